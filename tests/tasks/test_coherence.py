"""The coherence check (gymforge.tasks.coherence): each kind of contradiction between a task's text and what it does
is flagged, and its coherent twin passes; a submission written as the text says is scored by the real evaluator;
the offline teacher's drafts slip and its repairs do not."""

import json
import re

import pytest
import yaml

from gymforge.core.records import CoherenceReport
from gymforge.offline import families
from gymforge.offline.coherence import verdict
from gymforge.tasks.coherence import (
    check_data,
    check_metric,
    check_placeholders,
    check_python_submission,
    check_submission_format,
    parse_verdict,
    submission_statement,
)
from gymforge.tasks.metrics import canonical_metric, same_metric
from gymforge.tasks.mlgym import DatasetConfig

CFG = "configs/tasks/t.yaml"
HEADER, ROWS = ["id", "species"], [["0", "setosa"], ["1", "virginica"]]
IRIS = [DatasetConfig(name="irisData", description="Iris flowers.\n\nSource: sklearn/iris, a local copy.",
                      data_path="data/t/data", is_local=True)]
INSTALLED = {"splits": ["train", "test"], "columns": {"train": ["sepal_length", "species"], "test": ["sepal_length"]}}


def kinds(findings) -> list[str]:
    return [f.kind for f in findings]


def metric_findings(text: str, printed=("rmse",), higher_is_better=False, metric="rmse", recorded=()):
    return kinds(check_metric(text, {p: 1.0 for p in printed}, [dict.fromkeys(recorded, 1.0)] if recorded else [],
                              metric, higher_is_better, CFG, "evaluate.py"))


def test_metric_names_mean_the_same_whatever_the_spelling():
    assert canonical_metric("macro-averaged F1") == canonical_metric("Macro_F1") == "macro_f1"
    assert canonical_metric("root mean squared error") == canonical_metric("RMSE") == "rmse"
    assert canonical_metric("mean absolute error") == "mae" and canonical_metric("log loss") == "log_loss"
    assert same_metric("F1", "macro_f1") and not same_metric("accuracy", "macro_f1")
    assert canonical_metric("Reward Mean") == "reward_mean"  # unknown names stay themselves


@pytest.mark.parametrize("incoherent, coherent", [
    ("Your model is scored by mean absolute error on the test split.",
     "Your model is scored by root mean squared error on the test split."),
    ("Task facts:\n- metric: mae (lower is better)", "Task facts:\n- metric: rmse (lower is better)"),
    ('The scorer prints one JSON object such as {{"mae": 0.5}}.', 'The scorer prints one JSON object such as '
     '{{"rmse": 0.5}}.'),
])
def test_a_metric_the_evaluation_does_not_print_is_flagged(incoherent, coherent):
    assert metric_findings(incoherent) == ["metric"]
    assert metric_findings(coherent) == []


def test_a_percentage_where_the_evaluation_prints_a_fraction_is_flagged():
    assert metric_findings("Your score will be the accuracy percentage.", printed=("accuracy",), metric="accuracy",
                           higher_is_better=True) == ["metric"]
    assert metric_findings("Your score will be the accuracy, a fraction.", printed=("accuracy",), metric="accuracy",
                           higher_is_better=True) == []


def test_a_sentence_that_contrasts_the_printed_metric_with_another_is_no_claim():
    assert metric_findings("Predictions are scored by RMSE (lower is better), not by MAE.") == []


def test_recorded_baseline_scores_and_the_declared_metric_must_be_printed():
    assert metric_findings("", recorded=("mae",)) == ["metric"]
    assert metric_findings("", recorded=("rmse",)) == []
    assert metric_findings("", metric="mae") == ["metric"]


def test_a_direction_against_the_declared_one_is_flagged():
    assert metric_findings("Task facts:\n- metric: rmse (higher is better)") == ["direction"]
    assert metric_findings("Task facts:\n- metric: rmse (lower is better)") == []
    # the declaration itself: RMSE ranked higher-better contradicts what RMSE is
    assert metric_findings("", higher_is_better=True) == ["direction"]
    assert metric_findings("", printed=("accuracy",), metric="accuracy", higher_is_better=True) == []


