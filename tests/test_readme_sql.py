"""Every SQL example in the README runs against a built snapshot and returns rows."""

from __future__ import annotations

import re

import duckdb
import pytest

from tests.conftest import ROOT

EXAMPLE = re.compile(r'duckdb -readonly out/snapshot/stepcast\.duckdb -c "(.*?)"(?=\n)', re.S)


def readme_queries() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [q.replace('\\"', '"').strip() for q in EXAMPLE.findall(text)]


def test_readme_has_sql_examples():
    assert len(readme_queries()) >= 3


@pytest.mark.parametrize("query", readme_queries())
def test_readme_sql_runs_on_snapshot(built_store, query):
    snapshot = built_store.parent / "snapshot" / built_store.name
    con = duckdb.connect(str(snapshot), read_only=True)
    try:
        rows = con.execute(query).fetchall()
    finally:
        con.close()
    assert rows, query
