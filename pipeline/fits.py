"""Versioned calibration fits in the store: `fits`, `fit_metrics`, `fit_artifacts`, `calibrated_predictions`.

- `fits`: one row per fit version (hash of data + code parameters, models.calibration.fit_version):
  `version, created_at, promoted, promoted_at, model_kind, physical_params` (JSON of the fitted PhysParams),
  `preset_overrides` (JSON), `cv_scheme` ('leave-one-source-out'), `mdape, mape, within_10pct, coverage_90,
  median_width` (fractions, of the calibrated predictions under that scheme), `analytical_mdape`,
  `physics_mdape`, `loho_mdape, loho_coverage_90`, `kappa, q`, `n_train, n_sources, n_hardware`,
  `features, hyperparameters` (JSON), `code_version`, `promotion_reason`.
- `fit_metrics`: per version x scheme (loso, loho, vtrain_multi_lomso) x grouping x group x predictor
  (analytical, physics, ridge, gbm, calibrated): n_runs, mdape, mape, within_10pct, coverage_90, median_width.
- `fit_artifacts`: version, format ('pickle'), sklearn_version, n_bytes, bytes (BLOB): the serialized
  models.calibration.CalibrationBundle. It is unpickled only from this store (a file we wrote).
- `calibrated_predictions`: per measured run, predictions of the promoted fit (see `calibrated_frame`).

Promotion: a new version is promoted when nothing is promoted yet, or when its leave-one-source-out MdAPE is
not worse than the promoted fit's; otherwise it is kept with `promoted = false` and the reason. Re-fitting the
same data gives the same version: the stored row is reused, nothing is duplicated.
"""

from __future__ import annotations

import datetime as dt
import json
import pickle

import duckdb
import polars as pl

from pipeline import store

CV_SCHEME = "leave-one-source-out"


