"""What a multi-process training job is launched with: the committed accelerate configs and the venv's scripts.

SFT (`gymforge.stages.training`) and the sharded RL update (`gymforge.rl.sharded`) both launch `accelerate launch
--config_file <strategy>.yaml` (`accelerate_launch`); the config files ship in the package under
`gymforge/runtime/accelerate/`.
"""

from __future__ import annotations

import os
import sys
from importlib.resources import files
from pathlib import Path

ACCELERATE_CONFIGS = Path(str(files("gymforge.runtime") / "accelerate"))  # shipped in the package
STRATEGY_FILES = {"ddp": "ddp.yaml", "fsdp": "fsdp.yaml", "deepspeed": "deepspeed.yaml"}


def accelerate_config(strategy: str, key: str = "train.strategy") -> Path:
    """The committed accelerate config of a strategy; `key` names the setting in the error."""
    if strategy not in STRATEGY_FILES:
        raise ValueError(f"{key}: unknown strategy {strategy!r} (one of {sorted(STRATEGY_FILES)})")
    path = ACCELERATE_CONFIGS / STRATEGY_FILES[strategy]
    if path.is_file():
        return path
    raise FileNotFoundError(f"no accelerate config for strategy {strategy!r} in {ACCELERATE_CONFIGS}")


def accelerate_launch(strategy: str, processes: int, key: str = "train.strategy") -> list[str]:
    """`accelerate launch` with the strategy's committed config on `processes` processes, without the launcher's
    per-rank log folders (`--log_dir /dev/null`; the workers write to the job's own log): torch's elastic agent
    otherwise makes a torchelastic_* folder in the temporary directory on every launch and never removes it."""
    return [venv_script("accelerate"), "launch", "--config_file", str(accelerate_config(strategy, key)),
            "--num_processes", str(processes), "--log_dir", os.devnull]


def venv_script(name: str) -> str:
    """An executable installed next to this interpreter (the venv's), else the bare name from PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name
