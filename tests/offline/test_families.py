"""The offline teacher's task writers: drafts parse, validate, run like MLGym runs them, and carry seeded bugs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gymforge.tasks import mlgym
from gymforge.llm.codeblocks import parse_files
from gymforge.runtime.codecheck import check_columns, check_python
from gymforge.offline import families, improvements
from gymforge.offline.families import games
from gymforge.offline.families.common import parse_facts
from gymforge.offline.families.data_heavy import dataset_details

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

# (topic, dataset id, metric asked for, family, entrypoint)
DATA_CASES = [
    ("Penguin species identification from body measurements", "palmerpenguins/penguins", "macro F1",
     "tabular_classification", "CSVSubmissionTasks"),
    ("Diabetes disease progression regression from baseline measurements", "sklearn/diabetes", "RMSE",
     "tabular_regression", "CSVSubmissionTasks"),
    ("Yearly sunspot activity forecasting", "statsmodels/sunspots", "MAE",
     "time_series_forecasting", "CSVSubmissionTasks"),
    ("Train and submit a wine cultivar classifier", "sklearn/wine", "accuracy",
     "model_submission", "ModelSubmissionTasks"),
]
GAME_TOPICS = {
    "stag_hunt": "Strategy for the iterated stag hunt against adaptive opponents",
    "hawk_dove": "Hawk-dove strategy in repeated encounters",
    "matching_pennies": "Repeated matching pennies against pattern-seeking opponents",
    "rock_paper_scissors": "Rock-paper-scissors bot exploiting biased opponents",
    "ultimatum": "Ultimatum game offers against heterogeneous responders",
    "knapsack": "Greedy knapsack heuristics under a time budget",
    "bin_packing": "Online bin packing heuristic design",
}


# The dataset as the offline hub describes it, and the split it materialises: the offline families' own helper.
hub_dataset = cache(dataset_details)


def proposal(topic: str, dataset_id: str | None, metric: str = "Score") -> dict[str, Any]:
    dataset = hub_dataset(dataset_id)[0] if dataset_id else None
    return {"topic": topic, "metric": metric, "description": f"A task about {topic.lower()}.", "dataset": dataset}


def draft(prop: dict[str, Any], seed: int = 0, attempt: int = 1) -> tuple[dict[str, str], dict[str, str]]:
    """(config files, code files) as the pipeline parses them from the teacher's answers."""
    configs = parse_files(families.write_configs(prop, seed=seed, attempt=attempt))
    code = parse_files(families.write_code(configs, prop["dataset"], seed=seed + 1, attempt=attempt))
    return configs, code


def validated(configs: dict[str, str]) -> tuple[mlgym.TaskConfig, list[mlgym.DatasetConfig]]:
    task, datasets = None, []
    for path, text in configs.items():
        model = mlgym.TaskConfig if path.startswith("configs/tasks/") else mlgym.DatasetConfig
        config, errors = mlgym.parse_config(model, text, path, Path(path).stem)
        assert not errors, errors
        if isinstance(config, mlgym.TaskConfig):
            task = config
        else:
            datasets.append(config)
    assert task is not None
    return task, datasets


def workspace(tmp: Path, configs: dict[str, str], code: dict[str, str], split: Any = None) -> Path:
    """An MLGym workspace: starter files under their base names, the local dataset as data/."""
    task, datasets = validated(configs)
    ws = tmp / task.id
    ws.mkdir(parents=True)
    for dest, src in mlgym.workspace_layout(task, datasets).items():
        if dest == "data":
            split.save_to_disk(str(ws / "data"))
        else:
            (ws / dest).write_text(code[src])
    return ws


def run(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ws, env=ENV, capture_output=True, text=True, timeout=120)


def evaluate(ws: Path, task: mlgym.TaskConfig) -> dict[str, float]:
    """The evaluation exactly as MLGym calls it and parses its stdout (docs/verification.md)."""
    script = task.evaluation_paths[0]
    if task.task_entrypoint == "CSVSubmissionTasks":
        out = run(ws, script, "--submission_file", str(ws / "submission.csv"))
    elif task.task_entrypoint == "ModelSubmissionTasks":
        yamls = sorted(ws.glob("*.yaml"))
        assert len(yamls) == 1, yamls
        out = run(ws, script, "--config_fname", str(yamls[0]))
    else:
        out = run(ws, script)
    assert out.returncode == 0, out.stderr
    if task.task_entrypoint == "ModelSubmissionTasks":
        return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
    return json.loads(out.stdout)


