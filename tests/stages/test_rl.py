"""On-policy RL (issue #16): rewards, advantages, duration weights, loss masking, resume after kill -9, curve.

The trainer tests run a tiny random Qwen3 (built here) with a fake episode collector: trajectories made
in the test, so that only the RL code is under test (the episode runner and serving have their own tests).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from gymforge.agent.tools import is_training_command
from gymforge.core.records import AgentInfo, Flag, Trajectory, TrajectoryStep
from gymforge.core.config import GymforgeConfig, RewardConfig
from gymforge.core.configview import restrict
from gymforge.rl import grpo
from gymforge.rl.rewards import Episode, TaskMetric, episode_reward, improvement
from gymforge.tasks.metrics import metric_direction

W = RewardConfig()
TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
        "intermediate_size": 128}


def traj(scores: list[dict[str, float]], status: str = "submitted", steps: list[tuple[str, int | None]] = (),
         flagged: bool = False, observation: str = "") -> Trajectory:
    t = Trajectory(info=AgentInfo(score=scores, exit_status=status))
    for i, (action, code) in enumerate(steps):
        t.trajectory.append(TrajectoryStep(action=action, observation=observation, response="", state="{}",
                                           thought="", execution_time=1.0, step=i + 1, exit_code=code))
    if flagged:
        t.info.flags.append(Flag(code="scorer_write", detail="x"))
    return t


def reward(t: Trajectory, task: TaskMetric) -> Any:
    return episode_reward(Episode.of(t), task, W)


# ---- rewards ----------------------------------------------------------------------------------------


def test_direction_higher_and_lower_is_better() -> None:
    acc = TaskMetric("accuracy", True, 0.8)
    rmse = TaskMetric("rmse", False, 2.0)
    assert reward(traj([{"accuracy": 0.88}]), acc).improvement == pytest.approx(0.1)
    assert reward(traj([{"accuracy": 0.72}]), acc).improvement == pytest.approx(-0.1)
    assert reward(traj([{"rmse": 1.8}]), rmse).improvement == pytest.approx(0.1)  # lower rmse: better
    assert reward(traj([{"rmse": 2.2}]), rmse).improvement == pytest.approx(-0.1)
    assert reward(traj([{"rmse": 1.8}]), rmse).milestones["beat_baseline"]
    assert not reward(traj([{"rmse": 2.2}]), rmse).milestones["beat_baseline"]


def test_improvement_is_normalised_per_task() -> None:
    """The same relative gain weighs the same on tasks of very different scales; big gains are clipped."""
    small = TaskMetric("loss", False, 0.02)
    large = TaskMetric("mse", False, 4000.0)
    a = reward(traj([{"loss": 0.018}]), small)
    b = reward(traj([{"mse": 3600.0}]), large)
    assert a.improvement == pytest.approx(b.improvement) == pytest.approx(0.1)
    assert a.reward == pytest.approx(b.reward)
    assert reward(traj([{"mse": 0.0}]), large).improvement == pytest.approx(W.improvement_clip)
    assert improvement(1.0, TaskMetric("x", True, 0.0), 0.01) == pytest.approx(100.0)  # floor, not a 0 division


def test_milestones_come_from_structured_events_not_printed_text() -> None:
    task = TaskMetric("accuracy", True, 0.5)
    # the policy printed a fake evaluation, but the loop recorded no score and the command failed
    fake = traj([], "submission_not_found (submit)", steps=[("echo 'Evaluation Score: {\"accuracy\": 0.99}'", 0),
                                                             ("python train.py", 1)],
                observation='Evaluation Score: {"accuracy": 0.99}')
    r = reward(fake, task)
    assert r.milestones == {"ran_code": False, "artefact": False, "evaluated": False, "beat_baseline": False}
    assert not r.valid and r.reward == pytest.approx(W.no_submission_penalty)
    honest = traj([{"accuracy": 0.5}, {"accuracy": 0.6}], steps=[("python train.py", 0), ("validate", None)])
    r = reward(honest, task)
    assert r.milestones == {"ran_code": True, "artefact": True, "evaluated": True, "beat_baseline": True}
    assert r.reward == pytest.approx(0.4 + 0.2)  # four milestones + 20% improvement


def test_no_valid_submission_is_penalised() -> None:
    task = TaskMetric("accuracy", True, 0.5)
    # validated once, then the final submission could not be read: no valid submission, but partial credit
    r = reward(traj([{"accuracy": 0.7}], "evaluation_format_error (submit)"), task)
    assert not r.valid and r.score is None and r.improvement == 0.0
    assert r.milestones["artefact"] and r.milestones["evaluated"] and not r.milestones["beat_baseline"]
    assert r.reward == pytest.approx(W.no_submission_penalty + 0.2)
    nothing = reward(traj([], "autosubmission (format)"), task)
    assert nothing.reward == pytest.approx(W.no_submission_penalty)
    assert nothing.reward < r.reward < reward(traj([{"accuracy": 0.5}]), task).reward  # denser than 0/1


def test_flagged_episode_gets_no_reward() -> None:
    task = TaskMetric("accuracy", True, 0.5)
    r = reward(traj([{"accuracy": 0.99}], steps=[("python train.py", 0)], flagged=True), task)
    assert r.flagged and r.reward == pytest.approx(W.no_submission_penalty)
    assert r.reward <= reward(traj([], "submission_not_found (submit)"), task).reward  # never cheaper to cheat


def test_well_formed_replies_separate_episodes_that_all_fail() -> None:
    """`rl.reward.well_formed`: two episodes that both end on malformed replies earn the same reward without it (a group
    of them teaches nothing) and differ by their share of well-formed replies with it, read from the loop's records
    (the steps it accepted, the format errors it re-asked); a flagged episode still gets the penalty alone."""
    task = TaskMetric("accuracy", True, 0.5)
    shaped = RewardConfig(well_formed=0.2)

    def failing(accepted: int, flagged: bool = False) -> Episode:
        t = traj([], "submission_not_found (format)", steps=[("ls", 0)] * accepted, flagged=flagged)
        t.trajectory.append(TrajectoryStep(action="exit_format", observation="", response="", state="{}",
                                           thought="Exit due to format", execution_time=0.0, step=accepted + 1,
                                           format_errors=[{"response": "```", "error": "no command"}] * 3))
        return Episode.of(t)

    one, three = failing(1), failing(3)
    assert (one.well_formed, one.malformed, three.well_formed) == (1, 3, 3)
    assert episode_reward(one, task, W).reward == episode_reward(three, task, W).reward == W.no_submission_penalty
    assert episode_reward(one, task, shaped).reward == pytest.approx(W.no_submission_penalty + 0.2 * 1 / 4)
    assert episode_reward(three, task, shaped).reward == pytest.approx(W.no_submission_penalty + 0.2 * 3 / 6)
    flagged = episode_reward(failing(3, flagged=True), task, shaped)
    assert flagged.flagged and flagged.reward == W.no_submission_penalty


def test_milestones_are_weighted_by_the_configs_milestone_keys() -> None:
    """Every milestone the reward computes has its weight in `RewardConfig.milestones`, set by `milestone_<name>`."""
    task = TaskMetric("accuracy", True, 0.5)
    honest = traj([{"accuracy": 0.5}], steps=[("python train.py", 0)])  # equals the baseline: not beaten
    r = reward(honest, task)
    assert set(r.milestones) == set(W.milestones) == {"ran_code", "artefact", "evaluated", "beat_baseline"}
    assert r.reward == pytest.approx(0.3)
    heavy = RewardConfig.model_validate({"milestone_ran_code": 0.5, "milestone_beat_baseline": 2.0})
    assert heavy.milestones == {"ran_code": 0.5, "artefact": 0.1, "evaluated": 0.1, "beat_baseline": 2.0}
    assert episode_reward(Episode.of(honest), task, heavy).reward == pytest.approx(0.7)
    zero = RewardConfig.model_validate({f"milestone_{name}": 0.0 for name in W.milestones})
    assert episode_reward(Episode.of(honest), task, zero).reward == pytest.approx(0.0)


@pytest.mark.parametrize("command", ["python train.py", "torchrun --standalone t.py", "accelerate launch t.py",
                                     "deepspeed t.py", "ls", "cat python_notes.txt"])
def test_ran_code_counts_what_the_loop_times_as_training(command: str) -> None:
    r = reward(traj([], steps=[(command, 0)]), TaskMetric("accuracy", True, 0.5))
    assert r.milestones["ran_code"] is is_training_command(command)
    assert not reward(traj([], steps=[(command, 1)]), TaskMetric("accuracy", True, 0.5)).milestones["ran_code"]


def test_metric_direction_from_proposal_text() -> None:
    assert metric_direction("balanced_accuracy (higher is better)") == ("balanced_accuracy", True)
    assert metric_direction("rmse (lower is better)") == ("rmse", False)
    assert metric_direction("log_loss") == ("log_loss", False)
    assert metric_direction("f1") == ("f1", True)


# ---- advantages and duration weights ----------------------------------------------------------------


def test_group_advantages() -> None:
    adv = grpo.group_advantages([1.0, 0.0, 0.0, 3.0])
    assert sum(adv) == pytest.approx(0.0, abs=1e-9)
    assert sum(a * a for a in adv) / 4 == pytest.approx(1.0, rel=1e-4)  # unit std
    assert adv[3] > adv[0] > adv[1] == adv[2]
    assert grpo.group_advantages([0.4, 0.4, 0.4]) == [0.0, 0.0, 0.0]  # no signal in an equal group


def test_duration_weights() -> None:
    w = grpo.duration_weights([1.0, 3.0, 2.0, 2.0], enabled=True, floor_s=0.0, max_weight=10)
    assert sum(w) / len(w) == pytest.approx(1.0)
    assert w[1] == pytest.approx(3 * w[0])  # proportional to the measured duration
    assert grpo.duration_weights([1.0, 3.0], enabled=False) == [1.0, 1.0]
    floored = grpo.duration_weights([0.0, 0.0, 10.0], enabled=True, floor_s=1.0, max_weight=10)
    assert floored[0] == floored[1] > 0  # a reply that ran nothing still learns
    capped = grpo.duration_weights([0.1] * 9 + [1000.0], enabled=True, floor_s=0.0, max_weight=5.0)
    assert max(capped) == pytest.approx(5.0)


def test_duration_weight_scales_the_actions_gradient() -> None:
    import torch

    lp = torch.tensor([-1.0, -2.0, -0.5])
    mask = torch.tensor([0, 1, 1])
    grads = []
    for weight in (1.0, 3.0):
        new = lp.clone().requires_grad_(True)
        loss, _, _ = grpo.sample_loss(new, lp, lp, mask, 1.0, clip_eps=0.2, kl_coef=0.0)
        (loss * weight).backward()
        grads.append(new.grad.clone())
    assert torch.allclose(grads[1], 3 * grads[0]) and grads[0].abs().sum() > 0


# ---- the loss ---------------------------------------------------------------------------------------


def test_loss_ignores_tokens_outside_the_mask_and_clips() -> None:
    import torch

    old = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    mask = torch.tensor([0, 0, 1, 1])
    new = torch.tensor([-3.0, 0.5, -1.0, -1.0], requires_grad=True)
    loss, kl, _ = grpo.sample_loss(new, old, old, mask, 2.0, clip_eps=0.2, kl_coef=0.1)
    loss.backward()
    assert new.grad[:2].abs().sum() == 0 and new.grad[2:].abs().sum() > 0  # prompt tokens get no gradient
    assert float(loss.detach()) == pytest.approx(-2.0) and float(kl) == pytest.approx(0.0)
    # a ratio beyond 1 + eps with a positive advantage is clipped: no gradient pushes it further
    far = torch.tensor([0.0, 0.0, -0.5, -0.5], requires_grad=True)
    loss, _, clipped = grpo.sample_loss(far, old, old, mask, 1.0, clip_eps=0.2, kl_coef=0.0)
    loss.backward()
    assert far.grad.abs().sum() == 0 and float(clipped) == 1.0
    # the KL penalty pulls towards the reference
    ref = torch.tensor([-1.0, -1.0, -0.2, -0.2])
    pulled = torch.tensor([-1.0, -1.0, -1.0, -1.0], requires_grad=True)
    loss, kl, _ = grpo.sample_loss(pulled, old, ref, mask, 0.0, clip_eps=0.2, kl_coef=1.0)
    loss.backward()
    assert float(kl) > 0 and (pulled.grad[2:] < 0).all()  # descending raises the log-probs towards ref


@pytest.fixture(scope="module")
def student(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 with the offline tokenizer (chat template with generation markers)."""
    from gymforge.student import base as student_base
    from gymforge.student.tokenizer import train_offline_tokenizer

    root = tmp_path_factory.mktemp("rl-student")
    texts = ["You are an agent.", "Task: predict prices.", "DISCUSSION\nlook\n```\nls\n```", "validate", "submit",
             "python baseline.py", "the quick brown fox jumps over the lazy dog"]
    train_offline_tokenizer(texts, vocab_size=400).save_pretrained(str(root / "tokenizer"))
    student_base.build_base(make_cfg(), root / "tokenizer", root / "sft")
    return root / "sft"


