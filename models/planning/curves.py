"""Scaling curves: the best layout at each cluster size N, and where adding accelerators stops paying off.

Pure and vectorized: every (N, global batch) point of a sweep is enumerated with ``models.planning.search``'s rules, all
layouts of all points go through **one** ``predict_arrays`` call, and the best feasible layout per point is
picked by tokens/s/GPU (the same ranking as ``models.planning.search.search(rank_by='throughput')``).

Sweep (``n_sweep``): N = node × {1, 2, 3, 4, 6, 8, 12, 16, …} — the powers of two times the node and the
node-aligned sizes half-way between them (×1.5), from one node to ``n_max``. ``node`` is the accelerator's
typical node (``gpus_per_node_typical``; the scale-up domain when empty), so NVL72 parts step by 72.

Batch policies (``policy_batches``):

* ``strong``   fixed global batch (sequences) at every N.
* ``weak``     fixed per-accelerator batch: global batch = per_gpu_batch_seqs × N.
* ``critical`` weak scaling up to a critical-batch-size ceiling that grows with training compute C (``batch_rule``:
  'deepseek' below by default; 'kaplan' and 'fixed', ``batch_tokens``)
  (= 6 · params · tokens, the C ≈ 6ND convention of Kaplan et al. 2020 / Hoffmann et al. 2022):
  ``B_crit(C) = 0.2920 · C^0.3271`` tokens — the DeepSeek LLM batch-size scaling fit (DeepSeek-AI 2024,
  arXiv:2401.02954, §3.1, eq. 1: B_opt = 0.2920·C^0.3271, fitted on 1e17–3e20 FLOP runs and validated to
  DeepSeek 67B; beyond this batch the loss per token rises, McCandlish et al. 2018). Batches (sequences) are
  rounded *down* to 2^a or 3·2^a so that data-parallel degrees of node-aligned clusters divide them.

Search grid (``CURVE_GRID``, restricted for speed; ``models.planning.search`` enumerates the rest unchanged): micro-batch
∈ {1, 2, 4}; sharding ∈ {zero1 (Megatron distributed optimizer), zero2, zero3 (FSDP-style), hsdp} ('none' when
dp·cp = 1); recompute ∈ {none, selective, full}; sequence parallelism on whenever tp > 1 (same traffic as plain
TP, less activation memory); interleaving vpp ∈ {1, 2, 4}; context parallelism only for seq_len ≥ 16,384.
``benchmarks/bench_curves.py`` prints how far this lands from the unrestricted ``models.planning.search.search`` on
reference cases (0.96–1.00 of its best tokens/s/GPU when written, 10–200× faster).

Efficiencies (X = tokens/s of the whole cluster, N₀ = the smallest N with a feasible layout, P(N) = the best
throughput per accelerator of any feasible size smaller than N, P(N₀) = X(N₀)/N₀):

* parallel efficiency ``E(N) = (X(N)/N) / P(N)``: against the best smaller size, so that a size made worse by
  divisibility never lifts a later one above 1. E > 1 only where N beats every smaller size per accelerator
  (super-linear); ``layout_note`` then says what the smaller sizes lack (memory for activations, batch per
  accelerator, their divisibility, or the calibration's correction).
* marginal efficiency ``M(Nᵢ) = [(X(Nᵢ) − X(Nᵢ₋₁)) / (Nᵢ − Nᵢ₋₁)] / P(Nᵢ)`` between consecutive Pareto sizes
  (``pareto_mask``: sizes beaten per accelerator by a larger one are skipped): the throughput the last
  accelerators added bring, per accelerator, relative to the best accelerator of a smaller cluster.
  1 = perfect scaling; 0 = the added accelerators bring nothing; < 0 = they slow the job down.
* inflection point: the smallest N with ``M(N) < threshold`` (``DEFAULT_THRESHOLD`` = 0.5: from there on, each
  added accelerator delivers less than half of what the best smaller cluster's accelerators deliver, i.e. the
  cluster-hours per token grow faster than the time saved). Its interval comes from the same rule applied to the
  calibrated lower and upper throughput bounds (equal to the point value when the curve is analytical only).
* ``efficient`` (``verdict``): the sizes where extra accelerators still pay — feasible, not beaten per accelerator
  by a larger size, faster as a whole job than every smaller size, and below the knee. ``explain``'s sentence names
  the largest of them and lists the smaller sizes that are not worth running; ``layout_note`` says why each odd
  point is odd (beaten by a larger size, slower than a smaller one, the batch or the layers not dividing at that N,
  super-linear).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping

import numpy as np
import polars as pl

from models.arch import moe
from models.arch.accounting import param_counts
from models.core.params import (
    DEFAULT,
    DTYPE_CODES,
    RECOMPUTE_CODES,
    SHARDING_CODES,
    TP_MODE_CODES,
    PhysParams,
    Sharding,
    TpMode,
)
from models.fitting.calibration import apply_calibration
from models.fitting.predictor import Predictor, predict_arrays
from models.memory.model import capacity_bytes
from models.physics import tp2d
from models.physics.step_time import BREAKDOWN
from models.physics.step_time import (
    ERR_MEMORY,
    INVALID_MASK,
    OUTPUT_COLUMNS,
    encode_arch,
)
from models.planning.search import _INV, LAYOUT_DIMS, _num, broadcast_arch_hw
from models.planning.usl import fit_usl

# the layout columns of a result: the search's dimensions with the tensor-parallel form beside tp
_DIMS = ("tp", "tp_mode") + tuple(c for c in LAYOUT_DIMS if c != "tp")

POLICIES = ("strong", "weak", "critical")
DEFAULT_THRESHOLD = 0.5
# a larger size must be more than 2 % faster per accelerator to make a smaller one not worth running (dominated):
# smaller gaps (e.g. the optimizer state sharded over a few more replicas as weak scaling grows dp) are below what
# the model resolves (its layout grid alone lands up to 4 % from the full search, benchmarks/bench_curves.py)
DOMINANCE_TOLERANCE = 0.02
# DeepSeek LLM (DeepSeek-AI 2024, arXiv:2401.02954) eq. 1: B_opt = 0.2920 * C^0.3271 tokens
CRIT_BATCH_COEF = 0.2920
CRIT_BATCH_EXP = 0.3271
# Batch ceilings (``batch_tokens``): 'deepseek' the rule above; 'kaplan' the critical batch of Kaplan et al. 2020
# (arXiv:2001.08361) eq. 1.4, B_crit(L) = B* / L^(1/alpha_B), at the loss (nats/token) of compute-optimal training,
# eq. 1.3, L(C_min) = (C_c / C_min)^alpha_C with C in PF-days; 'fixed' one batch at every compute.
BATCH_RULES = ("deepseek", "kaplan", "fixed")
KAPLAN_B_STAR_TOKENS, KAPLAN_ALPHA_B = 2e8, 0.21  # Kaplan et al. 2020, eq. 1.4
KAPLAN_C_C_PF_DAYS, KAPLAN_ALPHA_C = 3.1e8, 0.050  # Kaplan et al. 2020, eq. 1.3 (C_min)
PF_DAY_FLOP = 1e15 * 86_400.0
FIXED_BATCH_TOKENS = 2.0**22  # Llama 3 initial batch, 4M tokens (Dubey et al. 2024 §3.4.1)

SECONDS_PER_DAY = 86_400.0
# USL peaks beyond this multiple of the largest swept size are not reported (an extrapolation of κ ≈ 0)
PEAK_EXTRAPOLATION = 10.0

CURVE_GRID: dict[str, Any] = {
    "micro_batch": [1, 2, 4],
    "sharding": ["zero1", "zero2", "zero3", "hsdp"],
    "recompute": ["none", "selective", "full"],
    "vpp": [1, 2, 4],
}
LONG_SEQ_FOR_CP = 16_384
MAX_CP, MAX_VPP, MAX_MICRO_BATCH = 16, 8, 64  # models.planning.search's limits

# The target runs the build sweeps on every accelerator (report pages, hardware choice), with their sources.
REFERENCE_RUNS: tuple[dict[str, Any], ...] = (
    {"arch_id": "gpt3-175b", "seq_len": 2048, "global_batch_seqs": 1536, "tokens": 300e9,
     "source": "Brown et al. 2020, Table 2.1 (batch 3.2M tokens = 1,536 x 2,048) and §2.2 (300B training tokens)"},
    {"arch_id": "llama3-8b", "seq_len": 8192, "global_batch_seqs": 512, "tokens": 15e12,
     "source": "Dubey et al. 2024 (Llama 3): 15T tokens; 4M-token batch (512 x 8,192), the initial Llama 3 "
               "batch (§3.4.1)"},
)
# weak scaling: one sequence per accelerator, where Narayanan et al. 2021 Table 1 ends (1T on 3,072 GPUs,
# batch 3,072)
DEFAULT_PER_GPU_BATCH_SEQS = 1.0
DEFAULT_N_MAX = 16_384  # Llama 3 405B trained on 16K H100 (Dubey et al. 2024 §3.3)


# What a calibration hook returns (the contract with models/calibration.apply_calibration).
CALIBRATED_COLUMNS = ("step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu",
                      "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "fit_version")
Calibrate = Callable[[pl.DataFrame, pl.DataFrame], pl.DataFrame]


# ------------------------------------------------------------------ sweeps and batches

def node_size(hw_row: Mapping[str, Any]) -> int:
    """Accelerators per node: ``gpus_per_node_typical``, else the scale-up domain, else 8."""
    for key in ("gpus_per_node_typical", "scaleup_size"):
        v = hw_row.get(key)
        if v is not None and not (isinstance(v, float) and math.isnan(v)) and float(v) >= 1:
            return int(v)
    return 8


def default_dtype(hw_row: Mapping[str, Any]) -> str:
    """The precision an accelerator trains in: fp32 on fp32-only parts (GTX 580, GTX 1080 Ti, K80:
    ``models.physics.hardware`` flag ``fp32_only``), fp16 where there is no BF16 peak (P100, V100: mixed-precision FP16
    with loss scaling, Micikevicius et al. 2018), bf16 otherwise."""
    if hw_row.get("fp32_only"):
        return "fp32"
    bf16 = hw_row.get("peak_bf16_tflops")
    if bf16 is None or (isinstance(bf16, float) and math.isnan(bf16)):
        return "fp16"
    return "bf16"


def n_sweep(node: int, n_max: int, n_min: int | None = None) -> list[int]:
    """node × {1, 2, 3, 4, 6, 8, 12, …} between n_min (default: one node) and n_max."""
    node = max(int(node), 1)
    lo = max(int(n_min or node), 1)
    out, k = [], 1
    while node * k <= n_max:
        for m in (k, 3 * k // 2) if k >= 2 else (k,):
            if lo <= node * m <= n_max:
                out.append(node * m)
        k *= 2
    return sorted(set(out))


def round_batch(seqs: float) -> int:
    """Largest 2^a or 3·2^a not above ``seqs`` (at least 1)."""
    if not np.isfinite(seqs) or seqs < 1:
        return 1
    p = 2 ** int(math.floor(math.log2(seqs)))
    return 3 * p // 2 if p >= 2 and 3 * p // 2 <= seqs else p


def batch_tokens(training_flop, rule: str = "deepseek", fixed_tokens: float = FIXED_BATCH_TOKENS) -> np.ndarray:
    """The batch ceiling in tokens at training compute C under a batch rule (``BATCH_RULES``, sources beside
    the constants)."""
    c = np.asarray(training_flop, dtype=np.float64)
    if rule == "deepseek":
        return CRIT_BATCH_COEF * np.power(c, CRIT_BATCH_EXP)
    if rule == "kaplan":
        loss = np.power(KAPLAN_C_C_PF_DAYS / (c / PF_DAY_FLOP), KAPLAN_ALPHA_C)
        return KAPLAN_B_STAR_TOKENS * np.power(loss, -1.0 / KAPLAN_ALPHA_B)
    if rule == "fixed":
        return np.full(np.shape(c), float(fixed_tokens))
    raise ValueError(f"batch rule must be one of {', '.join(BATCH_RULES)}, got '{rule}'")


def critical_batch_tokens(training_flop) -> np.ndarray:
    """DeepSeek LLM 2024 batch-size rule: B(C) = 0.2920 · C^0.3271 tokens."""
    return batch_tokens(training_flop, "deepseek")


def critical_batch_seqs(training_flop: float, seq_len: int, rule: str = "deepseek") -> int:
    return round_batch(float(batch_tokens(training_flop, rule)) / seq_len)


def policy_batches(policy: str, n_values, *, global_batch_seqs: int | None = None, per_gpu_batch_seqs: float = 1.0,
                   ceiling_seqs: int | None = None) -> np.ndarray:
    """Global batch (sequences) at each N for a policy (module docstring)."""
    n = np.asarray(n_values, dtype=np.int64)
    if policy == "strong":
        if not global_batch_seqs:
            raise ValueError("strong scaling needs global_batch_seqs")
        return np.full(len(n), int(global_batch_seqs), dtype=np.int64)
    weak = np.array([round_batch(per_gpu_batch_seqs * x) for x in n], dtype=np.int64)
    if policy == "weak":
        return weak
    if policy == "critical":
        if not ceiling_seqs:
            raise ValueError("the critical policy needs ceiling_seqs")
        return np.minimum(weak, int(ceiling_seqs))
    raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got '{policy}'")


# ------------------------------------------------------------------ best layout per point

def _grid_for(seq_len: int, grid: Mapping[str, Any] | None) -> dict[str, Any]:
    g = dict(CURVE_GRID if grid is None else grid)
    if seq_len < LONG_SEQ_FOR_CP and "cp" not in g:
        g["cp"] = [1]
    return g


def _fmt_int(x) -> str:
    return f"{int(x):,}"


@functools.lru_cache(maxsize=4096)
def _divisors(n: int) -> list[int]:
    small = [i for i in range(1, int(math.isqrt(int(n))) + 1) if n % i == 0]
    return sorted(set(small + [int(n) // i for i in small]))


def enumerate_points(arch_row: Mapping[str, Any], hw_row: Mapping[str, Any], n_values, batches, seq_len: int,
                     grid: Mapping[str, Any], dtype: str = "bf16") -> tuple[dict[str, Any], np.ndarray]:
    """Every layout of every (N, batch) point, as one set of ``predict_arrays`` inputs + the point index of
    each row.

    The rules are those of ``models.planning.search.enumerate_layouts`` (tp | N, tp | heads, inside or beyond the
    scale-up domain;
    pp | N/tp, pp ≤ layers; cp a power of two ≤ 16 dividing N/(tp·pp) and seq_len; dp = N/(tp·pp·cp) dividing
    the batch; ep | dp and ep | experts for MoE, etp 1 or tp for MoE with tp > 1 (models.arch.moe); vpp ≤ ceil(layers/pp)
    and only with pp > 1; micro-batch dividing batch/dp, ≤ 64; sharding 'none' when dp·cp = 1; tp_mode 1d, and 2d
    for tp ≥ 4) restricted to ``grid``'s values, plus sequence parallelism on whenever tp > 1. Built with numpy
    instead of per-block Python lists: a 20-point sweep is
    enumerated in milliseconds (tests check it finds the same best layout as ``models.planning.search.search``)."""
    L = int(_num(arch_row, "n_layers"))
    heads = int(_num(arch_row, "n_heads"))
    E = _num(arch_row, "n_experts", 0.0)
    E = int(E) if np.isfinite(E) else 0
    scaleup = int(_num(hw_row, "scaleup_size", 8.0))
    s = int(seq_len)
    shard_codes = [SHARDING_CODES[x] if isinstance(x, str) else int(x) for x in grid.get("sharding", list(SHARDING_CODES))]
    rc_codes = [RECOMPUTE_CODES[x] if isinstance(x, str) else int(x)
                for x in grid.get("recompute", list(RECOMPUTE_CODES))]
    mbs = [int(x) for x in grid.get("micro_batch", [1, 2, 4, 8, 16, 32, 64]) if int(x) <= MAX_MICRO_BATCH]
    vpps_g = [int(x) for x in grid.get("vpp", list(range(1, MAX_VPP + 1)))]
    cps_g = grid.get("cp")
    modes_g = [TP_MODE_CODES[x] if isinstance(x, str) else int(x) for x in grid.get("tp_mode", list(TP_MODE_CODES))]
    struct: list[tuple[int, ...]] = []
    for i, (n, B) in enumerate(zip(n_values, batches)):
        n, B = int(n), int(B)
        for tp in _divisors(n):
            if heads % tp:
                continue
            for pp in _divisors(n // tp):
                if pp > L:
                    break
                rest = n // (tp * pp)
                for cp in (1, 2, 4, 8, 16):
                    if cp > MAX_CP or rest % cp or s % cp or (cps_g is not None and cp not in cps_g):
                        continue
                    dp = rest // cp
                    if B % dp:
                        continue
                    eps = [e for e in _divisors(dp) if E % e == 0] if E > 0 else [1]
                    etps = moe.etp_candidates(E, tp)
                    ls = -(-L // pp)
                    for vpp in vpps_g:
                        if vpp > 1 and (pp == 1 or ls < vpp):
                            continue
                        for ep in eps:
                            for etp in etps:
                                for tpm in modes_g:
                                    if tpm == TpMode.ONE_D or tp >= tp2d.MIN_TP:
                                        struct.append((i, n, B, tp, pp, cp, dp, ep, vpp, etp, tpm))
    if not struct:
        return {}, np.zeros(0, dtype=np.int64)
    S = np.asarray(struct, dtype=np.int64)
    # fine grid: micro-batch x sharding (incl. 'none' for dp*cp == 1) x recompute
    shard_grid = sorted(set(shard_codes) | {Sharding.NONE})
    fine = np.asarray([(mb, sh, rc) for mb in mbs for sh in shard_grid for rc in rc_codes], dtype=np.int64)
    k, f = len(S), len(fine)
    S = np.repeat(S, f, axis=0)
    F = np.tile(fine, (k, 1))
    B_, cp_, dp_ = S[:, 2], S[:, 5], S[:, 6]
    mb_, sh_ = F[:, 0], F[:, 1]
    solo = dp_ * cp_ == 1
    keep = ((B_ // dp_) % mb_ == 0) & np.where(solo, sh_ == Sharding.NONE, np.isin(sh_, shard_codes))
    S, F = S[keep], F[keep]
    m = len(S)
    out: dict[str, Any] = {
        "tp": S[:, 3].astype(np.float64), "pp": S[:, 4].astype(np.float64), "cp": S[:, 5].astype(np.float64),
        "dp": S[:, 6].astype(np.float64), "ep": S[:, 7].astype(np.float64), "vpp": S[:, 8].astype(np.float64),
        "etp": S[:, 9].astype(np.float64),
        "micro_batch": F[:, 0].astype(np.float64), "sharding": F[:, 1], "recompute": F[:, 2],
        "sequence_parallel": S[:, 3] > 1, "n_gpus": S[:, 1].astype(np.float64),
        "global_batch_seqs": S[:, 2].astype(np.float64), "seq_len": np.full(m, float(s)),
        "gpus_per_node": np.full(m, float(scaleup)), "dtype": np.full(m, DTYPE_CODES[dtype], dtype=np.int64),
        "tp_mode": S[:, 10].copy(),
    }
    broadcast_arch_hw(out, m, arch_row, hw_row)
    return out, S[:, 0].copy()


def best_layouts(arch_row: Mapping[str, Any], hw_row: Mapping[str, Any], n_values, batches, seq_len: int, *,
                 dtype: str = "bf16", params: PhysParams = DEFAULT, grid: Mapping[str, Any] | None = None,
                 want_configs: bool = True) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Best feasible layout (max tokens/s/GPU) at each (N, global batch) point.

    Returns (best, configs): ``best`` has one row per point — ``n_gpus, global_batch_seqs, layouts_evaluated,
    feasible, reason``, the layout (LAYOUT_DIMS and tp_mode, strings for categoricals) and every prediction column
    (null when no layout is feasible, ``reason`` says why); ``configs`` holds the model-input columns of the
    chosen layouts (for a calibration hook)."""
    g = _grid_for(seq_len, grid)
    allrows, who = enumerate_points(arch_row, hw_row, n_values, batches, seq_len, g, dtype)
    total = len(who)
    res = predict_arrays(allrows, params) if total else {c: np.zeros(0) for c in OUTPUT_COLUMNS}
    feas = np.asarray(res["feasible"], dtype=bool) if total else np.zeros(0, dtype=bool)
    tput = np.where(feas, res["tokens_per_s_per_gpu"], -np.inf) if total else np.zeros(0)
    err = np.asarray(res["error_code"], dtype=np.int64) if total else np.zeros(0, dtype=np.int64)
    mem = np.asarray(res["memory_gb_per_gpu"], dtype=np.float64) if total else np.zeros(0)
    npts = len(n_values)
    # best row per point: sort by (point, -tput) and take the first row of each point
    order = np.lexsort((-tput, who)) if total else np.zeros(0, dtype=np.int64)
    first = np.full(npts, -1, dtype=np.int64)
    if total:
        w_sorted = who[order]
        starts = np.flatnonzero(np.r_[True, w_sorted[1:] != w_sorted[:-1]])
        first[w_sorted[starts]] = order[starts]
        bounds = np.searchsorted(w_sorted, np.arange(npts + 1))  # point i's rows: order[bounds[i]:bounds[i + 1]]
        valid_rows = (err & INVALID_MASK) == 0
        tight_rows = valid_rows & ((err & ERR_MEMORY) != 0)
    counts = np.bincount(who, minlength=npts) if total else np.zeros(npts, dtype=np.int64)
    cap = float(capacity_bytes(float(hw_row.get("memory_gb") or np.nan))) / 1e9  # decimal GB (models.memory.model)
    rows: list[dict[str, Any]] = []
    cfg_idx: list[int] = []
    for i in range(npts):
        n, b = int(n_values[i]), int(batches[i])
        j = first[i]
        ok = j >= 0 and feas[j]
        row: dict[str, Any] = {"n_gpus": n, "global_batch_seqs": b, "layouts_evaluated": int(counts[i]),
                               "feasible": bool(ok)}
        if ok:
            row["reason"] = None
            cfg_idx.append(int(j))
        else:
            mine = order[bounds[i]:bounds[i + 1]] if total else np.zeros(0, dtype=np.int64)
            if counts[i] == 0 or not valid_rows[mine].any():
                row["reason"] = (f"no valid layout for {_fmt_int(n)} accelerators at a global batch of {b} sequences "
                                 f"(dp must divide the batch, tp the heads, pp ≤ layers)")
            else:
                m = float(np.nanmin(np.where(tight_rows[mine], mem[mine], np.inf)))
                row["reason"] = (f"no layout fits in memory: the smallest needs {m:.1f} GB per accelerator "
                                 f"> {cap:g} GB")
        for c in _DIMS:
            if not ok:
                row[c] = None
            elif c in _INV:
                row[c] = _INV[c][int(allrows[c][j])]
            elif c == "sequence_parallel":
                row[c] = bool(allrows[c][j])
            else:
                row[c] = int(allrows[c][j])
        for c in OUTPUT_COLUMNS:
            if c in ("feasible",):
                continue
            row[c] = (float(res[c][j]) if c != "error_code" else int(res[c][j])) if ok else None
        rows.append(row)
    schema = _best_schema()
    best = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
    if not want_configs:
        return best, pl.DataFrame()
    sel = np.asarray(cfg_idx, dtype=np.int64)
    cfg = {k: (np.broadcast_to(v, (total,)) if np.ndim(v) == 0 else v)[sel] for k, v in allrows.items()} if total else {}
    configs = pl.DataFrame({k: (v if k not in _INV else [_INV[k][int(x)] for x in v]) for k, v in cfg.items()}) \
        if cfg_idx else pl.DataFrame()
    if configs.height:
        configs = configs.with_columns(pl.lit(dtype).alias("dtype"), pl.lit(str(arch_row.get("activation") or "gelu"))
                                       .alias("activation"), pl.lit(str(hw_row.get("id") or "")).alias("gpu"))
    return best, configs


