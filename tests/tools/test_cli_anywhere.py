"""Every `gymforge` command works from a directory that is not a checkout (no config.yaml, no results/): it runs on
the models' defaults or says in one line what it needs, never with a Python traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gymforge.cli import STEPS, TOOLS
from gymforge.core.prompts import templates_dir

# The commands beside TOOLS and STEPS (hand-written, not imported lazily).
OTHERS = ["hub", "teacher-server"]


def gymforge(cwd: Path, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gymforge", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


def no_traceback(proc: subprocess.CompletedProcess, ok: bool = True) -> subprocess.CompletedProcess:
    """No traceback; `ok`: exit 0, else a nonzero exit whose message is one line."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:
        assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    (tmp_path / "here").mkdir()
    return tmp_path / "here"


@pytest.mark.parametrize("verb", [*TOOLS, *OTHERS])
def test_each_tool_has_help_outside_a_checkout(empty: Path, verb: str) -> None:
    proc = no_traceback(gymforge(empty, verb, "--help"))
    assert f"gymforge {verb}" in proc.stdout


def test_each_step_has_help_outside_a_checkout(empty: Path) -> None:
    # One interpreter for all steps (each --help imports its stage module: ~1.5 s apart, a few seconds together).
    script = ("import sys\nfrom gymforge.cli import STEPS, main\n"
              "for verb in STEPS:\n"
              "    try:\n        main([verb, '--help'])\n"
              "    except SystemExit as exit:\n        assert exit.code in (0, None), (verb, exit.code)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=empty, capture_output=True, text=True, timeout=300)
    no_traceback(proc)
    for verb in STEPS:
        assert f"usage: gymforge {verb}" in proc.stdout, verb
    assert "--config CONFIG" in proc.stdout and "built-in defaults" in proc.stdout
    assert list(empty.iterdir()) == []


def write_mlgym_run(runs: Path) -> dict:
    """One MLGym run folder (<model>__<task>__<run>: <task>.traj + results.json) whose episode submits; returns
    the trajectory."""
    history = [{"role": "system", "content": "SETTING: you are an agent", "agent": "primary_0"},
               {"role": "user", "content": "TASK DESCRIPTION:\nsolve it", "agent": "primary_0"}]
    steps = []
    for i, action in enumerate(["ls", "submit"], 1):
        reply = f"DISCUSSION\nstep {i}\n\n```\n{action}\n```"
        history += [{"role": "assistant", "content": reply, "thought": f"DISCUSSION\nstep {i}", "action": action,
                     "agent": "primary_0"},
                    {"role": "user", "content": f"out {i}\n(Current Step: {i})\nbash-$", "agent": "primary_0"}]
        steps.append({"action": action, "observation": f"out {i}", "response": reply, "thought": f"step {i}",
                      "execution_time": 0.1,
                      "state": json.dumps({"open_file": "n/a", "working_dir": "/home/agent/workspace"})})
    traj = {"environment": "mlgym_main", "trajectory": steps, "history": history,
            "info": {"exit_status": "submitted", "score": [{"Score": 1.5}], "model_stats": {}}}
    folder = runs / "modelX__taskA__run0"
    folder.mkdir(parents=True)
    (folder / "taskA.traj").write_text(json.dumps(traj))
    (folder / "results.json").write_text(json.dumps({"agent": [{"Score": 1.5}], "baseline": {"Score": 1.0}}))
    return traj


@pytest.mark.slow  # about 30 s: a dozen commands, a tokenizer trained, a dataset written
def test_tools_run_outside_a_checkout(tmp_path: Path, empty: Path) -> None:
    # Nothing to read: one line that says what is missing, and nothing written here.
    for args in (["status"], ["show-task", "t0000"], ["show-trajectory", "nowhere.traj"], ["export-sft", "out"],
                 ["run-task", "task.yaml"], ["check-task", "task.yaml"], ["aup", "."],
                 ["import-trajectories", "runs", "--out", "out"], ["export-sft", "out", "--config", "nope.yaml"]):
        no_traceback(gymforge(empty, *args), ok=False)
    assert list(empty.iterdir()) == []

    # Tools that need nothing but the defaults.
    no_traceback(gymforge(empty, "schemas", "--out", "schemas"))
    assert (empty / "schemas" / "config.schema.json").is_file()
    proc = no_traceback(gymforge(empty, "estimate"))
    assert "built-in defaults" in proc.stdout and "total" in proc.stdout
    proc = no_traceback(gymforge(empty, "hub", "search", "iris"))  # the default hub is the offline one
    assert "iris" in proc.stdout

    # A step with the defaults (the offline student's tokenizer), then the tools on a tiny MLGym run.
    no_traceback(gymforge(empty, "student-tokenizer", "--templates", str(templates_dir()), "--out", "tokenizer"))
    traj = write_mlgym_run(tmp_path / "runs")
    proc = no_traceback(gymforge(empty, "import-trajectories", str(tmp_path / "runs"), "--out", "results/sft",
                                 "--tokenizer", "tokenizer"))
    assert "kept 1 of 1 trajectories" in proc.stdout
    no_traceback(gymforge(empty, "export-sft", "exported"))
    assert (empty / "exported" / "README.md").is_file()
    status = json.loads(no_traceback(gymforge(empty, "status", "--json")).stdout)
    assert status["results_dir"] == "results"
    # show-trajectory renders gymforge's .traj files (steps numbered); MLGym's own are import-trajectories' input.
    proc = no_traceback(gymforge(empty, "show-trajectory", str(tmp_path / "runs" / "modelX__taskA__run0")), ok=False)
    assert "import-trajectories" in proc.stderr
    for i, step in enumerate(traj["trajectory"], 1):
        step["step"] = i
    (tmp_path / "episode.traj").write_text(json.dumps(traj))
    proc = no_traceback(gymforge(empty, "show-trajectory", str(tmp_path / "episode.traj")))
    assert "submit" in proc.stdout
    (tmp_path / "tasks.json").write_text(json.dumps({"taskA": {"metric": "Score", "higher_is_better": True}}))
    proc = no_traceback(gymforge(empty, "aup", str(tmp_path / "runs"), "--tasks", str(tmp_path / "tasks.json")))
    assert proc.stdout.startswith("Model,")
