"""The HTTP side of gymforge's loopback OpenAI-compatible endpoints (offline teacher, served checkpoints).

`ChatCompletionsHandler` answers `GET /v1/models`, `GET /health` and `POST /v1/chat/completions` (JSON or
SSE); a subclass supplies `models()` and `complete(body)` and raises `BadRequest` for a client error.
"""

from __future__ import annotations

import json
import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)


class LoopbackHTTPServer(ThreadingHTTPServer):
    # The standard library listens with a backlog of 5: a burst of concurrent agents' first connects
    # would be refused and retried after a backoff.
    request_queue_size = 128
    daemon_threads = True

    def serve_until_interrupted(self) -> None:
        """Serve in the foreground until Ctrl-C (or SIGINT), then close the socket."""
        try:
            self.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self.server_close()


class BadRequest(ValueError):
    """A client error, answered in OpenAI's error shape; `param` and `code` name the offending field and why
    (e.g. `max_tokens`, `unsupported_parameter`), where there is one."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", *, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param
        self.code = code


def sse_chunks(result: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The completion as SSE chunks: one delta with the whole message, then the finish reason."""
    choice = result["choices"][0]
    delta = dict(choice["message"])
    if "tool_calls" in delta:
        delta["tool_calls"] = [dict(call, index=i) for i, call in enumerate(delta["tool_calls"])]
    base = {key: result[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    chunks = [
        base | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        base | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
    ]
    if include_usage:
        chunks.append(base | {"choices": [], "usage": result["usage"]})
    return chunks


class ChatCompletionsHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    failure = "generation failed"  # how a server error is introduced in the reply and the log

    def models(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def log_message(self, fmt: str, *args: Any) -> None:
        # Access lines go to logging (debug), not to stderr where they would drown the pipeline's output.
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str, param: str | None = None, code: str | None = None) -> None:
        self._send_json(status, {"error": {"message": message, "type": kind, "param": param,
                                           "code": status if code is None else code}})

    def do_GET(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        if path == "/v1/models":
            self._send_json(200, {"object": "list", "data": self.models()})
        elif path == "/health":
            self._send_json(200, {"status": "ok"})
        else:
            self._error(404, f"no route {self.path}", "not_found_error")

    def do_POST(self) -> None:
        if self.path.split("?")[0].rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route {self.path}", "not_found_error")
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if not isinstance(body, dict):
                raise BadRequest(400, "the request body must be a JSON object")
            result = self.complete(body)
        except json.JSONDecodeError as exc:
            self._error(400, f"request body is not JSON: {exc}", "invalid_request_error")
            return
        except BadRequest as exc:
            self._error(exc.status, str(exc), exc.kind, exc.param, exc.code)
            return
        except Exception as exc:
            log.exception("%s", self.failure)
            self._error(500, f"{self.failure}: {type(exc).__name__}: {exc}", "server_error")
            return
        if not body.get("stream"):
            self._send_json(200, result)
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        # No Content-Length for a stream: closing the connection marks its end.
        self.send_header("Connection", "close")
        self.end_headers()
        for chunk in sse_chunks(result, include_usage):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True
