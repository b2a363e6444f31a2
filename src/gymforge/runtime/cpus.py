"""How many cores this job owns, so that torch and BLAS pools match them instead of the machine's.

Snakemake sets `OMP_NUM_THREADS` to a job's `threads:`; SLURM, taskset and containers restrict the affinity mask
or set a CPU quota. A pool larger than the cores it gets waits at every barrier (two cores oversubscribed ran
training ~20x slower here), so every place that sizes a pool asks `cpu_threads`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"


def cpu_quota(path: Path | None = None) -> int | None:
    """The CPUs a cgroup CPU quota allows (rounded up; `CPU_MAX` unless `path`), or None without a quota."""
    try:
        quota, period = (CPU_MAX if path is None else path).read_text().split()[:2]
        return max(1, math.ceil(int(quota) / int(period))) if quota != "max" else None
    except (OSError, ValueError):
        return None


def cpu_threads(processes: int = 1) -> int:
    """The job's cores: `OMP_NUM_THREADS` when set (Snakemake sets it to the job's threads; torchrun to 1 per process
    when it starts several), else the CPUs this process may run on (its affinity mask, which taskset, SLURM and
    container CPU sets restrict, and at most a cgroup CPU quota's) shared by the `processes` training processes of
    this machine."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (macOS)
        cpus = os.cpu_count() or 1
    cpus = min(cpus, cpu_quota() or cpus)
    return max(1, cpus // max(1, processes))
