"""The command line: ingest errors name file, line and column; info reports paths and counts."""

from __future__ import annotations

import json

import duckdb
from typer.testing import CliRunner

from pipeline import store
from pipeline.cli import app
from tests.test_ingest import BASE, all_tables, write_rows

runner = CliRunner()


def test_ingest_bad_file_exits_nonzero_and_names_line_and_column(store_copy, tmp_path):
    bad = write_rows(tmp_path / "bad.csv", [dict(BASE, metric="mfu", unit="fraction", value="45")])
    before = all_tables(store_copy)
    result = runner.invoke(app, ["--store", str(store_copy), "ingest", "--no-publish", str(bad)])
    assert result.exit_code == 1
    out = result.output
    assert "bad.csv:2: column value = '45'" in out and "looks like a percent" in out
    after = all_tables(store_copy)
    for table in ("runs", "run_metrics", "hardware", "architectures", "cloud_prices"):
        assert after[table] == before[table]


def test_ingest_unreadable_file_names_missing_columns(store_copy, tmp_path):
    bad = tmp_path / "cols.csv"
    bad.write_text("run_id,value\nx,1\n")
    before = all_tables(store_copy)
    result = runner.invoke(app, ["--store", str(store_copy), "ingest", "--no-publish", str(bad)])
    assert result.exit_code == 1
    assert "cols.csv" in result.output and "missing required column(s)" in result.output and "gpu" in result.output
    assert all_tables(store_copy) == before


def test_ingest_good_file_publishes_snapshot(store_copy, tmp_path):
    good = write_rows(tmp_path / "good.csv", [BASE])
    result = runner.invoke(app, ["--store", str(store_copy), "ingest", str(good)])
    assert result.exit_code == 0, result.output
    snap = store_copy.parent / "snapshot" / store_copy.name
    con = duckdb.connect(str(snap), read_only=True)
    try:
        assert con.execute("select count(*) from runs where run_id = 't-run-1'").fetchall()[0][0] == 1
    finally:
        con.close()
    again = runner.invoke(app, ["--store", str(store_copy), "ingest", str(good)])
    assert again.exit_code == 0 and "unchanged" in again.output


def test_ingest_into_fresh_store_loads_reference_tables(tmp_path):
    good = write_rows(tmp_path / "good.csv", [BASE])
    s = tmp_path / "fresh" / "s.duckdb"
    result = runner.invoke(app, ["--store", str(s), "ingest", "--no-publish", str(good)])
    assert result.exit_code == 0, result.output
    con = store.connect(s, read_only=True)
    try:
        assert store.row_counts(con)["hardware"] == 54  # measurements/hardware_specs.csv
        assert con.execute("select arch_id from runs").fetchall() == [("llama3-8b",)]
    finally:
        con.close()


def test_info_json(built_store):
    result = runner.invoke(app, ["--store", str(built_store), "info", "--format", "json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["store"] == str(built_store)
    assert info["tables"]["runs"] == 2311 and info["tables"]["run_metrics"] == 2961
    assert info["snapshot"].endswith("snapshot/stepcast.duckdb")


def test_help_teaches():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for cmd in ("build", "ingest", "info"):
        assert cmd in result.output
    result = runner.invoke(app, ["ingest", "--help"])
    assert "rejected_rows" in result.output
