"""State that a cluster's shared file system can carry: the response cache packed per job, the ledger's check of
its locks at start, status reads that take no lock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loopback import LoopbackServer

from gymforge.runtime import sharedfs
from gymforge.core.config import EndpointConfig, GymforgeConfig
from gymforge.runtime.job import JOB_LOG_ENV
from gymforge.llm import ledger as ledger_mod
from gymforge.llm.client import LLMClient

KEY_ENV = "GYMFORGE_SHARED_FS_KEY"


def ask(tmp_path: Path, url: str, text: str) -> bool:
    """One chat call through a fresh client (a new process would do the same); whether it came from the cache."""
    ep = EndpointConfig(provider="openai", base_url=url, model="loopback-model", api_key_env=KEY_ENV)
    with LLMClient(ep, stage="verify", cache_dir=tmp_path / "cache", ledger_dir=tmp_path / "llm",
                   budget_usd=10.0) as llm:
        return llm.chat([{"role": "user", "content": text}], seed=1).cached


def files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_the_response_cache_is_one_file_per_job_not_per_call(tmp_path: Path, loopback: LoopbackServer,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "k")
    monkeypatch.setenv(JOB_LOG_ENV, str(tmp_path / "results" / "logs" / "environments" / "t0003.log"))
    assert [ask(tmp_path, loopback.url, f"q{i}") for i in range(5)] == [False] * 5
    assert files(tmp_path / "cache") == [tmp_path / "cache" / "packs" / "environments" / "t0003.jsonl"]
    # The job's rerun is answered from its pack, by a new client, with nothing sent.
    assert [ask(tmp_path, loopback.url, f"q{i}") for i in range(5)] == [True] * 5 and loopback.count == 5
    # Another job packs its own calls apart (and does not read this job's pack).
    monkeypatch.setenv(JOB_LOG_ENV, str(tmp_path / "results" / "logs" / "environments" / "t0004.log"))
    assert not ask(tmp_path, loopback.url, "q0") and len(files(tmp_path / "cache")) == 2


def test_a_pack_cut_by_a_kill_loses_only_the_cut_line(tmp_path: Path, loopback: LoopbackServer,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "k")
    monkeypatch.setenv(JOB_LOG_ENV, str(tmp_path / "logs" / "tasks" / "t0001.log"))
    ask(tmp_path, loopback.url, "first")
    ask(tmp_path, loopback.url, "second")
    pack = tmp_path / "cache" / "packs" / "tasks" / "t0001.jsonl"
    data = pack.read_bytes()
    pack.write_bytes(data[: len(data) - 20])  # the kill came while the second line was written
    assert ask(tmp_path, loopback.url, "first") and not ask(tmp_path, loopback.url, "second")
    assert ask(tmp_path, loopback.url, "second")  # re-appended on a line of its own, readable again
    assert loopback.count == 3 and len(pack.read_text().splitlines()) == 3


def test_responses_cached_one_file_per_call_are_still_read(tmp_path: Path, loopback: LoopbackServer,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache written before packs (`<key[:2]>/<key>.json`) keeps answering after the upgrade."""
    monkeypatch.setenv(KEY_ENV, "k")
    monkeypatch.delenv(JOB_LOG_ENV, raising=False)
    ask(tmp_path, loopback.url, "old")
    pack = next((tmp_path / "cache" / "packs").rglob("*.jsonl"))
    row = json.loads(pack.read_text())
    legacy = tmp_path / "cache" / row["key"][:2] / f"{row['key']}.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text(json.dumps(row["result"]))
    pack.unlink()
    assert ask(tmp_path, loopback.url, "old") and loopback.count == 1


LUSTRE = "36 25 0:52 / {point} rw,relatime shared:30 - lustre 10.0.0.1@o2ib:/scratch rw,{opts}\n"


