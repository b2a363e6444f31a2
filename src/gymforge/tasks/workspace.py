"""A task's installation in a run directory: the workspace, the secrets, the mounts every sandbox gets
(docs/verification.md). `TaskEnvironment` (tasks/environment.py) installs through it; `tasks.scoring` reads it.

Layout of a run directory:
    workspace/   the agent's workspace: starter code by base name, local data under data/
    secrets/     files the agent never sees: `secret_files` and the answers of `hidden_columns`

What MLGym leaves to trust, this enforces with mounts (under bwrap a sandbox runs as a random uid, so
file permissions protect nothing): the data directories and, with `evaluation_read_only`, the evaluation
script are read-only mounts over themselves in every session and run; the secrets directory is mounted
(read-only) only for evaluation runs, which find it through `GYMFORGE_SECRETS`. MLGym declares
`secret_files` but never implements them; here they are withheld from the workspace even when also
listed in `starter_code`, so under MLGym (no variable) an evaluation script falls back to the workspace.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path, PurePosixPath

from gymforge.runtime.gpus import gpu_count
from gymforge.hub.data import quiet_datasets
from gymforge.sandbox import Limits, Mount, SandboxBackend, make_readable
from gymforge.sandbox.base import WORKDIR
from gymforge.tasks import posttraining, prepare
from gymforge.tasks.datacache import sandbox_view
from gymforge.tasks.mlgym import (
    DatasetConfig,
    TaskConfig,
    load_dataset_config,
    load_task_config,
    render_description,
    workspace_layout,
)

SECRETS_ENV = "GYMFORGE_SECRETS"
ANSWERS_FILE = "answers.csv"


class InstallError(RuntimeError):
    """The task cannot be installed as written (a missing file, a bad hidden column...)."""


class TaskUnsupported(RuntimeError):
    """This host cannot run the task at all (an LM task without GPUs); the message says why."""


def default_root(task_yaml: Path) -> Path:
    """The MLGym root holding `configs/tasks/<id>.yaml`."""
    path = Path(task_yaml).resolve()
    if path.parent.name != "tasks" or path.parent.parent.name != "configs":
        raise InstallError(f"{task_yaml} is not at <root>/configs/tasks/<id>.yaml; name the MLGym root explicitly")
    return path.parent.parent.parent


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def copy_files(src: Path, dst: Path, withheld: set[Path]) -> None:
    """Copy a file or a directory tree of the task's source, leaving out the `withheld` (resolved) paths."""
    if src.resolve() in withheld:
        return
    if src.is_dir():
        shutil.copytree(
            src, dst, dirs_exist_ok=True,
            ignore=lambda d, names: {n for n in names if (Path(d) / n).resolve() in withheld},
        )
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


