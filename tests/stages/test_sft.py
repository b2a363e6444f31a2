"""Stage 3.6: filters, SFT examples, dataset outputs, export, plots, status and the student tokenizer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import DatasetCard

from gymforge.agent.sources import rollout_candidate
from gymforge.agent.trajectory import sft_messages
from gymforge.core.config import FilterConfig, GymforgeConfig
from gymforge.core.prompts import render, templates_dir
from gymforge.core.records import AgentInfo, RolloutRecord, SandboxRef, ShardRecord, TeacherRef, Trajectory, TrajectoryStep
from gymforge.stages.sft import REASONS, Kept, build_sft, is_successful, reject_reason
from gymforge.stages.sft_export import export_sft
from gymforge.student.tokenizer import build_tokenizer, count_chat_tokens, load_tokenizer

EXIT_STATUSES = ["submitted", "autosubmission (max_steps)", "autosubmission (format)", "autosubmission (context)",
                 "autosubmission (cost)", "submission_not_found (submit)", "submission_not_found (max_steps)",
                 "evaluation_format_error (submit)", "evaluation_format_error (max_steps)"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return build_tokenizer("offline", tmp_path_factory.mktemp("tok") / "tokenizer", templates_dir(), [])


def trajectory(actions: list[str], *, exit_status: str = "submitted", scores: list[dict] | None = None,
               tag: str = "", observation: str = "ok") -> Trajectory:
    """An agent history as the loop writes it: system, task, then reply/observation pairs; the last reply ends it."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent.", "agent": "primary"},
        {"role": "user", "content": f"TASK DESCRIPTION:\nDo the thing {tag}", "agent": "primary"},
    ]
    steps = []
    for i, action in enumerate(actions, 1):
        response = f"DISCUSSION\nstep {i} {tag}\n\n```\n{action}\n```"
        history.append({"role": "assistant", "content": response, "agent": "primary", "thought": f"step {i}",
                        "action": action})
        steps.append(TrajectoryStep(action=action, observation=observation, response=response, state="{}",
                                    thought=f"step {i}", execution_time=0.1, step=i))
        if i < len(actions):
            history.append({"role": "user", "content": f"{observation} {i}\n(Current Step: {i})", "agent": "primary"})
    return Trajectory(trajectory=steps, history=history,
                      info=AgentInfo(exit_status=exit_status, score=[{"rmse": 1.0}] if scores is None else scores))


def rollout(traj: Trajectory, index: int, slot: str = "t0000", task: str = "taskA") -> RolloutRecord:
    return RolloutRecord(slot=slot, task_id=task, rollout=index, seed=1000 + index,
                         teacher=TeacherRef(provider="offline", model="gymforge-offline-teacher@0.5",
                                            endpoint="http://127.0.0.1:1/v1", temperature=0.7, max_tokens=4096),
                         sandbox=SandboxRef(backend="local", confinement="bwrap"), max_steps=50,
                         baseline={"rmse": 2.0}, fingerprint="f", wall_s=1.0, trajectory=traj)


def write_shard(root: Path, slot: str, rollouts: list[RolloutRecord], k: int = 0) -> Path:
    path = root / "trajectories" / slot / f"shard_{k:04d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ShardRecord(item=slot, status="ok", shard=k, task_id=rollouts[0].task_id if rollouts else None,
                                rollout_indices=[r.rollout for r in rollouts], rollouts=rollouts).model_dump_json())
    return path


def build(root: Path, shards: list[Path], tokenizer: Path, **filters: Any) -> dict[str, Any]:
    cfg = GymforgeConfig.model_validate({"results_dir": str(root), "filter": filters,
                                         "trajectories": {"per_task": 4}})
    sft = root / "sft"
    return build_sft(cfg, shards, tokenizer, jsonl_out=sft / "train.jsonl", dataset_out=sft / "dataset",
                     rollouts_out=sft / "rollouts.jsonl", stats_out=sft / "stats.json")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---- filters -------------------------------------------------------------------------------------------


