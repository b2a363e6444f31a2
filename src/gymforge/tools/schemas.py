"""JSON schemas in `schemas/`, and the key table of docs/configuration.md (gymforge.tools.config_docs), are generated
from the Pydantic models, never edited by hand (`gymforge schemas`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gymforge.core import atomic
from gymforge.core import records as specs
from gymforge.core.config import DEFAULT_CONFIG_FILE, GymforgeConfig
from gymforge.tasks.mlgym import DatasetConfig, TaskConfig
from gymforge.tools import config_docs


def _models() -> dict[str, type[BaseModel]]:
    return {
        "config": GymforgeConfig,
        "mlgym_task": TaskConfig,
        "mlgym_dataset": DatasetConfig,
        "topic_batch": specs.TopicBatch,
        "proposal": specs.ProposalRecord,
        "generation": specs.GenerationRecord,
        "trajectory_shard": specs.ShardRecord,
        "sft_example": specs.Example,
    }


def render_schemas() -> dict[str, str]:
    return {f"{name}.schema.json": json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n"
            for name, model in _models().items()}


def write_schemas(out: Path) -> list[Path]:
    return [atomic.write_text(out / name, text) for name, text in render_schemas().items()]


def check_schemas(out: Path) -> list[str]:
    """Names of schema files that are missing or differ from what the models generate."""
    return [name for name, text in render_schemas().items()
            if not (out / name).exists() or (out / name).read_text() != text]


def main(args: Any) -> None:
    """`gymforge schemas [--out DIR] [--docs FILE] [--check]`: the JSON schemas, and the key table of `--docs`
    (docs/configuration.md of the checkout, its `config.yaml` column from ./config.yaml) when that file exists."""
    docs = Path(args.docs)
    expected = config_docs.expected_docs(docs, Path(DEFAULT_CONFIG_FILE)) if docs.is_file() else None
    if args.check:
        stale = check_schemas(Path(args.out))
        if expected is not None and docs.read_text() != expected:
            stale.append(str(docs))
        if stale:
            sys.exit("schemas out of date (run `gymforge schemas`): " + ", ".join(stale))
        print("schemas up to date")
    else:
        for path in write_schemas(Path(args.out)):
            print(path)
        if expected is not None and docs.read_text() != expected:
            print(atomic.write_text(docs, expected))
