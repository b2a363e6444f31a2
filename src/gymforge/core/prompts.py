"""Prompt rendering: one Jinja2 template per prompt in the package (`gymforge/core/templates/`), undefined
variables are errors."""

from __future__ import annotations

import os
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jinja2

# The templates ship inside the package (an installed wheel renders them too); GYMFORGE_TEMPLATES overrides them.
_DEFAULT_DIR = Path(str(files("gymforge.core") / "templates"))


def templates_dir() -> Path:
    return Path(os.environ.get("GYMFORGE_TEMPLATES", _DEFAULT_DIR))


@lru_cache(maxsize=4)
def _environment(root: str) -> jinja2.Environment:
    import jinja2  # here, not at the top: the Snakefile imports templates_dir() at parse time (0.2 s)

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(root),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(name: str, **context: object) -> str:
    """Render `<name>.j2`; a missing variable raises instead of rendering as blank."""
    return _environment(str(templates_dir())).get_template(f"{name}.j2").render(**context).strip() + "\n"
