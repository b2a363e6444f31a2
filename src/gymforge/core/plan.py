"""The plan: every id and count the workflow derives from the config, in one place.

The rules (`rules/common.smk`), the CLI, the stages and `gymforge estimate` all count topic batches, slots,
rollout shards and evaluation runs with these functions, so `snakemake -n`, the jobs and the estimate
never disagree. Cheap to import: the Snakefile needs nothing else to plan.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gymforge.core.config import GymforgeConfig, ModelSpec

# Model sources whose checkpoint gymforge serves itself (the others are endpoints already running).
SERVED_SOURCES = ("student-base", "student-sft", "student-rl", "checkpoint")


# ---- topics: batches of slots ------------------------------------------------------------------------


def batch_id(index: int) -> str:
    return f"b{index:04d}"


def slot_id(index: int) -> str:
    return f"t{index:04d}"


def batch_of_slot(slot: str, batch_size: int) -> str:
    return batch_id(int(slot[1:]) // batch_size)


def n_batches(cfg: GymforgeConfig) -> int:
    return math.ceil(cfg.topics.n / cfg.topics.batch_size)


def slot_ids(cfg: GymforgeConfig) -> list[str]:
    return [slot_id(i) for i in range(cfg.topics.n)]


def batch_ids(cfg: GymforgeConfig) -> list[str]:
    return [batch_id(i) for i in range(n_batches(cfg))]


# ---- trajectories: shards of rollouts per task -------------------------------------------------------


def shard_count(cfg: GymforgeConfig) -> int:
    return math.ceil(cfg.trajectories.per_task / cfg.trajectories.shard_size)


def shard_id(index: int) -> str:
    return f"{index:04d}"


def shard_ids(cfg: GymforgeConfig) -> list[str]:
    return [shard_id(k) for k in range(shard_count(cfg))]


def shard_rollouts(cfg: GymforgeConfig, shard: int) -> list[int]:
    size = cfg.trajectories.shard_size
    return list(range(shard * size, min((shard + 1) * size, cfg.trajectories.per_task)))


SHARD_OVERHEAD_MB = 1024
"""What a shard job itself holds beside its sandboxes (the agent loop, the teacher client)."""


def shard_mem_mb(cfg: GymforgeConfig) -> int:
    """Memory a rollout shard job declares: `trajectories.concurrency` sandboxes of `sandbox.memory_mb` each, plus
    the job itself. `trajectories.mem_mb` may raise it, never lower it: a job allocation (SLURM's cgroup) smaller
    than its sandboxes' limits would kill the job instead of the one sandbox that went over."""
    t = cfg.trajectories
    need = t.concurrency * cfg.sandbox.memory_mb + SHARD_OVERHEAD_MB
    if t.mem_mb is None:
        return need
    if t.mem_mb < need:
        raise ValueError(
            f"trajectories.mem_mb is {t.mem_mb} MB, but a shard runs {t.concurrency} sandboxes (trajectories."
            f"concurrency) of {cfg.sandbox.memory_mb} MB each (sandbox.memory_mb) plus {SHARD_OVERHEAD_MB} MB for "
            f"the job: at least {need} MB; raise it, set it to null (derived), or lower the concurrency")
    return t.mem_mb


def parts_dir(out: Path) -> Path:
    """Where finished rollouts of the shard at `out` wait for the shard to complete."""
    return out.parent / f".{out.stem}.parts"


# ---- evaluation: models x tasks x runs ---------------------------------------------------------------


def run_ids(cfg: GymforgeConfig) -> list[int]:
    return list(range(cfg.evaluate.runs_per_task))


def run_folder(model: str, task: str, run: int) -> str:
    """The MLGym run folder of one benchmark run (`<model>__<task>__run<k>`)."""
    return f"{model}__{task}__run{run}"


def teacher_identity(cfg: GymforgeConfig, spec: ModelSpec) -> str:
    """What a model's answers depend on in `llm.teacher`, beyond its spec: for a `teacher` model the endpoint
    (provider, model, URL, sampling, request options); an `endpoint` model borrows its reply length (`max_tokens`). Empty for the
    other sources, whose identity is their spec and checkpoint. Part of the `eval_runs` rule's params and of the
    runs' resume fingerprint."""
    if spec.source == "endpoint":
        return json.dumps({"max_tokens": cfg.llm.teacher.max_tokens})
    if spec.source != "teacher":
        return ""
    teacher = cfg.llm.teacher
    text = teacher.model_dump_json(include={"provider", "base_url", "model", "temperature", "max_tokens"})
    # reasoning effort, omitted sampling fields, extra request fields: only where set (older runs keep their identity)
    return text + (json.dumps(extra, sort_keys=True) if (extra := teacher.request_identity()) else "")


def model_spec(cfg: GymforgeConfig, name: str) -> ModelSpec:
    for spec in cfg.evaluate.models:
        if spec.name == name:
            return spec
    raise ValueError(f"evaluate.models has no model named {name!r}")
