"""runtime.procs: whether a recorded owner pid is still the process that wrote the record."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gymforge.runtime.procs import pid_alive, start_time


def test_a_live_process_is_alive_and_an_ended_one_is_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert pid_alive(os.getpid())
    assert not pid_alive(child.pid)  # reaped: no process has its pid (until the kernel reuses it)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="start times come from Linux's /proc")
def test_start_time_tells_a_recycled_pid_apart() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mine, theirs = start_time(os.getpid()), start_time(child.pid)
        assert mine is not None and theirs is not None
        assert theirs >= mine and start_time(os.getpid()) == mine  # stable for one process
    finally:
        child.kill()
        child.wait()
    assert start_time(child.pid) is None
