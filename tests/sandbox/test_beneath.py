"""sandbox.beneath: host-side file access inside a tree that sandboxed code controls never leaves the tree, whether
by `..`, an absolute path, a symlink (on the way or at the end) or a hard link to a file outside."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gymforge.sandbox import beneath


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/ (the sandbox's) with a file, a folder, and links to a secret outside it."""
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("inside")
    (root / "link.txt").symlink_to(secret)
    (root / "dirlink").symlink_to(tmp_path)
    os.link(secret, root / "hard.txt")
    return root


@pytest.mark.parametrize("rel", ["../secret.txt", "sub/../../secret.txt", "/etc/passwd"])
def test_paths_that_leave_the_root_are_refused(tree: Path, rel: str) -> None:
    with pytest.raises(beneath.OutsideError):
        beneath.read_bytes(tree, rel)


@pytest.mark.parametrize("rel", ["link.txt", "dirlink/secret.txt"])
def test_no_symlink_is_followed_on_the_way_or_at_the_end(tree: Path, rel: str) -> None:
    with pytest.raises(OSError):
        beneath.read_bytes(tree, rel)
    with pytest.raises(OSError):
        beneath.write_bytes(tree, rel, b"overwritten")
    assert (tree.parent / "secret.txt").read_text() == "host secret"


def test_reads_and_writes_inside_the_tree(tree: Path) -> None:
    assert beneath.read_bytes(tree, "sub/a.txt") == b"inside"
    beneath.write_bytes(tree, "sub/a.txt", b"changed")
    beneath.write_bytes(tree, "sub/new.txt", b"new", create=True)
    assert (tree / "sub" / "a.txt").read_bytes() == b"changed" and (tree / "sub" / "new.txt").read_bytes() == b"new"
    with pytest.raises(OSError, match="more than the 3"):
        beneath.read_bytes(tree, "sub/a.txt", limit=3)


def test_a_hard_link_to_a_file_outside_is_not_written_through(tree: Path) -> None:
    with pytest.raises(OSError, match="hard links"):
        beneath.write_bytes(tree, "hard.txt", b"overwritten")
    assert (tree.parent / "secret.txt").read_text() == "host secret"


def test_walk_and_copy_leave_links_out(tree: Path, tmp_path: Path) -> None:
    walked = sorted(rel for rel, _fd in beneath.walk_files(tree))
    assert walked == ["hard.txt", "sub/a.txt"]  # a hard link is a regular file; symlinks are skipped
    left_out = beneath.copy_tree(tree, tmp_path / "copy", max_bytes=1 << 20)
    assert sorted(left_out) == ["dirlink", "link.txt"]
    assert (tmp_path / "copy" / "sub" / "a.txt").read_text() == "inside" and not (tmp_path / "copy" / "link.txt").exists()
    with pytest.raises(beneath.CopyLimitError):
        beneath.copy_tree(tree, tmp_path / "small", max_bytes=4)
