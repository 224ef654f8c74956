"""Exhaustive layout search: enumerate every valid parallel layout, predict, rank.

Enumeration rules (docs/model.md, "Search"):
  tp   divisors of n_gpus that divide n_heads (beyond the scale-up domain too: the step-time model then
       charges the network's bandwidth and latency, models.physics.network.ring_link)
  pp   divisors of n_gpus/tp up to n_layers; uneven stages are allowed (the stage with
       ceil(n_layers/pp) layers governs the step, as predict models it)
  cp   powers of two dividing n_gpus/(tp*pp) and seq_len, up to ``max_cp`` (16)
  dp   = n_gpus / (tp*pp*cp), must divide global_batch_seqs
  ep   MoE only: divisors of dp that divide n_experts
  etp  MoE only, tp > 1: 1 and tp (expert tensor parallelism, Megatron-Core --expert-tensor-parallel-size: the
       default etp = tp and the setting recommended for fine-grained experts, etp = 1; models.arch.moe); else tp
  vpp  1, and for pp > 1 every v in 2..max_vpp with ceil(n_layers/pp) >= v
  micro_batch  divisors of global_batch_seqs/dp up to ``max_micro_batch``
  sharding  all six when dp*cp > 1, else 'none'; recompute all three;
  sequence_parallel  both when tp > 1, else False
  tp_mode  '1d' (Megatron), and for tp >= 4 also '2d' (models.physics.tp2d: the r x c grid; sequence-sharded by
       construction, so only with sequence_parallel on)
Any dimension can be fixed: ``fixed={'tp': 1, 'pp': 1, 'sharding': 'fsdp'}`` (a scalar or
a list of allowed values). Remaining invalid combinations (e.g. interleaving with a
micro-batch count not divisible by pp) are removed by ``predict_arrays``' validity rules.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping

import numpy as np
import polars as pl

from models.arch import moe
from models.core.params import (
    DEFAULT,
    DTYPE_CODES,
    RECOMPUTE_CODES,
    SHARDING_CODES,
    TP_MODE_CODES,
)
from models.core.precision import recipe_layers_16bit
from models.fitting.predictor import (
    EXTRA_COLUMNS,
    Model,
    as_predictor,
    domain_text,
    predict_arrays,
)
from models.memory.stacks import STACK_COLUMNS
from models.physics import tp2d
from models.physics.step_time import (
    HARDWARE_COLUMNS,
    NETWORK_COLUMNS,
    OUTPUT_COLUMNS,
    encode_arch,
)

LAYOUT_DIMS = ("tp", "pp", "cp", "dp", "ep", "etp", "vpp", "micro_batch", "sharding", "recompute",
               "sequence_parallel")
_CODES = {"sharding": SHARDING_CODES, "recompute": RECOMPUTE_CODES, "tp_mode": TP_MODE_CODES}
_INV = {key: {v: k for k, v in codes.items()} for key, codes in _CODES.items()}
_DTYPE_NAMES = {v: k for k, v in DTYPE_CODES.items()}


def _divisors(n: int) -> list[int]:
    n = int(n)
    small = [i for i in range(1, int(n**0.5) + 1) if n % i == 0]
    return sorted(set(small + [n // i for i in small]))


def _allowed(fixed: Mapping[str, Any], key: str, candidates):
    if key not in fixed:
        return list(candidates)
    want = fixed[key]
    want = list(want) if isinstance(want, (list, tuple, set, np.ndarray)) else [want]
    if key in _CODES:
        want = [_CODES[key][str(w)] if not isinstance(w, (int, np.integer)) else int(w) for w in want]
    elif key == "sequence_parallel":
        want = [bool(w) for w in want]
    return [c for c in candidates if c in want]


def _num(row: Mapping, key: str, default=np.nan) -> float:
    v = row.get(key, default)
    if v is None:
        return float(default)
    if isinstance(v, str):
        return float(v) if v.strip() else float(default)
    return float(v)


def enumerate_layouts(
    arch_row: Mapping[str, Any],
    hw_row: Mapping[str, Any],
    n_gpus: int,
    global_batch_seqs: int,
    seq_len: int,
    fixed: Mapping[str, Any] | None = None,
    dtype: str = "bf16",
    *,
    gpus_per_node: int | None = None,
    max_cp: int = 16,
    max_vpp: int = 8,
    max_micro_batch: int = 64,
) -> dict[str, np.ndarray]:
    """Every candidate layout as arrays ready for ``predict_arrays`` (arch + hw broadcast). ``fixed`` may also
    hold ``moe_capacity_factor`` (a number, or None for dropless): a constant column, not a searched dimension."""
    fixed = dict(fixed or {})
    cap = fixed.pop("moe_capacity_factor", None)
    L = int(_num(arch_row, "n_layers"))
    heads = int(_num(arch_row, "n_heads"))
    E = int(_num(arch_row, "n_experts", 0.0) if not np.isnan(_num(arch_row, "n_experts", 0.0)) else 0)
    scaleup = int(_num(hw_row, "scaleup_size", 8.0))
    node = int(gpus_per_node) if gpus_per_node else scaleup
    n = int(n_gpus)
    B = int(global_batch_seqs)
    s = int(seq_len)

    tps = [t for t in _divisors(n) if heads % t == 0]
    tps = _allowed(fixed, "tp", tps)
    outer: list[tuple] = []  # (tp, pp, cp, dp, ep, etp, vpp) with the inner grid that goes with it
    inner: list[np.ndarray] = []
    grids: dict[tuple, np.ndarray] = {}  # the inner grid depends on dp, on dp*cp > 1 and on tp > 1 only
    rcs = _allowed(fixed, "recompute", [0, 1, 2])
    modes: list[int] = []  # tp_mode code of each outer layout
    for tp in tps:
        pps = _allowed(fixed, "pp", [p for p in _divisors(n // tp) if p <= L])
        sps = _allowed(fixed, "sequence_parallel", [False, True] if tp > 1 else [False])
        if "etp" in fixed:  # a fixed expert-TP degree is taken as given (predict_arrays judges the folding)
            etps = [int(x) for x in (fixed["etp"] if isinstance(fixed["etp"], (list, tuple, set)) else [fixed["etp"]])]
        else:
            etps = list(moe.etp_candidates(E, tp))
        tpms = _allowed(fixed, "tp_mode", [0, 1] if tp >= tp2d.MIN_TP else [0])
        for pp in pps:
            rest = n // (tp * pp)
            cps = [c for c in _divisors(rest) if c <= max_cp and (c & (c - 1)) == 0 and s % c == 0]
            ls = -(-L // pp)
            vpps = _allowed(fixed, "vpp", [1] + ([v for v in range(2, max_vpp + 1) if ls >= v] if pp > 1 else []))
            for cp in _allowed(fixed, "cp", cps):
                dp = rest // cp
                if B % dp or not _allowed(fixed, "dp", [dp]):
                    continue
                gkey = (dp, dp * cp > 1, tp > 1)
                grid = grids.get(gkey)
                if grid is None:
                    mbs = _allowed(fixed, "micro_batch", [b for b in _divisors(B // dp) if b <= max_micro_batch])
                    shards = _allowed(fixed, "sharding", list(range(6)) if dp * cp > 1 else [0])
                    grid = grids[gkey] = np.array(list(itertools.product(mbs, shards, rcs, sps)),
                                                  dtype=np.float64).reshape(-1, 4)
                if not len(grid):
                    continue
                eps = _allowed(fixed, "ep", [e for e in _divisors(dp) if E % e == 0] if E > 0 else [1])
                grid2 = grid[grid[:, 3] > 0] if 1 in tpms and (grid[:, 3] > 0).any() else grid
                for ep, etp, vpp, tpm in itertools.product(eps, etps, vpps, tpms):
                    outer.append((tp, pp, cp, dp, ep, etp, vpp))
                    inner.append(grid2 if tpm else grid)
                    modes.append(tpm)
    if outer:  # one block per outer layout, built with two array operations instead of a column per block
        sizes = np.fromiter((len(g) for g in inner), dtype=np.int64, count=len(inner))
        mat = np.hstack([np.repeat(np.asarray(outer, dtype=np.float64), sizes, axis=0), np.concatenate(inner)])
        tp_mode = np.repeat(np.asarray(modes, dtype=np.int64), sizes)
    else:
        mat = np.zeros((0, len(LAYOUT_DIMS)))
        tp_mode = np.zeros(0, dtype=np.int64)
    m = len(mat)
    out: dict[str, np.ndarray] = {c: mat[:, i].copy() for i, c in enumerate(LAYOUT_DIMS)}
    out["tp_mode"] = tp_mode
    out["sharding"] = out["sharding"].astype(np.int64)
    out["recompute"] = out["recompute"].astype(np.int64)
    out["sequence_parallel"] = out["sequence_parallel"] > 0
    out["n_gpus"] = np.full(m, float(n))
    out["global_batch_seqs"] = np.full(m, float(B))
    out["seq_len"] = np.full(m, float(s))
    out["gpus_per_node"] = np.full(m, float(node))
    out["dtype"] = np.full(m, DTYPE_CODES[dtype], dtype=np.int64)
    if cap is not None:  # capacity factor (models.arch.moe); absent = dropless
        out["moe_capacity_factor"] = np.full(m, float(cap))
    broadcast_arch_hw(out, m, arch_row, hw_row)
    return out


#: what a stated training stack sets per configuration (pipeline.api `stack_inputs`): its memory values, whether it
#: is XLA-compiled on a GPU, its software era and whether the stack table knows it
STACK_INPUTS = (*STACK_COLUMNS, "xla_compiled", "era_code", "stack_unknown")


def broadcast_arch_hw(out: dict, m: int, arch_row: Mapping[str, Any], hw_row: Mapping[str, Any]) -> None:
    """Fill `out` with the architecture and hardware columns of one model on one accelerator, m rows each. The
    architecture is every input the step-time model reads for the row, encoded as `stepcast predict` encodes it
    (``models.physics.step_time.encode_arch``): a hybrid row's block pattern and Mamba shape, an MLA row's MLA and MTP
    columns, so search, curves, the frontier and the plan predict what `predict` predicts for the same layout."""
    for key, v in encode_arch(arch_row).items():
        out[key] = np.full(m, v[0])
    if m and "dtype" in out:  # the layers the model's published low-precision recipe keeps in 16 bits, as predict
        dtype = _DTYPE_NAMES.get(int(out["dtype"][0]))  # defaults them (models.core.precision)
        layers_16bit = recipe_layers_16bit(arch_row.get("id"), dtype) if dtype else None
        if layers_16bit:
            out["n_layers_16bit"] = np.full(m, float(layers_16bit))
    for key in HARDWARE_COLUMNS:
        out[key] = np.full(m, _num(hw_row, key))
    for key in NETWORK_COLUMNS:  # the optional pod tier, only when the row has one
        if _num(hw_row, key) == _num(hw_row, key):
            out[key] = np.full(m, _num(hw_row, key))
    for key in STACK_INPUTS:  # a stated training stack (`--stack`): its values, as predict's row carries them
        if hw_row.get(key) is not None and _num(hw_row, key) == _num(hw_row, key):
            out[key] = np.full(m, _num(hw_row, key))


def search(
    arch_row: Mapping[str, Any],
    hw_row: Mapping[str, Any],
    n_gpus: int,
    global_batch_seqs: int,
    seq_len: int,
    fixed: Mapping[str, Any] | None = None,
    dtype: str = "bf16",
    *,
    top_k: int = 10,
    rank_by: str = "throughput",
    usd_per_gpu_hour: float | None = None,
    params: Model = DEFAULT,
    gpus_per_node: int | None = None,
    return_count: bool = False,
    dedupe: bool = True,
):
    """Best feasible layouts, ranked by tokens/s (``rank_by='throughput'``) or by GPU-seconds
    (and USD when ``usd_per_gpu_hour`` is given) per token (``rank_by='cost'``).

    ``params`` is the prediction model (``models.fitting.predictor``: PhysParams for the analytical model, or a
    calibration/Predictor: ranking is then by the calibrated figure). Layouts whose prediction is identical
    (same step time and memory, e.g. ZeRO-3 and FSDP where they coincide) are shown once (``dedupe``).
    Returns a polars DataFrame (layout columns with string categoricals + predictions + the interval +
    ``fit_version``/``assumptions``/``calibration_domain`` + ``gpu_s_per_mtoken``/``usd_per_mtoken``), best
    first; with ``return_count=True`` a tuple (frame, number of layouts evaluated).
    """
    if rank_by not in ("throughput", "cost"):
        raise ValueError("rank_by must be 'throughput' or 'cost'")
    lay = enumerate_layouts(arch_row, hw_row, n_gpus, global_batch_seqs, seq_len, fixed, dtype,
                            gpus_per_node=gpus_per_node)
    count = len(lay["tp"])
    res = predict_arrays(lay, params) if count else {c: np.zeros(0) for c in OUTPUT_COLUMNS + EXTRA_COLUMNS}
    ok = np.asarray(res["feasible"], dtype=bool) if count else np.zeros(0, dtype=bool)
    idx = np.flatnonzero(ok)
    if dedupe and len(idx):  # identical predictions (to 10 significant digits) are one answer
        key2 = np.round(np.log(res["step_time_s"][idx]), 10) * 1e6 + np.round(res["memory_gb_per_gpu"][idx], 6)
        _, first = np.unique(key2, return_index=True)
        idx = idx[np.sort(first)]
    gpu_s_per_mtok = n_gpus * res["step_time_s"][idx] / (global_batch_seqs * seq_len) * 1e6 if count else np.zeros(0)
    if rank_by == "throughput":
        key = -res["tokens_per_s_per_gpu"][idx]
    else:
        key = gpu_s_per_mtok
    order = idx[np.argsort(key, kind="stable")][:top_k]
    # provenance of every row: which parameters and assumptions answered
    model = as_predictor(params)
    sub = {k: (v[order] if np.ndim(v) else v) for k, v in lay.items()} if count else lay
    data: dict[str, Any] = {}
    for c in LAYOUT_DIMS:
        col = lay[c][order]
        if c in _INV:
            data[c] = [_INV[c][int(x)] for x in col]
        elif c == "sequence_parallel":
            data[c] = col.astype(bool)
        else:
            data[c] = col.astype(np.int64)
        if c == "tp":
            data["tp_mode"] = [_INV["tp_mode"][int(x)] for x in lay["tp_mode"][order]]
    data["dtype"] = [dtype] * len(order)
    for c in OUTPUT_COLUMNS + EXTRA_COLUMNS:
        data[c] = res[c][order]
    data["fit_version"] = pl.Series([getattr(model, "fit_version", None)] * len(order), dtype=pl.Utf8)
    data["assumptions"] = [getattr(model, "assumptions", "analytical")] * len(order)
    data["calibration_domain"] = domain_text(params, sub, res["domain_code"][order]) if len(order) else []
    df = pl.DataFrame(data)
    df = df.with_columns(
        (pl.lit(float(n_gpus)) * pl.col("step_time_s") / (global_batch_seqs * seq_len) * 1e6).alias("gpu_s_per_mtoken")
    )
    if usd_per_gpu_hour is not None:
        df = df.with_columns((pl.col("gpu_s_per_mtoken") / 3600.0 * usd_per_gpu_hour).alias("usd_per_mtoken"))
    return (df, count) if return_count else df
