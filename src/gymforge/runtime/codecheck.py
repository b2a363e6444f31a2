"""Static checks on Python source: errors that would certainly fail at run time, dataset columns, and whether an
evaluation script imports gymforge_eval (the evaluation contract).

Used on generated starter code and on the agent's `edit` command, so messages name the file and line.
"""

from __future__ import annotations

import ast
import difflib
from typing import Iterator, Literal

from pyflakes import checker, messages

# pyflakes messages that mean the code fails when run; style findings (unused imports...) are left out.
_FATAL = tuple(
    getattr(messages, name)
    for name in (
        "UndefinedName", "UndefinedLocal", "UndefinedExport", "DuplicateArgument", "ReturnOutsideFunction",
        "YieldOutsideFunction", "ContinueOutsideLoop", "BreakOutsideLoop", "DefaultExceptNotLast",
        "TwoStarredExpressions", "TooManyExpressionsInStarredAssignment", "ForwardAnnotationSyntaxError",
        "FutureFeatureNotDefined", "LateFutureImport", "ImportStarNotPermitted",
        "StringDotFormatInvalidFormat", "StringDotFormatMissingArgument", "StringDotFormatMixingAutomatic",
        "PercentFormatInvalidFormat", "PercentFormatMixedPositionalAndNamed",
        "PercentFormatUnsupportedFormatCharacter", "PercentFormatPositionalCountMismatch",
        "PercentFormatExpectedMapping", "PercentFormatExpectedSequence", "PercentFormatMissingArgument",
        "PercentFormatStarRequiresSequence",
    )
    if hasattr(messages, name)
)
_IMPORT_HINTS = {
    "np": "import numpy as np", "pd": "import pandas as pd", "plt": "import matplotlib.pyplot as plt",
    "nn": "import torch.nn as nn", "F": "import torch.nn.functional as F", "json": "import json",
    "os": "import os", "sys": "import sys", "torch": "import torch", "argparse": "import argparse",
    "load_from_disk": "from datasets import load_from_disk", "load_dataset": "from datasets import load_dataset",
}


def check_python(source: str, filename: str) -> list[str]:
    """`file:line: problem` for syntax errors, else for pyflakes errors (undefined names, ...)."""
    try:
        tree = ast.parse(source, filename=filename)
        # Compiling also runs the symbol table, which catches e.g. `nonlocal` misuse that parsing accepts.
        compile(tree, filename, "exec")
    except SyntaxError as exc:
        where = f"{filename}:{exc.lineno}" + (f":{exc.offset}" if exc.offset else "")
        text = f": {exc.text.strip()!r}" if exc.text and exc.text.strip() else ""
        return [f"{where}: syntax error: {exc.msg}{text}"]
    except ValueError as exc:  # e.g. null bytes
        return [f"{filename}: cannot be compiled: {exc}"]
    out = []
    for msg in sorted(checker.Checker(tree, filename=filename).messages, key=lambda m: (m.lineno, m.col)):
        if not isinstance(msg, _FATAL):
            continue
        line = f"{filename}:{msg.lineno}: {msg.message % msg.message_args}"
        if isinstance(msg, messages.UndefinedName) and (hint := _IMPORT_HINTS.get(msg.message_args[0])):
            line += f" (missing `{hint}`?)"
        out.append(line)
    return out


def imports_gymforge_eval(source: str) -> bool:
    """Whether the evaluation script `source` imports gymforge_eval (`import gymforge_eval[.x]`, `from gymforge_eval[.x]
    import ...`, at any nesting), as its syntax tree says: a mention in a comment or a string is not the contract (such
    a script, importing the submission itself, would be scored on the task's own module). A script that does not parse
    does not."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: a null byte (Python < 3.12)
        return False

    def ours(name: str | None) -> bool:
        return name is not None and (name == "gymforge_eval" or name.startswith("gymforge_eval."))

    return any(isinstance(node, ast.Import) and any(ours(alias.name) for alias in node.names)
               or isinstance(node, ast.ImportFrom) and node.level == 0 and ours(node.module)
               for node in ast.walk(tree))


Kind = Literal["root", "table"]  # root: maybe a DatasetDict (string keys are splits); table: string keys are columns

_LOADERS = {"load_from_disk", "load_dataset"}
_READERS = {"read_csv", "read_parquet"}
_WRAPPERS = {"DataFrame", "from_pandas"}  # pd.DataFrame(table), Dataset.from_pandas(table)
# Methods whose result has (a subset of) the same columns.
_KEEP = {
    "to_pandas", "copy", "drop", "dropna", "fillna", "head", "tail", "sample", "reset_index", "sort_values",
    "sort_index", "drop_duplicates", "astype", "query", "infer_objects", "shuffle", "select", "filter", "sort",
    "with_format", "remove_columns", "select_columns", "cast", "flatten_indices",
}
_COLUMN_ARG_METHODS = {"remove_columns", "select_columns", "rename_column"}


def _name(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _strs(node: ast.expr | None) -> list[ast.Constant]:
    """String constants of `"a"` or `["a", "b"]` (or a tuple); empty for anything computed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, (ast.List, ast.Tuple)) and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return list(node.elts)  # type: ignore[arg-type]
    return []


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _stored_names(node: ast.AST) -> Iterator[str]:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            yield n.id
        elif isinstance(n, ast.arg):
            yield n.arg


