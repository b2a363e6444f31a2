"""Learning-frontier task selection and dynamic sampling in on-policy RL (issue #24, part 3): the choice prefers tasks
solved about half of the time, tries every task, is deterministic with its seed and survives a resume; groups with
zero reward variance leave the update and are counted in curve.json; an iteration without a group left skips its
update and carries the checkpoint over; the run report shows per-task pass rates."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gymforge.core.records import AgentInfo, Trajectory, TrajectoryStep
from gymforge.rl import frontier
from gymforge.rl.rewards import TaskMetric
from test_rl import fake_episode, make_cfg

# ---- selection ----------------------------------------------------------------------------------------

SLOTS = ["t0000", "t0001", "t0002", "t0003"]


def test_frontier_prefers_tasks_solved_half_of_the_time() -> None:
    # t0000 never solved, t0001 half of the time, t0002 always, t0003 one in four: all tried already
    history = {"t0000": [(0, 8), (0, 8)], "t0001": [(4, 8), (4, 8)], "t0002": [(8, 8), (8, 8)],
               "t0003": [(2, 8), (2, 8)]}
    picks = Counter()
    for it in range(400):
        picks.update(frontier.choose_frontier(SLOTS, history, 1, random.Random(it), window=4, floor=0.05))
    assert picks["t0001"] > picks["t0003"] > picks["t0000"] and picks["t0001"] > picks["t0002"]
    assert picks["t0001"] > 0.3 * 400 and min(picks.values()) > 0  # the floor keeps every task reachable
    # the weights: p(1-p) of the smoothed rate plus the floor
    p = frontier.smoothed_pass_rate(history["t0001"], 4)
    assert p == 0.5 and frontier.frontier_weight(p, 0.05) == pytest.approx(0.3)
    assert frontier.smoothed_pass_rate(history["t0000"], 4) == pytest.approx(1 / 18)
    assert frontier.smoothed_pass_rate([(0, 8), (8, 8)], 1) == pytest.approx(9 / 10)  # only the recent window
    # seeded: the same draw for the same seed, in the tasks' order
    a = frontier.choose_frontier(SLOTS, history, 2, random.Random(7), window=4, floor=0.05)
    b = frontier.choose_frontier(SLOTS, history, 2, random.Random(7), window=4, floor=0.05)
    assert a == b and len(set(a)) == 2 and a == sorted(a)


def test_unseen_tasks_are_tried_first() -> None:
    history = {"t0001": [(4, 8)], "t0003": [(4, 8)]}  # both on the frontier, yet the unseen ones come first
    for seed in range(20):
        assert frontier.choose_frontier(SLOTS, history, 2, random.Random(seed), window=4, floor=0.05) == \
            ["t0000", "t0002"]
    # simulated run, one task per iteration: every task is tried in the first len(SLOTS) iterations
    rows: list[dict[str, Any]] = []
    for it in range(len(SLOTS)):
        (slot,) = frontier.choose_frontier(SLOTS, frontier.pass_history(rows), 1, random.Random(it), window=4,
                                           floor=0.05)
        rows.append({"task_episodes": {slot: 4}, "task_passes": {slot: 0}})
    assert sorted(s for r in rows for s in r["task_episodes"]) == SLOTS
    # a task chosen whose episodes all crashed counts as tried
    assert frontier.choose_frontier(["a", "b"], {"a": [(0, 0)]}, 1, random.Random(0), window=4, floor=0) == ["b"]
    assert frontier.choose_round_robin(SLOTS, 1, 3) == ["t0003", "t0000", "t0001"]


def test_choose_tasks_follows_the_config(tmp_path: Path) -> None:
    from gymforge.stages.rl import choose_tasks

    tasks = make_tasks(tmp_path, SLOTS)
    rows = [{"task_episodes": {s: 4 for s in SLOTS}, "task_passes": {"t0000": 0, "t0001": 2, "t0002": 4,
                                                                       "t0003": 0}}]
    cfg = make_cfg(tasks_per_iteration=2)
    first = [[t.slot for t in choose_tasks(cfg, it, tasks, rows)] for it in range(50)]
    assert first == [[t.slot for t in choose_tasks(cfg, it, tasks, rows)] for it in range(50)]  # deterministic
    counts = Counter(s for c in first for s in c)
    assert counts["t0001"] == max(counts.values())
    assert first != [[t.slot for t in choose_tasks(make_cfg(tasks_per_iteration=2, seed=1), it, tasks, rows)]
                     for it in range(50)]  # the RL seed drives the draw
    rr = make_cfg(tasks_per_iteration=2, task_sampling="round_robin")
    assert [[t.slot for t in choose_tasks(rr, it, tasks, rows)] for it in range(3)] == \
        [["t0000", "t0001"], ["t0002", "t0003"], ["t0000", "t0001"]]


def test_pass_and_zero_variance() -> None:
    ok = {"milestones": {"beat_baseline": True}, "flagged": False}
    assert frontier.passed(ok)
    assert not frontier.passed({**ok, "flagged": True})
    assert not frontier.passed({"milestones": {"beat_baseline": False}, "flagged": False})
    assert frontier.zero_variance([-1.0, -1.0, -1.0]) and frontier.zero_variance([0.3])
    assert not frontier.zero_variance([-1.0, 0.3])


def test_frontier_fields_change_the_rl_fingerprint(tmp_path: Path) -> None:
    from gymforge.stages.rl import fingerprint

    base = fingerprint(make_cfg(), tmp_path, SLOTS)
    for change in ({"task_sampling": "round_robin"}, {"frontier_window": 2}, {"frontier_floor": 0.1},
                   {"drop_zero_variance": False}):
        assert fingerprint(make_cfg(**change), tmp_path, SLOTS) != base, change
    assert make_cfg().digest("rl") != make_cfg(drop_zero_variance=False).digest("rl")


# ---- the trainer: dropped groups, skipped updates ----------------------------------------------------


@pytest.fixture(scope="module")
def student(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 with the offline tokenizer (as tests/stages/test_rl.py builds it)."""
    from gymforge.student import base as student_base
    from gymforge.student.tokenizer import train_offline_tokenizer

    root = tmp_path_factory.mktemp("rl-frontier-student")
    texts = ["You are an agent.", "Task: predict prices.", "DISCUSSION\nlook\n```\nls\n```", "validate", "submit",
             "python baseline.py", "the quick brown fox jumps over the lazy dog"]
    train_offline_tokenizer(texts, vocab_size=400).save_pretrained(str(root / "tokenizer"))
    student_base.build_base(make_cfg(), root / "tokenizer", root / "sft")
    return root / "sft"


