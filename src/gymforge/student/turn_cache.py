"""Tokenizing many chats that share turns, each turn once: the `request` SFT unit at the cost of the conversation.

A trajectory's `request` examples (`reply_chats`) repeat its turns: request k+1 is request k with one more reply and
observation, except that the agent loop has elided the observation that fell out of its window ("Old output omitted
(N lines)"). Requests are therefore not prefixes of each other, and tokenizing each whole costs O(turns^2) tokens.
Their turns, though, are few and each renders the same text in every request it is part of.

`TurnCache` gives exactly what `gymforge.student.masks.tokenize_turns` gives (the same `input_ids`, the same
`assistant_masks`), tokenizing each distinct piece of rendered text once:

1. render the chat as `tokenize_turns` does (the template's `{% generation %}` spans, or `assistant_spans` of the
   rendering), which is cheap next to tokenizing it;
2. cut the rendering before every occurrence of the template's turn-opening special token (the *anchor*,
   `<|im_start|>` for ChatML templates); each piece is tokenized once per trajectory (cached by its text) and the
   ids are the pieces' ids end to end;
3. the mask: a token is trained when it overlaps a span, the rule `tokenize_turns` applies token by token, here
   applied with bisection to the pieces that hold a span (a token never crosses a piece).

Step 2 is exact because a fast tokenizer cuts its input at added tokens before anything else (normalizer,
pre-tokenizer and model run on each part alone): a cut where the tokenizer cuts anyway changes nothing. That holds
for a tokenizer whose anchor strips no whitespace before it (`lstrip`), needs no word boundary (`single_word`), is
matched before normalization, that no other added token overlaps across a cut, and whose pre-tokenizer does not
treat the text's first part differently (a Metaspace `prepend_scheme: first`). `TurnCache` checks these once, then
checks the ids of each trajectory's conversation (tokenized whole by the filters' length count anyway) against its
pieces (`conversation`): on any difference it tokenizes every chat whole from then on (`reason` says why), as
before.
"""

from __future__ import annotations

import json
import logging
from bisect import bisect_left, bisect_right
from itertools import chain
from typing import Any, Sequence

from gymforge.student.masks import PROBE, MaskError, assistant_spans, has_generation_markers, tokenize_turns

log = logging.getLogger(__name__)
HEADS = 32  # opening pieces kept from one trajectory to the next (most recently used)


class _Irregular(Exception):
    """The pieces cannot give what `tokenize_turns` gives (the message says why): a piece's token offsets out of
    order, where bisection would not find what the token-by-token rule does, or no renderer with spans."""


class _Piece:
    """A tokenized piece of rendered text: ids, token starts and token ends (relative to the piece), and the ends as
    the mask rule reads them (`reach`)."""

    __slots__ = ("ids", "starts", "reach")

    def __init__(self, ids: list[int], offsets: Sequence[tuple[int, int]], length: int, widen: bool) -> None:
        self.ids = ids
        self.starts = [s for s, _e in offsets]
        # `tokenize_with_assistant_mask` counts an empty token as one character wide; transformers' marker mask not
        self.reach = [max(e, s + 1) for s, e in offsets] if widen else [e for _s, e in offsets]
        inside = not self.starts or (self.starts[0] >= 0 and self.starts[-1] <= length)
        if not inside or self.starts != sorted(self.starts) or self.reach != sorted(self.reach):
            raise _Irregular


def _walk(node: Any) -> list[dict[str, Any]]:
    """Every component (dict with a `type`) of a tokenizer.json section, sequences opened."""
    if isinstance(node, dict):
        return [node] * ("type" in node) + [c for v in node.values() for c in _walk(v)]
    if isinstance(node, list):
        return [c for v in node for c in _walk(v)]
    return []


