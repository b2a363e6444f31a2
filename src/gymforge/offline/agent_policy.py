"""The offline teacher playing the MLGym agent: one DISCUSSION and one fenced command per turn.

The agent loop elides all but the last few observations, but always sends this policy's own earlier
replies, so progress is read from its own commands (what it opened, ran, edited, validated) and only
the decisions that need an output (an edit's file contents, a score, an error) read the observations
still shown. An episode is fixed by the request seed and the task: the exploration, the ideas and
their order, and which realistic failures it commits. The skill, from the model name
(`gymforge-offline-teacher@0.3`, default 0.8), sets how often those failures happen: malformed
replies, an edit the guard rejects, a command that runs into its time limit, wandering until the
step limit, forgetting to submit, and submitting before any artefact exists. A post-training task (final_model/
from base_model/) is played by `posttraining_policy`, in either agent interface; the reply's format and its
malformed variants stay this module's.
"""
# long file: the offline teacher's scripted agent (read the conversation, plan, decide, reply), top to bottom

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field

from gymforge.agent.parsing import FormatError, parse_reply
from gymforge.offline import improvements, posttraining_policy
from gymforge.offline.edits import edit_command
from gymforge.offline.families.common import seeded
from gymforge.offline.improvements import Brief

DEFAULT_SKILL = 0.8
TASK_HEADING = "TASK DESCRIPTION:"  # a line of core/templates/agent_task.j2, only in agent conversations
FORMAT_ERROR_PREFIX = "Your reply could not be used"  # core/templates/agent_format_error.j2
_ELIDED = re.compile(r"^Old output omitted \(\d+ lines\)$")
_STATUS = re.compile(r"\(Current Step: (\d+), Remaining Steps: (\d+)\)")
_RUN = re.compile(r"^python3? ([\w./-]+\.py)\s*$")
_SCORE = re.compile(r"^(Baseline|Evaluation) Score: (\{.*\})\s*$", re.MULTILINE)
# How this policy reports a validation in its next reply; read back once the observation is elided.
_REPORTED = re.compile(r"Validation gives (\S+) (-?[\d.]+(?:e[-+]?\d+)?) against")


def is_agent_conversation(conversation: list[tuple[str, str]]) -> bool:
    """Whether the first user message is the agent's task prompt."""
    first = next((text for role, text in conversation if role == "user"), "")
    return any(line.strip() == TASK_HEADING for line in first.splitlines())


def skill_of(model: str | None) -> float:
    """`name@0.3` -> 0.3 (clamped to [0, 1]); any other name gets the default."""
    m = re.search(r"@(\d*\.?\d+)\s*$", model or "")
    return min(1.0, max(0.0, float(m.group(1)))) if m else DEFAULT_SKILL


# ---- reading the conversation ----------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    action: str
    kind: str  # see `_kind`
    thought: str
    observation: str | None  # None: elided by the agent loop (or not there yet)


def _kind(action: str, file: str) -> str:
    """validate | submit | edit | stall | backup | restore | open | run (the file to improve) | look."""
    head = action.split(None, 1)[0] if action.strip() else ""
    if action in ("validate", "submit"):
        return action
    if head in ("edit", "insert"):
        return "edit"
    if head == "sleep":
        return "stall"
    if head == "cp":
        words = action.split()
        return "restore" if len(words) == 3 and words[1].endswith("_original.py") else "backup"
    if head == "open":
        return "open"
    if (m := _RUN.match(action)) and m.group(1).removeprefix("./") == file:
        return "run"
    return "look"


def _observation(text: str) -> str | None:
    if _ELIDED.match(text.strip()):
        return None
    # The status lines the loop appends say nothing about the command itself.
    cut = text.rfind("(Current Step:")
    return (text[:cut] if cut >= 0 else text).rstrip()


