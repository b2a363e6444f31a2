"""Progress lines (elapsed, ETA) of rollout shards and evaluation jobs, and `gymforge status --watch`."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

from gymforge.cli import main
from gymforge.core.config import GymforgeConfig, ModelSpec
from gymforge.runtime.progress import Progress, fmt_duration
from gymforge.tools.status import collect, render_table, watch
from results_fixture import build_results, config, make_rollout, make_trajectory, rollout_actions


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_fmt_duration() -> None:
    assert fmt_duration(0) == "00:00"
    assert fmt_duration(75.4) == "01:15"
    assert fmt_duration(3725) == "1:02:05"
    assert fmt_duration(None) == fmt_duration(float("nan")) == "--:--"


def test_progress_logs_count_percent_elapsed_and_eta(caplog) -> None:
    clock = Clock()
    log = logging.getLogger("gymforge.test-progress")
    p = Progress(4, "t0003 shard_0001 rollouts", log, stream=io.StringIO(), tty=False, clock=clock)
    with caplog.at_level(logging.INFO, logger="gymforge.test-progress"):
        clock.now += 10
        p.advance(detail="rollout 4: submitted")
        clock.now += 30
        p.advance(2)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "t0003 shard_0001 rollouts 1/4 (25%) elapsed 00:10 ETA 00:30 — rollout 4: submitted",
        "t0003 shard_0001 rollouts 3/4 (75%) elapsed 00:40 ETA 00:13",
    ]


def test_progress_redraws_one_line_on_a_terminal(caplog) -> None:
    clock = Clock()
    stream = io.StringIO()
    p = Progress(2, "runs", logging.getLogger("gymforge.test-progress"), stream=stream, tty=True, clock=clock)
    with caplog.at_level(logging.INFO, logger="gymforge.test-progress"):
        clock.now += 5
        p.advance(detail="run 0")
        assert stream.getvalue() == "\r\x1b[Kruns 1/2 (50%) elapsed 00:05 ETA 00:05 — run 0"
        clock.now += 5
        p.advance(detail="run 1")
    assert stream.getvalue().endswith("\r\x1b[Kruns 2/2 (100%) elapsed 00:10 ETA 00:00 — run 1\n")
    assert stream.getvalue().count("\n") == 1
    assert not caplog.records  # redrawn, not logged


def test_rollout_shard_logs_progress_lines(tmp_path: Path, caplog, monkeypatch) -> None:
    from gymforge.stages.rollouts import _ShardRunner

    cfg = config(tmp_path / "results", per_task=3, shard_size=3, concurrency=1)
    runner = object.__new__(_ShardRunner)
    runner.cfg, runner.slot, runner.stamp = cfg, "t0000", "fp"
    runner.out = tmp_path / "results" / "trajectories" / "t0000" / "shard_0000.json"
    runner.llm, runner.owns_llm = SimpleNamespace(), False

    async def fake_rollout(index: int):
        if index == 1:
            raise RuntimeError("boom")
        return make_rollout(0).model_copy(update={"rollout": index})

    monkeypatch.setattr(runner, "_rollout", fake_rollout)
    with caplog.at_level(logging.INFO, logger="gymforge.rollouts"):
        finished, failures, _ = asyncio.run(runner.run([0, 1, 2]))
    assert sorted(finished) == [0, 2] and len(failures) == 1
    lines = [r.getMessage() for r in caplog.records if "rollouts" in r.getMessage() and "/3" in r.getMessage()]
    assert [re.match(r"t0000 shard_0000 rollouts (\d)/3 \((\d+)%\) elapsed \d\d:\d\d ETA \d\d:\d\d — ", x).groups()
            for x in lines] == [("1", "33"), ("2", "67"), ("3", "100")]
    assert "rollout 1 crashed" in lines[1]
    assert "rollout 2: submitted after 4 steps" in lines[2]


def test_evaluation_job_logs_progress_lines(tmp_path: Path, caplog) -> None:
    from gymforge.stages.evaluation import _run_all

    cfg = GymforgeConfig.model_validate({"evaluate": {"concurrency": 1}})

    class Episodes:
        async def run(self, llm, task_yaml, **kwargs):
            return make_trajectory(rollout_actions(4), calls=4)

    class LLM:
        async def aclose(self) -> None:
            pass

    task = SimpleNamespace(id="demoTask", task_yaml=tmp_path / "demoTask.yaml", root=tmp_path)
    with caplog.at_level(logging.INFO, logger="gymforge.evaluation"):
        finished, failures = asyncio.run(_run_all(cfg, Episodes(), LLM(), ModelSpec(name="teacher", source="teacher"),
                                                  task, [0, 1], None, tmp_path / "runs", "stamp"))
    assert sorted(finished) == [0, 1] and not failures
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("teacher on demoTask runs")]
    assert len(lines) == 2
    assert lines[0].startswith("teacher on demoTask runs 1/2 (50%) elapsed ")
    assert lines[1].startswith("teacher on demoTask runs 2/2 (100%) elapsed ") and "ETA 00:00" in lines[1]
    assert "run 1: submitted after 4 steps" in lines[1] or "run 0: submitted after 4 steps" in lines[1]


# ---- status --watch -----------------------------------------------------------------------------------


def test_status_watch_cli_shows_count_tables(tmp_path: Path, capsys) -> None:
    results = build_results(tmp_path)
    main(["status", "--results", str(results), "--watch", "--interval", "0.01", "--count", "2"])
    out = capsys.readouterr().out
    assert out.count("gymforge status --watch:") == 2
    assert out.count(f"results: {results}") == 2
    assert "\x1b[2J" not in out  # not a terminal: plain tables one after another
    header = next(line for line in out.splitlines() if line.startswith("stage"))
    assert header.split()[-2:] == ["/min", "ETA"]
    trajectories = next(line for line in out.splitlines() if line.startswith("trajectories"))
    assert trajectories.split()[-1] == "done"  # 2 of 2 rollouts finished


def test_status_watch_derives_rates_and_eta_from_progress(tmp_path: Path) -> None:
    results = build_results(tmp_path, shard=False, sft=False)
    cfg = config(results, per_task=4, shard_size=2)
    (results / "config.json").write_text(cfg.model_dump_json())  # 1 verified task x 4 rollouts
    parts = results / "trajectories" / "t0000" / ".shard_0000.parts"
    clock = Clock()

    def sleep(seconds: float) -> None:  # between the two tables: one rollout finishes, 30 s pass
        parts.mkdir(parents=True, exist_ok=True)
        (parts / "r00000.json").write_text(make_rollout(0).model_dump_json())
        clock.now += 30

    out = io.StringIO()
    assert watch(results, interval=30, count=2, out=out, tty=False, sleep=sleep, clock=clock) == 2
    tables = out.getvalue().split("gymforge status --watch:")[1:]
    first = next(line for line in tables[0].splitlines() if line.startswith("trajectories")).split()
    second = next(line for line in tables[1].splitlines() if line.startswith("trajectories")).split()
    assert first[1:3] == ["4", "0"] and first[-2:] == ["-", "-"]
    # 1 rollout in 30 s: 2.0 per minute, 3 left -> 1:30
    assert second[1:3] == ["4", "1"] and second[-2:] == ["2.0", "01:30"]
    assert "watching for 00:30" in tables[1]
    shutil.rmtree(parts)


def test_status_watch_clears_the_screen_on_a_terminal(tmp_path: Path) -> None:
    results = build_results(tmp_path)
    out = io.StringIO()
    watch(results, interval=0, count=2, out=out, tty=True, sleep=lambda s: None)
    assert out.getvalue().count("\x1b[H\x1b[2J") == 2


def test_render_table_without_rates_is_unchanged(tmp_path: Path) -> None:
    report = collect(build_results(tmp_path))
    plain = render_table(report)
    assert "/min" not in plain and "ETA" not in plain
    assert render_table(report, rates={}).splitlines()[1].endswith("/min      ETA")


def test_status_watch_stops_on_ctrl_c(tmp_path: Path) -> None:
    results = build_results(tmp_path)

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    out = io.StringIO()
    assert watch(results, interval=1, out=out, tty=False, sleep=interrupt) == 1
    assert out.getvalue().count(f"results: {results}") == 1
