"""Measured throughput per run: the quantity every prediction is compared with (pure, vectorized).

One target per run, tokens/s per GPU, taken in this order of preference:
1. `step_time_s` with global batch, sequence length and n_gpus: tokens/s/GPU = B·s / (t·N)  (`step_time`)
2. `tokens_per_s_per_gpu` as reported                                                    (`tokens_per_s_per_gpu`)
3. `tokens_per_s` / n_gpus                                                               (`tokens_per_s`)
Rows derived from GPU-hour totals (whole-run averages that include restarts, evaluation and idle time, see
the data card) are flagged `whole_run_average` and excluded from error statistics: they are lower bounds, not
step throughput. MFU-, HFU- and TFLOP/s-only runs need the source's FLOP convention to become a throughput;
`target_kind` is null for them here (the calibration step converts them and flags `target_derived`).
"""

from __future__ import annotations

import polars as pl


def measured_throughput(run_metrics: pl.DataFrame) -> pl.DataFrame:
    """run_metrics (long form: run_id, metric, value, derived, notes, n_gpus, seq_len, global_batch_seqs)
    -> one row per run: run_id, measured_tokens_per_s_per_gpu, measured_step_time_s, target_kind,
    whole_run_average."""
    m = run_metrics.with_columns(
        (pl.col("derived").fill_null("no") == "yes").alias("_derived"),
        pl.col("notes").fill_null("").str.contains("(?i)gpu-hours|chip-hours").alias("_from_hours"),
    )
    per_run = m.group_by("run_id").agg(
        pl.col("value").filter(pl.col("metric") == "step_time_s").first().alias("step_time_s"),
        pl.col("value").filter(pl.col("metric") == "tokens_per_s_per_gpu").first().alias("tps_gpu"),
        pl.col("value").filter(pl.col("metric") == "tokens_per_s").first().alias("tps"),
        (pl.col("_derived") & pl.col("_from_hours") &
         pl.col("metric").is_in(["tokens_per_s_per_gpu", "tokens_per_s"])).any().alias("whole_run_average"),
        pl.col("n_gpus").first(), pl.col("seq_len").first(), pl.col("global_batch_seqs").first(),
    )
    tokens_per_step = pl.col("global_batch_seqs").cast(pl.Float64) * pl.col("seq_len")
    from_step = tokens_per_step / (pl.col("step_time_s") * pl.col("n_gpus"))
    from_tps = pl.col("tps") / pl.col("n_gpus")
    tput = pl.coalesce(from_step, pl.col("tps_gpu"), from_tps)
    kind = (pl.when(from_step.is_not_null()).then(pl.lit("step_time"))
            .when(pl.col("tps_gpu").is_not_null()).then(pl.lit("tokens_per_s_per_gpu"))
            .when(from_tps.is_not_null()).then(pl.lit("tokens_per_s")))
    step = pl.coalesce(pl.col("step_time_s"), tokens_per_step / (tput * pl.col("n_gpus")))
    return per_run.select(
        "run_id",
        tput.alias("measured_tokens_per_s_per_gpu"),
        step.alias("measured_step_time_s"),
        kind.alias("target_kind"),
        "whole_run_average",
    ).sort("run_id")
