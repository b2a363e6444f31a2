"""The offline teacher's task writers: MLGym configs from a proposal, then starter code from the configs.

Families and entrypoints:
- tabular_classification, tabular_regression, time_series_forecasting: CSVSubmissionTasks
- model_submission: ModelSubmissionTasks
- game_strategy: PythonSubmissionTasks (no dataset)
- post_training: PythonSubmissionTasks with post_training.yaml (fine-tune a language model; docs/post-training.md)

The family comes from the topic's vocabulary entry, else from the dataset card; everything else (id,
target, metric, model, wording, game parameters) is drawn from an RNG seeded by the request seed and the
inputs. The two stages run under different seeds, so the code writer reads what it must agree with
back from the configs (entrypoint and the description's facts block) and the dataset.
"""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import yaml

from gymforge.tasks.mlgym import DatasetConfig, TaskConfig, dump_yaml
from gymforge.offline import vocabulary
from gymforge.tasks.metrics import known_metric, same_metric
from gymforge.offline.families import (
    bugs,
    classification,
    forecasting,
    games,
    model_submission,
    post_training,
    regression,
    tabular,
)
from gymforge.offline.families.common import (
    HIGHER_IS_BETTER,
    TaskSpec,
    columns,
    markdown,
    n_rows,
    other_style,
    parse_facts,
    proposal_text,
    seeded,
)

FAMILIES: dict[str, ModuleType] = {
    m.NAME: m for m in (classification, regression, forecasting, model_submission, games, post_training)
}
_BY_PROBLEM = {"classification": classification.NAME, "regression": regression.NAME, "forecasting": forecasting.NAME}


def detect_family(topic: str, dataset: dict[str, Any] | None) -> str:
    """The vocabulary's family for the topic when the dataset can carry it, else the problem the topic names,
    else the card's task type."""
    if dataset is None:
        return games.NAME
    entry = vocabulary.lookup(topic)
    if entry is not None and entry.family in FAMILIES and entry.family != games.NAME:
        return entry.family
    return _BY_PROBLEM[tabular.problem_of(dataset, topic)]


def _plan(proposal: dict[str, Any], rng: random.Random) -> TaskSpec:
    family = detect_family(str(proposal["topic"]), proposal.get("dataset"))
    # A dataset without a column of the wanted kind still makes a task of another kind.
    for name in (family, classification.NAME, regression.NAME):
        spec = FAMILIES[name].plan(proposal, rng)
        if spec is not None:
            return spec
    raise ValueError(f"dataset {proposal['dataset'].get('id')!r} has no column a task could predict")


def _dataset_name(task_id: str) -> str:
    # Named after the task: two tasks on one dataset have different data paths, so they need two configs.
    return f"{task_id}_data" if "_" in task_id else f"{task_id}Data"


def _dataset_doc(spec: TaskSpec, dataset: dict[str, Any]) -> str:
    how = (dataset.get("card_data") or {}).get("split") or (
        "chronological: test is the tail of the series" if spec.family == forecasting.NAME else "random")
    lines = [str(dataset.get("description") or dataset.get("id", "")).strip(), "",
             f"Source: {dataset.get('id')}, a local copy in Hugging Face `datasets` format: {spec.n_rows} rows split "
             f"into `train` and `test` ({how}).", "", "Columns (name, dtype, role, example values):"]
    for c in spec.columns:
        role = "target" if c.name == spec.target else "time order" if c.kind == "time" else "feature"
        examples = ", ".join(dict.fromkeys(str(v) for v in c.examples))
        lines.append(f"- {c.name} ({c.dtype}, {role})" + (f": e.g. {examples}" if examples else ""))
    return "\n".join(line.rstrip() for line in lines)


def _key(proposal: dict[str, Any]) -> list[Any]:
    return [proposal.get("topic"), (proposal.get("dataset") or {}).get("id")]


