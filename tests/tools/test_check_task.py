"""`gymforge check-task`: a catalog of sloppy evaluators, each of which the probes must flag, and honest controls,
each of which must pass.

The sloppy tasks live in tests/fixtures/sloppy, an MLGym tree (configs/tasks/<id>.yaml, configs/datasets/,
data/<id>/...). Each is a small task written the way a task author commonly writes one, with a working baseline
and exactly one evaluator bug; the strict controls are the same tasks (same data, same baseline) with an
evaluator that validates. The CSVs are made by tests/fixtures/sloppy/make_data.py; the Python tasks make their
instances at import, from fixed seeds.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gymforge.core.records import CheckReport
from gymforge.tasks.probes import better
from gymforge.tools.check_task import check_task

SLOPPY = Path(__file__).parents[1] / "fixtures" / "sloppy"
MLGYM = Path(__file__).parents[1] / "fixtures" / "mlgym"

# Probe families (name prefixes, see gymforge.tasks.probes): the probes that expose each class of bug.
ROWS = ("repeat_id_", "duplicate_rows_", "missing_rows_", "unknown_ids_", "extra_rows")  # ids not matched 1:1
DUPLICATES = ("repeat_id_", "duplicate_rows_")  # one id on several rows
UNPARSED = ("nan_half_", "string_half_")  # non-numbers dropped instead of rejected
UNNORMALISED = ("probabilities_all_1",)  # each row's probabilities in [0, 1] but not a distribution
UNCHECKED_PROBABILITIES = ("probabilities_all_1", "inf_", "huge_")  # out-of-range values clipped into range
NOT_A_PERMUTATION = ("zeros", "ones", "first_repeated")  # the same element in every position
EVERYTHING = ("all_indices",)  # select every item
REPORTED = ("zeros", "ones", "negative_huge")  # a number the submission reports, not one the evaluator computes
EMPTY = ("empty",)
WRONG_SHAPE = ("short", "empty", "two_columns")


def task_yaml(task: str, root: Path = SLOPPY) -> Path:
    return root / "configs" / "tasks" / f"{task}.yaml"


def check(task: str, out: Path, root: Path = SLOPPY, **kwargs) -> CheckReport:
    return check_task(task_yaml(task, root), None, out, sandbox="local", gpus=0, **kwargs)


def case(task: str, family: tuple[str, ...], baseline: float, *, lower: bool | None = None, slow: bool = False):
    """One catalog entry: the task, the probes that may expose it, its baseline's score (pinning the fixture)
    and, where the metric's name does not say it, that lower is better (as `--direction lower` would)."""
    marks = [pytest.mark.slow] if slow else []
    return pytest.param(task, family, baseline, lower, id=task, marks=marks)


SLOPPY_CASES = [
    # CSV
    case("survivalInnerMerge", ROWS, 2 / 3),  # (1) inner merge on the id, only the row count checked (MLGym titanic)
    case("housingMergeNoCount", ROWS, 16.574027379080196),  # (2) merge, no row check: scored over the submission's rows
    case("sensorCoerce", UNPARSED, 1.0778985186229117, slow=True),  # (3) pd.to_numeric(errors="coerce") + dropna
    case("flowersLogLoss", UNNORMALISED, 0.11476726650347213, slow=True),  # (4) rows never checked to sum to 1
    case("flowersLogLossClip", UNCHECKED_PROBABILITIES, 0.11476726650347213, slow=True),  # (4') only clipped
    case("demandDuplicates", DUPLICATES, 9.198565590707252),  # (5) row count and unknown ids checked, duplicates not
    # Python
    case("tourPermutation", NOT_A_PERMUTATION, 3.448619830939969),  # (6) tour length checked, not a permutation
    case("colouringImproper", NOT_A_PERMUTATION, 25 / 6, lower=True),  # (7) colouring never checked to be proper
    case("knapsackCapacity", EVERYTHING, 297.3333333333333),  # (8) capacity never checked
    case("scheduleReportedCost", REPORTED, 50.0, lower=True),  # (9) the makespan the submission reports is trusted
    case("rootsEmptyOutput", EMPTY, 8.317778337563197e-06),  # (10) zip() over an empty answer scores 0
    # Model
    case("windTruncate", WRONG_SHAPE, 430.6727374374134),  # (11) scored over min(len(predictions), len(truth)) rows
    case("windZip", WRONG_SHAPE, 430.6727374374134),  # (11') zip() over the predictions, mean guarded by max(1, n)
]