def _best_schema() -> dict[str, Any]:
    s: dict[str, Any] = {"n_gpus": pl.Int64, "global_batch_seqs": pl.Int64, "layouts_evaluated": pl.Int64,
                         "feasible": pl.Boolean, "reason": pl.Utf8}
    for c in _DIMS:
        s[c] = pl.Utf8 if c in _INV else (pl.Boolean if c == "sequence_parallel" else pl.Int64)
    for c in OUTPUT_COLUMNS:
        if c == "feasible":
            continue
        s[c] = pl.Int64 if c == "error_code" else pl.Float64
    return s


# ------------------------------------------------------------------ efficiencies and the knee

def pareto_mask(n_gpus, throughput) -> np.ndarray:
    """True where no larger cluster of the curve is more efficient per accelerator.

    A size N is *dominated* when some N' > N has a throughput per accelerator more than ``DOMINANCE_TOLERANCE``
    higher: N' is then faster **and** cheaper per token, so nobody would run N (typically 3·2^k sizes whose
    data-parallel degree cannot divide a power-of-two batch). Dominated sizes stay in the table but are skipped by
    the marginal efficiency and the knee."""
    N = np.asarray(n_gpus, dtype=np.float64)
    X = np.asarray(throughput, dtype=np.float64)
    per = np.where(np.isfinite(X) & (X > 0), X / N, np.nan)
    order = np.argsort(N, kind="stable")
    best_after = np.full(len(N), -np.inf)
    running = -np.inf
    for i in order[::-1]:
        best_after[i] = running
        if np.isfinite(per[i]):
            running = max(running, per[i])
    return np.isfinite(per) & ~(best_after > per * (1.0 + DOMINANCE_TOLERANCE))


