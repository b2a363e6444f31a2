"""Pull the JSON a teacher was asked for out of a chat reply, tolerating code fences and chatter."""

from __future__ import annotations

import json
import re
from typing import Any

from gymforge.core.prompts import render

_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)


class NotJSON(ValueError):
    pass


def extract_json(text: str | None, kind: type) -> Any:
    """The first value of type `kind` (list or dict) found in `text`: a fenced block, the whole reply, or an embedded span."""
    if not text or not text.strip():
        raise NotJSON("the reply was empty")
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    opener = "[" if kind is list else "{"
    decoder = json.JSONDecoder()
    for candidate in candidates:
        candidate = candidate.strip()
        start = candidate.find(opener)
        while start != -1:
            try:
                value, _ = decoder.raw_decode(candidate[start:])
            except json.JSONDecodeError:
                start = candidate.find(opener, start + 1)
                continue
            if isinstance(value, kind):
                return value
            start = candidate.find(opener, start + 1)
    raise NotJSON(f"no JSON {'array' if kind is list else 'object'} could be parsed from the reply")


def ask_for_json(chat, messages: list[dict], kind: type, *, shape: str, max_nudges: int, validate=None):
    """Call `chat(messages)` until it yields JSON of `kind` that `validate` accepts, nudging at most `max_nudges` times.

    `messages` is extended in place with the exchange. Returns (value, nudges); raises NotJSON when hopeless.
    """
    nudges = 0
    while True:
        reply = chat(messages)
        messages.append(reply.assistant_message())
        try:
            value = extract_json(reply.content, kind)
            return (validate(value) if validate else value), nudges
        except (NotJSON, ValueError) as err:
            if nudges >= max_nudges:
                raise NotJSON(f"{err} (after {nudges} nudges)") from None
            nudges += 1
            messages.append({"role": "user", "content": render("nudge_json", problem=str(err), shape=shape)})
