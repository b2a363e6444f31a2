"""Best Attempt, Best Submission and AUP (area under the performance profile) of MLGym-format runs
(docs/scores.md, Scores).

Input: run folders named `<model>__<task>__<anything>`, each holding a `results.json` of the form
`{"agent": [<metric dict>, ...], "baseline": <metric dict>}` (the agent's scores in order, one per validate or
submit). MLGym writes names like `litellm:gpt-4o__rlMetaMazeMisc__default__t-0.00__p-0.95__c-4.00__install-0_run_0`;
ours look like `student-sft__blobClustering__run0`.

Pipeline:
1. `load_runs` -> `RunResult` per run folder;
2. `build_table` -> `ScoreTable`: per task and model the best over its runs of Best Attempt / Best Submission, plus
   the `baseline` pseudo-model;
3. `compute_aup` -> `AupResult`: per-task ratios, the performance profiles rho_m(tau) and the AUP of every model for
   both variants ("Best AUP" from Best Attempt, "Last AUP" from Best Submission);
4. `aup_csv` (the `Model,Best AUP,Last AUP` table) and `summarize` (a JSON-able report for `scores.json`).
`run_aup` chains them for the `gymforge aup` command.

The algorithm is MLGym's (`calculate_performance_ratios`, `compute_performance_profile`, `compute_aup`).
Degenerate cases, where MLGym crashes or is undefined, are decided here:
- A ratio that divides by zero (higher is better: a feasible score of 0 while the best is > 0; lower is better: a
  feasible score > 0 while the best is 0) is treated like an infeasible score: it gets worst_ratio * (1 + eps), and
  worst_ratio is the largest *finite* ratio. Scores equal to the best always get ratio 1 (so 0 vs a best of 0 is 1).
- A task where no model (baseline included) is feasible: every model gets the failure ratio 1 * (1 + eps), i.e.
  worst_ratio = 1; the task still counts in the denominator of rho, equally for everyone.
- A task where only the baseline is feasible needs no special case: baseline ratio 1, worst_ratio 1, every other
  model 1 + eps, max_tau 2.
- A task without a baseline value: the "score <= / >= baseline" condition is dropped (feasible iff score >= 0, as
  MLGym's NaN comparisons do) and the baseline pseudo-model counts as missing there. A warning is logged.
- T == 0 happens only with no tasks at all (with any task, max_tau >= ceil(1 + eps) = 2, so T >= 0.4): tau is then
  500 zeros, every rho is 0 and every AUP is 0.0.
- T is rounded up to one decimal exactly (integer arithmetic on max_tau), so log10(10) = 1 gives T = 1.0, never 1.1.
- NaN / infinite metric values are ignored like non-numeric ones.
"""
# long file: the AUP pipeline in the steps its docstring lists (runs, table, ratios, profile, bootstrap, CSV)

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from gymforge.core import atomic
from gymforge.core.metrics import last_score, valid_metric, valid_metrics
from gymforge.tasks.mlgym import BENCHMARK_TASKS

log = logging.getLogger("gymforge.benchmark.aup")

EPS = 0.05
N_TAU = 500
BASELINE = "baseline"
RESULTS_FILE = "results.json"
Variant = Literal["attempt", "submission"]
VARIANTS: tuple[Variant, Variant] = ("attempt", "submission")


class AupError(ValueError):
    """Bad input to the scorer (metadata file, runs directory); the message names the file and entry."""


# ---------------------------------------------------------------------------------------------------------------------
# Task metadata


