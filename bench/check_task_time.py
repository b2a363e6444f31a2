"""Time `gymforge check-task` on every task a finished run verified, and say whether each passes.

    python bench/check_task_time.py [--results results] [--root-limit N]

Each verified task (`results/environments/<slot>/verified/mlgym`) is installed, its baseline run and every probe
evaluated, exactly as the command does; the script prints one line per task (probes, wall seconds, verdict) and
the median and maximum wall time. Run it on an idle machine: the figure in docs/integrity.md comes from here.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from gymforge.core.records import VerificationReport
from gymforge.tools.check_task import check_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="results", type=Path)
    parser.add_argument("--limit", type=int, default=None, help="check at most this many tasks")
    args = parser.parse_args()
    reports = sorted(args.results.glob("environments/t*/report.json"))
    verified = [(p.parent, VerificationReport.model_validate_json(p.read_text())) for p in reports]
    verified = [(d, r) for d, r in verified if r.status == "ok"][: args.limit]
    if not verified:
        raise SystemExit(f"no verified task under {args.results}/environments: run `make run` first")
    times, gameable = [], []
    for folder, report in verified:
        tree = folder / "verified" / "mlgym"
        task_yaml = next((tree / "configs" / "tasks").glob("*.yaml"))
        with tempfile.TemporaryDirectory(prefix="check-task-bench-") as scratch:
            started = time.monotonic()
            result = check_task(task_yaml, tree, Path(scratch), gpus=0, hidden_columns=report.hidden_columns,
                                metric=report.metric, higher_is_better=report.higher_is_better)
            wall = time.monotonic() - started
        times.append(wall)
        verdict = "GAMEABLE: " + ", ".join(p.name for p in result.gameable_probes) if result.gameable else "passes"
        if result.gameable:
            gameable.append(report.task_id)
        print(f"{folder.name} {report.task_id:<44} {result.entrypoint:<22} {len(result.probes):>3} probes "
              f"{wall:6.1f} s  {verdict}", flush=True)
    print(f"{len(times)} tasks: median {statistics.median(times):.1f} s, max {max(times):.1f} s per task "
          f"(install, baseline and every probe); gameable: {len(gameable)}")


if __name__ == "__main__":
    main()
