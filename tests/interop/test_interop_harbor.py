"""Harbor task folders out and in (gymforge.interop.harbor; docs/interop.md): an exported task validates with
Harbor's own task models, its solution scores the baseline through the exported verifier in gymforge's sandbox,
doing nothing scores the floor, no answer reaches the agent's files, and folders written to Harbor's spec run."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

from gymforge.core.config import GymforgeConfig
from gymforge.interop.harbor import (SCHEMA_VERSION, HarborExportError, HarborTask, export_results, export_task,
                                     run_harbor_task, sandbox_for_task)
from gymforge.sandbox import get_sandbox
from gymforge.tasks.environment import TaskEnvironment

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "mlgym"
CSV_YAML = ROOT / "configs" / "tasks" / "csvTiny.yaml"
HARBOR = "0.25.0"


@pytest.fixture(scope="module")
def sandbox():
    return get_sandbox("local")


@pytest.fixture(scope="module")
def baseline(sandbox, tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    env = TaskEnvironment(CSV_YAML, sandbox=sandbox, run_dir=tmp_path_factory.mktemp("base"), gpus=0)
    env.install()
    return env.run_baseline().metrics


@pytest.fixture(scope="module")
def exported(sandbox, baseline, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("harbor") / "csvTiny"
    made = export_task(CSV_YAML, out, sandbox=sandbox, baseline=baseline, metric="rmse", higher_is_better=False)
    assert made.written and made.task_id == "csvTiny"
    return out


@pytest.fixture(scope="session")
def harbor_models(tmp_path_factory: pytest.TempPathFactory) -> types.SimpleNamespace:
    """Harbor 0.25.0's task models, loaded from its wheel on PyPI. Its package needs Python 3.12 to install, but
    `harbor/models/task/config.py` and `paths.py` parse on 3.11: the wheel is unpacked, `harbor` is registered as a
    bare package (its `__init__` imports the CLI's dependencies), and `toml` (used only to write TOML) is stubbed
    when absent."""
    where = tmp_path_factory.mktemp("harbor-wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", f"harbor=={HARBOR}", "--no-deps",
                           "--python-version", "3.12", "--only-binary=:all:", "-d", str(where), "-q"],
                          capture_output=True, text=True, timeout=300)
    wheels = list(where.glob("harbor-*.whl"))
    if proc.returncode != 0 or not wheels:
        pytest.skip(f"harbor {HARBOR} could not be downloaded from PyPI: {proc.stderr[-300:]}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(where / "src")
    sys.modules.setdefault("toml", types.ModuleType("toml"))
    package = types.ModuleType("harbor")
    package.__path__ = [str(where / "src" / "harbor")]
    sys.modules["harbor"] = package
    from harbor.models.task.config import TaskConfig
    from harbor.models.task.paths import TaskPaths

    return types.SimpleNamespace(TaskConfig=TaskConfig, TaskPaths=TaskPaths)


def unknown_keys(model: type, data: dict, where: str = "") -> list[str]:
    """Keys of `data` that are no field of the pydantic `model` (Harbor's models ignore unknown keys silently)."""
    found = []
    for key, value in data.items():
        info = model.model_fields.get(key)
        if info is None:
            found.append(f"{where}{key}")
            continue
        inner = info.annotation
        for candidate in getattr(inner, "__args__", (inner,)):
            if isinstance(value, dict) and isinstance(candidate, type) and hasattr(candidate, "model_fields"):
                found += unknown_keys(candidate, value, f"{where}{key}.")
    return found


def test_exported_folder_validates_with_harbors_task_models(exported: Path, harbor_models) -> None:
    import tomllib

    text = (exported / "task.toml").read_text()
    config = harbor_models.TaskConfig.model_validate_toml(text)
    assert not unknown_keys(harbor_models.TaskConfig, tomllib.loads(text))
    assert config.schema_version == SCHEMA_VERSION and config.environment.gpus == 0
    assert config.verifier.environment_mode.value == "separate" and config.environment.workdir == "/app"
    assert config.environment.network_mode.value == "no-network"
    paths = harbor_models.TaskPaths(exported)
    assert paths.discovered_test_path == exported / "tests" / "test.sh"
    assert paths.discovered_solve_path == exported / "solution" / "solve.sh"
    assert (paths.environment_dir / "Dockerfile").is_file() and paths.instruction_path.is_file()


def test_solution_scores_the_baseline_and_nothing_scores_the_floor(exported: Path, baseline, sandbox,
                                                                   tmp_path: Path) -> None:
    solved = run_harbor_task(exported, tmp_path / "solve", sandbox=sandbox)
    assert solved.agent is not None and solved.agent.exit_code == 0, solved.agent
    assert solved.rewards is not None and abs(solved.rewards["rmse"] - baseline["rmse"]) < 1e-6
    assert solved.rewards["reward"] == 0.5 and solved.rewards["baseline"] == baseline["rmse"]
    nothing = run_harbor_task(exported, tmp_path / "nop", sandbox=sandbox, solution=False)
    assert nothing.rewards == {"reward": 0.0, "valid": 0.0}
    # a better submission than the baseline's is worth more (the exact labels: rmse 0, reward 1)
    labels = (exported / "tests" / "answers" / "test_labels.csv").read_text()
    perfect = run_harbor_task(exported, tmp_path / "perfect", sandbox=sandbox, solution=False,
                              agent_command=f"printf '%s' {shlex.quote(labels)} > submission.csv")
    assert perfect.rewards["rmse"] == 0.0 and perfect.rewards["reward"] == 1.0


def test_no_hidden_answer_reaches_the_agents_image(exported: Path) -> None:
    labels = (exported / "tests" / "answers" / "test_labels.csv").read_text().splitlines()[1:]
    agent_files = [p for p in (exported / "environment").rglob("*") if p.is_file()]
    assert agent_files and not any(p.name == "test_labels.csv" for p in agent_files)
    for path in agent_files:
        text = path.read_text(errors="replace")
        assert not any(row in text for row in labels), f"a held-out label row is in {path}"
    instruction = (exported / "instruction.md").read_text()
    assert "Predict y from x" in instruction and not any(row in instruction for row in labels)


def test_export_is_incremental_and_the_base_image_configurable(exported: Path, sandbox, baseline) -> None:
    before = {p: p.stat().st_mtime_ns for p in exported.rglob("*")}
    again = export_task(CSV_YAML, exported, sandbox=sandbox, baseline=baseline, metric="rmse", higher_is_better=False)
    assert not again.written and {p: p.stat().st_mtime_ns for p in exported.rglob("*")} == before
    other = export_task(CSV_YAML, exported.parent / "local-image", sandbox=sandbox, baseline=baseline,
                        metric="rmse", higher_is_better=False, base_image="gymforge-sandbox:latest")
    assert (other.path / "environment" / "Dockerfile").read_text().startswith("FROM gymforge-sandbox:latest\n")
    assert (other.path / "tests" / "Dockerfile").read_text().startswith("FROM gymforge-sandbox:latest\n")


def test_tasks_whose_evaluation_runs_agent_code_are_refused(sandbox) -> None:
    with pytest.raises(HarborExportError, match="ModelSubmissionTasks task cannot be exported"):
        export_task(ROOT / "configs" / "tasks" / "modelTiny.yaml", Path("/nonexistent/x"), sandbox=sandbox)


def test_export_results_writes_every_verified_task_and_reports_the_refused(tmp_path: Path, sandbox, baseline) -> None:
    import shutil

    from gymforge.core.records import VerificationReport

    results = tmp_path / "results"
    for slot, task_id in (("t0000", "csvTiny"), ("t0001", "modelTiny")):
        tree = results / "environments" / slot / "verified" / "mlgym"
        shutil.copytree(ROOT, tree)
        for other in (tree / "configs" / "tasks").glob("*.yaml"):
            if other.stem != task_id:
                other.unlink()
        scores = [baseline] if task_id == "csvTiny" else [{"mse": 0.5}]
        (results / "environments" / slot / "report.json").write_text(VerificationReport(
            item=slot, status="ok", task_id=task_id, baseline_scores=scores).model_dump_json())
    done, refused = export_results(results, tmp_path / "out", sandbox=sandbox)
    assert [(e.task_id, e.written) for e in done] == [("csvTiny", True)] and list(refused) == ["t0001"]
    meta = json.loads((tmp_path / "out" / "csvTiny" / "tests" / "meta.json").read_text())
    assert (meta["metric"], meta["higher_is_better"], meta["baseline"]) == ("rmse", False, baseline["rmse"])
    again, _ = export_results(results, tmp_path / "out", sandbox=sandbox)
    assert [e.written for e in again] == [False]  # a rerun rewrites nothing
    # the CLI verb: the same folders, and what it left out with the reason
    proc = subprocess.run([sys.executable, "-m", "gymforge", "export-harbor", str(tmp_path / "cli"), "--results",
                           str(results)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "csvTiny" in proc.stdout and "written" in proc.stdout and "t0001" in proc.stdout
    assert (tmp_path / "cli" / "csvTiny" / "tests" / "meta.json").read_bytes() == \
        (tmp_path / "out" / "csvTiny" / "tests" / "meta.json").read_bytes()
    proc = subprocess.run([sys.executable, "-m", "gymforge", "harbor-run", str(tmp_path / "cli" / "csvTiny"),
                           "--work", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and json.loads(proc.stdout)["rewards"]["rmse"] == pytest.approx(baseline["rmse"])


# -- in: folders written to Harbor's documented spec ----------------------------------------------------------

def write_task(folder: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel.endswith(".sh"):
            path.chmod(0o755)
    return folder


HELLO = {
    "task.toml": 'schema_version = "1.4"\n\n[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 60.0\n\n'
                 '[environment]\ncpus = 1\nmemory_mb = 1024\n',
    "instruction.md": "Write `Hello, world!` to /app/hello.txt.\n",
    "environment/Dockerfile": "FROM ubuntu:24.04\nWORKDIR /app\n",
    "solution/solve.sh": "#!/bin/bash\necho 'Hello, world!' > /app/hello.txt\n",
    "tests/test.sh": "#!/bin/bash\nif [ \"$(cat /app/hello.txt 2>/dev/null)\" = 'Hello, world!' ]; then\n"
                     "  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n",
}

ML = {
    "task.toml": 'schema_version = "1.4"\nartifacts = ["/app/predictions.csv"]\n\n[verifier]\ntimeout_sec = 120.0\n'
                 'environment_mode = "separate"\n\n[agent]\ntimeout_sec = 300.0\n\n[environment]\ncpus = 1\n'
                 'memory_mb = 2048\ngpus = 1\n',
    "instruction.md": "Predict the label of each row of /app/data/test.csv into /app/predictions.csv (column label).\n",
    "environment/Dockerfile": "FROM python:3.11-slim\nRUN pip install scikit-learn\nWORKDIR /app\nCOPY data/ /app/data/\n",
    "environment/data/train.csv": "x,label\n" + "".join(f"{i},{int(i >= 10)}\n" for i in range(20)),
    "environment/data/test.csv": "x\n" + "".join(f"{i}\n" for i in (1, 4, 12, 18)),
    "solution/solve.sh": "#!/bin/bash\ncd /app\npython3 - <<'EOF'\nimport csv\n"
                         "rows = list(csv.DictReader(open('data/test.csv')))\n"
                         "with open('predictions.csv', 'w') as f:\n    f.write('label\\n')\n"
                         "    for r in rows:\n        f.write(f\"{int(int(r['x']) >= 10)}\\n\")\nEOF\n",
    "tests/test.sh": "#!/bin/bash\npython3 /tests/score.py\n",
    "tests/score.py": "import csv, json\ntruth = [0, 0, 1, 1]\ntry:\n"
                      "    got = [int(r['label']) for r in csv.DictReader(open('/app/predictions.csv'))]\n"
                      "except OSError:\n    got = []\n"
                      "acc = sum(a == b for a, b in zip(got, truth)) / len(truth)\n"
                      "json.dump({'reward': acc, 'accuracy': acc}, open('/logs/verifier/reward.json', 'w'))\n",
}


def test_a_hello_world_harbor_task_runs_in_gymforges_sandbox(tmp_path: Path, sandbox, harbor_models) -> None:
    folder = write_task(tmp_path / "hello-world", HELLO)
    harbor_models.TaskConfig.model_validate_toml((folder / "task.toml").read_text())  # a folder Harbor reads
    assert run_harbor_task(folder, tmp_path / "run", sandbox=sandbox).rewards == {"reward": 1.0}
    assert run_harbor_task(folder, tmp_path / "nop", sandbox=sandbox, solution=False).rewards == {"reward": 0.0}


def test_a_small_ml_harbor_task_with_a_separate_verifier_and_a_gpu(tmp_path: Path, sandbox, harbor_models) -> None:
    folder = write_task(tmp_path / "tiny-ml", ML)
    assert harbor_models.TaskConfig.model_validate_toml((folder / "task.toml").read_text()).environment.gpus == 1
    task = HarborTask.read(folder)
    assert (task.workdir, task.gpus, task.separate_verifier) == ("/app", 1, True)
    assert task.copies == [("data/", "/app/data/")] and task.ignored == ["RUN pip install scikit-learn"]
    cfg = GymforgeConfig()
    assert sandbox_for_task(cfg, task).gpus  # the backend gets the GPUs the task declares (Harbor's docker refuses)
    run = run_harbor_task(folder, tmp_path / "run", sandbox=sandbox)
    assert run.rewards == {"reward": 1.0, "accuracy": 1.0}
    assert run.ignored == ["RUN pip install scikit-learn"]  # said, never silently dropped
    assert run_harbor_task(folder, tmp_path / "nop", sandbox=sandbox, solution=False).rewards["reward"] == 0.0


# -- Harbor's contract with docker: images built from the exported folder --------------------------------------

@pytest.fixture(scope="module")
def docker_host() -> str:
    pytest.importorskip("docker", reason="the docker SDK is not installed")
    script = Path(__file__).resolve().parents[2] / "scripts" / "docker_sandbox.sh"
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        pytest.skip(f"no docker daemon: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    return r.stdout.strip().splitlines()[-1].removeprefix("DOCKER_HOST=")


@pytest.mark.slow
def test_docker_round_trip_of_an_exported_task(docker_host: str, sandbox, baseline, tmp_path: Path) -> None:
    """environment/ built with the project's daemon (FROM the locally built sandbox image), solve.sh run in it as the
    agent, /app carried to a fresh container of tests/'s image, test.sh run there: the metric is gymforge's baseline
    score to 1e-6, doing nothing gives the floor, and the agent's image holds no held-out label."""
    import docker

    from gymforge.interop.harbor import agent_image_tag, docker_trial

    made = export_task(CSV_YAML, tmp_path / "csvTiny", sandbox=sandbox, baseline=baseline, metric="rmse",
                       higher_is_better=False, base_image="gymforge-sandbox:latest")
    solved = docker_trial(made.path, base_url=docker_host)
    assert solved.agent is not None and solved.agent.exit_code == 0, solved.agent
    assert abs(solved.rewards["rmse"] - baseline["rmse"]) < 1e-6 and solved.rewards["reward"] == 0.5
    assert docker_trial(made.path, base_url=docker_host, solution=False).rewards == {"reward": 0.0, "valid": 0.0}
    client = docker.DockerClient(base_url=docker_host)
    image = client.images.get(agent_image_tag(made.path))  # the image just built from environment/
    labels = (made.path / "tests" / "answers" / "test_labels.csv").read_text().splitlines()[1:]
    script = ("find / -xdev -name test_labels.csv -o -xdev -name answers.csv 2>/dev/null; ls -d /tests 2>/dev/null; "
              "grep -rIl -e '" + "' -e '".join(labels) + "' /app; true")
    found = client.containers.run(image.id, ["bash", "-c", script], network_mode="none", remove=True)
    assert found.decode().strip() == "", f"held-out answers in the agent's image: {found.decode()[:500]}"


# -- a Harbor task in gymforge's agent loop (`gymforge run-task FOLDER`) ------------------------------------------

def test_the_agent_loop_runs_a_harbor_folder_and_its_verifier_scores_it(tmp_path: Path, sandbox) -> None:
    from gymforge.agent.trajectory import read_trajectory
    from gymforge.interop.harbor import run_harbor_episode
    from gymforge.tools.run_task import ScriptedModel

    folder = write_task(tmp_path / "hello-world", HELLO)
    replies = ["DISCUSSION\ncheck first\n\n```\nvalidate\n```\n",
               "DISCUSSION\nmake it\n\n```\ncreate hello.txt\n```\n",
               "DISCUSSION\nfill it\n\n```\nedit 1:1\nHello, world!\nend_of_edit\n```\n",
               "DISCUSSION\nthe verifier's score\n\n```\nvalidate\n```\n",
               "DISCUSSION\ndone\n\n```\nsubmit\n```\n"]
    traj = read_trajectory(run_harbor_episode(folder, tmp_path / "out", ScriptedModel(replies, "scripted"),
                                              sandbox=sandbox))
    assert traj.info.exit_status == "submitted" and traj.info.score == [{"reward": 0.0}, {"reward": 1.0},
                                                                         {"reward": 1.0}]
    assert traj.trajectory[0].observation.startswith("Your code produced a valid submission artefact")
    # the host-side file commands reached /app: the verifier read what `edit` wrote
    assert "Hello, world!" in traj.trajectory[2].observation


def test_run_task_on_an_exported_folder_scores_the_baseline(exported: Path, baseline, tmp_path: Path) -> None:
    """export -> import into gymforge's agent loop (`run-task FOLDER`, Harbor's oracle policy) -> the same score."""
    proc = subprocess.run([sys.executable, "-m", "gymforge", "run-task", str(exported), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads((tmp_path / "o" / "csvTiny.traj").read_text())["info"]
    assert info["exit_status"] == "submitted" and abs(info["score"][-1]["rmse"] - baseline["rmse"]) < 1e-6
    assert info["score"][-1]["reward"] == 0.5 and not info["flags"]


def test_the_harbor_task_step_under_its_rules_view(tmp_path: Path, sandbox, baseline, rule_reads) -> None:
    """Rule harbor_task (target `harbor`) runs `gymforge harbor-task` per slot: its step reads only the config
    sections the rule declares; a verified slot becomes a task folder FROM sandbox.image, any other slot a
    not_exported.json with the reason."""
    import shutil

    from gymforge.core.configview import restrict
    from gymforge.core.records import VerificationReport
    from gymforge.interop.harbor import harbor_task

    results = tmp_path / "results"
    tree = results / "environments" / "t0000" / "verified" / "mlgym"
    shutil.copytree(ROOT, tree)
    for other in (tree / "configs" / "tasks").glob("*.yaml"):
        if other.stem != "csvTiny":
            other.unlink()
    (results / "environments" / "t0000" / "report.json").write_text(VerificationReport(
        item="t0000", status="ok", task_id="csvTiny", baseline_scores=[baseline], metric="rmse",
        higher_is_better=False).model_dump_json())
    (results / "environments" / "t0001").mkdir(parents=True)
    (results / "environments" / "t0001" / "report.json").write_text(VerificationReport(
        item="t0001", status="discarded").model_dump_json())
    view = restrict(GymforgeConfig(results_dir=str(results)), rule_reads["harbor_task"]["reads"], step="harbor_task")
    env = results / "environments"
    said = harbor_task(view, "t0000", env / "t0000" / "report.json", env / "t0000" / "verified",
                       results / "proposals" / "t0000.json", results / "harbor" / "t0000")
    assert said == "t0000: csvTiny written"
    assert (results / "harbor" / "t0000" / "environment" / "Dockerfile").read_text().startswith(
        f"FROM {GymforgeConfig().sandbox.image}\n")
    said = harbor_task(view, "t0001", env / "t0001" / "report.json", env / "t0001" / "verified",
                       results / "proposals" / "t0001.json", results / "harbor" / "t0001")
    assert "not verified (discarded)" in said
    assert json.loads((results / "harbor" / "t0001" / "not_exported.json").read_text())["slot"] == "t0001"
    rules = (Path(__file__).resolve().parents[2] / "rules" / "interop.smk").read_text()
    assert "rule harbor_task:" in rules and "rule harbor:" in rules and '"harbor-task"' in rules


# -- `gymforge check-task FOLDER`: the checks Harbor's contract allows ------------------------------------------

def test_check_task_passes_the_hello_world_and_small_ml_folders(tmp_path: Path, sandbox, harbor_models) -> None:
    """Both folders validate (with Harbor's own TaskConfig: the fixture made `harbor` importable), their solutions
    score above doing nothing, their verifiers give the same rewards twice, and no answer is in environment/."""
    from gymforge.tasks.harbor import check_harbor_task

    for name, files in (("hello-world", HELLO), ("tiny-ml", ML)):
        report = check_harbor_task(write_task(tmp_path / name, files), tmp_path / f"check-{name}", sandbox=sandbox)
        audit = report.harbor
        assert audit.validator == "harbor TaskConfig" and not audit.failures, audit
        assert audit.solution["reward"] == 1.0 and audit.nothing["reward"] == 0.0 and audit.deterministic
        assert (report.metric, report.baseline, report.gameable) == ("reward", 1.0, False)
    assert audit.not_carried_out == ["RUN pip install scikit-learn"]


BROKEN = {  # each: the ML folder with one fault, and the words check-task says about it
    "random-verifier": ({"tests/test.sh": "#!/bin/bash\npython3 /tests/score.py\npython3 -c \"import json, random; "
                                          "p = '/logs/verifier/reward.json'; r = json.load(open(p)); "
                                          "r['noise'] = random.random(); json.dump(r, open(p, 'w'))\"\n"},
                        "the verifier is not deterministic"),
    "answers-shipped": ({"environment/data/expected_predictions.csv": "label\n0\n0\n1\n1\n"},
                        "the solution's output /app/predictions.csv is in the agent's environment"),
    "always-one": ({"tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"},
                   "doing nothing scores reward = 1, as well as the solution"),
    "misspelt-key": ({"task.toml": ML["task.toml"].replace("gpus = 1", "gpu = 1")},
                     "task.toml: unknown key environment.gpu"),
}


@pytest.mark.parametrize("fault", sorted(BROKEN))
def test_check_task_finds_a_broken_harbor_folder(fault: str, tmp_path: Path, sandbox) -> None:
    from gymforge.tasks.harbor import check_harbor_task

    change, said = BROKEN[fault]
    report = check_harbor_task(write_task(tmp_path / fault, {**ML, **change}), tmp_path / "check", sandbox=sandbox)
    assert any(said in failure for failure in report.harbor.failures), report.harbor.failures
    assert len(report.harbor.failures) == 1, report.harbor.failures  # the fault, and nothing else


def test_check_task_on_an_exported_folder_and_its_exit_status(exported: Path, baseline, tmp_path: Path) -> None:
    """export -> `gymforge check-task FOLDER`: the baseline is gymforge's own to 1e-6, doing nothing is no better,
    no held-out label row is in environment/; a folder that ships its answers exits 1 and says why."""
    proc = subprocess.run([sys.executable, "-m", "gymforge", "check-task", str(exported), "--out",
                           str(tmp_path / "w"), "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["metric"], report["higher_is_better"]) == ("rmse", False)
    assert abs(report["baseline"] - baseline["rmse"]) < 1e-6 and not report["harbor"]["failures"]
    leaky = write_task(tmp_path / "leaky", {**ML, "environment/data/expected_predictions.csv": "label\n0\n0\n1\n1\n"})
    proc = subprocess.run([sys.executable, "-m", "gymforge", "check-task", str(leaky), "--out", str(tmp_path / "w2")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1 and "answer visible to the agent" in proc.stderr, proc.stdout + proc.stderr


def test_a_hand_run_gpu_task_takes_a_lease_like_a_job(tmp_path: Path, monkeypatch) -> None:
    """`run-task`, `check-task` and `harbor-run` on a folder declaring gpus = 1: on a (simulated) 2-GPU host the
    device is locked through gymforge.runtime.gpus and named in CUDA_VISIBLE_DEVICES while the task runs; inside a
    job that already holds devices (CUDA_VISIBLE_DEVICES set by `with-gpus`) those are used, no second lock; on a
    CPU-only machine it runs without, and says so."""
    from gymforge.interop.harbor import leased_sandbox
    from gymforge.runtime import gpus

    task = HarborTask.read(write_task(tmp_path / "tiny-ml", ML))
    cfg = GymforgeConfig()
    monkeypatch.setenv("GYMFORGE_GPU_LOCKS", str(tmp_path / "locks"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("GYMFORGE_GPUS", "2")
    with leased_sandbox(cfg, task) as sandbox:
        held = os.environ["CUDA_VISIBLE_DEVICES"]
        assert sandbox.gpus and held in ("0", "1")
        host = {"GYMFORGE_GPUS": "2", "GYMFORGE_GPU_LOCKS": str(tmp_path / "locks")}  # another process's view
        with pytest.raises(gpus.GpuTimeout):  # the device is locked: both cannot be had
            gpus.acquire(2, timeout_s=0.2, env=host)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ and gpus.acquire(2, timeout_s=0.2, env=host).release() is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # a with-gpus job's lease
    with leased_sandbox(cfg, task) as sandbox:
        assert sandbox.gpus and os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("GYMFORGE_GPUS", "0")
    said: list[str] = []
    with leased_sandbox(cfg, task, say=said.append) as sandbox:
        assert not sandbox.gpus and "CUDA_VISIBLE_DEVICES" not in os.environ
    assert said == ["tiny-ml: task.toml declares 1 GPU(s) and 0 are here: it runs with 0"]


# -- the benchmark: Harbor folders in evaluate.harbor, run by gymforge's agent and scored by their verifiers --------

def harbor_cfg(tmp_path: Path, folders: list[Path], tasks: list[str] | None = None) -> GymforgeConfig:
    return GymforgeConfig.model_validate({
        "results_dir": str(tmp_path / "results"), "cache_dir": str(tmp_path / "cache"),
        "evaluate": {"runs_per_task": 1, "max_steps": 8, "harbor": [str(f) for f in folders], "tasks": tasks,
                     "models": [{"name": "teacher", "source": "teacher"}]}})


def test_harbor_folders_join_the_benchmark(tmp_path: Path) -> None:
    from gymforge.benchmark.suite import BenchmarkError, load_benchmark, recorded_baseline

    hello, ml = write_task(tmp_path / "hello-world", HELLO), write_task(tmp_path / "tiny-ml", ML)
    tasks = load_benchmark(harbor_cfg(tmp_path, [hello, ml]).evaluate)
    assert [t.id for t in tasks][-2:] == ["hello-world", "tiny-ml"] and len(tasks) > 2  # beside the built-in suite
    by_id = {t.id: t for t in tasks}
    assert (by_id["tiny-ml"].gpus, by_id["hello-world"].gpus, by_id["tiny-ml"].benchmark) == (1, 0, "harbor")
    assert (by_id["tiny-ml"].metric, by_id["tiny-ml"].higher_is_better) == ("reward", True)
    assert recorded_baseline(by_id["tiny-ml"]) is None
    only = load_benchmark(harbor_cfg(tmp_path, [hello, ml], tasks=["tiny-ml"]).evaluate)  # only Harbor tasks named
    assert [t.id for t in only] == ["tiny-ml"]
    with pytest.raises(BenchmarkError, match="is not a Harbor task folder"):
        load_benchmark(harbor_cfg(tmp_path, [tmp_path]).evaluate)
    with pytest.raises(ValueError, match="may only use ASCII letters"):
        harbor_cfg(tmp_path, [tmp_path / "a task"])


def test_the_benchmark_runs_an_exported_folder_to_the_same_score(exported: Path, baseline, tmp_path: Path) -> None:
    """export -> evaluate.harbor -> eval-runs (the offline teacher as the agent, gymforge's sandbox) -> the score
    gymforge measured, to 1e-6; the benchmark's evaluator check is the folder's checks; the score table reads the
    metric and the baseline task.toml records."""
    from gymforge.core.records import CheckReport, EvalRecord
    from gymforge.stages.evaluation import check_benchmark_task, evaluate_task
    from gymforge.stages.scores import score_table

    hello = write_task(tmp_path / "hello-world", HELLO)
    cfg = harbor_cfg(tmp_path, [exported, hello], tasks=["csvTiny", "hello-world"])
    runs = cfg.results / "scores" / "runs" / "teacher"
    record = evaluate_task(cfg, "teacher", "csvTiny", [0], runs / "csvTiny.json")
    assert record.baseline == {"rmse": baseline["rmse"]}
    [run] = record.runs
    assert run.valid_submission and abs(run.scores[-1]["rmse"] - baseline["rmse"]) < 1e-6, run
    assert evaluate_task(cfg, "teacher", "hello-world", [0], runs / "hello-world.json").runs[0].scores
    checks = cfg.results / "scores" / "checks"
    checks.mkdir(parents=True)
    for task in ("csvTiny", "hello-world"):
        assert "every check passed" in check_benchmark_task(cfg, task, checks / f"{task}.json")
    report = CheckReport.model_validate_json((checks / "csvTiny.json").read_text())
    assert abs(report.baseline - baseline["rmse"]) < 1e-6 and not report.gameable
    score_table(cfg, [runs / "csvTiny.json", runs / "hello-world.json"], aup_out=tmp_path / "aup.csv",
                scores_out=tmp_path / "scores.json", replies_out=tmp_path / "r.json", violins_out=tmp_path / "v.png",
                bars_out=tmp_path / "b.png", profiles_out=tmp_path / "p.png",
                checks=[checks / "csvTiny.json", checks / "hello-world.json"])
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["benchmark_tasks"] == ["csvTiny", "hello-world"] and scores["evaluators"]["gameable"] == []
    assert EvalRecord.model_validate_json((runs / "csvTiny.json").read_text()).runs == [run]


def test_a_harbor_task_declaring_a_gpu_plans_its_jobs_with_it(tmp_path: Path) -> None:
    """`snakemake -n`: the eval_runs and check_benchmark_task jobs of a Harbor task whose task.toml declares gpus = 1
    declare gpu=1 (Snakemake's `gpu` resource, leased by `with-gpus`), a task declaring none gpu=0; the folder's
    files are the jobs' input."""
    from workflow_copy import copy_workflow

    hello, ml = write_task(tmp_path / "hello-world", HELLO), write_task(tmp_path / "tiny-ml", ML)
    workdir = copy_workflow(tmp_path / "wf", "rules")
    overrides = (f"evaluate={{harbor: [{hello}, {ml}], tasks: [hello-world, tiny-ml], "
                 "models: [{name: teacher, source: teacher}]}")
    targets = [f"results/scores/{kind}/{task}.json" for kind in ("runs/teacher", "checks")
               for task in ("hello-world", "tiny-ml")]
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "2", "--config", overrides,
                           "topics={n: 1, batch_size: 1}", "--", *targets],
                          cwd=workdir, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    planned = {}
    for block in proc.stdout.split("rule ")[1:]:
        rule = block.split(":", 1)[0]
        if rule in ("eval_runs", "check_benchmark_task"):
            task = re.search(r"task=([\w-]+)", block).group(1)
            planned[rule, task] = int(re.search(r"resources: .*\bgpu=(\d+)", block).group(1))
            assert str(tmp_path / task / "task.toml") in block  # the folder is an input
    assert planned == {("eval_runs", "hello-world"): 0, ("eval_runs", "tiny-ml"): 1,
                       ("check_benchmark_task", "hello-world"): 0, ("check_benchmark_task", "tiny-ml"): 1}


GPU_TASK = {**ML, "solution/solve.sh": ML["solution/solve.sh"] + "nvidia-smi -L > /app/gpus.txt\n",
            "task.toml": ML["task.toml"].replace('artifacts = ["/app/predictions.csv"]',
                                                 'artifacts = ["/app/predictions.csv", "/app/gpus.txt"]'),
            "tests/test.sh": "#!/bin/bash\npython3 /tests/score.py\ngrep -q GPU /app/gpus.txt || "
                             "echo '{\"reward\": 0}' > /logs/verifier/reward.json\n"}


def test_a_gpu_harbor_task_in_the_benchmark(tmp_path: Path, monkeypatch) -> None:
    """The benchmark's job for a Harbor task declaring gpus = 1: without a GPU it is refused with the reason and
    what to do; with the job's lease (one visible device) it runs in a sandbox given the GPUs. The task's own use of
    the GPU (its solution lists it with nvidia-smi, its verifier checks that) needs one: skipped without."""
    from gymforge.benchmark.suite import TaskUnavailable
    from gymforge.runtime.gpus import gpu_count
    from gymforge.stages import evaluation
    from gymforge.tasks import episode

    ml = write_task(tmp_path / "tiny-ml", GPU_TASK)
    cfg = harbor_cfg(tmp_path, [ml], tasks=["tiny-ml"])
    out = cfg.results / "scores" / "runs" / "teacher" / "tiny-ml.json"
    monkeypatch.setattr(evaluation, "visible_gpus", lambda: 0)
    with pytest.raises(TaskUnavailable, match=r"needs 1 GPU\(s\) \(its task.toml declares them\) and this job sees 0"):
        evaluation.evaluate_task(cfg, "teacher", "tiny-ml", [0], out)
    given = []
    real = episode.sandbox_for
    monkeypatch.setattr(episode, "sandbox_for", lambda c, n: given.append(n) or real(c, n))
    monkeypatch.setattr(evaluation, "visible_gpus", lambda: 1)  # the job's lease
    record = evaluation.evaluate_task(cfg, "teacher", "tiny-ml", [0], out)
    assert given == [1] and record.runs[0].scores  # its sandbox was given the GPU; the verifier scored the runs
    if gpu_count() == 0:
        pytest.skip("no GPU here: the task's solution lists the GPU it was given (nvidia-smi), which needs one")
    with_gpu = run_harbor_task(ml, tmp_path / "trial", sandbox=sandbox_for_task(GymforgeConfig(), HarborTask.read(ml)))
    assert with_gpu.rewards["reward"] == 1.0, with_gpu
