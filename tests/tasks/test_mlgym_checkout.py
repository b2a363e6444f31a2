"""Checks against a real MLGym checkout (facebookresearch/MLGym), named by the MLGYM_ROOT environment variable.

1. `submit-baseline` on MLGym's game tasks scores their recorded baseline. Their evaluations are unseeded
   Monte-Carlo estimates (10,000 games), so a run matches to within sampling noise, not exactly.
2. MLGym's own loader (its `TaskConfig` and task classes, run with MLGYM_PYTHON, default this interpreter)
   accepts a verified environment written by gymforge, renders the same description, and re-measures the same
   baseline through `update_baseline_scores()`, with a local shell standing in for MLGym's container.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gymforge.agent import read_trajectory
from gymforge.tasks.environment import TaskEnvironment
from gymforge.tasks.mlgym import load_task_config
from gymforge.tools.run_task import run_task
from gymforge.sandbox import get_sandbox

MLGYM_ROOT = os.environ.get("MLGYM_ROOT")
pytestmark = pytest.mark.skipif(not MLGYM_ROOT, reason="MLGYM_ROOT is unset: set it to an MLGym checkout")
GAMES = ("prisonersDilemma", "battleOfSexes", "blotto")
FIXTURE = Path(__file__).parents[1] / "fixtures" / "mlgym" / "configs" / "tasks" / "stagHuntDuel.yaml"

# Runs under MLGym's interpreter: load the task as MLGym's environment does, install it as env.py does
# (starter code by base name, local data at data/), then let the task class run and score the baseline.
LOADER = r"""
import json, os, shutil, subprocess, sys
from pathlib import Path
root, task_id = Path(sys.argv[1]), sys.argv[2]
os.chdir(root)
from mlgym import CONFIG_DIR
try:
    from mlgym.environment.task_config import TaskConfig
except ImportError:
    from mlgym.environment.tasks import TaskConfig
from mlgym.environment.tasks import AbstractMLTask
cfg = TaskConfig.load_yaml(CONFIG_DIR / "tasks" / f"{task_id}.yaml")
ws = Path(sys.argv[3])
for i, d in enumerate(d for d in cfg._datasets if d.is_local):
    shutil.copytree(root / d.data_path, ws / "data" if i == 0 else ws / "data" / Path(d.data_path).name)
for entry in cfg.starter_code:
    src = root / entry
    (shutil.copytree if src.is_dir() else shutil.copy2)(src, ws / src.name)
def shell(cmd, timeout_duration=None, error_msg=""):
    out = subprocess.run(["bash", "-c", cmd], cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=timeout_duration)
    if error_msg and out.returncode:
        raise RuntimeError(error_msg + ": " + out.stdout)
    return out.stdout
