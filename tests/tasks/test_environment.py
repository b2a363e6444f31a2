"""The MLGym-compatible execution environment: entrypoints, metric parsing, secrets, read-only files, verified copies."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from gymforge.agent import EvaluationFormatError, SubmissionNotFound
from gymforge.runtime.gpus import gpu_count
from gymforge.tasks.environment import (
    BaselineFailed,
    InstallError,
    TaskEnvironment,
    TaskUnsupported,
    default_root,
    parse_metrics,
)
from gymforge.tasks.mlgym import load_task_config
from gymforge.sandbox import SandboxBackend, get_sandbox

ROOT = Path(__file__).parents[1] / "fixtures" / "mlgym"
CSV_BASELINE = {"rmse": 4.530212576758954}
GAME_BASELINE = {"Score": 2.755}


@pytest.fixture(scope="module")
def backend() -> SandboxBackend:
    return get_sandbox("local")


def bwrap_only(backend: SandboxBackend) -> None:
    if getattr(backend, "confinement", None) != "bwrap":
        pytest.skip("needs bubblewrap: without it the local sandbox sees the host file system and enforces no read-only mount")


def make_env(backend: SandboxBackend, tmp_path: Path, task_id: str, root: Path = ROOT, **kwargs) -> TaskEnvironment:
    env = TaskEnvironment.from_id(root, task_id, sandbox=backend, run_dir=tmp_path / "run", gpus=0, **kwargs)
    env.install()
    return env


def python_task(tmp_path: Path, evaluate: str) -> Path:
    """An MLGym root with one PythonSubmissionTasks task whose evaluate.py is `evaluate`."""
    root = tmp_path / "root"
    (root / "configs" / "tasks").mkdir(parents=True)
    (root / "data" / "probe").mkdir(parents=True)
    (root / "configs" / "tasks" / "probe.yaml").write_text(textwrap.dedent("""\
        id: probe
        name: Probe
        description: Prints metrics.
        task_entrypoint: PythonSubmissionTasks
        training_timeout: 60
        starter_code: [data/probe/target.py, data/probe/evaluate.py]
        baseline_paths: [target.py]
        evaluation_paths: [evaluate.py]
        """))
    (root / "data" / "probe" / "target.py").write_text("VALUE = 1\n")
    (root / "data" / "probe" / "evaluate.py").write_text(textwrap.dedent(evaluate))
    return root


# -- entrypoints ----------------------------------------------------------------------------------


def test_csv_task_installs_like_mlgym_and_scores_its_baseline(backend: SandboxBackend, tmp_path: Path) -> None:
    env = make_env(backend, tmp_path, "csvTiny")
    ws = env.workspace
    # starter code by base name, the local dataset's contents as data/, the secret withheld
    assert sorted(p.name for p in ws.iterdir()) == ["baseline.py", "data", "evaluate.py"]
    assert sorted(p.name for p in (ws / "data").iterdir()) == ["test.csv", "train.csv"]
    assert (env.secrets_dir / "test_labels.csv").is_file()
    assert "CSVTINYDATA:\ntrain.csv has columns" in env.description
    with pytest.raises(SubmissionNotFound, match="submission.csv"):
        env.evaluate()
    report = env.run_baseline()
    assert report.metrics == CSV_BASELINE
    assert report.artefact == f"{env.workdir}/submission.csv"
    assert report.baseline.exit_code == 0 and report.evaluation.duration_s > 0
    assert env.evaluate() == (CSV_BASELINE, f"{env.workdir}/submission.csv")


def test_model_task_evaluates_the_first_yaml_outside_data(backend: SandboxBackend, tmp_path: Path) -> None:
    env = make_env(backend, tmp_path, "modelTiny")
    (env.workspace / "data").mkdir()
    (env.workspace / "data" / "settings.yaml").write_text("coefficients: [0]\n")
    with pytest.raises(SubmissionNotFound, match="yaml"):
        env.evaluate()
    report = env.run_baseline()  # its evaluation prints a line before the JSON
    assert report.metrics == {"mse": pytest.approx(2.0813)}
    assert report.artefact == f"{env.workdir}/model.yaml"
    (env.workspace / "runs").mkdir()
    (env.workspace / "runs" / "a.yaml").write_text("coefficients: [0]\n")
    assert env.evaluate()[1] == f"{env.workdir}/model.yaml"  # top level first


def test_python_task_scores_the_edited_module(backend: SandboxBackend, tmp_path: Path) -> None:
    env = make_env(backend, tmp_path, "stagHuntDuel")
    assert sorted(p.name for p in env.workspace.iterdir()) == ["evaluate.py", "strategy.py"]  # no opponent
    report = env.run_baseline()
    assert report.metrics == GAME_BASELINE == load_task_config(env.task_yaml).baseline_scores[0]
    assert report.artefact == f"{env.workdir}/strategy.py"
    (env.workspace / "strategy.py").write_text("def row_strategy(history):\n    return 0\n")
    assert env.evaluate()[0]["Score"] > GAME_BASELINE["Score"]


def test_gpus_default_to_the_hosts_count(backend: SandboxBackend, tmp_path: Path, monkeypatch) -> None:
    """An environment given no GPU count takes the one host counter's (gymforge.runtime.gpus), GYMFORGE_GPUS included."""
    monkeypatch.setenv("GYMFORGE_GPUS", "3")
    assert TaskEnvironment.from_id(ROOT, "lmTiny", sandbox=backend, run_dir=tmp_path / "run").gpus == 3
    assert TaskEnvironment.from_id(ROOT, "lmTiny", sandbox=backend, run_dir=tmp_path / "run", gpus=1).gpus == 1


