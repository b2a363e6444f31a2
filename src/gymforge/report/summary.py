"""The run summary shown first in `snakemake --report`: the funnel, discard and failure reasons, AUP with its
intervals, the audit, the benchmark's evaluator probes, the RL curves (when RL ran) and LLM usage.

Two files from `gymforge status`'s numbers: `report/funnel.png` (items per stage, kept vs fallen out) and
`report/summary.html` (a self-contained table page). Snakemake embeds both in its report, next to the
plots the stages already draw (trajectory stats, score violins, AUP, performance profiles, loss curve).
"""

from __future__ import annotations

import html
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from gymforge.core import atomic  # noqa: E402
from gymforge.report.funnel import collect  # noqa: E402
from gymforge.report.rl_plots import curve_png  # noqa: E402
from gymforge.rl.frontier import task_pass_rates  # noqa: E402

_STYLE = ("body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;margin-bottom:1.5em}"
          "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th:first-child,td:first-child{text-align:left}")


def funnel_png(report: dict, out: Path) -> Path:
    stages = report["stages"]
    names = list(stages)
    ok = [stages[n]["ok"] for n in names]
    lost = [stages[n]["done"] - stages[n]["ok"] for n in names]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.bar(names, ok, color="#2b8a3e", label="kept")
    ax.bar(names, lost, bottom=ok, color="#e8590c", label="discarded, skipped or failed")
    for i, n in enumerate(names):
        ax.text(i, ok[i] + lost[i], f"{ok[i]}/{stages[n]['planned']}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("items")
    ax.set_title("Funnel: kept of planned, per stage")
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return atomic.write_bytes(out, buf.getvalue())


def _table(head: list[str], rows: list[list[object]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


def audit_html(stats: dict | None) -> str:
    """The suspicious-action audit of the rollouts (from `sft/stats.json`), or nothing before the SFT data exist."""
    if not stats or "audit" not in stats:
        return ""
    audit = stats["audit"]
    verdict = "excluded from the SFT data" if audit["excluded"] else "kept (filter.exclude_flagged: false)"
    rows = [[code, count] for code, count in audit["by_code"].items()]
    listed = ", ".join(audit["rollouts"][:20]) + (" ..." if len(audit["rollouts"]) > 20 else "")
    return (f"<h2>Suspicious actions (audit)</h2><p>{audit['flagged_rollouts']} of {stats['rollouts']} rollouts "
            f"flagged, {verdict}{': ' + html.escape(listed) if listed else ''}</p>"
            f"{_table(['flag', 'rollouts'], rows) if rows else ''}")


def rl_html(results: Path) -> str:
    """The RL reward curves (`rl/<student>/curve.json`, rule train_rl), or nothing when no RL ran."""
    import base64

    parts = []
    for curve_file in sorted(Path(results).glob("rl/*/curve.json")):
        curve = json.loads(curve_file.read_text())
        rows = curve.get("iterations", [])
        if not rows:
            continue
        png = base64.b64encode(curve_png(rows, dpi=90)).decode()
        table = _table(["iteration", "tasks", "mean reward", "valid share", "mean duration s", "KL",
                        "zero-variance groups dropped"],
                       [[r["iteration"], " ".join(r.get("tasks", [])), f"{r['mean_reward']:.3f}",
                         f"{r['valid_share']:.2f}", f"{r['mean_duration_s']:.2f}", f"{r['kl']:.4f}",
                         _dropped(r)] for r in rows])
        table += _pass_rate_table(rows)
        quarters = ""
        if "first_quarter_mean_reward" in curve:
            quarters = (f"<p>mean reward, first quarter of the iterations {curve['first_quarter_mean_reward']:.3f}, "
                        f"last quarter {curve['last_quarter_mean_reward']:.3f}</p>")
        parts.append(f"<h2>On-policy RL: {html.escape(curve_file.parent.name)}</h2>{quarters}"
                     f"<img src='data:image/png;base64,{png}' alt='reward curve'>{table}")
    return "".join(parts)


def _dropped(row: dict) -> str:
    """`dropped of groups` of one curve row (dynamic sampling), `update skipped` when none was left; `-` before."""
    if "groups" not in row:
        return "-"
    text = f"{row['groups_dropped_zero_variance']} of {row['groups']}"
    return text + (" (update skipped)" if row.get("update_skipped") else "")


def _pass_rate_table(rows: list[dict]) -> str:
    """Per task over the run (frontier sampling, `gymforge.rl.frontier`): groups, episodes, pass rate overall and in
    its last group, groups dropped for zero reward variance. Nothing for a curve without per-task counts."""
    tasks = task_pass_rates(rows)
    if not tasks:
        return ""

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    body = [[slot, t["groups"], t["episodes"], t["passes"], rate(t["pass_rate"]), rate(t["last"]), t["dropped"]]
            for slot, t in sorted(tasks.items())]
    return ("<h3>Per-task pass rates</h3><p>pass: the final submission beat the task's baseline, unflagged; "
            "frontier sampling prefers tasks passed about half of the time</p>"
            + _table(["task", "groups", "episodes", "passes", "pass rate", "last group", "zero-variance groups"],
                     body))


def _scores(results: Path) -> dict:
    """`scores/scores.json` (rule score_table), or {} before scoring."""
    path = Path(results) / "scores" / "scores.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def aup_html(results: Path) -> str:
    """AUP per model with its bootstrap interval, and each student's difference from the model it started from
    (`scores/scores.json`, rule score_table: `gymforge.benchmark.aup.bootstrap_aup`), or nothing before scoring."""
    scores = _scores(results)
    boot = scores.get("bootstrap")
    if not boot or not boot.get("aup"):
        return ""
    pct = f"{boot['level']:.0%}"
    suite = (f" on the {scores['benchmark']} benchmark ({len(scores.get('benchmark_tasks') or scores.get('tasks') or [])}"
             f" tasks)" if scores.get("benchmark") else "")

    def cell(x: dict, signed: bool = False) -> str:
        f = "+.3f" if signed else ".3f"
        lo, hi = x["ci"]
        return f"{x['estimate']:{f}} [{lo:{f}}, {hi:{f}}]"

    models = sorted(boot["aup"].items(), key=lambda kv: (-kv[1]["best_aup"]["estimate"], kv[0]))
    rows = [[m, cell(x["best_aup"]), cell(x["last_aup"])] for m, x in models]
    rows += [[name, cell(d["best_aup"], True), cell(d["last_aup"], True)] for name, d in boot["differences"].items()]
    return (f"<h2>AUP with {pct} intervals{suite}</h2><p>Best Attempt (Best AUP) and Best Submission (Last AUP) per model, "
            f"then each student's paired difference from the model it started from; {boot['samples']} bootstrap "
            f"replicates over runs (seed {boot['seed']}).</p>"
            + _table(["model", f"Best AUP [{pct} CI]", f"Last AUP [{pct} CI]"], rows))


def evaluators_html(results: Path) -> str:
    """The benchmark's evaluator probes (`scores/scores.json`, rule check_benchmark_task): each gameable task
    with the probe that gamed it, beside its AUP contribution (each model's performance ratio)."""
    scores = _scores(results)
    evaluators = scores.get("evaluators")
    if not evaluators or not evaluators.get("checked"):
        return ""
    rows = []
    for task in evaluators["gameable"]:
        report = evaluators["reports"][task]
        probes = ", ".join(f"{p['name']} ({p['score']:g})" for p in report["gameable_probes"])
        entry = scores["tasks"].get(task)
        ratios = ("left out of AUP" if entry is None else
                  ", ".join(f"{m} {v['ratio_submission']:.3g}" if v["ratio_submission"] is not None else f"{m} -"
                            for m, v in entry["models"].items()))
        rows.append([task, f"{report['baseline']:g}", probes, ratios])
    head = (f"<h2>Benchmark evaluators (probes)</h2><p>{len(evaluators['checked'])} tasks probed with "
            f"knowledge-free degenerate submissions; {len(rows)} gameable"
            f"{' (left out of AUP: evaluate.exclude_gameable)' if evaluators.get('excluded') else ''}.</p>")
    return head + (_table(["task", "baseline", "gameable by (score)", "AUP contribution (ratio per model)"], rows)
                   if rows else "")


def tracker_html(results: Path) -> str:
    """Where the SFT and RL curves were also logged (trackio's store under results/, gymforge.runtime.tracking)."""
    store = Path(results) / "trackio"
    projects = sorted(p.stem for p in store.glob("*.db"))
    if not projects:
        return ""
    items = "".join(f"<li><code>TRACKIO_DIR={html.escape(str(store.resolve()))} trackio show --project "
                    f"{html.escape(p)}</code></li>" for p in projects)
    return (f"<h2>Tracker</h2><p>SFT and RL logged every step to trackio in <code>{html.escape(str(store))}</code> "
            f"(the runs <code>sft-&lt;student&gt;-seed&lt;k&gt;</code> and <code>rl-&lt;student&gt;-seed&lt;k&gt;</code>); "
            f"its dashboard:</p><ul>{items}</ul>")


def summary_html(report: dict, out: Path, sft_stats: dict | None = None, results: Path | None = None) -> Path:
    stages = report["stages"]
    funnel = [[n, s["planned"], s["done"], s["ok"], sum(s["discarded"].values()), s["skipped"]] for n, s in stages.items()]
    reasons = [[n, code, count] for n, s in stages.items() for code, count in s["discarded"].items()]
    reasons += [[n, f"repaired ({code}), then kept", count] for n, s in stages.items()
                for code, count in s.get("repaired", {}).items()]
    usage = [[n, s["usage"]["calls"], s["usage"]["cache_hits"], s["usage"]["prompt_tokens"],
              s["usage"]["completion_tokens"], f"{s['usage']['cost_usd']:.4f}"] for n, s in stages.items()]
    usage_head = ["stage", "calls", "cache hits", "prompt tokens", "completion tokens", "cost $"]
    if any(s["usage"].get("reasoning_tokens") for s in stages.values()):  # a reasoning teacher: its hidden tokens too
        usage_head.insert(5, "of them reasoning")
        for row, s in zip(usage, stages.values(), strict=True):
            row.insert(5, s["usage"].get("reasoning_tokens", 0))
    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>gymforge run summary</title>"
        f"<style>{_STYLE}</style></head><body>"
        f"<h2>Funnel</h2>{_table(['stage', 'planned', 'done', 'kept', 'discarded', 'skipped'], funnel)}"
        f"<h2>Discard and failure reasons</h2>{_table(['stage', 'reason', 'items'], reasons)}"
        f"{aup_html(results) if results else ''}"
        f"{audit_html(sft_stats)}"
        f"{evaluators_html(results) if results else ''}"
        f"{rl_html(results) if results else ''}"
        f"{tracker_html(results) if results else ''}"
        f"<h2>LLM usage per stage</h2>"
        f"{_table(usage_head, usage)}"
        f"<p>LLM requests sent (this results directory, all time): {report['llm']['requests_sent']}</p>"
        f"</body></html>\n")
    return atomic.write_text(out, page)


def write_summary(results: Path, html_out: Path, png_out: Path) -> None:
    report = collect(Path(results))
    stats = Path(results) / "sft" / "stats.json"
    summary_html(report, html_out, json.loads(stats.read_text()) if stats.is_file() else None, Path(results))
    funnel_png(report, png_out)
