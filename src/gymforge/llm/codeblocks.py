"""Files from a teacher answer written as fenced code blocks whose first line names the file.

    ```yaml
    # configs/tasks/penguins.yaml
    id: penguins
    ```

Fences follow CommonMark: ``` or ~~~, three or more, closed by a run of the same character at
least as long, so a ```` block may contain ``` lines. Prose between blocks is ignored.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

_OPEN = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_PATH = r"(?:(?:file|filename|path)\s*:\s*)?(?P<path>[\w.\-/]*[\w\-][\w.\-/]*)"
_PATH_COMMENTS = (
    re.compile(rf"^\s*(?:#|//|--)\s*{_PATH}\s*$", re.IGNORECASE),
    re.compile(rf"^\s*<!--\s*{_PATH}\s*-->\s*$", re.IGNORECASE),
)
_EXAMPLE = "```python\n# data/<task_id>/baseline.py\nimport ...\n```"


class CodeBlockError(ValueError):
    """The answer cannot be split into files; `errors` holds every problem found."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


def _path_of(line: str) -> str | None:
    m = next((m for pattern in _PATH_COMMENTS if (m := pattern.match(line))), None)
    if m is None:
        return None
    path = m["path"]
    # A path has a directory or an extension; this keeps comments like `# setup` from counting.
    return path if ("/" in path or "." in path.strip(".")) and not path.endswith("/") else None


def _unsafe(path: str) -> str | None:
    p = PurePosixPath(path)
    if p.is_absolute():
        return "it is absolute; use a path relative to the task root"
    if ".." in p.parts:
        return "it contains '..'; use a path inside the task root"
    return None


def parse_files(markdown: str) -> dict[str, str]:
    """Relative path -> content (path comment removed, ending in exactly one newline)."""
    lines = markdown.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    files: dict[str, str] = {}
    errors: list[str] = []
    n_blocks = 0
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m or (m["fence"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        n_blocks += 1
        start, fence, indent = i + 1, m["fence"], len(m["indent"])
        close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = next((j for j in range(start, len(lines)) if close.match(lines[j])), None)
        if end is None:
            errors.append(
                f"code block {n_blocks} (opened with {fence} at line {i + 1}) is never closed; "
                f"end it with a line containing only {fence}"
            )
            break
        body = [line[min(indent, len(line) - len(line.lstrip(" "))):] for line in lines[start:end]]
        i = end + 1
        first = next((k for k, line in enumerate(body) if line.strip()), None)
        path = None if first is None else _path_of(body[first])
        if path is None:
            shown = "an empty block" if first is None else repr(body[first].strip()[:80])
            errors.append(
                f"code block {n_blocks} (line {start}) does not start with a comment naming its file "
                f"(found {shown}); make the first line of every block a comment with the relative path, e.g.\n{_EXAMPLE}"
            )
            continue
        if why := _unsafe(path):
            errors.append(f"code block {n_blocks} (line {start}): unsafe path {path!r}: {why}")
            continue
        path = str(PurePosixPath(path))
        if path in files:
            errors.append(f"code block {n_blocks} (line {start}): file {path!r} is written twice; give each file exactly one block")
            continue
        files[path] = "\n".join(body[first + 1 :]).rstrip("\n") + "\n"
    if n_blocks == 0:
        errors.append(f"no fenced code blocks found; write every file as its own fenced code block, e.g.\n{_EXAMPLE}")
    if errors:
        raise CodeBlockError(errors)
    return files
