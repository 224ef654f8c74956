"""Load benchmark of measurement ingest: many files, a million rows, bounded memory.

    cd /work/main && uv run python benchmarks/bench_ingest.py [--files 1000] [--rows-per-file 1000] [--keep DIR]

Generates the files with benchmarks/gen_load.py (1,000 files x 1,000 rows by default) in a temporary folder,
creates a fresh store with the reference tables, then ingests every file the way `stepcast ingest` does
(`store.ingest_files`: batches of about 250,000 rows, each parsed in one polars call and validated at once,
with one incremental `runs` update per batch, reading / parsing and validation / inserting overlapped on
threads, the whole call one transaction, one checkpoint at the end). Prints rows/s for
the ingest (everything, the final checkpoint included), checks that the incremental `runs` equals a full
`rebuild_runs` (rows differing, both ways, must be 0), the time of a second pass over the same files (all
`unchanged`), and the peak resident memory of the process (ru_maxrss).
Targets from issue 7: >= 200,000 rows/s and < 2 GB peak. benchmarks/ingest_floor.py times the stages alone.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import duckdb  # noqa: E402

from gen_load import generate  # noqa: E402
from pipeline import store  # noqa: E402
from pipeline.build import load_reference_tables  # noqa: E402
from pipeline.settings import Settings  # noqa: E402


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--rows-per-file", type=int, default=1000)
    ap.add_argument("--batch-rows", type=int, default=250_000)
    ap.add_argument("--keep", type=Path, default=None, help="generate into this folder and keep it")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="stepcast-bench-"))
    files_dir = work / "files"
    t0 = time.perf_counter()
    paths = sorted(files_dir.glob("load_*.csv")) if files_dir.exists() else []
    if len(paths) != args.files:
        paths = generate(files_dir, args.files, args.rows_per_file)
    print(f"files: {len(paths)} in {files_dir} (ready in {time.perf_counter() - t0:.1f} s); "
          f"rss before ingest {peak_rss_mb():.0f} MB")
    db = work / "bench.duckdb"
    db.unlink(missing_ok=True)
    con = duckdb.connect(str(db))
    store.ensure_schema(con)
    load_reference_tables(con, Settings.load(store=db))
    t0 = time.perf_counter()
    reports = store.ingest_files(con, paths, max_batch_rows=args.batch_rows)
    t_ingest = time.perf_counter() - t0
    rows = sum(r.rows_accepted for r in reports)
    bad = [r for r in reports if r.status != "accepted"]
    n_stored = con.execute("select count(*) from run_metrics").fetchone()[0]
    # the incremental `runs` (one update per batch) must equal a full rebuild from run_metrics
    con.execute("create temp table _runs_incremental as select * from runs")
    store.rebuild_runs(con)
    n_diff = con.execute("""select count(*) from ((select * from _runs_incremental except all select * from runs)
                            union all (select * from runs except all select * from _runs_incremental))""").fetchone()[0]
    n_runs = con.execute("select count(*) from runs").fetchone()[0]
    t0 = time.perf_counter()
    again = store.ingest_files(con, paths, max_batch_rows=args.batch_rows)
    t_again = time.perf_counter() - t0
    con.close()
    print(f"ingest: {len(paths)} files, {rows:,} rows accepted in {t_ingest:.2f} s = {rows / t_ingest:,.0f} rows/s "
          f"(files not accepted: {len(bad)}; run_metrics rows stored: {n_stored:,})")
    print(f"runs: {n_runs:,} rows; rows differing from a full rebuild_runs: {n_diff}")
    print(f"second pass (unchanged check, every file re-read and hashed): {t_again:.2f} s, "
          f"{sum(r.status == 'unchanged' for r in again)} unchanged")
    print(f"peak memory (ru_maxrss): {peak_rss_mb():.0f} MB")
    if n_diff:
        sys.exit(f"the incremental runs table differs from a full rebuild in {n_diff} row(s)")


if __name__ == "__main__":
    main()
