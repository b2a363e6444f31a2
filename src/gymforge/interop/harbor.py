"""Harbor task folders, out and in (docs/interop.md).

Out: `export_task` writes one verified gymforge task as a Harbor task folder in the format of harbor 0.25
(`task.toml` schema_version "1.4", read by Harbor's `TaskConfig`):

    <task id>/
      task.toml                timeouts, cpus, memory, storage, gpus; a separate verifier; the artefact carried to it
      instruction.md           the task's own text, as the agent loop shows it, and where its files are
      environment/Dockerfile   FROM a configurable base image; the agent's files in /app
      environment/app/         the workspace as gymforge installs it: starter files and the data the agent may see
      tests/Dockerfile         the verifier's own image (the same base)
      tests/test.sh            runs verify.py, which writes /logs/verifier/reward.json
      tests/verify.py          (gymforge.interop.harbor_verifier, standard library only)
      tests/score.py           gymforge's scorer launcher (evalkit/score.py)
      tests/task/              the task's pristine evaluation script, starter files and data
      tests/answers/           the held-out answers (secret files, hidden columns); never in environment/
      tests/meta.json          metric, direction, baseline, artefact, the evaluation's arguments
      solution/solve.sh        reproduces the baseline

Only tasks whose artefact is data can leave this way today (CSVSubmissionTasks): their evaluation reads nothing of
the agent's code, so a verifier container with the answers is safe. The others are refused with the reason.

In: `HarborTask` reads a Harbor task folder (task.toml, instruction.md, environment/Dockerfile's WORKDIR and COPY
lines, tests/, solution/), and `run_harbor_task` runs it in gymforge's sandbox as Harbor's trial does: the agent's
step (here: the task's `solve.sh`, or nothing) in the agent's sandbox with the environment's files at the task's
workdir, then `tests/test.sh` in a fresh sandbox that sees the agent's artefacts, `/tests` and `/logs/verifier`;
the reward is what test.sh wrote. A task that declares GPUs gets them from the backend (Harbor's own docker
environment refuses such tasks).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymforge.agent.errors import SubmissionNotFound
from gymforge.agent.loop import Agent, AgentConfig, AgentTask
from gymforge.core import atomic
from gymforge.core.config import GymforgeConfig
from gymforge.core.records import VerificationReport
from gymforge.interop import harbor_verifier
from gymforge.interop.trl_env import task_rows
from gymforge.rl.rollouts import load_task
from gymforge.sandbox import ExecResult, Limits, Mount, SandboxBackend
from gymforge.tasks.environment import EVALKIT, TaskEnvironment
from gymforge.tasks.episode import sandbox_for

SCHEMA_VERSION = "1.4"  # task.toml's schema_version in harbor 0.25.0 (harbor/models/task/config.py, TaskConfig)
HARBOR_VERSION = "0.25.0"
WORKDIR = "/app"
DEFAULT_IMAGE = "python:3.11-slim"
SUPPORTED = ("CSVSubmissionTasks",)


class HarborExportError(ValueError):
    """The task cannot be written as a Harbor task folder; the message says why."""


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def dump_toml(data: dict[str, Any]) -> str:
    """TOML of a dict whose values are scalars, lists of scalars or (nested) tables of them."""
    lines: list[str] = []

    def table(prefix: str, body: dict[str, Any]) -> None:
        scalars = {k: v for k, v in body.items() if not isinstance(v, dict) and v is not None}
        if prefix and scalars:
            lines.append(f"\n[{prefix}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
        for k, v in body.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}" if prefix else k, v)

    table("", data)
    return "\n".join(lines).lstrip("\n") + "\n"


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f"{path.relative_to(folder).as_posix()}\0{path.stat().st_mode & 0o111}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _carry(src: Path, dst: Path) -> None:
    """An artefact the agent left (a folder or a file; nothing when it left none) copied to where the verifier reads
    it, replacing what was there."""
    if src.is_dir():
        shutil.rmtree(dst, ignore_errors=True)
        _copy_tree(src, dst)
    elif src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)


def _copy_tree(src: Path, dst: Path) -> None:
    """Regular files and folders of `src` (symlinks left out), as plain files gymforge wrote."""
    dst.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.rglob("*")):
        if path.is_symlink():
            continue
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@dataclass
class Exported:
    task_id: str
    path: Path
    written: bool  # False: the folder was already there with the same contents


def export_task(task_yaml: Path, dest: Path, *, sandbox: SandboxBackend, root: Path | None = None,
                baseline: dict[str, float] | None = None, metric: str = "", higher_is_better: bool = True,
                hidden_columns: dict[str, list[str]] | None = None, limits: Limits | None = None,
                base_image: str = DEFAULT_IMAGE, scale_floor: float = 0.01, gpus: int = 0) -> Exported:
    """Write the Harbor task folder of one task at `dest` (atomically; left untouched when its contents would not
    change)."""
    limits = limits or Limits()
    with tempfile.TemporaryDirectory(prefix="harbor-export-") as scratch:
        env = TaskEnvironment(Path(task_yaml), root=root, sandbox=sandbox, run_dir=Path(scratch) / "run",
                              limits=limits, hidden_columns=hidden_columns, gpus=gpus)
        task = env.task
        if task.task_entrypoint not in SUPPORTED:
            raise HarborExportError(f"{task.id}: a {task.task_entrypoint} task cannot be exported yet: only tasks "
                                    f"whose artefact is data ({', '.join(SUPPORTED)}) run in a verifier container "
                                    "that holds the answers without running the agent's code")
        if any(not d.is_local for d in env.datasets):
            raise HarborExportError(f"{task.id}: loads a dataset from the hub by id; only local data is exported")
        env.install()
        name = metric or (next(iter(baseline)) if baseline else "")
        build = Path(scratch) / "folder"
        app = build / "environment" / "app"
        _copy_tree(env.workspace, app)
        (build / "environment" / "Dockerfile").write_text(
            f"FROM {base_image}\nWORKDIR {WORKDIR}\nCOPY app/ {WORKDIR}/\n")
        tests = build / "tests"
        env.scoring._place_pristine(tests / "task", everything=True)  # the task's own files, never an agent's
        for target in env.installation.data_targets():
            _copy_tree(env.workspace / target, tests / "task" / target)
        (tests / "answers").mkdir(parents=True)
        if env.secrets_dir.is_dir():
            _copy_tree(env.secrets_dir, tests / "answers")
        shutil.copyfile(EVALKIT / "score.py", tests / "score.py")
        shutil.copyfile(harbor_verifier.__file__, tests / "verify.py")
        meta = {"task_id": task.id, "entrypoint": task.task_entrypoint, "artefact": "submission.csv",
                "script": task.evaluation_paths[0], "argv": ["--submission_file", "{scorer}/submission.csv"],
                "metric": name, "higher_is_better": higher_is_better,
                "baseline": (baseline or {}).get(name), "scale_floor": scale_floor, "timeout_s": env.timeout}
        (tests / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        (tests / "Dockerfile").write_text(f"FROM {base_image}\nCOPY . /tests/\n")
        _script(tests / "test.sh", "#!/bin/bash\n# The task's own evaluation of the artefact in /app; writes "
                "/logs/verifier/reward.json.\nmkdir -p /logs/verifier\n"
                f"exec python3 /tests/verify.py /tests {WORKDIR} /logs/verifier\n")
        baseline_script = task.baseline_paths[0] if task.baseline_paths else None
        if baseline_script is None:
            raise HarborExportError(f"{task.id}: no baseline_paths, so there is no solution to write")
        _script(build / "solution" / "solve.sh", "#!/bin/bash\n# The task's baseline, as gymforge verified it.\n"
                f"set -e\ncd {WORKDIR}\npython3 {shlex.quote(baseline_script)}\n")
        (build / "instruction.md").write_text(
            f"{env.description.rstrip()}\n\nYour working directory is `{WORKDIR}`: the task's files are there, and "
            f"the evaluation reads `{WORKDIR}/submission.csv`.\n")
        config = {
            "schema_version": SCHEMA_VERSION,
            "source": "gymforge",
            "artifacts": [WORKDIR],
            "task": {"name": f"gymforge/{task.id}", "description": task.name or task.id},
            "metadata": {"gymforge_task": task.id, "metric": name, "higher_is_better": higher_is_better,
                         **({"baseline": float(baseline[name])} if baseline and name in baseline else {})},
            "verifier": {"timeout_sec": float(env.timeout) + 60.0, "environment_mode": "separate",
                         "network_mode": "no-network"},
            "agent": {"timeout_sec": float(env.timeout) * 4},
            "environment": {"network_mode": "no-network", "workdir": WORKDIR, "cpus": 1,
                            "memory_mb": int(limits.memory_mb), "storage_mb": int(limits.disk_mb), "gpus": int(gpus)},
        }
        (build / "task.toml").write_text(dump_toml(config))
        dest = Path(dest)
        if dest.is_dir() and _digest(dest) == _digest(build):
            return Exported(task.id, dest, False)
        with atomic.directory(dest) as tmp:
            _copy_tree(build, tmp)
            for script in (tmp / "tests" / "test.sh", tmp / "solution" / "solve.sh"):
                script.chmod(0o755)
        return Exported(task.id, dest, True)


def export_results(results: Path, out: Path, *, sandbox: SandboxBackend, micro: bool = False,
                   base_image: str = DEFAULT_IMAGE, limits: Limits | None = None,
                   scale_floor: float = 0.01) -> tuple[list[Exported], dict[str, str]]:
    """Every verified environment of a results directory (`micro`: its micro variants) as Harbor task folders under
    `out/<task id>`; (what was exported, {slot: why it was not})."""
    done, refused = [], {}
    for row in task_rows(results, micro=micro):
        try:
            done.append(export_task(
                Path(row["task"]), Path(out) / Path(row["task"]).stem, sandbox=sandbox, root=Path(row["root"]),
                baseline=json.loads(row["baseline"]) if row["baseline"] else None, metric=row["metric"],
                higher_is_better=row["higher_is_better"], base_image=base_image, limits=limits,
                hidden_columns=json.loads(row["hidden_columns"]) if row["hidden_columns"] else None,
                scale_floor=scale_floor))
        except HarborExportError as err:
            refused[row["slot"]] = str(err)
    return done, refused


# -- in: a Harbor task folder run in gymforge's sandbox -------------------------------------------------------

_COPY = re.compile(r"^\s*(?:COPY|ADD)\s+(?!--from)(?:--\S+\s+)*(.+?)\s*$", re.I)
_WORKDIR = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.I)


@dataclass
class HarborTask:
    """A Harbor task folder as gymforge reads it (the fields of task.toml it acts on)."""

    folder: Path
    instruction: str
    workdir: str
    gpus: int
    cpus: float | None
    memory_mb: int | None
    agent_timeout_s: float
    verifier_timeout_s: float
    separate_verifier: bool
    artifacts: list[str]
    copies: list[tuple[str, str]]  # (source under environment/, destination in the container) of COPY lines
    ignored: list[str] = field(default_factory=list)  # Dockerfile lines the local backend does not carry out

    @classmethod
    def read(cls, folder: Path) -> HarborTask:
        folder = Path(folder)
        config = tomllib.loads((folder / "task.toml").read_text())
        environment, verifier, agent = (config.get(k, {}) for k in ("environment", "verifier", "agent"))
        workdir, copies, ignored = None, [], []
        dockerfile = folder / "environment" / "Dockerfile"
        for line in (dockerfile.read_text().splitlines() if dockerfile.is_file() else []):
            if m := _WORKDIR.match(line):
                workdir = m.group(1)
            elif m := _COPY.match(line):
                *sources, dst = shlex.split(m.group(1))
                if not dst.startswith("/"):
                    dst = f"{workdir or '/'}/{dst}".replace("//", "/")
                copies += [(s, dst) for s in sources]
            elif line.strip() and not line.lstrip().startswith(("#", "FROM", "ENV", "USER", "CMD", "ENTRYPOINT")):
                ignored.append(line.strip())
        workdir = environment.get("workdir") or workdir or "/app"
        mode = verifier.get("environment_mode")
        return cls(folder=folder, instruction=(folder / "instruction.md").read_text(), workdir=workdir,
                   gpus=int(environment.get("gpus") or 0), cpus=environment.get("cpus"),
                   memory_mb=environment.get("memory_mb"), agent_timeout_s=float(agent.get("timeout_sec") or 600),
                   verifier_timeout_s=float(verifier.get("timeout_sec") or 600),
                   separate_verifier=mode == "separate" or (mode is None and "environment" in verifier),
                   artifacts=list(config.get("artifacts", [])), copies=copies, ignored=ignored)

    def materialize(self, dest: Path) -> Path:
        """The container's files under `dest` (a path of the container at dest/<path>), from the COPY lines."""
        for src, dst in self.copies:
            source = self.folder / "environment" / src.rstrip("/")
            target = dest / dst.lstrip("/")
            if source.is_dir():
                _copy_tree(source, target if src.endswith("/") or dst.endswith("/") else target)
            elif source.is_file():
                target = target / source.name if dst.endswith("/") else target
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
        (dest / self.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        return dest


@dataclass
class HarborRun:
    rewards: dict[str, float] | None  # what the verifier wrote (reward.json, or reward.txt as {"reward": x})
    agent: ExecResult | None
    verifier: ExecResult
    ignored: list[str]


def _rewards(logs: Path) -> dict[str, float] | None:
    if (logs / "reward.json").is_file():
        value = json.loads((logs / "reward.json").read_text())
        return {k: float(v) for k, v in value.items()} if isinstance(value, dict) else {"reward": float(value)}
    if (logs / "reward.txt").is_file():
        return {"reward": float((logs / "reward.txt").read_text().strip())}
    return None


def run_harbor_task(folder: Path, work: Path, *, sandbox: SandboxBackend, limits: Limits | None = None,
                    solution: bool = True, agent_command: str | None = None) -> HarborRun:
    """Harbor's trial of one task in gymforge's sandbox: `solution` runs solution/solve.sh as the agent (else
    `agent_command`, else nothing: Harbor's "nop" agent), then tests/test.sh as the verifier."""
    task = HarborTask.read(folder)
    limits = limits or Limits()
    work = Path(work)
    shutil.rmtree(work, ignore_errors=True)
    agent_root = task.materialize(work / "agent")
    app = agent_root / task.workdir.lstrip("/")
    (work / "logs" / "agent").mkdir(parents=True)
    mounts = [Mount(host=app, target=task.workdir, read_only=False),
              Mount(host=work / "logs" / "agent", target="/logs/agent", read_only=False)]
    agent = None
    command = "bash /solution/solve.sh" if solution else agent_command
    if command:
        extra = [Mount(host=folder / "solution", target="/solution")] if solution else []
        agent = sandbox.run_once(app, ["bash", "-c", f"cd {shlex.quote(task.workdir)} && {command}"],
                                 timeout=task.agent_timeout_s, limits=limits, mounts=mounts + extra)
    if task.separate_verifier:  # a fresh filesystem that holds only the agent's artifacts
        verifier_root = task.materialize(work / "verifier")
        for path in task.artifacts:
            _carry(agent_root / path.lstrip("/"), verifier_root / path.lstrip("/"))
        app = verifier_root / task.workdir.lstrip("/")
    logs = work / "logs" / "verifier"
    logs.mkdir(parents=True)
    verifier = sandbox.run_once(app, ["bash", "/tests/test.sh"], timeout=task.verifier_timeout_s, limits=limits,
                                mounts=[Mount(host=app, target=task.workdir, read_only=False),
                                        Mount(host=folder / "tests", target="/tests"),
                                        Mount(host=logs, target="/logs/verifier", read_only=False)])
    return HarborRun(_rewards(logs), agent, verifier, task.ignored)


def sandbox_for_task(cfg: GymforgeConfig, task: HarborTask) -> SandboxBackend:
    """The configured backend with the GPUs the task declares."""
    return sandbox_for(cfg, task.gpus)


# -- Harbor's contract with docker: images built from the folder, the agent's and the verifier's containers ----------

def _tar(files: dict[str, Path]) -> bytes:
    """A tar of host files and folders under the given archive names."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, path in files.items():
            tar.add(str(path), arcname=name)
    return buf.getvalue()


def agent_image_tag(folder: Path) -> str:
    """The tag `docker_trial` gives the agent's image of a task folder (its contents' digest)."""
    return f"harbor-agent:{_digest(Path(folder))[:12]}"


def docker_trial(folder: Path, *, base_url: str | None = None, solution: bool = True, gpus: int | None = None,
                 memory_mb: int | None = None, timeout_s: float | None = None) -> HarborRun:
    """Harbor's trial of one task folder with a docker daemon, as Harbor runs it: `environment/` built into the
    agent's image and `tests/` (when it has a Dockerfile: a separate verifier) into the verifier's, no network; the
    agent's step (solution/solve.sh copied to /solution, or nothing) in a container of the agent's image; the
    task's `artifacts` copied out of it into a fresh verifier container, `tests/` uploaded to /tests, `test.sh` run,
    `/logs/verifier/reward.json` (or reward.txt) read back. `gpus` (default: what task.toml declares) is asked of
    the daemon as device requests, which Harbor's own docker environment refuses."""
    import io
    import tarfile

    import docker
    from docker import types as docker_types

    task = HarborTask.read(folder)
    client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
    count = task.gpus if gpus is None else gpus
    run_kwargs: dict[str, Any] = {"network_mode": "none", "detach": True, "command": ["sleep", "infinity"],
                                  "working_dir": task.workdir}
    if memory_mb or task.memory_mb:
        run_kwargs["mem_limit"] = f"{memory_mb or task.memory_mb}m"
    if count:
        run_kwargs["device_requests"] = [docker_types.DeviceRequest(count=count, capabilities=[["gpu"]])]
    digest = _digest(folder)[:12]
    agent_image, _ = client.images.build(path=str(folder / "environment"), tag=agent_image_tag(folder),
                                         network_mode="none", rm=True)
    separate = task.separate_verifier and (folder / "tests" / "Dockerfile").is_file()
    verifier_image = agent_image
    if separate:
        verifier_image, _ = client.images.build(path=str(folder / "tests"), tag=f"harbor-verifier:{digest}",
                                                network_mode="none", rm=True)
    containers = []

    def run(container: Any, argv: list[str]) -> ExecResult:
        import time

        t0 = time.monotonic()
        code, output = container.exec_run(argv, workdir=task.workdir)
        return ExecResult(output=(output or b"").decode(errors="replace"), exit_code=int(code), timed_out=False,
                          duration_s=time.monotonic() - t0)

    try:
        agent_box = client.containers.run(agent_image.id, **run_kwargs)
        containers.append(agent_box)
        agent = None
        if solution:
            agent_box.put_archive("/", _tar({"solution": folder / "solution"}))
            agent = run(agent_box, ["bash", "/solution/solve.sh"])
        verifier_box = agent_box
        if task.separate_verifier:
            verifier_box = client.containers.run(verifier_image.id, **run_kwargs)
            containers.append(verifier_box)
            for path in task.artifacts:  # carried as Harbor's artifact handler does: at their own paths
                try:
                    stream, _ = agent_box.get_archive(path)
                except docker.errors.NotFound:
                    continue
                parent = str(Path(path).parent)
                run(verifier_box, ["mkdir", "-p", parent])
                verifier_box.put_archive(parent, b"".join(stream))
        verifier_box.put_archive("/", _tar({"tests": folder / "tests"}))
        run(verifier_box, ["mkdir", "-p", "/logs/verifier"])
        verifier = run(verifier_box, ["bash", "/tests/test.sh"])
        rewards = None
        for name in ("reward.json", "reward.txt"):
            try:
                stream, _ = verifier_box.get_archive(f"/logs/verifier/{name}")
            except docker.errors.NotFound:
                continue
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                member = tar.extractfile(tar.getmembers()[0])
                text = member.read().decode() if member else ""
            value = json.loads(text) if name.endswith(".json") else float(text.strip())
            rewards = ({k: float(v) for k, v in value.items()} if isinstance(value, dict)
                       else {"reward": float(value)})
            break
        return HarborRun(rewards, agent, verifier, [])
    finally:
        for box in containers:
            try:
                box.remove(force=True)
            except Exception:  # noqa: BLE001 - best-effort cleanup
                pass


