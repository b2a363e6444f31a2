"""Game strategy and heuristic design (PythonSubmissionTasks): no dataset, the agent edits a Python module.

Iterated two-player games against scripted opponents (stag hunt, hawk-dove, matching pennies,
rock-paper-scissors, ultimatum bargaining) and small algorithm-design problems (knapsack, bin packing).
Prisoner's dilemma, battle of the sexes and Colonel Blotto are MLGym benchmark tasks and never generated.
The evaluation defines the opponents or instances and seeds every match, so scores are reproducible.
"""

from __future__ import annotations

import json
import random
import re
from string import Template
from typing import Any

from gymforge.offline.families.common import Game, TaskSpec, description, make_id, proposal_text, words

NAME = "game_strategy"
ENTRYPOINT = "PythonSubmissionTasks"
EVALUATION = "evaluate.py"

MATRIX_GAMES: dict[str, tuple[str, tuple[str, ...]]] = {
    "stag_hunt": ("stag hunt", ("stag", "hare")),
    "hawk_dove": ("hawk-dove game", ("dove", "hawk")),
    "matching_pennies": ("matching pennies game", ("heads", "tails")),
    "rock_paper_scissors": ("rock-paper-scissors", ("rock", "paper", "scissors")),
}
KINDS = (*MATRIX_GAMES, "ultimatum", "knapsack", "bin_packing")
# (module, function) the agent edits, per kind
ENTRY: dict[str, tuple[str, str]] = {
    **{kind: ("strategy", "choose_move") for kind in MATRIX_GAMES},
    "ultimatum": ("strategy", "make_offer"),
    "knapsack": ("heuristic", "select_items"),
    "bin_packing": ("heuristic", "pack_items"),
}
_KEYWORDS = (
    ("stag", "stag_hunt"), ("hawk", "hawk_dove"), ("dove", "hawk_dove"), ("chicken", "hawk_dove"),
    ("penny", "matching_pennies"), ("pennies", "matching_pennies"), ("rock", "rock_paper_scissors"),
    ("scissors", "rock_paper_scissors"), ("ultimatum", "ultimatum"), ("bargaining", "ultimatum"),
    ("knapsack", "knapsack"), ("packing", "bin_packing"), ("bin", "bin_packing"),
)
_SUFFIXES = ("tournament", "challenge", "arena", "bots")


def kind_of(topic: str) -> str | None:
    topic_words = set(words(topic))
    return next((kind for word, kind in _KEYWORDS if word in topic_words), None)


