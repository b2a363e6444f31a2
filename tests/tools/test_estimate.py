"""`gymforge estimate`: arithmetic projections, measured vs default constants, the paper-scale config."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gymforge.cli import main
from gymforge.core.config import GymforgeConfig, load_config
from gymforge.tools.estimate import DEFAULTS, estimate, load_configs
from gymforge.tools.pilot import measure
from results_fixture import ROLLOUT_CALLS, ROLLOUT_COMPLETION, ROLLOUT_PROMPT, ROLLOUT_STEPS, build_results

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "configs" / "paper-scale.yaml"


PRICED = {"teacher": {"price": {"input_per_mtok": 1.25, "output_per_mtok": 10.0}}}


def cfg_with(**sections) -> GymforgeConfig:
    return GymforgeConfig.model_validate({"llm": {**PRICED, **sections.pop("llm", {})}, **sections})


def stage(report: dict, name: str) -> dict:
    return next(s for s in report["stages"] if s["name"] == name)


def test_doubling_per_task_doubles_rollout_calls_tokens_and_cost() -> None:
    base = estimate(cfg_with(topics={"n": 100}, trajectories={"per_task": 8, "shard_size": 4}))
    double = estimate(cfg_with(topics={"n": 100}, trajectories={"per_task": 16, "shard_size": 4}))
    a, b = stage(base, "trajectories"), stage(double, "trajectories")
    assert b["items"] == pytest.approx(2 * a["items"]) and a["items"] == pytest.approx(100 * 0.5 * 8)
    for key in ("calls", "prompt_tokens", "completion_tokens", "cost_usd", "cpu_hours"):
        assert b[key] == pytest.approx(2 * a[key]) and a[key] > 0
    # stages before the rollouts do not change
    assert stage(double, "verification")["calls"] == stage(base, "verification")["calls"]
    assert double["plan"]["shards"] == 2 * base["plan"]["shards"]


def test_counts_follow_the_config_arithmetic() -> None:
    cfg = cfg_with(topics={"n": 1000, "batch_size": 20},
                   trajectories={"per_task": 10, "shard_size": 4, "concurrency": 2, "gpus": 1},
                   evaluate={"runs_per_task": 3})
    r = estimate(cfg)
    assert r["plan"]["topic_batches"] == 50 and stage(r, "topics")["calls"] == pytest.approx(50)
    verified = 1000 * DEFAULTS["verified_per_slot"].value
    assert r["plan"]["rollouts"] == pytest.approx(verified * 10)
    assert r["plan"]["shards"] == pytest.approx(verified * 3)  # ceil(10 / 4)
    assert r["plan"]["eval_runs"] == 3 * 5 * 3  # 3 models x 5 built-in tasks x 3 runs
    assert r["plan"]["kept_trajectories"] == pytest.approx(verified * 10 * DEFAULTS["kept_per_rollout"].value)
    # shard GPU-hours: gpus x waves x rollout wall for GPU tasks (post-training on a GPU base); none when shards
    # declare no GPU
    gpu_tasks = {"topics": {"n": 1000, "batch_size": 20, "kind": "post_training"},
                 "post_training": {"base_model": "Qwen/Qwen3-0.6B-Base"}}
    one = estimate(cfg_with(**gpu_tasks, trajectories={"per_task": 10, "shard_size": 4, "concurrency": 2, "gpus": 1}))
    two = estimate(cfg_with(**gpu_tasks, trajectories={"per_task": 10, "shard_size": 4, "concurrency": 2, "gpus": 2}))
    assert stage(one, "trajectories")["gpu_hours"] > 0
    assert stage(two, "trajectories")["gpu_hours"] == pytest.approx(2 * stage(one, "trajectories")["gpu_hours"])
    no_gpu = estimate(cfg_with(**gpu_tasks, trajectories={"per_task": 10, "shard_size": 4}))
    assert stage(no_gpu, "trajectories")["gpu_hours"] == 0


def test_measured_averages_are_used_when_a_results_dir_is_given(tmp_path: Path) -> None:
    results = build_results(tmp_path)
    m = measure(results)
    calls, steps = sum(ROLLOUT_CALLS), sum(ROLLOUT_STEPS)
    assert m.values["rollout_steps"] == pytest.approx(steps / 2)
    assert m.values["rollout_calls_per_step"] == pytest.approx(calls / steps)
    assert m.values["rollout_prompt_per_call"] == pytest.approx(sum(ROLLOUT_PROMPT) / calls)
    assert m.values["rollout_completion_per_call"] == pytest.approx(sum(ROLLOUT_COMPLETION) / calls)
    assert m.values["verified_per_slot"] == pytest.approx(0.5)
    assert m.values["kept_per_rollout"] == pytest.approx(0.5)
    assert m.values["verification_calls_per_item"] == pytest.approx(20)
    assert m.values["verification_cpu_s_per_item"] == pytest.approx(40.0)
    assert m.values["rollout_cpu_s"] == pytest.approx(25.0)  # 50 s cpu_time over the shard's 2 rollouts

    cfg = cfg_with(topics={"n": 10}, trajectories={"per_task": 4})
    measured, default = estimate(cfg, m), estimate(cfg)
    assert measured["constants"]["rollout_steps"]["source"] == "pilot"
    assert default["constants"]["rollout_steps"]["source"] == "mlgym"
    assert default["constants"]["verified_per_slot"]["source"] == "paper"
    # 10 slots x 0.5 verified x 4 rollouts x 5 steps x 1.2 calls per step
    assert stage(measured, "trajectories")["calls"] == pytest.approx(10 * 0.5 * 4 * 5 * 1.2)
    assert stage(measured, "trajectories")["calls"] != pytest.approx(stage(default, "trajectories")["calls"])
    assert measured["measured_from"] == str(results) and default["measured_from"] is None


def test_cli_measures_the_config_results_dir_by_default_and_defaults_otherwise(tmp_path: Path, capsys,
                                                                               monkeypatch) -> None:
    results = build_results(tmp_path)
    monkeypatch.chdir(tmp_path)  # no config.yaml here: only the given file counts
    cfg_file = tmp_path / "small.yaml"
    cfg_file.write_text(yaml.safe_dump({"results_dir": str(results), "topics": {"n": 10}}))
    main(["estimate", "--configfile", str(cfg_file), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["measured_from"] == str(results)
    assert report["constants"]["rollout_steps"] == {"value": 5.0, "source": "pilot",
                                                    "note": report["constants"]["rollout_steps"]["note"]}
    main(["estimate", "--configfile", str(cfg_file), "--json", "--defaults"])
    assert json.loads(capsys.readouterr().out)["constants"]["rollout_steps"]["source"] == "mlgym"
    empty = tmp_path / "empty"
    empty.mkdir()
    main(["estimate", "--configfile", str(cfg_file), "--results", str(empty), "--json"])
    captured = capsys.readouterr()
    assert json.loads(captured.out)["measured_from"] is None and "no finished run" in captured.err


def test_configfiles_layer_in_order_and_inherit_config_yaml_only_through_base(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"topics": {"n": 7, "batch_size": 3},
                                                          "trajectories": {"per_task": 5}}))
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({"trajectories": {"per_task": 9, "max_steps": 20}}))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"trajectories": {"per_task": 11}}))
    cfg = load_configs(["a.yaml", "b.yaml"])
    assert (cfg.topics.n, cfg.topics.batch_size) == (GymforgeConfig().topics.n, GymforgeConfig().topics.batch_size)
    assert (cfg.trajectories.per_task, cfg.trajectories.max_steps) == (11, 20)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.yaml").write_text(yaml.safe_dump({"base": "../config.yaml", "topics": {"n": 8}}))
    cfg = load_configs(["sub/c.yaml", "a.yaml"])
    assert (cfg.topics.n, cfg.topics.batch_size, cfg.trajectories.per_task) == (8, 3, 9)
    assert load_configs([]).topics.n == 7  # no file given: ./config.yaml


def test_steps_are_capped_at_max_steps_and_budget_is_checked() -> None:
    short = estimate(cfg_with(trajectories={"max_steps": 3}, llm={"budget_usd": 0.001}))
    assert short["constants"]["rollout_steps"]["value"] > 4
    assert "~4.0 steps" in stage(short, "trajectories")["note"]  # max_steps 3 + the auto-submission
    from gymforge.tools.estimate import render

    assert "EXCEEDS" in render(short)


def test_paper_scale_config_validates_with_the_paper_settings() -> None:
    cfg = load_config(PAPER)
    assert (cfg.topics.n, cfg.topics.batch_size) == (1000, 20)
    assert (cfg.trajectories.per_task, cfg.trajectories.max_steps, cfg.trajectories.gpus) == (256, 50, 1)
    assert cfg.filter.max_tokens == 48000
    assert (cfg.train.student, cfg.train.max_length, cfg.train.gpus, cfg.train.strategy) == (
        "Qwen/Qwen3-4B", 32768, 8, "fsdp")
    assert cfg.llm.teacher.provider == "openai" and cfg.llm.teacher.base_url
    assert cfg.llm.teacher.price.input_per_mtok > 0 and cfg.llm.teacher.price.output_per_mtok > 0
    assert (cfg.evaluate.benchmark, cfg.evaluate.runs_per_task) == ("mlgym", 64)


def test_paper_scale_estimate_is_fast_and_arithmetic(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gymforge", "estimate", "--configfile", str(PAPER), "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert elapsed < 30, f"estimate took {elapsed:.1f}s"
    r = json.loads(proc.stdout)
    verified = 1000 * DEFAULTS["verified_per_slot"].value
    assert r["plan"]["topic_batches"] == 50
    assert r["plan"]["rollouts"] == pytest.approx(verified * 256) and r["plan"]["shards"] == pytest.approx(verified)
    assert r["plan"]["eval_runs"] == 4 * 13 * 64  # teacher, student-base, student-sft, student-rl
    assert stage(r, "training")["gpu_hours"] > 0 and stage(r, "evaluate")["gpu_hours"] > 0  # 2 served students
    # paper-scale's generated tasks are research tasks, whose shards ask for no GPU (CPU tasks)
    assert r["plan"]["shard_gpus"] == 0 and stage(r, "trajectories")["gpu_hours"] == 0
    assert math.isfinite(r["totals"]["cost_usd"]) and r["totals"]["cost_usd"] > 0
    text = subprocess.run([sys.executable, "-m", "gymforge", "estimate", "--configfile", str(PAPER)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60).stdout
    assert "trajectories" in text and "GPU-h" in text and "total" in text


def test_shard_gpu_hours_follow_whether_the_tasks_code_needs_a_gpu() -> None:
    """A shard asks for trajectories.gpus only for a task whose code needs a GPU (runtime.resources.needs_gpu): the
    estimate counts GPU-hours for those shards and none for CPU tasks' shards, saying which it assumed."""
    shards = {"per_task": 8, "shard_size": 4, "gpus": 1}

    def shard_gpu_hours(**sections) -> tuple[float, str]:
        r = estimate(cfg_with(topics={"n": 100, **sections.pop("topics", {})}, trajectories=shards, **sections))
        return stage(r, "trajectories")["gpu_hours"], stage(r, "trajectories")["note"]

    research, note = shard_gpu_hours()  # CSV / model / Python submissions: CPU tasks
    assert research == 0 and "CPU tasks" in note and "shard job-hours on CPU nodes" in note
    cpu_base, note = shard_gpu_hours(topics={"kind": "post_training"})  # each task's own base: the CPU build
    assert cpu_base == 0 and "smollm2-135m" in note
    overridden, _ = shard_gpu_hours(topics={"kind": "post_training"}, post_training={"base_model": "smollm2-135m"})
    assert overridden == 0
    gpu_base, note = shard_gpu_hours(topics={"kind": "post_training"},
                                     post_training={"base_model": "Qwen/Qwen3-0.6B-Base"})
    assert gpu_base > 0 and "GPU tasks" in note and "Qwen/Qwen3-0.6B-Base" in note
    # the same shards, the same wall: only the GPU request differs
    r = estimate(cfg_with(topics={"n": 100, "kind": "post_training"}, trajectories=shards,
                          post_training={"base_model": "Qwen/Qwen3-0.6B-Base"}))
    assert r["plan"]["shard_gpus"] == 1 and r["plan"]["shards"] == pytest.approx(100 * 0.5 * 2)


