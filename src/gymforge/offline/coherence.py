"""The offline teacher's answer to `check_coherence.j2`: a verdict on a task description's prose, as a program.

A reader of prose knows what a rule-based check does not: "the average absolute difference" is MAE, "the share
of rows labelled right" is accuracy, "the fewer mistakes the better" says lower is better. This program reads
each sentence for such descriptions of a metric (a small table of phrasings, `DESCRIBED`), and for a metric named
outright, and compares them with the printed metric and its direction. The verdict is a pure function of the
request, like every offline answer.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gymforge.tasks.coherence import sentences
from gymforge.tasks.metrics import direction_in, metrics_named, same_metric

# How prose describes a metric without naming it: pattern -> the canonical metric it describes.
DESCRIBED: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.I), m) for p, m in (
    (r"average (?:absolute|unsigned) (?:difference|deviation|error)|mean of the absolute", "mae"),
    (r"square root of the (?:mean|average) (?:of the )?squared|root of the average squared", "rmse"),
    (r"(?:mean|average) of the squared (?:errors|differences)|average squared (?:error|difference)", "mse"),
    (r"(?:share|fraction|proportion|percentage) of (?:test )?(?:rows|predictions|examples|samples) "
     r"(?:\w+ ){0,3}(?:right|correct)", "accuracy"),
    (r"mean of the per-class f1|f1 (?:averaged|computed) (?:over|per) class", "macro_f1"),
    (r"area under the (?:roc )?curve", "auc"),
    (r"share of (?:the )?variance explained|variance explained", "r2"),
))
_IMPLIED_LOWER = re.compile(r"\bthe (?:fewer|smaller|lower|less)\b[^.]*\bthe better\b", re.I)
_IMPLIED_HIGHER = re.compile(r"\bthe (?:more|larger|higher|greater)\b[^.]*\bthe better\b", re.I)
_SCORING = re.compile(r"\b(report|scor|evaluat|metric|measur|graded|judged|ranked|better)", re.I)


def _block(text: str, lang: str) -> str:
    match = re.search(rf"```{lang}\s*\n(.*?)\n```", text, re.S)
    return match.group(1) if match else ""


def _direction(sentence: str) -> bool | None:
    stated = direction_in(sentence)
    if stated is not None:
        return stated
    lower, higher = bool(_IMPLIED_LOWER.search(sentence)), bool(_IMPLIED_HIGHER.search(sentence))
    return None if lower == higher else higher


def verdict(description: str, facts: dict[str, Any]) -> dict[str, Any]:
    """The structured verdict on `description` given what the task does (`facts`: printed, metric, direction)."""
    printed = list(facts.get("printed") or {})
    metric, higher = facts.get("metric") or (printed[0] if printed else None), facts.get("higher_is_better")
    found: list[dict[str, str]] = []
    for sentence in sentences(description):
        if not _SCORING.search(sentence):
            continue
        named = [m for _, m in metrics_named(sentence.replace("`", ""))]
        named += [m for pattern, m in DESCRIBED if pattern.search(sentence)]
        foreign = [m for m in named if printed and not any(same_metric(m, p) for p in printed)]
        if foreign and not any(any(same_metric(m, p) for p in printed) for m in named):
            found.append({"kind": "metric", "sentence": sentence, "states": foreign[0],
                          "actual": f"the evaluation prints {', '.join(printed)}"})
            continue
        direction = _direction(sentence)
        about_metric = bool(named) or (metric is not None and metric.lower() in sentence.lower())
        if direction is not None and higher is not None and about_metric and direction != higher:
            found.append({"kind": "direction", "sentence": sentence,
                          "states": "higher is better" if direction else "lower is better",
                          "actual": f"{metric} is ranked {'higher' if higher else 'lower'} is better"})
    return {"coherent": not found, "contradictions": found}


def answer(request: str) -> str:
    """The reply to a `check_coherence.j2` request: one JSON object."""
    try:
        facts = json.loads(_block(request, "json") or "{}")
    except json.JSONDecodeError:
        facts = {}
    return json.dumps(verdict(_block(request, "text"), facts if isinstance(facts, dict) else {}))