def best_per_gpu_before(n_gpus, throughput) -> np.ndarray:
    """The best throughput per accelerator of any feasible size smaller than each N (NaN where there is none)."""
    N = np.asarray(n_gpus, dtype=np.float64)
    X = np.asarray(throughput, dtype=np.float64)
    per = np.where(np.isfinite(X) & (X > 0), X / N, np.nan)
    out = np.full(len(N), np.nan)
    running = np.nan
    for i in np.argsort(N, kind="stable"):
        out[i] = running
        if np.isfinite(per[i]):
            running = per[i] if not np.isfinite(running) else max(running, per[i])
    return out


def efficiencies(n_gpus, throughput) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(parallel efficiency, marginal efficiency, pareto mask) of total throughput X at sizes N.

    Both are measured against the best throughput per accelerator of a smaller feasible size (``best_per_gpu_before``;
    the smallest feasible size N₀ has E = M = 1): a size that is worse only because of its layout's divisibility
    then never lifts a later size above 1. E > 1 remains where a size beats every smaller one per accelerator
    (super-linear: e.g. the smaller clusters must recompute activations to fit in memory); ``verdict`` says why in
    ``layout_note``. Parallel efficiency is given for every feasible size; marginal efficiency only for the Pareto
    sizes (``pareto_mask``), each against the previous Pareto size."""
    N = np.asarray(n_gpus, dtype=np.float64)
    X = np.asarray(throughput, dtype=np.float64)
    pe = np.full(len(N), np.nan)
    me = np.full(len(N), np.nan)
    fin = np.flatnonzero(np.isfinite(X) & (X > 0))
    mask = pareto_mask(N, X)
    if len(fin) == 0:
        return pe, me, mask
    i0 = fin[np.argmin(N[fin])]
    ref = best_per_gpu_before(N, X)
    ref[i0] = X[i0] / N[i0]
    pe[fin] = (X[fin] / N[fin]) / ref[fin]
    mask[i0] = True  # the reference is always kept
    keep = np.flatnonzero(mask)
    keep = keep[np.argsort(N[keep], kind="stable")]
    me[keep[0]] = 1.0
    for a, b in zip(keep[:-1], keep[1:]):
        me[b] = ((X[b] - X[a]) / (N[b] - N[a])) / ref[b]
    return pe, me, mask


def knee(n_gpus, marginal_efficiency, threshold: float = DEFAULT_THRESHOLD) -> float:
    """Smallest N whose marginal efficiency is below ``threshold``; NaN when it never is."""
    N = np.asarray(n_gpus, dtype=np.float64)
    M = np.asarray(marginal_efficiency, dtype=np.float64)
    hit = np.flatnonzero(np.isfinite(M) & (M < threshold))
    return float(N[hit[0]]) if len(hit) else float("nan")


# ------------------------------------------------------------------ one curve

def scaling_curve(arch_row: Mapping[str, Any], hw_row: Mapping[str, Any], policy: str, *, seq_len: int,
                  tokens: float, global_batch_seqs: int | None = None, per_gpu_batch_seqs: float = 1.0,
                  n_max: int = 16_384, n_min: int | None = None, dtype: str = "bf16",
                  params: PhysParams = DEFAULT, usd_per_gpu_hour: float | None = None,
                  calibrate: Calibrate | None = None, grid: Mapping[str, Any] | None = None,
                  defer_calibration: bool = False, batch_rule: str = "deepseek",
                  layouts: "_Layouts | None" = None):
    """One scaling curve: one row per N (module docstring for the policies and efficiencies).

    ``tokens``: the training token budget (time-to-train and cost). ``usd_per_gpu_hour`` None → ``cost_usd``
    null (the curve has no cost). ``calibrate(analytical_rows, model_inputs)`` → the CALIBRATED_COLUMNS for
    those rows; None → analytical only (lo = hi = point, ``fit_version`` null, ``calibrated`` false).
    ``defer_calibration=True`` returns ``(raw, configs)`` instead, for ``calibrate_curves`` to calibrate many
    curves in one call (the residual model has a per-call cost). ``layouts``: the best layouts of a set of (N,
    batch) points holding this curve's (``_Layouts``, several curves of one model and accelerator share them),
    else they are searched here."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got '{policy}'")
    node = node_size(hw_row)
    ns = n_sweep(node, n_max, n_min)
    if not ns:
        raise ValueError(f"no cluster size between {n_min or node} and {n_max} in steps of the node ({node})")
    # training compute for the batch ceiling: 6 * params * tokens (C = 6ND)
    n_params = _arch_params(arch_row)
    training_flop = 6.0 * n_params * float(tokens)
    ceiling = critical_batch_seqs(training_flop, seq_len, batch_rule)
    batches = policy_batches(policy, ns, global_batch_seqs=global_batch_seqs, per_gpu_batch_seqs=per_gpu_batch_seqs,
                             ceiling_seqs=ceiling)
    if layouts is None:
        best, configs = best_layouts(arch_row, hw_row, ns, batches, seq_len, dtype=dtype, params=params, grid=grid,
                                     want_configs=calibrate is not None or defer_calibration)
    else:
        best, configs = layouts.take(ns, batches)
    out = best.with_columns(pl.lit(policy).alias("policy"), pl.lit(int(seq_len)).alias("seq_len"),
                            pl.lit(float(tokens)).alias("tokens"), pl.lit(training_flop).alias("training_flop"),
                            pl.lit(ceiling).alias("critical_batch_seqs"), pl.lit(node).alias("node_size"),
                            pl.lit(int(_num(arch_row, "n_layers"))).alias("n_layers"))
    out = out.with_columns(pl.lit(usd_per_gpu_hour, dtype=pl.Float64).alias("usd_per_gpu_hour"))
    if defer_calibration:
        return out, configs
    out = _attach_calibration(out, configs, calibrate)
    return _derive(out, usd_per_gpu_hour)


