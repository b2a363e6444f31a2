"""A small, hand-built results directory (two topic slots, one verified task with two rollouts) for the tests of
`gymforge show-task`, `show-trajectory`, `status --watch` and `estimate`. Every record is built with the
pipeline's own Pydantic models, so a format change breaks these fixtures loudly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gymforge.core.config import GymforgeConfig
from gymforge.core.records import (Attempt, GenerationRecord, ProposalRecord, TaskProposal, TopicBatch, TopicSlot,
                            UsageRecord, VerificationIteration, VerificationReport)
from gymforge.core.records import (AgentInfo, ModelStats, RolloutRecord, SandboxRef, ShardRecord, TeacherRef, Trajectory,
                                   TrajectoryStep)

TASK_ID = "demoTask"
SCRIPT_OBS = "<script>alert('x')</script> & more"
DEBUG_ERROR = "Traceback (most recent call last):\n  File \"evaluate.py\", line 3\nZeroDivisionError: division by zero"
TASK_YAML = f"""id: {TASK_ID}
name: Demo task
description: Predict y. {{dataset_docs}}
dataset_configs:
- datasets/demo_data.yaml
task_entrypoint: CSVSubmissionTasks
baseline_scores:
- acc: 0.5
"""
DATASET_YAML = "name: demo_data\ndescription: a demo dataset\ndata_path: data/demoTask/data\nis_local: true\n"

# Per-item numbers the estimate tests check against (chosen to differ from estimate.DEFAULTS).
ROLLOUT_STEPS = [4, 6]            # steps of rollouts 0 and 1 -> mean 5
ROLLOUT_CALLS = [5, 7]            # api calls -> 12 calls / 10 steps
ROLLOUT_PROMPT = [5000, 7000]     # tokens sent -> 1000 per call
ROLLOUT_COMPLETION = [600, 600]   # tokens received -> 100 per call


def _usage(calls: int, prompt: int, completion: int) -> UsageRecord:
    return UsageRecord(calls=calls, prompt_tokens=prompt, completion_tokens=completion,
                       cost_usd=(prompt * 1.25 + completion * 10) / 1e6)


def make_trajectory(actions: list[str], *, exit_status: str = "submitted", scores: list[dict] | None = None,
                    observations: dict[int, str] | None = None, calls: int = 0, sent: int = 0,
                    received: int = 0) -> Trajectory:
    """Steps as the agent loop writes them: a validate step's observation carries its score."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent.", "agent": "primary"},
        {"role": "user", "content": "TASK DESCRIPTION:\nPredict y.", "agent": "primary"},
    ]
    steps = []
    scores = [{"acc": 0.5}, {"acc": 0.75}] if scores is None else scores
    for i, action in enumerate(actions, 1):
        obs = (observations or {}).get(i, f"output of step {i}")
        if action == "validate" and scores:
            obs = ("Your code produced a valid submission artefact at /w/submission.csv.\n"
                   f"Baseline Score: {{\"acc\": 0.5}}\nEvaluation Score: {json.dumps(scores[0])}")
        if action == "submit":
            obs = "Exited (submit)"
        response = f"DISCUSSION\nthinking about step {i}\n\n```\n{action}\n```\n"
        history.append({"role": "assistant", "content": response, "agent": "primary", "thought": f"step {i}",
                        "action": action})
        steps.append(TrajectoryStep(action=action, observation=obs, response=response, state="{}",
                                    thought=f"DISCUSSION\nthinking about step {i}", execution_time=0.5, step=i,
                                    query_time=2.0, prompt_tokens=100 * i, completion_tokens=10))
        history.append({"role": "user", "content": obs, "agent": "primary"})
    return Trajectory(trajectory=steps, history=history, meta={"task_id": TASK_ID, "model": "teacher-x", "seed": 7},
                      info=AgentInfo(exit_status=exit_status, score=scores,
                                     model_stats=ModelStats(api_calls=calls, tokens_sent=sent, tokens_received=received,
                                                            total_cost=0.01, task_cost=0.01)))