task = AbstractMLTask.get(cfg.task_entrypoint)(0, cfg, str(ws), shell, shell)
task.setup()
recorded = list(cfg.baseline_scores)
cfg.baseline_scores.clear()
task.update_baseline_scores()
print("RESULT " + json.dumps({"description": cfg.description, "recorded": recorded, "measured": cfg.baseline_scores}))
"""


@pytest.mark.parametrize("task_id", GAMES)
def test_submit_baseline_scores_the_recorded_game_baseline(task_id: str, tmp_path: Path) -> None:
    task_yaml = Path(MLGYM_ROOT, "configs", "tasks", f"{task_id}.yaml")
    if not task_yaml.is_file():
        pytest.skip(f"{task_yaml} is not in this checkout")
    traj = read_trajectory(run_task(task_yaml, Path(MLGYM_ROOT), "submit-baseline", tmp_path / "out", gpus=0))
    recorded = load_task_config(task_yaml).baseline_scores[0]["Score"]
    assert traj.info.exit_status == "submitted"
    assert traj.info.score[-1]["Score"] == pytest.approx(recorded, abs=0.03)  # sampling sd is about 0.005



def test_house_price_split_is_made_in_the_sandbox_and_its_baseline_reproduces(tmp_path: Path) -> None:
    """regressionKaggleHousePrice's data split comes from MLGym's own helper (run unmodified, in the sandbox);
    its baseline then scores MLGym's recorded rmse and r2 (a deterministic evaluation: equal up to float
    rounding). The task is copied, so the checkout is left as it is."""
    from gymforge.benchmark.suite import load_benchmark, require_runnable
    from gymforge.core.config import EvaluateConfig
    from gymforge.sandbox import Limits

    task_id = "regressionKaggleHousePrice"
    if not Path(MLGYM_ROOT, "data", task_id, "_helpers").is_dir():
        pytest.skip(f"{task_id} is not in this checkout")
    root = tmp_path / "mlgym"
    shutil.copytree(Path(MLGYM_ROOT, "configs"), root / "configs")
    shutil.copytree(Path(MLGYM_ROOT, "data", task_id), root / "data" / task_id,
                    ignore=shutil.ignore_patterns("data"))  # as MLGym ships it: no split yet
    task = next(t for t in load_benchmark(EvaluateConfig(benchmark="mlgym", mlgym_root=str(root))) if t.id == task_id)
    require_runnable(task, tmp_path / "cache", 0, sandbox=get_sandbox("local"), limits=Limits())
    made = root / "data" / task_id / "data"
    assert sorted(p.name for p in made.iterdir()) == ["answer.csv", "test.csv", "train.csv", "validation.csv"]
    traj = read_trajectory(run_task(task.task_yaml, root, "submit-baseline", tmp_path / "out", gpus=0))
    recorded = load_task_config(task.task_yaml).baseline_scores[0]
    assert traj.info.exit_status == "submitted"
    assert traj.info.score[-1]["rmse"] == pytest.approx(recorded["rmse"], rel=1e-9)
    assert traj.info.score[-1]["r2"] == pytest.approx(recorded["r2"], rel=1e-9)

def test_mlgym_loader_accepts_a_verified_environment(tmp_path: Path) -> None:
    python = os.environ.get("MLGYM_PYTHON", sys.executable)
    probe = subprocess.run([python, "-c", "import mlgym.environment.tasks"], check=False, cwd=MLGYM_ROOT,
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=MLGYM_ROOT))
    if probe.returncode:
        pytest.skip(f"MLGym's package does not import with {python} (set MLGYM_PYTHON): {probe.stderr[-300:]}")
    # MLGym's CONFIG_DIR is the checkout's configs/, so the verified tree goes into a copy of the package.
    root = tmp_path / "mlgym"
    shutil.copytree(Path(MLGYM_ROOT, "mlgym"), root / "mlgym", ignore=shutil.ignore_patterns("__pycache__"))
    env = TaskEnvironment(FIXTURE, sandbox=get_sandbox("local"), run_dir=tmp_path / "run")
    env.write_verified_copy(tmp_path / "verified", env.task.baseline_scores)
    shutil.copytree(tmp_path / "verified", root, dirs_exist_ok=True)
    (tmp_path / "ws").mkdir()
    proc = subprocess.run([python, "-c", LOADER, str(root), env.task.id, str(tmp_path / "ws")], check=False,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(root), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert result["description"] == env.description
    assert result["recorded"] == env.task.baseline_scores
    assert result["measured"] == env.task.baseline_scores  # this task's evaluation is deterministic


# --- evaluate.benchmark: mlgym on the real checkout ---------------------------------------------------------------

CPU_TASKS = {"prisonersDilemma", "battleOfSexes", "blotto", "3SATTime", "regressionKaggleHousePrice"}


def test_all_13_benchmark_tasks_load_by_their_id() -> None:
    from gymforge.benchmark.suite import mlgym_tasks
    from gymforge.tasks.mlgym import BENCHMARK_TASKS

    tasks = {t.id: t for t in mlgym_tasks(MLGYM_ROOT)}
    assert list(tasks) == list(BENCHMARK_TASKS)
    assert tasks["rlMetaMazeMisc"].task_yaml.name == "rlMetaMaze.yaml"
    # imageClassificationCifar10L1.yaml declares the same id; the id's own file is MLGym-Bench's task.
    assert tasks["imageClassificationCifar10"].task_yaml.name == "imageClassificationCifar10.yaml"
    assert "3 SAT Problem Dataset" in tasks["3SATTime"].datasets  # a free-text dataset name, loaded leniently
    assert "Fashion MNIST" in tasks["imageClassificationFMnist"].datasets
    assert {t for t, task in tasks.items() if not task.gpus and not task.hub_datasets} == CPU_TASKS
    from gymforge.core.config import validate_config
    from gymforge.tools.estimate import _eval_tasks

    cfg = validate_config({"evaluate": {"benchmark": "mlgym", "mlgym_root": MLGYM_ROOT}})
    assert _eval_tasks(cfg) == (13, f"MLGym tasks found in {MLGYM_ROOT}")  # `gymforge estimate` counts the same


def test_every_config_mlgym_can_run_loads() -> None:
    from gymforge.tasks.mlgym import MLGymConfigError, load_dataset_config

    for path in Path(MLGYM_ROOT, "configs", "datasets").glob("*.yaml"):
        load_dataset_config(path)
    refused = {}
    for path in Path(MLGYM_ROOT, "configs", "tasks").glob("*.yaml"):
        try:
            load_task_config(path)
        except MLGymConfigError as err:
            refused[path.name] = str(err)
    # Its entrypoint BaseMLTask is no class of MLGym's: MLGym cannot run it either.
    assert list(refused) == ["regressionHousingPrice.yaml"]
    assert "task_entrypoint" in refused["regressionHousingPrice.yaml"]


def test_snakemake_plans_all_13_tasks(tmp_path: Path) -> None:
    from workflow_copy import copy_workflow

    workdir = copy_workflow(tmp_path / "wf", "rules", "report")
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "-p", "scores", "--config",
         f"evaluate={{benchmark: mlgym, mlgym_root: {MLGYM_ROOT}}}", f"results_dir={tmp_path / 'results'}"],
        check=False, cwd=workdir, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plan = proc.stdout + proc.stderr
    planned = set(re.findall(r"scores/runs/teacher/(\w+)\.json", plan))
    assert len(planned) == 13 and "rlMetaMazeMisc" in planned
    gpu_jobs = set(re.findall(r"with-gpus 1 -- .*? eval-runs .*--model teacher --task (\w+)", plan))
    assert gpu_jobs == {"languageModelingFineWeb", "imageCaptioningCOCO", "naturalLanguageInferenceMNLI",
                        "rlBreakoutMinAtar", "rlMetaMazeMisc", "rlMountainCarContinuous"}


def test_tasks_that_cannot_run_here_name_what_is_missing(tmp_path: Path) -> None:
    from gymforge.benchmark.suite import mlgym_tasks, unmet_needs

    for task in mlgym_tasks(MLGYM_ROOT):
        problems = " ".join(unmet_needs(task, tmp_path / "no-datasets", gpus=0))
        assert ("`snakemake datasets`" in problems) == bool(task.hub_datasets), task.id
        assert ("`snakemake --resources gpu=N`" in problems) == bool(task.gpus), task.id
        if task.id in GAMES:
            assert problems == ""


def test_parser_agrees_with_mlgym_on_its_released_trajectories() -> None:
    script = Path(__file__).parents[2] / "bench" / "parser_agreement.py"
    proc = subprocess.run([sys.executable, str(script), "--root", MLGYM_ROOT, "--target", "99.9"],
                          check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^gemini-20-flash-thinking\s+\d+", proc.stdout, re.MULTILINE)


# MLGym's own tasks under the evaluator probes (gymforge check-task). Controls that must pass: the house price
# regression and two of the games. Evaluators the probes must flag: titanic (row count checked, then an inner
# join on PassengerId: one id on every row scores 1.0) and blotto (`validate_strategy` accepts an empty
# allocation, which ties every battlefield: Score 0.0 against a baseline of -0.248).
@pytest.mark.parametrize(("task_id", "gameable", "probe"), [
    ("regressionKaggleHousePrice", False, None),
    ("prisonersDilemma", False, None),
    ("battleOfSexes", False, None),
    ("titanic", True, "repeat_id_class_0"),
    ("blotto", True, "empty"),
])
def test_mlgym_evaluators_under_the_probes(task_id: str, gameable: bool, probe: str | None, tmp_path: Path) -> None:
    from gymforge.tools.check_task import check_task

    root = Path(str(MLGYM_ROOT))
    report = check_task(root / "configs" / "tasks" / f"{task_id}.yaml", root, tmp_path, gpus=0, coherence="rules")
    assert report.gameable == gameable, [(p.name, p.score, p.rejected) for p in report.probes]
    # titanic's text says "the accuracy percentage" where its evaluator prints a fraction; the others say nothing
    # their evaluators contradict (docs/integrity.md#tasks-that-say-what-they-score-the-coherence-check)
    assert report.coherence.coherent == (task_id != "titanic"), report.coherence.findings
    if gameable:
        assert probe in [p.name for p in report.gameable_probes]
    else:
        assert any(p.rejected and p.applicable for p in report.probes)
