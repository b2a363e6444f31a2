"""Which GPUs a job may use: lock-based leases, because Snakemake never sets CUDA_VISIBLE_DEVICES.

`snakemake --resources gpu=N` only caps how many GPUs the running jobs *declare* in total; it does not
say which devices each job gets, so two 1-GPU jobs would both land on device 0. Rules therefore run
their command through `gymforge with-gpus {resources.gpu} -- CMD...`, which

- takes `n` device locks (`fcntl.flock` on `<lock_dir>/gpu<id>.lock`, non-blocking tries, polling until
  `n` are free at once; a partial set is released before waiting, so two jobs never deadlock holding
  one device each),
- execs CMD with `CUDA_VISIBLE_DEVICES` set to the leased ids. The lock file descriptors are inherited
  by CMD, so the devices stay leased exactly as long as CMD (and any child still holding them) lives;
  a killed job frees its GPUs with no cleanup.

Devices to choose from:
- `CUDA_VISIBLE_DEVICES` set (by a scheduler such as SLURM, or by the user): only those ids.
  Inside a scheduler job (SLURM_JOB_ID, PBS_JOBID or LSB_JOBID set) that holds exactly `n` ids they are
  passed through without locks: the scheduler already gave this job those devices, and since jobs may
  see their own GPUs renumbered from 0, locking them in a node-wide directory would make unrelated jobs
  wait for each other. A scheduler job with more GPUs than a step needs locks within its ids in a per-job
  subdirectory `job-<id>`. Outside a scheduler (a workstation with CUDA_VISIBLE_DEVICES=2,3 exported)
  the ids are always locked, so concurrent jobs never share a device.
- otherwise ids `0..total-1`, total = `GYMFORGE_GPUS`, else the `GPU` lines of `nvidia-smi -L`, else
  `torch.cuda.device_count()` (asked only where an NVIDIA driver is loaded), else 0 (`device_total`, the one GPU
  counter: task environments use it too).

`n == 0`: the job runs with `CUDA_VISIBLE_DEVICES=""`, i.e. it sees no GPU at all. On a shared
workstation a job that declares no GPU must not quietly allocate memory on device 0 (PyTorch, vLLM and
friends grab a GPU whenever one is visible), and Snakemake's `gpu` limit only counts declared GPUs.

Lock directory: `lock_dir`, else `$GYMFORGE_GPU_LOCKS`, else `/tmp/gymforge-gpu-locks` (created mode
1777 so several users of one machine share it). All jobs that share GPUs must use the same directory.
Device ids are strings: they may be indices ("0") or UUIDs ("GPU-...", "MIG-...").
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

DEFAULT_LOCK_DIR = "/tmp/gymforge-gpu-locks"
POLL_S = 0.5
SCHEDULER_JOB_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")
# Signals a supervising parent (replace_process=False) passes on to the command.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class GpuError(RuntimeError):
    """A lease that can never be granted (more GPUs than exist) or a bad device setting."""


class GpuTimeout(GpuError, TimeoutError):
    """`timeout_s` passed before enough devices were free."""


def visible_devices(env: dict[str, str] | None = None) -> list[str] | None:
    """The ids in CUDA_VISIBLE_DEVICES, or None when it is unset. Empty or "NoDevFiles": []. As in CUDA, an
    invalid entry such as "-1" ends the list."""
    env = os.environ if env is None else env
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    ids: list[str] = []
    for part in raw.split(","):
        part = part.strip()
        if not part or part == "NoDevFiles" or part.startswith("-"):
            break
        ids.append(part)
    return ids


def _nvidia_smi_count() -> int | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    # MIG instances are listed as indented "MIG ..." lines under their GPU; count whole GPUs only.
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


NVIDIA_DRIVER = Path("/proc/driver/nvidia")  # absent: no NVIDIA driver loaded, so torch would find no GPU


def _torch_count() -> int | None:
    if not NVIDIA_DRIVER.exists():
        return None  # spare the seconds an import of torch takes
    try:
        import torch
    except Exception:  # noqa: BLE001 - no torch, or a broken CUDA install: no GPUs known
        return None
    try:
        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001
        return None


def device_total(env: dict[str, str] | None = None) -> tuple[int, str]:
    """(number of GPUs on this machine, where that number came from)."""
    env = os.environ if env is None else env
    raw = env.get("GYMFORGE_GPUS")
    if raw not in (None, ""):
        try:
            total = int(raw)
        except ValueError:
            raise GpuError(f"GYMFORGE_GPUS must be a whole number, not {raw!r}") from None
        if total < 0:
            raise GpuError(f"GYMFORGE_GPUS must be >= 0, not {total}")
        return total, "GYMFORGE_GPUS"
    count = _nvidia_smi_count()
    if count is not None:
        return count, "nvidia-smi -L"
    count = _torch_count()
    if count is not None:
        return count, "torch.cuda.device_count()"
    return 0, "no nvidia-smi and no CUDA-enabled torch"


def gpu_count(env: dict[str, str] | None = None) -> int:
    """GPUs on this machine (`device_total`'s number): what a task environment may give torchrun."""
    return device_total(env)[0]


def candidate_devices(total: int | None = None, env: dict[str, str] | None = None) -> tuple[list[str], str]:
    """The ids a lease chooses from and a description of where they came from."""
    visible = visible_devices(env)
    if visible is not None:
        return visible, f"CUDA_VISIBLE_DEVICES={','.join(visible)!r}"
    if total is None:
        total, source = device_total(env)
    else:
        source = "total argument"
    if total < 0:
        raise GpuError(f"total must be >= 0, not {total}")
    return [str(i) for i in range(total)], f"{total} GPUs from {source}"


def scheduler_job(env: dict[str, str] | None = None) -> str | None:
    """The id of the batch-scheduler job this process runs in (SLURM, PBS/Torque, LSF), or None."""
    env = os.environ if env is None else env
    for var in SCHEDULER_JOB_VARS:
        if env.get(var):
            return env[var]
    return None


def default_lock_dir(env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = Path(env.get("GYMFORGE_GPU_LOCKS") or DEFAULT_LOCK_DIR)
    job = scheduler_job(env)
    if job and visible_devices(env) is not None:
        # Schedulers may renumber each job's GPUs from 0: device "0" of two jobs are different GPUs.
        return base / ("job-" + re.sub(r"[^A-Za-z0-9._-]", "_", job))
    return base


def _lock_path(lock_dir: Path, device: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", device)
    return lock_dir / f"gpu{safe}.lock"


def _make_lock_dir(lock_dir: Path) -> None:
    if lock_dir.is_dir():
        return
    lock_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # shared between users, like /tmp
        os.chmod(lock_dir, 0o1777)


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on path, or None when another process holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's lock file: flock needs no write access
        fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    with contextlib.suppress(OSError):  # who holds it, for people looking at the lock dir
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
    return fd


def _release(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)  # closing the last fd of the open file description drops the flock


class Lease:
    """Devices held by this process: `ids` and the lock fds (empty for a pass-through or n == 0)."""

    def __init__(self, ids: list[str], fds: list[int], waited_s: float, source: str):
        self.ids = ids
        self.fds = fds
        self.waited_s = waited_s
        self.source = source

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.ids)

    def release(self) -> None:
        _release(self.fds)
        self.fds = []


def acquire(n: int, *, lock_dir: str | os.PathLike | None = None, total: int | None = None,
            timeout_s: float | None = None, poll_s: float = POLL_S, env: dict[str, str] | None = None) -> Lease:
    """Take n devices (see the module docstring); the caller must `release()` the returned Lease."""
    if n < 0:
        raise GpuError(f"cannot lease {n} GPUs")
    env = os.environ if env is None else env
    if n == 0:
        return Lease([], [], 0.0, "no GPU requested")
    ids, source = candidate_devices(total, env)
    if n > len(ids):
        raise GpuError(f"asked for {n} GPU{'s' if n > 1 else ''} but only {len(ids)} exist here ({source}); "
                       "lower the rule's gpu resource, or set GYMFORGE_GPUS / CUDA_VISIBLE_DEVICES")
    if visible_devices(env) is not None and len(ids) == n and scheduler_job(env):
        return Lease(list(ids), [], 0.0, f"{source}, passed through")
    directory = Path(lock_dir) if lock_dir is not None else default_lock_dir(env)
    _make_lock_dir(directory)
    started = time.monotonic()
    while True:
        held: list[tuple[str, int]] = []
        for device in ids:
            fd = _try_lock(_lock_path(directory, device))
            if fd is not None:
                held.append((device, fd))
                if len(held) == n:
                    return Lease([d for d, _ in held], [fd for _, fd in held], time.monotonic() - started,
                                 f"{source}, locks in {directory}")
        # Never wait while holding a partial set: two jobs holding one device each would wait forever.
        _release([fd for _, fd in held])
        if timeout_s is not None and time.monotonic() - started >= timeout_s:
            raise GpuTimeout(f"no {n} of {len(ids)} GPUs ({source}) became free within {timeout_s:g} s "
                             f"(locks in {directory})")
        time.sleep(poll_s if timeout_s is None else max(0.0, min(poll_s, timeout_s - (time.monotonic() - started))))


@contextlib.contextmanager
def lease(n: int, *, lock_dir: str | os.PathLike | None = None, total: int | None = None,
          timeout_s: float | None = None, poll_s: float = POLL_S) -> Iterator[list[str]]:
    """Hold n devices for the duration of the block; yields their ids (strings, e.g. ["0", "2"]).

    Blocks (polling every poll_s) until n devices are free at once, or raises GpuTimeout after timeout_s;
    raises GpuError at once when n exceeds the devices there are.
    """
    held = acquire(n, lock_dir=lock_dir, total=total, timeout_s=timeout_s, poll_s=poll_s)
    try:
        yield list(held.ids)
    finally:
        held.release()


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def with_gpus(n: int, argv: Sequence[str], *, lock_dir: str | os.PathLike | None = None, total: int | None = None,
              timeout_s: float | None = None, poll_s: float = POLL_S, replace_process: bool = True,
              quiet: bool = False) -> int:
    """Run argv with CUDA_VISIBLE_DEVICES set to n leased devices ("" for n == 0).

    replace_process=True (what `gymforge with-gpus` does): exec argv in this process; the lock fds are
    inherited, so the lease lives exactly as long as the command. Never returns unless exec fails.
    replace_process=False: run argv as a child, forward SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 to it,
    release the lease when it ends and return its exit code (128+N when killed by signal N).
    """
    if not argv:
        raise GpuError("with_gpus needs a command to run")
    held = acquire(n, lock_dir=lock_dir, total=total, timeout_s=timeout_s, poll_s=poll_s)
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = held.cuda_visible_devices
    if not quiet:
        waited = f" after waiting {held.waited_s:.1f} s" if held.waited_s >= 1 else ""
        print(f"gymforge with-gpus: CUDA_VISIBLE_DEVICES={held.cuda_visible_devices!r} ({held.source}){waited}",
              file=sys.stderr, flush=True)
    if replace_process:
        for fd in held.fds:
            os.set_inheritable(fd, True)
        try:
            os.execvpe(argv[0], list(argv), env)
        except OSError as err:
            held.release()
            print(f"gymforge with-gpus: cannot run {argv[0]!r}: {err}", file=sys.stderr, flush=True)
            return 127 if isinstance(err, FileNotFoundError) else 126
    try:
        try:
            # The child gets no copy of the lock fds: the lease ends when this supervisor releases it.
            proc = subprocess.Popen(list(argv), env=env)
        except OSError as err:
            print(f"gymforge with-gpus: cannot run {argv[0]!r}: {err}", file=sys.stderr, flush=True)
            return 127 if isinstance(err, FileNotFoundError) else 126
        previous = {}

        def forward(signum, _frame):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

        for sig in FORWARDED_SIGNALS:
            with contextlib.suppress(ValueError, OSError):  # not the main thread: no forwarding
                previous[sig] = signal.signal(sig, forward)
        try:
            while True:
                try:
                    return _exit_code(proc.wait())
                except KeyboardInterrupt:  # SIGINT reached us before the handler was installed
                    forward(signal.SIGINT, None)
        finally:
            for sig, handler in previous.items():
                with contextlib.suppress(ValueError, OSError):
                    signal.signal(sig, handler)
    finally:
        held.release()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gymforge with-gpus",
        description="Run CMD with CUDA_VISIBLE_DEVICES set to N GPUs leased through lock files "
                    "(N = 0: no GPU visible). Waits until N devices are free.")
    parser.add_argument("n", type=int, metavar="N", help="GPUs to lease (a rule passes {resources.gpu})")
    parser.add_argument("--lock-dir", default=None,
                        help=f"lock directory (default: $GYMFORGE_GPU_LOCKS or {DEFAULT_LOCK_DIR})")
    parser.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (default: wait)")
    parser.add_argument("--quiet", action="store_true", help="no line on stderr naming the devices")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`gymforge with-gpus [--lock-dir D] [--timeout S] N -- CMD...` (argv: what follows `with-gpus`).

    Execs CMD (never returns) on success; returns 2 on a usage error, 1 when the lease cannot be had.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1:]
    else:
        own, command = argv[:1], argv[1:]
    parser = build_parser()
    try:
        args = parser.parse_args(own)
    except SystemExit as exc:
        return int(exc.code or 0)
    if not command:
        parser.print_usage(sys.stderr)
        print("gymforge with-gpus: error: no command after `--`", file=sys.stderr)
        return 2
    if args.n < 0:
        print(f"gymforge with-gpus: error: N must be >= 0, not {args.n}", file=sys.stderr)
        return 2
    try:
        return with_gpus(args.n, command, lock_dir=args.lock_dir, timeout_s=args.timeout, quiet=args.quiet)
    except GpuError as err:
        print(f"gymforge with-gpus: {err}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
