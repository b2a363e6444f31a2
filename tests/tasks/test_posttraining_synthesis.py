"""Synthesized post-training tasks (issue #25 part 2, docs/post-training.md#synthesized-post-training-tasks): the
offline teacher's post-training topics, the tasks it writes for them, and the rows gymforge renders from their
datasets when it builds them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from test_families import draft, hub_dataset, proposal, validated

from gymforge.llm.codeblocks import parse_files
from gymforge.offline import families, topics, vocabulary
from gymforge.offline.families.common import parse_facts
from gymforge.stages.generation import check_post_training_source
from gymforge.tasks import mlgym
from gymforge.tasks import posttraining as pt
from gymforge.tasks.files import TaskValidationError, validate_code_files, validate_config_files

TOPICS = [e for e in vocabulary.VOCABULARY if e.family == "post_training"]
DATASETS = {"iris": "sklearn/iris", "wine": "sklearn/wine", "breast cancer": "sklearn/breast_cancer",
            "anes96": "statsmodels/anes96", "modechoice": "statsmodels/modechoice", "spector": "statsmodels/spector"}


def pt_proposal(entry: vocabulary.VocabEntry) -> dict:
    return proposal(entry.text, DATASETS[entry.queries[0]], "accuracy")


def built(tmp: Path, prop: dict, seed: int = 0) -> tuple[Path, mlgym.TaskConfig, pt.PostTrainingSpec]:
    """The task tree as the pipeline builds it: configs and code validated, rows rendered from the split."""
    configs, code = draft(prop, seed=seed)
    bundle = validate_config_files(configs)
    columns = set(prop["dataset"]["features"])
    files = validate_code_files(bundle, code, columns)
    check_post_training_source(files, columns, bundle.task.secret_files)
    tree = tmp / "tree"
    for path, text in {**configs, **files}.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    spec = pt.spec_in(files)
    split = hub_dataset(prop["dataset"]["id"])[1]
    split.save_to_disk(str(tmp / "copy"))
    task_dir = tree / "data" / bundle.task.id
    pt.render_source(spec, tmp / "copy", task_dir / "data" / "train.jsonl", task_dir / spec.eval_file)
    return tree, bundle.task, spec


# -- templates and rows ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("template", ["{a.__class__}", "{a[0]}", "{a!r}", "{b}", "{a:{a}}", "{0}", "{}", "{a"])
def test_templates_name_columns_only(template: str) -> None:
    with pytest.raises(ValueError):
        pt.template_fields(template, ["a"])


def test_rows_skip_missing_values_and_repeated_questions() -> None:
    source = pt.PromptSource(prompt="x {a:g} y {b}?", answer="{c}")
    rows = [{"a": 1.50, "b": "p", "c": "u"}, {"a": float("nan"), "b": "p", "c": "u"}, {"a": 2.0, "b": None, "c": "v"},
            {"a": 1.5, "b": "p", "c": "w"}, {"a": 3.0, "b": "q", "c": ""}, {"a": 4.0, "b": "q", "c": "z"}]
    assert pt.render_rows(source, rows, "abc") == [{"prompt": "x 1.5 y p?", "answer": "u"},
                                                   {"prompt": "x 4 y q?", "answer": "z"}]


def test_held_out_rows_are_disjoint_from_the_pool_and_capped(tmp_path: Path) -> None:
    import datasets

    # Iris by its petals alone repeats flowers: a test flower the pool already asks about must not be held out.
    split = hub_dataset("sklearn/iris")[1]
    split.save_to_disk(str(tmp_path / "copy"))
    template = "Petals {petal_length_cm:g} by {petal_width_cm:g} cm: species?"
    test_questions = {template.format(**r) for r in datasets.load_from_disk(str(tmp_path / "copy"))["test"]}
    for cap in (10, 1000):
        spec = pt.PostTrainingSpec(eval_file="test.jsonl", source=pt.PromptSource(
            prompt=template, answer="{species}", eval_rows=cap))
        n_pool, n_held = pt.render_source(spec, tmp_path / "copy", tmp_path / "pool.jsonl", tmp_path / "test.jsonl")
        pool, held = (pt.read_rows((tmp_path / n).read_text()) for n in ("pool.jsonl", "test.jsonl"))
        assert (len(pool), len(held)) == (n_pool, n_held)
        assert [r["id"] for r in held] == list(range(n_held))
        assert not {r["prompt"] for r in pool} & {r["prompt"] for r in held}
        assert {r["answer"] for r in pool} == {"setosa", "versicolor", "virginica"}
    assert n_held == len(test_questions - {r["prompt"] for r in pool}) < 30  # every new question, and only those
    assert 10 < n_held


# -- the offline teacher ------------------------------------------------------------------------------------------


def test_post_training_topics_are_sampled_only_when_asked_for() -> None:
    asked = topics.sample(len(TOPICS), [], random.Random(0), post_training=True)
    assert {vocabulary.family_of(t) for t in asked} == {"post_training"}
    research = topics.sample(40, [], random.Random(0))
    assert "post_training" not in {vocabulary.family_of(t) for t in research}
    from gymforge.core.prompts import render

    reply = topics.answer(render("topics", n=3, seen=[], kind="post_training"), seed=1, nudged=True)
    assert {vocabulary.family_of(t) for t in json.loads(reply)} == {"post_training"}


@pytest.mark.parametrize("entry", TOPICS, ids=lambda e: e.text[:40])
def test_every_post_training_topic_makes_a_task_that_builds(entry: vocabulary.VocabEntry, tmp_path: Path) -> None:
    prop = pt_proposal(entry)
    assert families.detect_family(entry.text, prop["dataset"]) == "post_training"
    tree, task, spec = built(tmp_path, prop)
    layout = mlgym.workspace_layout(task, validated(draft(prop)[0])[1])
    loaded = pt.load(tree, task, layout)  # the kind's own checks: secret held-out file, gymforge_eval, generator
    assert loaded is not None and loaded.spec == spec
    pool = pt.read_rows(loaded.source("data/train.jsonl").read_text())
    held = pt.read_rows((tree / task.secret_files[0]).read_text())
    assert len(pool) > 50 and 10 <= len(held) <= 40
    assert "{dataset_docs}" in task.description and "final_model/" in task.description
    # what the description promises is what the rows hold: the example pool row's shape, the answer format
    style = parse_facts(task.description)["answer format"]
    if style == "json":
        assert all(json.loads(r["answer"]).keys() == {spec_target(task)} for r in pool)
    elif style == "labelled":
        assert all(r["answer"].lower().startswith(spec_target(task).replace("_", " ")) for r in pool)


def spec_target(task: mlgym.TaskConfig) -> str:
    return parse_facts(task.description)["target column"]


def test_the_same_seed_writes_the_same_task() -> None:
    prop = pt_proposal(TOPICS[0])
    assert draft(prop, seed=3) == draft(prop, seed=3)


def test_first_draft_bugs_are_caught_where_a_real_one_would_be(tmp_path: Path) -> None:
    """A misspelt column in the question template fails the build's template check (the teacher gets the error
    before anything runs); the runtime bug makes the evaluation look for a held-out file that does not exist; a
    sloppy evaluator scores an empty reply as right."""
    kinds = {}
    for entry in TOPICS:
        prop = pt_proposal(entry)
        for seed in range(40):
            configs = parse_files(families.write_configs(prop, seed=seed, attempt=1))
            bug = families.code_bug(configs, prop["dataset"], seed=seed, attempt=0)
            sloppy = families.sloppy_evaluator(configs, prop["dataset"], seed=seed, attempt=0)
            kinds.setdefault((bug, sloppy), (prop, configs, seed))
    assert {("wrong_column", False), ("runtime", False), (None, True)} <= set(kinds)

    prop, configs, seed = kinds[("wrong_column", False)]
    bundle = validate_config_files(configs)
    code = parse_files(families.write_code(configs, prop["dataset"], seed=seed, attempt=0))
    with pytest.raises(TaskValidationError, match="is not one of the dataset's columns"):
        check_post_training_source(code, set(prop["dataset"]["features"]), bundle.task.secret_files)

    prop, configs, seed = kinds[("runtime", False)]
    code = parse_files(families.write_code(configs, prop["dataset"], seed=seed, attempt=0))
    evaluate = next(t for p, t in code.items() if p.endswith("evaluate.py"))
    assert 'HELD_OUT = "test.jsonl"' not in evaluate

    prop, configs, seed = kinds[(None, True)]
    code = parse_files(families.write_code(configs, prop["dataset"], seed=seed, attempt=0))
    scope: dict = {"__file__": "evaluate.py"}
    exec(compile(next(t for p, t in code.items() if p.endswith("evaluate.py")), "evaluate.py", "exec"), scope)
    assert scope["matches"]("", "setosa") and not scope["matches"]("virginica", "setosa")


def test_a_source_must_name_a_secret_held_out_file_and_real_columns() -> None:
    spec = ("eval_file: test.jsonl\nsource:\n  prompt: 'q {a}'\n  answer: '{b}'\n")
    files = {"data/t/post_training.yaml": spec}
    check_post_training_source(files, {"a", "b"}, ["data/t/test.jsonl"])
    with pytest.raises(TaskValidationError, match="secret_files"):
        check_post_training_source(files, {"a", "b"}, [])
    with pytest.raises(TaskValidationError, match="columns"):
        check_post_training_source(files, {"a"}, ["data/t/test.jsonl"])
    with pytest.raises(TaskValidationError, match="no dataset|has none"):
        check_post_training_source(files, None, ["data/t/test.jsonl"])
