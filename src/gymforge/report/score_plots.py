"""Figures of the scores stage (matplotlib, Agg backend; every PNG written atomically).

- `violins`: per-task distributions of each model's per-run Best Attempt (like MLGym's paper, Figure 5), the
  baseline as a dashed line;
- `aup_bars`: Best AUP / Last AUP per model (Figure 6);
- `performance_profiles`: rho_m(tau) step curves, one panel per variant.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from gymforge.core import atomic  # noqa: E402
from gymforge.benchmark.aup import BASELINE, AupResult, RunResult, TaskMeta, aup_rows, build_table  # noqa: E402

BASELINE_COLOR = "#495057"


def _colors(models: Sequence[str]) -> dict[str, Any]:
    """A stable colour per model (the baseline grey)."""
    cmap = plt.get_cmap("tab10" if len(models) <= 10 else "tab20")
    real = [m for m in models if m != BASELINE]
    out: dict[str, Any] = {m: cmap(i % cmap.N) for i, m in enumerate(real)}
    out[BASELINE] = BASELINE_COLOR
    return out


def _save(fig: Any, out: str | Path) -> Path:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return atomic.write_bytes(out, buf.getvalue())


def violins(runs: Sequence[RunResult], metas: Mapping[str, TaskMeta], out_png: str | Path, *,
            tasks: Sequence[str] | None = None, baselines: Mapping[str, float] | None = None) -> Path:
    """One subplot per task, one violin per model of its per-run Best Attempt scores; a model with fewer than two
    values is drawn as points; the baseline is a dashed horizontal line; a task without scores says so."""
    table = build_table(runs, metas, tasks=tasks, baselines=baselines)
    task_ids = list(table.tasks)
    models = table.models
    colors = _colors(table.all_models)
    n = max(1, len(task_ids))
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(4.5, 1.1 * len(models) + 2.2) * ncols, 3.6 * nrows),
                             squeeze=False)
    flat = list(axes.flat)
    if not task_ids:
        flat[0].text(0.5, 0.5, "no tasks with runs", ha="center", va="center", transform=flat[0].transAxes)
        flat[0].set_axis_off()
    for ax, tid in zip(flat, task_ids, strict=False):  # the grid may hold more axes than tasks
        ts = table.tasks[tid]
        any_data = False
        for x, m in enumerate(models, start=1):
            vals = [r.best_attempt for r in ts.models[m].runs if r.best_attempt is not None]
            if len(vals) >= 2 and len(set(vals)) > 1:
                parts = ax.violinplot([vals], positions=[x], widths=0.8, showmedians=True, showextrema=True)
                for body in parts["bodies"]:
                    body.set_facecolor(colors[m])
                    body.set_edgecolor("black")
                    body.set_alpha(0.6)
                for key in ("cmedians", "cmins", "cmaxes", "cbars"):
                    if key in parts:
                        parts[key].set_color("black")
                        parts[key].set_linewidth(0.8)
            if vals:
                any_data = True
                jitter = np.linspace(-0.08, 0.08, len(vals)) if len(vals) > 1 else np.zeros(1)
                ax.scatter(x + jitter, vals, s=14, color=colors[m], edgecolor="black", linewidth=0.4, zorder=3)
            if not ts.models[m].runs:
                ax.text(x, 0.02, "no runs", ha="center", va="bottom", fontsize=7, color="grey",
                        transform=ax.get_xaxis_transform())
            elif not vals:
                ax.text(x, 0.02, "no score", ha="center", va="bottom", fontsize=7, color="grey",
                        transform=ax.get_xaxis_transform())
        if ts.baseline is not None:
            ax.axhline(ts.baseline, color=BASELINE_COLOR, linestyle="--", linewidth=1,
                       label=f"baseline ({ts.baseline:.4g})")
            ax.legend(fontsize=7, loc="best")
        if not any_data:
            ax.text(0.5, 0.5, "no scores", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_xticks(range(1, len(models) + 1), models, rotation=30, ha="right", fontsize=8)
        ax.set_xlim(0.3, len(models) + 0.7)
        arrow = "higher is better" if ts.meta.higher_is_better else "lower is better"
        ax.set_ylabel(f"{ts.meta.metric} ({arrow})", fontsize=8)
        ax.set_title(tid, fontsize=10)
        ax.grid(True, axis="y", linestyle="--", alpha=0.3)
    for ax in flat[len(task_ids):] if task_ids else flat[1:]:
        ax.set_axis_off()
    fig.suptitle("Best Attempt per run", fontsize=12)
    return _save(fig, out_png)


def aup_bars(aup_result: AupResult, out_png: str | Path) -> Path:
    """Grouped bars: Best AUP and Last AUP of every model and the baseline, sorted like the CSV."""
    rows = aup_rows(aup_result)
    names = [r[0] for r in rows]
    best = [aup_result.best_aup(m) for m in names]
    last = [aup_result.last_aup(m) for m in names]
    x = np.arange(len(names))
    w = 0.38
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(names) + 2.5), 4.2))
    b1 = ax.bar(x - w / 2, best, w, color="#1c7ed6", label="Best AUP (best attempt)")
    b2 = ax.bar(x + w / 2, last, w, color="#f08c00", label="Last AUP (best submission)")
    for bars in (b1, b2):
        for bar in bars:
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{bar.get_height():.3f}",
                    ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("AUP")
    ax.set_ylim(0, max([aup_result.T, *best, *last, 0.1]) * 1.3)
    ax.axhline(aup_result.T, color="grey", linestyle=":", linewidth=1, label=f"maximum (T = {aup_result.T:g})")
    ax.set_title(f"Area under the performance profile ({len(aup_result.tasks)} tasks, eps = {aup_result.eps:g})")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(True, axis="y", linestyle="--", alpha=0.3)
    return _save(fig, out_png)


def performance_profiles(aup_result: AupResult, out_png: str | Path) -> Path:
    """rho_m(tau) as step curves, Best Attempt and Best Submission side by side."""
    tau = np.asarray(aup_result.tau)
    colors = _colors(aup_result.models)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, variant, title in zip(axes, ("attempt", "submission"), ("Best Attempt", "Best Submission"), strict=True):
        prof = aup_result.profile(variant)  # type: ignore[arg-type]
        for m in aup_result.models:
            ax.step(tau, prof.rho[m], where="post", color=colors[m], linewidth=1.6,
                    linestyle="--" if m == BASELINE else "-", label=f"{m} (AUP {prof.aup[m]:.3f})")
        ax.set_xlim(0, max(aup_result.T, 1e-9))
        ax.set_ylim(-0.02, 1.05)
        ax.set_xlabel(r"$\tau$ (log$_{10}$ of the performance ratio)")
        ax.set_title(f"{title} profile ({len(aup_result.tasks)} tasks)")
        ax.grid(True, linestyle="--", alpha=0.4)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel(r"$\rho(\tau)$: share of tasks with log$_{10}$ ratio $\leq \tau$")
    return _save(fig, out_png)