@pytest.mark.parametrize(("task", "family", "baseline", "lower"), SLOPPY_CASES)
def test_sloppy_evaluator_is_flagged(task: str, family: tuple[str, ...], baseline: float, lower: bool | None,
                                     tmp_path: Path) -> None:
    report = check(task, tmp_path, stop_at_first=True, higher_is_better=None if lower is None else not lower)
    assert report.task_id == task and report.baseline_source == "measured"
    assert report.baseline == pytest.approx(baseline, rel=1e-6)  # the baseline ran and scored as the fixture intends
    if lower is not None:
        assert report.higher_is_better is not lower
    summary = [(o.name, o.score, o.rejected) for o in report.probes]
    assert report.gameable, summary
    # stop_at_first: the last probe is the one gameable probe, and it belongs to the bug's family
    [probe] = report.gameable_probes
    assert probe is report.probes[-1]
    assert probe.name.startswith(family), summary
    assert probe.rejected is None and probe.score is not None and math.isfinite(probe.score)
    assert better(probe.score, report.baseline, report.higher_is_better)
    assert probe.submission and probe.submission_file


def control(root: Path, task: str, baseline: float, *, lower: bool | None = None, rejects: bool = True,
            slow: bool = False):
    """One honest control; `rejects`: some applicable probe must be refused (else every probe is valid and merely
    scores worse)."""
    marks = [pytest.mark.slow] if slow else []
    return pytest.param(root, task, baseline, lower, rejects, id=f"{root.name}-{task}", marks=marks)


HONEST_CASES = [
    # the sloppy tasks' strict twins: same data, same baseline (so the same score), a validating evaluator
    control(SLOPPY, "survivalStrict", 2 / 3, slow=True),
    control(SLOPPY, "flowersLogLossStrict", 0.11476726650347213, slow=True),
    control(SLOPPY, "tourStrict", 3.448619830939969),
    control(SLOPPY, "scheduleStrict", 50.0, lower=True),
    control(SLOPPY, "windStrict", 430.6727374374134),
    # the MLGym fixtures with a baseline (lmTiny needs GPUs and has no battery)
    control(MLGYM, "csvTiny", 4.530212576758954),
    control(MLGYM, "stagHuntDuel", 2.755),
    # modelTiny's artefact is a YAML of polynomial coefficients: every probe (the coefficients set to 0 or to
    # +-1e12) is a valid polynomial, which its evaluator rightly scores, and worse; there is nothing to reject.
    control(MLGYM, "modelTiny", 2.0813, rejects=False),
]


@pytest.mark.parametrize(("root", "task", "baseline", "lower", "rejects"), HONEST_CASES)
def test_honest_evaluator_passes(root: Path, task: str, baseline: float, lower: bool | None, rejects: bool,
                                 tmp_path: Path) -> None:
    report = check(task, tmp_path, root, higher_is_better=None if lower is None else not lower)
    summary = [(o.name, o.score, o.rejected) for o in report.probes]
    assert report.baseline_source == "measured" and report.baseline == pytest.approx(baseline, rel=1e-6)
    assert not report.gameable, summary
    assert report.gameable_probes == []
    assert report.probes, "no probe was built"
    for o in report.probes:  # each probe rejected (or not applicable), or scored no better than the baseline
        assert o.rejected is not None or not better(o.score, report.baseline, report.higher_is_better), o
    rejected = [o.name for o in report.probes if o.rejected and o.applicable]
    assert bool(rejected) is rejects, summary


def test_fixture_data_is_reproducible(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SLOPPY / "make_data.py"), str(tmp_path)], check=True, timeout=60)
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.csv"))
    assert made and made == sorted(p.relative_to(SLOPPY / "data") for p in (SLOPPY / "data").rglob("*.csv"))
    for rel in made:
        assert (tmp_path / rel).read_bytes() == (SLOPPY / "data" / rel).read_bytes(), rel


# ---- where the direction and the model's path come from -----------------------------------------------------


def test_direction_is_read_from_the_task_when_the_name_does_not_say(tmp_path: Path) -> None:
    report = check("scheduleStrict", tmp_path)
    assert report.higher_is_better is False
    assert not report.gameable


