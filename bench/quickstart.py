"""Time `make run`'s workflow from a clean results directory: wall time, CPU use and the slowest rules.

    python bench/quickstart.py [--cores 2] [--keep]

Runs `snakemake --profile profiles/default --cores N` in the checkout after moving any existing `results/`
aside (restored afterwards unless --keep), exactly the command `make run` runs once its venv exists. Prints
the wall time, the CPU time of all jobs (from the children's rusage) and its share of what the cores could
give, and the five rule groups with the most summed wall time in the jobs' Snakemake benchmark files
(`results/benchmarks/**.tsv`: wall and CPU seconds per job). The README's quick-start figure comes from here,
on an idle machine, from a fresh clone (add the venv's setup time, `make setup`, measured apart).
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rule_group(tsv: Path, benchmarks: Path) -> str:
    """`environments/t0003.tsv` -> `environments`; `scores/runs/teacher/x.tsv` -> `scores/runs`."""
    parts = tsv.relative_to(benchmarks).parts
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def benchmark_table(benchmarks: Path) -> dict[str, tuple[int, float, float]]:
    """Rule group -> (jobs, summed wall seconds, summed CPU seconds)."""
    table: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for tsv in benchmarks.rglob("*.tsv"):
        with tsv.open() as fh:
            for row in csv.DictReader(fh, delimiter="\t"):
                entry = table[rule_group(tsv, benchmarks)]
                entry[0] += 1
                entry[1] += float(row["s"])
                entry[2] += float(row.get("cpu_time") or 0.0)
    return {k: (int(v[0]), v[1], v[2]) for k, v in table.items()}


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
    started = time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    table = benchmark_table(results / "benchmarks")
    try:
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-3000:])
            raise SystemExit(f"snakemake failed (rc {proc.returncode}) after {wall:.0f} s")
        print(f"command: {' '.join(command)} (from a clean results/, {os.cpu_count()} CPUs here)")
        print(f"wall {wall / 60:.1f} min ({wall:.0f} s); CPU {cpu:.0f} s = {cpu / wall:.0%} of one core, "
              f"{cpu / (wall * args.cores):.0%} of the {args.cores} cores")
        print(f"{'rule group':<22} {'jobs':>4} {'wall (sum)':>11} {'CPU (sum)':>10} {'CPU/wall':>8}")
        for name, (jobs, w, c) in sorted(table.items(), key=lambda kv: -kv[1][1])[:5]:
            print(f"{name:<22} {jobs:>4} {w:>10.0f}s {c:>9.0f}s {c / w if w else 0:>8.2f}")
    finally:
        if not args.keep and aside.exists():
            shutil.rmtree(results, ignore_errors=True)
            aside.rename(results)
        elif args.keep and aside.exists():
            shutil.rmtree(aside)


if __name__ == "__main__":
    main()