def test_lm_task_is_refused_without_gpus_with_a_reason(backend: SandboxBackend, tmp_path: Path) -> None:
    if gpu_count():
        pytest.skip("this host has GPUs")
    env = TaskEnvironment.from_id(ROOT, "lmTiny", sandbox=backend, run_dir=tmp_path / "run")
    with pytest.raises(TaskUnsupported, match="LMSubmissionTasks.*no GPU"):
        env.install()
    with pytest.raises(TaskUnsupported):
        env.evaluate()


def test_lm_task_runs_under_torchrun_with_gpus(tmp_path: Path) -> None:
    gpus = gpu_count()
    if not gpus:
        pytest.skip("no GPU on this host")
    env = TaskEnvironment.from_id(ROOT, "lmTiny", sandbox=get_sandbox("local", gpus=True), run_dir=tmp_path / "run")
    env.install()
    report = env.run_baseline()
    assert report.metrics == {"val_loss": 4.25}
    assert json.loads((env.workspace / "model.json").read_text())["world_size"] == gpus


# -- metric parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize("output, metrics", [
    ('{"accuracy": 0.5, "n": 3}\n', {"accuracy": 0.5, "n": 3.0}),
    ('{\n  "accuracy": 0.5\n}\n', {"accuracy": 0.5}),
    ('loading the data\n{"accuracy": 0.5}\ndone\n', {"accuracy": 0.5}),
    ('epoch 1 {"not": "json"\n  {"rmse": 1.5}\n{"rmse": 1.5}\n', {"rmse": 1.5}),
    ('{"status": "starting"}\n{"rmse": 2}\n', {"rmse": 2.0}),
    ('UserWarning: x\n{\n  "a": 1,\n  "nested": [{"b": 2}]\n}\n', None),  # non-numeric value
])
def test_parse_metrics_reads_the_one_metrics_object(output: str, metrics: dict[str, float] | None) -> None:
    if metrics is None:
        with pytest.raises(EvaluationFormatError, match="non-numeric"):
            parse_metrics(output)
    else:
        assert parse_metrics(output) == metrics


@pytest.mark.parametrize("output, reason", [
    ('{"accuracy": 0.5}\n{"accuracy": 0.75}\n', "ambiguous"),
    ("accuracy: 0.5\n", "no JSON object"),
    ("", "no JSON object"),
    ('{"accuracy": "high"}', "non-numeric"),
    ('{"accuracy": true}', "non-numeric"),
    ('{"accuracy": NaN}', "non-numeric"),
    ("{}", "no metrics"),
    ("[0.5]", "list JSON"),
])
def test_parse_metrics_rejects_what_is_not_one_metrics_object(output: str, reason: str) -> None:
    with pytest.raises(EvaluationFormatError, match=reason):
        parse_metrics(output)


def test_evaluation_and_baseline_failures_in_the_sandbox(backend: SandboxBackend, tmp_path: Path) -> None:
    root = python_task(tmp_path, """\
        import json
        print("scoring the submission")
        print(json.dumps({"score": 0.25}))
        """)
    env = make_env(backend, tmp_path, "probe", root)
    assert env.evaluate() == ({"score": 0.25}, f"{env.workdir}/target.py")
    (env.workspace / "evaluate.py").write_text('print(\'{"score": 1.0}\')\n')  # the agent's copy is never run
    assert env.evaluate()[0] == {"score": 0.25}
    source = root / "data" / "probe" / "evaluate.py"  # the task's own script is
    source.write_text('import sys\nprint("half done", file=sys.stderr)\nsys.exit("scorer crashed: bad input")\n')
    with pytest.raises(EvaluationFormatError, match=r"(?s)SystemExit.*half done.*scorer crashed: bad input"):
        env.evaluate()
    source.write_text('print(\'{"score": 1}\')\nprint(\'{"score": 2}\')\n')
    with pytest.raises(EvaluationFormatError, match="ambiguous"):
        env.evaluate()
    (env.workspace / "target.py").write_text('raise SystemExit("baseline broke")\n')
    with pytest.raises(BaselineFailed, match="(?s)status 1.*baseline broke") as failed:
        env.run_baseline()
    assert failed.value.result.exit_code == 1


