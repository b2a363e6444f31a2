"""Run-wide LLM ledger and budget, shared by every process of a run through a file lock.

`calls.jsonl` is a write-ahead log: every attempt is appended as `sent` before the request leaves and as
`done` after it (ok or failed, with its error class, HTTP status, endpoint, tokens and cost; a reasoning model's
`reasoning_tokens` are counted within `completion_tokens`, billed as output, and kept apart too); a cache hit is one
`cached` line. A request whose process died in flight (`kill -9`) is found by the next process that takes
the lock and booked as `done` with error `killed_in_flight` at its upper-bound cost, so nothing sent ever
escapes the log or the budget.

`spend.json` holds the settled spend, the reservations of attempts in flight and per-stage statistics.
A reservation is a realistic estimate (prompt estimate plus the stage's mean reply, capped by
`max_tokens`); the admission rule keeps the upper bounds of everything in flight within the budget by
lowering a request's `max_tokens` when needed, so actual spend never exceeds `llm.budget_usd`.

All of it rests on one flock held by every process of the run: a ledger checks at start that its directory's mount
gives that (`check_locks`; on a cluster, flock must hold across nodes: docs/operations.md).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import socket
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from filelock import FileLock

from gymforge.core import atomic
from gymforge.runtime import sharedfs
from gymforge.runtime.procs import pid_alive
from gymforge.core.config import Price

log = logging.getLogger(__name__)

# Tokens per prompt character: the estimate before a stage has settled a call, and the upper bound's floor.
PROMPT_RATIO = 0.25
PROMPT_RATIO_BOUND = 0.5
# Expected reply length before a stage has settled a call.
DEFAULT_REPLY_TOKENS = 512
KILLED = "killed_in_flight"


class BudgetExceeded(RuntimeError):
    """A call was refused because it does not fit in what is left of `llm.budget_usd`."""

    reason_code = "budget_exhausted"  # a job that fails with it (gymforge.runtime.job.classify)


def _alive(pid: int, started: float | None) -> bool:
    # A recycled pid belongs to a process that started later than the one that made the reservation.
    return pid_alive(pid) and (started is None or _start_time(pid) in (None, started))


def _start_time(pid: int) -> float | None:
    """Start time of a process in clock ticks since boot (Linux), to tell a recycled pid from its first owner."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return float(stat.rsplit(")", 1)[1].split()[19])


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


SINGLE_NODE_ENV = "GYMFORGE_SINGLE_NODE"


class LedgerLockError(RuntimeError):
    """The ledger's directory cannot give the run's processes one lock, so the budget would not hold."""

    reason_code = "ledger_lock"


@functools.cache
def check_locks(ledger_dir: Path) -> sharedfs.MountLocks:
    """The check at start: the ledger's lock must hold for every process of the run. Fails when flock does not
    work there at all, and inside a SLURM job (whose run has jobs on other nodes) when the mount's locks are per
    node (Lustre `localflock`, NFS `local_lock`), unless GYMFORGE_SINGLE_NODE=1 says every job runs on one node."""
    found = sharedfs.lock_mount(ledger_dir)
    where = f"{ledger_dir} is on {found.mount_point} ({found.fstype}): {found.why}"
    if found.state == "broken":
        raise LedgerLockError(f"the LLM ledger needs flock on its directory: {where}")
    on_cluster = "SLURM_JOB_ID" in os.environ and os.environ.get(SINGLE_NODE_ENV) != "1"
    if found.state == "per_node" and on_cluster:
        raise LedgerLockError(
            f"the LLM budget needs locks that hold across nodes, and {where}. Put results_dir on a mount with "
            f"cluster-wide flock (Lustre: mount -o flock), or run every job on one node and set {SINGLE_NODE_ENV}=1")
    if found.state == "unknown" and on_cluster:
        log.warning("LLM ledger: %s; the budget holds only if its locks are cluster-wide", where)
    return found


@dataclass(frozen=True)
class Admission:
    """A reserved attempt: its ledger id and the `max_tokens` it may send (lowered to fit the budget)."""

    id: str
    max_tokens: int
    estimate_usd: float
    bound_usd: float