def test_vocabulary_and_dataset_choose_the_family() -> None:
    for topic, dataset_id, _, family, _ in DATA_CASES:
        assert families.detect_family(topic, hub_dataset(dataset_id)[0]) == family
    assert families.detect_family("Anything at all", None) == "game_strategy"
    # Unknown topics fall back to the card: a time-series card makes a forecasting task.
    assert families.detect_family("Mystery topic", hub_dataset("statsmodels/nile")[0]) == "time_series_forecasting"
    assert families.detect_family("Mystery topic", hub_dataset("sklearn/iris")[0]) == "tabular_classification"


@pytest.mark.parametrize(("topic", "dataset_id", "family", "target"), [
    # The card's label unless the topic's subject names another column; inputs after "from" never count.
    ("Handwritten digit recognition from 8x8 pixel grids", "sklearn/digits", "tabular_classification", "digit"),
    ("Penguin island prediction from bill and flipper size", "palmerpenguins/penguins", "tabular_classification",
     "island"),
    ("Penguin body mass estimation from bill and flipper size", "palmerpenguins/penguins", "tabular_regression",
     "body_mass_g"),
    ("Quarterly economic output forecasting with exogenous indicators", "statsmodels/macrodata",
     "time_series_forecasting", "realgdp"),
])
def test_target_follows_the_card_and_the_topic(topic: str, dataset_id: str, family: str, target: str) -> None:
    configs = parse_files(families.write_configs(proposal(topic, dataset_id), seed=0, attempt=1))
    spec = families.spec_from_configs(configs, hub_dataset(dataset_id)[0])
    assert (spec.family, spec.target) == (family, target)


@pytest.mark.slow  # each case installs its task and runs its baseline and evaluation in the sandbox
@pytest.mark.parametrize("case", DATA_CASES, ids=[c[3] for c in DATA_CASES])
def test_data_family_runs_like_mlgym(case: tuple[str, str, str, str, str], tmp_path: Path) -> None:
    topic, dataset_id, metric, family, entrypoint = case
    prop = proposal(topic, dataset_id, metric)
    configs, code = draft(prop)
    task, datasets = validated(configs)
    assert task.task_entrypoint == entrypoint and len(datasets) == 1
    assert datasets[0].data_path == f"data/{task.id}/data" and datasets[0].is_local
    assert task.description.count(mlgym.PLACEHOLDER) == 1
    assert "{dataset_docs}" not in mlgym.render_description(task, datasets)
    spec = families.spec_from_configs(configs, prop["dataset"])
    assert spec.family == family
    assert spec.metric == {"macro F1": "macro_f1", "RMSE": "rmse", "MAE": "mae", "accuracy": "accuracy"}[metric]
    assert sorted(code) == sorted(task.starter_code)
    columns = set(prop["dataset"]["features"])
    for path, source in code.items():
        assert not check_python(source, path) and not check_columns(source, path, columns)
    assert not any(p.endswith((".yaml", ".yml")) for p in code)  # MLGym evaluates the first *.yaml it finds

    ws = workspace(tmp_path, configs, code, hub_dataset(dataset_id)[1])
    artefact = ws / ("model.pkl" if family == "model_submission" else "submission.csv")
    outputs = []
    for _ in range(2):
        done = run(ws, task.baseline_paths[0])
        assert done.returncode == 0, done.stderr
        outputs.append(artefact.read_bytes())
    assert outputs[0] == outputs[1], "the baseline is not deterministic"
    scores = evaluate(ws, task)
    assert list(scores) == [spec.metric] and isinstance(scores[spec.metric], float)

    if entrypoint == "CSVSubmissionTasks":
        # A malformed submission fails loudly instead of scoring.
        (ws / "submission.csv").write_text("id,prediction\n0,1\n")
        bad = run(ws, task.evaluation_paths[0], "--submission_file", str(ws / "submission.csv"))
        assert bad.returncode != 0 and "columns" in bad.stderr and not bad.stdout


SMARTER = {
    "matrix": '''
from collections import Counter
PAYOFF = {payoff}

def choose_move(history):
    n = len(PAYOFF)
    if len(history) < 2:
        return max(range(n), key=lambda m: max(PAYOFF[m]))  # aim for the best outcome; it wakes grudgers
    # Predict the opponent from what followed the same (my move, their move) context before.
    context = history[-1]
    seen = Counter(h2[1] for h1, h2 in zip(history, history[1:]) if h1 == context)
    if not seen:
        seen = Counter(theirs for _, theirs in history[-10:])
    total = sum(seen.values())
    return max(range(n), key=lambda m: sum(PAYOFF[m][j] * c / total for j, c in seen.items()))
''',
    "ultimatum": '''
PIE = {pie}

def make_offer(history):
    if not history:
        return max(1, PIE // 5)
    offer, accepted = history[-1]
    return offer if accepted else min(PIE, offer + max(1, PIE // 20))
''',
    # The offline agent's own heuristics (its improvement ideas) beat the greedy baselines.
    "knapsack": improvements.game_function("knapsack", "density"),
    "bin_packing": improvements.game_function("bin_packing", "ffd"),
}


