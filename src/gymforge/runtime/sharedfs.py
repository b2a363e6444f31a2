"""What a results directory's file system gives the run's shared state: locks that hold across hosts, or not.

The LLM ledger and budget (`gymforge.llm.ledger`) serialize every process of a run with `flock` on a file in
`<results>/llm/`. On one host any local file system does that. On a cluster the jobs run on many nodes, and the
lock holds between them only where the file system forwards `flock` to a lock server:

- Lustre mounted with `flock` does; with `localflock` each node has its own locks (two nodes can hold "the" lock
  at once), and with neither (`noflock`, the default) `flock` fails.
- NFS forwards `flock` (as whole-file byte-range locks) unless mounted with `local_lock=flock|all` or `nolock`.
- GPFS/Spectrum Scale and CephFS forward it. BeeGFS does only with `tuneUseGlobalFileLocks` in the client's
  configuration, which the mount table does not show.

`lock_mount(path)` reads the mount table and answers `ok`, `per_node` (locks are per node: fine when every job of
the run is on one node), `unknown` (a shared file system whose locks this cannot read off the mount) or `broken`
(`flock` itself fails here).
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Local file systems: one host sees them, and there flock always holds.
_LOCAL = {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs", "ramfs", "reiserfs", "jfs"}
_GLOBAL = {"gpfs", "ceph", "fuse.ceph", "fuse.cephfs"}


@dataclass(frozen=True)
class MountLocks:
    state: str  # ok | per_node | unknown | broken
    mount_point: str
    fstype: str
    why: str


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mount_of(path: str | Path, mountinfo: str | None = None) -> tuple[str, str, set[str]]:
    """(mount point, file system type, mount and super options) of the mount that holds `path`."""
    target = os.path.realpath(path)
    if mountinfo is None:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
    best = ("/", "unknown", set())
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 6 or len(rest) < 3:
            continue
        point = _unescape(fields[4])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, rest[0], set(fields[5].split(",")) | set(rest[2].split(",")))
    return best


def _flock_works(directory: Path) -> str | None:
    """None when an exclusive flock can be taken on a file in `directory`, else the error."""
    try:
        fd, name = tempfile.mkstemp(prefix=".gymforge-flock-probe-", dir=directory)
    except OSError as err:
        return f"cannot create a file there: {err.strerror}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as err:
        return f"flock fails: {errno.errorcode.get(err.errno, err.errno)} ({err.strerror})"
    finally:
        os.close(fd)
        os.unlink(name)
    return None


def lock_mount(path: str | Path, mountinfo: str | None = None, *, probe: bool = True) -> MountLocks:
    """Whether `flock` on files under `path` (an existing directory) holds across the hosts that mount it."""
    point, fstype, opts = mount_of(path, mountinfo)
    if probe and (err := _flock_works(Path(path))):
        return MountLocks("broken", point, fstype, err)
    if fstype == "lustre":
        if "localflock" in opts:
            return MountLocks("per_node", point, fstype, "Lustre mounted with localflock: each node has its own locks")
        if "flock" in opts:
            return MountLocks("ok", point, fstype, "Lustre mounted with flock: locks are cluster-wide")
        return MountLocks("broken", point, fstype, "Lustre mounted without flock (noflock): flock fails")
    if fstype in ("nfs", "nfs4"):
        local = next((o.split("=", 1)[1] for o in opts if o.startswith("local_lock=")), "none")
        if "nolock" in opts or local in ("flock", "all"):
            return MountLocks("per_node", point, fstype, f"NFS mounted with {'nolock' if 'nolock' in opts else 'local_lock=' + local}: locks stay on each client")
        return MountLocks("ok", point, fstype, "NFS forwards flock to the server (as whole-file locks)")
    if fstype in _GLOBAL:
        return MountLocks("ok", point, fstype, f"{fstype} forwards flock: locks are cluster-wide")
    if fstype in _LOCAL:
        return MountLocks("ok", point, fstype, f"a local {fstype} file system: one host, whose locks hold")
    return MountLocks("unknown", point, fstype, f"a {fstype} file system: whether its locks hold across nodes is "
                      "not shown in the mount table (BeeGFS: tuneUseGlobalFileLocks=true in beegfs-client.conf)")
