"""`gymforge import-trajectories` and `sft.extra_sources`: MLGym run folders and gymforge shards as SFT examples."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gymforge.agent.sources import import_candidates, mlgym_messages, mlgym_model, source_files
from gymforge.core.config import GymforgeConfig
from gymforge.tools.import_trajectories import import_trajectories as run_import
from gymforge.core.prompts import templates_dir
from gymforge.stages.sft import build_sft
from gymforge.core.records import (AgentInfo, Flag, RolloutRecord, SandboxRef, ShardRecord, TeacherRef, Trajectory,
                                   TrajectoryStep)
from gymforge.student.tokenizer import build_tokenizer

RUN = "metagen-modelX__taskA__default__t-0.00__p-0.95__c-4.00__install-0__parallel_agents_run_{k}"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return build_tokenizer("offline", tmp_path_factory.mktemp("tok") / "tokenizer", templates_dir(), [])


def mlgym_traj(actions: list[str], *, scores: list[dict] | None = None, forced_exit: str | None = None,
               tag: str = "") -> dict[str, Any]:
    """A `.traj` shaped like MLGym's: history entries carry `agent`, replies `thought`/`action`."""
    agent = "primary_0"
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "SETTING: you are an agent", "agent": agent},
        {"role": "user", "content": f"TASK DESCRIPTION:\nsolve it {tag}\nline3", "agent": agent},
    ]
    steps = []
    for i, action in enumerate(actions, 1):
        reply = f"DISCUSSION\nstep {i} {tag}\n\n```\n{action}\n```"
        history.append({"role": "assistant", "content": reply, "thought": f"DISCUSSION\nstep {i}", "action": action,
                        "agent": agent})
        history.append({"role": "user", "content": f"out {i}\n(Current Step: {i})\nbash-$", "agent": agent})
        steps.append({"action": action, "observation": f"out {i}", "response": reply, "thought": f"step {i}",
                      "execution_time": 0.1,
                      "state": json.dumps({"open_file": "n/a", "working_dir": "/home/agent/workspace"})})
    if forced_exit:
        history.append({"role": "assistant", "content": f"Exit due to {forced_exit}", "agent": agent,
                        "thought": f"Exit due to {forced_exit}", "action": f"exit_{forced_exit}"})
    info = {"exit_status": f"autosubmission (exit_{forced_exit})" if forced_exit else "submitted",
            "score": [{"Score": 1.5}] if scores is None else scores, "model_stats": {}}
    return {"environment": "mlgym_main", "trajectory": steps, "history": history, "info": info}


def write_run(root: Path, k: int, data: dict[str, Any], task: str = "taskA") -> Path:
    folder = root / RUN.format(k=k).replace("taskA", task)
    folder.mkdir(parents=True)
    (folder / f"{task}.traj").write_text(json.dumps(data))
    (folder / "results.json").write_text(json.dumps({"agent": data["info"]["score"], "baseline": {"Score": 1.0}}))
    return folder


def cfg_for(tmp_path: Path, **filters: Any) -> GymforgeConfig:
    return GymforgeConfig.model_validate({"results_dir": str(tmp_path / "results"), "filter": filters})


# ---- the conversation as the model saw it -----------------------------------------------------------


def test_mlgym_example_is_the_last_request_as_mlgym_sent_it_plus_the_last_real_reply():
    data = mlgym_traj([f"cmd{i}" for i in range(1, 9)], forced_exit="cost")
    # another agent's entries (a multi-agent run) were never in this agent's prompts
    data["history"].insert(3, {"role": "user", "content": "other agent", "agent": "primary_1"})
    messages = mlgym_messages(data["history"])
    assert messages is not None
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user"] + ["assistant", "user"] * 7 + ["assistant"]
    assert all(set(m) == {"role", "content"} for m in messages)
    assert messages[-1]["content"].endswith("```\ncmd8\n```")  # not the forced "Exit due to cost" entry
    assert messages[1]["content"].startswith("TASK DESCRIPTION")  # the first user message is always kept
    users = [m["content"] for m in messages if m["role"] == "user"][1:]  # the 7 observations before the reply
    assert users[:2] == ["Old output omitted (3 lines)"] * 2
    assert users[2:] == [f"out {i}\n(Current Step: {i})\nbash-$" for i in range(3, 8)]
    assert "other agent" not in json.dumps(messages)


