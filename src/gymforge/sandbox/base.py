"""The sandbox seam: where untrusted generated code and agent actions run.

A backend runs one-shot processes (`run_once`: baselines, evaluations) and opens sessions (`open`: one
agent episode, a persistent bash). Every backend applies `Limits`, starts from a scrubbed environment,
and gives the code a view in which the workspace is writable and `Mount`s appear at their targets.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import time
from pathlib import Path, PurePosixPath
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, Field, field_validator

from gymforge.core.config import SandboxConfig
from gymforge.runtime.cpus import cpu_threads

from . import beneath

DEFAULT_MAX_OUTPUT = 100_000
"""Bytes of output kept per command (head and tail); the middle is replaced by a note."""

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, unavailable confinement, bad mount)."""


_CONFIGURED = SandboxConfig()  # the defaults of the limits a config's `sandbox` section sets


class Limits(BaseModel):
    """What a sandbox allows. The fields named as in `SandboxConfig` are the configured ones (`from_config`), with
    its defaults; the others are fixed here."""

    cpu_seconds: int = Field(_CONFIGURED.cpu_seconds, gt=0, description="CPU time per process (RLIMIT_CPU).")
    memory_mb: int = Field(_CONFIGURED.memory_mb, description="Memory of the whole sandbox (an episode's cgroup, or "
                           "the container in docker), and the address space of each process locally.")
    max_processes: int = Field(_CONFIGURED.max_processes, gt=0,
                               description="Tasks (processes and threads) the sandbox may run at once.")
    max_file_mb: int = Field(1024, gt=0, description="Largest file a process may write (RLIMIT_FSIZE).")
    tmp_mb: int = Field(_CONFIGURED.tmp_mb, gt=0,
                        description="Size of the private /tmp (a tmpfs: it counts towards memory).")
    disk_mb: int = Field(_CONFIGURED.disk_mb, gt=0, description="Total size of the workspace; a command that grows "
                         "it past this is stopped.")
    open_files: int = Field(1024, ge=64, description="Open files per process (RLIMIT_NOFILE); with max_processes "
                            "this bounds the episode's total.")
    network: bool = False

    @field_validator("memory_mb")
    @classmethod
    def _enough_memory(cls, v: int) -> int:
        # Below 1 GiB of address space numeric libraries spin instead of failing (see notes/machine.md).
        if v < 1024:
            raise ValueError(f"memory_mb must be >= 1024, got {v}")
        return v

    @classmethod
    def from_config(cls, sandbox: SandboxConfig) -> Limits:
        """The limits a config's `sandbox` section sets (every field both models name); the others as defaulted."""
        return cls(**sandbox.model_dump(include=set(cls.model_fields) & set(SandboxConfig.model_fields)))


class Mount(BaseModel):
    host: Path
    target: str = Field(description="Path inside the sandbox view; a relative one resolves under the workspace.")
    read_only: bool = True


class ExecResult(BaseModel):
    output: str = Field(description="stdout and stderr interleaved, middle elided past the output cap.")
    exit_code: int = Field(description="Exit status; 128+N when killed by signal N (137 after a timeout).")
    timed_out: bool
    duration_s: float
    limit: str | None = Field(
        None,
        description="The sandbox limit that ended the command, in words (e.g. 'memory: 2048 MiB for the episode'); "
        "None when no limit was hit.",
    )


class Session:
    """One episode: a persistent bash whose cwd and exported variables survive between commands."""

    workspace: Path
    """Host path of the agent's workspace."""
    workdir: str
    """The workspace as the sandboxed code sees it (the host path locally, /workspace in docker)."""
    cwd: str
    """Current directory of the shell after the last command, in the sandbox view."""

    def run(self, command: str, timeout: float) -> ExecResult:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Where the workspace appears inside a sandbox that can place it (bwrap, docker): the same path on every
# host and in every run, so trajectories carry no host paths and a student sees at evaluation the paths it
# was trained on.
WORKDIR = "/workspace"
# MLGym's container path of the workspace: its tasks' evaluators hard-code it, so it names WORKDIR too.
MLGYM_WORKDIR = "/home/agent/workspace"
# Every sandbox's host name, in both backends: it says nothing about the host, and it resolves to loopback.
HOSTNAME = "sandbox"


