"""An MLGym-compatible execution environment for one task: install, baseline, evaluation (docs/verification.md).

`TaskEnvironment` is the façade every caller uses; its two parts are read on their own:
- `tasks.workspace.TaskWorkspace` (`env.installation`): the run directory's layout (workspace, secrets, hidden
  columns), the mounts of sessions and runs, the GPUs an LM task needs;
- `tasks.scoring.Scoring` (`env.scoring`): the evaluation contract (docs/integrity.md): the artefact's snapshot,
  the pristine files, the scorer's and the submission's sandboxes, the metrics, the failure messages.
What is left here: the agent's session, the baseline run, the audit's checks and the verified copy of the task.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gymforge.core import atomic
from gymforge.core.records import Flag
from gymforge.sandbox import ExecResult, Limits, Mount, SandboxBackend, Session
from gymforge.tasks.mlgym import TaskConfig, dump_yaml
from gymforge.tasks.scoring import EVALKIT, EvaluationFailed, Scoring, excerpt, parse_metrics
from gymforge.tasks.workspace import (
    ANSWERS_FILE,
    SECRETS_ENV,
    InstallError,
    TaskUnsupported,
    TaskWorkspace,
    copy_files,
    default_root,
)

__all__ = [
    "ANSWERS_FILE", "EVALKIT", "SECRETS_ENV", "BaselineFailed", "BaselineReport", "EvaluationFailed", "InstallError",
    "TaskEnvironment", "TaskUnsupported", "default_root", "parse_metrics",
]


class BaselineFailed(RuntimeError):
    """The baseline script failed or timed out; `result` holds its output."""

    def __init__(self, message: str, result: ExecResult) -> None:
        super().__init__(message)
        self.result = result


class BaselineReport(BaseModel):
    metrics: dict[str, float]
    artefact: str
    baseline: ExecResult
    evaluation: ExecResult
    install_s: float | None = None


def _of(part: str, name: str) -> property:
    """The attribute `name` of the environment's part `part`, read and written through the façade."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value))


