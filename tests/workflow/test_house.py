"""House rules on size: no function over 80 lines and no file over 600 lines under src/gymforge/ without a one-line
reason. A long function carries `# long: <reason>` on the line right above its `def` (or above its first
decorator); a long file carries a line `# long file: <reason>` at its top level."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "src" / "gymforge"
MAX_FUNCTION = 80  # lines from `def` to the function's last line, docstring included
MAX_FILE = 600
FUNCTION_REASON = re.compile(r"^\s*# long: \S")
FILE_REASON = re.compile(r"^# long file: \S", re.M)


def long_functions(text: str) -> list[tuple[str, int, int]]:
    """(name, line of its def, lines) of every function or method over MAX_FUNCTION lines without a reason above."""
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            above = lines[first - 2] if first >= 2 else ""
            if n > MAX_FUNCTION and not FUNCTION_REASON.match(above):
                found.append((node.name, node.lineno, n))
    return found


def long_file(text: str) -> bool:
    return len(text.splitlines()) > MAX_FILE and not FILE_REASON.search(text)


def test_the_rules_see_a_long_unit_and_its_reason() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION))
    long = f"def f():\n{body}"
    assert long_functions(long) == [("f", 1, MAX_FUNCTION + 1)]
    assert long_functions(f"# long: one table, read top to bottom\n@decorator\n{long}") == []
    assert long_functions("def g():\n" + "".join(body.splitlines(keepends=True)[1:])) == []  # exactly 80 lines
    big = "x = 1\n" * (MAX_FILE + 1)
    assert long_file(big) and not long_file("x = 1\n" * MAX_FILE)
    assert not long_file("# long file: one table\n" + big)


def test_no_function_over_80_lines_without_a_reason() -> None:
    offenders = [f"{path.relative_to(SOURCE)}:{line} {name} ({n} lines)"
                 for path in sorted(SOURCE.rglob("*.py")) for name, line, n in long_functions(path.read_text())]
    assert not offenders, ("split these into units a reader can hold, or say why one must stay long in a "
                           "`# long: <reason>` line right above it:\n" + "\n".join(offenders))


def test_no_file_over_600_lines_without_a_reason() -> None:
    offenders = [f"{path.relative_to(SOURCE)} ({len(path.read_text().splitlines())} lines)"
                 for path in sorted(SOURCE.rglob("*.py")) if long_file(path.read_text())]
    assert not offenders, ("split these, or say why one must stay long in a top-level `# long file: <reason>` "
                           "line:\n" + "\n".join(offenders))
