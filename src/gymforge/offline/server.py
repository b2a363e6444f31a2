"""The offline teacher's OpenAI-compatible HTTP endpoint (standard library only).

`GET /v1/models` and `POST /v1/chat/completions` (plain JSON, or SSE with `stream: true`) are
enough for the `openai` client, so the pipeline reaches this teacher exactly as a hosted model.

Two kinds of endpoint (`llm.teacher.offline_endpoint`): `chat` accepts what a chat model accepts; `reasoning`
follows the rules of OpenAI's reasoning models. It answers HTTP 400 in OpenAI's error shape to `max_tokens` (the
limit must come as `max_completion_tokens`), to a temperature or top_p other than 1, and to a reasoning effort it
does not know. It "reasons" before it answers: `usage.completion_tokens_details.reasoning_tokens` is a fixed multiple
of the visible reply per effort (`REASONING_PER_TOKEN`), counted within `completion_tokens` and within the reply's
limit, so a limit the reasoning uses up leaves an empty reply with finish reason `length`, as such a model does.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gymforge.llm.http import BadRequest, ChatCompletionsHandler, LoopbackHTTPServer
from gymforge.offline.dispatch import (
    Reply,
    UnknownRequest,
    respond,
    stable_seed,
    text_of,
)

MODEL_ID = "gymforge-offline-teacher"
log = logging.getLogger(__name__)

ENDPOINTS = ("chat", "reasoning")
# Reasoning tokens per visible reply token, by reasoning effort (the reasoning endpoint; `medium` when none is sent).
REASONING_PER_TOKEN = {"minimal": 0, "low": 1, "medium": 2, "high": 4}
DEFAULT_EFFORT = "medium"

_lock = threading.Lock()
_urls: dict[str, str] = {}


def count_tokens(text: str) -> int:
    """A rough token count (words and punctuation marks), enough for usage accounting."""
    return len(re.findall(r"\w+|[^\w\s]", text))


def _usage(body: dict[str, Any], reply: Reply) -> dict[str, int]:
    sent = sum(count_tokens(text_of(m)) for m in body.get("messages") or [])
    received = count_tokens(reply.content or "") + sum(count_tokens(c.arguments) + 1 for c in reply.tool_calls)
    return {"prompt_tokens": sent, "completion_tokens": received, "total_tokens": sent + received}


def _message(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    return message


def _truncate(reply: Reply, max_tokens: int | None) -> tuple[Reply, bool]:
    """The reply cut to `max_tokens` completion tokens, as a hosted model stops at its limit; True if it was cut."""
    if not max_tokens or _usage({}, reply)["completion_tokens"] <= max_tokens:
        return reply, False
    content = reply.content or ""
    spans = list(re.finditer(r"\w+|[^\w\s]", content))
    if len(spans) > max_tokens:
        return Reply(content[: spans[max_tokens - 1].end()]), True
    left = max_tokens - len(spans)  # the tool calls' arguments are cut instead
    calls = []
    for call in reply.tool_calls:
        args = list(re.finditer(r"\w+|[^\w\s]", call.arguments))
        keep = max(0, min(len(args), left - 1))
        calls.append(replace(call, arguments=call.arguments[: args[keep - 1].end()] if keep else ""))
        left -= keep + 1
    return Reply(reply.content, tuple(calls)), True


def check_reasoning_request(body: dict[str, Any]) -> None:
    """Refuse what an OpenAI reasoning model refuses, with its error's shape (BadRequest: HTTP 400)."""
    if "max_tokens" in body:
        raise BadRequest(400, "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                         "'max_completion_tokens' instead.", param="max_tokens", code="unsupported_parameter")
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None and value != 1:
            raise BadRequest(400, f"Unsupported value: '{name}' does not support {value} with this model. Only the "
                             "default (1) value is supported.", param=name, code="unsupported_value")
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in REASONING_PER_TOKEN:
        known = ", ".join(f"'{e}'" for e in REASONING_PER_TOKEN)
        raise BadRequest(400, f"Unsupported value: 'reasoning_effort' does not support {effort!r} with this model. "
                         f"Supported values are: {known}.", param="reasoning_effort", code="unsupported_value")


def reasoning_completion(body: dict[str, Any]) -> dict[str, Any]:
    """The reasoning endpoint's chat.completion: the request checked (`check_reasoning_request`), then the reply
    preceded by its reasoning tokens, both within `max_completion_tokens`."""
    check_reasoning_request(body)
    reply = respond(body)
    visible = _usage({}, reply)["completion_tokens"]
    reasoning = REASONING_PER_TOKEN[body.get("reasoning_effort") or DEFAULT_EFFORT] * visible
    limit = body.get("max_completion_tokens")
    cut = False
    if limit:
        reasoning = min(reasoning, limit)
        if limit - reasoning <= 0:
            reply, cut = Reply(""), True  # the reasoning used up the limit: nothing left to say
        else:
            reply, cut = _truncate(reply, limit - reasoning)
    result = _completion_object(body, reply, cut)
    usage = result["usage"]
    usage["completion_tokens"] += reasoning
    usage["total_tokens"] += reasoning
    usage["completion_tokens_details"] = {"reasoning_tokens": reasoning, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
    return result


def completion(body: dict[str, Any]) -> dict[str, Any]:
    """The chat.completion object for a request body (raises what `respond` raises). Like a hosted model, the reply
    stops at `max_tokens` (or `max_completion_tokens`) with finish reason `length`."""
    reply, cut = _truncate(respond(body), body.get("max_completion_tokens") or body.get("max_tokens"))
    return _completion_object(body, reply, cut)


def _completion_object(body: dict[str, Any], reply: Reply, cut: bool) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{stable_seed(body.get('seed'), body.get('messages')):016x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or MODEL_ID,
        "choices": [
            {
                "index": 0,
                "message": _message(reply),
                "finish_reason": "length" if cut else "tool_calls" if reply.tool_calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": _usage(body, reply),
    }


class _Handler(ChatCompletionsHandler):
    server_version = "gymforge-offline-teacher"
    failure = "offline teacher error"

    def models(self) -> list[dict[str, Any]]:
        return [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "gymforge"}]

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return completion(body)
        except UnknownRequest as exc:
            raise BadRequest(400, str(exc)) from None


class _ReasoningHandler(_Handler):
    server_version = "gymforge-offline-teacher-reasoning"

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return reasoning_completion(body)
        except UnknownRequest as exc:
            raise BadRequest(400, str(exc)) from None


# The fields a request log records of each request: what it asked for, never what it said.
LOGGED_FIELDS = ("model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "reasoning_effort", "seed",
                 "stream")


def _logging_handler(base: type[_Handler], path: Path) -> type[_Handler]:
    """`base` that appends one JSON line per chat completion to `path`: the request's field names, the values of
    LOGGED_FIELDS, and the answer's status and usage (or the error). A run's requests can then be checked
    against the endpoint's rules after the fact (scripts/rehearsal.sh)."""
    lock = threading.Lock()

    class Logging(base):  # type: ignore[valid-type, misc]
        def complete(self, body: dict[str, Any]) -> dict[str, Any]:
            entry: dict[str, Any] = {"fields": sorted(body), **{k: body[k] for k in LOGGED_FIELDS if k in body}}
            try:
                result = super().complete(body)
            except BadRequest as exc:
                entry.update(status=exc.status, error=str(exc))
                raise
            except Exception as exc:
                entry.update(status=500, error=f"{type(exc).__name__}: {exc}")
                raise
            else:
                entry.update(status=200, usage=result.get("usage"))
                return result
            finally:
                with lock, path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(entry, sort_keys=True) + "\n")

    return Logging


def _make_server(host: str, port: int, endpoint: str = "chat", request_log: str | Path | None = None) -> LoopbackHTTPServer:
    if endpoint not in ENDPOINTS:
        raise ValueError(f"unknown offline endpoint {endpoint!r}; one of {', '.join(ENDPOINTS)}")
    handler: type[_Handler] = _ReasoningHandler if endpoint == "reasoning" else _Handler
    if request_log is not None:
        handler = _logging_handler(handler, Path(request_log))
    return LoopbackHTTPServer((host, port), handler)


def ensure_server(endpoint: str = "chat") -> str:
    """Start the teacher once per process and kind of endpoint (`chat`, `reasoning`) on a free loopback port; return
    its base URL (`.../v1`)."""
    with _lock:
        if endpoint not in _urls:
            server = _make_server("127.0.0.1", 0, endpoint)
            threading.Thread(target=server.serve_forever, name=f"offline-teacher-{endpoint}", daemon=True).start()
            _urls[endpoint] = f"http://127.0.0.1:{server.server_address[1]}/v1"
        return _urls[endpoint]


def serve(host: str = "127.0.0.1", port: int = 8000, endpoint: str = "chat",
          request_log: str | Path | None = None) -> None:
    """Serve in the foreground until interrupted (the `gymforge teacher-server` command); `request_log`: append
    one JSON line per chat completion there (`_logging_handler`)."""
    server = _make_server(host, port, endpoint, request_log)
    log.info("offline teacher (%s endpoint) listening on http://%s:%d/v1", endpoint, host, server.server_address[1])
    server.serve_until_interrupted()
