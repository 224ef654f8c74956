"""Measured throughput per run: the quantity every prediction is compared with (pure, vectorized).

One target per run, tokens/s per GPU, taken in this order of preference:
1. `step_time_s` with global batch, sequence length and n_gpus: tokens/s/GPU = B·s / (t·N)  (`step_time`)
2. `tokens_per_s_per_gpu` as reported                                                    (`tokens_per_s_per_gpu`)
3. `tokens_per_s` / n_gpus                                                               (`tokens_per_s`)
Rows derived from GPU-hour totals (whole-run averages that include restarts, evaluation and idle time, see
the data card) are flagged `whole_run_average` and excluded from error statistics: they are lower bounds, not
step throughput. MFU-, HFU- and TFLOP/s-only runs need the source's FLOP convention to become a throughput;
`target_kind` is null for them here; `derive_flop_targets` converts them (flagged `target_derived`):

| metric | source convention (data card) | tokens/s/GPU |
|---|---|---|
| `model_tflops_per_gpu` | the source's model FLOPs, recompute excluded; for the GPT-style models of these sources it equals the stepcast convention (Narayanan eq. 3 without recompute = Korthikanti's 72Bslh²(1+s/6h+V/12lh), docs/model.md) | TFLOP/s·1e12 / stepcast model FLOPs per token |
| `mfu` | model FLOPs / (n_gpus × dense BF16 peak) (data card: "usually the dense BF16 peak") | mfu · peak_bf16 · 1e12 / stepcast model FLOPs per token |
| `hfu` | hardware FLOPs incl. recompute / (n_gpus × BF16 peak) | hfu · peak_bf16 · 1e12 / stepcast hardware FLOPs per token (recompute of the run) |

Preference among them: model TFLOP/s, then MFU, then HFU (fewest convention assumptions first).
"""

from __future__ import annotations

import polars as pl


def measured_throughput(run_metrics: pl.DataFrame) -> pl.DataFrame:
    """run_metrics (long form: run_id, metric, value, derived, notes, n_gpus, seq_len, global_batch_seqs)
    -> one row per run: run_id, measured_tokens_per_s_per_gpu, measured_step_time_s, target_kind,
    whole_run_average, measured_model_tflops_per_gpu, measured_mfu, measured_hfu."""
    m = run_metrics.with_columns(
        (pl.col("derived").fill_null("no") == "yes").alias("_derived"),
        pl.col("notes").fill_null("").str.contains("(?i)gpu-hours|chip-hours").alias("_from_hours"),
    )
    per_run = m.group_by("run_id").agg(
        pl.col("value").filter(pl.col("metric") == "step_time_s").first().alias("step_time_s"),
        pl.col("value").filter(pl.col("metric") == "tokens_per_s_per_gpu").first().alias("tps_gpu"),
        pl.col("value").filter(pl.col("metric") == "tokens_per_s").first().alias("tps"),
        pl.col("value").filter(pl.col("metric") == "model_tflops_per_gpu").first().alias("model_tflops_per_gpu"),
        pl.col("value").filter(pl.col("metric") == "mfu").first().alias("mfu"),
        pl.col("value").filter(pl.col("metric") == "hfu").first().alias("hfu"),
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
        # the measured figures get their own names: a prediction table joined with this one has its own mfu/hfu
        pl.col("model_tflops_per_gpu").alias("measured_model_tflops_per_gpu"), pl.col("mfu").alias("measured_mfu"),
        pl.col("hfu").alias("measured_hfu"),
    ).sort("run_id")


def derive_flop_targets(table: pl.DataFrame) -> pl.DataFrame:
    """Fill the throughput target of runs that report only model TFLOP/s, MFU or HFU.

    `table`: `measured_throughput` columns joined with the run's analytical prediction
    (`model_flops_per_token`, `hardware_flops_per_token`, `peak_bf16_tflops`, `n_gpus`, `seq_len`,
    `global_batch_seqs`). Adds `target_derived` (True where converted) and sets `target_kind` to
    `model_tflops`, `mfu` or `hfu` for them (conventions in the module docstring)."""
    need = table["measured_tokens_per_s_per_gpu"].is_null()
    per_tflops = 1e12 / pl.col("model_flops_per_token")
    tput = pl.coalesce(
        pl.col("measured_model_tflops_per_gpu") * per_tflops,
        pl.col("measured_mfu") * pl.col("peak_bf16_tflops") * per_tflops,
        pl.col("measured_hfu") * pl.col("peak_bf16_tflops") * 1e12 / pl.col("hardware_flops_per_token"),
    )
    kind = (pl.when(pl.col("measured_model_tflops_per_gpu").is_not_null()).then(pl.lit("model_tflops"))
            .when(pl.col("measured_mfu").is_not_null() & pl.col("peak_bf16_tflops").is_not_null()).then(pl.lit("mfu"))
            .when(pl.col("measured_hfu").is_not_null() & pl.col("peak_bf16_tflops").is_not_null())
            .then(pl.lit("hfu")))
    tokens_per_step = pl.col("global_batch_seqs").cast(pl.Float64) * pl.col("seq_len")
    return table.with_columns(
        pl.Series("_need", need),
    ).with_columns(
        pl.when(pl.col("_need")).then(tput).otherwise(pl.col("measured_tokens_per_s_per_gpu"))
        .alias("measured_tokens_per_s_per_gpu"),
        pl.when(pl.col("_need")).then(kind).otherwise(pl.col("target_kind")).alias("target_kind"),
        (pl.col("_need") & tput.is_not_null()).alias("target_derived"),
    ).with_columns(
        pl.when(pl.col("_need")).then(tokens_per_step / (pl.col("measured_tokens_per_s_per_gpu") * pl.col("n_gpus")))
        .otherwise(pl.col("measured_step_time_s")).alias("measured_step_time_s"),
    ).drop("_need")
