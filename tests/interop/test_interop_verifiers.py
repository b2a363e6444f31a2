"""gymforge tasks as a verifiers 0.4 environment (src/gymforge/interop/verifiers_env/, gymforge.interop.verifiers_bridge;
docs/interop.md, "verifiers"): verifiers' own `vf-eval` runs gymforge's agent loop on a verified task against the
offline teacher's endpoint, and every reward and score it records is gymforge's for that episode."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from gymforge.agent.trajectory import read_trajectory
from gymforge.core.config import GymforgeConfig
from gymforge.core.records import VerificationReport
from gymforge.interop.verifiers_bridge import KEY_ENV, episode_config, rows
from gymforge.offline.server import MODEL_ID, ensure_server
from gymforge.rl.rewards import Episode, TaskMetric, episode_reward
from gymforge.sandbox import get_sandbox
from gymforge.tasks.datacache import cache_root
from gymforge.tasks.environment import TaskEnvironment
from gymforge.tools.run_task import replay_replies

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "src" / "gymforge" / "interop" / "verifiers_env"
MLGYM = REPO / "tests" / "fixtures" / "mlgym"
VERIFIERS = "verifiers==0.4.0"
# verifiers pins openai<3 and gymforge's lock has 3.x: its own venv, kept for the rest of the run (CI's checkout).
VENV = Path(os.environ.get("GYMFORGE_VERIFIERS_VENV", REPO / ".cache" / "verifiers-venv"))


def _pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/verifiers/", timeout=15):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def vf_eval() -> Path:
    """verifiers' `vf-eval` in its own venv, with the gymforge_tasks plugin installed (editable); made once."""
    stamp = VENV / "gymforge-stamp"
    want = hashlib.sha256(f"{VERIFIERS}\n{(PLUGIN / 'pyproject.toml').read_text()}".encode()).hexdigest()
    if not (stamp.is_file() and stamp.read_text() == want and (VENV / "bin" / "vf-eval").is_file()):
        if not _pypi_reachable():
            pytest.skip("PyPI is unreachable: verifiers 0.4 cannot be installed into its own venv")
        shutil.rmtree(VENV, ignore_errors=True)
        uv = Path(sys.executable).with_name("uv")  # `make setup` puts uv in gymforge's venv
        python = VENV / "bin" / "python"
        if uv.is_file():
            subprocess.run([str(uv), "venv", "-q", "--python", sys.executable, str(VENV)], check=True)
            install = [str(uv), "pip", "install", "-q", "--python", str(python)]
        else:
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
            install = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*install, VERIFIERS, "-e", str(PLUGIN)], check=True)
        stamp.write_text(want)
    return VENV / "bin" / "vf-eval"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    """A results directory whose one verified environment is the csvTiny fixture, written as verification writes it
    (the verified copy with the baseline gymforge's own baseline run measures)."""
    env = TaskEnvironment(MLGYM / "configs" / "tasks" / "csvTiny.yaml", sandbox=get_sandbox("local"),
                          run_dir=tmp_path_factory.mktemp("base"), gpus=0)
    env.install()
    baseline = env.run_baseline().metrics
    results = tmp_path_factory.mktemp("vf") / "results"
    env.write_verified_copy(results / "environments" / "t0000" / "verified" / "mlgym", [baseline])
    (results / "environments" / "t0000" / "report.json").write_text(VerificationReport(
        item="t0000", status="ok", task_id="csvTiny", baseline_scores=[baseline], metric="rmse",
        higher_is_better=False).model_dump_json())
    return results, baseline


def test_the_taskset_rows_are_the_results_directorys_verified_tasks(results: tuple[Path, dict[str, float]]) -> None:
    root, baseline = results
    [row] = rows(root)
    assert row["task"].endswith("t0000/verified/mlgym/configs/tasks/csvTiny.yaml") and row["slot"] == "t0000"
    assert (row["metric"], row["higher_is_better"], json.loads(row["baseline"])) == ("rmse", False, baseline)
    assert "prompt" not in row and rows(root, micro=True) == []


