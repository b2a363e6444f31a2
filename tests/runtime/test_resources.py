"""What jobs ask of their scheduler (gymforge.runtime.resources): a slot verification did not keep asks for nothing it
will not use, and a plan no partition can take fails before anything is submitted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gymforge.runtime import resources
from gymforge.core.config import load_config, validate_config

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "configs" / "paper-scale.yaml"
PARTITIONS = REPO / "profiles" / "slurm" / "partitions.yaml"


def _report(folder: Path, status: str) -> Path:
    path = folder / "report.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"item": "t0001", "status": status}))
    return path


def test_a_slot_that_was_not_verified_asks_for_no_gpu_and_minutes(tmp_path: Path) -> None:
    cfg = load_config(PAPER)
    for request in (resources.shard, resources.micro):
        full = request(cfg)
        assert full.gpu == 1 and full.mem_mb > 32768 and full.runtime >= 30
        assert request(cfg, _report(tmp_path / request.__name__ / "ok", "ok")) == full
        for status in ("discarded", "skipped"):
            assert request(cfg, _report(tmp_path / request.__name__ / status, status)) == resources.SKIPPED
        assert request(cfg, tmp_path / "not-yet" / "report.json") == full  # planning: as if verified


def test_a_job_no_partition_can_take_fails_naming_its_key() -> None:
    partitions = resources.load_partitions(PARTITIONS)
    cfg = validate_config({"train": {"gpus": 8, "runtime_min": 4320}, "rl": {"gpus": 8, "runtime_min": 100}})
    with pytest.raises(ValueError) as err:
        resources.check_partitions(resources.plan_requests(cfg), partitions, str(PARTITIONS))
    assert "train_student: asks for 8 GPU(s) for 4320 min" in str(err.value) and "train.runtime_min" in str(err.value)
    assert "  train_rl:" not in str(err.value)
    cfg = validate_config({"train": {"gpus": 16}})
    with pytest.raises(ValueError, match="no partition has 16 GPUs per node"):
        resources.check_partitions(resources.plan_requests(cfg), partitions)
    resources.check_partitions(resources.plan_requests(cfg), {})  # no partition file: nothing to hold it against


@pytest.mark.parametrize("path", [PAPER, REPO / "configs" / "post-training-paper-scale.yaml"], ids=lambda p: p.name)
def test_the_paper_scale_configs_fit_the_slurm_profiles_partitions(path: Path) -> None:
    resources.check_partitions(resources.plan_requests(load_config(path)), resources.load_partitions(PARTITIONS))


def _dry_run(workdir: Path, *args: str) -> str:
    env = {**os.environ, "SNAKEMAKE_SLURM_PARTITIONS": str(PARTITIONS)}
    proc = subprocess.run(
        # --cores: a dry run otherwise caps every job's threads at 1 (a real SLURM run does not)
        [sys.executable, "-m", "snakemake", "-n", "--cores", "256", "--profile", "profiles/slurm", "--workflow-profile",
         "none", "--configfile", str(PAPER), "--config", "topics={n: 2}", "evaluate={benchmark: builtin}", *args],
        cwd=workdir, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-4000:]
    return proc.stdout


def _jobs(text: str) -> list[dict[str, str]]:
    """Each planned job of a dry run: its rule, wildcards, resources and threads as printed."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", text):
        if not (m := re.match(r"(?:local)?rule (\w+):", block)):
            continue
        job = {"rule": m[1]}
        for key in ("wildcards", "resources", "threads"):
            if found := re.search(rf"^\s+{key}: (.*)$", block, re.M):
                job[key] = found[1]
        jobs.append(job)
    return jobs


def _resource(job: dict[str, str], name: str) -> int:
    return int(re.search(rf"\b{name}=(\d+)", job["resources"])[1])


@pytest.mark.slow  # two dry runs of the paper-scale plan under profiles/slurm: ~10 s each
def test_the_paper_scale_plan_under_slurm_requests_what_it_uses(tmp_path: Path) -> None:
    from workflow_copy import copy_workflow

    workdir = copy_workflow(tmp_path / "wf", "rules", "report", "profiles")
    cfg = load_config(PAPER)
    partitions = yaml.safe_load(PARTITIONS.read_text())["partitions"]
    longest = {gpu: max(p.get("max_runtime", 10**9) for p in partitions.values() if not gpu or p.get("max_gpu", 0) >= gpu)
               for gpu in (0, 1, 8)}
    jobs = _jobs(_dry_run(workdir))
    by_rule = {job["rule"]: job for job in jobs}
    for job in jobs:
        if "resources" in job and "runtime=" in job["resources"]:
            gpu = _resource(job, "gpu") if "gpu=" in job["resources"] else 0
            assert _resource(job, "runtime") <= longest[gpu], job
    train = by_rule["train_student"]
    assert (_resource(train, "gpu"), _resource(train, "nodes"), int(train["threads"])) == (8, 1, cfg.train.threads)
    assert cfg.train.threads >= 8 * cfg.train.gpus
    assert _resource(by_rule["train_rl"], "nodes") == 1
    assert int(by_rule["rollout_shard"]["threads"]) == cfg.trajectories.threads == cfg.trajectories.concurrency

    # A slot verification discarded: its shard and micro task ask for no GPU and a minimal allocation; the
    # verified slot's keep the full request.
    for slot, status in (("t0000", "ok"), ("t0001", "discarded")):
        env = workdir / "results-paper" / "environments" / slot
        (env / "verified").mkdir(parents=True)
        (env / "report.json").write_text(json.dumps({"item": slot, "status": status}))
    targets = [f"results-paper/{kind}" for kind in ("trajectories/t0000/shard_0000.json", "trajectories/t0001/shard_0000.json",
                                                   "micro/t0000/report.json", "micro/t0001/report.json")]
    jobs = _jobs(_dry_run(workdir, "--allowed-rules", "rollout_shard", "micro_task", "--", *targets))
    seen = {(job["rule"], re.search(r"slot=(t\d+)", job["wildcards"])[1]): job for job in jobs}
    assert len(seen) == 4, jobs
    for rule in ("rollout_shard", "micro_task"):
        kept, skipped = seen[(rule, "t0000")], seen[(rule, "t0001")]
        assert _resource(kept, "gpu") == cfg.trajectories.gpus and _resource(kept, "mem_mb") > cfg.sandbox.memory_mb
        assert (_resource(skipped, "gpu"), _resource(skipped, "mem_mb"), _resource(skipped, "runtime")) == (
            0, resources.SKIPPED.mem_mb, resources.SKIPPED.runtime)


@pytest.mark.slow
def test_a_plan_past_the_partitions_limit_fails_before_anything_runs(tmp_path: Path) -> None:
    from workflow_copy import copy_workflow

    workdir = copy_workflow(tmp_path / "wf", "rules", "report")
    env = {**os.environ, "SNAKEMAKE_SLURM_PARTITIONS": str(PARTITIONS)}
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(PAPER), "--config",
         "topics={n: 2}", "evaluate={benchmark: builtin}", "train={runtime_min: 4320}"],
        cwd=workdir, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode != 0
    out = proc.stderr + proc.stdout
    assert "train_student: asks for 8 GPU(s) for 4320 min" in out and "lower train.runtime_min" in out
