"""A Snakemake job as the rules run it (`gymforge --log <log> <command>`): earlier attempts' logs kept, a one-line
failure reason where users look, a failure record, temporaries in a scratch dir; stale Snakemake locks."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from loopback import closed_port_url

from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig
from gymforge.runtime.job import SCRATCH_ENV, attempt_logs, failure_path, scratch_dir
from gymforge.runtime.locks import clear_stale_locks, stale_lock_state
from gymforge.tools.status import collect, render_table


def config(tmp_path: Path, **teacher) -> Path:
    cfg = GymforgeConfig(results_dir=str(tmp_path / "results"), cache_dir=str(tmp_path / "cache"),
                         llm={"teacher": teacher} if teacher else {})
    path = tmp_path / f"config-{len(list(tmp_path.glob('config-*')))}.json"
    path.write_text(cfg.model_dump_json())
    return path


def gymforge(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gymforge", *args], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "OFFLINE_KEY": "k"}, timeout=120, check=False)


def topics_job(tmp_path: Path, cfg: Path, *wrapper: str) -> subprocess.CompletedProcess:
    log = tmp_path / "results" / "logs" / "topics" / "b0000.log"
    out = tmp_path / "results" / "topics" / "batches" / "b0000.json"
    command = ["topic-batch", "--config", str(cfg), "--batch", "b0000", "--previous", "--out", str(out)]
    if wrapper:  # e.g. with-gpus 0 --: the job's process execs the real command
        command = [*wrapper, sys.executable, "-m", "gymforge", *command]
    return gymforge(tmp_path, "--log", str(log), *command)


@pytest.mark.parametrize("wrapper", [(), ("with-gpus", "0", "--")], ids=["direct", "with-gpus"])
def test_failed_attempt_is_kept_named_and_cleared_by_a_successful_rerun(tmp_path: Path, wrapper: tuple) -> None:
    log = tmp_path / "results" / "logs" / "topics" / "b0000.log"
    dead = closed_port_url()
    broken = config(tmp_path, provider="openai", base_url=dead, api_key_env="OFFLINE_KEY", max_retries=0)
    failed = topics_job(tmp_path, broken, *wrapper)
    assert failed.returncode == 1
    line = "gymforge: job topics/b0000 failed (llm_unavailable): APIConnectionError: Connection error."
    assert line in failed.stderr and f"endpoint {dead} model gymforge-offline-teacher" in failed.stderr
    assert log.read_text().splitlines()[-1].startswith(line)  # the log ends with the cause, after the traceback
    record = json.loads(failure_path(log).read_text())
    assert (record["job"], record["status"], record["reason_code"]) == ("topics/b0000", "failed", "llm_unavailable")
    report = collect(tmp_path / "results")
    assert report["stages"]["topics"]["failed"] == {"llm_unavailable": 1}
    assert report["stages"]["topics"]["llm"]["errors"] == {"APIConnectionError": 1}
    assert "failed (llm_unavailable): 1" in render_table(report)

    log.unlink()  # what Snakemake does before it reruns the job
    ok = topics_job(tmp_path, config(tmp_path), *wrapper)
    assert ok.returncode == 0, ok.stderr
    [earlier] = attempt_logs(log)
    assert earlier.name == "b0000.log.attempt-1" and line in earlier.read_text()
    assert "topics kept" in log.read_text() and "failed" not in log.read_text()
    assert not failure_path(log).exists() and not scratch_dir(log).exists()


def test_temporaries_of_a_job_live_in_its_scratch_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "logs" / ".t0001.scratch"
    scratch.mkdir(parents=True)
    monkeypatch.setenv(SCRATCH_ENV, str(scratch))
    with atomic.directory(tmp_path / "tasks" / "t0001" / "mlgym") as tree:
        assert tree.parent == scratch
        (tree / "file.txt").write_text("x")
        atomic.write_text(tmp_path / "tasks" / "t0001" / "status.json", "{}")
        assert [p.parent for p in scratch.iterdir()] == [scratch]  # the half-built tree, nothing beside the output
    assert (tmp_path / "tasks" / "t0001" / "mlgym" / "file.txt").read_text() == "x"
    assert list(scratch.iterdir()) == [] and sorted(p.name for p in (tmp_path / "tasks" / "t0001").iterdir()) == [
        "mlgym", "status.json"]


def test_stale_snakemake_lock_is_cleared_only_when_no_snakemake_runs_here(tmp_path: Path) -> None:
    said = io.StringIO()
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("results/x\n")
    other = subprocess.Popen(["bash", "-c", "exec -a snakemake sleep 60"], cwd=tmp_path)
    try:
        for _ in range(50):  # until the exec has happened
            if stale_lock_state(tmp_path)[0] == "held":
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert stale_lock_state(tmp_path) == ("held", [other.pid])
        assert clear_stale_locks(tmp_path, out=said) == "held" and (locks / "0.input.lock").exists()
    finally:
        other.kill()
        other.wait()
    assert said.getvalue() == "" and clear_stale_locks(tmp_path, out=said) == "stale"
    assert "removed a stale Snakemake lock" in said.getvalue()
    assert not list(locks.iterdir()) and stale_lock_state(tmp_path) == ("none", [])


def test_a_lock_recorded_by_another_host_is_never_cleared_here(tmp_path: Path) -> None:
    """On a shared file system a second login node cannot see the run that holds the lock: the record of the
    locking run's host keeps a dry run there from deleting it; on the run's own host a dead pid makes it stale."""
    import socket

    from gymforge.runtime.locks import owner_path, read_owner

    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    lock = locks / "0.input.lock"
    assert clear_stale_locks(tmp_path, out=io.StringIO()) == "none"  # no lock: this process records itself
    assert read_owner(tmp_path)["host"] == socket.gethostname()
    lock.write_text("results/x\n")
    owner_path(tmp_path).write_text(json.dumps({"host": "login2.cluster", "pid": 1234, "started": 1.0}))
    said = io.StringIO()
    assert clear_stale_locks(tmp_path, out=said) == "elsewhere" and lock.exists()
    assert "login2.cluster" in said.getvalue() and "snakemake --unlock" in said.getvalue()
    assert read_owner(tmp_path)["host"] == "login2.cluster"  # the live run's record stays too

    alive = subprocess.Popen(["sleep", "60"])  # this host's locking run, alive (its name is not snakemake's)
    try:
        owner_path(tmp_path).write_text(json.dumps({"host": socket.gethostname(), "pid": alive.pid}))
        assert stale_lock_state(tmp_path) == ("held", [alive.pid])
        assert clear_stale_locks(tmp_path, out=io.StringIO()) == "held" and lock.exists()
    finally:
        alive.kill()
        alive.wait()
    assert clear_stale_locks(tmp_path, out=io.StringIO()) == "stale" and not lock.exists()
