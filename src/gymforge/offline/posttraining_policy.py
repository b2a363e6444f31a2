"""The offline teacher's agent on post-training tasks (docs/post-training.md): fine-tune base_model/ on the task's
pool and leave the best evaluated model in final_model/, in either interface.

- `cli` (MLGym's commands): look around, write `train.py` (TRL's SFTTrainer on the pool as prompt-completion chat
  rows, torch threads from the sandbox, a few steps, `save_pretrained` to final_model/ with the base's tokenizer
  files) with `create` and `edit`, run it, `validate`, change one setting and train again while that pays, submit.
- `workflow` (the AutoTrainess skills, gymforge.tasks.workflow): `python baseline.py` and `evaluate` (the base's
  score), then per iteration `plan`, data (`data_validate`), a YAML config, `train`, `evaluate`, `log`; keep the best
  run in final_model/ and submit.

An episode is a program (`Episode.cli`, `Episode.workflow`: generators that yield one step at a time and receive
what each command showed). Each turn replays it over the conversation: the agent's own earlier commands must come
out again, and what each observation showed is read back from the reply after it (whose opening sentence states
it, `Seen.sentence`), so an observation the agent loop has elided since gives the same decision it gave when it was
shown. The seed and the task fix the episode's draws; the skill (from the model name) sets how often it commits the
realistic failures: a wrong data key, a TRL argument that no longer exists, forgetting the tokenizer files, an edit
the guard refuses, a learning rate far too high, skipping the data check. Whether each failure costs a failed
action, a lost training run or nothing is up to the mechanics (the interface's checks, the evaluation's admission),
as are the scores and the trajectory's counts.
"""
# long file: the offline post-training agent and the training script and config texts it writes (as data)

from __future__ import annotations

import json
import random
import re
from collections.abc import Generator
from dataclasses import dataclass, field, replace

from gymforge.agent.parsing import FormatError, parse_reply
from gymforge.offline.edits import edit_command
from gymforge.offline.families.common import seeded

TASK_HEADING = "TASK DESCRIPTION:"
WORKFLOW_HEADING = "WORKFLOW: you post-train the model through skills"  # core/templates/agent_workflow.j2
MAX_TRAININGS = 2  # training runs that finish in an episode (failed ones do not count): cheap on 2 CPU cores
# A SmolLM2-135M step of 4 rows costs ~3.2 s on 2 cores (compute-bound), so runs stay short: 6-10 steps, at most 16.
MOST_STEPS = 16
_ELIDED = re.compile(r"^Old output omitted \(\d+ lines\)$")
_NUMBER = r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)"
_SCORE = re.compile(r"^Evaluation Score: (\{.*\})\s*$", re.MULTILINE)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "added_tokens.json")


# ---- the task ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """What the agent reads off a post-training task's first message."""

    description: str
    interface: str  # cli | workflow
    pool: str = "data/train.jsonl"
    answer_key: str = "answer"
    metric: str = "accuracy"
    higher_is_better: bool = True
    baseline: float | None = None
    max_steps: int = 50


def read_task(first_message: str) -> Task | None:
    """The post-training task of an agent's first message, or None for a task of another kind. A post-training task
    asks for final_model/ fine-tuned from base_model/; the workflow interface adds its skills to the message."""
    _, _, rest = first_message.partition(TASK_HEADING)
    description, _, tail = rest.partition("\nBASELINE SCORE:")
    if "base_model/" not in description or "final_model/" not in description:
        return None
    pools = re.findall(r"(data/[\w./-]+\.jsonl)", description)
    metric = re.search(r"Metric: ([\w-]+)", description)
    name = metric.group(1) if metric else "accuracy"
    lower = "lower is better" in description
    baseline = None
    if m := re.match(r"\s*(\{.*\})", tail):
        try:
            scores = json.loads(m.group(1))
            value = scores.get(name, next(iter(scores.values()), None)) if isinstance(scores, dict) else None
            baseline = float(value) if isinstance(value, (int, float)) else None
        except json.JSONDecodeError:
            baseline = None
    steps = re.search(r"You have (\d+) steps", tail)
    return Task(description.strip(), "workflow" if WORKFLOW_HEADING in tail else "cli",
                pools[0] if pools else "data/train.jsonl",
                "completion" if '"completion"' in description and '"answer"' not in description else "answer",
                name, not lower, baseline, int(steps.group(1)) if steps else 50)


