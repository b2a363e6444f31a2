from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import socket
import subprocess
import sys
import time
import types
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import openai
import pytest
from loopback import Answer, LoopbackServer, closed_port_url, completion, error_body
from openai.types.chat import ChatCompletionMessageParam
from pydantic import TypeAdapter

from gymforge.core.config import EndpointConfig, GymforgeConfig, Price
from gymforge.llm.ledger import Ledger
from gymforge.llm.client import BudgetExceeded, LLMClient, Usage, make_client, retry_after_s

KEY = "sk-gymforge-test-SECRET-4711"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMFORGE_TEST_KEY", KEY)


def client(tmp_path: Path, url: str, *, budget: float = 10.0, **endpoint: Any) -> LLMClient:
    ep = EndpointConfig(provider="openai", base_url=url, model="loopback-model", api_key_env="GYMFORGE_TEST_KEY", **endpoint)
    return LLMClient(
        ep, stage="test", cache_dir=tmp_path / "cache", ledger_dir=tmp_path / "ledger",
        budget_usd=budget, backoff_base_s=0.01, backoff_max_s=0.05,
    )


def retries(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if r.name == "gymforge.llm.client" and "retry" in r.getMessage())


def test_repeated_request_is_served_from_cache(tmp_path: Path, loopback: LoopbackServer) -> None:
    price = Price(input_per_mtok=1.0, output_per_mtok=2.0)
    with client(tmp_path, loopback.url, price=price) as llm:
        first = llm.chat(HI, seed=1)
        second = llm.chat(HI, seed=1)
        assert loopback.count == 1
        assert not first.cached and first.cost_usd == pytest.approx((10 * 1 + 5 * 2) / 1e6)
        assert second.cached and second.cost_usd == 0 and second.content == first.content == "echo: hi"
        llm.chat(HI, seed=1, temperature=0.0)  # a different request must miss
        assert loopback.count == 2
        assert llm.usage == Usage(calls=2, cache_hits=1, prompt_tokens=20, completion_tokens=10, cost_usd=2 * first.cost_usd)
    # The cache key ignores base_url: the offline teacher gets a new port every run.
    with LoopbackServer() as other, client(tmp_path, other.url, price=price) as llm2:
        assert llm2.chat(HI, seed=1).cached and other.count == 0
    ledger = Ledger(tmp_path / "ledger")
    assert ledger.request_count() == 2
    totals = ledger.totals()["test"]
    assert {k: totals[k] for k in Usage.model_fields} == (llm.usage + llm2.usage).model_dump()


def test_429_retry_after_is_honoured(tmp_path: Path, loopback: LoopbackServer, caplog: pytest.LogCaptureFixture) -> None:
    loopback.push(Answer(429, {"Retry-After": "1"}, error_body("slow down", "rate_limit_error")))
    with client(tmp_path, loopback.url) as llm:
        t0 = time.monotonic()
        result = llm.chat(HI)
        assert time.monotonic() - t0 >= 1.0
    assert result.content == "echo: hi" and loopback.count == 2 and retries(caplog) == 1


def test_500_is_retried(tmp_path: Path, loopback: LoopbackServer) -> None:
    loopback.push(Answer(500), Answer(503))
    with client(tmp_path, loopback.url) as llm:
        assert llm.chat(HI).content == "echo: hi"
    assert loopback.count == 3
    entries = Ledger(tmp_path / "ledger").entries()
    assert [e["event"] for e in entries] == ["sent", "done"] * 3  # write-ahead: each attempt logged before it leaves
    done = [e for e in entries if e["event"] == "done"]
    assert [(e["attempt"], e["ok"], e["http_status"]) for e in done] == [(1, False, 500), (2, False, 503), (3, True, 200)]
    assert len({e["call"] for e in entries}) == 1
    assert Ledger(tmp_path / "ledger").totals()["test"]["retries"] == 2


def test_connection_refused_is_retried_then_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with client(tmp_path, closed_port_url(), max_retries=2) as llm, pytest.raises(openai.APIConnectionError):
        llm.chat(HI)
    assert retries(caplog) == 2
    ledger = Ledger(tmp_path / "ledger")
    done = [e for e in ledger.entries() if e["event"] == "done"]
    assert [e["attempt"] for e in done] == [1, 2, 3]
    assert all(not e["ok"] and e["error"] == "APIConnectionError" and e["cost_usd"] == 0 for e in done)  # never reached
    assert json.loads(ledger.spend_path.read_text())["reservations"] == {}  # released on failure


@pytest.mark.parametrize("status", [400, 401, 404])
def test_client_errors_raise_at_once(tmp_path: Path, loopback: LoopbackServer, caplog: pytest.LogCaptureFixture,
                                     status: int) -> None:
    loopback.push(Answer(status, {}, error_body("no", "invalid_request_error")))
    with client(tmp_path, loopback.url) as llm, pytest.raises(openai.APIStatusError) as info:
        llm.chat(HI)
    assert loopback.count == 1 and retries(caplog) == 0
    assert f"endpoint {loopback.url} model loopback-model" in info.value.__notes__[0]
    assert not list((tmp_path / "cache").rglob("*.json*"))  # failures are not cached (no pack, no file)


