"""Micro-scale task variants (issue #16; docs/rl.md): row choice, tree rewriting, the stage, the rule."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gymforge.core.config import ConfigError, GymforgeConfig, validate_config
from gymforge.core.configview import restrict
from gymforge.core.records import VerificationIteration, VerificationReport
from gymforge.stages.micro import MicroReport, choose_rows, micro_task, scale_repeats, shrink_task

REPO = Path(__file__).resolve().parents[2]


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def labelled(n_a: int = 700, n_b: int = 250, n_c: int = 50) -> pd.DataFrame:
    labels = ["a"] * n_a + ["b"] * n_b + ["c"] * n_c
    order = np.random.default_rng(42).permutation(len(labels))
    return pd.DataFrame({"x": np.arange(len(labels), dtype=float), "y": np.asarray(labels)[order]})


# -- config ---------------------------------------------------------------------------------------------


def test_micro_config_defaults_and_minimum():
    cfg = GymforgeConfig()
    assert cfg.micro.max_train_rows == 200
    assert validate_config({"micro": {"max_train_rows": 50}}).micro.max_train_rows == 50
    with pytest.raises(ConfigError, match=r"micro\.max_train_rows"):
        validate_config({"micro": {"max_train_rows": 49}})
    with pytest.raises(ConfigError, match=r"micro\.eval_scale"):
        validate_config({"micro": {"eval_scale": 0}})


# -- choosing rows ---------------------------------------------------------------------------------------


def test_stratified_rows_keep_every_class_and_its_share():
    frame = labelled()
    keep, method, label = choose_rows(frame, 200, rng(), ["y"])
    assert (method, label, len(keep), len(set(keep))) == ("stratified", "y", 200, 200)
    assert list(keep) == sorted(keep)  # original order kept
    counts = frame["y"].iloc[keep].value_counts().to_dict()
    assert counts == {"a": 140, "b": 50, "c": 10}


def test_rare_classes_get_at_least_one_row():
    frame = labelled(n_a=990, n_b=9, n_c=1)
    keep, method, _ = choose_rows(frame, 50, rng(), ["y"])
    counts = frame["y"].iloc[keep].value_counts().to_dict()
    assert method == "stratified" and len(keep) == 50
    assert counts["c"] == 1 and counts["b"] >= 1 and sum(counts.values()) == 50


def test_row_choice_is_deterministic_per_seed():
    frame = labelled()
    first = choose_rows(frame, 100, rng(1), ["y"])[0]
    assert np.array_equal(first, choose_rows(frame, 100, rng(1), ["y"])[0])
    assert not np.array_equal(first, choose_rows(frame, 100, rng(2), ["y"])[0])


def test_continuous_target_is_sampled_uniformly_and_small_splits_are_kept():
    frame = pd.DataFrame({"x": np.arange(1000), "y": np.random.default_rng(0).normal(size=1000)})
    keep, method, label = choose_rows(frame, 120, rng(), ["y"])
    assert (method, label, len(keep)) == ("random", None, 120)
    keep, method, _ = choose_rows(frame.head(150), 200, rng(), ["y"])
    assert method == "kept_whole" and len(keep) == 150


def test_time_series_keep_their_most_recent_contiguous_rows():
    frame = pd.DataFrame({"date": pd.date_range("2000-01-01", periods=500, freq="D"), "value": np.arange(500.0)})
    keep, method, _ = choose_rows(frame, 80, rng(), ["value"])
    assert method == "time_tail" and list(keep) == list(range(420, 500))
    shuffled = frame.sample(frac=1, random_state=0)  # not ordered by time: no tail
    assert choose_rows(shuffled, 80, rng(), [])[1] == "random"


# -- cheaper evaluations (games, algorithmic tasks) -----------------------------------------------------------

GAME_EVAL = '''\
ROUNDS = 50
MATCHES = 5
SEED = 7


def simulate(strategy, num_simulations=10000):
    return strategy


def main():
    return simulate(None, num_simulations=3000), [run(n_games=40) for run in ()]
'''


def test_repetition_counts_shrink_and_game_rules_do_not():
    text, changes = scale_repeats(GAME_EVAL, 0.2)
    ast.parse(text)
    assert sorted(changes) == [("MATCHES", 5, 1), ("n_games", 40, 8), ("num_simulations", 3000, 600),
                               ("num_simulations", 10000, 2000)]
    assert "ROUNDS = 50" in text and "SEED = 7" in text and "MATCHES = 1\n" in text
    assert scale_repeats("ROUNDS = 10\nx = 3\n", 0.2) == ("ROUNDS = 10\nx = 3\n", [])


# -- rewriting a task tree --------------------------------------------------------------------------------


def write_tree(root: Path, kind: str = "hf", n_train: int = 900) -> Path:
    """A minimal verified MLGym tree: a CSV task whose local data is a DatasetDict (hf) or CSV files (csv)."""
    import datasets

    (root / "configs" / "tasks").mkdir(parents=True)
    (root / "configs" / "datasets").mkdir(parents=True)
    (root / "configs" / "tasks" / "demo.yaml").write_text(
        "id: demo\nname: Demo\ndescription: Predict y. {dataset_docs}\ndataset_configs:\n- datasets/demoData.yaml\n"
        "starter_code:\n- data/demo/baseline.py\n- data/demo/evaluate.py\nbaseline_paths:\n- baseline.py\n"
        "evaluation_paths:\n- evaluate.py\nbaseline_scores:\n- accuracy: 0.9\n")
    (root / "configs" / "datasets" / "demoData.yaml").write_text(
        "name: demoData\ndescription: 1000 rows split into train and test.\ndata_path: data/demo/data\nis_local: true\n")
    train, test = labelled(n_train * 7 // 10, n_train * 2 // 10, n_train // 10), labelled(70, 20, 10)
    data = root / "data" / "demo" / "data"
    if kind == "hf":
        datasets.DatasetDict({"train": datasets.Dataset.from_pandas(train, preserve_index=False),
                              "test": datasets.Dataset.from_pandas(test, preserve_index=False)}).save_to_disk(str(data))
    else:
        data.mkdir(parents=True)
        train.to_csv(data / "train.csv", index=False)
        test.drop(columns=["y"]).to_csv(data / "test.csv", index=False)
    for name in ("baseline.py", "evaluate.py"):
        (root / "data" / "demo" / name).write_text("print('{}')\n")
    return root


def test_shrink_subsamples_a_datasetdict_train_split_only(tmp_path):
    import datasets

    tree = write_tree(tmp_path / "mlgym", "hf")
    cfg = GymforgeConfig(micro={"max_train_rows": 100})
    info = shrink_task(cfg, "t0001", tree, {"test": ["y"]})
    assert info.kind == "subsampled" and (info.rows_before, info.rows_after) == (900, 100)
    [split] = info.splits
    assert (split.split, split.method, split.label) == ("train", "stratified", "y")
    dd = datasets.load_from_disk(str(tree / "data" / "demo" / "data"))
    assert len(dd["train"]) == 100 and len(dd["test"]) == 100
    assert sorted(set(dd["train"]["y"])) == ["a", "b", "c"]
    doc = (tree / "configs" / "datasets" / "demoData.yaml").read_text()
    assert "keeps 100 of its 900 rows" in doc and "{" not in doc
    # Deterministic with the run seed: a second copy gets the same rows; another seed other rows.
    again = write_tree(tmp_path / "again", "hf")
    shrink_task(cfg, "t0001", again, {"test": ["y"]})
    assert datasets.load_from_disk(str(again / "data" / "demo" / "data"))["train"]["x"] == dd["train"]["x"]
    other = write_tree(tmp_path / "other", "hf")
    shrink_task(GymforgeConfig(seed=1, micro={"max_train_rows": 100}), "t0001", other, {"test": ["y"]})
    assert datasets.load_from_disk(str(other / "data" / "demo" / "data"))["train"]["x"] != dd["train"]["x"]


def test_shrink_subsamples_train_csv_files_and_finds_the_label_from_the_test_file(tmp_path):
    tree = write_tree(tmp_path / "mlgym", "csv")
    info = shrink_task(GymforgeConfig(micro={"max_train_rows": 60}), "t0001", tree, None)
    [split] = info.splits
    assert (split.path, split.method, split.label, split.rows_after) == ("data/demo/data/train.csv", "stratified", "y", 60)
    assert len(pd.read_csv(tree / "data" / "demo" / "data" / "train.csv")) == 60
    assert len(pd.read_csv(tree / "data" / "demo" / "data" / "test.csv")) == 100


def test_game_task_gets_a_cheaper_evaluation(tmp_path):
    from gymforge.offline.families.data_heavy import build_task

    built = build_task(tmp_path / "mlgym", "Rock-paper-scissors bot exploiting biased opponents", None)
    script = next((tmp_path / "mlgym" / "data").rglob("evaluate.py"))
    before = script.read_text()
    info = shrink_task(GymforgeConfig(), "t0002", built.tree, None)
    assert info.kind == "cheaper_evaluation" and info.splits == []
    [change] = info.evaluation
    assert change.name == "MATCHES" and change.after < change.before
    after = script.read_text()
    assert f"MATCHES = {change.after}\n" in after and after != before
    assert [line for line in before.splitlines() if line.startswith("ROUNDS")] == \
        [line for line in after.splitlines() if line.startswith("ROUNDS")]


# -- the stage ----------------------------------------------------------------------------------------------


def test_unverified_task_yields_a_skipped_micro_report(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(VerificationReport(item="t0003", status="discarded", reason_code="verification_failed",
                                         reason="still failing").model_dump_json())
    (tmp_path / "verified").mkdir()
    out = micro_task(GymforgeConfig(), "t0003", report, tmp_path / "verified", tmp_path / "micro" / "report.json",
                     tmp_path / "micro" / "verified")
    assert (out.status, out.reason_code) == ("skipped", "verification_failed")
    saved = MicroReport.model_validate_json((tmp_path / "micro" / "report.json").read_text())
    assert saved.status == "skipped" and (tmp_path / "micro" / "verified").is_dir()


@pytest.mark.slow
def test_micro_task_is_verified_with_its_own_baseline(tmp_path, rule_reads, monkeypatch):
    import gymforge.stages.micro as micro
    from gymforge.offline.families.data_heavy import build_task
    from gymforge.stages.verification import check_baseline

    cfg = GymforgeConfig(results_dir=str(tmp_path / "results"))
    built = build_task(tmp_path / "src", "Handwritten digit recognition from pixel intensities", "sklearn/digits")
    it = VerificationIteration(iteration=1, source="generation", task_id=built.task_id)
    checked = check_baseline(cfg, built.tree, tmp_path / "run", built.hidden_columns, it)
    assert checked is not None, it.errors
    env, _ = checked
    env.write_verified_copy(tmp_path / "env" / "verified" / "mlgym", [it.baseline_scores])
    (tmp_path / "env" / "report.json").write_text(VerificationReport(
        item="t0004", status="ok", task_id=built.task_id, entrypoint=built.entrypoint, iterations=[it],
        baseline_scores=[it.baseline_scores], hidden_columns=built.hidden_columns,
        metric=next(iter(it.baseline_scores)), higher_is_better=True).model_dump_json())
    # on a cluster $TMPDIR is the node's own disk: the shrunk task and its check run there, not in results/
    node = tmp_path / "node-tmp"
    node.mkdir()
    monkeypatch.setenv("TMPDIR", str(node))
    runs = []

    def spy(cfg, tree, run_dir, *args):
        runs.append((tree, run_dir))
        return check_baseline(cfg, tree, run_dir, *args)

    monkeypatch.setattr(micro, "check_baseline", spy)
    # under micro_task's config view, as its Snakemake job runs it: a read its rule does not declare fails
    view = restrict(cfg, rule_reads["micro_task"]["reads"], step="micro_task")
    report = micro_task(view, "t0004", tmp_path / "env" / "report.json", tmp_path / "env" / "verified",
                        tmp_path / "micro" / "report.json", tmp_path / "micro" / "verified")
    assert report.status == "ok", report.reason
    [(tree, run_dir)] = runs
    assert tree.is_relative_to(node) and run_dir.is_relative_to(node)
    assert not list(node.iterdir())  # removed when the job is done; the results are in results/ (below)
    assert sorted(p.name for p in (tmp_path / "micro").iterdir()) == ["report.json", "verified"]
    assert report.hidden_columns == built.hidden_columns == {"test": ["digit"]}
    # what ranks its scores is the verified task's (the RL stage reads it, never the proposal's words)
    assert (report.metric, report.higher_is_better) == (next(iter(it.baseline_scores)), True)
    # the cut task's evaluator is probed again: every probe rejected or no better than the micro baseline
    probes = report.iterations[0].probes
    assert len(probes) >= 20 and not any(p.gameable for p in probes) and "probes" in report.iterations[0].timings_s
    assert report.micro.kind == "subsampled" and report.micro.rows_after == 200 < report.micro.rows_before
    assert report.micro.full_check_s == it.timings_s["baseline"] and report.micro.micro_check_s > 0
    [scores] = report.baseline_scores
    assert set(scores) == set(it.baseline_scores)
    task_yaml = json.dumps(__import__("yaml").safe_load(
        (tmp_path / "micro" / "verified" / "mlgym" / "configs" / "tasks" / f"{built.task_id}.yaml").read_text()))
    assert json.loads(task_yaml)["baseline_scores"] == [scores]
    import datasets

    data = datasets.load_from_disk(str(tmp_path / "micro" / "verified" / "mlgym" / "data" / built.task_id / "data"))
    assert len(data["train"]) == 200 and len(data["test"]) == 360


def test_cli_verb_and_rule_names_match():
    from gymforge.cli import STEPS, _step_function, _step_parser

    target, _ = STEPS["micro-task"]
    function = _step_function(target)
    assert function is micro_task
    args = vars(_step_parser("micro-task", function).parse_args(
        ["--slot", "t0001", "--report", "r", "--env", "e", "--report-out", "o", "--env-out", "v"]))
    assert args["slot"] == "t0001" and args["env"] == Path("e") and "config" in args
    rules = (REPO / "rules" / "micro.smk").read_text()
    assert "rule micro_task:" in rules and "rule micro:" in rules and '"micro-task"' in rules
    for flag in ("--report {input", "--env {input", "--report-out", "--env-out"):
        assert flag in rules


@pytest.mark.slow
def test_dry_run_plans_one_micro_task_per_slot(tmp_path):
    from workflow_copy import copy_workflow

    run = copy_workflow(tmp_path / "wf", "rules", "report")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "micro", "-n", "--quiet", "rules",
                           "--config", "topics={n: 3}"], cwd=run, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = {p[0]: int(p[1]) for p in (line.split() for line in proc.stdout.splitlines())
              if len(p) == 2 and p[1].isdigit()}
    assert counts["micro_task"] == 3 and counts["verify_environment"] == 3 and counts["micro"] == 1


def test_data_heavy_task_swaps_only_the_baseline_model(tmp_path):
    from gymforge.offline.families.data_heavy import HEAVY_CASES, build_task

    topic, dataset = HEAVY_CASES[0]
    light = build_task(tmp_path / "light", topic, dataset)
    heavy = build_task(tmp_path / "heavy", topic, dataset, heavy=True)
    assert light.task_id == heavy.task_id and heavy.train_rows == light.train_rows > 10_000
    read = {name: {p.name: p.read_text() for p in (t.tree / "data" / t.task_id).glob("*.py")}
            for name, t in (("light", light), ("heavy", heavy))}
    assert read["light"]["evaluate.py"] == read["heavy"]["evaluate.py"]
    baseline = read["heavy"]["baseline.py"]
    ast.parse(baseline)
    assert 'GridSearchCV(SVR(gamma="scale")' in baseline and "GridSearchCV" not in read["light"]["baseline.py"]
    # Same features and submission: only the model line and its import differ.
    changed = set(baseline.splitlines()) ^ set(read["light"]["baseline.py"].splitlines())
    assert all("import" in line or "make_pipeline(features" in line or "Baseline for" in line for line in changed)
