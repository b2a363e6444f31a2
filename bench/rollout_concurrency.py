"""Speed-up of concurrent rollouts inside one shard: `trajectories.concurrency` 16 against 1, same run.

    .venv/bin/python bench/rollout_concurrency.py [--rollouts 16] [--delay 0.2] [--turns 10]

One shard of `--rollouts` rollouts runs through the real `gymforge.stages.rollouts.run_shard` (real agent
loop, real local sandbox, real `openai` client over HTTP) against a loopback OpenAI-compatible server
that holds every response `--delay` seconds, like a remote model. The agent's replies are scripted so
that the time goes where it goes in production: waiting for the model. Each rollout opens a file,
browses it, runs the task's (tiny) baseline in its own sandbox workspace, validates and submits.
The task is a tiny CSV regression (tests/fixtures/mlgym/csvTiny), so sandbox work stays small.
Prints the wall time of each setting and the speed-up; exits 1 below `--target` (default 8x).

Everything a real shard does is measured, the LLM ledger and response cache included (fsync'd atomic
writes on the event loop thread: on a slow or busy disk pass `--scratch /dev/shm` to see the engine alone).
The machine should be otherwise idle: on 2 cores, other jobs' CPU load shows up directly in the result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from loopback import Answer, LoopbackServer, completion  # noqa: E402

from gymforge.core.config import GymforgeConfig  # noqa: E402
from gymforge.core.records import VerificationReport  # noqa: E402
from gymforge.stages.rollouts import rollout_shard  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "mlgym"
SLOT = "t0000"


def make_environment(root: Path, slot: str = SLOT, baseline: float = 3.0) -> tuple[Path, Path]:
    """A verified environment of the fixture's csvTiny task, laid out as stage 3.4 writes it: (report, verified)."""
    import yaml

    env_dir = root / "environments" / slot
    tree = env_dir / "verified" / "mlgym"
    (tree / "configs" / "tasks").mkdir(parents=True)
    task = yaml.safe_load((FIXTURE / "configs" / "tasks" / "csvTiny.yaml").read_text())
    task["baseline_scores"] = [{"rmse": baseline}]
    (tree / "configs" / "tasks" / "csvTiny.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    shutil.copytree(FIXTURE / "configs" / "datasets", tree / "configs" / "datasets")
    shutil.copytree(FIXTURE / "data" / "csvTiny", tree / "data" / "csvTiny")
    report = VerificationReport(item=slot, status="ok", task_id="csvTiny", entrypoint="CSVSubmissionTasks",
                                baseline_scores=[{"rmse": baseline}])
    (env_dir / "report.json").write_text(report.model_dump_json(indent=2))
    return env_dir / "report.json", env_dir / "verified"


def scripted_reply(turn: int, seed: int | None, turns: int) -> str:
    """The scripted agent's reply at `turn` (0-based): browse, run the baseline, validate, submit."""
    browse = ['open "baseline.py"', "scroll_down", "goto 1", "search_file mean", 'open "evaluate.py"', "scroll_up"]
    plan = ["ls"] + [browse[i % len(browse)] for i in range(max(0, turns - 4))] + ["python baseline.py", "validate",
                                                                                    "submit"]
    action = plan[min(turn, len(plan) - 1)]
    return f"DISCUSSION\nStep {turn} of my plan (episode seed {seed}): `{action.splitlines()[0]}`.\n\n```\n{action}\n```\n"


def responder(turns: int):
    def respond(body: dict[str, Any]) -> Answer:
        turn = sum(m.get("role") == "assistant" for m in body.get("messages", []))
        reply = scripted_reply(turn, body.get("seed"), turns)
        return Answer(200, {}, completion(reply, model=body.get("model", "scripted"), prompt_tokens=100,
                                          completion_tokens=20))
    return respond


def config(root: Path, url: str, rollouts: int, concurrency: int, max_steps: int = 30) -> GymforgeConfig:
    return GymforgeConfig.model_validate({
        "results_dir": str(root / "results"),
        "cache_dir": str(root / "cache"),
        "llm": {"budget_usd": 100.0, "teacher": {"provider": "openai", "base_url": url, "model": "scripted-agent",
                                                   "concurrency": max(concurrency, 1)}},
        "trajectories": {"per_task": rollouts, "shard_size": rollouts, "concurrency": concurrency,
                         "max_steps": max_steps},
    })


def run_once(work: Path, url: str, rollouts: int, concurrency: int) -> tuple[float, Any]:
    report, verified = make_environment(work)
    cfg = config(work, url, rollouts, concurrency)
    t0 = time.perf_counter()
    shard = rollout_shard(cfg, SLOT, 0, report, verified, work / "results" / "trajectories" / SLOT / "shard_0000.json")
    return time.perf_counter() - t0, shard


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.2, help="seconds the server holds every response")
    parser.add_argument("--turns", type=int, default=10, help="agent turns per rollout")
    parser.add_argument("--target", type=float, default=8.0)
    parser.add_argument("--scratch", default=None,
                        help="where the results dir, cache and workspaces go (default: the system temp dir)")
    args = parser.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "loopback")  # the loopback server ignores it
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    results = {}
    with LoopbackServer(respond=responder(args.turns), delay_s=args.delay) as server, \
            tempfile.TemporaryDirectory(prefix="gymforge-bench-", dir=args.scratch) as tmp:
        print(f"scratch: {tmp}; server delay {args.delay:g} s per response")
        for concurrency in (1, args.concurrency):
            sent = server.count
            seconds, shard = run_once(Path(tmp) / f"c{concurrency}", server.url, args.rollouts, concurrency)
            exits = sorted({r.trajectory.info.exit_status for r in shard.rollouts})
            results[concurrency] = seconds
            print(f"concurrency {concurrency:>2}: {args.rollouts} rollouts x {args.turns} turns, "
                  f"{server.count - sent} requests, {seconds:6.2f} s wall, exits {exits}")
        print(f"max requests in flight: {server.max_in_flight}")
    speedup = results[1] / results[args.concurrency]
    ideal = min(args.concurrency, args.rollouts)
    print(json.dumps({"delay_s": args.delay, "rollouts": args.rollouts, "turns": args.turns,
                      "seconds": {str(k): round(v, 2) for k, v in results.items()},
                      "speedup": round(speedup, 2), "ideal": ideal}))
    print(f"speed-up of concurrency {args.concurrency} over 1: {speedup:.1f}x (ideal {ideal}x, target {args.target}x)")
    return 0 if speedup >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
