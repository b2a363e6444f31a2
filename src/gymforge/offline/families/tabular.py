"""Code shared by the dataset families: target choice, the model catalogue, baseline and scorer sources.

Generated scripts name dataset columns as string literals inside subscripts (`train["species"]`), the
form the pipeline's static column check can follow, so a misspelt column is caught before anything runs.
"""

from __future__ import annotations

import json
import random
import re
from importlib import resources
from string import Template
from typing import Any

import yaml

from gymforge.offline.families.common import (
    Column,
    TaskSpec,
    columns,
    description,
    is_calendar,
    is_id_like,
    make_id,
    n_rows,
    normalize_metric,
    proposal_text,
    subject_words,
    topic_match,
    words,
)

# What every CSV family (classification, regression, forecasting) writes and how MLGym runs it.
ENTRYPOINT = "CSVSubmissionTasks"
FILES = ("baseline.py", "evaluate.py")

# (label, import line, constructor with $placeholders, choices per placeholder)
Model = tuple[str, str, str, dict[str, tuple[Any, ...]]]

# The model tables and the CSV families' prose: data, in tabular.yaml (shipped with the package).
_TABLES: dict[str, Any] = yaml.safe_load(
    resources.files(__package__).joinpath("tabular.yaml").read_text(encoding="utf-8"))


def _models(problem: str) -> tuple[Model, ...]:
    return tuple((m["label"], m["import"], m["constructor"], {k: tuple(v) for k, v in m["choices"].items()})
                 for m in _TABLES["models"][problem])


CLASSIFIERS: tuple[Model, ...] = _models("classification")
REGRESSORS: tuple[Model, ...] = _models("regression")


