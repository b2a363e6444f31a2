"""What each job asks of its scheduler: GPUs, memory, minutes and cores, from the config and, for the jobs of one topic
slot, from whether verification kept that slot.

The rules' `resources:` call these. Snakemake evaluates a resource callable that takes the job's input again just
before the job starts, when that input exists: a rollout shard or micro task of a slot that verification did not keep
(it only writes a "skipped" record) then asks for no GPU and a minutes-sized allocation instead of the verified task's.
While planning (`snakemake -n` before verification ran) a slot's jobs show what a verified task would get.

`check_partitions` holds every job's request against the cluster's partitions (the SLURM plugin's partition file),
so that a plan SLURM would reject fails before anything is submitted, naming the config key to change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gymforge.core.plan import shard_mem_mb

if TYPE_CHECKING:
    from gymforge.core.config import GymforgeConfig

JOB_OVERHEAD_MB = 1024  # the job's own process beside its sandbox: gymforge, the agent loop, the LLM client


@dataclass(frozen=True)
class Request:
    """One job's request: `gpu` devices, `mem_mb`, `runtime` minutes, `threads` cores, `key` the config keys that set
    its runtime (named by the partition check)."""

    gpu: int
    mem_mb: int
    runtime: int
    threads: int = 1
    key: str = ""


# A job that only writes a "skipped" record for a slot verification did not keep.
SKIPPED = Request(gpu=0, mem_mb=JOB_OVERHEAD_MB, runtime=10, threads=1, key="(a skipped slot's job)")


def slot_was_verified(report: str | Path) -> bool:
    """Whether the slot's verification report keeps it; True while the report does not exist yet (planning)."""
    try:
        return json.loads(Path(report).read_text()).get("status") == "ok"
    except FileNotFoundError:
        return True


def _sandbox_job_mb(cfg: GymforgeConfig, explicit: int | None) -> int:
    return explicit if explicit is not None else cfg.sandbox.memory_mb + JOB_OVERHEAD_MB


def verification(cfg: GymforgeConfig) -> Request:
    return Request(cfg.trajectories.gpus, _sandbox_job_mb(cfg, cfg.verification.mem_mb),
                   cfg.verification.runtime_min, 1, "verification.runtime_min")


def shard(cfg: GymforgeConfig, report: str | Path | None = None) -> Request:
    """A rollout shard of the slot whose verification report is `report`."""
    if report is not None and not slot_was_verified(report):
        return SKIPPED
    t = cfg.trajectories
    return Request(t.gpus, shard_mem_mb(cfg), t.runtime_min, t.threads, "trajectories.runtime_min")


def micro(cfg: GymforgeConfig, report: str | Path | None = None) -> Request:
    """The micro variant of the slot whose verification report is `report` (its check runs the task like
    verification, with the GPUs the task's rollouts get)."""
    if report is not None and not slot_was_verified(report):
        return SKIPPED
    return Request(cfg.trajectories.gpus, _sandbox_job_mb(cfg, cfg.micro.mem_mb), cfg.micro.runtime_min, 1,
                   "micro.runtime_min")


# ---- the cluster's partitions ---------------------------------------------------------------------------------


def load_partitions(path: str | Path | None) -> dict[str, dict[str, Any]]:
    """The partitions of a snakemake-executor-plugin-slurm partition file (`partitions: {name: {max_runtime,
    max_gpu, ...}}`); {} without one."""
    if not path:
        return {}
    return dict((yaml.safe_load(Path(path).read_text()) or {}).get("partitions") or {})


def _fits(limits: dict[str, Any], request: Request) -> bool:
    gpus = limits.get("max_gpu")
    if request.gpu and (gpus is not None and gpus < request.gpu):
        return False
    return limits.get("max_runtime") is None or limits["max_runtime"] >= request.runtime


def check_partitions(requests: dict[str, Request], partitions: dict[str, dict[str, Any]], source: str = "") -> None:
    """ValueError naming each rule whose request no partition can take (a GPU job needs a partition with that many
    GPUs per node and a long enough time limit; a limit not listed is unlimited), with the key to change."""
    if not partitions:
        return
    problems = []
    for rule, request in requests.items():
        if any(_fits(limits, request) for limits in partitions.values()):
            continue
        kind = [p for p, lim in partitions.items() if not request.gpu or (lim.get("max_gpu") or 0) >= request.gpu]
        longest = max((partitions[p].get("max_runtime", 0) for p in kind), default=0)
        what = f"{request.gpu} GPU(s) for {request.runtime} min" if request.gpu else f"{request.runtime} min"
        problems.append(f"  {rule}: asks for {what}, but "
                        + (f"the longest partition that offers that allows {longest} min: lower {request.key}"
                           if kind else f"no partition has {request.gpu} GPUs per node"))
    if problems:
        raise ValueError(f"jobs that no partition{f' in {source}' if source else ''} can take:\n" + "\n".join(problems)
                         + "\n(a train_student or train_rl job stopped at its limit resumes from its last checkpoint "
                         "when resubmitted: the profile's `retries`)")


def plan_requests(cfg: GymforgeConfig) -> dict[str, Request]:
    """The request of every rule that runs long, as the plan declares it (a verified slot's, for slot jobs)."""
    t, e = cfg.train, cfg.evaluate
    return {
        "verify_environment": verification(cfg),
        "micro_task": micro(cfg),
        "rollout_shard": shard(cfg),
        "train_student": Request(t.gpus, t.mem_mb, t.runtime_min, t.threads, "train.runtime_min"),
        "train_rl": Request(cfg.rl.gpus, cfg.rl.mem_mb, cfg.rl.runtime_min, cfg.rl.threads, "rl.runtime_min"),
        "eval_runs": Request(e.serving.gpus, e.mem_mb, e.runtime_min, e.threads, "evaluate.runtime_min"),
        "fetch_dataset": Request(0, cfg.datasets.mem_mb, cfg.datasets.runtime_min, 1, "datasets.runtime_min"),
    }
