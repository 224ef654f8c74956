"""Ingest: exact counts on the shipped corpus, every rejection reason, idempotency, transactions."""

from __future__ import annotations

import csv
from pathlib import Path

import duckdb
import polars as pl
import pytest

from pipeline import store
from pipeline.measurements import COLUMNS, METRICS
from pipeline.readers import FileRejected
from tests.conftest import MEASUREMENTS

BASE = {
    "run_id": "t-run-1", "source": "unit-test", "source_ref": "tests/test_ingest.py", "year": "2024",
    "model_name": "Llama 3 8B", "arch": "dense", "params_b": "8", "n_layers": "32", "d_model": "4096",
    "n_heads": "32", "n_kv_heads": "8", "ffn_dim": "14336", "vocab": "128256", "seq_len": "8192",
    "global_batch_seqs": "128", "micro_batch": "1", "gpu": "h100-sxm5-80gb", "gpu_as_reported": "H100",
    "n_gpus": "64", "gpus_per_node": "8", "framework": "torchtitan", "dtype": "bf16", "tp": "1", "pp": "1",
    "dp": "64", "sharding": "fsdp", "recompute": "none", "metric": "tokens_per_s_per_gpu", "value": "6000",
    "unit": "tokens/s/GPU", "derived": "no", "notes": "synthetic row for a test",
}


def write_rows(path: Path, rows: list[dict], columns: list[str] | None = None) -> Path:
    columns = columns or list(COLUMNS)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in columns})
    return path


def ingest_one(store_path: Path, path, **kw):
    """`store.ingest_file` on its own connection to the store at `store_path` (closed afterwards)."""
    con = store.connect(store_path)
    try:
        return store.ingest_file(con, path, **kw)
    finally:
        con.close()


def all_tables(path: Path) -> dict[str, list[tuple]]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {t: sorted(map(repr, con.execute(f'select * from "{t}"').fetchall()))
                for t in store.MAIN_TABLES if store.table_exists(con, t)}
    finally:
        con.close()


# ---------------------------------------------------------------- the shipped corpus

def test_shipped_corpus_exact_counts(built_store):
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        log = {Path(r[0]).name: r for r in con.execute(
            "select file, rows_total, rows_accepted, rows_rejected, rows_duplicate, status from ingest_log").fetchall()}
        assert log["measured_runs.csv"][1:] == (1521, 1521, 0, 0, "accepted")
        assert log["ground_truth_single.csv"][1:] == (1440, 1440, 0, 0, "accepted")
        # the multi-node raw file is recognised as the 109 vTrain rows already in measured_runs.csv
        assert log["ground_truth_multi.csv"][1:] == (109, 0, 0, 109, "duplicate")
        assert con.execute("select count(*) from run_metrics").fetchall()[0][0] == 1521 + 1440
        assert con.execute("select count(*) from rejected_rows").fetchall()[0][0] == 0
        n_runs_shipped = con.execute(
            "select count(distinct run_id) from run_metrics where source_file like '%measured_runs.csv'").fetchall()[0][0]
        assert n_runs_shipped == 871
        assert con.execute("select count(*) from runs").fetchall()[0][0] == 871 + 1440
        vtrain = con.execute("select count(*) from runs where run_id like 'vtrain_m%'").fetchall()[0][0]
        assert vtrain == 109
        assert con.execute("select count(*) from hardware").fetchall()[0][0] == 54
        assert con.execute("select count(*) from cloud_prices").fetchall()[0][0] == 744
    finally:
        con.close()


def test_runs_pivot_and_architecture_fill(built_store):
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        # a vTrain multi-node run: the step time pivots into its column, the shape comes from architectures
        row = con.execute("select step_time_s, arch_id, ffn_dim, vocab, arch_filled from runs "
                          "where run_id = 'vtrain_m002'").fetchall()[0]
        assert row[0] == pytest.approx(3.5665)
        assert row[1] == "vtrain-gpt-3.6b"
        assert row[2] == 4 * 3072 and row[3] == 51200 and row[4] is True
        # a single-node vTrain run arrives through the adapter with ms converted to s
        s = con.execute("select step_time_s, n_gpus, tp, dp, pp from runs where run_id = 'vtrain_s0002'").fetchall()[0]
        assert s == (pytest.approx(0.372160408), 2, 1, 1, 2)
        # a run with two metrics has both in one row
        m = con.execute("select model_tflops_per_gpu, mfu from runs where run_id = 'mlm-h100-2024-1p7b'").fetchall()[0]
        assert m == (pytest.approx(408.8), pytest.approx(0.41))
    finally:
        con.close()


