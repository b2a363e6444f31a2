"""Every config key a step's code can reach is declared by its rule: a static check of the config views.

A step run by its rule reads the config through a view (gymforge.core.configview) that stops the job on a key the
rule's `CFG.digest(...)` does not declare (`undeclared_config`). The end-to-end runs test that only on the branches
the offline runs take; a read on a production-only branch (the real hub, docker, GPUs, vLLM) would first fail on a
user's cluster. So this reads the code instead: from each step function (gymforge.cli.STEPS) it follows the config
through the gymforge functions, methods and classes it is handed to, and collects every key read on any branch.

It follows the step's `cfg` as data: through assignments, `for` loops and `model_copy`, into the parameters of the
functions, methods and classes it (or a section of it) is handed to, into `self.<attr>` of a class given it, and
into the config models' own properties and methods (`cfg.train.name` reads `train.student`); `cfg.digest(...)`
reads the sections it names. Where it cannot be exact it over-approximates: every branch counts, a class handed the
config counts all of its methods as run, a closure counts as called, and a config object handed to code it cannot
follow (another library, a call through a variable, *args) counts as read whole. A value is read where it is taken.
"""

from __future__ import annotations

import ast
import functools
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pydantic import BaseModel

from gymforge import cli
from gymforge.core.config import READABLE_EVERYWHERE, SECTION_KEYS, GymforgeConfig, declared_keys

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "gymforge"
WHOLE = "<the whole config>"  # a read of the root: the config handed on whole where it cannot be followed

# ---- where each config model sits in GymforgeConfig -----------------------------------------------------------