class TaskMeta(BaseModel):
    """A benchmark task and the metric that ranks its scores."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    metric: str = Field(min_length=1, description="Priority metric: the key of the results.json score dicts.")
    higher_is_better: bool


class _MetaEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metric: str = Field(min_length=1)
    higher_is_better: StrictBool


def mlgym_task_meta() -> dict[str, TaskMeta]:
    """MLGym-Bench's 13 tasks, in MLGym's order."""
    return {tid: TaskMeta(id=tid, metric=pm.metric, higher_is_better=pm.higher_is_better)
            for tid, pm in BENCHMARK_TASKS.items()}


def _task_id_problem(tid: Any) -> str | None:
    if not isinstance(tid, str) or not tid.strip():
        return "task id must be a non-empty string"
    if "__" in tid or "/" in tid or any(c.isspace() for c in tid):
        return "task id must not contain '__', '/' or whitespace (run folders are named <model>__<task>__<run>)"
    return None


def load_task_meta(path: str | Path) -> dict[str, TaskMeta]:
    """Task metadata from a YAML or JSON file (JSON when the name ends in `.json`, YAML otherwise).

    The file is a mapping from task id to the task's priority metric and its direction::

        blobClustering:
          metric: silhouette
          higher_is_better: true
        3SATTime:
          metric: Time
          higher_is_better: false

    `metric` is a non-empty string (a key of the score dicts in results.json); `higher_is_better` is a boolean
    (true/false, not a string). No other keys are allowed. Every problem is reported at once, each naming the file
    and the task id; the error is an `AupError` (a `ValueError`).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise AupError(f"{path}: cannot read task metadata: {exc}") from exc
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise AupError(f"{path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'}: {exc}") from exc
    if not isinstance(data, dict) or not data:
        raise AupError(f"{path}: expected a non-empty mapping of task id -> {{metric, higher_is_better}}, "
                       f"got {type(data).__name__ if data is not None else 'an empty file'}")
    metas: dict[str, TaskMeta] = {}
    errors: list[str] = []
    for tid, entry in data.items():
        problem = _task_id_problem(tid)
        if problem:
            errors.append(f"{path}: task {tid!r}: {problem}")
            continue
        if not isinstance(entry, dict):
            errors.append(f"{path}: task {tid!r}: expected a mapping with keys 'metric' and 'higher_is_better', "
                          f"got {type(entry).__name__}")
            continue
        try:
            e = _MetaEntry.model_validate(entry)
        except ValidationError as exc:
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"]) or "entry"
                errors.append(f"{path}: task {tid!r}: {loc}: {err['msg']}")
            continue
        metas[tid] = TaskMeta(id=tid, metric=e.metric, higher_is_better=e.higher_is_better)
    if errors:
        raise AupError("\n".join(errors))
    return metas


def resolve_tasks(tasks: str | Path | Mapping[str, TaskMeta]) -> dict[str, TaskMeta]:
    """`"mlgym"` -> MLGym's 13 tasks; a path -> `load_task_meta`; a mapping -> itself (checked)."""
    if isinstance(tasks, Mapping):
        out = dict(tasks)
        for tid, meta in out.items():
            if not isinstance(meta, TaskMeta) or meta.id != tid:
                raise AupError(f"task {tid!r}: expected a TaskMeta with id {tid!r}, got {meta!r}")
        return out
    if isinstance(tasks, str) and tasks == "mlgym":
        return mlgym_task_meta()
    return load_task_meta(tasks)


# ---------------------------------------------------------------------------------------------------------------------
# Runs


class RunResult(BaseModel):
    """One run folder `<model>__<task>__<run>` and its results.json."""

    model: str
    task: str
    run: str = Field(description="The rest of the folder name after <model>__<task>__.")
    scores: list[dict[str, float]] = Field(description='results.json "agent": one metric dict per validate/submit.')
    baseline: dict[str, float] | None = Field(description='results.json "baseline".')
    path: Path = Field(description="The run folder.")


def parse_run_name(name: str, known_tasks: Iterable[str] | None = None) -> tuple[str, str, str] | None:
    """(model, task, run) from `<model>__<task>__<run>`, or None when the name does not have that shape.

    With `known_tasks`, the task is the first `__`-separated part (after the first) that is a known task id, so a
    model name containing `__` still parses; otherwise the model is the first part and the task the second.
    """
    parts = name.split("__")
    if len(parts) < 3:
        return None
    split = 1
    if known_tasks is not None:
        known = set(known_tasks)
        split = next((i for i in range(1, len(parts) - 1) if parts[i] in known), 1)
    model, task, run = "__".join(parts[:split]), parts[split], "__".join(parts[split + 1:])
    if not model or not task:
        return None
    return model, task, run