class Ledger:
    def __init__(self, ledger_dir: str | Path, *, read_only: bool = False) -> None:
        """`read_only`: a reader (`gymforge status`) that never takes the run's lock and writes nothing: it reads
        the log and the spend file as they are (both only ever replaced or appended whole lines), and counts the
        requests of this host's killed processes as spent at their bound without booking them."""
        self.dir = Path(ledger_dir)
        self.read_only = read_only
        self.calls_path = self.dir / "calls.jsonl"
        self.spend_path = self.dir / "spend.json"
        if not read_only:
            self.dir.mkdir(parents=True, exist_ok=True)
            check_locks(self.dir)
        self._lock = FileLock(str(self.dir / "ledger.lock"))

    def _locked(self) -> FileLock | contextlib.nullcontext:
        return contextlib.nullcontext() if self.read_only else self._lock

    # -- spend.json -------------------------------------------------------------------------------

    def _read_spend(self, booked: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The spend file with the reservations of dead processes booked (call with the lock held); read-only, the
        `done` lines they would get go to `booked` instead of the log."""
        spend: dict[str, Any] = {"spent_usd": 0.0, "reservations": {}, "stats": {}}
        if self.spend_path.exists():
            spend.update(json.loads(self.spend_path.read_text()))
        host = socket.gethostname()
        dead = {token: r for token, r in spend["reservations"].items()
                if r.get("host") == host and not _alive(r["pid"], r.get("started"))}
        # A process killed inside `settle`, after logging its `done` line and before writing this file: book what it
        # logged, not its bound and a second `done` line.
        settled = self._logged_costs(dead.keys()) if dead else {}
        for token, r in dead.items():
            del spend["reservations"][token]
            if token in settled:
                spend["spent_usd"] += settled[token]
                continue
            # The request may have been answered and billed: book its upper bound, and log it.
            bound = r.get("bound_usd", r.get("usd", 0.0))
            spend["spent_usd"] += bound
            (booked.append if self.read_only and booked is not None else self._append)({
                "event": "done", "id": token, "call": r.get("call"), "attempt": r.get("attempt", 1),
                "stage": r.get("stage"), "job": r.get("job"), "model": r.get("model"), "endpoint": r.get("endpoint"),
                "cached": False, "ok": False, "error": KILLED, "http_status": None, "transient": True,
                "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": bound, "cost_basis": "upper_bound",
            })
        if dead and not self.read_only:
            atomic.write_json(self.spend_path, spend)
        return spend

    def _logged_costs(self, tokens: Iterable[str]) -> dict[str, float]:
        """The cost of each of `tokens` that already has a `done` line in the log."""
        wanted, found = set(tokens), {}
        if self.calls_path.exists():
            for line in self.calls_path.read_text().splitlines():
                if not any(t in line for t in wanted):
                    continue
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("event") == "done" and e.get("id") in wanted:
                    found[e["id"]] = e.get("cost_usd") or 0.0
        return found

    @staticmethod
    def _expected_reply(spend: dict[str, Any], stage: str, max_tokens: int) -> int:
        """Mean reply length of the stage's settled calls, else of all stages', else DEFAULT_REPLY_TOKENS."""
        stats = spend["stats"].get(stage) or {}
        if not stats.get("n"):
            every = spend["stats"].values()
            stats = {"n": sum(s["n"] for s in every), "completion_tokens": sum(s["completion_tokens"] for s in every)}
        mean = stats["completion_tokens"] / stats["n"] if stats["n"] else DEFAULT_REPLY_TOKENS
        return max(1, min(max_tokens, math.ceil(mean)))

    @staticmethod
    def _prompt_ratios(spend: dict[str, Any], stage: str) -> tuple[float, float]:
        """(estimate, upper bound) of prompt tokens per character for `stage`."""
        stats = spend["stats"].get(stage) or {}
        if not stats.get("prompt_chars"):
            return PROMPT_RATIO, PROMPT_RATIO_BOUND
        mean = stats["prompt_tokens"] / stats["prompt_chars"]
        return mean, max(PROMPT_RATIO_BOUND, 1.25 * stats.get("max_prompt_ratio", mean))

    def admit(self, *, stage: str, prompt_chars: int, max_tokens: int, price: Price, budget_usd: float,
              meta: dict[str, Any]) -> Admission | None:
        """Reserve an attempt and log it as `sent`; None when it must wait for attempts in flight to settle.

        Admitted when the realistic estimate fits in what is neither spent nor reserved, and the upper bounds of
        everything in flight plus this attempt's fit in the budget, with `max_tokens` lowered if that is what
        it takes (never below the expected reply). Raises BudgetExceeded when even the estimate does not fit.
        """
        with self._lock:
            spend = self._read_spend()
            live = spend["reservations"].values()
            spent = spend["spent_usd"]
            reserved = sum(r["usd"] for r in live)
            bounds = sum(r.get("bound_usd", r["usd"]) for r in live)
            ratio, ratio_bound = self._prompt_ratios(spend, stage)
            expected = self._expected_reply(spend, stage, max_tokens)
            estimate = price.cost(math.ceil(prompt_chars * ratio), expected)
            remaining = budget_usd - spent - reserved

            def exhausted(needed: float) -> BudgetExceeded:
                return BudgetExceeded(
                    f"LLM budget exhausted (stage {stage}): budget ${budget_usd:.4f}, spent ${spent:.4f}, "
                    f"reserved ${reserved:.4f} by {len(spend['reservations'])} requests in flight, remaining "
                    f"${max(remaining, 0.0):.6f}; the next request needs about ${needed:.6f}. "  # 6 places: 4 printed ties
                    "Raise llm.budget_usd to continue")

            if estimate > remaining:
                raise exhausted(estimate)
            prompt_bound = price.cost(math.ceil(prompt_chars * ratio_bound), 0)
            room = budget_usd - spent - bounds - prompt_bound
            if price.output_per_mtok > 0:
                allowed = min(max_tokens, math.floor(max(room, 0.0) * 1e6 / price.output_per_mtok + 1e-6))
            else:
                allowed = max_tokens if room >= 0 else 0
            if allowed < expected:
                if spend["reservations"]:
                    return None  # what is in flight will settle, most likely well below its bound
                raise exhausted(prompt_bound + price.cost(0, expected))  # the expected reply at the prompt's bound
            admission = Admission(uuid.uuid4().hex, allowed, estimate, prompt_bound + price.cost(0, allowed))
            spend["reservations"][admission.id] = {
                "usd": estimate, "bound_usd": admission.bound_usd, "stage": stage, "pid": os.getpid(),
                "started": _start_time(os.getpid()), "host": socket.gethostname(), "ts": _now(), **meta,
            }
            # Reservation first, then the `sent` line: a kill in between books a request that never left.
            atomic.write_json(self.spend_path, spend)
            self._append({"event": "sent", "id": admission.id, "stage": stage, "cached": False,
                          "max_tokens": allowed, "reserved_usd": estimate, "bound_usd": admission.bound_usd, **meta})
            return admission

    def settle(self, token: str, entry: dict[str, Any], *, prompt_chars: int | None = None) -> None:
        """Release a reservation, book `entry["cost_usd"]` and log the attempt as `done`.

        With `prompt_chars`, a successful entry with real usage also updates the stage's statistics."""
        with self._lock:
            spend = self._read_spend()
            spend["reservations"].pop(token, None)
            spend["spent_usd"] += entry["cost_usd"]
            if prompt_chars and entry.get("ok") and entry.get("cost_basis") == "usage":
                s = spend["stats"].setdefault(entry["stage"], {"n": 0, "completion_tokens": 0, "prompt_tokens": 0,
                                                               "prompt_chars": 0, "max_prompt_ratio": 0.0})
                s["n"] += 1
                s["completion_tokens"] += entry["completion_tokens"]
                s["prompt_tokens"] += entry["prompt_tokens"]
                s["prompt_chars"] += prompt_chars
                s["max_prompt_ratio"] = max(s["max_prompt_ratio"], entry["prompt_tokens"] / prompt_chars)
            self._append({"event": "done", "id": token, "cached": False, **entry})
            atomic.write_json(self.spend_path, spend)

    def log(self, entry: dict[str, Any]) -> None:
        """Append an entry that costs nothing (a cache hit)."""
        with self._lock:
            self._append({"event": "cached", **entry})

    def _append(self, entry: dict[str, Any]) -> None:
        line = json.dumps({"ts": _now(), **entry}) + "\n"
        # One write() of one line in append mode: lines of concurrent writers never interleave.
        with self.calls_path.open("a") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    # -- reading ----------------------------------------------------------------------------------

    def entries(self) -> list[dict[str, Any]]:
        """Every line of the log; lines of the older format (one per finished call) read as `done`."""
        booked: list[dict[str, Any]] = []
        with self._locked():
            self._read_spend(booked)  # books requests of killed processes first
            if not self.calls_path.exists():
                return []
            out = []
            for line in self.calls_path.read_text().splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a line cut by a crash mid-write, or (read-only) one being appended right now
                e.setdefault("event", "cached" if e.get("cached") else "done")
                out.append(e)
            return out + booked

    def budget(self, budget_usd: float) -> dict[str, float | int]:
        with self._locked():
            spend = self._read_spend()
        reserved = sum(r["usd"] for r in spend["reservations"].values())
        return {"budget_usd": budget_usd, "spent_usd": spend["spent_usd"], "reserved_usd": reserved,
                "in_flight": len(spend["reservations"]),
                "remaining_usd": budget_usd - spend["spent_usd"] - reserved}

    def spent(self) -> float:
        with self._locked():
            return self._read_spend()["spent_usd"]

    def totals(self, by: Callable[[dict[str, Any]], str] | None = None) -> dict[str, dict[str, Any]]:
        """Per client stage (or per `by(entry)`): the usage keys of `gymforge.llm.client.Usage` (`calls` = attempts sent)
        plus retries, requests in flight at a kill, requests in flight now, failed attempts by error class."""
        by = by or (lambda e: e.get("stage") or "?")
        out: dict[str, dict[str, Any]] = {}
        done: set[str] = set()
        sent: dict[str, dict[str, Any]] = {}
        entries = self.entries()
        for e in entries:
            if e["event"] == "sent":
                sent[e["id"]] = e
            elif e["event"] == "done" and "id" in e:
                done.add(e["id"])
        for e in entries:
            if e["event"] == "sent":
                continue
            t = out.setdefault(by(e), _empty_totals())
            if e["event"] == "cached":
                t["cache_hits"] += 1
                continue
            t["calls"] += 1
            t["retries"] += int((e.get("attempt") or 1) > 1)
            t["prompt_tokens"] += e.get("prompt_tokens") or 0
            t["completion_tokens"] += e.get("completion_tokens") or 0
            t["reasoning_tokens"] += e.get("reasoning_tokens") or 0
            t["cost_usd"] += e.get("cost_usd") or 0.0
            if e.get("error") == KILLED:
                t["killed_in_flight"] += 1
            elif not e.get("ok", True):
                t["errors"][e.get("error") or "unknown"] = t["errors"].get(e.get("error") or "unknown", 0) + 1
        for token, e in sent.items():
            if token not in done:  # alive and in flight right now
                t = out.setdefault(by(e), _empty_totals())
                t["in_flight"] += 1
        return out

    def request_count(self) -> int:
        """Requests sent to an endpoint (every attempt, failed and in-flight ones included), cache hits excluded."""
        entries = self.entries()
        sent = {e["id"] for e in entries if e["event"] == "sent"}
        # Attempts logged only as `done`: the older format, and a kill between reservation and `sent` line.
        return len(sent) + sum(1 for e in entries if e["event"] == "done" and e.get("id") not in sent)


def _empty_totals() -> dict[str, Any]:
    return {"calls": 0, "cache_hits": 0, "prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "cost_usd": 0.0,
            "retries": 0, "killed_in_flight": 0, "in_flight": 0, "errors": {}}