def test_demonstrations_stay_whole_and_do_not_count_as_observations():
    data = mlgym_traj([f"cmd{i}" for i in range(1, 8)])
    data["history"].insert(1, {"role": "user", "content": "DEMO\nx", "agent": "primary_0", "is_demo": True})
    messages = mlgym_messages(data["history"])
    assert messages is not None and messages[1]["content"] == "DEMO\nx"
    users = [m["content"] for m in messages if m["role"] == "user"]
    assert users[1].startswith("TASK DESCRIPTION") and users[2] == "Old output omitted (3 lines)"
    assert sum(u.startswith("out ") for u in users) == 5


def test_a_run_without_a_real_reply_has_no_example():
    data = mlgym_traj([], forced_exit="context")
    assert mlgym_messages(data["history"]) is None
    assert mlgym_model("metagen-gpt4o2__taskA__default") == "metagen-gpt4o2" and mlgym_model("run1") == "unknown"


# ---- filters and outputs ----------------------------------------------------------------------------------


def test_import_of_mlgym_runs_applies_every_filter_and_records_the_source(tmp_path, tokenizer_dir):
    import datasets

    runs = tmp_path / "runs"
    write_run(runs, 0, mlgym_traj(["ls", "python train.py", "validate", "submit"], tag="a"))
    write_run(runs, 1, mlgym_traj(["ls", "submit"], scores=[], tag="b"))  # never scored
    write_run(runs, 2, mlgym_traj(["cat /answers/labels.csv", "submit"], tag="c"))  # reads the answers
    write_run(runs, 3, mlgym_traj(["rm evaluate.py", "submit"], tag="d"))  # deletes the evaluation
    write_run(runs, 4, mlgym_traj(["ls", "python train.py", "validate", "submit"], tag="a"))  # same as run 0
    write_run(runs, 5, mlgym_traj(["ls"] * 30 + ["submit"], tag="e"), task="taskB")  # too long
    write_run(runs, 6, mlgym_traj([], forced_exit="context", scores=[{"Score": 1.2}]), task="taskB")
    (runs / "notes.txt").write_text("ignored")
    stats = run_import(cfg_for(tmp_path, max_tokens=600), [runs], tokenizer_dir, tmp_path / "out")

    assert stats["rollouts"] == 7 and stats["kept"] == 1
    assert stats["discarded"] == {"flagged": 2, "no_successful_submission": 1, "no_assistant_turn": 1,
                                  "too_long": 1, "duplicate": 1}
    assert stats["audit"]["by_code"] == {"answers_path": 1, "eval_tamper": 1}
    assert stats["sources"] == {str(runs): {"rollouts": 7, "kept": 1, "discarded": stats["discarded"]}}
    assert json.loads((tmp_path / "out" / "stats.json").read_text()) == stats
    ds = datasets.load_from_disk(str(tmp_path / "out" / "dataset"))
    row = ds[0]
    assert len(ds) == 1 and row["id"] == RUN.format(k=0) and row["task"] == "taskA"
    assert (row["teacher"], row["metric"], row["score"], row["seed"]) == ("metagen-modelX", "Score", 1.5, None)
    assert json.loads(row["source"]) == {"origin": str(runs), "format": "mlgym", "path": RUN.format(k=0),
                                         "model": "metagen-modelX", "history_processor": "Last5Observations"}
    assert row["messages"] == mlgym_messages(mlgym_traj(["ls", "python train.py", "validate", "submit"],
                                                        tag="a")["history"])
    summary = [json.loads(line) for line in (tmp_path / "out" / "rollouts.jsonl").read_text().splitlines()]
    assert [s["reason"] for s in summary] == [None, "no_successful_submission", "flagged", "flagged", "duplicate",
                                             "too_long", "no_assistant_turn"]

    # flagged runs are kept (and still counted) when exclude_flagged is off
    stats = run_import(cfg_for(tmp_path, max_tokens=600, exclude_flagged=False), [runs], tokenizer_dir,
                       tmp_path / "out2")
    assert stats["kept"] == 3 and stats["audit"]["flagged_rollouts"] == 2