def test_verification_and_micro_gpu_hours_follow_the_tasks_gpu_request() -> None:
    """A slot's verification job and micro task ask for the GPUs its shards get (runtime.resources.verification and
    micro: trajectories.gpus for a task whose code needs a GPU, else none): the estimate charges them for their wall
    time on GPU tasks and charges nothing for CPU tasks."""
    d = {k: DEFAULTS[k].value for k in ("verification_calls_per_item", "llm_s_per_call", "rollout_exec_s_per_step",
                                         "micro_exec_steps_per_item", "code_ok_per_slot", "verified_per_slot")}
    gpu_tasks = {"topics": {"n": 100, "kind": "post_training"}, "post_training": {"base_model": "Qwen/Qwen3-0.6B-Base"}}
    r = estimate(cfg_with(**gpu_tasks, trajectories={"gpus": 2}))
    verification, micro = stage(r, "verification"), stage(r, "micro")
    verification_wall_h = d["verification_calls_per_item"] * (d["llm_s_per_call"] + d["rollout_exec_s_per_step"]) / 3600
    assert verification["gpu_hours"] == pytest.approx(100 * d["code_ok_per_slot"] * 2 * verification_wall_h)
    assert micro["items"] == pytest.approx(100 * d["verified_per_slot"])  # one micro task per verified task
    assert micro["gpu_hours"] == pytest.approx(
        micro["items"] * 2 * d["micro_exec_steps_per_item"] * d["rollout_exec_s_per_step"] / 3600)
    assert "2 GPU each: GPU tasks" in verification["note"] and "2 GPU each: GPU tasks" in micro["note"]
    # CPU tasks (research tasks; post-training on the CPU base): the jobs ask for no GPU, even with trajectories.gpus
    for cpu_tasks in ({"topics": {"n": 100}}, {"topics": {"n": 100, "kind": "post_training"}}):
        r = estimate(cfg_with(**cpu_tasks, trajectories={"gpus": 2}))
        assert stage(r, "verification")["gpu_hours"] == 0 and stage(r, "micro")["gpu_hours"] == 0
        assert stage(r, "micro")["items"] > 0 and stage(r, "micro")["cpu_hours"] > 0
    # RL on the verified tasks themselves builds no micro tasks; rl.tasks limits them to those slots
    r = estimate(cfg_with(**gpu_tasks, trajectories={"gpus": 1}, rl={"tasks_from": "environments"}))
    assert stage(r, "micro")["items"] == 0 and stage(r, "micro")["gpu_hours"] == 0
    r = estimate(cfg_with(**gpu_tasks, trajectories={"gpus": 1}, rl={"tasks": ["t0001", "t0002", "t0003"]}))
    assert stage(r, "micro")["items"] == 3 and stage(r, "micro")["gpu_hours"] > 0


