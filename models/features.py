"""Regression features for the calibration step (pure, vectorized).

One row per configuration, built from the analytical breakdown and the configuration itself. Everything
here must be computable for a configuration nobody has measured (a `stepcast search` row), so only the
model's inputs and outputs are used — never the source, the framework name or anything measured.

Required columns (`REQUIRED_CONFIG` from the configuration, `REQUIRED_ANALYTICAL` from
`models.step_time.predict` with the fit's PhysParams):
"""

from __future__ import annotations

import numpy as np
import polars as pl

REQUIRED_ANALYTICAL = ("step_time_s", "compute_s", "tp_comm_s", "pp_bubble_s", "pp_comm_s", "dp_comm_exposed_s",
                       "cp_comm_s", "ep_comm_s", "optimizer_s", "memory_gb_per_gpu")
REQUIRED_CONFIG = ("n_layers", "d_model", "n_heads", "ffn_dim", "seq_len", "global_batch_seqs", "micro_batch",
                   "n_gpus", "tp", "pp", "dp", "peak_bf16_tflops", "memory_gb", "memory_bw_gbps",
                   "intra_node_bw_gbps", "inter_node_bw_gbps")
# optional config columns and the value a missing/null one takes (documented defaults of the model)
OPTIONAL_CONFIG = {"cp": 1.0, "ep": 1.0, "vpp": 1.0, "n_experts": 0.0, "recompute": "none", "sharding": "none",
                   "dtype": "bf16", "sequence_parallel": False, "software_preset": "default"}
HARDWARE_HINT = ("peak_bf16_tflops", "memory_gb", "memory_bw_gbps", "intra_node_bw_gbps", "inter_node_bw_gbps")

__doc__ += f"""
    analytical: {", ".join(REQUIRED_ANALYTICAL)}
    config:     {", ".join(REQUIRED_CONFIG)}
    optional:   {", ".join(f"{k} (default {v})" for k, v in OPTIONAL_CONFIG.items())}

A null or non-finite value in a required column is an error (`FeatureError`) that names the row and the
column; null hardware columns are reported as unknown hardware (the `gpu` id is named when present).
"""

FEATURE_NAMES = (
    # where the analytical time goes (fractions of the predicted step)
    "frac_compute", "frac_tp", "frac_bubble", "frac_pp", "frac_dp", "frac_cp", "frac_ep", "frac_optimizer",
    # per-GPU shapes (GEMM sizes drive small-kernel inefficiency)
    "log_tokens_per_mb", "log_hidden_per_tp", "log_ffn_per_tp", "log_layers_per_stage", "log_d_model",
    "log_seq_len", "log_microbatches",
    # degrees
    "log_tp", "log_pp", "log_dp", "log_cp", "log_ep", "log_vpp", "log_n_gpus",
    # hardware
    "log_peak_bf16", "log_hbm_bw", "log_intra_bw", "log_inter_bw", "log_flops_per_byte",
    # precision, recompute, sharding, software era, memory pressure, MoE
    "is_8bit", "is_fp4", "recompute_selective", "recompute_full", "fsdp_like", "zero", "megatron_2022",
    "sequence_parallel", "mem_fill", "is_moe",
)


class FeatureError(ValueError):
    """Bad input to the calibration features: names the row, the column and what was expected."""


def _col(df: pl.DataFrame, name: str, default=None) -> pl.Series:
    if name in df.columns:
        s = df[name]
        return s.fill_null(default) if default is not None else s
    return pl.Series(name, [default] * df.height)


def validate(analytical: pl.DataFrame, config: pl.DataFrame) -> None:
    """Raise FeatureError for missing columns, unknown hardware, or null/non-finite/non-positive required values."""
    if analytical.height != config.height:
        raise FeatureError(f"analytical has {analytical.height} rows but features_input has {config.height}")
    for frame, names, label in ((analytical, REQUIRED_ANALYTICAL, "analytical"), (config, REQUIRED_CONFIG,
                                                                                   "features_input")):
        missing = [c for c in names if c not in frame.columns]
        if missing:
            raise FeatureError(f"{label}: missing column(s) {', '.join(missing)}")
    gpu = config["gpu"] if "gpu" in config.columns else None
    for c in HARDWARE_HINT:
        x = config[c].cast(pl.Float64, strict=False).to_numpy()
        bad = ~np.isfinite(x) | (x <= 0)
        if bad.any():
            i = int(np.argmax(bad))
            who = f" (gpu '{gpu[i]}')" if gpu is not None else ""
            raise FeatureError(f"features_input row {i}: column {c} = {config[c][i]!r}: unknown hardware{who}; "
                               "expected a resolved hardware row (models.hardware.resolve_hardware)")
    for frame, names, label in ((config, REQUIRED_CONFIG, "features_input"), (analytical, REQUIRED_ANALYTICAL,
                                                                              "analytical")):
        for c in names:
            x = frame[c].cast(pl.Float64, strict=False).to_numpy()
            bad = ~np.isfinite(x) | ((x < 0) if c.endswith("_s") else (x <= 0))
            if bad.any():
                i = int(np.argmax(bad))
                want = "a finite number >= 0" if c.endswith("_s") else "a finite number > 0"
                raise FeatureError(f"{label} row {i}: column {c} = {frame[c][i]!r}: expected {want}")


def build_features(analytical: pl.DataFrame, config: pl.DataFrame, check: bool = True) -> np.ndarray:
    """Feature matrix (rows x FEATURE_NAMES) for configurations and their analytical prediction."""
    if check:
        validate(analytical, config)
    f = lambda frame, c, d=None: _col(frame, c, d).cast(pl.Float64, strict=False).to_numpy()  # noqa: E731
    step = f(analytical, "step_time_s")
    frac = [f(analytical, c) / step for c in ("compute_s", "tp_comm_s", "pp_bubble_s", "pp_comm_s",
                                              "dp_comm_exposed_s", "cp_comm_s", "ep_comm_s", "optimizer_s")]
    tp, pp, dp = f(config, "tp"), f(config, "pp"), f(config, "dp")
    cp, ep, vpp = (f(config, c, OPTIONAL_CONFIG[c]) for c in ("cp", "ep", "vpp"))
    b, s, B = f(config, "micro_batch"), f(config, "seq_len"), f(config, "global_batch_seqs")
    h, L, F = f(config, "d_model"), f(config, "n_layers"), f(config, "ffn_dim")
    peak = f(config, "peak_bf16_tflops")
    hbm = f(config, "memory_bw_gbps")
    lower = lambda c: _col(config, c, OPTIONAL_CONFIG[c]).cast(pl.Utf8).str.to_lowercase().to_numpy()  # noqa: E731
    dtype, rc, shard = lower("dtype"), lower("recompute"), lower("sharding")
    preset = lower("software_preset")
    sp = _col(config, "sequence_parallel", False).cast(pl.Float64, strict=False).fill_null(0.0).to_numpy()
    n_exp = f(config, "n_experts", 0.0)
    mem_fill = f(analytical, "memory_gb_per_gpu") / f(config, "memory_gb")
    cols = frac + [
        np.log(b * s / cp), np.log(h / tp), np.log(F / tp), np.log(np.ceil(L / pp)), np.log(h), np.log(s),
        np.log(B / (dp * b)),
        np.log(tp), np.log(pp), np.log(dp), np.log(cp), np.log(ep), np.log(vpp), np.log(f(config, "n_gpus")),
        np.log(peak), np.log(hbm), np.log(f(config, "intra_node_bw_gbps")), np.log(f(config, "inter_node_bw_gbps")),
        np.log(peak * 1e3 / hbm),
        np.isin(dtype, ["fp8", "fp8-cs", "mxfp8", "nvfp4"]).astype(float), (dtype == "nvfp4").astype(float),
        (rc == "selective").astype(float), (rc == "full").astype(float),
        np.isin(shard, ["fsdp", "hsdp", "zero3"]).astype(float), np.isin(shard, ["zero1", "zero2"]).astype(float),
        (preset == "megatron_2022").astype(float), np.nan_to_num(sp), np.clip(mem_fill, 0, 5),
        (np.nan_to_num(n_exp) > 0).astype(float),
    ]
    X = np.column_stack([np.asarray(c, dtype=np.float64) for c in cols])
    if check and not np.isfinite(X).all():
        i, j = np.argwhere(~np.isfinite(X))[0]
        raise FeatureError(f"row {i}: feature {FEATURE_NAMES[j]} is not finite; check its input columns")
    return X
