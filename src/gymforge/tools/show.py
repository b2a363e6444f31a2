"""Inspection tools: `gymforge show-task` (one synthesized task, every stage) and `gymforge show-trajectory`
(one agent episode, readable in the terminal or as a static HTML page).

`show-task <slot-or-task-id>` reads a results directory: the topic and proposal, the validated configs (task
YAML and dataset YAMLs, from the verified tree when there is one), baseline scores, the verification
history (`environments/<slot>/report.json`: every iteration's source, errors and timings), the teacher
rollouts (exit statuses, scores, which ones the SFT filter kept, from `sft/rollouts.jsonl` or the shards)
and where each file is.

`show-trajectory <path>` accepts a `.traj` file, a rollout shard (`trajectories/<slot>/shard_<k>.json`, pick a
rollout with `--rollout K`), a finished-rollout part (`.shard_<k>.parts/r<index>.json`) or a run folder
(`scores/runs/<model>/<task>/<model>__<task>__run<k>/`, `environments/<slot>/verified/episode/`).
"""
# long file: show-task and show-trajectory share the text helpers at the top

from __future__ import annotations

import html
import json
import re
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gymforge.core import atomic
from gymforge.core.records import RolloutRecord, ShardRecord, Trajectory, TrajectoryStep, final_submission
from gymforge.core.plan import batch_of_slot

SLOT_RE = re.compile(r"^t\d{4,}$")


class ShowError(ValueError):
    """The thing to show cannot be found or read; the message says what exists."""


# ---- small text helpers ------------------------------------------------------------------------------


def _clip_lines(text: str, max_lines: int | None, max_chars: int | None = None) -> str:
    """At most `max_lines` lines (and `max_chars` characters), saying how much was left out."""
    text = text.rstrip("\n")
    lines = text.split("\n")
    cut = ""
    if max_lines is not None and len(lines) > max_lines:
        cut = f"... ({len(lines) - max_lines} more lines)"
        lines = lines[:max_lines]
    out = "\n".join(lines)
    if max_chars is not None and len(out) > max_chars:
        cut = f"... ({len(text) - max_chars} more characters)"
        out = out[:max_chars]
    return out + ("\n" + cut if cut else "")


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line else prefix.rstrip() for line in text.split("\n"))