@pytest.mark.parametrize("kind", list(GAME_TOPICS))
def test_game_family_runs_and_baseline_is_beatable(kind: str, tmp_path: Path) -> None:
    prop = proposal(GAME_TOPICS[kind], None)
    configs, code = draft(prop, seed=7)
    task, datasets = validated(configs)
    assert task.task_entrypoint == "PythonSubmissionTasks" and not datasets and not task.dataset_configs
    game = games.parse_game(parse_facts(task.description))
    assert game.kind == kind
    for path, source in code.items():
        assert not check_python(source, path)
    ws = workspace(tmp_path, configs, code)
    done = run(ws, task.baseline_paths[0])
    assert done.returncode == 0, done.stderr
    baseline = evaluate(ws, task)
    assert list(baseline) == ["Score"] and baseline["Score"] >= 0
    assert evaluate(ws, task) == baseline

    smarter = SMARTER["matrix" if kind in games.MATRIX_GAMES else kind]
    (ws / task.baseline_paths[0]).write_text(smarter.format(payoff=[list(r) for r in game.payoff], pie=game.pie))
    assert evaluate(ws, task)["Score"] > baseline["Score"] + 0.02


def test_game_parameters_and_opponents_vary_with_the_seed() -> None:
    prop = proposal(GAME_TOPICS["stag_hunt"], None)
    payoffs = {parse_facts(validated(draft(prop, seed=s)[0])[0].description)["payoff matrix"] for s in range(8)}
    pools = {draft(prop, seed=s)[1][next(iter(draft(prop, seed=s)[1]))] for s in range(4)}
    assert len(payoffs) > 2 and len(pools) > 1
    # A topic about a held-out benchmark game still gets one of ours, named after what it is.
    for seed in range(10):
        configs = parse_files(families.write_configs(proposal("Prisoner's dilemma tournament", None), seed=seed,
                                                     attempt=1))
        task, _ = validated(configs)
        assert "prisoner" not in task.id.lower() and parse_facts(task.description)["game"] in games.KINDS


def test_same_inputs_same_draft_and_seeds_vary_it() -> None:
    for topic, dataset_id, metric, *_ in DATA_CASES[:2]:
        prop = proposal(topic, dataset_id, metric)
        assert families.write_configs(prop, seed=3, attempt=0) == families.write_configs(prop, seed=3, attempt=0)
        configs = {s: families.write_configs(prop, seed=s, attempt=1) for s in range(6)}
        assert len(set(configs.values())) >= 5
        parsed = parse_files(configs[0])
        code = {s: families.write_code(parsed, prop["dataset"], seed=s, attempt=1) for s in range(6)}
        assert families.write_code(parsed, prop["dataset"], seed=0, attempt=1) == code[0]
        assert len(set(code.values())) >= 5


def test_repairs_keep_the_task_id_and_family() -> None:
    for seed in range(12):
        prop = proposal(*DATA_CASES[seed % 4][:2], DATA_CASES[seed % 4][2])
        first, repaired = (parse_files(families.write_configs(prop, seed=seed, attempt=a)) for a in (0, 1))
        assert sorted(first) == sorted(repaired)
        code = [parse_files(families.write_code(repaired, prop["dataset"], seed=seed, attempt=a)) for a in (0, 1)]
        assert sorted(code[0]) == sorted(code[1])


BUG_PROPOSALS = [*((t, d, m) for t, d, m, *_ in DATA_CASES), *((t, None, "Score") for t in GAME_TOPICS.values())]


def test_first_config_drafts_carry_detectable_bugs() -> None:
    seen: dict[str | None, int] = {}
    for seed in range(50):
        prop = proposal(*BUG_PROPOSALS[seed % len(BUG_PROPOSALS)])
        bug = families.config_bug(prop, seed=seed, attempt=0)
        assert families.config_bug(prop, seed=seed, attempt=1) is None
        seen[bug] = seen.get(bug, 0) + 1
        configs = parse_files(families.write_configs(prop, seed=seed, attempt=0))
        task_path = next(p for p in configs if p.startswith("configs/tasks/"))
        _, errors = mlgym.parse_config(mlgym.TaskConfig, configs[task_path], task_path, Path(task_path).stem)
        if bug is None:
            assert not errors
            assert configs == parse_files(families.write_configs(prop, seed=seed, attempt=1))
        elif bug == "id_mismatch":
            assert len(errors) == 1 and "file name stem" in errors[0]
        else:
            assert errors and all("description" in e for e in errors)
            with pytest.raises((KeyError, ValueError, IndexError)):
                yaml.safe_load(configs[task_path])["description"].format(dataset_docs="")
    assert set(seen) == {None, "id_mismatch", "unescaped_brace"}
    assert 0.3 <= 1 - seen[None] / 50 <= 0.55


