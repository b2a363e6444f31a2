"""The one door to chat models: response cache, retries, the write-ahead ledger and the run-wide budget.

Every stage talks to its teacher through an `LLMClient`, so a re-run with the same requests is free
(content-addressed cache), transient endpoint failures are retried here and only here (tenacity; the
openai client's own retries are off so that each attempt is admitted against the budget and logged), and
no attempt is sent whose worst case could push the run past `llm.budget_usd`.

Transient, retried up to `max_retries` times with full-jitter backoff that honours Retry-After: transport
errors and timeouts, HTTP 408/409/429/5xx, and 200 responses whose body is not a usable completion (not
JSON, no `choices`). Anything else (400, 401, 404, context length) fails at once; every error carries a
note naming the endpoint and model. Connecting gives up after `connect_timeout_s`, so an unreachable endpoint
costs at most (1 + `max_retries`) x that plus the backoff, not x `timeout_s`.

Requests are phrased as the endpoint's settings say (`gymforge.core.config.RequestOptions`): the reply's limit
goes in `max_tokens` or, for reasoning models, `max_completion_tokens`; fields the endpoint rejects are left out;
`reasoning_effort` and `extra_body` are added. A reasoning model's hidden tokens
(`usage.completion_tokens_details.reasoning_tokens`) are billed as output tokens, as OpenAI bills them, and are
recorded on their own as well (`reasoning_tokens` in the ledger, `Usage` and `ChatResult`).
"""
# long file: LLMClient's retries, budget waits, cache and ledger are one state machine around one call

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Self, TypedDict, Unpack
from urllib.parse import urlsplit, urlunsplit

from openai import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    AsyncOpenAI,
    OpenAI,
    OpenAIError,
    Timeout,
)
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, Field, ValidationError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    wait_random_exponential,
)

from gymforge.core import plugins
from gymforge.core.config import EndpointConfig, GymforgeConfig
from gymforge.core.tokens import Sampled, from_response
from gymforge.runtime import job
from gymforge.runtime.job import current_job as _job
from gymforge.llm.cache import ResponseCache
from gymforge.llm.ledger import Admission, BudgetExceeded, Ledger

__all__ = ["BudgetExceeded", "ChatResult", "LLMClient", "MalformedResponse", "ToolCall", "Usage", "is_transient",
           "make_client"]

log = logging.getLogger("gymforge.llm.client")


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: str  # raw JSON text as the model wrote it; it may not parse


class ChatResult(BaseModel):
    content: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int  # reasoning tokens included, as OpenAI counts (and bills) them
    cost_usd: float
    cached: bool = False
    model: str
    reasoning_tokens: int = 0  # the hidden part of completion_tokens (reasoning models)
    # With `token_ids` on the endpoint: the prompt's and reply's token ids and the sampled tokens' log-probs, when the
    # endpoint returned them (gymforge.core.tokens); None otherwise.
    tokens: Sampled | None = None

    def assistant_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:  # OpenAI rejects an empty tool_calls list
            msg["tool_calls"] = [
                {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                for t in self.tool_calls
            ]
        return msg


class Usage(BaseModel):
    calls: int = 0  # requests actually sent: every attempt, failed ones too; cache hits excluded
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    reasoning_tokens: int = 0  # within completion_tokens

    def add(self, result: ChatResult) -> None:
        if result.cached:
            self.cache_hits += 1
            return
        self.calls += 1
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens
        self.reasoning_tokens += result.reasoning_tokens
        self.cost_usd += result.cost_usd

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{f: getattr(self, f) + getattr(other, f) for f in Usage.model_fields})


def _estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def _brief(err: BaseException) -> str:
    """The first line of an error's message, short enough for a ledger entry or a log line."""
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__


def _describe(err: BaseException | None) -> str:
    if isinstance(err, APIStatusError):
        return f"HTTP {err.status_code} ({type(err).__name__})"
    return f"{type(err).__name__}: {_brief(err)}" if err is not None else "?"


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asked us to wait (`retry-after-ms`, or `Retry-After` as seconds or HTTP-date)."""
    if ms := headers.get("retry-after-ms"):
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


TRANSIENT_STATUS = frozenset({408, 409, 429})


class MalformedResponse(APIResponseValidationError):
    """HTTP 200 whose body is not a usable chat completion (not JSON, no `choices`): retried like a 5xx."""


def is_transient(err: BaseException) -> bool:
    """Worth another attempt: transport errors and timeouts, 408/409/429/5xx, malformed or empty 200 bodies."""
    if isinstance(err, (MalformedResponse, APIConnectionError)):  # APITimeoutError is an APIConnectionError
        return True
    return isinstance(err, APIStatusError) and (err.status_code in TRANSIENT_STATUS or err.status_code >= 500)


def _failure_code(err: BaseException) -> str | None:
    """A job's failure reason code for an endpoint error (`gymforge.runtime.job.classify`)."""
    if isinstance(err, OpenAIError):
        return "llm_unavailable" if is_transient(err) else "llm_rejected"
    return None


