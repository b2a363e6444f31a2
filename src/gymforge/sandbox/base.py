"""The sandbox seam: where untrusted generated code and agent actions run.

A backend runs one-shot processes (`run_once`: baselines, evaluations) and opens sessions (`open`: one
agent episode, a persistent bash). Every backend applies `Limits`, starts from a scrubbed environment,
and gives the code a view in which the workspace is writable and `Mount`s appear at their targets.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path, PurePosixPath
from typing import Protocol

from pydantic import BaseModel, Field, field_validator

DEFAULT_MAX_OUTPUT = 100_000
"""Bytes of output kept per command (head and tail); the middle is replaced by a note."""

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, unavailable confinement, bad mount)."""


class Limits(BaseModel):
    cpu_seconds: int = Field(3600, gt=0, description="CPU time per process (RLIMIT_CPU).")
    memory_mb: int = Field(2048, description="Address space per process locally, memory of the container in docker.")
    max_processes: int = Field(256, gt=0, description="Tasks (processes and threads) the sandbox may run at once.")
    max_file_mb: int = Field(1024, gt=0, description="Largest file a process may write (RLIMIT_FSIZE).")
    network: bool = False

    @field_validator("memory_mb")
    @classmethod
    def _enough_memory(cls, v: int) -> int:
        # Below 1 GiB of address space numeric libraries spin instead of failing (see notes/machine.md).
        if v < 1024:
            raise ValueError(f"memory_mb must be >= 1024, got {v}")
        return v


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


class SandboxBackend(Protocol):
    name: str

    def workdir(self, workspace: Path) -> str:
        """The path at which sandboxed code sees `workspace`."""
        ...

    def open(
        self, workspace: Path, *, limits: Limits, mounts: list[Mount] = [], env: dict[str, str] = {}
    ) -> Session: ...

    def run_once(
        self,
        workspace: Path,
        argv: list[str],
        *,
        timeout: float,
        limits: Limits,
        mounts: list[Mount] = [],
        env: dict[str, str] = {},
    ) -> ExecResult:
        """Run `argv` with the workspace as cwd; everything it started is gone when this returns."""
        ...


_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_NOT_SECRET = {"TOKENIZERS_PARALLELISM"}


def looks_secret(name: str) -> bool:
    return name.upper() not in _NOT_SECRET and bool(_SECRET.search(name))


def sandbox_env(extra: dict[str, str], *, home: str, path: str, network: bool) -> dict[str, str]:
    """A minimal environment built from scratch: nothing of the parent leaks except what is named here."""
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
    missing = [p for p in [target, *target.parents] if p.is_relative_to(ws) and p != ws and not os.path.lexists(p)]
    return missing[::-1]


def mount_points(ws: Path, targets: list[Path], uid: int | None) -> list[Path]:
    """Prepare mount points in the host workspace; returns what to remove afterwards.

    Missing parents are made here, traversable (and owned by `uid`, when given); the sandbox makes the
    mount point itself. Targets outside `ws` create nothing on the host.
    """
    created = []
    for t in targets:
        missing = missing_ancestry(ws, t)
        for d in missing[:-1]:
            d.mkdir(mode=0o755)
            if uid is not None:
                os.chown(d, uid, uid)
        created += missing
    return created


def remove_mount_points(paths: list[Path]) -> None:
    for p in reversed(paths):  # deepest first
        try:
            if p.is_symlink() or (p.is_file() and p.stat().st_size == 0):
                p.unlink()
            elif p.is_dir():
                p.rmdir()  # fails, and stays, when the code put something in it
        except OSError:
            continue


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
