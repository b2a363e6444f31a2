"""Stale Snakemake locks: a run killed with `kill -9` leaves `.snakemake/locks/` behind, and Snakemake then refuses
every later run of the workflow ("Directory cannot be locked") until `snakemake --unlock`.

The Snakefile calls `clear_stale_locks()` while it is parsed, before Snakemake checks its locks. A lock is certainly
stale when no other Snakemake process runs in the working directory (read from /proc); then it is removed, with a
note. Where that cannot be known (no /proc, or a process whose working directory is not readable), nothing is
removed and the note names the one command that clears the lock.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

UNLOCK = "snakemake --unlock"


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


def stale_lock_state(workdir: Path) -> tuple[str, list[int]]:
    """`none` (no lock), `held` (another Snakemake runs here: pids), `stale` (certainly stale), `unknown`."""
    if not lock_files(workdir):
        return "none", []
    pids = other_snakemakes(workdir)
    if pids is None:
        return "unknown", []
    return ("held", pids) if pids else ("stale", [])


def clear_stale_locks(workdir: Path = Path("."), *, out=None) -> str:
    """Remove the Snakemake locks of `workdir` when they are certainly stale; say what was done. Returns the state."""
    out = out if out is not None else sys.stderr
    state, _pids = stale_lock_state(workdir)
    if state == "stale":
        for path in lock_files(workdir):
            path.unlink(missing_ok=True)
        print("gymforge: removed a stale Snakemake lock (.snakemake/locks/) left by a run that was killed: no "
              "other snakemake process runs in this directory", file=out)
    elif state == "unknown":
        print(f"gymforge: .snakemake/locks/ exists; if no other Snakemake runs in this directory (a run was killed), "
              f"clear it with: {UNLOCK}", file=out)
    return state
