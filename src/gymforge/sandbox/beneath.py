"""Host-side file access inside a directory that sandboxed code can change at any moment.

Host steps (the agent's file tools, ownership changes, artefact copies, mount-point cleanup) may run as
root while code in the sandbox renames, swaps (renameat2 RENAME_EXCHANGE) and symlinks entries of the
same directory. Resolving a path and then opening it is a race such code can win. Everything here works
on file descriptors instead: a path is walked one component at a time from an open directory with
O_NOFOLLOW, so a symlink anywhere on the way fails the call (ELOOP / ENOTDIR) instead of leading out of
the tree, and every later step (stat, chown, read, write, unlink) acts on what was opened, not on a name
that may have changed meanwhile. `..` is refused outright, so nothing resolves above the root.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO planted by the code must not hang us


class OutsideError(OSError):
    """A path that would leave its root (`..`, absolute) or pass through a symlink."""


def parts_of(rel: str | PurePosixPath) -> list[str]:
    """The components of a relative path; refuses `..` and absolute paths ("." components drop out)."""
    p = PurePosixPath(rel)
    if p.is_absolute():
        raise OutsideError(errno.EXDEV, f"{rel}: not a relative path")
    parts = [x for x in p.parts if x != "."]
    if ".." in parts:
        raise OutsideError(errno.EXDEV, f"{rel}: '..' is not allowed here")
    return parts


def _explain(err: OSError, rel: str) -> OSError:
    if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return OutsideError(err.errno, f"{rel}: a component is a symlink or not a directory (symlinks are not followed)")
    return err


def open_root(root: Path) -> int:
    """An fd of a host-controlled directory (the root itself must not be a symlink)."""
    return os.open(root, _DIR)


def open_dir(root: Path | int, rel: str | PurePosixPath = ".") -> int:
    """An fd of the directory `rel` beneath `root`, no symlink followed on the way. Caller closes it."""
    fd = open_root(root) if not isinstance(root, int) else os.dup(root)
    try:
        for part in parts_of(rel):
            nfd = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except OSError as err:
        os.close(fd)
        raise _explain(err, str(rel)) from None
    return fd


@contextmanager
def parent_of(root: Path | int, rel: str | PurePosixPath) -> Iterator[tuple[int, str]]:
    """(fd of the parent directory, final name) of `rel` beneath `root`."""
    parts = parts_of(rel)
    if not parts:
        raise OutsideError(errno.EISDIR, f"{rel}: names the root itself")
    fd = open_dir(root, PurePosixPath(*parts[:-1]) if len(parts) > 1 else ".")
    try:
        yield fd, parts[-1]
    finally:
        os.close(fd)


def open_file(root: Path | int, rel: str | PurePosixPath, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """An fd of the file `rel` beneath `root` (never through a symlink, the final component included)."""
    with parent_of(root, rel) as (dfd, name):
        try:
            return os.open(name, flags | _NOFOLLOW, mode, dir_fd=dfd)
        except OSError as err:
            raise _explain(err, str(rel)) from None


def lstat(root: Path | int, rel: str | PurePosixPath) -> os.stat_result:
    parts = parts_of(rel)
    if not parts:
        fd = open_dir(root)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)
    with parent_of(root, rel) as (dfd, name):
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)


def read_bytes(root: Path | int, rel: str | PurePosixPath, limit: int = 64 << 20) -> bytes:
    """The content of a regular file beneath `root`, at most `limit` bytes (more is an error)."""
    fd = open_file(root, rel)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{rel}: not a regular file")
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"{rel}: {st.st_size} bytes, more than the {limit} this reads")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)[:limit]
    finally:
        os.close(fd)


def write_bytes(root: Path | int, rel: str | PurePosixPath, data: bytes, *, create: bool = False) -> os.stat_result:
    """Replace the content of a regular file beneath `root` (or create it, failing if it exists).

    A file with more than one link is refused: it may be a hard link to a file outside the tree.
    Returns the stat of the parent directory (for ownership decisions by the caller).
    """
    with parent_of(root, rel) as (dfd, name):
        flags = os.O_WRONLY | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(name, flags | _NOFOLLOW, 0o644, dir_fd=dfd)
        except OSError as err:
            raise _explain(err, str(rel)) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, f"{rel}: not a regular file")
            if st.st_nlink > 1:
                raise OSError(errno.EPERM, f"{rel}: has {st.st_nlink} hard links; refusing to write through them")
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            parent = os.fstat(dfd)
            if create and os.geteuid() == 0:
                os.fchown(fd, parent.st_uid, parent.st_gid)
            return parent
        finally:
            os.close(fd)


def walk_files(root: Path | int, rel: str | PurePosixPath = ".", *, hidden: bool = True) -> Iterator[tuple[str, int]]:
    """(path relative to `rel`, fd of its directory) of every regular file beneath root/rel, symlinks skipped.

    The fd is valid only until the next item; open the file with `os.open(name, ..., dir_fd=fd)`.
    """
    top = open_dir(root, rel)
    try:
        for dirpath, dirnames, filenames, dfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            dirnames[:] = sorted(d for d in dirnames if hidden or not d.startswith("."))
            for name in sorted(filenames):
                if not hidden and name.startswith("."):
                    continue
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    yield os.path.normpath(os.path.join(dirpath, name)), dfd
    finally:
        os.close(top)


def read_at(dfd: int, name: str, limit: int) -> bytes | None:
    """A regular file's content by directory fd and name, None when it is not one or is larger than `limit`."""
    try:
        fd = os.open(os.path.basename(name), os.O_RDONLY | _NOFOLLOW, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit)
    finally:
        os.close(fd)