# ---- what a command showed ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """What one observation showed, as far as the agent's decisions go."""

    ok: bool = True
    error: str = ""  # the gist of a failure: a traceback's last line, a refusal
    score: float | None = None
    run: int | None = None  # the train skill's run number
    note: str = field(default="", compare=False)  # what else it showed, for the next reply only (never recalled)

    def sentence(self, task: Task, rng: random.Random) -> str:
        """The opening sentence of the next reply; `recall` reads the same Seen back from it."""
        if self.score is not None:
            verdict = ""
            if task.baseline is not None:
                better = self.score > task.baseline if task.higher_is_better else self.score < task.baseline
                verdict = (" (better than the baseline's" if better else " (no better than the baseline's") + \
                    f" {task.baseline:g})"
            return f"The evaluation gives {task.metric} {self.score:g}{verdict}."
        if not self.ok:
            return f"That failed: `{self.error}`."
        if self.run is not None:
            return f"Run {self.run} finished.{f' {self.note}' if self.note else ''}"
        return self.note or rng.choice(("Noted.", "Good.", "That worked.", "OK."))


def recall(thought: str) -> Seen:
    """The Seen that a reply's opening sentence states (`Seen.sentence`)."""
    if m := re.search(r"The evaluation gives \S+ " + _NUMBER, thought):
        return Seen(score=float(m.group(1)))
    if m := re.search(r"That failed: `(.*?)`\.", thought):
        return Seen(ok=False, error=m.group(1))
    if m := re.search(r"Run (\d+) finished\.", thought):
        return Seen(run=int(m.group(1)))
    return Seen()


def _gist(text: str, limit: int = 160) -> str:
    line = " ".join(text.split()).replace("`", "'")
    return (line[: limit - 3] + "...") if len(line) > limit else line


def observe(command: str, observation: str) -> Seen:
    """What the observation of `command` shows."""
    head = command.split(None, 1)[0] if command.strip() else ""
    text = observation or ""
    if head in ("validate", "evaluate"):
        if m := _SCORE.search(text):
            try:
                scores = json.loads(m.group(1))
                value = next(iter(scores.values())) if isinstance(scores, dict) and scores else None
                if isinstance(value, (int, float)):  # as the next reply states it, so recall gives the same
                    return Seen(score=float(f"{float(value):.6g}"))
                return Seen(ok=False, error="no score")
            except json.JSONDecodeError:
                pass
        return Seen(ok=False, error=_gist(next((ln for ln in text.splitlines() if ln.strip()), "no score")))
    if head in ("edit", "insert", "create"):
        if "NOT applied" in text or text.startswith("Error:"):
            detail = next((ln[2:] for ln in text.splitlines() if ln.startswith("- ")), text.splitlines()[0])
            return Seen(ok=False, error=_gist(detail))
        return Seen(note="The file is in place." if head != "create" else "")
    if head in ("data_validate", "data_build"):
        if "PASSED" in text:
            rows = re.search(r"(\d+) usable rows", text)
            return Seen(note=f"The data passed validation ({rows.group(1)} usable rows)." if rows else "")
        problem = next((ln.strip() for ln in text.splitlines() if "line" in ln and ("no " in ln or "not " in ln)),
                       "the data failed validation")
        return Seen(ok=False, error=_gist(problem))
    if head == "train":
        if m := re.search(r"^run (\d+): ok", text, re.MULTILINE):
            result = re.search(r"^TRAIN_RESULT (\{.*\})", text, re.MULTILINE)
            figures = json.loads(result.group(1)) if result else {}
            note = (f"{figures['steps']} steps, train loss {figures['train_loss']:g}, {figures['seconds']:g} s."
                    if {"steps", "train_loss", "seconds"} <= set(figures) else "")
            return Seen(run=int(m.group(1)), note=note)
        if m := re.search(r"^run \d+: failed \((.*)\); log", text, re.MULTILINE):
            return Seen(ok=False, error=_gist(m.group(1)))
        return Seen(ok=False, error=_gist("train refused: " + text.strip().splitlines()[-1] if text.strip() else "?"))
    if "TIMED OUT" in text:
        return Seen(ok=False, error="the command timed out")
    if m := re.search(r"\[the command was stopped: (.*)\]", text):
        return Seen(ok=False, error=_gist("stopped: " + m.group(1)))
    if "Traceback (most recent call last)" in text:
        last = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(" ")]
        return Seen(ok=False, error=_gist(last[-1] if last else "a Python error"))
    if re.search(r"(command not found|No such file or directory|cannot stat)", text):
        return Seen(ok=False, error=_gist(text.strip().splitlines()[-1]))
    return Seen(note=_note(command, text))


