"""A hard cap on the workspace's size: a file system of its own, as large as `Limits.disk_mb`.

While a sandbox is open on a workspace (a session, or a writable one-shot run), the workspace is a sparse ext4
image loop-mounted over its own host directory: a write past the cap fails at once with ENOSPC, however fast
the writer (`fallocate -l 50G`, dd), and nothing of the host's disk beyond the cap can be taken. The host path
stays the same, so the host-side steps (file tools, the evaluation's copy-out) and the sandbox's bind mount
(bubblewrap, or the docker daemon's) see the same files. The image is populated from the directory when the
first sandbox opens (`mkfs.ext4 -d`), unlinked as soon as it is mounted (the loop device keeps it: a crash
leaves no image file, but the mount stays, with the files, until someone unmounts it), and copied back to a
plain directory when the last sandbox on the workspace closes. Nested users of one workspace (an episode's session and a run on the same workspace) share one image.

This needs root, `mkfs.ext4` and loop devices. Where any is missing (or a workspace is already a mount point
of its own) `acquire` returns False, once logged, and the caller falls back to polling the tree's size
(`LimitWatch`), which a fast writer overshoots until the next look.

In the sandbox's /proc/self/mountinfo the workspace then shows as the root of /dev/loopN: no host path.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gymforge.runtime.procs import pid_alive

from .base import tree_bytes

log = logging.getLogger(__name__)

class _Held:
    """The sandboxes open on one workspace; its lock serialises their first open and last close (the copies)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.refs = 0


_lock = threading.Lock()  # guards _held itself, never held during a copy
_held: dict[str, _Held] = {}
_SLACK = 64 << 20  # room above the workspace's current size when it already exceeds the cap (cleaning up needs some)


def _run(argv: list[str], timeout: float = 120) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise OSError(f"{' '.join(argv[:2])} failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-300:]}")


def _image_bytes(content: int, cap_mb: int) -> int:
    """An image whose free space is about `cap_mb` MiB (or the content plus some slack, if it already holds more):
    ext4's own metadata (inode tables, about 3.1% at one 256-byte inode per 8 KiB, and the group descriptors)
    on top."""
    size = cap_mb << 20 if content <= cap_mb << 20 else content + _SLACK
    return size + size // 28 + (16 << 20)


def _mkfs(image: Path, source: Path | None, size: int) -> None:
    with open(image, "wb") as f:
        f.truncate(size)  # sparse: the host disk holds only what is written
    _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-i", "8192", "-O", "^has_journal", "-E", "nodiscard,lazy_itable_init=1",
          *(["-d", str(source)] if source is not None else []), str(image)])


def _mount(image: Path, at: Path) -> None:
    _run(["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", str(image), str(at)])


def _umount(at: Path) -> None:
    try:
        _run(["umount", str(at)])
    except OSError:
        _run(["umount", "-l", str(at)])  # something still holds it open: detach now, free when it lets go


@functools.cache
def available() -> bool:
    """Whether workspaces can get a file system of their own here (tried once, with a tiny image)."""
    why = None
    if os.geteuid() != 0:
        why = "not root"
    elif not (shutil.which("mkfs.ext4") and shutil.which("mount")):
        why = "no mkfs.ext4"
    else:
        with tempfile.TemporaryDirectory(prefix="gymforge-disk-") as d:
            image, at = Path(d) / "img", Path(d) / "mnt"
            at.mkdir()
            try:
                _mkfs(image, None, 8 << 20)
                _mount(image, at)
                _umount(at)
            except (OSError, subprocess.SubprocessError) as err:
                why = str(err)
    if why:
        log.warning("the workspace disk cap (sandbox.disk_mb) is polled every 2 s, not enforced by a file system of "
                    "its own (%s): a fast writer overshoots it until the next check", why)
    return why is None


def _entry(workspace: Path) -> _Held:
    with _lock:
        return _held.setdefault(str(workspace), _Held())


def acquire(workspace: Path, cap_mb: int) -> bool:
    """Put `workspace` (a resolved host path, no sandbox running on it) on a file system of about `cap_mb` MiB,
    or count one more user of the one it is on. False: not possible here, the caller polls instead."""
    held = _entry(workspace)
    with held.lock:
        if held.refs:
            held.refs += 1
            return True
        if not available() or os.path.ismount(workspace):
            return False
        try:
            _capture(workspace, cap_mb)
        except (OSError, subprocess.SubprocessError) as err:
            log.warning("workspace %s stays on the host's disk, its cap polled: %s", workspace.name, err)
            return False
        held.refs = 1
        return True


