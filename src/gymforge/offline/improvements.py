"""Genuine improvements the offline teacher's agent makes to a task's starter code.

`improve(source, brief, idea)` takes the file the agent opened, whatever the family generator wrote for
that seed, and returns it improved under the same I/O contract. It rewrites only what the idea changes,
found with `ast` (the model factory and the feature list, the forecaster, the strategy function); a file
without that shape is rewritten whole from what the task description states. Each idea's new code opens
with a docstring of its own, so `idea_of` can tell from an edit which idea it carried.
"""

from __future__ import annotations

import ast
import json
import random
import re
from dataclasses import dataclass
from typing import Literal

from pyflakes import checker, messages

from gymforge.runtime.codecheck import check_python
from gymforge.offline.families.common import (
    HIGHER_IS_BETTER,
    Column,
    Game,
    is_id_like,
    parse_facts,
    program,
)
from gymforge.offline.families.games import MATRIX_GAMES, parse_game
from gymforge.offline.families.tabular import PREPROCESS

Kind = Literal["csv", "model", "python", "unknown"]


@dataclass(frozen=True)
class Brief:
    """What the agent reads off the task description."""

    kind: Kind
    file: str  # the file to improve, relative to the workspace
    problem: str = ""  # classification | regression | forecasting | the game's kind
    target: str = ""
    metric: str = ""
    higher_is_better: bool = True
    features: tuple[str, ...] = ()  # usable columns, from the dataset docs
    entry: str = ""  # python tasks: the function the evaluation imports
    game: Game | None = None


_COLUMN = re.compile(r"^- (\S+) \((.+), (target|feature|time order)\)(?::.*)?$")
_LOWER = ("rmse", "mae", "mse", "loss", "error", "time")


def read_brief(description: str) -> Brief:
    """The task's kind, files, target, metric and columns; `unknown` when there is no facts block."""
    facts = parse_facts(description)
    named = [f for f in re.findall(r"`([\w./-]+\.py)`", description) if "evaluat" not in f]
    file = named[0] if named else "baseline.py"
    metric = facts.get("metric", "").split(" ")[0]
    higher = HIGHER_IS_BETTER.get(metric, not any(w in metric.lower() for w in _LOWER))
    if "lower is better" in facts.get("metric", ""):
        higher = False
    if "game" in facts:
        submission = facts.get("submission", "")
        m = re.match(r"([\w./-]+\.py) defining (\w+)\(", submission)
        try:
            game = parse_game(facts)
        except (KeyError, ValueError):
            return Brief("unknown", file)
        return Brief("python", m.group(1) if m else file, game.kind, metric="Score", entry=m.group(2) if m else "",
                     game=game)
    if "target column" not in facts:
        return Brief("unknown", file, metric=metric, higher_is_better=higher)
    features = []
    for line in description.splitlines():
        m = _COLUMN.match(line.strip())
        if m and m.group(3) == "feature" and not is_id_like(Column(m.group(1), m.group(2), "numeric")):
            features.append(m.group(1))
    kind: Kind = "model" if ".yaml" in facts.get("submission", "") else "csv"
    return Brief(kind, file, facts.get("task", ""), facts["target column"], metric, higher, tuple(features))


# ---- source surgery ----------------------------------------------------------------------------------


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _splice(source: str, edits: list[tuple[int, int, int, int, str]]) -> str:
    """Replace (line, col)-(end line, end col) spans (1-based lines, as ast gives them) with text."""
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for l0, c0, l1, c1, text in sorted(edits, reverse=True):
        start, end = offsets[l0 - 1] + c0, offsets[l1 - 1] + c1
        source = source[:start] + text + source[end:]
    return source


def _replace_lines(source: str, first: ast.stmt, last: ast.stmt, new: str) -> str:
    """Replace the lines from `first`'s (decorators included) to `last`'s end with `new`."""
    start = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))])
    end = last.end_lineno or last.lineno
    return _splice(source, [(start, 0, end, len(source.splitlines()[end - 1]), new.rstrip("\n"))])


def _bound_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def _insertion_line(tree: ast.Module) -> int:
    """The line after the last top-level import (else after the docstring); 0 means the top."""
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if imports:
        return max(n.end_lineno or n.lineno for n in imports)
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.end_lineno or first.lineno
    return 0


