"""Time `make run`'s workflow from a clean results directory: wall time, the machine's CPU use, and per rule
its jobs, summed wall time and when it ran.

    python bench/quickstart.py [--cores 2] [--keep]

Runs `snakemake --profile profiles/default --cores N` in the checkout after moving any existing `results/`
aside (restored afterwards unless --keep), exactly the command `make run` runs once its venv exists. Prints
- the wall time, and the machine's CPU use over the run (/proc/stat, every process: a child's rusage misses
  the sandboxed processes bubblewrap reaps, so the figure is honest only on an otherwise idle machine, which
  the load average at the start tells);
- per rule, from the run's Snakemake log: the jobs, their summed wall time, and when its first job started
  and its last one finished (minutes from the start), so the serial stretches of the run (one SFT job) show.
The README's quick-start figure comes from here, on an idle machine, from a fresh clone (add the venv's setup
time, `make setup`, measured apart).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$")
STARTED = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")


def busy_jiffies() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the machine since boot (/proc/stat's first line)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def rule_timeline(log: Path) -> dict[str, tuple[int, float, float, float]]:
    """Rule -> (jobs, summed wall seconds, first start, last finish) from a Snakemake log; times in seconds from
    the log's first timestamp (whole seconds: Snakemake logs no finer)."""
    stamp: datetime | None = None
    origin: datetime | None = None
    rule_of: dict[str, str] = {}
    started: dict[str, datetime] = {}
    pending: str | None = None
    table: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, float("inf"), 0.0])
    for line in log.read_text().splitlines():
        if m := STAMP.match(line):
            stamp = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
            origin = origin or stamp
        elif (m := STARTED.match(line)) and stamp is not None:
            pending = m.group(1)
        elif (m := JOBID.match(line)) and pending is not None and stamp is not None:
            rule_of[m.group(1)], started[m.group(1)], pending = pending, stamp, None
        elif (m := FINISHED.match(line)) and stamp is not None and m.group(1) in started:
            assert origin is not None
            entry = table[m.group(2)]
            entry[0] += 1
            entry[1] += (stamp - started[m.group(1)]).total_seconds()
            entry[2] = min(entry[2], (started[m.group(1)] - origin).total_seconds())
            entry[3] = max(entry[3], (stamp - origin).total_seconds())
    return {k: (int(v[0]), v[1], v[2], v[3]) for k, v in table.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="leave the new results/ (and drop the old one)")
    args = parser.parse_args()
    results, aside = ROOT / "results", ROOT / "results.before-quickstart"
    if aside.exists():
        raise SystemExit(f"{aside} exists: a previous run was interrupted; restore or remove it first")
    if results.exists():
        results.rename(aside)
    shutil.rmtree(ROOT / ".snakemake", ignore_errors=True)
    snakemake = Path(sys.executable).parent / "snakemake"
    command = [str(snakemake), "--profile", "profiles/default", "--cores", str(args.cores)]
    load = os.getloadavg()[0]
    busy0, total0 = busy_jiffies()
    started = time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    busy1, total1 = busy_jiffies()
    share = (busy1 - busy0) / max(1, total1 - total0)  # of all the machine's CPUs
    try:
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-3000:])
            raise SystemExit(f"snakemake failed (rc {proc.returncode}) after {wall:.0f} s")
        log = max((ROOT / ".snakemake" / "log").glob("*.snakemake.log"), key=lambda p: p.stat().st_mtime)
        cpus = os.cpu_count() or 1
        print(f"command: {' '.join(command)} (from a clean results/; {cpus} CPUs here, load {load:.2f} at the start)")
        print(f"wall {wall / 60:.1f} min ({wall:.0f} s); the machine's CPUs {share:.0%} busy "
              f"({share * cpus * wall:.0f} CPU-seconds, every process)")
        print(f"{'rule':<22} {'jobs':>4} {'wall (sum)':>11} {'first start':>12} {'last end':>9}  (minutes from the start)")
        for name, (jobs, w, first, last) in sorted(rule_timeline(log).items(), key=lambda kv: kv[1][2]):
            print(f"{name:<22} {jobs:>4} {w:>10.0f}s {first / 60:>12.1f} {last / 60:>9.1f}")
    finally:
        if not args.keep and aside.exists():
            shutil.rmtree(results, ignore_errors=True)
            aside.rename(results)
        elif args.keep and aside.exists():
            shutil.rmtree(aside)


if __name__ == "__main__":
    main()