def write_configs(proposal: dict[str, Any], *, seed: int, attempt: int) -> str:
    """The teacher's answer to `write_configs`: the task config and, with a dataset, its dataset config."""
    dataset = proposal.get("dataset")
    rng = seeded(seed, "configs", _key(proposal))
    spec = _plan(proposal, rng)
    module = FAMILIES[spec.family]
    if not bugs.metric_drift(_key(proposal), seed, attempt):
        # The metric chosen is carried into the proposal's sentence; a drifting draft keeps the sentence as it was.
        proposal = {**proposal, "description": carry_metric(proposal, spec)}
    baseline, evaluation = module.file_names(spec)
    task: dict[str, Any] = {"id": spec.task_id, "name": str(proposal["topic"]),
                            "description": module.describe(spec, proposal, rng)}
    files: dict[str, str] = {}
    if dataset is not None:
        name = _dataset_name(spec.task_id)
        task["dataset_configs"] = [f"datasets/{name}.yaml"]
        doc = getattr(module, "dataset_doc", _dataset_doc)(spec, dataset)
        files[f"configs/datasets/{name}.yaml"] = dump_yaml(DatasetConfig(
            name=name, description=doc, data_path=f"data/{spec.task_id}/data", is_local=True))
    task |= {
        "task_entrypoint": module.ENTRYPOINT, "training_timeout": rng.choice((600, 900, 1200, 1800)),
        "use_generic_conda": True, "starter_code": [f"data/{spec.task_id}/{f}" for f in (baseline, evaluation)],
        "baseline_paths": [baseline], "evaluation_paths": [evaluation], "evaluation_read_only": True,
    }
    if (extra := getattr(module, "config_fields", None)) is not None:
        task |= extra(spec)
    bug = bugs.config_bug(_key(proposal), seed, attempt)
    if bug == "id_mismatch":
        task["id"] = other_style(spec.task_id)
    elif bug == "unescaped_brace":
        task["description"] = bugs.unescape_braces(task["description"])
    # model_construct: a buggy draft must reach the page as written, not be rejected here.
    files = {f"configs/tasks/{spec.task_id}.yaml": dump_yaml(TaskConfig.model_construct(**task)), **files}
    return markdown(files)


def carry_metric(proposal: dict[str, Any], spec: TaskSpec) -> str:
    """The proposal's description with its metric phrase ("mae (lower is better)") rewritten to the metric the
    task scores, when the proposal named a metric the task does not score; else as it was."""
    text, stated = proposal_text(proposal), str(proposal.get("metric") or "")
    name = stated.split(" (", 1)[0]
    if not stated or not known_metric(name) or same_metric(name, spec.metric):
        return text
    return text.replace(stated, f"{spec.metric} ({spec.direction})")


def metric_drift(proposal: dict[str, Any], *, seed: int, attempt: int) -> bool:
    """Whether `write_configs` lets this draft score another metric than the proposal's sentence names."""
    return bugs.metric_drift(_key(proposal), seed, attempt)


def config_bug(proposal: dict[str, Any], *, seed: int, attempt: int) -> str | None:
    """Which bug `write_configs` puts in this draft: None, "id_mismatch" or "unescaped_brace"."""
    return bugs.config_bug(_key(proposal), seed, attempt)


def _task_config(configs: dict[str, str]) -> dict[str, Any]:
    parsed = {path: yaml.safe_load(text) for path, text in configs.items()}
    task = next((doc for path, doc in parsed.items() if "tasks/" in path and isinstance(doc, dict)), None)
    task = task or next((doc for doc in parsed.values() if isinstance(doc, dict) and "task_entrypoint" in doc), None)
    if task is None:
        raise ValueError(f"no task config among {sorted(configs)}")
    return task


