"""The workflow interface (`agent.interface: workflow`, gymforge.tasks.workflow, docs/post-training.md): the skills'
checks as units, and real episodes on the built-in penguinSpeciesPosttrain task (bubblewrap sandbox, a scripted model
behind the loopback OpenAI-compatible server, the tiny base of tests/tasks/test_posttraining.py standing in for SmolLM2)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest
from loopback import Answer, LoopbackServer, completion
from test_posttraining import TASK, TASK_DIR, build_tiny_base, rows

from gymforge.agent import Agent, AgentConfig, AgentTask
from gymforge.agent.commands import CommandResult
from gymforge.benchmark.suite import builtin_root
from gymforge.core.config import EndpointConfig, GymforgeConfig
from gymforge.llm.client import LLMClient
from gymforge.sandbox import Limits, SandboxBackend, get_sandbox
from gymforge.tasks import posttraining as pt
from gymforge.tasks import workflow as wf
from gymforge.tasks.episode import EpisodeRunner

SKILL_COMMANDS = ("plan", "data_validate", "data_build", "train", "evaluate", "log")
LIMITS = Limits(memory_mb=4096, cpu_seconds=600, max_processes=256)


def skill_module(name: str) -> Any:
    """A sandbox-side skill script, imported from its file (they import each other by bare name)."""
    import sys

    sys.path.insert(0, str(wf.SKILLS_DIR))
    try:
        spec = importlib.util.spec_from_file_location(f"skill_{name}", wf.SKILLS_DIR / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(wf.SKILLS_DIR))


def cmd(command: str) -> str:
    return f"DISCUSSION\nNext step.\n\n```\n{command}\n```\n"


# -- units ------------------------------------------------------------------------------------------------------


def test_rowformat_accepts_the_three_sft_forms_and_preferences(tmp_path: Path) -> None:
    rowformat = skill_module("rowformat")
    good = [{"prompt": "q1", "completion": "a"}, {"prompt": "q2", "answer": "b"},
            {"messages": [{"role": "user", "content": "q3"}, {"role": "assistant", "content": "c"}]}]
    bad = [{"prompt": "q4"}, {"messages": [{"role": "user", "content": "q5"}]}, ["not", "an", "object"],
           {"prompt": "q6", "chosen": "x", "rejected": "x"}]
    lines = [json.dumps(r) for r in good] + [json.dumps(good[1])] + [json.dumps(r) for r in bad] + ["{oops",
             json.dumps({"prompt": "q1", "completion": "other"})]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n\n")
    kept, problems, duplicates, conflicts = rowformat.read(str(path))
    assert [(n, kind) for n, kind, _ in kept] == [(1, "sft"), (2, "sft"), (3, "sft"), (10, "sft")]
    assert kept[1][2] == {"prompt": [{"role": "user", "content": "q2"}],
                          "completion": [{"role": "assistant", "content": "b"}]}
    assert [n for n, _ in problems] == [5, 6, 7, 8, 9] and problems[-1][1] == "not valid JSON"
    assert duplicates == [(4, 2)]
    assert conflicts == [(10, 1)]  # q1 with another completion: a warning, not a format error
    kind, row = rowformat.normalise({"prompt": "q", "chosen": "good", "rejected": "bad"})
    assert kind == "dpo" and row["rejected"] == [{"role": "assistant", "content": "bad"}]


def test_overlapping_lines_name_the_agents_rows_from_the_held_out_prompts_only() -> None:
    held_out = [r["prompt"] for r in rows("test.jsonl")]
    pool = (TASK_DIR / "data" / "train.jsonl").read_text()
    index = pt.EvalNgrams(held_out, 8, [pool])
    text = "\n".join([*pool.splitlines()[:50],
                      json.dumps({"messages": [{"role": "user", "content": held_out[3]},
                                               {"role": "assistant", "content": "Adelie"}]}),
                      "", held_out[7].upper()])  # not JSON: the line itself is read
    assert wf.overlapping_lines(text, index, 0.5) == [51, 53]
    assert wf.overlapping_lines(pool, index, 0.5) == []  # the task's own pool is no leak


def test_result_line_takes_the_last_tagged_json_object() -> None:
    out = 'DATA_RESULT {"ok": false}\nnoise\nDATA_RESULT {"ok": true}\nDATA_RESULT_X 1\n'
    assert wf.result_line(out, "DATA_RESULT") == {"ok": True}
    assert wf.result_line("DATA_RESULT [1]", "DATA_RESULT") is None and wf.result_line("", "X") is None


def test_train_config_is_checked_before_a_model_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    train = skill_module("train")
    monkeypatch.setattr(train, "WORKSPACE", str(tmp_path))
    (tmp_path / "base_model").mkdir()
    (tmp_path / "base_model" / "config.json").write_text("{}")
    config = tmp_path / "c.yaml"
    for text, error in [("data: d.jsonl\nlr: 1\n", "unknown settings ['lr']"), ("epochs: 1\n", "`data`"),
                        ("data: d.jsonl\nmodel: /etc\n", "`model` must be"),
                        ("data: d.jsonl\nmodel: runs/3/checkpoint\n", "holds no model"),
                        ("data: d.jsonl\nbatch_size: many\n", "`batch_size` must be a number")]:
        config.write_text(text)
        with pytest.raises(train.ConfigError, match=error.replace("[", r"\[").replace("]", r"\]")):
            train.load_config(str(config))
    config.write_text("data: d.jsonl\nmax_steps: 3\n")
    assert train.load_config(str(config))["model"] == str(tmp_path / "base_model")


class Skills:
    """Two extra commands for a unit episode: `trainx` (exit 0 or 1 as asked) and `evalx` (the host's validate)."""

    names = frozenset({"trainx", "evalx"})

    def instructions(self) -> str:
        return "EXTRA COMMANDS: trainx, evalx"

    def run(self, action: str, host: Any) -> CommandResult:
        if action.startswith("trainx"):
            code = host.shell("true" if action.endswith("ok") else "false").exit_code
            return CommandResult(f"trained in {host.cwd}", exit_code=code, trained=True)
        observation, metrics = host.validate()
        return CommandResult(observation, exit_code=0 if metrics else 1)


def _client(tmp_path: Path, server: LoopbackServer) -> LLMClient:
    ep = EndpointConfig(provider="openai", base_url=server.url, model="loopback-model", api_key_env="GYMFORGE_TEST_KEY")
    return LLMClient(ep, stage="agent", cache_dir=tmp_path / "cache", ledger_dir=tmp_path / "ledger", budget_usd=10.0)


def test_extra_commands_reach_the_loop_and_are_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The extension point: the commands' text in the first message, their actions in the trajectory, failed actions
    and train-to-eval iterations counted."""
    from test_agent_loop import FileEvaluator

    monkeypatch.setenv("GYMFORGE_TEST_KEY", "sk-test")
    ws = tmp_path / "ws"
    ws.mkdir()
    replies = [cmd("evalx"), cmd("trainx fail"), cmd("trainx ok"), cmd("echo 0.5 > submission.csv"), cmd("evalx"),
               cmd("evalx"), cmd("nosuchcommand"), cmd("submit")]
    server = LoopbackServer([Answer(200, {}, completion(r)) for r in replies]).start()
    try:
        with get_sandbox("local").open(ws, limits=Limits()) as session:
            agent = Agent(_client(tmp_path, server), session, FileEvaluator(ws),
                          AgentTask(id="toy", description="Write a number.", training_timeout=10), AgentConfig(),
                          commands=Skills())
            traj = agent.run()
    finally:
        server.stop()
    assert "EXTRA COMMANDS: trainx, evalx" in traj.history[1]["content"]
    assert [s.action for s in traj.trajectory][:3] == ["evalx", "trainx fail", "trainx ok"]
    assert [s.exit_code for s in traj.trajectory][:3] == [1, 1, 0]
    assert "Submission artefact not found" in traj.trajectory[0].observation
    assert traj.info.score == [{"score": 0.5}] * 3
    # failed: evalx with nothing to score, trainx fail, nosuchcommand (127)
    assert traj.info.failed_actions == 3
    assert traj.info.train_eval_iterations == 1  # trainx ok -> evalx; the second evalx and submit follow no training


# -- real episodes on the post-training task ---------------------------------------------------------------------



@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A base-model cache whose `smollm2-135m` is the tiny base: the task's own base key resolves to it."""
    cache = tmp_path_factory.mktemp("models")
    build_tiny_base(cache / pt.SMOLLM2)
    return cache


def episode(tmp_path: Path, bwrap_backend: SandboxBackend, model_cache: Path, monkeypatch: pytest.MonkeyPatch,
            interface: str, replies: list[str]) -> tuple[Any, LoopbackServer, Path]:
    monkeypatch.setenv("GYMFORGE_TEST_KEY", "sk-test")
    runner = EpisodeRunner(bwrap_backend, LIMITS, interface=interface, post_training=lambda: (None, model_cache))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the job's cores: each sandbox's torch gets them (GYMFORGE_TORCH_THREADS)
    server = LoopbackServer([Answer(200, {}, completion(r)) for r in replies]).start()
    run_dir = tmp_path / "run"
    keep = tmp_path / "kept"
    monkeypatch.setattr("shutil.rmtree", _keeping(run_dir / "workspace", keep))
    root = builtin_root()
    try:
        traj = asyncio.run(runner.run(_client(tmp_path, server), root / "configs" / "tasks" / f"{TASK}.yaml",
                                      root=root, run_dir=run_dir, max_steps=len(replies), seed=0,
                                      baseline={"accuracy": 0.0}, meta={}, out_dir=tmp_path / "out"))
    finally:
        server.stop()
    return traj, server, keep


def _keeping(workspace: Path, keep: Path) -> Any:
    """shutil.rmtree that copies the episode's workspace aside before the runner removes the run directory."""
    import shutil

    real = shutil.rmtree

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path) == workspace.parent and workspace.is_dir() and not keep.exists():
            shutil.copytree(workspace, keep, symlinks=True, ignore=shutil.ignore_patterns("base_model", "skills", "data"))
        real(path, *args, **kwargs)

    return rmtree


