"""Resumable SFT: the checkpoints a rerun of `train_student` continues from, and how a complete one is told apart.

Where: `.<name>.resume/checkpoint-<step>/`, a hidden sibling of the final folder `<name>/` (beside the
`.<name>.tmp` it is written in). Snakemake removes a failed job's declared output, not this folder, so a rerun of
the job finds it; nothing reads it as a trained model. Each checkpoint is transformers' own (weights, optimizer,
scheduler, RNG states, `trainer_state.json`), loaded with `Trainer.train(resume_from_checkpoint=...)`.

Complete: transformers writes a checkpoint file by file, so a kill while it saves leaves a folder that looks like
one. `CheckpointCallback.on_save` runs after transformers has written every file of a checkpoint: every process
has reached it, the files are flushed to disk (fsync), and only then is `MARKER` written (atomically). Old
checkpoints are removed here too, marker first (transformers' own rotation is off), so a folder with a marker is
always whole. `newest_complete` takes the highest step whose marker names this run; a rerun first removes every
other folder that has no such marker: half-saved, half-removed, or another run's.

Another run: the marker carries `run_key`, a hash of what the weights depend on (the `train` section apart from
resources and saving, the seed, the base, the tokenizer, the dataset's bytes, the number of processes). A rerun
after any of them changed starts from the base instead of resuming a different run's optimizer.

The marker also keeps the rows of `metrics.jsonl` logged up to the checkpoint, so a resumed run's metrics file
holds every step once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from gymforge.core import atomic
from gymforge.core.config import TRAIN_SAVING, GymforgeConfig
from gymforge.student.base import train_seed

log = logging.getLogger("gymforge.student.resume")

MARKER = "gymforge-complete.json"
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
# Settings that change no weight: resources, logging and how often checkpoints are saved.
_NOT_IN_KEY = ("gpus", "mem_mb", "runtime_min", "logging_steps", *TRAIN_SAVING)


def resume_dir(out: str | Path) -> Path:
    """The folder of resumable checkpoints for the final checkpoint folder `out`."""
    out = Path(out)
    return out.parent / f".{out.name}.resume"


def _dataset_files(root: Path) -> list[Path]:
    """A saved `datasets` folder's own files: `datasets` adds cache files beside them when it maps the data."""
    state = json.loads((root / "state.json").read_text()) if (root / "state.json").is_file() else {}
    names = ["state.json", "dataset_info.json", *(f["filename"] for f in state.get("_data_files", []))]
    return [root / n for n in names if (root / n).is_file()]


def _hash_tree(h: Any, root: Path, contents: bool, files: list[Path] | None = None) -> None:
    """Feed the files under `root` (relative names, sizes, and their bytes or mtimes) into `h`."""
    for path in sorted(files if files is not None else (p for p in root.rglob("*") if p.is_file())):
        st = path.stat()
        h.update(f"{path.relative_to(root)}\0{st.st_size}\0".encode())
        if not contents:
            h.update(str(st.st_mtime_ns).encode())
            continue
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)


def run_key(cfg: GymforgeConfig, dataset: str | Path, base: str, tokenizer: str | Path, world_size: int) -> str:
    """What a checkpoint's weights depend on, hashed. The dataset and the tokenizer are hashed by content; a local
    base (gigabytes at production scale) by its files' names, sizes and modification times, so a rebuilt base
    counts as another one."""
    train = {k: v for k, v in cfg.train.model_dump(mode="json").items() if k not in _NOT_IN_KEY}
    h = hashlib.sha256(json.dumps({"train": train, "seed": train_seed(cfg), "base": str(base),
                                   "world_size": world_size}, sort_keys=True).encode())
    _hash_tree(h, Path(dataset), contents=True, files=_dataset_files(Path(dataset)))
    _hash_tree(h, Path(tokenizer), contents=True)
    if Path(base).is_dir():
        _hash_tree(h, Path(base), contents=False)
    return h.hexdigest()[:16]


def _step(path: Path) -> int | None:
    match = _CHECKPOINT.fullmatch(path.name)
    return int(match.group(1)) if match and path.is_dir() else None


def _marker(path: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((path / MARKER).read_text())
        state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("step") != state.get("global_step"):
        return None
    return marker


def _is_complete(path: Path, key: str) -> bool:
    marker = _marker(path)
    return marker is not None and marker.get("step") == _step(path) and marker.get("key") == key


def newest_complete(run_dir: Path, key: str) -> Path | None:
    """The complete checkpoint of this run with the highest step, if any."""
    if not run_dir.is_dir():
        return None
    found = sorted((step, p) for p in run_dir.iterdir() if (step := _step(p)) is not None and _is_complete(p, key))
    return found[-1][1] if found else None


def discard_unusable(run_dir: Path, key: str) -> list[str]:
    """Remove the checkpoint folders of `run_dir` that are not complete checkpoints of this run (the main process,
    before training); returns their names."""
    if not run_dir.is_dir():
        return []
    gone = sorted(p.name for p in run_dir.iterdir() if p.is_dir() and not _is_complete(p, key))
    for name in gone:
        shutil.rmtree(run_dir / name)
    if gone:
        log.warning("%s: removed %s (saved incompletely or by a run with other settings or data)", run_dir,
                    ", ".join(gone))
    return gone


def resumed_rows(checkpoint: Path) -> list[dict[str, Any]]:
    """The metrics rows logged up to `checkpoint`."""
    marker = _marker(checkpoint)
    return list(marker.get("metrics", [])) if marker else []


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):  # files before the folders that hold them
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    """Remove a checkpoint folder, its marker first: a kill halfway leaves a folder without one."""
    (path / MARKER).unlink(missing_ok=True)
    shutil.rmtree(path)


def checkpoint_callback(run_dir: Path, key: str, keep: int, save_minutes: float | None,
                        rows: Callable[[], list[dict[str, Any]]]) -> Any:
    """The `TrainerCallback` that marks complete checkpoints, keeps the newest `keep`, asks for a save every
    `save_minutes` and for none at the last step (the final folder is written right after it)."""
    from transformers import TrainerCallback

    class CheckpointCallback(TrainerCallback):
        def __init__(self) -> None:
            self.last_save = time.monotonic()

        def on_train_begin(self, args, state, control, **kwargs):
            self.last_save = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= state.max_steps:
                control.should_save = False
                return control
            if save_minutes is not None and not control.should_save:
                due = time.monotonic() - self.last_save >= 60 * save_minutes
                distributed = args.distributed_state
                if distributed.num_processes > 1:  # every process must save at the same step: the main one decides
                    from accelerate.utils import broadcast_object_list

                    due = broadcast_object_list([due], from_process=0)[0]
                control.should_save = bool(due)
            return control

        def on_save(self, args, state, control, **kwargs):
            args.distributed_state.wait_for_everyone()  # every process has written its part
            if state.is_world_process_zero:
                path = run_dir / f"checkpoint-{state.global_step}"
                _fsync_tree(path)
                atomic.write_json(path / MARKER, {"step": state.global_step, "key": key,
                                                  "metrics": [r for r in rows() if r["step"] <= state.global_step]})
                complete = sorted((s, p) for p in run_dir.iterdir() if (s := _step(p)) is not None
                                  and _is_complete(p, key))
                for _, old in complete[:-keep]:
                    _remove(old)
                log.info("saved resumable checkpoint %s", path)
            self.last_save = time.monotonic()
            return control

    return CheckpointCallback()
