"""The response cache, packed per job: one append-only file of JSON lines per Snakemake job, not one file per call.

A re-run of a job (after a kill, a failure or a change upstream) sends the requests it sent before, and those are
answered from its pack: `<cache_dir>/packs/<stage>/<item>.jsonl` for the job `<stage>/<item>` (a process outside a
job packs by client stage: `packs/_<stage>.jsonl`). On a cluster's shared file system a run then creates a file
per job instead of one per LLM call (issue #45: ~1.9M files at paper scale against inode quotas).

Each line is `{"key": ..., "result": ...}`, written with one `write()` in append mode by the job's one process;
a line cut by a kill is skipped when the pack is read, and the next line starts on a line of its own. Requests
that another job sent are not looked up (each job reads only its own pack), and the files of the earlier layout
(`<cache_dir>/<key[:2]>/<key>.json`) are still read.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from gymforge.runtime.job import current_job


class ResponseCache:
    def __init__(self, cache_dir: str | Path, stage: str, job: str | None = None) -> None:
        self.dir = Path(cache_dir)
        job = job if job is not None else current_job()
        rel = job if job else f"_{stage}"
        self.pack = self.dir / "packs" / f"{rel.strip('/').replace('..', '__')}.jsonl"
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] | None = None
        self._cut = False  # the pack ends inside a line (a kill mid-write)

    def _load(self) -> dict[str, dict[str, Any]]:
        if self._entries is None:
            entries: dict[str, dict[str, Any]] = {}
            try:
                data = self.pack.read_bytes()
            except FileNotFoundError:
                data = b""
            for line in data.splitlines():
                try:
                    row = json.loads(line)
                    entries[row["key"]] = row["result"]
                except (ValueError, KeyError, TypeError):
                    continue
            self._cut = bool(data) and not data.endswith(b"\n")
            self._entries = entries
        return self._entries

    def legacy_path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            if (hit := self._load().get(key)) is not None:
                return hit
        try:
            return json.loads(self.legacy_path(key).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def put(self, key: str, result: dict[str, Any]) -> None:
        line = json.dumps({"key": key, "result": result}) + "\n"
        with self._lock:
            entries = self._load()
            self.pack.parent.mkdir(parents=True, exist_ok=True)
            data = ("\n" if self._cut else "") + line
            fd = os.open(self.pack, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                view = memoryview(data.encode())
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            self._cut = False
            entries[key] = result