@pytest.mark.slow  # about 40 s on the 2-core machine: two evaluations and a training run, each in a sandbox
def test_workflow_episode_validates_trains_evaluates_and_logs(
    tmp_path: Path, bwrap_backend: SandboxBackend, model_cache: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    held_out = rows("test.jsonl")[11]["prompt"]
    pool = rows("data/train.jsonl")
    good = json.dumps({"prompt": pool[0]["prompt"], "completion": pool[0]["answer"]})
    planted = json.dumps({"prompt": held_out, "completion": "Gentoo"})
    replies = [
        cmd("plan Fine-tune on the pool for a few steps to teach the answer format."),
        cmd(f"cat > mine.jsonl <<'EOF'\n{good}\n{good}\n{planted}\nEOF"),
        cmd("data_validate mine.jsonl"),
        cmd("printf 'data: mine.jsonl\\nmax_steps: 2\\n' > bad.yaml && "
            "printf 'data: data/train.jsonl\\nmax_steps: 3\\nbatch_size: 4\\nmax_length: 64\\nlogging_steps: 1\\n' "
            "> sft.yaml"),
        cmd("train bad.yaml"),
        cmd("train sft.yaml"),
        cmd("evaluate"),
        cmd("log The format is learnt; next: more steps."),
        cmd("submit"),
    ]
    t0 = time.monotonic()
    traj, server, kept = episode(tmp_path, bwrap_backend, model_cache, monkeypatch, "workflow", replies)
    print(f"\nworkflow episode: {time.monotonic() - t0:.1f} s; steps: "
          + ", ".join(f"{s.action.split()[0]} {s.execution_time:.1f}s" for s in traj.trajectory))
    steps = {s.action.split(None, 1)[0] + str(i): s for i, s in enumerate(traj.trajectory)}
    obs = [s.observation for s in traj.trajectory]
    assert traj.meta["interface"] == "workflow"
    assert "WORKFLOW" in traj.history[1]["content"] and "data_validate <file.jsonl>" in traj.history[1]["content"]
    assert [s.action.split(None, 1)[0] for s in traj.trajectory] == [r.split("```\n")[1].split()[0] for r in replies]

    # data_validate: the duplicate and the planted held-out row, by line number, never the prompt itself
    assert "exact duplicates: 1: line 2 (repeats line 1)" in obs[2]
    assert "1 rows: lines 3" in obs[2] and "FAILED" in obs[2] and steps["data_validate2"].exit_code == 1
    assert all(held_out not in o and held_out.lower() not in o.lower() for o in obs)
    # train refuses the data that failed, starts no run; then trains on the pool (validated first)
    assert "train refused" in obs[4] and steps["train4"].exit_code == 1
    assert "was not validated as it is now" in obs[5] and "PASSED" in obs[5] and steps["train5"].exit_code == 0
    assert "run 1: ok" in obs[5]
    # evaluate: the task's evaluation of final_model/, appended to the log
    assert "Evaluation Score" in obs[6] and "appended to experiment_log.md" in obs[6]
    assert len(traj.info.score) == 2 and traj.info.exit_status == "submitted"
    assert traj.info.failed_actions == 2  # data_validate and train bad.yaml
    assert traj.info.train_eval_iterations == 1  # train sft.yaml -> evaluate; submit follows no new training

    run = kept / "runs" / "1"
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint", "config.yaml", "result.json", "train.log"]
    assert (run / "checkpoint" / "model.safetensors").is_file() and (kept / "final_model" / "model.safetensors").is_file()
    assert not (kept / "runs" / "2").exists()
    assert json.loads((run / "result.json").read_text())["steps"] == 3
    assert [json.loads(line)["step"] for line in (run / "train.log").read_text().splitlines()][:3] == [1, 2, 3]
    log = (kept / "experiment_log.md").read_text()
    for part in ("## Plan for iteration 1",
                 "## Iteration 1: train run 1 (sft)", "## Evaluation of final_model/ (run 1, after 1 runs)",
                 "## Note (after 1 runs)\nThe format is learnt"):
        assert part in log
    assert log.index("Plan for iteration 1") < log.index("Iteration 1: train") < log.index("(run 1, after 1 runs)")
    score = traj.info.score[0]
    assert f"- score: {json.dumps(score)} (baseline {{\"accuracy\": 0.0}})" in log


def test_cli_episode_has_no_skills(
    tmp_path: Path, bwrap_backend: SandboxBackend, model_cache: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    replies = [cmd("data_validate data/train.jsonl"), cmd("ls skills"), cmd("submit")]
    traj, _, _ = episode(tmp_path, bwrap_backend, model_cache, monkeypatch, "cli", replies)
    assert "interface" not in traj.meta
    first = traj.history[1]["content"]
    assert "WORKFLOW" not in first and not any(f"\n{name} <" in first for name in SKILL_COMMANDS)
    assert "command not found" in traj.trajectory[0].observation and traj.trajectory[0].exit_code == 127
    assert traj.trajectory[1].exit_code != 0
    assert traj.info.failed_actions == 3 and traj.info.train_eval_iterations == 0  # submit: no final_model/


def test_for_config_reads_the_interface_only_when_an_episode_runs() -> None:
    cfg = GymforgeConfig.model_validate({"agent": {"interface": "workflow"}})
    assert EpisodeRunner.for_config(cfg, 0).interface == "workflow"
    assert GymforgeConfig().agent.interface == "cli"


@pytest.mark.slow  # two submit-baseline episodes with the tiny base: ~40 s on the 2-core machine
def test_run_task_gives_the_skills_only_under_the_workflow_interface(tmp_path: Path, model_cache: Path) -> None:
    from gymforge.agent.trajectory import read_trajectory
    from gymforge.tools.run_task import run_task

    root = builtin_root()
    settings = GymforgeConfig.model_validate({"post_training": {"cache_dir": str(model_cache)}})
    for interface in ("workflow", "cli"):
        traj = read_trajectory(run_task(root / "configs" / "tasks" / f"{TASK}.yaml", root, "submit-baseline",
                                        tmp_path / interface, limits=LIMITS, settings=settings, interface=interface))
        first = traj.history[1]["content"]
        assert traj.info.exit_status == "submitted" and traj.info.score  # the base, scored
        assert ("WORKFLOW" in first) == (interface == "workflow")
        assert traj.meta.get("interface") == ("workflow" if interface == "workflow" else None)
