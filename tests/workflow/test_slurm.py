"""profiles/slurm through a real single-node SLURM cluster (scripts/slurm_cluster.sh + scripts/slurm_e2e.sh).

Needs root and apt-get the first time (slurm-wlm + munge are installed, ~25 s); skips with the script's
reason where SLURM cannot run. The end to end is the rehearsal's SLURM run (tests/rehearsal_run.py): paper-scale's
profile and config with sizes shrunk, to `all`, checked by scripts/slurm_e2e.sh as any run of it is.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rehearsal_run import Rehearsal
from workflow_copy import copy_workflow

REPO = Path(__file__).resolve().parents[2]

# `heavy`: the end to end's checks wait for the rehearsal's run, which mostly waits on SLURM's polls.
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


def test_e2e_runs_every_job_through_slurm(rehearsal: Rehearsal) -> None:
    """scripts/slurm_e2e.sh's checks of the rehearsal's SLURM run (configs/rehearsal.yaml to `all`), held here."""
    summary = rehearsal.e2e
    assert summary, f"no e2e-summary.json: {rehearsal.proc.stderr[-6000:]}"
    assert summary["ok"] and summary["snakemake_rc"] == 0, summary.get("problems")
    # Every rule with a command ran as a SLURM job; only the shell-less aggregation targets stayed local.
    assert {"topic_batch", "proposal", "verify_environment", "rollout_shard", "sft_dataset"} <= set(summary["remote_rules"])
    assert set(summary["local_rules"]) <= {"environments", "trajectories", "topics", "tasks", "checkpoints", "scores",
                                           "all"}
    assert summary["sbatch_jobs"] >= 8
    # One sbatch job per Snakemake job: the profile leaves job arrays off (tests/workflow/test_slurm_arrays.py).
    assert not summary["array_jobs"] and not summary["array_tasks"]
    assert summary["slurm_states"] and set(summary["slurm_states"].values()) == {"COMPLETED"}
    assert len(summary["rollout_shards"]) == 4  # 2 slots x 2 rollouts in shards of 1
    # trajectories.gpus is 1 (paper-scale's), but the offline tasks are CPU tasks: their verifications and shards asked
    # SLURM for no GPU and ran in the CPU partition (the GPU request follows the task's code, read from its records)
    slot_jobs = summary["slot_gpus"].values()
    assert {job["rule"] for job in slot_jobs} >= {"verify_environment", "rollout_shard"}
    assert all(not job["gpu"] and job["partition"] == "debug" for job in slot_jobs), slot_jobs
    assert summary["slurm_logs"] >= summary["sbatch_jobs"]
    print(f"slurm e2e (the rehearsal's): snakemake {summary['snakemake_s']} s")


def test_cluster_left_stopped_and_other_snakemake_calls_not_slowed(rehearsal: Rehearsal) -> None:
    """The script stops the cluster it started; with the private slurm.conf no client finds a dead
    controller, so importing the SLURM plugin (what every snakemake call does) stays fast."""
    assert rehearsal.proc.returncode == 0, rehearsal.proc.stderr[-3000:]
    assert rehearsal.cluster_status_after == 3  # slurm_cluster.sh status: 3 = not running
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import snakemake_executor_plugin_slurm"], check=True, timeout=60,
                   env=clean_env())
    # ~0.5-2 s normally; a client that waits for a missing controller costs ~10 s here.
    assert time.monotonic() - started < 6
