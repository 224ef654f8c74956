"""The DuckDB store: table definitions, transactional idempotent ingest, the `runs` view of runs, snapshots.

Tables (documented in README "The store"):
- `hardware`, `architectures`, `cloud_prices`: reference tables, replaced whole from measurements/.
- `run_metrics`: long form, one row per (run_id, metric) as reported, with `source_file` and `source_line`.
- `runs`: one row per run: architecture (filled from `architectures` by model-name alias where the
  measurement leaves it empty), layout, hardware, and the metrics pivoted into columns.
- `ingest_log`: one row per ingested file: sha256, rows accepted / rejected / duplicate, status, time.
- `rejected_rows`: file, line, column, value, reason for every rejected row.

Only one process writes: every writer (`stepcast build`, `ingest`, `fit`, the snapshot publish, every Dagster
run) holds `writer_lock` (an flock on `<store>.lock`); a second writer waits up to a bound, then stops with
"another process is writing <store> (pid, command, since)". The project's dagster.yaml also runs one Dagster
run at a time. `ingest_file` is one transaction;
`ingest_files` is one transaction too, inserting batches of files (about 250,000 rows) with one incremental
update of `runs` each: a failure anywhere rolls the whole call back, and ingesting the same bytes again changes
nothing. Reading, validation and writing run on their own threads, overlapped (see `ingest_files`).
`publish_snapshot` writes the readers' copy beside and renames it into place (see its docstring).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from pipeline import adapters
from pipeline.catalog import (
    DECIMAL_SIZE,
    NAME_IGNORED,
    NAME_IGNORED_KEEP_DOTS,
    ids_by_name,
)
from pipeline.measurements import (
    COLUMNS,
    REJECT_SCHEMA,
    SCHEMA,
    Validated,
    missing_required,
    validate,
)
from pipeline.readers import (
    FileRejected,
    SimpleCsv,
    _decode,
    parse_simple,
    read_csv_text,
    read_measurement_file,
    sha256_bytes,
)
from pipeline.settings import PROJECT_ROOT

_SQL_TYPES = {pl.Int64: "BIGINT", pl.Float64: "DOUBLE", pl.Utf8: "VARCHAR"}
METRIC_COLUMNS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "hfu",
                  "time_to_train_min", "gpu_hours")
ARCH_FILL = ("n_layers", "d_model", "n_heads", "n_kv_heads", "ffn_dim", "vocab")
#: the architecture columns `runs` takes as they are (not filled into run columns)
_ARCH_EXTRA = ("head_dim", "activation", "n_experts", "top_k", "expert_ffn_dim", "n_shared_experts", "n_dense_layers",
               "tied_embeddings")
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


#: how long a process waits for DuckDB's own file lock, held by another process of the same writer (a step of
#: `stepcast build` while another step uses the store), before giving up (env STEPCAST_STORE_WAIT_S). The
#: longest hold in the build is the calibration fit's (its asset keeps the store open while it fits).
STORE_WAIT_S = 600.0


def store_wait_s() -> float:
    return _env_seconds("STEPCAST_STORE_WAIT_S", STORE_WAIT_S)


def _env_seconds(name: str, default: float) -> float:
    """A wait bound in seconds from the environment variable `name`, else (unset or not a number) `default`."""
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _file_lock_conflict(err: BaseException) -> bool:
    return isinstance(err, duckdb.IOException) and "Could not set lock on file" in str(err)


_DUCKDB_HOLDER = re.compile(r"Conflicting lock is held in (?P<exe>.*?) \(PID (?P<pid>\d+)\)")


def file_holder(err: BaseException) -> int | None:
    """The pid DuckDB's "Could not set lock on file" error names as holding the file (None when it names none)."""
    found = _DUCKDB_HOLDER.search(str(err))
    return int(found["pid"]) if found and int(found["pid"]) > 0 else None


def describe_process(pid: int) -> str:
    """'pid N (its command line)', the command line as /proc has it (its executable alone, or nothing, where /proc
    cannot say)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        cmd = " ".join(a.decode("utf-8", "replace") for a in args if a)
    except OSError:
        cmd = ""
    cmd = " ".join(cmd.split())
    return f"pid {pid} ({cmd[:160] + ('...' if len(cmd) > 160 else '')})" if cmd else f"pid {pid}"


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether `pid` is `ancestor` or one of its descendants (/proc; False where /proc cannot say)."""
    for _ in range(64):
        if pid == ancestor:
            return True
        parent = _parent_pid(pid)
        if parent is None or parent <= 1:
            return False
        pid = parent
    return False


def _writer_owns(store: Path, holder: int | None) -> bool:
    """Whether the process `holder` that has the DuckDB file open belongs to the writer holding the store's writer
    lock (the lock's holder or a process it started: the step processes of `stepcast build`)."""
    owner = _holder_pid(Path(str(store) + ".lock"))
    return holder is not None and owner is not None and _descends_from(holder, owner)


def foreign_holder_message(store: str | Path, holder: int | None, waited_s: float) -> str:
    """One line: which process has the store open outside stepcast's writer lock, and what to do."""
    who = describe_process(holder) if holder is not None else "a process DuckDB does not name"
    stop = f"close the store there or end that process (`kill {holder}`)" if holder is not None else \
        "close the program that has it open"
    return (f"another process has {store} open: {who}, not a stepcast writer; {stop}, then run the command "
            f"again (waited {waited_s:g} s, env STEPCAST_LOCK_WAIT_S)")