def release(workspace: Path) -> None:
    """One user of `workspace` is done (its processes are gone); the last one puts the files back on the host's
    disk and removes the file system."""
    held = _entry(workspace)
    with held.lock:
        if held.refs == 0:
            return
        held.refs -= 1
        if held.refs == 0:  # the entry stays: a later acquire must wait on this same lock until the copy is done
            _restore(workspace)


def acquire_all(ws: Path, workspace: Path | None, mounts: Sequence[Any], cap_mb: int) -> list[Path]:
    """`acquire` for the workspace (unless None: read-only) and for every writable mount's directory outside `ws`
    (a session's HF_HOME: as writable as the workspace, so as capped); returns what was put on a file system of
    its own, for `release_all`."""
    held: list[Path] = []
    try:
        if workspace is not None and acquire(workspace, cap_mb):
            held.append(workspace)
        for m in mounts:
            host = m.host.resolve()
            if not m.read_only and host.is_dir() and not host.is_relative_to(ws) and host not in held:
                if acquire(host, cap_mb):
                    held.append(host)
    except BaseException:
        release_all(held)
        raise
    return held


def release_all(held: list[Path]) -> None:
    errors = []
    for path in reversed(held):
        try:
            release(path)
        except OSError as err:  # the others still go back
            errors.append(err)
    if errors:
        raise errors[0]


def _sibling(workspace: Path, what: str) -> Path:
    # The pid names the owner: `sweep` tells a dead process's file systems from a live one's by it.
    return workspace.parent / f".{workspace.name}.{what}-{os.getpid()}-{secrets.token_hex(4)}"


_IMAGE = re.compile(r"\.img-(\d+)-[0-9a-f]{8} \(deleted\)$")


def sweep() -> list[str]:
    """Unmount the capped file systems whose process died without giving them back (kill -9): their directories
    become plain empty directories again, so a rerun can remove and recreate its run directory (the files of
    the dead run go with them). Called when a backend is made; returns the mount points swept."""
    if os.geteuid() != 0:
        return []
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    swept = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, where = right.split(), left.split()
        if len(fields) < 2 or len(where) < 5 or fields[0] != "ext4" or not fields[1].startswith("/dev/loop"):
            continue
        try:
            backing = Path("/sys/block", fields[1].removeprefix("/dev/"), "loop", "backing_file").read_text().strip()
        except OSError:
            continue
        m = _IMAGE.search(backing)
        if m is None or pid_alive(int(m.group(1))):
            continue
        point = re.sub(r"\\([0-7]{3})", lambda o: chr(int(o.group(1), 8)), where[4])  # mountinfo's octal escapes
        try:
            _run(["umount", "-l", point])
        except (OSError, subprocess.SubprocessError) as err:
            log.warning("could not unmount the stale workspace file system at %s: %s", point, err)
            continue
        log.warning("unmounted the workspace file system a dead process (pid %s) left at %s", m.group(1), point)
        swept.append(point)
    return swept


def _capture(ws: Path, cap_mb: int) -> None:
    st = os.lstat(ws)
    staged = _sibling(ws, "in")
    image = _sibling(ws, "img")
    os.rename(ws, staged)
    mounted = False
    try:
        _mkfs(image, staged, _image_bytes(tree_bytes(staged), cap_mb))
        os.mkdir(ws, 0o700)
        _mount(image, ws)
        mounted = True
        os.rmdir(ws / "lost+found")
        os.chown(ws, st.st_uid, st.st_gid)
        os.chmod(ws, st.st_mode & 0o7777)
    except BaseException:
        if mounted:
            _umount(ws)
        if ws.is_dir():
            os.rmdir(ws)
        os.rename(staged, ws)
        raise
    finally:
        image.unlink(missing_ok=True)  # the loop device holds it while mounted; freed with the mount
    shutil.rmtree(staged, ignore_errors=True)


def _restore(ws: Path) -> None:
    out = _sibling(ws, "out")
    try:
        # Every process of the sandboxes is gone: the tree is still. Links are copied as links, never followed.
        _run(["cp", "-a", "--", f"{ws}/.", str(out)], timeout=3600)
    except (OSError, subprocess.SubprocessError) as err:
        shutil.rmtree(out, ignore_errors=True)
        log.error("could not copy workspace %s off its capped file system; it stays mounted: %s", ws, err)
        return
    _umount(ws)
    os.rmdir(ws)
    os.rename(out, ws)
