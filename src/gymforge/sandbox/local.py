"""The local backend: sandboxed process trees on this machine.

Confinement, best first (detected at runtime, `confinement` says which one is in force):

- "bwrap": bubblewrap with new pid, ipc, uts, cgroup and (unless `Limits.network`) network namespaces.
  The view holds read-only system directories (/usr, the /bin-/lib links, a short list of /etc files
  without /etc/shadow), the Python prefixes (venv and base interpreter), a private /tmp and /dev/shm,
  the workspace (writable, at `WORKDIR`, /workspace) and the mounts. Nothing else of the host is visible, and
  read-only mounts cannot be modified. Killing the bwrap process kills the whole pid namespace.
- "unshare-net" (root only): `unshare` with new network, pid and mount namespaces. No network and the
  process tree dies with its pid namespace, but the whole host file system is visible and writable.
- "none": a plain process group; setsid'd escapees survive a kill. Logged as a warning.

Limits are rlimits set by a `bash -c 'ulimit ...'` wrapper, so they hold for every process in the
tree and only root outside bwrap could raise them again: CPU time (SIGXCPU, exit 152; SIGKILL 5 s
later), address space (not for a sandbox given GPUs: CUDA reserves more than any sensible cap; the cgroup or the
job's allocation bounds memory there) and file size per process; RLIMIT_NPROC for `max_processes`. RLIMIT_NPROC counts all tasks (threads too) of a uid and does not apply to root, so:
as root with bwrap each session runs as its own unprivileged uid (derived from the workspace path, in [1000000, 2000000), set with
`setpriv` inside the sandbox after the mounts are made) and gets exactly `max_processes`; the workspace
and writable mounts are chowned to that uid (entries without an owner write bit stay as they are, use a
read-only Mount for anything the code must not change). As a non-root user the limit is the tasks that
uid already has plus `max_processes`. As root without bwrap the process limit is not enforced.

bwrap's --die-with-parent is tied to the thread that opened the session: keep a session in the thread
that opened it (or in the main thread).
"""
# long file: the bubblewrap backend whole, so every isolation flag and mount it sets is reviewed in one place

from __future__ import annotations

import functools
import hashlib
import logging
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Callable, Literal

from . import beneath, cgroups, disk
from .base import (
    DEFAULT_MAX_OUTPUT,
    HOSTNAME,
    PATH,
    MLGYM_WORKDIR,
    WORKDIR,
    ExecResult,
    Limits,
    LimitWatch,
    Mount,
    OutputBuffer,
    SandboxError,
    Session,
    missing_ancestry,
    mount_points,
    remove_mount_points,
    resolve_target,
    sandbox_env,
)
from .shell import ShellSession, collect

log = logging.getLogger(__name__)

Confinement = Literal["bwrap", "unshare-net", "none"]

_ETC = (
    "alternatives", "ca-certificates", "ca-certificates.conf", "debian_version", "fonts", "gai.conf",
    "group", "host.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "mime.types",
    "nsswitch.conf", "os-release", "passwd", "protocols", "services", "ssl", "timezone",
)  # fmt: skip
_UID_BASE, _UID_SPAN = 1_000_000, 1_000_000  # below 2**21: old tar formats store uids in 7 octal digits
_INSTALL = "install it with `apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`"
_UNSHARE = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]


def _is_root() -> bool:
    return os.geteuid() == 0


VENV = "/opt/venv"
"""Where a virtualenv's interpreter is shown under bwrap, so that $PATH names no host path."""


def _venv() -> str | None:
    return os.path.realpath(sys.prefix) if sys.prefix != sys.base_prefix else None


def _python_prefixes() -> list[str]:
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    return sorted(p for p in prefixes if not p.startswith("/usr/"))