def rollout_actions(n_steps: int) -> list[str]:
    """`ls`, `cat data.csv` ..., then validate and submit: `n_steps` actions in all."""
    middle = [f"python train.py --epochs {k}" for k in range(n_steps - 3)]
    return ["ls", *middle, "validate", "submit"]


def make_rollout(index: int, slot: str = "t0000") -> RolloutRecord:
    observations = {1: SCRIPT_OBS + "\n" + "\n".join(f"line {k}" for k in range(60))}
    traj = make_trajectory(rollout_actions(ROLLOUT_STEPS[index]), observations=observations,
                           calls=ROLLOUT_CALLS[index], sent=ROLLOUT_PROMPT[index], received=ROLLOUT_COMPLETION[index],
                           exit_status="submitted" if index == 0 else "submission_not_found (submit)",
                           scores=[{"acc": 0.75}, {"acc": 0.75}] if index == 0 else [])
    return RolloutRecord(slot=slot, task_id=TASK_ID, rollout=index, seed=100 + index,
                         teacher=TeacherRef(provider="openai", model="teacher-x", endpoint="http://127.0.0.1:9/v1",
                                            temperature=0.7, max_tokens=4096),
                         sandbox=SandboxRef(backend="local", confinement="bwrap"), max_steps=10,
                         baseline={"acc": 0.5}, fingerprint="fp", wall_s=30.0 + index, trajectory=traj)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def config(results: Path, **trajectories: Any) -> GymforgeConfig:
    return GymforgeConfig.model_validate({
        "results_dir": str(results),
        "topics": {"n": 2, "batch_size": 2},
        "trajectories": {"per_task": 2, "shard_size": 2, "concurrency": 2, "max_steps": 10, **trajectories},
    })


