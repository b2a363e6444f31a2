"""The programs the offline teacher writes are whole files (gymforge/offline/programs/*.py.j2): each template, with
any values filled in, is one complete Python module (no fragment that ends inside a block), and the family and
improvement code renders them (tests/offline/test_families.py runs what they generate)."""

from __future__ import annotations

import ast
from pathlib import Path

import jinja2.meta
import pytest

from gymforge.offline.families.common import _PROGRAMS, program

PROGRAMS = sorted(p.name for p in (Path(_PROGRAMS.loader.searchpath[0])).glob("*.py.j2"))  # type: ignore[attr-defined]


class Name(str):
    """A value for any template variable: a Python name, with any attribute or item (also a name)."""

    def __new__(cls, name: str = "value") -> Name:
        return super().__new__(cls, name)

    def __getattr__(self, attr: str) -> Name:
        return Name(attr)

    def __getitem__(self, key: object) -> Name:
        return Name("item")


# Values that must be statements, not expressions: the lines of a function body.
STATEMENTS = {"preprocess": "    features = None\n"}


def test_the_programs_are_there():
    assert len(PROGRAMS) >= 20 and "bin_evaluate.py.j2" in PROGRAMS and "strategy_ffd.py.j2" in PROGRAMS


@pytest.mark.parametrize("name", PROGRAMS)
def test_every_program_template_renders_a_whole_python_module(name: str) -> None:
    source = _PROGRAMS.loader.get_source(_PROGRAMS, name)[0]
    needed = jinja2.meta.find_undeclared_variables(_PROGRAMS.parse(source))
    for idea in ("select", "boosting"):  # build_model.py.j2 branches on it
        text = program(name, **{v: STATEMENTS.get(v, Name(v)) for v in needed} | {"idea": idea})
        tree = ast.parse(text)
        assert tree.body, name