def _turns(messages: list[tuple[str, str]], file: str) -> list[Turn]:
    turns = []
    for i, (role, text) in enumerate(messages):
        if role != "assistant":
            continue
        try:
            thought, action = parse_reply(text)
        except FormatError:
            continue  # the loop never keeps a malformed reply, but a caller might
        following = messages[i + 1] if i + 1 < len(messages) and messages[i + 1][0] == "user" else None
        turns.append(Turn(action, _kind(action, file), thought, _observation(following[1]) if following else None))
    return turns


def _task(prompt: str) -> tuple[str, dict[str, float] | None]:
    """(description, baseline scores) from the agent's task prompt."""
    _, _, rest = prompt.partition(TASK_HEADING)
    description, _, tail = rest.partition("\nBASELINE SCORE:")
    baseline = None
    m = re.match(r"\s*(\{.*\})", tail)
    if m:
        try:
            baseline = json.loads(m.group(1))
        except json.JSONDecodeError:
            baseline = None
    return description.strip(), baseline


def file_view(observation: str | None, path: str) -> list[str] | None:
    """The whole file, if the observation shows all of it (an `open` or an applied edit)."""
    if not observation:
        return None
    lines = observation.split("\n")
    for h, line in enumerate(lines):
        m = re.match(r"^\[File: (.+) \((\d+) lines total\)\]$", line)
        if not m or not (m.group(1) == path or m.group(1).endswith("/" + path)):
            continue
        n = int(m.group(2))
        body = lines[h + 2 : h + 2 + n]
        if lines[h + 1 : h + 2] != ["(0 more lines above)"] or len(body) < n:
            return None
        if any(not row.startswith(f"{i}:") for i, row in enumerate(body, 1)):
            return None
        if lines[h + 2 + n : h + 3 + n] != ["(0 more lines below)"]:
            return None
        return [row[len(f"{i}:") :] for i, row in enumerate(body, 1)]
    return None


def _scores(observation: str | None) -> dict[str, dict[str, float]]:
    found = {}
    for which, raw in _SCORE.findall(observation or ""):
        try:
            found[which] = json.loads(raw)
        except json.JSONDecodeError:
            continue
    return found


def _failed(observation: str | None) -> bool:
    return bool(observation) and ("Traceback (most recent call last)" in observation or "TIMED OUT" in observation)


# ---- the episode -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The episode's draws; every turn of one rollout draws the same ones."""

    setup: tuple[str, ...]  # commands before the baseline run; the last opens the file to improve
    ideas: tuple[str, ...]
    slip: bool  # the first edit carries a mistake the edit guard rejects
    stall: bool  # one command that runs into its time limit
    backup: bool
    check_baseline: bool  # validate the untouched baseline first
    fate: str  # normal | premature | wander | forget
    wander_at: int  # the turn at which a wandering episode stops making progress


def backup_name(path: str) -> str:
    stem, _, ext = path.rpartition(".")
    return f"{stem}_original.{ext}"


def _plan(seed: int, description: str, brief: Brief, skill: float) -> Plan:
    rng = seeded(seed, "agent-episode", description)
    f = 1.0 - skill
    if brief.kind == "python":
        pool = [rng.choice(("cat evaluate.py", "head -n 60 evaluate.py")), "python evaluate.py"]
    elif brief.kind == "unknown":
        pool = ["ls data"]
    else:
        pool = [
            "python -c \"from datasets import load_from_disk; d = load_from_disk('data'); print(d); "
            "print(d['train'].to_pandas().describe(include='all').T.to_string())\"",
            "ls data",
            "head -n 30 evaluate.py",
        ]
    extras = rng.sample(pool, min(len(pool), rng.choice((0, 1, 1, 2))))
    setup = (rng.choice(("ls -la", "ls")), *extras, f'open "{brief.file}"')
    ideas = list(improvements.ideas(brief))
    if ideas and rng.random() > skill:
        rng.shuffle(ideas)  # a weaker agent does not know which idea is strongest
    n_ideas = 1 + (rng.random() < skill) + (rng.random() < skill - 0.3)
    u = rng.random()
    fates = (("premature", 0.1 * f), ("wander", 0.2 * f * f), ("forget", 0.15 * f))
    fate, edge = "normal", 0.0
    for name, p in fates:
        edge += p
        if u < edge:
            fate = name
            break
    if fate == "premature" and brief.kind not in ("csv", "model"):
        fate = "forget"  # a Python task's artefact always exists, so submitting early is no failure
    return Plan(
        setup=setup, ideas=tuple(ideas[:n_ideas]), slip=rng.random() < 0.6 * f, stall=rng.random() < 0.3 * f,
        backup=rng.random() < skill * 0.7, check_baseline=rng.random() < 0.6 + 0.4 * skill, fate=fate,
        wander_at=len(setup) + rng.randint(0, 3),
    )