def build_results(root: Path, *, sft: bool = True, shard: bool = True) -> Path:
    """results/ of a run of 2 slots: t0000 verified after a debug iteration with 2 rollouts (1 kept), t0001 a
    duplicate topic skipped everywhere."""
    results = root / "results"
    cfg = config(results)
    _write(results / "config.json", cfg.model_dump_json(indent=1))
    topics = ["Demo regression of y", "Demo regression of y!"]
    batch = TopicBatch(batch="b0000", requested=2, raw=topics, seen=[topics[0]], usage=_usage(1, 170, 20), slots=[
        TopicSlot(item="t0000", status="ok", topic=topics[0]),
        TopicSlot(item="t0001", status="discarded", reason_code="duplicate_topic", reason="duplicate of t0000",
                  topic=topics[1], duplicate_of=topics[0])])
    _write(results / "topics" / "batches" / "b0000.json", batch.model_dump_json())
    skip = {"status": "skipped", "reason_code": "duplicate_topic", "reason": "duplicate of t0000"}
    _write(results / "proposals" / "t0000.json", ProposalRecord(
        item="t0000", status="ok", topic=topics[0], usage=_usage(4, 2000, 400), searches=["demo"],
        proposal=TaskProposal(topic=topics[0], metric="acc (higher is better)", description="Predict y from x.",
                              dataset="demo/data"),
        dataset={"id": "demo/data", "description": "demo rows", "license": "mit"}).model_dump_json())
    _write(results / "proposals" / "t0001.json", ProposalRecord(item="t0001", **skip).model_dump_json())
    files = {f"configs/tasks/{TASK_ID}.yaml": TASK_YAML, "configs/datasets/demo_data.yaml": DATASET_YAML}
    _write(results / "configs" / "t0000.json", GenerationRecord(
        item="t0000", status="ok", task_id=TASK_ID, entrypoint="CSVSubmissionTasks", usage=_usage(2, 3000, 1500),
        files=files, attempts=[Attempt(errors=["id 'demo' must equal the file name stem"]), Attempt()]).model_dump_json())
    _write(results / "configs" / "t0001.json", GenerationRecord(item="t0001", **skip).model_dump_json())
    _write(results / "tasks" / "t0000" / "status.json", GenerationRecord(
        item="t0000", status="ok", task_id=TASK_ID, usage=_usage(1, 2500, 1200), attempts=[Attempt()]).model_dump_json())
    _write(results / "tasks" / "t0001" / "status.json", GenerationRecord(item="t0001", **skip).model_dump_json())
    report = VerificationReport(
        item="t0000", status="ok", task_id=TASK_ID, entrypoint="CSVSubmissionTasks", usage=_usage(20, 60000, 2000),
        baseline_scores=[{"acc": 0.5}], hidden_columns={"test": ["y"]},
        iterations=[VerificationIteration(iteration=1, source="generation", task_id=TASK_ID,
                                          errors=[DEBUG_ERROR], timings_s={"baseline": 3.25}),
                    VerificationIteration(iteration=2, source="debug", task_id=TASK_ID, baseline_scores={"acc": 0.5},
                                          episode_exit_status="submitted",
                                          timings_s={"baseline": 2.5, "episode": 40.0})])
    _write(results / "environments" / "t0000" / "report.json", report.model_dump_json())
    _write(results / "environments" / "t0001" / "report.json", VerificationReport(item="t0001", **skip).model_dump_json())
    verified = results / "environments" / "t0000" / "verified" / "mlgym"
    for rel, text in files.items():
        _write(verified / rel, text)
    rollouts = [make_rollout(0), make_rollout(1)]
    if shard:
        _write(results / "trajectories" / "t0000" / "shard_0000.json", ShardRecord(
            item="t0000", status="ok", shard=0, task_id=TASK_ID, rollout_indices=[0, 1],
            rollouts=rollouts).model_dump_json())
    _write(results / "trajectories" / "t0001" / "shard_0000.json", ShardRecord(
        item="t0001", status="skipped", shard=0, reason_code="duplicate_topic",
        reason="environment skipped: duplicate of t0000").model_dump_json())
    if sft:
        rows = [{"id": "t0000-r00000", "slot": "t0000", "task": TASK_ID, "rollout": 0, "seed": 100,
                 "exit_status": "submitted", "steps": 4, "turns": 4, "tokens": 3000, "successful": True, "kept": True,
                 "reason": None, "score": 0.75},
                {"id": "t0000-r00001", "slot": "t0000", "task": TASK_ID, "rollout": 1, "seed": 101,
                 "exit_status": "submission_not_found (submit)", "steps": 6, "turns": 6, "tokens": 4000,
                 "successful": False, "kept": False, "reason": "no_successful_submission", "score": None}]
        _write(results / "sft" / "rollouts.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        _write(results / "sft" / "stats.json", json.dumps({
            "rollouts": 2, "kept": 1, "discarded": {"no_successful_submission": 1},
            "tokens": {"kept": {"n": 1, "mean": 3000.0}}}))
    ledger = [("topics", 170, 20), ("trajectories", 6000, 600), ("trajectories", 6000, 600)]
    _write(results / "llm" / "calls.jsonl", "".join(
        json.dumps({"ts": "2026-01-01T00:00:00", "stage": s, "model": "teacher-x", "cached": False,
                    "prompt_tokens": p, "completion_tokens": c, "cost_usd": 0.0, "ok": True}) + "\n"
        for s, p, c in ledger))
    bench_head = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    _write(results / "benchmarks" / "environments" / "t0000.tsv", bench_head + "50.0\t0:00:50\t1\t1\t1\t1\t0\t0\t1\t40.0\n")
    _write(results / "benchmarks" / "tasks" / "t0000.tsv", bench_head + "5.0\t0:00:05\t1\t1\t1\t1\t0\t0\t1\t3.0\n")
    _write(results / "benchmarks" / "trajectories" / "t0000" / "shard_0000.tsv",
           bench_head + "70.0\t0:01:10\t1\t1\t1\t1\t0\t0\t1\t50.0\n")
    return results