def test_request_examples_train_every_request_and_auto_follows_the_longest_trajectory() -> None:
    """Under `sft.example_unit: request` each teacher reply is an example holding the request before it, so the
    SFT trains more tokens than one conversation per trajectory; `auto` picks `request` only when the student's
    context is shorter than the longest kept trajectory (as the sft stage resolves it)."""
    def plan(unit: str, max_length: int) -> dict:
        return estimate(cfg_with(sft={"example_unit": unit}, train={"max_length": max_length}))["plan"]

    longest = DEFAULTS["kept_tokens_max"].value
    conversation, request = plan("conversation", 32768), plan("request", 32768)
    assert request["kept_trajectories"] == conversation["kept_trajectories"]
    assert request["sft_examples"] == pytest.approx(conversation["sft_examples"] * DEFAULTS["replies_per_kept"].value)
    assert request["train_tokens"] == pytest.approx(
        conversation["train_tokens"] * DEFAULTS["request_tokens_per_kept"].value / DEFAULTS["kept_tokens_mean"].value)
    assert plan("auto", int(longest) + 1) == conversation
    short = int(longest) - 1
    assert plan("auto", short) == plan("request", short)
    # each request example is cut at max_length: a tiny context bounds the tokens per reply
    assert plan("request", 256)["train_tokens"] == pytest.approx(
        request["sft_examples"] * 256 * GymforgeConfig().train.epochs)


