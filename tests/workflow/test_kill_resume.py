"""`kill -9` of the whole Snakemake process group at random points of `snakemake tasks`, then one plain rerun: it must
complete (the stale lock is cleared by itself), with results identical to an uninterrupted run's, no temporaries
left, and every request ever sent in the ledger (those in flight at the kill booked at their upper bound)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from fault_proxy import FaultProxy
from workflow_runs import (
    SMALL_TOPICS,
    env,
    fingerprint,
    leftovers,
    snakemake,
    snakemake_cmd,
    workflow,
)

from gymforge.llm.ledger import Ledger

pytestmark = pytest.mark.slow


def start(workdir: Path, tmp: Path, stderr: Path | None = None) -> subprocess.Popen:
    # Its own process group, as a terminal's job would be: killpg reaches Snakemake and every job it started.
    # `tmp`: TMPDIR, where a killed Snakemake leaves its own (empty) temporary folder instead of in /tmp.
    with open(stderr or os.devnull, "w") as err:
        return subprocess.Popen(snakemake_cmd("tasks"), cwd=workdir, env={**env(), "TMPDIR": str(tmp)},
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)


def kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_kill_9_at_random_points_then_one_rerun_completes_identically(tmp_path: Path, teacher_url: str,
                                                                       clean_tasks: dict[str, str],
                                                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("killed-runs-tmp")
    rng = random.Random(14)
    nth = rng.randrange(3, 12)  # first kill: while the nth chat request is being answered
    arrived = threading.Event()
    with FaultProxy(teacher_url, rate=0.0, delay_s=0.5, on_request=lambda n: n == nth and arrived.set()) as proxy:
        workflow(tmp_path, proxy.url, topics=SMALL_TOPICS)
        proc = start(tmp_path, tmp)
        assert arrived.wait(timeout=300), "the run ended before its request to kill at"
        kill_group(proc)
        assert leftovers(tmp_path), "a kill mid-run leaves a lock (and usually temporaries)"
        # Second kill: at a random moment of the resumed run (which starts by clearing the first kill's lock).
        proc = start(tmp_path, tmp, stderr=tmp_path / "resumed.err")
        try:
            proc.wait(timeout=rng.uniform(3.0, 15.0))
        except subprocess.TimeoutExpired:
            kill_group(proc)
        rerun = snakemake(tmp_path, "tasks")
        sent_to_endpoint = proxy.requests
    assert "removed a stale Snakemake lock" in (tmp_path / "resumed.err").read_text()
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert fingerprint(tmp_path / "results") == clean_tasks
    assert leftovers(tmp_path) == []
    ledger = Ledger(tmp_path / "results" / "llm")
    totals = ledger.totals()
    # Write-ahead: everything that reached the endpoint was logged as sent first (a request killed between its `sent`
    # line and the socket is logged too), and nothing is left unsettled.
    assert ledger.request_count() >= sent_to_endpoint
    assert sum(t["in_flight"] for t in totals.values()) == 0
    assert sum(t["killed_in_flight"] for t in totals.values()) >= 1
    killed = [e for e in ledger.entries() if e.get("error") == "killed_in_flight"]
    assert all(e["cost_usd"] > 0 and e["cost_basis"] == "upper_bound" and e["job"] for e in killed)
    assert ledger.spent() == pytest.approx(sum(e["cost_usd"] for e in ledger.entries() if e["event"] == "done"))
