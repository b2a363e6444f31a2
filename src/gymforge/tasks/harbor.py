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
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymforge.agent.errors import SubmissionNotFound
from gymforge.core.records import CheckReport, HarborAudit, ProbeOutcome
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
    name: str | None = None  # task.toml's [task] name

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
                   artifacts=[a if isinstance(a, str) else a["source"] for a in config.get("artifacts", [])],
                   copies=copies, ignored=ignored,
                   metadata=dict(config.get("metadata") or {}), name=(config.get("task") or {}).get("name"))

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


# long: one docker trial as Harbor runs it, in its order: build, agent step, carry artifacts, verify, read reward
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
    # The loop brings the OpenAI client, which every Snakefile parse would load (benchmark.suite imports this module).
    from gymforge.agent.loop import Agent, AgentConfig, AgentTask  # deferred: ~0.3 s of every `snakemake` start

    env = HarborEnvironment(folder, Path(out) / "episode", sandbox=sandbox, limits=limits, oracle=oracle)
    env.install()
    task = AgentTask(id=env.id, description=env.description, baseline=None, training_timeout=env.timeout)
    with env.open_session() as session:
        Agent(llm, session, env, task, AgentConfig(max_steps=max_steps), seed=seed, mounts=env.mounts,
              out_dir=Path(out), meta={"harbor_task": str(env.folder), "sandbox": sandbox.name, **(meta or {})}).run()
    return Path(out) / f"{env.id}.traj"


# -- `gymforge check-task FOLDER`: what can be checked of a Harbor task without knowing it ------------------------

# Harbor 0.25's task.toml (harbor/models/task/config.py, TaskConfig, schema_version "1.4"): the keys of its tables
# gymforge checks against when Harbor itself cannot be imported (it installs on Python >= 3.12 only).
_SCHEMA: dict[str, set[str] | None] = {
    "": {"schema_version", "task", "metadata", "verifier", "agent", "environment", "solution", "source",
         "multi_step_reward_strategy", "steps", "artifacts"},
    "task": {"name", "version", "description", "authors", "keywords"},
    "metadata": None,  # free-form
    "agent": {"timeout_sec", "user", "network_mode", "allowed_hosts"},
    "verifier": {"timeout_sec", "env", "user", "environment_mode", "environment", "collect", "network_mode",
                 "allowed_hosts"},
    "environment": {"build_timeout_sec", "docker_image", "os", "cpus", "memory_mb", "storage_mb", "gpus",
                    "gpu_types", "tpu", "mcp_servers", "env", "skills_dir", "healthcheck", "workdir",
                    "allow_internet", "network_mode", "allowed_hosts"},
    "solution": {"env"},
}
_NUMBERS = {"environment": ("cpus", "memory_mb", "storage_mb", "gpus", "build_timeout_sec"),
            "agent": ("timeout_sec",), "verifier": ("timeout_sec",)}
_ANSWER_NAME = re.compile(r"answer|label|truth|gold|expected|solution|secret|hidden", re.I)
_DATA_SUFFIXES = {".csv", ".tsv", ".txt", ".json", ".jsonl", ".npy", ".parquet"}


