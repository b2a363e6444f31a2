"""End to end: the offline default through `tasks`, run by Snakemake exactly as a user runs it."""

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gymforge.llm.ledger import Ledger
from gymforge.tasks.files import validate_config_files
from workflow_copy import copy_workflow

SNAKEMAKE = [sys.executable, "-m", "snakemake"]

pytestmark = pytest.mark.slow


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, "--cores", "2", *args], cwd=workdir, capture_output=True, text=True,
                          timeout=timeout)


def status(workdir: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "gymforge", "status", "--json", "--results", "results"],
                         cwd=workdir, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A copy of the workflow with its own results and cache, built once for the module."""
    workdir = tmp_path_factory.mktemp("pipeline")
    copy_workflow(workdir, "rules", "report")
    proc = snakemake(workdir, "tasks")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return workdir


def test_offline_default_yields_tasks_and_a_reason_for_every_other_topic(run):
    report = status(run)
    stages = report["stages"]
    assert report["topics_planned"] == 6
    assert stages["tasks"]["ok"] >= 4  # seed 0: 5 of the 6
    assert stages["tasks"]["done"] == 6
    discarded = sum(sum(s["discarded"].values()) for s in stages.values())
    assert stages["tasks"]["ok"] + discarded == 6
    # Every slot file agrees: either an MLGym tree exists or a reason is recorded.
    for status_file in sorted((run / "results" / "tasks").glob("t*/status.json")):
        record = json.loads(status_file.read_text())
        tree = status_file.parent / "mlgym"
        if record["status"] == "ok":
            assert (tree / "configs" / "tasks" / f"{record['task_id']}.yaml").exists()
        else:
            assert record["reason"] and record["reason_code"]
            # Snakemake stamps directory outputs; nothing else may be there.
            assert [p.name for p in tree.iterdir()] in ([], [".snakemake_timestamp"])


def test_generated_configs_load_like_mlgym(run):
    trees = [p for p in (run / "results" / "tasks").glob("t*/mlgym") if (p / "configs").exists()]
    assert trees
    for tree in trees:
        files = {str(p.relative_to(tree)): p.read_text() for p in (tree / "configs").rglob("*.yaml")}
        bundle = validate_config_files(files)
        for rel in bundle.task.starter_code:
            assert (tree / rel).exists(), rel
        for ds in bundle.datasets.values():
            if ds.is_local:
                assert (tree / ds.data_path / "dataset_dict.json").exists()
        raw = yaml.safe_load((tree / "configs" / "tasks" / f"{bundle.task.id}.yaml").read_text())
        assert raw["id"] == bundle.task.id


def test_rerun_does_nothing_and_sends_no_request(run):
    before = Ledger(run / "results" / "llm").request_count()
    proc = snakemake(run, "tasks")
    assert proc.returncode == 0
    assert "Nothing to be done" in proc.stdout + proc.stderr
    assert Ledger(run / "results" / "llm").request_count() == before


def test_raising_topic_count_runs_only_new_slots(run):
    proc = snakemake(run, "tasks", "-n", "--quiet", "rules", "--config", "topics={n: 10}")
    assert proc.returncode == 0, proc.stderr
    counts = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    assert counts == {"topic_batch": 1, "proposal": 4, "task_configs": 4, "starter_code": 4, "tasks": 1, "run_config": 1, "total": 15}


def test_dry_run_of_paper_scale_plan_is_fast(run):
    # CPU seconds of the dry run, not wall time: the suite's parallel workers share the cores (about 21 s idle).
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = snakemake(run, "-n", "--quiet", "rules", "--config", "topics={n: 1000, batch_size: 20}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert proc.returncode == 0, proc.stderr
    assert "starter_code" in proc.stdout
    assert cpu < 30, cpu
