"""Tokens/s of the offline student's SFT on this CPU, before and after the CPU changes, and how far from the limit.

    python bench/student_throughput.py [--steps 8] [--rounds 3] [--settings old,head,new] [--sweep-threads]

Builds what `make run`'s `train_student` trains on, without running the pipeline: the offline tokenizer (byte-level
BPE trained on the package's prompt templates and source), the tiny random-init Qwen3 of `config.yaml` (`train.tiny`,
4 layers) and 36 synthetic agent trajectories in the SFT data's chat format whose lengths are drawn uniformly from
2,000-7,300 tokens (the offline run's: ~2k to ~7.3k, ~4.8k on average), short `DISCUSSION` + command replies as the
offline teacher writes them (the loss is on them only: ~12% of the tokens), observations from source files. Then,
with `config.yaml`'s `train` section (batch size 1, max_length 8192, fp32, a log line per step), each run trains
`--steps` optimizer steps with `gymforge.stages.training.build_trainer`, in a fresh process (its own OpenMP runtime,
as a Snakemake job has), with one of the settings:

- old: as before the CPU changes: TRL's fused LM head projects every position (on CUDA it projects only the
  labelled ones); OpenMP threads spin at barriers (GNU OpenMP's default);
- head: the LM head on the labelled positions only (`gymforge.student.cpu_training.compact_lm_head`), OpenMP as old;
- new: what `train_student` does now: that, `OMP_WAIT_POLICY=PASSIVE` (`prepare_cpu_process`: threads sleep at a
  barrier, so a thread that waits for one the kernel took off the CPU yields its core) and the job's cores.

The settings alternate (old, head, new, new, head, old, ...) `--rounds` times on the same examples in the same
order, so a drifting load on a shared machine hits all of them; each round's ratios to old are printed, and the
medians. The final weights are compared (old vs new: rounding only; new twice with the same seed: identical).

The limit: the FLOPs a step needs (6 x the layers' parameters per token, the LM head's 6 x hidden x vocab per
*trained* token, causal attention 3 x 4 x heads x head_dim x L(L+1)/2 per layer and sequence) divided by the rates
of this CPU's kernels at the model's shapes, measured in a process set up as new's: `torch.matmul` of fp32 matrices
of the model's hidden size (4,096 tokens x hidden @ hidden x intermediate, and back), the LM head's matmul, and
SDPA's CPU flash attention (forward and backward, causal, the model's heads and head_dim, 4,096 tokens). Printed:
that bound in tokens/s, the FLOP/s each setting reaches, its fraction of the bound and of a 2048^3 matmul's rate
(the CPU's practical fp32 peak). On a machine shared with other jobs every figure moves with their load: compare
the settings only within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

N_EXAMPLES, MIN_TOKENS, MAX_TOKENS = 36, 2000, 7300
COMMANDS = ["ls -la", "ls data", "cat evaluate.py", "python baseline.py", "validate", "submit", "head -n 20 data/train.csv",
            "python -c 'import pandas as pd; print(pd.read_csv(\"data/train.csv\").describe())'"]


def build_data(work: Path, seed: int) -> tuple[Any, list[list[dict[str, str]]], list[int]]:
    """The offline tokenizer (saved to work/tokenizer) and N_EXAMPLES conversations with their token counts."""
    from gymforge.student.tokenizer import corpus, train_offline_tokenizer

    templates = corpus(ROOT / "src" / "gymforge" / "core" / "templates", [])
    source = [p.read_text() for p in sorted((ROOT / "src" / "gymforge").rglob("*.py"))]
    tokenizer = train_offline_tokenizer(templates + source)
    tokenizer.save_pretrained(str(work / "tokenizer"))
    lines = [line for text in source for line in text.splitlines() if line.strip()]
    rng = random.Random(seed)

    def n_tokens(messages: list[dict[str, str]]) -> int:
        return len(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))

    def reply() -> str:
        thought = " ".join(rng.sample(lines, rng.randint(1, 2))).strip()
        if rng.random() < 0.2:  # an edit: code in the command
            command = "edit 1:1\n" + "\n".join(rng.sample(lines, rng.randint(4, 15))) + "\nend_of_edit"
        else:
            command = rng.choice(COMMANDS)
        return f"DISCUSSION\n{thought}\n\n```\n{command}\n```\n"

    rows, lengths = [], []
    for _ in range(N_EXAMPLES):
        target = rng.randint(MIN_TOKENS, MAX_TOKENS)
        messages = [{"role": "system", "content": templates[1]},
                    {"role": "user", "content": "\n".join(rng.sample(lines, 60))}]
        while True:
            messages.append({"role": "assistant", "content": reply()})
            if n_tokens(messages) >= target:
                break
            messages.append({"role": "user", "content": "\n".join(rng.sample(lines, rng.randint(8, 40)))})
            if n_tokens(messages) >= target:
                messages.pop()
                break
        rows.append(messages)
        lengths.append(n_tokens(messages))
    return tokenizer, rows, lengths


SETTINGS = {
    "old": "as before: TRL's fused LM head on every position, OpenMP threads that spin at barriers",
    "head": "the LM head on the trained positions only (compact_lm_head), OpenMP as before",
    "new": "build_trainer and train_student as they are: compact_lm_head, the job's cores, OMP_WAIT_POLICY=PASSIVE",
}


def kernel_rates(work: Path) -> None:
    """The FLOP/s of this CPU's kernels at the shapes of the model in work/base (a JSON line)."""
    import torch
    from transformers import AutoConfig

    from gymforge.student.cpu_training import set_cpu_threads

    set_cpu_threads()
    config = AutoConfig.from_pretrained(str(work / "base"))
    h, inter = config.hidden_size, config.intermediate_size
    print(json.dumps({
        "mm": statistics.median([matmul_rate(4096, h, inter), matmul_rate(4096, inter, h), matmul_rate(4096, h, h),
                                 matmul_rate(h, 4096, inter)]),
        "head_mm": matmul_rate(1024, h, config.vocab_size),
        "attention": attention_rate(config.num_attention_heads, config.head_dim, 4096),
        "square": matmul_rate(2048, 2048, 2048), "threads": torch.get_num_threads()}))


