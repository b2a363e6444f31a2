"""Shared machinery of the attack suite (tests/sandbox/test_attacks.py): entrypoints, an attacker's episode, canaries.

An `Episode` is one installed task with the agent's session open on it. Everything the agent would see
(shell output, file-tool observations, evaluation observations) is collected in `Episode.visible`; the
checks then look there, in the workspace and in the shared HF_HOME for the held-out answers, and at the
canary files outside the workspace for any read or change.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import stat
import sys
import textwrap
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import gymforge.benchmark
from gymforge.agent import Agent, AgentTask, EvaluationFormatError, SubmissionNotFound
from gymforge.tasks.environment import TaskEnvironment
from gymforge.tools.run_task import ScriptedModel
from gymforge.sandbox import ExecResult, Limits, SandboxBackend

REPO = Path(__file__).resolve().parents[2]
BUILTIN = Path(gymforge.benchmark.__file__).resolve().parent / "tasks"
FIXTURES = REPO / "tests" / "fixtures" / "attacks"
LIMITS = Limits(memory_mb=2048, cpu_seconds=600, max_processes=256)


@dataclass(frozen=True)
class Entry:
    """One entrypoint of the suite and the task that stands for it."""

    name: str
    root: Path
    task_id: str
    gpus: int
    honest: str | None  # shell command that makes the honest artefact (None: the starter code is it)
    module: str | None  # the submission module the evaluation imports (code entrypoints)
    metric: str
    perfect: float  # the value a counterfeit would claim
    answers: str  # the secret file's name

    @property
    def yaml(self) -> Path:
        return self.root / "configs" / "tasks" / f"{self.task_id}.yaml"

    @property
    def secret_source(self) -> Path:
        return self.root / "data" / self.task_id / self.answers

    @property
    def perfect_json(self) -> str:
        return json.dumps({self.metric: self.perfect})


ENTRIES = {
    "csv": Entry("csv", BUILTIN, "blobClustering", 0, "python baseline.py", None, "ari", 1.0, "test_labels.csv"),
    "python": Entry("python", BUILTIN, "graphColoring", 0, None, "coloring", "colors", 1.0, "test_graphs.json"),
    "model": Entry("model", FIXTURES, "polyModel", 0, "python baseline.py", "model", "mse", 0.0, "heldout.csv"),
    # The built-in model task: its model is a YAML config the evaluator reads itself, no agent code to submit.
    "kde": Entry("kde", BUILTIN, "kernelDensityBandwidth", 0, "python baseline.py", None, "nll", 0.0, "heldout.csv"),
    "lm": Entry("lm", FIXTURES, "bigramLM", 1, "python baseline.py", "lm", "val_loss", 0.0, "heldout.txt"),
}


def answer_markers(entry: Entry) -> list[str]:
    """Strings that appear in what the agent sees only if the held-out answers leaked."""
    raw = entry.secret_source.read_text()
    markers = [raw[40:200], raw.encode()[:48].hex()]
    if entry.name == "python":
        graphs = json.loads(raw)
        markers += [json.dumps(g["edges"])[:120] for g in graphs[:3]]
    if entry.name == "lm":
        markers += ["quokka", "zephyr", "marmalade", "xylophone"]  # words only the held-out text has
    return markers


def heldout_input_markers(entry: Entry) -> list[str]:
    """The held-out inputs the evaluation passes to the submission (for these tasks they are the secret)."""
    raw = entry.secret_source.read_text()
    if entry.name == "python":
        return [json.dumps(g["edges"])[:120] for g in json.loads(raw)[:3]]
    if entry.name == "lm":
        return ["quokka", "zephyr", "marmalade", "xylophone"]
    return []


# -- canaries: host files outside the workspace, root-owned --------------------------------------------


class Canaries:
    """Root-owned files outside the workspace that no attack may read, change, chown or add to."""

    def __init__(self, where: Path) -> None:
        self.dir = where
        self.token = f"CANARY-{uuid.uuid4().hex}"
        where.mkdir(parents=True, exist_ok=True)
        (where / "sub").mkdir(exist_ok=True)
        files = {"canary.txt": 0o644, "secret.txt": 0o600, "sub/inner.txt": 0o644, "f.txt": 0o644}
        for rel, mode in files.items():
            p = where / rel
            p.write_text(f"{self.token} {rel}\n")
            p.chmod(mode)
        where.chmod(0o755)
        self.before = self.state()

    def state(self) -> dict[str, tuple[Any, ...]]:
        out = {}
        for p in sorted([self.dir, *self.dir.rglob("*")]):
            st = p.lstat()
            data = p.read_bytes() if stat.S_ISREG(st.st_mode) else b""
            out[str(p.relative_to(self.dir))] = (
                stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns,
                hashlib.sha256(data).hexdigest(),
            )
        return out

    def changes(self) -> list[str]:
        after = self.state()
        out = [f"{k}: {self.before.get(k)} -> {after.get(k)}" for k in sorted(set(self.before) | set(after))
               if self.before.get(k) != after.get(k)]
        return out


# -- the attacker's episode -----------------------------------------------------------------------------


@dataclass
class Outcome:
    metrics: dict[str, float] | None
    error: str | None
    seen: str  # what the agent is shown


@dataclass
class Episode:
    entry: Entry
    backend: SandboxBackend
    tmp: Path
    limits: Limits = field(default_factory=lambda: LIMITS)
    task_yaml: Path | None = None
    root: Path | None = None
    dataset_cache: Path | None = None
    visible: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.canaries = Canaries(self.tmp / "host")
        self.env = TaskEnvironment(
            self.task_yaml or self.entry.yaml, root=self.root or self.entry.root, sandbox=self.backend,
            run_dir=self.tmp / "run", limits=self.limits, gpus=self.entry.gpus, dataset_cache=self.dataset_cache,
        )
        self.env.install()
        self.visible.append(self.env.description)
        self.session = self.env.open_session()
        task = AgentTask(id=self.env.task.id, description=self.env.description, baseline=None,
                         training_timeout=self.env.timeout)
        self.agent = Agent(ScriptedModel(["submit"], "attacker"), self.session, self.env, task,
                           mounts=self.env.mounts, out_dir=self.tmp / "traj")

    # what the agent does

    def sh(self, command: str, timeout: float = 120) -> ExecResult:
        r = self.session.run(command, timeout)
        self.visible.append(r.output)
        return r

    def write(self, rel: str, text: str) -> None:
        """Write a file the way the agent would: from its shell, as its user."""
        data = base64.b64encode(textwrap.dedent(text).encode()).decode()
        r = self.sh(f"mkdir -p \"$(dirname '{rel}')\" && echo {data} | base64 -d > '{rel}'", 60)
        assert r.exit_code == 0, r.output

    def tool(self, action: str) -> str:
        obs = self.agent.files.run(action, self.session.cwd)
        self.visible.append(obs)
        return obs

    def make_honest(self) -> None:
        if self.entry.honest:
            r = self.sh(self.entry.honest, 300)
            assert r.exit_code == 0, r.output

    def evaluate(self, timeout: float = 240) -> Outcome:
        """The evaluation as the agent's `validate` sees it; a hang past `timeout` fails the test."""
        box: dict[str, Any] = {}

        def go() -> None:
            try:
                box["metrics"] = self.env.evaluate()[0]
            except (EvaluationFormatError, SubmissionNotFound) as err:
                box["error"] = f"{type(err).__name__}: {err}"
            except BaseException as err:  # noqa: BLE001 - any other exception is a crash, reported as such
                box["crash"] = err

        t = threading.Thread(target=go, daemon=True)
        t.start()
        t.join(timeout)
        assert not t.is_alive(), f"the evaluation hung for more than {timeout} s"
        if "crash" in box:
            raise AssertionError(f"the evaluation crashed instead of failing cleanly: {box['crash']!r}") from box["crash"]
        metrics = box.get("metrics")
        seen = f"Evaluation Score: {json.dumps(metrics)}" if metrics is not None else box["error"]
        self.visible.append(seen)
        return Outcome(metrics, box.get("error"), seen)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a session an attack broke still must not fail the cleanup
            self.session.close()

    # what the checks look at

    def agent_readable_text(self) -> str:
        """Everything the agent saw, plus what it could still read: the workspace and the shared HF_HOME."""
        parts = list(self.visible)
        for d in [self.env.workspace, self.env.run_dir / "hf-home"]:
            if not d.is_dir():
                continue
            for p in d.rglob("*"):
                try:
                    if p.is_file() and not p.is_symlink() and p.stat().st_size < 5 << 20:
                        parts.append(p.read_text(errors="replace"))
                except OSError:
                    continue
        return "\n".join(parts)