def read_results(path: Path) -> tuple[list[dict[str, float]], dict[str, float] | None]:
    """(agent scores, baseline) of one results.json; raises ValueError/OSError when it is unusable.

    A missing or null "agent" is a run without scores (it exists, but contributes nothing). Agent entries that are
    not objects become empty dicts (they still count as the last entry for Best Submission).
    """
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    agent = data.get("agent")
    if agent is None:
        agent = []
    if not isinstance(agent, list):
        raise ValueError(f'"agent" must be a list of metric objects, got {type(agent).__name__}')
    scores = [valid_metrics(e) if isinstance(e, dict) else {} for e in agent]
    baseline = data.get("baseline")
    if baseline is not None and not isinstance(baseline, dict):
        log.warning("%s: ignoring \"baseline\": expected an object, got %s", path, type(baseline).__name__)
        baseline = None
    return scores, (valid_metrics(baseline) if baseline is not None else None)


def load_runs(runs_dir: str | Path, tasks: Iterable[str] | None = None) -> list[RunResult]:
    """Every run folder under `runs_dir` (recursively, `runs_dir` included), sorted by path.

    A run folder contains `results.json` and is named `<model>__<task>__<anything>`; other folders with a
    results.json are skipped (logged at debug level). An unreadable or malformed results.json is skipped with a
    warning. `tasks` (known task ids) only helps split names whose model part contains `__`.
    """
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise AupError(f"runs directory {runs_dir} does not exist or is not a directory")
    known = list(tasks) if tasks is not None else None
    runs: list[RunResult] = []
    for dirpath, dirnames, filenames in os.walk(runs_dir):
        dirnames.sort()
        if RESULTS_FILE not in filenames:
            continue
        folder = Path(dirpath)
        parsed = parse_run_name(folder.name, known)
        if parsed is None:
            log.debug("%s: has %s but is not named <model>__<task>__<run>; skipped", folder, RESULTS_FILE)
            continue
        try:
            scores, baseline = read_results(folder / RESULTS_FILE)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            log.warning("skipping run %s: unreadable %s: %s", folder, RESULTS_FILE, exc)
            continue
        model, task, run = parsed
        runs.append(RunResult(model=model, task=task, run=run, scores=scores, baseline=baseline, path=folder))
    runs.sort(key=lambda r: str(r.path))
    return runs


# ---------------------------------------------------------------------------------------------------------------------
# Best Attempt / Best Submission


def _better(a: float, b: float, higher_is_better: bool) -> bool:
    return a > b if higher_is_better else a < b


def best_attempt_index(scores: Sequence[Mapping[str, Any]], meta: TaskMeta) -> int | None:
    """Index of the entry with the best priority-metric value (first on ties); None when no entry has the metric."""
    best: int | None = None
    for i, entry in enumerate(scores):
        v = valid_metric(entry.get(meta.metric))
        if v is None:
            continue
        if best is None or _better(v, float(scores[best][meta.metric]), meta.higher_is_better):
            best = i
    return best


def best_attempt(scores: Sequence[Mapping[str, Any]], meta: TaskMeta) -> float | None:
    """The best priority-metric value over the run's score entries (entries without it ignored); None if none."""
    i = best_attempt_index(scores, meta)
    return None if i is None else float(scores[i][meta.metric])


def best_submission(scores: Sequence[Mapping[str, Any]], meta: TaskMeta) -> float | None:
    """The priority-metric value of the LAST score entry; None when there are no entries or it lacks the metric."""
    return last_score(scores, meta.metric)


def _best_of(values: Iterable[float | None], higher_is_better: bool) -> float | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return max(present) if higher_is_better else min(present)


# ---------------------------------------------------------------------------------------------------------------------
# Per-task table


class RunScore(BaseModel):
    run: str
    path: str
    entries: int
    best_attempt: float | None
    best_attempt_index: int | None
    best_submission: float | None


class ModelTaskScore(BaseModel):
    """One model on one task: the best over its runs (None when no run contributes); no runs = missing."""

    best_attempt: float | None = None
    best_submission: float | None = None
    runs: list[RunScore] = Field(default_factory=list)


