"""MLGym's task and dataset config formats as Pydantic models (docs/verification.md: how MLGym's configs are read).

Semantics follow facebookresearch/MLGym (`mlgym/configs/task.py`, `mlgym/environment/tasks.py`,
`mlgym/environment/env.py`):
- `dataset_configs` entries are resolved relative to MLGym's `configs/` directory
  (`datasets/<name>.yaml`); `starter_code`, `requirements_path`, `sample_submission` and a local
  `data_path` are resolved relative to the MLGym root (`data/<task id>/...`).
- Every `starter_code` entry is copied into the agent workspace under its base name; the first local
  dataset directory becomes `workspace/data` (read-only). `baseline_paths` and `evaluation_paths` are
  workspace-relative, and only the first of each is used.
- At setup the description is rendered with `description.format(dataset_docs=...)`, with or without
  datasets, so every literal brace must be doubled.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal, NamedTuple, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gymforge.core.ids import ID_MAX_LENGTH, check_task_id, short_repr

Entrypoint = Literal["CSVSubmissionTasks", "ModelSubmissionTasks", "LMSubmissionTasks", "PythonSubmissionTasks"]
DEFAULT_TRAINING_TIMEOUT = 3600  # MLGym's MLGYM_AGENT_LONG_TIMEOUT default, used when training_timeout is unset
PLACEHOLDER = "{dataset_docs}"
ID_PATTERN = r"^[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*$"  # snake_case or camelCase; MLGym has ids like 3SATTime


class PriorityMetric(NamedTuple):
    metric: str
    higher_is_better: bool


# MLGym-Bench's 13 tasks and the metric, with its direction, by which MLGym's AUP ranks their scores.
BENCHMARK_TASKS: dict[str, PriorityMetric] = {
    "regressionKaggleHousePrice": PriorityMetric("r2", True),
    "3SATTime": PriorityMetric("Time", False),
    "imageClassificationCifar10": PriorityMetric("accuracy", True),
    "imageClassificationFMnist": PriorityMetric("accuracy", True),
    "imageCaptioningCOCO": PriorityMetric("BLEU Score", True),
    "languageModelingFineWeb": PriorityMetric("val_loss", False),
    "naturalLanguageInferenceMNLI": PriorityMetric("validation_accuracy", True),
    "battleOfSexes": PriorityMetric("Score", True),
    "prisonersDilemma": PriorityMetric("Score", True),
    "blotto": PriorityMetric("Score", True),
    "rlBreakoutMinAtar": PriorityMetric("Reward Mean", True),
    "rlMetaMazeMisc": PriorityMetric("Reward Mean", True),
    "rlMountainCarContinuous": PriorityMetric("Reward Mean", True),
}


class MLGymConfigError(ValueError):
    """One or more problems with MLGym config files, each message self-contained."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


def safe_relpath(value: str) -> str:
    """A normalised relative POSIX path; raises ValueError for absolute paths and `..`."""
    if not value.strip():
        raise ValueError("path is empty")
    if "\\" in value:
        raise ValueError(f"path {value!r} uses backslashes; use '/'")
    path = PurePosixPath(value)
    if path.is_absolute() or re.match(r"^[A-Za-z]:", value):
        raise ValueError(f"path {value!r} is absolute; it must be relative")
    if ".." in path.parts:
        raise ValueError(f"path {value!r} contains '..'")
    return str(path)


def description_errors(description: str) -> list[str]:
    """Why `description.format(dataset_docs=...)` would fail or mangle text, one message per brace."""
    errors = []
    lines = description.split("\n")

    def where(pos: int) -> str:
        line = description.count("\n", 0, pos)
        col = pos - (description.rfind("\n", 0, pos) + 1)
        return f"description line {line + 1}, column {col + 1} ({lines[line].strip()!r})"

    i, n = 0, len(description)
    while i < n:
        c = description[i]
        if description.startswith(("{{", "}}"), i):
            i += 2
        elif c == "{":
            end = description.find("}", i)
            inner_open = description.find("{", i + 1)
            if end == -1 or (inner_open != -1 and inner_open < end):
                errors.append(f"{where(i)}: unmatched '{{'; write '{{{{' for a literal brace")
                i += 1
                continue
            field = description[i : end + 1]
            if field != PLACEHOLDER:
                errors.append(
                    f"{where(i)}: {field!r} is not a placeholder; MLGym fills the description with "
                    f"str.format(dataset_docs=...), so {PLACEHOLDER} is the only allowed placeholder "
                    f"and literal braces must be doubled: write {'{' + field + '}'!r}"
                )
            i = end + 1
        elif c == "}":
            errors.append(f"{where(i)}: single '}}'; write '}}}}' for a literal brace")
            i += 1
        else:
            i += 1
    return errors


