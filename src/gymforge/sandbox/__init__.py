"""Sandboxes for untrusted code: generated task code, baselines, evaluations and agent actions."""

from __future__ import annotations

from typing import Any

from .base import (
    ExecResult,
    Limits,
    Mount,
    SandboxBackend,
    SandboxError,
    Session,
    make_readable,
)

__all__ = ["ExecResult", "Limits", "Mount", "SandboxBackend", "SandboxError", "Session", "get_sandbox", "make_readable"]


def get_sandbox(name: str, **options: Any) -> SandboxBackend:
    """`local` (options: confinement, gpus, max_output) or `docker` (image, base_url, gpus, cpus, user, max_output)."""
    if name == "local":
        from .local import LocalBackend  # deferred: the backends cost ~20 ms that users of Mount (Snakefile parse) skip

        return LocalBackend(**options)
    if name == "docker":
        from .docker import DockerBackend  # deferred: as LocalBackend (the docker SDK itself loads on first use)

        return DockerBackend(**options)
    raise ValueError(f"unknown sandbox backend {name!r} (expected 'local' or 'docker')")