class _View:
    """bwrap arguments that build the sandbox's file system view, in order."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self._tmpfs: set[str] = {"/"}  # bwrap's own root is a tmpfs
        self._host: set[str] = set()

    def _parents(self, dst: str) -> None:
        # bwrap would create missing parents with mode 0700, which the unprivileged uid cannot traverse.
        for p in map(str, reversed(Path(dst).parents)):
            if any(p == h or p.startswith(h + "/") for h in self._host):
                return  # inside a host bind: must already exist on the host
            if p not in self._tmpfs:
                self.args += ["--perms", "0755", "--dir", p]
                self._tmpfs.add(p)

    def bind(self, flag: str, src: str, dst: str) -> None:
        self._parents(dst)
        self.args += [flag, src, dst]
        self._host.add(dst)

    def tmpfs(self, dst: str, size_mb: int) -> None:
        self._parents(dst)
        self.args += ["--perms", "1777", "--size", str(size_mb << 20), "--tmpfs", dst]
        self._tmpfs.add(dst)

    def data(self, fd: str, dst: str) -> None:
        """A read-only file of the sandbox's own, its content read from `fd`."""
        self._parents(dst)
        self.args += ["--perms", "0644", "--ro-bind-data", fd, dst]

    def special(self, flag: str, dst: str) -> None:
        self.args += [flag, dst]
        self._tmpfs.add(dst)


def _bwrap_argv(
    ws: Path, limits: Limits, mounts: Sequence[Mount], uid: int | None, gpus: bool, ws_read_only: bool = False
) -> list[str]:
    """bwrap's arguments: the host workspace `ws` appears at WORKDIR, relative mount targets under it."""
    a = ["bwrap", "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid", "--unshare-uts"]
    a += ["--unshare-cgroup-try", "--hostname", HOSTNAME]
    if not limits.network:
        a.append("--unshare-net")
    # As root: no user namespace, so that setpriv can switch to a real unprivileged uid for RLIMIT_NPROC.
    a += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if _is_root() else ["--unshare-user"]
    v = _View()
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = Path("/", name)
        if p.is_symlink():  # merged /usr
            v.args += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            v.bind("--ro-bind", str(p), str(p))
    v.bind("--ro-bind", "/usr", "/usr")
    for name in _ETC + (("resolv.conf",) if limits.network else ()):
        if os.path.exists(p := f"/etc/{name}"):
            v.bind("--ro-bind", p, p)
    # The sandbox's own hostname must resolve (torchrun's c10d store looks it up), and the host's names stay out.
    v.data(_HOSTS_FD, "/etc/hosts")
    v.special("--proc", "/proc")
    v.special("--dev", "/dev")
    v.tmpfs("/tmp", limits.tmp_mb)
    v.tmpfs("/dev/shm", limits.tmp_mb)
    # After the tmpfs: a virtualenv that lives under /tmp (a CI checkout) must stay visible.
    for p in _python_prefixes():
        v.bind("--ro-bind", p, p)
    if venv := _venv():
        v.bind("--ro-bind", venv, VENV)
    if gpus:
        for dev in sorted(Path("/dev").glob("nvidia*")):
            v.bind("--dev-bind", str(dev), str(dev))
        v.bind("--ro-bind", "/sys", "/sys")
    v.bind("--ro-bind" if ws_read_only else "--bind", str(ws), WORKDIR)
    # MLGym's path of the workspace (its evaluators hard-code it): a symlink in world-readable parents.
    parent = str(Path(MLGYM_WORKDIR).parent)
    v.args += ["--perms", "0755", "--dir", str(Path(parent).parent), "--perms", "0755", "--dir", parent,
               "--symlink", WORKDIR, MLGYM_WORKDIR]
    for m in sorted(mounts, key=lambda m: resolve_target(m.target, WORKDIR).count("/")):
        v.bind("--ro-bind" if m.read_only else "--bind", str(m.host.resolve()), resolve_target(m.target, WORKDIR))
    a += v.args + ["--chdir", WORKDIR, "--"]
    if uid is not None:
        a += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--no-new-privs"]
        a.append("--")
    return a


@functools.cache
def _bwrap_works() -> bool:
    if not shutil.which("bwrap"):
        return False
    with tempfile.TemporaryDirectory() as d:
        argv, fds = _with_fds(_bwrap_argv(Path(d), Limits(), [], _UID_BASE if _is_root() else None, False) + ["true"])
        try:
            r = subprocess.run(argv, capture_output=True, timeout=60, pass_fds=fds)
        finally:
            for fd in fds:
                os.close(fd)
    if r.returncode:
        log.warning("bwrap is installed but a trial run failed: %s", r.stderr.decode(errors="replace").strip())
    return r.returncode == 0


