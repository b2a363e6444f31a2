"""Every rule's job reads only what its rule declares: one job of each rule of a finished tiny run, rerun with the
shell command Snakemake recorded for it in a fresh directory that holds only that job's declared inputs (plus the
resolved config under results/.gymforge, which the command names, and the installed package), must succeed and
write its outputs. A job that reads an undeclared file (another stage's output, a file it finds by globbing
results/) fails here, and Snakemake could not have known to rerun it.

Every command reads the resolved config from $GYMFORGE_CONFIG (rules/common.smk), set here as Snakemake sets it.
Shared, not inputs: the cache directory (`.cache/gymforge`, linked into every copy): LLM replies keyed by their
request's content and the offline hub built from installed packages, which change no output, only its cost.
Documented exceptions, copied for the one rule that reads them (`EXCEPTIONS`): run_summary's funnel counts every
LLM request (the ledger, results/llm) and every failed job (logs/**/*.failed.json); every job appends to those
logs, so they cannot be a rule's output, and the summary is rebuilt whenever the score table is.

Cost: 17 jobs, each its rule's cheapest (the verified slot whose verification took least, the shorter run of the SFT
student), 2 at a time, longest first: 66 s CPU (sandboxes not counted), 138 s wall at load ~5 on the 2-core machine,
besides the session's finished run (tests/finished_run.py, shared with tests/report/test_report.py).

Not sampled: micro_task and train_rl (targets `micro` and `rl`, not part of `all`, so not in the finished run;
tests/stages/test_micro.py and tests/stages/test_rl.py run their stage functions), fetch_dataset (only with the real hub).
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from finished_run import snakemake

# The session's finished run (about 10 minutes at load ~16) counts against the first test that asks for it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

RULES = {"run_config", "topic_batch", "proposal", "task_configs", "starter_code", "verify_environment",
         "rollout_shard", "student_tokenizer", "sft_dataset", "sft_plots", "student_base", "train_student",
         "decontamination", "eval_runs", "check_benchmark_task", "score_table", "run_summary"}
# Files a job reads beyond its declared inputs, on purpose (module docstring): rule -> glob patterns in results/.
EXCEPTIONS = {"run_summary": ["llm/*", "logs/**/*.failed.json"]}
# A job that merely glances at an undeclared file (an `exists()`, a count) succeeds without it but writes something
# else: so every rerun output must equal the run's, byte for byte, but for the records that hold wall-clock times
# and the random fingerprint Hugging Face datasets write (state.json) or Snakemake's directory stamps.
TIMED = {"eval_runs", "rollout_shard", "train_student", "verify_environment", "check_benchmark_task"}
UNSTABLE_FILES = {"state.json", ".snakemake_timestamp"}
# LLM accounting: a rerun is answered from the shared reply cache, so its records count cache hits, not calls.
UNSTABLE_KEYS = {"usage"}


def _comparable(path: Path) -> object:
    """A file's content for the comparison: JSON without its LLM accounting, other files as bytes."""
    if path.suffix != ".json":
        return path.read_bytes()

    def strip(value: object) -> object:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in UNSTABLE_KEYS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(json.loads(path.read_text()))


def recorded_jobs(workdir: Path) -> dict[str, list[dict]]:
    """Rule -> its jobs as Snakemake recorded them (`--detailed-summary`): shell command, inputs, outputs, log."""
    proc = snakemake(workdir, "--detailed-summary")
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs: dict[tuple[str, str], dict] = {}
    for line in proc.stdout.splitlines():
        fields = line.split("\t")
        if len(fields) != 8 or fields[0] == "output_file":
            continue
        output, _date, rule, log, inputs, shellcmd, _status, _plan = fields
        job = jobs.setdefault((rule, shellcmd), {"rule": rule, "shellcmd": shellcmd, "outputs": [],
                                                 "inputs": [i for i in inputs.split(",") if i],
                                                 "logs": [p for p in log.split(",") if p]})
        job["outputs"].append(output)
    by_rule: dict[str, list[dict]] = {}
    for job in jobs.values():
        by_rule.setdefault(job["rule"], []).append(job)
    return by_rule


def recorded_seconds(workdir: Path, output: str) -> float:
    """How long the job that wrote `output` ran in the finished run (Snakemake's metadata: start and end time)."""
    record = workdir / ".snakemake" / "metadata" / base64.urlsafe_b64encode(output.encode()).decode()
    if not record.is_file():
        return math.inf
    times = json.loads(record.read_text())
    return times["endtime"] - times["starttime"]


def cheapest(workdir: Path, jobs: list[dict]) -> dict:
    """The job that took the least time in the finished run: a rerun does the same work again."""
    return min(jobs, key=lambda job: recorded_seconds(workdir, job["outputs"][0]))


