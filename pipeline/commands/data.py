"""`stepcast build`, `stepcast ingest` and `stepcast info`: fill the store and say where everything is."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from pipeline.commands.common import builder, console, err_console, fail, settings, store_modules


def build(
    reports_dir: Optional[Path] = typer.Option(None, "--reports-dir", metavar="DIR",
                                               help="Where the report site goes (default: <store folder>/site)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the summary."),
    wait_s: Optional[float] = typer.Option(
        None, "--wait", min=0, metavar="SECONDS",
        help="How long to wait for a store held by another writer or open in another program, saying so, before "
             "stopping with one line naming the holder (default: 30 s, env STEPCAST_LOCK_WAIT_S)."),
) -> None:
    """Run the main job on the embedded store: ingest, predict, checks, publish the read-only snapshot.

    Example: `stepcast build` then `duckdb out/snapshot/stepcast.duckdb -c "select count(*) from runs"`.
    """
    cfg = settings(reports_dir)
    ok = builder().run_build(cfg, console=console, quiet=quiet, wait_s=wait_s)
    raise typer.Exit(0 if ok else 1)


def ingest(
    files: list[Path] = typer.Argument(..., metavar="FILE...", help="Measurement-schema files: CSV, TSV, Parquet, JSON, JSON Lines or a Markdown table."),
    publish: bool = typer.Option(True, "--publish/--no-publish", help="Publish a fresh snapshot after a change."),
    batch_rows: int = typer.Option(250_000, "--batch-rows", min=1, metavar="N",
                                   help="Rows parsed, validated and inserted at a time when ingesting many files "
                                        "(bounds memory; the whole command is one transaction)."),
) -> None:
    """Ingest measurement files into the store (same code path as the pipeline).

    A file that cannot be read, or lacks a required column, changes nothing. Rows that fail validation go to
    `rejected_rows`; the command prints file, line, column and reason for each and exits with status 1 when
    anything was rejected. Ingesting the same file twice changes nothing; a changed file replaces its earlier
    rows. Many files are read ahead in parallel and written in batches of about `--batch-rows` rows (one
    update of `runs` per batch), all in one transaction: a failure while writing leaves the store as it was
    before the command. A progress bar shows files and rows.

    Example: `stepcast ingest my_runs.csv` or `stepcast ingest drop/*.csv`
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # ~25 ms

    _, store = store_modules()
    cfg = settings()
    failed = False
    changed = False
    # the waits are said on a terminal only: a script sees the one line that ends them, or nothing
    say = (lambda message: print(message, file=sys.stderr, flush=True)) if err_console.is_terminal else None
    lock = store.writer_lock(cfg.store, on_wait=say)
    try:
        lock.__enter__()
    except store.StoreBusy as err:
        fail(str(err), 1)
    try:
        con = store.connect_waiting(cfg.store, on_wait=say)  # a program outside stepcast may have it open
    except store.StoreBusy as err:
        lock.__exit__(None, None, None)
        fail(str(err), 1)
    try:
        store.ensure_schema(con)
        if not store.table_exists(con, "hardware"):
            builder().load_reference_tables(con, cfg)
        show = len(files) > 1 and err_console.is_terminal
        rows = {"n": 0}
        with Progress(TextColumn("ingest"), BarColumn(), MofNCompleteColumn(), TextColumn("files"),
                      TextColumn("{task.fields[rows]:,} rows read"), TimeElapsedColumn(), console=err_console,
                      disable=not show, transient=True) as progress:
            task = progress.add_task("ingest", total=len(files), rows=0)

            def on_read(_name: str, n: int) -> None:
                rows["n"] += n
                progress.update(task, rows=rows["n"])

            def on_file(rep) -> None:
                progress.advance(task)
                nonlocal failed, changed
                if rep.error is not None:
                    failed = True
                    print(f"rejected: {rep.error}", file=sys.stderr)
                    return
                for warning in rep.warnings:
                    progress.console.print(f"[yellow]warning[/yellow] {warning}")
                changed |= rep.status != "unchanged"
                console.print(f"{rep.file}: [bold]{rep.status}[/bold] — {rep.rows_accepted} accepted, "
                              f"{rep.rows_rejected} rejected, {rep.rows_duplicate} duplicate. {rep.message}")
                if rep.rejections is not None and rep.rejections.height:
                    failed = True
                    for r in rep.rejections.iter_rows(named=True):
                        col = r["column"] or "-"
                        print(f"{r['file']}:{r['line']}: column {col} = {r['value']!r}: {r['reason']}",
                              file=sys.stderr)

            store.ingest_files(con, files, max_batch_rows=batch_rows, on_read=on_read, on_file=on_file)
    finally:
        con.close()
        lock.__exit__(None, None, None)
    if changed and publish:
        try:
            store.publish_snapshot(cfg.store, cfg.snapshot)
        except store.StoreBusy as err:
            fail(f"ingested, but the snapshot was not published: {err}", 1)
        console.print(f"snapshot published: {cfg.snapshot}")
    raise typer.Exit(1 if failed else 0)


def info(fmt: str = typer.Option("table", "--format", "-f", help="table or json")) -> None:
    """Print where the store, snapshot, reports and incoming folder are, the row counts of the main tables,
    the served (promoted) calibration fit and the latest candidate fit with the promotion decision's reason."""
    fits, store = store_modules()
    cfg = settings()
    out: dict = {
        "store": str(cfg.store), "snapshot": str(cfg.snapshot), "reports": str(cfg.reports),
        "incoming": str(cfg.incoming), "measurements": str(cfg.measurements),
        "store_exists": cfg.store.exists(), "snapshot_exists": cfg.snapshot.exists(), "tables": {},
    }
    source = cfg.store if cfg.store.exists() else cfg.snapshot if cfg.snapshot.exists() else None
    if source is not None:
        try:
            con = store.connect(source, read_only=True)
        except Exception:  # noqa: BLE001 - the writer holds the lock: read the snapshot instead
            source = cfg.snapshot if cfg.snapshot.exists() else None
            con = store.connect(source, read_only=True) if source else None
        if con is not None:
            try:
                out["tables"] = {k: v for k, v in store.row_counts(con).items() if v is not None}
                out["fits"] = fits.fit_status(con)
            finally:
                con.close()
    out["counted_from"] = str(source) if source else None
    if fmt == "json":
        print(json.dumps(out, indent=2))
        return
    if fmt != "table":
        raise typer.BadParameter("expected table or json", param_hint="--format")
    t = Table(show_header=False, box=None)
    for key in ("store", "snapshot", "reports", "incoming", "measurements"):
        t.add_row(key, out[key])
    console.print(t)
    if out["tables"]:
        counts = Table("table", "rows", title=f"row counts ({out['counted_from']})")
        for name, n in out["tables"].items():
            counts.add_row(name, f"{n:,}")
        console.print(counts)
    else:
        console.print("no store yet: run `stepcast build`")
    for role in ("served", "latest"):
        f = (out.get("fits") or {}).get(role)
        if f is None:
            continue
        state = "promoted" if f["promoted"] else "NOT promoted"
        label = "served fit" if role == "served" else "latest candidate"
        console.print(f"{label}: {f['version']} (n_train {f['n_train']}, created {f['created_at']}, {state}): "
                      f"{f['promotion_reason']}", highlight=False)