STATEMENT = ("Write a prediction for every test row to `{file}`. Task facts:\n- submission: submission.csv with "
             "columns {columns}; one row per test row, where id is the row's {base} position in the test split")


def format_findings(file="submission.csv", columns="id, species", base="0-based"):
    text = STATEMENT.format(file=file, columns=columns, base=base)
    return kinds(check_submission_format(submission_statement(text, set()), "submission.csv", HEADER, ROWS, CFG))


@pytest.mark.parametrize("change, kind", [({"file": "predictions.csv"}, "file_name"),
                                          ({"columns": "id, label"}, "columns"),
                                          ({"columns": "species, id"}, "columns"),
                                          ({"base": "1-based"}, "id_base")])
def test_a_submission_format_the_evaluation_does_not_accept_is_flagged(change, kind):
    assert format_findings(**change) == [kind]
    assert format_findings() == []


@pytest.mark.parametrize("incoherent, coherent, kind", [
    ("Task facts:\n- submission: strategy.py defining row_strategy(history) returning your next move",
     "Task facts:\n- submission: player.py defining row_strategy(history) returning your next move", "file_name"),
    ("Modify the `next_move(history)` function in `player.py`.",
     "Modify the `row_strategy(history)` function in `player.py`.", "submission"),
])
def test_a_python_submission_the_task_does_not_have_is_flagged(tmp_path, incoherent, coherent, kind):
    (tmp_path / "player.py").write_text("def row_strategy(history):\n    return 0\n")
    evaluator = "from player import row_strategy\n"
    assert kinds(check_python_submission(incoherent, tmp_path, evaluator, CFG)) == [kind]
    assert check_python_submission(coherent, tmp_path, evaluator, CFG) == []


def data_findings(text: str, dataset_id="sklearn/iris"):
    return kinds(check_data(text, IRIS, INSTALLED, {"species"}, dataset_id, CFG))


@pytest.mark.parametrize("incoherent, coherent, kind", [
    ("Classify flowers of the `sklearn/wine` dataset.", "Classify flowers of the `sklearn/iris` dataset.",
     "dataset"),
    ("The data has splits `train` and `validation`.", "The data has splits `train` and `test`.", "split"),
    ("Task facts:\n- target column: label", "Task facts:\n- target column: species", "target"),
    ("Predict the column `petal_colour` from the others.", "Predict the column `species` from the others.",
     "target"),
])
def test_data_the_task_does_not_install_is_flagged(incoherent, coherent, kind):
    assert data_findings(incoherent) == [kind]
    assert data_findings(coherent) == []


def test_an_unrendered_placeholder_is_flagged_but_dataset_docs_and_escaped_braces_are_not():
    assert kinds(check_placeholders("Predict {target} from the rest.\n\n{dataset_docs}", CFG)) == ["placeholder"]
    assert kinds(check_placeholders("Predict {{ target }} from the rest.", CFG)) == ["placeholder"]
    assert check_placeholders('Predict species.\n\n{dataset_docs}\n\nA row: {{"id": 0}}.', CFG) == []


@pytest.mark.parametrize("incoherent, coherent", [
    ("Predictions are scored by the average absolute difference from the true value.",
     "Predictions are scored by the square root of the mean squared difference from the true value."),
    ("The evaluation reports rmse: the larger the value, the better.",
     "The evaluation reports rmse: the smaller the value, the better."),
])
def test_the_offline_teacher_reads_what_the_rules_cannot(incoherent, coherent):
    facts = {"printed": {"rmse": 1.0}, "metric": "rmse", "higher_is_better": False}
    assert metric_findings(incoherent) == []  # nothing the rules can read
    found = verdict(incoherent, facts)
    assert not found["coherent"] and found["contradictions"][0]["sentence"]
    assert verdict(coherent, facts) == {"coherent": True, "contradictions": []}


def test_a_verdict_without_the_promised_shape_is_refused():
    with pytest.raises(ValueError):
        parse_verdict({"coherent": False, "contradictions": []}, CFG)
    with pytest.raises(ValueError):
        parse_verdict({"verdict": "fine"}, CFG)
    state, found = parse_verdict({"coherent": False, "contradictions": [
        {"kind": "metric", "sentence": "s", "states": "mae", "actual": "rmse"}]}, CFG)
    assert state == "incoherent" and found[0].by == "teacher"


