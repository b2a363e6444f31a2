"""Tabular regression (CSVSubmissionTasks): predict a numeric column for the test split."""

from __future__ import annotations

import random
from typing import Any

from gymforge.offline.families import tabular
from gymforge.offline.families.common import TaskSpec

NAME = "tabular_regression"
ENTRYPOINT = "CSVSubmissionTasks"
PROBLEM = "regression"
METRICS = ("rmse", "mae", "r2")
FILES = ("baseline.py", "evaluate.py")

TASK_LINES = (
    "Fit a regression model on the `train` split and predict `{target}` for every row of the `test` split.",
    "Predict the numeric column `{target}` from the other columns; the model is judged on the held-out `test` "
    "split.",
    "Learn from the `train` split to estimate `{target}` for the unseen rows of the `test` split.",
)
CLOSINGS = (
    "Beat the baseline: transform skewed columns, add interactions, try other model families and tune "
    "regularisation, comparing ideas with cross-validation on the train split.",
    "The baseline uses only some of the columns and an untuned model, so there is room to improve; hold out part "
    "of the train split to compare ideas.",
    "Outliers, scaling and model capacity all matter here; validate on the train split before you submit.",
)


def plan(proposal: dict[str, Any], rng: random.Random) -> TaskSpec | None:
    return tabular.plan(NAME, PROBLEM, METRICS, proposal, rng)


def file_names(spec: TaskSpec) -> tuple[str, str]:
    return FILES


def describe(spec: TaskSpec, proposal: dict[str, Any], rng: random.Random) -> str:
    facts = {"task": PROBLEM, "target column": spec.target, "metric": f"{spec.metric} ({spec.direction})",
             "submission": tabular.csv_submission_note(spec)}
    lines = tuple(line.format(target=spec.target) for line in TASK_LINES)
    return tabular.csv_description(spec, proposal, rng, lines, CLOSINGS, facts)


def files(spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    return {FILES[0]: tabular.csv_baseline(spec, rng), FILES[1]: tabular.csv_evaluate(spec)}


def runtime_bug(sources: dict[str, str], spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    return tabular.csv_runtime_bug(sources, spec, FILES[0], rng)