# -- what the agent cannot reach ------------------------------------------------------------------


def test_secrets_reach_the_evaluation_only(backend: SandboxBackend, tmp_path: Path) -> None:
    bwrap_only(backend)
    env = make_env(backend, tmp_path, "csvTiny")
    secret = env.secrets_dir / "test_labels.csv"
    with env.open_session() as session:
        r = session.run(f"cat {secret}; cat test_labels.csv; ls {env.secrets_dir}", 10)
        assert r.exit_code != 0 and "id,y" not in r.output and "No such file" in r.output
    assert env.run_baseline().metrics == CSV_BASELINE  # the evaluation reads the labels from GYMFORGE_SECRETS


def test_agent_code_run_by_the_evaluation_cannot_copy_secrets_out(backend: SandboxBackend, tmp_path: Path) -> None:
    bwrap_only(backend)
    env = make_env(backend, tmp_path, "stagHuntDuel")
    (env.workspace / "strategy.py").write_text(textwrap.dedent("""\
        import os, shutil, sys
        try:
            shutil.copy(os.path.join(os.environ["GYMFORGE_SECRETS"], "target.py"), "stolen.py")
        except OSError as err:
            print("copy refused:", err, file=sys.stderr)

        def row_strategy(history):
            return 0
        """))
    metrics, _ = env.evaluate()
    assert "Score" in metrics
    # An MLGym evaluator imports the agent's code (the residual risk of third-party tasks), but what it does
    # stays in the scorer's private snapshot, deleted with it.
    assert not (env.workspace / "stolen.py").exists() and not (env.run_dir / ".eval").exists()


def test_evaluation_script_and_data_are_read_only_for_the_agent(backend: SandboxBackend, tmp_path: Path) -> None:
    bwrap_only(backend)
    env = make_env(backend, tmp_path, "csvTiny")
    before = {p: p.read_bytes() for p in [env.workspace / "evaluate.py", env.workspace / "data" / "train.csv"]}
    attacks = ["echo 'print(1)' >> evaluate.py", "rm -f evaluate.py", "mv evaluate.py e.py", "rm data/train.csv",
               "echo x,y > data/train.csv", "touch data/extra.csv", "chmod u+w evaluate.py && echo >> evaluate.py"]
    with env.open_session() as session:
        for command in attacks:
            assert session.run(command, 10).exit_code != 0, command
        assert session.run("echo 'x' > notes.txt", 10).exit_code == 0  # the rest of the workspace is the agent's
    assert {p: p.read_bytes() for p in before} == before
    assert not (env.workspace / "data" / "extra.csv").exists()


def pets_task(root: Path) -> Path:
    """A CSV task under `root` (MLGym's layout) whose test split's `species` is the answer: the baseline predicts
    "cat" for every row (accuracy 1/3), the evaluation reads the answers from the secrets."""
    import datasets

    (root / "configs" / "tasks").mkdir(parents=True)
    (root / "configs" / "datasets").mkdir()
    (root / "data" / "pets").mkdir(parents=True)
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"weight": [4.0, 30.0, 5.0, 25.0], "species": ["cat", "dog", "cat", "dog"]}),
        "test": datasets.Dataset.from_dict({"weight": [3.5, 28.0, 6.0], "species": ["cat", "dog", "hidden-lynx"]}),
    }).save_to_disk(str(root / "data" / "pets" / "data"))
    (root / "configs" / "datasets" / "pets_data.yaml").write_text(
        "name: pets_data\ndescription: weights and species\ndata_path: data/pets/data\nis_local: true\n")
    (root / "configs" / "tasks" / "pets.yaml").write_text(textwrap.dedent("""\
        id: pets
        name: Pets
        description: "Predict species. {dataset_docs}"
        dataset_configs: [datasets/pets_data.yaml]
        training_timeout: 60
        starter_code: [data/pets/baseline.py, data/pets/evaluate.py]
        baseline_paths: [baseline.py]
        evaluation_paths: [evaluate.py]
        evaluation_read_only: true
        """))
    (root / "data" / "pets" / "baseline.py").write_text(textwrap.dedent("""\
        from datasets import load_from_disk
        test = load_from_disk("data")["test"]
        with open("submission.csv", "w") as f:
            f.write("id,species\\n" + "".join(f"{i},cat\\n" for i in range(len(test))))
        """))
    (root / "data" / "pets" / "evaluate.py").write_text(textwrap.dedent("""\
        import argparse, csv, json, os
        parser = argparse.ArgumentParser()
        parser.add_argument("--submission_file")
        args = parser.parse_args()
        with open(os.path.join(os.environ["GYMFORGE_SECRETS"], "answers.csv")) as f:
            answers = {r["id"]: r["species"] for r in csv.DictReader(f)}
        with open(args.submission_file) as f:
            predictions = {r["id"]: r["species"] for r in csv.DictReader(f)}
        print(json.dumps({"accuracy": sum(predictions[i] == a for i, a in answers.items()) / len(answers)}))
        """))
    return root / "configs" / "tasks" / "pets.yaml"