def find_anchor(tokenizer: Any) -> tuple[str | None, str]:
    """The added token the tokenizer's chat template opens its turns with, where cutting the rendering before it
    tokenizes the same; else None and why not."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        return None, "not a fast tokenizer"
    try:
        text = tokenizer.apply_chat_template(list(PROBE), tokenize=False, add_generation_prompt=False)
    except Exception as err:  # noqa: BLE001 - any template failure means: tokenize whole, as before
        return None, f"the chat template does not render: {err}"
    added = {str(t.content): t for t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).values()}
    found = [c for c in added if c and text.count(c) >= len(PROBE)]
    if not found:
        return None, "no added token opens every turn of the rendering"
    anchor = max(found, key=lambda c: (text.startswith(c), text.count(c), len(c)))
    token = added[anchor]
    spec = json.loads(backend.to_str())
    if getattr(tokenizer, "split_special_tokens", False):
        return None, "it splits special tokens like text"
    if getattr(token, "lstrip", False) or getattr(token, "single_word", False):
        return None, f"{anchor!r} strips whitespace before it or needs a word boundary"
    if spec.get("normalizer") is not None and getattr(token, "normalized", False):
        return None, f"{anchor!r} is matched after normalization"
    for other in added:
        if any(anchor.startswith(other[i:]) or other[i:].startswith(anchor) for i in range(1, len(other))):
            return None, f"the added token {other!r} can span a cut before {anchor!r}"
    if any(c.get("type") == "Metaspace" and c.get("prepend_scheme") == "first"
           for c in _walk([spec.get("normalizer"), spec.get("pre_tokenizer")])):
        return None, "its pre-tokenizer treats the first part of the text differently (Metaspace, prepend_scheme first)"
    return anchor, ""


class TurnCache:
    """`tokenize_turns` for many chats of one trajectory, each distinct piece of their renderings tokenized once
    (module docstring). `clear()` between trajectories; `conversation(messages, whole_ids)` checks the pieces against
    a conversation tokenized whole and falls back to whole tokenization for good when they differ."""

    def __init__(self, tokenizer: Any, name: str = "the student") -> None:
        self.tokenizer = tokenizer
        self.name = name
        self.markers = has_generation_markers(tokenizer.chat_template)
        self.anchor, self.reason = find_anchor(tokenizer)
        self._pieces: dict[str, _Piece] = {}
        self._heads: dict[str, _Piece] = {}  # the first pieces (system prompt, task) of recent trajectories
        if self.anchor is None:
            log.info("request examples are tokenized whole: %s", self.reason)

    @property
    def active(self) -> bool:
        return self.anchor is not None

    def clear(self) -> None:
        """Forget the pieces of the trajectory before, but those that open its requests (the system prompt and the
        task, which the runs of a task share)."""
        self._pieces = dict(self._heads)

    def _fall_back(self, reason: str) -> None:
        self.anchor, self.reason = None, reason
        self._pieces, self._heads = {}, {}
        log.warning("request examples are tokenized whole from here on: %s", reason)

    def tokenize_turns(self, messages: Sequence[dict[str, Any]], *, last_only: bool = False) -> dict[str, list[int]]:
        """Exactly `tokenize_turns(tokenizer, messages, name, last_only=...)`."""
        if self.anchor is not None:
            try:
                return self._tokenize(messages, last_only)
            except _Irregular as err:
                self._fall_back(str(err) or "a piece's token offsets are out of order")
        return tokenize_turns(self.tokenizer, messages, self.name, last_only=last_only)

    def conversation(self, messages: Sequence[dict[str, Any]], whole_ids: Sequence[int]) -> dict[str, list[int]]:
        """`tokenize_turns` of a trajectory's conversation (every turn), its pieces checked against `whole_ids`, the
        conversation tokenized whole (`chat_token_ids`): when they differ, this and every later chat is tokenized
        whole."""
        enc = self.tokenize_turns(messages)
        if self.anchor is not None and enc["input_ids"] != list(whole_ids):
            self._fall_back("the pieces' tokens differ from the conversation's, tokenized whole")
            enc = self.tokenize_turns(messages)
        return enc

    # ---- the pieces -----------------------------------------------------------------------------------

    def _render(self, messages: Sequence[dict[str, Any]], last_only: bool) -> tuple[str, list[tuple[int, int]]]:
        if not self.markers:
            return assistant_spans(self.tokenizer, messages, self.name, last_only=last_only)
        try:  # what apply_chat_template(return_assistant_tokens_mask=True) renders, with its generation spans
            from transformers.utils.chat_template_utils import render_jinja_template

            texts, spans = render_jinja_template(
                conversations=[[dict(m) for m in messages]], chat_template=self.tokenizer.get_chat_template(),
                return_assistant_tokens_mask=True, add_generation_prompt=False, **self.tokenizer.special_tokens_map)
        except (ImportError, TypeError) as err:  # another transformers: its own path, whole
            raise _Irregular(f"transformers' renderer with generation spans is not usable here: {err}") from None
        return texts[0], [tuple(s) for s in spans[0]]

    def _encode(self, text: str) -> list[tuple[int, _Piece]]:
        """The pieces of `text` (cut before every anchor) with their start in it, each tokenized once."""
        assert self.anchor is not None
        cuts = [0]
        at = text.find(self.anchor, 1)
        while at >= 0:
            cuts.append(at)
            at = text.find(self.anchor, at + len(self.anchor))
        cuts.append(len(text))
        parts = [(a, text[a:b]) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
        missing = list(dict.fromkeys(p for _a, p in parts if p not in self._pieces))
        if missing:
            enc = self.tokenizer(missing, add_special_tokens=False, return_offsets_mapping=True)
            for piece, ids, offsets in zip(missing, enc["input_ids"], enc["offset_mapping"], strict=True):
                self._pieces[piece] = _Piece(list(ids), offsets, len(piece), widen=not self.markers)
        opening = 2 + (not text.startswith(self.anchor))  # system prompt and task, after any preamble
        for _a, head in parts[:opening]:
            self._heads[head] = self._heads.pop(head, None) or self._pieces[head]
        while len(self._heads) > HEADS:
            del self._heads[next(iter(self._heads))]
        return [(a, self._pieces[p]) for a, p in parts]

    def _tokenize(self, messages: Sequence[dict[str, Any]], last_only: bool) -> dict[str, list[int]]:
        text, spans = self._render(messages, last_only)
        pieces = self._encode(text)
        firsts = [0]  # index of each piece's first token
        for _a, piece in pieces:
            firsts.append(firsts[-1] + len(piece.ids))
        starts = [a for a, _p in pieces]
        # a token is trained iff it starts before a span's end and reaches past its start (`tokenize_turns`' rule,
        # token by token against the first span ending after the token's start; the same since spans and token
        # starts are in order): per span, a range of tokens, since token starts and reaches are in order
        ranges: list[tuple[int, int]] = []
        for lo_char, hi_char in spans:
            # the piece holding the span's start, and the one before (an empty token at its very end reaches on)
            first = max(0, bisect_right(starts, lo_char) - 2)
            for i in range(first, len(pieces)):
                at, piece = pieces[i]
                if at >= hi_char:
                    break
                lo = bisect_right(piece.reach, lo_char - at)
                hi = bisect_left(piece.starts, hi_char - at)
                if lo < hi:
                    ranges.append((firsts[i] + lo, firsts[i] + hi))
        ids = list(chain.from_iterable(piece.ids for _a, piece in pieces))
        mask = [0] * len(ids)
        if self.markers and last_only and ranges:  # `last_run` of the whole marker mask: its last run of ones
            runs: list[tuple[int, int]] = []
            for lo, hi in sorted(ranges):
                if runs and lo <= runs[-1][1]:
                    runs[-1] = (runs[-1][0], max(runs[-1][1], hi))
                else:
                    runs.append((lo, hi))
            ranges = runs[-1:]
        for lo, hi in ranges:
            mask[lo:hi] = [1] * (hi - lo)
        return {"input_ids": ids, "assistant_masks": mask}


__all__ = ["MaskError", "TurnCache", "find_anchor"]