def test_a_candidate_is_rejected_for_the_first_filter_it_fails_in_reasons_order():
    """`reject_reason` applies the filters in the order `REASONS` (and stats.json's `filters.order`) lists them:
    a candidate failing every filter, mended one filter at a time, is rejected for each reason in turn."""
    cfg = FilterConfig(max_tokens=10, max_per_task=1)
    good = rollout_candidate(rollout(trajectory(["ls", "submit"]), 0))
    kept = Kept(excluded=frozenset({good.slot}))  # decontamination dropped its slot
    kept.add(good)  # the same messages, of the same slot, were kept before
    c = dataclasses.replace(good, flags=["scorer_write"], scores=[], messages=None)
    reasons = [reject_reason(c, 11, kept, cfg)]
    kept = dataclasses.replace(kept, excluded=frozenset())
    reasons.append(reject_reason(c, 11, kept, cfg))
    c = dataclasses.replace(c, flags=[])
    reasons.append(reject_reason(c, 11, kept, cfg))
    c = dataclasses.replace(c, scores=good.scores)
    reasons.append(reject_reason(c, 11, kept, cfg))
    c = dataclasses.replace(c, messages=good.messages)
    reasons.append(reject_reason(c, 11, kept, cfg))
    reasons.append(reject_reason(c, 10, kept, cfg))  # exactly max_tokens is short enough
    kept.digests.clear()
    reasons.append(reject_reason(c, 10, kept, cfg))
    kept.per_slot.clear()
    reasons.append(reject_reason(c, 10, kept, cfg))
    assert reasons == [*REASONS, None]
    assert reject_reason(dataclasses.replace(c, flags=["scorer_write"]), 10, kept,
                         cfg.model_copy(update={"exclude_flagged": False})) is None


def test_length_filter_keeps_exactly_max_tokens_and_rejects_one_above(tmp_path, tokenizer_dir):
    traj = trajectory(["ls", "python train.py", "validate", "submit"])
    tokens = count_chat_tokens(load_tokenizer(tokenizer_dir), sft_messages(traj))
    shard = write_shard(tmp_path, "t0000", [rollout(traj, 0)])
    stats = build(tmp_path / "at", [shard], tokenizer_dir, max_tokens=tokens)
    assert stats["kept"] == 1 and lines(tmp_path / "at" / "sft" / "train.jsonl")[0]["tokens"] == tokens
    stats = build(tmp_path / "above", [shard], tokenizer_dir, max_tokens=tokens - 1)
    assert stats["kept"] == 0 and stats["discarded"] == {"too_long": 1}
    [summary] = lines(tmp_path / "above" / "sft" / "rollouts.jsonl")
    assert summary["reason"] == "too_long" and summary["tokens"] == tokens


@pytest.mark.parametrize("exit_status", EXIT_STATUSES)
def test_success_filter_for_each_exit_status(exit_status, tmp_path, tokenizer_dir):
    """Kept iff some score entry has a valid metric, whatever the exit status (a validate counts too)."""
    cases = {
        "scored": ([{"rmse": 1.5}], True),
        "validated_then_failed": ([{"rmse": 1.5}], True),
        "unscored": ([], False),
        "empty_entry": ([{}], False),
    }
    rollouts = [rollout(trajectory(["ls", "validate", "submit"], exit_status=exit_status, scores=scores, tag=name), i)
                for i, (name, (scores, _)) in enumerate(cases.items())]
    for rec, (_, expected) in zip(rollouts, cases.values(), strict=True):
        assert is_successful(rec.trajectory) is expected
    # a non-finite metric is no valid score (the evaluator never records one; JSON could not hold it)
    assert not is_successful(trajectory(["submit"], exit_status=exit_status, scores=[{"rmse": float("nan")}]))
    stats = build(tmp_path, [write_shard(tmp_path, "t0000", rollouts)], tokenizer_dir)
    kept = [row["id"] for row in lines(tmp_path / "sft" / "train.jsonl")]
    assert kept == [f"t0000-r{i:05d}" for i, (_, ok) in enumerate(cases.values()) if ok]
    assert stats["discarded"] == {"no_successful_submission": 2}
    assert stats["exit_status"] == {exit_status: {"total": 4, "kept": 2}}