def spec_from_configs(configs: dict[str, str], dataset: dict[str, Any] | None) -> TaskSpec:
    """The task as the configs state it: entrypoint and description facts, completed from the dataset."""
    task = _task_config(configs)
    facts = parse_facts(str(task.get("description", "")))
    task_id = str(task["id"])
    entrypoint = task.get("task_entrypoint", classification.ENTRYPOINT)
    if post_training.is_post_training(task):
        if dataset is None:
            raise ValueError(f"post-training task {task_id} needs its dataset to write code against")
        return post_training.spec_from(task, dataset)
    if entrypoint == games.ENTRYPOINT:
        return TaskSpec(family=games.NAME, task_id=task_id, metric="Score", game=games.parse_game(facts))
    if dataset is None:
        raise ValueError(f"task {task_id} ({entrypoint}) needs its dataset to write code against")
    problem = facts.get("task") or tabular.problem_of(dataset)
    family = model_submission.NAME if entrypoint == model_submission.ENTRYPOINT else _BY_PROBLEM[problem]
    metric = facts.get("metric", "").split(" ")[0]
    if metric not in HIGHER_IS_BETTER:
        metric = "accuracy" if problem == "classification" else "rmse"
    time_column = facts.get("time column", "")
    return TaskSpec(
        family=family, task_id=task_id, metric=metric, problem=problem,
        target=facts.get("target column") or str((dataset.get("card_data") or {}).get("target", "")),
        time_column=time_column, columns=tuple(columns(dataset, time_column or None)),
        n_rows=n_rows(dataset),
    )


def _code_bug(spec: TaskSpec, seed: int, attempt: int) -> str | None:
    return bugs.code_bug(spec.task_id, seed, attempt, has_columns=bool(spec.columns))


def write_code(configs: dict[str, str], dataset: dict[str, Any] | None, *, seed: int, attempt: int) -> str:
    """The teacher's answer to `write_code`: baseline and evaluation scripts under `data/<task id>/`."""
    spec = spec_from_configs(configs, dataset)
    module = FAMILIES[spec.family]
    sources: dict[str, str] = module.files(spec, seeded(seed, "code", spec.task_id))
    baseline, evaluation = module.file_names(spec)
    bug, rng = _code_bug(spec, seed, attempt), bugs.bug_rng(seed, spec.task_id)
    if bug == "missing_import":
        # The slip lands in the baseline when it imports anything (some heuristics import nothing).
        for path in (baseline, evaluation):
            if (changed := bugs.drop_import(sources[path], rng)) is not None:
                sources = {**sources, path: changed}
                break
    elif bug == "wrong_column" and hasattr(module, "misname_column"):
        sources = module.misname_column(sources, spec, rng)
    elif bug == "wrong_column":
        sources = {**sources, baseline: bugs.misname_column(sources[baseline], [c.name for c in spec.columns], rng)}
    elif bug == "runtime":
        sources = module.runtime_bug(sources, spec, rng)
    if (sloppy := _sloppy(spec, seed, attempt)) is not None:
        sources = sloppy(sources, spec, seeded(seed, "sloppy-details", spec.task_id))
    return markdown({f"data/{spec.task_id}/{name}": text for name, text in sources.items()})


def code_bug(configs: dict[str, str], dataset: dict[str, Any] | None, *, seed: int, attempt: int) -> str | None:
    """Which bug `write_code` puts in this draft: None, "missing_import", "wrong_column" or "runtime"."""
    return _code_bug(spec_from_configs(configs, dataset), seed, attempt)


def sloppy_evaluator(configs: dict[str, str], dataset: dict[str, Any] | None, *, seed: int, attempt: int) -> bool:
    """Whether `write_code` gives this draft a sloppy evaluator (one the evaluator probes game)."""
    return _sloppy(spec_from_configs(configs, dataset), seed, attempt) is not None


def _sloppy(spec: TaskSpec, seed: int, attempt: int):
    """The family's `sloppy_evaluator(sources, spec, rng)` when this draft gets one, else None."""
    module = FAMILIES[spec.family]
    make = getattr(module, "sloppy_evaluator", None)
    applies = getattr(module, "has_sloppy_evaluator", lambda _: True)
    return make if make is not None and applies(spec) and bugs.sloppy_evaluator(spec.task_id, seed, attempt) else None
