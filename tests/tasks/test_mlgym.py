"""MLGym config models: defaults, validation messages and compatibility with MLGym's loader."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gymforge.tasks.mlgym import (
    BENCHMARK_TASKS,
    DatasetConfig,
    MLGymConfigError,
    TaskConfig,
    dataset_docs,
    description_errors,
    dump_yaml,
    load_dataset_config,
    load_task_config,
    parse_config,
    render_description,
    workspace_layout,
)


# --- A stand-in for MLGym's loader (mlgym/configs/task.py, dataset.py, environment/tasks.py at 9d40c1b) ---
@dataclass(frozen=True)
class _MLGymSplit:
    name: str
    file_regex: str


@dataclass(frozen=True)
class _MLGymDataset:
    name: str
    description: str
    data_path: str
    is_local: bool = False
    train_split: _MLGymSplit | None = None
    valid_split: _MLGymSplit | None = None
    test_split: _MLGymSplit | None = None


@dataclass
class _MLGymTask:
    id: str
    name: str
    description: str
    dataset_configs: list[str] = field(default_factory=list)
    task_entrypoint: str = "CSVSubmissionTasks"
    training_timeout: int | None = None
    requirements_path: str | None = None
    benchmark_name: str | None = None
    use_generic_conda: bool = True
    starter_code: list[str] = field(default_factory=list)
    baseline_paths: list[str] = field(default_factory=list)
    baseline_scores: list[dict[str, float]] = field(default_factory=list)
    sample_submission: str | None = None
    evaluation_paths: list[str] = field(default_factory=list)
    evaluation_read_only: bool = False
    secret_files: list[str] = field(default_factory=list)
    memory_path: str | None = None


def mlgym_load(root: Path, task_config: str) -> tuple[_MLGymTask, list[_MLGymDataset], str]:
    """Load `configs/<task_config>` as MLGym does (cwd = root); return the task, datasets and rendered description."""
    task = _MLGymTask(**yaml.safe_load((root / "configs" / task_config).read_text()))
    datasets = []
    for rel in task.dataset_configs:
        path = root / "configs" / rel  # MLGym: CONFIG_DIR / path
        assert path.exists(), f"Dataset config file not found at {path}"
        raw = yaml.safe_load(path.read_text())
        for split in ("train_split", "valid_split", "test_split"):
            if raw.get(split):
                raw[split] = _MLGymSplit(**raw[split])
        datasets.append(_MLGymDataset(**raw))
    if task.sample_submission is not None:
        assert (root / task.sample_submission).exists()
    if not task.use_generic_conda:
        assert task.requirements_path is not None and (root / task.requirements_path).exists()
    for entry in task.starter_code:  # copied into the workspace at reset
        assert (root / entry).exists(), entry
    for d in datasets:
        if d.is_local:
            assert (root / d.data_path).exists(), d.data_path
    docs = "".join(f"{d.name.upper()}:\n{d.description}\n\n" for d in datasets)
    return task, datasets, task.description.format(dataset_docs=docs)


DESCRIPTION = """Predict the species of a penguin from its measurements.
{dataset_docs}
The evaluation script prints one JSON object, e.g. {{"accuracy": 0.93}}.

