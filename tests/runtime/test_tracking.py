"""Training runs in a tracker (issue #41, item 5): SFT and RL log their steps to trackio, offline, under results/;
the steps are read back from trackio's own store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gymforge.runtime import tracking
from gymforge.core.config import GymforgeConfig


def test_a_run_is_logged_and_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMFORGE_TRACKING", "trackio")
    cfg = GymforgeConfig.model_validate({"results_dir": str(tmp_path / "results")})
    run = tracking.open_tracker(cfg, name="sft-x", kind="sft", config={"lr": 1e-3})
    assert run.backend == "trackio"
    for step in range(3):
        run.log({"loss": 1.0 / (step + 1), "skipped": "not a number", "flag": True}, step=step)
    run.finish()
    store = tmp_path / "results" / "trackio"
    assert tracking.store_dir(cfg) == store and (store / "gymforge.db").is_file()
    steps = tracking.read_steps(store, "gymforge", "sft-x")
    assert [(s["step"], s["loss"], s["flag"]) for s in steps] == [(0, 1.0, 1.0), (1, 0.5, 1.0), (2, 1 / 3, 1.0)]
    assert all("skipped" not in s for s in steps)
    from gymforge.report.summary import tracker_html

    assert f"TRACKIO_DIR={store.resolve()} trackio show --project gymforge" in tracker_html(tmp_path / "results")
    assert tracker_html(tmp_path / "elsewhere") == ""  # no tracker store: the run summary says nothing


def test_none_and_a_tracker_that_cannot_start_log_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = GymforgeConfig.model_validate({"results_dir": str(tmp_path / "r"), "tracking": {"backend": "none"}})
    monkeypatch.delenv("GYMFORGE_TRACKING", raising=False)
    assert tracking.open_tracker(cfg, name="a", kind="rl").backend == "none"
    monkeypatch.setenv("GYMFORGE_TRACKING", "wandb")  # not installed here: a warning, and the run goes on untracked
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        assert tracking.open_tracker(cfg, name="a", kind="rl").backend == "none"
    assert not (tmp_path / "r").exists()


def test_sft_logs_every_step_to_trackio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_training import example, make_cfg, save_dataset, TASKS, SYSTEM, REPLY, user

    from gymforge.stages import training
    from gymforge.student import base as student
    from gymforge.student.tokenizer import train_offline_tokenizer

    monkeypatch.setenv("GYMFORGE_TRACKING", "trackio")
    monkeypatch.setattr(training.flops, "device_peak_flops", lambda device=None: 1e12)  # as if on a listed GPU
    texts = [SYSTEM, REPLY, *(user(t) for t in TASKS)]
    train_offline_tokenizer(texts, vocab_size=400).save_pretrained(str(tmp_path / "tokenizer"))
    cfg = make_cfg().model_copy(update={"results_dir": str(tmp_path / "results")})
    student.build_base(cfg, tmp_path / "tokenizer", tmp_path / "base")
    save_dataset([example(t) for t in TASKS], tmp_path / "dataset")
    report = training.train_student(cfg, tmp_path / "dataset", tmp_path / "base", tmp_path / "tokenizer",
                                    tmp_path / "ckpt")
    steps = tracking.read_steps(tmp_path / "results" / "trackio", "gymforge", f"sft-{cfg.train.name}-seed0")
    metrics = [json.loads(line) for line in (tmp_path / "ckpt" / training.METRICS).read_text().splitlines()]
    assert [s["step"] for s in steps] == [m["step"] for m in metrics] and len(steps) == report.steps
    assert [s["loss"] for s in steps] == pytest.approx([m["loss"] for m in metrics])
    assert all(s["tokens_per_s"] > 0 for s in steps[1:]) and "learning_rate" in steps[0]
    # mfu = the model's FLOPs per token (attention at a length within the examples') x tokens/s / the peak
    from transformers import AutoConfig

    from gymforge.student.flops import flops_per_token

    config = AutoConfig.from_pretrained(tmp_path / "base")
    per_token = [s["mfu"] * 1e12 / s["tokens_per_s"] for s in steps[1:]]
    assert "mfu" not in steps[0] and per_token
    assert per_token == pytest.approx([per_token[0]] * len(per_token))
    assert flops_per_token(config, 1) < per_token[0] <= flops_per_token(config, cfg.train.max_length)


def test_rl_logs_every_iteration_to_trackio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_rl import fake_episode, fake_tasks
    from test_rl import make_cfg as rl_cfg

    from gymforge.stages.rl import run_rl
    from gymforge.student import base as student_base
    from gymforge.student.tokenizer import train_offline_tokenizer

    monkeypatch.setenv("GYMFORGE_TRACKING", "trackio")
    texts = ["You are an agent.", "Task: predict prices.", "DISCUSSION\nlook\n```\nls\n```", "python baseline.py"]
    train_offline_tokenizer(texts, vocab_size=400).save_pretrained(str(tmp_path / "tokenizer"))
    cfg = rl_cfg(iterations=2, improve_fraction=0.0).model_copy(update={"results_dir": str(tmp_path / "results")})
    sft = student_base.build_base(cfg, tmp_path / "tokenizer", tmp_path / "sft")

    def collect(policy_dir: Path, iteration: int, plans: list[Any]) -> list[Any]:
        return [(p, fake_episode(p.seed, k % 2 == 0), 1.0) for k, p in enumerate(plans)]

    curve = run_rl(cfg, sft, fake_tasks(tmp_path / "task"), tmp_path / "rl" / "checkpoint", tmp_path / "rl" / "curve.json",
                   collect=collect)
    steps = tracking.read_steps(tmp_path / "results" / "trackio", "gymforge", f"rl-{cfg.train.name}-seed0")
    assert [s["step"] for s in steps] == [0, 1]
    for s, row in zip(steps, curve["iterations"], strict=True):
        assert s["mean_reward"] == pytest.approx(row["mean_reward"]) and s["kl"] == pytest.approx(row["kl"])
        assert s["mismatch_abs_logprob"] == row["mismatch_abs_logprob"] and s["retokenized"] == row["samples"]


class _Recorder(tracking.Tracker):
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.rows.append(dict(metrics))


def _drive(callback: Any, recorder: _Recorder, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Two logged steps, 1,000 tokens 2 s apart on a fake clock, as the Trainer calls the callback."""
    import time
    from types import SimpleNamespace

    clock = iter([10.0, 12.0])
    callback.on_train_begin(None, None, None)
    with monkeypatch.context() as m:
        m.setattr(time, "monotonic", lambda: next(clock))
        for step, tokens in ((1, 500), (2, 1500)):
            state = SimpleNamespace(is_world_process_zero=True, global_step=step)
            callback.on_log(None, state, None, logs={"loss": 1.0, "num_tokens": tokens})
    return recorder.rows


def test_sft_callback_logs_mfu_only_with_a_known_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = _Recorder()
    callback = tracking.trainer_callback(recorder, flops_per_token=6e9, peak_flops=1e15)
    first, second = _drive(callback, recorder, monkeypatch)
    assert "mfu" not in first and second["tokens_per_s"] == 500.0
    assert second["mfu"] == pytest.approx(6e9 * 500.0 / 1e15)
    recorder = _Recorder()  # a CPU or an unlisted GPU: no peak, no mfu key at all
    callback = tracking.trainer_callback(recorder, flops_per_token=6e9, peak_flops=None)
    rows = _drive(callback, recorder, monkeypatch)
    assert rows[1]["tokens_per_s"] == 500.0 and all("mfu" not in row for row in rows)
