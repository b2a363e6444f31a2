"""Text keys: word tokens for the benchmark's decontamination and the offline vocabulary, and topic
de-duplication (normalised text plus token-set similarity for near-duplicates)."""

from __future__ import annotations

import re

def _singular(word: str) -> str:
    if len(word) <= 3:
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "ches", "shes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def words(text: str) -> list[str]:
    """Lower-cased, singularised word tokens in order; hyphens and punctuation separate words."""
    return [_singular(w) for w in re.findall(r"[a-z0-9]+", text.lower())]


_STOP = frozenset("a an and the of for in on with to by from using via".split())


def _stem(token: str) -> str:
    # Enough morphology to merge the variants teachers produce ("predictions" vs "prediction").
    for suffix in ("ies", "es", "s"):
        if token.endswith(suffix) and len(token) - len(suffix) >= 3:
            return token[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return token


def tokens(text: str) -> frozenset[str]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return frozenset(_stem(w) for w in words if w not in _STOP)


def normalise(text: str) -> str:
    return " ".join(sorted(tokens(text)))


def similarity(a: str, b: str) -> float:
    ta, tb = tokens(a), tokens(b)
    if not ta or not tb:
        return float(ta == tb)
    return len(ta & tb) / len(ta | tb)


def find_duplicate(topic: str, accepted: list[tuple[str, str]], threshold: float) -> str | None:
    """Return the key of the first accepted (key, text) pair that `topic` duplicates, if any."""
    norm = normalise(topic)
    for key, text in accepted:
        if normalise(text) == norm or similarity(topic, text) >= threshold:
            return key
    return None
