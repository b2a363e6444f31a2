"""A real OpenAI-compatible HTTP server on 127.0.0.1 with scriptable answers, for tests.

    with LoopbackServer([Answer(429, {"Retry-After": "1"}), Answer(200)]) as srv:
        client = OpenAI(base_url=srv.url, api_key="x")
        ...
        assert srv.count == 2

Queued answers are served in order to POST /v1/chat/completions; once the queue is empty,
`respond(request_body)` decides (default: a completion echoing the last user message).
Test modules get the `loopback` fixture with `from loopback import loopback`, or all at once from
`pytest_plugins = ["loopback"]` in tests/conftest.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any, NamedTuple, Self

import pytest

from gymforge.llm.http import LoopbackHTTPServer


class Answer(NamedTuple):
    status: int = 200
    headers: Mapping[str, str] = {}
    # dict -> JSON, str -> raw text; None -> an echo completion (status < 400) or an OpenAI error body
    body: Any = None


def completion(
    content: str | None = "ok",
    *,
    tool_calls: list[tuple[str, dict[str, Any] | str]] | None = None,
    model: str = "loopback-model",
    prompt_tokens: int | None = 10,
    completion_tokens: int = 5,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """A chat.completion body; `tool_calls` are (name, arguments) pairs; prompt_tokens=None omits usage."""
    calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
        }
        for i, (name, args) in enumerate(tool_calls or [])
    ]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    body: dict[str, Any] = {
        "id": "chatcmpl-loopback",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason or ("tool_calls" if calls else "stop")}
        ],
    }
    if prompt_tokens is not None:
        body["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
    return body


def error_body(message: str, type_: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": None}}


def echo(request: dict[str, Any]) -> Answer:
    users = [m for m in request.get("messages", []) if m.get("role") == "user"]
    text = users[-1].get("content") if users else ""
    return Answer(200, {}, completion(f"echo: {text}", model=request.get("model", "loopback-model")))


def closed_port_url() -> str:
    """Base URL of a loopback port that nothing listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


class LoopbackThread:
    """An HTTP handler served on 127.0.0.1 (a free port) from a daemon thread, as a context manager."""

    _httpd: LoopbackHTTPServer | None = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Self:
        self._httpd = LoopbackHTTPServer(("127.0.0.1", 0), self.handler())
        # A short poll interval keeps stop() fast.
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name=type(self).__name__, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LoopbackServer(LoopbackThread):
    def __init__(
        self,
        answers: Iterable[Answer | tuple[int, Mapping[str, str], Any]] = (),
        *,
        respond: Callable[[dict[str, Any]], Answer] = echo,
        delay_s: float = 0.0,
        models: tuple[str, ...] = ("loopback-model",),
    ) -> None:
        self.answers: deque[Answer] = deque(Answer(*a) for a in answers)
        self.respond = respond
        self.delay_s = delay_s  # every chat request is held this long before answering
        self.models = models
        self.requests: list[dict[str, Any]] = []  # {"path", "headers", "body"} of each chat request
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        """Chat requests received so far."""
        with self._lock:
            return len(self.requests)

    def push(self, *answers: Answer | tuple[int, Mapping[str, str], Any]) -> None:
        with self._lock:
            self.answers.extend(Answer(*a) for a in answers)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return type("Handler", (_Handler,), {"owner": self})

    def _chat(self, headers: dict[str, str], body: dict[str, Any]) -> Answer:
        with self._lock:
            self.requests.append({"path": "/v1/chat/completions", "headers": headers, "body": body})
            queued = self.answers.popleft() if self.answers else None
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.delay_s)
            answer = queued if queued is not None else self.respond(body)
        finally:
            with self._lock:
                self.in_flight -= 1
        if answer.body is None:
            fill = echo(body).body if answer.status < 400 else error_body(f"scripted HTTP {answer.status}")
            answer = answer._replace(body=fill)
        return answer


class _Handler(BaseHTTPRequestHandler):
    owner: LoopbackServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.rstrip("/") != "/v1/models":
            return self._send(Answer(404, {}, error_body(f"no route {self.path}", "not_found")))
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "loopback"} for m in self.owner.models]
        self._send(Answer(200, {}, {"object": "list", "data": data}))

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._send(Answer(404, {}, error_body(f"no route {self.path}", "not_found")))
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return self._send(Answer(400, {}, error_body("request body is not JSON", "invalid_request_error")))
        self._send(self.owner._chat({k.lower(): v for k, v in self.headers.items()}, body))

    def _send(self, answer: Answer) -> None:
        data = (answer.body if isinstance(answer.body, str) else json.dumps(answer.body)).encode()
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output quiet


@pytest.fixture
def loopback() -> Iterator[LoopbackServer]:
    with LoopbackServer() as server:
        yield server