def validate_folder(folder: Path) -> tuple[str, list[str]]:
    """(what validated it, the problems) of a Harbor task folder: task.toml through Harbor's own `TaskConfig` when
    `harbor` imports, else against the keys and types of Harbor 0.25's schema (Harbor ignores unknown keys, so a
    misspelt one is reported here); the files Harbor's trial needs."""
    folder = Path(folder)
    problems = [f"no {rel}" for rel in ("task.toml", "instruction.md", "tests/test.sh") if not (folder / rel).is_file()]
    if not (folder / "task.toml").is_file():
        return "none", problems
    text = (folder / "task.toml").read_text()
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        return "tomllib", [*problems, f"task.toml is not TOML: {err}"]
    environment = config.get("environment") if isinstance(config.get("environment"), dict) else {}
    if not (folder / "environment" / "Dockerfile").is_file() and not environment.get("docker_image") and not (
            folder / "environment" / "docker-compose.yaml").is_file():
        problems.append("no environment/Dockerfile (nor docker-compose.yaml, nor [environment] docker_image)")
    try:
        from harbor.models.task.config import TaskConfig  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - not installed (Python < 3.12), or its package's imports fail
        TaskConfig = None
    validator = "harbor TaskConfig" if TaskConfig is not None else "gymforge's reading of Harbor 0.25's schema 1.4"
    if TaskConfig is not None:
        try:
            TaskConfig.model_validate_toml(text)
        except Exception as err:  # noqa: BLE001 - pydantic's ValidationError, or TOML's
            problems.append(f"Harbor's TaskConfig refuses task.toml: {err}")
    for table, keys in _SCHEMA.items():
        body = config if not table else config.get(table, {})
        if not isinstance(body, dict):
            problems.append(f"task.toml: {table} must be a table")
            continue
        if keys is not None:
            problems += [f"task.toml: unknown key {(table + '.') if table else ''}{k}" for k in body if k not in keys]
    for table, keys in _NUMBERS.items():
        body = config.get(table, {})
        for key in keys:
            value = body.get(key) if isinstance(body, dict) else None
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                problems.append(f"task.toml: {table}.{key} must be a non-negative number, not {value!r}")
    return validator, problems


def _lines(path: Path) -> list[str] | None:
    try:
        return path.read_text().splitlines()
    except (UnicodeDecodeError, OSError):
        return None


def _contains_block(haystack: list[str], block: list[str]) -> bool:
    n = len(block)
    return any(haystack[i:i + n] == block for i in range(len(haystack) - n + 1))


def find_leaks(folder: Path, solution_output: dict[str, bytes] | None = None) -> list[str]:
    """Answers an agent could read in environment/ (everything the image can be built from): a data file of tests/
    or solution/ named like an answer (answers, labels, truth, expected, ...) that is there as it is, a data file
    of tests/ or solution/ whose rows (after the header) are all there in one file, and a file the solution wrote
    (`solution_output`: its path -> contents) that is there with the same contents."""
    folder = Path(folder)
    env_files = [p for p in (folder / "environment").rglob("*") if p.is_file() and not p.is_symlink()]
    by_bytes: dict[bytes, Path] = {}
    for path in env_files:
        by_bytes.setdefault(hashlib.sha256(path.read_bytes()).digest(), path)
    env_lines = {path: _lines(path) for path in env_files if path.suffix.lower() in _DATA_SUFFIXES}
    found = []
    for side in ("tests", "solution"):
        for path in sorted(p for p in (folder / side).rglob("*") if p.is_file() and not p.is_symlink()):
            if path.suffix.lower() not in _DATA_SUFFIXES:
                continue
            rel = path.relative_to(folder)
            same = by_bytes.get(hashlib.sha256(path.read_bytes()).digest())
            if same is not None:
                if _ANSWER_NAME.search(path.name):
                    found.append(f"{rel} is in the agent's environment as {same.relative_to(folder)}")
                continue  # the same file on both sides: data the agent is meant to see
            lines = _lines(path)
            rows = [line for line in (lines or [])[1:] if line.strip()] if lines else []
            if len(rows) >= 2:
                for other, their in env_lines.items():
                    if their and _contains_block(their, rows):
                        found.append(f"the rows of {rel} are in the agent's environment, in {other.relative_to(folder)}")
                        break
    for name, data in (solution_output or {}).items():
        same = by_bytes.get(hashlib.sha256(data).digest()) if data.strip() else None
        if same is not None:
            found.append(f"the solution's output {name} is in the agent's environment as {same.relative_to(folder)}")
    return found


def _written(before: dict[str, bytes], root: Path) -> dict[str, bytes]:
    after = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}
    return {f"/{k}": v for k, v in after.items() if before.get(k) != v}