def make_tasks(root: Path, slots: list[str]) -> list[Any]:
    from gymforge.rl.rollouts import RLTask

    tree = root / "mlgym"
    (tree / "configs" / "tasks").mkdir(parents=True, exist_ok=True)
    task_yaml = tree / "configs" / "tasks" / "priceTask.yaml"
    task_yaml.write_text("id: priceTask\nname: Price task\ndescription: predict prices {dataset_docs}\n")
    # baseline 0.55: every good fake episode (accuracy 0.60 to 0.62) beats it, so it passes
    return [RLTask(slot=s, task_id="priceTask", tree=tree, task_yaml=task_yaml,
                   metric=TaskMetric("accuracy", True, 0.55), hidden_columns=None, baseline={"accuracy": 0.55})
            for s in slots]


def failed_episode() -> Trajectory:
    """An episode that never submitted: reward -1 (the penalty), no milestone."""
    t = Trajectory(info=AgentInfo(score=[], exit_status="submission_not_found (max_steps)"))
    t.history = [{"role": "system", "content": "You are an agent."},
                 {"role": "user", "content": "Task: predict prices."},
                 {"role": "assistant", "content": "DISCUSSION\nhm\n```\nls\n```"}, {"role": "user", "content": "x"}]
    t.trajectory = [TrajectoryStep(action="ls", observation="x", response="DISCUSSION\nhm\n```\nls\n```", state="{}",
                                   thought="hm", execution_time=0.1, step=1, exit_code=0),
                    TrajectoryStep(action="exit_max_steps", observation="Exited", response="", state="{}",
                                   thought="Exit due to max_steps", execution_time=0.1, step=2)]
    return t