@dataclass
class Attempt:
    idea: str | None
    rejections: int = 0
    rejected: bool = False  # the latest edit of this attempt was refused by the edit guard
    ran: bool = False
    run_ok: bool = True
    score: dict[str, float] | None = None
    validated: bool = False


@dataclass
class State:
    brief: Brief
    plan: Plan
    turns: list[Turn]
    baseline: dict[str, float] | None
    remaining: int
    rng: random.Random
    view: list[str] | None = None  # the file as a re-`open` just showed it
    attempts: list[Attempt] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        edits = [i for i, t in enumerate(self.turns) if t.kind in ("edit", "restore")]
        for i, turn in enumerate(self.turns[edits[0] :] if edits else [], edits[0] if edits else 0):
            if turn.kind in ("edit", "restore"):
                idea = improvements.idea_of(turn.action) if turn.kind == "edit" else "restore"
                previous = self.attempts[-1] if self.attempts else None
                # An edit right after an edit fixes a refused one (its refusal may be elided by now).
                if previous is not None and (previous.rejected or self.turns[i - 1].kind == "edit"):
                    previous.idea = idea or previous.idea  # the fix of a refused edit continues its attempt
                else:
                    self.attempts.append(Attempt(idea))
                refused = "NOT applied" in (turn.observation or "")
                self.attempts[-1].rejected = refused
                self.attempts[-1].rejections += refused
            elif turn.kind == "run" and self.attempts:
                self.attempts[-1].ran = True
                self.attempts[-1].run_ok = not _failed(turn.observation)
            elif turn.kind == "validate" and self.attempts:
                self.attempts[-1].validated = True
                self.attempts[-1].score = _scores(turn.observation).get("Evaluation")
                reported = _REPORTED.search(self.turns[i + 1].thought) if i + 1 < len(self.turns) else None
                if turn.observation is None and reported:
                    self.attempts[-1].score = {reported.group(1): float(reported.group(2))}
        if self.baseline is None:
            for turn in self.turns:
                if turn.kind == "validate" and (seen := _scores(turn.observation).get("Baseline")):
                    self.baseline = seen
            # Without a stated baseline, the untouched baseline's own validation is the reference.
            for i, turn in enumerate(self.turns[: edits[0] if edits else len(self.turns)]):
                if turn.kind != "validate" or self.baseline is not None:
                    continue
                self.baseline = _scores(turn.observation).get("Evaluation")
                reported = _REPORTED.search(self.turns[i + 1].thought) if i + 1 < len(self.turns) else None
                if self.baseline is None and reported:
                    self.baseline = {reported.group(1): float(reported.group(2))}

    @property
    def kinds(self) -> list[str]:
        return [t.kind for t in self.turns]

    def metric_value(self, scores: dict[str, float] | None) -> float | None:
        if not scores:
            return None
        key = self.brief.metric if self.brief.metric in scores else next(iter(scores))
        value = scores.get(key)
        return float(value) if isinstance(value, (int, float)) else None

    def beats(self, scores: dict[str, float] | None, other: dict[str, float] | None) -> bool:
        mine, theirs = self.metric_value(scores), self.metric_value(other)
        if mine is None:
            return False
        if theirs is None:
            return True
        return mine > theirs if self.brief.higher_is_better else mine < theirs

    def current_file(self) -> list[str] | None:
        """The file to improve as the newest observation still shown has it, if no restore came after."""
        if self.view is not None:
            return self.view
        for turn in reversed(self.turns):
            if turn.kind == "restore":
                return None
            view = file_view(turn.observation, self.brief.file)
            if view is not None:
                return view
        return None


