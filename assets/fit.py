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
        "served_fit_version": dg.MetadataValue.text(res["promoted"] or ""),
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


@dg.asset_check(asset=calibrated_predictions, description="Exactly one fit is promoted, and its calibrated "
                                                          "leave-one-source-out MdAPE is no worse than the "
                                                          "analytical model's on the same runs.")
def no_promoted_regression(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    with duckdb.get_connection() as con:
        f = con.sql("select version, mdape, analytical_mdape from fits where promoted").pl()
    if f.height != 1:
        return dg.AssetCheckResult(passed=False, description=f"{f.height} promoted fits (expected 1)")
    c = f.row(0, named=True)
    ok = c["mdape"] is not None and c["analytical_mdape"] is not None and c["mdape"] <= c["analytical_mdape"]
    return dg.AssetCheckResult(passed=bool(ok), description=(
        f"fit {c['version']}: calibrated LOSO MdAPE {c['mdape']} vs analytical {c['analytical_mdape']}"), metadata={
        "version": c["version"], "loso_mdape": c["mdape"], "analytical_loso_mdape": c["analytical_mdape"]})


@dg.asset_check(asset=calibrated_predictions, description="The latest fit was promoted (pipeline/fits.py: not worse "
                                                          "than the served fit on equal terms, new runs not "
                                                          "contradicting it), or a person decided since "
                                                          "(`stepcast fit --promote`). Fails with the reason when "
                                                          "a candidate was refused; the served fit stays.")
def latest_fit_promoted(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    with duckdb.get_connection() as con:
        latest = con.execute("select version, promoted, promotion_reason, n_train, created_at from fits "
                             "order by created_at desc limit 1").fetchone()
        served = con.execute("select version, n_train, promoted_at from fits where promoted "
                             "order by promoted_at desc limit 1").fetchone()
    if latest is None:
        return dg.AssetCheckResult(passed=False, description="no fit stored")
    decided = served is not None and served[2] is not None and served[2] >= latest[4]
    meta = {"latest_version": latest[0], "latest_n_train": latest[3], "reason": latest[2] or "",
            "served_version": served[0] if served else None, "served_n_train": served[1] if served else None}
    if latest[1] or decided:
        return dg.AssetCheckResult(passed=True, description=latest[2] or "", metadata=meta)
    return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR, metadata=meta, description=(
        f"candidate {latest[0]} (n_train {latest[3]}) refused, serving {meta['served_version']}: {latest[2]}"))
