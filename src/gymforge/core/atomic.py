"""Atomic file output: write to a temporary name, then rename, so a kill never leaves half a file.

Inside a job (`gymforge --log ...`, see `gymforge.runtime.job`) temporaries live in the job's scratch directory,
which the job empties when it starts: a `kill -9` leaves them where the rerun removes them. Elsewhere, or
when the target is on another file system (a rename cannot cross it), they are hidden siblings of the target.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

SCRATCH_ENV = "GYMFORGE_SCRATCH"  # a job's scratch directory (`gymforge.runtime.job` sets it)


def _temp_dir(target: Path) -> Path:
    """Where the temporary for `target` (whose parent exists) is made: the job's scratch dir if it can be renamed
    from there, else beside the target."""
    scratch = os.environ.get(SCRATCH_ENV)
    if scratch:
        try:
            if os.stat(scratch).st_dev == os.stat(target.parent).st_dev:
                return Path(scratch)
        except FileNotFoundError:
            pass
    return target.parent


def write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=_temp_dir(path), prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode())


def write_json(path: str | Path, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def write_yaml(path: str | Path, obj: Any) -> Path:
    return write_text(path, yaml.safe_dump(obj, sort_keys=False, allow_unicode=True, width=100))


@contextmanager
def directory(path: str | Path) -> Iterator[Path]:
    """Build a directory under a temporary name and move it into place only when the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=_temp_dir(path), prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