def family_texts(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(task sentences, closing advice) of a CSV family's descriptions; `{target}` stands for the target column."""
    texts = _TABLES["families"][name]
    return tuple(texts["task_lines"]), tuple(texts["closings"])


def lit(value: Any) -> str:
    """A Python literal in double quotes, the style the generated code uses throughout."""
    return json.dumps(value)


def _small_ints(column: Column) -> bool:
    return all(isinstance(v, int) and 0 <= v < 20 for v in column.examples)


def pick_target(dataset: dict[str, Any], problem: str, topic: str, rng: random.Random) -> Column | None:
    """The column to predict: the one the topic names, else the card's label, else a plausible one."""
    card = dataset.get("card_data") or {}
    card_target = card.get("target")
    regression_card = any("regression" in c or "time-series" in c for c in card.get("task_categories") or [])
    cols = [c for c in columns(dataset) if not is_calendar(c) and not is_id_like(c)]
    if problem == "classification":
        # A regression card's integer target (days, counts) is not a class label.
        numeric_label = regression_card and card_target
        candidates = [c for c in cols if c.discrete and not (c.name == numeric_label and c.kind != "categorical")]
    else:
        candidates = [c for c in cols if c.kind == "numeric" and "class_label" not in c.dtype]
    if not candidates:
        return None
    subject = subject_words(topic)
    # The card's label wins ties: "digit recognition from pixels" must not predict a pixel.
    best = max(candidates, key=lambda c: (topic_match(c, subject), c.name == card_target))
    if topic_match(best, subject) or best.name == card_target:
        return best
    if problem == "classification":
        preferred = [c for c in candidates if c.kind == "categorical"] or [c for c in candidates if _small_ints(c)]
    else:
        preferred = [c for c in candidates if c.dtype.startswith("float")]
    return rng.choice(preferred or candidates)


_PROBLEM_WORDS = (("forecast", "forecasting"), ("classif", "classification"), ("regress", "regression"),
                  ("estimat", "regression"))


def problem_of(dataset: dict[str, Any], topic: str = "") -> str:
    """classification | regression | forecasting: what the topic says, else the card, else the label's dtype."""
    lowered = topic.lower()
    named = next((problem for stem, problem in _PROBLEM_WORDS if stem in lowered), None)
    if named:
        return named
    card = dataset.get("card_data") or {}
    categories = " ".join(card.get("task_categories") or [])
    if "time-series" in categories or "forecasting" in categories:
        return "forecasting"
    if "regression" in categories:
        return "regression"
    if "classification" in categories:
        return "classification"
    target = next((c for c in columns(dataset) if c.name == card.get("target")), None)
    discrete = target is not None and (target.kind == "categorical" or _small_ints(target))
    return "classification" if discrete else "regression"


def choose_model(problem: str, n_rows: int, rng: random.Random) -> tuple[str, str, str]:
    """(label, import line, constructor expression) with seeded hyper-parameters that suit `n_rows` rows."""
    label, imports, expr, choices = rng.choice(CLASSIFIERS if problem == "classification" else REGRESSORS)
    # k-NN needs at least k training rows; the smallest datasets have a dozen.
    if "k" in choices:
        choices = {"k": tuple(k for k in choices["k"] if k <= n_rows // 2) or (1,)}
    return label, imports, Template(expr).substitute({k: rng.choice(v) for k, v in choices.items()})


def feature_subset(spec: TaskSpec, rng: random.Random) -> list[str]:
    """A seeded share of the usable columns, in schema order: the baseline leaves room to improve."""
    usable = [c.name for c in spec.features()]
    k = max(1, round(len(usable) * rng.choice((0.5, 0.75, 1.0))))
    keep = set(rng.sample(usable, k))
    return [name for name in usable if name in keep]


def example_value(spec: TaskSpec) -> Any:
    """A realistic prediction for the description's example row."""
    target = next((c for c in spec.columns if c.name == spec.target), None)
    if target is not None and target.examples:
        return target.examples[0]
    return 0 if spec.problem == "classification" else 0.0


PREPROCESS_IMPORTS = """\
from sklearn.compose import ColumnTransformer, make_column_selector
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler"""

# build_model's preprocessing (the improvements' models reuse it): impute and encode by dtype
PREPROCESS = '''\
    numeric = make_pipeline(SimpleImputer(strategy="median"), StandardScaler())
    categorical = make_pipeline(
        SimpleImputer(strategy="most_frequent"), OneHotEncoder(handle_unknown="ignore", sparse_output=False)
    )
    features = ColumnTransformer([
        ("numeric", numeric, make_column_selector(dtype_include="number")),
        ("categorical", categorical, make_column_selector(dtype_exclude="number")),
    ])
'''

BUILD_MODEL = Template('''\
def build_model():
    """Impute and encode by dtype, so the pipeline accepts any subset of the columns."""
''' + PREPROCESS + '''\
    return make_pipeline(features, $model)
''')

CSV_BASELINE = Template('''\
"""Baseline for $task_id: $label on $n_used of the $n_all usable columns.

Fits on the train split and writes submission.csv (columns id, $target), one row per test row.
"""

import numpy as np
import pandas as pd
from datasets import load_from_disk
$preprocess_imports
$model_import

SEED = $seed


$build_model

def main() -> None:
    # Estimators without a random_state draw from numpy's global generator.
    np.random.seed(SEED)
    data = load_from_disk("data")
    train = data["train"].to_pandas()
    train = train[train[$target_lit].notna()]
    test = data["test"].to_pandas()
    x_train = train[$features]
    model = build_model().fit(x_train, train[$target_lit])
    predictions = model.predict(test[x_train.columns])
    submission = pd.DataFrame({"id": np.arange(len(test)), $target_lit: predictions})
    submission.to_csv("submission.csv", index=False)
    print(f"wrote submission.csv with {len(submission)} rows")


if __name__ == "__main__":
    main()
''')


def csv_baseline(spec: TaskSpec, rng: random.Random) -> str:
    label, model_import, model = choose_model(spec.problem, spec.n_rows, rng)
    features = feature_subset(spec, rng)
    return CSV_BASELINE.substitute(
        task_id=spec.task_id, label=label, n_used=len(features), n_all=len(spec.features()),
        target=spec.target, target_lit=lit(spec.target), preprocess_imports=PREPROCESS_IMPORTS,
        model_import=model_import, seed=rng.randrange(10_000), build_model=BUILD_MODEL.substitute(model=model),
        features=lit(features),
    )


LABELS = '''\
def labels(values: pd.Series) -> pd.Series:
    """Labels as text, whole numbers without a decimal point, so 1, 1.0 and "1" are the same class."""
    return pd.Series([str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in values.tolist()])
'''

# Each scorer: (extra imports, source of `score(answers, predictions)`); both arguments are pandas Series.
SCORERS: dict[str, tuple[str, str]] = {
    "accuracy": ("", LABELS + '''

def score(answers: pd.Series, predictions: pd.Series) -> float:
    """Share of exact matches."""
    return float((labels(answers) == labels(predictions)).mean())
'''),
    "macro_f1": ("from sklearn.metrics import f1_score", LABELS + '''

def score(answers: pd.Series, predictions: pd.Series) -> float:
    """F1 averaged over classes, so a rare class weighs as much as a common one."""
    return float(f1_score(labels(answers), labels(predictions), average="macro"))
'''),
    "rmse": ("import numpy as np", '''\
def score(answers: pd.Series, predictions: pd.Series) -> float:
    """Root mean squared error."""
    return float(np.sqrt(np.mean((answers.to_numpy(float) - predictions.to_numpy(float)) ** 2)))
'''),
    "mae": ("import numpy as np", '''\
def score(answers: pd.Series, predictions: pd.Series) -> float:
    """Mean absolute error."""
    return float(np.mean(np.abs(answers.to_numpy(float) - predictions.to_numpy(float))))
'''),
    "r2": ("from sklearn.metrics import r2_score", '''\
def score(answers: pd.Series, predictions: pd.Series) -> float:
    """Coefficient of determination (1 is perfect, 0 is predicting the mean)."""
    return float(r2_score(answers.to_numpy(float), predictions.to_numpy(float)))
'''),
}

# A CSV scorer imports `datasets` only where it needs it (plain MLGym): the import costs every evaluation a second.
LAZY_DATASETS = "    from datasets import load_from_disk\n\n"
LOAD_ANSWERS = Template('''\
def load_answers() -> pd.Series:
    """Test labels in test-split order, read only here: under gymforge they sit outside the agent's reach in
    $$GYMFORGE_SECRETS/answers.csv; elsewhere (plain MLGym) they come from the test split."""
    secrets = os.environ.get("GYMFORGE_SECRETS")
    if secrets:
        answers = pd.read_csv(os.path.join(secrets, "answers.csv"))
        return answers.sort_values("id")[$target_lit].reset_index(drop=True)
$lazy_import    return load_from_disk("data")["test"].to_pandas()[$target_lit]
''')

CSV_EVALUATE = Template('''\
"""Scores a submission for $task_id against the held-out test labels.

Usage: python evaluate.py --submission_file submission.csv
Prints one JSON object, {"$metric": ...} ($direction); a malformed submission exits non-zero.
"""

import argparse
import json
import os
import sys

$imports

ID, TARGET = "id", $target_lit


$load_answers

def load_submission(path: str, n_rows: int) -> pd.Series:
    """Predictions in test order; exits with the reason when the file does not fit the test split."""
    try:
        submission = pd.read_csv(path)
    except (OSError, ValueError) as err:
        sys.exit(f"cannot read the submission {path}: {err}")
    if list(submission.columns) != [ID, TARGET]:
        sys.exit(f"submission columns must be {[ID, TARGET]}, got {list(submission.columns)}")
    if len(submission) != n_rows or sorted(submission[ID].tolist()) != list(range(n_rows)):
        sys.exit(f"the submission needs exactly one row per test row, with ids 0..{n_rows - 1}")
    predictions = submission.sort_values(ID)[TARGET].reset_index(drop=True)$coerce
    if predictions.isna().any():
        sys.exit("the submission has $missing predictions")
    return predictions


$scorer

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--submission_file", default="submission.csv")
    args = parser.parse_args()
    answers = load_answers()
    predictions = load_submission(args.submission_file, len(answers))
    # Rows whose label is missing in the source data cannot be scored.
    known = answers.notna().to_numpy()
    print(json.dumps({"$metric": score(answers[known], predictions[known])}))


if __name__ == "__main__":
    main()
''')


def import_block(*extra: str, datasets: bool = True) -> str:
    """Third-party imports of a scorer (pandas, with `datasets` datasets, and `extra`), sorted the way isort
    would."""
    lines = {"import pandas as pd", *(["from datasets import load_from_disk"] if datasets else []),
             *(line for block in extra for line in block.splitlines() if line)}
    return "\n".join(sorted(lines, key=lambda s: (s.startswith("from"), s)))


def csv_evaluate(spec: TaskSpec) -> str:
    scorer_import, scorer = SCORERS[spec.metric]
    numeric = spec.problem != "classification"
    return CSV_EVALUATE.substitute(
        task_id=spec.task_id, metric=spec.metric, direction=spec.direction, target_lit=lit(spec.target),
        imports=import_block(scorer_import, datasets=False),
        load_answers=LOAD_ANSWERS.substitute(target_lit=lit(spec.target), lazy_import=LAZY_DATASETS),
        coerce='\n    predictions = pd.to_numeric(predictions, errors="coerce")' if numeric else "",
        missing="missing or non-numeric" if numeric else "missing", scorer=scorer,
    )


def csv_runtime_bug(files: dict[str, str], spec: TaskSpec, baseline: str, rng: random.Random) -> dict[str, str]:
    """A submission the scorer rejects: a generic header or a near-miss file name. Static checks pass."""
    source = files[baseline]
    if rng.random() < 0.5:
        source = source.replace(f"np.arange(len(test)), {lit(spec.target)}: ", 'np.arange(len(test)), "prediction": ')
    else:
        source = source.replace('"submission.csv"', '"predictions.csv"')
    return {**files, baseline: source}


# A scorer as task authors often write it, for a share of the offline teacher's first drafts (bugs.py): it
# runs and scores the baseline right, but accepts degenerate submissions (the evaluator probes' quarry).
_STRICT_LOAD = re.compile(r"def load_submission\(path: str, n_rows: int\) -> pd\.Series:.*?    return predictions\n",
                          re.S)
_STRICT_MAIN = """    predictions = load_submission(args.submission_file, len(answers))
    # Rows whose label is missing in the source data cannot be scored.
    known = answers.notna().to_numpy()
    print(json.dumps({"%s": score(answers[known], predictions[known])}))
"""
_JOIN_LOAD = '''def load_submission(path: str, n_rows: int) -> pd.DataFrame:
    """The submission as a table of ids and predictions."""
    submission = pd.read_csv(path)%s%s
    return submission
'''
_JOIN_MAIN = """    submission = load_submission(args.submission_file, len(answers))
    truth = pd.DataFrame({ID: range(len(answers)), "answer": answers})
    merged = submission.merge(truth, on=ID).dropna()
    print(json.dumps({"%s": score(merged["answer"].reset_index(drop=True), merged[TARGET].reset_index(drop=True))}))
"""


def sloppy_csv_evaluate(source: str, spec: TaskSpec, rng: random.Random) -> str:
    """`source` (a `csv_evaluate` scorer) made sloppy: joined on the id with no check of duplicate, missing or
    unknown ids (a row count, at most), or invalid predictions dropped from the score instead of rejected."""
    main = _STRICT_MAIN % spec.metric
    assert main in source and _STRICT_LOAD.search(source), "not a csv_evaluate scorer"
    if rng.random() < 0.6:
        count = ('\n    if len(submission) != n_rows:\n        sys.exit(f"the submission needs {n_rows} rows, got '
                 '{len(submission)}")') if rng.random() < 0.5 else ""
        coerce = ('\n    submission[TARGET] = pd.to_numeric(submission[TARGET], errors="coerce")'
                  if spec.problem != "classification" else "")
        return _STRICT_LOAD.sub(lambda _: _JOIN_LOAD % (count, coerce), source).replace(main, _JOIN_MAIN % spec.metric)
    check = re.search(r"    if predictions\.isna\(\)\.any\(\):\n        sys\.exit\([^\n]*\)\n", source)
    assert check is not None
    dropped = source.replace(check.group(0), "")
    return dropped.replace("    known = answers.notna().to_numpy()\n",
                           "    known = (answers.notna() & predictions.notna()).to_numpy()\n")


def csv_submission_note(spec: TaskSpec) -> str:
    return (f"submission.csv with columns id, {spec.target}; one row per test row, where id is the row's "
            "0-based position in the test split")


DATA_NOTE = ("The data is in `data/` (Hugging Face `datasets` format, splits `train` and `test`); "
             "load it with `datasets.load_from_disk(\"data\")`.")


METRIC_LINES: dict[str, str] = {
    "accuracy": "Predictions are scored by accuracy, the share of test rows whose label is exactly right "
                "(higher is better).",
    "macro_f1": "Predictions are scored by macro-averaged F1, the mean of the per-class F1 scores (higher is better), "
                "so rare classes count as much as common ones.",
    "rmse": "Predictions are scored by root mean squared error, RMSE (lower is better).",
    "mae": "Predictions are scored by mean absolute error, MAE (lower is better).",
    "r2": "Predictions are scored by the coefficient of determination, r2 (higher is better; 0 means no better "
          "than always predicting the mean).",
}


def plan(family: str, problem: str, metrics: tuple[str, ...], proposal: dict[str, Any],
         rng: random.Random) -> TaskSpec | None:
    """The task's target, metric and id; None when the dataset has no column this problem can predict."""
    dataset = proposal["dataset"]
    target = pick_target(dataset, "classification" if problem == "classification" else "regression",
                         proposal["topic"], rng)
    if target is None:
        return None
    # A bare metric name ("accuracy") is taken; the pipeline's proposals say "mae (lower is better)", and for those
    # the writer picks one of the family's metrics itself (seeded), as it always has: `write_configs` then rewrites
    # the proposal's sentence to the metric picked (`carry_metric`), except in a drifting draft.
    wanted = normalize_metric(str(proposal.get("metric") or ""))
    cols = columns(dataset)
    time_column = ""
    if problem == "forecasting":
        time_column = next((c.name for c in cols if c.kind == "time"), "")
    return TaskSpec(
        family=family, task_id=make_id(words(proposal["topic"]), rng), problem=problem, target=target.name,
        metric=wanted if wanted in metrics else rng.choice(metrics), time_column=time_column,
        columns=tuple(cols), n_rows=n_rows(dataset),
    )


def csv_description(spec: TaskSpec, proposal: dict[str, Any], rng: random.Random, task_lines: tuple[str, ...],
                    closings: tuple[str, ...], facts: dict[str, str]) -> str:
    """The agent-facing description of a CSV-submission task, braces escaped for `str.format`."""
    workspace = rng.choice((
        "Your workspace contains `baseline.py`, which trains a simple model and writes a valid `submission.csv` "
        "(run `python baseline.py`), and `evaluate.py`, the read-only scorer "
        "(`python evaluate.py --submission_file submission.csv`).",
        "Start from `baseline.py` (`python baseline.py` writes a valid `submission.csv`); `evaluate.py` is the "
        "read-only scorer the task is graded with: `python evaluate.py --submission_file submission.csv`.",
    ))
    row, scores = json.dumps({"id": 0, spec.target: example_value(spec)}), json.dumps({spec.metric: 0.5})
    example = rng.choice((
        f"A valid first row of submission.csv, read as a dict, is {row}, and evaluate.py prints one JSON object "
        f"such as {scores}.",
        f"For example, `pd.read_csv(\"submission.csv\").iloc[0].to_dict()` could give {row}; the scorer's output "
        f"looks like {scores}.",
    ))
    body = [rng.choice(task_lines) + " " + METRIC_LINES[spec.metric], "{dataset_docs}", workspace + " " + DATA_NOTE]
    return description(proposal_text(proposal), body, facts, example, rng.choice(closings))


class CsvFamily:
    """The family protocol (`plan`, `file_names`, `describe`, `files`, `runtime_bug`) of a CSVSubmissionTasks
    family over one tabular problem: classification and regression differ only in these constants."""

    def __init__(self, name: str, problem: str, metrics: tuple[str, ...], files: tuple[str, str],
                 task_lines: tuple[str, ...], closings: tuple[str, ...]) -> None:
        self.name, self.problem, self.metrics, self.file_pair = name, problem, metrics, files
        self.task_lines, self.closings = task_lines, closings

    def plan(self, proposal: dict[str, Any], rng: random.Random) -> TaskSpec | None:
        return plan(self.name, self.problem, self.metrics, proposal, rng)  # the module's plan

    def file_names(self, spec: TaskSpec) -> tuple[str, str]:
        return self.file_pair

    def describe(self, spec: TaskSpec, proposal: dict[str, Any], rng: random.Random) -> str:
        facts = {"task": self.problem, "target column": spec.target, "metric": f"{spec.metric} ({spec.direction})",
                 "submission": csv_submission_note(spec)}
        lines = tuple(line.format(target=spec.target) for line in self.task_lines)
        return csv_description(spec, proposal, rng, lines, self.closings, facts)

    def files(self, spec: TaskSpec, rng: random.Random) -> dict[str, str]:
        return {self.file_pair[0]: csv_baseline(spec, rng), self.file_pair[1]: csv_evaluate(spec)}

    def runtime_bug(self, sources: dict[str, str], spec: TaskSpec, rng: random.Random) -> dict[str, str]:
        return csv_runtime_bug(sources, spec, self.file_pair[0], rng)

    def sloppy_evaluator(self, sources: dict[str, str], spec: TaskSpec, rng: random.Random) -> dict[str, str]:
        evaluation = self.file_pair[1]
        return {**sources, evaluation: sloppy_csv_evaluate(sources[evaluation], spec, rng)}
