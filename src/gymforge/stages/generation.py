"""Generation stage: the teacher writes MLGym configs, then starter code; each draft is validated and repaired."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig
from gymforge.core.prompts import render
from gymforge.core.records import Attempt, GenerationRecord, ProposalRecord, UsageRecord, derive_seed
from gymforge.hub import get_hub
from gymforge.llm.client import make_client
from gymforge.llm.codeblocks import CodeBlockError, parse_files
from gymforge.tasks import posttraining
from gymforge.tasks.coherence import stated_metric
from gymforge.tasks.files import (
    GENERIC_PACKAGES,
    TEACHER_ENTRYPOINTS,
    TaskValidationError,
    validate_code_files,
    validate_config_files,
    write_task_tree,
)

# What a task of each entrypoint the teacher may use (TEACHER_ENTRYPOINTS) submits, as the code prompt says.
# validate_config_files refuses any other entrypoint (LMSubmissionTasks), so a generated task's code needs a GPU only
# when it post-trains a GPU base (gymforge.runtime.resources.needs_gpu).
ARTEFACTS = {
    "CSVSubmissionTasks": ("submission.csv file in the workspace", "--submission_file <path>"),
    "ModelSubmissionTasks": ("trained model plus one YAML config in the workspace that points at it", "--config_fname <yaml>"),
    "PythonSubmissionTasks": ("Python module that the evaluation imports", ""),
}


class GenerationFailed(Exception):
    def __init__(self, attempts: list[Attempt]):
        super().__init__(attempts[-1].errors if attempts else [])
        self.attempts = attempts


def draft_until_valid(chat: Callable[[list[dict]], Any], messages: list[dict], validate: Callable[[str], Any],
                      max_attempts: int) -> tuple[Any, list[Attempt]]:
    """Ask, validate, and on failure re-prompt with the errors for the whole answer again (bounded)."""
    attempts: list[Attempt] = []
    for _ in range(max_attempts):
        reply = chat(messages)
        messages.append(reply.assistant_message())
        try:
            result = validate(reply.content or "")
        except TaskValidationError as err:
            errors = list(err.errors)
        except CodeBlockError as err:
            errors = [str(err)]
        else:
            attempts.append(Attempt())
            return result, attempts
        attempts.append(Attempt(errors=errors))
        messages.append({"role": "user", "content": render("repair", errors=errors)})
    raise GenerationFailed(attempts)


def _skip(slot: str, upstream: GenerationRecord | ProposalRecord) -> GenerationRecord:
    """An item an earlier stage discarded passes through with that stage's reason."""
    return GenerationRecord(item=slot, status="skipped", reason_code=upstream.reason_code, reason=upstream.reason)


def _failed(record: GenerationRecord, err: GenerationFailed, code: str, what: str) -> GenerationRecord:
    record.status, record.reason_code = "discarded", code
    record.reason = f"{what} still invalid after {len(err.attempts)} attempts: " + "; ".join(err.attempts[-1].errors)
    record.attempts = err.attempts
    return record


def task_configs(cfg: GymforgeConfig, slot: str, proposal: Path, out: Path) -> GenerationRecord:
    proposal_record = ProposalRecord.model_validate_json(Path(proposal).read_text())
    record = draft_configs(cfg, slot, proposal_record) if proposal_record.status == "ok" else _skip(slot, proposal_record)
    atomic.write_text(out, record.model_dump_json(indent=2))
    return record


def _seed(cfg: GymforgeConfig, stage: str, slot: str, variant: int) -> int:
    # Variant 0 is the first pass; later variants (verification restarts) ask for a fresh draft.
    return derive_seed(cfg.seed, stage, slot, *([variant] if variant else []))