class SandboxBackend(Protocol):
    name: str
    single_file_binds: bool
    """Whether a writable Mount of one file over a file of a read-only workspace is the only way sandboxed code
    sees that path (the workspace shows at one place), in a view with its own pid namespace and /tmp: what
    scoring several artefacts in one sandbox needs (`Scoring.evaluate_each`)."""

    def workdir(self, workspace: Path) -> str:
        """The path at which sandboxed code sees `workspace`."""
        ...

    def open(
        self, workspace: Path, *, limits: Limits, mounts: Sequence[Mount] = (), env: Mapping[str, str] | None = None
    ) -> Session: ...

    def run_once(
        self,
        workspace: Path,
        argv: list[str],
        *,
        timeout: float,
        limits: Limits,
        mounts: Sequence[Mount] = (),
        env: Mapping[str, str] | None = None,
        read_only: bool = False,
        within: Session | None = None,
    ) -> ExecResult:
        """Run `argv` with the workspace as cwd (writable unless `read_only`); everything it started is gone
        when this returns. `within`: an open session whose memory and task limits this run shares (an
        episode's limit then bounds its evaluation's submission too), where the backend can nest them."""
        ...


_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_NOT_SECRET = {"TOKENIZERS_PARALLELISM"}


def looks_secret(name: str) -> bool:
    return name.upper() not in _NOT_SECRET and bool(_SECRET.search(name))