# -- a Harbor task as the agent loop's task -------------------------------------------------------------------

def is_harbor_folder(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / "task.toml").is_file()


class HarborEnvironment:
    """A Harbor task installed for one episode of gymforge's agent loop: the agent's shell is a sandbox session on
    the task's files (shown at the task's workdir), and its evaluator (`validate`, `submit`) runs the task's
    verifier as `run_harbor_task` does, on a copy of what the agent left; its rewards are the metrics."""

    def __init__(self, folder: Path, run_dir: Path, *, sandbox: SandboxBackend, limits: Limits | None = None,
                 oracle: bool = False) -> None:
        self.folder, self.run_dir, self.sandbox = Path(folder).resolve(), Path(run_dir), sandbox
        self.harbor = HarborTask.read(self.folder)
        self.limits = limits or Limits()
        self.oracle = oracle  # the solution is mounted at /solution (Harbor's oracle agent sees it; others never)
        self.id = self.folder.name
        self.description = self.harbor.instruction.strip()
        self.timeout = self.harbor.agent_timeout_s
        self._agent_root = self.run_dir / "agent"
        self.app = self._agent_root / self.harbor.workdir.lstrip("/")
        self.workspace = self.app
        self.has_secrets = False

    def install(self) -> Path:
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.harbor.materialize(self._agent_root)
        (self.run_dir / "logs" / "agent").mkdir(parents=True)
        return self.app

    @property
    def mounts(self) -> list[Mount]:
        mounts = [Mount(host=self.app, target=self.harbor.workdir, read_only=False),
                  Mount(host=self.run_dir / "logs" / "agent", target="/logs/agent", read_only=False)]
        if self.oracle:
            mounts.append(Mount(host=self.folder / "solution", target="/solution"))
        return mounts

    def open_session(self) -> Any:
        return self.sandbox.open(self.app, limits=self.limits, mounts=self.mounts)

    def evaluate(self) -> tuple[dict[str, float], str]:
        """The verifier's rewards for the agent's current files; SubmissionNotFound when it wrote none."""
        check = self.run_dir / "verify"
        shutil.rmtree(check, ignore_errors=True)
        root = self.harbor.materialize(check / "root")
        for path in (self.harbor.artifacts if self.harbor.separate_verifier else [self.harbor.workdir]):
            _carry(self._agent_root / path.lstrip("/"), root / path.lstrip("/"))
        app = root / self.harbor.workdir.lstrip("/")
        logs = check / "logs"
        logs.mkdir(parents=True)
        result = self.sandbox.run_once(app, ["bash", "/tests/test.sh"], timeout=self.harbor.verifier_timeout_s,
                                       limits=self.limits,
                                       mounts=[Mount(host=app, target=self.harbor.workdir, read_only=False),
                                               Mount(host=self.folder / "tests", target="/tests"),
                                               Mount(host=logs, target="/logs/verifier", read_only=False)])
        rewards = _rewards(logs)
        shutil.rmtree(check, ignore_errors=True)
        if rewards is None:
            raise SubmissionNotFound(f"the task's verifier wrote no reward (exit status {result.exit_code})")
        return rewards, self.harbor.workdir