def test_exact_duplicates_and_the_per_task_cap(tmp_path, tokenizer_dir):
    same = trajectory(["ls", "submit"], tag="same")
    a = [rollout(same, 0), rollout(same.model_copy(deep=True), 1), rollout(trajectory(["ls", "submit"], tag="x"), 2),
         rollout(trajectory(["ls", "submit"], tag="y"), 3)]
    b = [rollout(trajectory(["ls", "submit"], tag="same"), 0, slot="t0001", task="taskB")]  # same text, other task
    shards = [write_shard(tmp_path, "t0000", a), write_shard(tmp_path, "t0001", b)]
    stats = build(tmp_path, shards, tokenizer_dir, max_per_task=2)
    assert [row["id"] for row in lines(tmp_path / "sft" / "train.jsonl")] == ["t0000-r00000", "t0000-r00002"]
    assert stats["discarded"] == {"duplicate": 2, "over_task_cap": 1}
    assert stats["per_task"]["t0000"]["discarded"] == {"duplicate": 1, "over_task_cap": 1}
    stats = build(tmp_path / "nocap", shards, tokenizer_dir)
    assert stats["kept"] == 3 and stats["discarded"] == {"duplicate": 2}


def test_a_slot_decontamination_dropped_gives_no_example_and_is_counted(tmp_path, tokenizer_dir):
    shards = [write_shard(tmp_path, slot, [rollout(trajectory(["ls", "submit"], tag=slot), 0, slot=slot, task=slot)])
              for slot in ("t0000", "t0001")]
    cfg = GymforgeConfig.model_validate({"results_dir": str(tmp_path)})
    sft = tmp_path / "sft"
    stats = build_sft(cfg, shards, tokenizer_dir, jsonl_out=sft / "train.jsonl", dataset_out=sft / "dataset",
                      rollouts_out=sft / "rollouts.jsonl", stats_out=sft / "stats.json", excluded=["t0001"])
    assert [row["slot"] for row in lines(sft / "train.jsonl")] == ["t0000"]
    assert stats["kept"] == 1 and stats["discarded"] == {"benchmark_overlap": 1}
    assert stats["per_task"]["t0001"]["discarded"] == {"benchmark_overlap": 1}


def test_a_trajectory_without_any_reply_is_not_an_example(tmp_path, tokenizer_dir):
    traj = trajectory([], exit_status="autosubmission (format)", scores=[{"rmse": 1.0}])
    assert sft_messages(traj) is None
    stats = build(tmp_path, [write_shard(tmp_path, "t0000", [rollout(traj, 0)])], tokenizer_dir)
    assert stats["discarded"] == {"no_assistant_turn": 1}


# ---- examples and outputs ------------------------------------------------------------------------------


def test_example_is_the_last_request_as_sent_plus_the_final_reply():
    # 7 observations: the two oldest are elided exactly as the agent loop elides them
    traj = trajectory(["ls", "a", "b", "c", "d", "e", "f", "submit"], observation="line1\nline2")
    example = sft_messages(traj)
    assert [m["role"] for m in example] == ["system", "user"] + ["assistant", "user"] * 7 + ["assistant"]
    assert example[3]["content"] == example[5]["content"] == "Old output omitted (3 lines)"
    assert example[7]["content"].startswith("line1")
    assert example[-1]["content"] == traj.history[-1]["content"] and set(example[-1]) == {"role", "content"}
    # an auto-submitted run ends on an observation: the example stops at the last reply
    traj.history.append({"role": "user", "content": "obs", "agent": "primary"})
    assert sft_messages(traj) == example