def _hang(text: str, first: str, rest: str | None = None) -> str:
    """`first` before the first line, `rest` (spaces as wide as `first` by default) before the others."""
    rest = " " * len(first) if rest is None else rest
    lines = text.split("\n")
    return "\n".join([first + lines[0]] + [(rest + line).rstrip() for line in lines[1:]])


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _scores(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "none"
    return ", ".join(f"{k}={_num(v)}" for k, v in entry.items())


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


# ---- show-task -----------------------------------------------------------------------------------------


def _slot_of_task(results: Path, task_id: str) -> list[str]:
    """Slots whose task id is `task_id` (reports first, then config records, then code records)."""
    for pattern in ("environments/t*/report.json", "configs/t*.json", "tasks/t*/status.json"):
        found = []
        for path in sorted(results.glob(pattern)):
            try:
                record = _read_json(path)
            except (OSError, ValueError):
                continue
            if record.get("task_id") == task_id:
                found.append(record.get("item") or path.parent.name)
        if found:
            return found
    return []


def resolve_slot(results: Path, key: str) -> str:
    if SLOT_RE.match(key):
        return key
    slots = _slot_of_task(results, key)
    if not slots:
        known = sorted({r.get("task_id") for p in results.glob("configs/t*.json")
                        for r in [_safe_json(p)] if r and r.get("task_id")})
        hint = f"; known task ids: {', '.join(known[:20])}" + (" ..." if len(known) > 20 else "") if known else ""
        raise ShowError(f"no topic slot or task id {key!r} in {results}{hint}")
    return slots[0]


def _safe_json(path: Path) -> Any:
    try:
        return _read_json(path)
    except (OSError, ValueError):
        return None


def _topic_slot(results: Path, slot: str) -> dict[str, Any] | None:
    """The slot's entry in its topic batch (topic text, status, duplicate_of)."""
    cfg = _safe_json(results / "config.json")
    batches: list[Path] = []
    if cfg:
        batches.append(results / "topics" / "batches" / f"{batch_of_slot(slot, cfg['topics']['batch_size'])}.json")
    batches += sorted((results / "topics" / "batches").glob("b*.json"))
    for path in batches:
        batch = _safe_json(path) if path.exists() else None
        for entry in (batch or {}).get("slots", []):
            if entry.get("item") == slot:
                return {**entry, "batch": batch.get("batch"), "file": str(path)}
    return None


def _config_files(results: Path, slot: str, configs_record: dict | None) -> tuple[str, dict[str, str]]:
    """(where from, relative path -> YAML text) of the task and dataset configs, the most final copy first."""
    for label, root in (("verified tree", results / "environments" / slot / "verified" / "mlgym"),
                        ("task tree", results / "tasks" / slot / "mlgym")):
        files = {str(p.relative_to(root)): p.read_text()
                 for sub in ("configs/tasks", "configs/datasets") for p in sorted((root / sub).glob("*.yaml"))}
        if files:
            return f"{label}: {root}", files
    if configs_record and configs_record.get("files"):
        return f"config record: {results / 'configs' / f'{slot}.json'}", dict(configs_record["files"])
    return "none", {}


def _rollout_rows(results: Path, slot: str) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """(source, per-rollout rows, per-shard rows). Rows come from sft/rollouts.jsonl when the SFT data covers the
    slot (with the filter's verdict), else from the shards and unfinished parts (no verdict yet)."""
    shards_dir = results / "trajectories" / slot
    shard_rows: list[dict[str, Any]] = []
    for path in sorted(shards_dir.glob("shard_*.json")):
        shard_rows.append({"file": str(path), "size": path.stat().st_size})
    rows: list[dict[str, Any]] = []
    sft = results / "sft" / "rollouts.jsonl"
    if sft.exists():
        with sft.open() as fh:
            for line in fh:
                if f'"slot":"{slot}"' in line or f'"slot": "{slot}"' in line:
                    row = json.loads(line)
                    if row.get("slot") == slot:
                        rows.append(row)
    if rows:
        return f"SFT filter verdicts: {sft}", rows, shard_rows
    for info in shard_rows:
        path = Path(info["file"])
        try:
            shard = ShardRecord.model_validate_json(path.read_text())
        except (OSError, ValueError) as err:
            info["error"] = str(err)
            continue
        info.update(status=shard.status, reason=shard.reason, rollouts=len(shard.rollouts), resumed=shard.resumed)
        rows += [_rollout_row(r) for r in shard.rollouts]
    for parts in sorted(shards_dir.glob(".shard_*.parts")):
        for part in sorted(parts.glob("r*.json")):
            try:
                rows.append({**_rollout_row(RolloutRecord.model_validate_json(part.read_text())), "unfinished_shard": True})
            except (OSError, ValueError):
                continue
    return (f"shards in {shards_dir}" if shard_rows else "none"), rows, shard_rows


def _rollout_row(rec: Any) -> dict[str, Any]:
    traj = rec.trajectory
    metric = next(iter(rec.baseline), None) if rec.baseline else None
    last = traj.info.score[-1] if traj.info.score else {}
    if metric is None and last:
        metric = next(iter(last))
    return {"id": f"{rec.slot}-r{rec.rollout:05d}", "slot": rec.slot, "rollout": rec.rollout,
            "exit_status": traj.info.exit_status or "unknown", "steps": len(traj.trajectory),
            "score": last.get(metric) if metric else None, "kept": None, "reason": None, "wall_s": rec.wall_s}


def task_summary(results: Path, key: str) -> dict[str, Any]:
    """Everything gymforge knows about one topic slot, as a JSON-able dict."""
    results = Path(results)
    if not results.is_dir():
        raise ShowError(f"results directory {results} does not exist")
    slot = resolve_slot(results, key)
    paths = {
        "topic batch": None,
        "proposal": results / "proposals" / f"{slot}.json",
        "configs": results / "configs" / f"{slot}.json",
        "code": results / "tasks" / slot / "status.json",
        "task tree": results / "tasks" / slot / "mlgym",
        "verification report": results / "environments" / slot / "report.json",
        "verified tree": results / "environments" / slot / "verified" / "mlgym",
        "verification episode": results / "environments" / slot / "verified" / "episode",
        "trajectories": results / "trajectories" / slot,
        "sft rollouts": results / "sft" / "rollouts.jsonl",
    }
    topic = _topic_slot(results, slot)
    if topic:
        paths["topic batch"] = Path(topic["file"])
    proposal = _safe_json(paths["proposal"]) if paths["proposal"].exists() else None
    configs = _safe_json(paths["configs"]) if paths["configs"].exists() else None
    code = _safe_json(paths["code"]) if paths["code"].exists() else None
    report = _safe_json(paths["verification report"]) if paths["verification report"].exists() else None
    if not any((topic, proposal, configs, code, report)):
        raise ShowError(f"slot {slot} has no records in {results} (not planned, or not run yet)")
    config_source, config_files = _config_files(results, slot, configs)
    rollout_source, rollouts, shards = _rollout_rows(results, slot)
    task_id = next((r.get("task_id") for r in (report, code, configs) if r and r.get("task_id")), None)
    logs = sorted(str(p) for p in (results / "logs").glob(f"*/{slot}.log")) + sorted(
        str(p) for p in (results / "logs" / "trajectories" / slot).glob("*.log"))
    stages = {}
    for name, record in (("topic", topic), ("proposal", proposal), ("configs", configs), ("code", code),
                         ("verification", report)):
        if record is not None:
            stages[name] = {"status": record.get("status"), "reason_code": record.get("reason_code"),
                            "reason": record.get("reason"), "usage": record.get("usage")}
    return {
        "results_dir": str(results),
        "slot": slot,
        "task_id": task_id,
        "topic": (proposal or {}).get("topic") or (topic or {}).get("topic"),
        "duplicate_of": (topic or {}).get("duplicate_of"),
        "stages": stages,
        "proposal": {k: (proposal or {}).get(k) for k in ("proposal", "searches", "nudges")} if proposal else None,
        "dataset": {k: ((proposal or {}).get("dataset") or {}).get(k) for k in ("id", "description", "license")}
        if proposal and proposal.get("dataset") else None,
        "config_attempts": (configs or {}).get("attempts", []),
        "code_attempts": (code or {}).get("attempts", []),
        "entrypoint": next((r.get("entrypoint") for r in (report, code, configs) if r and r.get("entrypoint")), None),
        "config_source": config_source,
        "config_files": config_files,
        "baseline_scores": (report or {}).get("baseline_scores", []),
        "hidden_columns": (report or {}).get("hidden_columns"),
        "iterations": (report or {}).get("iterations", []),
        "rollout_source": rollout_source,
        "rollouts": rollouts,
        "shards": shards,
        "files": {k: str(v) for k, v in paths.items() if v is not None and Path(v).exists()},
        "logs": logs,
    }


def _usage(u: dict[str, Any] | None) -> str:
    if not u:
        return ""
    return (f"{u.get('calls', 0)} calls ({u.get('cache_hits', 0)} cached), "
            f"{u.get('prompt_tokens', 0) + u.get('completion_tokens', 0)} tokens, ${u.get('cost_usd', 0.0):.4f}")


def _render_rollouts(summary: dict[str, Any], *, full: bool) -> list[str]:
    """`render_task`'s trajectories section: the shards, exit statuses, final scores, the SFT filter's verdicts and
    (all with `full`, else the first 20) one line per rollout."""
    out: list[str] = []
    add = out.append
    rows = summary["rollouts"]
    add("")
    add(f"trajectories: {len(rows)} rollout(s) ({summary['rollout_source']})")
    if summary["shards"]:
        for sh in summary["shards"]:
            extra = f" {sh['status']}" + (f" ({sh['reason']})" if sh.get("reason") else "") if sh.get("status") else ""
            add(f"  {sh['file']} ({sh['size'] / 1e6:.2f} MB){extra}")
    if rows:
        exits = Counter(r["exit_status"] for r in rows)
        add("  exit statuses: " + ", ".join(f"{k}: {v}" for k, v in exits.most_common()))
        scores = [r["score"] for r in rows if isinstance(r.get("score"), (int, float))]
        if scores:
            add(f"  final scores: min {_num(min(scores))}, median {_num(statistics.median(scores))}, "
                f"max {_num(max(scores))} (n={len(scores)})")
        verdicts = [r for r in rows if r.get("kept") is not None]
        if verdicts:
            reasons = Counter(r["reason"] for r in verdicts if not r["kept"])
            add(f"  kept by the SFT filter: {sum(r['kept'] for r in verdicts)}/{len(verdicts)}"
                + (" (discarded: " + ", ".join(f"{k}: {v}" for k, v in reasons.items()) + ")" if reasons else ""))
        else:
            add("  SFT filter: not run yet")
        shown = rows if full else rows[:20]
        for r in shown:
            verdict = "kept" if r.get("kept") else (f"discarded ({r['reason']})" if r.get("kept") is False else "-")
            tokens = f" {r['tokens']} tok" if r.get("tokens") is not None else ""
            add(f"    {r['id']}  {r['exit_status']:<32} {r['steps']:>3} steps{tokens}  score {_num(r.get('score'))}  {verdict}")
        if len(shown) < len(rows):
            add(f"    ... {len(rows) - len(shown)} more (--full)")
    return out


def render_task(summary: dict[str, Any], *, full: bool = False, max_lines: int = 40) -> str:
    """The summary of `task_summary` as terminal text; `full` prints whole files and error messages."""
    lines_cap = None if full else max_lines
    err_cap = None if full else 8
    out: list[str] = []
    add = out.append
    add(f"== {summary['slot']}: {summary['task_id'] or '(no task)'}   [{summary['results_dir']}]")
    add(f"topic: {summary['topic'] or '(none)'}" + (f" (duplicate of {summary['duplicate_of']!r})"
                                                       if summary.get("duplicate_of") else ""))
    add("")
    add("stages:")
    for name, st in summary["stages"].items():
        why = f" ({st['reason_code']}: {st['reason']})" if st.get("reason_code") or st.get("reason") else ""
        usage = _usage(st.get("usage"))
        add(f"  {name:<13} {st['status'] or '?':<10}{why}" + (f"  [{usage}]" if usage and st.get("usage", {}).get("calls") else ""))
    prop = summary.get("proposal")
    if prop and prop.get("proposal"):
        p = prop["proposal"]
        add("")
        add("proposal:")
        add(f"  metric: {p.get('metric')}")
        add(f"  dataset asked for: {p.get('dataset') or '(none)'}")
        add(_indent(_clip_lines(p.get("description") or "", lines_cap, None if full else 600), "  "))
    if prop and prop.get("searches"):
        add(f"  searches: {'; '.join(prop['searches'])}" + (f"   nudges: {prop['nudges']}" if prop.get("nudges") else ""))
    ds = summary.get("dataset")
    if ds:
        add(f"  resolved dataset: {ds.get('id')}" + (f" (license {ds['license']})" if ds.get("license") else ""))
    for label, attempts in (("config generation", summary["config_attempts"]), ("code generation", summary["code_attempts"])):
        if len(attempts) > 1 or any(a.get("errors") for a in attempts):
            add("")
            add(f"{label}: {len(attempts)} attempts")
            for i, a in enumerate(attempts, 1):
                errs = a.get("errors") or []
                add(f"  attempt {i}: {len(errs)} errors")
                for e in errs[:err_cap]:
                    add(_hang(_clip_lines(e, 6 if not full else None), "    - "))
    add("")
    add(f"configs ({summary['config_source']}):" + (f"  entrypoint {summary['entrypoint']}" if summary.get("entrypoint") else ""))
    for rel, text in summary["config_files"].items():
        add(f"  --- {rel}")
        add(_indent(_clip_lines(text, lines_cap)))
    add("")
    base = summary["baseline_scores"]
    add("baseline scores: " + ("; ".join(_scores(b) for b in base) if base else "none"))
    if summary.get("hidden_columns"):
        add("held-out columns: " + ", ".join(f"{k}: {', '.join(v)}" for k, v in summary["hidden_columns"].items()))
    iterations = summary["iterations"]
    add("")
    add(f"verification: {len(iterations)} iteration(s)")
    for it in iterations:
        timings = ", ".join(f"{k} {v:.1f}s" for k, v in (it.get("timings_s") or {}).items()) or "no timings"
        errs = it.get("errors") or []
        add(f"  #{it['iteration']} {it['source']:<10} {len(errs)} error(s); baseline {_scores(it.get('baseline_scores'))}; "
            f"episode {it.get('episode_exit_status') or '-'}; {timings}")
        for e in errs[:err_cap]:
            add(_hang(_clip_lines(e, 6 if not full else None, 600 if not full else None), "      - "))
        if err_cap is not None and len(errs) > err_cap:
            add(f"      ... {len(errs) - err_cap} more errors (--full)")
    out += _render_rollouts(summary, full=full)
    add("")
    add("files:")
    for label, path in summary["files"].items():
        add(f"  {label:<21} {path}")
    for log in summary["logs"]:
        add(f"  {'log':<21} {log}")
    return "\n".join(out)


# ---- show-trajectory ---------------------------------------------------------------------------------


def load_episode(path: Path, rollout: int | None = None) -> tuple[Trajectory, dict[str, Any]]:
    """(trajectory, context) of a `.traj` file, a shard, a rollout part or a run folder."""
    path = Path(path)
    if not path.exists():
        raise ShowError(f"{path} does not exist")
    context: dict[str, Any] = {"source": str(path)}
    if path.is_dir():
        trajs = sorted(path.glob("*.traj"))
        if not trajs:
            raise ShowError(f"{path} holds no .traj file (expected a run folder such as "
                            "scores/runs/<model>/<task>/<model>__<task>__run<k>/)")
        if len(trajs) > 1:
            raise ShowError(f"{path} holds several .traj files: {', '.join(t.name for t in trajs)}; pass one")
        results = path / "results.json"
        if results.exists():
            context["baseline"] = (_safe_json(results) or {}).get("baseline")
        run = path / "run.json"
        if run.exists():
            context["run"] = (_safe_json(run) or {}).get("summary")
        traj, sub = load_episode(trajs[0])
        return traj, {**sub, **context, "source": str(trajs[0])}
    try:
        data = _read_json(path)
    except ValueError as err:
        raise ShowError(f"{path} is not JSON: {err}") from None
    if isinstance(data, dict) and "rollouts" in data and "shard" in data:
        shard = ShardRecord.model_validate(data)
        if not shard.rollouts:
            raise ShowError(f"{path}: shard {shard.shard} of {shard.item} holds no rollouts "
                            f"({shard.status}{': ' + shard.reason if shard.reason else ''})")
        available = [r.rollout for r in shard.rollouts]
        if rollout is None:
            rec = shard.rollouts[0]
            context["note"] = (f"rollout {rec.rollout} of {len(available)} in this shard "
                               f"({available[0]}..{available[-1]}); pick another with --rollout K")
        else:
            rec = next((r for r in shard.rollouts if r.rollout == rollout), None)
            if rec is None:
                raise ShowError(f"{path} has no rollout {rollout}; it holds rollouts {available}")
        return rec.trajectory, {**context, **_rollout_context(rec)}
    if isinstance(data, dict) and "trajectory" in data and "slot" in data and "rollout" in data:
        rec = RolloutRecord.model_validate(data)
        return rec.trajectory, {**context, **_rollout_context(rec)}
    if isinstance(data, dict) and "trajectory" in data and "info" in data:
        try:
            return Trajectory.model_validate(data), context
        except ValidationError as err:  # e.g. MLGym's own .traj (no step numbers): gymforge import-trajectories
            first = err.errors()[0]
            raise ShowError(f"{path}: not a gymforge trajectory ({'.'.join(map(str, first['loc']))}: {first['msg']}; "
                            "MLGym's own .traj files are read by gymforge import-trajectories)") from None
    raise ShowError(f"{path}: not a .traj file, a rollout shard, a rollout part or a run folder")


def _rollout_context(rec: Any) -> dict[str, Any]:
    return {"slot": rec.slot, "task_id": rec.task_id, "rollout": rec.rollout, "seed": rec.seed,
            "teacher": f"{rec.teacher.model} ({rec.teacher.provider}, {rec.teacher.endpoint or 'no endpoint'})",
            "sandbox": rec.sandbox.backend + (f"/{rec.sandbox.confinement}" if rec.sandbox.confinement else ""),
            "max_steps": rec.max_steps, "baseline": rec.baseline, "wall_s": rec.wall_s}


_EVAL_SCORE = re.compile(r"^Evaluation Score: (\{.*\})\s*$", re.M)


def step_scores(traj: Trajectory) -> list[dict[str, float] | None]:
    """Per step, the score entry it produced: a `validate` carries it in its observation; a final `submit` or
    auto-submission (`exit_*`) that succeeded produced the last entry."""
    scores: list[dict[str, float] | None] = [None] * len(traj.trajectory)
    for i, step in enumerate(traj.trajectory):
        action = step.action.strip()
        if action == "validate":
            m = _EVAL_SCORE.search(step.observation)
            if m:
                try:
                    scores[i] = json.loads(m.group(1))
                except ValueError:
                    pass
        elif (action == "submit" or action.startswith("exit_")) and i == len(traj.trajectory) - 1:
            scores[i] = final_submission(traj.info.score, traj.info.exit_status)
    return scores


def _header(traj: Trajectory, ctx: dict[str, Any]) -> list[tuple[str, str]]:
    meta = traj.meta
    stats = traj.info.model_stats
    rows = [
        ("source", ctx.get("source", "")),
        ("task", str(ctx.get("task_id") or meta.get("task_id") or "?")),
    ]
    if ctx.get("slot"):
        rows.append(("slot / rollout", f"{ctx['slot']} / {ctx.get('rollout')}"))
    if ctx.get("teacher") or meta.get("model"):
        rows.append(("model", str(ctx.get("teacher") or f"{meta.get('model')} ({meta.get('provider', '?')})")))
    seed = ctx.get("seed", meta.get("seed"))
    if seed is not None:
        rows.append(("seed", str(seed)))
    if ctx.get("sandbox") or meta.get("sandbox"):
        rows.append(("sandbox", str(ctx.get("sandbox") or meta.get("sandbox"))))
    rows.append(("exit status", (traj.info.exit_status or "unknown")
                 + (f" ({traj.info.exit_detail})" if traj.info.exit_detail else "")))
    rows.append(("steps", f"{len(traj.trajectory)}" + (f" of max {ctx['max_steps']}" if ctx.get("max_steps") else "")))
    if ctx.get("baseline"):
        rows.append(("baseline", _scores(ctx["baseline"])))
    rows.append(("scores", " | ".join(_scores(s) for s in traj.info.score) or "none"))
    rows.append(("model stats", f"{stats.api_calls} calls, {stats.tokens_sent} tokens sent, {stats.tokens_received} "
                 f"received, ${stats.total_cost:.4f}"))
    if ctx.get("wall_s") is not None:
        rows.append(("wall", f"{ctx['wall_s']:.1f}s"))
    run = ctx.get("run")
    if run:
        rows.append(("run", f"run {run.get('run')}: valid submission {run.get('valid_submission')}, "
                     f"{run.get('replies')} replies ({run.get('malformed')} malformed), {run.get('wall_s')}s"))
    if ctx.get("note"):
        rows.append(("note", ctx["note"]))
    return rows


def _step_line(step: TrajectoryStep) -> str:
    parts = [f"query {step.query_time:.1f}s", f"exec {step.execution_time:.1f}s",
             f"tokens {step.prompt_tokens}/{step.completion_tokens}"]
    if step.exit_code is not None:
        parts.append(f"exit {step.exit_code}")
    if step.timed_out:
        parts.append("TIMED OUT")
    if step.format_errors:
        parts.append(f"{len(step.format_errors)} malformed repl{'y' if len(step.format_errors) == 1 else 'ies'}")
    return ", ".join(parts)


def render_trajectory_text(traj: Trajectory, ctx: dict[str, Any], *, max_lines: int = 15,
                           max_chars: int = 2000) -> str:
    width = max(len(k) for k, _ in _header(traj, ctx))
    out = [f"{k:<{width}}  {v}" for k, v in _header(traj, ctx)]
    scores = step_scores(traj)
    for step, score in zip(traj.trajectory, scores, strict=True):
        out.append("")
        out.append(f"--- step {step.step}  [{_step_line(step)}]")
        for rejected in step.format_errors:
            out.append("  rejected reply: " + _clip_lines(rejected.get("error", ""), 2))
        thought = step.thought.strip()
        if thought.startswith("DISCUSSION"):
            thought = thought[len("DISCUSSION"):].strip()
        if thought:
            out.append(_hang(_clip_lines(thought, max_lines, max_chars), "  thought: "))
        out.append(_hang(step.action.rstrip(), "  $ ", "    "))
        obs = step.observation.rstrip()
        n = obs.count("\n") + 1 if obs else 0
        out.append(f"  observation ({n} line{'s' if n != 1 else ''}):")
        if obs:
            out.append(_indent(_clip_lines(obs, max_lines, max_chars), "  | "))
        if score is not None:
            out.append(f"  score: {_scores(score)}")
    out.append("")
    out.append(f"exit status: {traj.info.exit_status or 'unknown'}; final scores: "
               f"{_scores(traj.info.score[-1]) if traj.info.score else 'none'}")
    return "\n".join(out)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
table.meta td { padding: 2px 10px 2px 0; vertical-align: top; }
table.meta td:first-child { font-weight: bold; white-space: nowrap; }
section.step { border: 1px solid #ccc; border-radius: 6px; margin: 1em 0; padding: 0.5em 1em; }
section.step h2 { font-size: 1em; margin: 0.2em 0; }
.timing { color: #666; font-weight: normal; font-size: 0.9em; }
pre { background: #f6f6f6; padding: 0.5em; overflow-x: auto; white-space: pre-wrap; word-break: break-word; }
pre.action { background: #eef4ff; border-left: 3px solid #36c; }
.thought { white-space: pre-wrap; }
.score { background: #e9f7ef; border-left: 3px solid #2a2; padding: 0.3em 0.6em; }
.rejected { background: #fff3e6; border-left: 3px solid #e80; padding: 0.3em 0.6em; }
summary { cursor: pointer; color: #36c; }
"""


def render_trajectory_html(traj: Trajectory, ctx: dict[str, Any], *, collapse_lines: int = 20,
                           collapse_chars: int = 2000) -> str:
    """One static, self-contained page (inline CSS, no scripts or external assets; all text escaped)."""
    e = html.escape
    title = f"{ctx.get('task_id') or traj.meta.get('task_id') or 'trajectory'}: {traj.info.exit_status or 'unknown'}"
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{e(title)}</title>", f"<style>{_CSS}</style></head><body>", f"<h1>{e(title)}</h1>",
             '<table class="meta">']
    parts += [f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in _header(traj, ctx)]
    parts.append("</table>")
    first_user = next((m for m in traj.history if m.get("role") == "user"), None)
    if first_user:
        parts.append(f"<details><summary>task prompt ({e(str(len(str(first_user.get('content', '')).splitlines())))} "
                     f"lines)</summary><pre>{e(str(first_user.get('content', '')))}</pre></details>")
    for step, score in zip(traj.trajectory, step_scores(traj), strict=True):
        parts.append(f'<section class="step" id="step-{step.step}"><h2>Step {step.step} '
                     f'<span class="timing">{e(_step_line(step))}</span></h2>')
        for rejected in step.format_errors:
            parts.append(f'<div class="rejected"><details><summary>rejected reply: {e(rejected.get("error", ""))}'
                         f'</summary><pre>{e(rejected.get("response", ""))}</pre></details></div>')
        if step.thought.strip():
            parts.append(f'<div class="thought">{e(step.thought.strip())}</div>')
        parts.append(f'<pre class="action">{e(step.action)}</pre>')
        obs = step.observation
        n = len(obs.splitlines())
        if n > collapse_lines or len(obs) > collapse_chars:
            parts.append(f"<details><summary>observation ({n} lines, {len(obs)} characters)</summary>"
                         f"<pre class=\"observation\">{e(obs)}</pre></details>")
        else:
            parts.append(f'<pre class="observation">{e(obs)}</pre>')
        if score is not None:
            parts.append(f'<div class="score">score: {e(_scores(score))}</div>')
        parts.append("</section>")
    parts.append(f"<p>exit status: <b>{e(traj.info.exit_status or 'unknown')}</b>; final scores: "
                 f"{e(_scores(traj.info.score[-1]) if traj.info.score else 'none')}</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def task_main(args: Any) -> None:
    """`gymforge show-task TASK [--results R] [--full] [--json]`."""
    try:
        summary = task_summary(Path(args.results), args.task)
    except ShowError as err:
        sys.exit(f"gymforge show-task: {err}")
    print(json.dumps(summary, indent=2) if args.json else render_task(summary, full=args.full))


def trajectory_main(args: Any) -> None:
    """`gymforge show-trajectory PATH [--rollout K] [--html OUT] [--max-lines N]`."""
    try:
        traj, context = load_episode(Path(args.path), args.rollout)
    except ShowError as err:
        sys.exit(f"gymforge show-trajectory: {err}")
    if args.html:
        atomic.write_text(Path(args.html), render_trajectory_html(traj, context))
        print(f"{args.html}: {len(traj.trajectory)} steps, {traj.info.exit_status or 'unknown'}")
        return
    print(render_trajectory_text(traj, context, max_lines=args.max_lines))