# ---------------------------------------------------------------- rejection reasons

CASES = [
    # (change to the base row, column named, words in the reason)
    ({"run_id": ""}, "run_id", "missing"),
    ({"source": ""}, "source", "provenance"),
    ({"source_ref": " "}, "source_ref", "provenance"),
    ({"gpu": "h100-imaginary"}, "gpu", "unknown hardware id"),
    ({"value": "abc"}, "value", "expected a number"),
    ({"value": "nan"}, "value", "NaN"),
    ({"value": "inf"}, "value", "infinite"),
    ({"metric": "step_time_s", "unit": "s", "value": "0"}, "value", "time must be > 0"),
    ({"metric": "step_time_s", "unit": "s", "value": "-2.5"}, "value", "time must be > 0"),
    ({"metric": "step_time_s", "unit": "s", "value": "1e9"}, "value", "absurd step time"),
    ({"metric": "mfu", "unit": "fraction", "value": "41.5"}, "value", "looks like a percent"),
    ({"metric": "mfu", "unit": "fraction", "value": "0"}, "value", "0 < mfu <= 1"),
    ({"metric": "step_time_s", "unit": "ms", "value": "3.2"}, "unit", "unit for step_time_s must be s"),
    ({"metric": "speed"}, "metric", "unknown metric"),
    ({"tp": "0"}, "tp", "out of range"),
    ({"tp": "1.5"}, "tp", "expected an integer"),
    ({"n_gpus": "sixty-four"}, "n_gpus", "expected an integer"),
    ({"tp": "2", "dp": "64"}, "n_gpus", "inconsistent degrees"),
    ({"dtype": "bf17"}, "dtype", "expected one of"),
    ({"sharding": "zero4"}, "sharding", "expected one of"),
    ({"recompute": "some"}, "recompute", "expected one of"),
    ({"n_layers": "1e12"}, "n_layers", "out of range"),
    ({"inter_node_bw_gbps": "0"}, "inter_node_bw_gbps", "out of range"),
    ({"notes": "x" * 20_000}, "notes", "longer than"),
]


@pytest.mark.parametrize("change,column,reason", CASES, ids=[f"{c[1]}:{c[2]}" for c in CASES])
def test_every_rejection_reason_names_line_and_column(store_copy, tmp_path, change, column, reason):
    good = dict(BASE, run_id="t-good")
    bad = dict(BASE, **change)
    path = write_rows(tmp_path / "runs.csv", [good, bad])
    before = all_tables(store_copy)
    rep = ingest_one(store_copy, path)
    assert rep.status == "partial" and rep.rows_accepted == 1 and rep.rows_rejected == 1
    rej = rep.rejections.filter(pl.col("line") == 3)
    assert rej.height >= 1, rep.rejections
    hit = rej.filter(pl.col("column") == column)
    assert hit.height == 1, rej
    assert reason in hit["reason"][0], hit["reason"][0]
    after = all_tables(store_copy)
    # nothing that was stored before is lost or changed
    for table in ("hardware", "architectures", "cloud_prices"):
        assert after[table] == before[table]
    assert set(before["run_metrics"]) <= set(after["run_metrics"])


def test_duplicate_run_metric_with_different_values_rejects_both(store_copy, tmp_path):
    path = write_rows(tmp_path / "dup.csv", [BASE, dict(BASE, value="7000"), dict(BASE, run_id="t-2")])
    rep = ingest_one(store_copy, path)
    assert rep.rows_accepted == 1
    assert sorted(rep.rejections["line"].to_list()) == [2, 3]
    assert all("different values" in r for r in rep.rejections["reason"])