def verified_slot(workdir: Path) -> str:
    """A slot whose task was verified: its jobs do real work in every per-slot rule (a discarded slot's are trivial).
    Of several, the one whose verification took the least time."""
    verified = [report for report in sorted((workdir / "results" / "environments").glob("t*/report.json"))
                if json.loads(report.read_text())["status"] == "ok"]
    assert verified, "no verified task in the tiny run"
    return min(verified, key=lambda r: recorded_seconds(workdir, str(r.relative_to(workdir)))).parent.name


def pick(workdir: Path, jobs: list[dict], slot: str) -> dict:
    """One job of a rule: the verified slot's (its batch for topic_batch), and the SFT student's benchmark run
    (it reads a built checkpoint) among eval_runs; of several that qualify, the cheapest."""
    for want in (f"/{slot}/", f"/{slot}.", f"{slot}.json", "/student-sft/", "b0000"):
        if matching := [job for job in jobs if any(want in out for out in job["outputs"])]:
            return cheapest(workdir, matching)
    return cheapest(workdir, jobs)


def copy_in(src: Path, dest: Path, rel: str) -> None:
    source, target = src / rel, dest / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(source, target)


def rerun_alone(workdir: Path, job: dict, config: str, dest: Path) -> subprocess.CompletedProcess:
    """Run `job`'s recorded shell command in `dest`, which holds only its declared inputs and the resolved config
    (`config`, which the command reads as $GYMFORGE_CONFIG), reading it through its rule's config view
    ($GYMFORGE_READS, as under Snakemake: tests/core/test_configview.py)."""
    dest.mkdir(parents=True)
    for rel in job["inputs"]:
        if not os.path.isabs(rel):  # absolute: files of the installed package (the prompt templates)
            copy_in(workdir, dest, rel)
    copy_in(workdir, dest, config)
    (reads,) = (str(p.relative_to(workdir)) for p in (workdir / "results" / ".gymforge").glob("reads-*.json"))
    copy_in(workdir, dest, reads)
    for pattern in EXCEPTIONS.get(job["rule"], []):
        for path in (workdir / "results").glob(pattern):
            copy_in(workdir, dest, str(path.relative_to(workdir)))
    (dest / ".cache").symlink_to(workdir / ".cache")
    for rel in job["outputs"] + job["logs"]:  # as Snakemake does before a job starts
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["bash", "-c", job["shellcmd"]], cwd=dest, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "GYMFORGE_CONFIG": config,
                               "GYMFORGE_READS": reads}, check=False)


def changed_outputs(workdir: Path, job: dict, dest: Path) -> list[str]:
    """The job's output files (directories walked) whose rerun differs from the finished run's."""
    changed = []
    for out in job["outputs"]:
        files = [dest / out] if (dest / out).is_file() else sorted(p for p in (dest / out).rglob("*") if p.is_file())
        for path in files:
            rel = path.relative_to(dest)
            if path.name not in UNSTABLE_FILES and _comparable(path) != _comparable(workdir / rel):
                changed.append(str(rel))
    return changed


def test_every_rule_reads_only_its_declared_inputs(finished_run, tmp_path):
    by_rule = recorded_jobs(finished_run)
    assert RULES <= set(by_rule), f"rules without a recorded job: {RULES - set(by_rule)}"
    slot = verified_slot(finished_run)
    sampled = [pick(finished_run, by_rule[rule], slot) for rule in sorted(RULES)]
    # the resolved config of the run: run_config's one input (results/.gymforge/config-<hash>.json)
    (config,) = by_rule["run_config"][0]["inputs"]
    assert re.fullmatch(r"results/\.gymforge/config-\w+\.json", config), config
    assert all("$GYMFORGE_CONFIG" in job["shellcmd"] for job in sampled if job["rule"].startswith(("topic", "train")))

    def run(job: dict) -> tuple[dict, subprocess.CompletedProcess]:
        return job, rerun_alone(finished_run, job, config, tmp_path / job["rule"])

    failures = []
    # longest first, so that the 2 workers finish together
    sampled.sort(key=lambda job: recorded_seconds(finished_run, job["outputs"][0]), reverse=True)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for job, proc in pool.map(run, sampled):
            dest = tmp_path / job["rule"]
            missing = [out for out in job["outputs"] if not (dest / out).exists()]
            if proc.returncode != 0 or missing:
                logs = "".join((dest / p).read_text()[-1500:] for p in job["logs"] if (dest / p).is_file())
                failures.append(f"{job['rule']}: rc {proc.returncode}, missing {missing}\n  {job['shellcmd']}\n"
                                f"{proc.stderr[-1500:]}\n{logs}")
            elif job["rule"] not in TIMED and (changed := changed_outputs(finished_run, job, dest)):
                failures.append(f"{job['rule']}: alone it wrote other outputs than in the run: {changed}")
    assert len(sampled) == len(RULES)
    assert not failures, "\n\n".join(failures)
