"""The package layering (docs/layout.md, Layers) beyond what `lint-imports` checks (pyproject.toml,
[tool.importlinter]): no import cycle between gymforge's modules, few function-level (deferred) imports of
gymforge's own modules and a measured reason for each, the sandbox-side scripts import nothing of gymforge, and the
workflow's parse loads none of the heavy libraries."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "gymforge"
MAX_DEFERRED = 20  # fewer than this many function-level imports of gymforge modules
MARK = "# deferred:"


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "benchmark/tasks" not in p.relative_to(SRC).as_posix())


def _is_gymforge(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or node.module == "gymforge" or (node.module or "").startswith("gymforge.")
    return any(a.name == "gymforge" or a.name.startswith("gymforge.") for a in node.names)


def deferred_imports() -> list[tuple[str, int, bool]]:
    """(file, line, has a `# deferred:` reason) of every import of a gymforge module inside a function."""
    found = []
    for path in _sources():
        text = path.read_text()
        lines = text.splitlines()
        seen: set[int] = set()
        for function in ast.walk(ast.parse(text)):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and _is_gymforge(node) and node.lineno not in seen:
                    seen.add(node.lineno)
                    around = lines[node.lineno - 2: node.end_lineno]  # the line above through the last line
                    found.append((str(path.relative_to(SRC)), node.lineno, any(MARK in line for line in around)))
    return sorted(found)


def test_few_deferred_imports_each_with_a_reason() -> None:
    found = deferred_imports()
    listing = "\n".join(f"  {f}:{line}" + ("" if ok else "  (no `# deferred: <reason>`)") for f, line, ok in found)
    assert len(found) < MAX_DEFERRED, f"{len(found)} function-level imports of gymforge modules (move them to the " \
                                      f"top of their module where the layering allows):\n{listing}"
    missing = [f"{f}:{line}" for f, line, ok in found if not ok]
    assert not missing, ("function-level imports of gymforge modules need a `# deferred: <reason>` comment on their "
                         f"line or the line above (or move them to the top): {', '.join(missing)}")


def test_no_import_cycles_between_modules() -> None:
    """Strongly connected components of the module import graph, function-level imports included, and imports
    under `if TYPE_CHECKING:` too: a type-only cycle still means two modules each need the other to be read."""
    graph = grimp.build_graph("gymforge", cache_dir=None, exclude_type_checking_imports=False)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm, iterative over each node's successors
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        work = [(v, iter(sorted(edges[v])))]
        while work:
            node, successors = work[-1]
            for w in successors:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            connect(module)
    assert not cycles, "import cycles between modules (move what both need down a layer):\n" + "\n".join(
        "  " + " <-> ".join(c) for c in cycles)


def test_evalkit_imports_nothing_of_gymforge() -> None:
    """evalkit/ runs inside evaluation sandboxes, where gymforge is not installed (standard library only); so do the
    workflow skills (skills/, in the agent's sandbox) and the probes' programs (tasks/probekit/, in a submission's
    sandbox; its __init__ is the host's reader)."""
    programs = [p for p in (SRC / "tasks" / "probekit").glob("*.py") if p.name != "__init__.py"]
    for path in sorted([*(SRC / "evalkit").glob("*.py"), *(SRC / "skills").glob("*.py"), *programs]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                assert not _is_gymforge(node), f"{path.name}:{node.lineno} imports gymforge"


def test_the_workflows_parse_loads_no_heavy_library() -> None:
    """Every `snakemake` start parses the Snakefile (two per SLURM job: the job step and the job inside it), and a
    gymforge command loads the same modules: the OpenAI client alone is ~0.3 s and ~670 modules (an agent loop reached
    through tasks.harbor loaded it until 8d6efd8), which a shared file system such as Lustre serves slowly."""
    rules = [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]
    modules = sorted({m for path in rules for m in re.findall(r"^\s*(?:from|import) (gymforge[\w.]*)", path.read_text(),
                                                             re.MULTILINE)})
    assert "gymforge.benchmark.suite" in modules and "gymforge.core.config" in modules, modules
    heavy = ("openai", "torch", "transformers", "datasets", "pandas", "sklearn", "trl")
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint(sorted(h for h in {heavy!r} if h in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert loaded.stdout.strip() == "[]", loaded.stdout
