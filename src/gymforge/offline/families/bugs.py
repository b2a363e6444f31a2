"""First-draft bugs: on attempt 0 a draft carries, with seeded probability, exactly one realistic mistake.

Config drafts: `id` in the other case style than the file name, or the description's example left with
single braces (`str.format` chokes on it). Code drafts: a dropped import or a misspelt column in the
baseline's data loading, both caught by static checks, or a runtime-only slip (wrong submission header or
file name, wrong config key, renamed entry function) that only running the task reveals. Apart from these,
a share of first code drafts has a sloppy evaluator: it runs, and scores the baseline right, but accepts
degenerate submissions (ids not checked, invalid predictions dropped, a packing's constraints unchecked),
which only the evaluator probes of verification reveal. And a share of first config drafts drifts from the
proposal's metric: the description keeps the proposal's sentence ("The evaluation reports mae") while the task
scores another metric, which only verification's coherence check reveals. Repairs
(attempt >= 1) are clean. The decision is a pure function of (stage key, seed, attempt), so callers can ask
`config_bug` / `code_bug` in `families` which bug a draft carries.
"""

from __future__ import annotations

import random
import re

from gymforge.offline.families.common import join_words, seeded

# Kinds with their probabilities on a first draft; the rest of the mass is a clean draft (~42-43% buggy).
CONFIG_BUGS: tuple[tuple[str, float], ...] = (("id_mismatch", 0.21), ("unescaped_brace", 0.21))
CODE_BUGS: tuple[tuple[str, float], ...] = (("missing_import", 0.14), ("wrong_column", 0.14), ("runtime", 0.15))


def _draw(table: tuple[tuple[str, float], ...], rng: random.Random) -> str | None:
    u, edge = rng.random(), 0.0
    for kind, p in table:
        edge += p
        if u < edge:
            return kind
    return None


def config_bug(key: object, seed: int, attempt: int) -> str | None:
    return None if attempt else _draw(CONFIG_BUGS, seeded(seed, "config-bug", key))


def code_bug(key: object, seed: int, attempt: int, has_columns: bool) -> str | None:
    kind = None if attempt else _draw(CODE_BUGS, seeded(seed, "code-bug", key))
    # Without a dataset there is no column to misspell; the draft forgets an import instead.
    return "missing_import" if kind == "wrong_column" and not has_columns else kind


# Share of first code drafts whose evaluator accepts degenerate submissions (families' `sloppy_evaluator`),
# drawn apart from CODE_BUGS so the other bugs land where they did before it existed.
SLOPPY_EVALUATOR_P = 0.3


def sloppy_evaluator(key: object, seed: int, attempt: int) -> bool:
    return not attempt and seeded(seed, "sloppy-evaluator", key).random() < SLOPPY_EVALUATOR_P


# Share of first config drafts that keep the proposal's sentence about its metric whatever metric the task scores
# (the config step chose its own and did not rewrite what the proposal said): where the two differ, the coherence
# check's quarry.
METRIC_DRIFT_P = 0.35


def metric_drift(key: object, seed: int, attempt: int) -> bool:
    return not attempt and seeded(seed, "metric-drift", key).random() < METRIC_DRIFT_P


def bug_rng(seed: int, key: object) -> random.Random:
    """Draws for the bug's details, apart from the content's draws so a repair changes nothing else."""
    return seeded(seed, "bug-details", key)


def unescape_braces(description: str) -> str:
    return description.replace("{{", "{").replace("}}", "}")


def drop_import(source: str, rng: random.Random) -> str | None:
    """The source without one `import x [as y]` line whose name is used; None when there is none."""
    lines = source.splitlines(keepends=True)
    used = []
    for i, line in enumerate(lines):
        m = re.fullmatch(r"import (\w+)(?: as (\w+))?\n?", line)
        if m and re.search(rf"\b{m.group(2) or m.group(1)}\.", "".join(lines[:i] + lines[i + 1:])):
            used.append(i)
    if not used:
        return None
    i = rng.choice(used)
    return "".join(lines[:i] + lines[i + 1:])


def misspell(name: str, taken: set[str], rng: random.Random) -> str:
    """A near miss an author might type for a column: other case style, dropped unit, invented suffix."""
    parts = [p for p in name.split("_") if p]
    variants = [join_words(parts, "camel"), "_".join(parts[:-1])] if len(parts) > 1 else []
    variants += [f"{name}_name", f"{name}s", name.capitalize(), name[:3]]
    return rng.choice([v for v in variants if v and v != name and v not in taken])


def misname_column(source: str, columns: list[str], rng: random.Random) -> str | None:
    """The source with the first quoted use of one real column misspelt; None when it quotes none."""
    quoted = [c for c in columns if f'"{c}"' in source]
    if not quoted:
        return None
    name = rng.choice(quoted)
    return source.replace(f'"{name}"', f'"{misspell(name, set(columns), rng)}"', 1)