def test_hidden_columns_leave_the_agent_copy_and_reach_the_evaluation(backend: SandboxBackend, tmp_path: Path) -> None:
    import datasets

    root = tmp_path / "root"
    pets_task(root)
    source_before = sorted((p, p.read_bytes()) for p in (root / "data").rglob("*") if p.is_file())

    env = make_env(backend, tmp_path, "pets", root, hidden_columns={"test": ["species"]})
    agent_data = datasets.load_from_disk(str(env.workspace / "data"))
    assert agent_data["test"].column_names == ["weight"] and agent_data["test"]["weight"] == [3.5, 28.0, 6.0]
    assert agent_data["train"].column_names == ["weight", "species"]
    for p in (env.workspace / "data" / "test").rglob("*"):
        assert b"species" not in p.read_bytes() and b"hidden-lynx" not in p.read_bytes(), p
    assert (env.secrets_dir / "answers.csv").read_text() == "id,species\n0,cat\n1,dog\n2,hidden-lynx\n"
    assert env.run_baseline().metrics == {"accuracy": pytest.approx(1 / 3)}
    assert sorted((p, p.read_bytes()) for p in (root / "data").rglob("*") if p.is_file()) == source_before

    with pytest.raises(InstallError, match="no columns"):
        make_env(backend, tmp_path / "bad", "pets", root, hidden_columns={"test": ["colour"]})


# -- verified copy --------------------------------------------------------------------------------


def test_verified_copy_holds_the_baseline_scores_and_leaves_the_source_alone(backend: SandboxBackend, tmp_path: Path) -> None:
    source_yaml = ROOT / "configs" / "tasks" / "csvTiny.yaml"
    before = source_yaml.read_bytes()
    env = make_env(backend, tmp_path, "csvTiny")
    dest = env.write_verified_copy(tmp_path / "verified", [CSV_BASELINE])
    assert source_yaml.read_bytes() == before
    assert load_task_config(dest / "configs" / "tasks" / "csvTiny.yaml").baseline_scores == [CSV_BASELINE]
    assert (dest / "configs" / "datasets" / "csvTinyData.yaml").read_bytes() == (ROOT / "configs" / "datasets" / "csvTinyData.yaml").read_bytes()
    copied = sorted(str(p.relative_to(dest)) for p in (dest / "data").rglob("*") if p.is_file())
    assert copied == ["data/csvTiny/baseline.py", "data/csvTiny/data/test.csv", "data/csvTiny/data/train.csv",
                      "data/csvTiny/evaluate.py", "data/csvTiny/test_labels.csv"]
    assert not list(tmp_path.glob(".verified*"))  # no temporary left behind
    # The copy is a task of its own: it installs and scores the same.
    again = TaskEnvironment(dest / "configs" / "tasks" / "csvTiny.yaml", sandbox=backend, run_dir=tmp_path / "again", gpus=0)
    again.install()
    assert again.run_baseline().metrics == CSV_BASELINE
    with pytest.raises(ValueError, match="outside the source tree"):
        env.write_verified_copy(ROOT / "verified", [CSV_BASELINE])


def test_root_is_found_from_the_task_yaml(tmp_path: Path) -> None:
    assert default_root(ROOT / "configs" / "tasks" / "csvTiny.yaml") == ROOT.resolve()
    shutil.copy(ROOT / "configs" / "tasks" / "csvTiny.yaml", tmp_path / "csvTiny.yaml")
    with pytest.raises(InstallError, match="configs/tasks"):
        default_root(tmp_path / "csvTiny.yaml")
