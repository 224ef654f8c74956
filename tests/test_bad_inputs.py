"""The bad-input corpus (tests/data/bad/, manifest EXPECTED.csv, written by make_corpus.py): every file gets
its expected outcome, a rejection names file, line and column, and nothing already stored is lost or changed."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pytest

from pipeline import readers, store
from pipeline.readers import FileRejected

BAD = Path(__file__).resolve().parent / "data" / "bad"
with open(BAD / "EXPECTED.csv", newline="", encoding="utf-8") as _fh:
    CASES = list(csv.DictReader(_fh))


@pytest.fixture(scope="module")
def shared_store(built_store, tmp_path_factory) -> Path:
    """One private copy of the built store for the whole corpus (run ids are unique per corpus file)."""
    target = tmp_path_factory.mktemp("bad") / "store.duckdb"
    shutil.copyfile(built_store, target)
    return target


def test_corpus_has_at_least_30_cases_and_every_file_is_listed():
    files = {p.name for p in BAD.iterdir() if p.is_file() and p.name not in ("EXPECTED.csv", "make_corpus.py")}
    assert {c["file"] for c in CASES} == files
    assert len(CASES) >= 30
    outcomes = {c["outcome"] for c in CASES}
    assert outcomes == {"accepted", "rejected_file", "rejected_rows"}


def fingerprints(path: Path, exclude_file: str = "") -> dict[str, tuple]:
    """(rows, sum of row hashes) per main table; rows that came from `exclude_file` are left out."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        out = {}
        for table, col in (("hardware", ""), ("architectures", ""), ("cloud_prices", ""), ("ingest_log", "file"),
                           ("rejected_rows", "file"), ("run_metrics", "source_file"), ("runs", "source_file")):
            where = f"where {col} is distinct from ?" if col else ""
            out[table] = con.execute(f'select count(*), coalesce(sum(hash(t)), 0) from "{table}" t {where}',
                                     [exclude_file] if col else []).fetchone()
        return out
    finally:
        con.close()


def _changing(monkeypatch):
    real = readers._read_bytes
    calls = {"n": 0}

    def read(p: Path) -> bytes:
        calls["n"] += 1
        return real(p) + (b"\n" if calls["n"] == 2 else b"")  # the hash after parsing sees other bytes

    monkeypatch.setattr(readers, "_read_bytes", read)


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_bad_input_case(shared_store, case, monkeypatch):
    path = BAD / case["file"]
    if case["file"].startswith("changing"):
        _changing(monkeypatch)
    key = store.file_key(path)
    before = fingerprints(shared_store)
    con = store.connect(shared_store)
    try:
        if case["outcome"] == "rejected_file":
            with pytest.raises(FileRejected) as info:
                store.ingest_file(con, path)
            err = info.value
            assert case["file"] in str(err)
            assert case["reason"] in err.reason, str(err)
            if case["line"]:
                assert err.line == int(case["line"]) and f"line {case['line']}" in str(err)
            if case["column"]:
                assert err.column == case["column"] and f"column {case['column']}" in str(err)
            rep = None
        else:
            rep = store.ingest_file(con, path)
    finally:
        con.close()
    if rep is None:
        assert fingerprints(shared_store) == before  # a refused file changes nothing at all
        return
    # nothing already in the store is lost or changed: every row that did not come from this file is as before
    assert fingerprints(shared_store, exclude_file=key) == before
    stem_rows = duckdb.connect(str(shared_store), read_only=True)
    try:
        stored = stem_rows.execute("select count(*) from run_metrics where source_file = ?", [rep.file]).fetchone()[0]
        rejected_stored = stem_rows.execute("select line, \"column\", reason from rejected_rows where file = ?",
                                            [rep.file]).fetchall()
    finally:
        stem_rows.close()
    if case["outcome"] == "accepted":
        assert rep.status == "accepted" and rep.rows_rejected == 0, rep.rejections
        assert rep.rows_accepted >= 1 and stored == rep.rows_accepted
        if case["reason"]:
            assert any(case["reason"] in w for w in rep.warnings), rep.warnings
        return
    assert rep.status in ("partial", "rejected")
    hit = rep.rejections.filter((pl.col("line") == int(case["line"])) & (pl.col("column") == case["column"]))
    assert hit.height >= 1, rep.rejections
    assert any(case["reason"] in r for r in hit["reason"]), hit["reason"].to_list()
    assert (int(case["line"]), case["column"], hit["reason"][0]) in rejected_stored
    assert stored == rep.rows_accepted >= 1  # the good row of the file is kept


def test_cli_rejection_names_file_line_and_column(store_copy):
    from typer.testing import CliRunner

    from pipeline.cli import app

    result = CliRunner().invoke(app, ["--store", str(store_copy), "ingest", "--no-publish",
                                      str(BAD / "mfu_percent.csv"), str(BAD / "nul_byte.csv")])
    assert result.exit_code == 1
    assert f"{store.file_key(BAD / 'mfu_percent.csv')}:3: column value = '45': mfu looks like a percent" in result.output
    assert "nul_byte.csv, line 2, column model_name: NUL byte" in result.output


@pytest.mark.parametrize("name", ["bom_crlf.csv", "quoted_comma.csv", "escaped_quotes.csv", "padded_cells.csv",
                                  "semicolon.csv", "extra_columns.csv"])
def test_fast_csv_path_reads_exactly_what_the_csv_module_reads(name):
    data = (BAD / name).read_bytes()
    text = readers._decode(name, data)
    fast, _, short = readers.read_csv_text(name, text, data)
    slow, _, short_slow = readers.read_csv_text(name, text)  # no bytes: always the csv module
    assert readers._fast_csv(name, data, ";" if name == "semicolon.csv" else ",") is not None  # really fast
    assert short == short_slow == []
    assert fast.columns == slow.columns
    assert fast.fill_null("").equals(slow.fill_null(""))


@pytest.mark.parametrize("name", ["quoted_newline_ok.csv", "blank_lines.csv", "truncated_row.csv", "extra_field.csv"])
def test_files_the_fast_path_cannot_number_go_the_careful_way(name):
    data = (BAD / name).read_bytes()
    assert readers._fast_csv(name, data, ",") is None


def test_batch_ingest_keeps_order_and_one_owner_per_run_id(store_copy, tmp_path):
    from tests.test_ingest import BASE, write_rows

    a = write_rows(tmp_path / "a.csv", [dict(BASE, run_id="batch-x"), dict(BASE, run_id="batch-a")])
    b = write_rows(tmp_path / "b.csv", [dict(BASE, run_id="batch-x", value="7000")])
    con = store.connect(store_copy)
    try:
        reports = store.ingest_files(con, [a, BAD / "empty.csv", b, a], max_batch_rows=1)
        owner = con.execute("select source_file, value from run_metrics where run_id = 'batch-x'").fetchall()
        runs = con.execute("select count(*) from runs where run_id like 'batch-%'").fetchone()[0]
    finally:
        con.close()
    assert [Path(r.file).name for r in reports] == ["a.csv", "a.csv", "empty.csv", "b.csv"]
    assert [r.status for r in reports] == ["accepted", "unchanged", "unreadable", "rejected"]
    assert "already ingested from" in reports[3].rejections["reason"][0]
    assert owner == [(store.file_key(a), 6000.0)] and runs == 2
