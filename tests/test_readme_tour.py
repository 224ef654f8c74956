"""The README is for users: its 5-minute tour runs, and it and docs/ stay inside the repository.

The tour's commands (the `$` lines of the section "A 5-minute tour") run on the session's built store and must
exit with status 0, and what the README shows under them, like the example output of docs/python-api.md, is what
they print now: the same words, figures within 2%; so are the held-out figures of the README and of
docs/calibration.md the served fit's (`uv run python -m pipeline.docs_regen` rewrites all of them from a built
store)."""

from __future__ import annotations

import re

import pytest

from pipeline import docs_regen
from tests.conftest import ROOT

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
    done = docs_regen.run_tour_command(command, built_store)
    assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stderr[-2000:]}"
    assert done.stdout.strip(), f"{command} printed nothing"


def test_the_tour_shows_what_its_commands_print_now(built_store):
    problems = docs_regen.readme_differences(built_store)
    assert not problems, "\n".join(problems) + "\n(re-run: uv run python -m pipeline.docs_regen)"


def test_the_calibration_doc_shows_the_served_fits_held_out_figures(built_store):
    problems = docs_regen.calibration_differences(built_store)
    assert not problems, "\n".join(problems) + "\n(re-run: uv run python -m pipeline.docs_regen)"


def test_the_python_api_doc_shows_what_its_examples_print_now(built_store):
    problems = docs_regen.python_api_differences(built_store)
    assert not problems, "\n".join(problems) + "\n(re-run: uv run python -m pipeline.docs_regen)"


@pytest.mark.parametrize("shown, now, same", [
    ("│ step_time_s │ 17.72 │", "│ step_time_s │ 18.02 │", True),   # 1.7%
    ("│ step_time_s │ 17.72 │", "│ step_time_s │ 18.90 │", False),  # 6.7%
    ("│ mfu │ 0.45 │", "│ mfu │ 0.454 │", True),                   # within the rounding of the figure shown
    ("│ 1 │ tpu-v6e │ 2048 │", "│ 1 │ h100-sxm5-80gb │ 2048 │", False),
    ("│ dp │ 32 │", "│ dp │ 33 │", False),                           # an integer layout changed
    ("best 5 of 255,816 layouts (1.16 s)", "best 5 of 255,816 layouts (7.75 s)", True),  # elapsed time
    ("1.16e+07", "1.25e+07", False),
    ("│ feasible │ yes │", "│ feasible │ no │", False),
])
def test_compare_reads_words_exactly_and_figures_within_2_percent(shown, now, same):
    assert (docs_regen.compare(shown, now) == []) is same


def test_a_sentences_percentages_are_refilled_in_order_to_the_decimals_shown():
    assert docs_regen._refill("MdAPE 9.4% at k = 0, 8.6% at k = 1; 90% coverage 56%", [0.081, 0.0795, 0.9, 0.5]) == \
        "MdAPE 8.1% at k = 0, 8.0% at k = 1; 90% coverage 50%"


def test_a_shown_block_is_the_template_of_its_fresh_output():
    fresh = """  title of the table — fit 0123abcd, domain: inside
┏━━━━━━┳━━━━┳━━━━━━━━━━━━━┳━━━━━━━┓
┃ rank ┃ tp ┃ step_time_s ┃ mfu   ┃
┡━━━━━━╇━━━━╇━━━━━━━━━━━━━╇━━━━━━━┩
│ 1    │ 8  │ 12.5        │ 0.611 │
│ 2    │ 4  │ 12.9        │ 0.590 │
│ 3    │ 2  │ 13.1        │ 0.580 │
└──────┴────┴─────────────┴───────┘
inflection: marginal efficiency stays above 0.5 up to N = 512; dominated by contention"""
    shown = ["title of the …", "│ rank │ … │ mfu │", "│ 2 │ … │ 0.6 │", "…", "inflection: marginal efficiency …"]
    assert docs_regen.regenerate_output(shown, fresh) == [
        "title of the …", "│ rank │ … │ mfu   │", "│ 2    │ … │ 0.590 │", "…", "inflection: marginal efficiency …"]


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