def test_jsonl_dataset_and_stats_agree(tmp_path, tokenizer_dir):
    import datasets

    rollouts = [rollout(trajectory(["ls", "validate", "submit"], tag=str(i),
                                   scores=[{"rmse": 3.0}, {"rmse": 1.0 + i}] if i != 2 else []), i) for i in range(4)]
    stats = build(tmp_path, [write_shard(tmp_path, "t0000", rollouts)], tokenizer_dir)
    rows = lines(tmp_path / "sft" / "train.jsonl")
    ds = datasets.load_from_disk(str(tmp_path / "sft" / "dataset"))
    assert ds.to_list() == rows and len(rows) == stats["kept"] == 3
    row = rows[0]
    assert set(row) == {"id", "messages", "slot", "task", "rollout", "seed", "teacher", "exit_status", "metric",
                        "score", "scores", "tokens", "turns", "source", "unit", "reply"}
    assert json.loads(row["source"]) == {"origin": "rollouts", "format": "gymforge-shard"}
    # every trajectory fits the default train.max_length: auto resolves to one example per trajectory
    assert (row["unit"], row["reply"], stats["example_unit"], stats["examples"]) == ("conversation", None,
                                                                                     "conversation", 3)
    assert (row["task"], row["seed"], row["metric"], row["score"], row["exit_status"], row["turns"]) == (
        "taskA", 1000, "rmse", 1.0, "submitted", 3)
    assert json.loads(row["scores"]) == [{"rmse": 3.0}, {"rmse": 1.0}]
    assert stats["rollouts"] == 4 and stats["per_task"]["t0000"] == {
        "task_id": "taskA", "rollouts": 4, "kept": 3, "discarded": {"no_successful_submission": 1}}
    assert stats["tokens"]["kept"]["n"] == 3 and stats["turns"]["kept"]["max"] == 3
    assert stats["teacher"] == {"gymforge-offline-teacher@0.5": 4}
    assert len(lines(tmp_path / "sft" / "rollouts.jsonl")) == 4


def test_export_is_a_folder_load_dataset_reads(tmp_path, tokenizer_dir):
    import datasets

    from gymforge.report.sft_plots import plot_sft

    rollouts = [rollout(trajectory(["ls", "submit"], tag=str(i), scores=[] if i == 1 else None), i) for i in range(3)]
    results = tmp_path / "results"
    build(results, [write_shard(results, "t0000", rollouts)], tokenizer_dir)
    sft = results / "sft"
    plot_sft(sft / "stats.json", sft / "rollouts.jsonl", sft / "plots" / "kept_per_task.png",
             sft / "plots" / "trajectory_stats.png")
    (results / "proposals").mkdir()
    (results / "proposals" / "t0000.json").write_text(json.dumps({"dataset": {"id": "sklearn/diabetes"}}))
    out = export_sft(results, tmp_path / "export")
    ds = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == 2 and ds[0]["messages"][-1]["role"] == "assistant"
    card = (out / "README.md").read_text()
    stats = json.loads((sft / "stats.json").read_text())
    assert card.startswith("---\nlicense: other") and (out / "data" / "train-00000-of-00001.parquet").exists()
    meta = DatasetCard.load(out / "README.md").data  # the hub's own parser reads the card's metadata
    assert (meta.license, meta.license_name, meta.size_categories) == ("other", "mixed-see-card", ["n<1K"])
    assert meta.task_categories == ["text-generation"] and "sft" in meta.tags and card.endswith("```\n")
    for needle in (stats["config_hash"], "gymforge-offline-teacher@0.5", "kept trajectories: 2",
                   "rows: 2 examples, unit `conversation`", "| conversation (this dataset) | 2 |",
                   "no_successful_submission", "sklearn/diabetes", "## License", "push_to_hub", "48000"):
        assert needle in card, needle
    assert (out / "plots" / "kept_per_task.png").exists() and (out / "stats.json").exists()
    # a new export to a folder of the same name loads the new rows, not a cached copy of the old ones
    other = tmp_path / "other" / "results"
    build(other, [write_shard(other, "t0000", rollouts[:1])], tokenizer_dir)
    again = export_sft(other, tmp_path / "other" / "export")
    assert again.name == out.name
    assert datasets.load_dataset(str(again), split="train", cache_dir=str(tmp_path / "hf")).num_rows == 1


