"""What the parts of a million-row ingest cost on their own (issue 7 analysis; prints figures).

    cd /work/main && uv run python benchmarks/ingest_floor.py [--keep DIR]

Uses the files of benchmarks/gen_load.py (1,000 files x 1,000 rows; generated if DIR lacks them) and runs
stepcast's own ingest stages one after another on one thread of control (no overlap), 4 batches of 250
files, timing each: reading and checking the bytes (`_prepare`), the joint parse (`_batch_frame`),
validation, the `runs` rows, DuckDB's inserts (`_write_batch`, all in one transaction as `ingest_files`
does) and the COMMIT. It also times, for comparison, one polars read per file against one joint parse, and
DuckDB alone inserting the same typed rows into `run_metrics` in one transaction versus one transaction per
batch (each commit leaves a partial row group that the next commit or the checkpoint writes again).

From these it prints two ceilings for `benchmarks/bench_ingest.py`: rows / (CPU-seconds / 2 cores), what a
perfect overlap of every stage on the 2-core machine would give, and rows / (DuckDB's serial time), what the
writer thread alone allows even if everything else were free.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import duckdb  # noqa: E402
import polars as pl  # noqa: E402

from gen_load import generate  # noqa: E402
from pipeline import readers, store  # noqa: E402
from pipeline.build import load_reference_tables  # noqa: E402
from pipeline.measurements import COLUMNS, validate  # noqa: E402
from pipeline.settings import Settings  # noqa: E402


class Clock:
    """Wall and process-CPU seconds per named stage (CPU counts every thread, polars' included)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def __call__(self, name: str, fn, *args, **kw):
        w, c = time.perf_counter(), time.process_time()
        out = fn(*args, **kw)
        self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w
        self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c
        return out


def fresh_store(path: Path) -> duckdb.DuckDBPyConnection:
    for f in (path, Path(str(path) + ".wal")):
        f.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    store.ensure_schema(con)
    load_reference_tables(con, Settings.load(store=path))
    con.execute("CHECKPOINT")
    return con


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, default=None, help="folder with (or for) the generated files")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="stepcast-floor-"))
    files = sorted((work / "files").glob("load_*.csv")) if (work / "files").exists() else []
    if len(files) != 1000:
        files = generate(work / "files", 1000, 1000)
    paths = [str(p) for p in files]

    # 1. parsing alone: one polars call per file vs one per 250 files (the bytes already in memory)
    datas = [Path(p).read_bytes() for p in paths]
    t0 = time.process_time()
    for d in datas:
        pl.read_csv(io.BytesIO(d), infer_schema=False)
    per_file = time.process_time() - t0
    t0 = time.process_time()
    for i in range(0, len(paths), 250):
        readers.parse_simple([readers.simple_csv(p, d, ",") for p, d in zip(paths[i:i + 250], datas[i:i + 250])])
    joint = time.process_time() - t0
    del datas
    print(f"parse, CPU-s for the {len(paths):,} files: one polars call per file {per_file:.2f}; byte checks and one "
          f"call per 250 files {joint:.2f}")

    # 2. the ingest's own stages in sequence, the writes in one transaction
    con = fresh_store(work / "floor.duckdb")
    hw, aliases = store.known_hardware(con), store.arch_aliases(con)
    con.execute("SET threads = 1")
    con.execute("SET checkpoint_threshold = '1TiB'")
    clock = Clock()
    typed = []
    con.execute("BEGIN TRANSACTION")
    for i in range(0, len(paths), 250):
        batch = [clock("read and byte checks", store._prepare, p, "measurements", p) for p in paths[i:i + 250]]
        frame, plain = clock("joint parse", store._batch_frame, batch)
        checked = clock("validate", validate, frame, None, hw, blanks_are_spaces=plain)
        new_runs = clock("runs rows", lambda a: store.runs_rows(store.runs_base(a), aliases), checked.accepted)
        clock("DuckDB inserts", store._write_batch, con, batch, checked, new_runs, "measurements", False, set(),
              None)
        typed.append(checked.accepted.select(*COLUMNS, "source_file", "source_line"))
    clock("DuckDB commit + checkpoint", lambda: (con.execute("COMMIT"), con.execute("CHECKPOINT")))
    n_rows = con.execute("select count(*) from run_metrics").fetchone()[0]
    con.close()
    width = max(map(len, clock.wall))
    for name in clock.wall:
        print(f"  {name:<{width}}  wall {clock.wall[name]:5.2f} s   CPU {clock.cpu[name]:5.2f} s")
    cpu = sum(clock.cpu.values())
    duck = clock.wall["DuckDB inserts"] + clock.wall["DuckDB commit + checkpoint"]
    print(f"stages in sequence: {n_rows:,} rows, {sum(clock.wall.values()):.2f} s wall, {cpu:.2f} CPU-s")
    print(f"ceilings on 2 cores: perfect overlap {n_rows / (cpu / 2):,.0f} rows/s; DuckDB's serial writes alone "
          f"({duck:.2f} s) {n_rows / duck:,.0f} rows/s")

    # 3. DuckDB alone, run_metrics only: one transaction vs one per batch
    for label, per_batch in (("one transaction", False), ("one transaction per batch", True)):
        con = fresh_store(work / "floor_db.duckdb")
        con.execute("SET threads = 1")
        con.execute("SET checkpoint_threshold = '1TiB'")
        t0 = time.perf_counter()
        con.execute("BEGIN TRANSACTION")
        for k, part in enumerate(typed):
            con.register("_part", part.to_arrow())
            con.execute("insert into run_metrics select * from _part")
            if per_batch and k < len(typed) - 1:
                con.execute("COMMIT")
                con.execute("BEGIN TRANSACTION")
        con.execute("COMMIT")
        t1 = time.perf_counter()
        con.execute("CHECKPOINT")
        t2 = time.perf_counter()
        size = os.path.getsize(work / "floor_db.duckdb") / 1e6
        con.close()
        print(f"DuckDB alone, run_metrics, 1 thread, {label}: inserts and commits {t1 - t0:.2f} s, final checkpoint "
              f"{t2 - t1:.2f} s -> {n_rows / (t2 - t0):,.0f} rows/s ({size:.0f} MB file)")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