def _model_of(annotation: object) -> type[BaseModel] | None:
    """The config model inside an annotation (`X`, `X | None`, `list[X]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (model := _model_of(arg)) is not None:
            return model
    return None


def _paths() -> dict[str, type[BaseModel]]:
    """Dotted path -> the model at that path ("" is GymforgeConfig; a list of models has its item's model)."""
    paths: dict[str, type[BaseModel]] = {"": GymforgeConfig}
    todo = [("", GymforgeConfig)]
    while todo:
        prefix, model = todo.pop()
        for name, info in model.model_fields.items():
            if (sub := _model_of(info.annotation)) is not None:
                path = f"{prefix}{name}"
                paths[path] = sub
                todo.append((f"{path}.", sub))
    return paths


PATHS = _paths()


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# ---- the source index -----------------------------------------------------------------------------------------


@dataclass
class Module:
    name: str
    tree: ast.Module
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # local name -> (module, name or None)


def _resolve_relative(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts[: len(parts) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


@functools.cache
def index(*roots: Path) -> dict[str, Module]:
    """Every module of the packages at `roots` (default: gymforge's source), by dotted name."""
    modules = {}
    for path in sorted(p for root in roots or (SRC,) for p in root.rglob("*.py")):
        root = next(r for r in roots or (SRC,) if r in path.parents)
        rel = path.relative_to(root.parent).with_suffix("")
        is_package = rel.name == "__init__"
        name = ".".join(rel.parts[:-1] if is_package else rel.parts)
        tree = ast.parse(path.read_text(), str(path))
        mod = Module(name, tree)
        for node in ast.walk(tree):  # deferred imports inside functions count too
            if isinstance(node, ast.ImportFrom):
                source = _resolve_relative(name, node, is_package)
                for alias in node.names:
                    mod.imports[alias.asname or alias.name] = (source, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        mod.imports[alias.asname] = (alias.name, None)
                    else:
                        mod.imports[alias.name.split(".")[0]] = (alias.name.split(".")[0], None)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                mod.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                mod.classes[node.name] = node
        modules[name] = mod
    return modules


def _lookup(module: str, name: str, modules: dict[str, Module] | None = None,
            depth: int = 0) -> tuple[Module, ast.AST] | None:
    """The function or class `name` of `module`, following re-exports (`from x import name`)."""
    modules = index() if modules is None else modules
    mod = modules.get(module)
    if mod is None or depth > 8:
        return None
    if name in mod.functions:
        return mod, mod.functions[name]
    if name in mod.classes:
        return mod, mod.classes[name]
    if name in mod.imports:
        source, attr = mod.imports[name]
        if attr is not None:
            return _lookup(source, attr, modules, depth + 1)
    return None


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


# ---- the walk -------------------------------------------------------------------------------------------------


class Reads:
    """The config keys (dotted paths) reachable from the step functions analysed with it."""

    def __init__(self, modules: dict[str, Module] | None = None) -> None:
        self.modules = index() if modules is None else modules
        self.where: dict[str, set[str]] = {}  # key -> module:line of each read
        self.done: set[tuple[int, tuple[tuple[str, str], ...]]] = set()

    # a function, with the config paths its parameters (or `self.<attr>`) hold
    def function(self, mod: Module, node: ast.AST, env: dict[str, str], cls: ast.ClassDef | None = None) -> None:
        key = (id(node), tuple(sorted(env.items())))
        if key in self.done:
            return
        self.done.add(key)
        Body(self, mod, dict(env), cls).visit_body(node)

    def klass(self, mod: Module, cls: ast.ClassDef, env: dict[str, str]) -> None:
        """A class handed config values (its constructor's `env`): every method runs, `self.<attr>` set from them
        (or annotated as a config model on the class) holding them."""
        methods = _methods(cls)
        attrs: dict[str, str] = {}
        for stmt in cls.body:  # dataclass / pydantic fields: `cfg: GymforgeConfig`
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if stmt.target.id in env:
                    attrs[f"self.{stmt.target.id}"] = env[stmt.target.id]
        init = methods.get("__init__")
        if init is not None:
            init_env = dict(env)
            for stmt in ast.walk(init):
                if isinstance(stmt, ast.Assign):
                    pairs = _assign_pairs(stmt)
                    for target, value in pairs:
                        if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                                and target.value.id == "self"):
                            path = Body(self, mod, init_env, cls, record=False).path(value)
                            if path is not None:
                                attrs[f"self.{target.attr}"] = path
        for method in methods.values():
            method_env = dict(attrs)
            if method.name == "__init__":
                method_env.update(env)
            self.function(mod, method, method_env, cls)


def _assign_pairs(stmt: ast.Assign) -> list[tuple[ast.expr, ast.expr]]:
    pairs = []
    for target in stmt.targets:
        if isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple) and len(target.elts) == len(stmt.value.elts):
            pairs += list(zip(target.elts, stmt.value.elts, strict=True))
        else:
            pairs.append((target, stmt.value))
    return pairs


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.arg]:
    args = node.args
    return [*args.posonlyargs, *args.args, *args.kwonlyargs]


class Body(ast.NodeVisitor):
    """One function body: tracks which names hold config paths and records every key read."""

    def __init__(self, reads: Reads, mod: Module, env: dict[str, str], cls: ast.ClassDef | None,
                 record: bool = True) -> None:
        self.reads, self.mod, self.env, self.cls, self.record = reads, mod, env, cls, record
        self.line = 0  # of the statement or expression being read (for the failure message)

    def visit_body(self, node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for stmt in node.body:
                self.visit(stmt)
        else:
            self.visit(node)

    def read(self, path: str) -> None:
        if self.record:
            self.reads.where.setdefault(path or WHOLE, set()).add(f"{self.mod.name}:{self.line}")

    def visit(self, node: ast.AST) -> None:
        if hasattr(node, "lineno"):
            self.line = node.lineno
        super().visit(node)

    # -- what an expression holds ---------------------------------------------------------------------------

    def path(self, expr: ast.expr) -> str | None:
        """The config path `expr` holds (a model or a value), recording nothing; None when it holds none."""
        if isinstance(expr, ast.Name):
            return self.env.get(expr.id)
        if isinstance(expr, ast.Attribute):
            if isinstance(expr.value, ast.Name) and expr.value.id == "self" and f"self.{expr.attr}" in self.env:
                return self.env[f"self.{expr.attr}"]
            base = self.path(expr.value)
            if base is not None and base in PATHS and expr.attr in PATHS[base].model_fields:
                return _join(base, expr.attr)
            return None
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "model_copy":
            return self.path(expr.func.value)
        if isinstance(expr, ast.IfExp):
            return self.path(expr.body) or self.path(expr.orelse)
        if isinstance(expr, ast.BoolOp):
            return next((p for v in expr.values if (p := self.path(v)) is not None), None)
        return None

    # -- statements that bind names -------------------------------------------------------------------------

    def visit_Assign(self, node: ast.Assign) -> None:
        for target, value in _assign_pairs(node):
            path = self.path(value)
            if path is not None and isinstance(target, ast.Name):
                self.env[target.id] = path  # bound, not read yet
            elif path is not None and isinstance(target, ast.Attribute) and _dotted(target) == f"self.{target.attr}":
                self.env[f"self.{target.attr}"] = path
            else:
                self.visit(value)
                self.visit(target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
            if isinstance(node.target, ast.Name) and (path := self.path(node.value)) is not None:
                self.env[node.target.id] = path

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        if (path := self.path(node.value)) is not None:
            self.env[node.target.id] = path

    def visit_For(self, node: ast.For) -> None:
        self.visit(node.iter)
        if isinstance(node.target, ast.Name) and (path := self.path(node.iter)) is not None:
            self.env[node.target.id] = path  # an item of a list of models: the list's path
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self.visit(node.iter)
        if isinstance(node.target, ast.Name) and (path := self.path(node.iter)) is not None:
            self.env[node.target.id] = path
        for cond in node.ifs:
            self.visit(cond)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:  # a closure: assume it runs, with what it sees
        Body(self.reads, self.mod, dict(self.env), self.cls, self.record).visit_body(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.body)

    # -- reads ----------------------------------------------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> None:
        if (path := self.env.get(node.id)) is not None:
            self.read(path)  # used as a whole (returned, compared, put in a container, ...)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        path = self.path(node)
        if path is not None:
            self.read(path)
            return
        base = self.path(node.value)
        if base is not None and base in PATHS:
            self.member(base, node.attr, None)
            return
        self.visit(node.value)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        call = node.value
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "rerun_view"
                and self.path(call.func.value) == "" and isinstance(node.slice, ast.Constant)):
            for key in declared_keys([str(node.slice.value)]):  # cfg.rerun_view()["rl"]: the section `rl`
                self.read(key)
            return
        self.generic_visit(node)

    def member(self, base: str, attr: str, call: ast.Call | None) -> None:
        """`<config at base>.attr`, not a field: a property or method of the model (or pydantic's)."""
        model = PATHS[base]
        if base == "" and attr == "digest" and call is not None:
            for arg in call.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    for key in declared_keys([arg.value]):
                        self.read(key)
            return
        if base == "" and attr == "rerun_view":
            return  # the view's rerun_view() holds only the declared sections
        for klass in model.__mro__:
            found = _lookup(klass.__module__, klass.__name__, self.reads.modules)
            if found is None:
                continue
            mod, cls = found
            assert isinstance(cls, ast.ClassDef)
            if attr in _methods(cls):
                self.reads.function(mod, _methods(cls)[attr], {"self": base}, cls)
                return
        self.read(base)  # model_dump(), iteration, ...: all of it

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "model_copy" and self.path(func.value) is not None:
            for kw in node.keywords:
                self.visit(kw.value)
            return
        if isinstance(func, ast.Attribute) and (base := self.path(func.value)) is not None and base in PATHS \
                and func.attr not in PATHS[base].model_fields:
            self.member(base, func.attr, node)
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                self.visit(arg)
            return
        passed = {i: p for i, a in enumerate(node.args) if (p := self.path(a)) is not None}
        named = {k.arg: p for k in node.keywords if k.arg and (p := self.path(k.value)) is not None}
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            if self.path(arg) is None:
                self.visit(arg)
        if isinstance(func, ast.Attribute) and self.path(func) is None:
            self.visit(func.value)
        for path in [*passed.values(), *named.values()]:
            if path not in PATHS:
                self.read(path)  # a value (not a model) is read where it is handed on
        passed = {i: p for i, p in passed.items() if p in PATHS}
        named = {k: p for k, p in named.items() if p in PATHS}
        if not passed and not named:
            return
        target = self.callee(func)
        if target is None:
            for path in [*passed.values(), *named.values()]:
                self.read(path)  # a model handed to code this cannot follow: all of it
            return
        mod, callee, owner = target
        if isinstance(callee, ast.ClassDef):
            init = _methods(callee).get("__init__")
            fields = [s.target.id for s in callee.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
            names = [p.arg for p in _params(init)][1:] if init is not None else fields
            self.reads.klass(mod, callee, self.hand_over(names, passed, named))
            return
        params = [p.arg for p in _params(callee)]
        if owner is not None and not _is_static(callee):
            params = params[1:]
        env = self.hand_over(params, passed, named)
        if owner is not None and owner is self.cls:  # a method of this class: what `self.<attr>` holds here
            env |= {k: v for k, v in self.env.items() if k.startswith("self.")}
        self.reads.function(mod, callee, env, owner)

    def hand_over(self, params: list[str], passed: dict[int, str], named: dict[str, str]) -> dict[str, str]:
        """The callee's parameters that receive config models; one that lands in *args / **kwargs is read whole."""
        env = {params[i]: p for i, p in passed.items() if i < len(params)}
        env |= {k: p for k, p in named.items() if k in params}
        for path in [p for i, p in passed.items() if i >= len(params)] + [p for k, p in named.items() if k not in params]:
            self.read(path)
        return env

    def callee(self, func: ast.expr) -> tuple[Module, ast.AST, ast.ClassDef | None] | None:
        """The gymforge function, class or method a call runs (with the class of a method), if the code tells."""
        if isinstance(func, ast.Name):
            name = func.id
            if name == "cls" and self.cls is not None:
                return self.mod, self.cls, None
            if name in self.mod.functions:
                return self.mod, self.mod.functions[name], None
            if name in self.mod.classes:
                return self.mod, self.mod.classes[name], None
            if name in self.mod.imports:
                source, attr = self.mod.imports[name]
                if attr is not None and (found := _lookup(source, attr, self.reads.modules)) is not None:
                    return found[0], found[1], None
            return None
        if isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id in ("self", "cls") and self.cls is not None:
                method = _methods(self.cls).get(func.attr)
                return (self.mod, method, self.cls) if method is not None else None
            owner = self.callee(func.value) if isinstance(func.value, ast.Name) else None
            if owner is not None and isinstance(owner[1], ast.ClassDef):  # `Class.method(...)`: a classmethod
                method = _methods(owner[1]).get(func.attr)
                return (owner[0], method, owner[1]) if method is not None else None
            dotted = _dotted(func.value)
            if dotted is not None:
                head, *rest = dotted.split(".")
                if head in self.mod.imports:
                    source, attr = self.mod.imports[head]
                    module = ".".join([source] + ([attr] if attr else []) + rest)
                    if (found := _lookup(module, func.attr, self.reads.modules)) is not None:
                        return found[0], found[1], None
        return None


def _is_static(function: ast.AST) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in getattr(function, "decorator_list", []))


def _dotted(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute) and (head := _dotted(expr.value)) is not None:
        return f"{head}.{expr.attr}"
    return None


def step_reads(target: str, modules: dict[str, Module] | None = None) -> dict[str, set[str]]:
    """The config keys the step function `module:function` can read on any branch, each with where (module:line)."""
    module, _, name = target.partition(":")
    reads = Reads(modules)
    found = _lookup(module, name, reads.modules)
    assert found is not None, target
    reads.function(found[0], found[1], {"cfg": ""})
    return reads.where


def allowed(declared: list[str], key: str) -> bool:
    """Whether a step whose rule declares `declared` may read `key` (what the view lets through)."""
    from gymforge.core.configview import _covers

    return key != WHOLE and _covers(declared_keys(tuple(declared)) | frozenset(READABLE_EVERYWHERE), key)


# ---- the checks -----------------------------------------------------------------------------------------------

CONFIG_STEPS = {verb: target for verb, (target, _help) in cli.STEPS.items()
                if "cfg" in [p.arg for p in _params(_lookup(*target.split(":"))[1])]}  # type: ignore[index, arg-type]

# Reads the walk finds on a branch that never runs for the step, with the reason (a path-insensitive walk cannot
# tell). Each must still be found, so that one the code no longer has is taken out.
NEVER_RUN: dict[tuple[str, str], str] = {
    **{(rule, "agent.interface"): "EpisodeRunner.for_config hands `cfg.agent.interface` over in a lambda that only "
       "an agent episode calls (EpisodeRunner.run); the step runs baselines and probes, no episode"
       for rule in ("micro_task", "check_benchmark_task")},
    **{("train_rl", f"llm.teacher.{key}"): "open_endpoint's `teacher` branch: train_rl serves its policy as a "
       "`checkpoint` ModelSpec (stages/rl.py), never the teacher" for key in ("provider", "model", "offline_endpoint")},
}


@pytest.mark.parametrize("verb", sorted(CONFIG_STEPS))
def test_every_key_a_steps_code_can_read_is_declared_by_its_rule(verb: str, rule_reads) -> None:
    rule = verb.replace("-", "_")
    declared = rule_reads[rule]["reads"]
    where = step_reads(CONFIG_STEPS[verb])
    for (never_rule, key), reason in NEVER_RUN.items():
        if never_rule == rule:
            assert key in where, f"{rule}: {key} is no longer read ({reason}): take it out of NEVER_RUN"
            where.pop(key)
    undeclared = {key: sorted(lines) for key, lines in sorted(where.items()) if not allowed(declared, key)}
    assert not undeclared, (
        f"step {verb} can read config keys that rule {rule} ({rule_reads[rule]['file']}) does not declare (it "
        f"declares {declared}): {undeclared}. Add them to the rule's CFG.digest(...) (or `covered=`), or stop "
        "reading them")


def test_the_walk_finds_reads_several_calls_deep_on_every_branch() -> None:
    """Reads of the real steps that only a walk through the code they call finds: the docker backend's image (a
    branch the offline runs never take), the workflow interface of the agent, the reference SFT's settings."""
    verification = step_reads("gymforge.stages.verification:verify_environment")
    assert {"sandbox.image", "sandbox.backend", "verification.max_iterations", "agent.interface",
            "post_training.reference_sft.steps"} <= verification.keys()
    assert any(line.startswith("gymforge.tasks.episode:") for line in verification["sandbox.image"])
    assert "trajectories.max_steps" in step_reads("gymforge.stages.rollouts:rollout_shard")
    assert "train.student" in step_reads("gymforge.stages.training:student_base")  # through TrainConfig.name


FAKE_STEP = {
    "__init__.py": "",
    "stage.py": """
from fakesteps import helpers
from fakesteps.helpers import Runner


def fake_step(cfg, out):
    runner = Runner(cfg, out)
    if helpers.on_gpu():
        return helpers.serve(cfg.evaluate)
    return runner.name
""",
    "helpers.py": """
def on_gpu():
    return False


def serve(evaluate):
    if evaluate.serving.backend == "vllm":
        return _vllm(evaluate.serving)
    return None


def _vllm(serving):
    return [*serving.vllm_args, str(serving.gpus)]


class Runner:
    def __init__(self, config, out):
        self.config, self.out = config, out

    @property
    def name(self):
        return self.config.train.name

    def cleanup(self, keep):
        return self.config.rl.reward.milestones if keep else None
""",
}


def test_the_check_fails_on_a_read_on_a_production_only_branch(tmp_path: Path) -> None:
    """A step whose GPU-only branch reads `evaluate.serving.vllm_args` two calls deep, and a class whose unused
    method reads `rl.reward`: a rule declaring `evaluate.serving.backend` and `student` misses both; so does the
    check, and it names them with where they are read."""
    package = tmp_path / "fakesteps"
    package.mkdir()
    for name, text in FAKE_STEP.items():
        (package / name).write_text(text)
    where = step_reads("fakesteps.stage:fake_step", {**index(), **index(package)})
    assert {"evaluate.serving.backend", "evaluate.serving.vllm_args", "evaluate.serving.gpus", "train.student",
            "rl.reward"} <= where.keys()
    assert where["evaluate.serving.vllm_args"] == {"fakesteps.helpers:13"}
    declared = ["evaluate.serving.backend", "student"]
    assert sorted(k for k in where if not allowed(declared, k)) == ["evaluate.serving.vllm_args", "rl.reward"]
    assert allowed(declared, "evaluate.serving.gpus")  # readable everywhere (a resource)


def test_what_a_rule_declaration_lets_a_step_read() -> None:
    assert not allowed(["seed"], "sandbox.backend") and allowed(["sandbox"], "sandbox.backend")
    assert allowed(["student"], "train.student") and not allowed(["student"], "train.epochs")
    assert allowed(["teacher"], "llm.teacher.model") and SECTION_KEYS["teacher"] == ("llm.teacher",)
    assert not allowed(["topics"], WHOLE) and allowed(["seed"], "results_dir")
