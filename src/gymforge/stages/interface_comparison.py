"""The agent interfaces compared on the same tasks (`trajectories.interfaces`, docs/post-training.md): for each
interface, over its teacher rollouts, the share of valid submissions, the improvement over the baseline (for a
post-training task: over the base model), the share of failed actions and the train-to-eval iterations per episode,
each with a bootstrap 95% interval over episodes.

An episode without a valid final submission counts as no improvement (0): what a user gets from it is the base
model. Improvements are in the task's own metric, signed so that better is positive, and averaged over episodes of
every task; with tasks of different metrics they are comparable only as a sign.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig
from gymforge.core.records import ShardRecord, VerificationReport, final_submission

LEVEL = 0.95
SAMPLES = 2000
SEED = 0
MEASURES = {
    "valid": "valid submissions",
    "improvement": "improvement over the baseline",
    "failed_share": "failed actions (share of actions)",
    "train_eval_iterations": "train-to-eval iterations per episode",
}


def episode_measures(record: Any, metric: str | None, higher_is_better: bool) -> dict[str, float]:
    """The four measures of one rollout (`RolloutRecord`)."""
    info, steps = record.trajectory.info, len(record.trajectory.trajectory)
    final = final_submission(info.score, info.exit_status)
    improvement = 0.0
    if final is not None and metric and record.baseline and metric in final and metric in record.baseline:
        improvement = (final[metric] - record.baseline[metric]) * (1 if higher_is_better else -1)
    return {"valid": float(final is not None), "improvement": float(improvement),
            "failed_share": info.failed_actions / steps if steps else 0.0,
            "train_eval_iterations": float(info.train_eval_iterations)}


def interval(values: list[float], seed: int = SEED) -> dict[str, Any]:
    """The mean and its percentile-bootstrap interval (scipy.stats.bootstrap); a single point when every value is
    the same or there is one."""
    from scipy.stats import bootstrap

    data = np.asarray(values, dtype=float)
    mean = float(data.mean()) if data.size else float("nan")
    if data.size < 2 or np.all(data == data[0]):
        return {"estimate": round(mean, 4), "ci": [round(mean, 4), round(mean, 4)]}
    res = bootstrap((data,), np.mean, confidence_level=LEVEL, n_resamples=SAMPLES, method="percentile",
                    random_state=np.random.default_rng(seed))
    low, high = res.confidence_interval
    return {"estimate": round(mean, 4), "ci": [round(float(low), 4), round(float(high), 4)]}


def compare(shards: list[ShardRecord], reports: dict[str, VerificationReport]) -> dict[str, Any]:
    """{interface: {episodes, tasks, <measure>: {estimate, ci}}} over every rollout that names its interface."""
    by_interface: dict[str, list[dict[str, float]]] = defaultdict(list)
    tasks: dict[str, set[str]] = defaultdict(set)
    for shard in shards:
        report = reports.get(shard.item)
        for record in shard.rollouts:
            interface = record.trajectory.meta.get("interface")
            if interface is None or report is None:
                continue
            by_interface[interface].append(episode_measures(record, report.metric, report.higher_is_better))
            tasks[interface].add(shard.item)
    out: dict[str, Any] = {}
    for interface, rows in sorted(by_interface.items()):
        out[interface] = {"episodes": len(rows), "tasks": len(tasks[interface]),
                          **{m: interval([r[m] for r in rows]) for m in MEASURES}}
    return out


def render(table: dict[str, Any]) -> str:
    """The comparison as a Markdown table (estimate [95% interval])."""
    lines = ["| interface | episodes (tasks) | " + " | ".join(MEASURES.values()) + " |",
             "|---|---|" + "---|" * len(MEASURES)]
    for interface, row in table.items():
        cells = [f"{row[m]['estimate']:.3g} [{row[m]['ci'][0]:.3g}, {row[m]['ci'][1]:.3g}]" for m in MEASURES]
        lines.append(f"| `{interface}` | {row['episodes']} ({row['tasks']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def interface_comparison(cfg: GymforgeConfig, shards: list[Path], reports: list[Path], out: Path,
                         table_out: Path) -> str:
    """Read the rollout shards and the tasks' verification reports; write the comparison (JSON) and its table."""
    records = [ShardRecord.model_validate_json(Path(p).read_text()) for p in shards]
    verified = {}
    for path in reports:
        report = VerificationReport.model_validate_json(Path(path).read_text())
        if report.status == "ok":
            verified[report.item] = report
    table = compare(records, verified)
    atomic.write_text(out, json.dumps({"level": LEVEL, "samples": SAMPLES, "seed": SEED,
                                       "interfaces": cfg.trajectories.interfaces, "measures": MEASURES,
                                       "by_interface": table}, indent=2))
    text = render(table)
    atomic.write_text(table_out, text)
    return text