# ---- what to say --------------------------------------------------------------------------------------


def _pick(rng: random.Random, *options: str) -> str:
    return rng.choice(options)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def _summary(view: list[str], brief: Brief) -> str:
    text = "\n".join(view)
    if brief.kind == "python":
        doc = re.search(rf"def {re.escape(brief.entry)}\(.*\n\s+\"\"\"(.+?)\"\"\"", text)
        said = f"Its docstring says: {doc.group(1).strip()}" if doc else ""
        return f"`{brief.entry}` is the part to change. {said}".rstrip()
    if brief.problem == "forecasting":
        doc = re.search(r"def forecast\(.*\n\s+\"\"\"(.+?)\"\"\"", text)
        return "The baseline forecaster: " + (doc.group(1).strip() if doc else "a simple rule.")
    model = re.search(r"make_pipeline\(features, (\w+)\(", text)
    chosen = re.search(r"\[\[(.+?)\]\]", text)
    n_used = len(re.findall(r"\"[^\"]+\"", chosen.group(1))) if chosen else None
    text = f"The model is {model.group(1)}" if model else "It fits a scikit-learn pipeline"
    if n_used is not None and brief.features:
        text += f", trained on {n_used} of the {len(brief.features)} usable columns"
    return text + "."


def _listing(observation: str) -> str:
    names = []
    for line in observation.splitlines():
        parts = line.split()
        if not parts or line.startswith("total"):
            continue
        name = parts[-1]
        if name not in (".", ".."):
            names.append(name)
    return ", ".join(names[:12]) if names else "nothing unexpected"


def _reflect(s: State) -> str:
    """A sentence on what the last command showed."""
    if not s.turns:
        return _pick(s.rng, "Let me start by seeing what is in the workspace.",
                     "First I want an overview of the workspace and the files I was given.")
    last, rng, brief = s.turns[-1], s.rng, s.brief
    obs = last.observation or ""
    kind = last.kind
    if kind == "look" and last.action.startswith("ls") and obs:
        where = [w for w in last.action.split()[1:] if not w.startswith("-")]
        return f"{where[0]}/ holds {_listing(obs)}." if where else f"The workspace contains {_listing(obs)}."
    if kind == "look" and last.action.startswith("python -c"):
        rows = re.search(r"num_rows: (\d+)", obs)
        return (f"The train split has {rows.group(1)} rows; the summary shows the column types and missing values."
                if rows else "The data summary gives me the column types and ranges.")
    if kind == "look" and last.action.startswith("python") and "evaluate.py" in last.action:
        printed = re.search(r"\{.*\}", obs)
        return (f"The untouched baseline scores {printed.group(0)} in the evaluation." if printed
                else "The evaluation did not print a score.")
    if kind == "look" and "evaluate.py" in last.action:
        if brief.kind == "python":
            bots = [b for b in re.findall(r"^def (\w+)\(", obs, re.MULTILINE)
                    if b not in ("play", "main", "make_instance", "optimum", "packed_value", "bins_used")]
            return ("The evaluation plays a fixed pool of scripted opponents (" + ", ".join(bots) + "), some of them "
                    "predictable, so a strategy that learns from the history should beat a blind one."
                    if bots else "The evaluation generates seeded instances and checks every answer for validity.")
        return "evaluate.py reads the artefact, checks its format and prints one JSON object with the metric."
    if kind == "open":
        view = file_view(obs, brief.file)
        if view is not None:
            return f"{brief.file} has {len(view)} lines. {_summary(view, brief)}"
        return "Here is the file again."
    if kind == "run":
        if "TIMED OUT" in obs:
            return "The run hit the time limit."
        if _failed(obs):
            error = [ln for ln in obs.splitlines() if ln.strip()][-1] if obs.strip() else "an error"
            return f"The run failed with `{error.strip()}`."
        tail = [ln for ln in obs.splitlines() if ln.strip() and "Warning" not in ln and "warn" not in ln]
        return f"The script ran fine{f' (last line: `{tail[-1].strip()}`)' if tail else ''}."
    if kind == "stall":
        return _pick(rng, "That wait ran into the time limit for non-training commands; the run had already finished, "
                          "so waiting was pointless.",
                     "The sleep was cut off by the command time limit. Nothing was running anyway, so I lost a step.")
    if kind == "validate":
        scores = _scores(obs)
        if "Evaluation" not in scores:
            return "Validation found no usable artefact."
        mine, base = s.metric_value(scores["Evaluation"]), s.metric_value(s.baseline)
        direction = "higher" if brief.higher_is_better else "lower"
        key = brief.metric or next(iter(scores["Evaluation"]))
        verdict = ("better than" if s.beats(scores["Evaluation"], s.baseline) else
                   "the same as" if mine == base else "worse than")
        return (f"Validation gives {key} {_fmt(mine)} against the baseline's {_fmt(base)} ({direction} is better): "
                f"{verdict} the baseline.")
    if kind == "edit":
        if "NOT applied" in obs:
            error = next((ln[2:] for ln in obs.splitlines() if ln.startswith("- ")), "an error")
            return f"The edit was rejected: {error}."
        return _pick(rng, "The edit applied cleanly.", "The file is updated and the indentation looks right.")
    if kind == "backup":
        return f"The original is saved as {backup_name(brief.file)}."
    if kind == "restore":
        return f"The original {brief.file} is back in place."
    return _pick(rng, "Noted.", "That confirms what I expected.", "Nothing surprising there.")