def check_harbor_task(folder: Path, work: Path, *, sandbox: SandboxBackend, limits: Limits | None = None) -> CheckReport:
    """`gymforge check-task` on a Harbor task folder: a `CheckReport` whose `harbor` part says, each as a check:
    the folder is Harbor's (`validate_folder`); solution/solve.sh scores strictly above doing nothing (Harbor's nop
    agent), which must still get a reward (a verifier that writes none when there is nothing to read fails the trial
    instead of scoring it); the verifier gives the same rewards twice on the same files; no answer is in
    environment/ (`find_leaks`). The report's baseline is the solution's score and its one probe is doing nothing,
    `gameable` when nothing scores as well as the solution; the metric is `[metadata] metric` (gymforge's exports),
    else `reward`."""
    t0 = time.monotonic()
    folder, work = Path(folder).resolve(), Path(work)
    limits = limits or Limits()
    validator, problems = validate_folder(folder)
    audit = HarborAudit(validator=validator, schema_problems=problems)
    failures = [f"not a Harbor task folder: {p}" for p in problems]
    task = HarborTask.read(folder) if (folder / "task.toml").is_file() and not any(
        p.startswith("task.toml is not TOML") for p in problems) else None
    metric = str((task.metadata.get("metric") if task else None) or "reward")
    higher = bool(task.metadata.get("higher_is_better", True)) if task else True
    report = CheckReport(task_id=folder.name, entrypoint="harbor", metric=metric, higher_is_better=higher,
                         baseline=float("nan"), baseline_source="measured", harbor=audit)
    if task is None or not (folder / "tests" / "test.sh").is_file():
        audit.failures, report.seconds = failures, round(time.monotonic() - t0, 3)
        return report
    audit.not_carried_out = list(task.ignored)
    output: dict[str, bytes] = {}
    if (folder / "solution" / "solve.sh").is_file():
        before_root = task.materialize(work / "before")
        before = {str(p.relative_to(before_root)): p.read_bytes() for p in before_root.rglob("*") if p.is_file()}
        solved = run_harbor_task(folder, work / "solution", sandbox=sandbox, limits=limits)
        audit.solution = solved.rewards
        output = _written(before, work / "solution" / "agent")
        if solved.rewards is None:
            failures.append(f"the verifier wrote no reward for the solution (solve.sh exit "
                            f"{solved.agent.exit_code if solved.agent else None}, test.sh exit "
                            f"{solved.verifier.exit_code}: {solved.verifier.output[-300:]!r})")
        else:
            audit.repeat, _ = run_verifier(task, work / "solution" / "agent", work / "repeat", sandbox=sandbox,
                                           limits=limits)
            audit.deterministic = audit.repeat == solved.rewards
            if not audit.deterministic:
                failures.append(f"the verifier is not deterministic: {solved.rewards} then {audit.repeat} on the "
                                "same files")
    else:
        failures.append("no solution/solve.sh: nothing shows the task can be solved")
    nothing = run_harbor_task(folder, work / "nothing", sandbox=sandbox, limits=limits, solution=False)
    audit.nothing = nothing.rewards
    score = (audit.solution or {}).get(metric)
    floor = (audit.nothing or {}).get(metric)
    report.baseline = float("nan") if score is None else score
    probe = ProbeOutcome(name="nothing", kind="harbor", description="the agent does nothing (Harbor's nop agent)",
                         submission_file=task.workdir, submission="(the environment's files, untouched)",
                         metrics=audit.nothing, score=floor,
                         rejected=None if audit.nothing is not None else "the verifier wrote no reward")
    if audit.nothing is None:
        failures.append("doing nothing gets no reward: Harbor counts the trial as failed, not as the floor")
    elif score is not None and floor is not None:
        probe.gameable = floor >= score if higher else floor <= score
        if probe.gameable:
            failures.append(f"doing nothing scores {metric} = {floor:g}, as well as the solution ({score:g})")
    elif score is not None:
        probe.rejected = f"the verifier's rewards for nothing have no {metric}"
        top, bottom = (audit.solution or {}).get("reward"), audit.nothing.get("reward")
        if top is not None and bottom is not None and bottom >= top:  # Harbor's own reward decides then
            probe.gameable = True
            failures.append(f"doing nothing is rewarded {bottom:g}, as much as the solution ({top:g})")
    report.probes = [probe]
    report.gameable = probe.gameable
    audit.leaks = find_leaks(folder, output)
    failures += [f"answer visible to the agent: {leak}" for leak in audit.leaks]
    report.gameable = report.gameable or bool(audit.leaks)
    audit.failures = failures
    report.seconds = round(time.monotonic() - t0, 3)
    shutil.rmtree(work, ignore_errors=True)
    return report
