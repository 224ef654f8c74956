"""What the parts of a million-row ingest cost on their own (issue 7 analysis; prints figures).

    cd /work/main && uv run python benchmarks/ingest_floor.py [--keep DIR]

Uses the files of benchmarks/gen_load.py (1,000 files x 1,000 rows; generated if DIR lacks them) and times,
outside stepcast's ingest path:
  1. parsing: one polars read per file (what the ingest does, to keep per-file line numbers, hashes and
     rejections) vs one multi-file polars scan of all of them;
  2. DuckDB alone: one INSERT of the million rows (already typed) into a fresh store's run_metrics, its COMMIT
     and a CHECKPOINT, with 1 and 2 threads.
Together with `benchmarks/bench_ingest.py` this shows how far the per-file design is from the 200,000 rows/s
target and what a redesign would have to change.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import duckdb  # noqa: E402
import polars as pl  # noqa: E402

from gen_load import generate  # noqa: E402
from pipeline import store  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, default=None, help="folder with (or for) the generated files")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="stepcast-floor-"))
    files = sorted((work / "files").glob("load_*.csv")) if (work / "files").exists() else []
    if len(files) != 1000:
        files = generate(work / "files", 1000, 1000)
    paths = [str(p) for p in files]

    t0 = time.process_time()
    frames = [pl.read_csv(p, infer_schema_length=0) for p in paths]
    per_file_cpu = time.process_time() - t0
    t0 = time.perf_counter()
    scanned = pl.scan_csv(paths, infer_schema_length=0, include_file_paths="_file").collect()
    scan_wall = time.perf_counter() - t0
    print(f"parse: one polars read per file {per_file_cpu:.2f} CPU-s ({per_file_cpu:.2f} ms per file); "
          f"one multi-file scan {scan_wall:.2f} s wall for {scanned.height:,} rows")

    df = pl.concat(frames, how="vertical_relaxed")
    del frames, scanned
    for threads in (1, 2):
        db = work / f"floor{threads}.duckdb"
        for f in (db, Path(str(db) + ".wal")):
            f.unlink(missing_ok=True)
        con = duckdb.connect(str(db))
        con.execute(f"set threads={threads}")
        store.ensure_schema(con)
        con.execute("checkpoint")
        schema = con.execute("select column_name, data_type from information_schema.columns "
                             "where table_name = 'run_metrics' order by ordinal_position").fetchall()

        def expr(c: str, t: str) -> str:
            if c == "source_file":
                return "'bench' as source_file"
            if c == "source_line":
                return "1 as source_line"
            return f'try_cast("{c}" as {t}) as "{c}"' if c in df.columns else f'null::{t} as "{c}"'

        con.register("src", df.select([c for c, _ in schema if c in df.columns]).to_arrow())
        con.execute(f"create temp table staged as select {', '.join(expr(c, t) for c, t in schema)} from src")
        t0 = time.perf_counter()
        con.execute("begin")
        con.execute("insert into run_metrics select * from staged")
        t1 = time.perf_counter()
        con.execute("commit")
        t2 = time.perf_counter()
        con.execute("checkpoint")
        t3 = time.perf_counter()
        con.close()
        print(f"DuckDB alone, {threads} thread(s): insert {t1 - t0:.2f} s, commit {t2 - t1:.2f} s, checkpoint "
              f"{t3 - t2:.2f} s -> {df.height / (t3 - t0):,.0f} rows/s")


if __name__ == "__main__":
    main()
