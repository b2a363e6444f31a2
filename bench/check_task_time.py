"""CPU-seconds and wall time of `gymforge check-task`, with the evaluator probes batched (a task's probes share one
scorer sandbox where the backend and the task allow) and, in the same run (`--compare`), with only a CSV task's probes
batched (as before Python and model tasks batched) and with one sandbox per probe.

    python bench/check_task_time.py [--results results] [--limit N] [--compare] [--rounds R]

The tasks: every task a finished run verified (`results/environments/<slot>/verified/mlgym`), or with
`--results -` (the default when there is no finished run) the built-in suite's tasks that have no post-training
model (graphColoring, gridNavigation, blobClustering, signalDenoising, kernelDensityBandwidth). Each is installed,
its baseline run and every probe evaluated, exactly as the command does, in a forked process that has made itself
the subreaper of everything it starts: a bubblewrap sandbox's init, which outlives the bwrap that started it and
would be reaped by the machine's init, is reaped by that process, so its CPU counts (`getrusage`, the process and
every descendant it reaped). One line per task and mode; then the total CPU-seconds per mode and, with `--compare`,
the ratios of batched to one by one and to CSV only. The modes alternate task by task, so a busy machine weighs on both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gymforge.tasks.scoring import Scoring
from gymforge.tools.check_task import check_task

MODES = ("batched", "csv_only", "one_by_one")  # csv_only: only a CSV task's probes share a sandbox (as until #42)


def _reap_all() -> None:
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def measure(task_yaml: Path, root: Path, mode: str, extra: dict) -> dict:
    """check-task on `task_yaml` in a forked subreaper process: its CPU-seconds (user + system, descendants
    included), wall seconds, probe count and verdict."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the measured process
        os.close(read)
        code = 1
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
            if mode == "one_by_one":
                Scoring.batches = lambda self: False  # what every probe got before probes shared a sandbox
            elif mode == "csv_only":
                batches = Scoring.batches
                Scoring.batches = lambda self: batches(self) and self.installed.task.task_entrypoint == "CSVSubmissionTasks"
            before = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
            started = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="check-task-bench-") as scratch:
                report = check_task(task_yaml, root, Path(scratch), sandbox="local", gpus=0, **extra)
            wall = time.monotonic() - started
            _reap_all()
            after = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
            cpu = sum(a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime for a, b in zip(after, before, strict=True))
            result = {"cpu_s": cpu, "wall_s": wall, "probes": len(report.probes), "entrypoint": report.entrypoint,
                      "gameable": [p.name for p in report.gameable_probes]}
            os.write(write, json.dumps(result).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or not data:
        raise SystemExit(f"check-task failed on {task_yaml}")
    return json.loads(data)


def tasks(results: str, limit: int | None) -> list[tuple[str, Path, Path, dict]]:
    """(name, task yaml, task root, check_task's extra arguments) of the tasks to time."""
    found = []
    if results != "-":
        from gymforge.core.records import VerificationReport

        for path in sorted(Path(results).glob("environments/t*/report.json")):
            report = VerificationReport.model_validate_json(path.read_text())
            if report.status != "ok":
                continue
            tree = path.parent / "verified" / "mlgym"
            found.append((f"{path.parent.name}/{report.task_id}", next((tree / "configs" / "tasks").glob("*.yaml")),
                          tree, {"hidden_columns": report.hidden_columns, "metric": report.metric,
                                 "higher_is_better": report.higher_is_better}))
    else:
        from gymforge.benchmark.suite import load_benchmark
        from gymforge.core.config import GymforgeConfig

        for task in load_benchmark(GymforgeConfig().evaluate):
            if "Posttrain" not in task.id:  # those need a base model and generate with it
                found.append((task.id, task.task_yaml, task.root, {}))
    return found[:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=None, help="a finished run's results directory; '-': the built-in "
                        "suite (the default when ./results has no verified task)")
    parser.add_argument("--limit", type=int, default=None, help="check at most this many tasks")
    parser.add_argument("--compare", action="store_true", help="also time each task with one sandbox per probe")
    parser.add_argument("--rounds", type=int, default=1, help="time each task and mode this many times (medians)")
    args = parser.parse_args()
    results = args.results or ("results" if any(Path("results").glob("environments/t*/report.json")) else "-")
    todo = tasks(results, args.limit)
    if not todo:
        raise SystemExit(f"no verified task under {results}/environments: run `make run` first, or --results -")
    modes = MODES if args.compare else MODES[:1]
    totals = {m: 0.0 for m in modes}
    for name, task_yaml, root, extra in todo:
        runs = {m: [] for m in modes}
        for _ in range(args.rounds):
            for mode in modes:
                runs[mode].append(measure(task_yaml, root, mode, extra))
        for mode in modes:
            cpu = statistics.median(r["cpu_s"] for r in runs[mode])
            wall = statistics.median(r["wall_s"] for r in runs[mode])
            last = runs[mode][-1]
            totals[mode] += cpu
            verdict = "GAMEABLE: " + ", ".join(last["gameable"]) if last["gameable"] else "passes"
            print(f"{name:<40} {last['entrypoint']:<22} {last['probes']:>3} probes {mode:<10} {cpu:7.2f} CPU-s "
                  f"{wall:6.1f} s wall  {verdict}", flush=True)
    line = ", ".join(f"{m} {totals[m]:.1f} CPU-s ({totals[m] / len(todo):.2f} per check)" for m in modes)
    print(f"{len(todo)} tasks, {args.rounds} round(s): {line}")
    if args.compare:
        print(f"ratio batched / one by one: {totals['batched'] / totals['one_by_one']:.3f}; batched / CSV only: "
              f"{totals['batched'] / totals['csv_only']:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