def _add_lines(source: str, after: int, new: list[str], blank_before: bool) -> str:
    lines = source.splitlines()
    block = ([""] if blank_before and after else []) + new
    if (after == 0 or blank_before) and after < len(lines) and lines[after].strip():
        block.append("")
    return "\n".join(lines[:after] + block + lines[after:]) + "\n"


def ensure_imports(source: str, needed: list[tuple[str, str]]) -> str:
    """Add `from module import name` (module "" means `import name`) for each name the module lacks."""
    tree = ast.parse(source)
    bound = _bound_names(tree)
    missing = []
    for module, name in needed:
        alias = name.split(" as ")[-1]
        if alias not in bound:
            missing.append(f"from {module} import {name}" if module else f"import {name}")
            bound.add(alias)
    if not missing:
        return source
    has_imports = any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body)
    return _add_lines(source, _insertion_line(tree), missing, blank_before=not has_imports)


def ensure_constants(source: str, constants: dict[str, str]) -> str:
    """Define each NAME = value the module lacks, after its imports."""
    tree = ast.parse(source)
    bound = _bound_names(tree)
    missing = [f"{name} = {value}" for name, value in constants.items() if name not in bound]
    if not missing:
        return source
    return _add_lines(source, _insertion_line(tree), missing, blank_before=True)


def drop_unused_imports(source: str) -> str:
    """Remove single-name import statements that nothing uses any more (the replaced model's, say)."""
    tree = ast.parse(source)
    unused = {m.lineno for m in checker.Checker(tree).messages if isinstance(m, messages.UnusedImport)}
    drop = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) and n.lineno in unused
            and len(n.names) == 1 and n.lineno == n.end_lineno]
    if not drop:
        return source
    lines = source.splitlines()
    for node in sorted(drop, key=lambda n: -n.lineno):
        del lines[node.lineno - 1]
    return re.sub(r"\n{4,}", "\n\n\n", "\n".join(lines) + "\n")


def lit(value: object) -> str:
    return json.dumps(value)


# ---- tabular: classification, regression, model submission -------------------------------------------

TABULAR_IDEAS = ("select", "boosting", "forest", "all_columns")
FORECAST_IDEAS = ("backtest", "holt", "seasonal")
GAME_IDEAS: dict[str, tuple[str, ...]] = {
    **{kind: ("predict", "fictitious", "reciprocate") for kind in MATRIX_GAMES},
    "ultimatum": ("probe", "settle"),
    "knapsack": ("dp", "density"),
    "bin_packing": ("ffd", "bfd"),
}

# The first docstring line of each idea's new code: how `idea_of` recognises it in an edit.
MARKS: dict[str, str] = {
    "select": "Chooses by 5-fold cross-validation: boosting, a forest, a tuned linear model or the baseline's model.",
    "boosting": "Gradient boosting with many small, regularised steps on every usable column.",
    "forest": "A large random forest of fully grown trees on every usable column.",
    "backtest": "The candidate forecaster with the lowest error when backtested on the end of the history.",
    "holt": "Holt's damped linear trend: smoothed level and slope, the slope fading with the horizon.",
    "seasonal": "Seasonal naive with drift: repeats the last season (period found by autocorrelation) plus the trend.",
    "predict": "Best response to the opponent's predicted move, learnt from what it did after the same recent rounds.",
    "fictitious": "Fictitious play: best response to the opponent's move frequencies so far.",
    "reciprocate": "Reciprocity: best response to the opponent's last move, opening with the best move on average.",
    "probe": "Opens low and raises the offer after each rejection; an accepted offer is kept, never lowered.",
    "settle": "Opens near the typical acceptance level, raises quickly on rejection and settles on what works.",
    "dp": "Exact 0/1 knapsack by dynamic programming over the capacity.",
    "density": "Greedy by value per unit of weight, compared with the single most valuable item that fits.",
    "ffd": "First fit decreasing: largest items first, each into the first bin with room.",
    "bfd": "Best fit decreasing: largest items first, each into the fullest bin that still has room.",
    # Last: the other tabular ideas widen the feature list too, and their own mark must win.
    "all_columns": "Every usable column, not the baseline's subset.",
}
LABELS: dict[str, str] = {
    "select": "a cross-validated choice among gradient boosting, a random forest, a tuned linear model and the "
              "baseline's model, on every usable column",
    "boosting": "regularised gradient boosting on every usable column",
    "forest": "a larger random forest on every usable column",
    "all_columns": "the same model on every usable column instead of a subset",
    "backtest": "a forecaster chosen by backtesting naive, drift, smoothing, trend and seasonal methods on the end "
                "of the training series",
    "holt": "Holt's damped trend exponential smoothing",
    "seasonal": "a seasonal naive forecast with drift, the period found by autocorrelation",
    "predict": "a best response to the opponent's move predicted from what it did after the same recent rounds",
    "fictitious": "fictitious play (best response to the opponent's move frequencies)",
    "reciprocate": "a reciprocal strategy that best-responds to the opponent's last move",
    "probe": "an offer that starts low, rises after each rejection and stays once accepted",
    "settle": "an offer that starts near the usual acceptance level and settles quickly",
    "dp": "exact dynamic programming over the capacity",
    "density": "greedy packing by value density, checked against the best single item",
    "ffd": "first fit decreasing",
    "bfd": "best fit decreasing",
}

