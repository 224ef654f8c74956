"""Calibration: versioned fit (physics + residual model + conformal intervals) and calibrated predictions."""

import dagster as dg
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.ingest import hardware, runs
from pipeline import fits

COVERAGE_BAND = (0.85, 0.95)


@dg.asset(group_name="calibrate", kinds={"duckdb"}, deps=[runs, hardware],
          description="Fits the named physical parameters and a residual regressor on the measured runs, "
                      "validated under transfer protocols (leave one source, hardware generation, architecture "
                      "family, precision out; fit small clusters, score large ones), with conformal 90% intervals; "
                      "stores the version in `fits` / `fit_metrics` / `fit_artifacts` (promotion rule in "
                      "pipeline/fits.py) and writes `calibrated_predictions` with the promoted fit.")
def calibrated_predictions(duckdb: DuckDBResource) -> dg.MaterializeResult:
    with duckdb.get_connection() as con:
        res = fits.run_fit(con)
    f = res["fit"]
    return dg.MaterializeResult(metadata={
        "fit_version": dg.MetadataValue.text(f["version"]),
        "promoted": dg.MetadataValue.bool(bool(f["promoted"])),
        "promotion_reason": dg.MetadataValue.text(f["promotion_reason"] or ""),
        "reused_stored_fit": dg.MetadataValue.bool(res["reused"]),
        "model_kind": dg.MetadataValue.text(f["model_kind"]),
        "loso_mdape": dg.MetadataValue.float(float(f["mdape"])),
        "loso_mdape_analytical": dg.MetadataValue.float(float(f["analytical_mdape"])),
        "loso_coverage_90": dg.MetadataValue.float(float(f["coverage_90"])),
        "n_train": dg.MetadataValue.int(int(f["n_train"])),
        **{f"{r['scheme']}_mdape": dg.MetadataValue.float(float(r["mdape"]))
           for r in res["metrics"].filter((pl.col("grouping") == "source") & (pl.col("group") == "ALL")
                                          & (pl.col("predictor") == "calibrated")).iter_rows(named=True)
           if r["mdape"] is not None},
    })


@dg.asset_check(asset=calibrated_predictions, description="Leave-one-source-out coverage of the promoted fit's "
                                                          "90% intervals is within 0.85-0.95.")
def grouped_coverage_in_band(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    with duckdb.get_connection() as con:
        row = con.execute("select version, coverage_90, loho_coverage_90 from fits where promoted").fetchone()
    if row is None:
        return dg.AssetCheckResult(passed=False, description="no promoted fit")
    ok = row[1] is not None and COVERAGE_BAND[0] <= row[1] <= COVERAGE_BAND[1]
    return dg.AssetCheckResult(passed=bool(ok), metadata={"version": row[0], "loso_coverage_90": row[1],
                                                          "loho_coverage_90": row[2]})


@dg.asset_check(asset=calibrated_predictions, description="The promoted fit is no worse (LOSO MdAPE) than the "
                                                          "analytical model alone and than every fit promoted "
                                                          "before it.")
def no_promoted_regression(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    with duckdb.get_connection() as con:
        f = con.sql("select version, mdape, analytical_mdape, promoted, promoted_at from fits").pl()
    cur = f.filter(pl.col("promoted"))
    if cur.height != 1:
        return dg.AssetCheckResult(passed=False, description=f"{cur.height} promoted fits (expected 1)")
    c = cur.row(0, named=True)
    earlier = f.filter(pl.col("promoted_at").is_not_null() & ~pl.col("promoted"))
    best_before = earlier["mdape"].min() if earlier.height else None
    ok = c["mdape"] <= c["analytical_mdape"] and (best_before is None or c["mdape"] <= best_before + 1e-12)
    return dg.AssetCheckResult(passed=bool(ok), metadata={
        "version": c["version"], "loso_mdape": c["mdape"], "analytical_loso_mdape": c["analytical_mdape"],
        "best_earlier_promoted_mdape": best_before})
