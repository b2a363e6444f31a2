"""The README and every page under docs/ link only to files and sections that exist: a renamed heading or a moved
file breaks a test, not a reader's click."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_package_readmes import LINK, anchors

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", flags=re.M | re.S)


def links(page: Path) -> list[str]:
    """The relative link targets of a markdown page, outside fenced code."""
    text = FENCE.sub("", page.read_text())
    return [t for t in LINK.findall(text) if not t.startswith(("http://", "https://", "mailto:"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_to_a_file_and_section(page: Path) -> None:
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no such section")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_readme_is_short_and_links_every_page_under_docs() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) <= 12_500, "README.md: keep it at about 12 KB; move detail to docs/"
    linked = {t.partition("#")[0] for t in links(REPO / "README.md")}
    unlinked = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in linked]
    assert not unlinked, f"README.md does not link {unlinked}"
