"""The docker backend: one container per session or run, through the Docker SDK.

`docker.from_env()` honours DOCKER_HOST (scripts/docker_sandbox.sh starts a private daemon and builds
the default image `gymforge-sandbox:latest` offline). Containers run with network_mode=none unless
`Limits.network`, all capabilities dropped, no-new-privileges, docker-init as pid 1 (it reaps orphans),
`mem_limit` = `memswap_limit` = `memory_mb` (OOM kill, exit 137), `pids_limit` = `max_processes`
(threads count), and rlimits for CPU time and file size. Where this process has a writable cgroup (memory and
pids), a session's container lives in a group of the episode's own (`cgroup_parent`, cgroups.DockerParent)
with the same memory and pids limits, and `run_once(within=session)` (an evaluation's submission) puts its
container there too: the episode's agent code shares one limit, as with the local backend. The workspace is
a file system of its own while a container runs on it (disk.py): `disk_mb` is a hard cap.

The workspace is bind-mounted at /workspace, not copied: the code's changes are on the host at once.
Files it creates belong to the container user, which is the host's uid:gid (so the host user owns
them) unless the host runs as root, in which case the image's user (root) is kept; pass `user=` to
choose. Without capabilities even root in the container cannot write files of other owners (such as
the per-session uids of the local backend), so don't share a workspace between the two backends.
Mounts are bind mounts, read-only ones cannot be modified inside.

A session is a long-lived container (`sleep infinity` under docker-init) with a persistent bash
started by `exec` over an attached socket (see shell.py). On timeout every process in the container
except init, the keeper and the shell is killed; a restart kills the shell too and execs a new one.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from . import cgroups, disk
from .base import (
    DEFAULT_MAX_OUTPUT,
    HOSTNAME,
    PATH,
    MLGYM_WORKDIR,
    WORKDIR,
    ExecResult,
    LimitWatch,
    Limits,
    Mount,
    OutputBuffer,
    SandboxError,
    Session,
    mount_points,
    remove_mount_points,
    resolve_target,
    sandbox_env,
)
from .shell import ShellSession

log = logging.getLogger(__name__)

# Kills every process of the container except init, this script and the pids given as arguments; a
# fork between listing and killing is caught by the next round. Builtins only: nothing of it forks.
_KILLER = r"""
keep=" 1 $$ $* "
for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
  n=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$keep" in *" $p "*) continue ;; esac
    read -r st < "$d/stat" 2>/dev/null || continue
    st=${st##*) }
    [ "${st%% *}" = Z ] && continue
    kill -9 "$p" 2>/dev/null && n=$((n + 1))
  done
  [ "$n" = 0 ] && break
done
"""


class _ExecChannel:
    """A bash started with `docker exec`, stdin and output over the attached socket."""

    def __init__(self, container: Any, user: str, keeper: int) -> None:
        self._container = container
        self._api = container.client.api
        self._user = user
        self._keeper = keeper
        self._exec = self._api.exec_create(
            container.id, ["bash", "--noprofile", "--norc"], stdin=True, user=user, workdir=WORKDIR
        )["Id"]
        self._sock: socket.socket = self._api.exec_start(self._exec, socket=True)._sock
        self._frames = bytearray()

    def send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError:
            pass  # the shell is gone; recv() reports the end of the stream

    def recv(self, timeout: float) -> bytes | None:
        # Without a tty the stream is multiplexed: 8-byte headers (stream, 0, 0, 0, big-endian size).
        deadline = time.monotonic() + timeout
        while True:
            if len(self._frames) >= 8:
                size = struct.unpack(">I", self._frames[4:8])[0]
                if len(self._frames) >= 8 + size:
                    payload = bytes(self._frames[8 : 8 + size])
                    del self._frames[: 8 + size]
                    if payload:
                        return payload
                    continue
            ready, _, _ = select.select([self._sock], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                return None
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                return b""
            self._frames += data

    def interrupt(self, keep_pid: int) -> None:
        self._container.exec_run(["bash", "-c", _KILLER, "kill", str(self._keeper), str(keep_pid)], user=self._user)

    def kill(self) -> None:
        self._container.exec_run(["bash", "-c", _KILLER, "kill", str(self._keeper)], user=self._user)
        self._sock.close()

    def exit_code(self) -> int:
        for _ in range(50):  # the exec's status lags the end of its stream a little
            info = self._api.exec_inspect(self._exec)
            if not info["Running"] and info["ExitCode"] is not None:
                return info["ExitCode"]
            time.sleep(0.1)
        return -1


def _keeper(container: Any, user: str, wait: float = 30.0) -> int:
    """The pid of docker-init's only child so far, the session's keeper, which must survive every kill.

    Docker reports the container running once docker-init is up, which forks the keeper a moment later: on a
    loaded host an exec can get there first and find no child yet."""
    deadline = time.monotonic() + wait
    while True:
        r = container.exec_run(["cat", "/proc/1/task/1/children"], user=user)
        pids = r.output.split()
        if pids:
            return int(pids[0])
        if time.monotonic() > deadline:
            raise SandboxError(f"docker-init started no keeper within {wait:.0f} s")
        time.sleep(0.05)


class DockerBackend:
    name = "docker"
    single_file_binds = False  # the workspace shows twice (WORKDIR and MLGym's path): a bind covers one of them

    def workdir(self, workspace: Path) -> str:
        return WORKDIR

    def __init__(
        self,
        image: str = "gymforge-sandbox:latest",
        *,
        base_url: str | None = None,
        gpus: int | Literal["all"] | None = None,
        cpus: float | None = None,
        user: str | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> None:
        import docker

        self._docker = docker
        try:
            self.client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
            self.client.ping()
            img = self.client.images.get(image)
        except docker.errors.ImageNotFound as e:
            raise SandboxError(f"docker image {image!r} not found: build it with scripts/docker_sandbox.sh") from e
        except docker.errors.DockerException as e:
            raise SandboxError(
                f"no docker daemon at {base_url or os.environ.get('DOCKER_HOST', 'the default socket')}: {e}; "
                "start one with scripts/docker_sandbox.sh and export the DOCKER_HOST it prints"
            ) from e
        self.image = image
        disk.sweep()  # workspaces a killed run left on their capped file systems
        image_env = dict(kv.split("=", 1) for kv in img.attrs["Config"].get("Env") or [] if "=" in kv)
        self._path = image_env.get("PATH", PATH)
        self.gpus = gpus
        self.cpus = cpus
        self.user = user if user is not None else ("" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}")
        self.max_output = max_output

    def _run(
        self, ws: Path, command: list[str], limits: Limits, mounts: Sequence[Mount], env: Mapping[str, str] | None,
        ws_read_only: bool = False, cgroup_parent: str | None = None,
    ) -> Any:
        t = self._docker.types
        binds = [t.Mount(WORKDIR, str(ws), type="bind", read_only=ws_read_only),
                 t.Mount(MLGYM_WORKDIR, str(ws), type="bind", read_only=ws_read_only)]  # MLGym's path of it
        binds += [
            t.Mount(resolve_target(m.target, WORKDIR), str(m.host.resolve()), type="bind", read_only=m.read_only)
            for m in mounts
        ]
        kwargs: dict[str, Any] = {}
        if not limits.network:
            kwargs["network_mode"] = "none"
            # No network, so Docker leaves the container's own name out of /etc/hosts; torchrun's c10d store
            # resolves it (as the local sandbox's /etc/hosts allows): loopback, the only interface there is.
            kwargs["extra_hosts"] = {HOSTNAME: "127.0.0.1"}
        if self.cpus:
            kwargs["nano_cpus"] = int(self.cpus * 1e9)
        if cgroup_parent:  # the episode's group: its limits bound this container and its siblings together
            kwargs["cgroup_parent"] = cgroup_parent
        if self.gpus is not None:
            count = -1 if self.gpus == "all" else int(self.gpus)
            kwargs["device_requests"] = [t.DeviceRequest(count=count, capabilities=[["gpu"]])]
        fsize = limits.max_file_mb << 20
        return self.client.containers.run(
            self.image,
            command,
            detach=True,
            init=True,
            mounts=binds,
            working_dir=WORKDIR,
            user=self.user,
            environment=sandbox_env(env, home=WORKDIR, path=self._path, network=limits.network),
            hostname=HOSTNAME,
            mem_limit=f"{limits.memory_mb}m",
            memswap_limit=f"{limits.memory_mb}m",
            pids_limit=limits.max_processes,
            ulimits=[
                t.Ulimit(name="cpu", soft=limits.cpu_seconds, hard=limits.cpu_seconds + 5),  # SIGXCPU, then SIGKILL
                t.Ulimit(name="fsize", soft=fsize, hard=fsize),
                t.Ulimit(name="core", soft=0, hard=0),
                t.Ulimit(name="nofile", soft=limits.open_files, hard=limits.open_files),
            ],
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={limits.tmp_mb}m,mode=1777"},
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            labels={"gymforge.sandbox": "1"},
            **kwargs,
        )

    def _mount_points(self, ws: Path, mounts: Sequence[Mount]) -> list[Path]:
        targets = [PurePosixPath(resolve_target(m.target, WORKDIR)) for m in mounts]
        inside = [ws / t.relative_to(WORKDIR) for t in targets if t.is_relative_to(WORKDIR)]
        return mount_points(ws, inside, None)

    def open(
        self, workspace: Path, *, limits: Limits, mounts: Sequence[Mount] = (), env: Mapping[str, str] | None = None
    ) -> Session:
        ws = _workspace(workspace)
        held = disk.acquire_all(ws, ws, mounts, limits.disk_mb)  # the workspace, and a writable HF_HOME
        hard = ws in held
        created: list[Path] = []
        container = None
        parent: cgroups.DockerParent | None = None

        def close() -> None:
            try:
                if container is not None:
                    container.remove(force=True)
                remove_mount_points(ws, created)
                if parent is not None:
                    parent.remove()
            finally:
                disk.release_all(held)

        try:
            created = self._mount_points(ws, mounts)
            if cgroups.available():
                parent = cgroups.DockerParent(limits.memory_mb, limits.max_processes)
            try:
                container = self._run(ws, ["sleep", "infinity"], limits, mounts, env,
                                      cgroup_parent=parent.path if parent else None)
            except self._docker.errors.APIError as err:
                if parent is None:
                    raise
                # e.g. the systemd cgroup driver, which takes slices only: each container keeps its own limits
                log.warning("docker refused the episode's cgroup parent (%s): session and evaluation are limited "
                            "per container", err)
                parent.remove()
                parent = None
                container = self._run(ws, ["sleep", "infinity"], limits, mounts, env)
            keeper = _keeper(container, self.user)
            session = ShellSession(
                ws, WORKDIR, lambda: _ExecChannel(container, self.user, keeper), self.max_output, close,
                watch=LimitWatch(ws, limits, parent.group if parent else None, strip_setid=True, hard=hard),
                confinement="docker" + ("" if hard else "; disk cap polled"),
            )
            session.cgroup_parent = parent  # type: ignore[attr-defined]  # for run_once(within=session)
            return session
        except BaseException:
            close()
            raise

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
        """`within`: a session of this backend; the container then joins the session's group (`cgroup_parent`),
        whose memory and pids limits bound both containers together."""
        import requests

        parent: cgroups.DockerParent | None = getattr(within, "cgroup_parent", None) if within is not None else None
        if parent is not None and getattr(within, "_closed", False):
            parent = None  # its group is gone with it

        ws = _workspace(workspace)
        hard = not read_only and disk.acquire(ws, limits.disk_mb)
        created: list[Path] = []
        t0 = time.monotonic()
        container = None
        try:
            created = self._mount_points(ws, mounts)
            watch = LimitWatch(ws, limits, strip_setid=True, hard=hard)
            watch.start()
            container = self._run(ws, list(argv), limits, mounts, env, read_only,
                                  cgroup_parent=parent.path if parent else None)
            try:
                code = container.wait(timeout=max(timeout - (time.monotonic() - t0), 0.01))["StatusCode"]
                timed_out = False
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                container.kill()
                code, timed_out = 137, True
            buf = OutputBuffer(self.max_output)
            for chunk in container.logs(stream=True, stdout=True, stderr=True):
                buf.add(chunk)
            container.reload()
            limit = None
            # Killed by the episode's group (the session and this run together)? Only then is its event this
            # run's: otherwise the session's next command names it.
            shared = parent.group.limit_hit() if parent is not None and code == 137 else None
            if container.attrs["State"].get("OOMKilled") or (shared or "").startswith("memory"):
                buf.add(f"\n[killed: out of memory ({limits.memory_mb} MB)]\n".encode())
                limit = (f"memory: {limits.memory_mb} MiB for the episode (its session and this run together)"
                         if shared else f"memory: {limits.memory_mb} MiB for the whole sandbox (a process was killed)")
            limit = limit or shared or watch.after(code)
        finally:
            try:
                if container is not None:
                    container.remove(force=True)
                remove_mount_points(ws, created)
            finally:
                if hard:
                    disk.release(ws)
        return ExecResult(
            output=buf.text(), exit_code=code, timed_out=timed_out, duration_s=round(time.monotonic() - t0, 4),
            limit=limit,
        )


def _workspace(workspace: Path) -> Path:
    ws = workspace.resolve()
    if not ws.is_dir():
        raise SandboxError(f"workspace is not a directory: {ws}")
    return ws