def test_default_constants_are_mlgyms_released_runs_and_the_estimate_says_so(tmp_path: Path) -> None:
    """Without a pilot the agent loop's constants (steps, tokens per call, trajectory lengths, reasoning) come
    from MLGym's released runs, read from the stored table, and the report and its text name that source."""
    from gymforge.tools.estimate import CONSTANTS_FILE, render

    table = yaml.safe_load(CONSTANTS_FILE.read_text())
    assert set(table) == set(DEFAULTS) and all(DEFAULTS[k].note for k in DEFAULTS)
    loop = ("rollout_steps", "rollout_calls_per_step", "rollout_prompt_per_call", "rollout_completion_per_call",
            "reasoning_per_completion", "kept_tokens_max", "request_tokens_per_kept", "eval_steps_per_run")
    r = estimate(load_config(PAPER))
    for key in loop:
        assert DEFAULTS[key].source == "mlgym"
        assert r["constants"][key] == {"value": table[key]["value"], "source": "mlgym", "note": table[key]["note"]}
    assert r["constants_source"]["primary"] == "MLGym released runs"
    assert r["measured_from"] is None
    # steps per rollout follow the table: a different value there would change the plan's calls
    steps = min(table["rollout_steps"]["value"], 51)
    assert stage(r, "trajectories")["calls"] == pytest.approx(
        r["plan"]["rollouts"] * steps * table["rollout_calls_per_step"]["value"])
    assert render(r).splitlines()[2].startswith("constants from MLGym released runs")