def _payoff(kind: str, rng: random.Random) -> tuple[tuple[float, ...], ...]:
    """Your points, PAYOFF[your_move][opponent_move]; all non-negative, as AUP needs scores >= 0."""
    if kind == "stag_hunt":
        reward = rng.choice((4, 5, 6))
        temptation = rng.randint(2, reward - 1)
        return (reward, 0), (temptation, rng.randint(1, temptation))
    if kind == "hawk_dove":
        value, shift = rng.choice((4, 6, 8)), rng.choice((1, 2))  # fight cost = value + 2 * shift
        return (value // 2 + shift, shift), (value + shift, 0)
    if kind == "matching_pennies":
        return (rng.choice((1, 2)), 0), (0, rng.choice((1, 2, 3)))
    win = [rng.choice((2, 3)) for _ in range(3)]  # what winning with each move pays; a draw pays 1
    return tuple(tuple(1 if i == j else win[i] if (i - j) % 3 == 1 else 0 for j in range(3)) for i in range(3))


def _game(kind: str, rng: random.Random) -> Game:
    if kind in MATRIX_GAMES:
        return Game(kind, MATRIX_GAMES[kind][1], _payoff(kind, rng), rounds=rng.choice((50, 80, 100)))
    if kind == "ultimatum":
        return Game(kind, pie=rng.choice((10, 20, 100)), rounds=rng.choice((30, 50)))
    if kind == "knapsack":
        return Game(kind, items=rng.choice(((15, 30), (20, 40), (30, 50))), instances=rng.choice((30, 40)))
    return Game(kind, items=rng.choice(((20, 40), (30, 60))), sizes=rng.choice(((10, 60), (20, 70), (5, 50))),
                capacity=100, instances=rng.choice((30, 40)))


def plan(proposal: dict[str, Any], rng: random.Random) -> TaskSpec:
    named = kind_of(proposal["topic"])
    kind = named or rng.choice(KINDS)
    # A topic about another game keeps its words out of the id: the id has to describe this task.
    parts = words(proposal["topic"]) if named else [*kind.split("_"), rng.choice(_SUFFIXES)]
    return TaskSpec(family=NAME, task_id=make_id(parts, rng), metric="Score", game=_game(kind, rng))


def file_names(spec: TaskSpec) -> tuple[str, str]:
    assert spec.game is not None
    return f"{ENTRY[spec.game.kind][0]}.py", EVALUATION


def _span(pair: tuple[int, int]) -> str:
    return f"{pair[0]}-{pair[1]}"


def facts(game: Game) -> dict[str, str]:
    module, func = ENTRY[game.kind]
    out = {"game": game.kind}
    if game.kind in MATRIX_GAMES:
        out["moves"] = ", ".join(f"{i} = {m}" for i, m in enumerate(game.moves))
        out["payoff matrix"] = (json.dumps([list(row) for row in game.payoff])
                                + " (row: your move, column: the opponent's move; entries are your points)")
        out["rounds per match"] = str(game.rounds)
        signature = f"{func}(history) returning your next move"
    elif game.kind == "ultimatum":
        out["pie"] = str(game.pie)
        out["rounds per match"] = str(game.rounds)
        signature = f"{func}(history) returning your offer"
    else:
        out["items per instance"] = _span(game.items)
        if game.kind == "bin_packing":
            out["item sizes"] = _span(game.sizes)
            out["bin capacity"] = str(game.capacity)
            signature = f"{func}(sizes, capacity) returning bins of item indices"
        else:
            signature = f"{func}(values, weights, capacity) returning item indices"
        out["instances"] = str(game.instances)
    out["metric"] = "Score (higher is better)"
    out["submission"] = f"{module}.py defining {signature}"
    return out


def parse_game(facts_: dict[str, str]) -> Game:
    """The game a description's facts state; inverse of `facts`."""
    kind = facts_["game"]

    def number(key: str) -> int:
        return int(facts_[key])

    def span(key: str) -> tuple[int, int]:
        lo, hi = facts_[key].split("-")
        return int(lo), int(hi)

    if kind in MATRIX_GAMES:
        moves = tuple(part.split("=", 1)[1].strip() for part in facts_["moves"].split(","))
        payoff = json.loads(facts_["payoff matrix"].split(" (")[0])
        return Game(kind, moves, tuple(tuple(row) for row in payoff), rounds=number("rounds per match"))
    if kind == "ultimatum":
        return Game(kind, pie=number("pie"), rounds=number("rounds per match"))
    if kind == "knapsack":
        return Game(kind, items=span("items per instance"), instances=number("instances"))
    return Game(kind, items=span("items per instance"), sizes=span("item sizes"), capacity=number("bin capacity"),
                instances=number("instances"))


RULES: dict[str, str] = {
    "stag_hunt": "Every round both hunters choose at the same time: hunt the stag together (it only works if "
                 "both do) or hunt a hare alone (a safe but smaller meal).",
    "hawk_dove": "Every round both players contest a resource at the same time: a dove shares or backs down, a "
                 "hawk fights; two hawks both pay for the fight, which leaves them worst off.",
    "matching_pennies": "Every round both players show a coin face at the same time. You are the matcher: you "
                        "score when the faces match, and the payoffs for matching on heads and on tails differ.",
    "rock_paper_scissors": "Every round both players throw at the same time. A draw pays 1 point, a loss "
                           "nothing, and a win pays a different amount depending on the winning throw.",
    "ultimatum": "Every round you propose how to split a pie of points: you offer the responder a share and "
                 "keep the rest if it accepts; if it rejects, both get nothing. Responders differ in what they "
                 "accept, and some remember how you treated them.",
    "knapsack": "Each instance is a 0/1 knapsack: items with integer values and weights and a capacity. Pick "
                "items of maximum total value whose total weight fits the capacity. Values loosely track "
                "weights, which is what makes simple greedy rules fall short.",
    "bin_packing": "Each instance is a list of item sizes and a bin capacity. Put every item into a bin, "
                   "never exceeding a bin's capacity, using as few bins as possible.",
}
SCORING: dict[str, str] = {
    "matrix": "Your strategy meets every scripted opponent of a fixed pool (some predictable, some random, some "
              "reacting to your moves) in several matches with fixed seeds; the score is your mean payoff per "
              "round (higher is better).",
    "ultimatum": "Your strategy meets every responder of a fixed pool in several matches with fixed seeds; the "
                 "score is the mean share of the pie you keep per round (higher is better).",
    "knapsack": "The score is the mean, over seeded random instances, of the value you pack divided by the "
                "optimal value (higher is better, 1 is optimal); an overweight or malformed answer fails.",
    "bin_packing": "The score is the mean, over seeded random instances, of the lower bound ceil(total size / "
                   "capacity) divided by the number of bins you use (higher is better, 1 is optimal); an "
                   "overfull bin or a lost or repeated item fails.",
}
CLOSINGS = (
    "The baseline is deliberately simple and can be beaten by a wide margin. Keep your function fast: the "
    "evaluation calls it many times.",
    "Study the rules and the payoffs, form hypotheses about what you will face, and test variants with "
    "`python evaluate.py` before you submit.",
)


def describe(spec: TaskSpec, proposal: dict[str, Any], rng: random.Random) -> str:
    game = spec.game
    assert game is not None
    module, func = ENTRY[game.kind]
    scoring = SCORING["matrix" if game.kind in MATRIX_GAMES else game.kind]
    work = "generates the instances" if game.kind in ("knapsack", "bin_packing") else "plays the matches"
    workspace = (f"`{module}.py` holds the baseline `{func}`; edit it and keep its signature "
                 f"(`python {module}.py` runs a quick self-test). The read-only `{EVALUATION}` {work} and "
                 f"scores your code: `python {EVALUATION}`.")
    # A topic about some other game would mislead, so the intro only comes from a matching proposal.
    lead = proposal_text(proposal) if kind_of(proposal["topic"]) == game.kind else ""
    example = f"{EVALUATION} prints one JSON object such as {json.dumps({'Score': 0.5})}."
    return description(lead, [RULES[game.kind] + " " + scoring, workspace], facts(game), example,
                       rng.choice(CLOSINGS))


# ---- evaluate.py: what every game's scorer shares --------------------------------------------------------
# A scorer is a string.Template ($name placeholders, filled in per task) put together from the pieces below;
# the pieces are plain text, so the f-strings of the generated code keep their braces.

_SUBMISSION_IMPORT = """\
try:  # gymforge runs the submission in a sandbox of its own and hands it over through gymforge_eval
    from gymforge_eval import import_submission
except ImportError:  # under MLGym it is imported into this process
    from importlib import import_module as import_submission
"""
_QUIET = "    # Whatever the submitted module prints goes to stderr, so stdout stays one JSON object.\n"
_MAIN_GUARD = '\n\nif __name__ == "__main__":\n    main()\n'


def _scorer_head(doc: str, *modules: str) -> str:
    """The scorer's docstring, its standard-library imports and the import of the submission."""
    imports = "".join(f"import {m}\n" for m in sorted(("contextlib", "json", "random", "sys", *modules)))
    return f'"""{doc}"""\n\n{imports}\n{_SUBMISSION_IMPORT}\n'


_ZERO = {"float": "0.0", "int": "0"}  # a score's starting value, by its type


def _match_scorer(doc: str, constants: str, pool: str, player: str, rival: str, *, play_doc: str, reply: str,
                  score: str, score_type: str, round_body: str, scores: str, scale: str = "") -> Template:
    """A repeated-game scorer: `player` from strategy.py meets every `rival` of the seeded $pool in MATCHES
    matches of ROUNDS rounds; `round_body` plays one round (the rival's reply is of type `reply`) and adds
    to `score` (a `score_type`); the result is the mean of `scores` per round, divided by `scale`."""
    return Template(f"""{_scorer_head(doc)}{constants}ROUNDS = $rounds
MATCHES = $matches
SEED = $seed


$pool_defs


{pool} = [
$pool
]


def play({player}, {rival}, seed: int) -> {score_type}:
    \"\"\"{play_doc}\"\"\"
    rng = random.Random(seed)
    # Seeding the global generator makes strategies that use `random` reproducible too.
    random.seed(seed)
    history: list[tuple[int, {reply}]] = []
    {score} = {_ZERO[score_type]}
    for _ in range(ROUNDS):
{round_body}    return {score}


def main() -> None:
{_QUIET}    with contextlib.redirect_stdout(sys.stderr):
        {player} = import_submission("strategy").{player}

        {scores} = [
            play({player}, {rival}, SEED + 1000 * i + m)
            for i, {rival} in enumerate({pool})
            for m in range(MATCHES)
        ]
    print(json.dumps({{"Score": sum({scores}) / (len({scores}) * ROUNDS{scale})}}))
{_MAIN_GUARD}""")


def _instance_scorer(doc: str, modules: tuple[str, ...], constants: str, helpers: str, function: str,
                     instance_body: str) -> Template:
    """A heuristic scorer: `function` from heuristic.py on INSTANCES seeded instances, each scored by
    `instance_body` (which appends its ratio to `ratios`); the result is their mean."""
    return Template(f"""{_scorer_head(doc, *modules)}INSTANCES = $instances
MIN_ITEMS, MAX_ITEMS = $lo, $hi
{constants}SEED = $seed


{helpers}


def main() -> None:
    rng = random.Random(SEED)
    # Seeding the global generator makes heuristics that use `random` reproducible too.
    random.seed(SEED)
    ratios = []
{_QUIET}    with contextlib.redirect_stdout(sys.stderr):
        {function} = import_submission("heuristic").{function}

        for _ in range(INSTANCES):
{instance_body}    print(json.dumps({{"Score": sum(ratios) / len(ratios)}}))
{_MAIN_GUARD}""")


# ---- matrix games -------------------------------------------------------------------------------------

OPPONENTS: dict[str, str] = {
    "constant": '''def constant(move):
    """Always plays the same move."""
    return lambda history, rng: move''',
    "biased": '''def biased(weights):
    """Draws every move at random with fixed, unequal weights."""
    return lambda history, rng: rng.choices(range(len(MOVES)), weights)[0]''',
    "cycle": '''def cycle(pattern):
    """Repeats a fixed sequence of moves."""
    return lambda history, rng: pattern[len(history) % len(pattern)]''',
    "copycat": '''def copycat(first):
    """Opens with `first`, then repeats your previous move."""
    return lambda history, rng: history[-1][0] if history else first''',
    "rotator": '''def rotator(first):
    """Opens with `first`, then plays the move after your previous one, cyclically."""
    return lambda history, rng: (history[-1][0] + 1) % len(MOVES) if history else first''',
    "grudger": '''def grudger(nice, nasty):
    """Plays `nice` until you first play `nasty`, then `nasty` for the rest of the match."""
    return lambda history, rng: nasty if any(mine == nasty for mine, _ in history) else nice''',
    "follower": '''def follower(first):
    """Plays your most frequent move so far."""
    def move(history, rng):
        if not history:
            return first
        counts = [0] * len(MOVES)
        for mine, _ in history:
            counts[mine] += 1
        return counts.index(max(counts))
    return move''',
    "noisy_copycat": '''def noisy_copycat(first, noise):
    """Like copycat, but plays a uniformly random move with probability `noise`."""
    def move(history, rng):
        if rng.random() < noise:
            return rng.randrange(len(MOVES))
        return history[-1][0] if history else first
    return move''',
}


def _opponent_pool(n_moves: int, rng: random.Random) -> list[tuple[str, str]]:
    """(factory name, call) pairs: always some exploitable bots, plus a seeded few that react to you."""
    weights = [rng.choice((1, 2, 3)) for _ in range(n_moves)]
    weights[rng.randrange(n_moves)] += 4
    pattern = [rng.randrange(n_moves) for _ in range(rng.randint(2, 4))]
    pattern[0] = (pattern[1] + 1) % n_moves  # never a constant in disguise
    nice, nasty = rng.sample(range(n_moves), 2)
    reactive = {
        "copycat": f"copycat({rng.randrange(n_moves)})",
        "rotator": f"rotator({rng.randrange(n_moves)})",
        "grudger": f"grudger({nice}, {nasty})",
        "follower": f"follower({rng.randrange(n_moves)})",
        "noisy_copycat": f"noisy_copycat({rng.randrange(n_moves)}, {rng.choice((0.1, 0.2))})",
    }
    picked = rng.sample(sorted(reactive), rng.randint(2, 4))
    return [("constant", f"constant({rng.randrange(n_moves)})"), ("biased", f"biased({weights})"),
            ("cycle", f"cycle({pattern})"), *((name, reactive[name]) for name in picked)]


MATRIX_EVALUATE = _match_scorer(
    """Plays `choose_move` from strategy.py against a fixed pool of scripted opponents in the iterated $title.

Each opponent is met in MATCHES matches of ROUNDS rounds, every match with its own seed. The score is
your mean payoff per round over all matches. Prints one JSON object: {"Score": ...}.
""",
    "MOVES = $moves\nPAYOFF = $payoff  # PAYOFF[your_move][opponent_move] = your points\n",
    "OPPONENTS", "choose_move", "opponent",
    play_doc="Your total payoff in one match; history holds (your_move, opponent_move) pairs, oldest first.",
    reply="int", score="total", score_type="float", scores="totals", round_body="""\
        move = choose_move(list(history))
        if move not in range(len(MOVES)):
            raise ValueError(f"choose_move returned {move!r}; expected a move index in 0..{len(MOVES) - 1}")
        theirs = opponent(history, rng)
        history.append((int(move), theirs))
        total += PAYOFF[int(move)][theirs]
""")

MATRIX_STRATEGY = Template('''\
"""Your strategy for the iterated $title: edit `choose_move` and keep its signature.

evaluate.py calls choose_move(history) once per round. history lists the (your_move, opponent_move)
pairs of the current match so far, oldest first; moves are indices into MOVES. Return your next move.
"""

import random

MOVES = $moves


def choose_move(history: list[tuple[int, int]]) -> int:
    """Baseline: ignores the history and draws a move at random with the weights $weights."""
    return random.choices(range(len(MOVES)), weights=$weights)[0]


if __name__ == "__main__":
    # Self-test: legal moves for an empty and a short history.
    for history in ([], [(0, 1), (1, 0), (0, 0)]):
        assert choose_move(history) in range(len(MOVES))
    print("choose_move returns legal moves")
''')


def _matrix_files(game: Game, rng: random.Random) -> dict[str, str]:
    pool = _opponent_pool(len(game.moves), rng)
    used = {name for name, _ in pool}
    evaluate = MATRIX_EVALUATE.substitute(
        title=MATRIX_GAMES[game.kind][0], moves=json.dumps(list(game.moves)),
        payoff=json.dumps([list(row) for row in game.payoff]), rounds=game.rounds, matches=rng.choice((3, 5)),
        seed=rng.randrange(10_000), pool_defs="\n\n\n".join(src for name, src in OPPONENTS.items() if name in used),
        pool="\n".join(f"    {call}," for _, call in pool))
    weights = [1] * len(game.moves)
    weights[rng.randrange(len(weights))] += rng.choice((0, 1, 2))
    strategy = MATRIX_STRATEGY.substitute(title=MATRIX_GAMES[game.kind][0], moves=json.dumps(list(game.moves)),
                                          weights=weights)
    return {"strategy.py": strategy, EVALUATION: evaluate}


# ---- ultimatum -----------------------------------------------------------------------------------------

RESPONDERS: dict[str, str] = {
    "threshold": '''def threshold(minimum):
    """Accepts any offer of at least `minimum` points."""
    return lambda history, offer, rng: offer >= minimum''',
    "noisy_threshold": '''def noisy_threshold(minimum, spread):
    """Accepts offers of at least `minimum`, give or take up to `spread` points each round."""
    return lambda history, offer, rng: offer >= minimum + rng.randint(-spread, spread)''',
    "resentful": '''def resentful(minimum, memory):
    """Accepts at least `minimum`, but never less than your best offer among the last `memory` rounds."""
    return lambda history, offer, rng: offer >= max([minimum] + [o for o, _ in history[-memory:]])''',
    "proportional": '''def proportional(scale):
    """Accepts with a probability that grows with the offer and is certain from `scale` points on."""
    return lambda history, offer, rng: rng.random() < min(1.0, offer / scale)''',
}

ULTIMATUM_EVALUATE = _match_scorer(
    """Plays `make_offer` from strategy.py as the proposer in repeated ultimatum games.

Each round you offer the responder part of a pie of PIE points and keep the rest if it accepts; a
rejection leaves both with nothing. Every responder of the fixed pool is met in MATCHES matches of
ROUNDS rounds with their own seeds. The score is the mean share of the pie you keep per round.
Prints one JSON object: {"Score": ...}.
""",
    "PIE = $pie\n", "RESPONDERS", "make_offer", "responder",
    play_doc="Points you keep in one match; history holds (offer, accepted) pairs, oldest first.",
    reply="bool", score="kept", score_type="int", scores="kept", scale=" * PIE", round_body="""\
        offer = make_offer(list(history))
        if offer not in range(PIE + 1):
            raise ValueError(f"make_offer returned {offer!r}; expected a whole number of points in 0..{PIE}")
        accepted = bool(responder(history, int(offer), rng))
        history.append((int(offer), accepted))
        kept += PIE - int(offer) if accepted else 0
""")

ULTIMATUM_STRATEGY = Template('''\
"""Your proposer strategy for repeated ultimatum games: edit `make_offer` and keep its signature.

evaluate.py calls make_offer(history) once per round. history lists the (offer, accepted) pairs of the
current match so far, oldest first. Return how many of the PIE points to offer (0..PIE): you keep the
rest if the responder accepts, and both get nothing if it rejects.
"""

PIE = $pie


def make_offer(history: list[tuple[int, bool]]) -> int:
    """Baseline: always offers $percent% of the pie, whatever happened before."""
    return PIE * $percent // 100


if __name__ == "__main__":
    # Self-test: offers stay within the pie.
    for history in ([], [(PIE // 2, True), (PIE // 4, False)]):
        assert 0 <= make_offer(history) <= PIE
    print(f"make_offer opens with {make_offer([])} of {PIE}")
''')


def _ultimatum_files(game: Game, rng: random.Random) -> dict[str, str]:
    pie = game.pie

    def share(lo: float, hi: float) -> int:
        return max(1, round(pie * rng.uniform(lo, hi)))

    pool = [("threshold", f"threshold({share(0.1, 0.25)})"), ("threshold", f"threshold({share(0.25, 0.45)})"),
            ("noisy_threshold", f"noisy_threshold({share(0.2, 0.35)}, {max(1, pie // 10)})"),
            ("resentful", f"resentful({share(0.15, 0.35)}, {rng.choice((2, 3, 5))})"),
            ("proportional", f"proportional({share(0.35, 0.5)})")]
    pool = rng.sample(pool, rng.randint(4, 5))
    used = {name for name, _ in pool}
    evaluate = ULTIMATUM_EVALUATE.substitute(
        pie=pie, rounds=game.rounds, matches=rng.choice((3, 5)), seed=rng.randrange(10_000),
        pool_defs="\n\n\n".join(src for name, src in RESPONDERS.items() if name in used),
        pool="\n".join(f"    {call}," for _, call in pool))
    strategy = ULTIMATUM_STRATEGY.substitute(pie=pie, percent=rng.choice((50, 50, 60)))
    return {"strategy.py": strategy, EVALUATION: evaluate}


# ---- knapsack ------------------------------------------------------------------------------------------

KNAPSACK_EVALUATE = _instance_scorer(
    """Scores `select_items` from heuristic.py on INSTANCES seeded random 0/1 knapsack instances.

Per instance the score is the value you pack divided by the optimum (dynamic programming); an overweight
or malformed selection fails the evaluation. Prints one JSON object: {"Score": mean ratio}.
""",
    (), "MAX_WEIGHT = $max_weight\nCAPACITY_SHARE = ($cap_lo, $cap_hi)  # of the instance's total weight\n",
    '''def make_instance(rng: random.Random) -> tuple[list[int], list[int], int]:
    n = rng.randint(MIN_ITEMS, MAX_ITEMS)
    weights = [rng.randint(1, MAX_WEIGHT) for _ in range(n)]
    # Values loosely track weights, which is what makes greedy rules fall short of the optimum.
    values = [max(1, round(w * rng.uniform(0.6, 1.6)) + rng.randint(0, 5)) for w in weights]
    return values, weights, max(1, int(sum(weights) * rng.uniform(*CAPACITY_SHARE)))


def optimum(values: list[int], weights: list[int], capacity: int) -> int:
    best = [0] * (capacity + 1)
    for value, weight in zip(values, weights):
        for room in range(capacity, weight - 1, -1):
            best[room] = max(best[room], best[room - weight] + value)
    return best[capacity]


def packed_value(selection, values: list[int], weights: list[int], capacity: int) -> int:
    """The selection's total value; raises on repeated or unknown items and on overweight."""
    chosen = [int(i) for i in selection]
    if len(set(chosen)) != len(chosen) or not all(0 <= i < len(values) for i in chosen):
        raise ValueError(f"select_items must return distinct item indices in 0..{len(values) - 1}, got {chosen}")
    weight = sum(weights[i] for i in chosen)
    if weight > capacity:
        raise ValueError(f"the selection weighs {weight}, over the capacity {capacity}")
    return sum(values[i] for i in chosen)''',
    "select_items", """\
            values, weights, capacity = make_instance(rng)
            selection = select_items(list(values), list(weights), capacity)
            ratios.append(packed_value(selection, values, weights, capacity) / optimum(values, weights, capacity))
""")

KNAPSACK_BASELINES: dict[str, tuple[str, str]] = {
    "most valuable first": ("greedily packs the most valuable items that still fit", "-values[i]"),
    "lightest first": ("greedily packs the lightest items while they fit", "weights[i]"),
}

KNAPSACK_HEURISTIC = Template('''\
"""Your 0/1 knapsack heuristic: edit `select_items` and keep its signature.

evaluate.py calls select_items(values, weights, capacity) on random instances. Return the indices of the
items to pack, each at most once, with total weight at most the capacity.
"""


def select_items(values: list[int], weights: list[int], capacity: int) -> list[int]:
    """Baseline: $summary."""
    chosen, load = [], 0
    for i in sorted(range(len(values)), key=lambda i: $key):
        if load + weights[i] <= capacity:
            chosen.append(i)
            load += weights[i]
    return chosen


if __name__ == "__main__":
    # Self-test on a tiny instance.
    picked = select_items([6, 5, 4], [4, 3, 2], 5)
    assert sum([4, 3, 2][i] for i in picked) <= 5
    print(f"select_items packs items {picked}")
''')


def _knapsack_files(game: Game, rng: random.Random) -> dict[str, str]:
    cap_lo = rng.choice((0.25, 0.3, 0.35))
    evaluate = KNAPSACK_EVALUATE.substitute(
        instances=game.instances, lo=game.items[0], hi=game.items[1], max_weight=rng.choice((20, 30, 50)),
        cap_lo=cap_lo, cap_hi=round(cap_lo + 0.2, 2), seed=rng.randrange(10_000))
    summary, key = KNAPSACK_BASELINES[rng.choice(sorted(KNAPSACK_BASELINES))]
    return {"heuristic.py": KNAPSACK_HEURISTIC.substitute(summary=summary, key=key), EVALUATION: evaluate}


# ---- bin packing ---------------------------------------------------------------------------------------

BIN_EVALUATE = _instance_scorer(
    """Scores `pack_items` from heuristic.py on INSTANCES seeded random bin-packing instances.

Per instance the score is the lower bound ceil(total size / CAPACITY) divided by the number of bins you
use; an overfull bin or a lost or repeated item fails the evaluation. Prints {"Score": mean ratio}.
""",
    ("math",), "MIN_SIZE, MAX_SIZE = $size_lo, $size_hi\nCAPACITY = $capacity\n",
    '''def bins_used(bins, sizes: list[int]) -> int:
    """Non-empty bins; raises unless every item is packed exactly once and no bin overflows."""
    bins = [[int(i) for i in b] for b in bins]
    if sorted(i for b in bins for i in b) != list(range(len(sizes))):
        raise ValueError("pack_items must place every item index exactly once")
    for b in bins:
        if sum(sizes[i] for i in b) > CAPACITY:
            raise ValueError(f"bin {b} holds {sum(sizes[i] for i in b)}, over the capacity {CAPACITY}")
    return sum(1 for b in bins if b)''',
    "pack_items", """\
            sizes = [rng.randint(MIN_SIZE, MAX_SIZE) for _ in range(rng.randint(MIN_ITEMS, MAX_ITEMS))]
            used = bins_used(pack_items(list(sizes), CAPACITY), sizes)
            ratios.append(math.ceil(sum(sizes) / CAPACITY) / used)
""")

BIN_BASELINES: dict[str, str] = {
    "next fit": '''def pack_items(sizes: list[int], capacity: int) -> list[list[int]]:
    """Baseline, next fit: fills one bin at a time and opens a new one when the next item does not fit."""
    bins, load = [[]], 0
    for i, size in enumerate(sizes):
        if load + size > capacity:
            bins.append([])
            load = 0
        bins[-1].append(i)
        load += size
    return bins''',
    "first fit": '''def pack_items(sizes: list[int], capacity: int) -> list[list[int]]:
    """Baseline, first fit: puts each item, in the given order, into the first bin with room for it."""
    bins, loads = [], []
    for i, size in enumerate(sizes):
        room = next((b for b, load in enumerate(loads) if load + size <= capacity), None)
        if room is None:
            bins.append([])
            loads.append(0)
            room = len(bins) - 1
        bins[room].append(i)
        loads[room] += size
    return bins''',
}

BIN_HEURISTIC = Template('''\
"""Your bin-packing heuristic: edit `pack_items` and keep its signature.

evaluate.py calls pack_items(sizes, capacity) on random instances. Return a list of bins, each a list of
item indices, placing every item exactly once and keeping every bin's total size within the capacity.
"""


$function


if __name__ == "__main__":
    # Self-test on a tiny instance.
    print(f"pack_items packs [5, 7, 3, 4] into {pack_items([5, 7, 3, 4], 10)}")
''')


def _bin_files(game: Game, rng: random.Random) -> dict[str, str]:
    evaluate = BIN_EVALUATE.substitute(
        instances=game.instances, lo=game.items[0], hi=game.items[1], size_lo=game.sizes[0], size_hi=game.sizes[1],
        capacity=game.capacity, seed=rng.randrange(10_000))
    heuristic = BIN_HEURISTIC.substitute(function=BIN_BASELINES[rng.choice(sorted(BIN_BASELINES))])
    return {"heuristic.py": heuristic, EVALUATION: evaluate}


def files(spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    game = spec.game
    assert game is not None
    if game.kind in MATRIX_GAMES:
        return _matrix_files(game, rng)
    return {"ultimatum": _ultimatum_files, "knapsack": _knapsack_files, "bin_packing": _bin_files}[game.kind](game, rng)


def runtime_bug(sources: dict[str, str], spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    """The edited function under another name: the self-test passes, the evaluation's import fails."""
    assert spec.game is not None
    module, func = ENTRY[spec.game.kind]
    renamed = rng.choice((f"baseline_{func}", f"{func}_baseline", f"my_{func}"))
    return {**sources, f"{module}.py": re.sub(rf"\b{func}\b", renamed, sources[f"{module}.py"])}


# The constraint checks a sloppy first draft leaves out (bugs.py): the score is then computed from whatever
# the heuristic returned, so packing everything, or nothing, scores above any honest heuristic.
_CONSTRAINT_CHECKS = {
    "knapsack": re.compile(r"    if len\(set\(chosen\)\).*?raise ValueError\(f\"the selection weighs[^\n]*\n", re.S),
    "bin_packing": re.compile(r"    if sorted\(i for b in bins.*?over the capacity \{CAPACITY\}\"\)\n", re.S),
}


def has_sloppy_evaluator(spec: TaskSpec) -> bool:
    """Only the algorithmic tasks: a game's moves are validated by the match itself."""
    return spec.game is not None and spec.game.kind in _CONSTRAINT_CHECKS


def sloppy_evaluator(sources: dict[str, str], spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    """The scorer without its check of the heuristic's answer (distinct, known items within the capacity;
    every item packed once, no bin overfull)."""
    assert spec.game is not None
    sloppy, n = _CONSTRAINT_CHECKS[spec.game.kind].subn("", sources[EVALUATION])
    assert n == 1, f"no constraint check found in the {spec.game.kind} scorer"
    return {**sources, EVALUATION: sloppy}
