"""The batch ingest path: simple CSV files parsed together, one transaction per call, the space-only
normalisation shortcut. Each gives what the file-by-file careful path gives."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pipeline import readers, store
from pipeline.measurements import validate
from pipeline.readers import FileRejected
from tests.test_ingest import BASE, all_tables, write_rows


def _files(tmp_path: Path, n: int = 4) -> list[Path]:
    """n files in the schema's column order with quoted commas, quoted quotes, padded and empty cells."""
    out = []
    for i in range(n):
        rows = [dict(BASE, run_id=f"bi-{i}-{j}", notes=f"row {j}, file {i}" if j % 2 else 'a "quoted" note',
                     gpu_as_reported=" H100 " if j == 1 else "", value=str(6000 + j)) for j in range(3)]
        out.append(write_rows(tmp_path / f"bi_{i}.csv", rows))
    return out


def test_joint_parse_equals_the_csv_module_file_by_file(tmp_path):
    paths = _files(tmp_path)
    crlf = tmp_path / "bi_crlf.csv"
    crlf.write_bytes(paths[0].read_bytes().replace(b"bi-0-", b"bi-9-").replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    paths.append(crlf)
    simple = [readers.simple_csv(str(p), p.read_bytes(), ",") for p in paths]
    assert all(s is not None for s in simple)
    joint = readers.parse_simple(simple)
    careful = pl.concat([readers.read_csv_text(str(p), p.read_text(encoding="utf-8"))[0].drop("_line")
                         for p in paths])  # no bytes given: always the csv module
    assert joint.height == sum(s.n_rows for s in simple) == 15
    assert joint.fill_null("").equals(careful.fill_null(""))
    assert 'a "quoted" note' in joint["notes"].to_list() and "row 1, file 0" in joint["notes"].to_list()


@pytest.mark.parametrize("body,simple", [
    (b'a,b\n"x,1",2\n', True),  # a quoted delimiter: counted as inside quotes
    (b'a,b\n"",2\n,""\n', True),  # every quote in a `""` pair: nothing is inside quotes
    (b'a,b\n"x\ny",2\n', False),  # a quoted field spans lines
    (b'a,b\n"x,2\n', False),  # an unclosed quote
    (b'a,b\n1\n', False),  # a short row
    (b'a,b\n1,2\n\n', False),  # a blank line
    (b'a,b\n1,2\r3,4\n', False),  # a lone CR
])
def test_simple_csv_takes_only_files_it_can_number(body, simple):
    assert (readers.simple_csv("t.csv", body, ",") is not None) is simple


def test_plain_flag_and_space_only_normalisation_agree_with_the_full_one():
    frame = pl.DataFrame({"run_id": ["r1", " r2", "r3 "], "source": ["s", "s", "s"], "source_ref": ["x"] * 3,
                          "model_name": ["Llama 3 8B"] * 3, "gpu": ["h100-sxm5-80gb ", "h100-sxm5-80gb", "  "],
                          "metric": ["step_time_s"] * 3, "value": [" 2.5", "3", "4 "], "unit": ["s"] * 3,
                          "n_layers": ["32", " ", "32"], "_line": [2, 3, 4], "_file": ["f"] * 3})
    fast = validate(frame, None, {"h100-sxm5-80gb"}, blanks_are_spaces=True)
    full = validate(frame, None, {"h100-sxm5-80gb"})
    assert fast.accepted.equals(full.accepted) and fast.rejected.equals(full.rejected)
    assert fast.accepted["run_id"].to_list() == ["r1", "r2"]  # r3 has no gpu: rejected
    assert readers.simple_csv("t.csv", b"a,b\n1,2\n", ",").plain
    assert not readers.simple_csv("t.csv", b"a,b\n1,\t2\n", ",").plain
    assert not readers.simple_csv("t.csv", "a,b\n1,\u00a02\n".encode(), ",").plain


def test_a_failure_in_a_later_batch_rolls_back_the_whole_call(store_copy, tmp_path):
    paths = _files(tmp_path, 3)
    before = all_tables(store_copy)
    calls = {"n": 0}

    def boom():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected failure in the second batch")

    con = store.connect(store_copy)
    try:
        with pytest.raises(RuntimeError, match="second batch"):
            store.ingest_files(con, paths, max_batch_rows=1, _fail_after_insert=boom)
    finally:
        con.close()
    assert calls["n"] == 2  # the first batch was written (in the transaction) before the failure
    assert all_tables(store_copy) == before


def _ingest(store_path: Path, paths: list[Path]) -> tuple[list[store.FileReport], dict]:
    con = store.connect(store_path)
    try:
        reports = store.ingest_files(con, paths)
    finally:
        con.close()
    return reports, all_tables(store_path)


def test_a_refused_joint_parse_goes_file_by_file_with_the_same_result(store_copy, tmp_path, monkeypatch):
    paths = _files(tmp_path)
    other = tmp_path / "other.duckdb"
    other.write_bytes(store_copy.read_bytes())
    joint_reports, joint = _ingest(store_copy, paths)
    monkeypatch.setattr(store, "parse_simple", lambda files: None)  # the joint parse refuses every group
    careful_reports, careful = _ingest(other, paths)
    assert [r.status for r in joint_reports] == [r.status for r in careful_reports] == ["accepted"] * 4
    for table in ("run_metrics", "runs", "rejected_rows"):  # (ingest_log differs in its timestamps)
        assert careful[table] == joint[table], table


def test_a_file_the_careful_parse_refuses_is_reported_and_not_written(store_copy, tmp_path, monkeypatch):
    paths = _files(tmp_path, 3)
    real = store.read_csv_text

    def refuse_second(path, text, data=None, *rest):
        if path.endswith("bi_1.csv"):
            raise FileRejected(path, "refused by the test", line=3, column="notes")
        return real(path, text, data, *rest)

    monkeypatch.setattr(store, "parse_simple", lambda files: None)
    monkeypatch.setattr(store, "read_csv_text", refuse_second)
    reports, tables = _ingest(store_copy, paths)
    assert [r.status for r in reports] == ["accepted", "unreadable", "accepted"]
    assert reports[1].error.line == 3 and "refused by the test" in reports[1].message
    logged = {row.split("'")[1] for row in tables["ingest_log"]}
    assert store.file_key(paths[0]) in logged and store.file_key(paths[1]) not in logged
    assert not any("bi-1-" in row for row in tables["run_metrics"])


def test_rejections_in_a_jointly_parsed_batch_name_their_own_file_and_line(store_copy, tmp_path):
    paths = _files(tmp_path, 3)
    rows = [dict(BASE, run_id=f"bi-bad-{j}", value="-1" if j == 1 else "6000") for j in range(3)]
    paths.insert(1, write_rows(tmp_path / "bi_bad.csv", rows))  # second of four files, one header: one parse
    reports, _ = _ingest(store_copy, paths)
    assert [r.status for r in reports] == ["accepted", "partial", "accepted", "accepted"]
    bad = reports[1].rejections
    assert bad.select("file", "line", "column").rows() == [(store.file_key(paths[1]), 3, "value")]


def test_a_batch_of_files_with_different_headers_and_endings(store_copy, tmp_path):
    """Files with other column orders or sets form their own parse groups; a file without a final line feed
    and one with a BOM join their neighbours' group; every value lands in its own column."""
    rows = [dict(BASE, run_id=f"bh-{i}", value=str(6000 + i)) for i in range(6)]
    cols = list(BASE)
    a = write_rows(tmp_path / "bh_a.csv", rows[:2], cols)
    b = write_rows(tmp_path / "bh_b.csv", rows[2:3], cols[::-1])  # reversed column order: a group of its own
    c = write_rows(tmp_path / "bh_c.csv", rows[3:4], cols)
    c.write_bytes(c.read_bytes().rstrip(b"\r\n"))  # no final line feed
    d = write_rows(tmp_path / "bh_d.csv", rows[4:6], cols)
    d.write_bytes(b"\xef\xbb\xbf" + d.read_bytes())  # a BOM
    reports, tables = _ingest(store_copy, [a, b, c, d])
    assert [r.status for r in reports] == ["accepted"] * 4 and [r.rows_accepted for r in reports] == [2, 1, 1, 2]
    con = store.connect(store_copy, read_only=True)
    try:
        got = con.execute("select run_id, value, gpu, n_gpus, source_line from run_metrics "
                          "where run_id like 'bh-%' order by run_id").fetchall()
    finally:
        con.close()
    assert got == [(f"bh-{i}", 6000.0 + i, "h100-sxm5-80gb", 64, line)
                   for i, line in enumerate([2, 3, 2, 2, 2, 3])]
