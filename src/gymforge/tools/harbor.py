"""`gymforge export-harbor OUT` and `gymforge harbor-run FOLDER`: Harbor task folders out of a results directory, and
one Harbor task folder run in gymforge's sandbox (gymforge.interop.harbor; docs/interop.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gymforge.core.config import config_or_defaults
from gymforge.interop.harbor import DEFAULT_IMAGE, HarborTask, export_results, leased_sandbox, run_harbor_task
from gymforge.sandbox import Limits
from gymforge.tasks.episode import sandbox_for


def export_main(args) -> None:
    cfg = config_or_defaults(args.config)
    results = Path(args.results or cfg.results_dir)
    if not (results / "environments").is_dir():
        sys.exit(f"gymforge export-harbor: {results}/environments: no verified environments to export")
    done, refused = export_results(results, Path(args.out), sandbox=sandbox_for(cfg, 0),
                                   micro=args.micro, base_image=args.base_image, limits=Limits.from_config(cfg.sandbox),
                                   scale_floor=cfg.rl.reward.scale_floor)
    for item in done:
        print(f"{item.task_id:<32} {'written' if item.written else 'unchanged'}  {item.path}")
    for slot, why in refused.items():
        print(f"{slot:<32} not exported: {why}")


def run_main(args) -> None:
    cfg = config_or_defaults(args.config)
    folder = Path(args.folder)
    task = HarborTask.read(folder)
    with leased_sandbox(cfg, task, say=lambda line: print(line, file=sys.stderr)) as sandbox:
        run = run_harbor_task(folder, Path(args.work), sandbox=sandbox, limits=Limits.from_config(cfg.sandbox),
                              solution=not args.nop)
    for line in run.ignored:
        print(f"not carried out by gymforge's sandbox (build the image to have it): {line}", file=sys.stderr)
    print(json.dumps({"rewards": run.rewards, "agent_exit": run.agent.exit_code if run.agent else None,
                      "verifier_exit": run.verifier.exit_code}, indent=1))
    if run.rewards is None:
        sys.exit("gymforge harbor-run: the verifier wrote no reward (reward.json or reward.txt)")


__all__ = ["DEFAULT_IMAGE", "export_main", "run_main"]