class _Scope:
    def __init__(self, parent: _Scope | None = None, local: set[str] | None = None) -> None:
        self.parent, self.local, self.kinds = parent, local or set(), dict[str, Kind]()

    def get(self, name: str) -> Kind | None:
        if self.parent is None or name in self.local:
            return self.kinds.get(name)
        return self.parent.get(name)

    def set(self, name: str, kind: Kind | None) -> None:
        if kind is None:
            self.kinds.pop(name, None)
        else:
            self.kinds[name] = kind


def _created_columns(tree: ast.AST) -> set[str]:
    """Every string the code could use as a column it made itself; such keys are never flagged."""
    out: set[str] = set()

    def add(node: ast.expr | None) -> None:
        out.update(c.value for c in _strs(node))

    for n in ast.walk(tree):
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store):
            add(n.slice)
            if isinstance(n.slice, ast.Tuple) and len(n.slice.elts) > 1:
                add(n.slice.elts[1])  # .loc[rows, "new"] = ...
        elif isinstance(n, ast.Dict):  # rename mappings, map() results, metric dicts
            for k, v in zip(n.keys, n.values, strict=True):
                add(k)
                add(v)
        elif isinstance(n, ast.Call):
            method = _name(n.func)
            if method == "assign" or method == "dict":
                out.update(k.arg for k in n.keywords if k.arg)
            elif method == "add_column" and n.args:
                add(n.args[0])
            elif method in {"insert", "rename_column"} and len(n.args) > 1:  # df.insert(loc, "new", v)
                add(n.args[1])
            elif method == "reset_index":
                out.add("index")
    return out


