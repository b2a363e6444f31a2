"""What an RL iteration's update costs in two ways, on the same recorded batches, in one run.

    python bench/rl_update_cost.py results/rl-learning/seed_0 --runs 2048:per-reply 4096

A way is `MAX_LENGTH` (`rl.max_length`; the update as `train_rl` runs it: one pass per chain of replies whose
requests extend each other, `grpo.chains`) or `MAX_LENGTH:per-reply` (one pass per reply, as the update ran before
chains: each reply is put in an episode of its own, so nothing chains).

Replays the iterations of one `bench/rl_learning.py` seed (its `episodes/` and `trajectories/`, with the token ids the
server sampled) through the stage's own update (`gymforge.stages.rl`: group advantages and duration weights, then
`grpo.prepare` and one `grpo.update`, as `train_rl` runs them on one device), once per way and iteration, alternating
which way runs first, each time from a fresh copy of the SFT checkpoint (the weights do not change the cost). A longer
`max_length` cuts fewer prompts and so trains on more tokens. Prints per iteration the samples, the tokens and the
update's seconds each way, then the totals and their ratio, and, with the seed's `curve.json`, what that difference
makes of the iteration's wall time (rollouts as measured, the update each way).

Time is CPU or GPU time of this process alone: run it on an otherwise idle machine (`--threads`, default 1: the
`--cores 1` runs of docs/rl.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time
from pathlib import Path
from typing import Any

from gymforge.agent.trajectory import read_trajectory
from gymforge.core.config import load_config
from gymforge.core.records import derive_seed
from gymforge.rl import grpo
from gymforge.stages.rl import _weigh, update_models

ROOT = Path(__file__).resolve().parents[1]


def iteration_samples(seed_dir: Path, iteration: int, cfg: Any) -> list[Any]:
    """The weighed samples of one recorded iteration (none when all its groups had zero reward variance)."""
    scored = json.loads((seed_dir / "episodes" / f"iteration_{iteration:04d}.json").read_text())
    samples = []
    for i, episode in enumerate(scored):
        [traj] = (seed_dir / "trajectories" / episode["episode_id"]).glob("*.traj")
        samples.extend(grpo.action_samples(read_trajectory(traj), i))
    return _weigh(cfg, scored, samples).samples


def parse_way(way: str) -> tuple[int, bool]:
    """`4096` -> (4096, chained); `2048:per-reply` -> (2048, one pass per reply)."""
    length, _, mode = way.partition(":")
    if mode not in ("", "per-reply"):
        raise argparse.ArgumentTypeError(f"{way}: MAX_LENGTH or MAX_LENGTH:per-reply")
    return int(length), mode == ""


def timed_update(cfg: Any, samples: list[Any], sft: Path, way: str, seed: int) -> dict[str, float]:
    from transformers import AutoTokenizer

    rl = cfg.rl
    max_length, chained = parse_way(way)
    samples = [copy.copy(s) for s in samples]
    if not chained:
        for k, s in enumerate(samples):
            s.episode = k
    reference, policy, optimizer = update_models(sft, sft, rl.learning_rate, rl.gradient_checkpointing)
    tokenizer = AutoTokenizer.from_pretrained(str(sft))
    t0 = time.perf_counter()
    kept = grpo.prepare(samples, tokenizer, policy, reference, max_length=max_length,
                        template=grpo.training_template(tokenizer, cfg.train.student), temperature=rl.temperature,
                        single_step=rl.epochs == 1 and rl.minibatches == 1)
    stats = grpo.update(policy, optimizer, kept, epochs=rl.epochs, minibatches=rl.minibatches, clip_eps=rl.clip_eps,
                        kl_coef=rl.kl_coef, max_grad_norm=rl.max_grad_norm, rng=random.Random(seed),
                        temperature=rl.temperature, is_cap=rl.is_cap, mismatch_threshold=rl.mismatch_threshold)
    return {"update_s": time.perf_counter() - t0, "tokens": sum(len(s.input_ids) for s in kept),
            "passes_tokens": int(stats.get("update_tokens", 0)), "truncated": sum(bool(s.truncated) for s in kept),
            "loss": float(stats.get("loss", 0.0))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seed_dir", type=Path, help="a bench/rl_learning.py seed folder (episodes/, trajectories/)")
    parser.add_argument("--config", default="configs/rl-learning.yaml", help="the RL run's config file (rl settings)")
    parser.add_argument("--directory", type=Path, default=ROOT, help="the checkout whose results/ hold the student")
    parser.add_argument("--runs", nargs=2, default=["2048:per-reply", "4096"], metavar=("A", "B"),
                        help="two ways: MAX_LENGTH (chained, as train_rl) or MAX_LENGTH:per-reply")
    parser.add_argument("--iterations", type=int, nargs="*", default=None, help="default: every recorded one")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    directory = args.directory.resolve()
    cfg = load_config(directory / args.config)  # its `base:` chain: config.yaml below it
    sft = directory / cfg.results_dir / "checkpoints" / cfg.train.name
    recorded = sorted(int(p.stem.split("_")[1]) for p in (args.seed_dir / "episodes").glob("iteration_*.json"))
    for way in args.runs:
        parse_way(way)
    totals = {n: {"update_s": 0.0, "tokens": 0} for n in args.runs}
    rows = []
    for it in args.iterations if args.iterations is not None else recorded:
        samples = iteration_samples(args.seed_dir, it, cfg)
        if not samples:
            print(f"iteration {it}: no update (zero reward variance)")
            continue
        row: dict[str, Any] = {"iteration": it, "samples": len(samples)}
        order = args.runs if it % 2 == 0 else args.runs[::-1]  # alternate which length runs first
        for n in order:
            torch.manual_seed(derive_seed(0, "rl-torch", it))
            row[n] = timed_update(cfg, samples, sft, n, derive_seed(0, "rl-update", it))
            totals[n]["update_s"] += row[n]["update_s"]
            totals[n]["tokens"] += row[n]["passes_tokens"]
        rows.append(row)
        a, b = (row[n] for n in args.runs)
        print(f"iteration {it}: {len(samples)} samples; " + "; ".join(
            f"{n}: {r['tokens']} sample tokens ({r['truncated']} cut), {r['passes_tokens']} in its passes, "
            f"{r['update_s']:.1f} s"
            for n, r in zip(args.runs, (a, b), strict=True)), flush=True)
    if not rows:
        raise SystemExit("no recorded iteration had an update")
    (na, ta), (nb, tb) = ((n, totals[n]) for n in args.runs)
    print(f"updates of {len(rows)} iterations: {na} {ta['update_s']:.1f} s ({ta['tokens']} tokens in its passes), "
          f"{nb} {tb['update_s']:.1f} s ({tb['tokens']} tokens): time x{tb['update_s'] / ta['update_s']:.2f}, "
          f"tokens x{tb['tokens'] / ta['tokens']:.2f}")
    curve_path = args.seed_dir / "curve.json"
    if curve_path.exists():
        curve = json.loads(curve_path.read_text())["iterations"]
        rollout = sum(r.get("rollout_s", 0.0) for r in curve if r["iteration"] in {x["iteration"] for x in rows})
        if rollout:
            wall_a, wall_b = rollout + ta["update_s"], rollout + tb["update_s"]
            print(f"with the seed's measured rollouts ({rollout:.0f} s): iteration wall time x{wall_b / wall_a:.3f} "
                  f"({nb} over {na})")
    out = args.seed_dir / f"update_cost_{na}_{nb}.json".replace(":", "-")
    out.write_text(json.dumps({"runs": args.runs, "threads": args.threads, "rows": [
        {"iteration": r["iteration"], "samples": r["samples"], **{str(n): r[n] for n in args.runs}} for r in rows],
        "totals": {str(n): totals[n] for n in args.runs}}, indent=2))


if __name__ == "__main__":
    main()
