"""core.atomic: a write that fails leaves the old file (or folder) whole and no temporary behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gymforge.core import atomic


def test_writes_land_whole_and_leave_no_temporary(tmp_path: Path) -> None:
    out = atomic.write_json(tmp_path / "deep" / "report.json", {"ok": 1})
    assert json.loads(out.read_text()) == {"ok": 1}
    atomic.write_yaml(tmp_path / "deep" / "c.yaml", {"a": [1, 2]})
    assert (tmp_path / "deep" / "c.yaml").read_text() == "a:\n- 1\n- 2\n"
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["c.yaml", "report.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = atomic.write_text(tmp_path / "report.json", "old")

    with pytest.raises(TypeError):
        atomic.write_bytes(target, "not bytes")  # type: ignore[arg-type]  # fails inside the write
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_failed_directory_keeps_the_old_one(tmp_path: Path) -> None:
    with atomic.directory(tmp_path / "model") as tmp:
        (tmp / "weights").write_text("v1")
    with pytest.raises(RuntimeError), atomic.directory(tmp_path / "model") as tmp:
        (tmp / "weights").write_text("half of v2")
        raise RuntimeError("killed")
    assert (tmp_path / "model" / "weights").read_text() == "v1"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_temporaries_go_to_the_jobs_scratch_on_the_same_file_system(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv(atomic.SCRATCH_ENV, str(scratch))
    seen: list[str] = []
    real = atomic.os.replace
    monkeypatch.setattr(atomic.os, "replace", lambda src, dst: (seen.append(str(src)), real(src, dst)))
    atomic.write_text(tmp_path / "out.txt", "x")
    assert seen and Path(seen[0]).parent == scratch and (tmp_path / "out.txt").read_text() == "x"
