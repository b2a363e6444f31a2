"""The run summary shown first in `snakemake --report`: the funnel, discard and failure reasons, and LLM usage.

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
from gymforge.tools.status import collect  # noqa: E402

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


def summary_html(report: dict, out: Path, sft_stats: dict | None = None) -> Path:
    stages = report["stages"]
    funnel = [[n, s["planned"], s["done"], s["ok"], sum(s["discarded"].values()), s["skipped"]] for n, s in stages.items()]
    reasons = [[n, code, count] for n, s in stages.items() for code, count in s["discarded"].items()]
    usage = [[n, s["usage"]["calls"], s["usage"]["cache_hits"], s["usage"]["prompt_tokens"],
              s["usage"]["completion_tokens"], f"{s['usage']['cost_usd']:.4f}"] for n, s in stages.items()]
    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>gymforge run summary</title>"
        f"<style>{_STYLE}</style></head><body>"
        f"<h2>Funnel</h2>{_table(['stage', 'planned', 'done', 'kept', 'discarded', 'skipped'], funnel)}"
        f"<h2>Discard and failure reasons</h2>{_table(['stage', 'reason', 'items'], reasons)}"
        f"{audit_html(sft_stats)}"
        f"<h2>LLM usage per stage</h2>"
        f"{_table(['stage', 'calls', 'cache hits', 'prompt tokens', 'completion tokens', 'cost $'], usage)}"
        f"<p>LLM requests sent (this results directory, all time): {report['llm']['requests_sent']}</p>"
        f"</body></html>\n")
    return atomic.write_text(out, page)


def write_summary(results: Path, html_out: Path, png_out: Path) -> None:
    report = collect(Path(results))
    stats = Path(results) / "sft" / "stats.json"
    summary_html(report, html_out, json.loads(stats.read_text()) if stats.is_file() else None)
    funnel_png(report, png_out)
