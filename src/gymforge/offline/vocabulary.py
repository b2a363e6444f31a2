"""The research topics the offline teacher knows, and how to recognise them again.

The topics themselves are data (vocabulary.yaml, shipped with the package). Each entry names its task
family (which decides metric, dataset and code shape downstream) and the search queries a teacher would
type to find its data. Topics come back from the pipeline re-cased,
pluralised, hyphenated or reordered, so `lookup` compares order-free, singularised token keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Literal, get_args

import yaml

from gymforge.core.dedup import words

Family = Literal[
    "tabular_classification",
    "tabular_regression",
    "time_series_forecasting",
    "model_submission",
    "game_strategy",
    "post_training",
    "unavailable",
]
FAMILIES: tuple[Family, ...] = get_args(Family)


@dataclass(frozen=True)
class VocabEntry:
    text: str
    family: Family
    queries: list[str]
    # A plausible hub id that does not exist: proposing it makes the pipeline discard the topic.
    phantom_dataset: str | None = None


def _entry(family: Family, row: list[str]) -> VocabEntry:
    if family == "unavailable":
        text, query, phantom = row
        return VocabEntry(text, family, [query], phantom)
    text, *queries = row
    return VocabEntry(text, family, queries)


def _read_vocabulary() -> tuple[VocabEntry, ...]:
    """vocabulary.yaml (shipped with the package): family -> rows of [topic, queries...]."""
    table = yaml.safe_load(resources.files(__package__).joinpath("vocabulary.yaml").read_text(encoding="utf-8"))
    return tuple(_entry(family, row) for family, rows in table.items() for row in rows)


VOCABULARY: tuple[VocabEntry, ...] = _read_vocabulary()

# Suffixes the topic sampler appends once the plain vocabulary runs out; `lookup` strips them again.
QUALIFIERS: dict[Family, tuple[str, ...]] = {
    "tabular_classification": ("with limited training data", "with interpretable models", "under a tight compute budget"),
    "tabular_regression": ("with limited training data", "with interpretable models", "under a tight compute budget"),
    "time_series_forecasting": ("with a short training history", "at a longer forecast horizon", "with interpretable models"),
    "model_submission": ("with limited training data", "under a tight compute budget"),
    "game_strategy": ("under a tight compute budget", "with a short time horizon"),
    "post_training": ("under a tight compute budget", "with limited training data"),
    "unavailable": ("with limited training data", "under a tight compute budget"),
}


tokens = words  # the product's word tokens (gymforge.core.dedup), so the vocabulary and decontamination agree


def normalise(text: str) -> str:
    """An order-free key: casing, plurals, hyphenation and word order do not change it."""
    return " ".join(sorted(tokens(text)))


_QUALIFIER_TOKENS = sorted({tuple(tokens(q)) for qs in QUALIFIERS.values() for q in qs}, key=len, reverse=True)
_BY_KEY = {normalise(e.text): e for e in VOCABULARY}


def strip_qualifier(text: str) -> list[str]:
    """The topic's tokens without a trailing sampler qualifier."""
    words = tokens(text)
    for qualifier in _QUALIFIER_TOKENS:
        if len(words) > len(qualifier) and tuple(words[-len(qualifier):]) == qualifier:
            return words[: -len(qualifier)]
    return words


def lookup(text: str) -> VocabEntry | None:
    """The vocabulary entry a (possibly re-cased, pluralised, reordered or qualified) topic came from."""
    return _BY_KEY.get(" ".join(sorted(strip_qualifier(text))))


_FAMILY_HINTS: tuple[tuple[Family, re.Pattern[str]], ...] = (
    ("post_training", re.compile(r"\b(post-?training|fine-?tun\w*|instruction[- ]tun\w*|language models?)\b")),
    ("model_submission", re.compile(r"\btrain and submit\b")),
    ("game_strategy", re.compile(r"\b(game|auction|bidding|opponents?|bandits?|heuristics?|scheduling|packing)\b")),
    ("time_series_forecasting", re.compile(r"\b(forecast\w*|time[- ]series|nowcast\w*)\b")),
    ("tabular_regression", re.compile(r"\b(regress\w*|estimation|price|amount|counts?|yield)\b")),
)


def family_of(text: str) -> Family:
    """The vocabulary family, or a keyword guess for topics the vocabulary does not know."""
    entry = lookup(text)
    if entry is not None:
        return entry.family
    lowered = text.lower()
    return next((family for family, pattern in _FAMILY_HINTS if pattern.search(lowered)), "tabular_classification")
