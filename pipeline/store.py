"""The DuckDB store: table definitions, transactional idempotent ingest, the `runs` view of runs, snapshots.

Tables (documented in README "The store"):
- `hardware`, `architectures`, `cloud_prices`: reference tables, replaced whole from measurements/.
- `run_metrics`: long form, one row per (run_id, metric) as reported, with `source_file` and `source_line`.
- `runs`: one row per run: architecture (filled from `architectures` by model-name alias where the
  measurement leaves it empty), layout, hardware, and the metrics pivoted into columns.
- `ingest_log`: one row per ingested file: sha256, rows accepted / rejected / duplicate, status, time.
- `rejected_rows`: file, line, column, value, reason for every rejected row.

Only one process writes (DuckDB's file lock enforces it). Each file's ingest is one transaction: a failure
anywhere rolls back to the state before, and ingesting the same bytes again changes nothing.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl

from pipeline import adapters
from pipeline.measurements import COLUMNS, SCHEMA, Validated, missing_required, validate
from pipeline.readers import FileRejected, read_measurement_file, sha256_bytes

_SQL_TYPES = {pl.Int64: "BIGINT", pl.Float64: "DOUBLE", pl.Utf8: "VARCHAR"}
METRIC_COLUMNS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hfu",
                  "time_to_train_min", "gpu_hours")
ARCH_FILL = ("n_layers", "d_model", "n_heads", "n_kv_heads", "ffn_dim", "vocab")
MAIN_TABLES = ("hardware", "architectures", "cloud_prices", "run_metrics", "runs", "ingest_log", "rejected_rows")


def sha256_file(path: str | Path) -> str:
    return sha256_bytes(Path(path).read_bytes())


def connect(path: str | Path, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    path = Path(path)
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.exists():
        raise FileNotFoundError(f"store not found: {path} (run `stepcast build` first)")
    return duckdb.connect(str(path), read_only=read_only)


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    cols = ",\n  ".join(f"{c} {_SQL_TYPES[SCHEMA[c]]}" for c in COLUMNS)
    con.execute(f"""
        CREATE TABLE IF NOT EXISTS run_metrics (
          {cols},
          source_file VARCHAR NOT NULL,
          source_line BIGINT NOT NULL,
          PRIMARY KEY (run_id, metric)
        )""")
    con.execute("""
        CREATE TABLE IF NOT EXISTS ingest_log (
          file VARCHAR PRIMARY KEY, sha256 VARCHAR NOT NULL, kind VARCHAR NOT NULL, n_bytes BIGINT,
          rows_total BIGINT, rows_accepted BIGINT, rows_rejected BIGINT, rows_duplicate BIGINT,
          status VARCHAR NOT NULL, message VARCHAR, ingested_at TIMESTAMP NOT NULL)""")
    con.execute("""
        CREATE TABLE IF NOT EXISTS rejected_rows (
          file VARCHAR NOT NULL, line BIGINT, "column" VARCHAR, value VARCHAR, reason VARCHAR NOT NULL)""")


def table_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(con.execute(
        "select count(*) from information_schema.tables where table_name = ? and table_schema = 'main'", [name]
    ).fetchone()[0])


def row_counts(con: duckdb.DuckDBPyConnection, tables: Iterable[str] = MAIN_TABLES) -> dict[str, int | None]:
    return {t: (con.execute(f'select count(*) from "{t}"').fetchone()[0] if table_exists(con, t) else None)
            for t in tables}


# ---------------------------------------------------------------- reference tables

def read_reference_csv(path: Path, key: str, required: Iterable[str]) -> pl.DataFrame:
    """Read a reference CSV (hardware, architectures, prices); reject it whole if it is malformed."""
    if not path.exists():
        raise FileRejected(str(path), "file not found")
    try:
        frame = pl.read_csv(path, infer_schema_length=None)
    except Exception as err:  # noqa: BLE001
        raise FileRejected(str(path), f"unreadable CSV: {err}") from None
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise FileRejected(str(path), f"missing required column(s): {', '.join(missing)}", line=1)
    if key:
        blank = frame.with_row_index("_i").filter(pl.col(key).is_null())
        if blank.height:
            raise FileRejected(str(path), f"empty {key}", line=int(blank["_i"][0]) + 2, column=key)
        dup = frame.group_by(key).len().filter(pl.col("len") > 1)
        if dup.height:
            raise FileRejected(str(path), f"duplicate {key}: {', '.join(map(str, dup[key].to_list()))}", column=key)
    return frame


REFERENCE = {
    # table: (file, key column, required columns)
    "hardware": ("hardware_specs.csv", "id", ("id", "name", "peak_bf16_tflops", "peak_fp32_tflops", "memory_gb",
                                              "memory_bw_gbps", "intra_node_bw_gbps", "gpus_per_node_typical",
                                              "inter_node_bw_gbps", "source_ref")),
    "architectures": ("architectures.csv", "id", ("id", "name", "n_layers", "d_model", "n_heads", "n_kv_heads",
                                                  "ffn_dim", "vocab", "activation", "n_experts", "top_k",
                                                  "tied_embeddings", "aliases", "source")),
    "cloud_prices": ("cloud_prices.csv", "", ("accelerator_id", "cloud", "instance_type", "accelerator_count",
                                              "price_usd_per_hour", "catalog_file", "catalog_commit")),
}



def load_reference(con: duckdb.DuckDBPyConnection, table: str, measurements_root: Path) -> pl.DataFrame:
    """Validate a reference CSV and replace its table with it; returns the frame loaded."""
    file, key, required = REFERENCE[table]
    frame = read_reference_csv(Path(measurements_root) / file, key, required)
    replace_table(con, table, frame)
    return frame


def replace_table(con: duckdb.DuckDBPyConnection, name: str, frame: pl.DataFrame) -> None:
    """Replace a whole table in one transaction."""
    con.execute("BEGIN TRANSACTION")
    try:
        con.register("_incoming_frame", frame.to_arrow())
        con.execute(f'CREATE OR REPLACE TABLE "{name}" AS SELECT * FROM _incoming_frame')
        con.unregister("_incoming_frame")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def known_hardware(con: duckdb.DuckDBPyConnection) -> set[str]:
    if not table_exists(con, "hardware"):
        raise RuntimeError("the store has no hardware table yet: run `stepcast build` (or load hardware first)")
    return {r[0] for r in con.execute("select id from hardware").fetchall()}


# ---------------------------------------------------------------- ingest

@dataclass
class FileReport:
    file: str
    status: str  # accepted | partial | rejected | unchanged | duplicate
    rows_total: int = 0
    rows_accepted: int = 0
    rows_rejected: int = 0
    rows_duplicate: int = 0
    rejections: pl.DataFrame | None = None
    message: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status in ("accepted", "unchanged", "duplicate")


def file_key(path: str | Path) -> str:
    """How a file is named in the store: relative to the project root when inside it, else absolute."""
    from pipeline.settings import PROJECT_ROOT

    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(PROJECT_ROOT).as_posix()
    except ValueError:
        return resolved.as_posix()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None, microsecond=0)


def _prepare(path: str, kind: str) -> tuple[pl.DataFrame, str, int, list[str], list[tuple[int, int]]]:
    read = read_measurement_file(path)
    frame = read.frame
    if kind == "vtrain_single":
        frame = adapters.vtrain_single(frame, path)
    else:
        missing = missing_required([c for c in frame.columns if c != "_line"])
        if missing:
            raise FileRejected(path, f"missing required column(s): {', '.join(missing)} "
                                     f"(the measurement schema is described in measurements/DATA_CARD.md)", line=1)
        unknown = [c for c in frame.columns if c not in COLUMNS and c != "_line"]
        if unknown:
            read.warnings.append(f"{path}: ignoring unknown column(s): {', '.join(unknown)}")
    return frame, read.sha256, read.n_bytes, read.warnings, read.short_rows


def ingest_file(con: duckdb.DuckDBPyConnection, path: str | Path, kind: str = "measurements",
                _fail_after_insert: Callable[[], None] | None = None) -> FileReport:
    """Ingest one measurement file in one transaction. Raises FileRejected for whole-file problems
    (the store is untouched); row problems are recorded in `rejected_rows` and reported."""
    name = file_key(path)
    ensure_schema(con)
    frame, sha, n_bytes, warnings, short = _prepare(str(path), kind)
    previous = con.execute("select sha256, status from ingest_log where file = ?", [name]).fetchone()
    if previous and previous[0] == sha:
        return FileReport(file=name, status="unchanged", message="same content as the last ingest; nothing to do",
                          warnings=warnings)
    hw = known_hardware(con)
    checked: Validated = validate(frame, name, hw)
    accepted, rejected = checked.accepted, checked.rejected
    if short:
        ragged = pl.DataFrame(
            {"file": [name] * len(short), "line": [ln for ln, _ in short], "column": [None] * len(short),
             "value": [None] * len(short),
             "reason": [f"row has {n} fields, header has {frame.width - 1} (truncated or mis-quoted row)" for _, n in short]},
            schema=rejected.schema)
        rejected = pl.concat([rejected, ragged]).sort("line")
    # run ids owned by another file are not taken over silently
    if accepted.height:
        con.register("_ids", accepted.select("run_id").unique().to_arrow())
        owned = con.sql(
            "select distinct m.run_id, m.source_file from run_metrics m join _ids using (run_id) where m.source_file <> ?",
            params=[name]).pl()
        con.unregister("_ids")
        if owned.height:
            clash = accepted.join(owned, on="run_id", how="inner")
            rejected = pl.concat([rejected, clash.select(
                pl.lit(name).alias("file"), pl.col("source_line").alias("line"), pl.lit("run_id").alias("column"),
                pl.col("run_id").alias("value"),
                pl.format("run_id already ingested from {}", pl.col("source_file")).alias("reason"))]).sort("line")
            accepted = accepted.join(owned.select("run_id"), on="run_id", how="anti")
    n_total = frame.height + len(short)
    n_rejected_rows = rejected.select(pl.col("line")).n_unique() if rejected.height else 0
    status = "accepted" if n_rejected_rows == 0 else ("partial" if accepted.height else "rejected")
    message = "" if status == "accepted" else f"{n_rejected_rows} row(s) rejected; see rejected_rows"
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("delete from run_metrics where source_file = ?", [name])
        con.execute("delete from rejected_rows where file = ?", [name])
        if accepted.height:
            con.register("_acc", accepted.to_arrow())
            con.execute(f"insert into run_metrics select {', '.join(COLUMNS)}, ? as source_file, source_line from _acc",
                        [name])
            con.unregister("_acc")
        if rejected.height:
            con.register("_rej", rejected.to_arrow())
            con.execute('insert into rejected_rows select file, line, "column", value, reason from _rej')
            con.unregister("_rej")
        if _fail_after_insert is not None:
            _fail_after_insert()
        con.execute("delete from ingest_log where file = ?", [name])
        con.execute("insert into ingest_log values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [name, sha, kind, n_bytes, n_total, accepted.height, n_rejected_rows,
                     checked.duplicates_dropped, status, message, _now()])
        rebuild_runs(con)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return FileReport(file=name, status=status, rows_total=n_total, rows_accepted=accepted.height,
                      rows_rejected=n_rejected_rows, rows_duplicate=checked.duplicates_dropped,
                      rejections=rejected, message=message, warnings=warnings)


def check_vtrain_multi(con: duckdb.DuckDBPyConnection, path: str | Path) -> FileReport:
    """Recognise the vTrain multi-node raw file as a duplicate of the vTrain rows of measured_runs.csv.

    Each raw row must match the stored run `vtrain_mNNN` on layout and step time (to 0.1 ms); matching rows
    are counted as duplicates and not loaded. A raw row without its twin is reported as a rejection."""
    name = file_key(path)
    read = read_measurement_file(path)
    keys = adapters.vtrain_multi_keys(read.frame, name)
    con.register("_vm", keys.to_arrow())
    joined = con.sql("""
        select k.run_id, k.step_time_s as raw_s, r.step_time_s as stored_s,
               (r.n_gpus = k.n_gpus and r.global_batch_seqs = k.global_batch_seqs and r.micro_batch = k.micro_batch
                and r.d_model = k.d_model and r.n_layers = k.n_layers and r.tp = k.tp and r.dp = k.dp and r.pp = k.pp
                and abs(r.step_time_s - k.step_time_s) < 1e-4) as same
        from _vm k left join runs r using (run_id)""").pl()
    con.unregister("_vm")
    twins = int(joined["same"].fill_null(False).sum())
    orphans = joined.filter(~pl.col("same").fill_null(False))
    status = "duplicate" if orphans.height == 0 else "partial"
    message = (f"all {twins} rows duplicate the vTrain rows of measured_runs.csv; not loaded again"
               if orphans.height == 0 else f"{orphans.height} row(s) have no matching run in measured_runs.csv")
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("delete from ingest_log where file = ?", [name])
        con.execute("insert into ingest_log values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [name, read.sha256, "vtrain_multi", read.n_bytes, keys.height, 0, orphans.height, twins,
                     status, message, _now()])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return FileReport(file=name, status=status, rows_total=keys.height, rows_duplicate=twins,
                      rows_rejected=orphans.height, message=message)


def rebuild_runs(con: duckdb.DuckDBPyConnection) -> None:
    """Derive `runs` (one row per run) from `run_metrics`, filling architecture columns by alias."""
    ensure_schema(con)
    have_arch = table_exists(con, "architectures")
    run_cols = [c for c in COLUMNS if c not in ("run_id", "metric", "value", "unit", "derived", "notes", "source_ref")]
    # deterministic aggregates, so that rebuilding from the same rows gives the same table
    firsts = ",\n".join(f"min({c}) as {c}" for c in run_cols)  # rows of a run agree on non-null values
    firsts += ",\nstring_agg(distinct source_ref, ' | ' order by source_ref) as source_ref"
    pivots = ",\n".join(f"max(value) filter (where metric = '{m}') as {m}" for m in METRIC_COLUMNS)
    base = f"""
        select run_id, {firsts}, {pivots},
               min(unit) filter (where metric = 'gpu_hours') as gpu_hours_unit,
               count(*) as n_metrics, bool_or(derived = 'yes') as any_derived,
               min(source_file) as source_file
        from run_metrics group by run_id"""
    if have_arch:
        fill = ",\n".join(f"coalesce(b.{c}, a.{c}) as {c}" for c in ARCH_FILL)
        keep = ", ".join(f"b.{c}" for c in run_cols + ["source_ref"] + list(METRIC_COLUMNS) + ["gpu_hours_unit", "n_metrics",
                                                                            "any_derived", "source_file"]
                         if c not in ARCH_FILL)
        sql = f"""
            create or replace table runs as
            with base as ({base}),
            alias as (
              select trim(unnest(string_split(aliases, '|'))) as alias, id from architectures
              where aliases is not null)
            select b.run_id, al.id as arch_id, {fill},
                   a.head_dim, a.activation, a.n_experts, a.top_k, a.expert_ffn_dim, a.n_shared_experts,
                   a.n_dense_layers, a.tied_embeddings,
                   ({' or '.join(f'(b.{c} is null and a.{c} is not null)' for c in ARCH_FILL)}) as arch_filled,
                   {keep}
            from base b left join alias al on al.alias = b.model_name
            left join architectures a on a.id = al.id
            order by b.run_id"""
    else:
        sql = f"create or replace table runs as select * from ({base}) order by run_id"
    con.execute(sql)


# ---------------------------------------------------------------- snapshot

def publish_snapshot(store: Path, snapshot: Path) -> Path:
    """Copy the (checkpointed, closed) store beside the snapshot, then rename it into place atomically.

    A reader that has the old snapshot open keeps reading the old file; new readers see the new one."""
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    tmp = snapshot.with_name(f".{snapshot.name}.{os.getpid()}.tmp")
    con = duckdb.connect(str(store))
    try:
        con.execute("CHECKPOINT")
    finally:
        con.close()
    shutil.copyfile(store, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, snapshot)
    return snapshot
