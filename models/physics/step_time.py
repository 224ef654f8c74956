"""Analytical step-time model (vectorized over configurations).

``predict_arrays`` does the work on a dict of numpy arrays (categoricals as integer codes,
see models.core.params.*_CODES); ``predict`` is the polars front-end that encodes strings, fills
documented defaults and turns error bitmasks into messages. One code path serves one row
and ten million rows. Formulas, conventions and defaults: docs/model.md.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Mapping

import numpy as np
import polars as pl

from models.arch import mamba, mla, moe
from models.arch.accounting import (
    ARCH_COLUMNS,
    layer_shapes,
    normalize_arch,
    param_counts,
)
from models.core.domains import GENERATION_GROUPS
from models.core.fastops import divisible
from models.core.inputs import Inputs
from models.core.memo import IdentityMemo
from models.core.params import (
    ACTIVATION_CODES,
    DEFAULT,
    DTYPE_CODES,
    RECOMPUTE_CODES,
    SHARDING_CODES,
    TP_MODE_CODES,
    PhysParams,
    TpMode,
    is_32bit,
    is_low_precision,
    is_unknown_code,
)
from models.memory.model import GB, NO_OPTIONS, MemoryOptions, capacity_bytes, memory_per_gpu
from models.memory.stacks import STACK_COLUMNS, has_stack_columns, stack_memory_options, stage_gathered
from models.physics import network, parts, tp2d
from models.physics.hardware import (
    A100_TFLOPS_PER_SM,
    choose_peak,
    compiler_overlaps_tp,
    peak_table,
)
from models.physics.network import NETWORK_COLUMNS

LAYOUT_COLUMNS = (
    "seq_len",
    "global_batch_seqs",
    "micro_batch",
    "n_gpus",
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "vpp",
    "sharding",
    "recompute",
    "sequence_parallel",
    "dtype",
    "gpus_per_node",
    "tp_mode",
)
HARDWARE_COLUMNS = (
    "peak_fp32_tflops",
    "peak_tf32_tflops",
    "peak_bf16_tflops",
    "peak_fp16_tflops",
    "peak_fp8_tflops",
    "peak_fp4_tflops",
    "memory_gb",
    "memory_bw_gbps",
    "intra_node_bw_gbps",
    "inter_node_bw_gbps",
    "scaleup_size",
    "generation_code",
    "hardware_code",
    "sm_count",
    "scaleup_link_code",
)

# error bits of ``error_code``
ERR_BAD_VALUE = 1 << 0
ERR_GPU_PRODUCT = 1 << 1
ERR_BATCH = 1 << 2
ERR_HEADS_TP = 1 << 3
ERR_PP_LAYERS = 1 << 4
ERR_EP = 1 << 5
ERR_VPP = 1 << 6
ERR_CP_SEQ = 1 << 7
ERR_CATEGORY = 1 << 8
ERR_HARDWARE = 1 << 9
ERR_MEMORY = 1 << 10
ERR_HYBRID = 1 << 11
ERR_TP2D = 1 << 12
ERR_DTYPE_PEAK = 1 << 13
ERROR_MESSAGES = {
    ERR_BAD_VALUE: "a required numeric input is missing, non-finite or not positive",
    ERR_GPU_PRODUCT: "tp*pp*cp*dp != n_gpus",
    ERR_BATCH: "global_batch_seqs is not divisible by dp*micro_batch",
    ERR_HEADS_TP: "n_heads (or n_kv_heads, or a hybrid's Mamba heads/groups, or a Mamba-1 d_inner) not divisible "
                  "by tp",
    ERR_PP_LAYERS: "pp > n_layers",
    ERR_EP: "invalid ep or etp (ep>1 needs an MoE model, ep | n_experts and ep | dp or ep | tp*cp*dp; the expert "
            "grid must tile the stage: etp*ep | tp*cp*dp, Megatron-Core MoE parallel folding)",
    ERR_VPP: "invalid vpp (vpp>1 needs pp>1, micro-batches divisible by pp and >= vpp layers per stage)",
    ERR_CP_SEQ: "seq_len not divisible by cp (hybrids: or Mamba heads not divisible by tp*cp, or Mamba groups per "
                "tp rank neither a multiple nor a divisor of cp, or cp > 1 with Mamba-1 mixers such as Jamba's: no "
                "context-parallel selective scan is modelled)",
    ERR_CATEGORY: "unknown activation/sharding/recompute/dtype/tp_mode value",
    ERR_HARDWARE: "hardware lacks a required bandwidth/memory value (or an oversubscription < 1, or a pod_size "
                  "below the scale-up domain)",
    ERR_DTYPE_PEAK: "the accelerator's spec sheet gives no peak for this dtype (NVFP4 needs FP4 tensor cores: "
                    "Blackwell or later; `stepcast list gpus` shows each part's peaks)",
    ERR_HYBRID: "hybrid layer_pattern without a complete Mamba shape (Mamba-2: mamba_n_heads, mamba_head_dim, "
                "mamba_n_groups, mamba_state_dim; Mamba-1: mamba_dt_rank, mamba_state_dim, not mamba_n_heads) or "
                "whose blocks do not add up to n_layers",
    ERR_TP2D: "tp_mode 2d: the r x c grid (r the largest divisor of tp <= sqrt(tp), c = tp/r) does not split the "
              "shapes: d_model must be divisible by r, ffn_dim (and expert_ffn_dim) by tp, micro_batch*seq_len/cp "
              "by c; hybrid Mamba, MLA and MTP rows have no 2-D model (models.physics.tp2d)",
}
INVALID_MASK = ((ERR_DTYPE_PEAK << 1) - 1) & ~ERR_MEMORY  # every bit except memory

#: the parts of a step, in the order every answer shows them; they sum to step_time_s (the host's wait is in
#: compute_s)
BREAKDOWN = ("compute_s", "tp_comm_s", "pp_bubble_s", "pp_comm_s", "dp_comm_exposed_s", "cp_comm_s", "ep_comm_s",
             "optimizer_s", "straggler_s")

OUTPUT_COLUMNS = (
    "feasible",
    "error_code",
    "step_time_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "hfu",
    "memory_gb_per_gpu",
    "compute_s",
    "tp_comm_s",
    "pp_bubble_s",
    "pp_comm_s",
    "dp_comm_exposed_s",
    "cp_comm_s",
    "ep_comm_s",
    "optimizer_s",
    "straggler_s",
    "params",
    "active_params",
    "model_flops_per_token",
    "hardware_flops_per_token",
    "n_microbatches",
    "peak_tflops",
    "peak_fallback",
    "mem_weights_gb",
    "mem_grads_gb",
    "mem_optimizer_gb",
    "mem_activations_gb",
    "mem_overhead_gb",
)

#: the parts of one micro-batch and of the step a timeline of the step is drawn from
#: (``predict_arrays(..., detail=True)``; models.physics.timeline): seconds per micro-batch (``_mb_s``) or per step
#: (``_s``) on the stage that paces the pipeline, before the residual correction; the traffic of each stream in total
#: and what of it stays exposed after the overlap budget; ``tl_step_s`` the physics step they add up to
TIMELINE_COLUMNS = (
    "tl_fwd_mb_s", "tl_bwd_mb_s",
    "tl_tp_total_mb_s", "tl_tp_exposed_mb_s", "tl_cp_total_mb_s", "tl_cp_exposed_mb_s",
    "tl_ep_total_mb_s", "tl_ep_exposed_mb_s", "tl_pp_total_mb_s", "tl_pp_exposed_mb_s",
    "tl_gather_total_mb_s", "tl_gather_exposed_mb_s", "tl_dp_total_s", "tl_dp_exposed_s",
    "tl_optimizer_s", "tl_host_wait_s", "tl_straggler_s", "tl_step_s",
)

CHUNK = 8192  # rows per vectorized block: keeps the temporaries in L2 (measured fastest)


def _f(x, n) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    return np.broadcast_to(a, (n,)) if a.ndim == 0 else a


def _code(a: Mapping[str, np.ndarray], key: str, n: int) -> np.ndarray:
    """Integer category codes (models.core.params.*_CODES); missing or NaN -> 0 (the default)."""
    x = a.get(key)
    if x is None:
        return np.zeros(n, dtype=np.int64)
    x = np.asarray(x)
    if x.dtype.kind in "iu":  # already codes: no float round trip
        return np.broadcast_to(x.astype(np.int64, copy=False), (n,)) if x.ndim == 0 else x.astype(np.int64, copy=False)
    return np.nan_to_num(_f(x, n), nan=0.0).astype(np.int64)


#: per-row memory options a run's recipe may set (models.corpus.recipes.recipe_memory, recipe_fp8_params), with the value
#: used where neither the row nor its preset gives one: the share of layer activations offloaded to host memory, logits
#: bytes, weights kept as quantized parameters (1.0; models.memory.model.quantized_weights), Megatron-Core recompute_modules
#: bits (models.memory.model.RECOMPUTE_MODULE_BITS; 0: none), bytes per gradient element and of optimizer state per parameter
#: (models.corpus.recipes.recipe_optimizer; NaN: the preset's, else PhysParams'), and the share of the attention score
#: matrices an unfused attention core keeps (models.corpus.recipes.recipe_run_memory; NaN: PhysParams'), whether the
#: run executes the Llama block eagerly (models.memory.model.eager_block_elems; 0: no) and the share of the layers a
#: per-layer selective AC checkpoints whole (NaN: the stack's selective policy)
ROW_MEMORY_OPTIONS = {"act_offload_frac": 0.0, "logits_bytes": 4.0, "fp8_param_gather": 0.0, "recompute_modules": 0.0,
                      "grad_bytes": np.nan, "optimizer_bytes": np.nan, "selective_policy": 0.0,
                      "attn_scores_stored": np.nan, "eager_block": 0.0, "checkpointed_layer_share": np.nan}


def _stack_arrays(a: Mapping[str, np.ndarray], n: int) -> dict[str, np.ndarray] | None:
    """The training stack's memory values of each row (models.memory.stacks.STACK_COLUMNS, written by the corpus
    reader from measurements/stacks.csv); None for configurations that carry none (search, curves, flags)."""
    return {c: _f(a[c], n) for c in STACK_COLUMNS} if has_stack_columns(a) else None


def _memory_options(a: Mapping[str, np.ndarray], n: int, pp: np.ndarray) -> MemoryOptions:
    """The memory model's ``MemoryOptions`` from optional arrays: the stack's values (``STACK_COLUMNS``: the training
    stack's memory behaviour, models.memory.stacks), `trainable_frac` (LoRA: the share of parameters trained) and
    ``ROW_MEMORY_OPTIONS`` (what a run's recipe sets: offloaded activations, logits bytes)."""
    stack = _stack_arrays(a, n)
    preset = stack_memory_options(stack, pp) if stack is not None else NO_OPTIONS
    row: dict = {}
    if a.get("trainable_frac") is not None:
        row["trainable_frac"] = np.nan_to_num(_f(a["trainable_frac"], n), nan=1.0)
    for c_, default in ROW_MEMORY_OPTIONS.items():  # the row's recipe (models.corpus.recipes.recipe_memory)
        # NaN: the stack's value
        if a.get(c_) is not None:
            stated = _f(a[c_], n)
            fallback = getattr(preset, c_)
            row[c_] = np.where(np.isnan(stated), default if fallback is None else fallback, stated)
    if "selective_policy" in row:  # a code (models.memory.model): the row's save list (e.g. a MaxText remat_policy)
        row["selective_policy"] = row["selective_policy"].astype(np.int64)
    if "fp8_param_gather" in row and a.get("generation_code") is not None:
        # Transformer Engine runs non-TN FP8 GEMMs on compute capability 10.x (utils.py is_non_tn_fp8_gemm_supported):
        # the Blackwell group of models.core.domains (B200, GB200, B300, GB300); Hopper needs the weight's transpose
        row["non_tn_fp8"] = _f(a["generation_code"], n) == GENERATION_GROUPS.index("Blackwell")
    return replace(preset, **row) if row else preset


def _quantized_gather(a: Mapping[str, np.ndarray], n: int) -> np.ndarray | None:
    """Rows whose stack all-gathers the quantized GEMM input under sequence parallelism: the TransformerEngine
    stacks (models.memory.stacks ``quantized_saves``, the memory model's flag for the same quantized inputs); None
    without stack values or without such a row."""
    stack = _stack_arrays(a, n)
    if stack is None:
        return None
    q = stack_memory_options(stack).quantized_saves
    return q if q.any() else None


def _stage_gathered(a: Mapping[str, np.ndarray], n: int, pp: np.ndarray) -> np.ndarray | None:
    """Rows whose stack keeps a pipeline stage's FSDP weights gathered across the step's micro-batches
    (models.memory.stacks.stage_gathered; the memory model's ``fsdp_unsharded_stage``); None without stack values."""
    stack = _stack_arrays(a, n)
    if stack is None:
        return None
    keep = stage_gathered(stack, pp)
    return keep if keep.any() else None


def _flag(err: np.ndarray, bad: np.ndarray, bit: int) -> None:
    """Set ``bit`` in ``err`` where ``bad`` (in place; a cheap test first, since most rows are fine)."""
    if bad.any():
        err[bad] |= bit


def predict_arrays(a: Mapping[str, np.ndarray], params: PhysParams = DEFAULT, *,
                   detail: bool = False) -> dict[str, np.ndarray]:
    """Predict step time and its breakdown for every configuration in ``a``.

    ``a``: arrays of the architecture, layout and resolved-hardware columns (docs/model.md,
    "Inputs"); categoricals as integer codes (``activation``, ``sharding``, ``recompute``,
    ``dtype``), ``sequence_parallel``/``tied_embeddings`` as bool or 0/1. Missing optional
    columns take their defaults (cp=ep=vpp=1, sharding none, recompute none, no SP,
    gpus_per_node = scaleup_size; NETWORK_COLUMNS: oversubscription 1, no pod tier). Returns
    float/bool/int arrays (OUTPUT_COLUMNS); rows with invalid inputs get NaN outputs and ``error_code`` bits;
    memory-infeasible rows keep their time prediction but ``feasible`` is False and ERR_MEMORY is set.
    Optional MoE columns (models.arch.moe.COLUMNS): ``etp`` (NaN: tp, or the largest etp that folds),
    ``moe_capacity_factor`` (NaN: dropless), ``moe_pad_to_capacity``; ``params.moe_imbalance`` must be >= 1.
    ``detail``: also the parts a timeline of the step is drawn from (``TIMELINE_COLUMNS``).
    """
    if not (np.isfinite(params.moe_imbalance) and params.moe_imbalance >= 1.0):
        raise ValueError(f"moe_imbalance must be >= 1 (the most loaded EP rank's tokens / the mean), got "
                         f"{params.moe_imbalance}")
    n = len(np.asarray(a["n_layers"]))
    # rows with invalid inputs (a layout that does not tile the accelerators, a zero count) are computed with the
    # rest and then set to NaN with their error bits: their arithmetic warns nothing to the user
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return _predict_chunks(a, n, params, detail)


def _predict_chunks(a: Mapping[str, np.ndarray], n: int, params: PhysParams,
                    detail: bool = False) -> dict[str, np.ndarray]:
    if n <= CHUNK:
        return _predict_chunk(a, n, params, detail)
    out: dict[str, np.ndarray] = {}
    for i in range(0, n, CHUNK):
        j = min(i + CHUNK, n)
        part = _predict_chunk({k: (v[i:j] if np.ndim(v) else v) for k, v in a.items()}, j - i, params, detail)
        if not out:
            # the float outputs share one block: one large allocation is faulted in far fewer pages
            # than two dozen separate ones (about 2 % of the time at a million rows)
            floats = [k for k, x in part.items() if x.dtype == np.float64]
            block = np.empty((len(floats), n))
            out = {k: block[floats.index(k)] if k in floats else np.empty(n, dtype=x.dtype) for k, x in part.items()}
        for k, x in part.items():
            out[k][i:j] = x
    return out


def _hybrid_validity(err: np.ndarray, hy: Mapping[str, np.ndarray], t: np.ndarray, c: np.ndarray) -> None:
    """Error bits of hybrid rows: an incomplete shape; Megatron-Core MambaMixer asserts nheads % tp == 0 and
    ngroups % tp == 0; MambaContextParallel asserts nheads % (tp*cp) == 0 and that groups per tp rank are a
    multiple or a divisor of cp; Mamba-1 rows: d_inner % tp == 0 and cp == 1 (models.arch.mamba)."""
    _flag(err, hy["shape_bad"], ERR_HYBRID)
    m = hy["hybrid"] & (hy["n_mamba_layers"] > 0) & ~hy["shape_bad"]
    if np.any(m1 := hy["mamba1"]):  # Mamba-1 (Jamba): d_inner split over tp; no context-parallel scan
        _flag(err, m & m1 & ~divisible(hy["d_inner"], t), ERR_HEADS_TP)
        _flag(err, m & m1 & (c > 1), ERR_CP_SEQ)
        m = m & ~m1
    nh, G = hy["mamba_n_heads"], hy["mamba_n_groups"]
    _flag(err, m & ~(divisible(nh, t) & divisible(G, t)), ERR_HEADS_TP)
    gl = G / t
    cp_ok = divisible(nh, t * c) & (divisible(gl, c) | divisible(c, np.maximum(gl, 1.0)))
    _flag(err, m & (c > 1) & ~cp_ok, ERR_CP_SEQ)


#: every architecture input the step-time model reads (``_decode``): the transformer shape, the hybrid block counts
#: and Mamba shape (models.arch.mamba), the MLA shape and MTP depth (models.arch.mla)
ARCH_INPUTS = (*ARCH_COLUMNS, *mamba.HYBRID_COLUMNS, *mla.ARCH_COLUMNS)
_ARCH_MEMO = IdentityMemo()  # keyed by every input `_decode` builds the architecture from (ARCH_INPUTS)
_SHAPES_MEMO = IdentityMemo()  # keyed by the normalized architecture (the object _ARCH_MEMO returns)


#: the PhysParams fields the memory model reads (models.memory.model: bytes per value, the allowance, what attention
#: stores); `memory_per_gpu` is given the defaults for every other field, so its result depends on these alone
MEMORY_PARAM_FIELDS = ("grad_bytes", "optimizer_state_bytes_mixed", "optimizer_state_bytes_fp32", "mem_overhead_gb",
                       "mem_fragmentation_frac", "attn_scores_stored", "dropout_mask_elems", "moe_imbalance")
#: per-row efficiencies a caller may pass beside the configuration (a calibration's fitted values): read by the
#: rates, never by the memory model
EFFICIENCY_INPUTS = frozenset(("kernel_eff", "matmul_eff_16bit", "matmul_eff_8bit"))


def _inputs_memo(memo: IdentityMemo, a: Mapping[str, np.ndarray], n: int, extra: tuple, make):
    """``memo``'s result for a block's inputs other than EFFICIENCY_INPUTS (by identity) and ``extra`` (by
    equality): the calibration re-predicts one set of runs with new fitted efficiencies on the same arrays."""
    names = tuple(k for k in a if k not in EFFICIENCY_INPUTS)
    return memo.get(tuple(a[k] for k in names), (n, names, extra), make)


_MEMORY_MEMO = IdentityMemo(4)  # models.memory.model.memory_per_gpu of a block
_DECODE_MEMO = IdentityMemo(4)  # `_decode_static` of a block
_VALIDITY_MEMO = IdentityMemo(4)  # `_validity_static` of a block


def _memory_memo(a: Mapping[str, np.ndarray], n: int, P: PhysParams, make):
    """``make(memory params)``: the memory model of a block, reused when the same input arrays come again with the
    same memory params (`_inputs_memo`). Every input of the memory model is derived from the arrays of ``a`` other
    than EFFICIENCY_INPUTS and from MEMORY_PARAM_FIELDS (it is given DEFAULT's value of every other field)."""
    mp = tuple(getattr(P, f) for f in MEMORY_PARAM_FIELDS)
    return _inputs_memo(_MEMORY_MEMO, a, n, mp, lambda: make(DEFAULT.with_(**dict(zip(MEMORY_PARAM_FIELDS, mp)))))


def _shapes_and_counts(arch: Mapping[str, np.ndarray]):
    sh = layer_shapes(arch)
    return sh, param_counts(arch, normalized=True, shapes=sh)


def _decode_static(a: Mapping[str, np.ndarray], n: int) -> dict:
    """The part of `_decode` that reads neither PhysParams nor EFFICIENCY_INPUTS: architecture (normalized), layout
    (documented defaults filled), hardware peaks, the network's columns (models.physics.network.decode), the MoE
    options."""
    g = lambda k, d=np.nan: _f(a[k], n) if k in a and a[k] is not None else np.full(n, d)  # noqa: E731
    arch = _ARCH_MEMO.get(tuple(a.get(k) for k in ARCH_INPUTS), n, lambda: normalize_arch(
        {k: g(k) for k in ("n_layers", "d_model", "n_heads", "ffn_dim", "vocab")} | {
            k: g(k) for k in ("n_kv_heads", "head_dim", "n_experts", "top_k", "expert_ffn_dim",
                              "n_shared_experts", "n_dense_layers", "tied_embeddings", "activation")
        } | {k: g(k) for k in mamba.HYBRID_COLUMNS if a.get("n_attn_layers") is not None}
          | {k: g(k) for k in mla.ARCH_COLUMNS if a.get(k) is not None}))
    L = arch["n_layers"]
    B, b, d, p = g("global_batch_seqs"), g("micro_batch"), g("dp"), g("pp")
    c, e, v = (np.where(np.isnan(x), 1.0, x) for x in (g("cp", 1.0), g("ep", 1.0), g("vpp", 1.0)))
    dt = _code(a, "dtype", n)
    tpm = _code(a, "tp_mode", n)  # models.core.params.TpMode; 2-D rows (models.physics.tp2d) are sequence-sharded
    tp2d_rows = tpm == TpMode.TWO_D
    tp2d_rows = tp2d_rows if tp2d_rows.any() else None
    sp = g("sequence_parallel", 0.0) > 0  # NaN -> False
    # low-precision rows: GEMMs at the 8-bit efficiency; their LM head runs in 16 bits (models.physics.parts.lm_head)
    low = is_low_precision(dt)
    # MoE options (models.arch.moe): expert tensor parallelism (NaN: tp, or the largest etp that folds; dense rows: tp),
    # the capacity factor (NaN: dropless)
    t = g("tp")
    cap_f = g("moe_capacity_factor")
    et = np.where(arch["n_experts"] > 0, moe.resolve_etp(g("etp"), t, c, d, e)[0], t)
    pad = g("moe_pad_to_capacity", 0.0) > 0
    a2a = 0.0  # the recipe's EP A2A overlap (models.corpus.moe_recipes): merged share of the passes
    if "moe_a2a_overlap" in a:
        a2a = moe.a2a_merged_fraction(g("moe_a2a_overlap", 0.0), B / (d * b), p, v, arch["n_experts"], e,
                                      _code(a, "recompute", n))
    N = g("n_gpus")
    net = network.decode(g, N)  # the scale-up domain, the links, the pod tier (models.physics.network)
    hw = {c_: g(c_) for c_ in HARDWARE_COLUMNS if c_.startswith("peak_")}
    peaks, flags = peak_table(hw)
    peak_tf, peak_fb = choose_peak(dt, peaks, flags)
    is_fp32 = is_32bit(dt)
    # layers a low-precision recipe keeps in 16 bits (models.core.precision; NaN: none)
    l16 = g("n_layers_16bit", 0.0)
    l16 = np.where(low & (l16 > 0), l16, 0.0)  # NaN > 0 is False
    sm = g("sm_count")
    if np.isnan(sm).any():  # no SM count given: A100-equivalent SMs of the 16-bit peak (models.physics.hardware)
        sm = np.where(np.isnan(sm), peaks[0] / A100_TFLOPS_PER_SM, sm)
    # TPUs: XLA overlaps the TP collectives with the matmuls (models.physics.hardware.compiler_overlaps_tp), except on a
    # row whose stack predates the async collectives (``xla_async_collectives`` 0: models.corpus.runs_adapter; NaN: on)
    tp_hidden = compiler_overlaps_tp(g("scaleup_link_code")) if "scaleup_link_code" in a else None
    if tp_hidden is not None and a.get("xla_async_collectives") is not None:
        tp_hidden = tp_hidden & (g("xla_async_collectives", 1.0) != 0.0)
    fields = dict(
        n=n, arch=arch, hy=arch.get("hybrid"), L=L, h=arch["d_model"], heads=arch["n_heads"], kvh=arch["n_kv_heads"],
        V=arch["vocab"], E=arch["n_experts"], k=arch["top_k"], ns=arch["n_shared_experts"], act=arch["activation"],
        s=g("seq_len"), B=B, b=b, N=N, t=t, p=p, d=d, c=c, e=e, v=v, m=B / (d * b), Ls=np.ceil(L / p),
        shard=_code(a, "sharding", n), rc=_code(a, "recompute", n), dt=dt,
        sp=sp if tp2d_rows is None else sp | tp2d_rows, tp_mode=tpm, tp2d=tp2d_rows,
        grid2d=None if tp2d_rows is None else tp2d.grid(t),  # once per block: every 2-D term uses it
        is_fp32=is_fp32, mem_cap=g("memory_gb"), head_16bit=low, layers_16bit=l16,
        sm=sm, peaks=peaks, peak_tf=peak_tf, peak_fb=peak_fb,
        attn_peak_tf=np.where(is_fp32, peak_tf, peaks[0]), node=net["domain"], net_bad=net["bad"],
        et=et, moe_cf=cap_f, a2a=a2a,
        flex=(g("moe_dispatcher", 0.0) == moe.DISPATCHER_FLEX) if "moe_dispatcher" in a else False,
        rc_modules=g("recompute_modules") if a.get("recompute_modules") is not None else None,
        # the row's own save list (models.memory.model ``selective_policy``; NaN: its stack's, which recomputes the core)
        save_list=g("selective_policy") if a.get("selective_policy") is not None else None,
        # LoRA: the backward computes the weight gradients of the trained share only (NaN / absent: all)
        wgrad=np.nan_to_num(g("trainable_frac", 1.0), nan=1.0) if a.get("trainable_frac") is not None else 1.0,
        quantized_gather=_quantized_gather(a, n),
        xla=_xla_rows(a, n),
    )
    if tp_hidden is not None and not tp_hidden.any():
        tp_hidden = None
    given = dict(low=low, pad=pad, tp_hidden=tp_hidden, net=net, mbw=g("memory_bw_gbps"))
    return {"fields": fields, "given": given}


def _xla_rows(a: Mapping[str, np.ndarray], n: int) -> np.ndarray | None:
    """Rows XLA compiles: a TPU (scale-up link ICI: XLA is its only compiler, models.physics.hardware) or a row whose stack
    is an XLA one (``xla_compiled`` 1: models.corpus.runs_adapter, e.g. MaxText on a GPU); None when no row is."""
    rows = np.zeros(n, dtype=bool)
    if a.get("scaleup_link_code") is not None:
        rows |= compiler_overlaps_tp(_f(a["scaleup_link_code"], n))
    if a.get("xla_compiled") is not None:
        rows |= _f(a["xla_compiled"], n) == 1.0
    return rows if rows.any() else None


def _decode(a: Mapping[str, np.ndarray], n: int, P: PhysParams) -> Inputs:
    """The block's inputs as arrays: architecture (normalized), layout (documented defaults filled), hardware
    rates with the efficiencies of ``P`` (or per row: ``kernel_eff``, ``matmul_eff_16bit``, ``matmul_eff_8bit``)
    and the network's tiers (models.physics.network.build). The part that depends on neither (`_decode_static`) is
    computed once per set of input arrays (`_inputs_memo`)."""
    st = _inputs_memo(_DECODE_MEMO, a, n, (), lambda: _decode_static(a, n))
    fx, gv = st["fields"], st["given"]
    g = lambda k, d=np.nan: _f(a[k], n) if k in a and a[k] is not None else np.full(n, d)  # noqa: E731
    dt, low = fx["dt"], gv["low"]
    # kernel efficiency of the software stack: the params' value, or per row (a calibration's value for the
    # row's stack and hardware generation; NaN: the params')
    ke = P.kernel_eff
    if "kernel_eff" in a:
        ke_row = g("kernel_eff")
        ke = np.where(np.isnan(ke_row), P.kernel_eff, ke_row)
    # GEMM efficiency by dtype (codes: models.core.params.DTYPE_CODES; invalid codes clipped, flagged by _validity)
    e16, e8, e32 = P.matmul_eff_16bit, P.matmul_eff_8bit, P.matmul_eff_32bit
    if "matmul_eff_16bit" in a or "matmul_eff_8bit" in a:
        # per-row GEMM efficiencies (a calibration's values for each row's hardware generation)
        e16 = np.where(np.isnan(g("matmul_eff_16bit", e16)), e16, g("matmul_eff_16bit", e16))  # NaN: the params'
        e8 = np.where(np.isnan(g("matmul_eff_8bit", e8)), e8, g("matmul_eff_8bit", e8))
        eff = np.where(low, e8, np.where(fx["is_fp32"], e32, e16))
    else:
        eff = np.take(np.array([e16, e16, e8, e8, e8, e8, e32, e32]), dt, mode="clip")
    # the slowest EP rank's factor of the mean routed tokens (models.arch.moe)
    rho = moe.effective_imbalance(P.moe_imbalance, fx["moe_cf"], gv["pad"])
    e16_rows = np.broadcast_to(e16, (n,)) if np.ndim(e16) == 0 else e16
    # share of the TP traffic that can hide behind compute: the params' (Megatron-class stacks expose it), all of it
    # where the compiler overlaps it (TPUs)
    tp_ov = P.tp_overlap if gv["tp_hidden"] is None else np.where(gv["tp_hidden"], 1.0, P.tp_overlap)
    return Inputs(
        **fx, ke=ke, tp_ov=tp_ov, gemm_eff=eff, gemm_eff_16=e16_rows, hbm_bw=gv["mbw"] * 1e9 * (P.hbm_eff * ke),
        net=network.build(gv["net"], P), rho=rho,
    )


def _validity(x: Inputs, a: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
    """Error bits (ERR_*) of every row except ERR_MEMORY. With ``a`` (the block's input arrays), the bits that do
    not depend on the efficiencies (`_validity_static`) are computed once per set of input arrays (`_inputs_memo`)."""
    static = _validity_static(x) if a is None else _inputs_memo(_VALIDITY_MEMO, a, x.n, (),
                                                                lambda: _validity_static(x))
    err = static.copy()
    peak_tf, hbm_bw = x.peak_tf, x.hbm_bw
    _flag(err, ~(np.isfinite(peak_tf) & (peak_tf > 0)), ERR_DTYPE_PEAK)
    hw_bad = ~(np.isfinite(hbm_bw) & (hbm_bw > 0) & np.isfinite(x.mem_cap) & np.isfinite(x.attn_peak_tf))
    for tier in x.net:  # every tier of the network needs a bandwidth
        hw_bad |= ~(np.isfinite(tier.bw_Bps) & (tier.bw_Bps > 0))
    hw_bad |= x.net_bad
    _flag(err, hw_bad, ERR_HARDWARE)
    return err


def _validity_static(x: Inputs) -> np.ndarray:
    """The error bits of `_validity` that read only `_decode_static`'s fields (every bit but ERR_HARDWARE, which
    reads the bandwidths with their efficiencies, and ERR_DTYPE_PEAK beside it)."""
    n, L, E, k, t, c, e, v, p, d = x.n, x.L, x.E, x.k, x.t, x.c, x.e, x.v, x.p, x.d
    err = np.zeros(n, dtype=np.int64)
    # integer-valued inputs >= 1, with few passes: the sum of (x - floor(x)) is 0 only when every
    # value is a finite integer (NaN and +-inf give NaN), and the smallest value must be >= 1
    frac = np.zeros(n)
    lo = np.full(n, np.inf)
    tmp = np.empty(n)
    for y in (L, x.h, x.heads, x.kvh, x.V, x.s, x.B, x.b, x.N, t, p, d, c, e, v):
        np.floor(y, out=tmp)
        np.subtract(y, tmp, out=tmp)
        frac += tmp
        np.minimum(lo, y, out=lo)
    ints_ok = (frac == 0) & (lo >= 1)
    ints_ok &= np.isfinite(x.arch["ffn_dim"]) & (x.arch["ffn_dim"] > 0) & np.isfinite(x.arch["head_dim"])
    ints_ok &= np.isfinite(E) & (E >= 0) & np.isfinite(k) & (k >= 0) & ((k <= E) | (E == 0))
    _flag(err, ~ints_ok, ERR_BAD_VALUE)
    _flag(err, t * p * c * d != x.N, ERR_GPU_PRODUCT)
    _flag(err, ~divisible(x.B, d * x.b), ERR_BATCH)
    kv_ok = divisible(x.kvh, t) | divisible(t, np.maximum(x.kvh, 1))
    _flag(err, ~(divisible(x.heads, t) & kv_ok), ERR_HEADS_TP)
    _flag(err, p > L, ERR_PP_LAYERS)
    # expert parallelism is carved out of dp, or folded over tp x cp x dp (Megatron-Core MoE parallel folding)
    ep_bad = (e > 1) & ((E <= 0) | ~((divisible(d, e) | divisible(d * c * t, e)) & divisible(E, e)))
    _flag(err, ep_bad, ERR_EP)
    # expert tensor parallelism: the expert grid etp x ep must tile tp x cp x dp (models.arch.moe)
    _flag(err, (E > 0) & ~moe.folding_valid(t, c, d, e, x.et), ERR_EP)
    _flag(err, ~moe.capacity_factor_valid(x.moe_cf), ERR_BAD_VALUE)
    vpp_bad = (v > 1) & ((p <= 1) | ~divisible(x.m, p) | (x.Ls < v))
    _flag(err, vpp_bad, ERR_VPP)
    _flag(err, ~divisible(x.s, c), ERR_CP_SEQ)
    act, shard, rc, dt = x.act, x.shard, x.rc, x.dt
    cat_bad = is_unknown_code(act, ACTIVATION_CODES) | is_unknown_code(shard, SHARDING_CODES)
    cat_bad |= is_unknown_code(rc, RECOMPUTE_CODES) | is_unknown_code(dt, DTYPE_CODES)
    cat_bad |= is_unknown_code(x.tp_mode, TP_MODE_CODES)
    _flag(err, cat_bad, ERR_CATEGORY)
    if x.hy is not None:
        _hybrid_validity(err, x.hy, t, c)
    if x.tp2d is not None:  # the 2-D grid must split the shapes; rows it has no model for are refused (models.physics.tp2d)
        bad = ~tp2d.valid(t, x.h, x.arch["ffn_dim"], x.b * x.s / c, x.arch["expert_ffn_dim"], E, rc=x.grid2d)
        if x.hy is not None:
            bad |= x.hy["hybrid"]
        if x.arch.get("mla") is not None:
            bad |= x.arch["mla"]["mla"]
        if x.arch.get("mtp") is not None:
            bad |= x.arch["mtp"] > 0
        _flag(err, x.tp2d & bad, ERR_TP2D)
    return err


def _predict_chunk(a: Mapping[str, np.ndarray], n: int, P: PhysParams, detail: bool = False) -> dict[str, np.ndarray]:
    """One block: decode, validity, then one function per part (models.physics.parts), assembled into OUTPUT_COLUMNS
    (and with ``detail`` the TIMELINE_COLUMNS)."""
    x = _decode(a, n, P)
    err = _validity(x, a)
    invalid = err != 0
    sh, pc = _SHAPES_MEMO.get((x.arch,), n, lambda: _shapes_and_counts(x.arch))
    r = parts.rates(x, P, sh, pc)
    cm = parts.layers_kept_in_16bit(x, r, parts.compute(x, r, P), P)
    cm = parts.last_stage_balance(x, parts.save_list_recompute(x, r, parts.module_recompute(x, r, cm)))
    cp_mb, hidden_cp = parts.cp_comm(x, r, cm)
    tp_total, ep_total, pp_total = parts.tp_comm(x, r, cm), parts.ep_comm(x, r, cm), parts.pp_comm(x, r)
    ov = parts.overlap(cm, cp_mb, hidden_cp, tp_total, ep_total, pp_total, P, x.a2a, x.tp_ov)
    mem = _memory_memo(a, n, P, lambda mp: memory_per_gpu(x, sh, mp, _memory_options(a, n, x.p)))
    dp_exposed, gather_exposed_mb = parts.dp_comm(x, r, mem, cm, ov, P, _stage_gathered(a, n, x.p))
    optimizer_s = parts.optimizer(x, mem, P)
    st = parts.step_time(x, cm, ov, gather_exposed_mb, dp_exposed, optimizer_s, P.straggler_cv)
    model_fpt, hw_fpt = parts.flops_per_token(x, r)
    mem_total = mem["mem_total_bytes"]
    mem_ok = mem_total <= capacity_bytes(x.mem_cap)  # a vendor's GB are binary (models.memory.model)
    _flag(err, ~invalid & ~mem_ok, ERR_MEMORY)

    # invalid rows get NaN outputs: written in place, and only when a row of this chunk is invalid
    # (the common all-valid chunk then costs no extra pass over the outputs)
    if invalid.any():
        nanif = lambda y: np.where(invalid, np.nan, y)  # noqa: E731
    else:  # every output below is a fresh array, so no copy is needed
        nanif = lambda y: y  # noqa: E731
    step, m, N, tokens = st.step, x.m, x.N, x.B * x.s
    denom = step * N * x.peak_tf * 1e12
    out = {
        "feasible": ~invalid & mem_ok,
        "error_code": err,
        "step_time_s": nanif(step),
        "tokens_per_s_per_gpu": nanif(tokens / (step * N)),
        "mfu": nanif(model_fpt * tokens / denom),
        "hfu": nanif(hw_fpt * tokens / denom),
        "memory_gb_per_gpu": nanif(mem_total / GB),
        "compute_s": nanif(m * cm.compute_mb + st.host_wait),
        "tp_comm_s": nanif(m * ov.tp_mb),
        "pp_bubble_s": nanif(st.bubble_mb * st.t_mb),
        "pp_comm_s": nanif(m * ov.pp_mb),
        "dp_comm_exposed_s": nanif(dp_exposed + m * gather_exposed_mb),
        "cp_comm_s": nanif(m * ov.cp_mb),
        "ep_comm_s": nanif(m * ov.ep_mb),
        "optimizer_s": nanif(optimizer_s),
        "straggler_s": nanif(st.straggler),
        "params": r.pc["params"],
        "active_params": r.pc["active_params"],
        "model_flops_per_token": model_fpt,
        "hardware_flops_per_token": hw_fpt,
        "n_microbatches": nanif(m),
        "peak_tflops": x.peak_tf,
        "peak_fallback": x.peak_fb,
        "mem_weights_gb": nanif(mem["mem_weights_bytes"] / GB),
        "mem_grads_gb": nanif(mem["mem_grads_bytes"] / GB),
        "mem_optimizer_gb": nanif(mem["mem_optimizer_bytes"] / GB),
        "mem_activations_gb": nanif(mem["mem_activations_bytes"] / GB),
        "mem_overhead_gb": nanif(mem["mem_overhead_bytes"] / GB),
    }
    if detail:  # the same parts, before they are summed (models.physics.timeline draws them)
        # the DP traffic with no overlap at all: the same function with the overlap shares at zero
        no_overlap = replace(P, dp_overlap=0.0, fsdp_gather_overlap=0.0)
        dp_total, gather_total_mb = parts.dp_comm(x, r, mem, cm, ov, no_overlap, _stage_gathered(a, n, x.p))
        out.update({k: nanif(v) for k, v in zip(TIMELINE_COLUMNS, (
            cm.compute_mb - cm.bwd_mb, cm.bwd_mb,
            tp_total, ov.tp_mb, cp_mb + hidden_cp, ov.cp_mb, ep_total, ov.ep_mb, pp_total, ov.pp_mb,
            gather_total_mb, gather_exposed_mb, dp_total, dp_exposed, optimizer_s, st.host_wait,
            # the wait for the slowest accelerator, where the step model has that part (Step.straggler)
            np.broadcast_to(getattr(st, "straggler", 0.0), (n,)), step))})
    return out


# ---------------------------------------------------------------------------------------
# polars front-end
# ---------------------------------------------------------------------------------------
_CATEGORICALS = {
    "activation": (ACTIVATION_CODES, "gelu"),
    "sharding": (SHARDING_CODES, "none"),
    "recompute": (RECOMPUTE_CODES, "none"),
    "dtype": (DTYPE_CODES, "bf16"),
    "tp_mode": (TP_MODE_CODES, "1d"),
}
_NUMERIC_DEFAULTS = {"cp": 1, "ep": 1, "vpp": 1, "n_experts": 0, "n_shared_experts": 0, "n_dense_layers": 0}
_BOOL_DEFAULTS = {"sequence_parallel": False, "tied_embeddings": False}


def encode_configs(configs: pl.DataFrame) -> dict[str, np.ndarray]:
    """Encode a polars config table into the arrays ``predict_arrays`` expects.

    Nulls in categoricals take the defaults (activation gelu, sharding none, recompute none,
    dtype bf16, tp_mode 1d); values outside the vocabulary become -1 (-> ERR_CATEGORY). Missing optional
    numeric columns take cp=ep=vpp=1, n_experts=0 ...; gpus_per_node null -> scaleup_size.
    A `layer_pattern` column (hybrid Mamba-Transformer rows) adds the block counts
    (models.arch.mamba.COUNT_COLUMNS, null for rows without a pattern) and the Mamba shape columns;
    the MLA and MTP columns (models.arch.mla.ARCH_COLUMNS) are passed on where present (null: not MLA, no MTP),
    and so are the MoE options (models.arch.moe.COLUMNS; null: etp = tp, dropless, not padded).
    """
    out: dict[str, np.ndarray] = {}
    cols = set(configs.columns)
    exprs = []
    for name, (codes, default) in _CATEGORICALS.items():
        if name in cols:
            exprs.append(
                pl.col(name)
                .cast(pl.Utf8)
                .str.to_lowercase()
                .str.strip_chars()
                .fill_null(default)
                .replace_strict(dict(codes), default=-1, return_dtype=pl.Int64)
                .alias(name)
            )
        else:
            exprs.append(pl.lit(codes[default], dtype=pl.Int64).alias(name))
    for name, default in _BOOL_DEFAULTS.items():
        if name in cols:
            exprs.append(pl.col(name).cast(pl.Float64, strict=False).fill_null(float(default)).alias(name))
        else:
            exprs.append(pl.lit(float(default)).alias(name))
    numeric = [
        "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab", "top_k",
        "expert_ffn_dim", "seq_len", "global_batch_seqs", "micro_batch", "n_gpus", "tp", "pp", "dp",
        "gpus_per_node",
    ] + list(_NUMERIC_DEFAULTS) + list(HARDWARE_COLUMNS) + [c_ for c_ in NETWORK_COLUMNS if c_ in cols]
    for name in numeric:
        if name in cols:
            e_ = pl.col(name).cast(pl.Float64, strict=False)
            if name in _NUMERIC_DEFAULTS:
                e_ = e_.fill_null(float(_NUMERIC_DEFAULTS[name]))
            exprs.append(e_.alias(name))
        elif name in _NUMERIC_DEFAULTS:
            exprs.append(pl.lit(float(_NUMERIC_DEFAULTS[name])).alias(name))
        else:
            exprs.append(pl.lit(None, dtype=pl.Float64).alias(name))
    if "n_layers_16bit" in cols:  # layers a low-precision recipe keeps in 16 bits (models.core.precision; null: none)
        exprs.append(pl.col("n_layers_16bit").cast(pl.Float64, strict=False).alias("n_layers_16bit"))
    if "trainable_frac" in cols:
        exprs.append(pl.col("trainable_frac").cast(pl.Float64, strict=False).fill_null(1.0))
    if "xla_async_collectives" in cols:  # 0: a TPU run whose XLA predates async collectives (runs_adapter)
        exprs.append(pl.col("xla_async_collectives").cast(pl.Float64, strict=False))
    if "xla_compiled" in cols:  # 1: an XLA-compiled stack on a GPU (runs_adapter; a TPU is XLA's by its hardware)
        exprs.append(pl.col("xla_compiled").cast(pl.Float64, strict=False))
    if "stack_unknown" in cols:  # 1: a stated stack the stack table does not know (the generic row answers)
        exprs.append(pl.col("stack_unknown").cast(pl.Float64, strict=False))
    if "settings_halfwidth" in cols:  # the interval's part from settings left open (pipeline.api settings_spread)
        exprs.append(pl.col("settings_halfwidth").cast(pl.Float64, strict=False))
    for c_ in STACK_COLUMNS:  # the training stack's memory values (models.memory.stacks; `memory_preset` is its label)
        if c_ in cols:
            exprs.append(pl.col(c_).cast(pl.Float64, strict=False).alias(c_))
    for c_ in ROW_MEMORY_OPTIONS:  # what a run's recipe sets for memory (models.corpus.recipes.recipe_memory; null: stack's)
        if c_ in cols:
            exprs.append(pl.col(c_).cast(pl.Float64, strict=False).alias(c_))
    if "layer_pattern" in cols:  # hybrids: block counts from the pattern (null for other rows), Mamba shapes
        exprs += mamba.pattern_count_exprs("layer_pattern")
        exprs += [pl.col(c_).cast(pl.Float64, strict=False).alias(c_) if c_ in cols
                  else pl.lit(None, dtype=pl.Float64).alias(c_) for c_ in mamba.SHAPE_COLUMNS]
    if any(c_ in cols for c_ in mla.ARCH_COLUMNS):  # MLA attention and MTP modules (models.arch.mla)
        exprs += [pl.col(c_).cast(pl.Float64, strict=False).alias(c_) for c_ in mla.ARCH_COLUMNS if c_ in cols]
    if any(c_ in cols for c_ in moe.COLUMNS):  # MoE options: etp, capacity factor, padding (models.arch.moe)
        exprs += [pl.col(c_).cast(pl.Float64, strict=False).alias(c_) for c_ in moe.COLUMNS if c_ in cols]
    enc = configs.select(exprs)
    # nulls -> NaN in one pass (a fill per column costs a query each: ~10 ms for a one-row frame)
    enc = enc.with_columns([pl.col(c).fill_null(np.nan) for c, t in enc.schema.items() if t != pl.Int64])
    for name in enc.columns:
        out[name] = enc[name].to_numpy()
    return out


def arch_config(arch: Mapping) -> dict:
    """One model's architecture columns as a configuration row carries them to the model (`stepcast predict`'s row,
    and through ``encode_arch`` search's, the curve's, the frontier's and the plan's): the transformer shape
    (models.arch.accounting.ARCH_COLUMNS); for a hybrid row (one with a layer_pattern) the pattern and the Mamba shape
    (models.arch.mamba); when any is given, the MLA shape and MTP depth (models.arch.mla)."""
    row = {c: arch.get(c) for c in ARCH_COLUMNS}
    if arch.get("layer_pattern"):  # hybrid Mamba-Transformer rows (models.arch.mamba)
        row.update({c: arch.get(c) for c in ("layer_pattern", *mamba.SHAPE_COLUMNS)})
    if any(arch.get(c) not in (None, "") for c in mla.ARCH_COLUMNS):  # MLA attention, MTP modules (models.arch.mla)
        row.update({c: arch.get(c) for c in mla.ARCH_COLUMNS})
    return row


def encode_arch(arch: Mapping) -> dict[str, np.ndarray]:
    """The architecture inputs of one model (``arch_config``) encoded exactly as ``encode_configs`` encodes a
    `predict` row: one-element arrays, keyed by the ``ARCH_INPUTS`` the row has (a hybrid row adds its block counts
    and Mamba shape, an MLA row its MLA and MTP columns). An activation given as its code is taken as that code."""
    row = arch_config(arch)
    act = row.get("activation")
    if act is not None and not isinstance(act, str):  # a code (models.core.params.ACTIVATION_CODES), as arrays carry it
        row["activation"] = next((k for k, v in ACTIVATION_CODES.items() if v == int(act)), str(act))
    try:  # encoding one row takes ~10 ms; the frontier and the plan ask for the same few models hundreds of times
        enc = _encode_arch_row(tuple(row.items()))
    except TypeError:  # an unhashable value
        enc = _encode_arch_row.__wrapped__(tuple(row.items()))
    return {k: v.copy() for k, v in enc.items()}


@functools.lru_cache(maxsize=1024)
def _encode_arch_row(items: tuple) -> dict[str, np.ndarray]:
    enc = encode_configs(pl.DataFrame([dict(items)]))
    return {k: v for k, v in enc.items() if k in ARCH_INPUTS}


def with_error_strings(pred: pl.DataFrame, memory_gb) -> pl.DataFrame:
    """``pred`` with its ``error`` column (every reason of ``error_code``; a memory error names the modelled bytes
    against the capacity, ``memory_gb`` as stated and in binary bytes, models.memory.model.capacity_bytes)."""
    stated = np.asarray(memory_gb, dtype=np.float64)
    pred = pred.with_columns(pl.Series("__memory_cap", capacity_bytes(stated) / GB),
                             pl.Series("__memory_stated", stated))
    return pred.with_columns(_error_strings(pred)).drop("__memory_cap", "__memory_stated")


def _error_strings(pred: pl.DataFrame) -> pl.Expr:
    parts = [
        pl.when((pl.col("error_code") & bit) != 0).then(pl.lit(msg))
        for bit, msg in ERROR_MESSAGES.items()
    ]
    mem_msg = pl.format(
        "memory {} GB > {} GB capacity ({} GB as stated, binary): weights {} GB, grads {} GB, optimizer {} GB, "
        "activations {} GB, overhead {} GB",
        *[
            pl.col(c_).round(1)
            for c_ in (
                "memory_gb_per_gpu", "__memory_cap", "__memory_stated", "mem_weights_gb", "mem_grads_gb",
                "mem_optimizer_gb", "mem_activations_gb", "mem_overhead_gb",
            )
        ],
    )
    parts.append(pl.when((pl.col("error_code") & ERR_MEMORY) != 0).then(mem_msg))
    return pl.concat_str(parts, separator="; ", ignore_nulls=True).replace("", None).alias("error")


def predict(configs: pl.DataFrame, params: PhysParams = DEFAULT) -> pl.DataFrame:
    """Predict every row of ``configs`` (architecture + layout + resolved hardware columns).

    Returns one row per input row (same order) with OUTPUT_COLUMNS plus ``error`` (null when
    fine; otherwise every reason, e.g. "tp*pp*cp*dp != n_gpus" or "memory 93.2 GB > 80 GB:
    weights ..."). Join back with ``configs.hstack(result)``.
    """
    arrays = encode_configs(configs)
    res = predict_arrays(arrays, params)
    df = pl.DataFrame({k: res[k] for k in OUTPUT_COLUMNS})
    df = df.with_columns(
        [pl.col(c_).fill_nan(None) for c_ in OUTPUT_COLUMNS if df.schema[c_] == pl.Float64]
    )
    df = with_error_strings(df, arrays["memory_gb"])
    return df.select(["feasible", "error", *[c_ for c_ in OUTPUT_COLUMNS if c_ != "feasible"]])