def assert_no_leak(ep: Episode, extra_markers: list[str] = ()) -> None:
    """No held-out answer in anything the agent saw or can read; no canary read, changed or added."""
    text = ep.agent_readable_text()
    for m in [*answer_markers(ep.entry), *extra_markers]:
        assert m not in text, f"held-out data reached the agent: {m[:60]!r}"
    assert ep.canaries.token not in text, "a host file outside the workspace was read into the agent's view"
    changes = ep.canaries.changes()
    assert not changes, f"host files outside the workspace changed: {changes}"


def assert_honest(outcome: Outcome, honest: dict[str, float] | None) -> None:
    """The score equals the honest one, or the evaluation failed cleanly (an error the agent is shown).
    `honest` None: the honest evaluation cannot succeed here, so any score is counterfeit."""
    if honest is None:
        assert outcome.metrics is None, f"counterfeit score {outcome.metrics} (the honest evaluation cannot succeed)"
    if outcome.metrics is None:
        assert outcome.error, outcome
        return
    assert set(outcome.metrics) == set(honest) and all(
        abs(outcome.metrics[k] - honest[k]) <= 1e-6 * max(1.0, abs(honest[k])) for k in honest
    ), f"counterfeit score {outcome.metrics} (honest {honest})"


def host_paths(tmp: Path) -> list[str]:
    """Host paths the agent must never see: the test's directory (run dir, secrets, canaries), the checkout,
    and the host Python prefix."""
    paths = {str(tmp), str(tmp.resolve()), str(REPO), str(Path(sys.prefix).resolve())}
    return sorted(p for p in paths if p not in ("/", "/usr"))


