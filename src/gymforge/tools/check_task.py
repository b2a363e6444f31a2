"""`gymforge check-task`: probe a task's evaluator with knowledge-free degenerate submissions.

The task is installed as for any episode, its baseline runs (a task without a baseline script is scored as
installed, e.g. a game's untouched strategy; where nothing can be scored, as MLGym's `titanic`, its recorded
`baseline_scores` stand), then every probe of `gymforge.tasks.probes` is evaluated in the same sandboxes and
under the same evaluation contract as an agent's submission. The task is gameable when any probe is
accepted with a score strictly better than the baseline's.
"""

from __future__ import annotations

import os
from pathlib import Path

from gymforge.core.config import GymforgeConfig
from gymforge.core.records import CheckReport, derive_seed
from gymforge.rl.rewards import metric_direction, stated_direction
from gymforge.sandbox import Limits
from gymforge.tasks.environment import detect_gpus
from gymforge.tasks.episode import EpisodeRunner, limits_of, sandbox_for
from gymforge.tasks.mlgym import BENCHMARK_TASKS, load_task_config
from gymforge.tasks.probes import CheckError, measure_baseline, probe_environment

__all__ = ["CheckError", "check_task", "priority_metric"]


def priority_metric(task_id: str, metrics: dict[str, float], metric: str | None = None,
                    higher_is_better: bool | None = None, description: str = "") -> tuple[str, bool]:
    """The metric that ranks the task's scores and its direction: as given, else MLGym-Bench's or the built-in
    suite's, else the evaluation's only (or first) metric with the direction the task's description states
    ("lower is better", "minimise"), else the one its name implies (rmse, cost, makespan: lower)."""
    from gymforge.benchmark.suite import BUILTIN

    known = BENCHMARK_TASKS.get(task_id) or (BUILTIN[task_id][:2] if task_id in BUILTIN else None)
    if metric is None:
        metric = known[0] if known else next(iter(metrics), "")
    if higher_is_better is None:
        if known and known[0] == metric:
            higher_is_better = known[1]
        else:
            stated = stated_direction(description, metric)
            higher_is_better = stated if stated is not None else metric_direction(metric)[1]
    return metric, higher_is_better


def check_task(task_yaml: Path, root: Path | None = None, out: Path = Path("check-task"), *,
               cfg: GymforgeConfig | None = None, sandbox: str | None = None, seed: int = 0,
               metric: str | None = None, higher_is_better: bool | None = None, gpus: int | None = None,
               limits: Limits | None = None, hidden_columns: dict[str, list[str]] | None = None,
               dataset_cache: Path | None = None, stop_at_first: bool = False) -> CheckReport:
    """Install the task at `task_yaml` under `out`, run its baseline and probe its evaluator
    (`stop_at_first`: stop at the first probe that beats the baseline)."""
    base = cfg or GymforgeConfig()
    if sandbox is not None:
        base = base.model_copy(update={"sandbox": base.sandbox.model_copy(update={"backend": sandbox})})
    gpus = detect_gpus() if gpus is None else gpus
    if limits is None:
        timeout = load_task_config(task_yaml).effective_training_timeout
        default = limits_of(base)
        limits = default.model_copy(update={"cpu_seconds": max(default.cpu_seconds, timeout * (os.cpu_count() or 1))})
    runner = EpisodeRunner(sandbox_for(base, gpus), limits, dataset_cache, gpus=gpus)
    env = runner.environment(task_yaml, root=root, run_dir=Path(out) / "probe",
                             hidden_columns=hidden_columns)
    env.install()
    baseline = measure_baseline(env)
    metric, higher_is_better = priority_metric(env.task.id, baseline[0], metric, higher_is_better,
                                               description=env.task.description)
    return probe_environment(env, seed=derive_seed(seed, "probes", env.task.id), metric=metric,
                             higher_is_better=higher_is_better, baseline=baseline, stop_at_first=stop_at_first)
