"""Measuring a pilot run for `gymforge estimate` (`measure`): per-item averages and funnel yields of a finished (or
partly finished) results directory, each with a note of what it rests on: tokens per call from the LLM ledger
(`llm/calls.jsonl`) and the item records, calls per item from the records, steps, timings and tokens per rollout
from a sample of the rollout shards, yields from the stage records and `sft/stats.json`, CPU seconds from the
Snakemake benchmark files. What a pilot does not cover, `gymforge.tools.estimate` takes from its table of
defaults."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymforge.core.config import GymforgeConfig
from gymforge.core.plan import shard_rollouts
from gymforge.core.records import ShardRecord

# Stages whose calls go to the teacher (priced at its price, reasoning tokens included for a reasoning teacher).
TEACHER_STAGES = ("topics", "proposals", "configs", "code", "verification", "trajectories")


@dataclass
class Measured:
    """Constants measured from one results directory (a subset of DEFAULTS' keys) and what they rest on."""

    results: Path
    values: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def put(self, key: str, value: float | None, note: str) -> None:
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return
        self.values[key] = float(value)
        self.notes[key] = note


def has_data(results: Path) -> bool:
    results = Path(results)
    return (results / "config.json").exists() and any(
        (results / sub).exists() for sub in ("topics/batches", "llm/calls.jsonl", "proposals"))


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class _Spent:
    """Answered calls of one stage in the ledger: completion tokens include the reasoning tokens (as OpenAI counts
    and bills them)."""

    calls: int = 0
    prompt: int = 0
    completion: int = 0
    reasoning: int = 0


def _ledger(results: Path) -> dict[str, _Spent]:
    """stage -> what its answered calls spent, cache hits excluded."""
    out: dict[str, _Spent] = {}
    path = results / "llm" / "calls.jsonl"
    if not path.exists():
        return {}
    with path.open() as fh:
        for line in fh:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            # Tokens per call of answered calls: a `sent` line is followed by its `done` line, a failed attempt
            # (retried, or killed in flight) has no usage.
            if e.get("cached") or e.get("event") in ("sent", "cached") or e.get("ok") is False:
                continue
            t = out.setdefault(e.get("stage", "?"), _Spent())
            t.calls += 1
            t.prompt += int(e.get("prompt_tokens") or 0)
            t.completion += int(e.get("completion_tokens") or 0)
            t.reasoning += int(e.get("reasoning_tokens") or 0)
    return out


def _bench_cpu(path: Path) -> float | None:
    """cpu_time of the last row of a Snakemake benchmark TSV."""
    try:
        rows = list(csv.DictReader(path.open(), delimiter="\t"))
    except OSError:
        return None
    try:
        return float(rows[-1]["cpu_time"]) if rows else None
    except (KeyError, ValueError):
        return None


def _sample(paths: list[Path], limit: int) -> list[Path]:
    if len(paths) <= limit:
        return paths
    step = len(paths) / limit
    return [paths[int(i * step)] for i in range(limit)]


def _fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(intercept, slope) of a least-squares line; None with fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


class _Pilot:
    """Measuring one results directory into `Measured`, stage by stage (see `measure`)."""

    def __init__(self, results: Path, cfg: GymforgeConfig, shard_sample: int) -> None:
        self.results, self.cfg, self.n, self.shard_sample = results, cfg, cfg.topics.n, shard_sample
        self.m = Measured(results)
        self.ledger = _ledger(results)
        self.visible = 1.0  # billed completion tokens -> visible ones: 1 / (1 + reasoning per visible token)
        self.records: dict[str, list[dict[str, Any]]] = {}

    def reasoning(self) -> None:
        """Hidden reasoning tokens per visible completion token over the teacher's calls in the ledger."""
        spent = [self.ledger[s] for s in TEACHER_STAGES if s in self.ledger]
        completion, reasoning = sum(s.completion for s in spent), sum(s.reasoning for s in spent)
        if completion and completion > reasoning:
            ratio = reasoning / (completion - reasoning)
            self.m.put("reasoning_per_completion", ratio, f"{reasoning:,} reasoning tokens within {completion:,} "
                       f"completion tokens of {sum(s.calls for s in spent):,} teacher calls (llm/calls.jsonl)")
            self.visible = 1 / (1 + ratio)

    def per_call(self, stage: str, usages: list[dict[str, Any]], prefix: str) -> None:
        """Prompt and visible completion tokens per call: the item records, else the ledger."""
        sent = sum(u.get("calls", 0) for u in usages)
        prompt = sum(u.get("prompt_tokens", 0) for u in usages)
        completion = sum(u.get("completion_tokens", 0) for u in usages)
        where = "item records"
        spent = self.ledger.get(stage)
        if not sent and spent and spent.calls:
            sent, prompt, completion, where = spent.calls, spent.prompt, spent.completion, "llm/calls.jsonl"
        if sent:
            hidden = f", {1 - self.visible:.0%} of them reasoning" if self.visible < 1 else ""
            self.m.put(f"{prefix}_prompt_per_call", prompt / sent, f"{prompt:,} / {sent:,} calls ({where})")
            self.m.put(f"{prefix}_completion_per_call", completion * self.visible / sent,
                       f"{completion:,} / {sent:,} calls ({where}{hidden})")

    def topics(self) -> None:
        n, m = self.n, self.m
        batches = [b for b in (_json(p) for p in sorted((self.results / "topics" / "batches").glob("b*.json"))) if b]
        if not batches:
            return
        slots = [s for b in batches for s in b["slots"] if int(s["item"][1:]) < n]
        kept = sum(s["status"] == "ok" for s in slots)
        if len(slots) >= n:
            m.put("topics_kept_per_slot", kept / n, f"{kept} of {n} slots kept")
        calls = sum(b["usage"]["calls"] + b["usage"]["cache_hits"] for b in batches)
        m.put("topics_calls_per_batch", calls / len(batches), f"{calls} calls / {len(batches)} batches")
        points, completion, requested = [], 0.0, 0
        for b in batches:
            u = b["usage"]
            if u["calls"]:
                new = sum(s["status"] == "ok" for s in b["slots"])
                points.append((len(b["seen"]) - new, u["prompt_tokens"] / u["calls"]))
                completion += u["completion_tokens"] * self.visible / u["calls"]
                requested += b["requested"]
        fit = _fit_line(points)
        if fit:
            m.put("topics_prompt_base", max(0.0, fit[0]), f"least-squares fit over {len(points)} batches")
            m.put("topics_prompt_per_seen", max(0.0, fit[1]), f"least-squares fit over {len(points)} batches")
        elif points:
            m.put("topics_prompt_base", sum(y for _, y in points) / len(points), "mean (one batch size only)")
        if requested:
            m.put("topics_completion_per_topic", completion / requested,
                  f"visible completion tokens per requested topic over {len(points)} batches")

    def slots(self) -> None:
        """Yields, calls and tokens per item and CPU seconds of the per-slot stages."""
        n, m, results = self.n, self.m, self.results
        stage_files = {"proposals": "proposals/t*.json", "configs": "configs/t*.json", "code": "tasks/t*/status.json",
                       "verification": "environments/t*/report.json"}
        yields = {"proposals": "proposals_ok_per_slot", "configs": "configs_ok_per_slot", "code": "code_ok_per_slot",
                  "verification": "verified_per_slot"}
        for stage, pattern in stage_files.items():
            recs = [r for r in (_json(p) for p in sorted(results.glob(pattern))) if r and int(r["item"][1:]) < n]
            self.records[stage] = recs
            if len(recs) < n:
                continue  # a stage that has not finished every slot says nothing about yields or averages yet
            ran = [r for r in recs if r["status"] != "skipped"]
            ok = sum(r["status"] == "ok" for r in recs)
            m.put(yields[stage], ok / n, f"{ok} of {n} slots")
            if ran:
                calls = sum(r["usage"]["calls"] + r["usage"]["cache_hits"] for r in ran)
                m.put(f"{stage}_calls_per_item", calls / len(ran), f"{calls} calls / {len(ran)} items that ran")
                self.per_call(stage, [r["usage"] for r in ran], stage)
            if stage in ("code", "verification"):
                bench = "tasks" if stage == "code" else "environments"
                cpus = [c for c in (_bench_cpu(results / "benchmarks" / bench / f"{r['item']}.tsv") for r in ran)
                        if c is not None]
                if cpus:
                    m.put(f"{stage}_cpu_s_per_item", sum(cpus) / len(cpus), f"mean cpu_time of {len(cpus)} jobs")

    def shards(self) -> None:
        """Steps, calls, tokens and timings per rollout from a sample of the finished shards."""
        m, cfg, results = self.m, self.cfg, self.results
        verified = [r["item"] for r in self.records.get("verification", []) if r["status"] == "ok"]
        shard_files = sorted(p for slot in verified for p in (results / "trajectories" / slot).glob("shard_*.json"))
        steps = calls = prompt = completion = rollouts = 0
        query_s = exec_s = 0.0
        for path in _sample(shard_files, self.shard_sample):
            try:
                shard = ShardRecord.model_validate_json(path.read_text())
            except (OSError, ValueError):
                continue
            for rec in shard.rollouts:
                t = rec.trajectory
                rollouts += 1
                steps += len(t.trajectory)
                calls += t.info.model_stats.api_calls
                prompt += t.info.model_stats.tokens_sent
                completion += t.info.model_stats.tokens_received
                query_s += sum(s.query_time for s in t.trajectory)
                exec_s += sum(s.execution_time for s in t.trajectory)
        if rollouts and steps:
            where = f"{rollouts} rollouts in {min(len(shard_files), self.shard_sample)} of {len(shard_files)} shards"
            m.put("rollout_steps", steps / rollouts, f"{steps} steps / {where}")
            m.put("rollout_calls_per_step", calls / steps, f"{calls} calls / {steps} steps")
            m.put("rollout_exec_s_per_step", exec_s / steps, f"{exec_s:.0f} s / {steps} steps")
            if calls:
                m.put("rollout_prompt_per_call", prompt / calls, f"{prompt:,} / {calls} calls ({where})")
                m.put("rollout_completion_per_call", completion * self.visible / calls,
                      f"{completion:,} / {calls} calls" + (" (visible part)" if self.visible < 1 else ""))
                m.put("llm_s_per_call", query_s / calls, f"{query_s:.0f} s query time / {calls} calls "
                      f"({cfg.llm.teacher.provider} teacher {cfg.trajectories.model or cfg.llm.teacher.model})")
        cpu, cpu_rollouts = 0.0, 0
        for path in shard_files:
            c = _bench_cpu(results / "benchmarks" / "trajectories" / path.parent.name / f"{path.stem}.tsv")
            if c is not None:
                cpu += c
                cpu_rollouts += len(shard_rollouts(cfg, int(path.stem.split("_")[1])))
        if cpu_rollouts:
            m.put("rollout_cpu_s", cpu / cpu_rollouts, f"cpu_time {cpu:.0f} s of shard jobs / {cpu_rollouts} rollouts")

    def sft_and_training(self) -> None:
        m, cfg = self.m, self.cfg
        stats = _json(self.results / "sft" / "stats.json")
        if stats and stats.get("rollouts"):
            kept = stats["kept"]
            m.put("kept_per_rollout", kept / stats["rollouts"], f"{kept} kept of {stats['rollouts']} "
                  f"rollouts (filter.max_tokens {cfg.filter.max_tokens})")
            kept_tokens = stats.get("tokens", {}).get("kept") or {}
            if kept_tokens.get("mean"):
                m.put("kept_tokens_mean", kept_tokens["mean"], f"mean student tokens of {kept} kept examples "
                      f"(student {cfg.train.student})")
                m.put("kept_tokens_max", kept_tokens.get("max"), f"the longest of {kept} kept trajectories "
                      f"(student {cfg.train.student})")
            request = (stats.get("units") or {}).get("request") or {}
            if kept and request.get("examples"):
                m.put("request_tokens_per_kept", request["tokens"] / kept, f"{request['tokens']:,} tokens of "
                      f"{request['examples']} request examples from {kept} kept trajectories")
                m.put("replies_per_kept", request["replies"] / kept, f"{request['replies']} teacher replies in "
                      f"{kept} kept trajectories")
        report = _json(self.results / "checkpoints" / cfg.train.name / "train_report.json")
        if report and report.get("tokens_per_s") and str(report.get("device", "")).startswith("cuda"):
            world = max(1, int(report.get("world_size") or 1))
            m.put("train_tokens_per_s_per_gpu", report["tokens_per_s"] / world,
                  f"{report['tokens_per_s']:.0f} tokens/s on {world} GPU(s), student {report.get('student')}")
            m.notes["_train_student"] = str(report.get("student"))

    def evaluation(self) -> None:
        m, results = self.m, self.results
        runs = steps = replies = 0
        cpu, cpu_runs = 0.0, 0
        for path in sorted((results / "scores" / "runs").glob("*/*.json")):
            rec = _json(path)
            if not rec or "runs" not in rec:
                continue
            for run in rec["runs"]:
                runs += 1
                steps += run.get("steps", 0)
                replies += run.get("replies", 0)
            c = _bench_cpu(results / "benchmarks" / "scores" / path.parent.name / f"{path.stem}.tsv")
            if c is not None and rec["runs"]:
                cpu += c
                cpu_runs += len(rec["runs"])
        if runs and steps:
            m.put("eval_steps_per_run", steps / runs, f"{steps} steps / {runs} runs")
            m.put("eval_calls_per_step", replies / steps, f"{replies} replies / {steps} steps")
            spent = self.ledger.get("evaluate")
            if spent and spent.calls:
                visible = spent.completion - spent.reasoning
                m.put("eval_prompt_per_call", spent.prompt / spent.calls,
                      f"{spent.prompt:,} / {spent.calls} calls (llm/calls.jsonl)")
                m.put("eval_completion_per_call", visible / spent.calls,
                      f"{visible:,} visible / {spent.calls} calls (llm/calls.jsonl)")
        if cpu_runs:
            m.put("eval_cpu_s_per_run", cpu / cpu_runs, f"cpu_time {cpu:.0f} s / {cpu_runs} runs")


def measure(results: Path, *, shard_sample: int = 64) -> Measured:
    """Per-item averages and yields of the finished (or partly finished) pilot run in `results`. Completion
    tokens are the visible ones: a reasoning teacher's hidden tokens (the ledger's `reasoning_tokens`, within its
    completion tokens) become `reasoning_per_completion`."""
    results = Path(results)
    raw = _json(results / "config.json")
    if not raw:
        return Measured(results)
    pilot = _Pilot(results, GymforgeConfig.model_validate(raw), shard_sample)
    pilot.reasoning()
    pilot.topics()
    pilot.slots()
    pilot.shards()
    pilot.sft_and_training()
    pilot.evaluation()
    return pilot.m