def test_exact_duplicate_rows_collapse(store_copy, tmp_path):
    path = write_rows(tmp_path / "dup.csv", [BASE, BASE])
    rep = ingest_one(store_copy, path)
    assert (rep.status, rep.rows_accepted, rep.rows_duplicate) == ("accepted", 1, 1)


def test_rows_of_one_run_must_agree(store_copy, tmp_path):
    rows = [BASE, dict(BASE, metric="mfu", unit="fraction", value="0.4", n_gpus="128", dp="128")]
    rep = ingest_one(store_copy, write_rows(tmp_path / "r.csv", rows))
    assert rep.rows_accepted == 0
    assert set(rep.rejections["column"]) == {"dp"} and "disagree" in rep.rejections["reason"][0]


def test_run_id_owned_by_another_file_is_not_taken_over(store_copy, tmp_path):
    path = write_rows(tmp_path / "steal.csv", [dict(BASE, run_id="vtrain_m002")])
    con = store.connect(store_copy)
    try:
        rep = store.ingest_file(con, path)
        stored = con.execute("select value from run_metrics where run_id = 'vtrain_m002'").fetchall()
    finally:
        con.close()
    assert rep.rows_accepted == 0 and "already ingested from" in rep.rejections["reason"][0]
    assert stored == [(3.5665,)]


# ---------------------------------------------------------------- whole-file rejections

def test_missing_required_column_rejects_file(store_copy, tmp_path):
    columns = [c for c in COLUMNS if c not in ("gpu", "unit")]
    path = write_rows(tmp_path / "nocol.csv", [BASE], columns=columns)
    before = all_tables(store_copy)
    with pytest.raises(FileRejected) as err:
        ingest_one(store_copy, path)
    assert "nocol.csv" in str(err.value) and "gpu" in str(err.value) and "unit" in str(err.value)
    assert "line 1" in str(err.value)
    assert all_tables(store_copy) == before


@pytest.mark.parametrize("content,words", [
    (b"", "empty file"),
    ("\n".join([",".join(COLUMNS)]).encode(), "no data rows"),
    (",".join(COLUMNS).encode() + b"\nt-1,caf\xe9\n", "not UTF-8"),
    (",".join(COLUMNS).encode() + b"\nt-1,a\x00b\n", "NUL byte"),
    (",".join(COLUMNS).encode() + b'\n"t-1,unclosed quote\n', "malformed CSV"),
])
def test_unreadable_files_rejected_whole(store_copy, tmp_path, content, words):
    path = tmp_path / "broken.csv"
    path.write_bytes(content)
    before = all_tables(store_copy)
    with pytest.raises(FileRejected) as err:
        ingest_one(store_copy, path)
    assert words in str(err.value) and "broken.csv" in str(err.value)
    assert all_tables(store_copy) == before


def test_bom_crlf_and_quoted_newlines_are_fine(store_copy, tmp_path):
    path = write_rows(tmp_path / "ok.csv", [dict(BASE, notes="a note, with a comma\nand a newline"),
                                            dict(BASE, run_id="t-2")])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
    con = store.connect(store_copy)
    try:
        rep = store.ingest_file(con, path)
        lines = con.execute("select run_id, source_line from run_metrics where run_id like 't-%' order by 1").fetchall()
    finally:
        con.close()
    assert rep.status == "accepted" and rep.rows_accepted == 2
    assert lines == [("t-2", 4), ("t-run-1", 2)]  # the quoted newline makes row 1 span lines 2-3


def test_parquet_with_wrong_types_is_rejected_per_row(store_copy, tmp_path):
    frame = pl.DataFrame([BASE, dict(BASE, run_id="t-2", value="fast")])
    frame.write_parquet(tmp_path / "p.parquet")
    rep = ingest_one(store_copy, tmp_path / "p.parquet")
    assert rep.rows_accepted == 1
    assert rep.rejections.row(0, named=True)["line"] == 2 and rep.rejections["column"][0] == "value"


# ---------------------------------------------------------------- idempotency and transactions

def test_same_file_twice_leaves_store_unchanged(store_copy, tmp_path):
    path = write_rows(tmp_path / "runs.csv", [BASE, dict(BASE, run_id="t-2", value="abc")])
    first = ingest_one(store_copy, path)
    snapshot = all_tables(store_copy)
    second = ingest_one(store_copy, path)
    assert first.status == "partial" and second.status == "unchanged"
    assert all_tables(store_copy) == snapshot