_PREPROCESS = PREPROCESS  # the baseline's preprocessing, kept by every improved model
_PREPROCESS_IMPORTS = [
    ("sklearn.compose", "ColumnTransformer"), ("sklearn.compose", "make_column_selector"),
    ("sklearn.impute", "SimpleImputer"), ("sklearn.pipeline", "make_pipeline"),
    ("sklearn.preprocessing", "OneHotEncoder"), ("sklearn.preprocessing", "StandardScaler"),
]
_SCORING = {"accuracy": "accuracy", "macro_f1": "f1_macro", "rmse": "neg_root_mean_squared_error",
            "mae": "neg_mean_absolute_error", "r2": "r2"}


def _models(brief: Brief) -> dict[str, tuple[str, str]]:
    """(class, constructor) of the stronger models, for the task's problem."""
    if brief.problem == "classification":
        return {
            "boosting": ("HistGradientBoostingClassifier", "HistGradientBoostingClassifier(max_iter=200, "
                         "learning_rate=0.05, max_leaf_nodes=15, min_samples_leaf=5, l2_regularization=1.0, "
                         "random_state=SEED)"),
            "forest": ("RandomForestClassifier", "RandomForestClassifier(n_estimators=300, random_state=SEED)"),
            "linear": ("LogisticRegression", "LogisticRegression(max_iter=5000)"),
        }
    loss = "absolute_error" if brief.metric == "mae" else "squared_error"
    return {
        "boosting": ("HistGradientBoostingRegressor", f"HistGradientBoostingRegressor(loss={lit(loss)}, max_iter=300, "
                     "learning_rate=0.05, max_leaf_nodes=15, min_samples_leaf=5, l2_regularization=1.0, "
                     "random_state=SEED)"),
        "forest": ("RandomForestRegressor", "RandomForestRegressor(n_estimators=300, random_state=SEED)"),
        "linear": ("Ridge", "Ridge()"),
    }


def _module_of(cls: str) -> str:
    return "sklearn.linear_model" if cls in ("LogisticRegression", "Ridge") else "sklearn.ensemble"


def _baseline_model(node: ast.FunctionDef, source: str) -> str | None:
    """Source of the estimator at the end of the pipeline the baseline's factory returns."""
    for ret in (n for n in ast.walk(node) if isinstance(n, ast.Return) and isinstance(n.value, ast.Call)):
        call = ret.value
        assert isinstance(call, ast.Call)
        name = getattr(call.func, "id", getattr(call.func, "attr", ""))
        if name == "make_pipeline" and call.args:
            return ast.get_source_segment(source, call.args[-1])
        if name == "Pipeline" and call.args and isinstance(call.args[0], ast.List) and call.args[0].elts:
            last = call.args[0].elts[-1]
            if isinstance(last, ast.Tuple) and len(last.elts) == 2:
                return ast.get_source_segment(source, last.elts[1])
    return None


