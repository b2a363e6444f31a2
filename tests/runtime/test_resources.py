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
        assert full.gpu == 1 and full.mem_mb > cfg.sandbox.memory_mb and full.runtime >= 30
        assert request(cfg, _report(tmp_path / request.__name__ / "ok", "ok")) == full
        for status in ("discarded", "skipped"):
            assert request(cfg, _report(tmp_path / request.__name__ / status, status)) == resources.SKIPPED
        assert request(cfg, tmp_path / "not-yet" / "report.json") == full  # planning: as if verified


def _record(path: Path, status: str = "ok", entrypoint: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"item": "t0001", "status": status, "entrypoint": entrypoint}))
    return path


def test_the_gpu_request_of_a_slots_jobs_follows_its_tasks_code(tmp_path: Path) -> None:
    """Only a task whose code needs a GPU (an LMSubmissionTasks task: torchrun on CUDA) gets trajectories.gpus for its
    verification, micro variant and shards; a CPU task's jobs ask for none, with the same memory and minutes."""
    cfg = load_config(PAPER)
    assert cfg.trajectories.gpus == 1
    lm, csv = (_record(tmp_path / kind / "report.json", entrypoint=kind)
               for kind in ("LMSubmissionTasks", "CSVSubmissionTasks"))
    for request in (resources.verification, resources.shard, resources.micro):
        planned = request(cfg)
        assert request(cfg, lm) == planned and planned.gpu == 1  # planning shows what a GPU task would get
        on_cpu = request(cfg, csv)
        assert on_cpu.gpu == 0 and (on_cpu.mem_mb, on_cpu.runtime, on_cpu.threads) == (
            planned.mem_mb, planned.runtime, planned.threads)
        for kind in ("ModelSubmissionTasks", "PythonSubmissionTasks"):
            assert request(cfg, _record(tmp_path / request.__name__ / kind / "r.json", entrypoint=kind)).gpu == 0
    # verify_environment reads the starter-code record: a slot whose code was not generated asks for none
    assert resources.verification(cfg, _record(tmp_path / "failed" / "status.json", "failed")).gpu == 0
    assert resources.verification(cfg, tmp_path / "not-yet" / "status.json").gpu == 1
    # the verification report's own verdict decides over its entrypoint
    lm_on_cpu = tmp_path / "verdict" / "report.json"
    lm_on_cpu.parent.mkdir()
    lm_on_cpu.write_text(json.dumps({"status": "ok", "entrypoint": "LMSubmissionTasks", "needs_gpu": False}))
    assert resources.shard(cfg, lm_on_cpu).gpu == 0
    no_gpus = validate_config({"trajectories": {"gpus": 0}})
    assert resources.shard(no_gpus, lm).gpu == 0


def test_a_post_training_task_needs_a_gpu_unless_its_base_is_the_cpu_build(tmp_path: Path) -> None:
    """A post-training task fine-tunes its base: on the offline CPU build (smollm2-135m) it needs no GPU, on a hub
    model it does; post_training.base_model overrides every task's own base."""
    cfg = load_config(PAPER)

    def code(name: str, spec: str | None) -> Path:
        files = {"mlgym/data/generate.py": "..."} | ({"mlgym/data/post_training.yaml": spec} if spec is not None else {})
        path = tmp_path / name / "status.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"status": "ok", "entrypoint": "PythonSubmissionTasks", "files": files}))
        return path

    plain, small, default, hub = (code("plain", None), code("small", "base_model: smollm2-135m\neval_file: e"),
                                  code("default", "eval_file: e"), code("hub", "base_model: Qwen/Qwen3-0.6B-Base"))
    assert [resources.verification(cfg, p).gpu for p in (plain, small, default, hub)] == [0, 0, 0, 1]
    on_hub = cfg.model_copy(update={"post_training": cfg.post_training.model_copy(
        update={"base_model": "Qwen/Qwen3-4B-Base"})})
    assert [resources.verification(on_hub, p).gpu for p in (plain, small, default, hub)] == [0, 1, 1, 1]
    assert resources.needs_gpu(cfg, "LMSubmissionTasks") and not resources.needs_gpu(cfg, "CSVSubmissionTasks")


def test_evaluation_jobs_hold_their_concurrent_sandboxes() -> None:
    """eval_runs runs evaluate.concurrency sandboxes at once, check_benchmark_task one: their mem_mb is evaluate.mem_mb
    raised to hold those sandboxes plus the job, so SLURM never kills a job before a sandbox reaches its own limit."""
    cfg = validate_config({"sandbox": {"memory_mb": 8192}, "evaluate": {"concurrency": 8, "mem_mb": 4096}})
    assert resources.evaluation(cfg).mem_mb == 8 * 8192 + resources.JOB_OVERHEAD_MB
    assert resources.benchmark_check(cfg).mem_mb == 8192 + resources.JOB_OVERHEAD_MB
    roomy = validate_config({"sandbox": {"memory_mb": 8192}, "evaluate": {"concurrency": 8, "mem_mb": 98304}})
    assert resources.evaluation(roomy).mem_mb == resources.benchmark_check(roomy).mem_mb == 98304
    paper = load_config(PAPER)
    assert resources.evaluation(paper).mem_mb >= paper.evaluate.concurrency * paper.sandbox.memory_mb


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
    # 16 sandboxes of 64 GiB: more than any node of the profile's partitions holds
    cfg = validate_config({"sandbox": {"memory_mb": 65536}, "trajectories": {"concurrency": 16, "gpus": 1}})
    with pytest.raises(ValueError) as err:
        resources.check_partitions(resources.plan_requests(cfg), partitions)
    assert ("  rollout_shard: asks for 1 GPU(s) for 240 min with 1049600 MB, but the largest partition that offers "
            "that allows 1000000 MB: lower trajectories.concurrency or sandbox.memory_mb") in str(err.value)
    assert "  rollout_shard (a CPU task): asks for 240 min with 1049600 MB" in str(err.value)


