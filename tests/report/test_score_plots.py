"""The score figures are written, non-empty PNGs, also with a model that has a single run."""

from __future__ import annotations

import json
from pathlib import Path

from gymforge.benchmark import aup
from gymforge.report import score_plots
from gymforge.benchmark.aup import TaskMeta

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(root: Path, name: str, agent, baseline=None) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({"agent": agent, "baseline": baseline}))


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_score_plots(tmp_path):
    runs_dir = tmp_path / "runs"
    for i, s in enumerate([0.6, 0.7, 0.65, 0.8]):
        write_run(runs_dir, f"teacher__t1__run{i}", [{"acc": s - 0.1}, {"acc": s}], {"acc": 0.5})
    write_run(runs_dir, "student__t1__run0", [{"acc": 0.55}], {"acc": 0.5})  # a single run: drawn as a point
    for i in range(2):  # equal values: no violin possible, points instead
        write_run(runs_dir, f"student__t2__run{i}", [{"loss": 1.0}], {"loss": 2.0})
    write_run(runs_dir, "teacher__t3__run0", [{"other": 1.0}], {"m": 1.0})  # a task without any score
    metas = {"t1": TaskMeta(id="t1", metric="acc", higher_is_better=True),
             "t2": TaskMeta(id="t2", metric="loss", higher_is_better=False),
             "t3": TaskMeta(id="t3", metric="m", higher_is_better=True)}
    runs = aup.load_runs(runs_dir)
    _, result = aup.score_runs(runs, metas)
    out = tmp_path / "plots"
    assert_png(score_plots.violins(runs, metas, out / "violins.png"))
    assert_png(score_plots.aup_bars(result, out / "aup.png"))
    assert_png(score_plots.performance_profiles(result, out / "profiles.png"))
    assert sorted(p.name for p in out.iterdir()) == ["aup.png", "profiles.png", "violins.png"]


def test_violins_without_runs(tmp_path):
    out = score_plots.violins([], {"t": TaskMeta(id="t", metric="m", higher_is_better=True)}, tmp_path / "v.png")
    assert_png(out)