def connect_waiting(path: str | Path, timeout_s: float | None = None, config: dict | None = None,
                    foreign_wait_s: float | None = None, on_wait=None) -> duckdb.DuckDBPyConnection:
    """A read-write connection to the store, waiting while another process has the file open (DuckDB lets one
    process at a time open a database file read-write: "Could not set lock on file", naming the holder's pid).

    - A process of the writer that holds the store's writer lock (the lock's holder or a process it started: the
      steps of a multiprocess run take turns on the file this way, each holding it only while it reads its
      inputs or writes its rows) is waited for up to `timeout_s` (default `store_wait_s()`).
    - Any other process (a DuckDB shell, a notebook, a script: it never takes stepcast's writer lock) is waited
      for up to `foreign_wait_s` (default `lock_wait_s()`); then StoreBusy says in one line which process it is
      and what to do. `on_wait(message)` is called once when such a wait starts."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    own_bound = store_wait_s() if timeout_s is None else timeout_s
    foreign_bound = lock_wait_s() if foreign_wait_s is None else foreign_wait_s
    delay, told = 0.05, False
    while True:
        try:
            return duckdb.connect(str(path), config=config or {})
        except duckdb.IOException as err:
            if not _file_lock_conflict(err):
                raise
            holder = file_holder(err)
            waited = time.monotonic() - start
            if _writer_owns(path, holder):
                if waited >= own_bound:
                    raise StoreBusy(f"{path} stayed open in {describe_process(holder)} of the writer holding its "
                                    f"lock for {own_bound:g} s (env STEPCAST_STORE_WAIT_S); try again when that "
                                    f"writer has finished") from None
            elif waited >= foreign_bound:
                raise StoreBusy(foreign_holder_message(path, holder, foreign_bound)) from None
            elif on_wait is not None and not told:
                told = True
                who = describe_process(holder) if holder is not None else "another process"
                on_wait(f"{path} is open in {who}; waiting up to {foreign_bound:g} s for it to close "
                        f"(env STEPCAST_LOCK_WAIT_S)")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    cols = ",\n  ".join(f"{c} {_SQL_TYPES[SCHEMA[c]]}" for c in COLUMNS)
    con.execute(f"""
        CREATE TABLE IF NOT EXISTS run_metrics (
          {cols},
          source_file VARCHAR NOT NULL,
          source_line BIGINT NOT NULL
        )""")
    # a store made before a column joined the schema gets it (inserts name their columns)
    have = set(table_columns(con, "run_metrics"))
    for c in COLUMNS:
        if c not in have:
            con.execute(f"ALTER TABLE run_metrics ADD COLUMN {c} {_SQL_TYPES[SCHEMA[c]]}")
    # (run_id, metric) is unique by construction (validation keeps one row per pair within a file, and a run
    # id belongs to one file); the blocking asset check `run_metrics_unique` re-checks the stored table. No
    # PRIMARY KEY index: it doubled the cost of a million-row ingest (benchmarks/bench_ingest.py).
    con.execute("""
        CREATE TABLE IF NOT EXISTS ingest_log (
          file VARCHAR PRIMARY KEY, sha256 VARCHAR NOT NULL, kind VARCHAR NOT NULL, n_bytes BIGINT,
          rows_total BIGINT, rows_accepted BIGINT, rows_rejected BIGINT, rows_duplicate BIGINT,
          status VARCHAR NOT NULL, message VARCHAR, ingested_at TIMESTAMP NOT NULL)""")
    con.execute("""
        CREATE TABLE IF NOT EXISTS rejected_rows (
          file VARCHAR NOT NULL, line BIGINT, "column" VARCHAR, value VARCHAR, reason VARCHAR NOT NULL)""")


def table_columns(con: duckdb.DuckDBPyConnection, name: str) -> list[str]:
    """The columns of a table of the main schema, in order (empty when there is no such table)."""
    return [r[0] for r in con.execute(
        "select column_name from information_schema.columns where table_name = ? and table_schema = 'main' "
        "order by ordinal_position", [name]).fetchall()]


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
                                              "inter_node_bw_gbps", "generation", "sm_count",
                                              "scaleup_domain_accelerators", "accelerators_per_host", "scaleup_link",
                                              "source_ref")),
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
    status: str  # accepted | partial | rejected | unchanged | duplicate | unreadable
    rows_total: int = 0
    rows_accepted: int = 0
    rows_rejected: int = 0
    rows_duplicate: int = 0
    rejections: pl.DataFrame | None = None
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    error: FileRejected | None = None  # set when the file could not be read at all (status unreadable)
    path: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("accepted", "unchanged", "duplicate")


def file_key(path: str | Path) -> str:
    """How a file is named in the store: relative to the project root when inside it, else absolute."""
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(PROJECT_ROOT).as_posix()
    except ValueError:
        return resolved.as_posix()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None, microsecond=0)


@dataclass
class _Read:
    name: str
    path: str
    frame: pl.DataFrame | None
    sha: str
    n_bytes: int
    warnings: list[str]
    short: list[tuple[int, int]]
    header: list[str]
    n_rows: int = 0  # data rows read (the frame is dropped once the batch is validated)
    simple: SimpleCsv | None = None  # a CSV whose parsing is left to the batch (`_batch_frame`), instead of frame
    error: FileRejected | None = None  # the batch found the file unreadable after all (reported, not written)


def _prepare(path: str, kind: str, name: str) -> _Read:
    read = read_measurement_file(path, defer_simple=kind == "measurements")
    frame = read.frame
    if kind == "vtrain_single":
        frame = adapters.vtrain_single(frame, path)
    else:
        missing = missing_required(read.header)
        if missing:
            raise FileRejected(path, f"missing required column(s): {', '.join(missing)} "
                                     f"(the measurement schema is described in measurements/DATA_CARD.md)", line=1,
                               column=missing[0])
        unknown = [c for c in read.header if c not in COLUMNS]
        if unknown:
            read.warnings.append(f"{path}: ignoring unknown column(s): {', '.join(unknown)}")
    if frame is None:
        return _Read(name=name, path=path, frame=None, sha=read.sha256, n_bytes=read.n_bytes,
                     warnings=read.warnings, short=[], header=read.header, n_rows=read.simple.n_rows,
                     simple=read.simple)
    return _Read(name=name, path=path, frame=_own_frame(frame, name), sha=read.sha256, n_bytes=read.n_bytes,
                 warnings=read.warnings, short=read.short_rows, header=read.header, n_rows=frame.height)


def _own_frame(frame: pl.DataFrame, name: str) -> pl.DataFrame:
    """One file's cells: the schema's columns (unknown ones dropped) and `_line`, plus `_file`."""
    keep = [c for c in frame.columns if c in COLUMNS or c == "_line"]
    if len(keep) < frame.width:
        frame = frame.select(keep)
    # hstack, not with_columns: per call, polars' query engine costs more than the column itself
    return frame.hstack([pl.Series("_file", [name], dtype=pl.Utf8).new_from_index(0, frame.height)])


def _batch_frame(batch: list[_Read]) -> tuple[pl.DataFrame | None, bool]:
    """The cells of a batch's files in one frame (`_file`, `_line` added), and whether every cell's only
    possible blank is ' ' (see `SimpleCsv.plain`). Consecutive deferred CSV files with one header are parsed in
    one call; a group the joint parse refuses is parsed file by file the careful way (a file that then proves
    unreadable gets `error` and is left out)."""
    frames: list[pl.DataFrame] = []
    plain = True
    i = 0
    while i < len(batch):
        r = batch[i]
        if r.simple is None:
            if r.frame is not None:
                frames.append(r.frame)
                plain = False
            i += 1
            continue
        j = i + 1
        while (j < len(batch) and batch[j].simple is not None and batch[j].simple.header == r.simple.header
               and batch[j].simple.delimiter == r.simple.delimiter):
            j += 1
        group = batch[i:j]
        frame = parse_simple([g.simple for g in group])
        if frame is None:
            for g in group:
                try:
                    one, _, g.short = read_csv_text(g.path, _decode(g.path, g.simple.data, g.simple.delimiter),
                                                     g.simple.data, g.simple.delimiter)
                except FileRejected as err:
                    g.error = err
                    continue
                g.n_rows = one.height
                frames.append(_own_frame(one, g.name))
                plain = False
        else:
            counts = np.array([g.simple.n_rows for g in group])
            starts = np.repeat(np.cumsum(counts) - counts, counts)
            keep = [c for c in frame.columns if c in COLUMNS]
            frames.append(frame.select(keep).hstack([
                pl.Series("_line", np.arange(frame.height) - starts + 2, dtype=pl.Int64),
                pl.DataFrame({"_file": [g.name for g in group], "_n": counts}).select(
                    pl.col("_file").repeat_by("_n").explode()).to_series()]))
            plain = plain and all(g.simple.plain for g in group)
        for g in group:
            g.simple = None
        i = j
    if not frames:
        return None, plain
    return (frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")), plain


def _unchanged(name: str, path: str, warnings: list[str] | None = None) -> FileReport:
    return FileReport(file=name, status="unchanged", path=path, warnings=warnings or [],
                      message="same content as the last ingest; nothing to do")


def _ragged_rejections(r: _Read) -> pl.DataFrame:
    """A row with the wrong number of fields: named by its line and the first column it lacks (or has extra)."""
    n_header = len(r.header)
    cols, reasons = [], []
    for _, n in r.short:
        if n < n_header:
            cols.append(r.header[n])
            reasons.append(f"row has {n} fields, header has {n_header}: column {r.header[n]} and after are "
                           f"missing (truncated or mis-quoted row)")
        else:
            cols.append(r.header[-1] if r.header else None)
            reasons.append(f"row has {n} fields, header has {n_header}: extra field(s) after column "
                           f"{r.header[-1] if r.header else '?'} (unquoted delimiter?)")
    return pl.DataFrame({"file": [r.name] * len(r.short), "line": [ln for ln, _ in r.short], "column": cols,
                         "value": [None] * len(r.short), "reason": reasons}, schema=REJECT_SCHEMA)


def _check_batch(batch: list[_Read], hw: set[str], aliases: pl.DataFrame | None) -> tuple[Validated, pl.DataFrame]:
    """Parse (deferred files), validate the rows of a batch of files at once and derive its `runs` rows
    (pure; the validation thread)."""
    frame, plain = _batch_frame(batch)
    for r in batch:
        r.frame = None  # the cells are in `frame` now; the writer needs only the files' metadata
    if frame is None:  # every file of the batch proved unreadable
        frame = pl.DataFrame(schema={"_line": pl.Int64, "_file": pl.Utf8})
    checked = validate(frame, None, hw, blanks_are_spaces=plain)
    del frame
    return checked, runs_rows(runs_base(checked.accepted), aliases)


#: DuckDB threads while `ingest_files` writes: the reading and validation threads keep the other cores busy
#: (the 1,000,000-row load on the 2-core machine: 8.0 s with 1, 9.8 s with DuckDB's default of 2)
_WRITER_THREADS = 1


def ingest_files(con: duckdb.DuckDBPyConnection, paths: Iterable[str | Path], kind: str = "measurements", *,
                 keys: Iterable[str] | None = None, strict: bool = False, max_batch_rows: int = 250_000,
                 on_read: Callable[[str, int], None] | None = None,
                 on_file: Callable[[FileReport], None] | None = None,
                 _fail_after_insert: Callable[[], None] | None = None) -> list[FileReport]:
    """Ingest many measurement files in ONE transaction: read, parse and validate them in batches of about
    `max_batch_rows` rows, each batch inserted with one incremental update of `runs`.

    A file that cannot be read (or lacks a required column) is reported with status `unreadable` and its
    `error`, and changes nothing; a file whose bytes are already in `ingest_log` is `unchanged`. With
    `strict=True` (the incoming drop folder) a file with any rejected row is not loaded at all (status
    `rejected`, nothing written). A failure while writing rolls the whole call back: the store is as it was
    before it (a killed process leaves nothing of the call either). One transaction costs DuckDB less than
    one per batch: each commit leaves a partial row group that the next commit or the checkpoint rewrites
    (benchmarks/ingest_floor.py). Memory is bounded by the batch size, not by the number of files (DuckDB
    writes the transaction's full row groups to the database file as they fill). `keys` names the files in
    the store (default `file_key(path)`). Reports come back in input order; `on_file` sees them as they are
    decided (before the commit).

    Three stages overlap: a pool of two threads reads files and checks their bytes a bounded number of files
    ahead, one thread parses a batch (consecutive simple CSV files with one header in one polars call) and
    validates it (pure polars), while another inserts the batch before it (the only thread that touches
    `con` until the call returns), so at most two batches are in flight besides the one being gathered.
    The first batch is a quarter of the size, so that the writer starts early. Batches are written in input
    order."""
    ensure_schema(con)
    hw = known_hardware(con)
    aliases = arch_aliases(con)
    previous = dict(con.execute("select file, sha256 from ingest_log").fetchall())
    reports: list[FileReport] = []
    pending: list[_Read] = []
    pending_rows = 0
    started = False  # a batch has been handed on (the first is smaller)
    inflight: deque[tuple[list[_Read], Future]] = deque()
    inflight_names: set[str] = set()
    failed = threading.Event()
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="stepcast-read")
    validator = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stepcast-validate")
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stepcast-write")

    def emit(rep: FileReport) -> None:
        reports.append(rep)
        if on_file is not None:
            on_file(rep)

    def write(batch: list[_Read], checked: Future, replaced: set[str]) -> list[FileReport]:
        if failed.is_set():
            return []  # an earlier batch failed: nothing after it is written
        try:
            return _write_batch(con, batch, *checked.result(), kind, strict, replaced, _fail_after_insert)
        except BaseException:
            failed.set()
            raise

    def settle(keep: int) -> None:
        """Finish in-flight batches (oldest first) until at most `keep` remain; emit their reports."""
        while len(inflight) > keep:
            batch, done = inflight.popleft()
            sha = {r.name: r.sha for r in batch}
            for rep in done.result():  # re-raises the batch's failure here
                if rep.status != "unreadable" and not (strict and rep.status == "rejected"):
                    previous[rep.file] = sha[rep.file]
                emit(rep)
            inflight_names.difference_update(sha)

    def flush(keep: int = 1) -> None:
        nonlocal pending, pending_rows, started
        started = True
        if pending:
            batch, pending, pending_rows = pending, [], 0
            checked = validator.submit(_check_batch, batch, hw, aliases)
            replaced = {r.name for r in batch if r.name in previous}
            inflight_names.update(r.name for r in batch)
            inflight.append((batch, writer.submit(write, batch, checked, replaced)))
        settle(keep)

    path_list = [str(p) for p in paths]
    key_list = list(keys) if keys is not None else [file_key(p) for p in path_list]

    def load(i: int) -> _Read | FileReport:
        path, name = path_list[i], key_list[i]
        if name in previous:  # cheap test first: same bytes as last time -> nothing to parse
            try:
                if sha256_bytes(Path(path).read_bytes()) == previous[name]:
                    return _unchanged(name, path)
            except OSError:
                pass  # the reader reports it
        try:
            return _prepare(path, kind, name)
        except FileRejected as err:
            return FileReport(file=name, status="unreadable", message=str(err), error=err, path=path)

    # polars, DuckDB and hashlib release the GIL, so the stages run in parallel; memory stays bounded by
    # the batch size times the batches in flight plus the read-ahead window
    window = 64

    def _run_stages() -> None:
        nonlocal pending_rows
        futures: dict[int, Future] = {}
        with pool, validator, writer:
            try:
                futures.update({i: pool.submit(load, i) for i in range(min(window, len(path_list)))})
                for i in range(len(path_list)):
                    item = futures.pop(i).result()
                    if i + window < len(path_list):
                        futures[i + window] = pool.submit(load, i + window)
                    name = item.file if isinstance(item, FileReport) else item.name
                    if name in inflight_names or any(r.name == name for r in pending):
                        flush(keep=0)  # the same file listed twice: the first copy goes to the store first
                    if isinstance(item, FileReport):
                        emit(item)
                        continue
                    if on_read is not None:
                        on_read(item.name, item.n_rows)
                    if previous.get(item.name) == item.sha:  # e.g. a second copy of a file just written
                        emit(_unchanged(item.name, item.path, item.warnings))
                        continue
                    pending.append(item)
                    pending_rows += item.n_rows
                    if pending_rows >= (max_batch_rows if started else max(1, max_batch_rows // 4)):
                        flush()
                flush(keep=0)
            except BaseException:
                failed.set()  # batches not yet started are not written
                for f in futures.values():
                    f.cancel()
                raise

    # one checkpoint after the commit, none during the call (DuckDB checkpoints when the WAL passes
    # checkpoint_threshold, 16 MiB by default); both settings are restored
    threshold, threads = con.execute(
        "select current_setting('checkpoint_threshold'), current_setting('threads')").fetchone()
    con.execute("SET checkpoint_threshold = '1TiB'")
    con.execute(f"SET threads = {_WRITER_THREADS}")
    try:
        con.execute("BEGIN TRANSACTION")
        try:
            _run_stages()
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    finally:
        con.execute(f"SET checkpoint_threshold = '{threshold}'")
        con.execute(f"SET threads = {threads}")
        if any(r.status not in ("unchanged", "unreadable") for r in reports):
            con.execute("CHECKPOINT")
    position = {name: i for i, name in reversed(list(enumerate(key_list)))}
    return sorted(reports, key=lambda r: position.get(r.file, len(key_list)))  # input order (stable)


def _write_batch(con: duckdb.DuckDBPyConnection, batch: list[_Read], checked: Validated, new_runs: pl.DataFrame,
                 kind: str, strict: bool, replaced: set[str], fail_hook: Callable[[], None] | None
                 ) -> list[FileReport]:
    """Write one validated batch inside the caller's transaction. `replaced` names the batch's files that the
    store already holds (their earlier rows are deleted). `runs` is updated incrementally: the rows of run ids
    new to the store come from `new_runs` (`runs_rows` of the batch's accepted rows); those that had rows
    before (the runs of replaced files) are re-derived from `run_metrics` after the insert. As a run id
    belongs to one file, this gives what a full `rebuild_runs` gives."""
    names = [r.name for r in batch]
    accepted, rejected = checked.accepted, checked.rejected
    ragged = [_ragged_rejections(r) for r in batch if r.short]
    if ragged:
        rejected = pl.concat([rejected, *ragged])
    # a run id belongs to one file: the store's owner wins, then the earlier file of this batch
    clash_found = False
    if accepted.height:
        ids = new_runs.select("run_id", "source_file").unique()
        con.register("_ids", ids.select("run_id").unique().to_arrow())
        owned = con.sql("select distinct m.run_id, m.source_file as owner from run_metrics m join _ids using (run_id)").pl()
        con.unregister("_ids")
        shared = ids.filter(pl.col("run_id").is_duplicated())  # run ids in several files of this batch
    if accepted.height and (owned.height or shared.height):  # else every run id is new and in one file
        order = pl.DataFrame({"source_file": names, "_order": list(range(len(names)))})
        first_in_batch = (ids.join(order, on="source_file").sort("_order").group_by("run_id", maintain_order=True)
                          .first().select("run_id", pl.col("source_file").alias("owner")))
        owners = pl.concat([owned, first_in_batch.join(owned.select("run_id"), on="run_id", how="anti")])
        clash = accepted.join(owners, on="run_id", how="inner").filter(pl.col("owner") != pl.col("source_file"))
        if clash.height:
            clash_found = True
            rejected = pl.concat([rejected, clash.select(
                pl.col("source_file").alias("file"), pl.col("source_line").alias("line"),
                pl.lit("run_id").alias("column"), pl.col("run_id").alias("value"),
                pl.format("run_id already ingested from {}", pl.col("owner")).alias("reason"))])
            accepted = accepted.join(clash.select("source_file", "run_id").unique(), on=["source_file", "run_id"],
                                     how="anti")
    rejected = rejected.sort("file", "line")
    n_acc = dict(accepted.group_by("source_file").len().iter_rows()) if accepted.height else {}
    n_rej = (dict(rejected.group_by("file").agg(pl.col("line").n_unique()).iter_rows()) if rejected.height else {})
    dups = checked.duplicates_by_file or {}
    reports, log_rows, load = [], [], []
    for r in batch:
        if r.error is not None:  # the batch's parse found it unreadable: reported, nothing written
            reports.append(FileReport(file=r.name, status="unreadable", message=str(r.error), error=r.error,
                                      path=r.path))
            continue
        acc, rej = n_acc.get(r.name, 0), n_rej.get(r.name, 0)
        status = "accepted" if rej == 0 else ("partial" if acc else "rejected")
        message = "" if status == "accepted" else f"{rej} row(s) rejected; see rejected_rows"
        if strict and rej:
            status, acc = "rejected", 0
            message = f"{rej} row(s) rejected; the file is not loaded (incoming files are all or nothing)"
        else:
            load.append(r.name)
            log_rows.append((r.name, r.sha, kind, r.n_bytes, r.n_rows + len(r.short), acc, rej,
                             dups.get(r.name, 0), status, message, _now()))
        reports.append(FileReport(
            file=r.name, status=status, rows_total=r.n_rows + len(r.short), rows_accepted=acc,
            rows_rejected=rej, rows_duplicate=dups.get(r.name, 0),
            rejections=rejected.filter(pl.col("file") == r.name) if rej else rejected.clear(),
            message=message, warnings=r.warnings, path=r.path))
    if not load:
        return reports
    files = pl.DataFrame({"name": load})
    if len(load) < len(batch) or clash_found:
        accepted = accepted.filter(pl.col("source_file").is_in(load))
        new_runs = new_runs.join(accepted.select("source_file", "run_id").unique(), on=["source_file", "run_id"],
                                 how="semi")
    rejected = rejected.filter(pl.col("file").is_in(load))
    try:
        con.register("_files", files.to_arrow())
        con.register("_acc", accepted.select("run_id", *[c for c in COLUMNS if c != "run_id"], "source_file",
                                             "source_line").to_arrow())
        # the run ids of the rows a replaced file brought before (a file new to the store has none; a file
        # with rows always has its ingest_log row, written in the same transaction)
        old_ids = pl.DataFrame(schema={"run_id": pl.Utf8})
        if replaced:
            old_ids = con.sql("select distinct run_id from run_metrics "
                              "where source_file in (select name from _files)").pl()
            con.execute("delete from run_metrics where source_file in (select name from _files)")
        con.execute("delete from rejected_rows where file in (select name from _files)")
        con.execute("delete from ingest_log where file in (select name from _files)")
        if accepted.height:
            con.execute(f"insert into run_metrics by name select {', '.join(COLUMNS)}, source_file, source_line "
                        "from _acc")
        if rejected.height:
            con.register("_rej", rejected.to_arrow())
            con.execute('insert into rejected_rows select file, line, "column", value, reason from _rej')
        if fail_hook is not None:
            fail_hook()
        con.register("_log", pl.DataFrame(log_rows, schema=_LOG_SCHEMA, orient="row").to_arrow())
        con.execute("insert into ingest_log select * from _log")
        con.register("_old", old_ids.to_arrow())
        con.register("_new_runs", new_runs.to_arrow())
        _update_runs(con, new_runs="_new_runs", old_ids="_old")
    finally:  # the caller's transaction rolls everything back on a failure
        for view in ("_files", "_acc", "_rej", "_log", "_old", "_new_runs"):
            con.unregister(view)
    return reports


_LOG_SCHEMA = {"file": pl.Utf8, "sha256": pl.Utf8, "kind": pl.Utf8, "n_bytes": pl.Int64, "rows_total": pl.Int64,
               "rows_accepted": pl.Int64, "rows_rejected": pl.Int64, "rows_duplicate": pl.Int64, "status": pl.Utf8,
               "message": pl.Utf8, "ingested_at": pl.Datetime("us")}


def ingest_file(con: duckdb.DuckDBPyConnection, path: str | Path, kind: str = "measurements",
                _fail_after_insert: Callable[[], None] | None = None, *, key: str | None = None,
                strict: bool = False) -> FileReport:
    """Ingest one measurement file in one transaction. Raises FileRejected for whole-file problems
    (the store is untouched); row problems are recorded in `rejected_rows` and reported."""
    rep = ingest_files(con, [path], kind, keys=None if key is None else [key], strict=strict,
                       _fail_after_insert=_fail_after_insert)[0]
    if rep.error is not None:
        raise rep.error
    return rep


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


_RUN_COLS = [c for c in COLUMNS if c not in ("run_id", "metric", "value", "unit", "derived", "notes", "source_ref")]


def _runs_base_sql() -> str:
    """One aggregated row per run of `run_metrics` rows matching `{where}` (a placeholder)."""
    # deterministic aggregates, so that rebuilding from the same rows gives the same table
    firsts = ",\n".join(f"min({c}) as {c}" for c in _RUN_COLS)  # rows of a run agree on non-null values
    firsts += ",\nstring_agg(distinct source_ref, ' | ' order by source_ref) as source_ref"
    pivots = ",\n".join(f"max(value) filter (where metric = '{m}') as {m}" for m in METRIC_COLUMNS)
    return f"""
        select run_id, {firsts}, {pivots},
               min(unit) filter (where metric = 'gpu_hours') as gpu_hours_unit,
               count(*) as n_metrics, bool_or(derived = 'yes') as any_derived,
               min(source_file) as source_file
        from run_metrics {{where}} group by run_id"""


def runs_base(rows: pl.DataFrame) -> pl.DataFrame:
    """`_runs_base_sql` computed by polars over validated rows (run_metrics' columns), one row per
    (source_file, run_id): the same values as the SQL for the rows of one file. Validation guarantees that
    the rows of a run (of one file) agree on every non-null run column, so the SQL's `min` is the first
    non-null value, which polars finds far faster than a string minimum."""
    if rows.height == 0:
        return pl.DataFrame(schema={"run_id": pl.Utf8, **{c: SCHEMA[c] for c in _RUN_COLS}, "source_ref": pl.Utf8,
                                    **{m: pl.Float64 for m in METRIC_COLUMNS}, "gpu_hours_unit": pl.Utf8,
                                    "n_metrics": pl.Int64, "any_derived": pl.Boolean, "source_file": pl.Utf8})
    ref = pl.col("source_ref")
    out = rows.group_by("source_file", "run_id").agg(
        *[pl.col(c).drop_nulls().first() for c in _RUN_COLS],
        ref.min().alias("_ref_min"), ref.max().alias("_ref_max"),
        *[pl.col("value").filter(pl.col("metric") == m).max().alias(m) for m in METRIC_COLUMNS],
        pl.col("unit").filter(pl.col("metric") == "gpu_hours").min().alias("gpu_hours_unit"),
        pl.len().cast(pl.Int64).alias("n_metrics"),
        # bool_or over (derived = 'yes'): null when every derived is null
        pl.when(pl.col("derived").is_not_null().any()).then((pl.col("derived") == "yes").any()).alias("any_derived"),
    )
    # string_agg(distinct source_ref order by source_ref): one value (min = max) is itself; the few runs
    # whose rows cite several references are joined in order
    several = out.filter(pl.col("_ref_min") != pl.col("_ref_max")).select("source_file", "run_id")
    out = out.with_columns(pl.col("_ref_min").alias("source_ref"))
    if several.height:
        joined = rows.join(several, on=["source_file", "run_id"], how="semi").group_by("source_file", "run_id").agg(
            ref.drop_nulls().unique().sort().str.join(" | ").alias("_joined"))
        out = out.join(joined, on=["source_file", "run_id"], how="left").with_columns(
            pl.coalesce("_joined", "source_ref").alias("source_ref"))
    return out.select("run_id", *_RUN_COLS, "source_ref", *METRIC_COLUMNS, "gpu_hours_unit", "n_metrics",
                      "any_derived", "source_file")


def _norm_sql(expr: str, keep_dots: bool = False) -> str:
    """`pipeline.catalog.normalize_name` in SQL: lower case, without spaces, '-', '_', brackets and (unless
    `keep_dots`) '.', a size's decimal point read as 'p' (the regular expressions are catalog's; a DuckDB string
    keeps its backslashes)."""
    if keep_dots:
        return f"regexp_replace(lower(trim({expr})), '{NAME_IGNORED_KEEP_DOTS}', '', 'g')"
    return (f"regexp_replace(regexp_replace(lower(trim({expr})), '{DECIMAL_SIZE}', '\\1p\\2\\3', 'g'), "
            f"'{NAME_IGNORED}', '', 'g')")


def _aliases_sql(keep_dots: bool) -> str:
    """One row per name of an architecture (`alias` = its normalized id, name or alias; `id`): how a run's
    model_name finds its architecture (`DeepSeek-V3`, `deepseekv3` and `DeepSeekV3` alike), first with dots kept
    then without (`catalog.find_architecture`); a key two architectures share is left out, as in
    `catalog.arch_name_keys`."""
    return (f"select alias, min(id) as id from (select {_norm_sql('n', keep_dots)} as alias, id from ("
            "select id, unnest(list_concat([id::varchar, name::varchar], "
            "coalesce(string_split(aliases::varchar, '|'), []))) as n "
            "from architectures)) where alias <> '' group by alias having count(distinct id) = 1")


_ALIASES_SQL = _aliases_sql(False)
#: the architecture id of a run (`b`) from the two alias levels joined as `al1` and `al2`
_ARCH_ID_SQL = "coalesce(al1.id, al2.id)"


def _runs_select(con: duckdb.DuckDBPyConnection, base: str) -> str:
    """The SELECT deriving `runs` rows from `base`, a query of one aggregated row per run (the columns of
    `_runs_base_sql`), filling architecture columns by alias."""
    if not table_exists(con, "architectures"):
        return f"select * from ({base}) order by run_id"
    fill = ",\n".join(f"coalesce(b.{c}, a.{c}) as {c}" for c in ARCH_FILL)
    keep = ", ".join(f"b.{c}" for c in _RUN_COLS + ["source_ref"] + list(METRIC_COLUMNS) + ["gpu_hours_unit", "n_metrics",
                                                                         "any_derived", "source_file"]
                     if c not in ARCH_FILL)
    return f"""
        with base as ({base}),
        alias1 as ({_aliases_sql(True)}),
        alias2 as ({_ALIASES_SQL})
        select b.run_id, {_ARCH_ID_SQL} as arch_id, {fill},
               {', '.join(f'a.{c}' for c in _ARCH_EXTRA)},
               ({' or '.join(f'(b.{c} is null and a.{c} is not null)' for c in ARCH_FILL)}) as arch_filled,
               {keep}
        from base b left join alias1 al1 on al1.alias = {_norm_sql('b.model_name', True)}
        left join alias2 al2 on al2.alias = {_norm_sql('b.model_name')}
        left join architectures a on a.id = {_ARCH_ID_SQL}
        order by b.run_id"""


def _runs_current(con: duckdb.DuckDBPyConnection, select: str) -> bool:
    """Whether `runs` exists with the columns the derivation gives (else only a full rebuild will do)."""
    if not table_exists(con, "runs"):
        return False
    wanted = [d[0] for d in con.execute(select.replace("{where}", "where false")).description]
    return wanted == table_columns(con, "runs")


def rebuild_runs(con: duckdb.DuckDBPyConnection, only: str | None = None) -> None:
    """Derive `runs` (one row per run) from `run_metrics`, filling architecture columns by alias.

    `only` names a table or view with a `run_id` column: then only those runs are rebuilt (deleted, then
    re-derived from their current rows). Falls back to the full rebuild when `runs` is missing or its
    columns differ from what the derivation gives."""
    ensure_schema(con)
    select = _runs_select(con, _runs_base_sql())
    if only is not None and _runs_current(con, select):
        con.execute(f"delete from runs where run_id in (select run_id from {only})")
        con.execute("insert into runs " + select.replace("{where}", f"where run_id in (select run_id from {only})"))
        return
    con.execute("create or replace table runs as " + select.replace("{where}", ""))


def _update_runs(con: duckdb.DuckDBPyConnection, new_runs: str, old_ids: str) -> None:
    """Bring `runs` up to date after a batch (inside its transaction).

    `new_runs` names a table of finished `runs` rows (`runs_rows`) of the batch's accepted rows (now in
    `run_metrics`); `old_ids` a table of the run ids whose rows the batch deleted (those of the files it
    replaces). A run id of `new_runs` not in `old_ids` had no rows in the store before (a run id belongs to
    one file), so its `runs` row is the one given; the runs of `old_ids` are re-derived from `run_metrics`
    (or dropped, when no row of theirs is left)."""
    stored = _runs_select(con, _runs_base_sql())
    if not _runs_current(con, stored):
        con.execute("create or replace table runs as " + stored.replace("{where}", ""))
        return
    n_old = con.execute(f"select count(*) from {old_ids}").fetchone()[0]
    con.execute(f"delete from runs where run_id in (select run_id from {new_runs}"
                + (f" union select run_id from {old_ids})" if n_old else ")"))
    where = f"where run_id not in (select run_id from {old_ids})" if n_old else ""
    con.execute(f"insert into runs by name select * from {new_runs} {where}")
    if n_old:
        con.execute("insert into runs " + stored.replace("{where}", f"where run_id in (select run_id from {old_ids})"))


def arch_aliases(con: duckdb.DuckDBPyConnection) -> pl.DataFrame | None:
    """One row per alias of an architecture (`alias`, `arch_id` and the columns `runs` takes from it), the
    lookup `_runs_select` joins; None when the store has no architectures table."""
    if not table_exists(con, "architectures"):
        return None
    cols = ", ".join(f"a.{c}" for c in [*ARCH_FILL, *_ARCH_EXTRA])
    return con.sql(f"select al.alias, al.level, al.id as arch_id, {cols} from ("
                   f"select *, 1 as level from ({_aliases_sql(True)}) union all "
                   f"select *, 2 as level from ({_ALIASES_SQL})) al join architectures a on a.id = al.id").pl()


def runs_rows(base: pl.DataFrame, aliases: pl.DataFrame | None) -> pl.DataFrame:
    """What `_runs_select` derives from `runs_base` rows, computed by polars (the validation thread) so that
    the writer only inserts them: architecture columns joined by alias, missing shape columns filled from
    it (`arch_filled`). Columns are matched by name when inserted."""
    if aliases is None:
        return base.sort("run_id")
    keys = [aliases.filter(pl.col("level") == lv).select(pl.col("alias").alias("key"), pl.col("arch_id").alias("id"))
            for lv in (1, 2)]
    joined = (ids_by_name(base, pl.col("model_name"), *keys)  # first with dots kept (`catalog.find_architecture`)
              .join(aliases.drop("alias", "level").unique("arch_id"), on="arch_id", how="left", suffix="_a"))
    filled = [(pl.col(c).is_null() & pl.col(f"{c}_a").is_not_null()) for c in ARCH_FILL]
    return joined.with_columns(
        *[pl.coalesce(c, f"{c}_a").alias(c) for c in ARCH_FILL],
        pl.any_horizontal(filled).alias("arch_filled"),
    ).drop([f"{c}_a" for c in ARCH_FILL]).sort("run_id")


# ---------------------------------------------------------------- snapshot and the writer lock

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_tmp(snapshot: Path) -> list[Path]:
    """Remove half-written snapshot copies left by a publisher that was killed (its pid is gone)."""
    removed = []
    for tmp in snapshot.parent.glob(f".{snapshot.name}.*.tmp"):
        try:
            pid = int(tmp.name[len(snapshot.name) + 2:-4])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_snapshot(store: Path, snapshot: Path, holder_pid: int | None = None) -> Path:
    """Copy the checkpointed store beside the snapshot, check the copy, then rename it into place.

    Crash safety: the copy is written to `.<name>.<pid>.tmp` in the snapshot's folder and fsynced; it is
    opened read-only and must hold every main table before `os.replace` swaps it in (atomic on POSIX), and
    the folder is fsynced after. A publisher killed at any point leaves the previous snapshot whole; its
    leftover temp file is removed by the next publish. A reader that has the old snapshot open keeps
    reading the old file (its inode); new readers see the new one. `holder_pid`: see `writer_lock`."""
    store, snapshot = Path(store), Path(snapshot)
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(snapshot)
    # the checkpoint writes the store, and no writer may change it during the copy
    with writer_lock(store, holder_pid=holder_pid):
        _checkpoint_and_copy(store, snapshot)
    return snapshot


def _checkpoint_and_copy(store: Path, snapshot: Path) -> None:
    tmp = snapshot.with_name(f".{snapshot.name}.{os.getpid()}.tmp")
    # the connection stays open during the copy: no other process (a check step of the same run still reading
    # the store) can open the file and change it meanwhile
    try:
        con = connect_waiting(store)
        try:
            con.execute("CHECKPOINT")
            shutil.copyfile(store, tmp)
        finally:
            con.close()
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        check = duckdb.connect(str(tmp), read_only=True)
        try:
            missing = [t for t, n in row_counts(check, ("hardware", "run_metrics", "runs", "ingest_log")).items()
                       if n is None]
        finally:
            check.close()
        if missing:
            raise RuntimeError(f"snapshot copy of {store} lacks table(s) {', '.join(missing)}; not published")
        os.replace(tmp, snapshot)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(snapshot.parent)


class StoreBusy(RuntimeError):
    """Another process holds the store's writer lock."""


#: how long a writer waits for the lock before giving up (env STEPCAST_LOCK_WAIT_S): longer than the usual
#: short holds (`stepcast ingest` of a drop, a snapshot publish: seconds), shorter than a whole build, so a
#: command started during a daemon run says so within half a minute instead of hanging for the run
LOCK_WAIT_S = 30.0

#: locks this process holds: lock path -> [open file, depth]. flock() conflicts between two open files of
#: the same process too, so a nested writer (the build job inside `stepcast build`, the snapshot asset
#: inside a daemon run) re-enters the lock its process already holds instead of waiting on itself
_HELD: dict[str, list] = {}
_HELD_MUTEX = threading.Lock()


def lock_wait_s() -> float:
    return _env_seconds("STEPCAST_LOCK_WAIT_S", LOCK_WAIT_S)


def _lock_fields(lock_path: str | Path) -> dict[str, str]:
    """The `key=value` lines the holder wrote into the lock file (pid, command, since); empty if unreadable."""
    try:
        text = Path(lock_path).read_text(encoding="utf-8").strip()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def lock_holder(lock_path: str | Path) -> str:
    """'pid N, command C, since T' as written by the holder into the lock file ('unknown holder' if unreadable)."""
    fields = _lock_fields(lock_path)
    if not fields.get("pid"):
        return "unknown holder"
    return f"pid {fields['pid']}, command {fields.get('command', '?')!r}, since {fields.get('since', '?')}"


def _holder_pid(lock_path: str | Path) -> int | None:
    """The pid the lock file names (None when it names none)."""
    try:
        return int(_lock_fields(lock_path)["pid"])
    except (KeyError, ValueError):
        return None


def _describe_self() -> str:
    import sys

    cmd = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "python"
    return cmd.replace("\n", " ")[:200]


@contextmanager
def writer_lock(store: str | Path, timeout_s: float | None = None, command: str | None = None,
                holder_pid: int | None = None, on_wait=None):
    """Hold the one-writer lock of a store (`<store>.lock`, an flock released by the OS when the holder
    dies, so a killed writer never leaves a stale lock). Every writer takes it: `stepcast build`, `ingest`,
    `fit`, the snapshot publish and every Dagster run (pipeline.resources.StoreResource). The holder writes
    its pid, command and start time into the lock file; a waiter that gives up after `timeout_s` (default
    `lock_wait_s()`) raises StoreBusy("another process is writing <store> (pid, command, since)").
    Re-entrant within a process. `holder_pid`: the process that started this one holds the lock for it (the
    step processes of `stepcast build`, whose parent holds it for the whole run): when the lock is held and
    its file names that pid, the block runs under that hold instead of waiting for it. `on_wait(message)` is
    called once when the lock is found held and the wait starts."""
    import fcntl

    lock_path = Path(str(store) + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    key = str(lock_path.resolve())
    with _HELD_MUTEX:
        held = _HELD.get(key)
        if held is not None:
            held[1] += 1
    if held is not None:
        try:
            yield lock_path
        finally:
            with _HELD_MUTEX:
                held[1] -= 1
        return
    timeout_s = lock_wait_s() if timeout_s is None else timeout_s
    fh = open(lock_path, "a+")
    deadline = time.monotonic() + timeout_s
    inherited = False
    try:
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if holder_pid and _holder_pid(lock_path) == holder_pid:  # held for this process by its parent
                    inherited = True
                    break
                if on_wait is not None and timeout_s > 0:
                    on_wait(f"another process is writing {store} ({lock_holder(lock_path)}); waiting up to "
                            f"{timeout_s:g} s for it to finish (env STEPCAST_LOCK_WAIT_S)")
                    on_wait = None
                if time.monotonic() >= deadline:
                    raise StoreBusy(f"another process is writing {store} ({lock_holder(lock_path)}); waited "
                                    f"{timeout_s:g} s (env STEPCAST_LOCK_WAIT_S), try again when it has "
                                    f"finished") from None
                time.sleep(0.2)
        if inherited:
            fh.close()
            yield lock_path
            return
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid={os.getpid()}\ncommand={command or _describe_self()}\n"
                 f"since={_now().isoformat(sep=' ')} UTC\n")
        fh.flush()
        with _HELD_MUTEX:
            _HELD[key] = [fh, 1]
        try:
            yield lock_path
        finally:
            with _HELD_MUTEX:
                _HELD.pop(key, None)
            fh.seek(0)
            fh.truncate()  # the lock file names no holder once released
            fh.flush()
    finally:
        fh.close()  # closing the descriptor releases the flock