def _identifier(value: str) -> str:
    """What generated ids and dataset names must meet: snake_case or camelCase, at most 64 characters."""
    if len(value) > ID_MAX_LENGTH:
        raise ValueError(f"{short_repr(value)} is {len(value)} characters long (at most {ID_MAX_LENGTH}); ids name files")
    if not re.fullmatch(ID_PATTERN, value):
        raise ValueError(
            f"{short_repr(value)} is not a valid identifier: use snake_case or camelCase "
            "(ASCII letters and digits, words joined by single underscores, at most "
            f"{ID_MAX_LENGTH} characters), e.g. penguinSpecies or penguin_species"
        )
    return value


def _lenient(info: ValidationInfo) -> bool:
    """True when an existing config is read as MLGym reads it (see `parse_config`)."""
    return bool((info.context or {}).get("mlgym_lenient"))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Split(_Model):
    name: str
    file_regex: str


class DatasetConfig(_Model):
    """`configs/datasets/<name>.yaml`; MLGym's `DatasetConfig` (frozen dataclass)."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1, description="Upper-cased as the heading of this dataset in {dataset_docs}.",
                      json_schema_extra={"pattern": ID_PATTERN, "maxLength": ID_MAX_LENGTH})
    description: str = Field(min_length=1)
    data_path: str = Field(min_length=1, description="Hugging Face id, or a path relative to the MLGym root when is_local.")
    is_local: bool = False
    train_split: Split | None = None
    valid_split: Split | None = None
    test_split: Split | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str, info: ValidationInfo) -> str:
        # MLGym's own names are free text ("3 SAT Problem Dataset", "Fashion MNIST"); only the heading uses them.
        return value if _lenient(info) else _identifier(value)

    @model_validator(mode="after")
    def _local_path(self) -> DatasetConfig:
        if self.is_local:
            try:
                safe_relpath(self.data_path)
            except ValueError as err:
                raise ValueError(f"data_path: {err} (a local dataset lives under the MLGym root)") from None
        elif any(ch.isspace() for ch in self.data_path):
            raise ValueError(f"data_path {self.data_path!r} is not a Hugging Face dataset id (it contains whitespace)")
        return self


class TaskConfig(_Model):
    """`configs/tasks/<id>.yaml`; MLGym's `TaskConfig`, same field order and defaults."""

    id: str = Field(json_schema_extra={"pattern": ID_PATTERN, "maxLength": ID_MAX_LENGTH})
    name: str = Field(min_length=1)
    description: str = Field(min_length=1)
    dataset_configs: list[str] = Field(default_factory=list, description="Paths relative to configs/, e.g. datasets/x.yaml.")
    task_entrypoint: Entrypoint = "CSVSubmissionTasks"
    training_timeout: int | None = Field(None, gt=0, description=f"Seconds; MLGym uses {DEFAULT_TRAINING_TIMEOUT} when unset.")
    requirements_path: str | None = None
    benchmark_name: str | None = None
    use_generic_conda: bool = True
    starter_code: list[str] = Field(default_factory=list, description="Paths relative to the MLGym root.")
    baseline_paths: list[str] = Field(default_factory=list, description="Workspace-relative; only the first is run.")
    baseline_scores: list[dict[str, float]] = Field(default_factory=list)
    sample_submission: str | None = None
    evaluation_paths: list[str] = Field(default_factory=list, description="Workspace-relative; only the first is run.")
    evaluation_read_only: bool = False
    secret_files: list[str] = Field(default_factory=list, description="Declared by MLGym but not implemented there.")
    memory_path: str | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, value: str, info: ValidationInfo) -> str:
        return check_task_id(value) if _lenient(info) else _identifier(value)

    @field_validator("description")
    @classmethod
    def _formattable(cls, value: str) -> str:
        if errors := description_errors(value):
            raise ValueError("\n".join(errors))
        return value

    @field_validator(
        "requirements_path", "starter_code", "baseline_paths", "sample_submission", "evaluation_paths",
        "secret_files", "memory_path",
    )
    @classmethod
    def _relative(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list):
            return [safe_relpath(v) for v in value]
        return None if value is None else safe_relpath(value)

    @field_validator("dataset_configs")
    @classmethod
    def _config_relative(cls, value: list[str]) -> list[str]:
        out = [safe_relpath(v) for v in value]
        for v in out:
            if v.startswith("configs/"):
                raise ValueError(
                    f"entry {v!r}: dataset_configs are resolved relative to the configs/ directory, "
                    f"so write {v.removeprefix('configs/')!r}"
                )
            if not v.endswith(".yaml"):
                raise ValueError(f"entry {v!r} is not a .yaml file")
        return out

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> TaskConfig:
        errors = []
        if not _lenient(info) and self.dataset_configs and PLACEHOLDER not in self.description:
            errors.append(
                f"description: the task has dataset_configs, so the description must contain the placeholder "
                f"{PLACEHOLDER} where MLGym inserts the dataset documentation"
            )
        if not self.use_generic_conda and self.requirements_path is None:
            errors.append("requirements_path is required when use_generic_conda is false")
        if errors:
            raise ValueError("\n".join(errors))
        return self

    @property
    def effective_training_timeout(self) -> int:
        return DEFAULT_TRAINING_TIMEOUT if self.training_timeout is None else self.training_timeout


