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
- the commands that used the most CPU inside each kind, with their process counts. Accounting records only a
  process's 16-byte name (every Python process is `python3`), so a thread samples the command lines of new
  processes from /proc every 50 ms and labels each process by what it ran (`command_label`): a gymforge verb, a
  Python script's file name, `python -c`, `python -m MODULE`. A process that lived less than the interval may be
  missed and keeps its name.
Accounting is machine-wide: run one measurement at a time (the second `accton` would redirect the first's records).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
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


class CommandLines(threading.Thread):
    """The argv of each process that appears while it runs, read from /proc every `interval` seconds when a pid is
    new since the last look and once more at the next one (a fork shows its parent's argv until it execs; reading
    every process's cmdline each time would itself load the machine). A pid used again later (pids wrap at 32,768
    here) gets a second entry. A process that execs later than that keeps the argv it had then."""

    def __init__(self, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.argv: dict[int, list[list[str]]] = defaultdict(list)
        self._done = threading.Event()

    def run(self) -> None:
        before: set[int] = set()
        fresh: set[int] = set()  # seen for the first time at the last look: maybe forked and not yet exec'd
        while not self._done.is_set():
            now = {int(n) for n in os.listdir("/proc") if n.isdigit()}
            for pid in fresh & now:  # read again: the argv after the exec that usually follows a fork at once
                if argv := self._read(pid):
                    self.argv[pid][-1] = argv
            fresh = set()
            for pid in now - before:
                if argv := self._read(pid):  # kernel threads and zombies have none
                    self.argv[pid].append(argv)
                    fresh.add(pid)
            before = now
            self._done.wait(self.interval)

    @staticmethod
    def _read(pid: int) -> list[str]:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return []
        return raw.rstrip(b"\0").decode(errors="replace").split("\0") if raw else []

    def stop(self) -> None:
        self._done.set()
        self.join()

    def labels(self, processes: list[Process]) -> list[str]:
        """`command_label` of each process, in order. Accounting writes a record when a process ends, so the
        records of one pid come in the order its argvs were seen."""
        used: Counter = Counter()
        out = []
        for p in processes:
            seen = self.argv.get(p.pid, [])
            argv = seen[min(used[p.pid], len(seen) - 1)] if seen else []
            used[p.pid] += 1
            out.append(command_label(argv, p.comm))
        return out


PYTHON = re.compile(r"python[\d.]*$")
VERB = re.compile(r"[a-z][a-z0-9-]*$")


def command_label(argv: list[str], comm: str) -> str:
    """What a process ran, in a few words: `gymforge VERB` (through `with-gpus`, the command it wraps), a Python
    script's file name (`baseline.py`, `snakemake`), `python -c`, `python -m MODULE`; else its accounting name."""
    if not argv:
        return comm
    if PYTHON.search(os.path.basename(argv[0])):
        args = argv[1:]
        while args and args[0].startswith("-") and args[0] not in ("-c", "-m"):
            args = args[1:]  # interpreter flags (-u, -I, -X x are not used by what gymforge starts)
        if not args:
            return "python"
        if args[0] == "-c":
            return "python -c"
        if args[0] == "-m":
            if args[1:2] == ["gymforge"]:
                return _gymforge_verb(args[2:])
            return f"python -m {args[1]}" if len(args) > 1 else "python -m"
        return os.path.basename(args[0])
    if os.path.basename(argv[0]) == "gymforge":
        return _gymforge_verb(argv[1:])
    return comm


def _gymforge_verb(args: list[str]) -> str:
    """`gymforge [--log FILE] VERB ...`; `with-gpus N -- COMMAND` is labelled by COMMAND."""
    while args[:1] == ["--log"]:
        args = args[2:]
    if args[:1] == ["with-gpus"] and "--" in args:
        return command_label(args[args.index("--") + 1:], "gymforge")
    verb = next((a for a in args if not a.startswith("-")), "")
    return f"gymforge {verb}" if VERB.match(verb) else "gymforge"


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
    parser.add_argument("--top", type=int, default=6, help="commands shown per kind")
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
        lines = CommandLines()
        lines.start()
        try:
            proc = subprocess.Popen(command)
            rc = proc.wait()
        finally:
            wall = time.monotonic() - started
            busy1, total1 = busy_jiffies()
            subprocess.run(["accton", "off"], check=True, capture_output=True)
            lines.stop()
        processes = read_accounting(log)
    kinds = kind_of(processes, proc.pid)
    cpu: dict[str, float] = defaultdict(float)
    commands: dict[str, Counter] = defaultdict(Counter)
    runs: dict[str, Counter] = defaultdict(Counter)
    for p, what in zip(processes, lines.labels(processes), strict=True):
        cpu[kinds[p.pid]] += p.cpu_s
        commands[kinds[p.pid]][what] += p.cpu_s
        runs[kinds[p.pid]][what] += 1
    busy, available = (busy1 - busy0) / TICKS, (total1 - total0) / TICKS
    ended = sum(cpu.values())
    print(f"\n{' '.join(command)}: rc {rc}, {wall:.0f} s wall; the machine {busy:.0f} busy CPU-s of {available:.0f} "
          f"({available / wall:.1f} cores, {100 * busy / max(available, 1e-9):.0f}% busy); {len(processes)} processes "
          f"ended, {ended:.0f} CPU-s")
    for kind, seconds in sorted(cpu.items(), key=lambda kv: -kv[1]):
        top = ", ".join(f"{c} {s:.0f} ({runs[kind][c]})" for c, s in commands[kind].most_common(args.top))
        print(f"  {seconds:7.1f} CPU-s  {kind:<36} {sum(runs[kind].values()):6d} processes ({top})")
    print(f"  {busy - ended:7.1f} CPU-s  {'not ended or the kernel':<36} {'':>16}(daemons still running, kernel "
          "threads)")
    sys.exit(rc)


if __name__ == "__main__":
    main()