job.register_classifier(_failure_code)


def _never_reached(err: BaseException) -> bool:
    """A connection that was never made: nothing was sent, nothing can be billed."""
    return isinstance(err, APIConnectionError) and type(err.__cause__).__name__ in ("ConnectError", "ConnectTimeout")


def _public_url(url: str) -> str:
    """The endpoint as the ledger records it: without user info (credentials) or query string."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


BUDGET_WAIT_S = 600.0  # longest wait for requests in flight to release the budget an attempt needs


class _WaitForBudget(Exception):
    """Attempts in flight hold the budget this one needs; they settle soon (not counted as an attempt)."""


@dataclass
class _Call:
    """One logical request: its cache key and parameters, and the attempts made for it."""

    key: str
    params: dict[str, Any]  # without the reply's token limit, which each attempt adds (`_admit`)
    prompt_text: str
    max_tokens: int  # the configured limit of the reply
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    attempts: int = 0
    truncated_by_budget: bool = False
    budget_wait_since: float | None = None


@dataclass(frozen=True)
class _Attempt:
    admission: Admission
    number: int
    params: dict[str, Any]


class ChatOptions(TypedDict, total=False):
    """The keyword options of LLMClient.chat and .achat; None (or left out) takes the endpoint's setting."""

    tools: list[dict[str, Any]] | None
    seed: int | None
    temperature: float | None
    max_tokens: int | None


