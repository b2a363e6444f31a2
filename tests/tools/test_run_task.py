"""`gymforge run-task`: one episode of an MLGym-format task with our runner, written as .traj and results.json."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from loopback import Answer, LoopbackServer, completion

from gymforge.agent import read_trajectory
from gymforge.core.config import EndpointConfig
from gymforge.llm.client import LLMClient
from gymforge.tasks.mlgym import load_task_config
from gymforge.tools.run_task import replay_replies, run_task
from gymforge.sandbox.local import LocalBackend

ROOT = Path(__file__).parents[1] / "fixtures" / "mlgym"
GAME = ROOT / "configs" / "tasks" / "stagHuntDuel.yaml"


def test_submit_baseline_reproduces_the_game_baseline(tmp_path: Path) -> None:
    before = GAME.read_bytes()
    traj_path = run_task(GAME, None, "submit-baseline", tmp_path / "out", gpus=0)
    assert traj_path == tmp_path / "out" / "stagHuntDuel.traj"
    traj = read_trajectory(traj_path)
    baseline = load_task_config(GAME).baseline_scores[0]
    assert traj.info.exit_status == "submitted"
    assert traj.info.score == [baseline]  # exactly, not approximately
    assert [s.action for s in traj.trajectory] == ["python strategy.py", "submit"]
    workspace = tmp_path / "out" / "episode" / "workspace"
    assert traj.info.submission == f"{LocalBackend().workdir(workspace)}/strategy.py"  # /workspace under bwrap
    assert traj.meta["policy"] == "submit-baseline" and traj.meta["sandbox"] == "local"
    assert [m["role"] for m in traj.history] == ["system", "user", "assistant", "user", "assistant"]
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == {"agent": [baseline], "baseline": baseline}
    assert GAME.read_bytes() == before
    assert not (tmp_path / "out" / "baseline").exists()  # the YAML's baseline_scores were used


def test_submit_baseline_without_baseline_paths_submits_the_starter_code(tmp_path: Path) -> None:
    # MLGym allows a task with recorded baseline_scores and no baseline script: its baseline is the starter code.
    root = tmp_path / "mlgym"
    shutil.copytree(ROOT, root)
    task = root / "configs" / "tasks" / "stagHuntDuel.yaml"
    task.write_text(task.read_text().replace("baseline_paths:\n- strategy.py\n", ""))
    assert not load_task_config(task).baseline_paths
    traj = read_trajectory(run_task(task, root, "submit-baseline", tmp_path / "out", gpus=0))
    assert [s.action for s in traj.trajectory] == ["submit"]
    assert traj.info.exit_status == "submitted"
    assert traj.info.score == load_task_config(task).baseline_scores


def test_teacher_policy_drives_the_given_llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMFORGE_TEST_KEY", "sk-test")
    replies = ["DISCUSSION\nAlways hunt the stag.\n\n```\necho 'def row_strategy(history):\n    return 0' > strategy.py\n```",
               "DISCUSSION\nCheck it.\n\n```\nvalidate\n```", "DISCUSSION\nDone.\n\n```\nsubmit\n```"]
    with LoopbackServer([Answer(200, {}, completion(r)) for r in replies]) as server:
        endpoint = EndpointConfig(provider="openai", base_url=server.url, model="loopback-model",
                                  api_key_env="GYMFORGE_TEST_KEY")
        llm = LLMClient(endpoint, stage="run-task", cache_dir=tmp_path / "cache", ledger_dir=tmp_path / "ledger",
                        budget_usd=1.0)
        traj = read_trajectory(run_task(GAME, ROOT, "teacher", tmp_path / "out", llm=llm, gpus=0, seed=3))
    assert traj.info.exit_status == "submitted"
    assert len(traj.info.score) == 2 and traj.info.score[0] == traj.info.score[1]
    assert traj.info.score[0]["Score"] > load_task_config(GAME).baseline_scores[0]["Score"]
    assert traj.meta["model"] == "loopback-model" and traj.meta["seed"] == 3
    assert "Baseline Score" in traj.trajectory[1].observation


def test_unknown_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="submit-baseline"):
        run_task(GAME, None, "random", tmp_path)


@pytest.mark.slow
def test_submit_baseline_on_a_generated_task(tmp_path: Path) -> None:
    try:
        from gymforge.llm.codeblocks import parse_files
        from gymforge.offline.hub import OfflineHub
        from gymforge.offline import families
        from gymforge.tasks.files import validate_code_files, validate_config_files, write_task_tree
    except ImportError as err:
        pytest.skip(f"the task families are not importable yet: {err}")

    hub = OfflineHub(tmp_path / "hub")
    dataset = hub.describe("sklearn/wine").model_dump()
    proposal = {"topic": "Wine cultivar classification from chemical analysis", "metric": "accuracy",
                "description": "Tell the wines apart.", "dataset": dataset}
    # The teacher's drafts carry deliberate bugs; take the first clean draft of each stage.
    attempt = next(a for a in range(1, 10) if families.config_bug(proposal, seed=0, attempt=a) is None)
    configs = parse_files(families.write_configs(proposal, seed=0, attempt=attempt))
    attempt = next(a for a in range(1, 10) if families.code_bug(configs, dataset, seed=1, attempt=a) is None)
    bundle = validate_config_files(configs)
    code = validate_code_files(bundle, parse_files(families.write_code(configs, dataset, seed=1, attempt=attempt)))
    tree = tmp_path / "tree"
    write_task_tree(tree, bundle, code)
    hub.materialize("sklearn/wine", tree / bundle.data_dir / "data")

    task_yaml = tree / bundle.task_path
    out = tmp_path / "out"
    traj = read_trajectory(run_task(task_yaml, None, "submit-baseline", out, gpus=0))
    measured = json.loads((out / "baseline.json").read_text())
    assert measured["baseline"]["exit_code"] == 0 and measured["evaluation"]["duration_s"] > 0
    assert traj.info.exit_status == "submitted"
    assert traj.info.score == [measured["metrics"]]
    assert json.loads((out / "results.json").read_text()) == {"agent": [measured["metrics"]], "baseline": measured["metrics"]}


# ---- --replay -------------------------------------------------------------------------------------------


def reply(command: str, thought: str = "DISCUSSION\nNext.") -> str:
    return f"{thought}\n\n```\n{command}\n```\n"


ATTACK = [
    reply("echo 'import sys' > json.py"),
    "no command block in this reply",  # rejected: a format re-ask, which a replay must send again
    reply("ln -s /etc/passwd x"),
    reply("cat /proc/1/environ | head -c 0"),
    reply("rm json.py"),  # the evaluation's outcome stays independent of how well it resists a shadow module
    reply("printf 'def row_strategy(history):\\n    return 0\\n' > strategy.py"),
    reply("validate"),
]


def test_replay_of_a_reply_list_flags_the_attack_then_autosubmits(tmp_path: Path) -> None:
    replies = tmp_path / "attack.json"
    replies.write_text(json.dumps(ATTACK))
    traj = read_trajectory(run_task(GAME, ROOT, out=tmp_path / "first", gpus=0, replay=replies))
    actions = [s.action for s in traj.trajectory]
    assert actions == ["echo 'import sys' > json.py", "ln -s /etc/passwd x", "cat /proc/1/environ | head -c 0",
                       "rm json.py", "printf 'def row_strategy(history):\\n    return 0\\n' > strategy.py", "validate", "exit_api"]
    assert [len(s.format_errors) for s in traj.trajectory] == [0, 1, 0, 0, 0, 0, 0]
    # The replies ran out: the model stopped answering, and the loop auto-submitted the artefact.
    assert traj.info.exit_status == "autosubmission (api)" and len(traj.info.score) == 2
    assert [(f.step, f.code) for f in traj.info.flags] == [
        (1, "shadow_module"), (1, "shadow_module"), (2, "symlink_outside"), (2, "symlink_outside"), (3, "proc_other")]
    assert traj.meta["policy"] == "replay" and traj.meta["replay"]["replies"] == len(ATTACK)
    assert traj.info.sandbox == "local"

    # Replaying the gymforge trajectory sends the same replies, the rejected one included: the same episode.
    again = read_trajectory(run_task(GAME, ROOT, out=tmp_path / "again", gpus=0, replay=tmp_path / "first" /
                                     "stagHuntDuel.traj"))
    assert [s.action for s in again.trajectory] == actions
    assert [s.format_errors for s in again.trajectory] == [s.format_errors for s in traj.trajectory]
    assert [s.observation for s in again.trajectory[:-2]] == [s.observation for s in traj.trajectory[:-2]]
    assert [(f.step, f.code, f.detail) for f in again.info.flags] == [
        (f.step, f.code, f.detail) for f in traj.info.flags]
    assert again.info.score == traj.info.score and again.info.exit_status == traj.info.exit_status


def test_replay_of_an_mlgym_trajectory_uses_its_responses(tmp_path: Path) -> None:
    # MLGym's layout: steps without our extras; forced exits (`exit_*`) never ran and are not replayed.
    steps = [{"action": a, "observation": "", "response": reply(a), "state": "{}", "thought": "", "execution_time": 0}
             for a in ["printf 'def row_strategy(history):\\n    return 0\\n' > strategy.py", "validate"]]
    steps.append({"action": "exit_cost", "observation": "", "response": reply("submit"), "state": "{}",
                  "thought": "Exit due to cost limit", "execution_time": 0})
    history = [{"role": "assistant", "content": s["response"], "agent": "primary_0"} for s in steps]
    path = tmp_path / "mlgym.traj"
    path.write_text(json.dumps({"environment": "mlgym_main", "trajectory": steps, "history": history,
                                "info": {"exit_status": "autosubmission (exit_cost)"}}))
    assert replay_replies(path) == [s["response"] for s in steps[:2]]
    traj = read_trajectory(run_task(GAME, ROOT, out=tmp_path / "out", gpus=0, replay=path, max_steps=5))
    assert [s.action for s in traj.trajectory] == [steps[0]["action"], "validate", "exit_api"]
    assert traj.info.score[0] == traj.info.score[1] and traj.info.flags == []

    # Without responses in the steps, the assistant turns of the history (what MLGym's run_replay.py reads).
    for s in steps:
        s["response"] = ""
    path.write_text(json.dumps({"trajectory": steps, "history": history}))
    assert replay_replies(path) == [m["content"] for m in history]


def test_replay_file_errors_before_any_install(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"no": "trajectory"}))
    with pytest.raises(ValueError, match="neither a JSON list"):
        run_task(GAME, ROOT, out=tmp_path / "out", gpus=0, replay=bad)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="needs a replay file"):
        run_task(GAME, ROOT, "replay", tmp_path / "out", gpus=0)


def test_cli_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gymforge.cli import main

    replies = tmp_path / "r.json"
    replies.write_text(json.dumps([reply("ln -s /etc/passwd x"), reply("submit")]))
    main(["run-task", str(GAME), "--root", str(ROOT), "--replay", str(replies), "--out", str(tmp_path / "out"),
          "--gpus", "0"])
    out = capsys.readouterr().out
    assert "stagHuntDuel.traj: submitted" in out
    assert "flagged at step 1: symlink_outside: command links 'x' -> '/etc/passwd'" in out


# ---- local data made by MLGym's helper scripts -------------------------------------------------------------

HELPER = """
import csv, os
rows = list(csv.DictReader(open("raw.csv")))
os.makedirs("../data", exist_ok=True)
with open("../data/train.csv", "w") as f:
    f.write("x,y\\n" + "".join(f"{r['x']},{r['y']}\\n" for r in rows[:12]))
