"""Local data an MLGym task generates with its own helper script, made in a sandbox before the task runs.

MLGym ships some tasks' data as a raw file plus `data/<task>/_helpers/*.py` that writes the split the task
reads (`regressionKaggleHousePrice`: `_helpers/_generate_split.py` turns `train.csv` into
`data/{train,validation,test,answer}.csv`); MLGym's users run it once by hand. gymforge runs it when the
task's `data_path` is missing, from one place, `prepare_task_data`, which every install of a task goes
through (`TaskEnvironment.install`: benchmark runs, `run-task`, `check-task`, verification; and the benchmark's
`require_runnable` before its runs): the helper is third-party code, so it runs in the sandbox on a copy of
`data/<task>/` (no network, its own uid), and only the regular files it wrote under the data path come back
(`sandbox.beneath.copy_tree`: no symlinks followed), moved into the checkout atomically under a lock, so
parallel `eval_runs` jobs of the task prepare it once.

The helpers were written for pandas 1: pandas >= 2 rejects `DataFrame.drop(columns=..., axis=1)` (the
axis is redundant there). The helper runs unmodified under a shim that drops that redundant axis; the split
itself is sklearn's `train_test_split` with the helper's fixed seed, so the data are MLGym's (measured: the
house-price baseline scores rmse 30340.111853413, r2 0.879989147474, MLGym's recorded values to 1e-12).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from gymforge.core import atomic
from gymforge.sandbox.beneath import copy_tree

# Runs before the helper (python -c): pandas 1's DataFrame.drop accepted a redundant axis with columns=/index=.
_SHIM = """
import runpy, sys
import pandas as pd
_drop = pd.DataFrame.drop
def _compatible_drop(self, labels=None, *, axis=0, index=None, columns=None, **kw):
    return _drop(self, labels, axis=0 if (columns is not None or index is not None) else axis,
                 index=index, columns=columns, **kw)
pd.DataFrame.drop = _compatible_drop
sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


MAX_BYTES = 4 << 30  # what a helper's data may take on the host


class PrepareError(RuntimeError):
    """The task's helper could not produce its data."""


def helpers(root: Path, task_id: str) -> list[Path]:
    return sorted((Path(root) / "data" / task_id / "_helpers").glob("*.py"))


def made_by_helpers(root: Path, task_id: str, data_path: str) -> bool:
    """Whether `data_path` is local data of `task_id` that MLGym's helpers make: under `data/<task_id>/`
    (where they write) and the task ships `_helpers/*.py`."""
    path, task_dir = PurePosixPath(data_path), PurePosixPath("data") / task_id
    return (path.is_relative_to(task_dir) and path != task_dir and ".." not in path.parts
            and bool(helpers(root, task_id)))


def prepare_task_data(root: Path, task_id: str, data_paths: Iterable[str], *, sandbox, limits,
                      timeout: float = 600) -> list[Path]:
    """Make each of the task's local `data_paths` (relative to `root`) that is missing and that MLGym's helper
    scripts make (`made_by_helpers`), in `sandbox` under `limits`; return the directories made.

    Every entry point that installs a task calls this first, so they all see the data the benchmark sees.
    A missing path no helper makes is left alone (the caller reports it); a helper that fails raises
    PrepareError."""
    made = []
    for path in dict.fromkeys(data_paths):
        if not (Path(root) / path).exists() and made_by_helpers(root, task_id, path):
            made.append(prepare_local_data(root, task_id, path, sandbox=sandbox, limits=limits, timeout=timeout))
    return made


def prepare_local_data(root: Path, task_id: str, data_path: str, *, sandbox, limits, timeout: float = 600) -> Path:
    """Make `root/data_path` by running the task's helper scripts in `sandbox`; return the data directory.

    `data_path` must lie under `data/<task_id>/` (where the helpers write, relative to `_helpers/`)."""
    root = Path(root)
    target = root / data_path
    task_dir = PurePosixPath("data") / task_id
    rel = PurePosixPath(data_path).relative_to(task_dir)  # ValueError: not the task's own data
    scripts = helpers(root, task_id)
    if not scripts:
        raise PrepareError(f"{task_id}: {data_path} is missing and MLGym ships no helper to make it")
    from filelock import FileLock  # deferred: ~15 ms the Snakefile's parse would pay (benchmark.suite imports this)

    with FileLock(str(root / "data" / f".{task_id}.prepare.lock")):
        if target.is_dir():
            return target  # another job made it while this one waited
        with tempfile.TemporaryDirectory(prefix=f"gymforge-prepare-{task_id}-") as scratch:
            ws = Path(scratch) / "ws"
            shutil.copytree(root / task_dir, ws, symlinks=True, ignore=shutil.ignore_patterns(rel.parts[0]))
            for script in scripts:
                command = f"cd _helpers && python -c {_quote(_SHIM)} {_quote(script.name)}"
                result = sandbox.run_once(ws, ["bash", "-c", command], timeout=timeout, limits=limits)
                if result.exit_code != 0:
                    raise PrepareError(f"{task_id}: {script.relative_to(root)} failed in the sandbox "
                                       f"(exit {result.exit_code}):\n{result.output[-2000:]}")
            made = ws / rel
            if not made.is_dir():
                raise PrepareError(f"{task_id}: the helpers ran but wrote no {data_path}")
            with atomic.directory(target) as tmp:
                tmp.rmdir()  # copy_tree makes it, with regular files and directories only
                if left_out := copy_tree(made, tmp, max_bytes=MAX_BYTES):
                    raise PrepareError(f"{task_id}: the helpers wrote non-regular files: {', '.join(left_out)}")
    return target


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