EVAL = "/home/agent/workspace/evaluate.py"


def with_open_file(data: dict[str, Any], step: int, open_file: str, observation: str) -> dict[str, Any]:
    """`data` with step `step` (0-based) run while `open_file` was open, printing `observation`."""
    data["trajectory"][step]["state"] = json.dumps({"open_file": open_file, "working_dir": "/home/agent/workspace"})
    data["trajectory"][step]["observation"] = observation
    return data


def test_an_mlgym_run_whose_only_flag_is_a_rejected_evaluator_edit_is_kept(tmp_path, tokenizer_dir):
    runs = tmp_path / "runs"
    edit = "edit 1:3\ndef row_strategy(history):\n    return 0\nend_of_edit"
    # MLGym's evaluate.py is chmod 555: the edit, meant for strategy.py, was refused and changed nothing
    write_run(runs, 0, with_open_file(mlgym_traj(["open evaluate.py", edit, "submit"], tag="a"), 1, EVAL,
                                      f"Error: You cannot edit read-only file {EVAL}"))
    # an older MLGym edit tool: bash's redirection failed, then the tool printed "File updated" regardless
    write_run(runs, 1, with_open_file(mlgym_traj(["open evaluate.py", edit, "submit"], tag="b"), 1, EVAL,
                                      f"/home/agent/commands/edit_linting.sh: line 79: {EVAL}: Permission denied\n"
                                      f"[File: {EVAL} (41 lines total)]\n1:import json\nFile updated."))
    # a writable evaluator: the edit applied, the run stays out
    write_run(runs, 2, with_open_file(mlgym_traj(["open evaluate.py", edit, "submit"], tag="c"), 1, EVAL,
                                      f"[File: {EVAL} (43 lines total)]\n1:def row_strategy(history):\nFile updated."))
    found = list(import_candidates(runs))
    assert [c.flags for c in found] == [["eval_edit_rejected"], ["eval_edit_rejected"], ["eval_tamper"]]

    stats = run_import(cfg_for(tmp_path), [runs], tokenizer_dir, tmp_path / "out")
    assert stats["kept"] == 2 and stats["discarded"] == {"flagged": 1}
    assert stats["audit"]["flagged_rollouts"] == 3  # counted, kept or not
    assert stats["audit"]["by_code"] == {"eval_edit_rejected": 2, "eval_tamper": 1}
    summary = [json.loads(line) for line in (tmp_path / "out" / "rollouts.jsonl").read_text().splitlines()]
    assert [(s["reason"], s["flags"]) for s in summary] == [
        (None, ["eval_edit_rejected"]), (None, ["eval_edit_rejected"]), ("flagged", ["eval_tamper"])]
    # filter.keep_eval_edit_rejected: false drops them like any flagged run
    strict = run_import(cfg_for(tmp_path, keep_eval_edit_rejected=False), [runs], tokenizer_dir, tmp_path / "strict")
    assert strict["kept"] == 0 and strict["discarded"] == {"flagged": 3}


def rollout(index: int, traj: Trajectory) -> RolloutRecord:
    return RolloutRecord(slot="t0000", task_id="taskG", rollout=index, seed=7 + index,
                         teacher=TeacherRef(provider="offline", model="teacher-g", endpoint="http://127.0.0.1:1/v1",
                                            temperature=0.7, max_tokens=64),
                         sandbox=SandboxRef(backend="local", confinement="bwrap"), max_steps=5,
                         baseline={"acc": 0.5}, fingerprint="f", wall_s=1.0, trajectory=traj)


