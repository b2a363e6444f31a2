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
