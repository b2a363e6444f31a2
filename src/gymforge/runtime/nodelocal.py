"""Where a job keeps its agents' workspaces: on the node's own disk when the job has one, not on the shared file
system that holds `results/`.

An episode's workspace takes thousands of small writes (the task's files copied in, the agent's edits, pip and
dataset caches, checkpoints) and is removed when the episode ends; only its trajectory and scores are kept, and
those are written into `results/` atomically (a temporary name, then a rename). On a cluster `$TMPDIR` is the job's
node-local scratch (set by the site: SLURM's job_container/tmpfs plugin or a prolog), so when `TMPDIR` is set the
workspaces go under `$TMPDIR/gymforge-<digest of the job's output>-<name>/`; without it, beside the output as before.
The same output always maps to the same directory, so a rerun of a killed job on the same node clears what its
predecessor left. `scratch` is that directory for a job's whole working tree (verification and micro tasks run the
task's baseline, probes and an episode there), emptied first and removed when the job is done.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def workspaces(out: Path, name: str) -> Path:
    """The directory of the workspaces of the job that writes `out`: `$TMPDIR/gymforge-<digest>-<name>` when TMPDIR
    is set, else `<out's folder>/<name>`."""
    tmp = os.environ.get("TMPDIR")
    if not tmp:
        return out.parent / name
    digest = hashlib.sha256(str(out.absolute()).encode()).hexdigest()[:16]
    return Path(tmp) / f"gymforge-{digest}-{name.lstrip('.')}"


@contextmanager
def scratch(out: Path, name: str) -> Iterator[Path]:
    """A fresh, empty `workspaces(out, name)` for the job that writes `out` (a killed predecessor's leftovers removed
    first), removed again when the block ends. What the job keeps it copies into `results/` itself, atomically."""
    path = workspaces(out, name)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
