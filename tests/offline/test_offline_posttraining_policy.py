"""The offline teacher's agent on post-training tasks (gymforge.offline.posttraining_policy), in both interfaces.

Units: the policy's decisions, driven through the offline server's dispatch (`agent_policy.answer`) against a small
simulated workspace that answers each command as the sandbox and the evaluation would (a training script's faults
crash it, a model without tokenizer files is refused, a learning rate far too high scores below the base), with the
agent loop's elision of old observations. Slow: one real episode per interface on penguinSpeciesPosttrain (bubblewrap
sandbox, the tiny base of tests/tasks/test_posttraining.py, the real offline server).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gymforge.agent.parsing import parse_reply
from gymforge.agent.trajectory import build_messages
from gymforge.core.prompts import render
from gymforge.offline import agent_policy
from gymforge.offline import posttraining_policy as ptp

DESCRIPTION = (
    "Post-train the language model in base_model/ (SmolLM2-135M-Instruct, a Hugging Face folder, read-only).\n"
    'Rows: one JSON object a line in data/train.jsonl: {"id": 0, "prompt": "Penguin ...?", "answer": "Adelie"}.\n'
    "Save your model with save_pretrained to final_model/ (safetensors weights, its config and the base's "
    "tokenizer files). `python baseline.py` copies the base model there unchanged. At most 5 new tokens. "
    "Metric: accuracy, higher is better."
)


def first_message(interface: str, max_steps: int, baseline: float | None = 0.0, description: str = DESCRIPTION) -> str:
    extra = render("agent_workflow", skills="skills", log="experiment_log.md", ngram=8) if interface == "workflow" \
        else ""
    return render("agent_task", description=description, baseline=json.dumps({"accuracy": baseline})
                  if baseline is not None else None, max_steps=max_steps, training_timeout="900", short_timeout="25",
                  extra=extra, current_step=0, remaining_steps=max_steps, open_file="n/a", working_dir="/ws").rstrip()


class Workspace:
    """What the sandbox and the evaluation would answer, modelled from the commands' text."""

    def __init__(self, oom: bool = False) -> None:
        self.oom = oom  # AdamW's state does not fit the sandbox's memory
        self.files: dict[str, str] = {}
        self.final: dict[str, Any] | None = None  # the model in final_model/
        self.runs: dict[int, dict[str, Any]] = {}
        self.trainings = 0

    @staticmethod
    def score(lr: float, steps: int) -> float:
        return 0.0 if lr >= 1e-3 else round(0.5 + steps / 100 + (0.05 if lr == 2e-4 else 0.0), 6)

    def model(self, lr: float, steps: int, tokenizer: bool = True) -> dict[str, Any]:
        return {"score": self.score(lr, steps), "tokenizer": tokenizer}

    def run(self, command: str) -> str:
        head = command.split(None, 1)[0]
        if command == "python baseline.py":
            self.final = {"score": 0.0, "tokenizer": True}
            return "copied base_model/ to /ws/final_model"
        if head == "create":
            self.files["train.py"] = "\n"
            return "[File: /ws/train.py (1 lines total)]"
        if head == "edit":
            first, *body = command.split("\n")[:-1]
            a, b = (int(x) for x in first.split()[1].split(":"))
            lines = self.files["train.py"].splitlines()
            new = "\n".join(lines[: a - 1] + body + lines[b:]) + "\n"
            if "os." in new and "import os" not in new:
                return ("Your edit was NOT applied: it would introduce these errors:\n- train.py:20: undefined name "
                        "'os'\nThe file is unchanged.")
            self.files["train.py"] = new
            return f"[File: /ws/train.py ({len(new.splitlines())} lines total)]\nFile updated."
        if command == "python train.py":
            text = self.files["train.py"]
            if 'row["completion"]' in text:
                return "Traceback (most recent call last):\n  File \"train.py\", line 30\nKeyError: 'completion'"
            if "max_seq_length" in text:
                return ("Traceback (most recent call last):\n  File \"train.py\", line 38\nTypeError: SFTConfig.__init__() "
                        "got an unexpected keyword argument 'max_seq_length'")
            if self.oom and 'OPTIM = "adamw_torch"' in text:
                return ("Traceback (most recent call last):\n  File \"adam.py\", line 178\nRuntimeError: [enforce fail at "
                        "alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                        "3538944 bytes. Error code 12 (Cannot allocate memory)")
            lr = float(re.search(r"LEARNING_RATE = (\S+)", text).group(1))
            steps = int(re.search(r"STEPS = (\d+)", text).group(1))
            tokenizer = "shutil.copyfile" in text or bool(self.final and self.final["tokenizer"])
            self.final = self.model(lr, steps, tokenizer)
            self.trainings += 1
            return f"302 training rows\ntrained {steps} steps, train loss 0.5\nsaved the model to final_model/"
        if head == "for" and "tokenizer.json" in command:
            if self.final is not None:
                self.final["tokenizer"] = True
            return "config.json\nmodel.safetensors\ntokenizer.json"
        if command.startswith("rm -rf best_model && cp -r final_model best_model"):
            self.files["best_model"] = json.dumps(self.final)
            return ""
        if command.startswith("rm -rf final_model && cp -r best_model final_model"):
            self.final = json.loads(self.files["best_model"])
            return ""
        if head in ("validate", "evaluate", "submit"):
            if self.final is None:
                return "Submission artefact not found: final_model/\nProduce the artefact the task asks for first."
            if not self.final["tokenizer"]:
                return ("The evaluation could not read your submission: final_model/ was rejected: tokenizer.json is "
                        "missing or differs from the base's (the tokenizer must be the base's)")
            return ("Your code produced a valid submission artefact at final_model.\nBaseline Score: "
                    f'{{"accuracy": 0.0}}\nEvaluation Score: {{"accuracy": {self.final["score"]}}}')
        if head == "python" and "sft.jsonl" in command:
            key = re.search(r"'(\w+)': r\['answer'\]", command).group(1)
            self.files["sft.jsonl"] = key
            return ""
        if head == "data_validate":
            path = command.split()[1]
            if path == "sft.jsonl" and self.files.get(path) != "completion":
                return ("format errors: 302 rows: line 1: no non-empty 'completion' (or 'answer') string\n"
                        "data_validate sft.jsonl: FAILED: fix the data first")
            return "302 rows\noverlap with the held-out evaluation prompts: none\ndata_validate " + path + ": PASSED"
        if head == "cat" and "<<'EOF'" in command:
            name = command.split()[2]
            self.files[name] = command.split("\n", 1)[1].rsplit("EOF", 1)[0]
            return ""
        if head == "train":
            config = yaml.safe_load(self.files[command.split()[1]])
            k = len(self.runs) + 1
            self.runs[k] = {}
            if "max_seq_length" in config:
                return f"run {k}: failed (unknown settings ['max_seq_length']; known: [...]); log runs/{k}/train.log"
            self.runs[k] = self.model(float(config["learning_rate"]), int(config["max_steps"]))
            self.final = dict(self.runs[k])
            self.trainings += 1
            return f"run {k}: ok; log runs/{k}/train.log, experiment_log.md updated\nTRAIN_RESULT {{}}"
        if head == "cp" and command.startswith("cp -r runs/"):
            self.final = dict(self.runs[int(command.split("/")[1])])
            return ""
        return "ok"


def play(interface: str, seed: int, model: str, max_steps: int = 30,
         ws: Workspace | None = None) -> tuple[list[tuple[str, str, str]], Workspace]:
    """An episode as the agent loop runs it, against the simulated workspace: (thought, command, observation)s."""
    ws = ws or Workspace()
    history: list[dict[str, str]] = [{"role": "system", "content": "system"},
                                     {"role": "user", "content": first_message(interface, max_steps)}]
    steps = []
    for n in range(max_steps):
        messages = build_messages(history)
        conversation = [(m["role"], m["content"]) for m in messages]
        reply = agent_policy.answer(conversation, seed=seed, model=model)
        for _ in range(3):  # the loop's format retries
            try:
                thought, command = parse_reply(reply)
                break
            except Exception:  # noqa: BLE001
                retry = [*conversation, ("assistant", reply),
                         ("user", "Your reply could not be used: it must hold one command block.")]
                reply = agent_policy.answer(retry, seed=seed, model=model)
        else:  # the loop auto-submits
            steps.append(("", "exit_format", ws.run("submit")))
            break
        observation = ws.run(command)
        steps.append((thought, command, observation))
        history.append({"role": "assistant", "content": reply})
        if command == "submit":
            break
        history.append({"role": "user", "content": f"{observation}\n(Current Step: {n + 1}, Remaining Steps: "
                                                   f"{max_steps - n - 1})\n(Open file: n/a)\n(Current directory: /ws)\nbash-$"})
    return steps, ws


SKILLS = ("gymforge-offline-teacher", "gymforge-offline-teacher@0.3", "gymforge-offline-teacher@0.0",
          "gymforge-offline-teacher@1.0")


def test_a_post_training_task_is_recognised_in_either_interface() -> None:
    cli = ptp.read_task(first_message("cli", 30))
    workflow = ptp.read_task(first_message("workflow", 12, baseline=None))
    assert cli is not None and cli.interface == "cli" and cli.max_steps == 30 and cli.baseline == 0.0
    assert cli.pool == "data/train.jsonl" and cli.answer_key == "answer" and cli.metric == "accuracy"
    assert workflow is not None and workflow.interface == "workflow" and workflow.max_steps == 12
    assert workflow.baseline is None
    other = render("agent_task", description="Train a classifier; write submission.csv.", baseline=None,
                   max_steps=30, training_timeout="900", short_timeout="25", extra="", current_step=0,
                   remaining_steps=30, open_file="n/a", working_dir="/ws")
    assert ptp.read_task(other) is None


@pytest.mark.parametrize("interface", ["cli", "workflow"])
def test_episodes_train_evaluate_and_submit_within_the_steps(interface: str) -> None:
    seen_faults = set()
    for seed, model in [(seed, model) for seed in range(12) for model in SKILLS]:
        for max_steps in (20, 30):  # configs/post-training.yaml, config.yaml's trajectories
            steps, ws = play(interface, seed, model, max_steps=max_steps)
            commands = [c for _, c, _ in steps]
            assert commands[-1] in ("submit", "exit_format"), (seed, model, commands)
            assert not any("lost track" in t for t, _, _ in steps), (seed, model, commands)
            seen_faults |= ptp.draw_plan(ptp.read_task(first_message(interface, 30)), seed,
                                         agent_policy.skill_of(model)).faults
            if commands[-1] == "exit_format":  # three malformed replies in a row: the loop auto-submitted
                continue
            assert 1 <= ws.trainings <= ptp.MAX_TRAININGS, (seed, model, commands)
            if interface == "workflow":
                assert commands.index("python baseline.py") < commands.index("evaluate")
                assert any(c.startswith("plan ") for c in commands) and any(c.startswith("log ") for c in commands)
                first_train = next(i for i, c in enumerate(commands) if c.startswith("train "))
                assert commands.index("evaluate") < first_train
            else:
                assert "create train.py" in commands and "python train.py" in commands and "validate" in commands
            # what is submitted is the best model the episode evaluated (or the base)
            scored = [json.loads(m.group(1))["accuracy"] for _, c, o in steps
                      if c in ("validate", "evaluate") and (m := re.search(r"Evaluation Score: (\{.*\})", o))]
            assert ws.final is not None and ws.final["score"] == max([0.0, *scored]), (seed, model, commands)
    assert {"data_key", "trl_arg", "high_lr"} <= seen_faults


def test_the_same_seed_gives_the_same_episode_and_seeds_differ() -> None:
    runs = {seed: [c for _, c, _ in play("cli", seed, "gymforge-offline-teacher@0.5")[0]] for seed in range(6)}
    assert runs[0] == [c for _, c, _ in play("cli", 0, "gymforge-offline-teacher@0.5")[0]]
    assert len({tuple(r) for r in runs.values()}) > 1


def test_failures_come_from_the_faults_and_are_repaired() -> None:
    """A wrong data key crashes the cli script (fixed by an edit), the workflow's data_validate catches it before any
    training; an unknown TRL argument crashes the script, the train skill refuses the config before loading a model;
    forgotten tokenizer files get the model refused; a learning rate far too high is lowered after its evaluation."""
    def find(interface: str, fault: str) -> tuple[list[tuple[str, str, str]], Workspace]:
        for seed in range(200):
            plan = ptp.draw_plan(ptp.read_task(first_message(interface, 30)), seed, 0.2)
            if fault in plan.faults and (fault != "tokenizer" or not plan.check_baseline):
                return play(interface, seed, "gymforge-offline-teacher@0.2")
        raise AssertionError(f"no seed draws {fault}")

    steps, _ = find("cli", "data_key")
    observations = [o for _, c, o in steps if c == "python train.py"]
    assert any("KeyError" in o for o in observations) and "trained" in observations[-1]
    steps, ws = find("workflow", "data_key")
    validations = [o for _, c, o in steps if c.startswith("data_validate")]
    assert "FAILED" in validations[0] and "PASSED" in validations[-1] and ws.trainings >= 1
    steps, _ = find("cli", "trl_arg")
    assert any("unexpected keyword argument" in o for _, c, o in steps if c == "python train.py")
    steps, ws = find("workflow", "trl_arg")
    trains = [o for _, c, o in steps if c.startswith("train ")]
    assert "unknown settings" in trains[0] and any("ok" in o for o in trains[1:])
    steps, _ = find("cli", "tokenizer")
    assert any("tokenizer.json is missing" in o for _, c, o in steps if c == "validate")
    assert any(c.startswith("for f in tokenizer.json") for _, c, _ in steps)
    for interface in ("cli", "workflow"):
        steps, ws = find(interface, "high_lr")
        trained = [c for _, c, _ in steps if c.startswith(("edit", "cat >"))]
        assert any("3e-3" in c or "0.003" in c for c in trained) and any("2e-4" in c or "0.0002" in c for c in trained)
        assert ws.final["score"] > 0


def test_a_cli_run_out_of_memory_switches_to_adafactor() -> None:
    steps, ws = play("cli", 1, "gymforge-offline-teacher", ws=Workspace(oom=True))
    runs = [o for _, c, o in steps if c == "python train.py"]
    assert "Cannot allocate memory" in runs[0] and "trained" in runs[-1] and ws.trainings >= 1
    assert any('OPTIM = "adafactor"' in c for _, c, _ in steps if c.startswith("edit"))


@pytest.mark.parametrize("interface", ["cli", "workflow"])
def test_a_short_budget_still_ends_with_a_submission(interface: str) -> None:
    for seed in range(8):
        for max_steps in (8, 12):
            steps, _ = play(interface, seed, "gymforge-offline-teacher@0.3", max_steps=max_steps)
            assert len(steps) <= max_steps
            if len(steps) < max_steps:
                assert steps[-1][1] in ("submit", "exit_format")


def test_the_cli_script_is_valid_python_with_no_undefined_names() -> None:
    from gymforge.runtime.codecheck import check_python

    task = ptp.read_task(first_message("cli", 30))
    script = ptp.train_script(task, ptp.Recipe())
    assert check_python(script, "train.py") == []
    assert 'row["answer"]' in script and "max_length=MAX_LENGTH" in script and "shutil.copyfile" in script
    assert any("undefined name 'os'" in e for e in check_python(ptp.train_script(task, ptp.Recipe(),
                                                                                 frozenset({"guard"})), "train.py"))


# -- real episodes on penguinSpeciesPosttrain (the tiny base standing in for SmolLM2) -----------------------------


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A base-model cache whose `smollm2-135m` is the tiny base: the task's own base key resolves to it."""
    from test_posttraining import build_tiny_base

    from gymforge.tasks import posttraining as pt

    cache = tmp_path_factory.mktemp("models")
    build_tiny_base(cache / pt.SMOLLM2)
    return cache


def seed_with(interface: str, skill: float, wanted: set[str], tmp_path: Path) -> int:
    """The first seed whose episode on penguinSpeciesPosttrain draws the `wanted` faults (and, in cli, writes the
    script before any baseline run, so a missing tokenizer would show)."""
    from test_posttraining import TASK

    from gymforge.benchmark.suite import builtin_root
    from gymforge.sandbox import get_sandbox
    from gymforge.tasks.environment import TaskEnvironment

    root = builtin_root()
    description = TaskEnvironment(root / "configs" / "tasks" / f"{TASK}.yaml", root=root, sandbox=get_sandbox("local"),
                                  run_dir=tmp_path / "describe").description
    task = ptp.read_task(first_message(interface, 30, description=description))
    for seed in range(500):
        plan = ptp.draw_plan(task, seed, skill)
        if wanted <= plan.faults and (interface == "workflow" or not plan.check_baseline):
            return seed
    raise AssertionError(f"no seed draws {wanted}")


def real_episode(tmp_path: Path, bwrap_backend: Any, model_cache: Path, monkeypatch: pytest.MonkeyPatch,
                 interface: str, seed: int, model: str, max_steps: int = 30) -> Any:
    from test_posttraining import TASK

    from gymforge.benchmark.suite import builtin_root
    from gymforge.core.config import EndpointConfig
    from gymforge.llm.client import LLMClient
    from gymforge.offline.server import ensure_server
    from gymforge.sandbox import Limits
    from gymforge.tasks.episode import EpisodeRunner

    runner = EpisodeRunner(bwrap_backend, Limits(memory_mb=4096, cpu_seconds=900, max_processes=256),
                           interface=interface, post_training=lambda: (None, model_cache))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the job's cores: each sandbox's torch gets them (GYMFORGE_TORCH_THREADS)
    llm = LLMClient(EndpointConfig(provider="offline", model=model), stage="agent", cache_dir=tmp_path / "cache",
                    ledger_dir=tmp_path / "ledger", budget_usd=10.0, base_url=ensure_server())
    root = builtin_root()
    try:
        return asyncio.run(runner.run(llm, root / "configs" / "tasks" / f"{TASK}.yaml", root=root,
                                      run_dir=tmp_path / "run", max_steps=max_steps, seed=seed,
                                      baseline={"accuracy": 0.0}, meta={}, out_dir=tmp_path / "out"))
    finally:
        llm.close()


def counted(traj: Any) -> tuple[int, int]:
    """(failed actions, train-to-eval iterations) recounted from the steps, as docs/post-training.md defines them."""
    from gymforge.agent.tools import is_training_command

    failed = iterations = 0
    trained = False
    for step in traj.trajectory:
        head, observation = step.action.split(None, 1)[0], step.observation
        if head in ("validate", "evaluate", "submit"):
            scored = "Evaluation Score" in observation or observation.strip() == "Exited (submit)"
            failed += not scored
            if scored and trained:
                iterations, trained = iterations + 1, False
            continue
        bad = step.exit_code not in (0, None) or step.timed_out or " was NOT applied" in observation \
            or observation.startswith("Error:")
        failed += bad
        if not bad and (head == "train" or is_training_command(step.action)):
            trained = True
    return failed, iterations


@pytest.mark.slow  # about 2 minutes on the 2-core machine: two trainings and three evaluations in the sandbox
@pytest.mark.parametrize("interface,wanted", [("cli", {"data_key"}), ("workflow", {"trl_arg"})])
def test_a_real_episode_trains_and_submits_a_scored_model(
    interface: str, wanted: set[str], tmp_path: Path, bwrap_backend: Any, model_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    skill = 0.5
    seed = seed_with(interface, skill, wanted, tmp_path)
    t0 = time.monotonic()
    traj = real_episode(tmp_path, bwrap_backend, model_cache, monkeypatch, interface, seed,
                        f"gymforge-offline-teacher@{skill}")
    actions = [s.action for s in traj.trajectory]
    print(f"\n{interface} episode (seed {seed}): {time.monotonic() - t0:.1f} s, {len(actions)} steps, scores "
          f"{traj.info.score}, failed {traj.info.failed_actions}, iterations {traj.info.train_eval_iterations}: "
          + ", ".join(f"{a.split()[0]} {s.execution_time:.0f}s" for a, s in zip(actions, traj.trajectory, strict=True)))
    assert traj.info.exit_status == "submitted" and actions[-1] == "submit"
    assert traj.info.submission and traj.info.score and traj.info.flags == []
    assert (traj.info.failed_actions, traj.info.train_eval_iterations) == counted(traj)
    assert traj.info.failed_actions >= 1 and traj.info.train_eval_iterations >= 1
    observations = [s.observation for s in traj.trajectory]
    if interface == "cli":
        assert "create train.py" in actions and any("KeyError" in o for o in observations)
        assert any("trained" in o and "saved the model" in o for a, o in zip(actions, observations, strict=True)
                   if a == "python train.py")
    else:
        assert traj.meta["interface"] == "workflow" and actions.index("evaluate") < actions.index("train sft1.yaml")
        assert any("unknown settings" in o for o in observations) and any("run 2: ok" in o for o in observations)
    # the same seed gives the same replies: each turn's request, rebuilt from the trajectory, gets its reply again
    for n, step in enumerate(traj.trajectory):
        request = [(m["role"], m["content"]) for m in build_messages(traj.history[: 2 * n + 2])]
        first = step.format_errors[0]["response"] if step.format_errors else step.response
        assert agent_policy.answer(request, seed=seed, model=f"gymforge-offline-teacher@{skill}") == first
