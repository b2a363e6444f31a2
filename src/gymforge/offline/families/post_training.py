"""Post-training tasks (PythonSubmissionTasks with `post_training.yaml`, docs/post-training.md): fine-tune a small
instruction-tuned language model so that it answers questions about single rows of a tabular dataset.

The config writer fixes the question and answer templates over the dataset's columns (a few feature columns and
the label, an answer format: the bare label, `Label: value` or a JSON object) and states them as facts; the code
writer puts them in `post_training.yaml`'s `source`, from which gymforge renders the pool (the train split) and
the held-out rows (the test split) when it builds the task. The files are the built-in penguin task's:
`generate.py` (greedy generation with the chat template), `evaluate.py` (exact match of the reply's first line),
`baseline.py` (the base model copied to `final_model/`).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from gymforge.offline.families import tabular
from gymforge.offline.families.common import (
    Column,
    TaskSpec,
    columns,
    description,
    escape_braces,
    make_id,
    n_rows,
    parse_facts,
    program,
    proposal_text,
    words,
)

NAME = "post_training"
ENTRYPOINT = "PythonSubmissionTasks"
FILES = ("baseline.py", "evaluate.py")
SPEC, GENERATOR, HELD_OUT, POOL = "post_training.yaml", "generate.py", "test.jsonl", "data/train.jsonl"
MAX_FEATURES = 4
FORMATS = {"plain": 8, "labelled": 12, "json": 16}  # answer format -> max new tokens
TRAINING_TIMEOUT = 900  # seconds: the built-in penguin task's budget

QUESTIONS = (
    "One {subject} record: {pairs}. What is its {target}? Reply with the {target} only.",
    "Given {pairs}, which {target} is this {subject} record? Answer with the {target} alone.",
    "{Subject} record with {pairs}. Name its {target}.",
)
ANSWER_RULES = {
    "plain": "The reply is the {target} value alone, e.g. `{example}`.",
    "labelled": "The reply is one line `{Target}: <value>`, e.g. `{example}`.",
    "json": "The reply is one JSON object with the key {key}, e.g. `{example}`.",
}


def _label(name: str) -> str:
    return name.replace("_", " ").strip()


def _field(column: Column) -> str:
    return f"{{{column.name}:g}}" if column.kind == "numeric" and column.dtype.startswith("float") else f"{{{column.name}}}"


def answer_template(target: str, style: str) -> str:
    if style == "json":
        return '{{"' + target + '": "{' + target + '}"}}'
    if style == "labelled":
        return _label(target).capitalize() + ": {" + target + "}"
    return "{" + target + "}"


def _style(topic: str, rng: random.Random) -> str:
    lowered = topic.lower()
    if "json" in lowered:
        return "json"
    if "format" in lowered:
        return "labelled"
    return rng.choices(("plain", "labelled", "json"), weights=(0.6, 0.25, 0.15))[0]


def plan(proposal: dict[str, Any], rng: random.Random) -> TaskSpec | None:
    """The label, the question's columns and the answer format; None when the dataset has no label column."""
    dataset = proposal["dataset"]
    target = tabular.pick_target(dataset, "classification", proposal["topic"], rng)
    if target is None:
        return None
    cols = columns(dataset)
    features = [c for c in cols if c.name != target.name and c.kind != "time" and c.name.lower() not in ("id", "index")]
    chosen = sorted(rng.sample(features, min(MAX_FEATURES, len(features))), key=features.index)
    if not chosen:
        return None
    subject = _label(str(dataset.get("id", "")).split("/")[-1]) or "data"
    pairs = ", ".join(f"{_label(c.name)} {_field(c)}" for c in chosen)
    question = rng.choice(QUESTIONS).format(subject=subject, Subject=subject.capitalize(), pairs=pairs,
                                            target=_label(target.name))
    style = _style(str(proposal["topic"]), rng)
    facts = (("target column", target.name), ("answer format", style), ("question", question),
             ("answer", answer_template(target.name, style)), ("max new tokens", str(FORMATS[style])))
    name = [w for w in words(subject) if not w.isdigit()][:2] + words(_label(target.name))[:1] + ["posttrain"]
    return TaskSpec(family=NAME, task_id=make_id(name, rng), metric="accuracy", problem="classification",
                    target=target.name, columns=tuple(cols), n_rows=n_rows(dataset), facts=facts)


