"""The compute frontier: what one accelerator type can train at all, within a time limit, at good utilization.

For each training compute C on a log grid (``FLOP_GRID_PER_DECADE`` points per decade, 1e16 to 1e32 FLOP), every
level is evaluated (the sweep goes *through* infeasible levels and says why each one is):

1. **Compute-optimal sizing** (Chinchilla, Hoffmann et al. 2022, §3 and Table 3: tokens ≈ 20 × parameters):
   with C = 6·N·D (Kaplan et al. 2020, §2.1) and D = 20·N, the target size is N = sqrt(C / 120) parameters.
2. **A dense GPT-style shape** for that size (``dense_arch_for_params``): aspect ratio d_model / n_layers ≈ 128
   (GPT-3 175B: d_model 12,288, 96 layers; Brown et al. 2020, Table 2.1), allowed to vary within 108-152, inside
   the flat optimum of Kaplan et al. 2020 (Fig. 5: loss within a few percent for d_model/n_layers ~20-200); the
   head count is the power of two nearest d_model/128 (head dimension 96-176 in steps of 8), so that tensor
   parallelism can split the heads at any power-of-two degree. GeLU MLP of 4·d_model, GPT-2 BPE vocabulary padded
   to 51,200 (Megatron), tied embeddings, sequence length 2,048 (GPT-3, Chinchilla). The shape whose parameter
   count is closest to the target is taken; tokens = 20 × that count; training compute = 6 × params × tokens.
3. **The batch ceiling** (``models.planning.curves.batch_tokens``, ``BATCH_RULES``): ``deepseek`` B_opt = 0.2920·C^0.3271 tokens
   (DeepSeek-AI 2024, arXiv:2401.02954, eq. 1); ``kaplan`` B_crit(L) = B*/L^(1/α_B), B* = 2e8 tokens,
   α_B = 0.21 (Kaplan et al. 2020, eq. 1.4) at the loss of compute-optimal training, L(C) = (C_c/C)^α_C with
   C_c = 3.1e8 PF-days, α_C = 0.050 (eq. 1.3); ``fixed`` 2^22 ≈ 4M tokens at every C (Llama 3's initial batch,
   Dubey et al. 2024 §3.4.1). A layout's global batch is the largest multiple of dp × micro-batch (× pp when
   interleaved) not above the ceiling.
4. **The cluster and layout** (``_search``): any N = tp × pp × dp × cp. tp is any power of two up to the head
   count (it may leave the scale-up domain and then pays the network's bandwidth and latency,
   ``models.physics.network.ring_link``); pp any value up to the layer count, ~2 per octave (1, 2, 3, 4, 6, 8, 11,
   16, 23, ...; uneven stages allowed); dp 2 per octave (1, 2, 3, 4, 6, 8, 12, ...); cp (ring attention) 1-8;
   the tensor-parallel form ``tp_form``: Megatron's 1-D (default), the 2-D grid for tp >= 4 (``2d``), or the
   better of the two (``any``; models.physics.tp2d). Under ``ideal`` assumptions TP traffic hides behind compute,
   and the 2-D grid's smaller traffic then removes the TP limit and moves the frontier far above Epoch AI's
   figures, so the default stays 1-D.
   N lies between N_min (the larger of the 100 %-utilization size model FLOPs / (time limit × peak) and the size
   that holds the model's states at 16 B/param) and ``N_WINDOW`` × N_min; no cap on N: the degrees bound it (the
   most accelerators a model's layouts can use, ``max_accelerators``: tp up to its heads × pp up to its layers ×
   dp up to its batch ceiling × cp 8). Stage 1 ranks every (tp, pp, dp, cp) with one setting, and a
   memory-frugal one where that does not fit (``STAGE1``); stage 2 searches, for the ``TOP_K`` best structures,
   interleaving 1-64, then micro-batch 1-256, then ZeRO-1/ZeRO-3 × no/full recompute, each at the best of the
   previous. The layout with the highest utilization (MFU) among those that fit in memory and finish within
   ``months`` is kept; ties: fewer accelerators.
5. **The latency wall** (``latency_wall_s``): the fewest steps the batch ceiling allows (tokens / ceiling) × the
   shortest possible step: one micro-batch through every layer, forward and backward, kernel after kernel
   (``PhysParams.ops_per_layer_fwd`` × (1 + ``elementwise_bwd_factor``) kernels per layer, ``KERNEL_LATENCY_S``
   each). Beyond the time limit no layout can finish: the level is bound by ``latency``. Each layout's step also
   can't be shorter than its own kernels in series: (micro-batches + bubble) × layers per stage × kernels ×
   ``KERNEL_LATENCY_S``.
6. **Binding constraint** per level (``binding``): ``memory`` (no layout fits, or more accelerators than the
   degrees allow are needed to hold the states), ``latency`` (the wall is beyond the time limit, or the kernel
   floor sets the chosen layout's step), ``batch`` (more accelerators than the degrees allow are needed even at
   100 % utilization), ``time`` (layouts fit but none finishes: utilization below 1/``N_WINDOW``; ``limited_by``
   then names the fastest layout's largest loss); on feasible levels the largest loss of the chosen layout:
   ``bandwidth`` (exposed communication), ``batch`` (the pipeline bubble the batch ceiling leaves) or ``compute``
   (losses < ``LOSS_SHARE_NONE`` of the step).
7. **The frontier** (``frontier_summary``), as Epoch AI defines it: the largest training compute at which
   utilization does "not fall below" ``min_utilization`` × the accelerator's best sustained utilization u*.
   u* (``best_sustained``) is the highest utilization held over ``SUSTAIN_LEVELS`` consecutive levels (half a
   decade), so one level's spike does not set it (at the grid's low end the compute-optimal model is mostly its
   vocabulary: 1-3 layers behind one large logits GEMM, >80 % of its FLOPs, whose calibrated efficiency swings
   with the shape and micro-batch from level to level). Walking up from u*'s levels, the first level below the
   threshold (0 when infeasible) ends the frontier (``exit_level``), whatever follows; the frontier is the level
   before it (``crossing_flop``: the log-linear crossing between them; ``ended_by``: the binding constraint of the
   ending level, ``ended_by_reason`` its sentence). ``reach`` says how far the accelerator trains at all: the
   largest feasible level, what ends feasibility after it (``reach_ended_by``: for a ``time`` level its
   ``limited_by``) and the first level behind the latency wall (``latency_wall_flop``).

Cost: cloud price × N × hours when a price exists; otherwise the purchase price, ``launch_price_usd`` × N, charged
in full to the run (no resale value; power, hosting and network excluded) — ``cost_basis`` says which.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import polars as pl

from models.arch.accounting import model_flops_per_token
from models.arch.shapes import dense_arch_for_params, gpt_shape
from models.core.params import (
    DEFAULT,
    DTYPE_CODES,
    RECOMPUTE_CODES,
    SHARDING_CODES,
    TP_MODE_CODES,
    PhysParams,
)
from models.fitting.assumptions import check_assumptions, params_for
from models.fitting.predictor import (
    Calibration,
    Predictor,
    physical_params,
    predict_arrays,
)
from models.memory.model import capacity_bytes
from models.physics import tp2d
from models.physics.hardware import peak_tflops_for
from models.physics.step_time import BREAKDOWN, ERR_MEMORY
from models.planning.curves import BATCH_RULES, FIXED_BATCH_TOKENS, batch_tokens
from models.planning.search import broadcast_arch_hw

TOKENS_PER_PARAM = 20.0  # Hoffmann et al. 2022 (Chinchilla)
SEQ_LEN = 2_048  # GPT-3 / Chinchilla context
DAYS_PER_MONTH = 30.4375  # 365.25 / 12
FLOP_GRID_START = 1e16
FLOP_GRID_PER_DECADE = 4
FLOP_GRID_MAX = 1e32
N_WINDOW = 16.0  # sizes from N_min to 16 x N_min: utilization down to 1/16 of peak is searched
STATE_BYTES_MIN = 16.0  # fp32 master + Adam m, v + 2-byte weights and grads, fully sharded (ZeRO, Rajbhandari 2020)
TOP_K = 4
LOSS_SHARE_NONE = 0.05
#: the batch laws whose frontiers `stepcast frontier` reports side by side (the band between them): DeepSeek's
#: fitted optimum and Kaplan's critical batch, the law of Epoch AI's model (models.planning.curves.batch_tokens)
BAND_RULES = ("deepseek", "kaplan")
SUSTAIN_LEVELS = 3  # the best utilization is the best held over 3 consecutive levels (half a decade)
# prior: the shortest GPU kernel, launch to completion, a few µs (the CUDA launch latency of ~5 µs quoted in
# models.core.params for host_overhead_s_per_op); one kernel after another on the critical path
KERNEL_LATENCY_S = 5e-6

CPS = (1, 2, 4, 8)  # context parallelism (ring attention) splits the 2,048-token sequence
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
VPPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
SHARDINGS = ("zero1", "zero3")
RECOMPUTES = ("none", "full")
# stage 1 settings (micro-batch, interleave 'max' = one layer per virtual stage, at most 64,
# sharding, recompute): the plain layout, and, for the structures where it does not fit, the most memory-frugal
STAGE1 = ((1, "max", "zero1", "none"), (1, "max", "zero3", "full"))

LAYOUT_KEYS = ("n_gpus", "tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "sharding", "recompute",
               "global_batch_seqs", "tp_mode")
COMM = ("tp_comm_s", "pp_comm_s", "dp_comm_exposed_s", "cp_comm_s", "ep_comm_s")


def flop_grid(start: float = FLOP_GRID_START, stop: float = FLOP_GRID_MAX,
              per_decade: int = FLOP_GRID_PER_DECADE) -> np.ndarray:
    n = int(round(math.log10(stop / start) * per_decade)) + 1
    return start * 10.0 ** (np.arange(n) / per_decade)


# ------------------------------------------------------------------ the latency wall

def kernels_per_layer(params: PhysParams) -> float:
    """Kernels one layer runs for one micro-batch, forward and backward (models.core.params.ops_per_layer_fwd)."""
    return params.ops_per_layer_fwd * (1.0 + params.elementwise_bwd_factor)


def latency_wall_s(n_layers, tokens, batch_tokens_, params: PhysParams = DEFAULT,
                   kernel_latency_s: float = KERNEL_LATENCY_S) -> np.ndarray:
    """The shortest possible training time (module docstring, step 5): steps at the batch ceiling × one
    micro-batch's kernels through every layer, forward and backward, in series."""
    steps = np.ceil(np.asarray(tokens, float) / np.asarray(batch_tokens_, float))
    return steps * np.asarray(n_layers, float) * kernels_per_layer(params) * kernel_latency_s


