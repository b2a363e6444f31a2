"""Evaluation stage, table: Best Attempt / Best Submission per model and task, AUP (docs/scores.md) with bootstrap 95%
intervals (each model, and each student after SFT minus its base: `gymforge.benchmark.aup.bootstrap_aup`), reply quality,
plots.

Reads the per-(model, task) `EvalRecord`s the evaluation jobs wrote, so models or tasks dropped from the
config never linger in the table, whatever run folders remain on disk. Every benchmark task counts for
every model: a model without runs on a task is scored as missing (infeasible), as AUP demands.
"""

from __future__ import annotations

import json
from pathlib import Path

from gymforge.core import atomic
from gymforge.benchmark.aup import RunResult, TaskMeta, aup_csv, bootstrap_aup, render_intervals, score_runs, summarize
from gymforge.core.config import GymforgeConfig, ModelSpec
from gymforge.core.records import CheckReport
from gymforge.stages.evaluation import EvalRecord
from gymforge.benchmark.suite import load_benchmark, recorded_baseline, suite_name
from gymforge.report.score_plots import aup_bars, performance_profiles, violins
from gymforge.report.summary import write_summary


def _runs(records: dict[Path, EvalRecord]) -> list[RunResult]:
    return [RunResult(model=r.model, task=r.task_id, run=f"run{s.run}", scores=s.scores, baseline=r.baseline,
                      path=file.parent / s.folder) for file, r in records.items() for s in r.runs]


def reply_quality(records: list[EvalRecord]) -> dict[str, dict[str, float | int]]:
    """Per model: the share of well-formed replies and of runs that ended with a scored submission."""
    out: dict[str, dict[str, float | int]] = {}
    for r in records:
        m = out.setdefault(r.model, {"runs": 0, "valid_submissions": 0, "replies": 0, "malformed": 0})
        for s in r.runs:
            m["runs"] += 1
            m["valid_submissions"] += s.valid_submission
            m["replies"] += s.replies
            m["malformed"] += s.malformed
    for m in out.values():
        m["well_formed_share"] = round((m["replies"] - m["malformed"]) / m["replies"], 4) if m["replies"] else 0.0
        m["valid_submission_share"] = round(m["valid_submissions"] / m["runs"], 4) if m["runs"] else 0.0
    return out


def render(aup_text: str, quality: dict[str, dict[str, float | int]]) -> str:
    lines = [aup_text.rstrip(), "", f"{'model':<16} {'runs':>5} {'well-formed replies':>20} {'valid submissions':>18}"]
    for model, q in quality.items():
        lines.append(f"{model:<16} {q['runs']:>5} {q['well_formed_share']:>19.1%} {q['valid_submission_share']:>17.1%}")
    return "\n".join(lines)


def student_pairs(models: list[ModelSpec]) -> list[tuple[str, str]]:
    """(student after SFT, its base) for the paired intervals: every `student-sft` model against the first
    `student-base` model (both are the one configured student, `train.student`, before and after SFT)."""
    base = next((m.name for m in models if m.source == "student-base"), None)
    sft = next((m.name for m in models if m.source == "student-sft"), None)
    pairs = [(m.name, base) for m in models if m.source == "student-sft" and base is not None]
    # the RL checkpoint against the SFT student it started from (issue #16)
    return pairs + [(m.name, sft) for m in models if m.source == "student-rl" and sft is not None]


def evaluator_checks(checks: list[Path]) -> dict[str, CheckReport]:
    """The benchmark's evaluator probe reports (rule check_benchmark_task), by task id."""
    reports = [CheckReport.model_validate_json(Path(f).read_text()) for f in checks]
    return {Path(f).stem: r for f, r in zip(checks, reports, strict=True)}


def _check_summary(report: CheckReport) -> dict:
    return {"gameable": report.gameable, "probes": len(report.probes), "baseline": report.baseline,
            "gameable_probes": [{"name": p.name, "description": p.description, "score": p.score,
                                 "submission_file": p.submission_file} for p in report.gameable_probes]}