def calibrate_curves(raws: list[tuple[pl.DataFrame, pl.DataFrame]], calibrate: Calibrate | None) -> list[pl.DataFrame]:
    """Finish curves made with ``defer_calibration=True``: one calibration call for all of them (falls back to
    analytical, with the reason in ``calibration_note``, when the hook fails on the batch), then the derived
    columns of each curve."""
    if calibrate is not None and raws:
        def eligible(c: pl.DataFrame) -> bool:  # the residual model needs a BF16 peak (not on fp32/fp16-only parts)
            return c.height > 0 and "peak_bf16_tflops" in c.columns and bool(
                (c["peak_bf16_tflops"].fill_nan(None).fill_null(0.0) > 0).all())

        batch = [i for i, (_, c) in enumerate(raws) if eligible(c)]
        try:
            cal = calibrate(pl.concat([raws[i][0].filter(pl.col("feasible")) for i in batch], how="diagonal_relaxed"),
                            pl.concat([raws[i][1] for i in batch], how="diagonal_relaxed")) if batch else None
        except Exception:  # noqa: BLE001 - fall back to curve-by-curve, each says why it stays analytical
            cal = None
        if cal is not None:
            parts, start = {}, 0
            for i in batch:
                parts[i] = cal.slice(start, raws[i][1].height)
                start += raws[i][1].height
            return [_derive(_attach_calibration(raw, configs, (lambda a, b, p=parts[i]: p) if i in parts else calibrate),
                            raw["usd_per_gpu_hour"][0]) for i, (raw, configs) in enumerate(raws)]
    return [_derive(_attach_calibration(raw, configs, calibrate), raw["usd_per_gpu_hour"][0]) for raw, configs in raws]


