"""Split a model reply into its DISCUSSION and its single fenced command.

Fences are lines of three or more backticks starting in column 0 (up to three spaces of indent when no
line of the reply starts with one); an opening fence may carry an info string (```bash), a closing fence
is backticks alone, at least as many as opened (where MLGym, which counts three, would take ```` ... ```
as a block, this parser reads the longer fence as Markdown does).

Where MLGym's parser (`MLGymThoughtActionParser`, built on SWE-agent's `ThoughtActionParser`) turns a
reply into an action, this parser returns the same action; it is stricter only where a reply reads as two
different commands. `bench/parser_agreement.py` measures the agreement on MLGym's released trajectories.
The rules that make it agree:

* A stray fence on the last line after the one complete block is ignored, as MLGym ignores an unclosed
  fence. gemini-2.0-flash-thinking writes its block, then a line `COMMAND`, the command again and a
  closing fence; the command is the first block. A fence with text after it (a second, unclosed block)
  is still an error: the reply holds two commands.
* Inside an `edit`/`insert` block, fences before `end_of_edit`/`end_of_insert` are content when they pair
  up, so a model can edit a Markdown file that itself contains fences. An odd number of them means the
  block was closed before its terminator (the same gemini quirk with an edit that lacks `end_of_edit`):
  the block ends at the first fence, as in MLGym, and the edit tool reports the missing terminator.
"""

from __future__ import annotations

import re

_MULTILINE = re.compile(r"^\s*(edit|insert)\b")


class FormatError(ValueError):
    """The reply does not hold exactly one non-empty command block; the message says what to fix."""


def _close(lines: list[str], start: int, fence: int, indent: int) -> int | None:
    """Index of the line that closes the block whose body starts at `start`, or None."""
    close = re.compile(rf"^ {{0,{indent}}}`{{{fence},}}\s*$")
    any_fence = re.compile(rf"^ {{0,{indent}}}`{{3,}}")
    first_close = next((j for j in range(start, len(lines)) if close.match(lines[j])), None)
    first = next((ln for ln in lines[start:] if ln.strip()), "")
    mm = _MULTILINE.match(first)
    if mm is None:
        return first_close
    terminator = f"end_of_{mm[1]}"
    end = next((j for j in range(start, len(lines)) if lines[j].strip() == terminator), None)
    if end is None or sum(1 for ln in lines[start:end] if any_fence.match(ln)) % 2:
        return first_close
    return next((j for j in range(end + 1, len(lines)) if close.match(lines[j])), None)


def _blocks(lines: list[str]) -> list[tuple[int, int]]:
    """(first, end) line spans of the fenced bodies; an unclosed fence raises, unless it is a stray last line."""
    # Fences start in column 0, as MLGym reads them; only a reply with none there (its block indented in a
    # list item, which MLGym rejects) may indent them by up to three spaces.
    indent = 0 if any(ln.startswith("```") for ln in lines) else 3
    opening = re.compile(rf"^ {{0,{indent}}}(`{{3,}})([^`]*)$")
    spans: list[tuple[int, int]] = []
    last = max((j for j, ln in enumerate(lines) if ln.strip()), default=-1)
    i = 0
    while i < len(lines):
        m = opening.match(lines[i])
        if not m:
            i += 1
            continue
        end = _close(lines, i + 1, len(m[1]), indent)
        if end is None:
            if spans and i == last:
                break  # a stray fence closing nothing, after the block (MLGym ignores it)
            raise FormatError(f"the code block opened at line {i + 1} is never closed; end it with a line of ```")
        spans.append((i + 1, end))
        i = end + 1
    return spans


def parse_reply(reply: str | None) -> tuple[str, str]:
    """(thought, action): the text outside the block, and the block's content."""
    text = (reply or "").replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise FormatError("the reply is empty")
    lines = text.split("\n")
    spans = _blocks(lines)
    if not spans:
        raise FormatError("the reply has no command block; put the command in a ``` fenced block")
    if len(spans) > 1:
        raise FormatError(f"the reply has {len(spans)} command blocks; give exactly one command per reply")
    start, end = spans[0]
    body = lines[start:end]
    indent = len(lines[start - 1]) - len(lines[start - 1].lstrip(" "))
    body = [ln[min(indent, len(ln) - len(ln.lstrip(" "))):] for ln in body]
    action = "\n".join(body).strip("\n").rstrip()
    if not action.strip():
        raise FormatError("the command block is empty")
    # Keep the command line itself free of stray whitespace; edit bodies are left as written.
    first, *rest = action.split("\n")
    action = "\n".join([first.strip(), *rest])
    thought = "\n".join([*lines[: start - 1], *lines[end + 1 :]]).strip()
    return thought, action
