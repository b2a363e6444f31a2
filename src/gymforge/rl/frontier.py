"""Which tasks an RL iteration trains on (learning-frontier sampling) and which groups its update keeps.

A GRPO group whose episodes all earn the same reward gets advantage 0 for every episode (`grpo.group_advantages`):
it teaches nothing, yet its rollouts cost as much as any other group's. Two measures (docs/rl.md, "Frontier
sampling and dynamic sampling"):

- **Frontier sampling** (`rl.task_sampling: frontier`, the default). Each iteration chooses
  `rl.tasks_per_iteration` of the RL tasks. A task never chosen before comes first (in the tasks' order), so every
  task is tried; the other places are drawn without replacement with probability proportional to
  `p * (1 - p) + rl.frontier_floor`, where `p = (passes + 1) / (episodes + 2)` is the task's pass rate over its last
  `rl.frontier_window` groups, smoothed towards 1/2 (Laplace). `p(1 - p)` is the variance of one episode's
  pass/fail outcome: largest (0.25) for a task the policy solves half of the time, the "learning frontier", and
  small for tasks it always or never solves. The floor keeps every task reachable. The draw uses the iteration's
  own seed (`derive_seed(seed, "rl-tasks", iteration)`) and the pass history of the finished iterations (their
  `curve.json` rows), so a resumed run chooses what an uninterrupted one would.
  `rl.task_sampling: round_robin` takes the tasks in turn instead (the choice before frontier sampling existed).
- **Dynamic sampling** (`rl.drop_zero_variance`, default true): a group whose rewards have zero variance (all
  equal, or a single scored episode) is left out of the update and counted in its `curve.json` row; when no group
  of an iteration is left, the update is skipped and the checkpoint carried over unchanged.

**Pass**: an episode passes when its final submission is strictly better than the task's baseline and the audit did
not cost it its reward: `milestones["beat_baseline"] and not flagged` of `gymforge.rl.rewards.Reward`. That is the
task's own success criterion, the same whatever `rl.reward` weighs (a reward threshold would move with the
weights). Crashed episodes (no trajectory) count for nothing: neither pass nor fail.
"""

from __future__ import annotations

import math
import random
from typing import Any, Mapping, Sequence

ZERO_VARIANCE_EPS = 1e-6  # the std below which `grpo.group_advantages` gives a group all zeros


def passed(reward: Mapping[str, Any]) -> bool:
    """Whether a scored episode (`Reward.as_dict()`) passed: it beat the baseline and was not rewarded as flagged."""
    return bool(reward["milestones"]["beat_baseline"]) and not reward["flagged"]


def zero_variance(rewards: Sequence[float], eps: float = ZERO_VARIANCE_EPS) -> bool:
    """Whether a group's rewards have (numerically) zero variance: every advantage of it is 0."""
    if len(rewards) < 2:
        return True
    mean = sum(rewards) / len(rewards)
    return math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) < eps


def pass_history(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, int]]]:
    """Per task, (passes, scored episodes) of each group it had, oldest first, from `curve.json` rows."""
    history: dict[str, list[tuple[int, int]]] = {}
    for row in rows:
        for slot, episodes in row.get("task_episodes", {}).items():
            history.setdefault(slot, []).append((int(row["task_passes"][slot]), int(episodes)))
    return history


def smoothed_pass_rate(groups: Sequence[tuple[int, int]], window: int) -> float:
    """The pass rate of the last `window` groups, Laplace-smoothed: (passes + 1) / (episodes + 2); 1/2 without one."""
    recent = list(groups)[-window:]
    return (sum(p for p, _ in recent) + 1) / (sum(n for _, n in recent) + 2)


def frontier_weight(p: float, floor: float) -> float:
    """Sampling weight of a task with smoothed pass rate `p`: the outcome variance p(1 - p) plus the floor."""
    return p * (1.0 - p) + floor


def choose_frontier(slots: Sequence[str], history: Mapping[str, Sequence[tuple[int, int]]], k: int,
                    rng: random.Random, *, window: int, floor: float) -> list[str]:
    """`k` of `slots` (in their order): the never-chosen ones first, then a weighted draw without replacement."""
    k = min(k, len(slots))
    chosen = [s for s in slots if s not in history][:k]
    pool = [s for s in slots if s not in chosen]
    weights = {s: frontier_weight(smoothed_pass_rate(history.get(s, ()), window), floor) for s in pool}
    while len(chosen) < k:
        total = sum(weights[s] for s in pool)
        pick = pool[-1]
        if total > 0:
            x = rng.random() * total
            for s in pool:
                x -= weights[s]
                if x < 0:
                    pick = s
                    break
        else:  # every weight 0 (floor 0 and certain outcomes cannot happen with smoothing, but stay total)
            pick = rng.choice(pool)
        chosen.append(pick)
        pool.remove(pick)
    order = {s: i for i, s in enumerate(slots)}
    return sorted(chosen, key=order.__getitem__)


def choose_round_robin(slots: Sequence[str], iteration: int, k: int) -> list[str]:
    """`k` of `slots` in turn: iteration i takes the (i*k)-th to the (i*k + k - 1)-th, wrapping around."""
    k = min(k, len(slots))
    return [slots[(iteration * k + j) % len(slots)] for j in range(k)]


def task_pass_rates(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task over a run's rows: groups, scored episodes, passes, pass rate (None without an episode), pass rate
    of its last group, and groups dropped for zero reward variance. For the run report."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        dropped = set(row.get("zero_variance_tasks", []))
        for slot, episodes in row.get("task_episodes", {}).items():
            t = out.setdefault(slot, {"groups": 0, "episodes": 0, "passes": 0, "dropped": 0, "last": None})
            passes = int(row["task_passes"][slot])
            t["groups"] += 1
            t["episodes"] += int(episodes)
            t["passes"] += passes
            t["dropped"] += slot in dropped
            t["last"] = passes / episodes if episodes else t["last"]
    for t in out.values():
        t["pass_rate"] = t["passes"] / t["episodes"] if t["episodes"] else None
    return out