class TaskScores(BaseModel):
    meta: TaskMeta
    baseline: float | None = Field(description="The baseline pseudo-model's score (both variants).")
    baseline_source: str | None = Field(description='"explicit", or the results.json the value was read from.')
    models: dict[str, ModelTaskScore] = Field(description="Every model found (baseline excluded).")

    def values(self, variant: Variant) -> dict[str, float | None]:
        """Model -> score of this variant, the baseline pseudo-model last."""
        out = {m: (s.best_attempt if variant == "attempt" else s.best_submission) for m, s in self.models.items()}
        out[BASELINE] = self.baseline
        return out


class ScoreTable(BaseModel):
    models: list[str] = Field(description="Every model found in the runs, sorted (baseline excluded).")
    tasks: dict[str, TaskScores]

    @property
    def all_models(self) -> list[str]:
        return [*self.models, BASELINE]


def build_table(runs: Sequence[RunResult], metas: Mapping[str, TaskMeta], *, tasks: Sequence[str] | None = None,
                baselines: Mapping[str, float] | None = None) -> ScoreTable:
    """Per task and model: the best over runs of Best Attempt and of Best Submission, plus the baseline.

    Tasks: `tasks` when given (each must have metadata; tasks without runs are kept, every model missing there),
    else the tasks of `metas` that appear in any run, in `metas` order. Models: every model of any run of a kept
    task. Runs whose task has no metadata are ignored with one warning. The baseline of a task is
    `baselines[task]` when given, else the priority metric of the first run (by path) whose results.json
    "baseline" has it.
    """
    baselines = dict(baselines or {})
    unknown: dict[str, int] = {}
    for r in runs:
        if r.task not in metas:
            unknown[r.task] = unknown.get(r.task, 0) + 1
    if unknown:
        log.warning("ignoring %d run(s) of task(s) without metadata: %s", sum(unknown.values()),
                    ", ".join(f"{t} ({n})" for t, n in sorted(unknown.items())))
    if tasks is not None:
        missing_meta = [t for t in tasks if t not in metas]
        if missing_meta:
            raise AupError(f"no metadata for task(s): {', '.join(missing_meta)}")
        task_ids = list(dict.fromkeys(tasks))
    else:
        seen = {r.task for r in runs}
        task_ids = [t for t in metas if t in seen]
    kept = [r for r in runs if r.task in task_ids]
    kept.sort(key=lambda r: str(r.path))
    models = sorted({r.model for r in kept})
    if BASELINE in models:
        raise AupError(f"a model is named {BASELINE!r} (e.g. {next(r.path for r in kept if r.model == BASELINE)}); "
                       "that name is reserved for the baseline pseudo-model")
    table: dict[str, TaskScores] = {}
    for tid in task_ids:
        meta = metas[tid]
        per_model: dict[str, ModelTaskScore] = {m: ModelTaskScore() for m in models}
        baseline, source = None, None
        if tid in baselines and baselines[tid] is not None:
            baseline, source = float(baselines[tid]), "explicit"
        for r in (r for r in kept if r.task == tid):
            i = best_attempt_index(r.scores, meta)
            per_model[r.model].runs.append(RunScore(
                run=r.run, path=str(r.path), entries=len(r.scores),
                best_attempt=None if i is None else r.scores[i][meta.metric], best_attempt_index=i,
                best_submission=best_submission(r.scores, meta)))
            if source is None and r.baseline is not None and meta.metric in r.baseline:
                baseline, source = r.baseline[meta.metric], str(r.path / RESULTS_FILE)
        for s in per_model.values():
            s.best_attempt = _best_of((x.best_attempt for x in s.runs), meta.higher_is_better)
            s.best_submission = _best_of((x.best_submission for x in s.runs), meta.higher_is_better)
        if baseline is None:
            log.warning("task %s: no baseline %r (neither given nor in any results.json); feasibility only "
                        "requires score >= 0 and the baseline counts as missing", tid, meta.metric)
        elif not math.isfinite(baseline):
            raise AupError(f"task {tid}: baseline {baseline!r} is not a finite number")
        table[tid] = TaskScores(meta=meta, baseline=baseline, baseline_source=source, models=per_model)
    return ScoreTable(models=models, tasks=table)


# ---------------------------------------------------------------------------------------------------------------------
# Ratios, profiles, AUP

Status = Literal["feasible", "infeasible", "no_score", "unbounded_ratio"]


