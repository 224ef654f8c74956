"""`stepcast predict --runs FILE`: predict every run of a measurement-schema file."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline import catalog
from pipeline.measurements import COLUMNS, SCHEMA
from pipeline.readers import FileRejected, read_measurement_file


CALIBRATED_COLUMNS = ["analytical_step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu_lo",
                      "tokens_per_s_per_gpu_hi", "fit_version"]
BREAKDOWN = ["compute_s", "tp_comm_s", "pp_bubble_s", "pp_comm_s", "dp_comm_exposed_s", "cp_comm_s", "ep_comm_s",
             "optimizer_s"]


def calibrate(result: pl.DataFrame, configs: pl.DataFrame, bundle) -> pl.DataFrame:
    """Add the calibrated columns to analytical `result` rows (same order as `configs`).

    With a bundle, rows with a valid analytical prediction get step_time_s / tokens_per_s_per_gpu / mfu from the
    calibrated model, the breakdown scaled proportionally (so the parts still add up to step_time_s), the
    90% interval and fit_version; `analytical_step_time_s` keeps the analytical step (fitted physics). Without a
    bundle (`--analytical-only`, or no promoted fit) analytical_step_time_s = step_time_s and the interval and
    fit_version are null."""
    out = result.with_columns(pl.col("step_time_s").alias("analytical_step_time_s"),
                              *[pl.lit(None, dtype=pl.Float64).alias(c) for c in CALIBRATED_COLUMNS[1:-1]],
                              pl.lit(None, dtype=pl.Utf8).alias("fit_version"))
    if bundle is None:
        return out
    from models.calibration import apply_calibration

    valid = out["step_time_s"].is_not_null().to_numpy()
    if not valid.any():
        return out
    import numpy as np

    idx = np.flatnonzero(valid)
    cal = apply_calibration(bundle, out[idx], configs[idx])
    ratio = cal["step_time_s"].to_numpy() / out["step_time_s"].to_numpy()[idx]
    cols = {}
    for c in ["step_time_s", "tokens_per_s_per_gpu", "mfu"] + BREAKDOWN + CALIBRATED_COLUMNS[1:]:
        if c not in out.columns:
            continue
        col = out[c].to_numpy().copy() if out[c].dtype != pl.Utf8 else np.array(out[c].to_list(), dtype=object)
        if c in ("step_time_s", "tokens_per_s_per_gpu") or c in CALIBRATED_COLUMNS:
            col[idx] = cal[c].to_numpy()
        elif c == "mfu":
            col[idx] = col[idx] / ratio
        else:
            col[idx] = col[idx] * ratio
        cols[c] = pl.Series(c, col, dtype=out[c].dtype)
    return out.with_columns(list(cols.values()))


def predict_file(path: Path, measurements: Path, bundle=None) -> pl.DataFrame:
    """One row per distinct run_id of the file: the analytical prediction or the reason it cannot be made.

    Cells are parsed leniently (a bad number becomes empty and the run says what is missing); only problems
    with the file as a whole raise FileRejected."""
    from models.hardware import resolve_hardware
    from models.runs_adapter import configs_from_runs, predict_by_preset, resolve_recompute
    from models.step_time import predict

    frame = read_measurement_file(path).frame
    if "run_id" not in frame.columns:
        raise FileRejected(str(path), "missing required column run_id", line=1)
    for c in COLUMNS:
        if c not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=pl.Utf8).alias(c))
    typed = frame.select(
        [pl.col(c).str.strip_chars().replace("", None).cast(SCHEMA[c], strict=False).alias(c)
         for c in COLUMNS if c not in ("metric", "value", "unit", "derived", "notes")]
    ).filter(pl.col("run_id").is_not_null())
    runs = typed.group_by("run_id", maintain_order=True).first()
    runs = catalog.fill_from_architectures(runs, measurements)
    hw = resolve_hardware(catalog.hardware(measurements), strict=False)
    cfg = configs_from_runs(runs, hw)
    unknown_gpu = ~cfg["gpu"].is_in(hw["id"].to_list())
    cfg = cfg.with_columns(
        pl.when(pl.Series(unknown_gpu)).then(pl.format("unknown hardware id '{}'", pl.col("gpu")))
        .otherwise(pl.col("config_error")).alias("config_error"))
    ok = cfg.filter(pl.col("config_error").is_null())
    ok = resolve_recompute(ok, predict)
    base, over = (bundle.params, bundle.preset_overrides) if bundle is not None else (None, None)
    good = ok.select("run_id", "software_preset", "assumptions").hstack(predict_by_preset(ok, predict, base, over))
    good = calibrate(good, ok, bundle)
    bad = cfg.filter(pl.col("config_error").is_not_null()).select(
        "run_id", pl.lit(False).alias("feasible"), pl.col("config_error").alias("error"))
    out = pl.concat([good, bad], how="diagonal_relaxed")
    if "fit_version" not in out.columns:
        out = calibrate(out, out, None)
    order = runs.select("run_id").with_row_index("_i")
    return out.join(order, on="run_id").sort("_i").drop("_i")