# ------------------------------------------------------------------ the layout search

def _grid_2_per_octave(hi: float) -> np.ndarray:
    """1, 2, 3, 4, 6, 8, 12, 16, ... up to hi."""
    out, k = [1.0], 1.0
    while 2 * k <= hi:
        out += [1.5 * k] if k >= 2 else []
        out.append(2 * k)
        k *= 2
    if 1.5 * k <= hi and k >= 2:
        out.append(1.5 * k)
    return np.unique(np.asarray(out))


def _pp_values(layers: int) -> np.ndarray:
    """1, 2, 3, 4, 6, 8, 11, 16, 23, ... (2^(i/2) rounded) up to the layer count."""
    v = np.unique(np.round(2.0 ** (np.arange(0, 2 * math.log2(max(layers, 1)) + 1) / 2.0)))
    return v[v <= layers]


def _mat_rows(struct: np.ndarray, fine: list[tuple]) -> np.ndarray:
    """(tp, pp, dp, layers, cp, mb, vpp, shard, rc, tp_mode) rows: every structure (tp, pp, dp, layers, cp, tp_mode)
    × every fine setting; vpp 'max' is one layer per virtual stage (at most 64 chunks)."""
    f = np.array([(mb, -1.0 if v == "max" else float(v), SHARDING_CODES[sh], RECOMPUTE_CODES[rc])
                  for mb, v, sh, rc in fine], dtype=np.float64)
    S = np.repeat(struct, len(f), axis=0)
    Fi = np.tile(f, (len(struct), 1))
    ls = np.ceil(S[:, 3] / S[:, 1])
    vmax = np.where(S[:, 1] > 1, np.minimum(ls, float(VPPS[-1])), 1.0)
    Fi[:, 1] = np.where(Fi[:, 1] < 0, vmax, Fi[:, 1])
    return np.column_stack([S[:, :5], Fi, S[:, 5:]])