@functools.cache
def _unshare_works() -> bool:
    if not (_is_root() and shutil.which("unshare")):
        return False
    return subprocess.run(_UNSHARE + ["--net", "true"], capture_output=True, timeout=60).returncode == 0


def detect_confinement() -> Confinement:
    if _bwrap_works():
        return "bwrap"
    if _unshare_works():
        return "unshare-net"
    return "none"


def _workspace_uid(ws: Path) -> int:
    """One uid per workspace: an episode's shell and its evaluation runs must own the same files, while
    concurrent episodes still get separate process limits."""
    digest = hashlib.sha256(str(ws.resolve()).encode()).hexdigest()
    return _UID_BASE + int(digest, 16) % _UID_SPAN


def _user_tasks(uid: int) -> int:
    """Tasks (threads included, as RLIMIT_NPROC counts them) that `uid` runs right now."""
    n = 0
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and d.stat().st_uid == uid:
                n += len(os.listdir(d / "task"))
        except OSError:
            continue
    return n


def _proc_status(pid: str) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


_ARGS_FD = "{args-fd}"
_HOSTS_FD = "{hosts-fd}"
_HOSTS = f"127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback {HOSTNAME}\n".encode()


def _with_fds(argv: list[str]) -> tuple[list[str], tuple[int, ...]]:
    """`argv` with bwrap's options moved to a pipe and the sandbox's /etc/hosts in another; the fds to pass on
    (the caller closes them once the child has them)."""
    fds: list[int] = []
    try:
        if _HOSTS_FD in argv:
            fds.append(_pipe_with(_HOSTS))
            argv = [str(fds[-1]) if a == _HOSTS_FD else a for a in argv]
        argv, options = _hide_bwrap_options(argv)
        if options is not None:
            fds.append(_pipe_with(options))
            argv = [str(fds[-1]) if a == _ARGS_FD else a for a in argv]
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return argv, tuple(fds)


def _hide_bwrap_options(argv: list[str]) -> tuple[list[str], bytes | None]:
    """bwrap's options move to a pipe (`--args FD`): bwrap stays pid 1 of the sandbox, and its command
    line, which names host paths, would otherwise be readable there in /proc/1/cmdline and `ps -ef`."""
    if "bwrap" not in argv:
        return argv, None
    i = argv.index("bwrap")
    j = argv.index("--", i)
    return argv[: i + 1] + ["--args", _ARGS_FD] + argv[j:], "".join(a + "\0" for a in argv[i + 1 : j]).encode()


def _pipe_with(data: bytes) -> int:
    """The read end of a pipe that holds `data` and then ends."""
    r, w = os.pipe()
    try:
        if len(data) > 60_000:  # more than a pipe buffer surely holds: write while bwrap reads
            threading.Thread(target=_write_all, args=(w, data), daemon=True).start()
            return r
        _write_all(w, data)
    except BaseException:
        os.close(r)
        raise
    return r


