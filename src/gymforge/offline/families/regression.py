"""Tabular regression (CSVSubmissionTasks): predict a numeric column for the test split."""

from __future__ import annotations

from gymforge.offline.families import tabular

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


# the family protocol, shared with the other CSV family (tabular.CsvFamily)
_FAMILY = tabular.CsvFamily(NAME, PROBLEM, METRICS, FILES, TASK_LINES, CLOSINGS)
plan, file_names, describe = _FAMILY.plan, _FAMILY.file_names, _FAMILY.describe
files, runtime_bug = _FAMILY.files, _FAMILY.runtime_bug