with open("../data/test.csv", "w") as f:
    f.write("id,x\\n" + "".join(f"{r['id']},{r['x']}\\n" for r in rows[12:]))
with open("../data/answer.csv", "w") as f:
    f.write("id,y\\n" + "".join(f"{r['id']},{r['y']}\\n" for r in rows[12:]))
"""

SPLIT_EVALUATE = """
import argparse, csv, json, math, os
# MLGym's regressionKaggleHousePrice reads the answers from the task's data directory, as this does.
ANSWERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "answer.csv")
parser = argparse.ArgumentParser()
parser.add_argument("--submission_file", required=True)
args = parser.parse_args()
read = lambda path: {row["id"]: float(row["y"]) for row in csv.DictReader(open(path))}
answers, predictions = read(ANSWERS), read(args.submission_file)
print(json.dumps({"rmse": math.sqrt(sum((predictions[i] - y) ** 2 for i, y in answers.items()) / len(answers))}))
"""


def helper_task(root: Path, helper: str = HELPER) -> Path:
    """An MLGym-shaped tree whose task's data split is made by `data/splitHelper/_helpers/make.py`, as
    regressionKaggleHousePrice's is: the split is not in the tree. Returns the task YAML."""
    task = root / "data" / "splitHelper"
    (task / "_helpers").mkdir(parents=True)
    raw = [(i, i / 4, 2 * (i / 4) + 1 + (i % 3) / 10) for i in range(18)]
    (task / "_helpers" / "raw.csv").write_text("id,x,y\n" + "".join(f"{i},{x},{y}\n" for i, x, y in raw))
    (task / "_helpers" / "make.py").write_text(helper)
    (task / "baseline.py").write_text(
        "import csv\nys = [float(r['y']) for r in csv.DictReader(open('data/train.csv'))]\n"
        "with open('submission.csv', 'w') as out:\n    out.write('id,y\\n')\n"
        "    for r in csv.DictReader(open('data/test.csv')):\n        out.write(f\"{r['id']},{sum(ys) / len(ys)}\\n\")\n")
    (task / "evaluate.py").write_text(SPLIT_EVALUATE)
    mean = sum(y for _, _, y in raw[:12]) / 12
    rmse = math.sqrt(sum((mean - y) ** 2 for _, _, y in raw[12:]) / 6)
    (root / "configs" / "datasets").mkdir(parents=True)
    (root / "configs" / "datasets" / "splitHelperData.yaml").write_text(
        "name: splitHelperData\ndescription: train.csv (x, y) and test.csv (id, x)\n"
        "data_path: data/splitHelper/data\nis_local: true\n")
    (root / "configs" / "tasks").mkdir(parents=True)
    task_yaml = root / "configs" / "tasks" / "splitHelper.yaml"
    task_yaml.write_text(
        "id: splitHelper\nname: Split made by a helper\ndescription: |-\n  Predict y for data/test.csv.\n"
        "  {dataset_docs}\ndataset_configs:\n- datasets/splitHelperData.yaml\ntask_entrypoint: CSVSubmissionTasks\n"
        "training_timeout: 120\nstarter_code:\n- data/splitHelper/baseline.py\n- data/splitHelper/evaluate.py\n"
        f"baseline_paths:\n- baseline.py\nbaseline_scores:\n- rmse: {rmse!r}\nevaluation_paths:\n- evaluate.py\n"
        "evaluation_read_only: true\n")
    return task_yaml


