"""Scaling efficiency of the corpus's measured series: how well a prediction reproduces the decline of per-GPU
throughput with the number of accelerators.

A **series** is the measured runs of one source that train one model with one stack on one accelerator, in one
precision, at one sequence length and one per-GPU micro-batch (where the run states it), at two or more cluster sizes N (`series_labels`).
Its **efficiency** is the per-GPU throughput at its largest N over that at its smallest (the median of the runs at
each end where a size was measured more than once): 1 is perfect scaling, 0.78 a 22% decline. The metric compares
the predicted efficiency (from the same runs' predicted throughput) with the measured one; it is independent of
the level of the prediction, which the throughput errors measure.

`series_efficiency` is pure numpy/polars: the fit's protocols call it on their out-of-fold predictions
(models.fitting.calibration), so a series held out with its source is scored on a fit that never saw it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

#: the columns that identify a series (with the model, `series_labels`); a missing one counts as one value
SERIES_KEYS = ("source", "framework", "gpu", "dtype", "seq_len", "micro_batch")


def series_labels(configs: pl.DataFrame) -> np.ndarray:
    """Per-run series label: "source | model | stack | accelerator | precision | seq | mb" (model = the
    architecture id, else the model's name)."""
    model = pl.coalesce(pl.col("arch_id").cast(pl.Utf8) if "arch_id" in configs.columns else pl.lit(None),
                        pl.col("model_name").cast(pl.Utf8) if "model_name" in configs.columns else pl.lit(None))
    parts = [pl.col(k).cast(pl.Utf8).fill_null("?") if k in configs.columns else pl.lit("?")
             for k in SERIES_KEYS]
    if "assumptions" in configs.columns:  # a micro-batch the run did not state (resolved per size) is no key
        unstated = pl.col("assumptions").fill_null("").str.contains(r"(^|; )micro_batch=\d+")
        parts[-1] = pl.when(unstated).then(pl.lit("?")).otherwise(parts[-1])
    return configs.select(pl.concat_str([parts[0], model.fill_null("?"), *parts[1:]], separator=" | ")
                          .alias("s"))["s"].to_numpy()


def series_efficiency(labels: np.ndarray, n_gpus: np.ndarray, log_pred: np.ndarray,
                      log_target: np.ndarray) -> pl.DataFrame:
    """One row per series with at least two cluster sizes that have both a measured and a predicted value:
    series, n_runs, n_min, n_max, efficiency_measured, efficiency_predicted, efficiency_error (predicted -
    measured). Rows without a finite prediction (a run its protocol never held out) are left out."""
    ok = np.isfinite(log_pred) & np.isfinite(log_target) & np.isfinite(n_gpus)
    df = pl.DataFrame({"series": labels[ok], "n": np.asarray(n_gpus, dtype=float)[ok],
                       "p": log_pred[ok], "m": log_target[ok]})
    per_n = df.group_by("series", "n").agg(pl.col("p", "m").median(), pl.len().alias("runs"))
    ends = (per_n.sort("series", "n").group_by("series", maintain_order=True)
            .agg(pl.len().alias("n_sizes"), pl.col("runs").sum().alias("n_runs"),
                 pl.col("n").first().alias("n_min"), pl.col("n").last().alias("n_max"),
                 (pl.col("m").last() - pl.col("m").first()).exp().alias("efficiency_measured"),
                 (pl.col("p").last() - pl.col("p").first()).exp().alias("efficiency_predicted"))
            .filter(pl.col("n_sizes") >= 2))
    return ends.with_columns((pl.col("efficiency_predicted") - pl.col("efficiency_measured"))
                             .alias("efficiency_error")).drop("n_sizes")


def summary(per_series: pl.DataFrame) -> dict:
    """Mean and largest |efficiency error| over the series, and how many exceed 0.06."""
    e = per_series["efficiency_error"].abs()
    if e.len() == 0:
        return {"n_series": 0, "mean_abs": None, "max_abs": None, "over_006": 0}
    return {"n_series": e.len(), "mean_abs": float(e.mean()), "max_abs": float(e.max()),
            "over_006": int((e > 0.06).sum())}