def test_first_code_drafts_carry_detectable_bugs(tmp_path: Path) -> None:
    seen: dict[str | None, int] = {}
    runtime_examples = {}
    for seed in range(50):
        prop = proposal(*BUG_PROPOSALS[seed % len(BUG_PROPOSALS)])
        configs = parse_files(families.write_configs(prop, seed=seed, attempt=1))
        bug = families.code_bug(configs, prop["dataset"], seed=seed, attempt=0)
        seen[bug] = seen.get(bug, 0) + 1
        first = parse_files(families.write_code(configs, prop["dataset"], seed=seed, attempt=0))
        clean = parse_files(families.write_code(configs, prop["dataset"], seed=seed, attempt=1))
        assert sorted(first) == sorted(clean)
        columns = set(prop["dataset"]["features"]) if prop["dataset"] else set()
        static = [e for path, src in first.items() for e in check_python(src, path) + check_columns(src, path, columns)]
        changed = [path for path in first if first[path] != clean[path]]
        if families.sloppy_evaluator(configs, prop["dataset"], seed=seed, attempt=0):
            # a sloppy evaluator is a separate slip (test_first_drafts_have_sloppy_evaluators)
            sloppy = next(p for p in changed if p.endswith("/evaluate.py"))
            changed.remove(sloppy)
            static = [e for e in static if not e.startswith(sloppy)]
        if bug is None:
            assert not changed and not static
            continue
        assert len(changed) == 1, (bug, changed)
        if bug == "missing_import":
            assert len(static) >= 1 and all("undefined name" in e for e in static)
        elif bug == "wrong_column":
            assert len(static) == 1 and "is not in the dataset" in static[0]
        else:
            assert not static
            runtime_examples.setdefault(families.spec_from_configs(configs, prop["dataset"]).family,
                                        (configs, first, prop))
    assert set(seen) == {None, "missing_import", "wrong_column", "runtime"}
    assert 0.3 <= 1 - seen[None] / 50 <= 0.55
    assert 0.08 <= seen["runtime"] / 50 <= 0.25

    # Runtime-only bugs pass every static check and still break the task when it runs.
    def fails(family: str) -> bool:
        configs, code, prop = runtime_examples[family]
        task, _ = validated(configs)
        split = hub_dataset(prop["dataset"]["id"])[1] if prop["dataset"] else None
        ws = workspace(tmp_path / family, configs, code, split)
        baseline = run(ws, task.baseline_paths[0])
        if baseline.returncode != 0:
            return True
        args = {"CSVSubmissionTasks": ["--submission_file", str(ws / "submission.csv")],
                "ModelSubmissionTasks": ["--config_fname", str(next(ws.glob("*.yaml"), ws / "missing.yaml"))]}
        return run(ws, task.evaluation_paths[0], *args.get(task.task_entrypoint, [])).returncode != 0

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(fails, sorted(runtime_examples)))


def test_first_drafts_have_sloppy_evaluators() -> None:
    """About 30% of first drafts of the families that have one (CSV, knapsack, bin packing) carry an evaluator that runs, passes every
    static check and scores the baseline, but accepts degenerate submissions; repairs never do."""
    sloppy = eligible = 0
    for seed in range(80):
        prop = proposal(*BUG_PROPOSALS[seed % len(BUG_PROPOSALS)])
        configs = parse_files(families.write_configs(prop, seed=seed, attempt=1))
        assert not families.sloppy_evaluator(configs, prop["dataset"], seed=seed, attempt=1)
        spec = families.spec_from_configs(configs, prop["dataset"])
        if spec.family == "model_submission" or (spec.game is not None and spec.game.kind not in ("knapsack",
                                                                                                  "bin_packing")):
            assert not families.sloppy_evaluator(configs, prop["dataset"], seed=seed, attempt=0)
            continue
        eligible += 1
        if not families.sloppy_evaluator(configs, prop["dataset"], seed=seed, attempt=0):
            continue
        sloppy += 1
        first = parse_files(families.write_code(configs, prop["dataset"], seed=seed, attempt=0))
        path = next(p for p in first if p.endswith("/evaluate.py"))
        if families.code_bug(configs, prop["dataset"], seed=seed, attempt=0) != "missing_import":
            assert check_python(first[path], path) == []
        clean = parse_files(families.write_code(configs, prop["dataset"], seed=seed, attempt=1))[path]
        removed = set(clean.splitlines()) - set(first[path].splitlines())
        # what a sloppy author leaves out: the id checks or the rejection of missing predictions (CSV), the
        # constraint checks on the heuristic's answer (knapsack, bin packing)
        assert any("ids 0.." in line or "missing" in line or "over the capacity" in line for line in removed)
    assert 0.15 <= sloppy / eligible <= 0.5