def _note(command: str, text: str) -> str:
    """A sentence on what a command that only looks (or a training script) showed."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if command.startswith("ls") and lines:
        names = [ln.split()[-1] for ln in lines if not ln.startswith("total") and ln.split()[-1] not in (".", "..")]
        where = "The base model folder" if "base_model" in command else "The workspace"
        return f"{where} holds {', '.join(names[:12])}." if names else ""
    if command.startswith("head") and ".jsonl" in command and lines:
        try:
            row = json.loads(lines[0])
        except json.JSONDecodeError:
            return ""
        return f"Each row has the keys {', '.join(row)}." if isinstance(row, dict) else ""
    if "generate.py" in command and "apply_chat_template" in text:
        return "generate.py renders each question with the tokenizer's chat template as one user turn and decodes " \
               "greedily, so the model must answer with the label right away."
    if "evaluate.py" in command and text:
        return "evaluate.py scores the first line of each reply against the answer."
    if command == "python train.py" and lines:
        return f"The script ran to the end ({_gist(lines[-1], 100)})."
    if command == "python baseline.py":
        return "final_model/ now holds a copy of the base."
    return ""


# ---- the training script (cli) and config (workflow) ------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    """One training run's settings."""

    steps: int = 10
    learning_rate: float = 2e-4
    batch_size: int = 4
    max_length: int = 256
    optim: str = "adamw_torch"  # cli only: adafactor when AdamW's two moments per weight do not fit


def _lr(value: float) -> str:
    return f"{value:.0e}".replace("e-0", "e-")