M = TypeVar("M", TaskConfig, DatasetConfig)


def dataset_docs(datasets: Sequence[DatasetConfig]) -> str:
    """The text MLGym substitutes for {dataset_docs}."""
    return "".join(f"{d.name.upper()}:\n{d.description}\n\n" for d in datasets)


def render_description(task: TaskConfig, datasets: Sequence[DatasetConfig]) -> str:
    """The task description the agent sees; `datasets` in `task.dataset_configs` order."""
    return task.description.format(dataset_docs=dataset_docs(datasets))


def workspace_layout(task: TaskConfig, datasets: Sequence[DatasetConfig]) -> dict[str, str]:
    """Workspace-relative destination -> source path relative to the MLGym root, as MLGym copies them."""
    layout: dict[str, str] = {}
    for i, d in enumerate(x for x in datasets if x.is_local):
        # `docker cp <dir> workspace/data` creates data/ from the first directory; later ones land inside it.
        layout["data" if i == 0 else f"data/{PurePosixPath(d.data_path).name}"] = d.data_path
    for entry in task.starter_code:
        layout[PurePosixPath(entry).name] = entry
    return layout


def workspace_source(task: TaskConfig, workspace_path: str) -> str | None:
    """The starter file (relative to the MLGym root) that ends up at `workspace_path`, if any."""
    for entry in task.starter_code:
        name = PurePosixPath(entry).name
        if workspace_path == name:
            return entry
        if workspace_path.startswith(name + "/"):  # the entry is a directory, copied whole
            return entry + workspace_path[len(name) :]
    return None


def format_validation_error(err: ValidationError, label: str, model: type[BaseModel]) -> list[str]:
    """One line per Pydantic error, with the field path and what to do."""
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "missing":
            out.append(f"{label}: required field '{loc}' is missing")
        elif e["type"] == "extra_forbidden":
            out.append(f"{label}: unknown field '{loc}'; allowed fields: {', '.join(model.model_fields)}")
        elif e["type"] == "value_error":
            prefix = f"{label}: field '{loc}': " if loc and not msg.startswith(loc) else f"{label}: "
            out.extend(prefix + line for line in msg.split("\n"))
        else:
            hint = ""
            if loc == "description" and e["type"] == "string_type":
                hint = " (write it as a block scalar, `description: |-`, so braces and colons stay text)"
            out.append(f"{label}: field '{loc}': {msg} (got {e.get('input')!r}){hint}")
    return out


def parse_config(model: type[M], text: str, label: str, stem: str | None, *, strict: bool = True
                 ) -> tuple[M | None, list[str]]:
    """Validate YAML text as `model`; the key (`id` / `name`) must equal `stem` when given.

    `strict` (what generated tasks must meet) also requires {dataset_docs} in a description with datasets.
    MLGym itself enforces neither, and its own tasks break both (titanic.yaml: id `titanicSurvival`, no
    placeholder), so configs read from an existing tree are loaded with `strict=False` and no stem.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        return None, [f"{label}: invalid YAML{at}: {problem}"]
    if not isinstance(data, dict):
        return None, [f"{label}: expected a YAML mapping of {model.__name__} fields, got {type(data).__name__}"]
    try:
        config = model.model_validate(data, context={"mlgym_lenient": not strict})
    except ValidationError as err:
        return None, format_validation_error(err, label, model)
    key = "id" if model is TaskConfig else "name"
    value = getattr(config, key)
    if stem is not None and value != stem:
        return None, [f"{label}: {key} '{value}' must equal the file name stem '{stem}' (set {key}: {stem} or name the file {value}.yaml)"]
    return config, []


def _load(model: type[M], path: str | Path) -> M:
    """Load an existing config as MLGym would (see `parse_config`)."""
    path = Path(path)
    config, errors = parse_config(model, path.read_text(), str(path), None, strict=False)
    if config is None:
        raise MLGymConfigError(errors)
    return config


def load_task_config(path: str | Path) -> TaskConfig:
    return _load(TaskConfig, path)


def load_dataset_config(path: str | Path) -> DatasetConfig:
    return _load(DatasetConfig, path)


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Multi-line text as a literal block, like MLGym's own dump; PyYAML falls back to quotes when it must.
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def dump_yaml(model: TaskConfig | DatasetConfig) -> str:
    """YAML MLGym loads: fields in model order, only those set explicitly or differing from the default."""
    data = model.model_dump(mode="json", exclude_none=True)
    fields = type(model).model_fields
    keep: dict[str, Any] = {
        k: v for k, v in data.items()
        if k in model.model_fields_set or v != fields[k].get_default(call_default_factory=True)
    }
    return yaml.dump(keep, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 16)