def _build_model(brief: Brief, idea: str, base: str | None) -> tuple[str, list[tuple[str, str]]]:
    """Source of the new `build_model()` (programs/build_model.py.j2) and the imports it needs."""
    models = _models(brief)
    imports = list(_PREPROCESS_IMPORTS)
    c = "C" if brief.problem == "classification" else "alpha"
    if idea == "select":
        imports += [("sklearn.pipeline", "Pipeline"), ("sklearn.model_selection", "GridSearchCV")]
        imports += [(_module_of(cls), cls) for cls, _ in models.values()]
    else:
        imports.append((_module_of(models[idea][0]), models[idea][0]))
    scoring = _SCORING.get(brief.metric, "accuracy" if brief.problem == "classification" else "r2")
    source = program("build_model.py.j2", idea=idea, mark=MARKS[idea], preprocess=_PREPROCESS,
                     models={name: expr for name, (_, expr) in models.items()}, base=base, c=c,
                     values="[0.1, 1.0, 10.0]" if c == "C" else "[0.1, 1.0, 10.0, 100.0]", scoring=lit(scoring))
    return source, imports


def _feature_list(tree: ast.Module) -> ast.List | None:
    """The first `frame[["a", "b"]]` column selection: the baseline's feature subset."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.List) and node.slice.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.slice.elts
        ):
            return node.slice
    return None


# The scripts an idea writes from scratch, when the file has no function to edit: programs/tabular_csv.py.j2
# (CSV submission) and programs/tabular_model.py.j2 (model submission), filled in with the task's target, its
# features and the idea's build_model().


def _improve_tabular(source: str, brief: Brief, idea: str) -> str:
    tree = ast.parse(source)
    factory = _function(tree, "build_model")
    if factory is None:
        script = "tabular_model.py.j2" if brief.kind == "model" else "tabular_csv.py.j2"
        build, imports = _build_model(brief, "boosting" if idea == "all_columns" else idea, None)
        text = program(script, target=brief.target, target_lit=lit(brief.target), features=lit(list(brief.features)),
                       build_model=build)
        return drop_unused_imports(ensure_imports(text, imports))
    edits: list[tuple[int, int, int, int, str]] = []
    selection = _feature_list(tree)
    if selection is not None and brief.features:
        edits.append((selection.lineno, selection.col_offset, selection.end_lineno or selection.lineno,
                      selection.end_col_offset or 0, lit(list(brief.features))))
        line = source.splitlines()[selection.lineno - 1]
        comment = f"{line[: len(line) - len(line.lstrip())]}# {MARKS['all_columns']}"
        changed = ast.get_source_segment(source, selection) != lit(list(brief.features))
        if idea == "all_columns" and changed and source.splitlines()[selection.lineno - 2] != comment:
            edits.append((selection.lineno, 0, selection.lineno, 0, comment + "\n"))
    imports: list[tuple[str, str]] = []
    if idea != "all_columns" and MARKS[idea] not in (ast.get_docstring(factory) or ""):
        build, imports = _build_model(brief, idea, _baseline_model(factory, source))
        end = factory.end_lineno or factory.lineno
        edits.append((factory.lineno, 0, end, len(source.splitlines()[end - 1]), build.rstrip("\n")))
    text = _splice(source, edits)
    text = ensure_constants(ensure_imports(text, imports), {"SEED": "0"} if "SEED" in text else {})
    return drop_unused_imports(text)


# ---- forecasting -------------------------------------------------------------------------------------

def _forecast_functions(brief: Brief, idea: str) -> str:
    """The idea's forecaster with the helpers it shares (programs/forecast_<idea>.py.j2), scored by the task's
    error."""
    error = "np.square" if brief.metric == "rmse" else "np.abs"
    return program(f"forecast_{idea}.py.j2", mark=MARKS[idea], error=error)


def _improve_forecast(source: str, brief: Brief, idea: str) -> str:
    tree = ast.parse(source)
    node = _function(tree, "forecast")
    functions = _forecast_functions(brief, idea)
    if node is None:
        return program("forecast_script.py.j2", functions=functions, target_lit=lit(brief.target))
    # Helpers a previous idea left behind are replaced along with the forecaster.
    old = [n for n in tree.body if isinstance(n, ast.FunctionDef)
           and n.name in ("seasonal_periods", "damped_trend", "seasonal_drift", "candidates")]
    first = min([node, *old], key=lambda n: n.lineno)
    last = max([node, *old], key=lambda n: n.end_lineno or 0)
    return ensure_imports(_replace_lines(source, first, last, functions), [("", "numpy as np")])


# ---- games and heuristics ----------------------------------------------------------------------------

# Each idea's function is programs/strategy_<idea>.py.j2: the signature evaluate.py calls (named `entry`) and the
# idea's MARK docstring.
_DEFAULT_ENTRY = {"ultimatum": "make_offer", "knapsack": "select_items", "bin_packing": "pack_items"}


def game_function(kind: str, idea: str, entry: str | None = None) -> str:
    """The idea's function for a game of this kind, named `entry` (by default what evaluate.py calls)."""
    return program(f"strategy_{idea}.py.j2", mark=MARKS[idea], entry=entry or _DEFAULT_ENTRY.get(kind, "choose_move"))