class TaskRatios(BaseModel):
    best: float | None = Field(description="Best feasible score; None when nothing is feasible.")
    worst_ratio: float
    max_tau: int
    ratios: dict[str, float]
    status: dict[str, Status] = Field(description="feasible; infeasible (negative or worse than the baseline); "
                                                  "no_score (missing or failed); unbounded_ratio (division by zero).")


def task_ratios(values: Mapping[str, float | None], baseline: float | None, higher_is_better: bool,
                eps: float = EPS) -> TaskRatios:
    """MLGym's performance ratios of one task; `values` is model -> score (the baseline included as a model).

    Feasible: score >= 0 and score >= baseline (higher is better) / score <= baseline (lower is better); the baseline
    condition is dropped when `baseline` is None. Best = max / min of the feasible scores; ratio = best / score
    (higher) or score / best (lower); scores equal to the best get exactly 1. Everything else (infeasible, None,
    division by zero) gets worst_ratio * (1 + eps), worst_ratio being the largest finite feasible ratio (1 if none).
    max_tau = ceil(worst_ratio * (1 + eps)).
    """
    status: dict[str, Status] = {}
    feasible: dict[str, float] = {}
    for m, v in values.items():
        if valid_metric(v) is None:
            status[m] = "no_score"
        elif v < 0 or (baseline is not None and (v < baseline if higher_is_better else v > baseline)):
            status[m] = "infeasible"
        else:
            feasible[m] = v
            status[m] = "feasible"
    best = None
    finite: dict[str, float] = {}
    if feasible:
        best = max(feasible.values()) if higher_is_better else min(feasible.values())
        for m, v in feasible.items():
            if v == best:
                r = 1.0
            else:
                num, den = (best, v) if higher_is_better else (v, best)
                r = num / den if den > 0 else math.inf
            if math.isfinite(r):
                finite[m] = r
            else:
                status[m] = "unbounded_ratio"
    worst_ratio = max(finite.values(), default=1.0)
    fail = worst_ratio * (1 + eps)
    if not math.isfinite(fail):
        raise AupError(f"worst ratio {worst_ratio!r} overflows; scores {dict(values)}")
    ratios = {m: finite.get(m, fail) for m in values}
    return TaskRatios(best=best, worst_ratio=worst_ratio, max_tau=math.ceil(fail), ratios=ratios, status=status)


def ceil_tenth(x: float, tol: float = 1e-9) -> float:
    """`x` rounded up to one decimal, forgiving float error: 0.30000000000000004 -> 0.3 (not 0.4), 0.30103 -> 0.4."""
    y = x * 10
    n = round(y)
    if abs(y - n) <= tol * max(1.0, abs(y)):
        return n / 10
    return math.ceil(y) / 10


def log10_ceil_tenth(m: int) -> float:
    """log10(m) rounded up to one decimal, exactly: the least d/10 with 10**d >= m**10 (m a positive integer)."""
    if m < 1:
        raise ValueError(f"expected a positive integer, got {m!r}")
    target = m ** 10
    d = max(0, math.ceil(10 * math.log10(m)) - 1)
    while d > 0 and 10 ** (d - 1) >= target:
        d -= 1
    while 10 ** d < target:
        d += 1
    return d / 10


class VariantProfile(BaseModel):
    variant: Variant
    tasks: dict[str, TaskRatios]
    rho: dict[str, list[float]] = Field(description="Model -> rho_m(tau) on the tau grid.")
    aup: dict[str, float]


class AupResult(BaseModel):
    models: list[str] = Field(description="Models found, sorted, then baseline.")
    tasks: list[str]
    eps: float
    T: float = Field(description="Upper end of the tau grid: log10 of the largest max_tau, rounded up to 0.1.")
    tau: list[float]
    attempt: VariantProfile = Field(description="From Best Attempt (Best AUP).")
    submission: VariantProfile = Field(description="From Best Submission (Last AUP).")

    def profile(self, variant: Variant) -> VariantProfile:
        return self.attempt if variant == "attempt" else self.submission

    def best_aup(self, model: str) -> float:
        return self.attempt.aup[model]

    def last_aup(self, model: str) -> float:
        return self.submission.aup[model]


