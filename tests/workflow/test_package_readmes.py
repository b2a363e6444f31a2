"""Each package under src/gymforge/ says in a short README what it owns, its entry points and its layer; their links
to docs/ (files and section anchors) resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "src" / "gymforge"
PACKAGES = sorted(p.name for p in PACKAGE_ROOT.iterdir() if (p / "__init__.py").is_file()) + ["evalkit", "skills"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+\s+(.*)$", markdown.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_has_a_short_readme_whose_links_resolve(package: str) -> None:
    readme = PACKAGE_ROOT / package / "README.md"
    assert readme.is_file(), f"src/gymforge/{package} has no README.md"
    lines = readme.read_text().splitlines()
    assert 5 <= len(lines) <= 15, f"{package}/README.md: {len(lines)} lines (5-15)"
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
