"""Each package under src/gymforge/ says in a short README what it owns, its entry points and its layer; their links
to docs/ (files and section anchors) resolve. Every module with logic has a test a reader finds: tests/<package>/
test_<module>.py, or a line of its package README, `Tests (...): `x.py` tests/<pkg>/test_y.py; ...`, naming the
tests that exercise it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = REPO / "src" / "gymforge"
PACKAGES = sorted(p.name for p in PACKAGE_ROOT.iterdir() if (p / "__init__.py").is_file()) + ["evalkit", "skills"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
TESTS_LINE = "Tests ("  # the README paragraph that maps modules to the tests that cover them
# Not modules of gymforge: the built-in benchmark's task files, run inside the sandbox as a task's own code.
NOT_MODULES = ("benchmark/tasks/",)


def anchors(markdown: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+\s+(.*)$", markdown.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_has_a_short_readme_whose_links_resolve(package: str) -> None:
    readme = PACKAGE_ROOT / package / "README.md"
    assert readme.is_file(), f"src/gymforge/{package} has no README.md"
    lines = [line for line in readme.read_text().splitlines() if not line.startswith(TESTS_LINE)]
    while lines and not lines[-1].strip():
        lines.pop()
    assert 5 <= len(lines) <= 15, f"{package}/README.md: {len(lines)} lines (5-15, its Tests line aside)"
    for target in LINK.findall(readme.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        path = (readme.parent / file).resolve()
        assert path.is_file(), f"{package}/README.md links to {target}: no such file"
        assert not anchor or anchor in anchors(path), f"{package}/README.md links to {target}: no such section"


def test_every_package_but_evalkit_names_its_layer() -> None:
    for package in PACKAGES:
        if package not in ("evalkit", "skills"):
            text = (PACKAGE_ROOT / package / "README.md").read_text()
            assert "docs/layout.md#layers" in text, package


def modules_with_logic(package: str) -> list[str]:
    """The package's modules (paths relative to it, subpackages included) that define a function or class."""
    found = []
    for path in sorted((PACKAGE_ROOT / package).rglob("*.py")):
        rel = path.relative_to(PACKAGE_ROOT / package).as_posix()
        if path.name in ("__init__.py", "__main__.py") or f"{package}/{rel}".startswith(NOT_MODULES):
            continue
        tree = ast.parse(path.read_text())
        if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in ast.walk(tree)):
            found.append(rel)
    return found


def readme_tests(package: str) -> dict[str, list[str]]:
    """module -> the tests its package README names for it (`a.py`, `b.py` tests/x/test_y.py, ...; items by `;`)."""
    named: dict[str, list[str]] = {}
    for line in (PACKAGE_ROOT / package / "README.md").read_text().splitlines():
        if line.startswith(TESTS_LINE):
            for item in line.split(":", 1)[1].split(";"):
                tests = re.findall(r"tests/[\w/]+\.py", item)
                for module in re.findall(r"`([\w/]+\.py)`", item):
                    named.setdefault(module, []).extend(tests)
    return named


def test_readme_tests_line_is_parsed() -> None:
    assert "loop.py" in modules_with_logic("agent") and "__init__.py" not in modules_with_logic("agent")
    named = readme_tests("agent")
    assert named["loop.py"] == ["tests/agent/test_agent_loop.py"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_with_logic_has_a_test_a_reader_finds(package: str) -> None:
    named = readme_tests(package)
    missing, dangling = [], []
    for module in modules_with_logic(package):
        if (REPO / "tests" / package / f"test_{Path(module).stem}.py").is_file():
            continue
        if not named.get(module):
            missing.append(module)
        dangling += [t for t in named.get(module, []) if not (REPO / t).is_file()]
    stale = [m for m in named if not (PACKAGE_ROOT / package / m).is_file()]
    assert not missing, (f"{package}: no tests/{package}/test_<module>.py for {missing}; add one, or name the tests "
                         f"that exercise each in the `{TESTS_LINE}...` line of src/gymforge/{package}/README.md")
    assert not dangling, f"{package}/README.md names tests that do not exist: {dangling}"
    assert not stale, f"{package}/README.md names modules that do not exist: {stale}"
