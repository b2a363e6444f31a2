"""One control group per sandbox (an episode's session, or one run): memory and tasks for the whole tree.

rlimits bind each process alone: four processes of 1.5 GiB hold 6 GiB together, and a tmpfs /tmp is
charged to nobody's address space. A control group bounds the sum: `memory` (the private /tmp's pages
included, they are charged to the group that wrote them) and `pids`, with CPU time accounted. Both the
unified hierarchy (cgroup v2: memory.max, pids.max, memory.events) and the legacy one (v1: memory and pids
hierarchies mounted apart, as on hybrid hosts) are used, whichever has the controller. A new group lives
under this process's own group, so limits set above it still apply.

The sandbox joins its group before anything of the untrusted code runs: `wrap()` prefixes the command
with a shell that writes its own pid into the group and then execs the rest.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import shlex
import signal
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of the cgroup file systems."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _, opts = right.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                found.append((left.split()[4], fstype, set(opts.split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """controller (or "" for v2) -> this process's group path."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


@functools.cache
def _layout() -> dict[str, Path] | None:
    """controller ("memory", "pids") -> the directory new groups are made in; None when unusable."""
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError:
        return None
    dirs: dict[str, Path] = {}
    for mount, fstype, opts in mounts:
        if fstype == "cgroup2":
            base = Path(mount) / own.get("", "/").lstrip("/")
            try:
                enabled = set((base / "cgroup.subtree_control").read_text().split())
            except OSError:
                continue
            for c in ("memory", "pids"):
                if c in enabled and c not in dirs and _writable_dir(base):
                    dirs[c] = base
        else:
            for c in ("memory", "pids"):
                if c in opts and c not in dirs:
                    base = Path(mount) / own.get(c, "/").lstrip("/")
                    if _writable_dir(base):
                        dirs[c] = base
    return dirs if {"memory", "pids"} <= dirs.keys() else None


@functools.cache
def available() -> bool:
    """Whether per-sandbox groups work here; says once in the log when they do not."""
    layout = _layout()
    if layout is None:
        log.warning(
            "no writable cgroup with the memory and pids controllers: sandbox limits are per process "
            "(rlimits) only, not per episode"
        )
        return False
    return True


def _v2(d: Path) -> bool:
    return (d / "cgroup.controllers").exists()


