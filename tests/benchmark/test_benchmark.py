"""The built-in benchmark suite (docs/scores.md), benchmark loading and decontamination against synthesized tasks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from gymforge import cli
from gymforge.agent import read_trajectory
from gymforge.benchmark import generate
from gymforge.benchmark.decontamination import (
    ContaminationError,
    DecontaminationReport,
    Extra,
    check,
    dropped_items,
    enforce,
    proposal_extra,
    words,
    write_report,
)
from gymforge.benchmark.decontamination import (
    run as run_check,
)
from gymforge.benchmark.suite import (
    BUILTIN,
    BenchmarkError,
    BenchmarkTask,
    TaskUnavailable,
    builtin_root,
    builtin_tasks,
    load_benchmark,
    mlgym_tasks,
    require_runnable,
    task_meta_file,
    unmet_needs,
)
from gymforge.core.config import ConfigError, EvaluateConfig, GymforgeConfig, validate_config
from gymforge.tasks.environment import TaskEnvironment
from gymforge.tasks.mlgym import (
    BENCHMARK_TASKS,
    load_dataset_config,
    load_task_config,
    render_description,
)
from gymforge.tools.run_task import run_task
from gymforge.sandbox import SandboxBackend, get_sandbox

TASKS = {t.id: t for t in builtin_tasks()}
IDS = list(TASKS)


@pytest.fixture(scope="module")
def backend() -> SandboxBackend:
    return get_sandbox("local")


def install(task: BenchmarkTask, backend: SandboxBackend, run_dir: Path) -> TaskEnvironment:
    env = TaskEnvironment(task.task_yaml, root=task.root, sandbox=backend, run_dir=run_dir, gpus=0)
    env.install()
    return env


def better(task: BenchmarkTask, metrics: dict[str, float], baseline: dict[str, float]) -> bool:
    mine, theirs = metrics[task.metric], baseline[task.metric]
    return mine > theirs if task.higher_is_better else mine < theirs


# ---- the suite ------------------------------------------------------------------------------------------


def test_the_suite_spans_entrypoints_directions_and_families() -> None:
    tasks = builtin_tasks()
    assert len(tasks) >= 5
    assert {t.entrypoint for t in tasks} >= {"CSVSubmissionTasks", "ModelSubmissionTasks", "PythonSubmissionTasks"}
    assert {t.higher_is_better for t in tasks} == {True, False}
    assert len({t.family for t in tasks}) == len(tasks)
    assert all(t.root == builtin_root() and t.benchmark == "builtin" and t.keywords and t.datasets for t in tasks)


# Built-in tasks scored MLGym's way (agent code importable in the scorer, beside the answers), each with its reason.
# Empty: every built-in evaluator is under the contract; an entry here must say why it cannot be.
NOT_ISOLATED: dict[str, str] = {}
SHIPPED_YAMLS = sorted((builtin_root() / "configs" / "tasks").glob("*.yaml"))


@pytest.mark.parametrize("yaml_path", SHIPPED_YAMLS, ids=[p.stem for p in SHIPPED_YAMLS])
def test_every_shipped_task_is_scored_under_the_evaluation_contract(yaml_path: Path, tmp_path: Path) -> None:
    """Every task YAML shipped with the built-in suites (post-training ones too) is scored as docs/integrity.md
    promises: a CSV task, or an evaluator that imports gymforge_eval (`Scoring.isolated`). Otherwise the scorer would
    import the agent's yaml.py or numpy/ beside /answers and take whatever metrics it prints
    (tests/sandbox/test_attacks.py::test_shadowed_imports[kde-local] counterfeited nll 0.0 that way)."""
    env = TaskEnvironment(yaml_path, root=builtin_root(), sandbox=get_sandbox("local"), run_dir=tmp_path / "run")
    assert env.task.id == yaml_path.stem
    assert env.isolated != (env.task.id in NOT_ISOLATED), (
        f"{env.task.id}: its evaluator does not import gymforge_eval, so the scorer runs agent code beside the answers"
        if not env.isolated else f"{env.task.id} is isolated now: remove it from NOT_ISOLATED")


@pytest.mark.parametrize("task_id", IDS)
def test_every_task_loads_with_the_mlgym_loader_and_documents_itself(task_id: str) -> None:
    task = TASKS[task_id]
    config = load_task_config(task.task_yaml)
    datasets = [load_dataset_config(task.root / "configs" / entry) for entry in config.dataset_configs]
    assert config.id == task_id and config.task_entrypoint == task.entrypoint
    assert list(config.baseline_scores[0]) == [task.metric]
    assert config.evaluation_read_only and config.secret_files, "held-out answers must be secret files"
    assert all(entry in config.starter_code for entry in config.secret_files)  # under MLGym too
    for rel in [*config.starter_code, *(d.data_path for d in datasets)]:
        assert (task.root / rel).exists(), rel
    text = " ".join(render_description(config, datasets).split())  # {dataset_docs} filled, braces undoubled
    direction = "higher is better" if task.higher_is_better else "lower is better"
    assert task.metric in text and direction in text
    artefact = {"CSVSubmissionTasks": "submission.csv", "ModelSubmissionTasks": "model.yaml"}.get(
        task.entrypoint, config.baseline_paths[0])
    assert artefact in text
    public = [Path(p).name for p in config.starter_code if p not in config.secret_files]
    assert all(name in text for name in public), public
    assert all(d.name.upper() in text for d in datasets)


def test_the_shipped_data_is_what_the_generator_writes() -> None:
    files = generate.generated_files()
    assert files and all((builtin_root() / rel).read_text() == text for rel, text in files.items())
    size = sum((builtin_root() / rel).stat().st_size for rel in files)
    assert size < 64_000, f"the suite's data is {size} bytes; keep it small"


def test_the_suite_uses_no_dataset_or_family_of_synthesis() -> None:
    from gymforge.benchmark.decontamination import dataset_key
    from gymforge.offline import catalog
    from gymforge.offline.vocabulary import VOCABULARY

    hub = {dataset_key(entry.id) for entry in catalog.CATALOG}
    assert not {dataset_key(d) for t in builtin_tasks() for d in t.datasets} & hub
    topics = [words(e.text) for e in VOCABULARY]
    for task in builtin_tasks():
        for keyword in task.keywords:
            phrase = " ".join(words(keyword))
            assert not any(f" {phrase} " in f" {' '.join(topic)} " for topic in topics), (task.id, keyword)


# ---- baselines, secrets, better solutions ---------------------------------------------------------------------


@pytest.mark.parametrize("task_id", IDS)
def test_the_baseline_reproduces_its_recorded_score_without_answers_in_the_workspace(
    task_id: str, backend: SandboxBackend, tmp_path: Path
) -> None:
    task = TASKS[task_id]
    t0 = time.monotonic()
    env = install(task, backend, tmp_path / "run")
    report = env.run_baseline()
    elapsed = time.monotonic() - t0
    assert report.metrics == env.task.baseline_scores[0]  # exactly, not approximately
    assert elapsed < 30, f"baseline and evaluation took {elapsed:.1f} s"

    secrets = [task.root / rel for rel in env.task.secret_files]
    workspace_files = [p for p in env.workspace.rglob("*") if p.is_file()]
    for secret in secrets:
        assert (env.secrets_dir / secret.name).read_bytes() == secret.read_bytes()
        assert secret.name not in {p.name for p in workspace_files}
        answers = secret.read_bytes()
        assert not any(answers in p.read_bytes() for p in workspace_files)
    if getattr(backend, "confinement", None) == "bwrap":  # only then is the host file system out of sight
        with env.open_session() as session:
            r = session.run(f"cat {env.secrets_dir}/*; ls {env.secrets_dir}", 10)
        assert r.exit_code != 0 and "No such file" in r.output
        assert not any(line and line in r.output for s in secrets for line in s.read_text().splitlines()[1:3])


def _gaussian_smoothing(values: list[float], sigma: float = 1.5) -> list[float]:
    import numpy as np

    radius = int(3 * sigma)
    kernel = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    padded = np.pad(np.array(values), radius, mode="edge")
    return list(np.convolve(padded, kernel / kernel.sum(), mode="valid"))


DSATUR = '''\
def color_graph(n, edges):
    """DSATUR: colour next the vertex whose neighbours already use the most distinct colours."""
    neighbours = [set() for _ in range(n)]
    for u, v in edges:
        neighbours[u].add(v)
        neighbours[v].add(u)
    colors = [-1] * n
    for _ in range(n):
        vertex = max((v for v in range(n) if colors[v] < 0),
                     key=lambda v: (len({colors[u] for u in neighbours[v] if colors[u] >= 0}), len(neighbours[v])))
        taken = {colors[u] for u in neighbours[vertex]}
        colors[vertex] = next(c for c in range(n) if c not in taken)
    return colors
'''

SHORTEST_PATH = '''\
from collections import deque

MOVES = {"N": (-1, 0), "S": (1, 0), "E": (0, 1), "W": (0, -1)}


def act(grid, position, goal):
    """Step to the neighbour with the shortest walking distance to the goal (breadth-first search)."""
    distance = {goal: 0}
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            cell = (r + dr, c + dc)
            if 0 <= cell[0] < len(grid) and 0 <= cell[1] < len(grid[0]) and grid[cell[0]][cell[1]] != "#" \\
                    and cell not in distance:
                distance[cell] = distance[(r, c)] + 1
                queue.append(cell)
    return min(MOVES, key=lambda m: distance.get((position[0] + MOVES[m][0], position[1] + MOVES[m][1]), 10**9))
'''


def write_better_solution(task_id: str, ws: Path) -> None:
    """What a competent agent would do on each task, written into the workspace."""
    import pandas as pd

    if task_id == "blobClustering":
        from sklearn.mixture import GaussianMixture

        points = pd.read_csv(ws / "data" / "points.csv")
        labels = GaussianMixture(5, n_init=5, random_state=0).fit_predict(points[["x", "y"]].to_numpy())
        pd.DataFrame({"id": points["id"], "cluster": labels}).to_csv(ws / "submission.csv", index=False)
    elif task_id == "signalDenoising":
        noisy = pd.read_csv(ws / "data" / "noisy.csv")
        values = [c for c in noisy.columns if c != "signal"]
        smooth = noisy.copy()
        smooth[values] = [_gaussian_smoothing(list(row)) for row in noisy[values].to_numpy()]
        smooth.to_csv(ws / "submission.csv", index=False)
    elif task_id == "kernelDensityBandwidth":
        (ws / "model.yaml").write_text("kernel: gaussian\nbandwidth: 0.3\nadaptive: 0.5\n")
    elif task_id == "graphColoring":
        (ws / "coloring.py").write_text(DSATUR)
    elif task_id == "gridNavigation":
        (ws / "policy.py").write_text(SHORTEST_PATH)
    else:
        raise AssertionError(f"no better solution written for {task_id}")


@pytest.mark.parametrize("task_id", IDS)
def test_a_better_solution_beats_the_baseline_clearly(task_id: str, backend: SandboxBackend, tmp_path: Path) -> None:
    task = TASKS[task_id]
    env = install(task, backend, tmp_path / "run")
    baseline = env.run_baseline().metrics
    write_better_solution(task_id, env.workspace)
    metrics, _ = env.evaluate()
    assert better(task, metrics, baseline), (metrics, baseline)
    gain = abs(metrics[task.metric] - baseline[task.metric]) / abs(baseline[task.metric])
    assert gain > 0.1, f"{task_id}: {metrics} is only {gain:.1%} better than the baseline {baseline}"
    assert metrics[task.metric] >= 0  # AUP treats negative scores as infeasible


@pytest.mark.parametrize("task_id", IDS)
def test_submit_baseline_episode_scores_the_recorded_baseline(task_id: str, tmp_path: Path) -> None:
    task = TASKS[task_id]
    traj = read_trajectory(run_task(task.task_yaml, task.root, "submit-baseline", tmp_path / "out", gpus=0))
    assert traj.info.exit_status == "submitted"
    assert traj.info.score == [load_task_config(task.task_yaml).baseline_scores[0]]
    assert not (tmp_path / "out" / "baseline").exists()  # the recorded baseline_scores were used


@pytest.mark.parametrize("task_id", IDS)
def test_the_offline_teacher_completes_an_episode(task_id: str, tmp_path: Path) -> None:
    task = TASKS[task_id]
    cfg = GymforgeConfig(cache_dir=str(tmp_path / "cache"), results_dir=str(tmp_path / "results"))
    traj = read_trajectory(run_task(task.task_yaml, task.root, "teacher", tmp_path / "out", cfg=cfg, gpus=0, seed=1))
    assert traj.info.exit_status == "submitted"
    scores = [s[task.metric] for s in traj.info.score if task.metric in s]
    assert scores, traj.info.score
    baseline = load_task_config(task.task_yaml).baseline_scores[0][task.metric]
    # It reads no family it knows in these tasks, so it submits the baseline's artefact: never worse.
    assert scores[-1] == baseline or better(task, {task.metric: scores[-1]}, {task.metric: baseline})


# ---- loading benchmarks ----------------------------------------------------------------------------------------


def test_load_benchmark_filters_and_names_what_exists() -> None:
    assert [t.id for t in load_benchmark(EvaluateConfig())] == list(BUILTIN)
    chosen = load_benchmark(EvaluateConfig(tasks=["gridNavigation", "blobClustering"]))
    assert [t.id for t in chosen] == ["gridNavigation", "blobClustering"]
    with pytest.raises(BenchmarkError, match="imageClassificationCifar10") as err:
        load_benchmark(EvaluateConfig(tasks=["blobClustering", "imageClassificationCifar10"]))
    assert all(task_id in str(err.value) for task_id in BUILTIN)
    with pytest.raises(BenchmarkError, match="empty"):
        load_benchmark(EvaluateConfig(tasks=[]))


def test_task_meta_file_is_what_aup_reads(tmp_path: Path) -> None:
    path = task_meta_file(builtin_tasks(), tmp_path / "meta" / "tasks.yaml")
    meta = yaml.safe_load(path.read_text())
    assert meta["signalDenoising"] == {"metric": "mse", "higher_is_better": False}
    assert meta["gridNavigation"] == {"metric": "Reward Mean", "higher_is_better": True}
    assert list(meta) == list(BUILTIN)


def _task_yaml(task_id: str, description: str = "Do the task.", datasets: list[str] | None = None,
               entrypoint: str = "CSVSubmissionTasks") -> str:
    task = {"id": task_id, "name": f"The {task_id} task", "description": description,
            "task_entrypoint": entrypoint, "evaluation_paths": ["evaluate.py"]}
    if datasets:
        task["dataset_configs"] = datasets
        task["description"] += "\n\n{dataset_docs}"
    return yaml.safe_dump(task, sort_keys=False)


THREE = ["regressionKaggleHousePrice", "imageClassificationFMnist", "prisonersDilemma"]


def fake_mlgym(root: Path) -> Path:
    """A minimal MLGym checkout with MLGym's quirks: all 13 benchmark ids, rlMetaMazeMisc in rlMetaMaze.yaml, a
    second config declaring imageClassificationCifar10, a free-text dataset name, a task outside the benchmark."""
    tasks, datasets = root / "configs" / "tasks", root / "configs" / "datasets"
    tasks.mkdir(parents=True)
    datasets.mkdir(parents=True)
    for task_id in BENCHMARK_TASKS:
        file = "rlMetaMaze" if task_id == "rlMetaMazeMisc" else task_id
        (tasks / f"{file}.yaml").write_text(_task_yaml(task_id))
    (tasks / "imageClassificationCifar10L1.yaml").write_text(_task_yaml("imageClassificationCifar10"))
    (tasks / "prisonersDilemma.yaml").write_text(_task_yaml("prisonersDilemma", entrypoint="PythonSubmissionTasks"))
    (tasks / "imageClassificationFMnist.yaml").write_text(
        _task_yaml("imageClassificationFMnist", datasets=["datasets/fashionMnistHF.yaml"]))
    (datasets / "fashionMnistHF.yaml").write_text(yaml.safe_dump(
        {"name": "Fashion MNIST", "description": "Zalando's article images.",
         "data_path": "zalando-datasets/fashion_mnist"}))
    (tasks / "regressionKaggleHousePrice.yaml").write_text(
        _task_yaml("regressionKaggleHousePrice", datasets=["datasets/kaggleHousingPrice.yaml"]))
    (datasets / "kaggleHousingPrice.yaml").write_text(yaml.safe_dump(
        {"name": "kaggleHousingPrice", "description": "Ames houses.", "data_path": "data/regressionKaggleHousePrice/data",
         "is_local": True}))
    (tasks / "titanic.yaml").write_text(_task_yaml("titanicSurvival"))
    return root


def test_mlgym_tasks_reads_a_checkout(tmp_path: Path) -> None:
    root = fake_mlgym(tmp_path / "MLGym")
    tasks = mlgym_tasks(root)
    assert [t.id for t in tasks] == list(BENCHMARK_TASKS)
    by_id = {t.id: t for t in tasks}
    assert by_id["rlMetaMazeMisc"].task_yaml.name == "rlMetaMaze.yaml"  # found by its id, not its file name
    assert by_id["imageClassificationCifar10"].task_yaml.name == "imageClassificationCifar10.yaml"
    assert by_id["regressionKaggleHousePrice"].metric == "r2" and by_id["regressionKaggleHousePrice"].higher_is_better
    assert "kaggleHousingPrice" in by_id["regressionKaggleHousePrice"].datasets
    assert {"Fashion MNIST", "zalando-datasets/fashion_mnist"} <= set(by_id["imageClassificationFMnist"].datasets)
    assert by_id["prisonersDilemma"].entrypoint == "PythonSubmissionTasks"
    assert all(t.benchmark == "mlgym" and t.root == root.resolve() and t.family and t.keywords for t in tasks)
    assert all((t.metric, t.higher_is_better) == BENCHMARK_TASKS[t.id] for t in tasks)

    cfg = EvaluateConfig(benchmark="mlgym", mlgym_root=str(root), tasks=["rlMetaMazeMisc", "prisonersDilemma"])
    assert [t.id for t in load_benchmark(cfg)] == ["rlMetaMazeMisc", "prisonersDilemma"]
    with pytest.raises(BenchmarkError, match="titanicSurvival is not an MLGym-Bench task; choose from"):
        load_benchmark(EvaluateConfig(benchmark="mlgym", mlgym_root=str(root), tasks=["titanicSurvival"]))


def test_a_missing_benchmark_task_fails_loudly_unless_narrowed(tmp_path: Path) -> None:
    root = fake_mlgym(tmp_path / "MLGym")
    (root / "configs" / "tasks" / "rlMetaMaze.yaml").unlink()
    (root / "configs" / "tasks" / "blotto.yaml").write_text("id: [unclosed\n")
    with pytest.raises(BenchmarkError) as err:
        load_benchmark(EvaluateConfig(benchmark="mlgym", mlgym_root=str(root)))
    message = str(err.value)
    assert "blotto, rlMetaMazeMisc" in message and "found 11 of 13" in message
    assert "blotto.yaml (invalid YAML)" in message and "set evaluate.tasks to run a subset" in message
    narrowed = EvaluateConfig(benchmark="mlgym", mlgym_root=str(root), tasks=THREE)
    assert [t.id for t in load_benchmark(narrowed)] == THREE
    with pytest.raises(BenchmarkError, match=r"rlMetaMazeMisc \(unreadable: blotto.yaml \(invalid YAML\)\); found 1 of 2$"):
        load_benchmark(EvaluateConfig(benchmark="mlgym", mlgym_root=str(root), tasks=["rlMetaMazeMisc", "prisonersDilemma"]))


def test_an_id_declared_twice_without_its_own_file_is_an_error(tmp_path: Path) -> None:
    root = fake_mlgym(tmp_path / "MLGym")
    tasks = root / "configs" / "tasks"
    (tasks / "imageClassificationCifar10.yaml").rename(tasks / "imageClassificationCifar10L2.yaml")
    with pytest.raises(BenchmarkError, match=r"declared by 2 configs \(imageClassificationCifar10L1.yaml, "
                                             r"imageClassificationCifar10L2.yaml\)"):
        mlgym_tasks(root, ["imageClassificationCifar10"])


def test_mlgym_tasks_explains_missing_files(tmp_path: Path) -> None:
    with pytest.raises(BenchmarkError, match="does not exist"):
        mlgym_tasks(tmp_path / "nowhere")
    (tmp_path / "empty" / "configs" / "tasks").mkdir(parents=True)
    with pytest.raises(BenchmarkError, match="no config declares .* found 0 of 13"):
        mlgym_tasks(tmp_path / "empty")
    root = fake_mlgym(tmp_path / "MLGym")
    (root / "configs" / "datasets" / "fashionMnistHF.yaml").unlink()
    with pytest.raises(BenchmarkError, match="datasets/fashionMnistHF.yaml does not exist"):
        mlgym_tasks(root)


# ---- decontamination -------------------------------------------------------------------------------------------

# (topic, hub dataset id or None for a game): every offline family, plus topics near the suite's families.
SYNTH_CASES = [
    ("Penguin species identification from body measurements", "palmerpenguins/penguins"),
    ("Diabetes disease progression regression from baseline measurements", "sklearn/diabetes"),
    ("Yearly sunspot activity forecasting", "statsmodels/sunspots"),
    ("Train and submit a wine cultivar classifier", "sklearn/wine"),
    ("Robustness of digit classifiers to pixel noise", "sklearn/digits"),
    ("Exponential smoothing for atmospheric CO2", "statsmodels/co2"),
    ("Strategy for the iterated stag hunt against adaptive opponents", None),
    ("Construction heuristic for random travelling salesman instances", None),
    ("Greedy knapsack heuristics under a time budget", None),
]


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Extra]]:
    """Task trees the offline teacher's families write (configs only), with their proposals' text."""
    from gymforge.llm.codeblocks import parse_files
    from gymforge.offline.hub import OfflineHub
    from gymforge.offline import families
    from gymforge.tasks.files import validate_config_files, write_task_tree

    base = tmp_path_factory.mktemp("synth")
    hub = OfflineHub(base / "hub")
    out = []
    for i, (topic, dataset_id) in enumerate(SYNTH_CASES):
        dataset = hub.describe(dataset_id).model_dump() if dataset_id else None
        proposal = {"topic": topic, "metric": "accuracy", "description": f"A task about {topic.lower()}.",
                    "dataset": dataset}
        attempt = next(a for a in range(1, 10) if families.config_bug(proposal, seed=i, attempt=a) is None)
        bundle = validate_config_files(parse_files(families.write_configs(proposal, seed=i, attempt=attempt)))
        tree = base / f"t{i:04d}" / "mlgym"
        write_task_tree(tree, bundle, {})
        out.append((tree, Extra(text=f"{topic}\n{proposal['description']}", datasets=[dataset_id] if dataset_id else [])))
    return out


def test_real_synthesized_tasks_pass_both_benchmarks(synthesized: list[tuple[Path, Extra]], tmp_path: Path) -> None:
    trees = [tree for tree, _ in synthesized]
    extra = {str(tree): e for tree, e in synthesized}
    report = check(builtin_tasks(), trees, extra)
    assert report.ok and report.benchmark == "builtin" and report.checked == len(SYNTH_CASES), report.conflicts
    enforce(report)  # no error
    mlgym = check(mlgym_tasks(fake_mlgym(tmp_path / "MLGym"), THREE), trees, extra)
    assert mlgym.ok and mlgym.benchmark == "mlgym", mlgym.conflicts
    (tmp_path / "empty" / "mlgym").mkdir(parents=True)  # a discarded slot leaves an empty tree
    assert check(builtin_tasks(), [tmp_path / "empty" / "mlgym"]).checked == 0


def synthetic_tree(root: Path, task_id: str, name: str, description: str,
                   dataset: dict[str, object] | None = None) -> Path:
    (root / "configs" / "tasks").mkdir(parents=True)
    task: dict[str, object] = {"id": task_id, "name": name, "description": description}
    if dataset is not None:
        (root / "configs" / "datasets").mkdir()
        (root / "configs" / "datasets" / f"{dataset['name']}.yaml").write_text(yaml.safe_dump(dataset))
        task["dataset_configs"] = [f"datasets/{dataset['name']}.yaml"]
        task["description"] = description + "\n\n{dataset_docs}"
    (root / "configs" / "tasks" / f"{task_id}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    return root


def test_a_prisoners_dilemma_task_fails_against_mlgym(tmp_path: Path) -> None:
    benchmark = mlgym_tasks(fake_mlgym(tmp_path / "MLGym"), THREE)
    tree = synthetic_tree(tmp_path / "synth", "repeatedDilemmaBots", "Repeated Prisoner’s Dilemma bots",
                          "Write a strategy that defects or cooperates against scripted opponents.")
    report = check(benchmark, [tree])
    assert not report.ok and report.checked == 1
    [conflict] = report.conflicts
    assert (conflict.task_id, conflict.benchmark_task, conflict.kind) == ("repeatedDilemmaBots", "prisonersDilemma",
                                                                            "family")
    assert "name" in conflict.detail and "prisoner" in conflict.detail
    with pytest.raises(ContaminationError, match="repeatedDilemmaBots vs prisonersDilemma"):
        enforce(report)
    out = write_report(report, tmp_path / "report" / "decontamination.json")
    assert DecontaminationReport.model_validate_json(out.read_text()) == report


def test_a_clustering_task_fails_against_the_builtin_suite(tmp_path: Path) -> None:
    by_name = synthetic_tree(tmp_path / "a", "customerSegments", "Customer segmentation by clustering",
                             "Group the shoppers.")
    by_id = synthetic_tree(tmp_path / "b", "kMeansShoppers", "Shopper groups", "Group the shoppers.")
    report = check(builtin_tasks(), [by_name, by_id])
    assert [(c.task_id, c.benchmark_task, c.kind) for c in report.conflicts] == [
        ("customerSegments", "blobClustering", "family"), ("kMeansShoppers", "blobClustering", "family")]
    assert "its id" in report.conflicts[1].detail
    out = tmp_path / "report.json"
    with pytest.raises(ContaminationError):
        run_check(EvaluateConfig(), [by_name], out)
    assert not DecontaminationReport.model_validate_json(out.read_text()).ok


def test_the_same_dataset_fails_whatever_its_spelling(tmp_path: Path,
                                                      synthesized: list[tuple[Path, Extra]]) -> None:
    benchmark = mlgym_tasks(fake_mlgym(tmp_path / "MLGym"), THREE)
    hf = synthetic_tree(tmp_path / "hf", "apparelTypes", "Apparel type recognition", "Predict the garment type.",
                        {"name": "apparelImages", "description": "Garments.", "data_path": "Fashion-MNIST"})
    local = synthetic_tree(tmp_path / "local", "homeValues", "Home value regression", "Predict the sale value.",
                           {"name": "homeValuesData", "description": "Homes.\n\nSource: someone/KaggleHousingPrice, "
                            "a local copy.", "data_path": "data/homeValues/data", "is_local": True})
    tree, _ = synthesized[0]  # a real penguins task, whose proposal named a benchmark dataset
    report = check(benchmark, [hf, local, tree], {"apparelTypes": "", str(tree): Extra(datasets=["uoft-cs/CIFAR10"])})
    found = {(c.task_id, c.benchmark_task, c.kind) for c in report.conflicts}
    assert ("apparelTypes", "imageClassificationFMnist", "dataset") in found
    assert ("homeValues", "regressionKaggleHousePrice", "dataset") in found
    assert not any(c.benchmark_task == "imageClassificationCifar10" for c in report.conflicts)  # not among the tasks checked
    builtin = check(builtin_tasks(), [tree], {str(tree): Extra(datasets=["gymforge-benchmark/grid_navigation_maps"])})
    assert [(c.benchmark_task, c.kind) for c in builtin.conflicts] == [("gridNavigation", "dataset")]


def test_proposals_feed_the_check(tmp_path: Path) -> None:
    results = tmp_path / "results"
    tree = synthetic_tree(results / "environments" / "t0003" / "verified" / "mlgym", "segmentShoppers",
                          "Shopper segments", "Group the shoppers.")
    (results / "proposals").mkdir()
    (results / "proposals" / "t0003.json").write_text(json.dumps({
        "topic": "Shopper segmentation", "proposal": {"topic": "Shopper segmentation",
                                                      "description": "Cluster analysis of shoppers.",
                                                      "dataset": "acme/shoppers"},
        "dataset": {"id": "acme/shoppers"}}))
    assert proposal_extra(results / "proposals" / "t0003.json").datasets == ["acme/shoppers"]
    config = tmp_path / "config.json"
    args = ["decontamination", "--config", str(config), "--synthesized", str(tree.parent),
            "--proposals", str(results / "proposals" / "t0003.json")]
    config.write_text(GymforgeConfig(decontamination={"on_overlap": "fail"}).model_dump_json())
    out = tmp_path / "decontamination.json"
    with pytest.raises(SystemExit, match="segmentShoppers vs blobClustering"):
        cli.main([*args, "--out", str(out)])
    report = DecontaminationReport.model_validate_json(out.read_text())
    assert [(c.benchmark_task, c.kind) for c in report.conflicts] == [("blobClustering", "family")]
    assert "extra text" in report.conflicts[0].detail and report.dropped == {}

    # The default policy: the build goes on, and the overlapping slot is named for the SFT data and the RL pool.
    config.write_text(GymforgeConfig().model_dump_json())
    cli.main([*args, "--out", str(out)])
    report = DecontaminationReport.model_validate_json(out.read_text())
    assert report.on_overlap == "drop" and not report.ok
    assert report.dropped == {"t0003": "benchmark_overlap: family of blobClustering (segmentShoppers)"}
    assert dropped_items(out) == report.dropped


def test_odd_evaluate_task_ids_fail_at_config_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"evaluate.tasks: task id 'x{40}'\.\.\. is 300 characters long") as err:
        validate_config({"evaluate": {"benchmark": "mlgym", "mlgym_root": str(tmp_path), "tasks": ["x" * 300]}})
    assert "x" * 41 not in str(err.value)
    with pytest.raises(ConfigError, match="'../x' may only use ASCII letters"):
        validate_config({"evaluate": {"tasks": ["../x"]}})
    assert not list(tmp_path.iterdir())


def test_unmet_needs_name_what_is_missing_and_how_to_get_it(tmp_path: Path) -> None:
    root = fake_mlgym(tmp_path / "MLGym")
    by_id = {t.id: t for t in mlgym_tasks(root)}
    cache = tmp_path / "datasets"
    fmnist, lm, house = (by_id[t] for t in ("imageClassificationFMnist", "languageModelingFineWeb",
                                            "regressionKaggleHousePrice"))
    assert (fmnist.hub_datasets, fmnist.gpus, lm.gpus, house.local_data) == (
        ["zalando-datasets/fashion_mnist"], 0, 1, ["data/regressionKaggleHousePrice/data"])
    assert sum(t.gpus for t in by_id.values()) == 6 and by_id["prisonersDilemma"].gpus == 0

    [problem] = unmet_needs(fmnist, cache, gpus=0)
    assert "zalando-datasets/fashion_mnist" in problem and "`snakemake datasets`" in problem
    assert problem.endswith(f"`snakemake {cache}/zalando-datasets--fashion_mnist/manifest.json`")
    (cache / "zalando-datasets--fashion_mnist").mkdir(parents=True)
    (cache / "zalando-datasets--fashion_mnist" / "manifest.json").write_text("{}")
    assert unmet_needs(fmnist, cache, gpus=0) == []

    with pytest.raises(TaskUnavailable, match=r"languageModelingFineWeb cannot run: .*needs 1 GPU.*torchrun.* "
                                              r"sees 0: .*`snakemake --resources gpu=N`"):
        require_runnable(lm, cache, gpus=0)
    assert not any("GPU" in p for p in unmet_needs(lm, cache, gpus=1))

    [problem] = unmet_needs(house, cache, gpus=0)
    assert "data/regressionKaggleHousePrice/data is not in" in problem and "does not ship it" in problem
    helpers = root / "data" / "regressionKaggleHousePrice" / "_helpers"
    helpers.mkdir(parents=True)
    (helpers / "_generate_split.py").write_text("")
    assert "generates it with data/regressionKaggleHousePrice/_helpers/_generate_split.py" in unmet_needs(
        house, cache, gpus=0)[0]
    (root / "data" / "regressionKaggleHousePrice" / "data").mkdir()
    assert unmet_needs(house, cache, gpus=0) == []


def test_eval_runs_on_a_task_without_its_data_says_so_without_a_traceback(tmp_path: Path) -> None:
    root = fake_mlgym(tmp_path / "MLGym")
    config = tmp_path / "config.json"
    config.write_text(GymforgeConfig(cache_dir=str(tmp_path / "cache"), evaluate=EvaluateConfig(
        benchmark="mlgym", mlgym_root=str(root))).model_dump_json())
    out = tmp_path / "runs" / "teacher" / "imageClassificationFMnist.json"
    with pytest.raises(SystemExit, match=r"^gymforge: benchmark task imageClassificationFMnist cannot run: .*"
                                         r"`snakemake datasets`"):
        cli.main(["eval-runs", "--config", str(config), "--model", "teacher", "--task", "imageClassificationFMnist",
                  "--runs", "0", "--out", str(out)])
    assert not out.parent.exists()  # nothing ran


def test_a_gpu_task_runs_in_a_sandbox_that_sees_its_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gymforge.tasks import episode
    from gymforge.stages import evaluation

    class Reached(Exception):
        pass

    def sandbox_for(cfg: GymforgeConfig, gpus: int) -> None:
        raise Reached(gpus)

    monkeypatch.setattr(episode, "sandbox_for", sandbox_for)
    monkeypatch.setattr(evaluation, "visible_gpus", lambda: 1)  # the job's lease
    cfg = GymforgeConfig(cache_dir=str(tmp_path / "cache"),
                         evaluate=EvaluateConfig(benchmark="mlgym", mlgym_root=str(fake_mlgym(tmp_path / "MLGym"))))
    for task_id, gpus in (("rlMetaMazeMisc", 1), ("prisonersDilemma", 0)):
        with pytest.raises(Reached) as reached:
            evaluation.evaluate_task(cfg, "teacher", task_id, [0], tmp_path / "runs" / f"{task_id}.json")
        assert reached.value.args == (gpus,)


def _helper_task(root: Path, script: str) -> None:
    helpers = root / "data" / "splitTask" / "_helpers"
    helpers.mkdir(parents=True)
    (helpers / "raw.csv").write_text("Id,x,y\n" + "".join(f"{i},{i * 2},{i % 3}\n" for i in range(20)))
    (helpers / "_generate_split.py").write_text(script)


SPLIT_HELPER = """
import os, pandas as pd
df = pd.read_csv("raw.csv")
X = df.drop(columns=["y"], axis=1)  # pandas 1 style: pandas >= 2 rejects the redundant axis
os.makedirs("../data", exist_ok=True)
X[:15].to_csv("../data/train.csv", index=False)
df[["Id", "y"]][15:].to_csv("../data/answer.csv", index=False)
print("uid", os.getuid())
"""


def test_mlgym_helper_makes_local_data_in_the_sandbox(tmp_path: Path) -> None:
    from gymforge.tasks.prepare import prepare_local_data
    from gymforge.sandbox import Limits, get_sandbox

    _helper_task(tmp_path, SPLIT_HELPER)
    made = prepare_local_data(tmp_path, "splitTask", "data/splitTask/data", sandbox=get_sandbox("local"),
                              limits=Limits())
    assert sorted(p.name for p in made.iterdir()) == ["answer.csv", "train.csv"]
    assert made.joinpath("train.csv").read_text().splitlines()[0] == "Id,x"
    assert not list(tmp_path.glob("data/.splitTask*.tmp"))  # nothing half-made is left beside it


def test_mlgym_helper_cannot_plant_links_or_fail_silently(tmp_path: Path) -> None:
    from gymforge.tasks.prepare import PrepareError, prepare_local_data
    from gymforge.sandbox import Limits, get_sandbox

    _helper_task(tmp_path / "a", "import os\nos.makedirs('../data')\nos.symlink('/etc/shadow', '../data/answer.csv')\n")
    with pytest.raises(PrepareError, match="non-regular files: answer.csv"):
        prepare_local_data(tmp_path / "a", "splitTask", "data/splitTask/data", sandbox=get_sandbox("local"),
                           limits=Limits())
    assert not (tmp_path / "a" / "data" / "splitTask" / "data").exists()
    _helper_task(tmp_path / "b", "raise SystemExit('no raw data')\n")
    with pytest.raises(PrepareError, match="no raw data"):
        prepare_local_data(tmp_path / "b", "splitTask", "data/splitTask/data", sandbox=get_sandbox("local"),
                           limits=Limits())
