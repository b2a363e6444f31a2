"""CPU of `gymforge import-trajectories` per example unit, measured in one run: `request` against `conversation`.

    MLGYM_ROOT=<checkout> .venv/bin/python bench/request_import.py [--every K] [--whole] [--tokenizer DIR]

Imports MLGym's released runs (`$MLGYM_ROOT/trajectories`, as a user would import them; `--every K`: a copy of every K-th run folder
in name order, for a quicker look) once per unit, each import in a fresh process running the command as
a user does (`gymforge import-trajectories ... --unit U`), and prints each one's CPU-seconds (user + system of the
process and its threads), wall time, examples, and the ratio request / conversation. `--whole` adds a third import:
`request` with every request tokenized whole (`filter_examples(reuse_turns=False)`, the way before
`gymforge.student.turn_cache`), and checks that its `train.jsonl` and `stats.json` equal the cached import's byte for
byte. Without `--tokenizer` the offline student's tokenizer is built first (not timed). Run it on an idle machine:
the imports are single-threaded but the tokenizer's batches may use a second core.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WHOLE = """
import sys
from pathlib import Path
from gymforge.core.config import config_or_defaults
from gymforge.agent.sources import import_candidates
from gymforge.stages.sft import filter_examples
src, tok, out = map(Path, sys.argv[1:4])
filter_examples(config_or_defaults(None), import_candidates(src), tok, jsonl_out=out / "train.jsonl",
                dataset_out=out / "dataset", rollouts_out=out / "rollouts.jsonl", stats_out=out / "stats.json",
                unit="request", reuse_turns=False)
"""


def _link(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def timed(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """CPU-seconds (user + system, the child and its threads) and wall seconds of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd[:3])}... failed:\n{proc.stderr[-3000:]}")
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=None, help="an MLGym checkout (default $MLGYM_ROOT)")
    parser.add_argument("--every", type=int, default=1, help="import every K-th run folder (default: all)")
    parser.add_argument("--whole", action="store_true", help="also import `request` tokenizing each request whole")
    parser.add_argument("--tokenizer", type=Path, default=None, help="the student's tokenizer (default: offline)")
    args = parser.parse_args()
    root = args.root or (Path(os.environ["MLGYM_ROOT"]) if os.environ.get("MLGYM_ROOT") else None)
    if root is None:
        sys.exit("set MLGYM_ROOT to an MLGym checkout or pass --root")
    runs = sorted({p.parent for p in (root / "trajectories").rglob("*.traj")})[:: args.every]
    if not runs:
        sys.exit(f"no .traj files under {root / 'trajectories'}")
    gymforge = Path(sys.executable).with_name("gymforge")
    with tempfile.TemporaryDirectory(prefix="request-import-") as tmp:
        work = Path(tmp)
        sample = root / "trajectories"
        if args.every > 1:  # the selected run folders side by side (hard links where the file system allows)
            sample = work / "runs"
            for run in runs:
                shutil.copytree(run, sample / run.name, copy_function=_link)
        tokenizer = args.tokenizer
        if tokenizer is None:
            from gymforge.core.prompts import templates_dir
            from gymforge.student.tokenizer import build_tokenizer

            tokenizer = build_tokenizer("offline", work / "tokenizer", templates_dir(), [])
        rows = []
        for unit in ("conversation", "request"):
            cpu, wall = timed([str(gymforge), "import-trajectories", str(sample), "--out", str(work / unit),
                               "--tokenizer", str(tokenizer), "--unit", unit], cwd=work)
            examples = sum(1 for _ in (work / unit / "train.jsonl").open())
            rows.append((unit, cpu, wall, examples))
            print(f"{unit:>22}: {cpu:8.1f} CPU-s {wall:8.1f} s wall {examples:7d} examples", flush=True)
        if args.whole:
            cpu, wall = timed([sys.executable, "-c", WHOLE, str(sample), str(tokenizer), str(work / "whole")],
                              cwd=work)
            examples = sum(1 for _ in (work / "whole" / "train.jsonl").open())
            rows.append(("request, each whole", cpu, wall, examples))
            print(f"{'request, each whole':>22}: {cpu:8.1f} CPU-s {wall:8.1f} s wall {examples:7d} examples")
            for name in ("train.jsonl", "stats.json", "rollouts.jsonl"):
                same = (work / "whole" / name).read_bytes() == (work / "request" / name).read_bytes()
                print(f"{name}: {'identical' if same else 'DIFFERENT'} (request cached vs whole)")
                if not same:
                    sys.exit(1)
        conversation, request = rows[0][1], rows[1][1]
        print(f"{len(runs)} run folders; request / conversation CPU: {request / conversation:.2f}"
              + (f"; whole / cached request CPU: {rows[2][1] / request:.2f}" if args.whole else ""))


if __name__ == "__main__":
    main()
