"""The key table of docs/configuration.md, generated from the config models' field descriptions (`gymforge schemas`).

One key is one edit: a field's type, default and `description=` in gymforge.core.sections (or GymforgeConfig) are
the table's row, and the value the quick start's config.yaml sets is its `config.yaml` column. The table sits
between two marker comments; the hand-written prose around it is kept as it is.
"""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gymforge.core.config import GymforgeConfig, read_layers

BEGIN = ("<!-- BEGIN generated key table: `gymforge schemas` writes it from the field descriptions of "
         "gymforge.core.sections / gymforge.core.config; edit those, not this -->")
END = "<!-- END generated key table -->"
NO_DESCRIPTION = "(undocumented: give the field a description)"

# `docs/x.md#anchor` in a description becomes a link relative to docs/.
_DOC_REF = re.compile(r"(?<![\w/`])docs/([\w.-]+\.md)(#[\w-]+)?")
_BOUNDS = ((annotated_types.Ge, "≥", "ge"), (annotated_types.Gt, ">", "gt"), (annotated_types.Le, "≤", "le"),
           (annotated_types.Lt, "<", "lt"))


def _type(annotation: Any) -> str:
    """A field's type as a reader says it: `int`, `` `a` \\| `b` ``, `list of str`, `... \\| null`."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join("null" if a is type(None) else _type(a) for a in typing.get_args(annotation))
    if origin is list:
        return f"list of {_type(typing.get_args(annotation)[0])}"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "model (rows below)"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(field: FieldInfo) -> str:
    marks = [f"{sign} {_number(getattr(m, attr))}" for m in field.metadata for kind, sign, attr in _BOUNDS
             if isinstance(m, kind)]
    marks += [f"at least {m.min_length} entries" for m in field.metadata if isinstance(m, annotated_types.MinLen)]
    return (" " + ", ".join(marks)) if marks else ""


def _number(value: float) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() and abs(value) < 1e6 else str(value)


def _value(value: Any) -> str:
    if value is PydanticUndefined:
        return "required"
    if value is None or isinstance(value, bool):
        return f"`{json.dumps(value)}`"
    if isinstance(value, (int, float)):
        return f"`{_number(value)}`"
    if isinstance(value, str):
        return f"`{value}`"
    if isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
        return ", ".join(f"`{getattr(v, 'name', type(v).__name__)}`" for v in value)
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return f"`{json.dumps(value)}`".replace("|", "\\|")


def _text(description: str | None) -> str:
    if not description:
        return NO_DESCRIPTION
    text = " ".join(description.split()).replace("|", "\\|")
    return _DOC_REF.sub(lambda m: f"[{m[0]}]({m[1]}{m[2] or ''})", text)


def _lookup(tree: Any, path: list[str]) -> Any:
    for part in path:
        if not isinstance(tree, dict) or part not in tree:
            return PydanticUndefined
        tree = tree[part]
    return tree


def _rows(fields: dict[str, FieldInfo], prefix: str, quick: Any) -> list[str]:
    """One row per leaf key of `fields` (nested models flattened into dotted keys, a list of models as `key[].field`)."""
    rows = []
    for name, field in fields.items():
        key, annotation = f"{prefix}{name}", field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows += _rows(annotation.model_fields, f"{key}.", _lookup(quick, [name]))
            continue
        set_here = _lookup(quick, [name])
        rows.append(f"| `{key}` | {_type(annotation)}{_bounds(field)} | "
                    f"{_value(field.get_default(call_default_factory=True))} | "
                    f"{'' if set_here is PydanticUndefined else _value(set_here)} | {_text(field.description)} |")
        item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else None
        if isinstance(item, type) and issubclass(item, BaseModel):
            rows += _rows(item.model_fields, f"{key}[].", None)
    return rows


def _section_intro(model: type[BaseModel]) -> str:
    """The first paragraph of the section model's docstring, on one line."""
    return " ".join((model.__doc__ or "").split("\n\n")[0].split())


def undocumented(model: type[BaseModel] = GymforgeConfig, prefix: str = "") -> list[str]:
    """Keys whose field has no description (the table would say NO_DESCRIPTION)."""
    missing = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            missing += undocumented(annotation, f"{prefix}{name}.")
            continue
        if not field.description:
            missing.append(prefix + name)
        if isinstance(item, type) and issubclass(item, BaseModel):
            missing += undocumented(item, f"{prefix}{name}[].")
    return missing


def render_key_table(quick_start: dict[str, Any]) -> str:
    """The generated part of docs/configuration.md: a table per section (top-level keys first), `quick_start`
    (config.yaml's own settings) filling the `config.yaml` column."""
    head = "| key | type | default | `config.yaml` | description |\n|---|---|---|---|---|\n"
    top = {name: f for name, f in GymforgeConfig.model_fields.items()
           if not (isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel))}
    parts = ["### Top level\n\n" + head + "\n".join(_rows(top, "", quick_start)) + "\n"]
    for name, field in GymforgeConfig.model_fields.items():
        if name in top:
            continue
        section: type[BaseModel] = field.annotation  # type: ignore[assignment]
        intro = _section_intro(section)
        parts.append(f"### `{name}`\n\n" + (f"{intro}\n\n" if intro else "") + head
                     + "\n".join(_rows(section.model_fields, f"{name}.", _lookup(quick_start, [name]))) + "\n")
    return "\n".join(parts)


def splice(document: str, table: str) -> str:
    """`document` with the text between the markers replaced by `table`; ValueError if the markers are missing."""
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the key table's markers are missing (put {BEGIN!r} and {END!r} where it goes)")
    return f"{document[:start]}{BEGIN}\n\n{table}\n{document[end:]}"


def expected_docs(docs: Path, quick_start_file: Path) -> str:
    """What `docs` should read: its prose, with the key table as the models and config.yaml make it."""
    quick = read_layers(quick_start_file) if quick_start_file.is_file() else {}
    return splice(docs.read_text(), render_key_table(quick))
