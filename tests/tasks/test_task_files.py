"""Validation of a whole generated task and its MLGym layout."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_mlgym import mlgym_load

from gymforge.llm.codeblocks import parse_files
from gymforge.tasks.files import (
    TEACHER_ENTRYPOINTS,
    ConfigBundle,
    TaskValidationError,
    validate_code_files,
    validate_config_files,
    write_task_tree,
)

COLUMNS = {"species", "island", "bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g", "sex", "year"}

CONFIG_ANSWER = '''I chose a species classification task.

```yaml
# configs/tasks/penguinSpecies.yaml
id: penguinSpecies
name: Palmer Penguins Species Classification
description: |-
  Predict the species of a penguin from its measurements.
  {dataset_docs}
  The evaluation script prints one JSON object, e.g. {{"accuracy": 0.93}}.

  SUBMISSION FORMAT:
  Save the test predictions to `submission.csv` with one column, `species`.
dataset_configs:
  - datasets/penguins.yaml
task_entrypoint: CSVSubmissionTasks
training_timeout: 600
starter_code:
  - data/penguinSpecies/baseline.py
  - data/penguinSpecies/evaluate.py
baseline_paths:
  - baseline.py
evaluation_paths:
  - evaluate.py
evaluation_read_only: true
```

```yaml
# configs/datasets/penguins.yaml
name: penguins
description: |-
  344 penguins with columns species, island, bill_length_mm, bill_depth_mm, flipper_length_mm,
  body_mass_g, sex and year, saved with `datasets` (save_to_disk) in ./data with train and test splits.
data_path: data/penguinSpecies/data
is_local: true
```
'''

CODE_ANSWER = '''```python
# data/penguinSpecies/baseline.py
import pandas as pd
from datasets import load_from_disk
from sklearn.ensemble import RandomForestClassifier

FEATURES = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]


def main() -> None:
    ds = load_from_disk("data")
    train = ds["train"].to_pandas().dropna(subset=FEATURES)
    test = ds["test"].to_pandas()
    model = RandomForestClassifier(n_estimators=200, random_state=0)
    model.fit(train[FEATURES], train["species"])
    preds = model.predict(test[FEATURES].fillna(train[FEATURES].median()))
    pd.DataFrame({"species": preds}).to_csv("submission.csv", index=False)


if __name__ == "__main__":
    main()
```

```python
# data/penguinSpecies/evaluate.py
import argparse
import json

import pandas as pd
from datasets import load_from_disk


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--submission_file", default="submission.csv")
    args = parser.parse_args()
    truth = load_from_disk("data")["test"]["species"]
    sub = pd.read_csv(args.submission_file)
    accuracy = float((sub["species"].to_numpy() == pd.Series(truth).to_numpy()).mean())
    print(json.dumps({"accuracy": accuracy}))


if __name__ == "__main__":
    main()
```
'''


@pytest.fixture
def configs() -> dict[str, str]:
    return parse_files(CONFIG_ANSWER)


@pytest.fixture
def code() -> dict[str, str]:
    return parse_files(CODE_ANSWER)


@pytest.fixture
def bundle(configs: dict[str, str]) -> ConfigBundle:
    return validate_config_files(configs)


def errors_of(fn, *args) -> list[str]:  # type: ignore[no-untyped-def]
    with pytest.raises(TaskValidationError) as err:
        fn(*args)
    return err.value.errors


def test_valid_task_round_trips_through_mlgym_layout(bundle: ConfigBundle, code: dict[str, str], tmp_path: Path) -> None:
    assert bundle.task.id == "penguinSpecies"
    assert list(bundle.datasets) == ["configs/datasets/penguins.yaml"]
    assert validate_code_files(bundle, code, COLUMNS) == code
    write_task_tree(tmp_path, bundle, code)
    (tmp_path / "data/penguinSpecies/data").mkdir()  # the local dataset, materialized by another stage
    task, datasets, rendered = mlgym_load(tmp_path, "tasks/penguinSpecies.yaml")
    assert task.baseline_paths == ["baseline.py"] and datasets[0].name == "penguins"
    assert rendered == bundle.description()
    assert "PENGUINS:\n344 penguins" in rendered and '{"accuracy": 0.93}' in rendered
    assert (tmp_path / "data/penguinSpecies/evaluate.py").read_text() == code["data/penguinSpecies/evaluate.py"]


def test_missing_dataset_config_and_unlisted_one(configs: dict[str, str]) -> None:
    configs["configs/datasets/iris.yaml"] = "name: iris\ndescription: d\ndata_path: scikit-learn/iris\n"
    del configs["configs/datasets/penguins.yaml"]
    errors = errors_of(validate_config_files, configs)
    assert len(errors) == 2
    assert "dataset_configs lists 'datasets/penguins.yaml'" in errors[0] and "configs/datasets/penguins.yaml" in errors[0]
    assert errors[1].startswith("configs/datasets/iris.yaml: not listed")


def test_all_config_errors_reported_together(configs: dict[str, str]) -> None:
    task = configs["configs/tasks/penguinSpecies.yaml"]
    configs["configs/tasks/penguinSpecies.yaml"] = (
        task.replace("{{\"accuracy\": 0.93}}", '{"accuracy": 0.93}')
        .replace("  - baseline.py", "  - data/penguinSpecies/baseline.py")
    )
    configs["configs/datasets/penguins.yaml"] = configs["configs/datasets/penguins.yaml"].replace("name: penguins", "name: pengs")
    configs["README.md"] = "hi\n"
    errors = errors_of(validate_config_files, configs)
    text = "\n".join(errors)
    assert "README.md: unexpected file" in text
    assert "name 'pengs' must equal the file name stem 'penguins'" in text
    assert "'{\"accuracy\": 0.93}' is not a placeholder" in text
    assert "relative to the agent workspace" in text and "write 'baseline.py'" in text


def test_policy_errors(configs: dict[str, str]) -> None:
    task = configs["configs/tasks/penguinSpecies.yaml"]
    configs["configs/tasks/penguinSpecies.yaml"] = (
        task.replace("  - data/penguinSpecies/evaluate.py", "  - src/evaluate.py")
        .replace("evaluation_read_only: true", "baseline_scores:\n  - accuracy: 0.9")
    )
    errors = "\n".join(errors_of(validate_config_files, configs))
    assert "'src/evaluate.py' must be under data/penguinSpecies/" in errors
    assert "baseline_scores must be empty" in errors


@pytest.mark.parametrize("entrypoint", ["LMSubmissionTasks", "TorchrunTasks"])
def test_generated_task_entrypoint_is_one_the_teacher_may_use(configs: dict[str, str], entrypoint: str) -> None:
    """A draft claiming LMSubmissionTasks (whose scorer runs on the agent's whole workspace beside the answers) or an
    entrypoint MLGym has no class for is refused with the allowed ones named; one of those passes unchanged."""
    path = "configs/tasks/penguinSpecies.yaml"
    configs[path] = configs[path].replace("task_entrypoint: CSVSubmissionTasks", f"task_entrypoint: {entrypoint}")
    errors = errors_of(validate_config_files, configs)
    [rule] = [e for e in errors if "a generated task's task_entrypoint must be one of" in e]
    assert rule.startswith(path) and all(allowed in rule for allowed in TEACHER_ENTRYPOINTS)
    assert "LMSubmissionTasks" not in TEACHER_ENTRYPOINTS and (entrypoint != "LMSubmissionTasks" or
                                                               "not 'LMSubmissionTasks'" in rule)
    configs[path] = configs[path].replace(f"task_entrypoint: {entrypoint}", "task_entrypoint: PythonSubmissionTasks")
    assert validate_config_files(configs).task.task_entrypoint == "PythonSubmissionTasks"


def test_exactly_one_task_config(configs: dict[str, str]) -> None:
    configs["configs/tasks/other.yaml"] = "id: other\nname: o\ndescription: d\n"
    assert "expected exactly one task config" in errors_of(validate_config_files, configs)[0]


def test_missing_starter_file_and_stray_files(bundle: ConfigBundle, code: dict[str, str]) -> None:
    del code["data/penguinSpecies/evaluate.py"]
    code["data/penguinSpecies/utils.py"] = "X = 1\n"
    code["baseline.py"] = "print(1)\n"
    errors = errors_of(validate_code_files, bundle, code, None)
    assert any(e.startswith("data/penguinSpecies/evaluate.py: listed in starter_code") for e in errors)
    assert any(e.startswith("data/penguinSpecies/utils.py: not referenced by starter_code") for e in errors)
    assert any(e.startswith("baseline.py: outside data/penguinSpecies/") for e in errors)


def test_python_and_column_errors(bundle: ConfigBundle, code: dict[str, str]) -> None:
    path = "data/penguinSpecies/baseline.py"
    code[path] = code[path].replace("import pandas as pd\n", "").replace('train["species"]', 'train["species_name"]')
    assert errors_of(validate_code_files, bundle, code, COLUMNS) == [f"{path}:14: undefined name 'pd' (missing `import pandas as pd`?)"]
    code[path] = "import pandas as pd\n" + code[path]
    [error] = errors_of(validate_code_files, bundle, code, COLUMNS)
    assert error.startswith(f"{path}:13: column 'species_name' is not in the dataset")
    assert validate_code_files(bundle, {**code, path: code[path].replace("species_name", "species")}, None)


def test_requirements(configs: dict[str, str], code: dict[str, str]) -> None:
    generic = validate_config_files(configs)
    errors = errors_of(validate_code_files, generic, {**code, "data/penguinSpecies/requirements.txt": "lightgbm\n"}, None)
    assert "do not write requirements.txt" in errors[0]

    task = configs["configs/tasks/penguinSpecies.yaml"]
    configs["configs/tasks/penguinSpecies.yaml"] = task + "use_generic_conda: false\nrequirements_path: data/penguinSpecies/requirements.txt\n"
    custom = validate_config_files(configs)
    assert "was not written" in errors_of(validate_code_files, custom, code, None)[0]
    reqs = "# extra packages\nlightgbm>=4.0\nxgboost[scikit-learn]==2.0.3, !=2.0.1 ; python_version >= '3.9'\n--index-url http://x\nbad package name\n"
    errors = errors_of(validate_code_files, custom, {**code, "data/penguinSpecies/requirements.txt": reqs}, None)
    assert [e.split(":")[1] for e in errors] == ["4", "5"]


def test_a_python_tasks_evaluation_script_must_import_gymforge_eval(configs: dict[str, str], code: dict[str, str]) -> None:
    """Asked for at the draft, before an install: verification would refuse the task anyway, since its scorer would run
    the agent's module beside the answers. A CSV task's scorer runs no agent code and is not asked."""
    path = "configs/tasks/penguinSpecies.yaml"
    assert validate_code_files(validate_config_files(configs), code, COLUMNS) == code  # CSV
    configs[path] = configs[path].replace("task_entrypoint: CSVSubmissionTasks", "task_entrypoint: PythonSubmissionTasks")
    python = validate_config_files(configs)
    evaluation = "data/penguinSpecies/evaluate.py"
    assert "gymforge_eval" not in code[evaluation]
    [error] = errors_of(validate_code_files, python, code, COLUMNS)
    assert error.startswith(f"{evaluation}: the evaluation script must reach the submission through gymforge_eval")
    commented = {**code, evaluation: "# reached through gymforge_eval\n" + code[evaluation]}
    assert errors_of(validate_code_files, python, commented, COLUMNS) == [error]
    channel = {**code, evaluation: "try:\n    import gymforge_eval  # noqa: F401\nexcept ImportError:\n    pass\n"
               + code[evaluation]}
    assert validate_code_files(python, channel, COLUMNS) == channel