def draft_configs(cfg: GymforgeConfig, slot: str, proposal: ProposalRecord, *, variant: int = 0,
                  previous: dict[str, str] | None = None, errors: list[str] | None = None) -> GenerationRecord:
    """Stage 1 of generation for one proposal: configs drafted, validated and repaired (bounded). With `previous`
    and `errors`, the teacher repairs configs that verification found wrong (an incoherent description)."""
    dataset = proposal.dataset
    payload = {**proposal.proposal.model_dump(), "dataset": _dataset_brief(dataset) if dataset else None}
    messages = [
        {"role": "system", "content": render("system_teacher")},
        {"role": "user", "content": render(
            "write_configs", proposal_json=json.dumps(payload, indent=2), has_dataset=dataset is not None,
            local_data=bool(dataset and dataset.get("is_local")), entrypoints=TEACHER_ENTRYPOINTS,
            metric=proposal.proposal.metric)},
    ]
    if previous is not None:
        messages += [{"role": "assistant", "content": code_files_markdown(previous)},
                     {"role": "user", "content": render("repair", errors=errors or [])}]

    def validate(text: str):
        files = parse_files(text)
        bundle = validate_config_files(files)
        _check_dataset_binding(bundle, dataset)
        return files, bundle

    seed = _seed(cfg, "configs", slot, variant)
    record = GenerationRecord(item=slot, status="ok", dataset_id=dataset["id"] if dataset else None)
    with make_client(cfg, "configs") as client:
        try:
            (files, bundle), record.attempts = draft_until_valid(
                lambda m: client.chat(m, seed=seed), messages, validate, cfg.generation.max_attempts)
            record.task_id, record.entrypoint, record.files = bundle.task.id, bundle.task.task_entrypoint, files
        except GenerationFailed as err:
            _failed(record, err, "invalid_config", "task configs")
        record.usage = UsageRecord.model_validate(client.usage.model_dump())
    return record


def _dataset_brief(dataset: dict) -> dict:
    keys = ("id", "description", "tags", "card_data", "features", "splits", "example_rows", "is_local")
    return {k: dataset[k] for k in keys if k in dataset}


def _check_dataset_binding(bundle, dataset: dict | None) -> None:
    """The configs must point at the dataset the proposal resolved, where the pipeline will put it."""
    errors = []
    if dataset is None and bundle.datasets:
        errors.append("this task has no dataset: remove the dataset configs and `dataset_configs`")
    if dataset is not None:
        if len(bundle.datasets) != 1:
            errors.append(f"write exactly one dataset config for {dataset['id']} (found {len(bundle.datasets)})")
        for path, ds in bundle.datasets.items():
            if dataset.get("is_local"):
                want = f"data/{bundle.task.id}/data"
                if not ds.is_local or ds.data_path.rstrip("/") != want:
                    errors.append(f"{path}: the dataset ships with the task: set `data_path: {want}` and `is_local: true`")
            elif ds.data_path != dataset["id"]:
                errors.append(f"{path}: `data_path` must be the Hugging Face id {dataset['id']!r}")
    if errors:
        raise TaskValidationError(errors)


def starter_code(cfg: GymforgeConfig, slot: str, proposal: Path, configs: Path,
                       status_out: Path, tree_out: Path) -> GenerationRecord:
    """Second generation stage; on success writes the MLGym layout under `tree_out` (always created)."""
    configs_record = GenerationRecord.model_validate_json(Path(configs).read_text())
    # The tree is moved into place before the status file appears, so a status always means a finished tree.
    with atomic.directory(tree_out) as tree:
        if configs_record.status != "ok":
            record = _skip(slot, configs_record)
        else:
            proposal_record = ProposalRecord.model_validate_json(Path(proposal).read_text())
            record = draft_code(cfg, slot, configs_record, proposal_record)
            if record.status == "ok":
                materialize_task(cfg, tree, configs_record, record, proposal_record)
    atomic.write_text(status_out, record.model_dump_json(indent=2))
    return record


def code_files_markdown(files: dict[str, str]) -> str:
    """Files rendered the way the teacher returns them, to replay an earlier answer in a conversation."""
    return "\n".join(f"```\n# {path}\n{text.rstrip()}\n```\n" for path, text in files.items())