# ---- deciding ------------------------------------------------------------------------------------------


def _submitting(why: str) -> tuple[str, str]:
    return why, "submit"


def _run_command(brief: Brief) -> str:
    return f"python {brief.file}"


def _wander(s: State) -> tuple[str, str]:
    brief, rng = s.brief, s.rng
    options = [
        ("Let me look at the workspace again.", "ls -la"),
        (f"I want to reread {brief.file} before deciding anything.", f"cat {brief.file}"),
        ("Let me check how the evaluation is set up once more.", "head -n 40 evaluate.py"),
        ("I will check which files exist below the workspace.", "find . -maxdepth 2 -type f | head -n 40"),
        (f"How long is {brief.file}?", f"wc -l {brief.file}"),
        ("Let me see which functions the files define.", f'search_file "def " {brief.file}'),
    ]
    if brief.kind == "csv":
        options.append(("Let me peek at the submission file.", "head -n 5 submission.csv"))
    if brief.kind == "model":
        options.append(("Let me check the model config.", "cat model_config.yaml"))
    if brief.kind != "python":
        options.append(("Let me look at the data directory.", "ls -la data"))
    thought, command = rng.choice(options)
    return thought, command


def _edit(s: State, idea: str, slip: bool) -> tuple[str, str]:
    brief, rng = s.brief, s.rng
    current = s.current_file()
    if current is None:
        return (f"Before editing I need the current contents of {brief.file} in front of me.",
                f'open "{brief.file}"')
    old = "\n".join(current) + "\n"
    new = improvements.improve(old, brief, idea)
    if new == old:
        rest = [i for i in s.plan.ideas if i != idea and improvements.improve(old, brief, i) != old]
        if not rest:
            return _submitting("There is nothing left worth changing, so I will submit what I have.")
        idea, new = rest[0], improvements.improve(old, brief, rest[0])
    label = improvements.LABELS[idea]
    text = new
    thought = _pick(rng, f"My plan: replace the baseline with {label}.",
                    f"Next I will try {label}.", f"I will switch to {label}, which should do better here.")
    if slip:
        text = improvements.slip(old, new, rng) or new
    command = edit_command(current, text.splitlines())
    if not slip and "NOT applied" in (s.turns[-1].observation or "") and s.turns[-1].kind == "edit":
        thought = _pick(rng, "I left a mistake in that edit; here it is again, fixed.",
                        "My mistake. I will resend the same change with the error corrected.")
    return thought, command


