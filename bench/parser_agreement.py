"""Agreement of gymforge's reply parser with MLGym's recorded actions on MLGym's released trajectories.

    MLGYM_ROOT=<checkout> .venv/bin/python bench/parser_agreement.py [--show N] [--model NAME] [--target 99.9]

Reads every `<task>.traj` under `$MLGYM_ROOT/trajectories/` (the run folders are named
`metagen-<model>__<task>__...`). Each step whose recorded action is a real action (not MLGym's
`exit_format`/`exit_cost`/... placeholders) is a turn MLGym parsed: MLGym's parser turned that model reply
into that action. A turn agrees when `parse_reply(reply)` returns the same action, compared as MLGym runs it
(`action.strip()`, the way `_run_step` strips it before execution). Prints per model: turns, agreements,
format errors (our parser rejected a reply MLGym accepted), other mismatches and the agreement in percent;
`--show N` prints up to N disagreements with both actions. Exits 1 when the overall agreement is below
`--target` percent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

from gymforge.agent.parsing import FormatError, parse_reply

# Actions MLGym records for turns where no model reply was parsed.
NOT_PARSED = {"exit_format", "exit_cost", "exit_context", "exit_api", "exit_error"}


def model_of(traj: Path) -> str:
    name = traj.parent.name.split("__", 1)[0]
    return name.removeprefix("metagen-")


def turns(root: Path):
    """(model, file, step index, reply, MLGym's action) of every turn MLGym parsed."""
    for traj in sorted(root.glob("trajectories/**/*.traj")):
        try:
            data = json.loads(traj.read_text())
        except (OSError, ValueError) as exc:  # a git-lfs pointer or a truncated file
            print(f"skipped {traj}: {exc}", file=sys.stderr)
            continue
        for i, step in enumerate(data.get("trajectory", [])):
            action, reply = step.get("action"), step.get("response")
            if not isinstance(action, str) or not isinstance(reply, str) or action.strip() in NOT_PARSED:
                continue
            yield model_of(traj), traj, i, reply, action


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.environ.get("MLGYM_ROOT"), help="MLGym checkout (default $MLGYM_ROOT)")
    ap.add_argument("--show", type=int, default=0, help="print up to N disagreements")
    ap.add_argument("--model", help="only this model")
    ap.add_argument("--target", type=float, default=99.9, help="exit 1 below this overall agreement (percent)")
    args = ap.parse_args()
    if not args.root:
        ap.error("set MLGYM_ROOT or pass --root")
    root = Path(args.root)
    stats: dict[str, Counter] = {}
    shown = 0
    for model, traj, i, reply, expected in turns(root):
        if args.model and model != args.model:
            continue
        c = stats.setdefault(model, Counter())
        c["turns"] += 1
        try:
            _, action = parse_reply(reply)
        except FormatError as exc:
            c["format_error"] += 1
            got = f"FormatError: {exc}"
        else:
            if action.strip() == expected.strip():
                c["agree"] += 1
                continue
            c["mismatch"] += 1
            got = action
        if shown < args.show:
            shown += 1
            print(f"--- {traj.relative_to(root)} step {i}\n[reply]\n{reply}\n[mlgym]\n{expected}\n[ours]\n{got}\n")
    total = Counter()
    print(f"{'model':32} {'turns':>6} {'agree':>6} {'fmt_err':>7} {'other':>6} {'agree%':>8}")
    for model in sorted(stats):
        c = stats[model]
        total.update(c)
        print(f"{model:32} {c['turns']:6} {c['agree']:6} {c['format_error']:7} {c['mismatch']:6} "
              f"{100 * c['agree'] / c['turns']:8.2f}")
    if not total["turns"]:
        print(f"no trajectories under {root}/trajectories", file=sys.stderr)
        return 1
    pct = 100 * total["agree"] / total["turns"]
    print(f"{'all':32} {total['turns']:6} {total['agree']:6} {total['format_error']:7} {total['mismatch']:6} "
          f"{pct:8.2f}")
    return 0 if pct >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
