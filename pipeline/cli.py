"""The `stepcast` command line.

Heavy imports (Dagster, scikit-learn, Altair) happen inside the commands that need them, so `stepcast predict`
and `stepcast search` start quickly.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from pipeline.settings import Settings

app = typer.Typer(
    name="stepcast",
    help=(
        "Predict how long one LLM training step takes on a given cluster and parallel layout, what a run costs, "
        "and where adding accelerators stops paying off.\n\n"
        "Start with `stepcast build` (ingests the shipped measurements into the DuckDB store and publishes a "
        "read-only snapshot), then `stepcast info` to see where everything went."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


class State:
    store: Optional[Path] = None


state = State()


def settings(reports: Optional[Path] = None) -> Settings:
    return Settings.load(store=state.store, reports=reports)


@app.callback()
def main_options(
    store: Optional[Path] = typer.Option(
        None, "--store", envvar="STEPCAST_STORE", metavar="PATH",
        help="DuckDB store the writer uses (default: out/stepcast.duckdb in the project; env STEPCAST_STORE).",
    ),
) -> None:
    state.store = store


# ---------------------------------------------------------------- build

@app.command()
def build(
    reports_dir: Optional[Path] = typer.Option(None, "--reports-dir", metavar="DIR",
                                               help="Where the report site goes (default: <store folder>/site)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the summary."),
) -> None:
    """Run the main job on the embedded store: ingest, predict, checks, publish the read-only snapshot.

    Example: `stepcast build` then `duckdb out/snapshot/stepcast.duckdb -c "select count(*) from runs"`.
    """
    from pipeline.build import run_build

    cfg = settings(reports_dir)
    ok = run_build(cfg, console=console, quiet=quiet)
    raise typer.Exit(0 if ok else 1)


# ---------------------------------------------------------------- ingest

@app.command()
def ingest(
    files: list[Path] = typer.Argument(..., metavar="FILE...", help="CSV or Parquet files in the measurement schema."),
    publish: bool = typer.Option(True, "--publish/--no-publish", help="Publish a fresh snapshot after a change."),
) -> None:
    """Ingest measurement files into the store (same code path as the pipeline).

    Each file is one transaction: a file that cannot be read, or lacks a required column, changes nothing.
    Rows that fail validation go to `rejected_rows`; the command prints file, line, column and reason for each
    and exits with status 1 when anything was rejected. Ingesting the same file twice changes nothing;
    a changed file replaces its earlier rows.

    Example: `stepcast ingest my_runs.csv`
    """
    from pipeline import store
    from pipeline.readers import FileRejected

    cfg = settings()
    con = store.connect(cfg.store)
    failed = False
    changed = False
    try:
        store.ensure_schema(con)
        if not store.table_exists(con, "hardware"):
            from pipeline.build import load_reference_tables

            load_reference_tables(con, cfg)
        for path in files:
            try:
                rep = store.ingest_file(con, path)
            except FileRejected as err:
                failed = True
                print(f"rejected: {err}", file=sys.stderr)
                continue
            for warning in rep.warnings:
                err_console.print(f"[yellow]warning[/yellow] {warning}")
            changed |= rep.status != "unchanged"
            console.print(f"{rep.file}: [bold]{rep.status}[/bold] — {rep.rows_accepted} accepted, "
                          f"{rep.rows_rejected} rejected, {rep.rows_duplicate} duplicate. {rep.message}")
            if rep.rejections is not None and rep.rejections.height:
                failed = True
                for r in rep.rejections.iter_rows(named=True):
                    col = r["column"] or "-"
                    print(f"{r['file']}:{r['line']}: column {col} = {r['value']!r}: {r['reason']}", file=sys.stderr)
    finally:
        con.close()
    if changed and publish:
        store.publish_snapshot(cfg.store, cfg.snapshot)
        console.print(f"snapshot published: {cfg.snapshot}")
    raise typer.Exit(1 if failed else 0)


# ---------------------------------------------------------------- info

@app.command()
def info(fmt: str = typer.Option("table", "--format", "-f", help="table or json")) -> None:
    """Print where the store, snapshot, reports and incoming folder are, and the row counts of the main tables."""
    from pipeline import store

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


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
