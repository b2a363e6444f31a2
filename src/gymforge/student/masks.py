"""Assistant-only loss for chat templates without `{% generation %}` markers: masks from the rendered conversation.

SmolLM2's template, Qwen3's and most others mark nothing, so `return_assistant_tokens_mask` cannot say which tokens
the assistant wrote. Here the mask comes from the text the template renders, the same text training tokenizes:

1. render the whole conversation once (`T`, no generation prompt);
2. for each assistant turn `i`, render the messages before it with the generation prompt (`P_i`, e.g. ending in
   `<|im_start|>assistant\\n`): `P_i` must be a prefix of `T` (else the template renders history differently once
   later turns exist and no mask can be trusted: an error says so), and the turn starts where `P_i` ends;
3. the turn ends after its content (found in `T` from that start; what the template puts between the generation
   prompt and the content, such as Qwen3's empty `<think>\\n\\n</think>\\n\\n`, is the model's to write and is kept)
   plus the special token that closes it, if one follows at once (`<|im_end|>`, `<|eot_id|>`): the model must learn
   to stop. The newline after it is the next turn's;
4. tokenize `T` with offsets (exactly `apply_chat_template(..., tokenize=True)`: the same text, no special tokens
   added) and train a token iff it overlaps a turn's span (as transformers does with markers: a token that merges
   the generation prompt's last newline with the content's leading space is trained).

A template whose generation prompt renders nothing cannot say where an assistant turn starts: it is refused.

A `request` SFT example (and an RL sample) is a request followed by the reply it got: only its final assistant turn
is trained (`last_only`), the earlier ones are the request's history. `tokenize_turns` gives either mask from the
template's `{% generation %}` markers when it has them, else from the rendering.
"""

from __future__ import annotations

import re
from typing import Any, Sequence


class MaskError(ValueError):
    """The chat template does not allow finding the assistant turns in its rendering."""


class TrainingError(RuntimeError):
    """Training cannot start or finish; the message says why and what to change."""


