"""The gymforge side of the verifiers environment (docs/interop.md, "verifiers").

verifiers 0.4 runs in a venv of its own (it pins `openai<3`, gymforge's lock has 3.x), so its plugin,
`gymforge_tasks` (src/gymforge/interop/verifiers_env/), imports nothing of gymforge: it runs this module with
gymforge's Python (`python -m gymforge.interop.verifiers_bridge ...`):

- `rows RESULTS [--micro]`: the taskset, a JSON list of the verified tasks' rows (`trl_env.task_rows`);
- `episode ROW --base-url URL --model M --out DIR --reward FILE [--config C] ...`: one rollout. It writes the
  rollout's run config (`episode_config`: the user's config with verifiers' interception endpoint as the teacher and
  a response cache of the rollout's own), runs `gymforge run-task --policy teacher` on the row's task with it, and
  writes FILE: the shaped reward of the trajectory (`gymforge.rl.rewards.episode_reward` under `rl.reward`, what
  TRL's `GymforgeEnv.get_reward` returns) and the scores of its submission.

The endpoint's key comes in the environment variable `KEY_ENV`, never on a command line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gymforge.agent.trajectory import read_trajectory
from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig, config_or_defaults
from gymforge.interop.trl_env import TaskRow, task_rows
from gymforge.rl.rewards import Episode, TaskMetric, episode_reward
from gymforge.tasks.datacache import cache_root

KEY_ENV = "GYMFORGE_VERIFIERS_API_KEY"
ROW_FIELDS = ("task", "root", "metric", "higher_is_better", "baseline", "hidden_columns", "slot")


def rows(results: Path, *, micro: bool = False) -> list[dict[str, Any]]:
    """The taskset's rows: the fields of `TaskRow` (no prompt: the agent loop renders the task's first message)."""
    return [{k: row[k] for k in ROW_FIELDS} for row in task_rows(results, micro=micro)]


def episode_config(settings: GymforgeConfig, *, base_url: str, model: str, cache: Path) -> GymforgeConfig:
    """`settings` with the teacher at `base_url` (an OpenAI-compatible endpoint whose key is in `KEY_ENV`) and the
    LLM response cache under `cache`, so that every model call of the rollout reaches the endpoint; the fetched
    datasets stay where `settings` keeps them."""
    teacher = settings.llm.teacher.model_copy(update={
        "provider": "openai", "base_url": base_url, "model": model, "api_key_env": KEY_ENV,
        "offline_endpoint": "chat"})
    datasets = settings.datasets.model_copy(update={"cache_dir": str(cache_root(settings).resolve())})
    return settings.model_copy(update={"llm": settings.llm.model_copy(update={"teacher": teacher}),
                                       "datasets": datasets, "cache_dir": str(Path(cache).resolve())})


def episode_reward_of(traj_path: Path, row: TaskRow, settings: GymforgeConfig,
                      measured_baseline: dict[str, float] | None = None) -> dict[str, Any]:
    """What the verifiers task records for one trajectory: the shaped reward and the submission's scores."""
    traj = read_trajectory(traj_path)
    baseline = json.loads(row.baseline) if row.baseline else measured_baseline or {}
    value = baseline.get(row.metric)
    metric = TaskMetric(metric=row.metric, higher_is_better=row.higher_is_better,
                        baseline=float(value) if isinstance(value, (int, float)) else None)
    reward = episode_reward(Episode.of(traj), metric, settings.rl.reward)
    return {"reward": reward.reward, "score": reward.score, "valid": reward.valid,
            "improvement": reward.improvement, "metric": row.metric, "scores": traj.info.score,
            "exit_status": traj.info.exit_status, "trajectory": str(Path(traj_path).resolve())}


def run_episode(row: TaskRow, *, base_url: str, model: str, out: Path, reward_file: Path,
                config: Path | None = None, sandbox: str = "local", max_steps: int = 50, seed: int = 0) -> dict[str, Any]:
    """One rollout of `row`'s task through `gymforge run-task` against `base_url`; the reward record (also
    written to `reward_file`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = config_or_defaults(str(config) if config else None)
    run_cfg = episode_config(settings, base_url=base_url, model=model, cache=out / "cache")
    cfg_path = atomic.write_text(out / "config.json", run_cfg.model_dump_json(indent=2))
    command = [sys.executable, "-m", "gymforge", "run-task", row.task, "--root", row.root, "--policy", "teacher",
               "--config", str(cfg_path), "--out", str(out / "episode"), "--sandbox", sandbox,
               "--max-steps", str(max_steps), "--seed", str(seed)]
    if row.hidden_columns:
        command += ["--hidden-columns", row.hidden_columns]
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        raise SystemExit(f"gymforge run-task exited {done.returncode} on {row.task}")
    trajectories = sorted((out / "episode").glob("*.traj"))
    if len(trajectories) != 1:
        raise SystemExit(f"gymforge run-task left {len(trajectories)} trajectories in {out / 'episode'}")
    results = out / "episode" / "results.json"
    measured = json.loads(results.read_text()).get("baseline") if results.is_file() else None
    record = episode_reward_of(trajectories[0], row, run_cfg, measured)
    atomic.write_json(reward_file, record)
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gymforge.interop.verifiers_bridge", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("rows", help="the verified tasks of a results directory, as a JSON list of rows")
    p.add_argument("results")
    p.add_argument("--micro", action="store_true", help="the micro variants instead")
    p = sub.add_parser("episode", help="one rollout: gymforge run-task against the endpoint, then its reward")
    p.add_argument("row", help="the task's row (JSON, as `rows` prints it)")
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True, help="the rollout's directory (run config, episode, response cache)")
    p.add_argument("--reward", required=True, help="where the reward record (JSON) goes")
    p.add_argument("--config", default=None, help="the gymforge config (default: ./config.yaml, else the defaults)")
    p.add_argument("--sandbox", choices=["local", "docker"], default="local")
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "rows":
        json.dump(rows(Path(args.results), micro=args.micro), sys.stdout)
        return
    row = TaskRow(**{k: v for k, v in json.loads(args.row).items() if k in ROW_FIELDS})
    record = run_episode(row, base_url=args.base_url, model=args.model, out=Path(args.out),
                         reward_file=Path(args.reward), config=Path(args.config) if args.config else None,
                         sandbox=args.sandbox, max_steps=args.max_steps, seed=args.seed)
    print(json.dumps({k: record[k] for k in ("reward", "score", "exit_status")}))


if __name__ == "__main__":
    main()
