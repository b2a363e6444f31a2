"""profiles/slurm through a real single-node SLURM cluster (scripts/slurm_cluster.sh + scripts/slurm_e2e.sh).

Needs root and apt-get the first time (slurm-wlm + munge are installed, ~25 s); skips with the script's
reason where SLURM cannot run. The e2e takes ~3 minutes on 2 cores.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from workflow_copy import copy_workflow

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
SKIP = 77  # slurm_cluster.sh / slurm_e2e.sh: SLURM cannot run here

# After the parallel phase, beside the SmolLM2 checks (`heavy`): the run mostly waits on SLURM's polls.
pytestmark = [pytest.mark.slow, pytest.mark.heavy]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment other tests run in: no SLURM_CONF, offline hub."""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **extra)
    return env


def workflow_copy(root: Path) -> Path:
    """The workflow with the two profiles under test and no profiles/default (it would apply on top)."""
    copy_workflow(root, "rules")
    for profile in ("slurm", "local-gpu"):
        shutil.copytree(REPO / "profiles" / profile, root / "profiles" / profile)
    return root


def dry_run(workdir: Path, *args: str, target: str = "trajectories") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--workflow-profile", "none", "-n", "--quiet", "rules",
                           "--config", "topics={n: 2, batch_size: 2}", *args, "--", target],
                          cwd=workdir, capture_output=True, text=True, timeout=300, env=clean_env())


def test_profiles_parse(tmp_path):
    pytest.importorskip("snakemake_executor_plugin_slurm")
    workdir = workflow_copy(tmp_path)
    proc = dry_run(workdir, "--profile", "profiles/slurm")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rollout_shard" in proc.stdout
    proc = dry_run(workdir, "--profile", "profiles/local-gpu", "--resources", "gpu=8")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rollout_shard" in proc.stdout


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    pytest.importorskip("snakemake_executor_plugin_slurm")
    workdir = tmp_path_factory.mktemp("slurm-e2e")
    was_running = subprocess.run([str(SCRIPTS / "slurm_cluster.sh"), "status"], capture_output=True,
                                 timeout=60, env=clean_env()).returncode == 0
    started = time.monotonic()
    proc = subprocess.run([str(SCRIPTS / "slurm_e2e.sh"), "trajectories"], capture_output=True, text=True,
                          timeout=1200, env=clean_env(GYMFORGE_PYTHON=sys.executable, GYMFORGE_E2E_DIR=str(workdir)))
    elapsed = time.monotonic() - started
    if proc.returncode == SKIP:
        reasons = [line for line in proc.stderr.splitlines() if "SKIP" in line]
        pytest.skip(reasons[-1] if reasons else proc.stderr[-500:])
    summary_path = workdir / "e2e-summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return proc, summary, elapsed, was_running


def test_e2e_runs_every_job_through_slurm(e2e):
    proc, summary, elapsed, _was_running = e2e
    assert proc.returncode == 0, f"problems: {summary.get('problems')}\n{proc.stderr[-6000:]}"
    assert summary["ok"] and summary["snakemake_rc"] == 0, summary.get("problems")
    # Every rule with a command ran as a SLURM job; only the shell-less aggregation targets stayed local.
    assert {"topic_batch", "proposal", "verify_environment", "rollout_shard", "sft_dataset"} <= set(summary["remote_rules"])
    assert set(summary["local_rules"]) <= {"environments", "trajectories", "topics", "tasks"}
    assert summary["sbatch_jobs"] >= 8
    # One sbatch job per Snakemake job: the profile leaves job arrays off (tests/workflow/test_slurm_arrays.py).
    assert not summary["array_jobs"] and not summary["array_tasks"]
    assert summary["slurm_states"] and set(summary["slurm_states"].values()) == {"COMPLETED"}
    assert len(summary["rollout_shards"]) == 4  # 2 slots x 2 rollouts in shards of 1
    # trajectories.gpus is 1, but the offline tasks are CPU tasks: their verifications and shards asked SLURM for no
    # GPU and ran in the CPU partition (the GPU request follows the task's code, read from its records)
    slot_jobs = summary["slot_gpus"].values()
    assert {job["rule"] for job in slot_jobs} >= {"verify_environment", "rollout_shard"}
    assert all(not job["gpu"] and job["partition"] == "debug" for job in slot_jobs), slot_jobs
    assert summary["slurm_logs"] >= summary["sbatch_jobs"]
    print(f"slurm e2e: {elapsed:.0f} s (snakemake {summary['snakemake_s']} s)")


def test_cluster_left_stopped_and_other_snakemake_calls_not_slowed(e2e):
    """The script stops the cluster it started; with the private slurm.conf no client finds a dead
    controller, so importing the SLURM plugin (what every snakemake call does) stays fast."""
    proc, _summary, _elapsed, was_running = e2e
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = subprocess.run([str(SCRIPTS / "slurm_cluster.sh"), "status"], capture_output=True, text=True,
                            timeout=60, env=clean_env())
    # A cluster that was already up before is left as it was found.
    assert status.returncode == (0 if was_running else 3), status.stdout + status.stderr
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import snakemake_executor_plugin_slurm"], check=True, timeout=60,
                   env=clean_env())
    # ~0.5-2 s normally; a client that waits for a missing controller costs ~10 s here.
    assert time.monotonic() - started < 6
