"""The project's import structure: no cycle, few imports inside functions, layers that point one way.

Read from the source with `ast` (nothing is imported), so a cycle that only an import inside a function closes is
found too. docs/architecture.md describes the layers these tests hold the code to.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "pipeline", "assets", "reports", "stepcast")
#: at most this many imports of project modules inside functions; each is there for start-up time
MAX_INNER_IMPORTS = 20
#: the sub-packages of models/, each allowed to import only the ones named for it (docs/architecture.md)
MODELS_LAYERS = {
    "core": set(),
    "arch": {"core"},
    "memory": {"core", "arch"},
    "physics": {"core", "arch", "memory"},
    "corpus": {"core", "arch", "memory", "physics"},
    "fitting": {"core", "arch", "memory", "physics"},
    "planning": {"core", "arch", "memory", "physics", "fitting"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The project modules an import statement loads (a package's __init__ counts as the package)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            here = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
            here = here[: len(here) - (node.level - 1)]
            base = ".".join(here + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    out = []
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name.split(".")[0] in PACKAGES:
            out.append(name)
    return out


def _imports() -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    """(module -> project modules it imports anywhere, [(module, line, source line) of imports inside functions])."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    inner: list[tuple[str, int, str]] = []
    for module, path in MODULES.items():
        text = path.read_text()
        lines = text.splitlines()

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    visit(child, True)
                elif isinstance(child, (ast.Import, ast.ImportFrom)):
                    found = [t for t in _targets(module, child) if t != module]
                    graph[module].update(found)
                    if found and in_function:
                        inner.append((module, child.lineno, lines[child.lineno - 2] + "\n" + lines[child.lineno - 1]))
                else:
                    visit(child, in_function)

        visit(ast.parse(text), False)
    return graph, inner


GRAPH, INNER = _imports()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_the_checks_see_a_cycle_and_an_inner_import():
    """The cycle finder and the import reader find what they are meant to (so the tests below can fail)."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert ("pipeline.cli", "pipeline.settings") in {(m, t) for m in GRAPH for t in GRAPH[m]}


def test_no_import_cycle_anywhere():
    assert _cycles(GRAPH) == []


def test_few_imports_inside_functions_each_for_start_up_time():
    uncommented = [f"{m}:{line}" for m, line, src in INNER if "start-up time" not in src]
    assert not uncommented, f"imports inside functions without a '# start-up time: ...' comment: {uncommented}"
    assert len(INNER) <= MAX_INNER_IMPORTS, [f"{m}:{line}" for m, line, _ in INNER]


def test_models_imports_no_outer_layer():
    """models/ is pure: it never imports the pipeline, the assets, the reports or the Python API."""
    bad = {m: sorted(t for t in ts if not t.startswith("models")) for m, ts in GRAPH.items() if m.startswith("models")}
    assert not {m: ts for m, ts in bad.items() if ts}


def test_reports_never_touch_the_database():
    bad = [m for m, path in MODULES.items() if m.startswith("reports") and "duckdb" in path.read_text()]
    assert not bad


@pytest.mark.parametrize("package", sorted(MODELS_LAYERS))
def test_models_sub_packages_import_only_lower_layers(package):
    prefix = f"models.{package}"
    used = {t.split(".")[1] for m, ts in GRAPH.items() if m == prefix or m.startswith(prefix + ".")
            for t in ts if t.startswith("models.") and t.count(".") >= 1}
    assert used - {package} <= MODELS_LAYERS[package], sorted(used - {package} - MODELS_LAYERS[package])


def test_every_models_module_is_in_a_layer():
    """A module added straight under models/ (outside the sub-packages) has no place in the layers above."""
    loose = [m for m in MODULES if m.startswith("models.") and m.split(".")[1] not in MODELS_LAYERS]
    assert not loose
