"""SFT that survives preemption (`gymforge.student.resume`): a `kill -9` mid-run, then a rerun that resumes from the
newest complete checkpoint and ends with the weights of an uninterrupted run; half-saved or foreign checkpoints are
never resumed; and bf16 training keeps fp32 master weights, so small AdamW steps are not rounded away."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_training import REPLY, SYSTEM, TASKS, example, make_cfg, save_dataset, user

from gymforge.stages import training
from gymforge.student import base as student
from gymforge.student import resume
from gymforge.student.tokenizer import train_offline_tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tokenizer/, base/ (tiny random Qwen3) and dataset/ (12 examples)."""
    root = tmp_path_factory.mktemp("resume")
    texts = [SYSTEM, REPLY, REPLY, *(user(t) for t in TASKS), "the quick brown fox jumps over the lazy dog"]
    train_offline_tokenizer(texts, vocab_size=400).save_pretrained(str(root / "tokenizer"))
    student.build_base(make_cfg(), root / "tokenizer", root / "base")
    save_dataset([example(t) for t in TASKS], root / "dataset")
    return root


def _inputs(tiny: Path) -> list[str]:
    return [str(tiny / "dataset"), str(tiny / "base"), str(tiny / "tokenizer")]


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


# ---- which checkpoint a rerun takes ---------------------------------------------------------------------------


def _checkpoint(run_dir: Path, step: int, key: str | None, state: str | None = None) -> Path:
    path = run_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"weights")
    if state is not None:
        (path / "trainer_state.json").write_text(state)
    else:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if key is not None:
        (path / resume.MARKER).write_text(json.dumps({"step": step, "key": key, "metrics": [{"step": 1}]}))
    return path


def test_only_a_complete_checkpoint_of_the_same_run_is_resumed(tmp_path: Path) -> None:
    run_dir = resume.resume_dir(tmp_path / "checkpoints" / "tiny-qwen3")
    assert run_dir.name == ".tiny-qwen3.resume" and run_dir.parent == tmp_path / "checkpoints"
    assert resume.newest_complete(run_dir, "k") is None and resume.discard_unusable(run_dir, "k") == []
    good = _checkpoint(run_dir, 4, "k")
    _checkpoint(run_dir, 3, "k")                        # older, complete: kept for the rotation to remove
    _checkpoint(run_dir, 8, None)                       # killed while transformers wrote it: no marker yet
    _checkpoint(run_dir, 12, "other")                   # another run's (other settings or data)
    _checkpoint(run_dir, 16, "k", state='{"global_s')   # its state cut short
    (run_dir / "checkpoint-20").mkdir()                  # an empty folder
    assert resume.newest_complete(run_dir, "k") == good
    assert resume.discard_unusable(run_dir, "k") == ["checkpoint-12", "checkpoint-16", "checkpoint-20",
                                                     "checkpoint-8"]
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint-3", "checkpoint-4"]
    assert resume.resumed_rows(good) == [{"step": 1}]


def test_the_run_key_follows_what_the_weights_depend_on(tiny: Path, tmp_path: Path) -> None:
    dataset, base, tokenizer = _inputs(tiny)
    key = resume.run_key(make_cfg(), dataset, base, tokenizer, 1)
    # saving, logging and resources change no weight
    assert resume.run_key(make_cfg(save_steps=3, save_minutes=None, save_total_limit=5, logging_steps=7, mem_mb=999),
                          dataset, base, tokenizer, 1) == key
    assert resume.run_key(make_cfg(learning_rate=1e-4), dataset, base, tokenizer, 1) != key
    assert resume.run_key(make_cfg(seed=3), dataset, base, tokenizer, 1) != key
    assert resume.run_key(make_cfg(), dataset, base, tokenizer, 2) != key
    other = save_dataset([example(t) for t in TASKS[:6]], tmp_path / "dataset")
    assert resume.run_key(make_cfg(), str(other), base, tokenizer, 1) != key


# ---- kill -9, then a rerun ------------------------------------------------------------------------------------

# The child trains as the rule's job would, a little slowed down so that the kill lands mid-run.
CHILD = """
import json, sys, time
from gymforge.core.config import GymforgeConfig
from gymforge.stages import training
from transformers import TrainerCallback

class Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.25)

cfg = GymforgeConfig.model_validate(json.loads(sys.argv[1]))
training.train_student(cfg, *sys.argv[2:6], callbacks=[Slow()])
"""


