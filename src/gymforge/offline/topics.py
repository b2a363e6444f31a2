"""Role 1: sample research topics, imperfectly enough that the pipeline's de-duplication has work.

A real teacher repeats itself despite the "already sampled" list, sometimes verbatim and sometimes
as a re-cased, pluralised, hyphenated or reordered variant; this sampler does both on purpose.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable

from gymforge.offline.vocabulary import QUALIFIERS, VOCABULARY, normalise

REPEAT_RATE = 0.15
FENCE_RATE = 0.2


def parse_request(text: str) -> tuple[int, list[str]]:
    """The requested count and the already-sampled topics from a topics.j2 prompt."""
    match = re.search(r"Propose exactly (\d+)", text) or re.search(r"JSON array of (\d+)", text)
    if match is None:
        raise ValueError("topics request does not say how many topics to propose")
    seen: list[str] = []
    if "### Already sampled" in text:
        block = text.split("### Already sampled", 1)[1]
        seen = [line[2:].strip() for line in block.splitlines() if line.startswith("- ")]
    return int(match.group(1)), seen


def _pluralise_last(words: list[str]) -> list[str] | None:
    last = words[-1]
    if last.endswith(("s", "ing")) or not last.isalpha():
        return None
    if last.endswith(("x", "ch", "sh")):
        plural = last + "es"
    elif last.endswith("y") and last[-2:-1] not in ("a", "e", "i", "o", "u"):
        plural = last[:-1] + "ies"
    else:
        plural = last + "s"
    return words[:-1] + [plural]


def _hyphenate(words: list[str]) -> list[str] | None:
    return [f"{words[0]}-{words[1]}"] + words[2:] if len(words) >= 3 and "-" not in words[0] + words[1] else None


def _swap_first(words: list[str]) -> list[str] | None:
    return [words[1], words[0]] + words[2:] if len(words) >= 3 else None


def _lower(words: list[str]) -> list[str] | None:
    return [w.lower() for w in words]


def _capitalise(words: list[str]) -> list[str] | None:
    return [w[:1].upper() + w[1:] for w in words]


_TRANSFORMS: tuple[Callable[[list[str]], list[str] | None], ...] = (
    _pluralise_last,
    _hyphenate,
    _swap_first,
    _lower,
    _capitalise,
)


def near_duplicate(text: str, rng: random.Random) -> str:
    """A variant of `text` that differs in surface form only (same `normalise` key up to plurals)."""
    words = text.split()
    for transform in rng.sample(_TRANSFORMS, k=rng.choice((1, 2))):
        words = transform(words) or words
    variant = " ".join(words)
    if variant == text:  # every transform drawn was a no-op on this phrasing
        variant = text.lower() if text.lower() != text else text.capitalize()
    return variant


POST_TRAINING_REQUEST = re.compile(r"post-training topics", re.IGNORECASE)  # topics.j2 with kind post_training


def sample(n: int, seen: list[str], rng: random.Random, *, post_training: bool = False) -> list[str]:
    """`n` topics: fresh vocabulary first, then qualified variants, with seeded slips into repeats. Post-training
    topics are drawn only when asked for, and then only they."""
    vocabulary = [e for e in VOCABULARY if (e.family == "post_training") == post_training]
    seen_keys = {normalise(t) for t in seen}
    fresh = [e.text for e in vocabulary if normalise(e.text) not in seen_keys]
    rng.shuffle(fresh)
    if len(fresh) < n:
        qualified = [
            f"{e.text} {q}" for e in vocabulary for q in QUALIFIERS[e.family] if normalise(f"{e.text} {q}") not in seen_keys
        ]
        rng.shuffle(qualified)
        fresh += qualified
    picks = fresh[:n]
    while len(picks) < n:  # everything has been sampled: all the teacher can do is repeat itself
        picks.append(near_duplicate(rng.choice(seen), rng) if seen else rng.choice(vocabulary).text)
    if seen:
        for i in range(n):
            if rng.random() < REPEAT_RATE:
                old = rng.choice(seen)
                picks[i] = old if rng.random() < 0.4 else near_duplicate(old, rng)
    return picks


def answer(text: str, *, seed: int, nudged: bool) -> str:
    """The reply to a topics request: a JSON array, sometimes in a ```json fence (never after a nudge)."""
    n, seen = parse_request(text)
    rng = random.Random(seed)
    topics = sample(n, seen, rng, post_training=bool(POST_TRAINING_REQUEST.search(text)))
    body = json.dumps(topics, indent=2, ensure_ascii=False)
    return f"```json\n{body}\n```" if not nudged and rng.random() < FENCE_RATE else body
