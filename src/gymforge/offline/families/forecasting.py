"""Time-series forecasting (CSVSubmissionTasks): forecast the chronological tail held out as the test split."""

from __future__ import annotations

import random
from datetime import date
from string import Template
from typing import Any

from gymforge.offline.families import tabular
from gymforge.offline.families.common import TaskSpec
from gymforge.offline.families.tabular import lit

NAME = "time_series_forecasting"
ENTRYPOINT, FILES = tabular.ENTRYPOINT, tabular.FILES
PROBLEM = "forecasting"
METRICS = ("rmse", "mae")
TASK_LINES, CLOSINGS = tabular.family_texts(NAME)  # the descriptions' prose (tabular.yaml)

# name -> (docstring summary, module constants, body of forecast(history, horizon))
METHODS: dict[str, tuple[str, str, str]] = {
    "last value": ("Repeats the last observed value.", "", "return np.full(horizon, history[-1])"),
    "window mean": ("Repeats the mean of the last WINDOW observations.", "WINDOW = $window",
                    "return np.full(horizon, history[-WINDOW:].mean())"),
    "seasonal naive": ("Repeats the last full season of PERIOD observations.", "PERIOD = $period",
                       "return np.resize(history[-PERIOD:], horizon)"),
    "drift": ("Extends the straight line from the first to the last observation.", "",
              "slope = (history[-1] - history[0]) / max(len(history) - 1, 1)\n"
              "    return history[-1] + slope * np.arange(1, horizon + 1)"),
    "exponential smoothing": ("Simple exponential smoothing: repeats the smoothed level.", "ALPHA = $alpha",
                              "level = history[0]\n    for value in history[1:]:\n"
                              "        level = ALPHA * value + (1 - ALPHA) * level\n"
                              "    return np.full(horizon, level)"),
}

BASELINE = Template('''\
"""Baseline for $task_id: $method forecast of `$target`.

$summary
Forecasts every row of the test split (the chronological continuation of train) and writes
submission.csv (columns id, $target).
"""

import numpy as np
import pandas as pd
from datasets import load_from_disk
$constants

def forecast(history: np.ndarray, horizon: int) -> np.ndarray:
    """$summary"""
    $body


def main() -> None:
    data = load_from_disk("data")
    train = data["train"].to_pandas()
    test = data["test"].to_pandas()
    # A gap would shift every later value, so the last observation is carried forward.
    history = train[$target_lit].ffill().dropna().to_numpy(dtype=float)
    submission = pd.DataFrame({"id": np.arange(len(test)), $target_lit: forecast(history, len(test))})
    submission.to_csv("submission.csv", index=False)
    print(f"wrote submission.csv with {len(submission)} rows")


if __name__ == "__main__":
    main()
''')


def season_length(spec: TaskSpec) -> int | None:
    """Observations per season, read from the schema and the spacing of the example timestamps."""
    names = {c.name for c in spec.columns}
    if "quarter" in names:
        return 4
    time = next((c for c in spec.columns if c.name == spec.time_column), None)
    stamps = [v for v in time.examples if isinstance(v, str)] if time else []
    try:
        days = [(date.fromisoformat(b[:10]) - date.fromisoformat(a[:10])).days
                for a, b in zip(stamps, stamps[1:], strict=False)]  # consecutive pairs: one fewer than stamps
    except ValueError:
        return None
    if not days:
        return None
    step = min(days)
    return {1: 7, 7: 52}.get(step) or (12 if 28 <= step <= 31 else 4 if 89 <= step <= 92 else None)


def plan(proposal: dict[str, Any], rng: random.Random) -> TaskSpec | None:
    return tabular.plan(NAME, PROBLEM, METRICS, proposal, rng)


def file_names(spec: TaskSpec) -> tuple[str, str]:
    return FILES


def describe(spec: TaskSpec, proposal: dict[str, Any], rng: random.Random) -> str:
    facts = {"task": PROBLEM, "target column": spec.target}
    if spec.time_column:
        facts["time column"] = spec.time_column
    facts |= {"metric": f"{spec.metric} ({spec.direction})", "submission": tabular.csv_submission_note(spec)}
    lines = tuple(line.format(target=spec.target) for line in TASK_LINES)
    return tabular.csv_description(spec, proposal, rng, lines, CLOSINGS, facts)


def files(spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    period = season_length(spec)
    choices = [m for m in METHODS if m != "seasonal naive"] + (["seasonal naive"] * 2 if period else [])
    method = rng.choice(choices)
    summary, constants, body = METHODS[method]
    constants = Template(constants).substitute(
        window=rng.choice((4, 8, 12)), period=period, alpha=rng.choice((0.2, 0.5, 0.8)))
    baseline = BASELINE.substitute(
        task_id=spec.task_id, method=method, target=spec.target, target_lit=lit(spec.target), summary=summary,
        constants=f"\n{constants}\n" if constants else "", body=body)
    return {FILES[0]: baseline, FILES[1]: tabular.csv_evaluate(spec)}


def runtime_bug(sources: dict[str, str], spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    return tabular.csv_runtime_bug(sources, spec, FILES[0], rng)


def sloppy_evaluator(sources: dict[str, str], spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    return {**sources, FILES[1]: tabular.sloppy_csv_evaluate(sources[FILES[1]], spec, rng)}
