"""The compute frontier: what one accelerator type can train at all, within a time limit, at good utilization.

For each training compute C on a log grid (``FLOP_GRID_PER_DECADE`` points per decade from 1e16 FLOP):

1. **Compute-optimal sizing** (Chinchilla, Hoffmann et al. 2022, §3 and Table 3: tokens ≈ 20 × parameters):
   with C = 6·N·D (Kaplan et al. 2020, §2.1) and D = 20·N, the target size is N = sqrt(C / 120) parameters.
2. **A dense GPT-style shape** for that size (``dense_arch_for_params``): head dimension 128 and an aspect ratio
   d_model / n_layers = 128, so n_layers = n_heads = d_model / 128 — exactly GPT-3 175B's shape (Brown et al.
   2020, Table 2.1: d_model 12,288, 96 layers, 96 heads of 128), within the flat optimum of Kaplan et al. 2020
   (Fig. 5: loss within a few percent for d_model/n_layers from ~20 to ~200). GeLU MLP of 4·d_model, GPT-2 BPE
   vocabulary padded to 51,200 (Megatron), tied embeddings, sequence length 2,048 (GPT-3, Chinchilla). d_model
   is the multiple of 128 whose parameter count (``models.accounting.param_counts``) is closest to the target;
   tokens = 20 × that count, and the reported training compute is 6 × params × tokens.
3. **The batch-size ceiling** of ``models.curves.critical_batch_seqs`` (DeepSeek LLM 2024: 0.2920·C^0.3271
   tokens), so large clusters cannot buy throughput with an arbitrarily large batch.
4. **The cluster**: the run must finish within ``months`` (× 30.4375 days, the mean Gregorian month). N can't be
   below N_lo = model FLOPs / (time limit × peak) (100 % utilization); the ``N_CANDIDATES`` node-aligned sizes
   from max(N_lo, one node) upward are searched (``models.curves.best_layouts`` with ``FRONTIER_GRID``) and the
   one with the highest utilization (MFU, stepcast's FLOP convention) among those finishing in time is kept.
   When none fits in memory or finishes in time, the next ``N_CANDIDATES`` sizes are tried (``MAX_WINDOWS``
   windows at most). A size beyond the first window could only win where utilization is below ~1/8 anyway.
5. The accelerator's **best achievable utilization** u* is the maximum over the grid; the **frontier** is the
   largest C whose utilization ≥ ``min_utilization`` × u*.

The sweep stops when N_lo exceeds ``N_CAP`` accelerators (2^27 ≈ 134 million) or after ``STOP_AFTER``
consecutive levels with no layout finishing in time once one has.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import polars as pl

from models.accounting import model_flops_per_token, param_counts
from models.curves import BREAKDOWN, best_layouts, critical_batch_seqs, n_sweep, node_size
from models.params import DEFAULT, PhysParams

TOKENS_PER_PARAM = 20.0  # Hoffmann et al. 2022 (Chinchilla)
ASPECT = 128  # d_model / n_layers (GPT-3 175B, Brown et al. 2020)
HEAD_DIM = 128  # GPT-3, Llama
VOCAB = 51_200  # GPT-2 BPE padded to a multiple of 1024 (Megatron-LM default)
SEQ_LEN = 2_048  # GPT-3 / Chinchilla context
DAYS_PER_MONTH = 30.4375  # 365.25 / 12
FLOP_GRID_START = 1e16
FLOP_GRID_PER_DECADE = 4
FLOP_GRID_MAX = 1e31
N_CANDIDATES = 6
MAX_WINDOWS = 3  # up to 18 sizes (a 512x range) when smaller clusters run out of memory or time
N_CAP = 2**27
STOP_AFTER = 3
# restricted layout grid (models.curves docstring): the frontier needs a few hundred searches per accelerator
FRONTIER_GRID: dict[str, Any] = {
    "micro_batch": [1, 2],
    "sharding": ["zero1", "zero3"],
    "recompute": ["none", "selective", "full"],
    "vpp": [1, 4],
    "cp": [1],
}


def _shape(k: np.ndarray) -> dict[str, np.ndarray]:
    d = 128.0 * k
    return {"n_layers": d / ASPECT, "d_model": d, "n_heads": d / HEAD_DIM, "n_kv_heads": d / HEAD_DIM,
            "head_dim": np.full_like(d, HEAD_DIM), "ffn_dim": 4.0 * d, "vocab": np.full_like(d, VOCAB),
            "activation": np.zeros_like(d), "n_experts": np.zeros_like(d), "top_k": np.zeros_like(d),
            "expert_ffn_dim": 4.0 * d, "n_shared_experts": np.zeros_like(d), "n_dense_layers": np.zeros_like(d),
            "tied_embeddings": np.ones_like(d)}


_K = np.arange(1.0, 4097.0)  # d_model up to 524,288 (≈ 1.3e17 parameters): far beyond any grid level
_P = param_counts(_shape(_K))["params"]


def dense_arch_for_params(target_params: float) -> dict[str, Any]:
    """The dense GPT-style architecture (module docstring, step 2) closest to ``target_params``."""
    i = int(np.argmin(np.abs(np.log(_P) - math.log(max(target_params, 1.0)))))
    k = float(_K[i])
    shape = {key: float(v[0]) for key, v in _shape(np.array([k])).items()}
    d = int(shape["d_model"])
    return {"id": f"dense-{d}x{d // ASPECT}", "n_layers": d // ASPECT, "d_model": d, "n_heads": d // HEAD_DIM,
            "n_kv_heads": d // HEAD_DIM, "head_dim": HEAD_DIM, "ffn_dim": 4 * d, "vocab": VOCAB, "activation": "gelu",
            "n_experts": 0, "top_k": 0, "expert_ffn_dim": 4 * d, "n_shared_experts": 0, "n_dense_layers": 0,
            "tied_embeddings": True, "params": float(_P[i])}


def flop_grid(start: float = FLOP_GRID_START, stop: float = FLOP_GRID_MAX,
              per_decade: int = FLOP_GRID_PER_DECADE) -> np.ndarray:
    n = int(round(math.log10(stop / start) * per_decade)) + 1
    return start * 10.0 ** (np.arange(n) / per_decade)


def frontier_sweep(hw_row: Mapping[str, Any], months: float = 3.0, *, params: PhysParams = DEFAULT,
                   dtype: str = "bf16", flops=None, usd_per_gpu_hour: float | None = None,
                   seq_len: int = SEQ_LEN) -> pl.DataFrame:
    """One row per compute level: the compute-optimal model and the best cluster/layout finishing within
    ``months`` (module docstring). ``feasible`` false rows carry the reason."""
    if not months or months <= 0:
        raise ValueError(f"months must be > 0, got {months}")
    limit_s = months * DAYS_PER_MONTH * 86_400.0
    node = node_size(hw_row)
    grid = flop_grid() if flops is None else np.asarray(flops, dtype=np.float64)
    rows: list[dict[str, Any]] = []
    misses, seen = 0, False
    for target in grid:
        arch = dense_arch_for_params(math.sqrt(target / (6.0 * TOKENS_PER_PARAM)))
        n_params = arch["params"]
        tokens = TOKENS_PER_PARAM * n_params
        c6nd = 6.0 * n_params * tokens
        fpt = float(model_flops_per_token(_shape(np.array([arch['d_model'] / 128.0])), seq_len)[0])
        model_flop = fpt * tokens
        batch = critical_batch_seqs(c6nd, seq_len)
        base = {"target_flop": float(target), "training_flop": c6nd, "model_flop": model_flop, "arch_id": arch["id"],
                "params": n_params, "tokens": tokens, "d_model": arch["d_model"], "n_layers": arch["n_layers"],
                "n_heads": arch["n_heads"], "seq_len": seq_len, "global_batch_seqs": batch, "months": float(months)}
        peak_tflops = _peak(hw_row, dtype)
        n_lo = model_flop / (limit_s * peak_tflops * 1e12) if peak_tflops else math.inf
        if not math.isfinite(n_lo) or n_lo > N_CAP:
            rows.append(base | {"feasible": False, "reason": f"needs more than {N_CAP:,} accelerators even at 100 % "
                                                             f"utilization"})
            break
        sizes = n_sweep(node, N_CAP, max(node, int(math.ceil(n_lo))))
        if not sizes:
            rows.append(base | {"feasible": False, "reason": "no cluster size"})
            break
        # windows of N_CANDIDATES sizes upward until one holds a layout that fits and finishes in time
        ok, tried, why, fastest = None, [], [], math.inf
        for w in range(MAX_WINDOWS):
            cands = sizes[w * N_CANDIDATES:(w + 1) * N_CANDIDATES]
            if not cands:
                break
            tried += cands
            best, _ = best_layouts(arch, hw_row, cands, [batch] * len(cands), seq_len, dtype=dtype, params=params,
                                   grid=FRONTIER_GRID, want_configs=False)
            best = best.with_columns((pl.lit(tokens) / (pl.col("tokens_per_s_per_gpu") * pl.col("n_gpus")))
                                     .alias("time_to_train_s"))
            ok = best.filter(pl.col("feasible") & (pl.col("time_to_train_s") <= limit_s))
            if ok.height:
                break
            why += best.filter(~pl.col("feasible"))["reason"].to_list()
            fastest = min(fastest, float(best["time_to_train_s"].min() or math.inf))
        if ok is None or ok.height == 0:
            reason = (f"no layout on {tried[0]:,}–{tried[-1]:,} accelerators finishes within {months:g} months"
                      + (f" (fastest {fastest / 86400 / DAYS_PER_MONTH:.1f} months)" if math.isfinite(fastest)
                         else f": {why[-1]}" if why else ""))
            rows.append(base | {"feasible": False, "reason": reason})
            misses += 1
            if seen and misses >= STOP_AFTER:
                break
            continue
        seen, misses = True, 0
        pick = ok.sort(["mfu", "n_gpus"], descending=[True, False]).row(0, named=True)
        rec = base | {k: pick[k] for k in ("n_gpus", "tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "sharding",
                                           "recompute", "step_time_s", "tokens_per_s_per_gpu", "mfu",
                                           "memory_gb_per_gpu", *BREAKDOWN)}
        rec.update(feasible=True, reason=None, utilization=pick["mfu"],
                   time_to_train_days=pick["time_to_train_s"] / 86_400.0)
        rows.append(rec)
    df = pl.DataFrame(rows, infer_schema_length=None)
    for c, t in (("n_gpus", pl.Int64), ("tp", pl.Int64), ("pp", pl.Int64), ("dp", pl.Int64), ("cp", pl.Int64),
                 ("ep", pl.Int64), ("vpp", pl.Int64), ("micro_batch", pl.Int64), ("sharding", pl.Utf8),
                 ("recompute", pl.Utf8), ("utilization", pl.Float64), ("time_to_train_days", pl.Float64),
                 ("step_time_s", pl.Float64), ("tokens_per_s_per_gpu", pl.Float64), ("mfu", pl.Float64),
                 ("memory_gb_per_gpu", pl.Float64), *[(b, pl.Float64) for b in BREAKDOWN]):
        df = df.with_columns(pl.col(c).cast(t)) if c in df.columns else df.with_columns(pl.lit(None, dtype=t).alias(c))
    return df.with_columns(
        pl.lit(usd_per_gpu_hour, dtype=pl.Float64).alias("usd_per_gpu_hour"),
        (pl.col("time_to_train_days") * 24.0 * pl.col("n_gpus") * pl.lit(usd_per_gpu_hour, dtype=pl.Float64))
        .alias("cost_usd"))


def _peak(hw_row: Mapping[str, Any], dtype: str) -> float:
    """The dense peak the run's precision uses (models.hardware.peak_tflops_for)."""
    from models.hardware import peak_tflops_for

    arrays = {k: np.array([float(hw_row[k]) if hw_row.get(k) is not None else np.nan])
              for k in ("peak_fp32_tflops", "peak_tf32_tflops", "peak_bf16_tflops", "peak_fp16_tflops",
                        "peak_fp8_tflops")}
    peak, _ = peak_tflops_for(dtype, arrays)
    v = float(np.asarray(peak).ravel()[0])
    return v if math.isfinite(v) and v > 0 else 0.0


def frontier_summary(sweep: pl.DataFrame, min_utilization: float = 0.8) -> dict[str, Any]:
    """The frontier point: the largest training compute with utilization ≥ min_utilization × best (module
    docstring, step 5). ``found`` false (and the reason) when no level was feasible."""
    if not 0 < min_utilization <= 1:
        raise ValueError(f"min_utilization must be in (0, 1], got {min_utilization}")
    ok = sweep.filter(pl.col("feasible")) if sweep.height else sweep
    if ok.height == 0:
        reasons = sweep["reason"].drop_nulls().unique(maintain_order=True).to_list() if sweep.height else []
        return {"found": False, "reason": reasons[0] if reasons else "no compute level evaluated",
                "best_utilization": None, "utilization_threshold": None}
    best_u = float(ok["utilization"].max())
    thr = min_utilization * best_u
    good = ok.filter(pl.col("utilization") >= thr).sort("training_flop")
    top = good.row(good.height - 1, named=True)
    best_row = ok.sort("utilization", descending=True).row(0, named=True)
    return {"found": True, "reason": None, "best_utilization": best_u, "best_utilization_flop": best_row["training_flop"],
            "utilization_threshold": thr, "min_utilization": min_utilization, **top}