def train_script(task: Task, recipe: Recipe, faults: frozenset[str] = frozenset()) -> str:
    """The cli agent's train.py; `faults` it has not fixed yet: data_key (reads the answer under the wrong key),
    trl_arg (an SFTConfig argument TRL renamed), tokenizer (final_model/ gets no tokenizer files), guard (a missing
    import, which the edit guard refuses)."""
    key = "completion" if task.answer_key != "completion" else "response"
    lines = [
        '"""Supervised fine-tuning of base_model/ on the task\'s training pool; the model goes to final_model/.',
        "",
        "TRL's SFTTrainer on prompt-completion rows in chat form (the loss on the answer only), rendered as the",
        "task's generation renders each question: one user turn, answered by the assistant.",
        '"""',
        "",
        "import json",
        *([] if "guard" in faults else ["import os"]),
        *([] if "tokenizer" in faults else ["import shutil"]),
        "",
        "import torch",
        "from datasets import Dataset",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "from trl import SFTConfig, SFTTrainer",
        "",
        'BASE = "base_model"',
        f'POOL = "{task.pool}"',
        'OUT = "final_model"',
        f"STEPS = {recipe.steps}",
        f"BATCH_SIZE = {recipe.batch_size}",
        f"LEARNING_RATE = {_lr(recipe.learning_rate)}",
        f"MAX_LENGTH = {recipe.max_length}",
        f'OPTIM = "{recipe.optim}"',
        *([] if "tokenizer" in faults else [
            "TOKENIZER_FILES = (" + ", ".join(f'"{n}"' for n in TOKENIZER_FILES[:4]) + ",",
            "                   " + ", ".join(f'"{n}"' for n in TOKENIZER_FILES[4:]) + ")"]),
        "",
        "torch.set_num_threads(int(os.environ.get(\"GYMFORGE_TORCH_THREADS\") or len(os.sched_getaffinity(0))))",
        "",
        "with open(POOL) as f:",
        "    rows = [json.loads(line) for line in f if line.strip()]",
        "data = Dataset.from_list([",
        '    {"prompt": [{"role": "user", "content": row["prompt"]}],',
        f'     "completion": [{{"role": "assistant", "content": row["{key if "data_key" in faults else task.answer_key}"]}}]}}',
        "    for row in rows",
        "])",
        'print(f"{len(rows)} training rows")',
        "",
        "tokenizer = AutoTokenizer.from_pretrained(BASE)",
        "model = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)",
        "args = SFTConfig(",
        '    output_dir="sft_output", max_steps=STEPS, per_device_train_batch_size=BATCH_SIZE,',
        '    learning_rate=LEARNING_RATE, optim=OPTIM, lr_scheduler_type="constant", '
        + ("max_seq_length=MAX_LENGTH," if "trl_arg" in faults else "max_length=MAX_LENGTH,"),
        '    completion_only_loss=True, logging_steps=2, save_strategy="no", report_to=[], seed=0,',
        "    # no bf16 autocast or gradient checkpointing: emulated on a CPU, they make a run ~20x slower",
        "    bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=not torch.cuda.is_available(),",
        "    disable_tqdm=True,",
        ")",
        "trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)",
        "result = trainer.train()",
        'print(f"trained {result.global_step} steps, train loss {result.training_loss:.4f}")',
        "",
        "trainer.model.save_pretrained(OUT, safe_serialization=True)",
        *([] if "tokenizer" in faults else [
            "for name in TOKENIZER_FILES:  # the base's own tokenizer files: the model must keep its tokenizer",
            "    if os.path.isfile(os.path.join(BASE, name)):",
            "        shutil.copyfile(os.path.join(BASE, name), os.path.join(OUT, name))"]),
        'print(f"saved the model to {OUT}/")',
    ]
    return "\n".join(lines) + "\n"


def train_config(data: str, recipe: Recipe, faults: frozenset[str] = frozenset()) -> str:
    """The workflow agent's train config (skills/train.py's settings); trl_arg: a setting train.py does not know."""
    return "\n".join([
        f"data: {data}",
        "method: sft",
        "model: base_model",
        f"max_steps: {recipe.steps}",
        f"learning_rate: {recipe.learning_rate:g}",
        f"batch_size: {recipe.batch_size}",
        ("max_seq_length" if "trl_arg" in faults else "max_length") + f": {recipe.max_length}",
        "lr_scheduler: constant",
        "logging_steps: 2",
    ]) + "\n"


# ---- the episode ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    thought: str
    command: str


@dataclass(frozen=True)
class Plan:
    """The episode's draws."""

    look: tuple[str, ...]  # commands that only look around
    check_baseline: bool  # cli: run the baseline and validate it first (the workflow always does)
    faults: frozenset[str]  # data_key, trl_arg, tokenizer, guard, high_lr, skip_data_check
    first: Recipe
    iterate: bool  # after a run that helps, train once more with one setting changed
    change: str  # steps | lr: the one setting an improving iteration changes