SUBMISSION FORMAT:
Save the test predictions to `submission.csv` with one column, `species`."""


def penguin_task(**extra: Any) -> TaskConfig:
    return TaskConfig(
        id="penguinSpecies",
        name="Palmer Penguins Species Classification",
        description=DESCRIPTION,
        dataset_configs=["datasets/penguins.yaml"],
        training_timeout=600,
        starter_code=["data/penguinSpecies/baseline.py", "data/penguinSpecies/evaluate.py"],
        baseline_paths=["baseline.py"],
        evaluation_paths=["evaluate.py"],
        evaluation_read_only=True,
        **extra,
    )


def penguin_dataset() -> DatasetConfig:
    return DatasetConfig(
        name="penguins",
        description="344 penguins, columns species, island, bill_length_mm, ... Saved with save_to_disk in ./data.",
        data_path="data/penguinSpecies/data",
        is_local=True,
        train_split={"name": "train", "file_regex": "train*"},
    )


def test_fields_and_defaults_match_mlgym() -> None:
    ours = TaskConfig(id="t", name="n", description="d")
    theirs = _MLGymTask(id="t", name="n", description="d")
    assert list(TaskConfig.model_fields) == [f.name for f in dataclasses.fields(_MLGymTask)]
    assert ours.model_dump() == dataclasses.asdict(theirs)
    assert ours.effective_training_timeout == 3600
    assert list(DatasetConfig.model_fields) == [f.name for f in dataclasses.fields(_MLGymDataset)]


def test_dumped_configs_load_in_mlgym_and_render_identically(tmp_path: Path) -> None:
    task, dataset = penguin_task(), penguin_dataset()
    (tmp_path / "configs/tasks").mkdir(parents=True)
    (tmp_path / "configs/datasets").mkdir(parents=True)
    (tmp_path / "configs/tasks/penguinSpecies.yaml").write_text(dump_yaml(task))
    (tmp_path / "configs/datasets/penguins.yaml").write_text(dump_yaml(dataset))
    (tmp_path / "data/penguinSpecies/data").mkdir(parents=True)
    for entry in task.starter_code:
        (tmp_path / entry).write_text("print('ok')\n")

    theirs, datasets, rendered = mlgym_load(tmp_path, "tasks/penguinSpecies.yaml")
    assert dataclasses.asdict(theirs) == task.model_dump()
    assert datasets[0].train_split == _MLGymSplit("train", "train*")
    assert rendered == render_description(task, [dataset])
    assert rendered.startswith("Predict the species of a penguin from its measurements.\nPENGUINS:\n344 penguins")
    assert '{"accuracy": 0.93}' in rendered
    # and our own loaders read the same files back unchanged
    assert load_task_config(tmp_path / "configs/tasks/penguinSpecies.yaml") == task
    assert load_dataset_config(tmp_path / "configs/datasets/penguins.yaml") == dataset


def test_dump_keeps_only_set_fields_in_model_order() -> None:
    minimal = TaskConfig(id="t", name="n", description="line one\nline two")
    text = dump_yaml(minimal)
    assert list(yaml.safe_load(text)) == ["id", "name", "description"]
    assert "description: |-\n  line one\n  line two" in text
    scored = penguin_task().model_copy(update={"baseline_scores": [{"accuracy": 0.9}]})
    loaded = yaml.safe_load(dump_yaml(scored))
    assert loaded["baseline_scores"] == [{"accuracy": 0.9}]
    assert list(loaded) == [k for k in TaskConfig.model_fields if k in loaded]


def test_unescaped_brace_reported_with_position() -> None:
    errors = description_errors('Intro {dataset_docs}\nPrint {"accuracy": 0.9} to stdout.')
    assert len(errors) == 1
    assert "line 2, column 7" in errors[0]
    assert '{{"accuracy": 0.9}}' in errors[0]
    with pytest.raises(ValueError, match="line 1, column 7"):
        TaskConfig(id="t", name="n", description='Print {"accuracy": 0.9}.')


def test_lone_and_unmatched_braces_reported() -> None:
    errors = description_errors("a } b\nc { d")
    assert [e.split(":")[0] for e in errors] == ["description line 1, column 3 ('a } b')", "description line 2, column 3 ('c { d')"]
    assert "single '}'" in errors[0] and "unmatched '{'" in errors[1]


def test_doubled_braces_accepted_and_rendered_single() -> None:
    task = TaskConfig(id="t", name="n", description='Print {{"accuracy": 0.9}}.')
    assert render_description(task, []) == 'Print {"accuracy": 0.9}.'


def test_placeholder_required_only_with_datasets() -> None:
    # MLGym formats the description even without datasets: {dataset_docs} becomes "".
    assert render_description(TaskConfig(id="t", name="n", description="Play {dataset_docs}blotto."), []) == "Play blotto."
    TaskConfig(id="t", name="n", description="No data needed.")
    with pytest.raises(ValueError, match="must contain the placeholder"):
        TaskConfig(id="t", name="n", description="No docs.", dataset_configs=["datasets/x.yaml"])


def test_dataset_docs_format() -> None:
    a = DatasetConfig(name="iris", description="Flowers.", data_path="scikit-learn/iris")
    b = DatasetConfig(name="wine_quality", description="Wines.", data_path="x/wine")
    assert dataset_docs([a, b]) == "IRIS:\nFlowers.\n\nWINE_QUALITY:\nWines.\n\n"


def test_requirements_path_needed_without_generic_conda() -> None:
    with pytest.raises(ValueError, match="requirements_path is required"):
        TaskConfig(id="t", name="n", description="d", use_generic_conda=False)
    TaskConfig(id="t", name="n", description="d", use_generic_conda=False, requirements_path="data/t/requirements.txt")


@pytest.mark.parametrize("good", ["penguinSpecies", "penguin_species", "3SATTime", "rlMountainCarContinuous"])
def test_ids_accepted(good: str) -> None:
    TaskConfig(id=good, name="n", description="d")


@pytest.mark.parametrize("bad", ["penguin-species", "penguin species", "_x", "x__y", "täsk"])
def test_ids_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="snake_case or camelCase"):
        TaskConfig(id=bad, name="n", description="d")


def test_unsafe_and_misrooted_paths_rejected() -> None:
    with pytest.raises(ValueError, match="write 'datasets/x.yaml'"):
        TaskConfig(id="t", name="n", description="{dataset_docs}", dataset_configs=["configs/datasets/x.yaml"])
    with pytest.raises(ValueError, match="contains '..'"):
        TaskConfig(id="t", name="n", description="d", starter_code=["data/t/../../etc/passwd"])
    with pytest.raises(ValueError, match="absolute"):
        TaskConfig(id="t", name="n", description="d", baseline_paths=["/tmp/baseline.py"])


def test_id_must_equal_file_stem_in_generated_configs(tmp_path: Path) -> None:
    text = dump_yaml(TaskConfig(id="penguinSpecies", name="n", description="d"))
    _, errors = parse_config(TaskConfig, text, "configs/tasks/penguins.yaml", "penguins")
    assert errors == [("configs/tasks/penguins.yaml: id 'penguinSpecies' must equal the file name stem 'penguins' "
                       "(set id: penguins or name the file penguinSpecies.yaml)")]
    _, errors = parse_config(DatasetConfig, "name: flowers\ndescription: d\ndata_path: scikit-learn/iris\n",
                             "iris.yaml", "iris")
    assert errors and "name 'flowers' must equal the file name stem 'iris'" in errors[0]


def test_existing_configs_load_as_leniently_as_mlgym(tmp_path: Path) -> None:
    # MLGym's own titanic.yaml: id differs from the file stem, dataset_configs but no {dataset_docs}.
    path = tmp_path / "titanic.yaml"
    path.write_text("id: titanicSurvival\nname: Titanic\ndescription: Predict survival.\n"
                    "dataset_configs:\n- datasets/titanic.yaml\n")
    task = load_task_config(path)
    assert task.id == "titanicSurvival"
    assert render_description(task, [DatasetConfig(name="t", description="x", data_path="a/b")]) == "Predict survival."
    _, errors = parse_config(TaskConfig, path.read_text(), "titanic.yaml", "titanic")
    assert any("must contain the placeholder" in e for e in errors)
    ds = tmp_path / "iris.yaml"
    ds.write_text("name: flowers\ndescription: d\ndata_path: scikit-learn/iris\n")
    assert load_dataset_config(ds).name == "flowers"


def test_load_reports_yaml_and_field_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("id: t\nname: n\ndescription: [unclosed\n")
    with pytest.raises(MLGymConfigError, match=r"invalid YAML at line \d+"):
        load_task_config(path)
    path.write_text("id: t\nname: n\ndescription: d\nbaseline_path: [a.py]\ntask_entrypoint: Foo\n")
    with pytest.raises(MLGymConfigError) as err:
        load_task_config(path)
    assert any("unknown field 'baseline_path'" in e for e in err.value.errors)
    assert any("field 'task_entrypoint'" in e and "CSVSubmissionTasks" in e for e in err.value.errors)


def test_workspace_layout_follows_mlgym_copy_rules() -> None:
    layout = workspace_layout(penguin_task(), [penguin_dataset()])
    assert layout == {
        "data": "data/penguinSpecies/data",
        "baseline.py": "data/penguinSpecies/baseline.py",
        "evaluate.py": "data/penguinSpecies/evaluate.py",
    }


def test_benchmark_tasks() -> None:
    assert len(BENCHMARK_TASKS) == 13
    assert BENCHMARK_TASKS["languageModelingFineWeb"] == ("val_loss", False)
    assert BENCHMARK_TASKS["3SATTime"].higher_is_better is False
    assert sum(not m.higher_is_better for m in BENCHMARK_TASKS.values()) == 2
    for task_id in BENCHMARK_TASKS:
        TaskConfig(id=task_id, name="n", description="d")


def test_mlgym_dataset_names_are_free_text_when_read(tmp_path: Path) -> None:
    # MLGym's own 3SAT.yaml and fashionMnistHF.yaml: names with spaces, shown only as {dataset_docs} headings.
    path = tmp_path / "3SAT.yaml"
    path.write_text("name: 3 SAT Problem Dataset\ndescription: Random formulas.\ndata_path: data/3SATTime/data\n"
                    "is_local: true\n")
    dataset = load_dataset_config(path)
    assert dataset_docs([dataset]).startswith("3 SAT PROBLEM DATASET:\nRandom formulas.")
    _, errors = parse_config(DatasetConfig, path.read_text(), "3SAT.yaml", None)  # what we generate: strict
    assert errors and "not a valid identifier" in errors[0]


@pytest.mark.parametrize(("task_id", "needle"), [
    ("a" * 300, "is 300 characters long (at most 64)"),
    ("b" * 65, "is 65 characters long"),
    ("penguin species", "may only use ASCII letters, digits, '_' and '-'"),
    ("../escape", "may only use"),
    ("", "is empty"),
])
def test_odd_task_ids_fail_at_load_even_leniently(tmp_path: Path, task_id: str, needle: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(f"id: '{task_id}'\nname: n\ndescription: d\n")
    with pytest.raises(MLGymConfigError, match=re.escape(needle)) as err:
        load_task_config(path)
    assert "a" * 41 not in str(err.value)  # a long id is shortened in the message
    with pytest.raises(ValueError) as err:  # what we generate: the stricter identifier rule
        TaskConfig(id=task_id, name="n", description="d")
    assert "a" * 41 not in str(err.value)
    assert ("characters long (at most 64)" if len(task_id) > 64 else "snake_case or camelCase") in str(err.value)


def test_hyphenated_ids_load_from_existing_trees_but_are_not_generated(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("id: rl-maze_v2\nname: n\ndescription: d\n")
    assert load_task_config(path).id == "rl-maze_v2"
    _, errors = parse_config(TaskConfig, path.read_text(), "rl-maze_v2.yaml", "rl-maze_v2")
    assert errors and "snake_case or camelCase" in errors[0]
    assert TaskConfig(id="x" * 64, name="n", description="d").id == "x" * 64
