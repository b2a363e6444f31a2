"""Benchmark runs (stage 3.8): MLGym run folders, resume, reply quality, the score table and `gymforge aup`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gymforge import cli
from gymforge.core.config import GymforgeConfig
from gymforge.sandbox import local
from gymforge.stages.evaluation import EvalRecord, check_benchmark_task, evaluate_task
from gymforge.stages.scores import score_table

TASK = "graphColoring"


def make_cfg(tmp_path: Path, **evaluate) -> GymforgeConfig:
    return GymforgeConfig.model_validate({
        "results_dir": str(tmp_path / "results"), "cache_dir": str(tmp_path / "cache"),
        "train": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
                           "intermediate_size": 64}},
        "evaluate": {"runs_per_task": 2, "max_steps": 8, "concurrency": 2, "tasks": [TASK],
                     "serving": {"max_new_tokens": 32}, **evaluate},
    })


def record_path(cfg: GymforgeConfig, model: str) -> Path:
    return cfg.results / "scores" / "runs" / model / f"{TASK}.json"


@pytest.mark.slow
def test_teacher_runs_are_mlgym_run_folders_and_resume(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    out = record_path(cfg, "teacher")
    record = evaluate_task(cfg, "teacher", TASK, [0, 1], out)
    assert [r.run for r in record.runs] == [0, 1] and record.resumed == 0
    for run in record.runs:
        folder = out.parent / run.folder
        assert folder.name == f"teacher__{TASK}__run{run.run}"
        results = json.loads((folder / "results.json").read_text())
        assert results["agent"] == run.scores and "colors" in results["baseline"]
        assert (folder / f"{TASK}.traj").exists()
        assert run.valid_submission and run.replies >= run.steps
    assert record.runs[0].seed != record.runs[1].seed

    # One more run: the two finished ones are reused, not rerun.
    again = evaluate_task(cfg, "teacher", TASK, [0, 1, 2], out)
    assert again.resumed == 2 and [r.run for r in again.runs] == [0, 1, 2]
    assert again.runs[:2] == record.runs

    # `gymforge aup` reads the same folders with the suite's task metadata.
    meta = tmp_path / "tasks.yaml"
    meta.write_text(f"{TASK}: {{metric: colors, higher_is_better: false}}\n")
    csv = tmp_path / "aup.csv"
    cli.main(["aup", str(cfg.results / "scores" / "runs"), "--tasks", str(meta), "--out", str(csv)])
    rows = csv.read_text().splitlines()
    assert rows[0] == "Model,Best AUP,Last AUP"
    assert {r.split(",")[0] for r in rows[1:]} == {"teacher", "baseline"}


@pytest.mark.slow
def test_an_untrained_student_is_served_and_scored(tmp_path: Path) -> None:
    from gymforge.student.base import build_base
    from gymforge.student.tokenizer import train_offline_tokenizer

    cfg = make_cfg(tmp_path, models=[{"name": "student-base", "source": "student-base"}])
    tokenizer = train_offline_tokenizer(["DISCUSSION\nrun it\n```\nls\n```", "colour the graph"] * 20, vocab_size=300)
    tokenizer.save_pretrained(str(tmp_path / "tokenizer"))
    base = build_base(cfg, tmp_path / "tokenizer", tmp_path / "base")
    out = record_path(cfg, "student-base")
    record = evaluate_task(cfg, "student-base", TASK, [0, 1], out, checkpoint=str(base))
    assert record.served_as.startswith("student-base-")
    # A random model never writes one discussion and one command: every run ends at the format limit,
    # after the first reply and its two re-asks, and the auto-submission still scores the untouched artefact.
    for run in record.runs:
        assert run.exit_status == "autosubmission (format)"
        assert (run.replies, run.malformed, run.steps) == (3, 3, 0)

    text = score_table(cfg, [out], aup_out=tmp_path / "aup.csv", scores_out=tmp_path / "scores.json",
                       replies_out=tmp_path / "replies.json", violins_out=tmp_path / "v.png",
                       bars_out=tmp_path / "b.png", profiles_out=tmp_path / "p.png")
    quality = json.loads((tmp_path / "replies.json").read_text())["student-base"]
    assert quality["well_formed_share"] == 0.0 and quality["runs"] == 2
    assert "student-base" in text and (tmp_path / "v.png").stat().st_size > 0
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert set(scores["models"]) == {"student-base", "baseline"}
    assert EvalRecord.model_validate_json(out.read_text()).runs == record.runs


def test_teacher_identity_is_in_the_resume_fingerprint_of_teacher_runs_only(tmp_path: Path) -> None:
    from gymforge.core.plan import model_spec
    from gymforge.stages.evaluation import fingerprint

    task_yaml = tmp_path / "task.yaml"
    task_yaml.write_text("id: t\n")
    cfg = make_cfg(tmp_path)
    other = cfg.model_copy(update={"llm": cfg.llm.model_copy(update={"teacher": cfg.llm.teacher.model_copy(
        update={"model": "another-teacher"})})})
    for name in ("teacher", "student-base", "student-sft"):
        spec = model_spec(cfg, name)
        same = fingerprint(cfg, spec, task_yaml, name) == fingerprint(other, spec, task_yaml, name)
        assert same == (name != "teacher"), name


def test_an_endpoint_models_runs_rerun_when_the_reply_length_it_borrows_from_the_teacher_changes() -> None:
    """An `endpoint` model replies with llm.teacher.max_tokens (stages.evaluation._client): the eval_runs param and
    resume fingerprint (teacher_identity) carry it, and nothing else of llm.teacher."""
    from gymforge.core.config import ModelSpec
    from gymforge.core.plan import teacher_identity

    spec = ModelSpec(name="api", source="endpoint", model="m", base_url="http://127.0.0.1:1/v1")
    base = GymforgeConfig()
    longer = GymforgeConfig.model_validate({"llm": {"teacher": {"max_tokens": 123}}})
    other_model = GymforgeConfig.model_validate({"llm": {"teacher": {"model": "another-teacher"}}})
    assert teacher_identity(base, spec) != teacher_identity(longer, spec)
    assert teacher_identity(base, spec) == teacher_identity(other_model, spec)


@pytest.mark.slow
@pytest.mark.timeout(2400)  # may build the session's finished run (tests/finished_run.py)
def test_changing_the_teacher_model_reruns_exactly_the_teachers_benchmark_runs(finished_run: Path) -> None:
    """On a finished run, `snakemake -n` with another `llm.teacher.model` plans the teacher's eval_runs jobs because
    their params changed, and no other eval_runs job: the students' runs are up to date. Upstream rules are held
    back (`--allowed-rules eval_runs`): the topics and everything after them depend on the teacher too, so the full
    plan reruns every job, and Snakemake then names only the first reason (inputs rebuilt)."""
    from finished_run import TINY, snakemake

    records = sorted(str(p.relative_to(finished_run)) for p in (finished_run / "results" / "scores" / "runs").glob("*/*.json"))
    assert len(records) == 6  # 3 models x 2 tasks
    proc = snakemake(finished_run, "-n", *records)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-2000:]

    other = [*TINY, "llm={teacher: {model: another-teacher}}"]
    proc = snakemake(finished_run, "-n", *records, "--allowed-rules", "eval_runs", config=other)  # nargs: targets first
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    planned = sorted(re.findall(r"^\s*output: (results/scores/runs/\S+\.json)", out, re.M))
    assert planned == [r for r in records if "/teacher/" in r], out[-3000:]
    assert "Params have changed since last execution" in out


def _records(tmp_path: Path, cfg: GymforgeConfig, tasks: dict[str, float]) -> list[Path]:
    """One teacher record per task, each with one submitted run of the given score (no run folders needed)."""
    from gymforge.benchmark.suite import load_benchmark
    from gymforge.stages.evaluation import RunSummary

    metrics = {t.id: t.metric for t in load_benchmark(cfg.evaluate)}
    paths = []
    for task, score in tasks.items():
        run = RunSummary(run=0, seed=1, folder=f"teacher__{task}__run0", exit_status="submitted",
                         scores=[{metrics[task]: score}], replies=2, malformed=0, steps=2, valid_submission=True,
                         wall_s=1.0)
        path = tmp_path / "runs" / "teacher" / f"{task}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(EvalRecord(item=f"teacher/{task}", status="ok", model="teacher", task_id=task,
                                   fingerprint="f", runs=[run]).model_dump_json())
        paths.append(path)
    return paths


def _check(tmp_path: Path, task: str, gameable: bool) -> Path:
    from gymforge.core.records import CheckReport, ProbeOutcome

    probe = ProbeOutcome(name="empty", kind="python", description="empty answers", submission_file="coloring.py",
                         submission="...", score=0.0, metrics={"colors": 0.0}, gameable=gameable)
    path = tmp_path / "checks" / f"{task}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(CheckReport(task_id=task, entrypoint="PythonSubmissionTasks", metric="colors",
                                higher_is_better=False, baseline=5.0, baseline_source="measured", probes=[probe],
                                gameable=gameable).model_dump_json())
    return path


@pytest.mark.parametrize("exclude", [False, True])
def test_a_gameable_benchmark_task_is_reported_beside_its_aup_or_excluded(tmp_path: Path, exclude: bool) -> None:
    tasks = {TASK: 4.0, "signalDenoising": 0.05}
    cfg = make_cfg(tmp_path, tasks=list(tasks), exclude_gameable=exclude)
    checks = [_check(tmp_path, TASK, gameable=True), _check(tmp_path, "signalDenoising", gameable=False)]
    scores_out = tmp_path / "results" / "scores" / "scores.json"
    text = score_table(cfg, _records(tmp_path, cfg, tasks), aup_out=tmp_path / "aup.csv",
                       scores_out=scores_out, replies_out=tmp_path / "replies.json",
                       violins_out=tmp_path / "v.png", bars_out=tmp_path / "b.png", profiles_out=tmp_path / "p.png",
                       checks=checks)
    scores = json.loads(scores_out.read_text())
    assert scores["evaluators"]["gameable"] == [TASK]
    # the run report's section: the task, the probe that gamed it and its score, beside its AUP contribution
    from gymforge.report.summary import evaluators_html

    page = evaluators_html(tmp_path / "results")
    assert TASK in page and "empty (0)" in page
    assert ("left out of AUP" in page) == exclude
    assert f"Gameable evaluators (a knowledge-free degenerate submission beat the baseline): {TASK}" in text
    if exclude:
        assert scores["evaluators"]["excluded"] == [TASK] and TASK not in scores["tasks"]
        assert "left out of AUP" in text
    else:
        # scored as usual, its AUP contribution (the per-model ratios) beside the probe that gamed it
        entry = scores["tasks"][TASK]
        assert entry["evaluator"]["gameable"] and entry["evaluator"]["gameable_probes"][0]["name"] == "empty"
        assert "ratio_submission" in entry["models"]["teacher"]
        assert not scores["tasks"]["signalDenoising"]["evaluator"]["gameable"]


@pytest.mark.skipif(not local._unshare_works(), reason="unshare needs root")
def test_a_suites_evaluators_are_checked_without_bubblewrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a host without bubblewrap (`sandbox.allow_weak_confinement: true`) the weaker sandbox shows host paths:
    a Python submission is still reached through its channel from a results folder deeper than a Unix socket's
    108-byte address, and a task's data is mounted over the data folder its scorer's copy already holds."""
    monkeypatch.setattr(local, "_bwrap_works", lambda: False)
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    cfg = make_cfg(deep, tasks=[TASK, "blobClustering"])
    cfg = cfg.model_copy(update={"sandbox": cfg.sandbox.model_copy(update={"allow_weak_confinement": True})})
    for task in (TASK, "blobClustering"):  # a Python submission; a CSV one reading data/
        out = cfg.results / "scores" / "checks" / f"{task}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        check_benchmark_task(cfg, task, out)
        report = json.loads(out.read_text())
        assert report["baseline_source"] == "measured" and not report["gameable"], report
        assert [p for p in report["probes"] if p["applicable"]], report["probes"]
        assert report["coherence"]["coherent"], report["coherence"]  # the suite's texts say what they score
