"""runtime.nodelocal: agents' workspaces go to the node's own disk ($TMPDIR) when the job has one."""

from __future__ import annotations

from pathlib import Path

import pytest

from gymforge.runtime.nodelocal import scratch, workspaces


def test_without_tmpdir_the_workspaces_sit_beside_the_output(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    assert workspaces(tmp_path / "shard_0000.json", ".work") == tmp_path / ".work"


def test_with_tmpdir_one_output_maps_to_one_node_local_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    out = tmp_path / "results" / "trajectories" / "t0001" / "shard_0000.json"
    first = workspaces(out, ".work")
    assert first.parent == tmp_path / "scratch" and first.name.startswith("gymforge-") and first.name.endswith("-work")
    assert workspaces(out, ".work") == first  # a rerun of the same job clears what its predecessor left
    assert workspaces(out.with_name("shard_0001.json"), ".work") != first


def test_scratch_starts_empty_and_is_removed_even_when_the_job_fails(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    out = tmp_path / "results" / "environments" / "t0001" / "verified"
    left = workspaces(out, ".t0001-work")
    left.mkdir(parents=True)
    (left / "from-a-killed-job").write_text("x")
    with scratch(out, ".t0001-work") as path:
        assert path == left and not list(path.iterdir())  # the predecessor's leftovers are gone
        (path / "run").mkdir()
    assert not path.exists()
    with pytest.raises(RuntimeError), scratch(out, ".t0001-work") as path:
        raise RuntimeError("the job failed")
    assert not path.exists() and not (tmp_path / "results").exists()  # nothing was written beside the results