def _write_all(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


class _Proc:
    """A sandboxed process tree whose root is a child of this process (the Channel of local sessions)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, confinement: Confinement) -> None:
        self.confinement = confinement
        argv, fds = _with_fds(argv)
        # A new session: the tree gets a process group of its own that one killpg reaches.
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=env, cwd=cwd, start_new_session=True, pass_fds=fds,
            )  # fmt: skip
        finally:
            for fd in fds:
                os.close(fd)
        self._out = self.proc.stdout.fileno()  # type: ignore[union-attr]
        self._ns: str | None = None

    def send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass  # the shell is gone; recv() reports the end of the stream

    def recv(self, timeout: float) -> bytes | None:
        ready, _, _ = select.select([self._out], [], [], max(timeout, 0))
        return os.read(self._out, 1 << 16) if ready else None

    def _members(self) -> Callable[[str], int | None]:
        """Maps a host pid to its pid as the sandbox sees it, or None when it is not in the sandbox."""
        if self.confinement == "none":

            def by_session(pid: str) -> int | None:
                with open(f"/proc/{pid}/stat") as f:
                    session = int(f.read().rsplit(")", 1)[1].split()[3])
                return int(pid) if session == self.proc.pid else None

            return by_session
        if self._ns is None:  # the namespace of the child of bwrap/unshare (pid 1 inside)
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if _proc_status(pid)["PPid"] == str(self.proc.pid):
                        self._ns = os.readlink(f"/proc/{pid}/ns/pid")
                        break
                except (OSError, KeyError):
                    continue
        ns = self._ns

        def by_namespace(pid: str) -> int | None:
            if ns is None or os.readlink(f"/proc/{pid}/ns/pid") != ns:
                return None
            return int(_proc_status(pid)["NSpid"].split()[-1])

        return by_namespace

    def _sweep(self, keep: set[int], member: Callable[[str], int | None]) -> None:
        def victims() -> list[int]:
            found = []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    inner = member(pid)
                    if inner is not None and inner not in keep and _proc_status(pid)["State"][0] != "Z":
                        found.append(int(pid))
                except (OSError, KeyError, IndexError, ValueError):
                    continue  # gone meanwhile, or not ours to inspect
            return found

        cgroups.kill_until_gone(victims, rounds=100, pause=0.005)

    def interrupt(self, keep_pid: int) -> None:
        # Pid 1 of a namespace is bwrap's reaper or the shell itself (unshare); killing it kills all.
        self._sweep({keep_pid} if self.confinement == "none" else {1, keep_pid}, self._members())

    def kill(self) -> None:
        member = self._members()  # before the kill: the namespace is found through its living pid 1
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        # The namespace dies with its pid 1, but asynchronously; "none" has no namespace at all.
        self._sweep(set(), member)
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                try:
                    f.close()
                except BrokenPipeError:
                    pass

    def exit_code(self) -> int:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return -1
        return 128 - rc if rc < 0 else rc


class LocalBackend:
    name = "local"

    def __init__(
        self,
        confinement: Literal["auto", "bwrap", "unshare-net", "none"] = "auto",
        *,
        gpus: bool = False,
        max_output: int = DEFAULT_MAX_OUTPUT,
        allow_weak_confinement: bool = False,
    ) -> None:
        if confinement == "auto":
            confinement = detect_confinement()
        elif confinement == "bwrap" and not _bwrap_works():
            raise SandboxError(f"bwrap confinement requested but bubblewrap is missing or does not work here; {_INSTALL}")
        elif confinement == "unshare-net" and not _unshare_works():
            raise SandboxError("unshare-net confinement requested but `unshare` does not work here (needs root)")
        if confinement != "bwrap" and not allow_weak_confinement:
            raise SandboxError(
                f"the local sandbox needs bubblewrap to confine untrusted code (found: {confinement}); {_INSTALL}. "
                "Weaker confinement lets that code read and write the host's files, held-out answers included; "
                "to accept that anyway set sandbox.allow_weak_confinement: true"
            )
        self.confinement: Confinement = confinement
        disk.sweep()  # workspaces a killed run left on their capped file systems
        self.gpus = gpus
        self.max_output = max_output
        if confinement != "bwrap":
            log.warning(
                "local sandbox without bubblewrap (confinement=%r): sandboxed code sees the host file system%s",
                confinement,
                "" if confinement == "unshare-net" else " and the network, and setsid'd processes escape kills",
            )
            if _is_root():
                log.warning("max_processes is not enforced for root without bwrap")

    @property
    def single_file_binds(self) -> bool:
        return self.confinement == "bwrap"  # MLGym's path of the workspace is a link to it

    def workdir(self, workspace: Path) -> str:
        # Only bwrap builds the file system view; the weaker confinements show the host's.
        return WORKDIR if self.confinement == "bwrap" else str(workspace.resolve())

    def _prepare(
        self, workspace: Path, limits: Limits, mounts: Sequence[Mount], env: Mapping[str, str] | None,
        ws_read_only: bool = False, within: Session | None = None, cap_mounts: bool = False,
    ) -> tuple[Path, list[str], dict[str, str], Callable[[], None], LimitWatch]:
        """The argv prefix and environment of one sandbox, its limit watch and the cleanup to run when it is gone.
        `cap_mounts`: the writable mounts outside the workspace (a session's HF_HOME) get a disk cap of their own."""
        ws = workspace.resolve()
        if not ws.is_dir():
            raise SandboxError(f"workspace is not a directory: {ws}")
        held = disk.acquire_all(ws, None if ws_read_only else ws, mounts if cap_mounts else (), limits.disk_mb)
        try:
            return self._prepare_on(ws, limits, mounts, env, ws_read_only, within, held)
        except BaseException:
            disk.release_all(held)
            raise

    def _prepare_on(
        self, ws: Path, limits: Limits, mounts: Sequence[Mount], env: Mapping[str, str] | None, ws_read_only: bool,
        within: Session | None, held: list[Path],
    ) -> tuple[Path, list[str], dict[str, str], Callable[[], None], LimitWatch]:
        hard = ws in held
        extra = dict(env or {})
        if self.gpus and "CUDA_VISIBLE_DEVICES" in os.environ:
            extra.setdefault("CUDA_VISIBLE_DEVICES", os.environ["CUDA_VISIBLE_DEVICES"])
        python_bin = f"{VENV}/bin" if self.confinement == "bwrap" and _venv() else str(Path(sys.executable).parent)
        full_env = sandbox_env(extra, home=self.workdir(ws), path=f"{python_bin}:{PATH}", network=limits.network)
        nproc: int | None = None
        if self.confinement == "bwrap":
            uid = _workspace_uid(ws) if _is_root() else None
            if uid is not None:
                for p in ([] if ws_read_only else [ws]) + [m.host.resolve() for m in mounts if not m.read_only]:
                    beneath.chown_tree(p, uid)
                nproc = limits.max_processes
            created = mount_points(ws, [Path(resolve_target(m.target, str(ws))) for m in mounts], uid)
            prefix = _bwrap_argv(ws, limits, mounts, uid, self.gpus, ws_read_only)
            cleanup = functools.partial(remove_mount_points, ws, created)
        else:
            links, shadowed = _link_mounts(ws, mounts)
            prefix = [] if self.confinement == "none" else _UNSHARE + ([] if limits.network else ["--net"])
            cleanup = functools.partial(_unlink_mounts, ws, links, shadowed)
        if not _is_root():
            nproc = _user_tasks(os.getuid()) + limits.max_processes
        ulimit = f"ulimit -c 0{_address_space(limits, self.gpus)} -f {limits.max_file_mb * 1024} -n {limits.open_files}"
        if nproc is not None:
            ulimit += f" -u {nproc}"
        # SIGXCPU at the soft limit tells "out of CPU time" apart from other kills; SIGKILL 5 s later.
        ulimit += f" && ulimit -S -t {limits.cpu_seconds} && ulimit -H -t {limits.cpu_seconds + 5}"
        # Under unshare the wrapper stays as pid 1: the kernel spares a namespace's init the signals it
        # has no handler for, SIGXCPU included, so the code itself must never be pid 1.
        run = '"$@"; exit $?' if self.confinement == "unshare-net" else 'exec "$@"'
        prefix += ["bash", "--noprofile", "--norc", "-c", f"{ulimit} && {run}", "gymforge-sandbox"]
        group = None
        if cgroups.available():
            parent = getattr(getattr(within, "_watch", None), "group", None) if within is not None else None
            group = cgroups.SandboxGroup(limits.memory_mb, limits.max_processes, parent)
            prefix = group.wrap(prefix)
            cleanup = _then(cleanup, group.remove)
        if held:  # last: the sandbox's processes are gone by then
            cleanup = _then(cleanup, functools.partial(disk.release_all, held))
        return ws, prefix, full_env, cleanup, LimitWatch(ws, limits, group, hard=hard)

    def open(
        self, workspace: Path, *, limits: Limits, mounts: Sequence[Mount] = (), env: Mapping[str, str] | None = None
    ) -> Session:
        ws, prefix, full_env, cleanup, watch = self._prepare(workspace, limits, mounts, env, cap_mounts=True)
        argv = prefix + ["bash", "--noprofile", "--norc"]
        try:
            return ShellSession(
                ws, self.workdir(ws), lambda: _Proc(argv, full_env, ws, self.confinement), self.max_output, cleanup,
                watch=watch, confinement=self.confinement + ("" if watch.hard else "; disk cap polled"),
            )
        except BaseException:
            cleanup()
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
        ws, prefix, full_env, cleanup, watch = self._prepare(workspace, limits, mounts, env, read_only, within)
        t0 = time.monotonic()
        buf = OutputBuffer(self.max_output)
        limit = None
        watch.start()
        try:
            p = _Proc(prefix + list(argv), full_env, ws, self.confinement)
            p.proc.stdin.close()  # type: ignore[union-attr]
            deadline = t0 + timeout
            ended = False
            while not ended and time.monotonic() < deadline and p.proc.poll() is None:
                ended = collect(p, min(deadline, time.monotonic() + 0.2), buf)
                if limit := watch.during():
                    deadline = time.monotonic()  # stop it as a timeout would
            if not ended and p.proc.poll() is not None:
                # Drain: the output may outlive the process, held open by what it left behind ("none").
                collect(p, time.monotonic() + 0.5, buf)
            try:
                p.proc.wait(timeout=max(deadline - time.monotonic(), 0))
                code, timed_out = p.exit_code(), False
            except subprocess.TimeoutExpired:
                code, timed_out = 137, limit is None
            p.kill()
            limit = limit or watch.after(code)
        finally:
            cleanup()
        return ExecResult(
            output=buf.text(), exit_code=code, timed_out=timed_out, duration_s=round(time.monotonic() - t0, 4),
            limit=limit,
        )


def _address_space(limits: Limits, gpus: bool) -> str:
    """The `ulimit` option that caps each process's address space, or none for a sandbox given GPUs: CUDA maps far
    more virtual memory than it uses (a CUDA context reserves tens of GiB), so the cap would stop CUDA from starting
    rather than bound memory. There the sandbox's cgroup (`cgroups`), or where there is none the job's own
    allocation (SLURM's cgroup, `mem_mb`), bounds memory instead."""
    if gpus:
        if not cgroups.available():
            log.warning("a GPU sandbox without a writable cgroup: its memory is bounded only by the job's allocation")
        return ""
    return f" -v {limits.memory_mb * 1024}"


def _then(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        try:
            first()
        finally:
            second()

    return both


def _link_mounts(ws: Path, mounts: Sequence[Mount]) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """Without bwrap a mount is a symlink in the workspace; read-only is then not enforced. Like a mount, the link
    hides what the workspace holds at its target (a data folder of the task's files, say) until the sandbox
    ends: that is moved aside and back (`_unlink_mounts`). Returns the paths made and the (aside, target) pairs."""
    created: list[Path] = []
    shadowed: list[tuple[Path, Path]] = []
    try:
        for m in mounts:
            target = Path(resolve_target(m.target, str(ws)))
            host = m.host.resolve()
            if target == host:
                continue
            if not target.is_relative_to(ws) or target == ws:
                raise SandboxError(f"mount at {target} needs bwrap confinement (outside the workspace)")
            if os.path.lexists(target):
                aside = target.with_name(f".{target.name}.gymforge-hidden-{secrets.token_hex(4)}")
                os.rename(target, aside)
                shadowed.append((aside, target))
            missing = missing_ancestry(ws, target)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(host)
            created += missing
            if m.read_only:
                log.warning("read-only mount %s -> %s is not enforced without bwrap", host, target)
    except BaseException:
        _unlink_mounts(ws, created, shadowed)
        raise
    return created, shadowed


def _unlink_mounts(ws: Path, created: list[Path], shadowed: list[tuple[Path, Path]]) -> None:
    remove_mount_points(ws, created)
    for aside, target in reversed(shadowed):
        try:
            os.rename(aside, target)
        except OSError as e:  # the sandboxed code put something there: what it wrote stays, the original aside
            log.warning("could not put %s back at %s: %s", aside, target, e)
