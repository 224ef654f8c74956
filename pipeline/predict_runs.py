"""`stepcast predict --runs FILE`: predict every run of a measurement-schema file."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline import catalog
from pipeline.measurements import COLUMNS, SCHEMA
from pipeline.readers import FileRejected, read_measurement_file


def predict_file(path: Path, measurements: Path) -> pl.DataFrame:
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
    good = ok.select("run_id", "software_preset", "assumptions").hstack(predict_by_preset(ok, predict))
    bad = cfg.filter(pl.col("config_error").is_not_null()).select(
        "run_id", pl.lit(False).alias("feasible"), pl.col("config_error").alias("error"))
    out = pl.concat([good, bad], how="diagonal_relaxed")
    order = runs.select("run_id").with_row_index("_i")
    return out.join(order, on="run_id").sort("_i").drop("_i")
