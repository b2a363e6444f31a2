"""Stale Snakemake locks: a run killed with `kill -9` leaves `.snakemake/locks/` behind, and Snakemake then refuses
every later run of the workflow ("Directory cannot be locked") until `snakemake --unlock`.

The Snakefile calls `clear_stale_locks()` while it is parsed, before Snakemake checks its locks. A lock is certainly
stale when no other Snakemake process runs in the working directory (read from /proc); then it is removed, with a
note. Where that cannot be known (no /proc, or a process whose working directory is not readable), nothing is
removed and the note names the one command that clears the lock.

/proc shows this host's processes only, while on a cluster the working directory is on a shared file system that
several login nodes see. So the run that is about to lock (the Snakefile's main process, when no lock is there)
records its host, pid and the pid's start time in `.snakemake/gymforge-lock-owner.json`. A lock whose record names
another host is never removed here (`elsewhere`: a dry run on a second login node leaves the live run's lock
alone); one whose record names this host is stale only when that pid is gone (or recycled) and no other Snakemake
runs here.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
from pathlib import Path

from gymforge.core import atomic
from gymforge.runtime.procs import pid_alive, start_time

UNLOCK = "snakemake --unlock"
OWNER = "gymforge-lock-owner.json"


def lock_files(workdir: Path) -> list[Path]:
    return sorted((Path(workdir) / ".snakemake" / "locks").glob("*.lock"))


def _is_snakemake(cmdline: list[str]) -> bool:
    names = [Path(a).name for a in cmdline[:3]]
    return any(n.startswith("snakemake") for n in names) or any(
        a == "-m" and b == "snakemake" for a, b in itertools.pairwise(cmdline))


def other_snakemakes(workdir: Path) -> list[int] | None:
    """Pids of the Snakemake processes other than this one whose working directory is `workdir` (including those
    whose working directory cannot be read); None where processes cannot be listed."""
    proc = Path("/proc")
    if not (proc / str(os.getpid())).exists():
        return None
    here = Path(workdir).resolve()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone, or not ours to read
        if not _is_snakemake(cmdline):
            continue
        try:
            if Path(os.readlink(entry / "cwd")).resolve() != here:
                continue
        except FileNotFoundError:
            continue
        except OSError:
            pass  # cannot tell where it runs: assume here
        found.append(int(entry.name))
    return sorted(found)


def owner_path(workdir: Path) -> Path:
    return Path(workdir) / ".snakemake" / OWNER


def read_owner(workdir: Path) -> dict | None:
    """The host, pid and start time of the run that last recorded itself here, or None."""
    try:
        owner = json.loads(owner_path(workdir).read_text())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) and {"host", "pid"} <= owner.keys() else None


def record_owner(workdir: Path = Path(".")) -> None:
    """Record this process (host, pid, start time) as the run about to take the locks of `workdir`."""
    pid = os.getpid()
    atomic.write_json(owner_path(workdir), {"host": socket.gethostname(), "pid": pid, "started": start_time(pid)})


def _owner_alive(owner: dict) -> bool:
    pid = int(owner["pid"])
    return pid_alive(pid) and owner.get("started") in (None, start_time(pid))


def stale_lock_state(workdir: Path) -> tuple[str, list[int]]:
    """`none` (no lock), `held` (a Snakemake of this host runs here: pids), `elsewhere` (the locking run recorded
    another host: pid there), `stale` (certainly stale), `unknown`."""
    if not lock_files(workdir):
        return "none", []
    owner = read_owner(workdir)
    if owner is not None and owner["host"] != socket.gethostname():
        return "elsewhere", [int(owner["pid"])]
    pids = other_snakemakes(workdir)
    if owner is not None and int(owner["pid"]) != os.getpid() and _owner_alive(owner):
        pids = sorted({*(pids or []), int(owner["pid"])})
    if pids is None:
        return "unknown", []
    return ("held", pids) if pids else ("stale", [])


def clear_stale_locks(workdir: Path = Path("."), *, out=None, record: bool = True) -> str:
    """Remove the Snakemake locks of `workdir` when they are certainly stale; say what was done. Returns the state.
    With `record`, and no lock left, this process is recorded as the run about to lock (`record_owner`)."""
    out = out if out is not None else sys.stderr
    state, pids = stale_lock_state(workdir)
    if state == "stale":
        for path in lock_files(workdir):
            path.unlink(missing_ok=True)
        print("gymforge: removed a stale Snakemake lock (.snakemake/locks/) left by a run that was killed: no "
              "other snakemake process runs in this directory", file=out)
    elif state == "elsewhere":
        owner = read_owner(workdir) or {}
        print(f"gymforge: .snakemake/locks/ belongs to a run on host {owner.get('host')} (pid {pids[0]}), which "
              f"this host cannot check; left alone. If that run is dead, clear it with: {UNLOCK}", file=out)
    elif state == "unknown":
        print(f"gymforge: .snakemake/locks/ exists; if no other Snakemake runs in this directory (a run was killed), "
              f"clear it with: {UNLOCK}", file=out)
    if record and state in ("none", "stale"):
        try:
            record_owner(workdir)
        except OSError:
            pass  # a read-only checkout (a dry run): nothing will lock
    return state