def score_table(cfg: GymforgeConfig, records: list[Path], *, aup_out: Path, scores_out: Path,
                replies_out: Path, violins_out: Path, bars_out: Path, profiles_out: Path,
                checks: list[Path] | None = None) -> str:
    benchmark = load_benchmark(cfg.evaluate)
    metas = {t.id: TaskMeta(id=t.id, metric=t.metric, higher_is_better=t.higher_is_better) for t in benchmark}
    baselines = {}
    for t in benchmark:
        recorded = recorded_baseline(t)
        if recorded and t.metric in recorded:
            baselines[t.id] = recorded[t.metric]
    loaded = {Path(f): EvalRecord.model_validate_json(Path(f).read_text()) for f in records}
    probed = evaluator_checks(list(checks or []))
    if cfg.evaluate.benchmark == "posttraining":
        # The baseline of a post-training task is its base model, which post_training.base_model may change from the
        # SmolLM2 the task records: the evaluator check's measured baseline (the base, scored in the sandbox) wins.
        baselines.update({t: r.baseline for t, r in probed.items()
                          if t in metas and r.baseline_source == "measured" and r.metric == metas[t].metric})
    gameable = [t.id for t in benchmark if t.id in probed and probed[t.id].gameable]
    excluded = gameable if cfg.evaluate.exclude_gameable else []
    runs = [r for r in _runs(loaded) if r.task not in excluded]
    tasks = [t.id for t in benchmark if t.id not in excluded]
    # the suite the scored tasks are (builtin, posttraining, mlgym, harbor, builtin + harbor), not evaluate.benchmark:
    # evaluate.tasks naming only Harbor folders scores no task of it. AUPs of different suites do not compare.
    suite = suite_name([t for t in benchmark if t.id in tasks])
    table, result = score_runs(runs, metas, tasks=tasks, baselines=baselines)
    text = aup_csv(result)
    quality = reply_quality(list(loaded.values()))
    # Intervals: run-to-run noise of each AUP and of each student's difference from its base (aup.bootstrap_aup).
    boot = bootstrap_aup(table, student_pairs(cfg.evaluate.models))
    atomic.write_text(aup_out, text)
    summary = summarize(table, result)
    for tid, entry in summary["tasks"].items():
        if tid in probed:
            entry["evaluator"] = _check_summary(probed[tid])
    evaluators = {"gameable": gameable, "excluded": excluded,
                  "checked": sorted(probed), "reports": {t: _check_summary(r) for t, r in probed.items()}}
    atomic.write_text(scores_out, json.dumps({"benchmark": suite, "benchmark_tasks": tasks, **summary,
                                              "evaluators": evaluators, "bootstrap": boot}, indent=1))
    atomic.write_text(replies_out, json.dumps(quality, indent=1))
    violins(runs, metas, violins_out, tasks=tasks, baselines=baselines)
    aup_bars(result, bars_out)
    performance_profiles(result, profiles_out)
    notes = ""
    if gameable:
        what = ("left out of AUP (evaluate.exclude_gameable)" if excluded else
                "scored as usual; evaluate.exclude_gameable: true leaves them out")
        notes = (f"\n\nGameable evaluators (a knowledge-free degenerate submission beat the baseline): "
                 f"{', '.join(gameable)}: {what}")
    head = f"{suite} benchmark: {len(tasks)} task{'' if len(tasks) == 1 else 's'} ({', '.join(tasks)})\n"
    return head + render(text, quality) + "\n\n" + render_intervals(boot) + notes


def run_summary(results: Path, html_out: Path, png_out: Path) -> Path:
    """The funnel page and figure of a results directory (shown first in `snakemake --report`)."""
    write_summary(Path(results), Path(html_out), Path(png_out))
    return Path(html_out)