class _ColumnChecker:
    def __init__(self, filename: str, columns: set[str], tree: ast.Module) -> None:
        self.filename, self.columns, self.created = filename, columns, _created_columns(tree)
        # A helper the code defines itself, e.g. its own `load_dataset()`, returns who knows what.
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.loaders, self.readers = _LOADERS - defined, _READERS - defined
        self.errors: list[str] = []

    def kind(self, node: ast.expr, scope: _Scope) -> Kind | None:
        if isinstance(node, ast.Name):
            return scope.get(node.id)
        if isinstance(node, ast.Call):
            name = _name(node.func)
            if name in self.loaders:
                return "table" if _kw(node, "split") is not None else "root"
            if name in self.readers and node.args:
                # Only literal data paths: a submission or prediction file has its own columns.
                text = " ".join(c.value for c in ast.walk(node.args[0]) if isinstance(c, ast.Constant) and isinstance(c.value, str))
                return "table" if text and not any(w in text.lower() for w in ("submission", "pred")) else None
            if name in _WRAPPERS and node.args and self.kind(node.args[0], scope) == "table":
                return "table"
            if isinstance(node.func, ast.Attribute) and (base := self.kind(node.func.value, scope)):
                if name == "to_pandas":
                    return "table"
                if name == "train_test_split" and base == "table":
                    return "root"
                return base if name in _KEEP else None
            return None
        if isinstance(node, ast.Subscript):
            target = node.value
            if isinstance(target, ast.Attribute) and target.attr in {"loc", "iloc"}:
                if self.kind(target.value, scope) != "table":
                    return None
                s = node.slice
                cols = s.elts[1] if isinstance(s, ast.Tuple) and len(s.elts) > 1 else None
                return "table" if cols is None or isinstance(cols, (ast.List, ast.Slice)) else None
            base = self.kind(target, scope)
            s = node.slice
            if base == "root":
                split = isinstance(s, (ast.Name, ast.JoinedStr)) or (isinstance(s, ast.Constant) and isinstance(s.value, str))
                return "table" if split else None
            if base == "table":
                # df[["a", "b"]], df[mask], df[:n] keep columns; df["a"] is a column.
                if isinstance(s, (ast.List, ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Call, ast.Slice)):
                    return "table"
        return None

    def flag(self, node: ast.Constant) -> None:
        key = node.value
        if key in self.columns or key in self.created:
            return
        close = difflib.get_close_matches(key, self.columns, n=1)
        msg = (
            f"{self.filename}:{node.lineno}: column {key!r} is not in the dataset "
            f"(columns: {', '.join(sorted(self.columns))})" + (f"; did you mean {close[0]!r}?" if close else "")
        )
        if msg not in self.errors:
            self.errors.append(msg)

    def check(self, expr: ast.expr, scope: _Scope) -> None:
        shadowed = {n for c in ast.walk(expr) if isinstance(c, (ast.comprehension, ast.Lambda)) for n in _stored_names(c)}
        if shadowed:
            scope = _Scope(scope, shadowed)
        for node in ast.walk(expr):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                target = node.value
                if isinstance(target, ast.Attribute) and target.attr == "loc":
                    if self.kind(target.value, scope) == "table" and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) > 1:
                        for c in _strs(node.slice.elts[1]):
                            self.flag(c)
                elif self.kind(target, scope) == "table":
                    for c in _strs(node.slice):
                        self.flag(c)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                method, base = node.func.attr, self.kind(node.func.value, scope)
                if base is None:
                    continue
                if method == "drop" and base == "table":
                    cols = _kw(node, "columns")
                    axis = _kw(node, "axis")
                    if cols is None and node.args and isinstance(axis, ast.Constant) and axis.value in (1, "columns"):
                        cols = node.args[0]
                    for c in _strs(cols):
                        self.flag(c)
                elif method in _COLUMN_ARG_METHODS:
                    for c in _strs(node.args[0] if node.args else _kw(node, "column_names") or _kw(node, "original_column_name")):
                        self.flag(c)
                elif method in {"rename", "rename_columns"}:
                    mapping = _kw(node, "columns") if method == "rename" else (node.args[0] if node.args else None)
                    if isinstance(mapping, ast.Dict):
                        for k in mapping.keys:
                            for c in _strs(k):
                                self.flag(c)

    def run(self, body: list[ast.stmt], scope: _Scope) -> None:
        for stmt in body:
            self.statement(stmt, scope)

    def statement(self, stmt: ast.stmt, scope: _Scope) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in [*stmt.decorator_list, *stmt.args.defaults, *stmt.args.kw_defaults]:
                if d is not None:
                    self.check(d, scope)
            local = set(_stored_names(stmt.args)) | {n for s in stmt.body for n in _stored_names(s)}
            self.run(stmt.body, _Scope(scope, local))
            scope.set(stmt.name, None)
            return
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            if stmt.value is None:
                return
            self.check(stmt.value, scope)
            kind = self.kind(stmt.value, scope)
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    scope.set(t.id, kind)
                    continue
                self.check(t, scope)
                for part in t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                    self.check_store(part, scope)
                for name in _stored_names(t):
                    scope.set(name, None)
            return
        for field, value in ast.iter_fields(stmt):
            items = value if isinstance(value, list) else [value]
            if field in {"body", "orelse", "finalbody", "handlers", "cases"}:
                for item in items:
                    if isinstance(item, ast.stmt):
                        self.statement(item, scope)
                    else:  # except handler / match case
                        if getattr(item, "name", None):
                            scope.set(item.name, None)
                        self.run(item.body, scope)
                continue
            for item in items:
                if isinstance(item, ast.withitem):
                    self.check(item.context_expr, scope)
                    for name in _stored_names(item.optional_vars or ast.Pass()):
                        scope.set(name, None)
                elif isinstance(item, ast.expr):
                    if isinstance(getattr(item, "ctx", None), ast.Store):
                        for name in _stored_names(item):  # for-loop targets
                            scope.set(name, None)
                    else:
                        self.check(item, scope)
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            self.in_place(stmt.value, scope)

    def check_store(self, node: ast.expr, scope: _Scope) -> None:
        """A column written under a computed name, or `df.columns = ...`, makes any later key plausible."""
        if isinstance(node, ast.Attribute) and node.attr == "columns" and isinstance(node.value, ast.Name):
            scope.set(node.value.id, None)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            target = node.value.value if isinstance(node.value, ast.Attribute) and node.value.attr == "loc" else node.value
            s = node.slice
            key = s.elts[1] if isinstance(node.value, ast.Attribute) and isinstance(s, ast.Tuple) and len(s.elts) > 1 else s
            if isinstance(target, ast.Name) and not _strs(key):
                scope.set(target.id, None)

    def in_place(self, call: ast.Call, scope: _Scope) -> None:
        """`df.rename(..., inplace=True)` and friends change the columns of `df` itself."""
        inplace = _kw(call, "inplace")
        f = call.func
        if (
            isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.attr not in _KEEP
            and isinstance(inplace, ast.Constant) and inplace.value is True
        ):
            scope.set(f.value.id, None)


def check_columns(source: str, filename: str, columns: set[str]) -> list[str]:
    """`file:line: column 'x' is not in the dataset (...)` for string keys on dataset-derived tables.

    Conservative: only variables that come from `load_from_disk` / `load_dataset` / `read_csv` /
    `read_parquet` (through assignments, split subscripts and column-preserving methods) are
    followed, and keys the code creates anywhere are never reported.
    """
    if not columns:
        return []
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError:
        return []  # check_python reports it
    columns_checker = _ColumnChecker(filename, set(columns), tree)
    columns_checker.run(tree.body, _Scope())
    return columns_checker.errors
