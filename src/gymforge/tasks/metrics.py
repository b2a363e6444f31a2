"""A task's metric by name and direction: what "macro-averaged F1", "rmse (lower is better)" or "minimise the
error" mean, for every stage that reads a task's metric (verification, `check-task`, RL's rewards).

- `metric_direction`: (name, higher_is_better) of a proposal's metric text such as "rmse (lower is better)";
- `stated_direction`: the direction a description states for a metric, if it states one;
- `canonical_metric`: one key per metric whatever its spelling ("root mean squared error", "RMSE" -> rmse);
- `metrics_named`: the metrics a sentence names by a name in the synonym table, in order.
"""

from __future__ import annotations

import re

_LOWER = re.compile(r"\b(lower|smaller|less)\s+is\s+better\b|\bminimi[sz]e\b", re.I)
_HIGHER = re.compile(r"\b(higher|larger|greater|more)\s+is\s+better\b|\bmaximi[sz]e\b", re.I)
# metric names that are minimised when a task says nothing about its direction
_LOWER_NAMES = re.compile(r"(loss|error|rmse|mse|mae|mape|logloss|perplexity|time|regret|distance|wer|cer|cost|"
                          r"makespan|tour|latency|gap|violation|colou?rs|bins)", re.I)

# Canonical metric -> (higher_is_better, the names it goes by). A name is matched as whole words, case and
# separators ignored ("macro-averaged F1" = "macro averaged f1" = "Macro_F1"). Plain "f1" is its own entry: a
# text that says F1 where the evaluation prints macro_f1 is read as naming F1 (see `same_metric`).
SYNONYMS: dict[str, tuple[bool, tuple[str, ...]]] = {
    "accuracy": (True, ("accuracy", "acc", "classification accuracy", "validation accuracy", "test accuracy")),
    "balanced_accuracy": (True, ("balanced accuracy",)),
    "macro_f1": (True, ("macro f1", "macro averaged f1", "macro average f1", "f1 macro", "macro f1 score",
                        "macrof1", "f1 score macro averaged")),
    "micro_f1": (True, ("micro f1", "micro averaged f1")),
    "weighted_f1": (True, ("weighted f1", "weighted averaged f1")),
    "f1": (True, ("f1", "f1 score", "f measure")),
    "precision": (True, ("precision",)),
    "recall": (True, ("recall",)),
    "auc": (True, ("auc", "roc auc", "auroc", "area under the roc curve", "area under the curve", "roc_auc")),
    "log_loss": (False, ("log loss", "logloss", "logarithmic loss", "cross entropy", "cross entropy loss")),
    "nll": (False, ("nll", "negative log likelihood", "mean negative log likelihood")),
    "rmse": (False, ("rmse", "root mean squared error", "root mean square error", "root mse")),
    "mse": (False, ("mse", "mean squared error", "mean square error")),
    "mae": (False, ("mae", "mean absolute error")),
    "mape": (False, ("mape", "mean absolute percentage error")),
    "r2": (True, ("r2", "r squared", "r^2", "r²", "coefficient of determination", "r2 score")),
    "bleu": (True, ("bleu", "bleu score")),
    "perplexity": (False, ("perplexity",)),
}
_LOOKUP: dict[str, str] = {}
for _key, (_, _names) in SYNONYMS.items():
    for _name in (_key, *_names):
        _LOOKUP[re.sub(r"[^a-z0-9²^]+", " ", _name.lower()).strip()] = _key
# Longest names first, so "mean absolute error" wins over a shorter name inside it.
_PHRASES = re.compile(
    r"(?<![a-z0-9_])(" + "|".join(
        re.escape(n).replace(r"\ ", r"[\s_\-]+") for n in sorted(_LOOKUP, key=len, reverse=True)) + r")(?![a-z0-9_])",
    re.I)


def _words(text: str) -> str:
    return re.sub(r"[^a-z0-9²^]+", " ", text.lower()).strip()


def canonical_metric(name: str) -> str:
    """The synonym table's key for a metric name; an unknown name as its lower-case words joined by `_`."""
    words = _words(name)
    return _LOOKUP.get(words) or _LOOKUP.get(words.replace(" ", "")) or words.replace(" ", "_")


def known_metric(name: str) -> bool:
    """Whether `name` is in the synonym table."""
    words = _words(name)
    return words in _LOOKUP or words.replace(" ", "") in _LOOKUP


def same_metric(stated: str, printed: str) -> bool:
    """Whether a text's `stated` name can mean the evaluation's `printed` one: the same canonical metric, or a
    plain "F1" for one of the averaged F1s (the text is vaguer than the evaluation, not contrary to it)."""
    a, b = canonical_metric(stated), canonical_metric(printed)
    return a == b or (a == "f1" and b.endswith("_f1"))


def metrics_named(text: str) -> list[tuple[str, str]]:
    """(canonical metric, the words as written) of every metric in `text` named by a name of the synonym table."""
    return [(canonical_metric(m.group(1)), m.group(1)) for m in _PHRASES.finditer(text)]


def natural_direction(metric: str) -> bool | None:
    """higher_is_better of a metric the synonym table knows, else None."""
    entry = SYNONYMS.get(canonical_metric(metric))
    return entry[0] if entry else None


def direction_in(text: str) -> bool | None:
    """True when `text` says higher is better (or maximise), False for lower (or minimise), None for neither or
    both."""
    lower, higher = bool(_LOWER.search(text)), bool(_HIGHER.search(text))
    return None if lower == higher else higher


def stated_direction(text: str, metric: str) -> bool | None:
    """Whether `text` (a task description) says that higher (True) or lower (False) `metric` is better: in a
    sentence that names the metric, else anywhere when the whole text says only one of them; None if it does
    not say."""
    sentences = re.split(r"(?<=[.!?;:\n])\s+", text)
    named = [s for s in sentences if metric and metric.lower() in s.lower()]
    for scope in (" ".join(named), text):
        found = direction_in(scope)
        if found is not None:
            return found
    return None


def metric_direction(metric_text: str) -> tuple[str, bool]:
    """(metric name, higher_is_better) from a proposal's metric text such as "rmse (lower is better)"."""
    name = re.split(r"[\s(]", metric_text.strip(), maxsplit=1)[0] if metric_text.strip() else ""
    if _LOWER.search(metric_text):
        return name, False
    if _HIGHER.search(metric_text):
        return name, True
    return name, not _LOWER_NAMES.search(name)