def _rho(log_ratios: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """Share of tasks with log10(ratio) <= tau, for every tau (zeros when there are no tasks)."""
    if log_ratios.size == 0:
        return np.zeros_like(tau)
    return (log_ratios[None, :] <= tau[:, None]).mean(axis=1)


def area(rho: Sequence[float] | np.ndarray, tau: Sequence[float] | np.ndarray) -> float:
    """Left Riemann sum: sum over i of (tau[i+1] - tau[i]) * rho[i]."""
    t, r = np.asarray(tau, dtype=float), np.asarray(rho, dtype=float)
    return float(np.sum(np.diff(t) * r[:-1]))


def compute_aup(table: ScoreTable, eps: float = EPS, n_tau: int = N_TAU) -> AupResult:
    """Ratios per task (both variants), T, the tau grid, rho_m(tau) and AUP_m for every model plus the baseline."""
    if n_tau < 2:
        raise ValueError(f"n_tau must be >= 2, got {n_tau}")
    models = table.all_models
    task_ids = list(table.tasks)
    per_variant = {v: {tid: task_ratios(ts.values(v), ts.baseline, ts.meta.higher_is_better, eps)
                       for tid, ts in table.tasks.items()} for v in VARIANTS}
    max_tau = max((tr.max_tau for v in VARIANTS for tr in per_variant[v].values()), default=1)
    T = log10_ceil_tenth(max_tau)
    tau = np.linspace(0.0, T, n_tau)
    profiles = {}
    for v in VARIANTS:
        rho: dict[str, list[float]] = {}
        aup: dict[str, float] = {}
        for m in models:
            logs = np.array([math.log10(per_variant[v][tid].ratios[m]) for tid in task_ids], dtype=float)
            r = _rho(logs, tau)
            rho[m] = r.tolist()
            aup[m] = area(r, tau)
        profiles[v] = VariantProfile(variant=v, tasks=per_variant[v], rho=rho, aup=aup)
    return AupResult(models=models, tasks=task_ids, eps=eps, T=T, tau=tau.tolist(),
                     attempt=profiles["attempt"], submission=profiles["submission"])


def score_runs(runs: Sequence[RunResult], metas: Mapping[str, TaskMeta], *, tasks: Sequence[str] | None = None,
               baselines: Mapping[str, float] | None = None, eps: float = EPS) -> tuple[ScoreTable, AupResult]:
    """`build_table` then `compute_aup`."""
    table = build_table(runs, metas, tasks=tasks, baselines=baselines)
    return table, compute_aup(table, eps=eps)


# ---------------------------------------------------------------------------------------------------------------------
# Bootstrap intervals

BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


def _resample(table: ScoreTable, rng: np.random.Generator) -> ScoreTable:
    """One bootstrap replicate of `table`: per task, every model's runs drawn with replacement (same count)."""
    tasks: dict[str, TaskScores] = {}
    for tid, ts in table.tasks.items():
        hib = ts.meta.higher_is_better
        by_label = {m: {r.run: r for r in s.runs} for m, s in ts.models.items() if s.runs}
        labels = {tuple(sorted(runs)) for runs in by_label.values()}
        # Runs of the same index share their seed (and task instance) across models: draw one set of run
        # labels for every model when they all have the same runs, so a difference is paired by run.
        shared = None
        if len(labels) == 1:
            common = next(iter(labels))
            shared = [common[i] for i in rng.integers(0, len(common), len(common))]
        models: dict[str, ModelTaskScore] = {}
        for m, s in ts.models.items():
            if not s.runs:
                models[m] = ModelTaskScore.model_construct(best_attempt=None, best_submission=None, runs=[])
                continue
            drawn = ([by_label[m][label] for label in shared] if shared is not None
                     else [s.runs[i] for i in rng.integers(0, len(s.runs), len(s.runs))])
            models[m] = ModelTaskScore.model_construct(  # validated once, in the table; thousands of replicates
                best_attempt=_best_of((r.best_attempt for r in drawn), hib),
                best_submission=_best_of((r.best_submission for r in drawn), hib), runs=[])
        tasks[tid] = TaskScores.model_construct(meta=ts.meta, baseline=ts.baseline, baseline_source=ts.baseline_source,
                                                models=models)
    return ScoreTable.model_construct(models=table.models, tasks=tasks)


def _interval(values: np.ndarray, level: float) -> list[float]:
    lo, hi = np.percentile(values, [50 * (1 - level), 50 * (1 + level)])
    return [round(float(lo), 4), round(float(hi), 4)]


def bootstrap_aup(table: ScoreTable, pairs: Sequence[tuple[str, str]] = (), *, samples: int = BOOTSTRAP_SAMPLES,
                  seed: int = BOOTSTRAP_SEED, level: float = CONFIDENCE, eps: float = EPS) -> dict[str, Any]:
    """Bootstrap intervals for every model's Best and Last AUP and for paired differences `(model, base)`.

    Method (nonparametric percentile bootstrap over runs):
    - The unit resampled is a run. Tasks are not resampled (the benchmark is a fixed set, not a sample) and
      the baseline is the recorded value. In each of `samples` replicates, for every task, each model's runs
      on that task are drawn with replacement, as many as it has; when every model has the same run labels
      on a task (run k of each model shares its seed), one draw of labels serves all of them, so run k of a
      student is compared with run k of its base.
    - Each replicate goes through the whole score pipeline (`compute_aup`): Best Attempt / Best Submission
      as the best over the drawn runs, ratios against the replicate's best feasible score, its own tau grid,
      AUP per model. A pair's difference is `AUP(model) - AUP(base)` within the same replicate (paired).
    - The interval is the (1 - level)/2 and (1 + level)/2 percentiles of the replicates' values
      (`level` 0.95: 2.5% and 97.5%). The generator is `numpy.random.default_rng(seed)`: the same runs and
      seed give the same intervals.
    - What it covers: run-to-run variation only (sampling seeds, generation), not which tasks the benchmark
      has. A best-of-runs score is a maximum, whose bootstrap leans low: a replicate misses a model's best
      run with probability (1 - 1/n)^n (37% for n = 4 runs), so intervals sit mostly at or below the
      point estimate; with one run per task every interval is a single point (there is nothing to resample).
      An interval that contains 0 for a difference means the runs do not show a difference at this level.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    models = table.all_models
    rng = np.random.default_rng(seed)
    values = {v: {m: np.empty(samples) for m in models} for v in VARIANTS}
    for b in range(samples):
        result = compute_aup(_resample(table, rng), eps=eps)
        for v in VARIANTS:
            aup = result.profile(v).aup
            for m in models:
                values[v][m][b] = aup[m]
    point = compute_aup(table, eps=eps)
    names = {"attempt": "best_aup", "submission": "last_aup"}
    out: dict[str, Any] = {
        "samples": samples, "seed": seed, "level": level,
        "method": "percentile bootstrap over runs within each (task, model), tasks fixed, runs paired by label "
                  "across models when their labels match",
        "aup": {m: {names[v]: {"estimate": round(point.profile(v).aup[m], 4),
                               "ci": _interval(values[v][m], level)} for v in VARIANTS} for m in models},
        "differences": {},
    }
    for model, base in pairs:
        if model not in models or base not in models:
            continue
        out["differences"][f"{model} - {base}"] = {"model": model, "base": base, **{
            names[v]: {"estimate": round(point.profile(v).aup[model] - point.profile(v).aup[base], 4),
                       "ci": _interval(values[v][model] - values[v][base], level)} for v in VARIANTS}}
    return out


def render_intervals(boot: dict[str, Any]) -> str:
    """The bootstrap as text: every model's AUP with its interval, then each paired difference."""
    pct = f"{boot['level']:.0%}"
    lines = [f"{'model':<16} {'Best AUP [' + pct + ' CI]':>26} {'Last AUP [' + pct + ' CI]':>26}"]

    def cell(x: dict[str, Any], signed: bool = False) -> str:
        lo, hi = x["ci"]
        f = "+.3f" if signed else ".3f"
        return f"{x['estimate']:{f}} [{lo:{f}}, {hi:{f}}]"

    for m, x in sorted(boot["aup"].items(), key=lambda kv: (-kv[1]["best_aup"]["estimate"], kv[0])):
        lines.append(f"{m:<16} {cell(x['best_aup']):>26} {cell(x['last_aup']):>26}")
    for name, d in boot["differences"].items():
        lines.append(f"{name:<16} {cell(d['best_aup'], True):>26} {cell(d['last_aup'], True):>26}")
    lines.append(f"({boot['samples']} bootstrap replicates over runs, seed {boot['seed']})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# Outputs

CSV_HEADER = ("Model", "Best AUP", "Last AUP")


def aup_rows(result: AupResult) -> list[tuple[str, float, float]]:
    """(model, Best AUP, Last AUP) for every model and the baseline, rounded to 3 decimals, sorted by Best AUP
    descending, then Last AUP descending, then name."""
    rows = [(m, round(result.best_aup(m), 3), round(result.last_aup(m), 3)) for m in result.models]
    return sorted(rows, key=lambda r: (-r[1], -r[2], r[0]))


def aup_csv(result: AupResult) -> str:
    """`Model,Best AUP,Last AUP` with three decimals (trailing newline)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_HEADER)
    for m, best, last in aup_rows(result):
        w.writerow([m, f"{best:.3f}", f"{last:.3f}"])
    return buf.getvalue()


def summarize(table: ScoreTable, result: AupResult) -> dict[str, Any]:
    """A JSON-able report (what the `scores` stage writes to scores.json)."""
    tasks: dict[str, Any] = {}
    for tid, ts in table.tasks.items():
        ra, rs = result.attempt.tasks[tid], result.submission.tasks[tid]
        models: dict[str, Any] = {}
        for m in result.models:
            s = ts.models.get(m)
            models[m] = {
                "runs": len(s.runs) if s else None,
                "best_attempt": s.best_attempt if s else ts.baseline,
                "best_submission": s.best_submission if s else ts.baseline,
                "ratio_attempt": ra.ratios[m],
                "ratio_submission": rs.ratios[m],
                "status_attempt": "missing" if s is not None and not s.runs else ra.status[m],
                "status_submission": "missing" if s is not None and not s.runs else rs.status[m],
                "per_run": [r.model_dump() for r in s.runs] if s else [],
            }
        tasks[tid] = {
            "metric": ts.meta.metric,
            "higher_is_better": ts.meta.higher_is_better,
            "baseline": ts.baseline,
            "baseline_source": ts.baseline_source,
            "attempt": {"best": ra.best, "worst_ratio": ra.worst_ratio, "max_tau": ra.max_tau},
            "submission": {"best": rs.best, "worst_ratio": rs.worst_ratio, "max_tau": rs.max_tau},
            "models": models,
        }
    return {
        "eps": result.eps,
        "T": result.T,
        "n_tau": len(result.tau),
        "models": result.models,
        "tasks": tasks,
        "aup": {m: {"best_aup": best, "last_aup": last} for m, best, last in aup_rows(result)},
    }


def run_aup(runs_dir: str | Path, tasks: str | Path | Mapping[str, TaskMeta] = "mlgym",
            out_csv: str | Path | None = None, *, baselines: Mapping[str, float] | None = None) -> str:
    """The `gymforge aup` command: the AUP CSV of the runs under `runs_dir` (returned; written atomically to
    `out_csv` when given). Raises `AupError` for a bad metadata file or when no run of a known task is found."""
    metas = resolve_tasks(tasks)
    runs = load_runs(runs_dir, tasks=metas)
    if not any(r.task in metas for r in runs):
        found = sorted({r.task for r in runs})
        raise AupError(f"no runs of known tasks under {runs_dir}: found {len(runs)} run folder(s) "
                       f"(<model>__<task>__<run>/{RESULTS_FILE})"
                       + (f" of unknown task(s) {', '.join(found)}" if found else ""))
    _, result = score_runs(runs, metas, baselines=baselines)
    text = aup_csv(result)
    if out_csv is not None:
        atomic.write_text(out_csv, text)
    return text


def main(args: Any) -> None:
    """`gymforge aup RUNS_DIR [--tasks mlgym|FILE] [--out CSV]`."""
    try:
        print(run_aup(Path(args.runs_dir), tasks=args.tasks, out_csv=Path(args.out) if args.out else None), end="")
    except AupError as err:
        sys.exit(f"gymforge aup: {err}")
