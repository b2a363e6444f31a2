"""JSON schemas in `schemas/` are generated from the Pydantic models, never edited by hand."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel


def _models() -> dict[str, type[BaseModel]]:
    from gymforge.core import records as specs
    from gymforge.core.config import GymforgeConfig
    from gymforge.tasks.mlgym import DatasetConfig, TaskConfig
    from gymforge.stages.sft import Example
    from gymforge.stages.rollouts import ShardRecord

    return {
        "config": GymforgeConfig,
        "mlgym_task": TaskConfig,
        "mlgym_dataset": DatasetConfig,
        "topic_batch": specs.TopicBatch,
        "proposal": specs.ProposalRecord,
        "generation": specs.GenerationRecord,
        "trajectory_shard": ShardRecord,
        "sft_example": Example,
    }


def render_schemas() -> dict[str, str]:
    return {f"{name}.schema.json": json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n"
            for name, model in _models().items()}


def write_schemas(out: Path) -> list[Path]:
    from gymforge.core import atomic

    return [atomic.write_text(out / name, text) for name, text in render_schemas().items()]


def check_schemas(out: Path) -> list[str]:
    """Names of schema files that are missing or differ from what the models generate."""
    return [name for name, text in render_schemas().items()
            if not (out / name).exists() or (out / name).read_text() != text]