def chown_tree(root: Path, uid: int, gid: int | None = None) -> None:
    """Give `uid` every entry beneath `root` that has an owner write bit, by fd, never following a link (`root`
    itself, when it is a regular file)."""
    gid = uid if gid is None else gid
    if stat.S_ISREG(os.lstat(root).st_mode):  # a single-file mount
        os.chown(root, uid, gid, follow_symlinks=False)
        return
    top = open_root(root)
    try:
        os.chown(top, uid, gid)
        for _, dirnames, filenames, dfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            for name in dirnames + filenames:
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if st.st_mode & 0o200:
                        os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    continue  # gone or replaced meanwhile: nothing of ours to change
    finally:
        os.close(top)


class CopyLimitError(OSError):
    """A copy would exceed its size or file-count cap."""


def copy_tree(
    src: Path,
    dst: Path,
    *,
    max_bytes: int,
    max_files: int = 100_000,
    skip: frozenset[str] = frozenset(),
    only: list[str] | None = None,
) -> list[str]:
    """Copy regular files and directories of `src` into the new directory `dst`, never following a link.

    Symlinks, devices, FIFOs and sockets are left out and returned (relative paths); the relative paths in
    `skip` (mount points) are left out silently. `only` limits the copy to those relative paths (files or directories).
    Over `max_bytes` in total or `max_files` files, raises CopyLimitError. Copies are owned by the caller.
    """
    left_out: list[str] = []
    total = files = 0
    dst.mkdir(mode=0o755)
    dst_top = open_root(dst)
    try:
        roots = only if only is not None else ["."]
        for start in roots:
            try:
                st = lstat(src, start)
            except OSError:
                left_out.append(start)
                continue
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                left_out.append(start)
                continue
            if stat.S_ISREG(st.st_mode):
                with parent_of(src, start) as (sdfd, name):
                    _ensure_dirs(dst_top, PurePosixPath(start).parent)
                    total += _copy_file(sdfd, name, dst_top, start, max_bytes - total)
                    files += 1
                continue
            top = open_dir(src, start)
            try:
                for dirpath, dirnames, filenames, dfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                    rel_dir = os.path.normpath(os.path.join(start, dirpath))
                    if skip:
                        dirnames[:] = [d for d in dirnames if os.path.normpath(os.path.join(rel_dir, d)) not in skip]
                        filenames = [f for f in filenames if os.path.normpath(os.path.join(rel_dir, f)) not in skip]
                    _ensure_dirs(dst_top, PurePosixPath(rel_dir))
                    for name in filenames:
                        rel = os.path.normpath(os.path.join(rel_dir, name))
                        try:
                            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                        except OSError:
                            continue
                        if not stat.S_ISREG(st.st_mode):
                            left_out.append(rel)
                            continue
                        files += 1
                        if files > max_files:
                            raise CopyLimitError(errno.EFBIG, f"more than {max_files} files")
                        total += _copy_file(dfd, name, dst_top, rel, max_bytes - total)
                    for name in list(dirnames):  # fwalk lists links to directories here, never enters them
                        try:
                            if stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                                left_out.append(os.path.normpath(os.path.join(rel_dir, name)))
                        except OSError:
                            continue
            finally:
                os.close(top)
    finally:
        os.close(dst_top)
    return left_out


def _ensure_dirs(top: int, rel: PurePosixPath) -> None:
    fd = os.dup(top)
    try:
        for part in parts_of(rel):
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            nfd = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)


def _copy_file(sdfd: int, name: str, dst_top: int, rel: str, budget: int) -> int:
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=sdfd)
    except OSError:
        return 0  # gone, or swapped for a link since it was listed
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return 0
        with parent_of(dst_top, rel) as (ddfd, dname):
            out = os.open(dname, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=ddfd)
            n = 0
            try:
                while chunk := os.read(fd, 1 << 20):
                    n += len(chunk)
                    if n > budget:
                        raise CopyLimitError(errno.EFBIG, "over the size cap")
                    os.write(out, chunk)
            finally:
                os.close(out)
        return n
    finally:
        os.close(fd)


def make_dir(root: Path, rel: str, uid: int | None = None) -> None:
    """Make the directory `rel` beneath `root` (its parent must exist), mode 0755, owned by `uid` if given."""
    with parent_of(root, rel) as (dfd, name):
        os.mkdir(name, 0o755, dir_fd=dfd)
        if uid is not None:
            os.chown(name, uid, uid, dir_fd=dfd, follow_symlinks=False)


def remove_entries(root: Path, rels: list[str]) -> None:
    """Remove mount points the host made beneath `root`, deepest first: empty directories and empty files
    only, each by its parent's fd (a directory swapped for a symlink makes the removal fail, not stray)."""
    for rel in sorted(rels, key=lambda r: -len(parts_of(r))):
        try:
            with parent_of(root, rel) as (dfd, name):
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    os.rmdir(name, dir_fd=dfd)  # fails, and stays, when the code put something in it
                elif stat.S_ISLNK(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_size == 0):
                    os.unlink(name, dir_fd=dfd)
        except OSError:
            continue


def strip_setid(root: Path) -> int:
    """Clear set-user-ID and set-group-ID bits beneath `root` (by fd, links never followed); returns how many
    files had them. For trees that code running as root in a container could mark setuid-root."""
    found = 0
    top = open_root(root)
    try:
        for _, _, filenames, dfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            for name in filenames:
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                        fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=dfd)
                        try:
                            os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                            found += 1
                        finally:
                            os.close(fd)
                except OSError:
                    continue
    finally:
        os.close(top)
    return found
