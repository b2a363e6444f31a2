"""Faults between gymforge and its teacher: a real loopback proxy (tests/fault_proxy.py) injects every fault kind
in front of the real offline teacher endpoint; the LLM layer must retry each one, log every attempt, and book it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai
import pytest
from fault_proxy import KINDS, FaultProxy

from gymforge.config import EndpointConfig, Price
from gymforge.ledger import Ledger
from gymforge.llm import LLMClient, MalformedResponse
from gymforge.offline_teacher.server import ensure_server
from gymforge.prompts import render

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
    assert not list((tmp_path / "cache").rglob("*.json"))


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
