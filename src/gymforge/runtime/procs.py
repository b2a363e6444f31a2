"""Process liveness, for the records that name their owner by pid (LLM budget reservations, sandbox disks)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (on this host); one owned by another user counts."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def start_time(pid: int) -> float | None:
    """When a process started, in clock ticks since boot (Linux; None elsewhere or when it is gone): a pid recorded
    with its start time is known to be recycled when the start time differs."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    return float(stat.rsplit(")", 1)[1].split()[19])