# -- task variants ---------------------------------------------------------------------------------------


def with_hub_dataset(entry: Entry, dest: Path, dataset_id: str) -> tuple[Path, Path]:
    """A copy of the entry's task tree whose task also loads `dataset_id` from the hub: its runs get the shared
    writable HF_HOME. Returns (task yaml, root)."""
    root = dest / "tree"
    shutil.copytree(entry.root / "data" / entry.task_id, root / "data" / entry.task_id)
    task = yaml.safe_load(entry.yaml.read_text())
    (root / "configs" / "tasks").mkdir(parents=True)
    (root / "configs" / "datasets").mkdir(parents=True)
    for rel in task.get("dataset_configs", []):
        src = entry.root / "configs" / rel
        (root / "configs" / rel).write_text(src.read_text())
        data_path = yaml.safe_load(src.read_text()).get("data_path", "")
        if data_path and (entry.root / data_path).exists() and not (root / data_path).exists():
            shutil.copytree(entry.root / data_path, root / data_path)
    (root / "configs" / "datasets" / "hubExtra.yaml").write_text(yaml.safe_dump(
        {"name": "hubExtra", "description": "an extra hub dataset", "data_path": dataset_id, "is_local": False}))
    task["dataset_configs"] = [*task.get("dataset_configs", []), "datasets/hubExtra.yaml"]
    if "{dataset_docs}" not in task["description"]:
        task["description"] += "\n\n{dataset_docs}"
    path = root / "configs" / "tasks" / f"{entry.task_id}.yaml"
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    return path, root


def is_root() -> bool:
    return os.geteuid() == 0