def _ensure(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("""CREATE TABLE IF NOT EXISTS fits (
        version VARCHAR PRIMARY KEY, created_at TIMESTAMP, promoted BOOLEAN, promoted_at TIMESTAMP,
        model_kind VARCHAR, physical_params VARCHAR, preset_overrides VARCHAR, cv_scheme VARCHAR,
        mdape DOUBLE, mape DOUBLE, within_10pct DOUBLE, coverage_90 DOUBLE, median_width DOUBLE,
        analytical_mdape DOUBLE, physics_mdape DOUBLE, loho_mdape DOUBLE, loho_coverage_90 DOUBLE,
        kappa DOUBLE, q DOUBLE, n_train BIGINT, n_sources BIGINT, n_hardware BIGINT, features VARCHAR,
        hyperparameters VARCHAR, code_version VARCHAR, promotion_reason VARCHAR)""")
    con.execute("""CREATE TABLE IF NOT EXISTS fit_metrics (
        version VARCHAR, scheme VARCHAR, grouping VARCHAR, "group" VARCHAR, predictor VARCHAR, n_runs BIGINT,
        mdape DOUBLE, mape DOUBLE, within_10pct DOUBLE, coverage_90 DOUBLE, median_width DOUBLE)""")
    con.execute("""CREATE TABLE IF NOT EXISTS fit_artifacts (
        version VARCHAR PRIMARY KEY, format VARCHAR, sklearn_version VARCHAR, n_bytes BIGINT, bytes BLOB)""")


def load_fit(con: duckdb.DuckDBPyConnection, version: str):
    if not store.table_exists(con, "fit_artifacts"):
        return None
    row = con.execute("select bytes from fit_artifacts where version = ?", [version]).fetchone()
    return pickle.loads(row[0]) if row else None


def load_promoted_fit(con: duckdb.DuckDBPyConnection):
    """The promoted models.calibration.CalibrationBundle of a store or snapshot, or None if there is none.
    `bundle.params` are the fitted PhysParams (`bundle.params_for(preset)` for a software preset)."""
    if not (store.table_exists(con, "fits") and store.table_exists(con, "fit_artifacts")):
        return None
    row = con.execute("select version from fits where promoted order by promoted_at desc limit 1").fetchone()
    return load_fit(con, row[0]) if row else None


def fit_summary(bundle, report, data) -> dict:
    from models.calibration import FIT_CODE_VERSION, HYPER
    from models.features import FEATURE_NAMES

    m = report["metrics"]

    def pick(scheme, predictor, col):
        r = m.filter((pl.col("scheme") == scheme) & (pl.col("grouping") == "source") & (pl.col("group") == "ALL")
                     & (pl.col("predictor") == predictor))
        return float(r[col][0]) if r.height and r[col][0] is not None else None

    return {
        "version": bundle.version, "model_kind": bundle.model_kind,
        "physical_params": json.dumps(bundle.params.to_dict(), sort_keys=True),
        "preset_overrides": json.dumps(bundle.preset_overrides, sort_keys=True), "cv_scheme": CV_SCHEME,
        "mdape": pick("loso", "calibrated", "mdape"), "mape": pick("loso", "calibrated", "mape"),
        "within_10pct": pick("loso", "calibrated", "within_10pct"),
        "coverage_90": pick("loso", "calibrated", "coverage_90"),
        "median_width": pick("loso", "calibrated", "median_width"),
        "analytical_mdape": pick("loso", "analytical", "mdape"), "physics_mdape": pick("loso", "physics", "mdape"),
        "loho_mdape": pick("loho", "calibrated", "mdape"), "loho_coverage_90": pick("loho", "calibrated",
                                                                                     "coverage_90"),
        "kappa": float(bundle.kappa), "q": float(bundle.q), "n_train": data.configs.height,
        "n_sources": int(data.configs["source"].n_unique()), "n_hardware": int(data.configs["gpu"].n_unique()),
        "features": json.dumps(list(FEATURE_NAMES)), "hyperparameters": json.dumps(HYPER, sort_keys=True),
        "code_version": FIT_CODE_VERSION,
    }


def save_fit(con: duckdb.DuckDBPyConnection, bundle, report, data, now: dt.datetime | None = None) -> dict:
    """Store a fit (row, per-group metrics, artifact) and apply the promotion rule, in one transaction.
    Returns the stored `fits` row as a dict."""
    import sklearn

    _ensure(con)
    now = now or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    row = fit_summary(bundle, report, data)
    existing = con.execute("select version from fits where version = ?", [row["version"]]).fetchone()
    if existing:
        return stored_fit(con, row["version"])
    cur = con.execute("select version, mdape from fits where promoted order by promoted_at desc limit 1").fetchone()
    if cur is None:
        promote, reason = True, "first fit"
    elif row["mdape"] is not None and row["mdape"] <= cur[1] + 1e-12:
        promote, reason = True, f"LOSO MdAPE {row['mdape']:.4f} <= promoted {cur[0]} {cur[1]:.4f}"
    else:
        promote, reason = False, (f"not promoted: LOSO MdAPE {row['mdape']:.4f} worse than promoted {cur[0]} "
                                  f"{cur[1]:.4f}")
    blob = pickle.dumps(bundle, protocol=pickle.HIGHEST_PROTOCOL)
    metrics = report["metrics"].with_columns(pl.lit(row["version"]).alias("version")).select(
        "version", "scheme", "grouping", "group", "predictor", "n_runs", "mdape", "mape", "within_10pct",
        "coverage_90", "median_width")
    con.execute("BEGIN TRANSACTION")
    try:
        if promote:
            con.execute("update fits set promoted = false where promoted")
        cols = ["version", "created_at", "promoted", "promoted_at"] + [k for k in row if k != "version"] + [
            "promotion_reason"]
        vals = [row["version"], now, promote, now if promote else None] + [row[k] for k in row if k != "version"] + [
            reason]
        con.execute(f"insert into fits ({', '.join(cols)}) values ({', '.join('?' * len(cols))})", vals)
        con.register("_fm", metrics.to_arrow())
        con.execute("insert into fit_metrics select * from _fm")
        con.unregister("_fm")
        con.execute("insert into fit_artifacts values (?, 'pickle', ?, ?, ?)",
                    [row["version"], sklearn.__version__, len(blob), blob])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return stored_fit(con, row["version"])


def stored_fit(con: duckdb.DuckDBPyConnection, version: str) -> dict:
    cur = con.execute("select * from fits where version = ?", [version])
    names = [d[0] for d in cur.description]
    return dict(zip(names, cur.fetchone()))


def read_inputs(con: duckdb.DuckDBPyConnection) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    runs = con.sql("select * from runs").pl()
    hw = con.sql("select * from hardware").pl()
    metrics = con.sql("select run_id, metric, value, derived, notes, n_gpus, seq_len, global_batch_seqs "
                      "from run_metrics").pl()
    return runs, hw, metrics


def run_fit(con: duckdb.DuckDBPyConnection, protocols=None, force: bool = False) -> dict:
    """Fit on the store's runs (unless this exact version is already stored and `force` is False), store it,
    rewrite `calibrated_predictions` with the promoted fit. Returns {'fit': row, 'reused': bool,
    'metrics': fit_metrics rows of this version}."""
    from models import calibration as cal
    from models.evaluate import predict_runs, prepare_configs

    protocols = tuple(protocols or cal.PROTOCOLS)
    runs, hw, metrics = read_inputs(con)
    ok, _ = prepare_configs(runs, hw)
    targets = predict_runs(runs, hw, metrics)
    data = cal.fit_data(ok, targets.select("run_id", "measured_tokens_per_s_per_gpu", "whole_run_average"))
    version = cal.fit_version(data)
    _ensure(con)
    reused = bool(con.execute("select count(*) from fits where version = ?", [version]).fetchone()[0]) and not force
    if not reused:
        from pipeline.parallel import pool_map

        bundle, report = cal.fit_calibration(data, protocols=protocols, map_fn=pool_map)
        if con.execute("select count(*) from fits where version = ?", [version]).fetchone()[0]:
            con.execute("delete from fit_metrics where version = ?", [version])
            con.register("_fm", report["metrics"].with_columns(pl.lit(version).alias("version")).select(
                "version", "scheme", "grouping", "group", "predictor", "n_runs", "mdape", "mape", "within_10pct",
                "coverage_90", "median_width").to_arrow())
            con.execute("insert into fit_metrics select * from _fm")
            con.unregister("_fm")
        else:
            save_fit(con, bundle, report, data)
        oof = report["oof"]
    else:
        oof = None
    promoted = load_promoted_fit(con)
    frame = calibrated_frame(promoted, ok, targets, oof if promoted is not None and promoted.version == version
                             else None)
    store.replace_table(con, "calibrated_predictions", frame)
    fm = con.execute("select * from fit_metrics where version = ?", [version]).pl()
    return {"fit": stored_fit(con, version), "reused": reused, "metrics": fm, "promoted": promoted.version
            if promoted is not None else None}


def calibrated_frame(bundle, configs: pl.DataFrame, targets: pl.DataFrame, oof: pl.DataFrame | None) -> pl.DataFrame:
    """One row per predictable measured run: analytical (prior physics), physics (fitted), calibrated with its
    90% interval, the measured target and the error; `loso_*` = the out-of-source prediction of the same fit
    (the honest number for runs like these from a source the fit has not seen)."""
    from models.predictor import predict

    base = targets.select("run_id", "source", "gpu", pl.col("step_time_s").alias("analytical_step_time_s"),
                          pl.col("tokens_per_s_per_gpu").alias("analytical_tokens_per_s_per_gpu"),
                          "measured_tokens_per_s_per_gpu", "measured_step_time_s", "target_kind",
                          pl.col("target_derived").fill_null(False), pl.col("whole_run_average").fill_null(False))
    if bundle is None:
        return base.with_columns(pl.lit(None, dtype=pl.Utf8).alias("fit_version"))
    res = predict(configs, bundle)  # the one prediction function, as every command serves it
    valid = res["step_time_s"].is_not_null()
    cal = res.filter(valid)
    out = configs.filter(valid).select("run_id").hstack(cal.select(
        pl.col("analytical_step_time_s").alias("physics_step_time_s"), "feasible", "step_time_s", "step_time_lo_s",
        "step_time_hi_s", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi",
        "fit_version", "calibration_domain"))
    out = base.join(out, on="run_id", how="inner")
    if oof is not None:
        out = out.join(oof, on="run_id", how="left")
    return out.with_columns(
        (pl.col("tokens_per_s_per_gpu") / pl.col("measured_tokens_per_s_per_gpu") - 1.0).alias("rel_error"),
        ((pl.col("measured_tokens_per_s_per_gpu") >= pl.col("tokens_per_s_per_gpu_lo"))
         & (pl.col("measured_tokens_per_s_per_gpu") <= pl.col("tokens_per_s_per_gpu_hi"))).alias("covered"),
    ).sort("run_id")
