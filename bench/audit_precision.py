"""Precision of the suspicious-action audit on MLGym's released trajectories.

    MLGYM_ROOT=<checkout> .venv/bin/python bench/audit_precision.py [--root DIR] [--show]

Audits every `<task>.traj` under `$MLGYM_ROOT/trajectories/` exactly as `gymforge import-trajectories` does
(`Auditor.check_command` per step, MLGym's workspace and `evaluate.py`, the step's observation) and prints,
per flag code, how many trajectories it flags, now and as the audit did before it read observations (every
write of the evaluator `eval_tamper`).

Then the ground truth for each step that writes `evaluate.py` (`eval_tamper` or `eval_edit_rejected`), judged
independently of the audit's refusal patterns: did the evaluator's content change?

1. Listings. MLGym's file viewer prints the open file as `[File: <path> (N lines total)]` and numbered lines
   after `open`, `goto`, `scroll_*` and every `edit`/`insert` (the file *after* the step; a syntax-rejected
   edit also prints the rejected version, "how your edit would have looked", which is skipped: its last
   listing is the file as restored). The listings of `evaluate.py` are replayed in order: the writes since
   the previous listing `changed` the evaluator when the next listing differs from what the listings before
   showed (the line count, or any line both show), and left it `unchanged` when it agrees on the line count
   and on every line both show.
2. File mode. Otherwise, when an `ls -l` of the workspace (or of `evaluate.py`) in the same run shows the
   evaluator without its owner's write bit (MLGym's `evaluation_read_only` is `chmod 555`; the agent's tools
   write as the agent, and restoring the bit would be a `chmod` of the evaluator, itself `eval_tamper`), the
   step could not have written it: `unchanged (read-only)`.
3. Else the step is `undetermined`; `--show` prints every step with its verdict and the first line the tool
   printed, for a reading by hand.

Replaying every listing also finds evaluator changes the audit did not flag (a miss: a change with no
`eval_tamper` step since the previous listing).

Precision of a code: the share of the trajectories it flags whose flag is true (`eval_tamper`: at least one
flagged step changed the evaluator; `eval_edit_rejected`: none of its steps changed it), counted over the
trajectories with evidence, the undetermined ones shown apart. Exits 1 when an `eval_edit_rejected` step is
seen to have changed the evaluator (a real change the audit let through as a rejected attempt).

On MLGym's release (671 trajectories): 39 flagged, as before; `eval_tamper` 6 (was 39), all 6 seen to change
`evaluate.py` (languageModelingFineWeb runs whose evaluator was writable); `eval_edit_rejected` 35 (33 with
no other flag), 20 confirmed unchanged by listings or file mode, none seen changed; the 15 undetermined ones,
read by hand, hold only refusals that cannot have written: "You cannot edit read-only file" in 12
(edit_linting.sh and insert_linting.sh print it only on paths that return before the write), a syntax-
rejected edit in 2 (the restored listing has the line count from before the edit), a usage error in 1 and a
`create` of an existing file in 1 (both return before writing; that run also has a read-only refusal).
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymforge.agent.audit import Auditor
from gymforge.agent.sources import MLGYM_EVALUATION, MLGYM_WORKDIR, mlgym_flags

EVALUATOR = posixpath.join(MLGYM_WORKDIR, MLGYM_EVALUATION[0])
_HEADER = re.compile(r"^\[File: (.+?) \((\d+) lines total\)\]$")
_LINE = re.compile(r"^(\d+):(.*)$")
_WOULD_HAVE = "This is how your edit would have looked if applied"
_LS_ROW = re.compile(r"^[-l]([r-])([w-])([xsS-])[rwxsStT-]{6}\S*\s+\d+\s+\S+\s+\S+\s+\d+\s+\w+\s+\d+\s+[\d:]+\s+(\S+)$")


def evaluator_mode(action: str, cwd: str, observation: str) -> bool | None:
    """From an `ls -l` of the workspace (or of the evaluator): whether the evaluator's owner may write it
    (None: not listed)."""
    words = action.split()
    if not words or words[0] != "ls" or not any(w.startswith("-") and "l" in w for w in words[1:]):
        return None
    named = [posixpath.normpath(posixpath.join(cwd, w)) for w in words[1:] if not w.startswith("-")] or [cwd]
    if not set(named) & {MLGYM_WORKDIR, EVALUATOR}:
        return None
    for row in observation.splitlines():
        m = _LS_ROW.match(row.strip())
        if m and m.group(4).rstrip("*@=|/") == posixpath.basename(EVALUATOR):  # `ls -F` marks executables `*`
            return m.group(2) == "w"
    return None


@dataclass
class Listing:
    total: int
    lines: dict[int, str]


def listings(observation: str) -> list[Listing]:
    """The listings of the evaluator in one observation, in order (a rejected edit's preview skipped)."""
    found: list[Listing] = []
    rows = observation.splitlines()
    preview = False
    i = 0
    while i < len(rows):
        row = rows[i].rstrip("\r")
        if row.strip() == _WOULD_HAVE:
            preview = True
        m = _HEADER.match(row.strip())
        if not m:
            i += 1
            continue
        lines: dict[int, str] = {}
        i += 1
        while i < len(rows) and (n := _LINE.match(rows[i].rstrip("\r"))):
            lines[int(n.group(1))] = n.group(2)
            i += 1
        if posixpath.normpath(m.group(1)) == EVALUATOR and not preview:
            found.append(Listing(int(m.group(2)), lines))
        preview = False
    return found


def differs(known: Listing, after: Listing) -> bool | None:
    """True: the evaluator changed since the listings merged in `known`; False: `after` agrees with them;
    None: nothing to compare (the same line count, no line both show)."""
    if known.total != after.total:
        return True
    common = known.lines.keys() & after.lines.keys()
    if not common:
        return None
    return any(known.lines[k] != after.lines[k] for k in common)


@dataclass
class Step:
    index: int
    codes: set[str]
    old_codes: set[str]
    action: str
    observation: str
    verdict: str = "undetermined"  # changed | unchanged | unchanged (read-only) | undetermined


@dataclass
class Run:
    path: str
    codes: list[str]
    old_codes: list[str]
    writes: list[Step] = field(default_factory=list)  # steps flagged for writing the evaluator
    misses: list[tuple[int, int]] = field(default_factory=list)  # (from, to): changed, no eval_tamper step between


EVAL_CODES = {"eval_tamper", "eval_edit_rejected"}


def audit_run(path: Path, data: dict[str, Any]) -> Run:
    steps = [s for s in data.get("trajectory") or [] if isinstance(s, dict)]
    new, old = (Auditor(Path(MLGYM_WORKDIR), MLGYM_WORKDIR, evaluation_paths=MLGYM_EVALUATION) for _ in range(2))
    per_step: list[tuple[set[str], set[str], str, str]] = []
    modes: list[bool] = []  # owner-writable, per `ls -l` of the workspace that lists the evaluator
    for step in steps:
        try:
            state = json.loads(step.get("state") or "{}")
        except (TypeError, ValueError):
            state = {}
        state = state if isinstance(state, dict) else {}
        action = str(step.get("action") or "").strip()
        observation = step.get("observation")
        observation = observation if isinstance(observation, str) else ""
        kw = {"cwd": str(state.get("working_dir") or MLGYM_WORKDIR), "open_file": state.get("open_file")}
        if not action:
            per_step.append((set(), set(), action, observation))
            continue
        if (mode := evaluator_mode(action, kw["cwd"], observation)) is not None:
            modes.append(mode)
        codes = {f.code for f in new.check_command(action, observation=observation, **kw)}  # type: ignore[arg-type]
        old_codes = {f.code for f in old.check_command(action, **kw)}  # type: ignore[arg-type]
        per_step.append((codes, old_codes, action, observation))
    codes = sorted(set().union(*(c for c, _, _, _ in per_step)))
    if codes != mlgym_flags(steps):  # the same audit as the import, step by step
        raise SystemExit(f"{path}: per-step flags {codes} differ from mlgym_flags {mlgym_flags(steps)}")
    run = Run(str(path), codes, sorted(set().union(*(o for _, o, _, _ in per_step))))
    last: Listing | None = None  # the evaluator as known from the listings since its last change
    last_at = -1
    pending: list[Step] = []  # write steps since the last listing
    for i, (codes_i, old_i, action, observation) in enumerate(per_step):
        step = None
        if codes_i & EVAL_CODES:
            step = Step(i, codes_i, old_i, action, observation)
            run.writes.append(step)
            pending.append(step)
        for listing in listings(observation):
            change = differs(last, listing) if last is not None else None
            if last is not None and not change:  # the same file: what both listings show is known of it
                listing = Listing(listing.total, {**last.lines, **listing.lines})
            if change is not None and pending:
                # the first listing after a write settles the steps since the previous listing: one change
                # among several writes is charged to each of them (there is no finer evidence)
                for s in pending:
                    s.verdict = "changed" if change else "unchanged"
            if change and not any("eval_tamper" in s.codes for s in pending):
                run.misses.append((last_at, i))
            pending = [] if change is not None else pending
            last, last_at = listing, i
    if modes and not any(modes) and "eval_tamper" not in run.codes:  # read-only whenever listed, never re-moded
        for s in run.writes:
            if s.verdict == "undetermined":
                s.verdict = "unchanged (read-only)"
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.environ.get("MLGYM_ROOT"), help="MLGym checkout (default $MLGYM_ROOT)")
    ap.add_argument("--show", action="store_true", help="print every flagged step with its verdict")
    args = ap.parse_args()
    if not args.root:
        ap.error("set MLGYM_ROOT or pass --root")
    root = Path(args.root)
    base = root / "trajectories" if (root / "trajectories").is_dir() else root
    runs: list[Run] = []
    for traj in sorted(base.rglob("*.traj")):
        try:
            data = json.loads(traj.read_text())
        except (OSError, ValueError) as exc:  # a git-lfs pointer or a truncated file
            print(f"skipped {traj}: {exc}", file=sys.stderr)
            continue
        if isinstance(data, dict):
            runs.append(audit_run(traj.relative_to(base), data))
    if not runs:
        print(f"no trajectories under {base}", file=sys.stderr)
        return 1

    n = len(runs)
    print(f"{n} trajectories under {base}\n")
    print(f"{'flag code':22} {'before':>7} {'after':>7}")
    before, after = Counter(), Counter()
    for r in runs:
        before.update(r.old_codes)
        after.update(r.codes)
    for code in sorted(set(before) | set(after)):
        print(f"{code:22} {before[code]:7} {after[code]:7}")
    flagged_old = sum(1 for r in runs if r.old_codes)
    flagged_new = sum(1 for r in runs if r.codes)
    dropped_new = sum(1 for r in runs if set(r.codes) - {"eval_edit_rejected"})
    print(f"{'any flag':22} {flagged_old:7} {flagged_new:7}")
    print(f"{'dropped by default':22} {flagged_old:7} {dropped_new:7}   "
          f"({100 * flagged_old / n:.1f}% -> {100 * dropped_new / n:.1f}% of {n})\n")

    # ground truth per step and per trajectory
    print("steps that write evaluate.py, by the replayed listings of it:")
    print(f"{'code':22} {'steps':>6} {'changed':>8} {'unchanged':>10} {'read-only':>10} {'undetermined':>13}")
    for code in ("eval_tamper", "eval_edit_rejected"):
        steps = [s for r in runs for s in r.writes if code in s.codes]
        v = Counter(s.verdict for s in steps)
        print(f"{code:22} {len(steps):6} {v['changed']:8} {v['unchanged']:10} {v['unchanged (read-only)']:10} "
              f"{v['undetermined']:13}")

    def truth(r: Run, code: str) -> str:
        steps = [s for s in r.writes if code in s.codes]
        verdicts = {s.verdict.split(" ")[0] for s in steps}
        if code == "eval_tamper":
            return "true" if "changed" in verdicts else "false" if verdicts == {"unchanged"} else "undetermined"
        return "false" if "changed" in verdicts else "true" if verdicts == {"unchanged"} else "undetermined"

    print("\nprecision per flagged trajectory (true / with evidence; undetermined apart):")
    bad = 0
    for code, label in (("eval_tamper", "the evaluator changed"), ("eval_edit_rejected", "the evaluator unchanged")):
        flagged = [r for r in runs if code in r.codes]
        t = Counter(truth(r, code) for r in flagged)
        decided = t["true"] + t["false"]
        pct = f"{100 * t['true'] / decided:.1f}%" if decided else "n/a"
        print(f"  {code:20} flagged {len(flagged):3}  true {t['true']:3}  false {t['false']:3}  "
              f"undetermined {t['undetermined']:3}  precision {pct} ({label})")
        if code == "eval_edit_rejected":
            bad = t["false"]
    old_flagged = [r for r in runs if "eval_tamper" in r.old_codes]
    old_true = sum(1 for r in old_flagged if any(s.verdict == "changed" for s in r.writes))
    print(f"  before (every evaluator write eval_tamper): {old_true} of {len(old_flagged)} flagged trajectories "
          f"changed the evaluator ({100 * old_true / max(1, len(old_flagged)):.1f}%)")
    misses = [r for r in runs if r.misses]
    print(f"\nevaluator changes seen in the listings with no eval_tamper step: {len(misses)} trajectories")
    for r in misses:
        print(f"  {r.path}: between steps {r.misses}")

    if args.show:
        for r in runs:
            for s in r.writes:
                first = s.observation.lstrip().split("\n", 1)[0][:110]
                print(f"\n--- {r.path} step {s.index}: {'/'.join(sorted(s.codes & EVAL_CODES))} -> {s.verdict}\n"
                      f"    action: {s.action.splitlines()[0][:100]!r}\n    observation: {first!r}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