@pytest.mark.slow
def test_sft_killed_mid_run_resumes_and_ends_with_the_uninterrupted_weights(
        tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import torch

    cfg = make_cfg(epochs=6.0, save_steps=4, save_minutes=None)  # 18 steps of 3 a epoch: checkpoints at 4, 8, ...
    out = tmp_path / "killed" / "tiny-qwen3"
    run_dir = resume.resume_dir(out)
    with (tmp_path / "child.log").open("w") as log:
        # its own process group, as a scheduler's job: killpg reaches every process it started
        proc = subprocess.Popen([sys.executable, "-c", CHILD, cfg.model_dump_json(), *_inputs(tiny), str(out)],
                                start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 240
        while not list(run_dir.glob(f"checkpoint-*/{resume.MARKER}")):
            assert proc.poll() is None, (tmp_path / "child.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint was saved"
            time.sleep(0.05)
        time.sleep(random.Random(38).uniform(0.0, 1.0))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL and not out.exists()
    key = resume.run_key(cfg, *_inputs(tiny), 1)
    killed_at = resume.newest_complete(run_dir, key)
    assert killed_at is not None
    step = int(killed_at.name.split("-")[1])
    assert 4 <= step < 18

    with caplog.at_level(logging.INFO, logger="gymforge"):
        report = training.train_student(cfg, *_inputs(tiny), out)
    assert f"resuming from {killed_at}" in caplog.text
    assert report.resumed_from_step == step and report.steps == 18
    assert not run_dir.exists() and not (out.parent / ".tiny-qwen3.tmp").exists()  # the finished model only
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 19))  # every step once, those before the kill included

    # the same training uninterrupted, without any checkpoint
    clean = tmp_path / "clean" / "tiny-qwen3"
    reference = training.train_student(make_cfg(epochs=6.0, save_steps=None, save_minutes=None), *_inputs(tiny),
                                       clean)
    assert reference.resumed_from_step is None
    resumed, uninterrupted = _weights(out), _weights(clean)
    base = _weights(tiny / "base")
    assert resumed.keys() == uninterrupted.keys()
    for name, weight in uninterrupted.items():
        torch.testing.assert_close(resumed[name], weight, rtol=1e-5, atol=1e-6, msg=name)
    assert any(not torch.equal(base[n], uninterrupted[n]) for n in base)  # training moved the weights
    clean_rows = [json.loads(line) for line in (clean / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in clean_rows], rel=1e-5)
    assert rows[-1]["tokens"] == clean_rows[-1]["tokens"] == report.train_tokens


@pytest.mark.parametrize("saving", [
    {"save_steps": 2, "save_minutes": None},
    # timed saves (every step here), the newest one kept, LoRA adapters
    {"save_steps": None, "save_minutes": 1e-6, "save_total_limit": 1,
     "lora": {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0}}], ids=["steps", "minutes-lora"])
def test_a_failed_run_keeps_its_checkpoints_for_the_rerun(tiny: Path, tmp_path: Path, saving: dict) -> None:
    from transformers import TrainerCallback

    class Boom(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise RuntimeError("preempted")

    out = tmp_path / "checkpoints" / "tiny-qwen3"
    cfg = make_cfg(epochs=2.0, **saving)
    with pytest.raises(RuntimeError, match="preempted"):
        training.train_student(cfg, *_inputs(tiny), out, callbacks=[Boom()])
    run_dir = resume.resume_dir(out)
    assert sorted(p.name for p in out.parent.iterdir()) == [run_dir.name]  # no model, no temporary
    assert [p.name for p in run_dir.glob("checkpoint-*")] == ["checkpoint-2"]
    report = training.train_student(cfg, *_inputs(tiny), out)
    assert report.resumed_from_step == 2 and report.steps == 6
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny-qwen3"]
    assert not any("adapter" in p.name or p.name.startswith("checkpoint-") for p in out.iterdir())


# ---- bf16 compute over fp32 master weights --------------------------------------------------------------------


@pytest.mark.parametrize("master, moved_at_least, moved_at_most", [("fp32", 0.9, 1.0), ("bf16", 0.0, 0.4)])
def test_bf16_training_keeps_small_updates_with_fp32_master_weights(tiny: Path, tmp_path: Path, master: str,
                                                                    moved_at_least: float,
                                                                    moved_at_most: float) -> None:
    """Three AdamW steps at lr 1e-5 (about 1e-5 a weight each) under bf16: fp32 master weights keep nearly every
    one; bf16 weights round most of them away (std-0.02 weights have a bf16 spacing of up to 1.2e-4). Either way
    the saved model is bfloat16, the master weights rounded once."""
    import torch
    from transformers import TrainerCallback

    name = "model.layers.0.mlp.up_proj.weight"

    class Masters(TrainerCallback):
        def on_train_end(self, args, state, control, model=None, **kwargs):
            self.weight = dict(model.named_parameters())[name].detach().clone()

    masters = Masters()
    cfg = make_cfg(precision="bf16", master_weights=master, learning_rate=1e-5, warmup_ratio=0.0,
                   scheduler="constant", save_steps=None, save_minutes=None)
    report = training.train_student(cfg, *_inputs(tiny), tmp_path / "bf16", callbacks=[masters])
    assert report.precision == "bf16" and report.steps == 3
    assert report.master_weights == {"fp32": "float32", "bf16": "bfloat16"}[master]
    trained = masters.weight
    assert trained.dtype == getattr(torch, report.master_weights)
    start = _weights(tiny / "base")[name].to(trained.dtype)  # the weights as loaded (bf16 ones: rounded)
    moved = (trained != start).float().mean().item()
    assert moved_at_least <= moved <= moved_at_most, moved
    saved = _weights(tmp_path / "bf16")
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    assert torch.equal(saved[name], trained.to(torch.bfloat16))
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


def test_a_sharded_model_is_rewritten_in_bf16(tiny: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny / "base"), dtype=torch.float32)
    model.save_pretrained(str(tmp_path / "sharded"), max_shard_size="40KB")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    training.save_in_dtype(tmp_path / "sharded", "bfloat16")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(p.numel() * 2 for p in model.parameters())  # tied head once
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "sharded"))  # the dtype the folder says
    assert loaded.dtype == torch.bfloat16
    want = dict(model.named_parameters())
    for name, weight in loaded.named_parameters():
        assert torch.equal(weight, want[name].to(torch.bfloat16)), name


