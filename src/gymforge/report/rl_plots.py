"""The figure of the on-policy RL stage (matplotlib, Agg backend): mean reward and valid-submission share per
iteration, from `rl/<student>/curve.json` (rule train_rl). Rule rl_plot writes it for `snakemake --report`; the run
summary (`gymforge.report.summary.rl_html`) embeds the same figure beside its per-iteration table."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from gymforge.core import atomic  # noqa: E402


def curve_png(rows: list[dict[str, Any]], *, title: str = "", dpi: int = 110) -> bytes:
    """The reward curve of `rows` (curve.json's `iterations`) as PNG bytes; a curve without iterations says so."""
    fig, ax = plt.subplots(figsize=(6, 3))
    if rows:
        steps = [r["iteration"] for r in rows]
        ax.plot(steps, [r["mean_reward"] for r in rows], marker="o", label="mean reward")
        ax.plot(steps, [r["valid_share"] for r in rows], marker=".", label="valid share")
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no finished iteration", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def plot_curve(curve: Path, out: Path) -> Path:
    """`out`: the reward curve of the curve file `curve` (titled with its student's name and quarter means)."""
    data = json.loads(Path(curve).read_text())
    title = f"On-policy RL: {Path(curve).parent.name}"
    if "first_quarter_mean_reward" in data:
        title += (f" (mean reward {data['first_quarter_mean_reward']:.3f} -> "
                  f"{data['last_quarter_mean_reward']:.3f}, first -> last quarter)")
    return atomic.write_bytes(out, curve_png(data.get("iterations", []), title=title))
