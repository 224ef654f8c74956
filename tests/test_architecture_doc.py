"""docs/architecture.md names only what exists: every file, every dotted name, every constant or class it puts in
backticks, and every entry point it gives a models/ sub-package. A rename that leaves the map or a checklist
behind fails here."""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
TEXT = DOC.read_text()
TICKED = re.findall(r"`([^`\n]+)`", TEXT)

PATH_RE = re.compile(r"^[\w.-]+(/[\w.-]+)+/?$|^[\w-]+\.(py|csv|md|yaml|toml|html)$")
DOTTED_RE = re.compile(r"^(models|pipeline|assets|reports|stepcast)(\.\w+)+$")
CONSTANT_RE = re.compile(r"^([A-Z][A-Z0-9]*_[A-Z0-9_]+|[A-Z][a-z]+[A-Z]\w*|[A-Z]{3,})$")  # NAME_X, CamelCase, DEFAULT
#: backticked words of the doc that are no Python name (environment variables, table and column names, ...)
NOT_NAMES = {"STEPCAST_WORKERS", "DAGSTER_HOME", "STEPCAST_"}


@cache
def defined_names() -> frozenset[str]:
    """Every module-level name (assignment, function, class) and class attribute of the project's code."""
    names: set[str] = set()
    for pkg in ("models", "pipeline", "assets", "reports", "stepcast"):
        for f in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Assign):
                    names.update(t.id for t in node.targets if isinstance(t, ast.Name))
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
    return frozenset(names)


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_doc_names_files_and_names():
    """The patterns below find what the doc names (so the tests after them check something)."""
    assert sum(bool(PATH_RE.match(t)) for t in TICKED) > 40
    assert sum(bool(DOTTED_RE.match(t)) for t in TICKED) > 5
    assert sum(bool(CONSTANT_RE.match(t)) for t in TICKED) > 15


def _paths() -> list[tuple[str, tuple[Path, ...]]]:
    """(file named, folders it may be in): a bare file name is looked for in the folders its table row or paragraph names (the
    package table lists `params.py` beside `models/core`), in the project root and in docs/."""
    out = []
    units = [line for block in TEXT.split("\n\n")
             for line in (block.splitlines() if block.lstrip().startswith("|") else [block])]
    for line in units:
        ticked = [t for t in re.findall(r"`([^`\n]+)`", line) if PATH_RE.match(t)]
        dirs = [ROOT / t for t in ticked if "/" in t and (ROOT / t).is_dir()]
        dirs += [(ROOT / t).parent for t in ticked if "/" in t and not (ROOT / t).is_dir()]
        out += [(t, tuple(dirs) if "/" not in t else ()) for t in ticked]
    return out


@pytest.mark.parametrize("path,folders", _paths())
def test_every_file_it_names_exists(path, folders):
    assert any((d / path).exists() for d in (ROOT, ROOT / "docs", *folders)), path


@pytest.mark.parametrize("dotted", sorted({t for t in TICKED if DOTTED_RE.match(t)}))
def test_every_dotted_name_it_gives_resolves(dotted):
    _resolve(dotted)


@pytest.mark.parametrize("name", sorted({t for t in TICKED if CONSTANT_RE.match(t)} - NOT_NAMES))
def test_every_constant_and_class_it_names_is_defined(name):
    assert name in defined_names(), f"docs/architecture.md names `{name}`, which the code does not define"


def _package_rows() -> list[tuple[str, list[str]]]:
    """(package, entry points) of the table "models/, package by package"."""
    rows = []
    for line in TEXT.splitlines():
        m = re.match(r"^\| `models/(\w+)` \|[^|]*\| ([^|]*) \|", line)
        if m:
            rows.append((m.group(1), re.findall(r"`(\w+)`", m.group(2))))
    return rows


def test_the_package_table_lists_every_models_sub_package():
    listed = {pkg for pkg, _ in _package_rows()}
    actual = {p.name for p in (ROOT / "models").iterdir() if (p / "__init__.py").exists()}
    assert listed == actual


@pytest.mark.parametrize("package,entry_points", _package_rows())
def test_every_entry_point_is_the_package_s(package, entry_points):
    module = importlib.import_module(f"models.{package}")
    missing = [e for e in entry_points if not hasattr(module, e)]
    assert entry_points and not missing, f"models.{package} does not export {missing}"
    assert set(entry_points) <= set(getattr(module, "__all__", entry_points))
