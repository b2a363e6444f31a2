"""A loopback HTTP proxy that injects faults into chat requests on their way to an OpenAI-compatible endpoint.

    with FaultProxy(upstream_url, rate=0.3, seed=0, hang_s=3) as proxy:
        ... base_url=proxy.url ...
        proxy.injected  # Counter of faults by kind

Faults (`KINDS`): `429` (with Retry-After), `500`, `503`, `hang` (no answer until after the client's
timeout, then the connection is closed), `cut` (the upstream's answer, cut in half, then the connection is
closed), `bad_json` (the upstream's 200 answer, truncated to invalid JSON) and `no_choices` (the upstream's
200 answer with an empty `choices` list, usage kept). Whether a request is faulted, and how, is drawn from
`seed`, the request body and how many times that body was seen before, so a run injects the same faults
whatever the order in which concurrent jobs send their requests, and a retry gets a fresh draw.
Everything other than `POST .../chat/completions` is passed through untouched.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any

from loopback import LoopbackThread

KINDS = ("429", "500", "503", "hang", "cut", "bad_json", "no_choices")


class FaultProxy(LoopbackThread):
    def __init__(self, upstream: str, *, rate: float = 0.3, seed: int = 0, kinds: Iterable[str] = KINDS,
                 hang_s: float = 3.0, retry_after: str = "1", delay_s: float = 0.0,
                 schedule: Callable[[int], str | None] | None = None,
                 on_request: Callable[[int], None] | None = None) -> None:
        """`upstream`: base URL ending in /v1. `schedule(n)`, if given, overrides the draw for the n-th chat
        request (0-based): a kind, or None for no fault. `delay_s`: added latency of every chat request.
        `on_request(n)` is called when the n-th chat request arrives (before its latency)."""
        self.upstream = upstream.rstrip("/")
        self.rate = rate
        self.seed = seed
        self.kinds = tuple(kinds)
        self.hang_s = hang_s
        self.retry_after = retry_after
        self.schedule = schedule
        self.delay_s = delay_s
        self.on_request = on_request
        self.injected: Counter[str] = Counter()
        self.requests = 0  # chat requests received
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()

    def draw(self, body: bytes) -> str | None:
        digest = hashlib.sha256(body).hexdigest()
        with self._lock:
            n, self.requests = self.requests, self.requests + 1
            occurrence = self._seen[digest]
            self._seen[digest] += 1
        if self.schedule is not None:
            kind = self.schedule(n)
        else:
            rng = random.Random(f"{self.seed}:{digest}:{occurrence}")
            kind = rng.choice(self.kinds) if rng.random() < self.rate else None
        if kind is not None:
            with self._lock:
                self.injected[kind] += 1
        if self.on_request is not None:
            self.on_request(n)
        return kind

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return type("Handler", (_Handler,), {"proxy": self})


class _Handler(BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._relay("GET", None)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._relay("POST", body)
        kind = self.proxy.draw(body)
        time.sleep(self.proxy.delay_s)
        if kind in ("429", "500", "503"):
            headers = {"Retry-After": self.proxy.retry_after} if kind == "429" else {}
            error = {"error": {"message": f"injected HTTP {kind}", "type": "server_error", "param": None, "code": None}}
            return self._send(int(kind), json.dumps(error).encode(), headers)
        if kind == "hang":
            time.sleep(self.proxy.hang_s)
            self.close_connection = True
            return
        status, data, _ = self._upstream("POST", body)
        if kind == "cut":
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if kind == "bad_json" and status == 200:
            data = data[: len(data) // 2]
        elif kind == "no_choices" and status == 200:
            data = json.dumps({**json.loads(data), "choices": []}).encode()
        self._send(status, data, {})

    def _upstream(self, method: str, body: bytes | None) -> tuple[int, bytes, str]:
        suffix = self.path.removeprefix("/v1")
        req = urllib.request.Request(self.proxy.upstream + suffix, data=body, method=method, headers={
            k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")})
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                return resp.status, resp.read(), resp.headers.get("Content-Type", "application/json")
        except urllib.error.HTTPError as err:
            return err.code, err.read(), err.headers.get("Content-Type", "application/json")

    def _relay(self, method: str, body: bytes | None) -> None:
        status, data, _ = self._upstream(method, body)
        self._send(status, data, {})

    def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