def draft_code(cfg: GymforgeConfig, slot: str, configs: GenerationRecord, proposal: ProposalRecord, *,
               variant: int = 0, previous: dict[str, str] | None = None,
               runtime_errors: list[str] | None = None) -> GenerationRecord:
    """Stage 2 of generation. With `previous` and `runtime_errors`, the teacher repairs code that failed to run."""
    dataset = proposal.dataset
    try:
        bundle = validate_config_files(configs.files)
    except TaskValidationError as err:  # configs recorded before a rule they break: no code is drafted for them
        return GenerationRecord(item=slot, status="discarded", reason_code="invalid_config", task_id=configs.task_id,
                                entrypoint=configs.entrypoint, dataset_id=configs.dataset_id,
                                reason="task configs invalid: " + "; ".join(err.errors))
    task = bundle.task
    artefact, eval_args = ARTEFACTS[task.task_entrypoint]
    messages = [
        {"role": "system", "content": render("system_teacher")},
        {"role": "user", "content": render(
            "write_code", configs=configs.files, dataset=dataset,
            dataset_json=json.dumps(_dataset_brief(dataset), indent=2, default=str) if dataset else "",
            local_data=bool(dataset and dataset.get("is_local")), task_id=task.id,
            entrypoint=task.task_entrypoint, artefact=artefact, eval_args=eval_args,
            generic_packages=sorted(GENERIC_PACKAGES), metric=stated_metric(task.description or ""))},
    ]
    if previous is not None:
        messages += [{"role": "assistant", "content": code_files_markdown(previous)},
                     {"role": "user", "content": render("repair", errors=runtime_errors or [])}]
    columns = set(dataset["features"]) if dataset else None

    def validate(text: str) -> dict[str, str]:
        files = validate_code_files(bundle, parse_files(text), columns)
        check_post_training_source(files, columns, task.secret_files)
        return files

    seed = _seed(cfg, "code", slot, variant)
    record = GenerationRecord(item=slot, status="ok", task_id=task.id, entrypoint=task.task_entrypoint,
                              dataset_id=configs.dataset_id)
    with make_client(cfg, "code") as client:
        try:
            record.files, record.attempts = draft_until_valid(
                lambda m: client.chat(m, seed=seed), messages,
                validate, cfg.generation.max_attempts)
        except GenerationFailed as err:
            _failed(record, err, "invalid_code", "starter code")
        record.usage = UsageRecord.model_validate(client.usage.model_dump())
    return record


def materialize_task(cfg: GymforgeConfig, tree: Path, configs: GenerationRecord, code: GenerationRecord,
                     proposal: ProposalRecord) -> None:
    """Write the MLGym layout of a validated task, with its local dataset copy, under `tree`."""
    bundle = validate_config_files(configs.files)
    write_task_tree(tree, bundle, code.files)
    dataset = proposal.dataset
    if not (dataset and dataset.get("is_local")):
        return
    data = tree / "data" / bundle.task.id / "data"
    spec = posttraining.spec_in(code.files)
    if spec is None or spec.source is None:
        get_hub(cfg).materialize(dataset["id"], data)
        return
    # A post-training task's rows are rendered from the dataset: the pool where the workspace's data/ comes from,
    # the held-out rows at the secret file; the dataset's own copy is not kept.
    secret = next(p for p in bundle.task.secret_files if PurePosixPath(p).name == PurePosixPath(spec.eval_file).name)
    pool = data / PurePosixPath(spec.train_files[0]).relative_to("data")
    with tempfile.TemporaryDirectory(dir=tree, prefix=".dataset-") as raw:
        get_hub(cfg).materialize(dataset["id"], Path(raw) / "copy")
        posttraining.render_source(spec, Path(raw) / "copy", pool, tree / secret)


def check_post_training_source(files: dict[str, str], columns: set[str] | None, secret_files: list[str]) -> None:
    """A generated post-training task's `post_training.yaml` must parse, name a secret held-out file and a pool
    under data/, and its `source` templates only the dataset's columns."""
    try:
        spec = posttraining.spec_in(files)
        if spec is None or spec.source is None:
            return
        if columns is None:
            raise posttraining.PostTrainingError("`source` renders rows from the task's dataset, and it has none")
        if PurePosixPath(spec.eval_file).name not in {PurePosixPath(p).name for p in secret_files}:
            raise posttraining.PostTrainingError(f"eval_file {spec.eval_file!r} must be one of the task config's "
                                                 "secret_files: the held-out rows never enter the workspace")
        if not spec.train_files or not spec.train_files[0].startswith("data/"):
            raise posttraining.PostTrainingError("the pool (`train_files`' first entry) must be under data/")
        for template in (spec.source.prompt, spec.source.answer):
            posttraining.template_fields(template, columns)
    except (posttraining.PostTrainingError, ValueError) as err:
        raise TaskValidationError([str(err)]) from None
