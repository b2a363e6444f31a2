"""Faults between gymforge and its teacher: a real loopback proxy (tests/fault_proxy.py) injects every fault kind
in front of the real offline teacher endpoint; the LLM layer must retry each one, log every attempt, and book it."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from fault_proxy import KINDS, FaultProxy
from workflow_runs import SMALL_TOPICS, fingerprint, leftovers, snakemake, workflow

from gymforge.core.config import EndpointConfig, Price
from gymforge.llm.ledger import Ledger
from gymforge.llm.client import LLMClient, MalformedResponse
from gymforge.offline.server import ensure_server
from gymforge.core.prompts import render

PRICE = Price(input_per_mtok=1.25, output_per_mtok=10.0)
TOPICS = [{"role": "system", "content": render("system_teacher")},
          {"role": "user", "content": render("topics", n=4, seen=[])}]


@pytest.fixture(scope="module")
def teacher() -> str:
    return ensure_server()


def client(tmp_path: Path, url: str, **endpoint) -> LLMClient:
    ep = EndpointConfig(provider="openai", base_url=url, model="gymforge-offline-teacher", api_key_env="FAULT_KEY",
                        price=PRICE, **{"timeout_s": 1.0, **endpoint})
    return LLMClient(ep, stage="topics", cache_dir=tmp_path / "cache", ledger_dir=tmp_path / "llm", budget_usd=10.0,
                     backoff_base_s=0.01, backoff_max_s=0.05)


def done(tmp_path: Path) -> list[dict]:
    return [e for e in Ledger(tmp_path / "llm").entries() if e["event"] == "done"]


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULT_KEY", "sk-fault-SECRET")


@pytest.mark.parametrize("kind", KINDS)
def test_each_fault_kind_is_retried_and_logged(tmp_path: Path, teacher: str, kind: str) -> None:
    clean = client(tmp_path / "clean", teacher).chat(TOPICS, seed=7)
    with FaultProxy(teacher, schedule=lambda n: kind if n == 0 else None, hang_s=1.5, retry_after="0") as proxy:
        url = proxy.url
        with client(tmp_path, url) as llm:
            result = llm.chat(TOPICS, seed=7)
    assert result.content == clean.content and proxy.injected == {kind: 1}
    failed, ok = done(tmp_path)
    assert ok["ok"] and ok["attempt"] == 2 and failed["attempt"] == 1 and not failed["ok"]
    assert failed["transient"] and failed["endpoint"] == url and "SECRET" not in json.dumps(failed)
    expected = {"429": ("RateLimitError", 429), "500": ("InternalServerError", 500), "503": ("InternalServerError", 503),
                "hang": ("APITimeoutError", None), "cut": ("APIConnectionError", None),
                "bad_json": ("MalformedResponse", 200), "no_choices": ("MalformedResponse", 200)}[kind]
    assert (failed["error"], failed["http_status"]) == expected
    # Refused requests cost nothing; a reply that may have been generated is booked: from its usage when the
    # body still reports it, else at the attempt's upper bound.
    basis = {"429": "none", "500": "none", "503": "none", "no_choices": "usage"}.get(kind, "upper_bound")
    assert failed["cost_basis"] == basis and (failed["cost_usd"] > 0) == (basis != "none")
    assert Ledger(tmp_path / "llm").spent() == pytest.approx(failed["cost_usd"] + ok["cost_usd"])
    assert llm.usage.calls == 2


def test_malformed_bodies_exhaust_retries_with_the_endpoint_named(tmp_path: Path, teacher: str) -> None:
    with FaultProxy(teacher, rate=1.0, kinds=["bad_json"]) as proxy, client(tmp_path, proxy.url, max_retries=2) as llm:
        url = proxy.url
        with pytest.raises(MalformedResponse) as info:
            llm.chat(TOPICS, seed=1)
    assert proxy.requests == 3 and len(done(tmp_path)) == 3
    assert f"endpoint {url} model gymforge-offline-teacher" in info.value.__notes__[-1]
    assert not list((tmp_path / "cache").rglob("*.json*"))  # nothing cached: no pack, no file


def test_client_errors_fail_fast_naming_endpoint_and_model(tmp_path: Path, teacher: str) -> None:
    unknown = [{"role": "user", "content": "something the offline teacher cannot play"}]
    with client(tmp_path, teacher) as llm, pytest.raises(openai.BadRequestError) as info:
        llm.chat(unknown)
    assert "not retried" in info.value.__notes__[0] and "model gymforge-offline-teacher" in info.value.__notes__[0]
    [entry] = done(tmp_path)
    assert entry["http_status"] == 400 and entry["transient"] is False and entry["cost_usd"] == 0


def test_30_percent_faults_async_all_answered(tmp_path: Path, teacher: str) -> None:
    """Many concurrent requests through 30% faults of every kind: all answered, each exactly like a clean run."""
    prompts = [[*TOPICS[:1], {"role": "user", "content": render("topics", n=4, seen=[f"topic {i}"])}]
               for i in range(24)]

    async def ask(llm: LLMClient) -> list[str | None]:
        return [r.content for r in await asyncio.gather(*(llm.achat(p, seed=i) for i, p in enumerate(prompts)))]

    clean = asyncio.run(ask(client(tmp_path / "clean", teacher)))
    with FaultProxy(teacher, rate=0.3, seed=3, hang_s=1.5, retry_after="0") as proxy, \
            client(tmp_path, proxy.url, concurrency=8, max_retries=8) as llm:
        faulty = asyncio.run(ask(llm))
    assert faulty == clean
    assert sum(proxy.injected.values()) >= 5
    entries = done(tmp_path)
    assert len(entries) == proxy.requests == 24 + sum(proxy.injected.values())
    assert sum(e["ok"] for e in entries) == 24


# -- end to end: `snakemake tasks` through the proxy ---------------------------------------------------------------


@pytest.mark.slow
def test_one_invocation_of_tasks_survives_30_percent_faults(tmp_path: Path, teacher_url: str,
                                                            clean_tasks: dict[str, str]) -> None:
    with FaultProxy(teacher_url, rate=0.3, seed=1, hang_s=3.0) as proxy:
        workflow(tmp_path, proxy.url, topics=SMALL_TOPICS)
        proc = snakemake(tmp_path, "tasks")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sum(proxy.injected.values()) >= 3 and len(proxy.injected) >= 2, proxy.injected
    assert fingerprint(tmp_path / "results") == clean_tasks
    assert leftovers(tmp_path) == []
    # Every request is in the ledger, and `gymforge status` counts each retry where it happened.
    assert Ledger(tmp_path / "results" / "llm").request_count() == proxy.requests
    stages = status(tmp_path)["stages"]
    assert sum(s["llm"]["retries"] for s in stages.values()) == sum(proxy.injected.values())
    assert sum(sum(s["llm"]["errors"].values()) for s in stages.values()) == sum(proxy.injected.values())
    assert not any(s["failed"] for s in stages.values())


@pytest.mark.slow
def test_a_small_budget_is_used_up_never_exceeded_and_named(tmp_path: Path, teacher_url: str) -> None:
    workflow(tmp_path, teacher_url, topics=SMALL_TOPICS, budget_usd=0.03)
    proc = snakemake(tmp_path, "tasks")
    assert proc.returncode != 0
    budget = Ledger(tmp_path / "results" / "llm").budget(0.03)
    assert budget["spent_usd"] <= 0.03 and budget["in_flight"] == 0
    # Where users look: Snakemake's output, the failed job's log and failure record, `gymforge status`. It stopped
    # only when what was left could not pay for the next request: all but less than one request's cost was used
    # (with 12 topics and $0.05, calls are small against the budget: 97% used, see docs/operations.md).
    lines = [ln for ln in proc.stderr.splitlines() if "failed (budget_exhausted)" in ln]
    for line in lines:
        remaining, needed = map(float, re.search(r"remaining \$(\d+\.\d+); the next request needs about \$(\d+\.\d+)",
                                                 line).groups())
        assert "LLM budget exhausted" in line and "spent $" in line and remaining < needed
    assert budget["remaining_usd"] < max(float(re.search(r"needs about \$(\d+\.\d+)", ln).group(1)) for ln in lines)
    failed = {stage: s["failed"] for stage, s in status(tmp_path)["stages"].items() if s["failed"]}
    assert failed and all(set(f) == {"budget_exhausted"} for f in failed.values())
    record = json.loads(next((tmp_path / "results" / "logs").rglob("*.failed.json")).read_text())
    assert record["status"] == "failed" and record["reason"] in Path(record["log"].replace("results", str(
        tmp_path / "results"), 1)).read_text()


def status(workdir: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "gymforge", "status", "--json"], cwd=workdir, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)