def sandbox_env(extra: Mapping[str, str] | None, *, home: str, path: str, network: bool) -> dict[str, str]:
    """A minimal environment built from scratch: nothing of the parent leaks except what is named here."""
    extra = dict(extra or {})
    if bad := sorted(k for k in extra if looks_secret(k)):
        raise SandboxError(f"refusing to pass secret-looking variables into a sandbox: {', '.join(bad)}")
    env = {
        "PATH": path,
        "HOME": home,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONHASHSEED": "0",
        "PYTHONUNBUFFERED": "1",
        "MPLBACKEND": "Agg",
        # Agent commands are non-interactive: no pagers, no prompts.
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "DEBIAN_FRONTEND": "noninteractive",
        # Many episodes share few cores: BLAS/OpenMP pools sized to the machine oversubscribe it (a
        # gradient-boosting fit measured ~50x slower). Callers that own whole cores can raise these.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        # A command that raises its pool (a fine-tune's torch.set_num_threads(2)) shares the cores with other
        # episodes: OpenMP threads that spin at barriers while another job holds the core ran ~6x slower.
        "OMP_WAIT_POLICY": "PASSIVE",
        # What a command that owns the job's cores may raise its pool to (a fine-tune, a model's generation): the
        # job's cores, not the machine's, so that two 1-core jobs on 2 cores do not run 4 torch threads.
        "GYMFORGE_TORCH_THREADS": str(cpu_threads()),
    }
    if not network:
        # Without these the Hugging Face libraries retry a dead network for ~20 s before failing.
        env |= {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return env | extra


def make_readable(path: Path) -> None:
    """World-readable (and traversable): a sandbox's uid owns nothing it only reads."""
    paths = [path] if path.is_file() else [path, *path.rglob("*")]
    for p in paths:
        if not p.is_symlink():
            mode = p.stat().st_mode
            p.chmod(mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH | (0o111 if p.is_dir() else 0))


def resolve_target(target: str, workdir: str) -> str:
    p = PurePosixPath(target)
    full = p if p.is_absolute() else PurePosixPath(workdir) / p
    if ".." in full.parts:
        raise SandboxError(f"mount target must not contain '..': {target}")
    return str(full)


def missing_ancestry(ws: Path, target: Path) -> list[Path]:
    """`target` and its missing parents under `ws`, top-down: what a mount there creates on the host."""
    missing = []
    for p in [target, *target.parents]:
        if not p.is_relative_to(ws) or p == ws:
            continue
        try:
            beneath.lstat(ws, p.relative_to(ws).as_posix())
        except FileNotFoundError:
            missing.append(p)
        except OSError:
            continue  # behind a symlink: the sandbox refuses such a mount point itself
    return missing[::-1]


def mount_points(ws: Path, targets: list[Path], uid: int | None) -> list[Path]:
    """Prepare mount points in the host workspace; returns what to remove afterwards.

    Missing parents are made here, traversable (and owned by `uid`, when given), each by its parent's fd
    so that a directory the code swapped for a symlink makes this fail instead of writing elsewhere; the
    sandbox makes the mount point itself. Targets outside `ws` create nothing on the host.
    """
    created = []
    for t in targets:
        missing = missing_ancestry(ws, t)
        for d in missing[:-1]:
            beneath.make_dir(ws, d.relative_to(ws).as_posix(), uid)
        created += missing
    return created


def remove_mount_points(ws: Path, paths: list[Path]) -> None:
    beneath.remove_entries(ws, [p.relative_to(ws).as_posix() for p in paths if p.is_relative_to(ws)])


class OutputBuffer:
    """Keeps the first and last `cap // 2` bytes of a stream of any length."""

    def __init__(self, cap: int) -> None:
        self.half = max(cap // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > 4 * self.half:  # trim in batches, not on every chunk
            del self.tail[: -self.half]

    def text(self) -> str:
        if self.total <= 2 * self.half:
            return (self.head + self.tail).decode(errors="replace")
        tail = self.tail[-self.half :]
        omitted = self.total - len(self.head) - len(tail)
        return (
            self.head.decode(errors="replace")
            + f"\n[... {omitted} bytes of output truncated ...]\n"
            + tail.decode(errors="replace")
        )


def tree_bytes(root: Path, cap_entries: int = 200_000) -> int:
    """Disk blocks in use under `root`, by fd and never through a link (stops counting at `cap_entries`)."""
    total = seen = 0
    try:
        top = beneath.open_root(root)
    except OSError:
        return 0
    try:
        for _, dirnames, filenames, dfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            for name in dirnames + filenames:
                seen += 1
                if seen > cap_entries:
                    return total
                try:
                    total += os.stat(name, dir_fd=dfd, follow_symlinks=False).st_blocks * 512
                except OSError:
                    continue
    finally:
        os.close(top)
    return total


class LimitWatch:
    """Names the limit that ended a command: the sandbox's group (memory, processes), the rlimits by the
    signal that killed it (CPU time, file size), and the workspace's total size, which `during()` also
    checks while a command runs so that a command filling the disk is stopped. With `hard` the workspace is a
    file system of its own (`disk.py`) that refuses writes past the cap by itself; the checks then only ask it
    whether it is full (statvfs), instead of walking the tree."""

    INTERVAL_S = 2.0

    def __init__(
        self, workspace: Path, limits: Limits, group: Any = None, strip_setid: bool = False, hard: bool = False
    ) -> None:
        self.workspace, self.limits, self.group = workspace, limits, group
        self.strip_setid = strip_setid  # docker: code runs as root there and could leave setuid-root files
        self.hard = hard  # the workspace is a file system of disk_mb (sandbox.disk): writes past it fail, no polling
        self._next = 0.0
        self._before = 0

    def start(self) -> None:
        """A command begins: only growth past the cap from here on stops it (cleaning up must stay possible)."""
        self._before = self._free() if self.hard else tree_bytes(self.workspace)
        self._next = time.monotonic() + self.INTERVAL_S

    def _free(self) -> int:
        try:
            st = os.statvfs(self.workspace)
        except OSError:
            return 1 << 62
        return st.f_bavail * st.f_frsize if st.f_favail else 0  # out of inodes is full too

    def during(self) -> str | None:
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.INTERVAL_S
        return self._disk()

    def _disk(self) -> str | None:
        if self.hard:
            free = self._free()
            # The file system refused the writes already; a command that keeps trying is stopped all the same.
            if free < 1 << 20 and free < self._before:
                return f"disk: the workspace is full ({self.limits.disk_mb} MiB; delete files to go on)"
            return None
        size = tree_bytes(self.workspace)
        if size > self.limits.disk_mb << 20 and size > self._before:
            return f"disk: the workspace holds more than {self.limits.disk_mb} MiB (delete files to go on)"
        return None

    def after(self, exit_code: int) -> str | None:
        if self.strip_setid:
            beneath.strip_setid(self.workspace)
        if self.group is not None and (hit := self.group.limit_hit()):
            return hit
        if exit_code == 128 + signal.SIGXCPU:
            return f"cpu time: {self.limits.cpu_seconds} s per process"
        if exit_code == 128 + signal.SIGXFSZ:
            return f"file size: {self.limits.max_file_mb} MiB per file"
        return self._disk()