def test_reasoning_tokens_of_a_reasoning_teacher_are_priced_as_output() -> None:
    price = {"input_per_mtok": 1.0, "output_per_mtok": 10.0}
    chat = estimate(cfg_with(llm={"teacher": {"model": "chat-model", "price": price}}))
    reasoning_cfg = cfg_with(llm={"teacher": {"model": "chat-model", "price": price,
                                              "token_param": "max_completion_tokens"}})
    by_param = estimate(reasoning_cfg)
    ratio = DEFAULTS["reasoning_per_completion"].value
    assert chat["reasoning"]["ratio"] == 0 and stage(chat, "trajectories")["reasoning_tokens"] == 0
    assert "max_completion_tokens" in by_param["reasoning"]["reasoning_teacher"]
    for name in ("topics", "code", "trajectories"):
        a, b = stage(chat, name), stage(by_param, name)
        assert b["completion_tokens"] == pytest.approx(a["completion_tokens"])
        assert b["reasoning_tokens"] == pytest.approx(a["completion_tokens"] * ratio) and b["reasoning_tokens"] > 0
        assert b["cost_usd"] - a["cost_usd"] == pytest.approx(b["reasoning_tokens"] * 10.0 / 1e6)
    assert by_param["totals"]["cost_usd"] > chat["totals"]["cost_usd"]
    # the model's name alone marks OpenAI's reasoning families; the option overrides, 0 prices none
    by_name = estimate(cfg_with(llm={"teacher": {"model": "gpt-5", "price": price}}))
    assert by_name["reasoning"]["ratio"] == ratio and by_name["constants"]["reasoning_per_completion"]["source"] == "mlgym"
    twice = estimate(reasoning_cfg, reasoning_ratio=2.0)
    traj = stage(twice, "trajectories")
    assert traj["reasoning_tokens"] == pytest.approx(2 * traj["completion_tokens"])
    assert twice["constants"]["reasoning_per_completion"]["source"] == "option"
    assert estimate(reasoning_cfg, reasoning_ratio=0.0)["totals"]["cost_usd"] == pytest.approx(
        chat["totals"]["cost_usd"])