class LLMClient:
    def __init__(
        self,
        endpoint: EndpointConfig,
        *,
        stage: str,
        cache_dir: Path,
        ledger_dir: Path,
        budget_usd: float,
        base_url: str | None = None,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.endpoint = endpoint
        self.stage = stage
        self.cache_dir = Path(cache_dir)
        self._cache = ResponseCache(self.cache_dir, stage)
        self.ledger = Ledger(ledger_dir)
        self.budget_usd = budget_usd
        self.base_url = base_url or endpoint.base_url or os.environ.get("OPENAI_BASE_URL")
        if not self.base_url:
            raise ValueError(f"no base_url for provider {endpoint.provider!r}; build clients with make_client()")
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.usage = Usage()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(endpoint.concurrency)
        # Built on first network use so a fully cached re-run needs no API key.
        self._client: OpenAI | None = None
        self._aclient: AsyncOpenAI | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._asem: asyncio.Semaphore | None = None
        self._acloser: asyncio.Task[None] | None = None

    @property
    def where(self) -> str:
        """The endpoint and model, as error messages and the ledger name them (never the key)."""
        return f"endpoint {_public_url(self.base_url)} model {self.endpoint.model}"

    # -- public API ---------------------------------------------------------------------------
    # chat() and achat() share everything but the await: the retry policy (tenacity), admission against the
    # budget with the write-ahead `sent` line, and the booking of each attempt's outcome.

    def chat(self, messages: list[dict[str, Any]], **options: Unpack[ChatOptions]) -> ChatResult:
        call = self._request(messages, **options)
        if (hit := self._cache_get(call)) is not None:
            return hit
        create = self._sync_client().chat.completions.with_raw_response.create
        with self._slots:
            result = Retrying(**self._policy(call))(self._attempt, call, create)
        return self._done(call, result)

    async def achat(self, messages: list[dict[str, Any]], **options: Unpack[ChatOptions]) -> ChatResult:
        call = self._request(messages, **options)
        if (hit := self._cache_get(call)) is not None:
            return hit
        client, slots = self._async_parts()
        create = client.chat.completions.with_raw_response.create
        # Admission happens only once a slot is free, so queued calls do not hold budget they are not using.
        async with slots:
            result = await AsyncRetrying(**self._policy(call))(self._aattempt, call, create)
        return self._done(call, result)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        # An async client is closed by its closer task when its event loop ends (see _async_parts).
        self._aclient = self._aloop = self._asem = self._acloser = None

    async def aclose(self) -> None:
        if self._acloser is not None and self._aloop is asyncio.get_running_loop():
            self._acloser.cancel()
            await asyncio.wait([self._acloser])
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- one attempt ----------------------------------------------------------------------------

    def _attempt(self, call: _Call, create: Any) -> ChatResult:
        attempt = self._admit(call)
        try:
            raw = create(**attempt.params)
        except BaseException as err:
            self._failed(call, attempt, err)
            raise
        return self._received(call, attempt, raw)

    async def _aattempt(self, call: _Call, create: Any) -> ChatResult:
        attempt = self._admit(call)
        try:
            raw = await create(**attempt.params)
        except BaseException as err:
            self._failed(call, attempt, err)
            raise
        return self._received(call, attempt, raw)

    def _policy(self, call: _Call) -> dict[str, Any]:
        """Tenacity settings for one call: retry what is transient, up to `max_retries` times, with full-jitter
        exponential backoff that never undercuts the server's Retry-After; budget waits are not attempts."""
        backoff = wait_random_exponential(multiplier=self.backoff_base_s, max=self.backoff_max_s)

        def wait(state: RetryCallState) -> float:
            err = state.outcome.exception() if state.outcome else None
            if isinstance(err, _WaitForBudget):
                return 0.2
            asked = retry_after_s(err.response.headers) if isinstance(err, APIStatusError) else None
            # The backoff grows with the attempts sent, not with the budget waits in between.
            return max(backoff(SimpleNamespace(attempt_number=call.attempts)), asked or 0.0)

        def stop(state: RetryCallState) -> bool:
            err = state.outcome.exception() if state.outcome else None
            return not isinstance(err, _WaitForBudget) and call.attempts > self.endpoint.max_retries

        def before_sleep(state: RetryCallState) -> None:
            err = state.outcome.exception() if state.outcome else None
            if not isinstance(err, _WaitForBudget):
                log.warning("%s: %s from %s; retry %d/%d in %.2fs", self.stage, _describe(err), self.where,
                            call.attempts, self.endpoint.max_retries, state.upcoming_sleep)

        return {"retry": retry_if_exception(lambda e: isinstance(e, _WaitForBudget) or is_transient(e)),
                    "wait": wait, "stop": stop, "before_sleep": before_sleep, "reraise": True}

    def _admit(self, call: _Call) -> _Attempt:
        configured = call.max_tokens
        admission = self.ledger.admit(
            stage=self.stage, prompt_chars=len(call.prompt_text), max_tokens=configured,
            price=self.endpoint.price, budget_usd=self.budget_usd,
            meta={"call": call.id, "attempt": call.attempts + 1, "job": _job(), "model": self.endpoint.model,
                  "endpoint": _public_url(self.base_url)},
        )
        if admission is None:
            call.budget_wait_since = call.budget_wait_since or time.monotonic()
            if time.monotonic() - call.budget_wait_since > BUDGET_WAIT_S:
                raise BudgetExceeded(f"LLM budget: requests in flight have held the rest of llm.budget_usd for "
                                     f"{BUDGET_WAIT_S:.0f} s (stage {self.stage}); raise llm.budget_usd to continue")
            raise _WaitForBudget()
        call.budget_wait_since = None
        call.attempts += 1
        if admission.max_tokens < configured:
            log.info("%s: max_tokens lowered to %d so that the requests in flight cannot exceed the budget",
                     self.stage, admission.max_tokens)
        # The limit travels in the field the endpoint expects (reasoning models: max_completion_tokens).
        return _Attempt(admission, call.attempts, {**call.params, self.endpoint.token_param: admission.max_tokens})

    def _book(self, call: _Call, attempt: _Attempt, *, ok: bool, prompt_tokens: int = 0, completion_tokens: int = 0,
              reasoning_tokens: int = 0, basis: str, err: BaseException | None = None,
              http_status: int | None = None) -> float:
        # basis: usage (reported), estimate (usage missing), upper_bound (unknown), none (nothing generated)
        cost = {"upper_bound": attempt.admission.bound_usd, "none": 0.0}.get(
            basis, self.endpoint.price.cost(prompt_tokens, completion_tokens))
        self.ledger.settle(attempt.admission.id, {
            "call": call.id, "attempt": attempt.number, "stage": self.stage, "job": _job(),
            "model": self.endpoint.model, "endpoint": _public_url(self.base_url), "ok": ok,
            "error": None if err is None else type(err).__name__, "detail": None if err is None else _brief(err),
            "http_status": http_status, "transient": None if err is None else is_transient(err),
            "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "reasoning_tokens": reasoning_tokens, "cost_usd": cost, "cost_basis": basis,
        }, prompt_chars=len(call.prompt_text))
        with self._lock:
            self.usage.calls += 1
            self.usage.prompt_tokens += prompt_tokens
            self.usage.completion_tokens += completion_tokens
            self.usage.reasoning_tokens += reasoning_tokens
            self.usage.cost_usd += cost
        return cost

    def _failed(self, call: _Call, attempt: _Attempt, err: BaseException) -> None:
        if isinstance(err, APIStatusError) or _never_reached(err):
            basis = "none"  # refused, or never reached: nothing was generated
        else:
            basis = "upper_bound"  # timeout, cut connection, cancelled: the reply may have been generated and billed
        self._book(call, attempt, ok=False, basis=basis, err=err,
                   http_status=err.status_code if isinstance(err, APIStatusError) else None)
        if isinstance(err, OpenAIError):
            verdict = "retried" if is_transient(err) else "not retried"
            err.add_note(f"{self.where}: attempt {attempt.number} of at most {self.endpoint.max_retries + 1} "
                         f"({verdict})")

    def _received(self, call: _Call, attempt: _Attempt, raw: Any) -> ChatResult:
        """Parse a 200 response; a body that is not a usable completion is booked and raised as MalformedResponse."""
        http = raw.http_response
        usage = None
        try:
            completion = ChatCompletion.model_validate(json.loads(http.text))
            usage = completion.usage
            if not completion.choices or completion.choices[0].message is None:
                raise ValueError("the response has no choices")
        except (ValueError, ValidationError) as exc:
            err = MalformedResponse(http, http.text[:500], message=f"unusable HTTP {http.status_code} body: {_brief(exc)}")
            if usage is not None:
                completion_tokens, reasoning_tokens = _output_tokens(usage)
                self._book(call, attempt, ok=False, prompt_tokens=usage.prompt_tokens,
                           completion_tokens=completion_tokens, reasoning_tokens=reasoning_tokens, basis="usage",
                           err=err, http_status=http.status_code)
            else:
                self._book(call, attempt, ok=False, basis="upper_bound", err=err, http_status=http.status_code)
            err.add_note(f"{self.where}: attempt {attempt.number} of at most {self.endpoint.max_retries + 1}")
            raise err from None
        choice = completion.choices[0]
        msg = choice.message
        tool_calls = [
            ToolCall(id=tc.id, name=tc.function.name, arguments=tc.function.arguments or "")
            for tc in msg.tool_calls or []
            if getattr(tc, "function", None) is not None
        ]
        reasoning_tokens = 0
        if usage is not None:
            prompt_tokens, basis = usage.prompt_tokens, "usage"
            completion_tokens, reasoning_tokens = _output_tokens(usage)
        else:
            out_text = (msg.content or "") + "".join(t.name + t.arguments for t in tool_calls)
            prompt_tokens, completion_tokens = _estimate_tokens(call.prompt_text), _estimate_tokens(out_text)
            basis = "estimate"
        cost = self._book(call, attempt, ok=True, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                          reasoning_tokens=reasoning_tokens, basis=basis, http_status=http.status_code)
        # A reply cut short by a budget-lowered max_tokens is not what the configured request would give.
        call.truncated_by_budget = (choice.finish_reason == "length"
                                    and attempt.admission.max_tokens < call.max_tokens)
        return ChatResult(
            content=msg.content,
            tool_calls=tool_calls,
            finish_reason=choice.finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            reasoning_tokens=reasoning_tokens,
            cost_usd=cost,
            model=completion.model or self.endpoint.model,
            tokens=from_response(json.loads(http.text)) if self.endpoint.token_ids else None,
        )

    def _done(self, call: _Call, result: ChatResult) -> ChatResult:
        if not call.truncated_by_budget:
            self._cache_put(call, result)
        return result

    # -- internals ----------------------------------------------------------------------------

    def _request(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        seed: int | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> _Call:
        ep = self.endpoint
        # What the endpoint rejects is never sent, whatever the caller asked for; its own default then applies.
        temperature = None if "temperature" in ep.omit_params else ep.temperature if temperature is None else temperature
        seed = None if "seed" in ep.omit_params else seed
        max_tokens = ep.max_tokens if max_tokens is None else max_tokens
        # base_url is left out on purpose: the offline teacher listens on a new port every run; so is the name of the
        # token field (the same request either way). The request options join the key only where set, so a chat
        # endpoint's cached replies keep their keys.
        key_fields = {
            "provider": ep.provider, "model": ep.model, "messages": messages, "tools": tools,
            "temperature": temperature, "max_tokens": max_tokens, "seed": seed, **ep.request_identity(),
        }
        key = hashlib.sha256(_canonical(key_fields).encode()).hexdigest()
        params: dict[str, Any] = {"model": ep.model, "messages": messages}
        if temperature is not None:
            params["temperature"] = temperature
        if tools is not None:
            params["tools"] = tools
        if seed is not None:
            params["seed"] = seed
        if ep.reasoning_effort is not None:
            params["reasoning_effort"] = ep.reasoning_effort
        if ep.extra_body:
            params["extra_body"] = dict(ep.extra_body)
        if ep.token_ids:  # OpenAI's per-token log-probs plus vLLM's token ids (gymforge.core.tokens)
            key_fields["token_ids"] = True
            key = hashlib.sha256(_canonical(key_fields).encode()).hexdigest()
            params["logprobs"] = True
            params["extra_body"] = {**params.get("extra_body", {}), "return_token_ids": True}
        return _Call(key, params, _canonical([messages, tools]), max_tokens)

    def _cache_get(self, call: _Call) -> ChatResult | None:
        if (stored := self._cache.get(call.key)) is None:
            return None
        result = ChatResult(**stored, cost_usd=0.0, cached=True)
        self.ledger.log({
            "stage": self.stage, "job": _job(), "model": result.model, "cached": True, "ok": True, "attempt": 0,
            "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0,
        })
        with self._lock:
            self.usage.add(result)
        return result

    def _cache_put(self, call: _Call, result: ChatResult) -> None:
        self._cache.put(call.key, result.model_dump(exclude={"cost_usd", "cached"}))  # the job's pack (llm.cache)

    def _timeout(self) -> Timeout:
        # A short connect timeout: an unreachable endpoint fails fast; a reply may still take timeout_s.
        return Timeout(self.endpoint.timeout_s, connect=min(self.endpoint.connect_timeout_s,
                                                                  self.endpoint.timeout_s))

    def _sync_client(self) -> OpenAI:
        with self._lock:
            if self._client is None:
                self._client = OpenAI(
                    base_url=self.base_url, api_key=self.endpoint.api_key(),
                    max_retries=0, timeout=self._timeout(),
                )
            return self._client

    def _async_parts(self) -> tuple[AsyncOpenAI, asyncio.Semaphore]:
        # The async client's connection pool and the semaphore are tied to one event loop;
        # stages may call asyncio.run() repeatedly, so each loop gets its own.
        loop = asyncio.get_running_loop()
        if self._aloop is not loop or self._aclient is None or self._asem is None:
            self._aclient = AsyncOpenAI(
                base_url=self.base_url, api_key=self.endpoint.api_key(),
                max_retries=0, timeout=self._timeout(),
            )
            self._asem = asyncio.Semaphore(self.endpoint.concurrency)
            self._aloop = loop
            # asyncio.run() cancels leftover tasks before closing its loop; this one then closes the
            # connections inside the loop that owns them, even when the caller never awaits aclose().
            self._acloser = loop.create_task(_close_when_cancelled(self._aclient))
        return self._aclient, self._asem


def _output_tokens(usage: Any) -> tuple[int, int]:
    """(completion tokens to bill, reasoning tokens among them) of a response's `usage`. OpenAI counts reasoning
    tokens within `completion_tokens` and bills them as output; an endpoint that reports more reasoning tokens than
    completion tokens evidently counts them apart, and both are billed."""
    details = getattr(usage, "completion_tokens_details", None)
    reasoning = int(getattr(details, "reasoning_tokens", None) or 0)
    completion = int(usage.completion_tokens or 0)
    return (completion if reasoning <= completion else completion + reasoning), reasoning


async def _close_when_cancelled(client: AsyncOpenAI) -> None:
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        await client.close()


def make_client(cfg: GymforgeConfig, stage: str, model: str | None = None) -> LLMClient:
    """The one teacher-client factory: `llm.teacher` (with `model` instead of its model, when given)."""
    endpoint = cfg.llm.teacher
    if model:
        endpoint = endpoint.model_copy(update={"model": model})
    base_url = None  # openai: LLMClient falls back to endpoint.base_url, then OPENAI_BASE_URL
    if endpoint.provider == "offline":
        # starts the simulator's server, as the kind of endpoint it imitates; only when needed
        base_url = plugins.load("offline-teacher")(endpoint.offline_endpoint)
    return LLMClient(
        endpoint,
        stage=stage,
        cache_dir=cfg.cache / "llm",
        ledger_dir=cfg.results / "llm",
        budget_usd=cfg.llm.budget_usd,
        base_url=base_url,
    )
