"""The benchmark models are scored on: gymforge's built-in offline suite or MLGym-Bench (docs/scores.md, Benchmark).

`suite` loads the tasks (`load_benchmark`), `decontamination` keeps synthesized tasks disjoint from them,
`generate` rebuilds the built-in suite's data files.
"""

from typing import Any

from gymforge.benchmark.suite import (
    BenchmarkError,
    BenchmarkTask,
    builtin_root,
    builtin_tasks,
    load_benchmark,
    mlgym_tasks,
    task_meta_file,
)

_DECONTAMINATION = ("Conflict", "ContaminationError", "DecontaminationReport", "check", "enforce", "write_report")

__all__ = [
    "BenchmarkError",
    "BenchmarkTask",
    "builtin_root",
    "builtin_tasks",
    "load_benchmark",
    "mlgym_tasks",
    "task_meta_file",
    *_DECONTAMINATION,
]


def __getattr__(name: str) -> Any:
    if name in _DECONTAMINATION:
        # deferred: on first use, so `python -m gymforge.benchmark.decontamination` runs the module only once
        from gymforge.benchmark import decontamination

        return getattr(decontamination, name)
    raise AttributeError(f"module 'gymforge.benchmark' has no attribute {name!r}")