class SandboxGroup:
    """The memory and pids groups of one sandbox; `limit_hit()` names the limit a command ran into."""

    def __init__(self, memory_mb: int, max_pids: int, parent: SandboxGroup | None = None) -> None:
        """`parent`: a group this one lives in, whose limits then bound both together (an evaluation's
        submission inside its episode's session)."""
        layout = _layout()
        assert layout is not None, "check cgroups.available() first"
        if parent is not None:
            layout = {"memory": parent.memory, "pids": parent.pids}
        name = f"gymforge-{os.getpid()}-{secrets.token_hex(4)}"
        self.memory_mb, self.max_pids = memory_mb, max_pids
        self.dirs: list[Path] = []
        for d in dict.fromkeys(layout[c] / name for c in ("memory", "pids")):
            d.mkdir()
            self.dirs.append(d)
        self.memory, self.pids = layout["memory"] / name, layout["pids"] / name
        limit = str(memory_mb << 20)
        if _v2(self.memory):
            (self.memory / "memory.max").write_text(limit)
            (self.memory / "memory.swap.max").exists() and (self.memory / "memory.swap.max").write_text("0")
        else:
            (self.memory / "memory.limit_in_bytes").write_text(limit)
            if (swap := self.memory / "memory.memsw.limit_in_bytes").exists():
                try:
                    swap.write_text(limit)
                except OSError:
                    pass  # swap accounting off: memory alone is limited
        (self.pids / "pids.max").write_text(str(max_pids))
        self._seen = self._counters()

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv`, run from a shell that first moves itself into this group (before anything else runs)."""
        procs = " ".join(shlex.quote(str(d / "cgroup.procs")) for d in self.dirs)
        join = f"for f in {procs}; do echo $$ > \"$f\" || exit 125; done; exec \"$@\""
        return ["sh", "-c", join, "gymforge-cgroup", *argv]

    def _read(self, path: Path) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in (ln.split() for ln in path.read_text().splitlines() if len(ln.split()) == 2)}
        except (OSError, ValueError):
            return {}

    def _counters(self) -> tuple[int, int]:
        if _v2(self.memory):
            ooms = self._read(self.memory / "memory.events").get("oom_kill", 0)
        else:
            ooms = self._read(self.memory / "memory.oom_control").get("oom_kill", 0)
        return ooms, self._read(self.pids / "pids.events").get("max", 0)

    def limit_hit(self) -> str | None:
        """The group limit hit since the last call, in words."""
        now = self._counters()
        ooms, forks = (a - b for a, b in zip(now, self._seen, strict=True))
        self._seen = now
        if ooms:
            return f"memory: {self.memory_mb} MiB for the whole sandbox (a process was killed)"
        if forks:
            return f"processes: {self.max_pids} at once for the whole sandbox (a fork or thread was refused)"
        return None

    def cpu_seconds(self) -> float | None:
        for d in self.dirs:
            if _v2(d) and (stat := self._read(d / "cpu.stat")):
                return stat.get("usage_usec", 0) / 1e6
        return None

    def kill_all(self) -> None:
        kill_until_gone(lambda: [int(p) for d in self.dirs for p in _lines(d / "cgroup.procs")], rounds=50, pause=0.01)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs:
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # tasks still exiting
                    time.sleep(0.02)


class _Base:
    """Where a SandboxGroup is made (stands in for a parent group)."""

    def __init__(self, memory: Path, pids: Path) -> None:
        self.memory, self.pids = memory, pids


class DockerParent:
    """A group for docker to put an episode's containers in (`cgroup_parent`): its memory and pids limits bound
    the session's container and the evaluation's submission container together, as the local backend's nested
    groups do. Made under this process's own memory group, at the same path in every hierarchy (docker's
    cgroupfs driver names one path for all controllers)."""

    def __init__(self, memory_mb: int, max_pids: int) -> None:
        layout = _layout()
        assert layout is not None, "check cgroups.available() first"
        mounts = _mounts()
        unified, root = next((fstype == "cgroup2", Path(m)) for m, fstype, opts in mounts
                             if layout["memory"].is_relative_to(m) and (fstype == "cgroup2" or "memory" in opts))
        rel = layout["memory"].relative_to(root)
        pids_base = root / rel if unified else next(Path(m) for m, t, o in mounts if t == "cgroup" and "pids" in o) / rel
        pids_base.mkdir(parents=True, exist_ok=True)
        self.group = SandboxGroup(memory_mb, max_pids, _Base(layout["memory"], pids_base))  # type: ignore[arg-type]
        self.path = "/" + str(rel / self.group.memory.name)
        if _v2(self.group.memory):  # docker makes its containers' groups inside: they need the controllers
            try:
                (self.group.memory / "cgroup.subtree_control").write_text("+memory +pids")
            except OSError:
                pass

    def remove(self) -> None:
        """After the containers are gone: this group, and what docker made at its path in the other hierarchies."""
        self.group.remove()
        for mount, _, _ in _mounts():
            d = Path(mount) / self.path.lstrip("/")
            if d not in self.group.dirs and d.is_dir():
                try:
                    d.rmdir()
                except OSError:
                    pass


def kill_until_gone(victims: Callable[[], list[int]], *, rounds: int, pause: float) -> None:
    """SIGKILL whatever `victims()` lists, again and again (a process may fork between listing and killing),
    until it lists nothing or `rounds` are spent."""
    for _ in range(rounds):
        pids = victims()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(pause)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []
