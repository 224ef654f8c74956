"""Adapters that bring external raw data into the measurement schema (pure: bytes/rows in, DataFrame out).

vTrain (Bang et al., MICRO 2024) released its validation measurements as two CSV files
(`measurements/external/vtrain/`). The multi-node file's 109 rows are already in `measured_runs.csv`
(run ids `vtrain_mNNN`, NNN = line in the raw file); the single-node file's 1,440 rows enter only through
`vtrain_single`. `vtrain_multi_keys` lets ingest recognise the multi-node duplicates instead of loading
them twice.
"""

from __future__ import annotations

import polars as pl

from pipeline.readers import FileRejected

VTRAIN_SOURCE = "vTrain (Bang et al., MICRO 2024) released validation data"
VTRAIN_COMMIT = "f8dda8473a48b373b1d25f51f52d685bff5150c5"
VTRAIN_RAW = {
    "# GPUs": "n_gpus",
    "global batch": "global_batch_seqs",
    "micro batch": "micro_batch",
    "hidden size": "d_model",
    "attention heads": "n_heads",
    "# layers": "n_layers",
    "sequence length": "seq_len",
    "tensor parallelism": "tp",
    "data parallelism": "dp",
    "pipeline parallelism": "pp",
    "iteration time (ms)": "iteration_time_ms",
}


def _rename_vtrain(frame: pl.DataFrame, path: str) -> pl.DataFrame:
    missing = [c for c in VTRAIN_RAW if c not in frame.columns]
    if missing:
        raise FileRejected(path, f"not a vTrain ground-truth file: missing column(s) {', '.join(missing)}", line=1)
    return frame.rename({k: v for k, v in VTRAIN_RAW.items()})


def vtrain_single(frame: pl.DataFrame, path: str) -> pl.DataFrame:
    """vTrain single-node rows (string cells + `_line`) -> measurement-schema rows (string cells + `_line`).

    Filled by inference, and said so in `notes`: ffn_dim = 4 x hidden and vocab 51,200 (Megatron GPT
    defaults: GPT-2 BPE of 50,257 padded to a multiple of 128 x TP), GPU `a100-sxm4-80gb` (the repository
    names only 'A100'; the data card maps unstated A100 memory to 80 GB), 8 GPUs per node.
    """
    f = _rename_vtrain(frame, path)
    ms = pl.col("iteration_time_ms").str.strip_chars().cast(pl.Float64, strict=False)
    hidden = pl.col("d_model").str.strip_chars().cast(pl.Int64, strict=False)
    return f.select(
        pl.format("vtrain_s{}", pl.col("_line").cast(pl.Utf8).str.zfill(4)).alias("run_id"),
        pl.lit(VTRAIN_SOURCE + " (single-node)").alias("source"),
        pl.format("VIA-Research/vTrain data/ground_truth_single.csv line {} (commit {})", pl.col("_line"),
                  pl.lit(VTRAIN_COMMIT[:7])).alias("source_ref"),
        pl.lit("2024").alias("year"),
        pl.format("GPT h{} L{} (vTrain single-node)", pl.col("d_model"), pl.col("n_layers")).alias("model_name"),
        pl.lit("dense").alias("arch"),
        "n_layers", "d_model", "n_heads",
        pl.col("n_heads").alias("n_kv_heads"),
        (hidden * 4).cast(pl.Utf8).alias("ffn_dim"),
        pl.lit("51200").alias("vocab"),
        "seq_len", "global_batch_seqs", "micro_batch",
        pl.lit("a100-sxm4-80gb").alias("gpu"),
        pl.lit("A100").alias("gpu_as_reported"),
        "n_gpus",
        pl.lit("8").alias("gpus_per_node"),
        pl.lit("Megatron-DeepSpeed").alias("framework"),
        "tp", "pp", "dp",
        pl.lit("unknown").alias("recompute"),
        pl.lit("step_time_s").alias("metric"),
        (ms / 1000.0).cast(pl.Utf8).alias("value"),
        pl.lit("s").alias("unit"),
        pl.lit("no").alias("derived"),
        pl.format(
            "iteration time reported as {} ms (unit conversion only). Single-node run (2-8 GPUs). Inferred, not "
            "stated by the source: ffn_dim = 4 x hidden and vocab 51200 (Megatron GPT defaults), GPU memory 80 GB "
            "(repo says 'A100'), recompute unknown.", pl.col("iteration_time_ms")).alias("notes"),
        "_line",
    )


def vtrain_multi_keys(frame: pl.DataFrame, path: str) -> pl.DataFrame:
    """The multi-node raw rows as (run_id, step_time_s) keyed the way measured_runs.csv names them."""
    f = _rename_vtrain(frame, path)
    return f.select(
        pl.format("vtrain_m{}", pl.col("_line").cast(pl.Utf8).str.zfill(3)).alias("run_id"),
        (pl.col("iteration_time_ms").str.strip_chars().cast(pl.Float64) / 1000.0).alias("step_time_s"),
        *[pl.col(c).str.strip_chars().cast(pl.Int64).alias(c) for c in
          ("n_gpus", "global_batch_seqs", "micro_batch", "d_model", "n_heads", "n_layers", "seq_len", "tp", "dp", "pp")],
    )
