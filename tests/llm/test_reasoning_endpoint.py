"""Reasoning-model endpoints: the client's request options, reasoning tokens in the ledger, the offline teacher's
`reasoning` endpoint (OpenAI's rules and error shape, over real HTTP) and the teacher's connect timeout."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from loopback import Answer, LoopbackServer, closed_port_url, completion
from workflow_copy import copy_workflow
from workflow_runs import snakemake

from gymforge.core.config import ConfigError, EndpointConfig, GymforgeConfig, Price, load_config, validate_config
from gymforge.runtime.job import classify
from gymforge.core.prompts import render
from gymforge.llm.client import LLMClient, make_client
from gymforge.llm.ledger import Ledger
from gymforge.report.funnel import collect
from gymforge.report.summary import summary_html
from gymforge.offline.server import REASONING_PER_TOKEN, count_tokens, ensure_server

KEY_ENV = "GYMFORGE_REASONING_TEST_KEY"
HI = [{"role": "user", "content": "hi"}]
# The settings an OpenAI reasoning model (GPT-5 class) needs.
REASONING = {"token_param": "max_completion_tokens", "omit_params": ["temperature"]}


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-reasoning-test")


def client(tmp_path: Path, url: str, **endpoint: Any) -> LLMClient:
    fields = {"provider": "openai", "base_url": url, "model": "reasoning-model", "api_key_env": KEY_ENV,
              "max_retries": 2, **endpoint}
    return LLMClient(EndpointConfig(**fields), stage="test", cache_dir=tmp_path / "cache",
                     ledger_dir=tmp_path / "ledger", budget_usd=10.0, backoff_base_s=0.01, backoff_max_s=0.05)


def topics_request(n: int = 3) -> list[dict[str, Any]]:
    """The pipeline's topic request, which the offline teacher answers."""
    return [{"role": "system", "content": render("system_teacher")},
            {"role": "user", "content": render("topics", n=n, seen=[])}]


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{url}/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def done_entries(tmp_path: Path) -> list[dict[str, Any]]:
    return [e for e in Ledger(tmp_path / "ledger").entries() if e["event"] == "done"]


# -- the offline teacher's reasoning endpoint, over raw HTTP ------------------------------------------------------


