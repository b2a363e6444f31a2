"""An MLGym-compatible execution environment for one task: install, baseline, evaluation (docs/verification.md).

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

import json
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel

from gymforge.core import atomic
from gymforge.core.gpus import gpu_count
from gymforge.core.metrics import valid_metric
from gymforge.core.records import Flag
from gymforge.agent.errors import EvaluationFormatError, SubmissionNotFound
from gymforge.tasks.mlgym import (
    DatasetConfig,
    TaskConfig,
    dump_yaml,
    load_dataset_config,
    load_task_config,
    render_description,
    workspace_layout,
)
from gymforge.sandbox import ExecResult, Limits, Mount, SandboxBackend, Session, beneath, make_readable
from gymforge.sandbox.base import WORKDIR
from gymforge.hub.data import quiet_datasets
from gymforge.tasks.datacache import sandbox_view
from gymforge.tasks import posttraining, prepare

SECRETS_ENV = "GYMFORGE_SECRETS"
EVALKIT = Path(__file__).resolve().parents[1] / "evalkit"  # gymforge/evalkit: copied into every evaluation
"""Files that run inside an evaluation's sandboxes (`gymforge/evalkit/README.md`)."""
ANSWERS_FILE = "answers.csv"
_EXCERPT_CHARS = 2000


class EvaluationFailed(EvaluationFormatError):
    """The evaluation did not produce metrics. The message is what the agent may see; `detail` is the
    scorer's whole output, for the task's author (verification) only."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class InstallError(RuntimeError):
    """The task cannot be installed as written (a missing file, a bad hidden column...)."""


class TaskUnsupported(RuntimeError):
    """This host cannot run the task at all (an LM task without GPUs); the message says why."""


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


def default_root(task_yaml: Path) -> Path:
    """The MLGym root holding `configs/tasks/<id>.yaml`."""
    path = Path(task_yaml).resolve()
    if path.parent.name != "tasks" or path.parent.parent.name != "configs":
        raise InstallError(f"{task_yaml} is not at <root>/configs/tasks/<id>.yaml; name the MLGym root explicitly")
    return path.parent.parent.parent


def _excerpt(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _EXCERPT_CHARS else "[...]\n" + text[-_EXCERPT_CHARS:]


def _json_objects(text: str) -> list[dict[str, Any]]:
    """JSON objects that start a line and end one (they may span lines), outermost only."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    pos = covered = 0
    for line in text.splitlines(keepends=True):
        start, pos = pos, pos + len(line)
        i = start + len(line) - len(line.lstrip())
        if start < covered or not text.startswith("{", i):
            continue
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and not re.match(r"[^\r\n]*", text[end:])[0].strip():
            found.append(obj)
            covered = end
    return found


def parse_metrics(output: str) -> dict[str, float]:
    """Metrics from an evaluation's output: the whole output as one JSON object, else the one distinct
    JSON object of numbers among its lines (stray prints around it are fine)."""
    try:
        whole = json.loads(output)
    except json.JSONDecodeError:
        candidates = _json_objects(output)
    else:
        if not isinstance(whole, dict):
            raise EvaluationFormatError(
                f"the evaluation printed {type(whole).__name__} JSON, not an object of metrics: {_excerpt(output)}"
            )
        candidates = [whole]
    if not candidates:
        raise EvaluationFormatError(
            "the evaluation printed no JSON object of metrics (expected a line like {\"accuracy\": 0.9}); "
            f"its output:\n{_excerpt(output)}"
        )
    metrics = [c for c in candidates if c and all(valid_metric(v) is not None for v in c.values())]
    if not metrics:
        bad = {k: v for c in candidates for k, v in c.items() if valid_metric(v) is None}
        what = f"non-numeric values {json.dumps(bad, default=str)[:500]}" if bad else "no metrics ({})"
        raise EvaluationFormatError(f"the evaluation's JSON has {what}; every metric must be a finite number")
    distinct = {json.dumps(m, sort_keys=True) for m in metrics}
    if len(distinct) > 1:
        raise EvaluationFormatError(
            f"the evaluation printed {len(distinct)} different JSON objects of metrics, so which one counts is "
            f"ambiguous: {'; '.join(sorted(distinct))[:1000]}"
        )
    return {k: float(v) for k, v in metrics[0].items()}


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