def test_a_rollouts_config_sends_every_model_call_to_the_endpoint_and_keeps_the_datasets(tmp_path: Path) -> None:
    settings = GymforgeConfig.model_validate({"llm": {"teacher": {"temperature": 0.3}}})
    cfg = episode_config(settings, base_url="http://127.0.0.1:9/v1", model="policy", cache=tmp_path / "c")
    teacher = cfg.llm.teacher
    assert (teacher.provider, teacher.base_url, teacher.model, teacher.api_key_env) == (
        "openai", "http://127.0.0.1:9/v1", "policy", KEY_ENV)
    assert teacher.temperature == 0.3  # the user's request settings stay
    assert cfg.cache == (tmp_path / "c").resolve()  # a response cache of the rollout's own: no call is answered old
    assert cache_root(cfg) == cache_root(settings).resolve()  # the fetched datasets stay where they are
    assert GymforgeConfig.model_validate_json(cfg.model_dump_json()) == cfg  # what run-task reads back


def test_the_plugin_imports_nothing_of_gymforge() -> None:
    """It runs in verifiers' venv (openai<3), where gymforge's dependencies are not installed."""
    tree = ast.parse((PLUGIN / "gymforge_tasks.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.split(".")[0] == "gymforge"]


@pytest.mark.slow
def test_vf_eval_runs_gymforges_loop_and_records_gymforges_rewards(vf_eval: Path, results: tuple[Path, dict[str, float]],
                                                                  tmp_path: Path) -> None:
    """`vf-eval gymforge-tasks`, two rollouts of the task with the offline teacher as the model: each rollout is one
    `gymforge run-task` episode whose every model call went through verifiers (its trace holds them all, the first
    request is the loop's own task message), and the reward and score verifiers records are gymforge's reward of
    that trajectory and gymforge's evaluation of the episode's submission."""
    root, baseline = results
    keep = tmp_path / "episodes"
    env = {**os.environ, "GYMFORGE_PYTHON": sys.executable, "OFFLINE_TEACHER_KEY": "offline"}
    done = subprocess.run(
        [str(vf_eval), "gymforge-tasks", "--env.taskset.results", str(root),
         "--env.agent.runtime.type", "subprocess", "--env.agent.harness.id", "gymforge-tasks",
         "--env.agent.harness.max-steps", "8", "--env.agent.harness.keep", str(keep),
         "-m", MODEL_ID, "--client.base-url", ensure_server(), "--client.api-key-var", "OFFLINE_TEACHER_KEY",
         "--no-push", "-o", str(tmp_path / "out"), "-n", "1", "-r", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [traces_file] = (tmp_path / "out").glob("*/traces.jsonl")
    traces = [t for line in traces_file.read_text().splitlines() for t in json.loads(line)["traces"]]
    assert len(traces) == 2
    weights = GymforgeConfig().rl.reward
    for trace in traces:
        assert trace["ok"] and not trace["errors"], trace["errors"]
        traj_path = keep / trace["id"] / "episode" / "csvTiny.traj"
        traj = read_trajectory(traj_path)
        assert traj.meta["model"] == MODEL_ID and traj.info.exit_status is not None
        # verifiers saw every model call of the episode, starting from the loop's own first message
        assert len(trace["calls"]) == len(replay_replies(traj_path)) > 1
        first_user = next(n["message"]["content"] for n in trace["nodes"] if n["message"]["role"] == "user")
        assert first_user.startswith("We are solving this task:") and "Predict y from x" in first_user
        # the reward is gymforge's reward of that trajectory
        ours = episode_reward(Episode.of(traj), TaskMetric("rmse", False, baseline["rmse"]), weights)
        assert trace["rewards"]["gymforge"]["score"] == pytest.approx(ours.reward, abs=1e-9)
        # the score is gymforge's evaluation of the episode's submission, measured again here from its artefact
        assert traj.info.score, "the offline teacher's episode submitted nothing"
        check = TaskEnvironment(Path(traj.meta["task_yaml"]), sandbox=get_sandbox("local"), run_dir=tmp_path / "check" / trace["id"],
                                gpus=0)
        workspace = check.install()
        shutil.copy(keep / trace["id"] / "episode" / "episode" / "workspace" / "submission.csv", workspace)
        metrics, _ = check.evaluate()
        assert trace["metrics"]["submission_score"] == pytest.approx(metrics["rmse"], abs=1e-9)
        assert traj.info.score[-1] == metrics
