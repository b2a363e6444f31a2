"""The funnel of a results directory: per stage, how many items are planned, done, kept and why others fell out
(`collect`; `gymforge status` shows it as a table, the run summary as a page)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, Field

from gymforge.benchmark.decontamination import dropped_items
from gymforge.benchmark.suite import load_benchmark
from gymforge.core.config import GymforgeConfig
from gymforge.runtime.locks import stale_lock_state
from gymforge.core.plan import parts_dir, run_folder, shard_ids, shard_rollouts
from gymforge.core.records import (
    GenerationRecord,
    ItemRecord,
    ProposalRecord,
    RunSummary,
    TopicBatch,
    UsageRecord,
    VerificationReport,
)
from gymforge.llm.ledger import Ledger

RESOLVED_CONFIG = "config.json"
# Stages after topics: one record per topic slot, found by glob under the results dir.
PER_SLOT_STAGES = [
    ("proposals", "proposals/t*.json", ProposalRecord),
    ("configs", "configs/t*.json", GenerationRecord),
    ("tasks", "tasks/t*/status.json", GenerationRecord),
    ("environments", "environments/t*/report.json", VerificationReport),
]


# Client stage -> funnel stage, for ledger entries written outside a Snakemake job (no `job` field).
CLIENT_STAGES = {"code": "tasks", "verification": "environments", "evaluate": "scores"}


class LLMActivity(BaseModel):
    """What the ledger says about a stage's requests beyond usage: every attempt counts as a call."""

    retries: int = 0
    killed_in_flight: int = Field(0, description="Requests in flight when their job was killed (booked at their bound).")
    in_flight: int = 0
    errors: dict[str, int] = Field({}, description="Failed attempts by error class (retried or not).")


class StageStatus(BaseModel):
    planned: int
    done: int = 0
    ok: int = 0
    skipped: int = 0
    discarded: dict[str, int] = {}
    repaired: dict[str, int] = Field({}, description="Kept items that needed repairs first, by what failed "
                                     "(verification: `incoherent_task`, `gameable_evaluator` or `runtime_error`).")
    failed: dict[str, int] = Field({}, description="Jobs whose last run failed, by reason code (`<log>.failed.json`).")
    usage: UsageRecord = UsageRecord()
    llm: LLMActivity = LLMActivity()


def _tally(planned: int, records: Iterable[ItemRecord]) -> StageStatus:
    stage = StageStatus(planned=planned)
    reasons: Counter[str] = Counter()
    for r in records:
        stage.done += 1
        if r.status == "ok":
            stage.ok += 1
        elif r.status == "skipped":
            stage.skipped += 1
        else:
            reasons[r.reason_code or "unknown"] += 1
    stage.discarded = dict(sorted(reasons.items()))
    return stage


def _repairs(reports: Iterable[VerificationReport]) -> dict[str, int]:
    """Verified tasks by what their failed iterations failed for (a task repaired for both counts in both)."""
    found: Counter[str] = Counter()
    for r in reports:
        if r.status == "ok":
            found.update({"incoherent_task" if it.incoherent else "gameable_evaluator" if it.gameable
                          else "runtime_error" for it in r.iterations[:-1]})
    return dict(sorted(found.items()))


def _planned_slots(results: Path) -> int:
    resolved = results / RESOLVED_CONFIG
    if not resolved.exists():
        return 0
    return json.loads(resolved.read_text())["topics"]["n"]


def _read(paths: Iterable[Path], model: type[BaseModel]) -> list:
    return [model.model_validate_json(p.read_text()) for p in sorted(paths)]


def _trajectories(results: Path, environments: list[VerificationReport]) -> StageStatus:
    """Rollouts: planned = verified tasks x per_task; done = rollouts in finished shards plus finished parts of
    running (or interrupted) shards; ok / discarded = the filter's verdict, once the SFT data is built."""
    cfg = _config(results)
    if cfg is None:
        return StageStatus(planned=0)
    verified = [r.item for r in environments if r.status == "ok"]
    stage = StageStatus(planned=len(verified) * cfg.trajectories.per_task)
    for slot in verified:
        for k in shard_ids(cfg):
            shard = results / "trajectories" / slot / f"shard_{k}.json"
            # A finished shard holds all its rollouts by construction: no need to parse the (large) file.
            stage.done += len(shard_rollouts(cfg, int(k))) if shard.exists() else len(list(parts_dir(shard).glob("r*.json")))
    stats = results / "sft" / "stats.json"
    if stats.exists():
        sft = json.loads(stats.read_text())
        stage.ok, stage.discarded = sft["kept"], dict(sorted(sft["discarded"].items()))
    return stage


def _decontamination(results: Path, environments: list[VerificationReport]) -> StageStatus:
    """Verified tasks held against the benchmark: ok = kept for the SFT data and the RL pool, discarded =
    `benchmark_overlap` (decontamination.on_overlap: drop; under `fail` an overlap stops the build instead)."""
    verified = {r.item for r in environments if r.status == "ok"}
    stage = StageStatus(planned=len(verified))
    report = results / "scores" / "decontamination.json"
    if report.exists():
        dropped = verified & dropped_items(report).keys()
        stage.done, stage.ok = len(verified), len(verified) - len(dropped)
        stage.discarded = {"benchmark_overlap": len(dropped)} if dropped else {}
    return stage