def draw_plan(task: Task, seed: int, skill: float) -> Plan:
    rng = seeded(seed, "posttrain-episode", task.description, task.interface)
    f = 1.0 - skill
    extras = [f"head -n 3 {task.pool}", "cat generate.py", "cat evaluate.py", "ls base_model"]
    if task.interface == "workflow":
        extras.append("head -n 40 skills/train.py")
    looks = rng.sample(extras, rng.choice((0, 1, 1, 2)))[: max(0, (task.max_steps - 12) // 2)]  # a short budget trains
    look = ("ls" if rng.random() < 0.5 else "ls -la", *looks)
    odds = {"data_key": 0.45, "trl_arg": 0.45, "tokenizer": 0.4, "guard": 0.5, "high_lr": 0.35, "skip_data_check": 0.5}
    faults = frozenset(name for name, p in odds.items() if rng.random() < p * f)
    steps = rng.choice((6, 8, 8, 10))
    lr = 3e-3 if "high_lr" in faults else rng.choice((2e-4, 2e-4, 1e-4, 3e-4))
    return Plan(look=look, check_baseline=rng.random() < 0.3 + 0.4 * skill, faults=faults,
                first=Recipe(steps=steps, learning_rate=lr), iterate=rng.random() < 0.2 + 0.7 * skill,
                change=rng.choice(("steps", "lr")))


Program = Generator[Step, Seen, None]


@dataclass
class Episode:
    task: Task
    seed: int
    skill: float
    plan: Plan = field(init=False)
    n: int = 0  # steps taken
    last: Seen | None = None
    baseline: float | None = None
    trainings: int = 0

    def __post_init__(self) -> None:
        self.plan = draw_plan(self.task, self.seed, self.skill)
        self.baseline = self.task.baseline

    # -- helpers ----------------------------------------------------------------------------------------------

    @property
    def remaining(self) -> int:
        return self.task.max_steps - self.n

    def rng(self) -> random.Random:
        return seeded(self.seed, "posttrain-turn", self.task.description, self.n)

    def act(self, plan: str, command: str) -> Generator[Step, Seen, Seen]:
        opening = self.last.sentence(self.task, self.rng()) if self.last is not None else ""
        seen = yield Step(f"{opening} {plan}".strip(), command)
        self.n += 1
        self.last = seen
        return seen

    def better(self, a: float | None, b: float | None) -> bool:
        if a is None:
            return False
        if b is None:
            return True
        return a > b if self.task.higher_is_better else a < b

    def next_recipe(self, recipe: Recipe, score: float, best: float | None) -> tuple[Recipe, str] | None:
        """The one change the next run makes, with why, or None to stop training."""
        if self.trainings >= MAX_TRAININGS:
            return None
        if not self.better(score, self.baseline):
            if recipe.learning_rate >= 1e-3:
                return replace(recipe, learning_rate=2e-4), (
                    f"No gain over the base: a learning rate of {_lr(recipe.learning_rate)} is far too high for a full "
                    "fine-tune and has probably wrecked the model. I will train again at 2e-4, nothing else changed.")
            if recipe.steps < MOST_STEPS:
                return replace(recipe, steps=MOST_STEPS), (
                    f"No gain over the base after {recipe.steps} steps; the format may need more updates. I will "
                    f"train for {MOST_STEPS} steps, nothing else changed.")
            return None
        if recipe.learning_rate >= 1e-3:
            return replace(recipe, learning_rate=2e-4), (
                f"The fine-tune helps, but a learning rate of {_lr(recipe.learning_rate)} is unusually high for a full "
                "fine-tune. One change for the next run: 2e-4.")
        if not self.plan.iterate or (best is not None and self.better(best, score)):  # only improve on the best
            return None
        if self.plan.change == "steps" and recipe.steps < MOST_STEPS:
            return replace(recipe, steps=min(MOST_STEPS, recipe.steps * 2)), (
                f"The fine-tune helps. One change for the next run: {min(MOST_STEPS, recipe.steps * 2)} steps instead of "
                f"{recipe.steps}, to see whether more updates help.")
        lr = 1e-4 if recipe.learning_rate > 1e-4 else 2e-4
        return replace(recipe, learning_rate=lr), (
            f"The fine-tune helps. One change for the next run: learning rate {_lr(lr)} instead of "
            f"{_lr(recipe.learning_rate)}, to see which way the score moves.")

    # -- shared openings --------------------------------------------------------------------------------------

    def look_around(self) -> Generator[Step, Seen, None]:
        for i, command in enumerate(self.plan.look):
            if i == 0:
                yield from self.act("I have to post-train base_model/ and leave the result in final_model/. Let me "
                                    "see what the workspace holds.", command)
            elif command.startswith("head") and self.task.pool in command:
                yield from self.act("Let me look at a few rows of the training pool to see its keys.", command)
            elif command.startswith("ls base_model"):
                yield from self.act("Let me check which files the base model comes with.", command)
            else:
                yield from self.act(f"Let me read {command.split()[-1]} to see how the model is scored.", command)

    def base_score(self, evaluate: str) -> Generator[Step, Seen, None]:
        yield from self.act("First I record the base model's score: baseline.py copies base_model/ to final_model/.",
                            "python baseline.py")
        seen = yield from self.act("Now I score that copy of the base.", evaluate)
        if seen.score is not None:
            self.baseline = seen.score if self.baseline is None else self.baseline

    # -- cli ------------------------------------------------------------------------------------------------------

    def cli(self) -> Program:
        plan, task = self.plan, self.task
        yield from self.look_around()
        model = "none"  # what final_model/ holds: none | ok | worse (scored below the base, or refused)
        if plan.check_baseline and self.remaining > 10:
            yield from self.base_score("validate")
            model = "ok"
        recipe, faults = plan.first, set(plan.faults - {"skip_data_check", "high_lr"})
        yield from self.act(
            "I will write my own training script: TRL's SFTTrainer on the pool as prompt-completion chat rows (the "
            "question as one user turn, as generate.py renders it), torch threads from the sandbox, "
            f"{recipe.steps} steps of {recipe.batch_size} rows at learning rate {_lr(recipe.learning_rate)}, saved "
            "with save_pretrained to final_model/.", "create train.py")
        file = [""]
        written = train_script(task, recipe, frozenset(faults))
        seen = yield from self.act("Here is the script.", edit_command(file, written.splitlines()))
        if not seen.ok:  # the guard refused the edit: fix what it names and send it again
            faults.discard("guard")
            written = train_script(task, recipe, frozenset(faults))
            seen = yield from self.act("I left out an import; the same script with it.",
                                       edit_command(file, written.splitlines()))
            if not seen.ok:
                yield from self.act("The script will not go in; I submit the baseline instead.", "python baseline.py")
                yield from self.act("Submitting the base model.", "submit")
                return
        file = written.splitlines()
        best: float | None = None
        holder = ""  # where the best model is: final_model or best_model
        fixes = 0
        while True:
            seen = yield from self.act(
                f"Running the training ({recipe.steps} steps, learning rate {_lr(recipe.learning_rate)}).",
                "python train.py")
            if not seen.ok:
                fix = self._fix_script(seen.error, faults, recipe)
                if fix is None or fixes >= 3 or self.remaining < 5:
                    break
                faults.discard(fix[0])
                fixes += 1
                if fix[0] == "memory":
                    recipe = replace(recipe, optim="adafactor")
                written = train_script(task, recipe, frozenset(faults))
                yield from self.act(fix[1], edit_command(file, written.splitlines()))
                file = written.splitlines()
                continue
            self.trainings += 1
            seen = yield from self.act("Let me validate the fine-tuned model.", "validate")
            if not seen.ok and "tokenizer" in seen.error and "tokenizer" in faults and self.remaining > 4:
                faults.discard("tokenizer")
                written = train_script(task, recipe, frozenset(faults))
                yield from self.act("The model was refused because final_model/ lacks the base's tokenizer files. I "
                                    "add copying them to the script for later runs.",
                                    edit_command(file, written.splitlines()))
                file = written.splitlines()
                copy = " ".join(TOKENIZER_FILES)
                yield from self.act("And I copy them into this run's final_model/ now.",
                                    f"for f in {copy}; do if [ -f base_model/$f ]; then cp base_model/$f final_model/; "
                                    "fi; done; ls final_model")
                seen = yield from self.act("Validating again.", "validate")
            if seen.score is None:
                model = "worse"
                break
            model = "worse" if self.better(self.baseline, seen.score) else "ok"
            if self.better(seen.score, best) and self.better(seen.score, self.baseline):
                best, holder = seen.score, "final_model"
            step = self.next_recipe(recipe, seen.score, best)
            if step is None or self.remaining < 6:
                break
            recipe, why = step
            if holder == "final_model":
                yield from self.act(f"{why} First I keep a copy of this model.",
                                    "rm -rf best_model && cp -r final_model best_model")
                holder = "best_model"
                why = "Now the change."
            written = train_script(task, recipe, frozenset(faults))
            yield from self.act(why, edit_command(file, written.splitlines()))
            file = written.splitlines()
        yield from self.finish(best, "" if holder == "final_model" else holder, model,
                               "rm -rf final_model && cp -r best_model final_model")

    def _fix_script(self, error: str, faults: set[str], recipe: Recipe) -> tuple[str, str] | None:
        """(fault, what the fix does) for the error a run of train.py ended with, if the agent can tell."""
        if re.search(r"allocate memory|MemoryError|stopped: memory", error) and recipe.optim != "adafactor":
            return "memory", ("The run ran out of memory while creating the optimizer's state: AdamW keeps two fp32 "
                              "moments per weight. Adafactor keeps factored second moments only, so I switch to it.")
        if "KeyError" in error and "data_key" in faults:
            return "data_key", (f"The pool's rows keep the target under \"{self.task.answer_key}\", not the key my "
                                "script reads. Fixing that line.")
        if "unexpected keyword argument" in error and "trl_arg" in faults:
            return "trl_arg", "This TRL version calls the setting max_length; renaming the argument."
        return None

    def finish(self, best: float | None, holder: str, model: str, restore: str) -> Program:
        """Leave the best evaluated model in final_model/ and submit. `holder`: best_model/run when final_model/
        holds a worse model than the best one kept elsewhere; `model`: what final_model/ holds otherwise (none, ok,
        worse: a model scored below the base or refused)."""
        if holder and best is not None and self.remaining >= 2:
            yield from self.act(f"The last run was worse than the best one ({best:g}); putting that one back.",
                                restore)
        elif best is None and model in ("none", "worse") and self.remaining >= 2:
            yield from self.act("No fine-tune of mine beat the base, so I put the base model back in final_model/ "
                                "and submit that.", "python baseline.py")
        if best is not None:
            yield from self.act(f"final_model/ holds the best model I evaluated ({self.task.metric} {best:g}); "
                                "submitting it.", "submit")
        else:
            yield from self.act("Submitting what I have.", "submit")

    # -- workflow -------------------------------------------------------------------------------------------------

    def workflow(self) -> Program:
        plan, task = self.plan, self.task
        yield from self.look_around()
        yield from self.base_score("evaluate")
        recipe, faults = plan.first, set(plan.faults & {"data_key", "trl_arg"})
        data, validated = task.pool, False
        best: float | None = None
        best_run: int | None = None
        holder = ""  # final_model | run (final_model/ holds another run than the best)
        model = "ok"  # baseline.py has put the base in final_model/; worse: a run scored below it
        why = ("The base does not answer in the required form. Plan: SFT on the pool, "
               f"{recipe.steps} steps of {recipe.batch_size} rows at learning rate {_lr(recipe.learning_rate)}; "
               f"success: {task.metric} above the base's.")
        iteration = 1
        while True:
            if self.remaining < 6:
                break
            yield from self.act(f"Iteration {iteration}: I write down the plan first.", f"plan {why}")
            if not validated and "data_key" in faults:
                key = "completion" if task.answer_key != "completion" else "response"
                wrong = "response" if key == "completion" else "target"
                yield from self.act(
                    "I convert the pool to prompt/completion rows for the trainer.",
                    self._convert(wrong))
                seen = yield from self.act("Checking the converted file.", "data_validate sft.jsonl")
                if not seen.ok:
                    faults.discard("data_key")
                    yield from self.act(f"The rows need a \"{key}\" key, not \"{wrong}\"; converting again.",
                                        self._convert(key))
                    seen = yield from self.act("Checking it again.", "data_validate sft.jsonl")
                data, validated = ("sft.jsonl", True) if seen.ok else (task.pool, False)
            elif not validated and "skip_data_check" not in plan.faults:
                seen = yield from self.act("The pool is the training data; checking it before training.",
                                           f"data_validate {data}")
                validated = seen.ok
            config = f"sft{iteration}.yaml"
            text = train_config(data, recipe, frozenset(faults))
            yield from self.act(f"The run's config: {recipe.steps} steps, learning rate {_lr(recipe.learning_rate)}.",
                                f"cat > {config} <<'EOF'\n{text}EOF")
            seen = yield from self.act("Training.", f"train {config}")
            if not seen.ok and "max_seq_length" in seen.error and "trl_arg" in faults and self.remaining > 4:
                faults.discard("trl_arg")
                text = train_config(data, recipe, frozenset(faults))
                yield from self.act("The skill calls that setting max_length; fixing the config.",
                                    f"cat > {config} <<'EOF'\n{text}EOF")
                seen = yield from self.act("Training again.", f"train {config}")
            if not seen.ok or seen.run is None:
                break
            self.trainings += 1
            run = seen.run
            holder = "run" if holder == "final_model" else holder
            seen = yield from self.act("Scoring the run's model.", "evaluate")
            if seen.score is None:
                model = "worse"
                break
            model = "worse" if self.better(self.baseline, seen.score) else "ok"
            if self.better(seen.score, best) and self.better(seen.score, self.baseline):
                best, best_run, holder = seen.score, run, "final_model"
            step = self.next_recipe(recipe, seen.score, best)
            base = "n/a" if self.baseline is None else f"{self.baseline:g}"
            verdict = (f"Run {run}: {task.metric} {seen.score:g} (base {base}"
                       + (f", best so far {best:g})." if best is not None else ")."))
            if step is None or self.remaining < 8:
                yield from self.act("I log what this iteration showed.", f"log {verdict} Stopping here.")
                break
            recipe, why = step
            yield from self.act("I log what this iteration showed.", f"log {verdict} Next: {why}")
            iteration += 1
        restore = f"cp -r runs/{best_run}/checkpoint/. final_model/"
        if holder == "run" and self.remaining >= 3:
            yield from self.act(f"The last run was worse than run {best_run} ({best:g}); putting that one back.",
                                restore)
            yield from self.act("Evaluating it again, to be sure final_model/ is the best model.", "evaluate")
            holder = ""
        yield from self.finish(best, holder if holder == "run" else "", model, restore)

    def _convert(self, key: str) -> str:
        pool, answer = self.task.pool, self.task.answer_key
        return ("python -c \"import json; rows = [json.loads(l) for l in open('" + pool + "') if l.strip()]; "
                "open('sft.jsonl', 'w').writelines(json.dumps({'prompt': r['prompt'], '" + key + "': r['" + answer
                + "']}) + '\\n' for r in rows)\"")

    def program(self) -> Program:
        return self.workflow() if self.task.interface == "workflow" else self.cli()


# ---- one turn -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    thought: str
    action: str
    observation: str | None  # None: elided by the agent loop, or not there yet


def turns_of(history: list[tuple[str, str]]) -> list[Turn]:
    """The agent's earlier steps from the messages after the task prompt."""
    turns = []
    for i, (role, text) in enumerate(history):
        if role != "assistant":
            continue
        try:
            thought, action = parse_reply(text)
        except FormatError:
            continue
        following = history[i + 1][1] if i + 1 < len(history) and history[i + 1][0] == "user" else None
        observation = None
        if following is not None and not _ELIDED.match(following.strip()):
            cut = following.rfind("(Current Step:")
            observation = (following[:cut] if cut >= 0 else following).rstrip()
        turns.append(Turn(thought, action, observation))
    return turns


def next_step(task: Task, history: list[tuple[str, str]], *, seed: int, skill: float) -> Step:
    """The agent's next step: the episode's program replayed over its earlier steps."""
    turns = turns_of(history)
    episode = Episode(task, seed, skill)
    program = episode.program()
    step = next(program)
    try:
        for i, turn in enumerate(turns):
            if turn.action.strip() != step.command.strip():
                return Step("I have lost track of my plan, so I will submit what I have.", "submit")
            seen = recall(turns[i + 1].thought) if i + 1 < len(turns) else observe(turn.action, turn.observation or "")
            step = program.send(seen)
    except StopIteration:
        return Step("The task is done; submitting.", "submit")
    return step
