"""A real HTTP server on 127.0.0.1 that answers the Hugging Face Hub endpoints `datasets.load_dataset` uses.

    with FakeHFHub({"owner/name": {"data/train.csv": b"x,y\\n1,2\\n"}}) as hub:
        env = {"HF_ENDPOINT": hub.url, ...}   # in a subprocess: huggingface_hub reads it at import

Routes: dataset info (`/api/datasets/<id>[/revision/<rev>]`), the file tree (`/api/datasets/<id>/tree/<rev>[/<path>]`),
paths-info, and file downloads (`HEAD`/`GET /datasets/<id>/resolve/<rev>/<path>`, with Range); the same for model
repositories (`/api/models/<id>...`, `/<id>/resolve/<rev>/<path>`). Anything else is a
404 with the hub's `X-Error-Code`, and is recorded in `unhandled`, so a test sees which endpoint it forgot.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from gymforge.llm.http import LoopbackHTTPServer

SHA = "0123456789abcdef0123456789abcdef01234567"


class FakeHFHub:
    def __init__(self, repos: dict[str, dict[str, bytes]]) -> None:
        self.repos = repos
        self.requests: list[str] = []
        self.unhandled: list[str] = []
        self._lock = threading.Lock()
        self._httpd: LoopbackHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> FakeHFHub:
        handler = type("Handler", (_Handler,), {"hub": self})
        self._httpd = LoopbackHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="fake-hf-hub", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def record(self, line: str, handled: bool) -> None:
        with self._lock:
            self.requests.append(line)
            if not handled:
                self.unhandled.append(line)


def _oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHFHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- routing ----------------------------------------------------------------------------------

    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        query = parse_qs(url.query)
        for pattern, method in (
            (r"/api/datasets/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?/?", self._info),
            (r"/api/datasets/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<sub>.*))?", self._tree),
            (r"/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)", self._resolve),
            # model repositories (what `snapshot_download` of a model asks)
            (r"/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?/?", self._info),
            (r"/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<sub>.*))?", self._tree),
            (r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)", self._resolve),
        ):
            m = re.fullmatch(pattern, path)
            if m:
                repo = m.group("repo")
                if repo not in self.hub.repos:
                    return self._missing(head, "RepoNotFound", f"Repository {repo} not found")
                self.hub.record(f"{self.command} {self.path}", True)
                return method(head=head, query=query, **m.groupdict())
        self._missing(head, "EntryNotFound", f"no route {path}", record=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode()
        m = re.fullmatch(r"/api/datasets/(?P<repo>[^/]+/[^/]+)/paths-info/(?P<rev>[^/]+)", unquote(urlsplit(self.path).path))
        if not m or m.group("repo") not in self.hub.repos:
            return self._missing(False, "EntryNotFound", f"no route {self.path}", record=True)
        self.hub.record(f"POST {self.path}", True)
        form = parse_qs(body) if not body.startswith("{") else {k: v if isinstance(v, list) else [v]
                                                                   for k, v in json.loads(body).items()}
        files = self.hub.repos[m.group("repo")]
        wanted = [p for p in form.get("paths", [])]
        self._json([e for e in self._entries(files, "", recursive=True, dirs=True) if e["path"] in wanted])

    # -- answers ----------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, payload: Any, head: bool = False) -> None:
        self._send(200, json.dumps(payload).encode(), {"Content-Type": "application/json"}, head)

    def _missing(self, head: bool, code: str, message: str, record: bool = False) -> None:
        if record:
            self.hub.record(f"{self.command} {self.path}", False)
        body = json.dumps({"error": message}).encode()
        self._send(404, body, {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}, head)

    def _entries(self, files: dict[str, bytes], sub: str, *, recursive: bool, dirs: bool) -> list[dict[str, Any]]:
        prefix = f"{sub.strip('/')}/" if sub.strip("/") else ""
        out: dict[str, dict[str, Any]] = {}
        for name, data in sorted(files.items()):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix):].split("/")
            for depth in range(1, len(rest)):
                if dirs and (recursive or depth == 1):
                    d = prefix + "/".join(rest[:depth])
                    out.setdefault(d, {"type": "directory", "oid": _oid(d.encode()), "size": 0, "path": d})
            if recursive or len(rest) == 1:
                out[name] = {"type": "file", "oid": _oid(data), "size": len(data), "path": name}
        return list(out.values())

    def _info(self, head: bool, query: dict[str, list[str]], repo: str, rev: str | None) -> None:
        files = self.hub.repos[repo]
        self._json({
            "_id": "fake", "id": repo, "author": repo.split("/")[0], "sha": SHA, "lastModified": "2026-01-01T00:00:00.000Z",
            "private": False, "gated": False, "disabled": False, "downloads": 1, "likes": 0, "tags": [],
            "cardData": {}, "createdAt": "2026-01-01T00:00:00.000Z", "usedStorage": sum(map(len, files.values())),
            "siblings": [{"rfilename": name} for name in sorted(files)],
        }, head)

    def _tree(self, head: bool, query: dict[str, list[str]], repo: str, rev: str, sub: str | None) -> None:
        files = self.hub.repos[repo]
        entries = self._entries(files, sub or "", recursive=query.get("recursive", ["false"])[0].lower() == "true",
                                dirs=True)
        if sub and not entries:
            return self._missing(head, "EntryNotFound", f"{sub} does not exist on {rev}")
        self._json(entries, head)

    def _resolve(self, head: bool, query: dict[str, list[str]], repo: str, rev: str, file: str) -> None:
        data = self.hub.repos[repo].get(file)
        if data is None:
            return self._missing(head, "EntryNotFound", f"{file} does not exist on {rev}")
        headers = {"Content-Type": "application/octet-stream", "ETag": f'"{_oid(data)}"', "X-Repo-Commit": SHA,
                   "Accept-Ranges": "bytes"}
        status = 200
        rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if rng:
            start = int(rng.group(1))
            end = min(int(rng.group(2)) if rng.group(2) else len(data) - 1, len(data) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start:end + 1], 206
        self._send(status, data, headers, head)