def spec_from(task: dict[str, Any], dataset: dict[str, Any]) -> TaskSpec:
    """The task as its config states it (the facts block), completed from the dataset."""
    facts = parse_facts(str(task.get("description", "")))
    return TaskSpec(family=NAME, task_id=str(task["id"]), metric="accuracy", problem="classification",
                    target=facts.get("target column", ""), columns=tuple(columns(dataset)), n_rows=n_rows(dataset),
                    facts=tuple((k, facts[k]) for k in ("target column", "answer format", "question", "answer",
                                                       "max new tokens") if k in facts))


def is_post_training(task: dict[str, Any]) -> bool:
    return any(str(p).endswith("/" + SPEC) for p in task.get("starter_code") or [])


def file_names(spec: TaskSpec) -> tuple[str, str]:
    return FILES


def config_fields(spec: TaskSpec) -> dict[str, Any]:
    """What the task config needs beyond the common fields: every starter file, the secret held-out rows."""
    here = f"data/{spec.task_id}"
    return {"starter_code": [f"{here}/{f}" for f in (SPEC, GENERATOR, *FILES)], "secret_files": [f"{here}/{HELD_OUT}"],
            "training_timeout": TRAINING_TIMEOUT}


def _example(spec: TaskSpec) -> tuple[str, str]:
    """A question and its answer rendered from the card's first example row (placeholders when it has none)."""
    facts = dict(spec.facts)
    row = {c.name: (c.examples[0] if c.examples else f"<{c.name}>") for c in spec.columns}

    def fill(template: str) -> str:
        return re.sub(r"\{(\w+)(?::g)?\}", lambda m: str(row.get(m.group(1), m.group(0))),
                      template.replace("{{", "\0").replace("}}", "\1")).replace("\0", "{").replace("\1", "}")

    return fill(facts["question"]), fill(facts["answer"])


def describe(spec: TaskSpec, proposal: dict[str, Any], rng: random.Random) -> str:
    facts = dict(spec.facts)
    target, style = spec.target, facts["answer format"]
    question, answer = _example(spec)
    rule = ANSWER_RULES[style].format(target=_label(target), Target=_label(target).capitalize(),
                                      key=json.dumps(target), example=answer)
    body = [escape_braces(
        "Post-train the language model in base_model/ (a Hugging Face folder, read-only; SmolLM2-135M-Instruct "
        "offline) so that it answers questions about single rows of the dataset below with the right "
        f"{_label(target)} and nothing else. {rule}"),
        "{dataset_docs}",
        f"Save your model with save_pretrained to final_model/ (safetensors weights, its config and the base's "
        f"tokenizer files); `python baseline.py` copies the base model there unchanged, which is the baseline. "
        f"The score is taken on held-out questions that are not in the workspace: generate.py (the task's own; "
        f"your copy is not used) renders each question with the tokenizer's chat template as one user turn and "
        f"decodes greedily, at most {facts['max new tokens']} new tokens; a reply counts when its first line, "
        "lower-cased and stripped of outer spaces and punctuation, equals the answer. Metric: accuracy, higher is "
        "better. `python evaluate.py` prints it as one JSON object; evaluate.py is read-only.",
    ]
    closing = rng.choice((
        "Rules: final_model/ must be fine-tuned from base_model/ (same architecture and config, the base's "
        "tokenizer, the same tensor names and shapes, weights close to the base's); another checkpoint, a "
        "re-initialised one or pickled weights are rejected. Training data that reproduces held-out questions is "
        "flagged. Use an existing trainer (TRL's SFTTrainer or transformers' Trainer) and set "
        "torch.set_num_threads to $GYMFORGE_TORCH_THREADS, the cores your commands have.",
        "Only the safetensors weights of final_model/ are loaded, and only if they descend from base_model/ (same "
        "config, tokenizer, tensor names and shapes, weights near the base's). Do not train on held-out questions: "
        "such data is flagged. Train with an existing trainer (TRL's SFTTrainer or transformers' Trainer), "
        "torch.set_num_threads($GYMFORGE_TORCH_THREADS).",
    ))
    example = f"A pool row: {json.dumps({'id': 0, 'prompt': question, 'answer': answer})}"
    return description(proposal_text(proposal), body, facts, example, closing)