def make_cfg(**rl: Any) -> GymforgeConfig:
    return GymforgeConfig.model_validate({"seed": 0, "train": {"tiny": TINY}, "rl": {
        "iterations": 4, "group_size": 4, "tasks_per_iteration": 1, "learning_rate": 1e-3, "threads": 1,
        "max_length": 512, **rl}})


def test_mask_covers_exactly_the_reply(student: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(student))
    request = [{"role": "system", "content": "You are an agent."},
               {"role": "user", "content": "Task: predict prices."},
               {"role": "assistant", "content": "DISCUSSION\nearlier\n```\nls\n```"},
               {"role": "user", "content": "output"}]
    reply = "DISCUSSION\nlook\n```\npython baseline.py\n```"
    ids, mask = grpo.tokenize_sample(tok, request, reply, 4096, grpo.training_template(tok, "offline"))
    masked = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert masked.replace(" ", "") == (reply + "<|im_end|>").replace(" ", "")  # not the earlier assistant turn
    ids_cut, mask_cut = grpo.tokenize_sample(tok, request, reply, 20, None)
    assert len(ids_cut) == 20 and sum(mask_cut) == sum(mask)  # the prompt side is cut, the reply kept


def test_logprobs_use_the_sampling_temperature(student: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(student)).eval()
    ids = [5, 17, 42, 8, 99]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
        want = torch.log_softmax(logits / 0.5, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        got = grpo.token_logprobs(model, ids, 0.5)
        plain = grpo.token_logprobs(model, ids)
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, plain, atol=1e-3)