def _arch_params(arch_row: Mapping[str, Any]) -> float:
    """The model's parameter count, from the architecture inputs `predict` encodes (hybrid rows block by block,
    models.arch.mamba; MLA rows, models.arch.mla): models.physics.step_time.encode_arch."""

    return float(param_counts(encode_arch(arch_row))["params"][0])


def calibration_from_bundle(bundle, adaptation=None) -> tuple[Calibrate | None, PhysParams, str]:
    """(hook, model, note) for a promoted calibration (``models.fitting.predictor.Calibration``) or None. The layouts
    are ranked by the one prediction function with the fit (``model``, a ``models.fitting.predictor.Predictor``); the
    hook (``models.fitting.calibration.apply_calibration``, the same function) gives the chosen layouts' calibrated
    figures and interval."""
    if bundle is None:
        return None, DEFAULT, "analytical only: no promoted calibration fit"

    params = Predictor(bundle, adaptation=adaptation)

    def hook(analytical: pl.DataFrame, configs: pl.DataFrame) -> pl.DataFrame:
        return apply_calibration(params, analytical, configs)

    note = f"calibrated with fit {bundle.version}"
    return hook, params, note if adaptation is None else f"{note}; {adaptation.describe()}"


def _attach_calibration(best: pl.DataFrame, configs: pl.DataFrame, calibrate: Calibrate | None) -> pl.DataFrame:
    point = best.with_columns(
        pl.col("step_time_s").alias("step_time_lo_s"), pl.col("step_time_s").alias("step_time_hi_s"),
        pl.col("tokens_per_s_per_gpu").alias("tokens_per_s_per_gpu_lo"),
        pl.col("tokens_per_s_per_gpu").alias("tokens_per_s_per_gpu_hi"),
        pl.col("step_time_s").alias("analytical_step_time_s"),
        pl.col("tokens_per_s_per_gpu").alias("analytical_tokens_per_s_per_gpu"),
        pl.lit(None, dtype=pl.Utf8).alias("fit_version"), pl.lit(False).alias("calibrated"),
        pl.lit("analytical only: no promoted calibration fit").alias("calibration_note"))
    if calibrate is None or configs.height == 0:
        return point
    feasible = point.filter(pl.col("feasible"))
    try:
        cal = calibrate(feasible, configs)
        missing = [c for c in CALIBRATED_COLUMNS if c not in cal.columns]
        if missing or cal.height != feasible.height:
            raise ValueError(f"calibration returned {cal.height} rows for {feasible.height}"
                             + (f", without {', '.join(missing)}" if missing else ""))
    except Exception as err:  # noqa: BLE001 - e.g. FeatureError for hardware without a BF16 peak: say so, stay analytical
        return point.with_columns(pl.lit(f"analytical only: calibration not applicable ({err})")
                                  .alias("calibration_note"))
    cal = cal.select([pl.col(c).cast(pl.Utf8 if c == "fit_version" else pl.Float64) for c in CALIBRATED_COLUMNS])
    upd = feasible.select("n_gpus").hstack(cal).with_columns(pl.lit(True).alias("calibrated"))
    rest = point.drop(list(CALIBRATED_COLUMNS) + ["calibrated"])
    return (rest.join(upd, on="n_gpus", how="left")
            .with_columns(pl.col("calibrated").fill_null(False),
                          pl.when(pl.col("calibrated")).then(pl.format("calibrated with fit {}", pl.col("fit_version")))
                          .otherwise(pl.lit("no feasible layout at this size")).alias("calibration_note")))