def worker(work: Path, name: str, setting: str, steps: int) -> None:
    """One training run in this fresh process (as `train_student` runs in its job): prints a JSON line and saves the
    final weights to work/<name>.pt. Setting `rates`: `kernel_rates`, set up as `new`."""
    if setting in ("new", "rates"):
        from gymforge.student.cpu_training import prepare_cpu_process

        prepare_cpu_process()  # what train_student does first: before torch is imported
    if setting == "rates":
        kernel_rates(work)
        return
    warnings.filterwarnings("ignore")
    import datasets
    import torch
    from transformers.utils import logging as hf_logging

    from gymforge.core.config import load_config
    from gymforge.stages import training
    from gymforge.student import cpu_training

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    cfg = load_config(ROOT / "config.yaml", json.loads((work / "overrides.json").read_text()))
    if setting == "new":
        cpu_training.set_cpu_threads()
    dataset = training.load_sft_dataset(work / "dataset")
    args = training.sft_config(cfg, work / name, "fp32")
    args.max_steps = steps
    if setting == "old":
        training.compact_lm_head = lambda model: False  # TRL's fused head as it is
    trainer = training.build_trainer(cfg, dataset, str(work / "base"), work / "tokenizer", work / name, args=args)
    trained: list[int] = []  # per batch: tokens with a label (the LM head's work)
    lengths: list[int] = []
    collate = trainer.data_collator

    def counting(examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = collate(examples)
        trained.append(int((batch["labels"][:, 1:] != -100).sum()))
        lengths.append(int(batch["input_ids"].shape[1]))
        return batch

    trainer.data_collator = counting  # the dataloader is built in train(), with this collator
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    tokens = int(trainer._total_train_tokens)
    torch.save({k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, work / f"{name}.pt")
    print(json.dumps({"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                      "threads": torch.get_num_threads(), "wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                      "trained": sum(trained[:steps]), "lengths": lengths[:steps],
                      "loss": [r["loss"] for r in trainer.state.log_history if "loss" in r]}))


def train_run(work: Path, name: str, setting: str, steps: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`worker` in a subprocess (its own OpenMP runtime, as a Snakemake job has); its JSON line."""
    proc = subprocess.run([sys.executable, __file__, "--worker", setting, "--work", str(work), "--name", name,
                           "--steps", str(steps)], capture_output=True, text=True, env=env or dict(os.environ))
    if proc.returncode:
        raise SystemExit(f"{setting} run failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def matmul_rate(m: int, k: int, n: int, seconds: float = 1.0) -> float:
    """FLOP/s of torch.matmul on fp32 (m x k) @ (k x n)."""
    import torch

    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(2):
        a @ b
    reps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        reps += 1
    return 2 * m * k * n * reps / (time.perf_counter() - start)


def attention_rate(heads: int, head_dim: int, length: int, reps: int = 3) -> float:
    """FLOP/s of SDPA's causal attention, forward and backward (counted as 3 x the forward's 4 x heads x head_dim x
    L(L+1)/2), fp32, batch 1."""
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.randn(1, heads, length, head_dim, requires_grad=True) for _ in range(3))
    best = float("inf")
    for _ in range(reps + 1):
        start = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        best = min(best, time.perf_counter() - start)
    return attention_flops(heads, head_dim, length) / best


def attention_flops(heads: int, head_dim: int, length: int) -> float:
    """Forward and backward FLOPs of one layer's causal attention over one sequence (Q K^T and P V, 3x forward)."""
    return 3 * 4 * heads * head_dim * length * (length + 1) / 2


def step_flops(config: Any, length: int, trained: int) -> dict[str, float]:
    """FLOPs one training step needs: the layers' matmuls, the LM head on the trained tokens, attention."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    per_layer = h * q * 2 + h * kv * 2 + 3 * h * inter  # q, o; k, v; gate, up, down
    return {"linear": 6 * per_layer * layers * length, "head": 6 * h * config.vocab_size * trained,
            "attention": layers * attention_flops(config.num_attention_heads, config.head_dim, length)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per training run (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of one run per setting (default 3)")
    parser.add_argument("--settings", default="old,head,new", help="which of old, head, new (default all three)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sweep-threads", action="store_true", help="also time `new` at 1..cores threads")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--worker", choices=[*SETTINGS, "rates"], help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if opts.worker:
        worker(opts.work, opts.name, opts.worker, opts.steps)
        return
    settings = [x.strip() for x in opts.settings.split(",") if x.strip()]
    if not set(settings) <= set(SETTINGS) or "new" not in settings:
        raise SystemExit(f"--settings: a comma-separated subset of {', '.join(SETTINGS)} with new")

    warnings.filterwarnings("ignore")
    import datasets
    import torch
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    from gymforge.core.config import load_config
    from gymforge.student import base as student
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    overrides = {"seed": opts.seed}
    cfg = load_config(ROOT / "config.yaml", overrides)
    print(f"CPU: {os.cpu_count()} cores, affinity {len(os.sched_getaffinity(0))}; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS')}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; torch "
          f"{torch.__version__}; load average {os.getloadavg()[0]:.2f}", flush=True)
    for name in settings:
        print(f"  {name}: {SETTINGS[name]}")

    with tempfile.TemporaryDirectory(prefix="student-throughput-") as tmp:
        work = Path(tmp)
        (work / "overrides.json").write_text(json.dumps(overrides))
        _, rows, lengths = build_data(work, opts.seed)
        student.build_base(cfg, work / "tokenizer", work / "base")
        datasets.Dataset.from_dict({"messages": rows, "tokens": lengths}).save_to_disk(str(work / "dataset"))
        config = AutoConfig.from_pretrained(str(work / "base"))
        params = json.loads((work / "base" / student.MARKER).read_text())["parameters"]
        print(f"data: {len(rows)} trajectories of {min(lengths)}-{max(lengths)} tokens (mean {statistics.mean(lengths):.0f}); "
              f"model: {config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab {config.vocab_size}, "
              f"{params / 1e6:.2f} M parameters; train: batch {cfg.train.batch_size}, max_length {cfg.train.max_length}, "
              f"{opts.steps} steps a run", flush=True)

        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in settings}
        for r in range(opts.rounds):
            order = settings if r % 2 == 0 else settings[::-1]  # old, head, new, new, head, old, ...
            for name in order:
                run = train_run(work, f"{name}{r}", name, opts.steps)
                runs[name].append(run)
                print(f"round {r + 1} {name:4s}: {run['tokens']} tokens in {run['seconds']:5.1f} s = "
                      f"{run['tokens_per_s']:5.0f} tokens/s ({run['threads']} threads, OMP_WAIT_POLICY "
                      f"{run['wait_policy']}; load {os.getloadavg()[0]:.2f})", flush=True)
            if "old" in settings:
                print(f"round {r + 1}: " + ", ".join(f"{name}/old {runs[name][-1]['tokens_per_s'] / runs['old'][-1]['tokens_per_s']:.2f}x"
                                                     for name in settings if name != "old"), flush=True)

        print()
        median = {name: statistics.median(x["tokens_per_s"] for x in runs[name]) for name in settings}
        best = {name: max(x["tokens_per_s"] for x in runs[name]) for name in settings}
        ratios: dict[str, list[float]] = {}
        for name in settings:
            line = f"{name:4s}: median {median[name]:5.0f} tokens/s, best {best[name]:5.0f}"
            if "old" in settings and name != "old":
                ratios[name] = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs[name], runs["old"], strict=True)]
                line += (f"; {name}/old per round {', '.join(f'{x:.2f}' for x in ratios[name])}: median "
                         f"{statistics.median(ratios[name]):.2f}x, best/best {best[name] / best['old']:.2f}x")
            print(line)
        weights = {name: torch.load(work / f"{name}0.pt") for name in settings}
        again = torch.load(work / f"new{opts.rounds - 1}.pt")
        same = all(torch.equal(weights["new"][k], again[k]) for k in again)
        print(f"new twice with seed {opts.seed}: weights identical: {same}")
        for name in settings:
            if name != "new":
                diff = max(float((weights[name][k] - weights["new"][k]).abs().max()) for k in again)
                loss = max(abs(a - b) for a, b in zip(runs[name][0]["loss"], runs["new"][0]["loss"], strict=True))
                print(f"{name} vs new: loss curves differ by at most {loss:.1e}, weights after {opts.steps} steps by "
                      f"at most {diff:.1e} (rounding)")

        sweep = {}
        if opts.sweep_threads:
            for threads in range(1, (os.cpu_count() or 1) + 1):
                run = train_run(work, f"threads{threads}", "new", opts.steps,
                                env={**os.environ, "OMP_NUM_THREADS": str(threads)})
                sweep[threads] = run["tokens_per_s"]
                print(f"new at {threads} threads: {run['tokens_per_s']:.0f} tokens/s", flush=True)

        # the limit: what the steps need at the rates of this CPU's kernels for these shapes (measured in a process
        # set up as `new`'s)
        rates = train_run(work, "rates", "rates", opts.steps)
        mm, head_mm, attn, square, threads = (rates[k] for k in ("mm", "head_mm", "attention", "square", "threads"))
        first = runs["new"][0]
        seq_lengths, trained = first["lengths"], first["trained"]
        need = {"linear": 0.0, "head": step_flops(config, 0, trained)["head"], "attention": 0.0}
        for length in seq_lengths:
            flops = step_flops(config, length, 0)
            need["linear"] += flops["linear"]
            need["attention"] += flops["attention"]
        total, tokens = sum(need.values()), sum(seq_lengths)
        bound_s = need["linear"] / mm + need["head"] / head_mm + need["attention"] / attn
        print(f"\nFLOPs the steps need ({tokens / len(seq_lengths):.0f} tokens a step, {trained / tokens:.0%} of them "
              f"trained): {total / tokens / 1e6:.1f} MFLOP/token (6 x parameters alone: {6 * params / 1e6:.1f}): "
              f"attention {need['attention'] / total:.0%}, linear layers {need['linear'] / total:.0%}, LM head "
              f"{need['head'] / total:.0%}")
        print(f"kernel rates here ({threads} threads, fp32): matmul at the model's shapes {mm / 1e9:.1f} GFLOP/s, "
              f"LM head matmul {head_mm / 1e9:.1f}, causal attention fwd+bwd at 4,096 tokens {attn / 1e9:.1f}, a 2048^3 "
              f"matmul {square / 1e9:.1f} GFLOP/s")
        print(f"bound: {tokens / bound_s:.0f} tokens/s if every FLOP ran at those rates")
        for name in settings:
            achieved = total * median[name] / tokens
            print(f"{name:4s}: {achieved / 1e9:5.1f} GFLOP/s = {median[name] * bound_s / tokens:4.0%} of the bound, "
                  f"{achieved / square:4.0%} of the large-matmul rate")
        if opts.json:
            opts.json.write_text(json.dumps({
                "median_tokens_per_s": median, "best_tokens_per_s": best, "ratios_to_old": ratios, "threads": threads,
                "deterministic": same, "sweep": sweep, "flops_per_token": total / tokens,
                "flop_shares": {k: v / total for k, v in need.items()}, "matmul_flops": mm, "head_matmul_flops": head_mm,
                "attention_flops": attn, "square_matmul_flops": square, "bound_tokens_per_s": tokens / bound_s,
            }, indent=2) + "\n")


if __name__ == "__main__":
    main()