def _next_idea(s: State) -> tuple[str, str] | None:
    tried = {improvements.idea_of(t.action) for t in s.turns if t.kind == "edit"}
    fresh = [i for i in s.plan.ideas if i not in tried]
    if fresh and s.remaining > 5:
        return _edit(s, fresh[0], slip=False)
    return None


def _after_attempt(s: State) -> tuple[str, str]:
    """The last attempt ran (and maybe validated): submit it, try another idea, or go back to the best one."""
    current = s.attempts[-1]
    if current.run_ok and not current.rejected and current.validated and s.beats(current.score, s.baseline):
        if s.plan.fate == "forget":
            return _wander(s)
        return _submitting(_pick(s.rng, "That is a real improvement, so I will submit it.",
                                "The change beats the baseline; submitting."))
    if current.idea == "restore" or (current.idea is not None
                                     and [a.idea for a in s.attempts].count(current.idea) > 1):
        return _submitting("This is the best version I have, so I will submit it.")
    if (step := _next_idea(s)) is not None:
        return step[0] if step[1] == "submit" else f"That did not help enough. {step[0]}", step[1]
    better = [a for a in s.attempts[:-1] if a.validated and s.beats(a.score, s.baseline)]
    if better:
        best = better[0]
        for other in better[1:]:
            if s.beats(other.score, best.score):
                best = other
        assert best.idea is not None
        thought, command = _edit(s, best.idea, slip=False)
        return f"The earlier version scored better, so I will bring it back. {thought}", command
    if "backup" in s.kinds:
        return ("None of my changes beat the baseline, so I will restore the original and submit that.",
                f"cp {backup_name(s.brief.file)} {s.brief.file}")
    return _submitting("I am out of ideas that help here; I will submit what I have.")


def _decide(s: State) -> tuple[str, str]:
    """(plan sentence, command) for the next step."""
    plan, brief, kinds, rng = s.plan, s.brief, s.kinds, s.rng
    n = len(s.turns)
    if n > len(plan.setup) and s.turns[-1].kind == "open":
        # A re-open only refreshed the view of the file: decide as before it, with the view at hand.
        view = file_view(s.turns[-1].observation, brief.file)
        if view is None:
            return _submitting("The viewer does not show the whole file at once, so I will submit what I have.")
        return _decide(State(brief, plan, s.turns[:-1], s.baseline, s.remaining, rng, view))
    if s.remaining <= 1 and plan.fate not in ("wander", "forget"):
        return _submitting("I am on my last step, so I will submit now.")
    if plan.fate == "wander" and n >= plan.wander_at:
        return _wander(s)
    if n < len(plan.setup):
        command = plan.setup[n]
        if command.startswith("open"):
            return f"Let me read {brief.file}, the file I will be improving.", command
        if command.startswith("python -c"):
            return "Let me get a quick summary of the training data.", command
        if command.startswith("python"):
            return "Let me run the evaluation once on the untouched baseline.", command
        if "evaluate.py" in command:
            return "Let me see how submissions are scored.", command
        if command.startswith("ls data"):
            return "Let me see how the data is stored.", command
        return "Let me list the files.", command
    if plan.fate == "premature" and "run" not in kinds:
        return _submitting(_pick(rng, "The baseline already writes a valid submission, so I can submit it directly.",
                                "The starter code looks sound; I will submit right away."))
    if "run" not in kinds:
        if brief.kind == "python":
            return f"Let me run {brief.file}'s self-test to make sure the baseline works.", _run_command(brief)
        return f"Let me run the baseline as it is to make sure it works and to produce the {_artefact(brief)}.", \
            _run_command(brief)
    if plan.stall and "stall" not in kinds:
        command = _pick(rng, "sleep 60 && ls -la", "sleep 90; ls -la")
        return "I will give the run a minute to flush its output and then look at the workspace.", command
    if not s.attempts and "edit" not in kinds:
        if plan.check_baseline and "validate" not in kinds:
            return "Let me validate the baseline's artefact to see its score.", "validate"
        if not plan.ideas:
            return _submitting("I have no change I trust for this task, so I will submit the baseline's artefact.")
        if plan.backup and "backup" not in kinds:
            return ("Before changing anything I will keep a copy of the original.",
                    f"cp {brief.file} {backup_name(brief.file)}")
        return _edit(s, plan.ideas[0], slip=plan.slip)
    last, current = s.turns[-1], s.attempts[-1]
    if last.kind == "edit" and current.rejected:
        if current.rejections >= 2:
            return _after_attempt(s)
        return _edit(s, current.idea or plan.ideas[0], slip=False)
    if not current.ran:
        return "Now I will rerun the script to regenerate the artefact with the change.", _run_command(brief)
    if not current.run_ok:
        return _after_attempt(s)
    if not current.validated and current.idea != "restore":
        return "Let me validate the new artefact.", "validate"
    return _after_attempt(s)