def run_harbor_episode(folder: Path, out: Path, llm: Any, *, sandbox: SandboxBackend, limits: Limits | None = None,
                       max_steps: int = 50, seed: int = 0, oracle: bool = False,
                       meta: dict[str, Any] | None = None) -> Path:
    """One episode of gymforge's agent loop (audit included) on a Harbor task folder; the `.traj` path."""
    env = HarborEnvironment(folder, Path(out) / "episode", sandbox=sandbox, limits=limits, oracle=oracle)
    env.install()
    task = AgentTask(id=env.id, description=env.description, baseline=None, training_timeout=env.timeout)
    with env.open_session() as session:
        Agent(llm, session, env, task, AgentConfig(max_steps=max_steps), seed=seed, mounts=env.mounts,
              out_dir=Path(out), meta={"harbor_task": str(env.folder), "sandbox": sandbox.name, **(meta or {})}).run()
    return Path(out) / f"{env.id}.traj"


# -- the Snakemake step: one slot's Harbor folder (rule harbor_task, target `harbor`) ---------------------------

def harbor_task(cfg: GymforgeConfig, slot: str, report: Path, env: Path, proposal: Path, out: Path) -> str:
    """The Harbor task folder of one topic slot's verified environment at `out` (rule `harbor_task`; base image
    `sandbox.image`); a slot that was not verified, or whose task cannot leave, gets `out/not_exported.json` with
    the reason instead, so the target's folders are known before the run."""
    task = load_task(slot, Path(report), Path(env), Path(proposal) if Path(proposal).exists() else None)
    why = None
    if task is None:
        why = f"not verified ({VerificationReport.model_validate_json(Path(report).read_text()).status})"
    else:
        try:
            made = export_task(task.task_yaml, Path(out), sandbox=sandbox_for(cfg, 0), root=task.tree,
                               baseline=task.baseline, metric=task.metric.metric,
                               higher_is_better=task.metric.higher_is_better, hidden_columns=task.hidden_columns,
                               limits=Limits.from_config(cfg.sandbox), base_image=cfg.sandbox.image,
                               scale_floor=cfg.rl.reward.scale_floor)
            return f"{slot}: {made.task_id} {'written' if made.written else 'unchanged'}"
        except HarborExportError as err:
            why = str(err)
    with atomic.directory(Path(out)) as tmp:
        (tmp / "not_exported.json").write_text(json.dumps({"slot": slot, "reason": why}, indent=1) + "\n")
    return f"{slot}: not exported: {why}"
