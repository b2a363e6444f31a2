"""The interface comparison (gymforge.stages.interface_comparison, `trajectories.interfaces`): what each measure
counts per episode, the intervals, and the files the rule writes."""

from __future__ import annotations

import json
from pathlib import Path

from results_fixture import make_rollout

from gymforge.core.config import GymforgeConfig
from gymforge.core.records import ShardRecord, VerificationReport
from gymforge.stages.interface_comparison import compare, episode_measures, interface_comparison, interval


def rollout(index: int, interface: str, *, final: float | None, failed: int, iterations: int):
    """Rollout `index` of the fixture (10 steps for index 0) under `interface`, with its final score on `acc`
    (baseline 0.5) or no valid submission."""
    record = make_rollout(0)
    record.rollout = index
    info, traj = record.trajectory.info, record.trajectory
    traj.meta["interface"] = interface
    info.score = [] if final is None else [{"acc": 0.6}, {"acc": final}]
    info.exit_status = "submitted" if final is not None else "submission_not_found (submit)"
    info.failed_actions, info.train_eval_iterations = failed, iterations
    return record


def test_an_episode_counts_its_final_submission_failures_and_iterations() -> None:
    good = episode_measures(rollout(0, "cli", final=0.8, failed=2, iterations=3), "acc", True)
    steps = len(make_rollout(0).trajectory.trajectory)
    assert good == {"valid": 1.0, "improvement": 0.8 - 0.5, "failed_share": 2 / steps, "train_eval_iterations": 3.0}
    # no valid submission: the user is left with the baseline, an improvement of 0
    assert episode_measures(rollout(1, "cli", final=None, failed=0, iterations=1), "acc", True)["improvement"] == 0
    # lower is better: a lower final score is a positive improvement
    assert episode_measures(rollout(2, "cli", final=0.4, failed=0, iterations=0), "acc", False)["improvement"] > 0


def test_intervals_are_seeded_and_hold_the_mean() -> None:
    values = [0.0, 0.1, 0.3, 0.2, 0.9, 0.4]
    first, again = interval(values), interval(values)
    assert first == again
    low, high = first["ci"]
    assert low < first["estimate"] < high and 0 <= low and high <= 0.9
    assert interval([0.25, 0.25]) == {"estimate": 0.25, "ci": [0.25, 0.25]}


def test_the_rule_compares_interfaces_over_verified_tasks_only(tmp_path: Path) -> None:
    shard = ShardRecord(item="t0000", shard=0, status="ok", task_id="taskA", rollout_indices=[0, 1, 2, 3],
                        rollouts=[rollout(0, "cli", final=0.5, failed=3, iterations=0),
                                  rollout(1, "workflow", final=0.9, failed=0, iterations=2),
                                  rollout(2, "cli", final=None, failed=4, iterations=1),
                                  rollout(3, "workflow", final=0.7, failed=1, iterations=1)])
    other = shard.model_copy(update={"item": "t0001"})  # a task that was discarded: its rollouts do not count
    report = VerificationReport(item="t0000", status="ok", task_id="taskA", metric="acc", higher_is_better=True)
    discarded = VerificationReport(item="t0001", status="discarded")
    paths = []
    for name, model in (("shard0.json", shard), ("shard1.json", other), ("r0.json", report), ("r1.json", discarded)):
        paths.append(tmp_path / name)
        paths[-1].write_text(model.model_dump_json())
    cfg = GymforgeConfig.model_validate({"trajectories": {"interfaces": ["cli", "workflow"]}})
    table = interface_comparison(cfg, paths[:2], paths[2:], tmp_path / "c.json", tmp_path / "c.md")
    data = json.loads((tmp_path / "c.json").read_text())["by_interface"]
    assert data == compare([shard], {"t0000": report})
    assert data["cli"]["episodes"] == data["workflow"]["episodes"] == 2 and data["cli"]["tasks"] == 1
    assert data["cli"]["valid"]["estimate"] == 0.5 and data["workflow"]["valid"]["estimate"] == 1.0
    assert round(data["workflow"]["improvement"]["estimate"], 4) == 0.3  # (0.4 + 0.2) / 2
    assert data["workflow"]["train_eval_iterations"]["estimate"] == 1.5
    assert table == (tmp_path / "c.md").read_text() and "| `workflow` | 2 (1) |" in table