def test_plots_are_pngs(tmp_path, tokenizer_dir):
    from gymforge.report.sft_plots import plot_sft

    rollouts = [rollout(trajectory(["ls"] * (i + 1) + ["submit"], tag=str(i), exit_status=status,
                                   scores=[] if "not_found" in status else None), i)
                for i, status in enumerate(["submitted", "submission_not_found (submit)", "autosubmission (max_steps)"])]
    build(tmp_path, [write_shard(tmp_path, "t0000", rollouts), write_shard(tmp_path, "t0001", [])], tokenizer_dir)
    sft = tmp_path / "sft"
    paths = plot_sft(sft / "stats.json", sft / "rollouts.jsonl", sft / "a.png", sft / "b.png")
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


# ---- status --------------------------------------------------------------------------------------------


def test_status_counts_planned_done_kept_and_discarded(tmp_path, tokenizer_dir):
    from gymforge.core.records import VerificationReport
    from gymforge.stages.rollouts import parts_dir
    from gymforge.tools.status import collect

    results = tmp_path / "results"
    cfg = GymforgeConfig.model_validate({"results_dir": str(results), "topics": {"n": 3},
                                         "trajectories": {"per_task": 4, "shard_size": 2}})
    (results).mkdir()
    (results / "config.json").write_text(cfg.model_dump_json())
    for slot, status in (("t0000", "ok"), ("t0001", "ok"), ("t0002", "discarded")):
        path = results / "environments" / slot / "report.json"
        path.parent.mkdir(parents=True)
        path.write_text(VerificationReport(item=slot, status=status).model_dump_json())
    shards = [write_shard(results, "t0000", [rollout(trajectory(["ls", "submit"], tag=f"{k}{i}",
                                                                scores=[] if i else None), 2 * k + i)
                                             for i in range(2)], k) for k in range(2)]
    part = parts_dir(results / "trajectories" / "t0001" / "shard_0000.json") / "r00000.json"
    part.parent.mkdir(parents=True)
    part.write_text("{}")
    stage = collect(results)["stages"]["trajectories"]
    assert (stage["planned"], stage["done"], stage["ok"]) == (8, 5, 0)
    build_sft(cfg, shards, tokenizer_dir, jsonl_out=results / "sft" / "train.jsonl",
              dataset_out=results / "sft" / "dataset", rollouts_out=results / "sft" / "rollouts.jsonl",
              stats_out=results / "sft" / "stats.json")
    stage = collect(results)["stages"]["trajectories"]
    assert (stage["ok"], stage["discarded"]) == (2, {"no_successful_submission": 2})


# ---- the student tokenizer -----------------------------------------------------------------------------


def test_offline_tokenizer_is_deterministic_and_marks_assistant_tokens(tmp_path):
    env = tmp_path / "environments" / "t0000" / "verified"
    (env / "mlgym" / "data" / "task").mkdir(parents=True)
    (env / "mlgym" / "data" / "task" / "baseline.py").write_text("import numpy\nprint('hello regression') \n" * 50)
    a = build_tokenizer("offline", tmp_path / "a", templates_dir(), [env, tmp_path / "missing"])
    b = build_tokenizer("offline", tmp_path / "b", templates_dir(), [env])
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
    tok = load_tokenizer(a)
    messages = [{"role": "system", "content": render("agent_system", window=1000)},
                {"role": "user", "content": "hello regression"},
                {"role": "assistant", "content": "DISCUSSION\nok\n\n```\nls\n```"}]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text.startswith("<|im_start|>system\n") and text.endswith("```<|im_end|>\n")
    encoded = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    masked = [t for t, m in zip(encoded["input_ids"], encoded["assistant_masks"], strict=True) if m]
    assert tok.decode(masked) == messages[-1]["content"] + "<|im_end|>"
    assert count_chat_tokens(tok, messages) == len(encoded["input_ids"])
    assert tok.decode(tok("héllo ✓ unseen")["input_ids"]) == "héllo ✓ unseen"  # byte-level: nothing is unknown