def test_zero_variance_groups_are_dropped_and_counted(student: Path, tmp_path: Path) -> None:
    """t0000 always fails (zero variance: dropped), t0001 half passes (kept): one iteration, both tasks."""
    from gymforge.stages.rl import run_rl

    cfg = make_cfg(iterations=1, tasks_per_iteration=2, improve_fraction=0.0)

    def collect(policy_dir: Path, iteration: int, plans: list[Any]) -> list[Any]:
        return [(p, failed_episode() if p.task.slot == "t0000" else fake_episode(p.seed, k % 2 == 0), 1.0)
                for k, p in enumerate(plans)]

    out = tmp_path / "rl"
    curve = run_rl(cfg, student, make_tasks(tmp_path / "task", ["t0000", "t0001"]), out / "checkpoint",
                   out / "curve.json", collect=collect)
    (row,) = curve["iterations"]
    assert row["tasks"] == ["t0000", "t0001"] and row["groups"] == 2
    assert row["groups_dropped_zero_variance"] == 1 and row["zero_variance_tasks"] == ["t0000"]
    assert row["task_episodes"] == {"t0000": 4, "t0001": 4} and row["task_passes"] == {"t0000": 0, "t0001": 2}
    assert row["task_pass_rate"] == {"t0000": 0.0, "t0001": 0.5}
    assert not row["update_skipped"] and row["samples"] > 0 and row["optimizer_steps"] == 1
    assert row["samples"] == 4 * 2  # t0001's replies only (two per fake episode); t0000's are left out
    episodes = json.loads((out / ".work" / "episodes" / "iteration_0000.json").read_text())
    assert [e["passed"] for e in episodes] == [False] * 4 + [True, False, True, False]
    assert curve["groups_dropped_zero_variance"] == 1 and curve["updates_skipped"] == 0
    assert curve["task_sampling"] == "frontier" and curve["drop_zero_variance"] is True


def test_all_dropped_iteration_skips_the_update(student: Path, tmp_path: Path) -> None:
    """Every episode fails the same way: the group is dropped, no update runs, the checkpoint is carried over;
    with drop_zero_variance false the group stays in the update (KL only)."""
    import torch
    from safetensors.torch import load_file

    from gymforge.stages.rl import run_rl

    def collect(policy_dir: Path, iteration: int, plans: list[Any]) -> list[Any]:
        return [(p, failed_episode(), 1.0) for p in plans]

    out = tmp_path / "rl"
    curve = run_rl(make_cfg(iterations=2), student, make_tasks(tmp_path / "task", ["t0000"]), out / "checkpoint",
                   out / "curve.json", collect=collect)
    for row in curve["iterations"]:
        assert row["update_skipped"] and row["groups_dropped_zero_variance"] == 1
        assert (row["samples"], row["optimizer_steps"], row["kl"]) == (0, 0, 0.0)
    assert curve["updates_skipped"] == 2 and curve["groups_dropped_zero_variance"] == 2
    state = json.loads((out / ".work" / "state.json").read_text())
    assert state["finished"] == 2 and (out / ".work" / "iter_0002" / "model.safetensors").exists()
    before, after = load_file(str(student / "model.safetensors")), load_file(str(out / "checkpoint" /
                                                                                    "model.safetensors"))
    assert all(torch.equal(before[k].float(), after[k].float()) for k in before)  # carried over unchanged

    kept = tmp_path / "kept"
    curve = run_rl(make_cfg(iterations=1, drop_zero_variance=False), student,
                   make_tasks(tmp_path / "task", ["t0000"]), kept / "checkpoint", kept / "curve.json",
                   collect=collect)
    (row,) = curve["iterations"]
    assert not row["update_skipped"] and row["groups_dropped_zero_variance"] == 0
    assert row["samples"] > 0 and row["optimizer_steps"] == 1


def test_report_shows_per_task_pass_rates(tmp_path: Path) -> None:
    from gymforge.report.summary import rl_html

    rows = [{"iteration": i, "mean_reward": -0.5, "valid_share": 0.5, "mean_duration_s": 1.0, "kl": 0.0,
             "tasks": ["t0000", "t0001"], "task_episodes": {"t0000": 4, "t0001": 4},
             "task_passes": {"t0000": 0, "t0001": 2 + i}, "task_pass_rate": {"t0000": 0.0, "t0001": (2 + i) / 4},
             "groups": 2, "groups_dropped_zero_variance": 1, "zero_variance_tasks": ["t0000"],
             "update_skipped": False} for i in range(2)]
    (tmp_path / "rl" / "tiny").mkdir(parents=True)
    (tmp_path / "rl" / "tiny" / "curve.json").write_text(json.dumps({"iterations": rows}))
    page = rl_html(tmp_path)
    assert "Per-task pass rates" in page and "t0001" in page and "0.62" in page  # 5 of 8 episodes passed
    stats = frontier.task_pass_rates(rows)
    assert stats["t0001"] == {"groups": 2, "episodes": 8, "passes": 5, "dropped": 0, "last": 0.75,
                              "pass_rate": 0.625}
    assert stats["t0000"]["dropped"] == 2 and stats["t0000"]["pass_rate"] == 0.0
    # a curve from before frontier sampling still renders (no per-task table)
    (tmp_path / "rl" / "tiny" / "curve.json").write_text(json.dumps({"iterations": [
        {k: rows[0][k] for k in ("iteration", "mean_reward", "valid_share", "mean_duration_s", "kl")}]}))
    assert "Per-task pass rates" not in rl_html(tmp_path)