class TaskWorkspace:
    """One task's installation: its config, the workspace and secrets directories, the mounts its sessions and
    runs get, the GPUs it needs. The arguments are `TaskEnvironment`'s (which documents them)."""

    def __init__(
        self,
        task_yaml: Path,
        *,
        root: Path | None,
        sandbox: SandboxBackend,
        run_dir: Path,
        limits: Limits | None,
        gpus: int | None,
        hidden_columns: dict[str, list[str]] | None,
        dataset_cache: Path | None,
        base_model: str | None,
        model_cache: Path | None,
    ) -> None:
        self.task_yaml = Path(task_yaml).resolve()
        self.root = Path(root).resolve() if root is not None else default_root(self.task_yaml)
        self.task: TaskConfig = load_task_config(self.task_yaml)
        self.datasets: list[DatasetConfig] = [
            load_dataset_config(self.root / "configs" / entry) for entry in self.task.dataset_configs
        ]
        if not self.task.evaluation_paths:
            raise InstallError(f"{self.task_yaml}: evaluation_paths is empty; the task cannot be evaluated")
        self.sandbox = sandbox
        self.run_dir = Path(run_dir).resolve()
        self.workspace = self.run_dir / "workspace"
        self.secrets_dir = self.run_dir / "secrets"
        self.limits = limits if limits is not None else Limits()
        self._gpus = gpus
        self.hidden_columns = hidden_columns or {}
        self.dataset_cache = Path(dataset_cache) if dataset_cache is not None else None
        self._hub_mounts: list[Mount] = []
        self.run_env: dict[str, str] = {}  # what every run and session gets on top of the sandbox's own environment
        self.install_s: float | None = None
        self.workdir = sandbox.workdir(self.workspace)
        # Post-training tasks (tasks/posttraining.py): `base_model` overrides the task's base, `model_cache` holds
        # the base models built or fetched for them.
        try:
            self.post_training = posttraining.load(self.root, self.task, self.layout(), base_model=base_model,
                                                   cache=model_cache)
        except posttraining.PostTrainingError as err:
            raise InstallError(str(err)) from None

    # -- facts ----------------------------------------------------------------------------------

    @property
    def description(self) -> str:
        return render_description(self.task, self.datasets)

    @property
    def timeout(self) -> float:
        return float(self.task.effective_training_timeout)

    @property
    def gpus(self) -> int:
        if self._gpus is None:
            self._gpus = gpu_count()
        return self._gpus

    @property
    def has_secrets(self) -> bool:
        return bool(self.task.secret_files or self.hidden_columns)

    @property
    def mounts(self) -> list[Mount]:
        """What the agent's sessions and the baseline get: data and (maybe) the evaluation script, read-only,
        and the fetched hub datasets the task loads by id."""
        ro = [self.task.evaluation_paths[0]] if self.task.evaluation_read_only else []
        base = self.post_training.mounts() if self.post_training is not None else []
        return self.data_mounts() + self._workspace_mounts(ro) + self._hub_mounts + base

    def data_mounts(self) -> list[Mount]:
        return self._workspace_mounts(self.data_targets())

    def _workspace_mounts(self, targets: list[str]) -> list[Mount]:
        return [Mount(host=self.workspace / t, target=t) for t in targets if (self.workspace / t).exists()]

    def data_targets(self) -> list[str]:
        """Where the task's local data lies in the workspace (read-only mounts in every sandbox)."""
        local = self.local_data_paths()
        return [dest for dest, src in self.layout().items() if src in local]

    def layout(self) -> dict[str, str]:
        """Workspace path -> source path (relative to `root`) of every file the workspace starts with."""
        return workspace_layout(self.task, self.datasets)

    def local_data_paths(self) -> list[str]:
        return [d.data_path for d in self.datasets if d.is_local]

    def hub_view(self, home: Path) -> tuple[list[Mount], dict[str, str]]:
        """The hub datasets the task loads by id again (mounts, environment), with an HF_HOME of one sandbox's own at
        `home` (never the session's writable one); nothing when it loads none or there is no dataset cache."""
        hub_ids = [d.data_path for d in self.datasets if not d.is_local]
        if not hub_ids or self.dataset_cache is None:
            return [], {}
        return sandbox_view(self.dataset_cache, hub_ids, home, fixed=self.workdir == WORKDIR)

    def require_gpus(self) -> None:
        if self.task.task_entrypoint == "LMSubmissionTasks" and self.gpus == 0:
            raise TaskUnsupported(
                f"{self.task.id} is an LMSubmissionTasks task, run with `torchrun --nproc_per_node=<gpus>`, "
                "and this host has no GPU (nvidia-smi -L and torch.cuda found none)"
            )

    def launcher(self, isolated: bool | None = None) -> list[str]:
        """The command a task's script runs under, per entrypoint: torchrun across the GPUs for LM tasks, else python.

        `isolated` None: as MLGym runs a baseline (`python`, `torchrun`). Otherwise the scorer's interpreter:
        `-I` under gymforge's contract; outside it, for LM tasks, `-P`, because `-m` would otherwise put the cwd
        (the agent's files) first on sys.path (the workers torchrun starts get PYTHONSAFEPATH from the environment).
        """
        lm = self.task.task_entrypoint == "LMSubmissionTasks"
        if isolated is None:
            python, torchrun = ["python"], ["torchrun"]
        else:
            python = ["python", "-I"] if isolated else ["python", "-P"] if lm else ["python"]
            torchrun = [*python, "-m", "torch.distributed.run"]
        return [*torchrun, f"--nproc_per_node={self.gpus}", "--standalone"] if lm else python

    # -- install --------------------------------------------------------------------------------

    def prepare_data(self) -> list[Path]:
        """Make the task's missing local data that MLGym makes with the task's own helper scripts
        (`data/<id>/_helpers/*.py`), in this environment's sandbox under its limits, as the benchmark does
        (`gymforge.tasks.prepare.prepare_task_data`, the one function every entry point goes through);
        returns the directories made. `install` calls it first."""
        try:
            return prepare.prepare_task_data(self.root, self.task.id, self.local_data_paths(), sandbox=self.sandbox,
                                             limits=self.limits)
        except (prepare.PrepareError, OSError) as err:
            raise InstallError(f"{self.task_yaml}: its local data could not be made with MLGym's helper: {err}") from err

    def install(self) -> Path:
        """A fresh workspace and secrets directory; returns the workspace. Local data that MLGym's helpers make
        is made first when missing (`prepare_data`)."""
        self.require_gpus()
        self.prepare_data()
        t0 = time.monotonic()
        for d in (self.workspace, self.secrets_dir):
            remove_path(d)
        self.workspace.mkdir(parents=True)
        withheld = {(self.root / p).resolve() for p in self.task.secret_files}
        self._refuse_symlinks()
        if self.has_secrets:
            self.secrets_dir.mkdir()
            self._store_secrets()
        for dest, src in self.layout().items():
            source = self.root / src
            if not source.exists():
                raise InstallError(
                    f"{self.task_yaml}: {src} (copied to the workspace as {dest}) does not exist under {self.root}"
                )
            copy_files(source, self.workspace / dest, withheld)
        if self.hidden_columns:
            self._hide_columns()
        self._mount_hub_datasets()
        make_readable(self.workspace)
        if self.has_secrets:
            make_readable(self.secrets_dir)
        self.install_s = round(time.monotonic() - t0, 4)
        return self.workspace

    def _refuse_symlinks(self) -> None:
        """A task's files must be its own: a symlink in its source tree could bring any host file into the
        workspace (or the answers into a sandbox that must not have them)."""
        sources = [*self.layout().values(), *self.task.secret_files]
        for rel in sources:
            path = self.root / rel
            found = [path] if path.is_symlink() else []
            if path.is_dir() and not path.is_symlink():
                found += [p for p in path.rglob("*") if p.is_symlink()]
            if found:
                raise InstallError(f"{self.task_yaml}: {found[0]} is a symlink; a task's files must be regular files "
                                   "and directories")

    def _mount_hub_datasets(self) -> None:
        hub_ids = [d.data_path for d in self.datasets if not d.is_local]
        if not hub_ids or self.dataset_cache is None:
            return
        try:
            self._hub_mounts, self.run_env = sandbox_view(self.dataset_cache, hub_ids, self.run_dir / "hf-home",
                                                          fixed=self.workdir == WORKDIR)
        except FileNotFoundError as err:
            raise InstallError(f"{self.task.id}: {err}") from None

    def _store_secrets(self) -> None:
        for rel in self.task.secret_files:
            source = self.root / rel
            dest = self.secrets_dir / PurePosixPath(rel).name
            if not source.exists():
                raise InstallError(f"{self.task_yaml}: secret file {rel} does not exist under {self.root}")
            if dest.exists() or (self.hidden_columns and dest.name == ANSWERS_FILE):
                raise InstallError(f"{self.task_yaml}: two secrets are stored as {dest.name}; give them different names")
            copy_files(source, dest, set())

    def _hide_columns(self) -> None:
        import datasets
        import pandas as pd

        local = [d for d in self.datasets if d.is_local]
        if not local:
            raise InstallError(f"hidden_columns given but {self.task.id} has no local dataset")
        if len(self.hidden_columns) != 1:
            raise InstallError(
                f"hidden_columns must name exactly one split (its answers go to {ANSWERS_FILE}), "
                f"got {sorted(self.hidden_columns)}"
            )
        [(split, columns)] = self.hidden_columns.items()
        source = datasets.load_from_disk(str(self.root / local[0].data_path))
        if not isinstance(source, datasets.DatasetDict) or split not in source:
            found = sorted(source) if isinstance(source, datasets.DatasetDict) else "a single unsplit dataset"
            raise InstallError(f"hidden_columns: {local[0].data_path} has no split {split!r} (found {found})")
        missing = [c for c in columns if c not in source[split].column_names]
        if missing:
            raise InstallError(
                f"hidden_columns: split {split!r} has no columns {missing} (columns: {source[split].column_names})"
            )
        answers: pd.DataFrame = source[split].select_columns(list(columns)).to_pandas()
        answers.insert(0, "id", range(len(answers)))
        answers.to_csv(self.secrets_dir / ANSWERS_FILE, index=False)
        # The split is rewritten, not filtered in place, so the hidden values are absent from the bytes.
        agent_split = self.workspace / "data" / split
        shutil.rmtree(agent_split)
        with quiet_datasets():
            source[split].remove_columns(list(columns)).save_to_disk(str(agent_split))
