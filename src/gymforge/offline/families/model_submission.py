"""Model submission (ModelSubmissionTasks): the agent trains a model, pickles it and points one YAML config at it.

MLGym hands the evaluation the first `*.yaml` it finds in the workspace, so the starter code holds no YAML;
the baseline writes `model_config.yaml` itself.
"""

from __future__ import annotations

import json
import random
from string import Template
from typing import Any

from gymforge.offline.families import tabular
from gymforge.offline.families.common import TaskSpec, description, proposal_text
from gymforge.offline.families.tabular import lit

NAME = "model_submission"
ENTRYPOINT = "ModelSubmissionTasks"
METRICS = {"classification": ("accuracy", "macro_f1"), "regression": ("rmse", "mae", "r2")}
FILES = ("baseline.py", "evaluate.py")
CONFIG = "model_config.yaml"

CLOSINGS = (
    "Improve on the baseline model: use more of the columns, try other model families and tune them with "
    "cross-validation on the train split; any object with a predict() method that survives pickling works.",
    "Keep the whole preprocessing inside the pickled model (a scikit-learn Pipeline is the easy way), since "
    "evaluate.py feeds it the raw test columns.",
)

BASELINE = Template('''\
"""Baseline for $task_id: fits $label on $n_used of the $n_all usable columns and saves it.

Writes model.pkl (a fitted scikit-learn pipeline that takes the raw test columns as a DataFrame) and
$config, the one YAML file evaluate.py reads.
"""

import pickle

import numpy as np
from datasets import load_from_disk
$preprocess_imports
$model_import

SEED = $seed
MODEL_PATH = "model.pkl"
CONFIG_PATH = "$config"


$build_model

def main() -> None:
    # Estimators without a random_state draw from numpy's global generator.
    np.random.seed(SEED)
    train = load_from_disk("data")["train"].to_pandas()
    train = train[train[$target_lit].notna()]
    model = build_model().fit(train[$features], train[$target_lit])
    with open(MODEL_PATH, "wb") as fh:
        pickle.dump(model, fh)
    with open(CONFIG_PATH, "w") as fh:
        fh.write(f"model_path: {MODEL_PATH}\\n")
    print(f"saved {MODEL_PATH} and {CONFIG_PATH}")


if __name__ == "__main__":
    main()
''')

EVALUATE = Template('''\
"""Scores the model a YAML config points at on the held-out test split of $task_id.

Usage: python evaluate.py --config_fname $config
The config sets `model_path`: a pickled object whose predict() takes a pandas DataFrame of the test
split's columns (the target removed). Prints one JSON line, {"$metric": ...} ($direction).
"""

import argparse
import json
import os
import pickle
import sys
from pathlib import Path

try:  # gymforge unpickles and runs the model in a sandbox of its own, reached through gymforge_eval
    from gymforge_eval import SubmissionError, load_pickle
except ImportError:  # under MLGym it is unpickled into this process
    class SubmissionError(Exception):
        pass

    def load_pickle(path):
        with open(path, "rb") as fh:
            return pickle.load(fh)

$imports

TARGET = $target_lit


$load_answers

def load_features() -> pd.DataFrame:
    # errors="ignore": the target column may already have been moved out of the test split.
    return load_from_disk("data")["test"].to_pandas().drop(columns=[TARGET], errors="ignore")


def read_config(path: str) -> dict[str, str]:
    """Top-level `key: value` pairs: all this config needs, without a YAML dependency."""
    config = {}
    for line in Path(path).read_text().splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and not key.startswith((" ", "#")):
            config[key.strip()] = value.split(" #")[0].strip().strip("\\"'")
    return config


def load_model(config_path: str):
    try:
        config = read_config(config_path)
    except OSError as err:
        sys.exit(f"cannot read the config {config_path}: {err}")
    if "model_path" not in config:
        sys.exit(f"{config_path} must set model_path, the pickled model to evaluate")
    path = Path(config_path).parent / config["model_path"]
    try:
        return load_pickle(path)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ModuleNotFoundError, SubmissionError) as err:
        sys.exit(f"cannot load the model {path}: {err}")


$scorer

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config_fname", required=True)
    args = parser.parse_args()
    model = load_model(args.config_fname)
    answers = load_answers()
    predictions = pd.Series(np.asarray(model.predict(load_features())).ravel())
    if len(predictions) != len(answers):
        sys.exit(f"the model returned {len(predictions)} predictions for {len(answers)} test rows")
    if predictions.isna().any():
        sys.exit("the model returned missing predictions")
    # Rows whose label is missing in the source data cannot be scored.
    known = answers.notna().to_numpy()
    print(json.dumps({"$metric": score(answers[known], predictions[known])}))


if __name__ == "__main__":
    main()
''')