def test_run_task_makes_helper_generated_data_as_the_benchmark_does(tmp_path: Path) -> None:
    # A new user's first command on a fresh checkout: nothing has prepared the split (no `snakemake scores`).
    root = tmp_path / "mlgym"
    task_yaml = helper_task(root)
    made = root / "data" / "splitHelper" / "data"
    assert not made.exists()
    traj = read_trajectory(run_task(task_yaml, root, "submit-baseline", tmp_path / "out", gpus=0))
    assert traj.info.exit_status == "submitted"
    assert traj.info.score == load_task_config(task_yaml).baseline_scores  # the recorded baseline, exactly
    assert sorted(p.name for p in made.iterdir()) == ["answer.csv", "test.csv", "train.csv"]  # made once, in the tree
    assert sorted(p.name for p in (tmp_path / "out" / "episode" / "workspace" / "data").iterdir()) == [
        "answer.csv", "test.csv", "train.csv"]


def test_the_benchmark_and_run_task_prepare_data_with_the_same_function(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from gymforge.tasks import prepare
    from gymforge.benchmark.suite import BenchmarkTask, require_runnable
    from gymforge.sandbox import Limits, get_sandbox
    from gymforge.tasks.episode import EpisodeRunner

    calls: list[tuple[str, list[str]]] = []
    real = prepare.prepare_task_data
    monkeypatch.setattr(prepare, "prepare_task_data",
                        lambda root, task_id, paths, **kw: calls.append((task_id, list(paths))) or real(
                            root, task_id, paths, **kw))
    root = tmp_path / "mlgym"
    task_yaml = helper_task(root)
    task = BenchmarkTask(id="splitHelper", name="s", task_yaml=task_yaml, root=root, entrypoint="CSVSubmissionTasks",
                         metric="rmse", higher_is_better=False, family="f", keywords=[], datasets=[],
                         local_data=["data/splitHelper/data"])
    require_runnable(task, tmp_path / "cache", 0, sandbox=get_sandbox("local"), limits=Limits())
    # What check-task does: an environment from the one episode runner, then install.
    runner = EpisodeRunner(get_sandbox("local"), Limits())
    runner.environment(task_yaml, root=root, run_dir=tmp_path / "check").install()
    assert calls == [("splitHelper", ["data/splitHelper/data"])] * 2


def test_a_failing_helper_stops_the_install_with_its_output(tmp_path: Path) -> None:
    from gymforge.tasks.environment import InstallError

    root = tmp_path / "mlgym"
    task_yaml = helper_task(root, "raise SystemExit('raw data is corrupt')\n")
    with pytest.raises(InstallError, match=r"(?s)could not be made with MLGym's helper: .*make.py failed in the "
                                           r"sandbox.*raw data is corrupt"):
        run_task(task_yaml, root, "submit-baseline", tmp_path / "out", gpus=0)
    assert not (root / "data" / "splitHelper" / "data").exists()


def test_cli_hidden_columns_keep_the_answers_from_the_agent_and_give_them_to_the_evaluation(tmp_path: Path) -> None:
    """`--hidden-columns` (what a results directory's rows carry, e.g. for the verifiers environment): the episode's
    workspace has the test split without the hidden column, and the evaluation reads it from the secrets."""
    import datasets
    from test_environment import pets_task

    from gymforge.cli import main

    task = pets_task(tmp_path / "root")
    out = tmp_path / "out"
    main(["run-task", str(task), "--out", str(out), "--gpus", "0",
          "--hidden-columns", json.dumps({"test": ["species"]})])
    agent_data = datasets.load_from_disk(str(out / "episode" / "workspace" / "data"))
    assert agent_data["test"].column_names == ["weight"] and agent_data["train"].column_names == ["weight", "species"]
    traj = read_trajectory(out / "pets.traj")
    assert traj.info.exit_status == "submitted" and traj.info.score == [{"accuracy": pytest.approx(1 / 3)}]
