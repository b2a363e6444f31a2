"""A finished tiny offline run (`all`, every rule of the default target: 22 jobs), built once per test session in a
scratch copy of the workflow, for the tests that inspect a finished run (rule inputs, rerun triggers, the report)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from workflow_copy import copy_workflow

# 1 topic slot (verified at seed 0), 2 rollouts in one shard, 1 epoch, 2 benchmark tasks x 1 run x 3 models, student
# replies of at most 64 tokens: every rule of `all` runs one job or two. Built alone at load ~5 on the 2 cores: 22 jobs,
# 240 s wall, 111 CPU-s (with 2 slots and 256-token replies: 27 jobs, 319 s, 149 CPU-s; CPU: getrusage of the build's children).
TINY = [
    "topics={n: 1, batch_size: 1}",
    "trajectories={per_task: 2, shard_size: 2, max_steps: 12}",
    "train={epochs: 1}",
    "evaluate={tasks: [graphColoring, signalDenoising], runs_per_task: 1, max_steps: 6, serving: {max_new_tokens: 64}}",
]


def snakemake(workdir: Path, *args: str, config: list[str] = TINY, timeout: int = 1800) -> subprocess.CompletedProcess:
    """`snakemake --cores 2 <args> --config <TINY>` in `workdir`."""
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args, "--config", *config], cwd=workdir,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workflow directory of a finished tiny run (results/ complete, nothing left to do). Tests must not change
    its results; a dry run (`-n`) is fine."""
    workdir = tmp_path_factory.mktemp("finished-run")
    copy_workflow(workdir, "rules", "report")
    proc = snakemake(workdir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir
