"""The offline teacher as an MLGym agent: its improvements, its policy, and whole episodes over HTTP."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from gymforge.tasks import mlgym
from gymforge.agent import Agent, AgentConfig, AgentTask, EvaluationFormatError, SubmissionNotFound, parse_reply
from gymforge.agent.parsing import FormatError
from gymforge.llm.codeblocks import parse_files
from gymforge.runtime.codecheck import check_python
from gymforge.core.config import EndpointConfig
from gymforge.llm.client import LLMClient
from gymforge.offline import agent_policy, dispatch, ensure_server, families, improvements
from gymforge.offline.families.data_heavy import dataset_details
from gymforge.core.prompts import render
from gymforge.sandbox import ExecResult, Limits, get_sandbox

# One thread per numeric library: parallel runs on a small machine otherwise spin against each other.
THREADS = {"OMP_NUM_THREADS": "1"}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **THREADS}

TASKS: dict[str, tuple[str, ...]] = {
    "tabular_classification": ("Penguin species identification from body measurements", "palmerpenguins/penguins",
                               "macro F1"),
    "tabular_regression": ("Diabetes disease progression regression from baseline measurements", "sklearn/diabetes",
                           "RMSE"),
    "time_series_forecasting": ("Yearly sunspot activity forecasting", "statsmodels/sunspots", "MAE"),
    "model_submission": ("Train and submit a wine cultivar classifier", "sklearn/wine", "accuracy"),
    "stag_hunt": ("Strategy for the iterated stag hunt against adaptive opponents",),
    "rock_paper_scissors": ("Rock-paper-scissors bot exploiting biased opponents",),
    "ultimatum": ("Ultimatum game offers against heterogeneous responders",),
    "knapsack": ("Greedy knapsack heuristics under a time budget",),
    "bin_packing": ("Online bin packing heuristic design",),
}


# The hub's description of a bundled dataset and the train/test split the pipeline stores: the offline
# families' own helper.
_dataset = cache(dataset_details)


@cache
def task_of(name: str, seed: int = 0) -> Task:
    return Task(*TASKS[name], seed=seed)


class Task:
    """A task as the offline teacher writes it (clean drafts), laid out as an MLGym workspace on demand."""

    def __init__(self, topic: str, dataset_id: str | None = None, metric: str = "Score", seed: int = 0) -> None:
        self.dataset_id = dataset_id
        dataset = _dataset(dataset_id)[0] if dataset_id else None
        proposal = {"topic": topic, "metric": metric, "description": f"A task about {topic.lower()}.",
                    "dataset": dataset}
        configs = parse_files(families.write_configs(proposal, seed=seed, attempt=1))
        self.code = parse_files(families.write_code(configs, dataset, seed=seed + 1, attempt=1))
        self.config: mlgym.TaskConfig | None = None
        datasets = []
        for path, text in configs.items():
            model = mlgym.TaskConfig if path.startswith("configs/tasks/") else mlgym.DatasetConfig
            parsed, errors = mlgym.parse_config(model, text, path, Path(path).stem)
            assert not errors, errors
            if isinstance(parsed, mlgym.TaskConfig):
                self.config = parsed
            else:
                datasets.append(parsed)
        assert self.config is not None
        self.datasets = datasets
        self.description = mlgym.render_description(self.config, datasets)
        self.brief = improvements.read_brief(self.description)

    def source(self, name: str) -> str:
        return next(text for path, text in self.code.items() if path.endswith("/" + name))

    def workspace(self, root: Path) -> Path:
        ws = root / self.config.id  # type: ignore[union-attr]
        ws.mkdir(parents=True)
        for dest, src in mlgym.workspace_layout(self.config, self.datasets).items():  # type: ignore[arg-type]
            if dest == "data":
                _dataset(self.dataset_id)[1].save_to_disk(str(ws / "data"))  # type: ignore[arg-type]
            else:
                (ws / dest).write_text(self.code[src])
        return ws


class Evaluator:
    """Runs the task's evaluation script the way MLGym does and reads its stdout (docs/verification.md)."""

    def __init__(self, ws: Path, config: mlgym.TaskConfig) -> None:
        self.ws, self.config = ws, config

    def evaluate(self) -> tuple[dict[str, float], str]:
        entrypoint = self.config.task_entrypoint
        if entrypoint == "CSVSubmissionTasks":
            artefact = self.ws / "submission.csv"
            args = ["--submission_file", str(artefact)]
        elif entrypoint == "ModelSubmissionTasks":
            artefact = next(iter(sorted(self.ws.glob("*.yaml"))), self.ws / "missing.yaml")
            args = ["--config_fname", str(artefact)]
        else:
            artefact, args = self.ws / self.config.baseline_paths[0], []
        if not artefact.exists():
            raise SubmissionNotFound(f"{artefact.name} does not exist")
        done = subprocess.run([sys.executable, self.config.evaluation_paths[0], *args], cwd=self.ws, env=ENV,
                              capture_output=True, text=True, timeout=300)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        if done.returncode or not lines:
            raise EvaluationFormatError(done.stderr.strip()[-500:] or "no JSON on stdout")
        text = lines[0] if entrypoint == "ModelSubmissionTasks" else done.stdout
        return json.loads(text), str(artefact)


def _beats(brief: improvements.Brief, score: float, baseline: float) -> bool:
    return score > baseline if brief.higher_is_better else score < baseline


def _score(ws: Path, task: Task, source: str) -> float:
    (ws / task.brief.file).write_text(source)
    done = subprocess.run([sys.executable, task.brief.file], cwd=ws, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    metrics, _ = Evaluator(ws, task.config).evaluate()  # type: ignore[arg-type]
    return next(iter(metrics.values()))


# ---- improvements --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TASKS))
def test_every_idea_turns_the_real_baseline_into_clean_code(name: str) -> None:
    for seed in range(3):
        task = task_of(name, seed)
        ideas = improvements.ideas(task.brief)
        assert ideas, task.brief
        source = task.source(task.brief.file)
        for idea in ideas:
            improved = improvements.improve(source, task.brief, idea)
            assert not check_python(improved, task.brief.file), (idea, improved)
            assert improvements.improve(improved, task.brief, idea) == improved  # applying twice changes nothing
            if improved != source:
                assert improvements.idea_of(improved) == idea
                broken = improvements.slip(source, improved, random.Random(seed))
                assert broken is not None and check_python(broken, task.brief.file)


def test_the_brief_reads_the_task_description() -> None:
    regression, game = task_of("tabular_regression").brief, task_of("knapsack").brief
    assert (regression.kind, regression.problem, regression.target) == ("csv", "regression", "progression")
    assert not regression.higher_is_better and len(regression.features) == 10
    assert (game.kind, game.file, game.entry) == ("python", "heuristic.py", "select_items")
    assert task_of("model_submission").brief.kind == "model"
    assert improvements.read_brief("Beat the baseline in `baseline.py`.").kind == "unknown"


def test_a_file_of_unknown_shape_is_rewritten_whole_with_the_same_contract() -> None:
    brief = task_of("tabular_regression").brief
    rewritten = improvements.improve("import pandas as pd\n\nprint('hand-written')\n", brief, "boosting")
    assert not check_python(rewritten, "baseline.py")
    assert '"submission.csv"' in rewritten and '"progression"' in rewritten and "load_from_disk" in rewritten


# The costlier "select" is what the end-to-end episode below runs.
@pytest.mark.parametrize("name,idea", [pytest.param("tabular_regression", "forest", marks=pytest.mark.slow),
                                       ("knapsack", "dp"), ("stag_hunt", "predict")])
def test_improvements_beat_the_baseline_when_run(name: str, idea: str, tmp_path: Path) -> None:
    task = task_of(name)
    ws = task.workspace(tmp_path)
    source = task.source(task.brief.file)
    baseline = _score(ws, task, source)
    improved = _score(ws, task, improvements.improve(source, task.brief, idea))
    assert _beats(task.brief, improved, baseline), (baseline, improved)


# ---- the policy on synthetic conversations --------------------------------------------------------------


def _conversation(task: Task, turns: list[tuple[str, str]] | None = None) -> list[dict[str, str]]:
    status = {"current_step": 0, "remaining_steps": 50, "open_file": "n/a", "working_dir": "/ws"}
    messages = [
        {"role": "system", "content": render("agent_system", window=1000)},
        {"role": "user", "content": render("agent_task", description=task.description, baseline=None, max_steps=50,
                                           training_timeout="600", short_timeout="25", **status)},
    ]
    for i, (reply, observation) in enumerate(turns or [], 1):
        status |= {"current_step": i, "remaining_steps": 50 - i}
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": render("agent_next_step", observation=observation, **status)}]
    return messages


def _reply(messages: list[dict[str, str]], seed: int, model: str = "gymforge-offline-teacher@1.0") -> str:
    content = dispatch.respond({"model": model, "seed": seed, "messages": messages}).content
    assert content is not None
    return content


def test_agent_conversations_are_recognised_by_the_task_prompt() -> None:
    task = task_of("tabular_classification")
    convo = [(m["role"], m["content"]) for m in _conversation(task)]
    assert agent_policy.is_agent_conversation(convo)
    assert not agent_policy.is_agent_conversation([("user", render("topics", n=3, seen=[]))])
    assert agent_policy.skill_of("gymforge-offline-teacher") == agent_policy.DEFAULT_SKILL == 0.8
    assert agent_policy.skill_of("gymforge-offline-teacher@0.3") == 0.3
    assert agent_policy.skill_of("gymforge-offline-teacher@7") == 1.0


def test_first_replies_explore_then_run_the_baseline() -> None:
    task = task_of("tabular_regression")
    turns: list[tuple[str, str]] = []
    actions = []
    for _ in range(8):
        reply = _reply(_conversation(task, turns), seed=3)
        thought, action = parse_reply(reply)
        assert thought.startswith("DISCUSSION") and len(thought) > 40
        actions.append(action)
        observation = "baseline.py\ndata\nevaluate.py" if action.startswith("ls") else ""
        if action.startswith("open"):
            lines = task.source("baseline.py").splitlines()
            observation = "\n".join([f"[File: /ws/baseline.py ({len(lines)} lines total)]", "(0 more lines above)",
                                     *(f"{i}:{ln}" for i, ln in enumerate(lines, 1)), "(0 more lines below)"])
        elif action == "python baseline.py":
            observation = "wrote submission.csv with 89 rows"
        elif action == "validate":
            observation = ("Your code produced a valid submission artefact at /ws/submission.csv.\n"
                           'Baseline Score: {"rmse": 62.0}\nEvaluation Score: {"rmse": 62.0}')
        turns.append((reply, observation))
        if action.startswith("edit"):
            break
    assert actions[0] in ("ls", "ls -la")
    opened = actions.index('open "baseline.py"')
    ran = actions.index("python baseline.py")
    assert opened < ran < len(actions) - 1 and actions[-1].startswith("edit ")
    assert "end_of_edit" in actions[-1] and improvements.idea_of(actions[-1]) == "select"


def test_same_seed_same_reply_and_seeds_vary_the_episode() -> None:
    task = task_of("tabular_classification")
    messages = _conversation(task)
    assert _reply(messages, seed=5) == _reply(messages, seed=5)
    plans = {agent_policy._plan(seed, task.description, task.brief, 0.8) for seed in range(20)}
    assert len({p.setup for p in plans}) > 2 and len(plans) > 5


def test_malformed_replies_grow_as_skill_drops_and_a_re_ask_gets_a_proper_one() -> None:
    task = task_of("bin_packing")
    messages = _conversation(task)

    def malformed(model: str) -> list[tuple[int, str, str]]:
        bad = []
        for seed in range(80):
            reply = _reply(messages, seed, model)
            try:
                parse_reply(reply)
            except FormatError as err:
                bad.append((seed, reply, str(err)))
        return bad

    weak = malformed("gymforge-offline-teacher@0.0")
    assert len(weak) >= 10 > 3 >= len(malformed("gymforge-offline-teacher@1.0"))
    for seed, reply, error in weak[:5]:
        retry = [*messages, {"role": "assistant", "content": reply},
                 {"role": "user", "content": render("agent_format_error", error=error)}]
        thought, action = parse_reply(_reply(retry, seed))
        assert action in ("ls", "ls -la") and "format" in thought


def test_low_skill_plans_commit_every_kind_of_failure() -> None:
    task = task_of("tabular_regression")
    plans = [agent_policy._plan(seed, task.description, task.brief, 0.2) for seed in range(200)]
    assert {p.fate for p in plans} == {"normal", "premature", "wander", "forget"}
    assert any(p.slip for p in plans) and any(p.stall for p in plans)
    strong = [agent_policy._plan(seed, task.description, task.brief, 1.0) for seed in range(50)]
    assert all(p.fate == "normal" and not p.slip and not p.stall for p in strong)


class ScriptedSession:
    """A shell that runs nothing: canned outputs, real files, so the file tools and the policy meet for real."""

    def __init__(self, ws: Path, artefact: str) -> None:
        self.workspace, self.workdir, self.cwd = ws, str(ws), str(ws)
        self.artefact = ws / artefact

    def run(self, command: str, timeout: float) -> ExecResult:
        if command.startswith("sleep"):
            return ExecResult(output="", exit_code=137, timed_out=True, duration_s=timeout)
        if command.startswith("python") and not command.startswith("python -c"):
            self.artefact.write_text("id,target\n")
            return ExecResult(output="wrote submission.csv", exit_code=0, timed_out=False, duration_s=0.1)
        return ExecResult(output="baseline.py\ndata\nevaluate.py", exit_code=0, timed_out=False, duration_s=0.1)


class ScoreByIdea:
    """Scores the file by the idea it carries, so the episode's decisions are what is being tested."""

    def __init__(self, ws: Path, task: Task) -> None:
        self.ws, self.task = ws, task

    def evaluate(self) -> tuple[dict[str, float], str]:
        if not (self.ws / "submission.csv").exists():
            raise SubmissionNotFound("submission.csv does not exist")
        idea = improvements.idea_of((self.ws / self.task.brief.file).read_text())
        return {"rmse": {None: 62.0, "select": 64.0, "boosting": 58.0}.get(idea, 60.0)}, "submission.csv"


def _client(tmp_path: Path, skill: float) -> LLMClient:
    endpoint = EndpointConfig(provider="offline", model=f"gymforge-offline-teacher@{skill}")
    return LLMClient(endpoint, stage="agent", cache_dir=tmp_path / "cache", ledger_dir=tmp_path / "ledger",
                     budget_usd=1.0, base_url=ensure_server())


def _scripted_episode(tmp_path: Path, seed: int, skill: float) -> Any:
    task = task_of("tabular_regression")
    ws = tmp_path / f"ws{seed}_{skill}"
    ws.mkdir()
    (ws / "baseline.py").write_text(task.source("baseline.py"))
    assert task.config is not None
    agent_task = AgentTask(id=task.config.id, description=task.description, baseline={"rmse": 62.0},
                           training_timeout=600)
    agent = Agent(_client(tmp_path, skill), ScriptedSession(ws, "submission.csv"), ScoreByIdea(ws, task), agent_task,
                  AgentConfig(max_steps=30), seed=seed)
    return agent.run()


def test_a_strong_agent_keeps_the_best_idea_and_a_weak_one_fails_realistically(tmp_path: Path) -> None:
    # "select" scores worse than the baseline in this script: a strong agent tries the next idea and submits it.
    traj = _scripted_episode(tmp_path, seed=1, skill=1.0)
    actions = [step.action for step in traj.trajectory]
    assert traj.info.exit_status == "submitted" and traj.info.score[-1] == {"rmse": 58.0}
    ideas = [improvements.idea_of(a) for a in actions if a.startswith("edit")]
    assert ideas[:2] == ["select", "boosting"]
    assert actions.index("python baseline.py") < actions.index("validate") < next(
        i for i, a in enumerate(actions) if a.startswith("edit"))
    statuses = {_scripted_episode(tmp_path, seed, 0.1).info.exit_status for seed in range(8)}
    assert statuses - {"submitted"}, statuses


# ---- whole episodes: real teacher over HTTP, real sandbox, real task -------------------------------------


def _healthy_seed(task: Task, skill: float) -> int:
    """A rollout seed whose episode commits no failure, so the test checks competence, not luck."""
    plans = ((s, agent_policy._plan(s, task.description.strip(), task.brief, skill)) for s in range(50))
    return next(s for s, plan in plans if plan.fate == "normal" and not plan.stall)


@pytest.mark.parametrize("name", [pytest.param("tabular_regression", marks=pytest.mark.slow), "knapsack"])
def test_episode_end_to_end_improves_on_the_baseline(name: str, tmp_path: Path) -> None:
    task = task_of(name)
    ws = task.workspace(tmp_path / "tasks")
    config = task.config
    assert config is not None
    done = subprocess.run([sys.executable, config.baseline_paths[0]], cwd=ws, env=ENV, capture_output=True)
    assert done.returncode == 0
    evaluator = Evaluator(ws, config)
    baseline = evaluator.evaluate()[0]
    (ws / "submission.csv").unlink(missing_ok=True)
    agent_task = AgentTask(id=config.id, description=task.description, baseline=baseline,
                           training_timeout=config.effective_training_timeout)
    with get_sandbox("local").open(ws, limits=Limits(), env=THREADS) as session:
        agent = Agent(_client(tmp_path, 0.9), session, evaluator, agent_task, AgentConfig(short_timeout_s=10),
                      seed=_healthy_seed(task, 0.9), out_dir=tmp_path / "run")
        traj = agent.run()
    assert traj.info.exit_status == "submitted", [s.action for s in traj.trajectory]
    metric = next(iter(baseline))
    assert _beats(task.brief, traj.info.score[-1][metric], baseline[metric]), (baseline, traj.info.score)
    assert (tmp_path / "run" / f"{config.id}.traj").exists()
    for step in traj.trajectory:
        assert step.thought.startswith("DISCUSSION")
