"""The report site as an asset: read the tables, hand DataFrames to reports/ (which never touches the store)."""

import time
from pathlib import Path

import dagster as dg
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.curves import CALIBRATION_DEPS, frontier, scaling_curves
from assets.ingest import hardware, runs
from assets.plan import hardware_choice
from assets.predict import analytical_predictions
from assets.publish import SnapshotConfig
from pipeline import store
from pipeline.parallel import shared_executor
from pipeline.resources import MeasurementsResource
from reports.site import build_site

OPTIONAL_TABLES = ("calibrated_predictions", "fits", "fit_metrics", "hardware_choice")


@dg.asset(group_name="reports", kinds={"html"}, deps=[scaling_curves, frontier, analytical_predictions, runs, hardware,
                                                   hardware_choice, *CALIBRATION_DEPS],
          description="Static report site (index, a scaling page per accelerator, calibration, frontier, hardware "
                      "choice for every target run of measurements/target_runs.csv) written to the reports folder "
                      "(`stepcast build --reports-dir`); self-contained HTML that opens offline. Picks up "
                      "`calibrated_predictions`/`fits`/`hardware_choice` when they exist.")
def report_site(context: dg.AssetExecutionContext, duckdb: DuckDBResource, paths: SnapshotConfig,
                measurements: MeasurementsResource) -> dg.MaterializeResult:
    start = time.perf_counter()
    names = ("scaling_curves", "inflection_points", "frontier", "analytical_predictions", "runs", "hardware")
    with duckdb.get_connection() as con:
        tables = {t: con.sql(f'select * from "{t}"').pl() for t in names}
        for t in OPTIONAL_TABLES:
            tables[t] = con.sql(f'select * from "{t}"').pl() if store.table_exists(con, t) else None
    targets = measurements.path("target_runs.csv")
    tables["target_runs"] = pl.read_csv(targets) if targets.exists() else None  # the hardware-choice page's list
    folder = Path(paths.reports) if paths.reports else Path(paths.store).parent / "site"
    files = build_site(folder, tables, executor=shared_executor())  # the build's worker pool, if any
    pages = [f for f in files if f.suffix == ".html"]
    context.log.info(f"report site: {len(pages)} pages in {folder}")
    return dg.MaterializeResult(metadata={
        "path": dg.MetadataValue.path(str(folder)),
        "index": dg.MetadataValue.url((folder / "index.html").as_uri()),
        "pages": dg.MetadataValue.int(len(pages)),
        "files": dg.MetadataValue.md("\n".join(f"- [{f.relative_to(folder)}]({f.as_uri()})" for f in files)),
        "calibrated_shown": dg.MetadataValue.bool(tables["calibrated_predictions"] is not None),
        "seconds": dg.MetadataValue.float(round(time.perf_counter() - start, 2)),
    })