@pytest.mark.parametrize("fstype, opts, state", [
    ("lustre", "flock,lazystatfs", "ok"),
    ("lustre", "localflock,lazystatfs", "per_node"),
    ("lustre", "lazystatfs", "broken"),
    ("nfs4", "vers=4.2,local_lock=none,addr=10.0.0.2", "ok"),
    ("nfs", "vers=3,local_lock=flock,addr=10.0.0.2", "per_node"),
    ("beegfs", "cfgFile=/etc/beegfs/beegfs-client.conf", "unknown"),
    ("ext4", "errors=remount-ro", "ok"),
])
def test_whether_locks_hold_across_nodes_is_read_off_the_mount(tmp_path: Path, fstype: str, opts: str,
                                                               state: str) -> None:
    mountinfo = ("22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n" +
                 LUSTRE.replace("lustre 10", f"{fstype} 10").format(point=tmp_path.parent, opts=opts))
    found = sharedfs.lock_mount(tmp_path, mountinfo, probe=False)
    assert (found.state, found.mount_point, found.fstype) == (state, str(tmp_path.parent), fstype)
    assert sharedfs.lock_mount(tmp_path, "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n", probe=True).state == "ok"


def test_the_ledger_refuses_per_node_locks_in_a_cluster_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Lustre with localflock two nodes each hold "the" ledger lock, and the budget would not hold: a job on a
    cluster refuses to start spending, naming the mount option, unless every job runs on one node."""
    real = sharedfs.lock_mount
    mount = LUSTRE.format(point=tmp_path, opts="localflock")
    monkeypatch.setattr(sharedfs, "lock_mount", lambda path: real(path, mount))
    ledger_mod.check_locks.cache_clear()
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    ledger_mod.Ledger(tmp_path / "off-cluster")  # one host: its locks hold
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with pytest.raises(ledger_mod.LedgerLockError, match="localflock.*GYMFORGE_SINGLE_NODE=1"):
        ledger_mod.Ledger(tmp_path / "cluster")
    monkeypatch.setenv("GYMFORGE_SINGLE_NODE", "1")
    ledger_mod.check_locks.cache_clear()
    ledger_mod.Ledger(tmp_path / "cluster")
    ledger_mod.check_locks.cache_clear()


def test_the_ledger_refuses_a_directory_without_flock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = sharedfs.lock_mount
    monkeypatch.setattr(sharedfs, "lock_mount", lambda path: real(path, LUSTRE.format(point=tmp_path, opts="noflock"),
                                                                  probe=False))
    ledger_mod.check_locks.cache_clear()
    with pytest.raises(ledger_mod.LedgerLockError, match="noflock"):
        ledger_mod.Ledger(tmp_path / "llm")
    ledger_mod.check_locks.cache_clear()


def test_status_reads_the_ledger_without_its_lock_and_writes_nothing(tmp_path: Path) -> None:
    """While a job holds the run's ledger lock (a slow file system, a stuck process), `gymforge status` still
    answers, from the log as it is, and leaves the results directory as it found it."""
    import subprocess
    import sys
    import time

    from gymforge.core.config import Price

    results = tmp_path / "results"
    ledger = ledger_mod.Ledger(results / "llm")
    price = Price(input_per_mtok=1.0, output_per_mtok=2.0)
    admitted = ledger.admit(stage="topics", prompt_chars=400, max_tokens=100, price=price, budget_usd=5.0,
                            meta={"job": "topics/b0000"})
    ledger.settle(admitted.id, {"stage": "topics", "job": "topics/b0000", "ok": True, "cost_usd": 0.0003,
                                "prompt_tokens": 100, "completion_tokens": 100, "cost_basis": "usage"})
    (results / "config.json").write_text(GymforgeConfig.model_validate({"llm": {"budget_usd": 5.0}}).model_dump_json())
    before = {p: p.stat().st_mtime_ns for p in results.rglob("*")}
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from filelock import FileLock; "
                               "FileLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)",
                               str(results / "llm" / "ledger.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "gymforge", "status", "--results", str(results), "--json"],
                           capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["llm"]["requests_sent"] == 1 and report["stages"]["topics"]["usage"]["calls"] == 1
    assert report["llm"]["budget"]["spent_usd"] == pytest.approx(0.0003)
    assert took < 30  # it did not wait for the lock (held for 120 s)
    assert {p: p.stat().st_mtime_ns for p in results.rglob("*")} == before