def test_logprobs_from_the_reply_on_are_those_of_the_whole_sequence(student: Path) -> None:
    """The update takes log-probs from the reply's first token (the logits of the prompt are never computed): the same
    values as the whole sequence's from there on, so the loss does not change."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(student)).eval()
    ids, mask = [5, 17, 42, 8, 99, 7, 3], [0, 0, 0, 0, 1, 1, 1]
    start = grpo.reply_start(mask)
    assert start == 3  # ids[1:]-aligned: the first masked token, ids[4]
    with torch.no_grad():
        whole = grpo.token_logprobs(model, ids, 0.7)
        tail = grpo.token_logprobs(model, ids, 0.7, start)
    assert tail.shape == (3,) and torch.allclose(tail, whole[start:], atol=1e-5)


def fake_episode(seed: int, good: bool, rejected: bool = False) -> Trajectory:
    """A two-step episode as the agent loop records it (history, steps, one rejected reply)."""
    from gymforge.core.prompts import render

    reply1 = "DISCUSSION\nlook\n```\nls\n```"
    reply2 = "DISCUSSION\nrun it\n```\npython baseline.py\n```" if good else "DISCUSSION\nhm\n```\nls\n```"
    t = Trajectory(info=AgentInfo(score=[{"accuracy": 0.6 + 0.01 * (seed % 3)}] if good else [],
                                  exit_status="autosubmission (max_steps)" if good else
                                  "submission_not_found (max_steps)"))
    t.history = [{"role": "system", "content": "You are an agent."},
                 {"role": "user", "content": "Task: predict prices."},
                 {"role": "assistant", "content": reply1}, {"role": "user", "content": "data baseline.py"},
                 {"role": "assistant", "content": reply2}, {"role": "user", "content": "done"}]
    errors = [{"response": "no command here", "error": "no fenced command"}] if rejected else []
    t.trajectory = [
        TrajectoryStep(action="ls", observation="data baseline.py", response=reply1, state="{}", thought="look",
                       execution_time=0.1, step=1, exit_code=0, format_errors=errors),
        TrajectoryStep(action=reply2.split("```\n")[1].rstrip("\n`"), observation="done", response=reply2,
                       state="{}", thought="", execution_time=4.0 if good else 0.1, step=2, exit_code=0),
        TrajectoryStep(action="exit_max_steps", observation="Exited", response="", state="{}",
                       thought="Exit due to max_steps", execution_time=0.5, step=3),
    ]
    assert render("agent_format_error", error="x")  # the re-ask prompt exists
    return t


def test_action_samples_pair_every_request_with_its_reply() -> None:
    t = fake_episode(0, True, rejected=True)
    samples = grpo.action_samples(t, 7)
    assert [s.response for s in samples] == ["no command here", t.trajectory[0].response, t.trajectory[1].response]
    assert samples[0].request[-1]["content"] == "Task: predict prices."  # the first request: system + task
    # the accepted reply answered the re-ask: the first request, the rejected reply and the format-error prompt
    assert samples[1].request[:2] == samples[0].request
    assert samples[1].request[2] == {"role": "assistant", "content": "no command here"}
    assert "no fenced command" in samples[1].request[3]["content"]
    assert samples[2].request[-1]["content"] == "data baseline.py"
    assert [s.duration_s for s in samples] == [0.0, 0.1, 4.0] and {s.episode for s in samples} == {7}


# ---- the trainer: curve schema, improvement, resume after kill -9 ------------------------------------

COLLECTOR = '''
import json, logging, random, sys
logging.basicConfig(level=logging.INFO)
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_rl import fake_episode, make_cfg, fake_tasks
from gymforge.stages.rl import run_rl

cfg = make_cfg(iterations={iterations})
out = Path({out!r})

def collect(policy_dir, iteration, plans):
    if iteration == {stall}:
        (out / "stalled").write_text("1")
        import time; time.sleep(600)
    return [(p, fake_episode(p.seed, random.Random(p.seed).random() < 0.5, rejected=p.seed % 2 == 0), 1.0)
            for p in plans]

run_rl(cfg, Path({sft!r}), fake_tasks(Path({tasks!r})), out / "checkpoint", out / "curve.json", collect=collect)
'''


def fake_tasks(root: Path) -> list[Any]:
    from gymforge.rl.rollouts import RLTask

    tree = root / "mlgym"
    (tree / "configs" / "tasks").mkdir(parents=True, exist_ok=True)
    task_yaml = tree / "configs" / "tasks" / "priceTask.yaml"
    task_yaml.write_text("id: priceTask\nname: Price task\ndescription: predict prices {dataset_docs}\n")
    return [RLTask(slot="t0000", task_id="priceTask", tree=tree, task_yaml=task_yaml,
                   metric=TaskMetric("accuracy", True, 0.6), hidden_columns=None, baseline={"accuracy": 0.6})]


def _run(student: Path, tmp: Path, out: Path, iterations: int, stall: int = -1) -> subprocess.Popen:
    script = tmp / f"run_{out.name}.py"
    script.write_text(textwrap.dedent(COLLECTOR.format(tests=str(Path(__file__).parent), iterations=iterations,
                                                       out=str(out), stall=stall, sft=str(student),
                                                       tasks=str(tmp / "task"))))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = open(tmp / f"{out.name}-{time.monotonic_ns()}.log", "w+")  # a file: a full pipe would block the run
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log_file = log  # type: ignore[attr-defined]
    return proc


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    proc.wait(timeout=timeout)
    proc.log_file.seek(0)  # type: ignore[attr-defined]
    return proc.log_file.read()  # type: ignore[attr-defined]


@pytest.mark.slow
def test_resume_after_kill_between_iterations(student: Path, tmp_path: Path) -> None:
    """kill -9 during iteration 2; the rerun resumes after iteration 1 and ends where an uninterrupted run ends."""
    killed = tmp_path / "killed"
    proc = _run(student, tmp_path, killed, iterations=4, stall=2)
    deadline = time.monotonic() + 300
    while not (killed / "stalled").exists():
        assert proc.poll() is None, _finish(proc)
        assert time.monotonic() < deadline
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    state = json.loads((killed / ".work" / "state.json").read_text())
    assert state["finished"] == 2 and len(state["curve"]) == 2
    resumed = _run(student, tmp_path, killed, iterations=4)
    out = _finish(resumed)
    assert resumed.returncode == 0, out
    assert "resuming after iteration 1" in out
    straight = tmp_path / "straight"
    once = _run(student, tmp_path, straight, iterations=4)
    out2 = _finish(once)
    assert once.returncode == 0, out2
    a = json.loads((killed / "curve.json").read_text())["iterations"]
    b = json.loads((straight / "curve.json").read_text())["iterations"]
    assert [r["iteration"] for r in a] == [0, 1, 2, 3]
    for ra, rb in zip(a, b, strict=True):  # same draws, same weights after resuming: the same curve
        assert ra["mean_reward"] == rb["mean_reward"]
        assert ra["kl"] == pytest.approx(rb["kl"], rel=1e-4, abs=1e-7)
    assert (killed / "checkpoint" / "model.safetensors").exists()
    assert not (killed / "checkpoint" / "optimizer.pt").exists()


def test_curve_schema_and_update(student: Path, tmp_path: Path, rule_reads: dict[str, dict]) -> None:
    from gymforge.stages.rl import run_rl

    cfg = make_cfg(iterations=2, improve_fraction=0.5)
    seen_plans: list[list[Any]] = []

    def collect(policy_dir: Path, iteration: int, plans: list[Any]) -> list[Any]:
        seen_plans.append(plans)
        time.sleep(0.3)  # the episodes' time, which the curve must put in rollout_s, not in the update's
        return [(p, fake_episode(p.seed, k % 2 == 0), 1.0) for k, p in enumerate(plans)]

    view = restrict(cfg, rule_reads["train_rl"]["reads"], step="train_rl")  # as train_rl's Snakemake job reads the config
    curve = run_rl(view, student, fake_tasks(tmp_path / "task"), tmp_path / "rl" / "checkpoint",
                     tmp_path / "rl" / "curve.json", collect=collect)
    rows = curve["iterations"]
    assert [r["iteration"] for r in rows] == [0, 1]
    for row in rows:
        for key, kind in (("iteration", int), ("mean_reward", float), ("valid_share", float),
                          ("mean_duration_s", float), ("kl", float)):
            assert isinstance(row[key], kind), key
        assert row["episodes"] == 4 and row["valid_share"] == 0.5 and row["samples"] > 0
        # where the time went: episodes, then the update with its checkpoint, adding up to the iteration's wall time
        assert row["rollout_s"] >= 0.3 and row["update_s"] > 0
        assert row["rollout_s"] + row["update_s"] == pytest.approx(row["wall_s"], abs=0.02)
        # the update's throughput: tokens through its forward and backward passes over update_s; no GPU, no mfu
        assert row["update_tokens"] > 0 and "mfu" not in row
        # over the unrounded update time: within what rounding update_s to 0.01 s allows
        slowest, fastest = row["update_tokens"] / (row["update_s"] + 0.006), row["update_tokens"] / (row["update_s"] - 0.006)
        assert slowest <= row["update_tokens_per_s"] <= fastest
    assert rows[1]["kl"] > 0  # the policy moved away from the reference after the first update
    assert json.loads((tmp_path / "rl" / "curve.json").read_text()) == curve
    # iteration 0 has no previous solution; iteration 1 starts half of its episodes from the best one
    assert [p.improve for p in seen_plans[0]] == [False] * 4
    assert [p.improve for p in seen_plans[1]] == [True, True, False, False]
    text = seen_plans[1][0].task_yaml.read_text()
    assert "IMPROVE A PREVIOUS SOLUTION" in text and "python baseline.py" in text
    assert "{dataset_docs}" in text  # MLGym still fills the dataset docs


def test_rl_config_defaults_and_student_rl_source() -> None:
    cfg = GymforgeConfig()
    assert cfg.rl.improve_fraction == 0.5 and cfg.rl.duration_aware and cfg.rl.reward.milestone_artefact == 0.1
    GymforgeConfig.model_validate({"evaluate": {"models": [{"name": "student-rl", "source": "student-rl"}]}})
    from gymforge.stages.scores import student_pairs

    models = GymforgeConfig.model_validate({"evaluate": {"models": [
        {"name": "b", "source": "student-base"}, {"name": "s", "source": "student-sft"},
        {"name": "r", "source": "student-rl"}]}}).evaluate.models
    assert student_pairs(models) == [("s", "b"), ("r", "s")]
    assert random.Random(0)  # keep the import honest