def _derive(df: pl.DataFrame, usd: float | None) -> pl.DataFrame:
    """Totals, MFU scaled by the calibrated throughput, time, cost and efficiencies (sorted by N)."""
    df = df.sort("n_gpus")
    ratio = pl.col("tokens_per_s_per_gpu") / pl.col("analytical_tokens_per_s_per_gpu")
    df = df.with_columns(
        (pl.col("mfu") * ratio).alias("mfu"),
        (pl.col("mfu") * pl.col("tokens_per_s_per_gpu_lo") / pl.col("analytical_tokens_per_s_per_gpu")).alias("mfu_lo"),
        (pl.col("mfu") * pl.col("tokens_per_s_per_gpu_hi") / pl.col("analytical_tokens_per_s_per_gpu")).alias("mfu_hi"),
    )
    for sfx in ("", "_lo", "_hi"):
        df = df.with_columns((pl.col(f"tokens_per_s_per_gpu{sfx}") * pl.col("n_gpus")).alias(f"tokens_per_s{sfx}"))
    for sfx, src in (("", ""), ("_lo", "_lo"), ("_hi", "_hi")):
        # the slow end of the throughput interval gives the long end of the time interval
        tp = {"": "", "_lo": "_hi", "_hi": "_lo"}[src]
        df = df.with_columns((pl.col("tokens") / pl.col(f"tokens_per_s{tp}") / SECONDS_PER_DAY)
                             .alias(f"time_to_train_days{sfx}"))
    df = df.with_columns(pl.lit(usd, dtype=pl.Float64).alias("usd_per_gpu_hour"))
    for sfx in ("", "_lo", "_hi"):
        df = df.with_columns((pl.col(f"time_to_train_days{sfx}") * 24.0 * pl.col("n_gpus") * pl.col("usd_per_gpu_hour"))
                             .alias(f"cost_usd{sfx}"))
    n = df["n_gpus"].to_numpy()
    cols = {}
    for sfx in ("", "_lo", "_hi"):
        x = df[f"tokens_per_s{sfx}"].fill_null(np.nan).to_numpy().astype(np.float64)
        pe, me, mask = efficiencies(n, x)
        cols[f"parallel_efficiency{sfx}"] = pe
        cols[f"marginal_efficiency{sfx}"] = me
        if sfx == "":
            pareto = mask
    return verdict(df.with_columns([pl.Series(k, v).fill_nan(None) for k, v in cols.items()]
                                   + [pl.Series("pareto_optimal", pareto)]))


# ------------------------------------------------------------------ which sizes pay, and why a point looks odd

# the step-time components (``BREAKDOWN``) in words, for the reason of a super-linear size
_COMPONENT_WORDS = {"compute_s": "compute", "tp_comm_s": "tensor-parallel communication",
                    "pp_bubble_s": "the pipeline bubble", "pp_comm_s": "pipeline communication",
                    "dp_comm_exposed_s": "exposed data-parallel communication",
                    "cp_comm_s": "context-parallel communication", "ep_comm_s": "expert-parallel communication",
                    "optimizer_s": "the optimizer step", "straggler_s": "the wait for the slowest accelerator"}
_RECOMPUTE_RANK = {"none": 0, "selective": 1, "full": 2}


def _odd_part(n: int) -> int:
    n = int(n)
    while n and n % 2 == 0:
        n //= 2
    return n


def _layout_text(r: Mapping[str, Any]) -> str:
    return (f"tp {r['tp']} × pp {r['pp']} × dp {r['dp']}" + (f" × cp {r['cp']}" if (r.get("cp") or 1) > 1 else "")
            + f", micro-batch {r['micro_batch']}, " + ("no" if r["recompute"] == "none" else r["recompute"])
            + " recompute")