@pytest.mark.parametrize("budget", [1.08, 2.0])
def test_budget_is_used_up_but_never_exceeded(tmp_path: Path, loopback: LoopbackServer, budget: float) -> None:
    # Worst case per call: 100 completion tokens at $10k/Mtok = $1; each actually costs 5 tokens = $0.05.
    price = Price(output_per_mtok=10_000)
    with client(tmp_path, loopback.url, budget=budget, price=price, max_tokens=100) as llm, \
            pytest.raises(BudgetExceeded) as info:
        for i in range(100):
            llm.chat([{"role": "user", "content": f"q{i}"}])
    spent = Ledger(tmp_path / "ledger").spent()
    assert spent == pytest.approx(0.05 * loopback.count) and budget - 0.05 < spent <= budget
    assert f"budget ${budget:.4f}, spent ${spent:.4f}, reserved $0.0000" in str(info.value)
    assert "remaining" in str(info.value) and "Raise llm.budget_usd" in str(info.value)
    # Each request's worst case fitted in what was left: max_tokens was lowered where the configured one did not.
    sent = [r["body"]["max_tokens"] for r in loopback.requests]
    assert all(0.05 * i + n * 0.01 <= budget + 1e-9 for i, n in enumerate(sent))
    assert min(sent) < 100


def test_in_flight_calls_hold_budget(tmp_path: Path) -> None:
    # Each call could cost $1 and only $1.5 is left: while one is in flight the other must be refused.
    async def both(llm: LLMClient) -> list[Any]:
        calls = [llm.achat([{"role": "user", "content": str(i)}]) for i in range(2)]
        return await asyncio.gather(*calls, return_exceptions=True)

    with LoopbackServer(delay_s=0.3) as srv, client(
        tmp_path, srv.url, budget=1.5, price=Price(output_per_mtok=10_000), max_tokens=100
    ) as llm:
        outcomes = asyncio.run(both(llm))
    assert sorted(type(o).__name__ for o in outcomes) == ["BudgetExceeded", "ChatResult"]
    assert srv.count == 1


def test_in_flight_bound_lowers_max_tokens_or_waits(tmp_path: Path) -> None:
    # One settled call teaches the ledger that replies are 5 tokens ($0.05); then two run at once. The first holds
    # its $1 bound; the second fits only with a lowered max_tokens (budget 1.5), or must wait (budget 1.09).
    async def both(llm: LLMClient) -> list[Any]:
        return await asyncio.gather(*(llm.achat([{"role": "user", "content": str(i)}]) for i in range(2)))

    for budget, lowered, overlapped in [(1.5, 45, 2), (1.09, 99, 1)]:
        with LoopbackServer(delay_s=0.3) as srv, client(
            tmp_path / str(budget), srv.url, budget=budget, price=Price(output_per_mtok=10_000), max_tokens=100
        ) as llm:
            llm.chat(HI)
            assert [r.content for r in asyncio.run(both(llm))] == ["echo: 0", "echo: 1"]
        assert sorted(r["body"]["max_tokens"] for r in srv.requests[1:]) == [lowered, 100]
        assert srv.max_in_flight == overlapped


def test_achat_is_bounded_by_concurrency(tmp_path: Path) -> None:
    async def ask(llm: LLMClient, *questions: str) -> list[Any]:
        return await asyncio.gather(*(llm.achat([{"role": "user", "content": q}]) for q in questions))

    questions = [f"q{i}" for i in range(6)]
    with LoopbackServer(delay_s=0.15) as srv, client(tmp_path, srv.url, concurrency=2) as llm:
        results = asyncio.run(ask(llm, *questions))
        assert [r.content for r in results] == [f"echo: {q}" for q in questions]
        assert srv.max_in_flight == 2 and srv.count == 6
        # A second asyncio.run() must not reuse the first loop's connections or semaphore.
        assert asyncio.run(ask(llm, "again"))[0].content == "echo: again"
    assert llm.usage.calls == 7


def test_tool_calls_round_trip(tmp_path: Path, loopback: LoopbackServer) -> None:
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    loopback.push(Answer(200, {}, completion(None, tool_calls=[("search", {"query": "penguins"})])))
    with client(tmp_path, loopback.url) as llm:
        result = llm.chat(HI, tools=tools)
        [call] = result.tool_calls
        assert result.finish_reason == "tool_calls" and call.name == "search"
        assert json.loads(call.arguments) == {"query": "penguins"}
        reply = result.assistant_message()
        history = [*HI, reply, {"role": "tool", "tool_call_id": call.id, "content": "[]"}]
        TypeAdapter(list[ChatCompletionMessageParam]).validate_python(history)
        llm.chat(history, tools=tools)
    sent = loopback.requests[-1]["body"]
    assert sent["messages"][1] == reply and sent["tools"] == tools


def test_missing_usage_is_estimated(tmp_path: Path, loopback: LoopbackServer) -> None:
    loopback.push(Answer(200, {}, completion("x" * 40, prompt_tokens=None)))
    with client(tmp_path, loopback.url) as llm:
        result = llm.chat(HI)
    assert result.completion_tokens == 10 and result.prompt_tokens > 0