_ERROR_NAMES = {n for n, v in vars(__import__("builtins")).items() if isinstance(v, type) and issubclass(v, BaseException)}
_ERROR_NAMES.add("SubmissionError")


def _regular(root: Path, rel: str) -> bool:
    try:
        return stat.S_ISREG(beneath.lstat(root, rel).st_mode)
    except OSError:
        return False


def _read_out(out: Path) -> tuple[str, dict[str, Any] | None]:
    """The scorer's captured stdout (ranks in order) and how it ended, from its private directory."""
    texts, status = [], None
    for name in sorted(os.listdir(out), key=lambda n: (len(n), n)):
        if name.startswith("stdout"):
            texts.append(beneath.read_bytes(out, name, 16 << 20).decode(errors="replace"))
        elif name in ("status.json", "status.0.json"):
            try:
                status = json.loads(beneath.read_bytes(out, name, 1 << 16))
            except (OSError, ValueError):
                status = None
    return "".join(texts), status if isinstance(status, dict) else None


def _copy(src: Path, dst: Path, withheld: set[Path]) -> None:
    """Copy a file or a directory tree, leaving out the `withheld` (resolved) paths."""
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


class TaskEnvironment:
    """One task installed in a run directory, with the evaluator the agent loop calls (`TaskEvaluator`).

    `root` (the MLGym root the task's paths are relative to) defaults to the tree holding `task_yaml`.
    `hidden_columns` (split -> columns) applies to the first local dataset (the one at `data/`, a
    Hugging Face dataset saved with `save_to_disk`): the columns are removed from the agent's copy of that
    split and written, with `id` = row position, to `answers.csv` among the secrets.
    `gpus` is the count torchrun gets for LM tasks (None: `gymforge.core.gpus.gpu_count`); the backend must expose them.
    `dataset_cache` is the root of the host's dataset cache (`gymforge.stages.datasets`): datasets the task loads
    from the hub by id (not `is_local`) must be fetched there, and every run sees them read-only, offline.
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
        self.last_evaluation: ExecResult | None = None
        self.last_submission_run: ExecResult | None = None  # the submission's own sandbox in the last evaluation
        self._session: Session | None = None  # the episode's open session: its limits bound the submission too
        self.install_s: float | None = None
        self.workdir = sandbox.workdir(self.workspace)
        # Post-training tasks (tasks/posttraining.py): `base_model` overrides the task's base, `model_cache` holds
        # the base models built or fetched for them.
        try:
            self.post_training = posttraining.load(self.root, self.task, self._layout(), base_model=base_model,
                                                   cache=model_cache)
        except posttraining.PostTrainingError as err:
            raise InstallError(str(err)) from None

    @classmethod
    def from_id(cls, root: Path, task_id: str, **kwargs: Any) -> TaskEnvironment:
        return cls(Path(root) / "configs" / "tasks" / f"{task_id}.yaml", root=root, **kwargs)

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
        return self._data_mounts() + self._workspace_mounts(ro) + self._hub_mounts + base

    def _data_mounts(self) -> list[Mount]:
        return self._workspace_mounts(self._data_targets())

    def _workspace_mounts(self, targets: list[str]) -> list[Mount]:
        return [Mount(host=self.workspace / t, target=t) for t in targets if (self.workspace / t).exists()]

    def _data_targets(self) -> list[str]:
        """Where the task's local data lies in the workspace (read-only mounts in every sandbox)."""
        local = self._local_data_paths()
        return [dest for dest, src in self._layout().items() if src in local]

    @property
    def isolated(self) -> bool:
        """Whether the evaluation follows gymforge's contract: nothing of the agent's code runs where the
        answers are (CSV tasks, whose artefact is data, and evaluators that reach the submission through
        `gymforge_eval`). Otherwise it runs as MLGym runs it, agent code in the scorer's process."""
        if self.task.task_entrypoint == "CSVSubmissionTasks":
            return True
        script = self.root / self._layout().get(self.task.evaluation_paths[0], self.task.evaluation_paths[0])
        try:
            return "gymforge_eval" in script.read_text(errors="replace")
        except OSError:
            return False

    def _layout(self) -> dict[str, str]:
        return workspace_layout(self.task, self.datasets)

    def _local_data_paths(self) -> list[str]:
        return [d.data_path for d in self.datasets if d.is_local]

    def _require_gpus(self) -> None:
        if self.task.task_entrypoint == "LMSubmissionTasks" and self.gpus == 0:
            raise TaskUnsupported(
                f"{self.task.id} is an LMSubmissionTasks task, run with `torchrun --nproc_per_node=<gpus>`, "
                "and this host has no GPU (nvidia-smi -L and torch.cuda found none)"
            )

    # -- install --------------------------------------------------------------------------------

    def prepare_data(self) -> list[Path]:
        """Make the task's missing local data that MLGym makes with the task's own helper scripts
        (`data/<id>/_helpers/*.py`), in this environment's sandbox under its limits, as the benchmark does
        (`gymforge.tasks.prepare.prepare_task_data`, the one function every entry point goes through);
        returns the directories made. `install` calls it first."""
        try:
            return prepare.prepare_task_data(self.root, self.task.id, self._local_data_paths(), sandbox=self.sandbox,
                                             limits=self.limits)
        except (prepare.PrepareError, OSError) as err:
            raise InstallError(f"{self.task_yaml}: its local data could not be made with MLGym's helper: {err}") from err

    def install(self) -> Path:
        """A fresh workspace and secrets directory; returns the workspace. Local data that MLGym's helpers make
        is made first when missing (`prepare_data`)."""
        self._require_gpus()
        self.prepare_data()
        t0 = time.monotonic()
        for d in (self.workspace, self.secrets_dir):
            _remove(d)
        self.workspace.mkdir(parents=True)
        withheld = {(self.root / p).resolve() for p in self.task.secret_files}
        self._refuse_symlinks()
        if self.has_secrets:
            self.secrets_dir.mkdir()
            self._store_secrets()
        for dest, src in self._layout().items():
            source = self.root / src
            if not source.exists():
                raise InstallError(
                    f"{self.task_yaml}: {src} (copied to the workspace as {dest}) does not exist under {self.root}"
                )
            _copy(source, self.workspace / dest, withheld)
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
        sources = [*self._layout().values(), *self.task.secret_files]
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
            _copy(source, dest, set())

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

    # -- sessions and runs ----------------------------------------------------------------------

    def open_session(self) -> Session:
        """The agent's persistent shell on the workspace: data and evaluation read-only, no secrets."""
        self._session = self.sandbox.open(self.workspace, limits=self.limits, mounts=self.mounts, env=self.run_env)
        return self._session

    def _script(self, rel: str) -> str:
        return f"{self.workdir}/{rel}"

    def _launcher(self) -> list[str]:
        if self.task.task_entrypoint == "LMSubmissionTasks":
            return ["torchrun", f"--nproc_per_node={self.gpus}", "--standalone"]
        return ["python"]

    def run_baseline(self) -> BaselineReport:
        """Run the baseline like MLGym (`python <baseline>`, torchrun for LM tasks), then evaluate its artefact."""
        self._require_gpus()
        if not self.task.baseline_paths:
            raise InstallError(f"{self.task_yaml}: baseline_paths is empty; there is no baseline to run")
        argv = [*self._launcher(), self._script(self.task.baseline_paths[0])]
        result = self.sandbox.run_once(
            self.workspace, argv, timeout=self.timeout, limits=self.limits, mounts=self.mounts, env=self.run_env
        )
        if result.timed_out:
            raise BaselineFailed(
                f"the baseline ran past training_timeout ({self.timeout:g} s); output tail:\n{_excerpt(result.output)}",
                result,
            )
        if result.exit_code != 0:
            raise BaselineFailed(
                f"the baseline `{' '.join(argv)}` exited with status {result.exit_code}; output tail:\n"
                f"{_excerpt(result.output)}",
                result,
            )
        metrics, artefact = self.evaluate()
        assert self.last_evaluation is not None
        return BaselineReport(metrics=metrics, artefact=artefact, baseline=result, evaluation=self.last_evaluation,
                              install_s=self.install_s)

    def _artefact(self) -> str | None:
        """The artefact's path in the workspace (docs/integrity.md); None for LM tasks, which have none to check."""
        entrypoint = self.task.task_entrypoint
        if self.post_training is not None:
            return self.post_training.artefact(self.workspace)
        if entrypoint == "CSVSubmissionTasks":
            if not _regular(self.workspace, "submission.csv"):
                raise SubmissionNotFound(
                    "no submission.csv in the workspace (a regular file, not a symlink); write your predictions there"
                )
            return "submission.csv"
        if entrypoint == "ModelSubmissionTasks":
            skip = {"data", *self._data_targets()}
            configs = sorted(
                (rel for rel, _ in beneath.walk_files(self.workspace)
                 if rel.endswith(".yaml") and not any(rel == t or rel.startswith(t + "/") for t in skip)),
                key=lambda p: (p.count("/"), p),
            )
            if not configs:
                raise SubmissionNotFound("no *.yaml model config in the workspace (outside data/); save one for your model")
            return configs[0]
        if entrypoint == "LMSubmissionTasks":
            return None
        return self.task.baseline_paths[0] if self.task.baseline_paths else "target.py"

    def _argv(self, workdir: str, artefact: str | None) -> list[str]:
        """The evaluation's arguments after the script, per entrypoint as MLGym passes them, in a sandbox's view."""
        if self.task.task_entrypoint == "CSVSubmissionTasks":
            return ["--submission_file", f"{workdir}/{artefact}"]
        if self.task.task_entrypoint == "ModelSubmissionTasks":
            return ["--config_fname", f"{workdir}/{artefact}"]
        return []

    def evaluate(self) -> tuple[dict[str, float], str]:
        """(metrics, artefact) of the workspace's current artefact.

        The evaluation never runs in the agent's workspace. The host copies what it needs out of it (regular
        files only, never through a symlink, size-capped) into a private directory that becomes the scorer's
        /workspace, together with the task's pristine evaluation script and starter files and the read-only
        data; the answers are mounted at /answers. With gymforge's contract (`isolated`) nothing of the
        agent's code is importable there (`python -I`, only the artefact copied), and a Python or model
        submission runs in a second sandbox without the answers, reached through `gymforge_eval`. The metrics
        leave through a directory only the scorer writes. The agent is shown the metrics, or the error's
        class and its own code's output, never the output of a process that had the answers.
        """
        self._require_gpus()
        artefact = self._artefact()
        isolated = self.isolated
        entrypoint = self.task.task_entrypoint
        serve = isolated and entrypoint in ("PythonSubmissionTasks", "ModelSubmissionTasks", "LMSubmissionTasks")
        ev = self.run_dir / ".eval"
        _remove(ev)
        ev.mkdir(mode=0o755)
        try:
            scorer_ws = ev / "scorer"
            whole = not isolated or entrypoint == "LMSubmissionTasks"
            only = None if whole else ([artefact] if artefact and entrypoint != "PythonSubmissionTasks" else [])
            self._snapshot(scorer_ws, only, artefact)
            self._place_pristine(scorer_ws, everything=isolated)
            if serve and self.post_training is not None:  # only the model, checked and rebuilt from the base
                self._snapshot(ev / "submission", [posttraining.ARTEFACT], artefact)
                self.post_training.admit(ev / "submission")
            elif serve:
                self._snapshot(ev / "submission", None, artefact)
            make_readable(ev)  # the sandboxes' users own nothing here and only read it
            result, metrics_text, status, server = self._score(ev, scorer_ws, artefact, isolated, serve)
        finally:
            _remove(ev)
        self.last_evaluation, self.last_submission_run = result, server
        shown = f"{self.workdir}/{artefact}" if artefact else self.workdir
        if status is None or status.get("exit") != 0 or result.timed_out or result.limit:
            raise self._failure(result, status, server, shown, isolated)
        try:
            return parse_metrics(metrics_text), shown
        except EvaluationFormatError as err:
            raise EvaluationFailed(str(err) if not self.has_secrets else
                                   "the evaluation printed no readable metrics", detail=result.output) from None

    def _snapshot(self, dest: Path, only: list[str] | None, artefact: str | None) -> None:
        try:
            left_out = beneath.copy_tree(self.workspace, dest, max_bytes=self.limits.disk_mb << 20,
                                         skip=frozenset(self._data_targets()), only=only)
        except beneath.CopyLimitError as err:
            raise EvaluationFailed(f"the workspace is too large to evaluate ({err.strerror}; cap: "
                                   f"{self.limits.disk_mb} MiB)") from None
        if artefact and artefact in left_out:
            raise SubmissionNotFound(f"{artefact} is a symlink or not a regular file; write the artefact as a regular file")
        for t in self._data_targets():  # mount points for the read-only data
            (dest / t).mkdir(parents=True, exist_ok=True)

    def _place_pristine(self, dest: Path, *, everything: bool) -> None:
        """The task's own files (never the agent's versions): the evaluation script, and with `everything`
        all starter code (an isolated scorer imports nothing of the agent's, but may import the task's)."""
        withheld = {(self.root / p).resolve() for p in self.task.secret_files}
        local = set(self._local_data_paths())
        layout = self._layout()
        wanted = [d for d, src in layout.items() if src not in local] if everything else []
        wanted += [e for e in self.task.evaluation_paths[:1] if e not in wanted]
        for rel in wanted:
            src = self.root / layout.get(rel, rel)
            target = dest / rel
            if target.exists() or target.is_symlink():
                _remove(target)
            if src.exists():
                _copy(src, target, withheld)

    def _places(self, ws: Path) -> dict[str, str]:
        """Where the scorer's fixed places show in a sandbox on `ws`: fixed paths where the backend builds the
        view (bwrap, docker), links inside the workspace under the weak local confinements."""
        names = ("kit", "out", "channel", "answers")
        if self.sandbox.workdir(ws) == WORKDIR:
            return {n: f"/gymforge-{n}" if n != "answers" else "/answers" for n in names}
        return {n: str(ws.resolve() / f".gymforge-{n}") for n in names}

    def _score(
        self, ev: Path, scorer_ws: Path, artefact: str | None, isolated: bool, serve: bool
    ) -> tuple[ExecResult, str, dict[str, Any] | None, ExecResult | None]:
        out = ev / "out"
        out.mkdir()
        at = self._places(scorer_ws)
        data = self._data_mounts()
        hub, hub_env = self._private_hub(ev / "hf-scorer")
        mounts = [*data, *hub, Mount(host=EVALKIT, target=at["kit"]),
                  Mount(host=out, target=at["out"], read_only=False)]
        flags = []
        if self.has_secrets:
            mounts.append(Mount(host=self.secrets_dir, target=at["answers"]))
            flags += ["--answers", at["answers"]]
        server: list[ExecResult] = []
        thread = None
        if serve:
            channel = ev / "channel"
            channel.mkdir()
            channel.chmod(0o1777)  # the two sandboxes may run as different users
            mounts.append(Mount(host=channel, target=at["channel"], read_only=False))
            flags += ["--channel", at["channel"]]
            thread = threading.Thread(target=self._serve, args=(ev, channel, data, server), daemon=True)
            thread.start()
        workdir = self.sandbox.workdir(scorer_ws)
        script = f"{workdir}/{self.task.evaluation_paths[0]}"
        if self.task.task_entrypoint == "LMSubmissionTasks":
            # -I: `-m` would otherwise put the cwd (the agent's files) first on sys.path; the workers torchrun
            # starts get PYTHONSAFEPATH (-P) from the environment.
            launcher = ["python", "-I" if isolated else "-P", "-m", "torch.distributed.run",
                        f"--nproc_per_node={self.gpus}", "--standalone"]
        else:
            launcher = ["python", "-I"] if isolated else ["python"]
        argv = [*launcher, f"{at['kit']}/score.py", at["out"], *flags, *([] if isolated else ["--mlgym"]), script]
        argv += self._argv(workdir, artefact)
        try:
            result = self.sandbox.run_once(scorer_ws, argv, timeout=self.timeout, limits=self.limits, mounts=mounts,
                                           env={**hub_env, "PYTHONSAFEPATH": "1"}, read_only=isolated)
        finally:
            if thread is not None:
                try:  # the submission shares this directory: never through a link it planted
                    beneath.write_bytes(ev / "channel", "done", b"", create=True)
                except OSError:
                    pass  # it sabotaged its own shutdown: its sandbox ends at the timeout
                thread.join()
        metrics, status = _read_out(out)
        return result, metrics, status, (server[0] if server else None)

    def _serve(self, ev: Path, channel: Path, data: list[Mount], sink: list[ExecResult]) -> None:
        """The submission's sandbox: the agent's files (a read-only snapshot), the data, no answers."""
        ws = ev / "submission"
        at = self._places(ws)
        hub, hub_env = self._private_hub(ev / "hf-submission")
        mounts = [*data, *hub, Mount(host=EVALKIT, target=at["kit"]),
                  Mount(host=channel, target=at["channel"], read_only=False)]
        argv = ["python", "-I", f"{at['kit']}/serve.py", at["channel"]]
        session = self._session if self._session is not None and not getattr(self._session, "_closed", True) else None
        sink.append(self.sandbox.run_once(ws, argv, timeout=self.timeout, limits=self.limits, mounts=mounts,
                                          env=hub_env, read_only=True, within=session))

    def _private_hub(self, home: Path) -> tuple[list[Mount], dict[str, str]]:
        """The hub datasets again, with an HF_HOME of this sandbox's own (never the session's writable one)."""
        hub_ids = [d.data_path for d in self.datasets if not d.is_local]
        if not hub_ids or self.dataset_cache is None:
            return [], {}
        return sandbox_view(self.dataset_cache, hub_ids, home, fixed=self.workdir == WORKDIR)

    def _failure(
        self, result: ExecResult, status: dict[str, Any] | None, server: ExecResult | None, shown: str, isolated: bool
    ) -> Exception:
        if result.timed_out:
            what = f"the evaluation ran past training_timeout ({self.timeout:g} s)"
        elif result.limit:
            what = f"the evaluation was stopped by a sandbox limit ({result.limit})"
        else:
            error = (status or {}).get("error")
            # A class name, never a message; and only a known one (a name can carry data too).
            error = error if error in _ERROR_NAMES else ("an exception" if error else f"exit status {result.exit_code}")
            what = f"the evaluation of {shown} failed ({error})"
        message = what
        if server is not None and server.output.strip() and not self.has_secrets:
            # Only without held-out inputs: the scorer hands them to the submission, which could print them.
            message += f"; output of your code during the evaluation:\n{_excerpt(server.output)}"
        elif not self.has_secrets and not isolated:
            message += f"; output tail (stdout and stderr):\n{_excerpt(result.output)}"
        return EvaluationFailed(message, detail=result.output)

    def audit_checks(self) -> list[Callable[[], list[Flag]]]:
        """Checks of this task's kind that the audit runs after every step (gymforge.agent.audit): for post-training
        tasks, the agent's own data files against the held-out prompts."""
        if self.post_training is None or not self.secrets_dir.is_dir():
            return []
        return [self.post_training.watch(self.workspace, self.secrets_dir, self._data_targets())]

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
        referenced = [f"data/{task.id}", *task.starter_code, *self._local_data_paths(), *task.secret_files]
        referenced += [p for p in (task.requirements_path, task.sample_submission, task.memory_path) if p]
        with atomic.directory(dest) as tmp:
            atomic.write_text(tmp / "configs" / "tasks" / f"{task.id}.yaml", dump_yaml(task))
            for entry in task.dataset_configs:
                _copy(self.root / "configs" / entry, tmp / "configs" / entry, set())
            for rel in dict.fromkeys(referenced):
                if (self.root / rel).exists():
                    _copy(self.root / rel, tmp / rel, set())
        return dest
