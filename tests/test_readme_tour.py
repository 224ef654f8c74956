"""The README is for users: its 5-minute tour runs, and it and docs/ stay inside the repository.

The tour's commands (the `$` lines of the section "A 5-minute tour") run on the session's built store and must
exit with status 0; their printed output in the README is illustrative and not compared (figures change with the
data and the fit)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

BIN = Path(sys.executable).parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300
LINK = re.compile(r"\]\(([^)\s]+)\)")


def section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    nxt = text.find("\n## ", start + 1)
    return text[start:nxt if nxt > 0 else None]


def tour_commands() -> list[str]:
    """Each `$ ` line of the tour, joined with the lines that close a quote it opened."""
    commands, current = [], None
    for line in section(README.read_text(encoding="utf-8"), "A 5-minute tour").splitlines():
        if current is not None:
            current += "\n" + line
        elif line.startswith("$ "):
            current = line[2:]
        if current is not None and current.replace('\\"', "").count('"') % 2 == 0:
            commands.append(current)
            current = None
    return commands


def test_the_tour_has_the_main_commands():
    words = [c.removeprefix("uv run ").split() for c in tour_commands()]
    verbs = {w[1] if w[0] == "stepcast" else w[0] for w in words}
    assert {"info", "predict", "search", "plan", "curve", "duckdb"} <= verbs


@pytest.mark.parametrize("command", tour_commands(), ids=lambda c: " ".join(c.split()[:4]))
def test_tour_command_exits_0(built_store, command):
    snapshot = built_store.parent / "snapshot" / built_store.name
    shell = command.removeprefix("uv run ").replace("out/snapshot/stepcast.duckdb", str(snapshot))
    env = dict(os.environ, STEPCAST_STORE=str(built_store), PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
               COLUMNS="160")
    done = subprocess.run(["bash", "-c", shell], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stderr[-2000:]}"
    assert done.stdout.strip(), f"{command} printed nothing"


def test_readme_is_short_and_for_users():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    # the two set-up commands, exactly (.ci/run runs the second)
    assert "python -m pip install uv && uv run --locked --compile-bytecode stepcast build" in text
    assert "python -m pip install uv && uv run --locked pytest" in text
    assert "python -m pip install uv && uv run --locked pytest" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs_link_only_inside_the_repository_and_cite_no_issues_or_commits(doc):
    text = doc.read_text(encoding="utf-8")
    for target in LINK.findall(text):
        assert not re.match(r"[a-z]+:", target), f"{doc.name}: link leaves the repository: {target}"
        path = (doc.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT), f"{doc.name}: link outside the repository: {target}"
        assert path.exists(), f"{doc.name}: broken link {target}"
    assert not re.search(r"\bissues? #?\d", text, re.I), f"{doc.name} cites an issue number"
    hexes = [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", h) and re.search(r"\d", h)]
    assert not hexes, f"{doc.name} cites commit-like ids {hexes[:3]}"
