"""RL episodes: the tasks, the improve-the-best-solution variant, and one iteration's groups of episodes.

Episodes run through the same `EpisodeRunner` as teacher rollouts and benchmark runs (same sandboxes,
agent loop, evaluation and audit); the policy is reached through the same serving seam as the benchmark
(`gymforge.llm.serving.open_endpoint`, the caller's job).

"Improve previous solution" ("RL for MLE agents": half of the episodes): the task's best episode so far
(highest reward with a valid submission) is shown to the policy through `agent_improve.j2`, which
wraps the task description with that episode's commands and its score. The variant is a copy of the task
tree whose task YAML carries that description; the workspace starts as the task's own (no artefact is
inherited, so every milestone must be earned again by the episode itself).
"""

from __future__ import annotations

import asyncio
import json
import os
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gymforge.core.prompts import render
from gymforge.rl.rewards import TaskMetric
from gymforge.tasks.metrics import metric_direction
from gymforge.core.records import VerificationReport
from gymforge.tasks.mlgym import dump_yaml, load_task_config

log = logging.getLogger("gymforge.rl")

MAX_SHOWN_ACTIONS = 12
MAX_ACTION_CHARS = 600


@dataclass
class RLTask:
    slot: str
    task_id: str
    tree: Path  # the MLGym tree (configs/, data/)
    task_yaml: Path
    metric: TaskMetric
    hidden_columns: dict[str, list[str]] | None
    baseline: dict[str, float] | None = None  # the verified baseline metrics, as the agent is shown them


def load_task(slot: str, report_file: Path, env_dir: Path, proposal_file: Path | None) -> RLTask | None:
    """The RL task of a slot, or None when its environment was not verified."""
    report = VerificationReport.model_validate_json(Path(report_file).read_text())
    if report.status != "ok":
        return None
    tree = Path(env_dir) / "mlgym"
    task_yaml = next((tree / "configs" / "tasks").glob("*.yaml"))
    baseline = report.baseline_scores[0] if report.baseline_scores else {}
    metric_text = ""
    if proposal_file and Path(proposal_file).exists():
        data = json.loads(Path(proposal_file).read_text())
        metric_text = str((data.get("proposal") or data).get("metric") or "")
    name, higher = metric_direction(metric_text)
    if name not in baseline and baseline:
        name = next(iter(baseline))  # the evaluation's own key (the proposal's text may name it loosely)
        higher = metric_direction(f"{name} {metric_text[len(name):]}")[1] if metric_text else metric_direction(name)[1]
    # What verification's evaluator probes ranked by wins over the proposal's words: a drifted proposal may name
    # another metric with its direction ("mae (lower is better)" for an evaluation that prints r2). A micro
    # variant's report carries its verified task's (stages.micro).
    if report.metric and report.higher_is_better is not None and (report.metric in baseline or not baseline):
        name, higher = report.metric, report.higher_is_better
    value = baseline.get(name)
    return RLTask(slot=slot, task_id=report.task_id or task_yaml.stem, tree=tree, task_yaml=task_yaml,
                  metric=TaskMetric(metric=name, higher_is_better=higher,
                                    baseline=float(value) if isinstance(value, (int, float)) else None),
                  hidden_columns=report.hidden_columns, baseline=baseline or None)


def _escape(text: str) -> str:
    """Literal braces for the task description's `str.format` (MLGym fills {dataset_docs} with it)."""
    return text.replace("{", "{{").replace("}", "}}")


def solution_actions(traj: Any) -> list[str]:
    """The commands an episode ran (auto-submissions excluded), shortened for the improve prompt."""
    actions = [s.action for s in traj.trajectory if not s.action.startswith("exit_")]
    shown = []
    for action in actions[-MAX_SHOWN_ACTIONS:]:
        shown.append(action if len(action) <= MAX_ACTION_CHARS else action[:MAX_ACTION_CHARS] + "\n[...]")
    return shown


def improve_variant(task: RLTask, best: dict[str, Any], work: Path) -> Path:
    """A copy of the task tree whose description asks to improve `best` (its actions and score); the task YAML."""
    dest = work / f"{task.slot}-{best['episode_id']}"
    yaml_path = dest / "configs" / "tasks" / task.task_yaml.name
    if yaml_path.exists():
        return yaml_path
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(task.tree, tmp)
    config = load_task_config(task.task_yaml)
    description = render("agent_improve", description=config.description,
                         actions=[_escape(a) for a in best["actions"]],
                         score=_escape(json.dumps(best["score"])), metric=_escape(task.metric.metric),
                         direction="higher" if task.metric.higher_is_better else "lower").rstrip()
    new = config.model_copy(update={"description": description})
    (tmp / "configs" / "tasks" / task.task_yaml.name).write_text(dump_yaml(new))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return yaml_path


@dataclass
class EpisodePlan:
    episode_id: str  # unique over the run: i<iteration>-<slot>-e<k>
    task: RLTask
    seed: int
    improve: bool
    task_yaml: Path
    root: Path


async def run_episodes(runner: Any, llm: Any, plans: list[EpisodePlan], *, max_steps: int, concurrency: int,
                       work: Path, keep: Path | None = None) -> list[tuple[EpisodePlan, Any, float]]:
    """Every planned episode, `concurrency` at a time: (plan, trajectory or None when it crashed, wall seconds).
    `keep`: each episode's `.traj` (with its sampled tokens) is written to `keep/<episode id>/` for the exports."""
    import time

    slots = asyncio.Semaphore(concurrency)
    results: list[tuple[EpisodePlan, Any, float]] = []

    async def one(plan: EpisodePlan) -> None:
        async with slots:
            t0 = time.monotonic()
            try:
                # per process: a killed job can leave an episode's workspace (and its mounts) behind
                traj = await runner.run(
                    llm, plan.task_yaml, root=plan.root, run_dir=work / f"{plan.episode_id}-{os.getpid()}",
                    max_steps=max_steps, out_dir=keep / plan.episode_id if keep is not None else None,
                    seed=plan.seed, baseline=plan.task.baseline, hidden_columns=plan.task.hidden_columns,
                    meta={"stage": "rl", "slot": plan.task.slot, "episode": plan.episode_id,
                          "improve": plan.improve})
            except Exception:  # noqa: BLE001 - a crashed episode is logged and left out of the update
                log.exception("episode %s crashed", plan.episode_id)
                traj = None
            results.append((plan, traj, time.monotonic() - t0))

    await asyncio.gather(*(one(p) for p in plans))
    order = {p.episode_id: i for i, p in enumerate(plans)}
    return sorted(results, key=lambda r: order[r[0].episode_id])