def test_the_evidence_names_sentence_value_and_file():
    from gymforge.core.records import CoherenceFinding

    report = CoherenceReport(coherent=False, findings=[CoherenceFinding(
        kind="metric", evidence="The evaluation reports mae.", stated="mae", actual="the evaluation prints rmse",
        file=CFG)])
    text = report.evidence()
    assert "The evaluation reports mae." in text and "'mae'" in text and "rmse" in text and CFG in text


def _description(reply: str) -> str:
    block = re.search(r"```yaml\n# configs/tasks/\S+\n(.*?)```", reply, re.S)
    return yaml.safe_load(block.group(1))["description"]


def test_offline_drafts_slip_at_a_realistic_rate_and_repairs_do_not(proposals_for_coherence):
    slipped = drafts = 0
    for proposal in proposals_for_coherence:
        for seed in range(12):
            drafts += 1
            first = _description(families.write_configs(proposal, seed=seed, attempt=0))
            repair = _description(families.write_configs(proposal, seed=seed, attempt=1))
            facts = {"printed": {families.parse_facts(first)["metric"].split(" ")[0]: 1.0}}
            drift = families.metric_drift(proposal, seed=seed, attempt=0)
            slipped += bool(metric_findings(first, printed=facts["printed"], metric=None, higher_is_better=None))
            if not drift:
                assert not metric_findings(first, printed=facts["printed"], metric=None, higher_is_better=None)
            printed = {families.parse_facts(repair)["metric"].split(" ")[0]: 1.0}
            assert not metric_findings(repair, printed=printed, metric=None, higher_is_better=None)
    assert 0.1 <= slipped / drafts <= 0.5, (slipped, drafts)


@pytest.fixture(scope="module")
def proposals_for_coherence():
    """Regression and classification proposals as the pipeline's proposer words them ("mae (lower is better)")."""
    out = []
    for name, metric, target, dtype in (("sklearn/diabetes", "mae (lower is better)", "progression", "float64"),
                                        ("sklearn/iris", "macro_f1 (higher is better)", "species", "string")):
        dataset = {"id": name, "description": f"The {name} data.", "is_local": True, "splits": {"train": 100},
                   "features": {"x1": "float64", "x2": "float64", target: dtype},
                   "example_rows": [{"x1": 0.1, "x2": 0.2, target: 1.0 if dtype == "float64" else "setosa"}],
                   "card_data": {"target": target}}
        kind = "regression model" if dtype == "float64" else "classifier"
        description = (f"Build a {kind} on the `{name}` dataset. The evaluation reports {metric} on held-out labels.")
        out.append({"topic": f"{target} {'regression' if dtype == 'float64' else 'classification'}",
                    "metric": metric, "description": description, "dataset": dataset})
    return out


def test_prompts_carry_the_metric_forward():
    from gymforge.core.prompts import render

    configs = render("write_configs", proposal_json=json.dumps({"metric": "mae (lower is better)"}),
                     has_dataset=False, local_data=False, entrypoints=["CSVSubmissionTasks"],
                     metric="mae (lower is better)")
    assert "`mae (lower is better)`" in configs and "rewrite every" in configs


def test_verification_ranks_by_the_printed_metric_in_the_direction_the_task_states():
    """A proposal's direction is about its own metric: a bin-packing proposal minimises bins used, its task prints a
    Score ratio that its text says is higher-better (the probes compared it lower-better before)."""
    from gymforge.stages.verification import proposal_metric

    text = "The evaluation reports mean number of bins used.\n\nTask facts:\n- metric: Score (higher is better)"
    assert proposal_metric("mean number of bins used (lower is better)", {"Score": 0.9}, text) == ("Score", True)
    assert proposal_metric("rmse (lower is better)", {"rmse": 2.0}, "") == ("rmse", False)
    assert proposal_metric("macro-averaged F1 (higher is better)", {"macro_f1": 0.5}, "") == ("macro_f1", True)
    assert proposal_metric("mae (lower is better)", {"r2": 0.5}, "") == ("r2", True)  # the name says so