def test_changed_file_replaces_its_earlier_rows(store_copy, tmp_path):
    path = write_rows(tmp_path / "runs.csv", [BASE, dict(BASE, run_id="t-2")])
    con = store.connect(store_copy)
    try:
        store.ingest_file(con, path)
        write_rows(path, [dict(BASE, value="6100")])
        rep = store.ingest_file(con, path)
        rows = con.execute("select run_id, value from run_metrics where run_id like 't-%'").fetchall()
        runs = con.execute("select tokens_per_s_per_gpu from runs where run_id = 't-run-1'").fetchall()
    finally:
        con.close()
    assert rep.status == "accepted"
    assert rows == [("t-run-1", 6100.0)] and runs == [(6100.0,)]


def test_failure_mid_ingest_changes_nothing(store_copy, tmp_path):
    path = write_rows(tmp_path / "runs.csv", [BASE, dict(BASE, run_id="t-2", value="abc")])
    before = all_tables(store_copy)

    def boom():
        raise RuntimeError("injected failure after the inserts")

    with pytest.raises(RuntimeError, match="injected"):
        ingest_one(store_copy, path, _fail_after_insert=boom)
    assert all_tables(store_copy) == before


def test_metric_table_matches_data_card():
    # the data card's metric list is the schema's (a new metric needs both)
    card = (MEASUREMENTS / "DATA_CARD.md").read_text()
    for metric in METRICS:
        assert f"`{metric}`" in card


def test_incremental_runs_equal_a_full_rebuild(store_copy, tmp_path):
    """`runs` kept current batch by batch (new run ids aggregated from the batch, the runs of a replaced file
    re-derived from run_metrics) is exactly what a full `rebuild_runs` derives."""
    one = dict(BASE, run_id="t-inc-1")
    a_rows = [
        dict(one, metric="step_time_s", value="2.5", unit="s", source_ref="ref B"),
        dict(one, metric="mfu", value="0.41", unit="fraction", derived="yes", source_ref="ref A", n_layers=""),
        dict(one, metric="tokens_per_s_per_gpu", value="6000", unit="tokens/s/GPU", derived=""),
        dict(BASE, run_id="t-inc-2", model_name="Model Without Alias", metric="gpu_hours", value="1000",
             unit="GPU-hours", n_layers=""),
    ]
    a = write_rows(tmp_path / "a.csv", a_rows)
    b = write_rows(tmp_path / "b.csv", [dict(BASE, run_id="t-inc-3"), dict(one, value="1")])  # t-inc-1: a's
    con = store.connect(store_copy)
    try:
        first = store.ingest_files(con, [a, b], max_batch_rows=1_000)  # one batch
        a_changed = write_rows(tmp_path / "a.csv", [dict(r, value="3.5") if r["metric"] == "step_time_s" else r
                                                   for r in a_rows[:3]])  # t-inc-2 dropped
        c = write_rows(tmp_path / "c.csv", [dict(BASE, run_id="t-inc-4", derived="")])
        second = store.ingest_files(con, [a_changed, c], max_batch_rows=1)  # two batches, a replaced
        con.execute("create temp table incremental as select * from runs")
        store.rebuild_runs(con)
        diff = con.execute("""select count(*) from (
            (select * from incremental except all select * from runs)
            union all (select * from runs except all select * from incremental))""").fetchone()[0]
        mine = con.execute("""select run_id, source_ref, step_time_s, any_derived, n_metrics, n_layers
                              from incremental where run_id like 't-inc-%' order by run_id""").fetchall()
    finally:
        con.close()
    assert [r.status for r in first] == ["accepted", "partial"] and [r.status for r in second] == ["accepted"] * 2
    assert diff == 0
    assert mine == [("t-inc-1", "ref A | ref B | tests/test_ingest.py", 3.5, True, 3, 32), ("t-inc-3", "tests/test_ingest.py", None, False, 1, 32),
                    ("t-inc-4", "tests/test_ingest.py", None, None, 1, 32)]
