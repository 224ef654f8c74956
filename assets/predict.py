"""Analytical predictions for every measured run, with the error by source and by hardware."""

from pathlib import Path

import dagster as dg
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.ingest import hardware, runs
from models.corpus.evaluate import error_summary, predict_runs
from pipeline import store
from pipeline.fits import input_recipes, read_inputs
from pipeline.resources import MeasurementsResource


@dg.asset(group_name="predict", kinds={"duckdb"}, deps=[runs, hardware],
          description="The analytical model (no calibration) on every measured run: prediction, breakdown, "
                      "assumptions made for unstated layout, measured target and error. Also writes "
                      "`analytical_error` (MdAPE/MAPE of throughput by source and by hardware).")
def analytical_predictions(duckdb: DuckDBResource, measurements: MeasurementsResource) -> dg.MaterializeResult:
    with duckdb.get_connection() as con:
        runs_df, hw, metrics = read_inputs(con)
    pred = predict_runs(runs_df, hw, metrics, input_recipes(Path(measurements.root)))
    errors = pl.concat([error_summary(pred, "source"), error_summary(pred, "gpu")])
    with duckdb.get_connection() as con:
        store.replace_table(con, "analytical_predictions", pred)
        store.replace_table(con, "analytical_error", errors)

    def md(frame: pl.DataFrame) -> str:
        lines = ["| group | runs | MdAPE | MAPE | within ±10% | median signed |", "|---|---:|---:|---:|---:|---:|"]
        for r in frame.iter_rows(named=True):
            lines.append(f"| {r['group']} | {r['n_runs']} | {r['mdape']:.1%} | {r['mape']:.1%} | "
                         f"{r['within_10pct']:.0%} | {r['median_signed_error']:+.1%} |")
        return "\n".join(lines)

    overall = errors.filter((pl.col("group") == "ALL") & (pl.col("grouping") == "source")).row(0, named=True)
    return dg.MaterializeResult(metadata={
        "runs_predicted": dg.MetadataValue.int(int(pred["feasible"].fill_null(False).sum())),
        "runs_scored": dg.MetadataValue.int(int(pred["scored"].sum())),
        "mdape": dg.MetadataValue.float(float(overall["mdape"])),
        "mape": dg.MetadataValue.float(float(overall["mape"])),
        "error_by_source": dg.MetadataValue.md(md(errors.filter(pl.col("grouping") == "source"))),
        "error_by_hardware": dg.MetadataValue.md(md(errors.filter(pl.col("grouping") == "gpu"))),
    })
