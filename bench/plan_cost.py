"""What planning costs: Snakemake's own time for gymforge's workflow against a bare workflow with as many jobs.

    python bench/plan_cost.py --finished /tmp/gf-run      # a workflow copy holding a finished run (`make run`)
    python bench/plan_cost.py --finished DIR --tiny       # DIR holds the tests' tiny run (tests/finished_run.py)
    python bench/plan_cost.py                             # builds that tiny run first (10-20 minutes)

Prints, in one run:
  (a) a no-op `snakemake --cores 2` in the finished run (nothing to do), and
  (b) `snakemake -n --configfile configs/paper-scale.yaml` with the builtin benchmark (every job planned),
each in seconds (median of --repeat runs) and as a ratio to the same command on a generated Snakefile with the
same number of trivial jobs (`touch`), so that what is left is what gymforge adds: its imports, the config's
validation, the input functions and params of its rules. Goals (issue #15): (a) under 2 s, (b) under 10 s.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
# The tests' tiny run (tests/finished_run.py): every rule of `all`, 27 jobs.
TINY = ["topics={n: 2, batch_size: 2}", "trajectories={per_task: 2, shard_size: 2, max_steps: 12}",
        "train={epochs: 1}", "evaluate={tasks: [graphColoring, signalDenoising], runs_per_task: 1, max_steps: 6}"]
BUILTIN = {"evaluate": {"benchmark": "builtin", "mlgym_root": None}}
BARE = """\
N = {n}


rule all:
    input:
        expand("out/{{i}}.txt", i=range(N)),


rule job:
    output:
        "out/{{i}}.txt",
    log:
        "logs/{{i}}.log",
    shell:
        "touch {{output}} 2> {{log}}"
"""
# The same number of jobs shaped like gymforge's per-task chain (proposal -> configs -> code -> environment ->
# rollouts): chains of STAGES rules, each job reading its predecessor's output and declaring a log and a benchmark
# file as every gymforge rule does. What gymforge costs beyond this is its own input functions, params and config.
STAGES = 5
SHAPED_RULE = """
rule s{k}:
    input:
        {input}
    output:
        "out/s{k}/{{i}}.txt",
    log:
        "logs/s{k}/{{i}}.log",
    benchmark:
        "benchmarks/s{k}/{{i}}.tsv"
    shell:
        "touch {{output}} 2> {{log}}"
