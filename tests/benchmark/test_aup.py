"""AUP, Best Attempt and Best Submission (docs/scores.md) on tiny hand-computed run folders."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from gymforge.benchmark import aup
from gymforge.benchmark.aup import AupError, TaskMeta

H = 0.5 / 499  # tau step when T = 0.5 (500 points)


def write_run(root: Path, name: str, agent, baseline=None, raw: str | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    body = raw if raw is not None else json.dumps({"agent": agent, **({"baseline": baseline} if baseline else {})})
    (d / "results.json").write_text(body)
    return d


def meta(tid: str, metric: str, higher: bool = True) -> TaskMeta:
    return TaskMeta(id=tid, metric=metric, higher_is_better=higher)


def riemann_count(log_ratio: float, T: float, n: int = 500) -> int:
    """How many of the n-1 left endpoints i*T/(n-1) satisfy log_ratio <= tau (the definition, by brute force)."""
    return sum(1 for i in range(n - 1) if i * T / (n - 1) >= log_ratio)


# --- Best Attempt / Best Submission ----------------------------------------------------------------------------------


def test_best_attempt_first_on_ties_and_ignores_entries_without_metric():
    hi, lo = meta("t", "m", True), meta("t", "m", False)
    scores = [{"other": 9.0}, {"m": 1.0}, {"m": 3.0}, {"x": 1.0}, {"m": 3.0}, {"m": 2.0}]
    assert aup.best_attempt_index(scores, hi) == 2  # first of the two 3.0s
    assert aup.best_attempt(scores, hi) == 3.0
    assert aup.best_attempt_index(scores, lo) == 1
    assert aup.best_attempt(scores, lo) == 1.0
    assert aup.best_attempt([{"other": 1.0}], hi) is None
    assert aup.best_attempt([], hi) is None


def test_best_submission_is_the_last_entry():
    hi = meta("t", "m", True)
    assert aup.best_submission([{"m": 5.0}, {"m": 1.0}], hi) == 1.0  # last, even though worse
    assert aup.best_submission([{"m": 5.0}, {"other": 1.0}], hi) is None  # last entry lacks the metric
    assert aup.best_submission([], hi) is None


# --- AUP, hand-computed ----------------------------------------------------------------------------------------------


def two_task_runs(root: Path) -> None:
    # t1: A's best attempt 2.0, B = baseline = 1.0 -> ratios A 1, B 2, baseline 2; worst 2, max_tau ceil(2.1) = 3.
    write_run(root, "A__t1__r0", [{"acc": 1.5}, {"acc": 2.0}], {"acc": 1.0})
    write_run(root, "B__t1__r0", [{"acc": 1.0}], {"acc": 1.0})
    # t2: baseline 4; A 2.0 (worse than baseline) and B -1.0 (negative) infeasible -> only the baseline is feasible:
    # baseline 1, A and B 1 * 1.05; max_tau 2.
    write_run(root, "A__t2__r0", [{"acc": 2.0}], {"acc": 4.0})
    write_run(root, "B__t2__r0", [{"acc": -1.0}], {"acc": 4.0})


def test_two_task_aup_by_hand(tmp_path):
    two_task_runs(tmp_path)
    metas = {"t1": meta("t1", "acc"), "t2": meta("t2", "acc")}
    table, res = aup.score_runs(aup.load_runs(tmp_path), metas)
    assert res.models == ["A", "B", "baseline"]
    t1, t2 = res.attempt.tasks["t1"], res.attempt.tasks["t2"]
    assert t1.ratios == {"A": 1.0, "B": 2.0, "baseline": 2.0} and t1.max_tau == 3
    assert t2.ratios == pytest.approx({"A": 1.05, "B": 1.05, "baseline": 1.0}) and t2.max_tau == 2
    assert t2.status == {"A": "infeasible", "B": "infeasible", "baseline": "feasible"}
    # T = log10(3) = 0.477 rounded up -> 0.5; tau step H = 0.5/499.
    assert res.T == 0.5 and len(res.tau) == 500 and res.tau[-1] == 0.5
    # rho steps: log10(1) = 0 counts at all 499 left endpoints; log10(1.05) = 0.02119 from i = 22 (477 of them);
    # log10(2) = 0.30103 from i = 301 (198 of them). Each task is worth 1/2.
    expected = {"A": H * (499 + 477) / 2, "B": H * (198 + 477) / 2, "baseline": H * (198 + 499) / 2}
    assert [riemann_count(math.log10(r), 0.5) for r in (1, 1.05, 2)] == [499, 477, 198]
    for m, v in expected.items():
        assert res.best_aup(m) == pytest.approx(v, abs=1e-12)
        assert res.last_aup(m) == pytest.approx(v, abs=1e-12)  # one-entry runs / same last entry
    # the AUP is close to the integral sum over tasks of (T - log10 ratio) / n_tasks
    assert res.best_aup("A") == pytest.approx((0.5 + 0.5 - math.log10(1.05)) / 2, abs=H)
    # rho curve: A has 1/2 at tau = 0 and 1 at the end
    assert res.attempt.rho["A"][0] == 0.5 and res.attempt.rho["A"][-1] == 1.0


def test_csv_format(tmp_path):
    two_task_runs(tmp_path)
    out = tmp_path / "out" / "aup.csv"
    metas = {"t1": meta("t1", "acc"), "t2": meta("t2", "acc")}
    text = aup.run_aup(tmp_path, metas, out_csv=out)
    # A: 0.5*976/998 = 0.48898; baseline: 0.5*697/998 = 0.34920; B: 0.5*675/998 = 0.33818
    assert text == ("Model,Best AUP,Last AUP\n"
                    "A,0.489,0.489\n"
                    "baseline,0.349,0.349\n"
                    "B,0.338,0.338\n")
    assert out.read_text() == text
    assert not [p for p in out.parent.iterdir() if p.name != "aup.csv"]  # no temporary file left behind


def test_lower_is_better_missing_model_mlgym_names_and_last_submission(tmp_path):
    gpt = "litellm:gpt-4o"
    # sat (Time, lower is better), baseline 10.
    write_run(tmp_path, f"{gpt}__sat__default__t-0.00__p-0.95__c-4.00__install-0_run_0",
              [{"Time": 5.0}, {"other": 1.0}, {"Time": 8.0}], {"Time": 10.0})  # attempt 5, submission 8
    write_run(tmp_path, f"{gpt}__sat__default__t-0.00__p-0.95__c-4.00__install-0_run_1",
              [{"Time": 4.0}, {"other": 2.0}])  # attempt 4, submission None (last entry lacks Time)
    write_run(tmp_path / "nested" / "deeper", "student__sat__run0", [{"Time": 20.0}])  # worse than baseline
    # reg (r2, higher is better), baseline 0.25; the student has no run here (missing).
    write_run(tmp_path, f"{gpt}__reg__default_run_0", [{"r2": 0.5}], {"r2": 0.25})
    metas = {"sat": meta("sat", "Time", False), "reg": meta("reg", "r2", True)}
    runs = aup.load_runs(tmp_path, tasks=metas)
    assert {(r.model, r.task) for r in runs} == {(gpt, "sat"), ("student", "sat"), (gpt, "reg")}
    assert runs[0].run.startswith("default__t-0.00") or runs[1].run.startswith("default__t-0.00")
    table, res = aup.score_runs(runs, metas)
    sat = table.tasks["sat"].models[gpt]
    assert (sat.best_attempt, sat.best_submission) == (4.0, 8.0)
    assert [r.best_submission for r in sat.runs] == [8.0, None]
    assert table.tasks["reg"].models["student"].runs == []
    # attempt: sat best 4 -> gpt 1, baseline 10/4 = 2.5, student 2.5*1.05 = 2.625 (max_tau 3);
    #          reg best 0.5 -> gpt 1, baseline 0.5/0.25 = 2, student (missing) 2.1 (max_tau 3)
    assert res.attempt.tasks["sat"].ratios == pytest.approx({gpt: 1.0, "student": 2.625, "baseline": 2.5})
    assert res.attempt.tasks["reg"].ratios == pytest.approx({gpt: 1.0, "student": 2.1, "baseline": 2.0})
    # submission: sat best 8 -> baseline 1.25, student 1.3125 (max_tau 2)
    assert res.submission.tasks["sat"].ratios == pytest.approx({gpt: 1.0, "student": 1.3125, "baseline": 1.25})
    assert res.T == 0.5
    # counts of left endpoints with log10(ratio) <= tau (T = 0.5): 2.5 -> 101, 2.625 -> 80, 2 -> 198, 2.1 -> 177,
    # 1.25 -> 402, 1.3125 -> 381
    assert res.best_aup(gpt) == pytest.approx(0.5) and res.last_aup(gpt) == pytest.approx(0.5)
    assert res.best_aup("baseline") == pytest.approx(H * (101 + 198) / 2)
    assert res.best_aup("student") == pytest.approx(H * (80 + 177) / 2)
    assert res.last_aup("baseline") == pytest.approx(H * (402 + 198) / 2)
    assert res.last_aup("student") == pytest.approx(H * (381 + 177) / 2)
    assert [riemann_count(math.log10(r), 0.5) for r in (2.5, 2.625, 2, 2.1, 1.25, 1.3125)] == \
        [101, 80, 198, 177, 402, 381]
    summary = aup.summarize(table, res)
    json.dumps(summary)  # JSON-able
    assert summary["tasks"]["reg"]["models"]["student"]["status_attempt"] == "missing"
    assert summary["tasks"]["sat"]["models"]["student"]["status_attempt"] == "infeasible"
    assert summary["tasks"]["sat"]["baseline"] == 10.0
    assert summary["aup"][gpt] == {"best_aup": 0.5, "last_aup": 0.5}


def test_equal_scores_across_models_tie_at_ratio_one(tmp_path):
    write_run(tmp_path, "A__t__0", [{"s": 3.0}], {"s": 1.0})
    write_run(tmp_path, "B__t__0", [{"s": 3.0}], {"s": 1.0})
    _, res = aup.score_runs(aup.load_runs(tmp_path), {"t": meta("t", "s")})
    assert res.attempt.tasks["t"].ratios == {"A": 1.0, "B": 1.0, "baseline": 3.0}
    assert res.best_aup("A") == res.best_aup("B")
    # worst 3 -> max_tau ceil(3.15) = 4 -> T = 0.7 (log10 4 = 0.602); A and B count at every endpoint: AUP = T
    assert res.T == 0.7 and res.best_aup("A") == pytest.approx(0.7)


# --- T rounding ------------------------------------------------------------------------------------------------------


def test_T_rounding_exact_and_float_error():
    # the float trap: naive rounding up of 0.1 + 0.2 gives 0.4
    assert math.ceil((0.1 + 0.2) * 10) / 10 == 0.4
    assert aup.ceil_tenth(0.1 + 0.2) == 0.3
    assert aup.ceil_tenth(0.30000000000000004) == 0.3
    assert aup.ceil_tenth(0.30103) == 0.4
    assert aup.ceil_tenth(1.0000000000000002) == 1.0
    assert aup.ceil_tenth(0.0) == 0.0
    assert [aup.log10_ceil_tenth(m) for m in (1, 2, 3, 4, 10, 11, 100, 1000, 10**15)] == \
        [0.0, 0.4, 0.5, 0.7, 1.0, 1.1, 2.0, 3.0, 15.0]


def test_T_is_exactly_one_when_max_tau_is_ten(tmp_path):
    # worst ratio 9 -> 9 * 1.05 = 9.45 -> max_tau 10 -> T = log10(10) = 1.0, not 1.1
    write_run(tmp_path, "A__t__0", [{"s": 9.0}], {"s": 1.0})
    _, res = aup.score_runs(aup.load_runs(tmp_path), {"t": meta("t", "s")})
    assert res.attempt.tasks["t"].max_tau == 10
    assert res.T == 1.0 and res.tau[-1] == 1.0
    # A at ratio 1 everywhere: AUP = T; baseline at log10 9 = 0.954
    assert res.best_aup("A") == pytest.approx(1.0)
    assert res.best_aup("baseline") == pytest.approx(riemann_count(math.log10(9), 1.0) / 499)


# --- degenerate cases ------------------------------------------------------------------------------------------------


def test_division_by_zero_is_treated_as_failure():
    # higher is better, best 2 > 0: a feasible 0 has an unbounded ratio -> worst finite ratio (1) * 1.05
    r = aup.task_ratios({"A": 2.0, "B": 0.0, "baseline": 0.0}, 0.0, True)
    assert r.ratios == {"A": 1.0, "B": 1.05, "baseline": 1.05}
    assert r.status["B"] == "unbounded_ratio" and r.max_tau == 2
    # all feasible scores 0: they are all the best -> ratio 1
    r = aup.task_ratios({"A": 0.0, "baseline": 0.0}, 0.0, True)
    assert r.ratios == {"A": 1.0, "baseline": 1.0}
    # lower is better, best 0: positive scores are unbounded
    r = aup.task_ratios({"A": 0.0, "B": 2.0, "baseline": 4.0}, 4.0, False)
    assert r.ratios == {"A": 1.0, "B": 1.05, "baseline": 1.05}


def test_nothing_feasible_and_only_baseline_feasible():
    r = aup.task_ratios({"A": -1.0, "B": None, "baseline": -2.0}, -2.0, True)
    assert r.best is None and r.worst_ratio == 1.0 and r.max_tau == 2
    assert r.ratios == {"A": 1.05, "B": 1.05, "baseline": 1.05}
    assert r.status == {"A": "infeasible", "B": "no_score", "baseline": "infeasible"}
    r = aup.task_ratios({"A": 1.0, "baseline": 3.0}, 3.0, True)
    assert r.ratios == {"A": 1.05, "baseline": 1.0} and r.max_tau == 2


def test_missing_baseline_drops_the_baseline_condition(tmp_path, caplog):
    write_run(tmp_path, "A__t__0", [{"s": 1.0}])
    write_run(tmp_path, "B__t__0", [{"s": 2.0}])
    with caplog.at_level(logging.WARNING, logger="gymforge.benchmark.aup"):
        table, res = aup.score_runs(aup.load_runs(tmp_path), {"t": meta("t", "s")})
    assert "no baseline" in caplog.text
    assert res.attempt.tasks["t"].ratios == {"A": 2.0, "B": 1.0, "baseline": 2.1}
    # an explicit baseline wins over (absent) run baselines
    table = aup.build_table(aup.load_runs(tmp_path), {"t": meta("t", "s")}, baselines={"t": 1.5})
    assert table.tasks["t"].baseline == 1.5 and table.tasks["t"].baseline_source == "explicit"


def test_no_tasks_gives_T_zero_and_zero_aup():
    res = aup.compute_aup(aup.ScoreTable(models=[], tasks={}))
    assert res.T == 0.0 and len(res.tau) == 500 and res.best_aup("baseline") == 0.0
    assert aup.aup_csv(res) == "Model,Best AUP,Last AUP\nbaseline,0.000,0.000\n"


def test_explicit_task_list_counts_tasks_without_runs(tmp_path):
    write_run(tmp_path, "A__t1__0", [{"s": 2.0}], {"s": 1.0})
    metas = {"t1": meta("t1", "s"), "t2": meta("t2", "s")}
    table, res = aup.score_runs(aup.load_runs(tmp_path), metas, tasks=["t1", "t2"])
    assert res.tasks == ["t1", "t2"]
    # t2: nothing at all -> everyone 1.05; A's rho is therefore 1/2 at tau = 0
    assert res.attempt.tasks["t2"].ratios == {"A": 1.05, "baseline": 1.05}
    assert res.attempt.rho["A"][0] == 0.5


# --- loading ---------------------------------------------------------------------------------------------------------


def test_load_runs_skips_malformed_and_ignores_non_numeric(tmp_path, caplog):
    write_run(tmp_path, "A__t__ok", [{"s": 1.0, "note": "hi", "flag": True, "bad": float("nan")}, "junk"],
              {"s": 0.5, "x": "str"})
    write_run(tmp_path, "A__t__broken", None, raw="{not json")
    write_run(tmp_path, "A__t__notlist", None, raw='{"agent": 3}')
    write_run(tmp_path, "A__t__array", None, raw="[1, 2]")
    write_run(tmp_path, "A__t__noagent", None, raw='{"baseline": {"s": 0.5}}')
    write_run(tmp_path, "notarun", [{"s": 1.0}])
    write_run(tmp_path, "A__t", [{"s": 1.0}])  # no run part
    with caplog.at_level(logging.WARNING, logger="gymforge.benchmark.aup"):
        runs = aup.load_runs(tmp_path)
    assert sorted(r.run for r in runs) == ["noagent", "ok"]
    ok = next(r for r in runs if r.run == "ok")
    assert ok.scores == [{"s": 1.0}, {}] and ok.baseline == {"s": 0.5}
    assert next(r for r in runs if r.run == "noagent").scores == []
    for name in ("A__t__broken", "A__t__notlist", "A__t__array"):
        assert name in caplog.text
    # a run whose last entry is junk has no Best Submission
    assert aup.best_submission(ok.scores, meta("t", "s")) is None


def test_model_name_with_double_underscore_uses_known_tasks():
    assert aup.parse_run_name("org__model__t1__run0", ["t1"]) == ("org__model", "t1", "run0")
    assert aup.parse_run_name("org__model__t1__run0") == ("org", "model", "t1__run0")
    assert aup.parse_run_name("m.v1:q-2__t1__a__b_run_3") == ("m.v1:q-2", "t1", "a__b_run_3")
    assert aup.parse_run_name("__t1__x") is None and aup.parse_run_name("m__t1") is None


def test_run_aup_warns_about_unknown_tasks_and_errors_without_runs(tmp_path, caplog):
    write_run(tmp_path, "A__regressionKaggleHousePrice__r0", [{"r2": 0.8}], {"r2": 0.5})
    write_run(tmp_path, "A__mysteryTask__r0", [{"r2": 0.8}])
    with caplog.at_level(logging.WARNING, logger="gymforge.benchmark.aup"):
        text = aup.run_aup(tmp_path)
    assert "mysteryTask (1)" in caplog.text
    assert text.splitlines()[0] == "Model,Best AUP,Last AUP"
    assert {line.split(",")[0] for line in text.splitlines()[1:]} == {"A", "baseline"}
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(AupError, match="no runs of known tasks"):
        aup.run_aup(empty)
    with pytest.raises(AupError, match="does not exist"):
        aup.run_aup(tmp_path / "nope")


def test_mlgym_task_meta():
    metas = aup.mlgym_task_meta()
    assert len(metas) == 13
    assert metas["3SATTime"] == TaskMeta(id="3SATTime", metric="Time", higher_is_better=False)
    assert metas["imageCaptioningCOCO"].metric == "BLEU Score" and metas["imageCaptioningCOCO"].higher_is_better


def test_load_task_meta_yaml_json_and_errors(tmp_path):
    y = tmp_path / "tasks.yaml"
    y.write_text("blobClustering:\n  metric: silhouette\n  higher_is_better: true\n"
                 "fastSort:\n  metric: Time\n  higher_is_better: false\n")
    assert aup.load_task_meta(y) == {"blobClustering": meta("blobClustering", "silhouette", True),
                                     "fastSort": meta("fastSort", "Time", False)}
    j = tmp_path / "tasks.json"
    j.write_text(json.dumps({"t": {"metric": "acc", "higher_is_better": True}}))
    assert aup.load_task_meta(j) == {"t": meta("t", "acc")}
    bad = tmp_path / "bad.yaml"
    bad.write_text("good:\n  metric: a\n  higher_is_better: true\n"
                   "noDir:\n  metric: a\n"
                   "strDir:\n  metric: a\n  higher_is_better: 'true'\n"
                   "extra:\n  metric: a\n  higher_is_better: true\n  colour: red\n"
                   "scalar: 3\n"
                   "bad__id:\n  metric: a\n  higher_is_better: true\n")
    with pytest.raises(AupError) as exc:
        aup.load_task_meta(bad)
    msg = str(exc.value)
    for tid in ("noDir", "strDir", "extra", "scalar", "bad__id"):
        assert f"{bad}: task {tid!r}" in msg
    assert "'good'" not in msg
    with pytest.raises(AupError, match="non-empty mapping"):
        (tmp_path / "list.yaml").write_text("- a\n")
        aup.load_task_meta(tmp_path / "list.yaml")
    with pytest.raises(AupError, match="not valid JSON"):
        (tmp_path / "broken.json").write_text("{")
        aup.load_task_meta(tmp_path / "broken.json")
    with pytest.raises(AupError, match="cannot read"):
        aup.load_task_meta(tmp_path / "missing.yaml")
    assert aup.resolve_tasks(y)["fastSort"].higher_is_better is False
    assert len(aup.resolve_tasks("mlgym")) == 13


def test_model_named_baseline_is_rejected(tmp_path):
    write_run(tmp_path, "baseline__t__0", [{"s": 1.0}])
    with pytest.raises(AupError, match="reserved"):
        aup.build_table(aup.load_runs(tmp_path), {"t": meta("t", "s")})


# --- bootstrap intervals ---------------------------------------------------------------------------------------------


def boot_table(runs: dict[str, dict[str, list[float]]], baseline: float = 1.0) -> aup.ScoreTable:
    """model -> task -> one score per run (run k named run<k>)."""
    results = [aup.RunResult(model=m, task=t, run=f"run{k}", scores=[{"acc": v}], baseline={"acc": baseline},
                             path=Path(f"/runs/{m}__{t}__run{k}"))
               for m, tasks in runs.items() for t, values in tasks.items() for k, v in enumerate(values)]
    return aup.build_table(results, {t: meta(t, "acc") for t in next(iter(runs.values()))})


def test_bootstrap_is_seeded_and_collapses_when_runs_do_not_vary():
    table = boot_table({"A": {"t1": [2.0, 2.0, 2.0], "t2": [3.0] * 3}, "B": {"t1": [1.5] * 3, "t2": [1.0] * 3}})
    boot = aup.bootstrap_aup(table, [("A", "B")], samples=50)
    point = aup.compute_aup(table)
    for m in ("A", "B", "baseline"):
        est = boot["aup"][m]["best_aup"]["estimate"]
        assert est == pytest.approx(point.best_aup(m), abs=1e-4) and boot["aup"][m]["best_aup"]["ci"] == [est, est]
    diff = boot["differences"]["A - B"]["last_aup"]
    assert diff["estimate"] == pytest.approx(point.last_aup("A") - point.last_aup("B"), abs=1e-4) and diff["estimate"] > 0
    assert diff["ci"] == [diff["estimate"]] * 2
    assert aup.bootstrap_aup(table, [("A", "missing")], samples=5)["differences"] == {}


def test_bootstrap_interval_separates_a_clear_gain_and_not_noise():
    tasks = [f"t{i}" for i in range(6)]
    noisy = {t: [1.2, 1.6, 2.0, 2.4] for t in tasks}
    table = boot_table({"base": noisy, "same": {t: [2.4, 2.0, 1.6, 1.2] for t in tasks},
                        "better": {t: [v + 2 for v in noisy[t]] for t in tasks}})
    boot = aup.bootstrap_aup(table, [("better", "base"), ("same", "base")], samples=300, seed=1)
    assert boot == aup.bootstrap_aup(table, [("better", "base"), ("same", "base")], samples=300, seed=1)
    lo, hi = boot["differences"]["better - base"]["best_aup"]["ci"]
    assert 0 < lo <= hi
    lo, hi = boot["differences"]["same - base"]["best_aup"]["ci"]
    assert lo < 0 < hi  # the same runs in another order: nothing to tell apart
    lo, hi = boot["aup"]["base"]["best_aup"]["ci"]
    assert lo < hi <= boot["aup"]["base"]["best_aup"]["estimate"] + 1e-9  # best-of-runs leans low
    assert "better - base" in aup.render_intervals(boot) and "300 bootstrap replicates" in aup.render_intervals(boot)


def test_bootstrap_pairs_runs_by_label():
    # a student whose run k equals its base's run k: paired replicates never differ
    runs = {"t1": [1.0, 3.0, 2.0, 5.0], "t2": [4.0, 1.5, 2.5, 1.1]}
    table = boot_table({"base": runs, "copy": {t: list(v) for t, v in runs.items()}})
    diff = aup.bootstrap_aup(table, [("copy", "base")], samples=200)["differences"]["copy - base"]
    assert diff["best_aup"]["ci"] == [0.0, 0.0] and diff["last_aup"]["ci"] == [0.0, 0.0]
    # with different run labels the draws are independent and the copy's difference spreads
    unpaired = boot_table({"base": runs, "copy": {t: list(v) for t, v in runs.items()}})
    for s in unpaired.tasks["t1"].models["copy"].runs + unpaired.tasks["t2"].models["copy"].runs:
        s.run = "other-" + s.run
    lo, hi = aup.bootstrap_aup(unpaired, [("copy", "base")], samples=200)["differences"]["copy - base"]["best_aup"]["ci"]
    assert lo < 0 < hi


def test_student_pairs_from_the_configured_models():
    from gymforge.core.config import ModelSpec
    from gymforge.stages.scores import student_pairs

    models = [ModelSpec(name="teacher", source="teacher"), ModelSpec(name="sft", source="student-sft"),
              ModelSpec(name="base", source="student-base")]
    assert student_pairs(models) == [("sft", "base")]
    assert student_pairs(models[:2]) == []
