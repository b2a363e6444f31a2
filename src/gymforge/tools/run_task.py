"""`gymforge run-task`: one agent episode on any MLGym-format task, written as `<id>.traj` and results.json.

Policies:
- `submit-baseline`: a scripted model that runs the task's baseline script (if it has one) and submits. It drives the
  real `Agent`, so its trajectory has exactly the format of a model's, and its score must equal the
  baseline's (a check that the task is deterministic and that our runner scores like MLGym).
- `teacher`: the configured teacher LLM (`llm.teacher`; offline by default) plays the agent.
- `replay` (`--replay FILE`): the replies come from FILE, in order (`replay_replies`): a JSON list of reply
  strings, or a gymforge / MLGym `.traj`. When they run out the model stops answering: the loop
  auto-submits as it does when an endpoint fails (`autosubmission (api)`). Replaying a gymforge trajectory
  on the same task sends the same replies, rejected ones included, so it runs the same actions.

Output directory: `<id>.traj`, `results.json` ({"agent": scores, "baseline": metrics}), `episode/`
(the agent's run directory) and, when the task YAML has no `baseline_scores`, `baseline/` plus
`baseline.json` (the measured baseline run: output and timings).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple, cast

import openai

from gymforge.core import atomic
from gymforge.agent.loop import Agent, AgentConfig, AgentTask
from gymforge.agent.trajectory import read_trajectory
from gymforge.core.config import GymforgeConfig, config_or_defaults
from gymforge.runtime.gpus import gpu_count
from gymforge.interop.harbor import HarborTask, is_harbor_folder, leased_sandbox, run_harbor_episode
from gymforge.tasks.environment import TaskEnvironment
from gymforge.llm.client import ChatResult, LLMClient, make_client
from gymforge.tasks.mlgym import load_task_config
from gymforge.sandbox import Limits
from gymforge.tasks.datacache import cache_root
from gymforge.tasks.episode import EpisodeRunner, sandbox_for
from gymforge.tasks.workflow import skills_for
from gymforge.tasks.posttraining import post_training_settings

POLICIES = ("submit-baseline", "teacher", "replay")


class _Endpoint(NamedTuple):
    provider: str
    model: str


class ScriptedModel:
    """Stands in for an `LLMClient` in the agent loop: answers with `replies` in order, then repeats the last."""

    provider = "scripted"

    def __init__(self, replies: list[str], model: str) -> None:
        self.endpoint = _Endpoint(provider=self.provider, model=model)
        self._replies = list(replies)
        self.turn = 0

    def _next(self) -> str:
        return self._replies[min(self.turn, len(self._replies) - 1)]

    async def achat(self, messages: list[dict[str, Any]], **_: Any) -> ChatResult:
        reply = self._next()
        self.turn += 1
        return ChatResult(content=reply, finish_reason="stop", prompt_tokens=0, completion_tokens=0, cost_usd=0.0,
                          model=self.endpoint.model)


class RepliesExhausted(openai.OpenAIError):
    """A replayed model has no replies left: to the agent loop, an endpoint that stopped answering."""


class ReplayFileError(ValueError):
    """A `--replay` file that holds no replies in a known format."""


class ReplayModel(ScriptedModel):
    """Answers with `replies` in order, then stops answering (RepliesExhausted)."""

    provider = "replay"

    def _next(self) -> str:
        if self.turn >= len(self._replies):
            raise RepliesExhausted(f"the replay has no replies left ({len(self._replies)} replayed)")
        return self._replies[self.turn]


def _is_exit(step: dict[str, Any]) -> bool:
    """An auto-submission or a forced exit (ours: `exit_<reason>`; MLGym: `exit_cost`, `exit_format`...)."""
    return str(step.get("action", "")).strip().startswith("exit_")


def replay_replies(path: Path) -> list[str]:
    """The model replies recorded in `path`, in the order the model gave them.

    - a JSON list of strings: as they are;
    - a gymforge `.traj` (steps carry `format_errors`): per step its rejected replies, then its reply, except for
      auto-submission steps (their reply, if any, is the last rejected one);
    - an MLGym `.traj`: `trajectory[*].response` without the forced exits (`exit_*`: the action never ran),
      or, when the steps carry no responses, the assistant turns of `history` (what MLGym's own replay uses).
    """
    data = json.loads(Path(path).read_text())
    if isinstance(data, list) and all(isinstance(r, str) for r in data):
        return data
    steps = data.get("trajectory") if isinstance(data, dict) else None
    if not isinstance(steps, list):
        raise ReplayFileError(f"{path}: neither a JSON list of reply strings nor a .traj (with a `trajectory` list)")
    if steps and all(isinstance(s, dict) and "format_errors" in s for s in steps):  # gymforge
        replies = []
        for step in steps:
            replies += [r["response"] for r in step["format_errors"]]
            if not (_is_exit(step) and str(step.get("thought", "")).startswith("Exit due to")):
                replies.append(step["response"])
        return replies
    responses = [s.get("response") for s in steps if isinstance(s, dict) and not _is_exit(s)]
    if responses and all(isinstance(r, str) and r for r in responses):
        return responses
    return [m["content"] for m in data.get("history", []) if isinstance(m, dict) and m.get("role") == "assistant"]


def submit_baseline_model(env: TaskEnvironment) -> ScriptedModel:
    """Run the baseline exactly as MLGym does, then submit.

    A task without `baseline_paths` (MLGym allows it: its baseline is the starter code as installed, e.g. a
    game's untouched strategy.py) is submitted as installed.
    """
    if not env.task.baseline_paths:
        return ScriptedModel([
            "DISCUSSION\nThe task has no baseline script: its baseline is the starter code as installed, "
            "so I submit it unchanged.\n\n```\nsubmit\n```\n",
        ], model="submit-baseline")
    baseline = env.task.baseline_paths[0]
    launcher = "python" if env.task.task_entrypoint != "LMSubmissionTasks" else (
        f"torchrun --nproc_per_node={env.gpus} --standalone")
    return ScriptedModel([
        f"DISCUSSION\nI start from the provided baseline: running {baseline} produces the artefact the task asks "
        f"for.\n\n```\n{launcher} {baseline}\n```\n",
        "DISCUSSION\nThe baseline has written its artefact, so I submit it.\n\n```\nsubmit\n```\n",
    ], model="submit-baseline")


def _policy_model(policy: str, env: TaskEnvironment, replies: list[str] | None, replay: Path | None, llm: LLMClient | None,
                  cfg: GymforgeConfig | None) -> tuple[LLMClient, LLMClient | None]:
    """The model the policy answers with, and the client `run_task` opened for it (to close), if any."""
    if policy == "submit-baseline":
        return cast(LLMClient, submit_baseline_model(env)), None  # the agent only calls achat and reads endpoint
    if replies is not None:
        return cast(LLMClient, ReplayModel(replies, model=f"replay:{Path(str(replay)).name}")), None
    if llm is not None:
        return llm, None
    owned = make_client(cfg or GymforgeConfig(), "run-task")
    return owned, owned


def run_task(
    task_yaml: Path,
    root: Path | None = None,
    policy: str = "submit-baseline",
    out: Path = Path("run-task"),
    *,
    sandbox: str = "local",
    llm: LLMClient | None = None,
    cfg: GymforgeConfig | None = None,
    seed: int = 0,
    max_steps: int = 50,
    gpus: int | None = None,
    limits: Limits | None = None,
    hidden_columns: dict[str, list[str]] | None = None,
    dataset_cache: Path | None = None,
    replay: Path | None = None,
    settings: GymforgeConfig | None = None,
    interface: str = "cli",
) -> Path:
    """Run one episode of the task at `task_yaml` (root: the tree holding it) and return the `.traj` path.

    `llm` overrides the teacher built from `cfg` (default config when None); `gpus` None detects them.
    `dataset_cache`: the fetched hub datasets (`gymforge.stages.datasets`) the task's non-local datasets load from.
    `replay`: the file whose replies the `replay` policy sends (a replay file alone implies that policy).
    `settings`: the config post-training tasks' base model and model cache come from (default: `cfg`'s).
    `interface`: `workflow` gives a post-training task's episode the workflow skills (other tasks get `cli`).
    """
    if replay is not None:
        policy = "replay"
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (expected one of {', '.join(POLICIES)})")
    if policy == "replay" and replay is None:
        raise ValueError("the replay policy needs a replay file (--replay FILE)")
    replies = replay_replies(Path(replay)) if replay is not None else None  # a bad file fails before any install
    out = Path(out)
    gpus = gpu_count() if gpus is None else gpus
    base = cfg or GymforgeConfig()
    run_cfg = base.model_copy(update={"sandbox": base.sandbox.model_copy(update={"backend": sandbox})})
    if limits is None:
        # The CPU-time limit must not cut a run short of its wall-clock training_timeout on every core.
        timeout = load_task_config(task_yaml).effective_training_timeout
        limits = Limits(cpu_seconds=max(Limits().cpu_seconds, timeout * (os.cpu_count() or 1)))

    runner = EpisodeRunner(sandbox_for(run_cfg, gpus), limits, dataset_cache, gpus=gpus,
                           post_training=post_training_settings(settings or run_cfg))

    def environment(name: str, skills: bool = False) -> TaskEnvironment:
        return runner.environment(task_yaml, root=root, run_dir=out / name, hidden_columns=hidden_columns,
                                  skills=skills)

    env = environment("episode", skills=interface == "workflow")
    if env.task.baseline_scores:
        baseline = env.task.baseline_scores[0]
    else:
        measured = environment("baseline")
        measured.install()
        report = measured.run_baseline()
        atomic.write_text(out / "baseline.json", report.model_dump_json(indent=2))
        baseline = report.metrics

    env.install()
    model, owned = _policy_model(policy, env, replies, replay, llm, cfg)
    task = AgentTask(id=env.task.id, description=env.description, baseline=baseline, training_timeout=env.timeout)
    meta = {"policy": policy, "sandbox": runner.sandbox.name, "task_yaml": str(Path(task_yaml).resolve()),
            "root": str(env.root)}
    if replay is not None:
        meta["replay"] = {"file": str(Path(replay).resolve()), "replies": len(replies or [])}
    skills = skills_for(env, baseline) if interface == "workflow" else None
    if skills is not None:
        meta["interface"] = "workflow"
    try:
        with env.open_session() as session:
            Agent(model, session, env, task, AgentConfig(max_steps=max_steps), seed=seed, mounts=env.mounts,
                  out_dir=out, meta=meta, commands=skills).run()
    finally:
        if owned is not None:
            owned.close()
    return out / f"{env.task.id}.traj"


def main(args: Any) -> None:
    """`gymforge run-task TASK_YAML [--root R] [--policy P | --replay FILE] [--out OUT] ...`; a Harbor task folder
    instead of TASK_YAML runs through `harbor_main`."""
    if is_harbor_folder(Path(args.task_yaml)):
        return harbor_main(args)
    # The teacher and the dataset cache come from the config: --config, else ./config.yaml, else the defaults.
    settings = config_or_defaults(args.config)
    cfg = settings if args.policy == "teacher" else None
    cache = cache_root(settings)
    if args.replay and args.policy != "submit-baseline":
        raise SystemExit("gymforge run-task: --replay replaces --policy; give one of them")
    traj = run_task(Path(args.task_yaml), Path(args.root) if args.root else None, args.policy, Path(args.out),
                    sandbox=args.sandbox, cfg=cfg, seed=args.seed, max_steps=args.max_steps, gpus=args.gpus,
                    dataset_cache=cache, replay=Path(args.replay) if args.replay else None, settings=settings,
                    interface=args.interface,
                    hidden_columns=json.loads(args.hidden_columns) if args.hidden_columns else None)
    info = read_trajectory(traj).info
    print(f"{traj}: {info.exit_status}; scores {info.score}")
    for flag in info.flags:
        print(f"  flagged at step {flag.step}: {flag.code}: {flag.detail}")


ORACLE = [
    "DISCUSSION\nThe task ships its solution: I run it as Harbor's oracle agent does.\n\n```\nbash /solution/solve.sh\n```\n",
    "DISCUSSION\nThe solution has run, so I submit.\n\n```\nsubmit\n```\n",
]


def harbor_main(args: Any) -> None:
    """`gymforge run-task FOLDER` for a Harbor task folder (docs/interop.md): one episode of the agent loop on it,
    scored by its verifier. `--policy submit-baseline` is Harbor's oracle (the task's solve.sh, mounted at
    /solution for this policy only), `teacher` the configured teacher, `--replay FILE` the replies in FILE."""
    settings = config_or_defaults(args.config)
    folder = Path(args.task_yaml)
    task = HarborTask.read(folder)
    cfg = settings.model_copy(update={"sandbox": settings.sandbox.model_copy(update={"backend": args.sandbox})})
    owned = None
    oracle = args.policy == "submit-baseline" and not args.replay
    if args.replay:
        llm: Any = ReplayModel(replay_replies(Path(args.replay)), model=f"replay:{Path(args.replay).name}")
    elif oracle:
        llm = ScriptedModel(ORACLE, model="harbor-oracle")
    else:
        llm = owned = make_client(settings, "run-task")
    try:  # the GPUs task.toml declares, leased as a Snakemake job's are
        with leased_sandbox(cfg, task, say=lambda line: print(line, file=sys.stderr)) as sandbox:
            traj = run_harbor_episode(folder, Path(args.out), llm, sandbox=sandbox,
                                      limits=Limits.from_config(cfg.sandbox), max_steps=args.max_steps,
                                      seed=args.seed, oracle=oracle,
                                      meta={"policy": "replay" if args.replay else args.policy})
    finally:
        if owned is not None:
            owned.close()
    info = read_trajectory(traj).info
    print(f"{traj}: {info.exit_status}; scores {info.score}")
    for flag in info.flags:
        print(f"  flagged at step {flag.step}: {flag.code}: {flag.detail}")
