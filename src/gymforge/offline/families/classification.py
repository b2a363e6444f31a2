"""Tabular classification (CSVSubmissionTasks): predict a label column for the test split."""

from __future__ import annotations

from gymforge.offline.families import tabular

NAME = "tabular_classification"
ENTRYPOINT = "CSVSubmissionTasks"
PROBLEM = "classification"
METRICS = ("accuracy", "macro_f1")
FILES = ("baseline.py", "evaluate.py")

TASK_LINES = (
    "Train a classifier on the `train` split and predict `{target}` for every row of the `test` split.",
    "Build a model that predicts the class label `{target}` from the other columns; it is judged on the "
    "held-out `test` split.",
    "Learn from the `train` split to predict `{target}` for the unseen rows of the `test` split.",
)
CLOSINGS = (
    "Beat the baseline: engineer features, try other model families, tune hyper-parameters, and compare ideas "
    "with cross-validation on the train split before submitting.",
    "The baseline uses only some of the columns and an untuned model, so there is room to improve; hold out part "
    "of the train split to compare ideas.",
    "Class balance, feature encoding and model capacity all matter here; validate on the train split before you "
    "submit.",
)


# the family protocol, shared with the other CSV family (tabular.CsvFamily)
_FAMILY = tabular.CsvFamily(NAME, PROBLEM, METRICS, FILES, TASK_LINES, CLOSINGS)
plan, file_names, describe = _FAMILY.plan, _FAMILY.file_names, _FAMILY.describe
files, runtime_bug = _FAMILY.files, _FAMILY.runtime_bug