def divisibility_cause(r: Mapping[str, Any]) -> str | None:
    """Why a point's layout is constrained by divisibility, or None: the batch (sequences) lacking an odd factor of
    N (dp must divide both, so tp · pp · cp carries it), or pipeline stages that do not divide the layers."""
    n, b = int(r["n_gpus"]), int(r["global_batch_seqs"])
    out = []
    g = math.gcd(n, b)
    odd = _odd_part(n // g)
    if odd > 1:
        dims = [d for d in ("tp", "pp", "cp") if int(r.get(d) or 1) % odd == 0]
        out.append(f"the batch of {b:,} sequences has no factor {odd} of N = {odd} × {n // odd:,}: dp divides "
                   f"gcd(N, batch) = {g:,} at most, so {' or '.join(dims) or 'tp × pp × cp'} carries the {odd}")
    layers = r.get("n_layers")
    pp = int(r.get("pp") or 1)
    if layers and pp > 1 and int(layers) % pp:
        longest = -(-int(layers) // pp)
        out.append(f"{pp} pipeline stages do not divide {int(layers)} layers: the longest stage holds {longest} "
                   f"({longest / (int(layers) / pp) - 1:.0%} above the mean)")
    return "; ".join(out) or None


def _superlinear_reason(r: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """Why size ``r`` has a higher throughput per accelerator than every smaller size (``ref`` the best of them)."""
    ratio = r["tokens_per_s_per_gpu"] / ref["tokens_per_s_per_gpu"]
    a_r, a_ref = r.get("analytical_tokens_per_s_per_gpu"), ref.get("analytical_tokens_per_s_per_gpu")
    head = (f"super-linear: {ratio:.2f}" if ratio >= 1.01 else f"super-linear: {ratio:.4f}") + (
        f"× the throughput per accelerator of the best smaller size, N = {int(ref['n_gpus']):,} "
        f"({_layout_text(ref)})")
    if a_r and a_ref and a_r <= a_ref * (1.0 + 1e-9):
        return (f"{head}: the analytical model's throughput per accelerator does not rise ({a_r / a_ref:.2f}×), "
                "the calibration's correction does")
    # GPU-seconds per token of each component: component_s x N / tokens per step
    per_tok = {c: (r[c] or 0.0) * r["n_gpus"] / r["global_batch_seqs"]
               - (ref[c] or 0.0) * ref["n_gpus"] / ref["global_batch_seqs"]
               for c in _COMPONENT_WORDS if r.get(c) is not None and ref.get(c) is not None}
    why = []
    if per_tok:
        c = min(per_tok, key=per_tok.get)
        if per_tok[c] < 0:
            text = f"GPU-time per token falls most in {_COMPONENT_WORDS[c]}"
            if c == "optimizer_s" and r["sharding"] not in ("none", None) and r["dp"] > ref["dp"]:
                text += f" (its state sharded over {r['dp']:,} data-parallel ranks instead of {ref['dp']:,})"
            elif c == "pp_bubble_s":
                text += (f" ({r['global_batch_seqs'] // (r['dp'] * r['micro_batch']):,} micro-batches per pipeline "
                         f"instead of {ref['global_batch_seqs'] // (ref['dp'] * ref['micro_batch']):,})")
            why.append(text)
    if _RECOMPUTE_RANK.get(ref["recompute"], 0) > _RECOMPUTE_RANK.get(r["recompute"], 0):
        why.append(f"the smaller cluster recomputes activations ({ref['recompute']}) to fit in memory, this one "
                   f"keeps more of them ({r['recompute']})")
    if r["global_batch_seqs"] / r["n_gpus"] > ref["global_batch_seqs"] / ref["n_gpus"] * (1.0 + 1e-9):
        why.append(f"the batch per accelerator grows ({ref['global_batch_seqs'] / ref['n_gpus']:.3g} → "
                   f"{r['global_batch_seqs'] / r['n_gpus']:.3g} sequences)")
    cause = divisibility_cause(ref)
    if cause:
        why.append(f"at N = {int(ref['n_gpus']):,} {cause}")
    return head + (": " + "; ".join(why) if why else "")


def verdict(curve: pl.DataFrame, threshold: float = DEFAULT_THRESHOLD) -> pl.DataFrame:
    """The curve with ``efficient`` (the sizes where extra accelerators still pay: feasible, not beaten per
    accelerator by a larger size, faster as a whole job than every smaller size, and below the knee) and
    ``layout_note`` (why a size looks odd, null otherwise): a size beaten per accelerator by a larger one (with
    the divisibility of batch or layers behind it, when that is the cause), a size slower than a smaller one, and
    a parallel efficiency above 1 (super-linear: what the smaller sizes lack)."""
    c = curve.sort("n_gpus")
    if c.height == 0:
        return c.with_columns(pl.lit(None, dtype=pl.Boolean).alias("efficient"),
                              pl.lit(None, dtype=pl.Utf8).alias("layout_note"))
    rows = c.to_dicts()
    n = np.array([r["n_gpus"] for r in rows], dtype=np.float64)
    x = np.array([r["tokens_per_s"] if r.get("feasible") and r.get("tokens_per_s") is not None else np.nan
                  for r in rows], dtype=np.float64)
    me = np.array([np.nan if r.get("marginal_efficiency") is None else r["marginal_efficiency"] for r in rows],
                  dtype=np.float64)
    k = knee(n, me, threshold)
    per = x / n
    efficient, notes = [], []
    for i, r in enumerate(rows):
        if not np.isfinite(x[i]):
            efficient.append(False)
            notes.append(None)
            continue
        before = [j for j in range(i) if np.isfinite(x[j])]
        after = [j for j in range(i + 1, len(rows))
                 if np.isfinite(x[j]) and per[j] > per[i] * (1.0 + DOMINANCE_TOLERANCE)]
        fastest = max(before, key=lambda j: x[j]) if before else None
        slower = fastest is not None and x[i] <= x[fastest]
        pareto = not after  # as pareto_mask, the smallest size included: it too can be beaten per accelerator
        efficient.append(bool(pareto and not slower and not (np.isfinite(k) and n[i] >= k)))
        parts = []
        pe = r.get("parallel_efficiency")
        if before and pe is not None and pe > 1.0 + 1e-9:
            parts.append(_superlinear_reason(r, rows[max(before, key=lambda j: per[j])]))
        if slower:
            f = rows[fastest]
            dearer = (r["cost_usd"] / f["cost_usd"] - 1.0) if r.get("cost_usd") and f.get("cost_usd") else None
            parts.append(f"slower than N = {int(f['n_gpus']):,} ({r['time_to_train_days']:.3g} vs "
                         f"{f['time_to_train_days']:.3g} days" + (f", {dearer:.0%} dearer" if dearer else "") + ")")
        if not pareto:
            j = max(after, key=lambda j: per[j])
            parts.append(f"not worth running: N = {int(rows[j]['n_gpus']):,} is faster per accelerator "
                         f"({per[j]:,.0f} vs {per[i]:,.0f} tokens/s), so sooner done and cheaper per token")
        if not pareto or slower:
            cause = divisibility_cause(r)
            if cause:
                parts.append(f"divisibility: {cause}")
        notes.append("; ".join(parts) or None)
    return c.with_columns(pl.Series("efficient", efficient, dtype=pl.Boolean),
                          pl.Series("layout_note", notes, dtype=pl.Utf8))


# ------------------------------------------------------------------ inflection summary

def inflection(curve: pl.DataFrame, threshold: float = DEFAULT_THRESHOLD) -> dict[str, Any]:
    """The knee of one curve (point and interval), the sizes worth running up to it (``verdict``) and its USL
    explanation, as one record."""
    c = verdict(curve, threshold).sort("n_gpus")
    n = c["n_gpus"].to_numpy().astype(np.float64)

    def me(sfx):
        return c[f"marginal_efficiency{sfx}"].fill_null(np.nan).to_numpy().astype(np.float64)

    point = knee(n, me(""), threshold)
    lo_hi = [knee(n, me("_lo"), threshold), knee(n, me("_hi"), threshold)]
    fin = [v for v in lo_hi + [point] if np.isfinite(v)]
    feas = c.filter(pl.col("feasible"))
    par = feas.filter(pl.col("pareto_optimal")) if "pareto_optimal" in feas.columns else feas
    fit = fit_usl(par["n_gpus"].to_numpy(), par["tokens_per_s"].to_numpy().astype(np.float64)) \
        if par.height >= 3 else None
    n_top = float(c["n_gpus"].max()) if c.height else float("nan")
    # a peak far beyond the sweep is an extrapolation of a nearly-zero κ: reported as "no peak"
    peak = fit.peak_n if fit and math.isfinite(fit.peak_n) and fit.peak_n <= PEAK_EXTRAPOLATION * n_top else None
    peak_row = feas.sort("tokens_per_s", descending=True).head(1) if feas.height else None
    eff = feas.filter(pl.col("efficient"))
    n_eff = int(eff["n_gpus"].max()) if eff.height else None
    upto = feas.filter(pl.col("n_gpus") <= n_eff) if n_eff is not None else feas.clear()
    # sizes up to the last efficient one that are slower, as a whole job, than a smaller size
    x = upto["tokens_per_s"].to_numpy()
    slower = [(int(upto["n_gpus"][i]), int(upto["n_gpus"][int(np.argmax(x[:i]))])) for i in range(1, len(x))
              if x[i] <= x[:i].max()]
    at_knee = c.filter(pl.col("n_gpus") == point)["marginal_efficiency"] if np.isfinite(point) else None
    return {
        "threshold": threshold,
        "inflection_n": point if np.isfinite(point) else None,
        "inflection_n_lo": min(fin) if fin else None,
        "inflection_n_hi": max(fin) if fin else None,
        "knee_found": bool(np.isfinite(point)),
        "marginal_efficiency_at_knee": float(at_knee[0]) if at_knee is not None and at_knee.len() else None,
        "n_efficient_max": n_eff,
        "n_not_worth": [int(v) for v in upto.filter(~pl.col("efficient"))["n_gpus"]],
        "n_slower": [f"{a:,} slower than {b:,}" for a, b in slower],
        "n_min_feasible": int(feas["n_gpus"].min()) if feas.height else None,
        "n_max_swept": int(c["n_gpus"].max()) if c.height else None,
        "n_best_throughput": int(peak_row["n_gpus"][0]) if peak_row is not None and peak_row.height else None,
        "usl_lambda_tokens_per_s": fit.lambda_ if fit else None,
        "usl_sigma": fit.sigma if fit else None,
        "usl_kappa": fit.kappa if fit else None,
        "usl_n0": fit.n0 if fit else None,
        "usl_peak_n": peak,
        "usl_rmse_log": fit.rmse_log if fit else None,
        "calibrated": bool(c["calibrated"].any()) if "calibrated" in c.columns else False,
    }


def explain(rec: Mapping[str, Any]) -> str:
    """One sentence that reads the knee (where extra accelerators stop paying, as the rows' ``efficient`` say) and
    the USL fit."""
    thr, n_eff = rec["threshold"], rec.get("n_efficient_max")
    if n_eff is None:
        knee_txt = "no size is worth running"
    else:
        knee_txt = f"extra accelerators pay up to N = {n_eff:,}"
        if rec.get("inflection_n"):
            m = rec.get("marginal_efficiency_at_knee")
            knee_txt += (f"; from there to N = {rec['inflection_n']:,.0f} the added ones bring "
                         + (f"{m:.2f}" if m is not None else f"< {thr:.2f}")
                         + f" of the best throughput per accelerator of a smaller cluster (threshold {thr:.2f})")
        else:
            knee_txt += (", the largest size swept" if n_eff == rec.get("n_max_swept") else
                         f" (the larger sizes swept, to N = {rec['n_max_swept']:,}, are not worth running)")
            knee_txt += f": marginal efficiency stays ≥ {thr:.2f} at every step"
    skipped = rec.get("n_not_worth") or []
    if skipped:
        knee_txt += (f"; up to it, not worth running (layout_note says why): {', '.join(f'{v:,}' for v in skipped)}"
                     + (f" ({'; '.join(rec['n_slower'])})" if rec.get("n_slower") else ""))
    if rec.get("usl_sigma") is None:
        return f"{knee_txt}; fewer than 3 sizes worth running: no USL fit."
    peak = rec.get("usl_peak_n")
    peak_txt = (f"throughput peaks near N* ≈ {peak:,.0f}" if peak else
                f"no throughput peak within {PEAK_EXTRAPOLATION:g}× the largest size swept")
    n = (rec["n_max_swept"] or rec["usl_n0"]) / rec["usl_n0"]  # losses at the largest size, in baseline units
    dom = ("contention (σ: work that does not shrink with N)" if rec["usl_sigma"] * (n - 1) >= rec["usl_kappa"] * n * (n - 1)
           else "coherency (κ: cost growing with N², e.g. collectives across the whole cluster)")
    return (f"{knee_txt}; USL σ = {rec['usl_sigma']:.3g}, κ = {rec['usl_kappa']:.3g} per {rec['usl_n0']:,.0f}-GPU "
            f"step, {peak_txt}; dominated by {dom}.")


class _Layouts:
    """The best layouts (``best_layouts``) of a set of (N, global batch) points, searched once for several curves:
    the policies of one model on one accelerator share many points (weak scaling and the critical batch agree
    below the ceiling), and a point's best layout does not depend on the curve asking."""

    def __init__(self, best: pl.DataFrame, configs: pl.DataFrame):
        self.best, self.configs = best, configs
        keys = list(zip(best["n_gpus"].to_list(), best["global_batch_seqs"].to_list()))
        self.row = {k: i for i, k in enumerate(keys)}
        # the configs row of each feasible point (best_layouts writes them in the points' order)
        feas = best["feasible"].to_numpy()
        self.cfg = np.where(feas, np.cumsum(feas) - 1, -1)

    def take(self, ns, batches) -> tuple[pl.DataFrame, pl.DataFrame]:
        idx = [self.row[(int(n), int(b))] for n, b in zip(ns, batches)]
        best = self.best[idx]
        c = [int(self.cfg[i]) for i in idx if self.cfg[i] >= 0]
        configs = self.configs[c] if c and self.configs.height else pl.DataFrame()
        return best, configs


def shared_layouts(arch_row: Mapping[str, Any], hw_row: Mapping[str, Any], points, seq_len: int, *,
                   dtype: str = "bf16", params: PhysParams = DEFAULT) -> _Layouts:
    """``best_layouts`` of the distinct (N, batch) ``points``, for ``scaling_curve(layouts=...)``."""
    pts = sorted({(int(n), int(b)) for n, b in points})
    best, configs = best_layouts(arch_row, hw_row, [n for n, _ in pts], [b for _, b in pts], seq_len, dtype=dtype,
                                 params=params, want_configs=True)
    return _Layouts(best, configs)


def reference_curves(hw_row: Mapping[str, Any], archs: Mapping[str, Mapping[str, Any]], params: PhysParams = DEFAULT,
                     *, policies=POLICIES, usd_per_gpu_hour: float | None = None,
                     n_max: int = DEFAULT_N_MAX,
                     refs=REFERENCE_RUNS) -> list[tuple[pl.DataFrame, pl.DataFrame, dict, dict]]:
    """The build's curves of one accelerator: every ``REFERENCE_RUNS`` target (``refs``, by default all; ``archs``:
    id -> architecture row) under each policy, uncalibrated (``defer_calibration``), as (raw, configs, keys, extra)
    for ``calibrate_curves``. One accelerator and target per call is the build's unit of work (worker processes)."""
    out = []
    dtype = default_dtype(hw_row)
    for ref in refs:
        if ref["arch_id"] not in archs:
            raise ValueError(f"architectures has no row '{ref['arch_id']}' (needed by models.planning.curves.REFERENCE_RUNS)")
        arch = archs[ref["arch_id"]]
        ns = n_sweep(node_size(hw_row), n_max, None)
        ceiling = critical_batch_seqs(6.0 * _arch_params(arch) * float(ref["tokens"]), ref["seq_len"], "deepseek")
        points = [pt for policy in policies for pt in zip(ns, policy_batches(
            policy, ns, global_batch_seqs=ref["global_batch_seqs"], per_gpu_batch_seqs=DEFAULT_PER_GPU_BATCH_SEQS,
            ceiling_seqs=ceiling))]
        layouts = shared_layouts(arch, hw_row, points, ref["seq_len"], dtype=dtype, params=params) if ns else None
        for policy in policies:
            raw, configs = scaling_curve(arch, hw_row, policy, seq_len=ref["seq_len"],
                                         tokens=ref["tokens"], global_batch_seqs=ref["global_batch_seqs"],
                                         per_gpu_batch_seqs=DEFAULT_PER_GPU_BATCH_SEQS, n_max=n_max, dtype=dtype,
                                         params=params, usd_per_gpu_hour=usd_per_gpu_hour, defer_calibration=True,
                                         layouts=layouts)
            keys = {"curve_id": f"{hw_row['id']}/{ref['arch_id']}/{policy}", "gpu": hw_row["id"],
                    "arch_id": ref["arch_id"]}
            extra = {"policy": policy, "seq_len": ref["seq_len"], "tokens": ref["tokens"],
                     "global_batch_seqs": ref["global_batch_seqs"], "dtype": dtype}
            out.append((raw, configs, keys, extra))
    return out
