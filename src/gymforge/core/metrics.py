"""What counts as a valid metric value: the one rule every stage that reads scores applies.

A score entry (`AgentInfo.score`, MLGym's results.json, an evaluation's output) maps metric names to values
as the task's evaluation printed them; only a finite number counts. Booleans, strings (even "0.5"), None,
NaN and infinities do not: a submission scored only with those has no valid score.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def valid_metric(value: Any) -> float | None:
    """`value` as a float when it is a valid metric value (a finite int or float, not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return None
    return number if math.isfinite(number) else None


def valid_metrics(entry: Mapping[Any, Any]) -> dict[str, float]:
    """The valid metric values of a score entry, by name (the others dropped)."""
    out: dict[str, float] = {}
    for name, value in entry.items():
        if (number := valid_metric(value)) is not None:
            out[str(name)] = number
    return out


def has_valid_metric(entry: Mapping[Any, Any]) -> bool:
    """Whether a score entry holds at least one valid metric value (a successful evaluation)."""
    return any(valid_metric(value) is not None for value in entry.values())


def last_score(scores: Sequence[Mapping[str, Any]], metric: str | None) -> float | None:
    """The valid value of `metric` in the last score entry (the final submission, MLGym's Best Submission);
    None when there are no entries, no metric, or the last entry lacks a valid value of it."""
    if not scores or not metric:
        return None
    return valid_metric(scores[-1].get(metric))