def test_pilot_run_constants_are_used_and_stated_with_results(tmp_path: Path, capsys, monkeypatch) -> None:
    """`gymforge estimate --results <pilot>`: the pilot's ledger and records give the constants, the hidden
    reasoning tokens in its ledger give the ratio, and both outputs name the pilot as the source."""
    results = build_results(tmp_path)
    ledger = [("topics", 170, 20, 0), ("trajectories", 6000, 600, 400), ("trajectories", 6000, 600, 400)]
    (results / "llm" / "calls.jsonl").write_text("".join(
        json.dumps({"stage": s, "model": "teacher-x", "cached": False, "prompt_tokens": p, "completion_tokens": c,
                    "reasoning_tokens": h, "cost_usd": 0.0, "ok": True}) + "\n" for s, p, c, h in ledger))
    monkeypatch.chdir(tmp_path)
    cfg_file = tmp_path / "big.yaml"
    cfg_file.write_text(yaml.safe_dump({"topics": {"n": 100}, "trajectories": {"per_task": 8}}))
    main(["estimate", "--configfile", str(cfg_file), "--results", str(results), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["constants_source"]["primary"] == f"pilot run at {results}"
    assert r["measured_from"] == str(results)
    used = r["constants"]
    assert used["rollout_steps"]["source"] == "pilot" and used["rollout_steps"]["value"] == pytest.approx(5.0)
    ratio = 800 / (1220 - 800)  # hidden per visible completion token over the teacher's ledger lines
    assert used["reasoning_per_completion"] == {"value": pytest.approx(ratio), "source": "pilot",
                                                "note": used["reasoning_per_completion"]["note"]}
    # the shards' tokens received include the hidden ones: the visible part is priced once, the rest as reasoning
    visible = sum(ROLLOUT_COMPLETION) / sum(ROLLOUT_CALLS) / (1 + ratio)
    assert used["rollout_completion_per_call"]["value"] == pytest.approx(visible)
    traj = stage(r, "trajectories")
    assert traj["reasoning_tokens"] == pytest.approx(traj["completion_tokens"] * ratio)
    assert traj["calls"] == pytest.approx(100 * 0.5 * 8 * 5 * 1.2)  # the pilot's yield, steps and calls per step
    main(["estimate", "--configfile", str(cfg_file), "--results", str(results)])
    text = capsys.readouterr().out
    assert f"constants from pilot run at {results}" in text and "(pilot)" in text


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MLGYM_ROOT"), reason="MLGYM_ROOT (an MLGym checkout) not set")
def test_stored_mlgym_constants_are_what_the_released_runs_give() -> None:
    """bench/mlgym_trajectory_stats.py recomputes the table's `mlgym` entries from the checkout's released runs."""
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "mlgym_trajectory_stats.py"), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    computed = json.loads(proc.stdout)
    for key, entry in computed.items():
        assert DEFAULTS[key].source == "mlgym"
        assert DEFAULTS[key].value == pytest.approx(entry["value"], rel=1e-6), key