def _improve_game(source: str, brief: Brief, idea: str) -> str:
    game = brief.game
    assert game is not None
    entry = brief.entry or _DEFAULT_ENTRY.get(game.kind, "choose_move")
    function = game_function(game.kind, idea, entry)
    constants: dict[str, str] = {}
    imports: list[tuple[str, str]] = []
    if game.kind in MATRIX_GAMES:
        constants["PAYOFF"] = lit([list(row) for row in game.payoff]) + "  # PAYOFF[your_move][opponent_move]"
        if "Counter" in function:
            imports.append(("collections", "Counter"))
    elif game.kind == "ultimatum":
        constants["PIE"] = str(game.pie)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    node = _function(tree, entry) if tree else None
    if tree is None or node is None:
        title = game.kind.replace("_", " ")
        text = f'"""Your {title} submission: `{entry}` as evaluate.py calls it."""\n\n\n{function}'
    else:
        text = _replace_lines(source, node, node, function)
    return drop_unused_imports(ensure_imports(ensure_constants(text, constants), imports))


# ---- the agent's interface -----------------------------------------------------------------------------


def ideas(brief: Brief) -> tuple[str, ...]:
    """Ideas for the task, strongest first; empty for a task the agent cannot read."""
    if brief.kind == "python" and brief.game is not None:
        return GAME_IDEAS.get(brief.game.kind, ())
    if brief.kind in ("csv", "model"):
        if brief.problem == "forecasting":
            return FORECAST_IDEAS if brief.kind == "csv" else ()
        return TABULAR_IDEAS
    return ()


def improve(source: str, brief: Brief, idea: str) -> str:
    """The file with the idea applied; same inputs, same output."""
    if brief.kind == "python":
        return _improve_game(source, brief, idea)
    if brief.problem == "forecasting":
        return _improve_forecast(source, brief, idea)
    return _improve_tabular(source, brief, idea)


def idea_of(text: str) -> str | None:
    """The idea an edit (or a file) carries, by its docstring; None for anything else."""
    return next((idea for idea, mark in MARKS.items() if mark in text), None)


def slip(old: str, new: str, rng: random.Random) -> str | None:
    """`new` with a plausible mistake in it, or None if none fits.

    An import the change needs left out (an undefined name), a block header without its colon or a line
    without its closing bracket (syntax errors): the edit guard rejects them all, which is the point.
    """
    old_lines, new_lines = old.splitlines(), new.splitlines()
    added = [i for i, line in enumerate(new_lines) if line.startswith(("import ", "from ")) and line not in old_lines]
    headers = [i for i, line in enumerate(new_lines) if line not in old_lines
               and re.match(r"\s*(def|for|if|while|with)\b.*:$", line)]
    closers = [i for i, line in enumerate(new_lines) if line not in old_lines and line.rstrip().endswith((")", "]"))]
    options = [("import", i) for i in added] + [("colon", i) for i in headers]
    rng.shuffle(options)
    options += [("bracket", i) for i in closers]  # the last resort: a line that only changed data
    before = set(check_python(old, "x.py"))
    for how, i in options:
        broken = list(new_lines)
        if how == "import":
            del broken[i]
        else:
            broken[i] = broken[i].rstrip()[:-1]
        text = "\n".join(broken) + "\n"
        if set(check_python(text, "x.py")) - before:
            return text
    return None