def dataset_doc(spec: TaskSpec, dataset: dict[str, Any]) -> str:
    question, answer = _example(spec)
    return "\n".join([
        str(dataset.get("description") or dataset.get("id", "")).strip(), "",
        f"Questions and answers made from the train split of {dataset.get('id')} ({spec.n_rows} rows in all, split "
        f"into train and test), one JSON object a line in {POOL}, e.g. "
        f"{json.dumps({'id': 0, 'prompt': question, 'answer': answer})}. The held-out questions come from the test "
        "split and are not in the workspace.",
    ])


def files(spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    facts = dict(spec.facts)
    tokens = int(facts.get("max new tokens", FORMATS["plain"]))
    source = {"prompt": facts["question"], "answer": facts["answer"], "eval_rows": 40}
    spec_yaml = "\n".join([
        "# gymforge post-training task (gymforge.tasks.posttraining.PostTrainingSpec); gymforge renders the pool and",
        "# the held-out rows from the task's dataset with `source` when it builds the task.",
        "base_model: smollm2-135m", f"eval_file: {HELD_OUT}", f"train_files: [{POOL}]", f"generator: {GENERATOR}",
        "metric: accuracy", "source:", *(f"  {k}: {json.dumps(v)}" for k, v in source.items()), ""])
    return {
        SPEC: spec_yaml,
        GENERATOR: program("posttrain_generate.py.j2", pool=POOL, max_new_tokens=tokens),
        "evaluate.py": program("posttrain_evaluate.py.j2", task_id=spec.task_id, eval_file=HELD_OUT,
                               max_new_tokens=tokens),
        "baseline.py": program("posttrain_baseline.py.j2", task_id=spec.task_id),
    }


def misname_column(sources: dict[str, str], spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    """A column of the question template misspelt in `post_training.yaml`: the build's template check finds it."""
    names = re.findall(r"\{(\w+)(?::g)?\}", dict(spec.facts)["question"])
    name = rng.choice(names)
    wrong = rng.choice([v for v in (f"{name}s", name.capitalize(), name[:4], f"{name}_value") if v != name])
    return {**sources, SPEC: sources[SPEC].replace("{" + name, "{" + wrong, 1)}


def runtime_bug(sources: dict[str, str], spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    """The evaluation reads the held-out rows under another name: only running it shows the missing file."""
    wrong = rng.choice(("held_out.jsonl", "eval.jsonl", "test.json"))
    return {**sources, "evaluate.py": sources["evaluate.py"].replace(f'HELD_OUT = "{HELD_OUT}"', f'HELD_OUT = "{wrong}"')}


def sloppy_evaluator(sources: dict[str, str], spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    """A reply counts when the answer starts with it ("truncated replies are fine"): an empty reply matches every
    answer, which the probes' empty-generation model shows."""
    old = "return isinstance(reply, str) and normalise(reply) == normalise(answer)"
    new = "return isinstance(reply, str) and normalise(answer).startswith(normalise(reply))"
    return {**sources, "evaluate.py": sources["evaluate.py"].replace(old, new)}