"""


def shaped_snakefile(n: int) -> str:
    chains = max(1, n // STAGES)
    head = f'rule all:\n    input:\n        expand("out/s{STAGES - 1}/{{i}}.txt", i=range({chains})),\n'
    rules = [SHAPED_RULE.format(k=k, input=f'"out/s{k - 1}/{{i}}.txt",' if k else "[]")
             for k in range(STAGES)]
    return head + "".join(rules)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(args: list[str], cwd: Path) -> tuple[float, float, str]:
    """Wall and CPU seconds (user + system, the command and its children) of `snakemake <args>`, and its output."""
    cpu, started = cpu_seconds(), time.perf_counter()
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, check=False)
    elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"snakemake {' '.join(args)} failed in {cwd}:\n{proc.stderr[-3000:]}")
    return elapsed, cpu, proc.stdout + proc.stderr


def timed(args: list[str], cwd: Path, repeat: int) -> tuple[float, float, str]:
    """Median wall and CPU seconds of `repeat` runs (on a loaded machine the CPU time is the steadier number)."""
    walls, cpus, out = [], [], ""
    for _ in range(repeat):
        wall, cpu, out = run(args, cwd)
        walls.append(wall)
        cpus.append(cpu)
    return statistics.median(walls), statistics.median(cpus), out


def job_count(output: str) -> int:
    """The `total` line of `snakemake -n --quiet rules` (or of a dry run's job stats)."""
    found = re.findall(r"^total\s+(\d+)\s*$", output, re.M)
    if not found:
        raise SystemExit(f"no job count in:\n{output[-2000:]}")
    return int(found[-1])


def copy_workflow(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "config.yaml"):
        shutil.copy(REPO / name, dest / name)
    for name in ("rules", "report", "configs"):
        shutil.copytree(REPO / name, dest / name, dirs_exist_ok=True)
    return dest


def bare(dest: Path, n: int, *, finished: bool, shaped: bool = False) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "Snakefile").write_text(shaped_snakefile(n) if shaped else BARE.format(n=n))
    if finished:
        run(["--cores", "2", "--quiet", "all"], dest)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--finished", type=Path, help="a workflow directory holding a finished run (default: build "
                        "the tests' tiny run in a scratch copy)")
    parser.add_argument("--tiny", action="store_true", help="the --finished run is the tests' tiny run (made with "
                        "its --config, tests/finished_run.py)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (the median is printed)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="gf-plan-cost-"))
    extra = ["--config", *TINY] if args.tiny or args.finished is None else []
    if args.finished is None:
        args.finished = copy_workflow(scratch / "finished")
        run(["--cores", "2", *extra], args.finished)
    noop_args = ["--cores", "2", *extra]
    # the finished run's job count: what `--forceall` would run
    noop_jobs = job_count(run(["--forceall", "-n", "--quiet", "rules", *extra], args.finished)[2])
    noop = timed(noop_args, args.finished, args.repeat)
    if "Nothing to be done" not in noop[2]:
        raise SystemExit(f"the finished run in {args.finished} is not finished:\n{noop[2][-2000:]}")

    paper = copy_workflow(scratch / "paper")
    (paper / "builtin.yaml").write_text(yaml.safe_dump(BUILTIN))
    paper_args = ["-n", "--configfile", "configs/paper-scale.yaml", "builtin.yaml"]
    paper_jobs = job_count(run([*paper_args, "--quiet", "rules"], paper)[2])
    plan = timed(paper_args, paper, max(1, args.repeat - 2))

    bare_noop = timed(["--cores", "2"], bare(scratch / "bare-noop", noop_jobs, finished=True), args.repeat)
    assert "Nothing to be done" in bare_noop[2], bare_noop[2][-2000:]
    bare_plan = timed(["-n"], bare(scratch / "bare-plan", paper_jobs, finished=False), max(1, args.repeat - 2))
    shaped_noop = timed(["--cores", "2"], bare(scratch / "shaped-noop", noop_jobs, finished=True, shaped=True),
                        args.repeat)
    assert "Nothing to be done" in shaped_noop[2], shaped_noop[2][-2000:]
    shaped_plan = timed(["-n"], bare(scratch / "shaped-plan", paper_jobs, finished=False, shaped=True),
                        max(1, args.repeat - 2))

    def entry(jobs: int, ours: tuple, base: tuple, shaped: tuple, goal: float) -> dict:
        return {"jobs": jobs, "seconds": round(ours[0], 2), "cpu_seconds": round(ours[1], 2),
                "bare_seconds": round(base[0], 2), "bare_cpu_seconds": round(base[1], 2),
                "ratio": round(ours[0] / base[0], 2), "cpu_ratio": round(ours[1] / base[1], 2),
                "shaped_seconds": round(shaped[0], 2), "shaped_cpu_seconds": round(shaped[1], 2),
                "shaped_ratio": round(ours[0] / shaped[0], 2), "shaped_cpu_ratio": round(ours[1] / shaped[1], 2),
                "goal_seconds": goal}

    result = {"noop": entry(noop_jobs, noop, bare_noop, shaped_noop, 2),
              "paper_scale_dry_run": entry(paper_jobs, plan, bare_plan, shaped_plan, 10)}
    shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for name, r in (("no-op `snakemake --cores 2` after a finished run", result["noop"]),
                    ("`snakemake -n --configfile configs/paper-scale.yaml` (builtin benchmark)",
                     result["paper_scale_dry_run"])):
        print(f"{name}: {r['jobs']} jobs, {r['seconds']:.2f} s wall / {r['cpu_seconds']:.2f} s CPU (goal < "
              f"{r['goal_seconds']} s); a bare workflow with as many jobs {r['bare_seconds']:.2f} s / "
              f"{r['bare_cpu_seconds']:.2f} s CPU; ratio {r['ratio']:.2f} wall, {r['cpu_ratio']:.2f} CPU")
        print(f"    against {STAGES}-rule chains with a log and a benchmark per job (gymforge's shape): "
              f"{r['shaped_seconds']:.2f} s / {r['shaped_cpu_seconds']:.2f} s CPU; ratio {r['shaped_ratio']:.2f} "
              f"wall, {r['shaped_cpu_ratio']:.2f} CPU")


if __name__ == "__main__":
    main()
