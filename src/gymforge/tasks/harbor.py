"""Harbor task folders as gymforge tasks (docs/interop.md, "Harbor task folders, in").

A Harbor task folder holds `task.toml`, `instruction.md`, `environment/` (a Dockerfile and the files it copies),
`tests/test.sh` (the verifier, which writes `/logs/verifier/reward.txt` or `reward.json`) and `solution/solve.sh`.
`HarborTask` reads one (the fields of task.toml gymforge acts on, environment/Dockerfile's WORKDIR and COPY lines),
`run_harbor_task` runs it in gymforge's sandbox as Harbor's trial does (the agent's step: the task's `solve.sh`, a
command, or nothing; then `tests/test.sh` in a fresh sandbox that sees the agent's artefacts, `/tests` and
`/logs/verifier`; the reward is what test.sh wrote), `docker_trial` does the same with a docker daemon, and
`HarborEnvironment` is a Harbor task as the agent loop's task (`gymforge run-task FOLDER`, the benchmark's runs
through `EpisodeRunner`). A task that declares GPUs gets them from the backend (Harbor's own docker environment
refuses such tasks). Writing Harbor folders (export) is `gymforge.interop.harbor`'s.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymforge.agent.errors import SubmissionNotFound
from gymforge.agent.loop import Agent, AgentConfig, AgentTask
from gymforge.sandbox import ExecResult, Limits, Mount, SandboxBackend


def folder_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f"{path.relative_to(folder).as_posix()}\0{path.stat().st_mode & 0o111}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def carry(src: Path, dst: Path) -> None:
    """An artefact the agent left (a folder or a file; nothing when it left none) copied to where the verifier reads
    it, replacing what was there."""
    if src.is_dir():
        shutil.rmtree(dst, ignore_errors=True)
        copy_tree(src, dst)
    elif src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)


def copy_tree(src: Path, dst: Path) -> None:
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
    metadata: dict[str, Any] = field(default_factory=dict)  # task.toml's [metadata] (free-form in Harbor's schema)

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
                   artifacts=list(config.get("artifacts", [])), copies=copies, ignored=ignored,
                   metadata=dict(config.get("metadata") or {}))

    def materialize(self, dest: Path) -> Path:
        """The container's files under `dest` (a path of the container at dest/<path>), from the COPY lines."""
        for src, dst in self.copies:
            source = self.folder / "environment" / src.rstrip("/")
            target = dest / dst.lstrip("/")
            if source.is_dir():
                copy_tree(source, target if src.endswith("/") or dst.endswith("/") else target)
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
    rewards, verifier = run_verifier(task, agent_root, work / "verifier", sandbox=sandbox, limits=limits)
    return HarborRun(rewards, agent, verifier, task.ignored)


def run_verifier(task: HarborTask, agent_root: Path, work: Path, *, sandbox: SandboxBackend,
                 limits: Limits) -> tuple[dict[str, float] | None, ExecResult]:
    """tests/test.sh on what the agent left under `agent_root` (the container's files at agent_root/<path>), as
    Harbor's verifier step: in a fresh sandbox built from the environment's files again, holding the task's
    `artifacts` (a separate verifier) or the agent's workdir (a shared one), copied, so the agent's files are never
    changed and the verifier can run again on the same ones; its rewards (None: it wrote none) and its result."""
    work = Path(work)
    shutil.rmtree(work, ignore_errors=True)
    root = task.materialize(work / "root")
    for path in (task.artifacts if task.separate_verifier else [task.workdir]):
        carry(Path(agent_root) / path.lstrip("/"), root / path.lstrip("/"))
    app = root / task.workdir.lstrip("/")
    logs = work / "logs"
    logs.mkdir(parents=True)
    result = sandbox.run_once(app, ["bash", "/tests/test.sh"], timeout=task.verifier_timeout_s, limits=limits,
                              mounts=[Mount(host=app, target=task.workdir, read_only=False),
                                      Mount(host=task.folder / "tests", target="/tests"),
                                      Mount(host=logs, target="/logs/verifier", read_only=False)])
    return _rewards(logs), result


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
    return f"harbor-agent:{folder_digest(Path(folder))[:12]}"


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
    digest = folder_digest(folder)[:12]
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
        rewards, result = run_verifier(self.harbor, self._agent_root, check, sandbox=self.sandbox, limits=self.limits)
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
