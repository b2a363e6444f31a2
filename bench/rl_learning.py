"""Does offline RL learn? The RL stage of a configuration for several RL seeds, and a bootstrap interval of the rise
of its reward curve (issue #24).

    python bench/rl_learning.py                                  # configs/rl-learning.yaml, RL seeds 0 1 2, 2 cores
    python bench/rl_learning.py --seeds 0 1 2 3 --cores 1
    python bench/rl_learning.py --analyze-only                   # the curves already under --out
    python bench/rl_learning.py --directory <scratch> -- --rerun-triggers params input   # more snakemake arguments

For each seed: `snakemake --cores N rl --configfile config.yaml <config> --config 'rl={seed: <seed>}'` in the
checkout (or `--directory`), which trains the SFT student of that results directory on the configuration's micro
task (building the micro task and the student first when they are missing: a fresh checkout runs the whole offline
chain once, ~18 min on 2 cores); `rl.seed` changes the RL run's fingerprint, so every seed starts over from the SFT
checkpoint. Its `curve.json`, its episodes (`.work/episodes/`), their trajectories and wall time are copied to
`<out>/seed_<seed>/`.
The configuration's own `rl.seed` runs last, so that the RL checkpoint left in `results/rl/` is the one that
`snakemake --configfile config.yaml <config> scores` scores (with `student-rl` in `evaluate.models`).

Prints per seed the reward curve (mean reward per iteration), the mean reward of its first and last quarter of
iterations (a quarter: max(1, iterations // 4), as in `curve.json`) and their difference; then the difference
pooled over seeds (the mean of the per-seed differences) with a 95% percentile-bootstrap interval: each replicate
resamples, within every seed and quarter, the quarter's iterations with replacement and then each drawn iteration's
episodes with replacement (two-stage: the noise of an iteration's episodes and the swings between iterations),
recomputes each seed's difference and averages them over seeds. The generator is
`numpy.random.default_rng(--bootstrap-seed)`: the same curves give the same interval.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import yaml

from gymforge.core.config import load_config

ROOT = Path(__file__).resolve().parents[1]
STUDENT_CURVE = "rl/{student}/curve.json"


def quarters(iterations: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """The first and the last quarter of a curve's iterations (max(1, n // 4) each, as `curve.json`)."""
    if len(iterations) < 2:
        raise ValueError(f"a curve of {len(iterations)} iterations has no first and last quarter")
    q = max(1, len(iterations) // 4)
    return list(iterations[:q]), list(iterations[-q:])


def _quarter_replicates(quarter: Sequence[Sequence[float]], samples: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates of a quarter's mean reward (the mean of its iterations' means), two-stage: iterations
    drawn with replacement, then each drawn iteration's episodes with replacement."""
    n = len(quarter)
    picks = rng.integers(0, n, (samples, n))
    total = np.zeros(samples)
    for j in range(n):
        means = np.stack([rng.choice(np.asarray(r, dtype=float), (samples, len(r))).mean(axis=1) for r in quarter])
        total += means[picks[:, j], np.arange(samples)]
    return total / n


def rise(curves: Sequence[Sequence[Sequence[float]]], *, samples: int = 10_000, seed: int = 0,
         level: float = 0.95) -> dict[str, Any]:
    """Last-quarter minus first-quarter mean reward per curve (a curve: per iteration, its episodes' rewards), their
    mean over curves, and its percentile-bootstrap interval at `level` (`_quarter_replicates` per quarter)."""
    rng = np.random.default_rng(seed)
    per_seed, replicates = [], np.zeros(samples)
    for curve in curves:
        first, last = quarters(curve)
        per_seed.append(float(np.mean([np.mean(r) for r in last]) - np.mean([np.mean(r) for r in first])))
        replicates += _quarter_replicates(last, samples, rng) - _quarter_replicates(first, samples, rng)
    replicates /= len(curves)
    lo, hi = np.percentile(replicates, [50 * (1 - level), 50 * (1 + level)])
    return {"per_seed": per_seed, "mean": float(np.mean(per_seed)), "interval": [float(lo), float(hi)],
            "level": level, "samples": samples, "excludes_zero": bool(lo > 0 or hi < 0)}


def episode_rewards(folder: Path, curve: dict[str, Any], key: str = "reward") -> list[list[float]]:
    """Per iteration, the rewards of its scored episodes (`episodes/iteration_<k>.json`); an iteration whose file
    is missing counts as one episode of its mean reward. `key="valid"`: 1 or 0 per episode, whether it ended on a
    valid submission (a missing file: the iteration's valid share), a measure no reward weight changes."""
    out = []
    for row in curve["iterations"]:
        path = folder / "episodes" / f"iteration_{row['iteration']:04d}.json"
        values = [float(e[key]) for e in json.loads(path.read_text())] if path.exists() else []
        out.append(values or [row["mean_reward" if key == "reward" else "valid_share"]])
    return out


def run_seed(directory: Path, configfile: str, seed: int, cores: int, extra: list[str], results: Path,
             student: str, out: Path) -> dict[str, Any]:
    """One RL run (Snakemake target `rl`) with RL seed `seed`; its curve and wall time go to out/seed_<seed>/."""
    cmd = [sys.executable, "-m", "snakemake", "--cores", str(cores), "rl", "--configfile", "config.yaml",
           configfile, "--config", f"rl={{seed: {seed}}}", *extra]
    print("$", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    subprocess.run(cmd, cwd=directory, check=True)
    wall = time.monotonic() - t0
    curve = json.loads((results / STUDENT_CURVE.format(student=student)).read_text())
    dest = out / f"seed_{seed}"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "curve.json").write_text(json.dumps(curve, indent=2))
    episodes = results / STUDENT_CURVE.format(student=student).replace("curve.json", ".work/episodes")
    shutil.rmtree(dest / "episodes", ignore_errors=True)
    shutil.copytree(episodes, dest / "episodes")  # every episode's reward, exit status and steps
    # and its trajectory, with the sampled token ids the update trained on (bench/rl_update_cost.py replays them)
    shutil.rmtree(dest / "trajectories", ignore_errors=True)
    shutil.copytree(episodes.parent / "trajectories", dest / "trajectories")
    (dest / "run.json").write_text(json.dumps({"seed": seed, "cores": cores, "wall_s": round(wall, 1),
                                               "command": cmd}, indent=2))
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/rl-learning.yaml", help="overlay on config.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="RL seeds (rl.seed)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--directory", type=Path, default=ROOT, help="where snakemake runs (config.yaml, results/)")
    parser.add_argument("--out", type=Path, default=None, help="default: <results_dir>/rl-learning")
    parser.add_argument("--analyze-only", action="store_true", help="read the curves under --out, run nothing")
    parser.add_argument("--bootstrap-seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("snakemake_args", nargs="*", help="after --: passed on to snakemake")
    args = parser.parse_args()
    directory = args.directory.resolve()
    cfg = load_config(directory / "config.yaml", yaml.safe_load((directory / args.config).read_text()) or {})
    results = directory / cfg.results_dir
    out = args.out or results / "rl-learning"
    student = cfg.train.name
    own = cfg.rl.seed if cfg.rl.seed is not None else cfg.seed
    seeds = sorted(args.seeds, key=lambda s: s == own)  # the configuration's own seed last (see the docstring)
    if not args.analyze_only:
        for seed in seeds:
            run_seed(directory, args.config, seed, args.cores, args.snakemake_args, results, student, out)
    curves, episodes, valid, walls = {}, {}, {}, {}
    for seed in sorted(args.seeds):
        data = json.loads((out / f"seed_{seed}" / "curve.json").read_text())
        curves[seed] = [row["mean_reward"] for row in data["iterations"]]
        episodes[seed] = episode_rewards(out / f"seed_{seed}", data)
        valid[seed] = episode_rewards(out / f"seed_{seed}", data, key="valid")
        run = out / f"seed_{seed}" / "run.json"
        walls[seed] = json.loads(run.read_text())["wall_s"] if run.exists() else None
    stats = rise(list(episodes.values()), samples=args.samples, seed=args.bootstrap_seed)
    for (seed, rewards), diff in zip(curves.items(), stats["per_seed"], strict=True):
        first, last = quarters(rewards)
        print(f"seed {seed}: " + " ".join(f"{r:+.2f}" for r in rewards))
        print(f"  first quarter {np.mean(first):+.3f}, last quarter {np.mean(last):+.3f}, difference {diff:+.3f}"
              + (f"; wall {walls[seed]:.0f} s" if walls[seed] is not None else ""))
    lo, hi = stats["interval"]
    print(f"last - first quarter, mean over {len(curves)} seeds: {stats['mean']:+.3f}, "
          f"{100 * stats['level']:.0f}% bootstrap interval [{lo:+.3f}, {hi:+.3f}]"
          f" ({'excludes' if stats['excludes_zero'] else 'includes'} 0)")
    shares = rise(list(valid.values()), samples=args.samples, seed=args.bootstrap_seed)
    vlo, vhi = shares["interval"]
    print("valid submissions, last - first quarter: " + ", ".join(
        f"seed {seed} {d:+.3f}" for seed, d in zip(valid, shares["per_seed"], strict=True))
          + f"; mean {shares['mean']:+.3f} [{vlo:+.3f}, {vhi:+.3f}]")
    (out / "summary.json").write_text(json.dumps({"curves": curves, "wall_s": walls, **stats, "valid_share": shares},
                                                 indent=2))


if __name__ == "__main__":
    main()
