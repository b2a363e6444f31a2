"""gymforge tasks as TRL environments (gymforge.interop.trl_env; docs/interop.md): the loop's commands, limits and
reward through TRL's environment interface, and a real GRPOTrainer run whose recorded rewards are gymforge's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gymforge.core.config import GymforgeConfig
from gymforge.interop.trl_env import ENDED, GymforgeEnv, task_row, task_rows
from gymforge.rl.rewards import Episode, TaskMetric, episode_reward
from gymforge.sandbox import get_sandbox
from gymforge.tasks.environment import TaskEnvironment

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "mlgym"
CSV_YAML = ROOT / "configs" / "tasks" / "csvTiny.yaml"


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """csvTiny's baseline metrics, from gymforge's own baseline run in the configured sandbox."""
    env = TaskEnvironment(CSV_YAML, sandbox=get_sandbox("local"), run_dir=tmp_path_factory.mktemp("base"), gpus=0)
    env.install()
    return env.run_baseline().metrics


@pytest.fixture
def env(tmp_path: Path):
    GymforgeEnv.configure(GymforgeConfig(), max_steps=4, work_dir=tmp_path / "episodes")
    made = GymforgeEnv()
    yield made
    made._close()


def test_reset_renders_the_loops_first_message_and_tools_run_in_the_sandbox(env: GymforgeEnv,
                                                                             baseline: dict[str, float]) -> None:
    GymforgeEnv.max_steps = 5
    first = env.reset(**task_row(CSV_YAML, baseline=baseline).as_row())
    assert first.startswith("We are solving this task:") and "Predict y from x" in first
    assert "CSVTINYDATA:" in first  # the dataset docs filled in, as the loop shows them
    assert json.dumps(baseline) in first and "You have 5 steps" in first and first.endswith("bash-$")
    # the hidden labels are not in the agent's workspace, the shell is the sandbox's
    assert "test_labels.csv" not in env.shell("ls")
    assert "not found" in env.validate()  # nothing to score yet: the loop's message, the episode goes on
    env.shell("python baseline.py")
    shown = env.validate()
    assert f"Evaluation Score: {json.dumps(baseline)}" in shown
    opened = env.open("baseline.py")  # the fifth step spends the budget: the loop auto-submits
    assert "baseline.py" in opened and opened.endswith("Exited (max_steps)")
    assert env.submit() == env.shell("ls") == ENDED
    reward = env.get_reward()
    traj = GymforgeEnv.finished[-1].trajectory
    assert [s.action for s in traj.trajectory] == ["ls", "validate", "python baseline.py", "validate",
                                                   'open baseline.py', "exit_max_steps"]
    assert traj.info.exit_status == "autosubmission (max_steps)" and traj.info.score[-1] == baseline
    metric = TaskMetric("rmse", False, baseline["rmse"])
    assert reward == episode_reward(Episode.of(traj), metric, GymforgeConfig().rl.reward).reward
    assert reward == pytest.approx(0.3)  # ran code, found and scored the artefact, no improvement


def test_submit_ends_the_episode_and_an_unfinished_one_is_auto_submitted(env: GymforgeEnv,
                                                                          baseline: dict[str, float]) -> None:
    row = task_row(CSV_YAML, baseline=baseline).as_row()
    env.reset(**row)
    assert env.submit().startswith("Exited (submit): submission artefact not found")
    assert env.get_reward() == GymforgeConfig().rl.reward.no_submission_penalty
    env.reset(**row)
    env.shell("python baseline.py")
    assert env.get_reward() == pytest.approx(0.3)  # the model stopped calling tools: the loop's format auto-submission
    assert GymforgeEnv.finished[-1].trajectory.info.exit_status == "autosubmission (format)"


def test_an_audited_action_costs_the_reward(env: GymforgeEnv, baseline: dict[str, float]) -> None:
    env.reset(**task_row(CSV_YAML, baseline=baseline).as_row())
    env.shell("python baseline.py")
    env.shell("echo 'print(1)' >> evaluate.py")  # read-only: rejected, and flagged by the audit
    assert env.get_reward() == GymforgeConfig().rl.reward.no_submission_penalty
    assert GymforgeEnv.finished[-1].trajectory.info.flags


def test_task_rows_read_a_results_directory(tmp_path: Path) -> None:
    from results_fixture import build_results

    results = build_results(tmp_path)
    rows = task_rows(results)
    assert [r["slot"] for r in rows] == ["t0000"]  # the skipped duplicate slot has no environment
    row = rows[0]
    assert row["task"].endswith("verified/mlgym/configs/tasks/demoTask.yaml") and Path(row["root"]).name == "mlgym"
    assert (row["metric"], row["higher_is_better"], json.loads(row["baseline"])) == ("acc", True, {"acc": 0.5})
    assert json.loads(row["hidden_columns"]) == {"test": ["y"]} and row["prompt"][0]["role"] == "user"
    assert task_rows(results, micro=True) == []


@pytest.mark.slow
def test_grpo_trainer_steps_on_a_gymforge_task_and_records_gymforges_rewards(tmp_path: Path,
                                                                             baseline: dict[str, float]) -> None:
    """Two GRPO optimizer steps on CPU with transformers generation: a tiny Qwen3 student (random weights) whose
    sampling is nudged towards one tool call, so that some rollouts run the baseline in the sandbox and others do
    nothing. Every reward TRL records is the shaped reward gymforge computes from that episode's trajectory, and a
    submission's score is the task's own evaluation of it."""
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template

    from gymforge.student.base import build_model
    from gymforge.student.tokenizer import train_offline_tokenizer

    call = '<tool_call>\n{"name": "shell", "arguments": {"command": "python baseline.py"}}\n</tool_call>'
    tok = train_offline_tokenizer([call, CSV_YAML.read_text()], vocab_size=400)
    tok.add_special_tokens({"additional_special_tokens": [
        "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]})
    tok.chat_template, tok.padding_side = qwen3_chat_template, "left"
    cfg = GymforgeConfig.model_validate({"train": {"tiny": {
        "hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
        "head_dim": 16}}})
    model = build_model(cfg, tok, seed=0)
    # A mild bias to start the call anywhere; once started, the call is completed (transformers' sequence_bias).
    ids = tok(call, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    bias = {(ids[0],): 2.0, **{tuple(ids[:k + 1]): 100.0 for k in range(1, len(ids))}}

    GymforgeEnv.configure(GymforgeConfig(), max_steps=4, work_dir=tmp_path / "episodes")
    rows = [task_row(CSV_YAML, baseline=baseline).as_row()] * 4
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=48, max_steps=2, logging_steps=1, report_to="none",
                      save_strategy="no", max_tool_calling_iterations=2, learning_rate=1e-3, seed=0,
                      generation_kwargs={"sequence_bias": bias})
    trainer = GRPOTrainer(model=model, processing_class=tok, args=args, train_dataset=Dataset.from_list(rows),
                          environment_factory=GymforgeEnv)
    trainer.train()

    episodes = GymforgeEnv.finished
    steps = [h for h in trainer.state.log_history if "rewards/GymforgeEnv/mean" in h]
    assert len(steps) == 2 and len(episodes) == 8
    weights = GymforgeConfig().rl.reward
    ours = [episode_reward(Episode.of(e.trajectory), TaskMetric("rmse", False, baseline["rmse"]), weights).reward
            for e in episodes]
    recorded = list(trainer._logs["rewards"]["GymforgeEnv"])  # the last step's per-rollout rewards
    assert recorded == pytest.approx(ours[-len(recorded):], abs=1e-6)
    for k, step in enumerate(steps):
        assert step["rewards/GymforgeEnv/mean"] == pytest.approx(sum(ours[4 * k:4 * k + 4]) / 4, abs=1e-6)
    acted = [e for e in episodes if any(s.action == "python baseline.py" for s in e.trajectory.trajectory)]
    assert acted and len(acted) < len(episodes)  # both kinds of rollout, so the advantages are not all zero
    for e in acted:  # the submission the baseline wrote is scored by the task's own evaluation
        assert e.trajectory.info.score[-1] == baseline
    assert any(h.get("grad_norm", 0) > 0 for h in steps)


def test_task_rows_rank_by_what_verification_probed_not_the_proposals_words(tmp_path: Path) -> None:
    """A proposal whose metric drifted ("mae (lower is better)") for an evaluation that prints r2: the row (and the
    RL stage, which reads tasks the same way) ranks by verification's metric and direction, r2 higher."""
    import shutil

    from gymforge.core.records import VerificationReport

    results = tmp_path / "results"
    shutil.copytree(ROOT, results / "environments" / "t0000" / "verified" / "mlgym")
    (results / "environments" / "t0000" / "report.json").write_text(VerificationReport(
        item="t0000", status="ok", task_id="csvTiny", baseline_scores=[{"r2": 0.87}], metric="r2",
        higher_is_better=True).model_dump_json())
    (results / "proposals").mkdir()
    (results / "proposals" / "t0000.json").write_text(json.dumps({"proposal": {"metric": "mae (lower is better)"}}))
    row = task_rows(results)[0]
    assert (row["metric"], row["higher_is_better"], json.loads(row["baseline"])) == ("r2", True, {"r2": 0.87})
