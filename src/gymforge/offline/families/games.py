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
from typing import Any

from gymforge.offline.families.common import Game, TaskSpec, description, make_id, program, proposal_text, words

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


# ---- the programs -------------------------------------------------------------------------------------
# Each game's evaluate.py and starter file is a whole template in gymforge/offline/programs/ (matrix_evaluate.py.j2,
# matrix_strategy.py.j2, ...; `common.program`), filled in per task with the game's parameters and the seeded pool of
# opponents below.


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



def _matrix_files(game: Game, rng: random.Random) -> dict[str, str]:
    pool = _opponent_pool(len(game.moves), rng)
    used = {name for name, _ in pool}
    evaluate = program(
        "matrix_evaluate.py.j2", title=MATRIX_GAMES[game.kind][0], moves=json.dumps(list(game.moves)),
        payoff=json.dumps([list(row) for row in game.payoff]), rounds=game.rounds, matches=rng.choice((3, 5)),
        seed=rng.randrange(10_000), pool_defs="\n\n\n".join(src for name, src in OPPONENTS.items() if name in used),
        pool="\n".join(f"    {call}," for _, call in pool))
    weights = [1] * len(game.moves)
    weights[rng.randrange(len(weights))] += rng.choice((0, 1, 2))
    strategy = program("matrix_strategy.py.j2", title=MATRIX_GAMES[game.kind][0],
                       moves=json.dumps(list(game.moves)), weights=weights)
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
    evaluate = program(
        "ultimatum_evaluate.py.j2", pie=pie, rounds=game.rounds, matches=rng.choice((3, 5)), seed=rng.randrange(10_000),
        pool_defs="\n\n\n".join(src for name, src in RESPONDERS.items() if name in used),
        pool="\n".join(f"    {call}," for _, call in pool))
    strategy = program("ultimatum_strategy.py.j2", pie=pie, percent=rng.choice((50, 50, 60)))
    return {"strategy.py": strategy, EVALUATION: evaluate}


# ---- knapsack ------------------------------------------------------------------------------------------

KNAPSACK_BASELINES: dict[str, tuple[str, str]] = {
    "most valuable first": ("greedily packs the most valuable items that still fit", "-values[i]"),
    "lightest first": ("greedily packs the lightest items while they fit", "weights[i]"),
}


def _knapsack_files(game: Game, rng: random.Random) -> dict[str, str]:
    cap_lo = rng.choice((0.25, 0.3, 0.35))
    evaluate = program(
        "knapsack_evaluate.py.j2", instances=game.instances, lo=game.items[0], hi=game.items[1], max_weight=rng.choice((20, 30, 50)),
        cap_lo=cap_lo, cap_hi=round(cap_lo + 0.2, 2), seed=rng.randrange(10_000))
    summary, key = KNAPSACK_BASELINES[rng.choice(sorted(KNAPSACK_BASELINES))]
    return {"heuristic.py": program("knapsack_heuristic.py.j2", summary=summary, key=key), EVALUATION: evaluate}


# ---- bin packing ---------------------------------------------------------------------------------------

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


def _bin_files(game: Game, rng: random.Random) -> dict[str, str]:
    evaluate = program(
        "bin_evaluate.py.j2", instances=game.instances, lo=game.items[0], hi=game.items[1], size_lo=game.sizes[0], size_hi=game.sizes[1],
        capacity=game.capacity, seed=rng.randrange(10_000))
    heuristic = program("bin_heuristic.py.j2", function=BIN_BASELINES[rng.choice(sorted(BIN_BASELINES))])
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
