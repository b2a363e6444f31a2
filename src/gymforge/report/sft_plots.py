"""Figures of the trajectory stage (matplotlib, Agg backend: no display needed).

- `kept_per_task.png`, like the paper's Figure 3: kept trajectories per task against the planned count.
- `trajectory_stats.png`, like its Figure 4: a summary table of the kept set, the exit-status breakdown
  (kept vs discarded), the token-length histogram and the turn-count histogram (all rollouts vs kept,
  with the `filter.max_tokens` limit marked).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from gymforge.core import atomic

KEPT, ALL, REJECTED = "#2b8a3e", "#adb5bd", "#e8590c"


def read_summaries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_kept_per_task(stats: dict[str, Any], out: Path) -> Path:
    tasks = sorted(stats["per_task"].items(), key=lambda kv: (-kv[1]["kept"], kv[0]))
    labels = [f"{t['task_id']} ({slot})" for slot, t in tasks]
    kept = [t["kept"] for _, t in tasks]
    rollouts = [t["rollouts"] for _, t in tasks]
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.38 * len(tasks) + 1.4)))
    y = range(len(tasks))
    ax.barh(y, rollouts, color=ALL, label="rollouts")
    ax.barh(y, kept, color=KEPT, label="kept")
    for i, (k, r) in enumerate(zip(kept, rollouts, strict=True)):
        ax.text(r, i, f" {k}/{r}", va="center", fontsize=8)
    ax.axvline(stats["per_task_planned"], color="black", linestyle="--", linewidth=1,
               label=f"planned per task ({stats['per_task_planned']})")
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("trajectories")
    ax.set_title(f"Kept trajectories per task ({stats['kept']} of {stats['rollouts']} over {stats['tasks']} tasks)",
                 pad=22)
    ax.set_xlim(0, max([stats["per_task_planned"], *rollouts]) * 1.18 or 1)
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, fontsize=8, frameon=False)
    return _save(fig, out)


def plot_trajectory_stats(stats: dict[str, Any], summaries: list[dict[str, Any]], out: Path) -> Path:
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    _summary_table(axes[0][0], stats)
    _exit_statuses(axes[0][1], stats)
    kept = [s for s in summaries if s["kept"]]
    with_turns = [s for s in summaries if s["tokens"] is not None]
    _histogram(axes[1][0], [s["tokens"] for s in with_turns], [s["tokens"] for s in kept], "tokens (student tokenizer)",
               "Token length of trajectories", limit=stats["filters"]["max_tokens"])
    _histogram(axes[1][1], [s["turns"] for s in with_turns], [s["turns"] for s in kept], "assistant turns",
               "Turns per trajectory", integer=True)
    fig.suptitle("Trajectories and the SFT set", fontsize=13)
    return _save(fig, out)


def _summary_table(ax: Any, stats: dict[str, Any]) -> None:
    tok, turns = stats["tokens"]["kept"], stats["turns"]["kept"]
    rows = [
        ("rollouts", stats["rollouts"]),
        ("kept trajectories", stats["kept"]),
        ("examples (unit)", f"{stats.get('examples', stats['kept'])} ({stats.get('example_unit', 'conversation')})"),
        ("tasks (with kept)", f"{stats['tasks']} ({stats['tasks_with_kept']})"),
        *((f"discarded: {r}", n) for r, n in stats["discarded"].items()),
        ("tokens: median / max", f"{tok.get('median', 0):g} / {tok.get('max', 0)}"),
        ("tokens: total kept", tok.get("total", 0)),
        ("turns: median / max", f"{turns.get('median', 0):g} / {turns.get('max', 0)}"),
        ("max_tokens filter", stats["filters"]["max_tokens"]),
    ]
    ax.axis("off")
    table = ax.table(cellText=[[k, str(v)] for k, v in rows], colLabels=["final training set", ""],
                     loc="center", cellLoc="left", colWidths=[0.6, 0.35])
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1, 1.3)
    ax.set_title("Summary")


def _exit_statuses(ax: Any, stats: dict[str, Any]) -> None:
    items = sorted(stats["exit_status"].items(), key=lambda kv: -kv[1].get("total", 0))
    names = [k for k, _ in items]
    kept = [v.get("kept", 0) for _, v in items]
    rejected = [v.get("total", 0) - v.get("kept", 0) for _, v in items]
    y = range(len(items))
    ax.barh(y, kept, color=KEPT, label="kept")
    ax.barh(y, rejected, left=kept, color=REJECTED, label="discarded")
    for i, (k, r) in enumerate(zip(kept, rejected, strict=True)):
        ax.text(k + r, i, f" {k}/{k + r}", va="center", fontsize=8)
    ax.set_xlim(0, max([k + r for k, r in zip(kept, rejected, strict=True)] or [1]) * 1.15)
    ax.set_yticks(list(y), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("trajectories")
    ax.set_title("Exit status")
    ax.legend(fontsize=8)


def _histogram(ax: Any, everything: list[int], kept: list[int], xlabel: str, title: str, *, limit: int | None = None,
               integer: bool = False) -> None:
    if not everything:
        ax.text(0.5, 0.5, "no trajectories", ha="center", va="center", transform=ax.transAxes)
    else:
        lo, hi = min(everything), max(everything + ([limit] if limit and limit < 2 * max(everything) else []))
        if integer:
            bins: Any = [b - 0.5 for b in range(lo, max(everything) + 2)]
            if len(bins) > 60:
                bins = 40
        else:
            bins = [lo + (hi - lo) * i / 30 for i in range(31)] if hi > lo else 10
        ax.hist(everything, bins=bins, color=ALL, label=f"all ({len(everything)})")
        ax.hist(kept, bins=bins, color=KEPT, label=f"kept ({len(kept)})")
        if limit is not None and limit <= hi:
            ax.axvline(limit, color=REJECTED, linestyle="--", label=f"max_tokens = {limit}")
        ax.legend(fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("trajectories")
    ax.set_title(title)


def _save(fig: Any, out: Path) -> Path:
    import io

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return atomic.write_bytes(out, buf.getvalue())


def plot_sft(stats_file: Path, summaries_file: Path, kept_out: Path, stats_out: Path) -> list[Path]:
    stats = json.loads(Path(stats_file).read_text())
    return [plot_kept_per_task(stats, kept_out),
            plot_trajectory_stats(stats, read_summaries(summaries_file), stats_out)]
