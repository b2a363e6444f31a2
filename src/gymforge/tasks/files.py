"""Validation of a generated task (configs from stage 1, starter code from stage 2) and its MLGym layout.

Layout, relative to an MLGym root:
    configs/tasks/<id>.yaml         the task; `dataset_configs` entries are relative to configs/
    configs/datasets/<name>.yaml    one per dataset
    data/<id>/...                   starter code (copied into the workspace by base name),
                                    requirements.txt when the task needs non-generic packages

Every error message names the file and says what to change, because it goes back to the teacher.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path, PurePosixPath

import yaml
from pydantic import BaseModel, ValidationError

from gymforge.core import atomic
from gymforge.runtime.codecheck import check_columns, check_python, imports_gymforge_eval
from gymforge.core.records import GenerationRecord, ProposalRecord
from gymforge.tasks.mlgym import (
    PLACEHOLDER,
    DatasetConfig,
    MLGymConfigError,
    TaskConfig,
    dump_yaml,
    parse_config,
    render_description,
    safe_relpath,
    workspace_source,
)

# The generic packages (MLGym's `use_generic_conda: true`): installed for every task; anything else needs
# requirements.txt and use_generic_conda: false.
GENERIC_PACKAGES = (
    "numpy", "pandas", "scipy", "torch", "scikit-learn", "tqdm", "datasets", "gymnasium", "transformers",
    "matplotlib", "torchvision",
)
# The entrypoints a generated task may use: the one allow-list, offered to the teacher (write_configs.j2) and checked
# on every config draft. Never LMSubmissionTasks: its scorer runs on a copy of the agent's whole workspace beside the
# answers, where an LM evaluator loads the agent's checkpoint (gymforge.tasks.scoring), no evaluator probe covers it,
# and it needs CUDA under torchrun. LM tasks come only from suites gymforge did not generate (MLGym-Bench's
# languageModelingFineWeb).
TEACHER_ENTRYPOINTS = ("CSVSubmissionTasks", "ModelSubmissionTasks", "PythonSubmissionTasks")
# Those whose scorer would meet the agent's code (a module to import, a pickled model) unless the evaluation script
# imports gymforge_eval: a CSV submission is data.
AGENT_CODE_ENTRYPOINTS = ("ModelSubmissionTasks", "PythonSubmissionTasks")
_CONFIG_PATH = re.compile(r"configs/(tasks|datasets)/([^/]+)\.yaml")
_VERSION = r"(?:===|==|!=|~=|>=|<=|>|<)\s*[A-Za-z0-9.*+!_-]+"
_REQUIREMENT = re.compile(
    rf"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9._,\s-]*\])?\s*(?:{_VERSION}\s*(?:,\s*{_VERSION}\s*)*)?(?:;.+)?"
)


class TaskValidationError(MLGymConfigError):
    """A generated task is invalid; `errors` lists every problem found."""


class ConfigBundle(BaseModel):
    """The validated stage-1 output."""

    task: TaskConfig
    datasets: dict[str, DatasetConfig]  # configs/datasets/<name>.yaml -> config, in dataset_configs order
    raw: dict[str, str]  # the YAML texts as written by the teacher

    @property
    def task_path(self) -> str:
        return f"configs/tasks/{self.task.id}.yaml"

    @property
    def data_dir(self) -> str:
        return f"data/{self.task.id}"

    def description(self) -> str:
        return render_description(self.task, list(self.datasets.values()))


def validate_config_files(files: dict[str, str]) -> ConfigBundle:
    """Parse and cross-check the task config and its dataset configs; raise with every error found."""
    errors: list[str] = []
    tasks, datasets = {}, {}
    for path, text in files.items():
        m = _CONFIG_PATH.fullmatch(path)
        if not m:
            errors.append(
                f"{path}: unexpected file; write exactly one configs/tasks/<task_id>.yaml "
                f"and one configs/datasets/<dataset_name>.yaml per dataset, nothing else"
            )
        elif m[1] == "tasks":
            tasks[path] = (text, m[2])
        else:
            datasets[path] = (text, m[2])
    if len(tasks) != 1:
        found = ", ".join(tasks) or "none"
        errors.append(f"expected exactly one task config configs/tasks/<task_id>.yaml, found {len(tasks)}: {found}")

    parsed: dict[str, DatasetConfig] = {}
    for path, (text, stem) in datasets.items():
        config, errs = parse_config(DatasetConfig, text, path, stem)
        errors += errs
        if config is not None:
            parsed[path] = config

    task, ordered, invalid = None, {}, set()
    if len(tasks) == 1:
        [(label, (text, stem))] = tasks.items()
        task, errs = parse_config(TaskConfig, text, label, stem)
        if errs:
            errors += errs
            task, invalid = _without_invalid_fields(text, stem)
    if task is not None and "dataset_configs" not in invalid:
        for entry in task.dataset_configs:
            path = f"configs/{entry}"
            if path in parsed:
                ordered[path] = parsed[path]
            elif path not in datasets:
                given = ", ".join(d.removeprefix("configs/") for d in datasets) or "none"
                errors.append(
                    f"{label}: dataset_configs lists {entry!r}, which MLGym resolves to {path}, but that file was not "
                    f"written (dataset config files given, relative to configs/: {given})"
                )
        for path in datasets:
            if path.removeprefix("configs/") not in task.dataset_configs:
                errors.append(f"{path}: not listed in the task's dataset_configs; add {path.removeprefix('configs/')!r} there or drop the file")
    if task is not None:
        errors += _task_policy_errors(task, label, invalid)
    if errors:
        raise TaskValidationError(errors)
    assert task is not None
    return ConfigBundle(task=task, datasets=ordered, raw=dict(files))


def _without_invalid_fields(text: str, stem: str) -> tuple[TaskConfig | None, set[str]]:
    """The task config minus its invalid fields, so the cross-checks still report on the rest."""
    data = yaml.safe_load(text)  # parse_config already reported YAML errors; it parses here
    try:
        TaskConfig.model_validate(data)
        invalid: set[str] = set()
    except ValidationError as err:
        invalid = {str(e["loc"][0]) for e in err.errors() if e["loc"]}
    # Neutral values for what the cross-checks never read, so model-level rules cannot fail again.
    neutral = {"id": stem, "name": stem, "description": PLACEHOLDER}
    patched = {k: v for k, v in data.items() if k not in invalid and k != "use_generic_conda"}
    patched |= {k: v for k, v in neutral.items() if k in invalid or k == "description"}
    try:
        return TaskConfig.model_validate(patched), invalid
    except ValidationError:
        return None, invalid


def _task_policy_errors(task: TaskConfig, label: str, invalid: set[str]) -> list[str]:
    """What gymforge requires of a generated task on top of MLGym's own rules; `invalid` fields are skipped (but for
    an invalid entrypoint, which is told the allowed ones)."""
    errors = []
    if "task_entrypoint" in invalid or task.task_entrypoint not in TEACHER_ENTRYPOINTS:
        got = "" if "task_entrypoint" in invalid else f", not {task.task_entrypoint!r}"
        errors.append(f"{label}: a generated task's task_entrypoint must be one of {', '.join(TEACHER_ENTRYPOINTS)}{got}"
                      " (LMSubmissionTasks is only for suites gymforge did not generate)")
    data_dir = f"data/{task.id}/"
    if "starter_code" in invalid:
        return errors
    if not task.starter_code:
        errors.append(f"{label}: starter_code is empty; list the baseline and evaluation scripts as {data_dir}<file>")
    names: dict[str, str] = {}
    for entry in task.starter_code:
        if not entry.startswith(data_dir):
            errors.append(
                f"{label}: starter_code entry {entry!r} must be under {data_dir} (paths are relative to the MLGym root), "
                f"e.g. {data_dir}{PurePosixPath(entry).name}"
            )
        name = PurePosixPath(entry).name
        if name in names:
            errors.append(
                f"{label}: starter_code entries {names[name]!r} and {entry!r} are both copied to the workspace "
                f"as {name!r}; give them different names"
            )
        names[name] = entry
    for field in ("requirements_path", "sample_submission"):
        value = getattr(task, field)
        if value is not None and not value.startswith(data_dir):
            errors.append(f"{label}: {field} {value!r} must be under {data_dir}, e.g. {data_dir}{PurePosixPath(value).name}")

    scripts = {}
    for field, role in (("baseline_paths", "baseline"), ("evaluation_paths", "evaluation")):
        paths = getattr(task, field)
        if field in invalid:
            continue
        if len(paths) != 1:
            errors.append(f"{label}: {field} must list exactly one {role} script, found {len(paths)}")
            continue
        [path] = paths
        scripts[role] = path
        if not path.endswith(".py"):
            errors.append(f"{label}: {field} entry {path!r} must be a Python script (.py); MLGym runs it with python")
        if workspace_source(task, path) is None:
            if path.startswith("data/"):
                hint = f"paths are relative to the agent workspace, where each starter_code entry is copied by its file name; write {PurePosixPath(path).name!r}"
            else:
                hint = f"add {data_dir}{path} to starter_code, or use the file name of an existing starter_code entry"
            errors.append(f"{label}: {field} entry {path!r} is not a file that starter_code puts in the workspace; {hint}")
    if len(scripts) == 2 and scripts["baseline"] == scripts["evaluation"]:
        errors.append(f"{label}: the baseline and the evaluation script must be different files")
    if task.baseline_scores:
        errors.append(f"{label}: baseline_scores must be empty; they are measured by running the baseline during verification")
    return errors


def _requirement_errors(path: str, text: str) -> list[str]:
    errors = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*", "", raw).strip()
        if not line:
            continue
        if line.startswith("-") or "://" in line or line.startswith(("pip ", "python ")):
            errors.append(f"{path}:{n}: {raw.strip()!r} is not a package requirement; write one package per line, e.g. lightgbm>=4.0 (no pip options, URLs or commands)")
        elif not _REQUIREMENT.fullmatch(line):
            errors.append(f"{path}:{n}: {raw.strip()!r} is not a valid requirement specifier; write e.g. xgboost==2.0.3 or lightgbm>=4.0")
    return errors


def validate_code_files(bundle: ConfigBundle, files: dict[str, str], columns: set[str] | None = None) -> dict[str, str]:
    """Check the stage-2 files against the configs; return them (path -> text) or raise with every error."""
    task, data_dir = bundle.task, bundle.data_dir + "/"
    label = bundle.task_path
    errors: list[str] = []

    for entry in task.starter_code:
        if entry not in files and not any(p.startswith(entry + "/") for p in files):
            errors.append(f"{entry}: listed in starter_code of {label} but not written; write it as a code block starting with '# {entry}'")
    for field in ("requirements_path", "sample_submission"):
        value = getattr(task, field)
        if value is not None and value not in files:
            errors.append(f"{value}: {label} sets {field} to this file but it was not written; write it as a code block starting with '# {value}'")

    def referenced(path: str) -> bool:
        return path in (task.requirements_path, task.sample_submission) or any(
            path == e or path.startswith(e + "/") for e in task.starter_code
        )

    for path in files:
        if not path.startswith(data_dir):
            errors.append(f"{path}: outside {data_dir}; every starter file belongs under {data_dir}")
        elif PurePosixPath(path).name == "requirements.txt" and path != task.requirements_path:
            if task.use_generic_conda:
                errors.append(
                    f"{path}: the task uses MLGym's generic environment (use_generic_conda: true), so do not write "
                    f"requirements.txt; use only the generic packages: {', '.join(GENERIC_PACKAGES)}"
                )
            else:
                errors.append(f"{path}: the task config's requirements_path is {task.requirements_path!r}; write the requirements there")
        elif not referenced(path):
            errors.append(
                f"{path}: not referenced by starter_code in {label}, so MLGym would not copy it into the workspace; "
                f"remove it (the scripts must work with only the starter_code files: {', '.join(task.starter_code)})"
            )

    for field, role in (("baseline_paths", "baseline"), ("evaluation_paths", "evaluation")):
        for path in getattr(task, field)[:1]:
            source = workspace_source(task, path)
            # A whole starter_code entry that is missing was reported above; this catches files inside a directory entry.
            if source is not None and source not in files and source not in task.starter_code:
                errors.append(f"{source}: the {role} script (workspace path {path!r}) was not written; write it as a code block starting with '# {source}'")

    # A Python or model task is scored under the evaluation contract only if its evaluation script imports
    # gymforge_eval (verification refuses it otherwise, `runs_agent_code_beside_answers`): asked for here, before
    # the task is installed, of a script that compiles.
    contract = (workspace_source(task, task.evaluation_paths[0])
                if task.evaluation_paths and task.task_entrypoint in AGENT_CODE_ENTRYPOINTS else None)
    for path, text in files.items():
        if path.endswith(".py"):
            problems = check_python(text, path)
            errors += problems or (check_columns(text, path, columns) if columns else [])
            if path == contract and not problems and not imports_gymforge_eval(text):
                errors.append(f"{path}: the evaluation script must reach the submission through gymforge_eval "
                              "(`try: from gymforge_eval import import_submission, load_pickle` / `except "
                              "ImportError: ...` for MLGym), so that the agent's code never runs in the scorer, "
                              "beside the answers")
        elif path == task.requirements_path:
            errors += _requirement_errors(path, text)

    if errors:
        raise TaskValidationError(errors)
    return dict(sorted(files.items()))


def write_task_tree(root: Path, bundle: ConfigBundle, code_files: dict[str, str]) -> None:
    """Write the task in MLGym layout under `root`: configs/tasks, configs/datasets and data/<id>."""
    root = Path(root)
    atomic.write_text(root / bundle.task_path, dump_yaml(bundle.task))
    for path, dataset in bundle.datasets.items():
        atomic.write_text(root / path, dump_yaml(dataset))
    for path, text in code_files.items():
        atomic.write_text(root / safe_relpath(path), text)


def answer_columns(proposal: ProposalRecord, code: GenerationRecord) -> dict[str, list[str]] | None:
    """Label columns to withhold from the agent: the dataset columns that the evaluation's `load_answers()`
    names, when it reads them from $GYMFORGE_SECRETS (the contract `core/templates/write_code.j2` states)."""
    dataset = proposal.dataset or {}
    evaluation = next((text for path, text in code.files.items() if path.endswith("/evaluate.py")), "")
    if not dataset.get("is_local") or "GYMFORGE_SECRETS" not in evaluation:
        return None
    try:
        tree = ast.parse(evaluation)
    except SyntaxError:
        return None
    loader = next((node for node in ast.walk(tree)
                   if isinstance(node, ast.FunctionDef) and node.name == "load_answers"), None)
    if loader is None:
        return None
    named = {n.value for n in ast.walk(loader) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    columns = sorted(named & set(dataset.get("features", {})))
    return {"test": columns} if columns else None