class TaskEnvironment:
    """One task installed in a run directory, with the evaluator the agent loop calls (`TaskEvaluator`).

    `root` (the MLGym root the task's paths are relative to) defaults to the tree holding `task_yaml`.
    `hidden_columns` (split -> columns) applies to the first local dataset (the one at `data/`, a
    Hugging Face dataset saved with `save_to_disk`): the columns are removed from the agent's copy of that
    split and written, with `id` = row position, to `answers.csv` among the secrets.
    `gpus` is the count torchrun gets for LM tasks (None: `gymforge.runtime.gpus.gpu_count`); the backend must expose them.
    `dataset_cache` is the root of the host's dataset cache (`gymforge.stages.datasets`): datasets the task loads
    from the hub by id (not `is_local`) must be fetched there, and every run sees them read-only, offline.
    `base_model` overrides a post-training task's base; `model_cache` holds the base models built or fetched for them.
    """

    def __init__(
        self,
        task_yaml: Path,
        *,
        root: Path | None = None,
        sandbox: SandboxBackend,
        run_dir: Path,
        limits: Limits | None = None,
        gpus: int | None = None,
        hidden_columns: dict[str, list[str]] | None = None,
        dataset_cache: Path | None = None,
        base_model: str | None = None,
        model_cache: Path | None = None,
    ) -> None:
        self.installation = TaskWorkspace(task_yaml, root=root, sandbox=sandbox, run_dir=run_dir, limits=limits,
                                          gpus=gpus, hidden_columns=hidden_columns, dataset_cache=dataset_cache,
                                          base_model=base_model, model_cache=model_cache)
        self.scoring = Scoring(self.installation)
        self._session: Session | None = None  # the episode's open session: its limits bound the submission too

    @classmethod
    def from_id(cls, root: Path, task_id: str, **kwargs: Any) -> TaskEnvironment:
        return cls(Path(root) / "configs" / "tasks" / f"{task_id}.yaml", root=root, **kwargs)

    # The installation's facts and state (tasks/workspace.py), the last evaluation's runs (tasks/scoring.py).
    task_yaml = _of("installation", "task_yaml")
    root = _of("installation", "root")
    task = _of("installation", "task")
    datasets = _of("installation", "datasets")
    sandbox = _of("installation", "sandbox")
    run_dir = _of("installation", "run_dir")
    workspace = _of("installation", "workspace")
    secrets_dir = _of("installation", "secrets_dir")
    workdir = _of("installation", "workdir")
    limits = _of("installation", "limits")
    hidden_columns = _of("installation", "hidden_columns")
    dataset_cache = _of("installation", "dataset_cache")
    post_training = _of("installation", "post_training")
    run_env = _of("installation", "run_env")
    install_s = _of("installation", "install_s")
    description = _of("installation", "description")
    timeout = _of("installation", "timeout")
    gpus = _of("installation", "gpus")
    has_secrets = _of("installation", "has_secrets")
    isolated = _of("scoring", "isolated")
    last_evaluation = _of("scoring", "last_evaluation")
    last_submission_run = _of("scoring", "last_submission_run")

    @property
    def mounts(self) -> list[Mount]:
        """What the agent's sessions and the baseline get (`TaskWorkspace.mounts`); subclasses add to it."""
        return self.installation.mounts

    def prepare_data(self) -> list[Path]:
        return self.installation.prepare_data()

    def install(self) -> Path:
        """A fresh workspace and secrets directory; returns the workspace (`TaskWorkspace.install`)."""
        return self.installation.install()

    def evaluate(self) -> tuple[dict[str, float], str]:
        """(metrics, artefact) of the workspace's current artefact (`Scoring.evaluate`, the evaluation contract)."""
        return self.scoring.evaluate(within=self._session)

    # -- sessions and runs ----------------------------------------------------------------------

    def open_session(self) -> Session:
        """The agent's persistent shell on the workspace: data and evaluation read-only, no secrets."""
        self._session = self.sandbox.open(self.workspace, limits=self.limits, mounts=self.mounts, env=self.run_env)
        return self._session

    def run_baseline(self) -> BaselineReport:
        """Run the baseline like MLGym (`python <baseline>`, torchrun for LM tasks), then evaluate its artefact."""
        self.installation.require_gpus()
        if not self.task.baseline_paths:
            raise InstallError(f"{self.task_yaml}: baseline_paths is empty; there is no baseline to run")
        argv = [*self.installation.launcher(), f"{self.workdir}/{self.task.baseline_paths[0]}"]
        result = self.sandbox.run_once(
            self.workspace, argv, timeout=self.timeout, limits=self.limits, mounts=self.mounts, env=self.run_env
        )
        if result.timed_out:
            raise BaselineFailed(
                f"the baseline ran past training_timeout ({self.timeout:g} s); output tail:\n{excerpt(result.output)}",
                result,
            )
        if result.exit_code != 0:
            raise BaselineFailed(
                f"the baseline `{' '.join(argv)}` exited with status {result.exit_code}; output tail:\n"
                f"{excerpt(result.output)}",
                result,
            )
        metrics, artefact = self.evaluate()
        assert self.last_evaluation is not None
        return BaselineReport(metrics=metrics, artefact=artefact, baseline=result, evaluation=self.last_evaluation,
                              install_s=self.install_s)

    def audit_checks(self) -> list[Callable[[], list[Flag]]]:
        """Checks of this task's kind that the audit runs after every step (gymforge.agent.audit): for post-training
        tasks, the agent's own data files against the held-out prompts."""
        if self.post_training is None or not self.secrets_dir.is_dir():
            return []
        return [self.post_training.watch(self.workspace, self.secrets_dir, self.installation.data_targets())]

    # -- output ---------------------------------------------------------------------------------

    def write_verified_copy(self, dest: Path, baseline_scores: list[dict[str, float]]) -> Path:
        """An MLGym tree of this task with `baseline_scores` filled, built aside and moved into place.

        The source tree is only read: MLGym's habit of caching baseline scores into the task YAML in place
        is what this avoids.
        """
        dest = Path(dest).resolve()
        if dest.is_relative_to(self.root) or self.root.is_relative_to(dest):
            raise ValueError(f"the verified copy {dest} must lie outside the source tree {self.root}")
        fields = self.task.model_dump(exclude_unset=True) | {"baseline_scores": baseline_scores}
        task = TaskConfig.model_validate(fields)
        referenced = [f"data/{task.id}", *task.starter_code, *self.installation.local_data_paths(), *task.secret_files]
        referenced += [p for p in (task.requirements_path, task.sample_submission, task.memory_path) if p]
        with atomic.directory(dest) as tmp:
            atomic.write_text(tmp / "configs" / "tasks" / f"{task.id}.yaml", dump_yaml(task))
            for entry in task.dataset_configs:
                copy_files(self.root / "configs" / entry, tmp / "configs" / entry, set())
            for rel in dict.fromkeys(referenced):
                if (self.root / rel).exists():
                    copy_files(self.root / rel, tmp / rel, set())
        return dest
