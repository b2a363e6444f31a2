"""`gymforge status`: the funnel of a results directory (`gymforge.report.funnel.collect`) as a table, once or
redrawn with rates and ETAs (`--watch`)."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from gymforge.runtime.progress import fmt_duration
from gymforge.report.funnel import collect


def render_table(report: dict, rates: dict[str, tuple[float | None, float | None]] | None = None) -> str:
    """The funnel as a table; with `rates` (stage -> (items per minute, ETA seconds), from `stage_rates`) two more
    columns, `/min` and `ETA`."""
    head = (f"{'stage':<12} {'planned':>7} {'done':>5} {'ok':>4} {'discarded':>9} {'skipped':>7} {'failed':>6} "
            f"{'calls':>6} {'retry':>5} {'killed':>6} {'cached':>6} {'tokens':>8} {'cost $':>8}")
    if rates is not None:
        head += f" {'/min':>7} {'ETA':>8}"
    lines = [f"results: {report['results_dir']}", head, "-" * len(head)]
    for name, s in report["stages"].items():
        u, llm = s["usage"], s["llm"]
        row = (
            f"{name:<12} {s['planned']:>7} {s['done']:>5} {s['ok']:>4} {sum(s['discarded'].values()):>9} "
            f"{s['skipped']:>7} {sum(s['failed'].values()):>6} {u['calls']:>6} {llm['retries']:>5} "
            f"{llm['killed_in_flight']:>6} {u['cache_hits']:>6} {u['prompt_tokens'] + u['completion_tokens']:>8} "
            f"{u['cost_usd']:>8.4f}")
        if rates is not None:
            rate, eta = rates.get(name, (None, None))
            row += f" {_fmt_rate(rate):>7} {_fmt_eta(s, eta):>8}"
        lines.append(row)
        if reasoning := u.get("reasoning_tokens"):
            lines.append(f"{'':<12}reasoning tokens: {reasoning} (within tokens; billed as output)")
        for code, count in s["discarded"].items():
            lines.append(f"{'':<12}{code}: {count}")
        for code, count in s.get("repaired", {}).items():
            lines.append(f"{'':<12}repaired ({code}), then kept: {count}")
        for code, count in s["failed"].items():
            lines.append(f"{'':<12}failed ({code}): {count}")
        if llm["errors"]:
            lines.append(f"{'':<12}failed attempts: " + ", ".join(f"{k} {v}" for k, v in sorted(llm["errors"].items())))
    lines.append(f"LLM requests sent (all time, this results dir, every attempt): {report['llm']['requests_sent']}")
    if budget := report["llm"].get("budget"):
        lines.append(f"LLM budget: ${budget['budget_usd']:.4f}, spent ${budget['spent_usd']:.4f} "
                     f"({budget['spent_usd'] / budget['budget_usd']:.0%}), reserved ${budget['reserved_usd']:.4f} by "
                     f"{budget['in_flight']} requests in flight, remaining ${budget['remaining_usd']:.4f}")
    if report.get("lock") == "stale":
        lines.append("Snakemake lock: stale (left by a killed run); the next snakemake run removes it")
    elif report.get("lock") == "elsewhere":
        lines.append("Snakemake lock: held by a run on another host (.snakemake/gymforge-lock-owner.json names it)")
    elif report.get("lock") == "unknown":
        lines.append("Snakemake lock: present; if no Snakemake runs here, clear it with: snakemake --unlock")
    return "\n".join(lines)


# ---- watch ------------------------------------------------------------------------------------------


def _fmt_rate(rate: float | None) -> str:
    if rate is None:
        return "-"
    return f"{rate:.1f}" if rate < 100 else f"{rate:.0f}"


def _fmt_eta(stage: dict, eta: float | None) -> str:
    if stage["planned"] and stage["done"] >= stage["planned"]:
        return "done"
    return fmt_duration(eta) if eta is not None else "-"


def stage_rates(first: tuple[float, dict], last: tuple[float, dict]) -> dict[str, tuple[float | None, float | None]]:
    """Per stage, (items done per minute, seconds left at that pace) between two (time, `collect()` report)
    snapshots; (None, None) where nothing finished in between (not derivable)."""
    (t0, r0), (t1, r1) = first, last
    span = t1 - t0
    out: dict[str, tuple[float | None, float | None]] = {}
    for name, stage in r1["stages"].items():
        before = r0["stages"].get(name, {}).get("done", 0)
        gained = stage["done"] - before
        if span <= 0 or gained <= 0:
            out[name] = (None, None)
            continue
        per_s = gained / span
        out[name] = (per_s * 60, max(0, stage["planned"] - stage["done"]) / per_s)
    return out


def watch(results: Path, interval: float = 5.0, count: int | None = None, *, out=None, tty: bool | None = None,
          sleep=None, clock=None, window_s: float = 600.0) -> int:
    """Redraw the funnel every `interval` seconds until interrupted (or `count` tables): the screen is cleared
    on a terminal, tables follow each other otherwise. Rates and ETAs come from how many items finished while
    watching (over the last `window_s` seconds). Returns the number of tables shown."""
    out = out if out is not None else sys.stdout
    if tty is None:
        isatty = getattr(out, "isatty", None)
        tty = bool(isatty and isatty())
    sleep = sleep or time.sleep
    clock = clock or time.monotonic
    start = clock()
    history: list[tuple[float, dict]] = []
    shown = 0
    try:
        while True:
            report = collect(Path(results))
            now = clock()
            history.append((now, report))
            while len(history) > 2 and now - history[1][0] >= window_s:
                history.pop(0)  # keep one snapshot at least window_s old, so the rate follows the recent pace
            rates = stage_rates(history[0], history[-1])
            header = (f"gymforge status --watch: {datetime.now().strftime('%H:%M:%S')}, watching for "
                      f"{fmt_duration(now - start)}, every {interval:g}s (Ctrl-C to stop); /min and ETA from "
                      "items finished while watching")
            text = header + "\n" + render_table(report, rates=rates)
            out.write(("\x1b[H\x1b[2J" + text + "\n") if tty else (text + "\n\n"))
            out.flush()
            shown += 1
            if count is not None and shown >= count:
                break
            sleep(interval)
    except KeyboardInterrupt:
        out.write("\n")
    return shown


def main(args: Any) -> None:
    """`gymforge status [--results R] [--json] [--watch ...]`."""
    if args.watch:
        watch(Path(args.results), interval=args.interval, count=args.count)
        return
    if not Path(args.results).is_dir():  # checked first: reading the LLM ledger would create results/llm/
        sys.exit(f"gymforge status: {args.results}: no results directory (run the workflow here, or pass "
                 f"--results DIR)")
    report = collect(Path(args.results))
    print(json.dumps(report, indent=2) if args.json else render_table(report))
