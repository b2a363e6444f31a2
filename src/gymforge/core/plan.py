"""The plan: every id and count the workflow derives from the config, in one place.

The rules (`rules/common.smk`), the CLI, the stages and `gymforge estimate` all count topic batches, slots,
rollout shards and evaluation runs with these functions, so `snakemake -n`, the jobs and the estimate
never disagree. Cheap to import: the Snakefile needs nothing else to plan.
"""

from __future__ import annotations

import math
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


# ---- evaluation: models x tasks x runs ---------------------------------------------------------------


def run_ids(cfg: GymforgeConfig) -> list[int]:
    return list(range(cfg.evaluate.runs_per_task))


def teacher_identity(cfg: GymforgeConfig, spec: ModelSpec) -> str:
    """What a `teacher` model's answers depend on beyond its spec: the endpoint `llm.teacher` (provider, model,
    URL, sampling). Empty for the other sources, whose identity is their spec and checkpoint. Part of the
    `eval_runs` rule's params and of the runs' resume fingerprint."""
    if spec.source != "teacher":
        return ""
    return cfg.llm.teacher.model_dump_json(include={"provider", "base_url", "model", "temperature", "max_tokens"})


def model_spec(cfg: GymforgeConfig, name: str) -> ModelSpec:
    for spec in cfg.evaluate.models:
        if spec.name == name:
            return spec
    raise ValueError(f"evaluate.models has no model named {name!r}")