# ---- several processes ----------------------------------------------------------------------------------------

RANK = """
import json, sys
from gymforge.core.config import GymforgeConfig
from gymforge.stages import training
from transformers import TrainerCallback

class Preempted(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == int(sys.argv[6]):
            raise RuntimeError("preempted")

cfg = GymforgeConfig.model_validate(json.loads(sys.argv[1]))
report = training.train_student(cfg, *sys.argv[2:6], callbacks=[Preempted()])
print("REPORT", report.model_dump_json())
"""


def _two_ranks(cfg, inputs: list[str], out: Path, fail_at: int) -> list[tuple[int, str]]:
    """`train_student` on two CPU processes (one gloo group, as `accelerate launch` starts them)."""
    from gymforge.llm.serving import free_port

    group = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
             "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, cfg.model_dump_json(), *inputs, str(out), str(fail_at)],
                              env={**os.environ, **group, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    return [(p.wait(timeout=300), p.communicate()[0]) for p in procs]


@pytest.mark.heavy  # three launches of two processes: 62 s each on the 2-core machine at load 12, ~50 s of it imports
def test_two_processes_save_together_and_resume(tiny: Path, tmp_path: Path) -> None:
    """Timed saves on two processes (the main one decides when, both save at that step), a failure, then a rerun
    on two processes resuming to the weights of an uninterrupted two-process run."""
    import torch

    cfg = make_cfg(epochs=3.0, save_steps=None, save_minutes=1e-6)  # a save after every step; 2 steps an epoch
    out = tmp_path / "ranks" / "tiny-qwen3"
    failed = _two_ranks(cfg, _inputs(tiny), out, fail_at=3)
    assert all(rc != 0 and "preempted" in text for rc, text in failed), failed[0][1][-3000:]
    run_dir = resume.resume_dir(out)
    assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert resume.newest_complete(run_dir, resume.run_key(cfg, *_inputs(tiny), 2)).name == "checkpoint-2"
    done = _two_ranks(cfg, _inputs(tiny), out, fail_at=0)
    assert [rc for rc, _ in done] == [0, 0], done[0][1][-3000:] + done[1][1][-3000:]
    report = json.loads(done[0][1].split("REPORT ", 1)[1].splitlines()[0])
    assert report["resumed_from_step"] == 2 and report["steps"] == 6 and report["world_size"] == 2
    assert not run_dir.exists()
    clean = tmp_path / "clean" / "tiny-qwen3"
    uninterrupted = _two_ranks(make_cfg(epochs=3.0, save_steps=None, save_minutes=None), _inputs(tiny), clean, 0)
    assert [rc for rc, _ in uninterrupted] == [0, 0], uninterrupted[0][1][-3000:]
    resumed, reference = _weights(out), _weights(clean)
    for name, weight in reference.items():
        torch.testing.assert_close(resumed[name], weight, rtol=1e-5, atol=1e-6, msg=name)