def test_api_key_is_never_written(tmp_path: Path, loopback: LoopbackServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    loopback.push(Answer(500))
    with client(tmp_path, loopback.url) as llm:
        llm.chat(HI)
        llm.chat(HI)
    assert loopback.requests[0]["headers"]["authorization"] == f"Bearer {KEY}"  # it is used ...
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".json" for p in files) and any(p.name == "calls.jsonl" for p in files)
    assert not [p for p in files if KEY.encode() in p.read_bytes()]  # ... but stored nowhere
    assert KEY not in caplog.text


def test_retry_after_formats() -> None:
    assert retry_after_s({"retry-after": "2"}) == 2.0
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    soon = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 28 <= retry_after_s({"retry-after": soon}) <= 30  # type: ignore[operator]
    assert retry_after_s({"retry-after": "whenever"}) is None and retry_after_s({}) is None


def test_make_client_wires_config(tmp_path: Path, loopback: LoopbackServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Stand-in for the embedded offline teacher: the client must ask it for its URL.
    fake = types.ModuleType("gymforge.offline.server")
    asked: list[str] = []
    fake.ensure_server = lambda endpoint: asked.append(endpoint) or loopback.url  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gymforge.offline.server", fake)
    cfg = GymforgeConfig(results_dir=str(tmp_path / "results"), cache_dir=str(tmp_path / "cache"), llm={"budget_usd": 3.0})
    with make_client(cfg, "topics") as llm:
        assert llm.base_url == loopback.url and llm.budget_usd == 3.0 and asked == ["chat"]
        llm.chat(HI)
    assert loopback.requests[0]["headers"]["authorization"] == "Bearer offline"
    assert len(list((tmp_path / "cache" / "llm").rglob("*.json*"))) == 1
    assert Ledger(tmp_path / "results" / "llm").totals()["topics"]["calls"] == 1


def _book(ledger_dir: Path, n: int) -> None:
    ledger = Ledger(ledger_dir)
    entry = {"stage": "mp", "ok": True, "cost_usd": 0.01, "prompt_tokens": 1, "completion_tokens": 1}
    for _ in range(n):
        admission = ledger.admit(stage="mp", prompt_chars=4, max_tokens=10, price=Price(output_per_mtok=1000),
                                 budget_usd=100.0, meta={})
        ledger.settle(admission.id, entry)


def test_ledger_is_shared_safely_by_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_book, args=(tmp_path, 25)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0] * 4
    ledger = Ledger(tmp_path)
    assert ledger.request_count() == 100 and ledger.spent() == pytest.approx(1.0)  # no lost updates


def ledger_with_a_dead_reservation(tmp_path: Path) -> Ledger:
    """A ledger whose one reservation (`stale`: bound $2, estimate $0.50) belongs to a process of this host that
    has exited."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    ledger = Ledger(tmp_path)
    stale = {"usd": 0.5, "bound_usd": 2.0, "stage": "x", "job": "tasks/t0001", "pid": int(dead.stdout),
             "host": socket.gethostname(), "call": "c1", "attempt": 1}
    ledger.spend_path.write_text(json.dumps({"spent_usd": 0.0, "reservations": {"stale": stale}}))
    return ledger


def test_request_of_a_dead_process_is_booked_at_its_bound(tmp_path: Path) -> None:
    ledger = ledger_with_a_dead_reservation(tmp_path)
    assert ledger.budget(5.0) == {"budget_usd": 5.0, "spent_usd": 2.0, "reserved_usd": 0.0, "in_flight": 0,
                                  "remaining_usd": 3.0}
    [killed] = ledger.entries()
    assert (killed["id"], killed["error"], killed["cost_usd"], killed["job"]) == ("stale", "killed_in_flight", 2.0,
                                                                                    "tasks/t0001")
    assert ledger.totals()["x"]["killed_in_flight"] == 1 and ledger.request_count() == 1
    assert len(Ledger(tmp_path).entries()) == 1  # booked once


def test_a_process_killed_inside_settle_is_booked_once_at_what_it_logged(tmp_path: Path) -> None:
    """Killed after logging its `done` line and before writing spend.json: the log's cost is booked, not the bound."""
    ledger = ledger_with_a_dead_reservation(tmp_path)
    ledger.calls_path.write_text(json.dumps({"event": "done", "id": "stale", "stage": "x", "ok": True,
                                             "cost_usd": 0.25, "cost_basis": "usage"}) + "\n")
    assert ledger.spent() == pytest.approx(0.25)
    assert [e["cost_usd"] for e in Ledger(tmp_path).entries()] == [0.25]  # no second `done` line
    assert ledger.spent() == pytest.approx(sum(e["cost_usd"] for e in ledger.entries() if e["event"] == "done"))


def test_loopback_lists_models(loopback: LoopbackServer) -> None:
    with openai.OpenAI(base_url=loopback.url, api_key="x", max_retries=0) as raw:
        assert [m.id for m in raw.models.list()] == ["loopback-model"]
