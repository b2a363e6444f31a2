"""Where a command's CPU goes, every process counted: the command runs under Linux process accounting, and each
process that ended during the run is charged to a kind.

    python bench/suite_cpu.py -- .venv/bin/pytest -q -n 3 --dist loadgroup -m "not slow"

`pytest --cpu-durations` (tests/cpu_time.py) counts a test's own process and the children it waited for. It misses
bubblewrap sandboxes: bwrap's init of the new pid namespace outlives the bwrap process that started it and is reaped
by the machine's init, so its CPU never reaches the test (`/usr/bin/time bwrap --unshare-pid ... python -c "import
sklearn"` reports 0 s). It also misses docker containers and daemons. Process accounting (`accton`, Debian package
`acct`, root only) records every process at exit, wherever it was reaped. Printed:
- the wall time, and the machine's busy CPU-seconds over the run (/proc/stat);
- CPU per kind of process: the command and its direct children (pytest and its xdist workers), processes inside
  bubblewrap, unshare and docker sandboxes, other processes the command started (Snakemake, CLI runs, training),
  and processes outside the command (other work on the machine: the run is honest only when this is ~0);
- what the accounting cannot see: processes still running at the end (the docker daemon) and the kernel's own
  threads, as busy CPU minus the ended processes;
- the commands that used the most CPU inside each kind.
Accounting is machine-wide: run one measurement at a time (the second `accton` would redirect the first's records).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from quickstart import busy_jiffies  # bench/ is on the path of a script run from it

TICKS = 100  # acct v3 times and /proc/stat's jiffies both count 100 per second on Linux
SANDBOXES = {"bwrap": "bubblewrap sandboxes", "unshare": "unshare sandboxes", "containerd-shim": "docker containers",
             "runc": "docker containers"}
DOCKER_DAEMONS = {"dockerd", "containerd"}


@dataclass(frozen=True)
class Process:
    comm: str
    cpu_s: float
    pid: int
    ppid: int


def read_accounting(path: Path) -> list[Process]:
    """The records of an acct v3 file, through `dump-acct` (columns: comm|version|utime|stime|etime|uid|gid|mem|io|
    pid|ppid|...)."""
    out = subprocess.run(["dump-acct", str(path)], capture_output=True, text=True, check=True).stdout
    processes = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) > 10:
            processes.append(Process(f[0], (float(f[2]) + float(f[3])) / TICKS, int(f[9]), int(f[10])))
    return processes


def kind_of(processes: list[Process], root: int) -> dict[int, str]:
    """pid -> kind. A process is inside a sandbox when it or an ancestor is a sandbox launcher (bwrap's pid-namespace
    init, reparented to the machine's init, included); else the command's own when it is the command or one of its
    direct children (pytest's xdist workers); else started by the command when `root` is an ancestor; else outside."""
    by_pid = {p.pid: p for p in processes}
    kinds: dict[int, str] = {}

    def classify(pid: int) -> str:
        if pid not in kinds:
            p = by_pid[pid]
            if p.comm in SANDBOXES:
                kinds[pid] = SANDBOXES[p.comm]
            elif pid == root or p.ppid == root:
                kinds[pid] = "the command and its direct children"
            elif p.ppid in by_pid:
                parent = classify(p.ppid)
                kinds[pid] = "started by the command" if parent == "the command and its direct children" else parent
            else:  # the parent was still running at the end
                kinds[pid] = _living_parent(p.ppid, root)
        return kinds[pid]

    for pid in by_pid:
        classify(pid)
    return kinds


def _living_parent(pid: int, root: int) -> str:
    """The kind of a child of `pid`, a process still running at the end: docker's daemons start the containers'
    helpers; a descendant of `root` was started by the command; anything else is outside it."""
    try:
        if Path(f"/proc/{pid}/comm").read_text().strip() in DOCKER_DAEMONS:
            return "docker containers"
    except OSError:
        pass
    while pid > 1:
        if pid == root:
            return "started by the command"
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return "outside the command"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=4, help="commands shown per kind")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    if os.geteuid() != 0 or not shutil.which("accton") or not shutil.which("dump-acct"):
        sys.exit("needs root and the `acct` package (apt-get install acct): process accounting is root's")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "pacct"
        log.touch()
        subprocess.run(["accton", str(log)], check=True, capture_output=True)
        busy0, total0 = busy_jiffies()
        started = time.monotonic()
        try:
            proc = subprocess.Popen(command)
            rc = proc.wait()
        finally:
            wall = time.monotonic() - started
            busy1, total1 = busy_jiffies()
            subprocess.run(["accton", "off"], check=True, capture_output=True)
        processes = read_accounting(log)
    kinds = kind_of(processes, proc.pid)
    cpu: dict[str, float] = defaultdict(float)
    count: Counter = Counter()
    commands: dict[str, Counter] = defaultdict(Counter)
    for p in processes:
        cpu[kinds[p.pid]] += p.cpu_s
        count[kinds[p.pid]] += 1
        commands[kinds[p.pid]][p.comm] += p.cpu_s
    busy, available = (busy1 - busy0) / TICKS, (total1 - total0) / TICKS
    ended = sum(cpu.values())
    print(f"\n{' '.join(command)}: rc {rc}, {wall:.0f} s wall; the machine {busy:.0f} busy CPU-s of {available:.0f} "
          f"({available / wall:.1f} cores, {100 * busy / max(available, 1e-9):.0f}% busy); {len(processes)} processes "
          f"ended, {ended:.0f} CPU-s")
    for kind, seconds in sorted(cpu.items(), key=lambda kv: -kv[1]):
        top = ", ".join(f"{c} {s:.0f}" for c, s in commands[kind].most_common(args.top))
        print(f"  {seconds:7.1f} CPU-s  {kind:<36} {count[kind]:6d} processes ({top})")
    print(f"  {busy - ended:7.1f} CPU-s  {'not ended or the kernel':<36} {'':>16}(daemons still running, kernel "
          "threads)")
    sys.exit(rc)


if __name__ == "__main__":
    main()