def test_model_probes_follow_a_config_relative_model_path(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    shutil.copytree(SLOPPY, root)
    baseline = root / "data" / "wind" / "baseline.py"
    text = baseline.read_text()
    text = text.replace('with open("model.pkl", "wb")', 'os.makedirs("configs", exist_ok=True)\nwith open("configs/model.pkl", "wb")')
    text = text.replace('with open("config.yaml", "w")', 'with open("configs/wind.yaml", "w")')
    baseline.write_text("import os\n" + text)
    report = check("windZip", tmp_path / "out", root, stop_at_first=True)
    assert report.baseline == pytest.approx(430.6727374374134, rel=1e-6)  # the baseline itself is fine
    assert report.gameable, [(o.name, o.score, o.rejected) for o in report.probes]


# ---- the command ---------------------------------------------------------------------------------------------


def gymforge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "gymforge"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "gymforge.cli"]
    # cwd: a directory without a config.yaml, so the command runs on the defaults
    return subprocess.run([*argv, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_cli_exit_status_and_json_report(tmp_path: Path) -> None:
    sloppy = gymforge("check-task", str(task_yaml("tourPermutation")), "--root", str(SLOPPY), "--json",
                      str(tmp_path / "sloppy.json"), "--out", str(tmp_path / "run-sloppy"), "--gpus", "0", cwd=tmp_path)
    assert sloppy.returncode == 1, sloppy.stdout + sloppy.stderr
    assert "tourPermutation is gameable" in sloppy.stderr
    assert "GAMEABLE" in sloppy.stdout and "zeros" in sloppy.stdout

    raw = json.loads((tmp_path / "sloppy.json").read_text())
    report = CheckReport.model_validate(raw)
    assert raw["gameable"] is True and report.task_id == "tourPermutation" and report.metric == "tour_distance"
    assert report.higher_is_better is False and report.baseline == pytest.approx(3.448619830939969, rel=1e-6)
    assert len(report.probes) > 1  # the command runs the whole battery
    flagged = {p["name"]: p for p in raw["probes"] if p["gameable"]}
    assert flagged and set(flagged) <= set(NOT_A_PERMUTATION)
    zeros = flagged["zeros"]
    assert zeros["submission_file"] == "tour.py"  # the submission it wrote, and what it began with
    assert zeros["submission"].startswith('"""gymforge evaluator probe: solve return')  # the wrapper around solve()
    assert zeros["score"] == 0.0 and zeros["metrics"] == {"tour_distance": 0.0} and zeros["rejected"] is None
    assert any(p["rejected"] and p["applicable"] for p in raw["probes"])

    honest = gymforge("check-task", str(task_yaml("tourStrict")), "--root", str(SLOPPY), "--json",
                      str(tmp_path / "honest.json"), "--out", str(tmp_path / "run-honest"), "--gpus", "0", cwd=tmp_path)
    assert honest.returncode == 0, honest.stdout + honest.stderr
    assert "tourStrict: every probe rejected or no better than the baseline" in honest.stdout
    report = CheckReport.model_validate_json((tmp_path / "honest.json").read_text())
    assert not report.gameable and any(p.rejected and p.applicable for p in report.probes)
    assert report.coherence is not None and "coherence:" in honest.stdout  # the report's coherence section
    assert {"placeholder", "metric", "direction", "data"} <= set(report.coherence.checked)


def test_cli_direction_flag(tmp_path: Path) -> None:
    """`--direction lower` is how a user checks a task whose metric's name does not say which way is better."""
    run = gymforge("check-task", str(task_yaml("colouringImproper")), "--direction", "lower", "--out",
                   str(tmp_path / "run"), "--gpus", "0", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "lower is better" in run.stdout and "colouringImproper is gameable" in run.stderr


# ---- the built-in suite: honest controls --------------------------------------------------------------------


def _builtin_tasks():
    from gymforge.benchmark.suite import load_benchmark
    from gymforge.core.config import GymforgeConfig

    return {t.id: t for t in load_benchmark(GymforgeConfig().evaluate)}


@pytest.mark.parametrize("task_id", sorted(_builtin_tasks()))
def test_builtin_suite_evaluators_pass(task_id: str, tmp_path: Path) -> None:
    task = _builtin_tasks()[task_id]
    report = check_task(task.task_yaml, task.root, tmp_path, sandbox="local", gpus=0)
    assert (report.metric, report.higher_is_better) == (task.metric, task.higher_is_better)
    assert report.coherence.coherent, report.coherence.findings  # its text says what it scores
    assert report.probes and not report.gameable, [(p.name, p.score) for p in report.gameable_probes]


# ---- every task a run verifies: probed in verification, and passes check-task ---------------------------------


@pytest.mark.slow
@pytest.mark.timeout(2400)  # may build the session's finished run (tests/finished_run.py)
def test_every_task_the_run_verifies_passes_the_probes(finished_run: Path, tmp_path: Path) -> None:
    from gymforge.core.records import VerificationReport

    reports = [VerificationReport.model_validate_json(p.read_text())
               for p in sorted((finished_run / "results" / "environments").glob("t*/report.json"))]
    verified = [r for r in reports if r.status == "ok"]
    assert verified
    for r in verified:
        last = r.iterations[-1]
        assert last.probes and not any(p.gameable for p in last.probes), r.item
        assert r.metric is not None and "probes" in last.timings_s
    first = verified[0]
    tree = finished_run / "results" / "environments" / first.item / "verified" / "mlgym"
    report = check_task(next((tree / "configs" / "tasks").glob("*.yaml")), tree, tmp_path, sandbox="local", gpus=0,
                        hidden_columns=first.hidden_columns, metric=first.metric,
                        higher_is_better=first.higher_is_better)
    assert not report.gameable and len(report.probes) >= len(first.iterations[-1].probes)