@pytest.mark.parametrize("path", [PAPER, REPO / "configs" / "post-training-paper-scale.yaml"], ids=lambda p: p.name)
def test_the_paper_scale_configs_fit_the_slurm_profiles_partitions(path: Path) -> None:
    resources.check_partitions(resources.plan_requests(load_config(path)), resources.load_partitions(PARTITIONS))


def _dry_run(workdir: Path, *args: str, config: tuple[str, ...] = ("topics={n: 2}",)) -> str:
    env = {**os.environ, "SNAKEMAKE_SLURM_PARTITIONS": str(PARTITIONS)}
    proc = subprocess.run(
        # --cores: a dry run otherwise caps every job's threads at 1 (a real SLURM run does not)
        [sys.executable, "-m", "snakemake", "-n", "--cores", "256", "--profile", "profiles/slurm", "--workflow-profile",
         "none", "--configfile", str(PAPER), "--config", *config, "evaluate={benchmark: builtin}", *args],
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
    # every job that runs sandboxes asks for the memory its concurrent sandboxes may hold, within a node's
    for rule, sandboxes in (("rollout_shard", cfg.trajectories.concurrency), ("eval_runs", cfg.evaluate.concurrency),
                            ("check_benchmark_task", 1), ("verify_environment", 1)):
        assert _resource(by_rule[rule], "mem_mb") > sandboxes * cfg.sandbox.memory_mb, rule
    largest = max(p.get("max_mem_mb", 0) for p in partitions.values())
    assert all(_resource(job, "mem_mb") <= largest for job in jobs if "mem_mb=" in job.get("resources", "")), largest

    # The GPU request follows each task's code: a verified LM task's shard and micro task (t0000) get
    # trajectories.gpus, a verified CSV task's (t0002) none with the same memory; a slot verification discarded
    # (t0001) asks for no GPU and a minimal allocation. verify_environment reads the starter-code record: an LM
    # task's (t0003) asks for the GPU, a CSV task's (t0004) for none.
    results = workdir / "results-paper"
    for slot, status, entrypoint in (("t0000", "ok", "LMSubmissionTasks"), ("t0001", "discarded", None),
                                     ("t0002", "ok", "CSVSubmissionTasks")):
        env = results / "environments" / slot
        (env / "verified").mkdir(parents=True)
        (env / "report.json").write_text(json.dumps({"item": slot, "status": status, "entrypoint": entrypoint}))
    for slot, entrypoint in (("t0003", "LMSubmissionTasks"), ("t0004", "CSVSubmissionTasks")):
        (results / "tasks" / slot / "mlgym").mkdir(parents=True)
        (results / "proposals").mkdir(exist_ok=True)
        (results / "configs").mkdir(exist_ok=True)
        record = json.dumps({"item": slot, "status": "ok", "entrypoint": entrypoint})
        for path in (results / "proposals" / f"{slot}.json", results / "configs" / f"{slot}.json",
                     results / "tasks" / slot / "status.json"):
            path.write_text(record)
    targets = [f"results-paper/{kind}/{slot}/{name}" for kind, name in (("trajectories", "shard_0000.json"),
                                                                         ("micro", "report.json"))
               for slot in ("t0000", "t0001", "t0002")]
    targets += [f"results-paper/environments/{slot}/report.json" for slot in ("t0003", "t0004")]
    jobs = _jobs(_dry_run(workdir, "--allowed-rules", "rollout_shard", "micro_task", "verify_environment", "--",
                          *targets, config=("topics={n: 5}", "datasets={hub: offline}")))
    seen = {(job["rule"], re.search(r"slot=(t\d+)", job["wildcards"])[1]): job for job in jobs}
    assert len(seen) == 8, jobs
    for rule in ("rollout_shard", "micro_task"):
        gpu_task, skipped, cpu_task = seen[(rule, "t0000")], seen[(rule, "t0001")], seen[(rule, "t0002")]
        assert _resource(gpu_task, "gpu") == cfg.trajectories.gpus == 1
        assert _resource(gpu_task, "mem_mb") > cfg.sandbox.memory_mb
        assert (_resource(cpu_task, "gpu"), _resource(cpu_task, "mem_mb")) == (0, _resource(gpu_task, "mem_mb"))
        assert (_resource(skipped, "gpu"), _resource(skipped, "mem_mb"), _resource(skipped, "runtime")) == (
            0, resources.SKIPPED.mem_mb, resources.SKIPPED.runtime)
    assert _resource(seen[("verify_environment", "t0003")], "gpu") == 1
    assert _resource(seen[("verify_environment", "t0004")], "gpu") == 0


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


def test_the_names_resources_copies_from_higher_layers_match_them() -> None:
    """runtime sits below student and tasks, so it names the CPU base model and the post-training spec file itself:
    a rename there would silently make every post-training task ask for GPUs (or none)."""
    from gymforge.runtime import resources
    from gymforge.student import smollm2
    from gymforge.tasks import posttraining

    assert resources.CPU_BASE_MODELS == {smollm2.NAME}
    assert resources.SPEC_FILE == posttraining.SPEC_FILE
