"""`gymforge show-task` and `gymforge show-trajectory` on a hand-built results directory."""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

import pytest

from gymforge.agent.trajectory import write_trajectory
from gymforge.cli import main
from results_fixture import DEBUG_ERROR, SCRIPT_OBS, TASK_ID, build_results, make_rollout, rollout_actions


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return build_results(tmp_path)


def run_cli(capsys, *argv: str) -> str:
    main(list(argv))
    return capsys.readouterr().out


# ---- show-task ---------------------------------------------------------------------------------------


def test_show_task_by_slot_shows_every_stage(results: Path, capsys) -> None:
    out = run_cli(capsys, "show-task", "t0000", "--results", str(results))
    assert f"t0000: {TASK_ID}" in out
    assert "topic: Demo regression of y" in out
    assert "resolved dataset: demo/data" in out
    # the configs come from the verified tree, in full (they are short)
    assert "--- configs/tasks/demoTask.yaml" in out and "--- configs/datasets/demo_data.yaml" in out
    assert "task_entrypoint: CSVSubmissionTasks" in out and "data_path: data/demoTask/data" in out
    # the config-generation repair, the baseline
    assert "attempt 1: 1 errors" in out and "must equal the file name stem" in out
    assert "baseline scores: acc=0.5" in out
    # files
    assert str(results / "environments" / "t0000" / "report.json") in out
    assert str(results / "trajectories" / "t0000") in out


def test_show_task_shows_verification_errors_of_the_debug_loop(results: Path, capsys) -> None:
    out = run_cli(capsys, "show-task", "t0000", "--results", str(results))
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip().startswith("#1 generation"))
    assert "1 error(s)" in lines[first] and "baseline 3.2s" in lines[first]
    # the iteration's error, every line of it, right under it
    block = "\n".join(lines[first + 1:first + 4])
    for part in DEBUG_ERROR.splitlines():
        assert part.strip() in block
    second = lines[first + 4]
    assert second.strip().startswith("#2 debug") and "0 error(s)" in second and "episode submitted" in second
    assert "episode 40.0s" in second


def test_show_task_trajectory_stats_and_sft_verdicts(results: Path, capsys) -> None:
    out = run_cli(capsys, "show-task", "t0000", "--results", str(results))
    assert "trajectories: 2 rollout(s)" in out
    assert "exit statuses: submitted: 1, submission_not_found (submit): 1" in out
    assert "kept by the SFT filter: 1/2 (discarded: no_successful_submission: 1)" in out
    assert "t0000-r00000" in out and "kept" in out
    assert "discarded (no_successful_submission)" in out


def test_show_task_before_the_sft_filter_reads_the_shards(tmp_path: Path, capsys) -> None:
    results = build_results(tmp_path, sft=False)
    out = run_cli(capsys, "show-task", "t0000", "--results", str(results))
    assert "trajectories: 2 rollout(s) (shards in" in out
    assert "SFT filter: not run yet" in out
    assert "final scores: min 0.75" in out


def test_show_task_by_task_id_and_skipped_slot(results: Path, capsys) -> None:
    assert f"t0000: {TASK_ID}" in run_cli(capsys, "show-task", TASK_ID, "--results", str(results))
    out = run_cli(capsys, "show-task", "t0001", "--results", str(results))
    assert "duplicate_topic" in out and "skipped" in out and "verification: 0 iteration(s)" in out


def test_show_task_unknown_names_the_known_ids(results: Path) -> None:
    with pytest.raises(SystemExit) as err:
        main(["show-task", "noSuchTask", "--results", str(results)])
    assert "noSuchTask" in str(err.value) and TASK_ID in str(err.value)


def test_show_task_json(results: Path, capsys) -> None:
    summary = json.loads(run_cli(capsys, "show-task", "t0000", "--results", str(results), "--json"))
    assert [it["errors"] for it in summary["iterations"]] == [[DEBUG_ERROR], []]
    assert summary["task_id"] == TASK_ID and len(summary["rollouts"]) == 2


# ---- show-trajectory ---------------------------------------------------------------------------------


def test_show_trajectory_of_a_shard_rollout(results: Path, capsys) -> None:
    shard = results / "trajectories" / "t0000" / "shard_0000.json"
    out = run_cli(capsys, "show-trajectory", str(shard), "--rollout", "0")
    for action in rollout_actions(4):
        assert f"$ {action}" in out
    assert "slot / rollout  t0000 / 0" in out
    assert "score: acc=0.75" in out  # at validate and at submit
    assert out.count("score: acc=0.75") == 2
    assert "exit status: submitted" in out
    assert "5 calls, 5000 tokens sent, 600 received" in out
    assert "(46 more lines)" in out  # the long observation is clipped to 15 lines
    other = run_cli(capsys, "show-trajectory", str(shard), "--rollout", "1")
    assert "submission_not_found (submit)" in other and "slot / rollout  t0000 / 1" in other


def test_show_trajectory_default_rollout_and_unknown_rollout(results: Path, capsys) -> None:
    shard = results / "trajectories" / "t0000" / "shard_0000.json"
    out = run_cli(capsys, "show-trajectory", str(shard))
    assert "pick another with --rollout K" in out
    with pytest.raises(SystemExit) as err:
        main(["show-trajectory", str(shard), "--rollout", "7"])
    assert "no rollout 7" in str(err.value) and "[0, 1]" in str(err.value)


def test_show_trajectory_html_is_self_contained_and_escaped(results: Path, tmp_path: Path, capsys) -> None:
    shard = results / "trajectories" / "t0000" / "shard_0000.json"
    out_html = tmp_path / "page.html"
    run_cli(capsys, "show-trajectory", str(shard), "--rollout", "1", "--html", str(out_html))
    page = out_html.read_text()
    for action in rollout_actions(6):
        assert f'<pre class="action">{html.escape(action)}</pre>' in page
    assert "<script" not in page  # the observation's <script> is escaped, and the page has none of its own
    assert html.escape(SCRIPT_OBS) in page
    assert "<link" not in page and "src=" not in page and "@import" not in page
    # the 61-line observation is collapsible, a short one is not
    assert "<details><summary>observation (61 lines" in page
    assert '<pre class="observation">output of step 2</pre>' in page
    assert "submission_not_found (submit)" in page and page.startswith("<!DOCTYPE html>")


def test_show_trajectory_of_traj_file_and_run_folder(tmp_path: Path, capsys) -> None:
    rec = make_rollout(0)
    folder = tmp_path / "runs" / f"m__{TASK_ID}__run0"
    write_trajectory(folder / f"{TASK_ID}.traj", rec.trajectory)
    (folder / "results.json").write_text(json.dumps({"agent": rec.trajectory.info.score, "baseline": {"acc": 0.25}}))
    (folder / "run.json").write_text(json.dumps({"fingerprint": "x", "summary": {
        "run": 0, "seed": 1, "folder": "f", "exit_status": "submitted", "scores": [], "replies": 5, "malformed": 1,
        "steps": 4, "valid_submission": True, "wall_s": 12.5}}))
    out = run_cli(capsys, "show-trajectory", str(folder))
    assert "baseline         acc=0.25" in out or "acc=0.25" in out
    assert "valid submission True, 5 replies (1 malformed)" in out
    assert "$ validate" in out
    out = run_cli(capsys, "show-trajectory", str(folder / f"{TASK_ID}.traj"))
    assert "$ submit" in out and "exit status: submitted" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit) as err:
        main(["show-trajectory", str(empty)])
    assert "no .traj file" in str(err.value)
    shutil.rmtree(empty)