def gymforge_traj(tag: str, *, flags: list[Flag] | None = None) -> Trajectory:
    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": f"task {tag}"},
               {"role": "assistant", "content": f"DISCUSSION\n{tag}\n```\nsubmit\n```"}]
    step = TrajectoryStep(action="submit", observation="", response=history[-1]["content"], state="{}",
                          thought=tag, execution_time=0.1, step=1)
    return Trajectory(trajectory=[step], history=history,
                      info=AgentInfo(exit_status="submitted", score=[{"acc": 0.75}], flags=flags or []))


def write_shard(path: Path, rollouts: list[RolloutRecord]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(ShardRecord(item="t0000", status="ok", shard=0, task_id="taskG",
                                rollout_indices=[r.rollout for r in rollouts], rollouts=rollouts).model_dump_json())
    return path


def test_gymforge_shards_and_run_task_folders_import_as_the_sft_stage_reads_them(tmp_path, tokenizer_dir):
    src = tmp_path / "other-results"
    shard = write_shard(src / "trajectories" / "t0000" / "shard_0000.json", [
        rollout(0, gymforge_traj("x")),
        rollout(1, gymforge_traj("y", flags=[Flag(code="proc_other", detail="command reads '/proc/1'")]))])
    run = src / "runs" / "r1"
    run.mkdir(parents=True)
    traj = gymforge_traj("z")
    traj.meta = {"task_id": "taskH", "model": "m-h", "seed": 3}
    (run / "taskH.traj").write_text(traj.model_dump_json())
    (run / "results.json").write_text(json.dumps({"agent": [{"acc": 0.75}], "baseline": {"acc": 0.5}}))
    assert source_files(src) == [run / "taskH.traj", run / "results.json", shard]
    found = list(import_candidates(src))
    assert [(c.id, c.task, c.teacher, c.seed, c.source["format"]) for c in found] == [
        ("runs/r1", "taskH", "m-h", 3, "gymforge-traj"),
        ("trajectories/t0000/shard_0000.json#r00000", "taskG", "teacher-g", 7, "gymforge-shard"),
        ("trajectories/t0000/shard_0000.json#r00001", "taskG", "teacher-g", 8, "gymforge-shard")]
    assert found[2].flags == ["proc_other"] and found[1].metric == "acc"

    # sft.extra_sources: the SFT stage's own rollouts and the extra source in one dataset, filtered alike
    own = write_shard(tmp_path / "results" / "trajectories" / "t0001" / "shard_0000.json", [rollout(0, gymforge_traj("o"))])
    cfg = GymforgeConfig.model_validate({"results_dir": str(tmp_path / "results"), "sft": {"extra_sources": [str(src)]}})
    sft = tmp_path / "results" / "sft"
    stats = build_sft(cfg, [own], tokenizer_dir, jsonl_out=sft / "train.jsonl", dataset_out=sft / "dataset",
                      rollouts_out=sft / "rollouts.jsonl", stats_out=sft / "stats.json",
                      extra_sources=cfg.sft.extra_sources)
    assert stats["sources"] == {"rollouts": {"rollouts": 1, "kept": 1, "discarded": {}},
                                str(src): {"rollouts": 3, "kept": 2, "discarded": {"flagged": 1}}}
    rows = [json.loads(line) for line in (sft / "train.jsonl").read_text().splitlines()]
    assert [json.loads(r["source"])["origin"] for r in rows] == ["rollouts", str(src), str(src)]
    plain = GymforgeConfig.model_validate({"results_dir": str(tmp_path / "results")})
    assert stats["config_hash"] != build_sft(plain, [own], tokenizer_dir, jsonl_out=sft / "train.jsonl",
                                             dataset_out=sft / "dataset", rollouts_out=sft / "rollouts.jsonl",
                                             stats_out=sft / "stats.json")["config_hash"]


@pytest.mark.slow
def test_cli_writes_a_loadable_dataset_and_names_bad_sources(tmp_path, tokenizer_dir):
    runs = tmp_path / "runs"
    write_run(runs, 0, mlgym_traj(["ls", "submit"]))
    config = Path(__file__).resolve().parents[2] / "config.yaml"
    cli = [sys.executable, "-m", "gymforge", "import-trajectories", "--config", str(config)]
    proc = subprocess.run([*cli, str(runs), "--out", str(tmp_path / "out"), "--tokenizer", str(tokenizer_dir)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "kept 1 of 1 trajectories" in proc.stdout
    (runs / "broken").mkdir()
    (runs / "broken" / "x.traj").write_text("{not json")
    proc = subprocess.run([*cli, str(runs), "--out", str(tmp_path / "out"), "--tokenizer", str(tokenizer_dir)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode != 0 and "x.traj: not JSON" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([*cli, str(tmp_path / "missing"), "--out", str(tmp_path / "o2"), "--tokenizer",
                           str(tokenizer_dir)], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode != 0 and "no such file or directory" in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MLGYM_ROOT"), reason="MLGYM_ROOT (an MLGym checkout) not set")
def test_released_mlgym_trajectories_import(tmp_path, tokenizer_dir):
    """A sample of MLGym's released runs: every one is read, and each kept example ends on the run's last
    real reply (the response of its last non-forced step)."""
    root = Path(os.environ["MLGYM_ROOT"]) / "trajectories"
    trajs = sorted(root.rglob("*.traj"))
    if not trajs:
        pytest.skip(f"no .traj files under {root}")
    sample = tmp_path / "sample"
    sample.mkdir()
    for path in trajs[:: max(1, len(trajs) // 12)]:
        shutil.copytree(path.parent, sample / path.parent.name)
    stats = run_import(cfg_for(tmp_path), [sample], tokenizer_dir, tmp_path / "out")
    assert stats["rollouts"] == len(list(sample.iterdir())) and stats["kept"] >= 1
    rows = [json.loads(line) for line in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    for row in rows:
        data = json.loads(next((sample / row["id"]).glob("*.traj")).read_text())
        real = [s for s in data["trajectory"] if not (s["action"].startswith("exit_")
                                                      and s["thought"].startswith("Exit due to"))]
        assert row["messages"][-1]["content"] == real[-1]["response"]
        assert row["messages"][0]["content"] == data["history"][0]["content"]


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MLGYM_ROOT"), reason="MLGYM_ROOT (an MLGym checkout) not set")
def test_released_mlgym_trajectories_audit():
    """The audit of every released run: of the 39 runs that aim a file tool at evaluate.py, the 6 whose edits
    applied stay eval_tamper and the other 33 (and 2 of the 6) have edits MLGym refused, eval_edit_rejected
    (bench/audit_precision.py checks both against the evaluator's listings)."""
    from gymforge.agent.sources import mlgym_flags

    trajs = sorted((Path(os.environ["MLGYM_ROOT"]) / "trajectories").rglob("*.traj"))
    if not trajs:
        pytest.skip("no .traj files")
    by_code: dict[str, int] = {}
    for path in trajs:
        steps = [s for s in json.loads(path.read_text()).get("trajectory") or [] if isinstance(s, dict)]
        for code in mlgym_flags(steps):
            by_code[code] = by_code.get(code, 0) + 1
    if len(trajs) == 671:  # MLGym's release (trajectories/mlgym_bench_v0)
        assert by_code == {"eval_edit_rejected": 35, "eval_tamper": 6}


@pytest.mark.slow
def test_extra_sources_are_inputs_of_the_sft_dataset_rule(tmp_path):
    from workflow_copy import copy_workflow

    workdir = copy_workflow(tmp_path / "wf", "rules", "report")
    folder = write_run(workdir / "extra", 0, mlgym_traj(["ls", "submit"]))
    base = [sys.executable, "-m", "snakemake", "-n", "results/sft/stats.json"]
    proc = subprocess.run([*base, "--filegraph", "--config", "sft={extra_sources: [extra]}"], cwd=workdir,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rel = folder.relative_to(workdir).as_posix()
    assert f"{rel}/taskA.traj" in proc.stdout and f"{rel}/results.json" in proc.stdout
    proc = subprocess.run([*base, "--config", "sft={extra_sources: [nowhere]}"], cwd=workdir, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode != 0 and "sft.extra_sources: nowhere: no such file or directory" in proc.stdout + proc.stderr