def test_reasoning_endpoint_refuses_max_tokens_with_openais_error() -> None:
    status, body = post(ensure_server("reasoning"), {"model": "m", "messages": topics_request(), "max_tokens": 500})
    assert status == 400
    assert body == {"error": {
        "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' "
                   "instead.",
        "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}}


@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_reasoning_endpoint_accepts_only_the_default_sampling(field: str) -> None:
    url = ensure_server("reasoning")
    status, body = post(url, {"model": "m", "messages": topics_request(), field: 0.7})
    assert status == 400
    assert body["error"] == {
        "message": f"Unsupported value: '{field}' does not support 0.7 with this model. Only the default (1) value is "
                   "supported.",
        "type": "invalid_request_error", "param": field, "code": "unsupported_value"}
    status, body = post(url, {"model": "m", "messages": topics_request(), field: 1})
    assert status == 200 and body["choices"][0]["message"]["content"]


def test_reasoning_endpoint_refuses_an_unknown_effort() -> None:
    status, body = post(ensure_server("reasoning"), {"model": "m", "messages": topics_request(),
                                                     "reasoning_effort": "extreme"})
    assert status == 400 and body["error"]["param"] == "reasoning_effort"
    assert body["error"]["code"] == "unsupported_value" and "'extreme'" in body["error"]["message"]


def test_the_chat_endpoint_still_takes_max_tokens_and_temperature() -> None:
    status, body = post(ensure_server(), {"model": "m", "messages": topics_request(), "max_tokens": 500,
                                          "temperature": 0.7})
    assert status == 200 and "completion_tokens_details" not in body["usage"]


def test_reasoning_tokens_follow_the_effort_and_count_within_the_limit() -> None:
    url = ensure_server("reasoning")
    visible = None
    for effort, per_token in REASONING_PER_TOKEN.items():
        status, body = post(url, {"model": "m", "messages": topics_request(), "seed": 3, "reasoning_effort": effort})
        assert status == 200
        usage, content = body["usage"], body["choices"][0]["message"]["content"]
        visible = count_tokens(content)
        assert usage["completion_tokens_details"]["reasoning_tokens"] == per_token * visible
        assert usage["completion_tokens"] == (1 + per_token) * visible
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert visible and visible > 10
    # A limit the reasoning uses up leaves nothing to say, as a reasoning model's empty reply with `length`.
    status, body = post(url, {"model": "m", "messages": topics_request(), "seed": 3, "reasoning_effort": "high",
                              "max_completion_tokens": visible})
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"]["content"] == ""
    assert body["usage"]["completion_tokens"] == body["usage"]["completion_tokens_details"]["reasoning_tokens"] == visible


# -- the client against it ------------------------------------------------------------------------------------------


def test_todays_settings_fail_against_a_reasoning_endpoint_as_llm_rejected(tmp_path: Path) -> None:
    with client(tmp_path, ensure_server("reasoning")) as llm, pytest.raises(openai.BadRequestError) as info:
        llm.chat(topics_request(), seed=1)
    code, reason = classify(info.value)
    assert code == "llm_rejected"
    assert "Unsupported parameter: 'max_tokens'" in reason and "not retried" in reason
    [entry] = done_entries(tmp_path)  # one attempt: a 400 is not retried, and costs nothing
    assert entry["http_status"] == 400 and entry["cost_usd"] == 0.0


def test_reasoning_settings_succeed_and_reasoning_tokens_are_billed(tmp_path: Path) -> None:
    price = Price(input_per_mtok=1.25, output_per_mtok=10.0)
    with client(tmp_path, ensure_server("reasoning"), price=price, reasoning_effort="high", **REASONING) as llm:
        result = llm.chat(topics_request(), seed=1)
        again = llm.chat(topics_request(), seed=1)
    visible = count_tokens(result.content or "")
    assert result.finish_reason == "stop" and json.loads(result.content or "")
    assert result.reasoning_tokens == REASONING_PER_TOKEN["high"] * visible
    assert result.completion_tokens == visible + result.reasoning_tokens
    assert result.cost_usd == pytest.approx(price.cost(result.prompt_tokens, result.completion_tokens))
    assert again.cached and again.content == result.content
    assert llm.usage.reasoning_tokens == result.reasoning_tokens and llm.usage.cache_hits == 1
    [entry] = done_entries(tmp_path)
    assert entry["ok"] and entry["reasoning_tokens"] == result.reasoning_tokens
    assert entry["completion_tokens"] == result.completion_tokens and entry["cost_usd"] == result.cost_usd
    ledger = Ledger(tmp_path / "ledger")
    assert ledger.spent() == pytest.approx(result.cost_usd)
    assert ledger.totals()["test"]["reasoning_tokens"] == result.reasoning_tokens


def test_make_client_reaches_the_offline_teacher_as_the_configured_endpoint(tmp_path: Path) -> None:
    base = {"results_dir": str(tmp_path / "results"), "cache_dir": str(tmp_path / "cache")}
    strict = {"offline_endpoint": "reasoning", "max_tokens": 16000}
    with make_client(GymforgeConfig(**base, llm={"teacher": strict}), "topics") as llm, \
            pytest.raises(openai.BadRequestError, match="max_completion_tokens"):
        llm.chat(topics_request(), seed=2)
    with make_client(GymforgeConfig(**base, llm={"teacher": {**strict, **REASONING}}), "topics") as llm:
        assert llm.chat(topics_request(), seed=2).reasoning_tokens > 0


# -- what the client sends ----------------------------------------------------------------------------------------


def test_default_requests_are_unchanged(tmp_path: Path, loopback: LoopbackServer) -> None:
    with client(tmp_path, loopback.url, max_tokens=300, temperature=0.2) as llm:
        llm.chat(HI, seed=5)
    body = loopback.requests[0]["body"]
    assert {k: body[k] for k in ("max_tokens", "temperature", "seed")} == {"max_tokens": 300, "temperature": 0.2,
                                                                          "seed": 5}
    assert not {"max_completion_tokens", "reasoning_effort"} & body.keys()


def test_reasoning_requests_carry_the_endpoints_options(tmp_path: Path, loopback: LoopbackServer) -> None:
    options = {**REASONING, "omit_params": ["temperature", "seed"], "reasoning_effort": "low",
               "extra_body": {"verbosity": "low", "service_tier": "flex"}}
    with client(tmp_path, loopback.url, max_tokens=20000, **options) as llm:
        llm.chat(HI, seed=5, temperature=0.3)  # what the endpoint rejects is left out even when a caller asks
    body = loopback.requests[0]["body"]
    assert body["max_completion_tokens"] == 20000 and body["reasoning_effort"] == "low"
    assert body["verbosity"] == "low" and body["service_tier"] == "flex"
    assert not {"max_tokens", "temperature", "seed"} & body.keys()


def test_the_effort_is_part_of_the_cache_key(tmp_path: Path, loopback: LoopbackServer) -> None:
    for effort in ("low", "high", "low"):
        with client(tmp_path, loopback.url, reasoning_effort=effort, **REASONING) as llm:
            llm.chat(HI)
    assert loopback.count == 2


def test_reasoning_tokens_reported_apart_are_billed_too(tmp_path: Path) -> None:
    """An endpoint that counts reasoning tokens outside completion_tokens: both are output, both are billed."""
    inside = completion("ok", prompt_tokens=100, completion_tokens=300)
    inside["usage"]["completion_tokens_details"] = {"reasoning_tokens": 250}
    apart = completion("ok", prompt_tokens=100, completion_tokens=50)
    apart["usage"]["completion_tokens_details"] = {"reasoning_tokens": 250}
    price = Price(input_per_mtok=2.0, output_per_mtok=10.0)
    with LoopbackServer([Answer(200, {}, inside), Answer(200, {}, apart)]) as srv, \
            client(tmp_path, srv.url, price=price, **REASONING) as llm:
        first, second = llm.chat(HI, seed=1), llm.chat(HI, seed=2)
    for result in (first, second):
        assert (result.completion_tokens, result.reasoning_tokens) == (300, 250)
        assert result.cost_usd == pytest.approx((100 * 2.0 + 300 * 10.0) / 1e6)


def test_budget_lowered_limits_travel_in_the_configured_field(tmp_path: Path, loopback: LoopbackServer) -> None:
    # $0.01 at $10/M output tokens: the worst case of 20,000 tokens does not fit, about 900 do.
    llm = LLMClient(EndpointConfig(provider="openai", base_url=loopback.url, model="m", api_key_env=KEY_ENV,
                                   max_tokens=20000, price=Price(output_per_mtok=10.0), **REASONING),
                    stage="test", cache_dir=tmp_path / "cache", ledger_dir=tmp_path / "ledger", budget_usd=0.01)
    with llm:
        llm.chat(HI)
    body = loopback.requests[0]["body"]
    assert "max_tokens" not in body and 0 < body["max_completion_tokens"] < 20000


# -- config ---------------------------------------------------------------------------------------------------------


def test_config_refuses_extra_fields_that_replace_the_clients_own() -> None:
    with pytest.raises(ConfigError, match="extra_body may not set max_tokens"):
        validate_config({"llm": {"teacher": {"extra_body": {"max_tokens": 5}}}})


def test_the_reasoning_offline_endpoint_needs_the_offline_provider() -> None:
    with pytest.raises(ConfigError, match="offline_endpoint applies to the offline teacher only"):
        validate_config({"llm": {"teacher": {"provider": "openai", "base_url": "http://x/v1",
                                             "offline_endpoint": "reasoning"}}})


def test_request_options_rerun_the_teachers_rules_only_when_set() -> None:
    plain = GymforgeConfig()
    assert plain.digest("teacher") == GymforgeConfig(llm={"teacher": {"token_param": "max_completion_tokens"}}).digest(
        "teacher")  # the field's name changes no answer
    assert plain.digest("teacher") != GymforgeConfig(llm={"teacher": {"reasoning_effort": "high"}}).digest("teacher")
    assert plain.digest("teacher") != GymforgeConfig(llm={"teacher": {"omit_params": ["temperature"]}}).digest("teacher")


# -- connecting ------------------------------------------------------------------------------------------------------


@pytest.fixture
def unanswered_url() -> Any:
    """A loopback port that never completes a connection: a listener with a full backlog that accepts nothing (the
    kernel drops further SYNs, so a connect waits as it would for a dead host)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(8):  # fill the accept queue (its length is the backlog plus one on Linux)
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(listener.getsockname())
        fillers.append(s)
    time.sleep(0.2)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    for s in fillers:
        s.close()
    listener.close()


def test_an_unreachable_endpoint_fails_after_the_connect_timeout(tmp_path: Path, unanswered_url: str) -> None:
    t0 = time.monotonic()
    with client(tmp_path, unanswered_url, timeout_s=60.0, connect_timeout_s=0.5, max_retries=1,
                price=Price(output_per_mtok=10.0)) as llm, pytest.raises(openai.APITimeoutError) as info:
        llm.chat(HI)
    elapsed = time.monotonic() - t0
    assert 1.0 <= elapsed < 10.0  # two attempts of 0.5 s each (plus backoff), not of 60 s
    assert classify(info.value)[0] == "llm_unavailable"
    entries = done_entries(tmp_path)
    assert [e["error"] for e in entries] == ["APITimeoutError"] * 2
    assert all(e["cost_usd"] == 0.0 for e in entries)  # never connected: nothing sent, nothing billed


def test_a_closed_port_fails_fast(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with client(tmp_path, closed_port_url(), timeout_s=60.0, max_retries=1, price=Price(output_per_mtok=10.0)) as llm, \
            pytest.raises(openai.APIConnectionError) as info:
        llm.chat(HI)
    assert time.monotonic() - t0 < 5.0 and classify(info.value)[0] == "llm_unavailable"
    assert all(e["cost_usd"] == 0.0 for e in done_entries(tmp_path))  # never reached: nothing billed



# -- the workflow against the reasoning endpoint ---------------------------------------------------------------------

# The teacher settings of a reasoning model, against the offline teacher's reasoning endpoint; with a limit that
# leaves room for the reasoning (it counts within max_completion_tokens).
STRICT_TEACHER = {"provider": "offline", "offline_endpoint": "reasoning", "max_tokens": 32000,
                  "reasoning_effort": "low", **REASONING}


def strict_workflow(dest: Path, teacher: dict[str, Any]) -> None:
    copy_workflow(dest, "rules", "report", "profiles")
    (dest / "run.yaml").write_text(yaml.safe_dump({"topics": {"n": 2}, "llm": {"teacher": teacher}}))


def run_status(workdir: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "gymforge", "status", "--json"], cwd=workdir, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.slow
def test_snakemake_tasks_runs_against_the_reasoning_endpoint(tmp_path: Path) -> None:
    """`snakemake tasks` end to end with a reasoning model's settings: every call succeeds, and the reasoning tokens
    reach the ledger, the cost and `gymforge status`; with today's chat settings the first call is refused."""
    strict_workflow(tmp_path, STRICT_TEACHER)
    proc = snakemake(tmp_path, "tasks")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((tmp_path / "results" / "tasks").glob("t*/*.json"))) >= 2
    entries = [e for e in Ledger(tmp_path / "results" / "llm").entries() if e["event"] == "done"]
    assert len(entries) >= 4 and all(e["ok"] for e in entries)
    assert all(0 < e["reasoning_tokens"] < e["completion_tokens"] for e in entries)
    price = load_config(tmp_path / "config.yaml").llm.teacher.price  # the workflow's illustrative prices
    assert price.output_per_mtok > 0
    assert sum(e["cost_usd"] for e in entries) == pytest.approx(
        sum(price.cost(e["prompt_tokens"], e["completion_tokens"]) for e in entries))
    report = run_status(tmp_path)
    shown = sum(s["usage"]["reasoning_tokens"] for s in report["stages"].values())
    assert shown == sum(e["reasoning_tokens"] for e in entries)
    table = subprocess.run([sys.executable, "-m", "gymforge", "status"], cwd=tmp_path, capture_output=True, text=True,
                           check=True).stdout
    assert "reasoning tokens:" in table
    page = summary_html(collect(tmp_path / "results"), tmp_path / "summary.html").read_text()
    assert "<th>of them reasoning</th>" in page

    chat = tmp_path / "chat-settings"
    strict_workflow(chat, {"provider": "offline", "offline_endpoint": "reasoning"})
    proc = snakemake(chat, "topics")
    assert proc.returncode != 0
    [failed] = (chat / "results" / "logs").rglob("*.failed.json")
    record = json.loads(failed.read_text())
    assert record["reason_code"] == "llm_rejected" and "Unsupported parameter: 'max_tokens'" in record["reason"]


def test_an_endpoint_model_is_asked_as_its_spec_says(tmp_path: Path, loopback: LoopbackServer) -> None:
    """A reasoning model scored on the benchmark (`evaluate.models`, source `endpoint`) gets its own request options;
    its runs' identity changes with them, and stays as it was for a spec that sets none."""
    from gymforge.llm.serving import Endpoint
    from gymforge.stages.evaluation import _client

    plain = {"name": "gpt5", "source": "endpoint", "base_url": loopback.url, "model": "gpt-5", "api_key_env": KEY_ENV}
    spec = {**plain, **REASONING, "reasoning_effort": "minimal"}
    cfg = GymforgeConfig(results_dir=str(tmp_path / "results"), cache_dir=str(tmp_path / "cache"),
                         evaluate={"models": [spec, {**plain, "name": "plain"}]})
    reasoning_spec, plain_spec = cfg.evaluate.models
    endpoint = Endpoint(base_url=loopback.url, model="gpt-5", provider="openai", api_key_env=KEY_ENV)
    with _client(cfg, reasoning_spec, endpoint) as llm:
        llm.chat(HI)
    body = loopback.requests[0]["body"]
    assert body["max_completion_tokens"] == cfg.llm.teacher.max_tokens and body["reasoning_effort"] == "minimal"
    assert "temperature" not in body and "max_tokens" not in body
    assert '"reasoning_effort": "minimal"' in reasoning_spec.identity_json()
    assert plain_spec.identity_json() == plain_spec.model_dump_json(exclude={"token_param", "omit_params",
                                                                             "reasoning_effort", "extra_body"})