def _artefact(brief: Brief) -> str:
    return {"csv": "submission.csv", "model": "model file and its config"}.get(brief.kind, "submission artefact")


# ---- the reply ------------------------------------------------------------------------------------------


def _render(thought: str, command: str) -> str:
    return f"DISCUSSION\n{thought}\n\n```\n{command}\n```\n"


def _malformed(thought: str, command: str, rng: random.Random) -> str:
    form = rng.choice(("no_block", "two_blocks", "unclosed"))
    if form == "no_block":
        return f"DISCUSSION\n{thought}\n\nI will run:\n{command}\n"
    if form == "two_blocks":
        extra = "validate" if command != "validate" else "ls"
        return f"DISCUSSION\n{thought} Then I will check the result.\n\n```\n{command}\n```\n\n```\n{extra}\n```\n"
    return f"DISCUSSION\n{thought}\n\n```\n{command}\n"


def answer(conversation: list[tuple[str, str]], *, seed: int, model: str | None) -> str:
    """The next assistant turn of an agent conversation given as (role, text) pairs."""
    skill = skill_of(model)
    users = [i for i, (role, _) in enumerate(conversation) if role == "user"]
    description, baseline = _task(conversation[users[0]][1])
    history = conversation[users[0] + 1 :]
    rejected = ""
    if history and history[-1][0] == "user" and history[-1][1].lstrip().startswith(FORMAT_ERROR_PREFIX):
        rejected = history[-2][1] if len(history) >= 2 else ""
        history = history[:-2]
    post = posttraining_policy.read_task(conversation[users[0]][1])
    if post is not None:  # a post-training task: its own policy, in either interface
        step = posttraining_policy.next_step(post, history, seed=seed, skill=skill)
        rng = seeded(seed, "agent-turn", description, sum(role == "assistant" for role, _ in history), rejected)
        reflection, thought, command = "", step.thought, step.command
    else:
        brief = improvements.read_brief(description)
        plan = _plan(seed, description, brief, skill)
        last_user = next((text for role, text in reversed([conversation[users[0]], *history]) if role == "user"), "")
        status = _STATUS.findall(last_user)
        remaining = int(status[-1][1]) if status else 50
        turns = _turns(history, brief.file)
        rng = seeded(seed, "agent-turn", description, len(turns), rejected)
        state = State(brief, plan, turns, baseline, remaining, rng)
        reflection = _reflect(state)
        thought, command = _decide(state)
    if rejected:
        reflection = _pick(rng, "Sorry, my last reply broke the format: one command in one code block.",
                           "My previous reply was not in the required format; here it is again.") + " " + reflection
    text = f"{reflection.strip()} {thought}".strip()
    f = 1.0 - skill
    p_bad = 0.25 * f * f if rejected else 0.01 + 0.3 * f * f
    if rng.random() < p_bad:
        return _malformed(text, command, rng)
    return _render(text, command)
