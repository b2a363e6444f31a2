"""One run of the paper-scale rehearsal (scripts/rehearsal.sh: configs/rehearsal.yaml through a SLURM test cluster of
its own, the docker sandbox and the strict reasoning teacher), shared by the tests that check it: the rehearsal's own
(tests/workflow/test_rehearsal.py) and the SLURM end to end's (tests/workflow/test_slurm.py), which reads the
`scripts/slurm_e2e.sh` summary the rehearsal's SLURM run wrote. One run instead of two: the two SLURM runs were
~580 of the suite's busy CPU-seconds, the rehearsal alone 420 (docs/layout.md, "The test suite's CPU").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP = 77  # scripts/rehearsal.sh: SLURM or docker cannot run here


@dataclass
class Rehearsal:
    proc: subprocess.CompletedProcess
    elapsed: float
    summary: dict[str, Any]  # <workdir>/rehearsal-summary.json
    e2e: dict[str, Any]  # <workdir>/e2e-summary.json: what scripts/slurm_e2e.sh found of the SLURM run
    cluster_status_after: int  # `slurm_cluster.sh status` once the script returned (3: stopped)


@pytest.fixture(scope="session")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> Rehearsal:
    pytest.importorskip("snakemake_executor_plugin_slurm")
    pytest.importorskip("docker", reason="the docker SDK is not installed")
    workdir = tmp_path_factory.mktemp("rehearsal")
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "DOCKER_HOST", "OPENAI_API_KEY")}
    # A SLURM test cluster of its own (scratch directory and ports), so that the rehearsal runs beside
    # tests/workflow/test_slurm_arrays.py's, which starts and stops the default one. A short path: munged's socket
    # lives in it, and a Unix socket's path holds at most 107 bytes.
    cluster = Path(tempfile.mkdtemp(prefix="gf-slurm-", dir="/tmp"))
    cluster.chmod(0o755)  # mkdtemp makes it 0700: munged runs as the munge user and keeps its socket and log in it
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", GYMFORGE_PYTHON=sys.executable,
               GYMFORGE_REHEARSAL_DIR=str(workdir), GYMFORGE_SLURM_DIR=str(cluster),
               GYMFORGE_SLURMCTLD_PORT="6827", GYMFORGE_SLURMD_PORT="6828")
    env.pop("GYMFORGE_SLURM_KEEP", None)  # the script stops the cluster it started
    env.pop("GYMFORGE_TRACKING", None)  # as a user runs it: paper-scale's tracker (trackio, offline)
    cluster_script = REPO / "scripts" / "slurm_cluster.sh"
    started = time.monotonic()
    try:
        proc = subprocess.run([str(REPO / "scripts" / "rehearsal.sh")], capture_output=True, text=True,
                              timeout=3000, env=env)
        status = subprocess.run([str(cluster_script), "status"], capture_output=True, timeout=60, env=env).returncode
    finally:
        subprocess.run([str(cluster_script), "stop"], capture_output=True, timeout=120, env=env, check=False)
        shutil.rmtree(cluster, ignore_errors=True)
    elapsed = time.monotonic() - started
    if proc.returncode == SKIP:
        reasons = [line for line in proc.stderr.splitlines() if "SKIP" in line]
        pytest.skip(reasons[-1] if reasons else proc.stderr[-500:])

    def read(name: str) -> dict[str, Any]:
        path = workdir / name
        return json.loads(path.read_text()) if path.exists() else {}

    return Rehearsal(proc, elapsed, read("rehearsal-summary.json"), read("e2e-summary.json"), status)