def plan(proposal: dict[str, Any], rng: random.Random) -> TaskSpec | None:
    problem = tabular.problem_of(proposal["dataset"], str(proposal["topic"]))
    problem = "classification" if problem == "classification" else "regression"
    return tabular.plan(NAME, problem, METRICS[problem], proposal, rng)


def file_names(spec: TaskSpec) -> tuple[str, str]:
    return FILES


def describe(spec: TaskSpec, proposal: dict[str, Any], rng: random.Random) -> str:
    verb = "classifier" if spec.problem == "classification" else "regressor"
    facts = {
        "task": spec.problem, "target column": spec.target, "metric": f"{spec.metric} ({spec.direction})",
        "submission": f"{CONFIG} in the workspace with model_path pointing at a pickled model whose predict() "
                      "takes a DataFrame of the test columns",
    }
    body = [
        rng.choice((
            f"Train a {verb} for `{spec.target}` on the `train` split and submit the trained model itself: "
            f"evaluation loads it and predicts the held-out `test` split.",
            f"Submit a trained model, not predictions: a {verb} for `{spec.target}` that evaluate.py loads and "
            "runs on the held-out `test` split.",
        )) + " " + tabular.METRIC_LINES[spec.metric],
        "{dataset_docs}",
        f"`baseline.py` fits a simple pipeline, pickles it to `model.pkl` and writes `{CONFIG}` "
        f"(`model_path: model.pkl`). The read-only `evaluate.py` scores it: "
        f"`python evaluate.py --config_fname {CONFIG}`. Keep exactly one YAML file in the workspace, because the "
        f"first `*.yaml` found there is the one evaluated. " + tabular.DATA_NOTE,
    ]
    example = f"evaluate.py prints one JSON line such as {json.dumps({spec.metric: 0.5})}."
    return description(proposal_text(proposal), body, facts, example, rng.choice(CLOSINGS))


def files(spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    label, model_import, model = tabular.choose_model(spec.problem, spec.n_rows, rng)
    features = tabular.feature_subset(spec, rng)
    scorer_import, scorer = tabular.SCORERS[spec.metric]
    baseline = BASELINE.substitute(
        task_id=spec.task_id, label=label, n_used=len(features), n_all=len(spec.features()), config=CONFIG,
        preprocess_imports=tabular.PREPROCESS_IMPORTS, model_import=model_import, seed=rng.randrange(10_000),
        build_model=tabular.BUILD_MODEL.substitute(model=model), target_lit=lit(spec.target),
        features=lit(features))
    evaluate = EVALUATE.substitute(
        task_id=spec.task_id, config=CONFIG, metric=spec.metric, direction=spec.direction,
        imports=tabular.import_block("import numpy as np", scorer_import), target_lit=lit(spec.target),
        load_answers=tabular.LOAD_ANSWERS.substitute(target_lit=lit(spec.target), lazy_import=""),
        scorer=scorer)
    return {FILES[0]: baseline, FILES[1]: evaluate}


def runtime_bug(sources: dict[str, str], spec: TaskSpec, rng: random.Random) -> dict[str, str]:
    """The config names the model under the wrong key; only evaluation notices."""
    key = rng.choice(("model_file", "checkpoint", "path"))
    return {**sources, FILES[0]: sources[FILES[0]].replace('"model_path: {MODEL_PATH}', f'"{key}: {{MODEL_PATH}}')}