def _render(tokenizer: Any, messages: Sequence[dict[str, Any]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt)


def _closing_tokens(tokenizer: Any) -> list[str]:
    """Special tokens that may close a turn, longest first (the template's eos first of all)."""
    specials = {str(t) for t in getattr(tokenizer, "all_special_tokens", [])}
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    specials |= {str(t.content) if hasattr(t, "content") else str(t) for t in decoder.values()
                 if getattr(t, "special", True)}
    eos = [tokenizer.eos_token] if tokenizer.eos_token else []
    return eos + sorted((s for s in specials if s and s not in eos), key=len, reverse=True)


def assistant_spans(tokenizer: Any, messages: Sequence[dict[str, Any]], name: str = "the student", *,
                    last_only: bool = False) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans `[start, end)` of its assistant turns (`last_only`: of the
    final one alone, which renders only the messages before it, not before every turn)."""
    text = _render(tokenizer, messages, False)
    closers = _closing_tokens(tokenizer)
    spans: list[tuple[int, int]] = []
    turns = [i for i, message in enumerate(messages) if message.get("role") == "assistant"]
    for i in turns[-1:] if last_only else turns:
        message = messages[i]
        prefix = _render(tokenizer, messages[:i], True)
        if prefix == _render(tokenizer, messages[:i], False):
            raise MaskError(f"the chat template of {name} renders no generation prompt (add_generation_prompt=True "
                            "adds nothing), so the start of an assistant turn cannot be told from its rendering; "
                            "add {% generation %} markers to the template")
        if not text.startswith(prefix):
            raise MaskError(f"the chat template of {name} renders the messages before assistant turn {i} differently "
                            "once later turns follow, so its assistant tokens cannot be found from the rendering; add "
                            "{% generation %} markers to the template")
        start = len(prefix)
        content = str(message.get("content") or "")
        end = start
        if content:
            at = text.find(content, start)
            if at < 0 and content.strip():
                content = content.strip()
                at = text.find(content, start)
            if at < 0:
                raise MaskError(f"the chat template of {name} does not render assistant turn {i}'s content verbatim; "
                                "add {% generation %} markers to the template")
            end = at + len(content)
        closer = next((c for c in closers if text.startswith(c, end)), None)
        if closer is not None:
            end += len(closer)
        if spans and start < spans[-1][1]:
            raise MaskError(f"assistant turns {len(spans) - 1} and {i} overlap in the rendering of {name}")
        spans.append((start, end))
    return text, spans


def tokenize_with_assistant_mask(tokenizer: Any, messages: Sequence[dict[str, Any]], name: str = "the student",
                                 *, last_only: bool = False) -> dict[str, list[int]]:
    """`input_ids` of the rendered conversation and `assistant_masks` (1: an assistant token, trained; with
    `last_only`, of the final assistant turn only)."""
    text, spans = assistant_spans(tokenizer, messages, name, last_only=last_only)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    mask = [0] * len(ids)
    k = 0
    for j, (s, e) in enumerate(offsets):
        while k < len(spans) and s >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if s < spans[k][1] and max(e, s + 1) > spans[k][0]:
            mask[j] = 1
    return {"input_ids": ids, "assistant_masks": mask}


def has_generation_markers(template: Any) -> bool:
    """The template marks the assistant's tokens with `{% generation %}` (TRL's test, without importing TRL)."""
    if isinstance(template, dict):
        template = template.get("default")
    return bool(template) and re.search(r"\{%-?\s*generation\s*-?%\}", str(template)) is not None


def last_run(mask: Sequence[int]) -> list[int]:
    """`mask` with only its last run of ones kept (the final assistant turn of a marker mask)."""
    out = [0] * len(mask)
    end = max((i + 1 for i, m in enumerate(mask) if m), default=0)
    start = end
    while start > 0 and mask[start - 1]:
        start -= 1
    out[start:end] = [1] * (end - start)
    return out


def tokenize_turns(tokenizer: Any, messages: Sequence[dict[str, Any]], name: str = "the student", *,
                   last_only: bool = False) -> dict[str, list[int]]:
    """`input_ids` and `assistant_masks` of a conversation as training tokenizes it: the mask from the template's
    `{% generation %}` markers when it has them (what TRL's `assistant_only_loss` uses), else from the rendering
    (`tokenize_with_assistant_mask`); `last_only`: the final assistant turn alone."""
    if not has_generation_markers(tokenizer.chat_template):
        return tokenize_with_assistant_mask(tokenizer, messages, name, last_only=last_only)
    enc = tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=True, add_generation_prompt=False,
                                        return_assistant_tokens_mask=True)
    mask = list(enc["assistant_masks"])
    return {"input_ids": list(enc["input_ids"]), "assistant_masks": last_run(mask) if last_only else mask}


# ---- which mask a student's template gets (SFT and RL check it before loading any model) --------------


PROBE = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Start."},
         {"role": "assistant", "content": "DISCUSSION\nLook.\n```\nls\n```"}, {"role": "user", "content": "a.py"},
         {"role": "assistant", "content": "DISCUSSION\nDone.\n```\nsubmit\n```"}]


def check_chat_template(tokenizer: Any, student: str) -> str:
    """Where the assistant mask comes from: `tokenizer` (its `{% generation %}` markers) or `rendered` (computed from
    the rendered conversation, `tokenize_with_assistant_mask`); a clear error when neither works."""
    from trl.chat_template_utils import has_generation_markers  # deferred: trl imports torch (seconds)

    template = tokenizer.chat_template
    if not template:
        raise TrainingError(f"the tokenizer of {student!r} has no chat template: the chat-format SFT data cannot "
                            "be rendered")
    if has_generation_markers(template):
        return "tokenizer"
    try:
        masked = tokenize_with_assistant_mask(tokenizer, PROBE, repr(student))
    except MaskError as err:
        raise TrainingError(f"assistant-only loss: {err} (chat_template.jinja in results/student/tokenizer), "
                            "then rerun") from None
    if 1 not in masked["assistant_masks"]:
        raise TrainingError(f"assistant-only loss: no assistant token found in the rendering of {student!r}'s chat "
                            "template; add {% generation %} markers to it")
    return "rendered"