def _config(results: Path):
    resolved = results / RESOLVED_CONFIG
    return GymforgeConfig.model_validate(json.loads(resolved.read_text())) if resolved.exists() else None


def _checkpoints(results: Path) -> StageStatus:
    cfg = _config(results)
    if cfg is None:
        return StageStatus(planned=0)
    done = (results / "checkpoints" / cfg.train.name / "train_report.json").exists()
    return StageStatus(planned=1, done=int(done), ok=int(done))


def _scores(results: Path) -> StageStatus:
    """Benchmark runs: planned = models x tasks x runs_per_task; ok = runs that ended with a scored
    submission; the others are counted by exit status. Runs of an unfinished job count as they finish."""
    cfg = _config(results)
    if cfg is None:
        return StageStatus(planned=0)
    try:
        tasks = [t.id for t in load_benchmark(cfg.evaluate)]
    except (OSError, ValueError):  # an MLGym checkout that moved since the run
        tasks = []
    runs = range(cfg.evaluate.runs_per_task)
    stage = StageStatus(planned=len(cfg.evaluate.models) * len(tasks) * len(runs))
    reasons: Counter[str] = Counter()
    for model in cfg.evaluate.models:
        for task in tasks:
            # A finished job's record (`runs/<model>/<task>.json`, the rule's declared output, which is all that
            # rule run_summary reads), else the runs of a running job as they finish (their run folders).
            record = results / "scores" / "runs" / model.name / f"{task}.json"
            if record.exists():
                done = json.loads(record.read_text()).get("runs", [])
                finished = [RunSummary.model_validate(r) for r in done if r["run"] in runs]
            else:
                stamps = [results / "scores" / "runs" / model.name / task / run_folder(model.name, task, k) / "run.json"
                          for k in runs]
                finished = [RunSummary.model_validate(json.loads(s.read_text())["summary"]) for s in stamps if s.exists()]
            for summary in finished:
                stage.done += 1
                if summary.valid_submission:
                    stage.ok += 1
                else:
                    reasons[(summary.exit_status or "unknown").split(" ")[0]] += 1
    stage.discarded = dict(sorted(reasons.items()))
    return stage


def collect(results: Path) -> dict:
    results = Path(results)
    n = _planned_slots(results)

    def in_plan(item: str) -> bool:
        return int(item[1:]) < n

    batches = _read((results / "topics" / "batches").glob("b*.json"), TopicBatch)
    slots = [s for b in batches for s in b.slots if in_plan(s.item)]
    stages = {"topics": _tally(n, slots)}
    for name, pattern, model in PER_SLOT_STAGES:
        records = [r for r in _read(results.glob(pattern), model) if in_plan(r.item)]
        stages[name] = _tally(n, records)
        if model is VerificationReport:
            stages[name].repaired = _repairs(records)
    environments = [r for r in _read(results.glob("environments/t*/report.json"), VerificationReport) if in_plan(r.item)]
    stages["decontamination"] = _decontamination(results, environments)
    stages["trajectories"] = _trajectories(results, environments)
    stages["checkpoints"] = _checkpoints(results)
    stages["scores"] = _scores(results)

    # LLM usage per stage from the ledger: every request any run of the stage's jobs sent, retries and requests
    # of killed or failed jobs included (item records hold only the last successful run's usage). Read-only: status
    # never takes the run's ledger lock (a running run's requests do not wait on it) and writes nothing.
    ledger = Ledger(results / "llm", read_only=True)
    for name, t in ledger.totals(by=_funnel_stage).items():
        if name in stages:
            stages[name].usage = UsageRecord(**t)
            stages[name].llm = LLMActivity(**t)
    for name, failed in _failures(results).items():
        if name in stages:
            stages[name].failed = failed
    cfg = _config(results)
    return {
        "results_dir": str(results),
        "topics_planned": n,
        "stages": {k: v.model_dump() for k, v in stages.items()},
        "llm": {"requests_sent": ledger.request_count(),
                **({"budget": ledger.budget(cfg.llm.budget_usd)} if cfg is not None else {})},
        "lock": _lock_state(),
    }


def _funnel_stage(entry: dict) -> str:
    """The funnel stage of a ledger entry: its job's (`tasks/t0003` -> tasks), else its client's."""
    if entry.get("job"):
        return entry["job"].split("/")[0]
    return CLIENT_STAGES.get(entry.get("stage") or "?", entry.get("stage") or "?")


def _failures(results: Path) -> dict[str, dict[str, int]]:
    """Per stage, the failed jobs (`logs/<stage>/.../<item>.failed.json`) by reason code."""
    out: dict[str, Counter[str]] = {}
    for record in failed_jobs(results):
        out.setdefault(record["job"].split("/")[0], Counter())[record.get("reason_code") or "unknown"] += 1
    return {k: dict(sorted(v.items())) for k, v in out.items()}


def failed_jobs(results: Path) -> list[dict]:
    """Every failure record (`logs/.../<item>.failed.json`) of a results directory: job, reason code, reason, log."""
    records = []
    for path in sorted((Path(results) / "logs").glob("**/*.failed.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return records


def _lock_state() -> str:
    return stale_lock_state(Path("."))[0]
