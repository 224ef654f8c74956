"""Predict every measured run and summarise the error (pure: DataFrames in, DataFrames out)."""

from __future__ import annotations

import polars as pl

from models.core.params import DEFAULT, PhysParams
from models.core.software import predict_by_preset
from models.corpus.recipes import Recipes
from models.corpus.runs_adapter import configs_from_runs, resolve_unstated
from models.corpus.targets import derive_flop_targets, measured_throughput
from models.physics.hardware import resolve_hardware
from models.physics.step_time import BREAKDOWN, predict

PREDICTION_COLUMNS = (
    "feasible", "error", "step_time_s", "tokens_per_s_per_gpu", "mfu", "hfu", "memory_gb_per_gpu", *BREAKDOWN,
    "params", "model_flops_per_token", "hardware_flops_per_token", "peak_tflops",
)
KEEP_COLUMNS = ("run_id", "source", "gpu", "model_name", "framework", "dtype", "n_gpus", "tp", "pp", "dp", "cp", "ep",
                "vpp", "micro_batch", "global_batch_seqs", "seq_len", "sharding", "recompute", "sequence_parallel",
                "software_preset", "assumptions")


def prepare_configs(runs: pl.DataFrame, hardware: pl.DataFrame,
                    recipes: Recipes) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(predictable configs with recompute resolved, runs that cannot be predicted with `config_error`); `recipes`:
    what the runs' named recipes set (models.corpus.recipes)."""
    hw = resolve_hardware(hardware, strict=False)
    cfg = configs_from_runs(runs, hw, recipes)
    ok = resolve_unstated(cfg.filter(pl.col("config_error").is_null()), predict)
    return ok, cfg.filter(pl.col("config_error").is_not_null())


def predict_runs(runs: pl.DataFrame, hardware: pl.DataFrame, run_metrics: pl.DataFrame, recipes: Recipes,
                 params: PhysParams = DEFAULT, preset_overrides: dict | None = None,
                 prepared: tuple[pl.DataFrame, pl.DataFrame] | None = None) -> pl.DataFrame:
    """One row per run: identifiers, the configuration actually predicted (with its assumptions), the
    analytical prediction and its breakdown, the measured target (throughput; MFU/HFU/TFLOP-only runs converted,
    `target_derived`) and the relative error of throughput. `preset_overrides` ({preset: {field: value}}) are
    fitted per-software-preset values (models.core.software.preset_params). `prepared`: `prepare_configs(runs,
    hardware, recipes)` when the caller has it already."""
    ok, bad_cfg = prepare_configs(runs, hardware, recipes) if prepared is None else prepared
    pred = predict_by_preset(ok, predict, params, overrides=preset_overrides)
    keep = list(KEEP_COLUMNS)
    good = ok.select(keep + ["peak_bf16_tflops"]).hstack(pred.select(PREDICTION_COLUMNS))
    bad = bad_cfg.select(
        *[c for c in keep if c != "recompute"], pl.col("recompute").cast(pl.Utf8),
        pl.lit(False).alias("feasible"), pl.col("config_error").alias("error"))
    out = pl.concat([good, bad], how="diagonal_relaxed")
    target = measured_throughput(run_metrics)
    out = derive_flop_targets(out.join(target, on="run_id", how="left"))
    out = out.with_columns(
        (pl.col("tokens_per_s_per_gpu") / pl.col("measured_tokens_per_s_per_gpu") - 1.0).alias("rel_error"),
        # a measured run is scored whatever the memory model says: it ran
        (pl.col("target_kind").is_not_null() & ~pl.col("whole_run_average").fill_null(False)
         & pl.col("step_time_s").is_not_null()).alias("scored"),
    )
    return out.sort("run_id")


def error_summary(predictions: pl.DataFrame, by: str) -> pl.DataFrame:
    """MdAPE, MAPE, share within ±10% and median signed error of throughput over scored runs, per group
    (`by` = 'source' or 'gpu'), plus an overall row (group 'ALL'). Errors are fractions, not percent."""
    scored = predictions.filter(pl.col("scored"))
    aggs = [
        pl.len().alias("n_runs"),
        pl.col("rel_error").abs().median().alias("mdape"),
        pl.col("rel_error").abs().mean().alias("mape"),
        (pl.col("rel_error").abs() <= 0.10).mean().alias("within_10pct"),
        pl.col("rel_error").median().alias("median_signed_error"),
    ]
    per = scored.group_by(by).agg(aggs).rename({by: "group"}).sort("n_runs", descending=True)
    overall = scored.select(pl.lit("ALL").alias("group"), *aggs)
    return pl.concat([overall, per], how="vertical_relaxed").with_columns(pl.lit(by).alias("grouping"))
