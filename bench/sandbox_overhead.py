"""What the hardened sandbox and evaluation cost: a validate and a trivial command, before vs after.

Runs the same measurement twice in one go: with the code of BEFORE (default: the last commit before the
hardening of issue #12, checked out into a temporary git worktree) and with this checkout, each in its own
interpreter, then prints the medians and the ratios after/before. On every built-in task of one CSV and one
Python entrypoint: `validate` = one evaluation of the baseline's artefact (TaskEnvironment.evaluate, which
the agent's `validate` calls), `trivial` = `true` in an open session.

    python bench/sandbox_overhead.py [--repeats 7] [--before 759ebab]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("blobClustering", "graphColoring")

MEASURE = r"""
import json, statistics, sys, tempfile, time
from pathlib import Path
try:
    from gymforge.tasks.environment import TaskEnvironment
except ImportError:  # the code before the layout of issue #15
    from gymforge.environment import TaskEnvironment
from gymforge.sandbox import Limits, get_sandbox
root, task, repeats = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
env = TaskEnvironment(root / "configs/tasks" / f"{task}.yaml", root=root, sandbox=get_sandbox("local"),
                      run_dir=Path(tempfile.mkdtemp()), limits=Limits())
env.install()
env.run_baseline()
validate, trivial = [], []
for _ in range(repeats):
    t = time.perf_counter(); env.evaluate(); validate.append(time.perf_counter() - t)
with env.open_session() as s:
    for _ in range(repeats):
        t = time.perf_counter(); s.run("true", timeout=30); trivial.append(time.perf_counter() - t)
print(json.dumps({"validate": statistics.median(validate), "trivial": statistics.median(trivial)}))
"""


def measure(src: Path, task: str, repeats: int) -> dict[str, float]:
    tasks = ROOT / "src" / "gymforge" / "benchmark" / "tasks"  # the same task files for both
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", MEASURE, str(tasks), task, str(repeats)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--before", default="759ebab", help="commit of the code before the hardening")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.before],
                       check=True, capture_output=True)
        try:
            rows = []
            for task in TASKS:
                before = measure(worktree / "src", task, args.repeats)
                after = measure(ROOT / "src", task, args.repeats)
                rows.append((task, before, after))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False)
    print(f"{'task':16} {'what':9} {'before ms':>9} {'after ms':>9} {'ratio':>6}")
    for task, before, after in rows:
        for what in ("validate", "trivial"):
            b, a = before[what] * 1e3, after[what] * 1e3
            print(f"{task:16} {what:9} {b:9.1f} {a:9.1f} {a / b:6.2f}")
    ratios = [after["validate"] / before["validate"] for _, before, after in rows]
    print(f"median validate ratio (after/before): {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
