"""What a served model sampled, token for token, and its compact record in a trajectory.

`Sampled` is one completion as the sampler saw it: the prompt's token ids (the request after the chat template, exactly
as the server tokenized it), the completion's token ids (the end-of-turn token included when the reply ended on it) and
each completion token's log-prob under the sampler (after temperature, top-k and top-p: the distribution it was drawn
from). `from_response` reads it from an OpenAI-compatible chat completion body, in the shape vLLM's server returns
(`return_token_ids: true`: `prompt_token_ids` on the response, `token_ids` on the choice; `logprobs: true`:
`choices[0].logprobs.content[*].logprob`); our transformers server answers in the same shape.

In a `.traj` file each model reply keeps its `Sampled` as a `TokenRecord`: token ids and log-probs as base64 of
little-endian uint32 / float32 arrays, and the prompt stored as the number of leading tokens it shares with the
previous reply's prompt plus completion (`prefix`) and the ids after them. An agent's request k+1 usually repeats
request k and its reply, so an episode's records grow with its new tokens, not with the square of its length; the
loop's elisions (an old observation replaced by a one-line note) only shorten the shared prefix. `encode_records` and
`decode_records` walk the replies of one trajectory in order (`None` for a reply whose endpoint returned no ids).
"""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field


class Sampled(BaseModel):
    """One completion's tokens as sampled: prompt ids, completion ids and the completion's log-probs (aligned)."""

    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]


class TokenRecord(BaseModel):
    """A `Sampled` in a trajectory (module docstring): base64 little-endian arrays, the prompt as a shared prefix."""

    prefix: int = Field(0, ge=0, description="Leading prompt tokens equal to the previous reply's prompt + completion.")
    prompt: str = Field("", description="The prompt's ids after the prefix (base64, uint32 little-endian).")
    ids: str = Field("", description="The completion's ids (base64, uint32 little-endian).")
    logprobs: str = Field("", description="Each completion token's sampler log-prob (base64, float32 little-endian).")


def _pack(values: Iterable[float | int], code: str) -> str:
    arr = array(code, values)
    if sys.byteorder == "big":
        arr.byteswap()
    return base64.b64encode(arr.tobytes()).decode("ascii")


def _unpack(text: str, code: str) -> list[Any]:
    arr = array(code)
    arr.frombytes(base64.b64decode(text))
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tolist()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def encode_records(replies: Iterable[Sampled | None], previous: Sequence[int] = ()) -> list[TokenRecord | None]:
    """The records of consecutive replies; `previous`: the prompt + completion ids of the reply before the first."""
    out: list[TokenRecord | None] = []
    last: Sequence[int] = previous
    for s in replies:
        if s is None:
            out.append(None)
            last = ()
            continue
        prefix = _common_prefix(last, s.prompt_ids)
        out.append(TokenRecord(prefix=prefix, prompt=_pack(s.prompt_ids[prefix:], "I"), ids=_pack(s.ids, "I"),
                               logprobs=_pack(s.logprobs, "f")))
        last = [*s.prompt_ids, *s.ids]
    return out


def decode_records(records: Iterable[TokenRecord | None]) -> list[Sampled | None]:
    """The inverse of `encode_records` (from the first reply of a trajectory)."""
    out: list[Sampled | None] = []
    last: list[int] = []
    for r in records:
        if r is None:
            out.append(None)
            last = []
            continue
        if r.prefix > len(last):
            raise ValueError(f"token record shares {r.prefix} tokens with a previous reply of {len(last)}")
        prompt = last[: r.prefix] + _unpack(r.prompt, "I")
        s = Sampled(prompt_ids=prompt, ids=_unpack(r.ids, "I"), logprobs=_unpack(r.logprobs, "f"))
        if len(s.ids) != len(s.logprobs):
            raise ValueError(f"token record has {len(s.ids)} ids but {len(s.logprobs)} log-probs")
        out.append(s)
        last = [*s.prompt_ids, *s.ids]
    return out


def from_response(body: Mapping[str, Any]) -> Sampled | None:
    """The `Sampled` of a chat completion body (its first choice), or None when it carries no token ids or no log-probs
    for them (an endpoint that does not return them, e.g. an external API)."""
    choices = body.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    prompt = body.get("prompt_token_ids")
    if prompt is None:
        prompt = choice.get("prompt_token_ids")
    ids = choice.get("token_ids")
    content = ((choice.get("logprobs") or {}).get("content")) or []
    if prompt is None or ids is None:
        return None
    logprobs = [float(c.get("logprob")) for c in content]
    if len(logprobs) != len(ids):
        return None
    return Sampled(prompt_ids=[int(i) for i in prompt], ids=[int(i) for i in ids], logprobs=logprobs)