def _prepare(mat: np.ndarray, arch: Mapping[str, Any], hw_row: Mapping[str, Any], bmax_seqs: float, seq_len: int,
             dtype: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The model inputs of rows (tp, pp, dp, L, cp, mb, vpp, shard, rc, tp_mode) of one level: the rows whose
    batch and interleave are possible, each with the largest global batch under the ceiling."""
    tp, pp, dp, cp, mb, vpp = mat[:, 0], mat[:, 1], mat[:, 2], mat[:, 4], mat[:, 5], mat[:, 6]
    L = float(arch["n_layers"])
    ls = np.ceil(L / pp)
    ok = (vpp == 1) | ((pp > 1) & (ls >= vpp))
    q = dp * mb * np.where(vpp > 1, pp, 1.0)
    batch = np.floor(bmax_seqs / q) * q
    ok &= batch >= q
    tp, pp, dp, cp, mb, vpp, batch, sh, rc, ls, tpm = (x[ok] for x in (tp, pp, dp, cp, mb, vpp, batch, mat[:, 7],
                                                                        mat[:, 8], ls, mat[:, 9]))
    m = len(tp)
    n = tp * pp * dp * cp
    su = float(hw_row.get("scaleup_size") or 8.0)
    a: dict[str, Any] = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": np.ones(m), "vpp": vpp,
                         "micro_batch": mb, "sharding": sh.astype(np.int64), "recompute": rc.astype(np.int64),
                         "sequence_parallel": tp > 1, "n_gpus": n, "global_batch_seqs": batch,
                         "seq_len": np.full(m, float(seq_len)), "gpus_per_node": np.full(m, su),
                         "dtype": np.full(m, DTYPE_CODES[dtype], dtype=np.int64), "tp_mode": tpm.astype(np.int64)}
    broadcast_arch_hw(a, m, arch, hw_row)
    rows = {"n": n, "tp": tp, "pp": pp, "dp": dp, "cp": cp, "vpp": vpp, "mb": mb, "sharding": sh, "recompute": rc,
            "tp_mode": tpm, "batch": batch, "ls": ls}
    return a, rows


def _finish(rows: dict[str, np.ndarray], res: dict[str, np.ndarray], seq_len: int, tokens: float, limit_s: float,
            kpl: float) -> dict[str, np.ndarray]:
    """Step time with the kernel floor and time to train of rows `_prepare` made, from the model's results."""
    if not len(rows["n"]):
        return {"n": np.zeros(0)}
    ls, batch, dp, mb, pp, vpp = rows["ls"], rows["batch"], rows["dp"], rows["mb"], rows["pp"], rows["vpp"]
    micro = batch / (dp * mb)
    floor = (micro + (pp - 1.0) / vpp) * ls * kpl * KERNEL_LATENCY_S
    step = np.maximum(res["step_time_s"], floor)
    steps = np.ceil(tokens / (batch * seq_len))
    time_s = steps * step
    out = {k: v for k, v in rows.items() if k != "ls"}
    return out | {"feasible": np.asarray(res["feasible"], bool), "mem": res["memory_gb_per_gpu"],
                  "error": np.asarray(res["error_code"]), "step": step, "step_model": res["step_time_s"],
                  "floor": floor, "mfu": res["mfu"] * res["step_time_s"] / step, "time_s": time_s,
                  "in_time": time_s <= limit_s, "res": {k: res[k] for k in _RECORD_RES}}


_RECORD_RES = ("tokens_per_s_per_gpu", *BREAKDOWN)  # the model outputs `_record` reads (all a level carries on)


def _evaluate_levels(pieces: list[tuple[np.ndarray, "_Level"]], hw_row: Mapping[str, Any], seq_len: int, dtype: str,
                     params: PhysParams, limit_s: float, kpl: float) -> list[dict[str, np.ndarray]]:
    """Predict the layout rows of several levels, ``(rows, level)`` pieces, in ONE call of the prediction function
    (its fixed cost, ~3 ms a call, would otherwise be paid ~5 times per level); one evaluation per piece."""
    prepared = [_prepare(mat, lv.arch, hw_row, lv.bmax_seqs, seq_len, dtype) for mat, lv in pieces]
    sizes = [len(rows["n"]) for _, rows in prepared]
    if not sum(sizes):
        return [{"n": np.zeros(0)} for _ in pieces]
    filled = [a for (a, _), m in zip(prepared, sizes) if m]
    inputs = {k: np.concatenate([np.asarray(a[k]) for a in filled]) for k in filled[0]}
    res_all = predict_arrays(inputs, params)
    out, at = [], 0
    for (mat, lv), (_, rows), m in zip(pieces, prepared, sizes):
        res = {k: np.asarray(v)[at:at + m] for k, v in res_all.items()}
        at += m
        out.append(_finish(rows, res, seq_len, lv.tokens, limit_s, kpl))
    return out


_RANK_KEYS = ("n", "feasible", "step", "in_time", "mfu", "time_s")  # what `_rank` reads


def _rank(ev: dict[str, np.ndarray]) -> np.ndarray:
    """Row order, best first: fits and finishes (by utilization, then fewer accelerators), then fits (fastest)."""
    if not len(ev["n"]):
        return np.zeros(0, dtype=np.int64)
    fits = ev["feasible"] & np.isfinite(ev["step"])
    good = fits & ev["in_time"]
    key1 = np.where(good, 0, np.where(fits, 1, 2))
    key2 = np.where(good, -ev["mfu"], np.where(fits, ev["time_s"], np.inf))
    return np.lexsort((ev["n"], key2, key1))


#: the tensor-parallel forms the frontier may use: Megatron's 1-D only (the default, the form the GTX 580
#: counterfactual reproduces), the 2-D grid only where tp >= 4, or either (models.physics.tp2d)
TP_FORMS = ("1d", "2d", "any")


class _Level:
    """One compute level's search (module docstring, step 4): its model, batch ceiling, tokens and size window."""

    def __init__(self, arch: Mapping[str, Any], n_min: float, bmax_seqs: float, tokens: float):
        self.arch, self.n_min, self.bmax_seqs, self.tokens = arch, n_min, bmax_seqs, tokens
        self.ev: dict | None = None  # every row evaluated so far
        self.top: list[tuple] = []  # the best structures after stage 1
        self.done = False  # nothing (more) to search


def _degree_grids(n_layers: int, n_heads: int, bmax_seqs: float, seq_len: int) -> tuple[np.ndarray, ...]:
    """The (tp, pp, dp, cp) degrees a level's layouts may take (module docstring, step 4)."""
    return (2.0 ** np.arange(0, int(math.log2(n_heads)) + 1), _pp_values(n_layers),
            _grid_2_per_octave(max(bmax_seqs, 1.0)), np.array([c for c in CPS if seq_len % c == 0], dtype=np.float64))


def max_accelerators(n_layers: int, n_heads: int, bmax_seqs: float, seq_len: int = SEQ_LEN) -> float:
    """The most accelerators one model's layouts can use: the largest tp × pp × dp × cp (tp up to the heads, pp up
    to the layers, dp up to the batch ceiling in sequences, cp up to 8)."""
    return float(math.prod(float(g.max()) for g in _degree_grids(n_layers, n_heads, bmax_seqs, seq_len)))


def _structures(lv: _Level, seq_len: int, tp_form: str) -> np.ndarray | None:
    """Stage 1's (tp, pp, dp, layers, cp, tp_mode) structures of a level: N within its window (or the smallest
    product above it), or None when no product reaches N_min."""
    arch = lv.arch
    L, heads = int(arch["n_layers"]), int(arch["n_heads"])
    lo, hi = max(lv.n_min, 1.0), max(lv.n_min, 1.0) * N_WINDOW
    tps, pps, dps, cps = _degree_grids(L, heads, lv.bmax_seqs, seq_len)
    T, P, D, C = np.meshgrid(tps, pps, dps, cps, indexing="ij")
    N = T * P * D * C
    sel = (N >= lo * (1 - 1e-9)) & (N <= hi * (1 + 1e-9))
    if not sel.any():  # the window holds no product of the grids: the smallest product above lo
        above = N >= lo * (1 - 1e-9)
        if not above.any():
            return None
        sel = above & (N == N[above].min())
    struct = np.column_stack([T[sel], P[sel], D[sel], np.full(sel.sum(), float(L)), C[sel], np.zeros(sel.sum())])
    if tp_form != "1d":
        wide = struct[:, 0] >= tp2d.MIN_TP
        two = struct[wide].copy()  # tp >= 4: the 2-D grid (models.physics.tp2d) beside, or instead of, the 1-D form
        two[:, 5] = float(TP_MODE_CODES["2d"])
        struct = np.vstack([struct, two] if tp_form == "any" else [struct[~wide], two])
    return struct


def _search_levels(levels: list[_Level], hw_row: Mapping[str, Any], seq_len: int, dtype: str, params: PhysParams,
                   limit_s: float, tp_form: str, kpl: float) -> list[tuple[dict | None, int]]:
    """The best layout of every level (module docstring, step 4): (evaluation, index of the best row or -1) per
    level. Each stage evaluates the rows of all levels in one call (``_evaluate_levels``); a level's stages depend
    only on its own rows, so the answer is the level-by-level search's."""
    def run(stage: list[tuple[np.ndarray, _Level]]) -> None:
        for (_, lv), ev in zip(stage, _evaluate_levels(stage, hw_row, seq_len, dtype, params, limit_s, kpl)):
            lv.ev = ev if lv.ev is None else _concat(lv.ev, ev)

    stage = []
    for lv in levels:
        struct = _structures(lv, seq_len, tp_form)
        if struct is None:
            lv.done = True
        else:
            stage.append((_mat_rows(struct, [STAGE1[0]]), lv))
    run(stage)
    stage = []  # the structures whose plain layout does not fit: the memory-frugal setting
    for lv in levels:
        if lv.done or not len(lv.ev["n"]):
            continue
        ev1, L = lv.ev, float(lv.arch["n_layers"])
        tight = (ev1["error"] & ERR_MEMORY) != 0
        if tight.any():
            frugal = np.column_stack([ev1["tp"][tight], ev1["pp"][tight], ev1["dp"][tight],
                                      np.full(int(tight.sum()), L), ev1["cp"][tight], ev1["tp_mode"][tight]])
            stage.append((_mat_rows(frugal, [STAGE1[1]]), lv))
    run(stage)
    for lv in levels:
        if lv.done:
            continue
        order = _rank(lv.ev)
        if not len(order):
            lv.done = True
            continue
        seen = set()
        for i in order:
            ev1 = lv.ev
            key = (ev1["tp"][i], ev1["pp"][i], ev1["dp"][i], ev1["cp"][i], ev1["tp_mode"][i])
            if key not in seen:
                seen.add(key)
                lv.top.append(key + (ev1["sharding"][i], ev1["recompute"][i]))
            if len(lv.top) >= TOP_K:
                break
    live = [lv for lv in levels if not lv.done]
    # stage 2, coordinate-wise: interleave at micro-batch 1, then micro-batch at the best interleave (both at the
    # structure's stage-1 sharding and recompute), then sharding x recompute at the best of those
    run([(_fine_rows(lv.top, int(lv.arch["n_layers"]), [(1, v) for v in VPPS]), lv) for lv in live])
    stage = []
    for lv in live:
        L = float(lv.arch["n_layers"])
        rows = [(t, p, d, L, c, mb, v, sh, rc, tm) for t, p, d, c, tm, _, v, sh, rc in _best_per_structure(lv.ev, lv.top)
                for mb in MICRO_BATCHES if 1 < mb <= max(lv.bmax_seqs, 1.0)]
        stage.append((np.array(rows, dtype=np.float64).reshape(-1, 10), lv))
    run(stage)
    stage = []
    for lv in live:
        L = float(lv.arch["n_layers"])
        rows = [(t, p, d, L, c, mb, v, SHARDING_CODES[sh], RECOMPUTE_CODES[rc], tm)
                for t, p, d, c, tm, mb, v, _, _ in _best_per_structure(lv.ev, lv.top) for sh in SHARDINGS
                for rc in RECOMPUTES]
        stage.append((np.array(rows, dtype=np.float64).reshape(-1, 10), lv))
    run(stage)
    out = []
    for lv in levels:
        if lv.ev is None:
            out.append((None, -1))
        elif lv.done:
            out.append((lv.ev, -1))
        else:
            order = _rank(lv.ev)
            out.append((lv.ev, int(order[0]) if len(order) else -1))
    return out


def _best_per_structure(ev: dict, top: list[tuple]) -> list[tuple]:
    """(tp, pp, dp, cp, tp_mode, micro-batch, interleave, sharding code, recompute code) of each structure's best
    row."""
    out = []
    for t, p, d, c, tm, sh, rc in top:
        mine = np.flatnonzero((ev["tp"] == t) & (ev["pp"] == p) & (ev["dp"] == d) & (ev["cp"] == c)
                              & (ev["tp_mode"] == tm))
        if not len(mine):
            continue
        i = mine[_rank({k: ev[k][mine] for k in _RANK_KEYS})[0]]
        out.append((t, p, d, c, tm, ev["mb"][i], ev["vpp"][i], ev["sharding"][i], ev["recompute"][i]))
    return out


def _fine_rows(top: list[tuple], layers: int, fine: list[tuple]) -> np.ndarray:
    """(tp, pp, dp, layers, cp, mb, vpp, shard, rc, tp_mode) rows: each structure (with its sharding and recompute
    codes) × every (micro-batch, interleave)."""
    f = np.asarray(fine, dtype=np.float64)
    s = np.asarray([(t, p, d, float(layers), c, sh, rc, tm) for t, p, d, c, tm, sh, rc in top], dtype=np.float64)
    S = np.repeat(s, len(f), axis=0)
    F = np.tile(f, (len(s), 1))
    return np.column_stack([S[:, :5], F, S[:, 5:]])


def _concat(a: dict, b: dict) -> dict:
    if not len(b["n"]):
        return a
    if not len(a["n"]):
        return b
    out = {k: np.concatenate([a[k], b[k]]) for k in a if k != "res"}
    out["res"] = {k: np.concatenate([np.asarray(a["res"][k]), np.asarray(b["res"][k])]) for k in a["res"]}
    return out


# ------------------------------------------------------------------ the sweep

def frontier_sweep(hw_row: Mapping[str, Any], months: float = 3.0, *, params: PhysParams = DEFAULT,
                   dtype: str = "bf16", flops=None, usd_per_gpu_hour: float | None = None,
                   seq_len: int = SEQ_LEN, assumptions: str = "realistic", batch_rule: str = "deepseek",
                   fixed_batch_tokens: float = FIXED_BATCH_TOKENS, tp_form: str = "1d") -> pl.DataFrame:
    """One row per compute level (module docstring): the compute-optimal model, the batch ceiling, the latency
    wall, and the best cluster/layout finishing within ``months``; ``feasible`` false rows carry the reason and
    every row its ``binding`` constraint. ``params`` are used as given: apply ``models.fitting.assumptions.params_for``
    before; ``assumptions`` names them in the output. ``tp_form``: 1d | 2d | any (module docstring, step 4)."""
    if not months or months <= 0:
        raise ValueError(f"months must be > 0, got {months}")
    check_assumptions(assumptions)
    if batch_rule not in BATCH_RULES:
        raise ValueError(f"batch rule must be one of {', '.join(BATCH_RULES)}, got '{batch_rule}'")
    if tp_form not in TP_FORMS:
        raise ValueError(f"tensor-parallel form must be one of {', '.join(TP_FORMS)}, got '{tp_form}'")
    limit_s = months * DAYS_PER_MONTH * 86_400.0
    phys = physical_params(params)  # once per sweep: every level and layout evaluation uses it
    kpl = kernels_per_layer(phys)
    grid = flop_grid() if flops is None else np.asarray(flops, dtype=np.float64)
    peak_tflops = _peak(hw_row, dtype)
    mem_gb = float(hw_row.get("memory_gb") or 0.0)
    price = _num_or_none(usd_per_gpu_hour)
    launch = _num_or_none(hw_row.get("launch_price_usd"))
    rows: list[dict[str, Any]] = []  # one per level; a level to search is completed after the search
    pending: list[tuple[int, _Level, float, float]] = []
    for target in grid:
        arch = dense_arch_for_params(math.sqrt(target / (6.0 * TOKENS_PER_PARAM)))
        n_params = arch["params"]
        tokens = TOKENS_PER_PARAM * n_params
        c6nd = 6.0 * n_params * tokens
        shp = gpt_shape(np.array([arch["d_model"]]), np.array([arch["n_layers"]]), np.array([arch["n_heads"]]))
        model_flop = float(model_flops_per_token(shp, seq_len)[0]) * tokens
        b_tok = float(batch_tokens(c6nd, batch_rule, fixed_batch_tokens))
        bmax = max(b_tok / seq_len, 1.0)
        wall = float(latency_wall_s(arch["n_layers"], tokens, bmax * seq_len, phys))
        n_lo = model_flop / (limit_s * peak_tflops * 1e12) if peak_tflops else math.inf
        n_mem = STATE_BYTES_MIN * n_params / float(capacity_bytes(mem_gb)) if mem_gb > 0 else math.inf
        base = {"target_flop": float(target), "training_flop": c6nd, "model_flop": model_flop, "arch_id": arch["id"],
                "params": n_params, "tokens": tokens, "d_model": arch["d_model"], "n_layers": arch["n_layers"],
                "n_heads": arch["n_heads"], "seq_len": seq_len, "batch_rule": batch_rule,
                "critical_batch_tokens": b_tok, "latency_wall_days": wall / 86_400.0, "months": float(months),
                "n_gpus_min": n_lo, "assumptions": assumptions}
        n_par = max_accelerators(arch["n_layers"], arch["n_heads"], bmax, seq_len)
        base["n_gpus_max"] = n_par
        if wall > limit_s:
            rows.append(base | {"feasible": False, "binding": "latency",
                                "reason": f"latency wall: even at the batch ceiling the kernels in series take "
                                          f"{wall / 86400 / DAYS_PER_MONTH:.3g} months"})
        elif not math.isfinite(n_lo):
            rows.append(base | {"feasible": False, "binding": "compute",
                                "reason": f"no {dtype} peak for this accelerator"})
        elif max(n_lo, n_mem) > n_par * (1 + 1e-9):
            # the layouts' degrees are bounded (tp by the heads, pp by the layers, dp by the batch ceiling): fewer
            # accelerators than the run needs at 100 % utilization (or to hold its states) is a parallelism limit
            need, what = (n_lo, "finish at 100 % utilization") if n_lo >= n_mem else (n_mem, "hold its states")
            rows.append(base | {"feasible": False, "binding": "batch" if n_lo >= n_mem else "memory",
                                "reason": f"the batch ceiling ({bmax:,.0f} sequences) and the model's "
                                          f"{arch['n_heads']} heads and {arch['n_layers']} layers allow at most "
                                          f"{n_par:,.0f} accelerators; {need:,.0f} are needed to {what}"})
        else:
            pending.append((len(rows), _Level(arch, max(n_lo, n_mem), bmax, tokens), n_lo, n_mem))
            rows.append(base)
    found = _search_levels([lv for _, lv, _, _ in pending], hw_row, seq_len, dtype, params, limit_s, tp_form, kpl)
    for (i, _, n_lo, n_mem), (ev, j) in zip(pending, found):
        rows[i] = rows[i] | _level_result(ev, j, n_lo, n_mem, mem_gb, months)
    return _frame(rows, price, launch)


def _level_result(ev: dict | None, j: int, n_lo: float, n_mem: float, mem_gb: float, months: float
                  ) -> dict[str, Any]:
    """A searched level's columns: the chosen layout, or why none was chosen (``binding``, ``reason``)."""
    if ev is None or j < 0 or not len(ev["n"]):
        return {"feasible": False, "binding": "batch",
                "reason": "no layout of the grid fits the batch ceiling: dp × micro-batch (× pp, interleaved) "
                          "exceeds it at every size that holds the model"}
    if not ev["feasible"][j]:
        valid = np.isfinite(ev["mem"]) & ~ev["feasible"]
        need = float(np.nanmin(ev["mem"][valid])) if valid.any() else float("nan")
        return {"feasible": False, "binding": "memory",
                "reason": f"no layout fits in memory: the smallest needs {need:.3g} GB per accelerator > "
                          f"{float(capacity_bytes(mem_gb)) / 1e9:.3g} GB ({mem_gb:g} GB as stated: binary)"}
    rec = _record(ev, j)
    if not ev["in_time"][j]:
        # the fastest layout's largest loss says what keeps it from finishing (its utilization below 1/N_WINDOW)
        return rec | {"feasible": False, "binding": "time", "utilization": None, "limited_by": _binding(rec),
                      "reason": f"no layout of {max(n_lo, n_mem, 1):,.0f}–"
                                f"{max(n_lo, n_mem, 1) * N_WINDOW:,.0f} accelerators finishes within "
                                f"{months:g} months (fastest {ev['time_s'][j] / 86400 / DAYS_PER_MONTH:.3g} months, "
                                f"limited by {_LOSS_WORDS[_binding(rec)]})"}
    b = _binding(rec)
    return rec | {"feasible": True, "reason": None, "binding": b, "limited_by": b}


def _record(ev: dict, j: int) -> dict[str, Any]:
    res = ev["res"]
    rec = {"n_gpus": int(ev["n"][j]), "tp": int(ev["tp"][j]), "pp": int(ev["pp"][j]), "dp": int(ev["dp"][j]),
           "cp": int(ev["cp"][j]), "ep": 1, "vpp": int(ev["vpp"][j]), "micro_batch": int(ev["mb"][j]),
           "sharding": {v: k for k, v in SHARDING_CODES.items()}[int(ev["sharding"][j])],
           "recompute": {v: k for k, v in RECOMPUTE_CODES.items()}[int(ev["recompute"][j])],
           "tp_mode": {v: k for k, v in TP_MODE_CODES.items()}[int(ev["tp_mode"][j])],
           "global_batch_seqs": int(ev["batch"][j]), "step_time_s": float(ev["step"][j]),
           "kernel_floor_s": float(ev["floor"][j]), "mfu": float(ev["mfu"][j]), "utilization": float(ev["mfu"][j]),
           "tokens_per_s_per_gpu": float(res["tokens_per_s_per_gpu"][j] * ev["step_model"][j] / ev["step"][j]),
           "memory_gb_per_gpu": float(ev["mem"][j]), "time_to_train_days": float(ev["time_s"][j]) / 86_400.0}
    for k in BREAKDOWN:
        rec[k] = float(res[k][j])
    # the kernel floor's excess over the model's step is latency the breakdown does not show
    rec["latency_floor_excess_s"] = float(ev["step"][j] - ev["step_model"][j])
    return rec


#: what each binding constraint of a level means, for the sentences that say what ended a frontier
_LOSS_WORDS = {"latency": "the kernel-latency floor", "bandwidth": "exposed communication",
               "batch": "the pipeline bubble the batch ceiling leaves", "compute": "compute efficiency",
               "memory": "memory", "time": "the time limit"}


def _binding(rec: Mapping[str, Any]) -> str:
    step = rec["step_time_s"]
    losses = {"latency": rec["latency_floor_excess_s"], "bandwidth": sum(rec[k] for k in COMM),
              "batch": rec["pp_bubble_s"]}
    name, worst = max(losses.items(), key=lambda kv: kv[1])
    return name if worst > LOSS_SHARE_NONE * step else "compute"


def _num_or_none(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f > 0 else None


_TYPES = {"n_gpus": pl.Int64, "tp": pl.Int64, "pp": pl.Int64, "dp": pl.Int64, "cp": pl.Int64, "ep": pl.Int64,
          "vpp": pl.Int64, "micro_batch": pl.Int64, "global_batch_seqs": pl.Int64, "sharding": pl.Utf8,
          "recompute": pl.Utf8, "tp_mode": pl.Utf8, "utilization": pl.Float64, "time_to_train_days": pl.Float64,
          "step_time_s": pl.Float64, "kernel_floor_s": pl.Float64, "tokens_per_s_per_gpu": pl.Float64,
          "mfu": pl.Float64, "memory_gb_per_gpu": pl.Float64, "latency_floor_excess_s": pl.Float64,
          "reason": pl.Utf8, "binding": pl.Utf8, "limited_by": pl.Utf8, "n_gpus_max": pl.Float64,
          **{b: pl.Float64 for b in BREAKDOWN}}


def _frame(rows: list[dict], price: float | None, launch: float | None) -> pl.DataFrame:
    df = pl.DataFrame(rows, infer_schema_length=None)
    for c, t in _TYPES.items():
        df = df.with_columns(pl.col(c).cast(t)) if c in df.columns else df.with_columns(pl.lit(None, dtype=t).alias(c))
    if price is not None:
        cost = pl.col("time_to_train_days") * 24.0 * pl.col("n_gpus") * price
        basis = f"cloud: {price:g} USD per accelerator-hour x N x hours"
    elif launch is not None:
        cost = pl.col("n_gpus").cast(pl.Float64) * launch
        basis = (f"purchase: launch price {launch:g} USD x N, charged in full to the run (no resale value; power, "
                 f"hosting and network excluded)")
    else:
        cost, basis = pl.lit(None, dtype=pl.Float64), "none: no cloud or launch price for this accelerator"
    return df.with_columns(pl.lit(price, dtype=pl.Float64).alias("usd_per_gpu_hour"),
                           pl.lit(launch, dtype=pl.Float64).alias("launch_price_usd"),
                           cost.cast(pl.Float64).alias("cost_usd"), pl.lit(basis).alias("cost_basis"))


def _peak(hw_row: Mapping[str, Any], dtype: str) -> float:
    """The dense peak the run's precision uses (models.physics.hardware.peak_tflops_for)."""

    arrays = {k: np.array([float(hw_row[k]) if hw_row.get(k) is not None else np.nan])
              for k in ("peak_fp32_tflops", "peak_tf32_tflops", "peak_bf16_tflops", "peak_fp16_tflops",
                        "peak_fp8_tflops")}
    peak, _ = peak_tflops_for(dtype, arrays)
    v = float(np.asarray(peak).ravel()[0])
    return v if math.isfinite(v) and v > 0 else 0.0


# ------------------------------------------------------------------ the frontier point

def frontier_summary(sweep: pl.DataFrame, min_utilization: float = 0.8) -> dict[str, Any]:
    """The frontier point (module docstring, step 7). ``found`` false (and the reason) when no level was
    feasible."""
    if not 0 < min_utilization <= 1:
        raise ValueError(f"min_utilization must be in (0, 1], got {min_utilization}")
    s = sweep.sort("training_flop") if sweep.height else sweep
    ok = s.filter(pl.col("feasible")) if s.height else s
    if ok.height == 0:
        reasons = s["reason"].drop_nulls().unique(maintain_order=True).to_list() if s.height else []
        return {"found": False, "reason": reasons[0] if reasons else "no compute level evaluated",
                "best_utilization": None, "utilization_threshold": None}
    u = s["utilization"].fill_null(0.0).to_numpy().astype(np.float64) * s["feasible"].to_numpy()
    c = s["training_flop"].to_numpy()
    i_start, best_u = best_sustained(u)
    thr = min_utilization * best_u
    i_end = exit_level(u, thr, i_start)
    i_top = len(u) - 1 if i_end is None else i_end - 1
    top = s.row(i_top, named=True)
    out = {"found": True, "reason": None, "best_utilization": best_u,
           "best_utilization_flop": float(c[min(i_start + SUSTAIN_LEVELS // 2, len(c) - 1)]),
           "peak_utilization": float(u.max()), "utilization_threshold": thr, "min_utilization": min_utilization}
    if i_end is None:
        out |= {"crossing_flop": None, "ended_by": None,
                "ended_by_reason": f"the grid ends at {c[-1]:.3g} FLOP with utilization still >= {thr:.3g}"}
    else:
        end = s.row(i_end, named=True)
        frac = (u[i_top] - thr) / (u[i_top] - u[i_end]) if u[i_top] > u[i_end] else 0.0
        crossing = float(10 ** (math.log10(c[i_top]) + frac * (math.log10(c[i_end]) - math.log10(c[i_top]))))
        out |= {"crossing_flop": crossing, "ended_by": end.get("binding"),
                "ended_by_reason": _end_sentence(end, u[i_end], thr, min_utilization, best_u)}
    return out | reach(s) | top


def best_sustained(u: np.ndarray, levels: int | None = None) -> tuple[int, float]:
    """(first level, utilization) of the best utilization sustained over ``SUSTAIN_LEVELS`` consecutive compute
    levels: the highest of each run's lowest. One level's spike (a degenerate shape at the grid's low end, a lucky
    layout) does not set the accelerator's best; with fewer levels than that, the best level."""
    k = SUSTAIN_LEVELS if levels is None else levels
    u = np.asarray(u, dtype=np.float64)
    if len(u) < k or k <= 1:
        i = int(np.argmax(u))
        return i, float(u[i])
    lows = np.lib.stride_tricks.sliding_window_view(u, k).min(axis=1)
    i = int(np.argmax(lows))
    return i, float(lows[i])


def exit_level(u: np.ndarray, threshold: float, start: int) -> int | None:
    """Epoch AI's "not fall below": the first level after ``start`` whose utilization (0 where infeasible) is below
    ``threshold``, or None when none is. A later recovery does not extend the frontier."""
    below = np.flatnonzero((np.arange(len(u)) > start) & (np.asarray(u) < threshold))
    return int(below[0]) if len(below) else None


def reach(sweep: pl.DataFrame) -> dict[str, Any]:
    """How far the sweep can train at all, whatever the utilization: the largest feasible level, the first level
    after it and what makes that one infeasible (``reach_ended_by``, ``reach_reason``), and the first level behind
    the latency wall (None when the wall is beyond the grid)."""
    s = sweep.sort("training_flop")
    feas = s["feasible"].fill_null(False).to_numpy()
    c = s["training_flop"].to_numpy()
    wall = s["latency_wall_days"].to_numpy() > s["months"].to_numpy() * DAYS_PER_MONTH
    out: dict[str, Any] = {"latency_wall_flop": float(c[np.argmax(wall)]) if wall.any() else None}
    if not feas.any():
        return out | {"largest_feasible_flop": None, "reach_ended_by": None, "reach_reason": None}
    last = int(np.flatnonzero(feas)[-1])
    out["largest_feasible_flop"] = float(c[last])
    if last + 1 >= len(c):
        return out | {"reach_ended_by": None, "reach_reason": f"the grid ends at {c[-1]:.3g} FLOP"}
    nxt = s.row(last + 1, named=True)
    by = nxt.get("binding")
    if by == "time" and nxt.get("limited_by"):
        by = nxt["limited_by"]
    return out | {"reach_ended_by": by, "reach_reason": f"at {c[last + 1]:.3g} FLOP: {nxt.get('reason')}"}


def _end_sentence(end: Mapping[str, Any], u_end: float, thr: float, min_utilization: float, best_u: float) -> str:
    """Why the level that ends the frontier does: its reason when infeasible, else its largest loss."""
    head = f"at {end['training_flop']:.3g} FLOP "
    if not end.get("feasible"):
        return head + f"no layout trains the model: {end.get('reason')}"
    by = end.get("binding") or "compute"
    loss = {"latency": end.get("latency_floor_excess_s"), "bandwidth": sum(end.get(k) or 0.0 for k in COMM),
            "batch": end.get("pp_bubble_s")}.get(by)
    share = f" takes {loss / end['step_time_s']:.0%} of the step" if loss and end.get("step_time_s") else ""
    return (head + f"the best layout's utilization {u_end:.3g} is below {thr:.3g} ({min_utilization:g} x the best "
            f"sustained {best_u:.3g}): {_LOSS_WORDS.get(by, by)}{share}")


def frontier_table(hw_row: Mapping[str, Any], params: PhysParams = DEFAULT, *, months: float = 3.0,
                   min_utilization: float = 0.8, dtype: str = "bf16", usd_per_gpu_hour: float | None = None,
                   assumptions=("ideal", "realistic"), batch_rule: str = "deepseek",
                   note: str = "") -> pl.DataFrame:
    """Every level of one accelerator's sweep under each assumption set (``params`` are the realistic ones;
    ``models.fitting.assumptions.params_for`` derives the ideal ones), with the frontier row of each flagged
    (``is_frontier``) and its summary columns. One accelerator per call: the unit of work of the build's
    partitions."""
    parts = []
    for a in assumptions:
        # a fit answers through the one prediction function (models.fitting.predictor) under each assumption set
        model = (Predictor(params.calibration if isinstance(params, Predictor) else params, a)
                 if isinstance(params, (Calibration, Predictor)) else params_for(a, params))
        sweep = frontier_sweep(hw_row, months, params=model, dtype=dtype,
                               usd_per_gpu_hour=usd_per_gpu_hour, assumptions=a, batch_rule=batch_rule)
        s = frontier_summary(sweep, min_utilization)
        flag = (pl.col("training_flop") == s["training_flop"]) if s["found"] else pl.lit(False)
        parts.append(sweep.with_columns(
            pl.lit(str(hw_row.get("id") or "")).alias("gpu"), pl.lit(dtype).alias("dtype"),
            pl.lit(float(min_utilization)).alias("min_utilization"),
            pl.lit(s.get("best_utilization"), dtype=pl.Float64).alias("best_utilization"),
            pl.lit(s.get("utilization_threshold"), dtype=pl.Float64).alias("utilization_threshold"),
            pl.lit(s.get("crossing_flop"), dtype=pl.Float64).alias("crossing_flop"),
            pl.lit(s.get("ended_by"), dtype=pl.Utf8).alias("ended_by"),
            pl.lit(s.get("largest_feasible_flop"), dtype=pl.Float64).alias("largest_feasible_flop"),
            flag.fill_null(False).alias("is_frontier"), pl.lit(note if a == "realistic" else
                                                                 "ideal: no residual calibration")
            .alias("calibration_note")))
    return pl.concat(parts, how="diagonal_relaxed")
