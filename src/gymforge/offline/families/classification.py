"""Tabular classification (CSVSubmissionTasks): predict a label column for the test split."""

from __future__ import annotations

from gymforge.offline.families import tabular

NAME = "tabular_classification"
ENTRYPOINT, FILES = tabular.ENTRYPOINT, tabular.FILES
PROBLEM = "classification"
METRICS = ("accuracy", "macro_f1")
TASK_LINES, CLOSINGS = tabular.family_texts(NAME)  # the descriptions' prose (tabular.yaml)


# the family protocol, shared with the other CSV family (tabular.CsvFamily)
_FAMILY = tabular.CsvFamily(NAME, PROBLEM, METRICS, FILES, TASK_LINES, CLOSINGS)
plan, file_names, describe = _FAMILY.plan, _FAMILY.file_names, _FAMILY.describe
files, runtime_bug, sloppy_evaluator = _FAMILY.files, _FAMILY.runtime_bug, _FAMILY.sloppy_evaluator
