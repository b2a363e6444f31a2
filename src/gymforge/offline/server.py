"""The offline teacher's OpenAI-compatible HTTP endpoint (standard library only).

`GET /v1/models` and `POST /v1/chat/completions` (plain JSON, or SSE with `stream: true`) are
enough for the `openai` client, so the pipeline reaches this teacher exactly as a hosted model.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import replace
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

_lock = threading.Lock()
_url: str | None = None


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


def completion(body: dict[str, Any]) -> dict[str, Any]:
    """The chat.completion object for a request body (raises what `respond` raises). Like a hosted model, the reply
    stops at `max_tokens` (or `max_completion_tokens`) with finish reason `length`."""
    reply, cut = _truncate(respond(body), body.get("max_completion_tokens") or body.get("max_tokens"))
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


def _make_server(host: str, port: int) -> LoopbackHTTPServer:
    return LoopbackHTTPServer((host, port), _Handler)


def ensure_server() -> str:
    """Start the teacher once per process on a free loopback port; return its base URL (`.../v1`)."""
    global _url
    with _lock:
        if _url is None:
            server = _make_server("127.0.0.1", 0)
            threading.Thread(target=server.serve_forever, name="offline-teacher", daemon=True).start()
            _url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        return _url


def serve(host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve in the foreground until interrupted (the `gymforge teacher-server` command)."""
    server = _make_server(host, port)
    log.info("offline teacher listening on http://%s:%d/v1", host, server.server_address[1])
    server.serve_until_interrupted()
