"""The named parts of the step-time model (vectorized over a block of configurations).

``models.physics.step_time._predict_chunk`` decodes a block of inputs into ``Inputs`` (models.core.inputs), flags
invalid rows, and then calls one function per part, in this order (docs/model.md, "Where each part lives"):

    rates        per-GPU work units of one micro-batch: tokens, GEMM / HBM rates, bytes per element (``Rates``)
    compute      forward + backward + recompute of the stage's layers, LM head, MTP, host issue time (``Compute``)
    tp_comm      tensor-parallel collectives of one micro-batch
    cp_comm      context-parallel K/V ring (+ Mamba all-to-alls) of one micro-batch, and what the core hides
    ep_comm      expert-parallel dispatch / combine of one micro-batch (MoE options: models.arch.moe)
    pp_comm      pipeline point-to-point of one micro-batch
    overlap      the one overlap budget per micro-batch: what TP/EP/PP traffic stays exposed (``Overlap``; the
                 recipe's EP A2A overlap: ``ep_a2a_hidden``)
    dp_comm      gradient sync and ZeRO / FSDP / HSDP gathers (per step and per micro-batch), exposed
    optimizer    the optimizer update (HBM-bound)
    step_time    pipeline bubble, host soft maximum (``Step``)
    flops_per_token  model and hardware FLOPs per token (MFU / HFU)

Memory (weights, gradients, optimizer state, activations, overhead) is ``models.memory.model.memory_per_gpu``, itself a
driver over its parts, reading the same ``Inputs``. Every function reads only the fields its signature names; each
returns arrays of the block's length. Names carry units: ``*_s`` seconds, ``*_bytes`` bytes, ``t_*`` seconds,
``inv_*`` seconds per FLOP or per byte.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np

from models.arch import mamba, mla, moe
from models.arch.accounting import hybrid_flops_per_token
from models.core.fastops import clip
from models.core.inputs import Inputs
from models.core.memo import IdentityMemo
from models.core.params import Activation, PhysParams, Recompute, Sharding
from models.core.precision import param_gather_bytes, saved_gemm_input_bytes
from models.core.recompute import recompute_flops, recomputed_work
from models.memory.model import RECOMPUTE_MODULE_BITS as BITS
from models.memory.model import SAVE_LIST_RECOMPUTE, SELECTIVE_OP_SAC, active_module_code
from models.physics import collectives as coll
from models.physics import network, tp2d


@dataclass(slots=True)
class Rates:
    """Per-GPU work units of one micro-batch (``rates``): shapes, token counts, bytes per element and the
    reciprocal GEMM / HBM / attention rates every compute term divides by."""

    sh: Mapping[str, np.ndarray]  # models.arch.accounting.layer_shapes
    pc: Mapping[str, np.ndarray]  # models.arch.accounting.param_counts
    any_moe: bool
    any_cp: bool
    any_ep: bool
    q: np.ndarray  # query width
    kvd: np.ndarray  # key/value width
    Ls_moe: np.ndarray  # MoE layers per stage
    Ls_dense: np.ndarray  # dense layers per stage
    n_fwd_passes: np.ndarray  # 2 with full recompute, else 1
    act_b: np.ndarray  # activation bytes per element
    w_read_b: np.ndarray  # weight bytes read per parameter
    inv_rate: np.ndarray  # s per GEMM FLOP
    inv_hbm: np.ndarray  # s per HBM byte
    attn_rate: np.ndarray  # attention-core FLOP/s
    inv_t: np.ndarray  # 1 / tp
    s_loc: np.ndarray  # tokens of a sequence on one cp rank
    T: np.ndarray  # tokens per micro-batch on one tp group
    Tt2: np.ndarray  # 2 T / t: FLOPs per weight per token-batch on one GPU
    aT: np.ndarray  # activation bytes per hidden element of the micro-batch
    aTt: np.ndarray  # aT / t
    wrt: np.ndarray  # weight bytes read per parameter, / t
    h2: np.ndarray  # 2 d_model
    n_mats: np.ndarray  # MLP weight matrices (2 GeLU, 3 SwiGLU)
    wh: np.ndarray  # GEMM-size ramp: extra time per GEMM call, s
    # the same three for GEMMs a low-precision recipe keeps in 16 bits (LM head, router, BF16-kept layers): the
    # 16-bit peak, the row's 16-bit GEMM efficiency, 2-byte weights; the row's own values on other rows
    inv_rate_16: np.ndarray
    wh_16: np.ndarray
    wrt_16: np.ndarray


@dataclass(slots=True)
class Compute:
    """One micro-batch's compute on the stage (``compute``) and the counts the communication parts read."""

    compute_mb: np.ndarray  # forward + backward + recompute + LM head (+ MTP), s
    bwd_mb: np.ndarray  # the backward part of it, s
    host_mb: np.ndarray  # host (CPU) time to issue its ops, s
    t_core: np.ndarray  # attention core of one layer, forward, s
    Ls_attn: np.ndarray  # attention layers on the stage
    Ls_moe: np.ndarray  # MoE layers on the stage
    tp_per_stage: np.ndarray  # TP collective pairs per pass
    # the last stage's own work besides its layers: LM head (+ MTP modules), s, its backward part, and what the MTP
    # modules add to the counts above (``last_stage_balance``)
    last_mb: np.ndarray | float = 0.0
    last_bwd: np.ndarray | float = 0.0
    mtp_counts: tuple = (0.0, 0.0, 0.0)  # (attention layers, MoE layers, TP collective pairs)
    rc_core: np.ndarray | float = 0.0  # one attention layer's selective recompute (core + stored scores), s


@dataclass(slots=True)
class Overlap:
    """Exposed per-micro-batch traffic after the one overlap budget (``overlap``)."""

    tp_mb: np.ndarray
    cp_mb: np.ndarray
    ep_mb: np.ndarray
    pp_mb: np.ndarray
    hidden_comm: np.ndarray  # CP + TP + EP + PP traffic hidden behind compute


@dataclass(slots=True)
class Step:
    step: np.ndarray  # s, host wait and stragglers included
    straggler: np.ndarray  # the wait for the slowest accelerator of the job, s
    t_mb: np.ndarray  # one micro-batch's GPU time, exposed traffic included
    bubble_mb: np.ndarray  # pipeline bubble in micro-batches
    host_wait: np.ndarray  # the GPU's wait for the host, s


# ---------------------------------------------------------------------------------------------- compute

def rates(x: Inputs, P: PhysParams, sh: Mapping, pc: Mapping) -> Rates:
    """Per-dtype constants, reciprocal rates and token counts of one micro-batch on one GPU."""
    # per-dtype constants by table lookup (codes: models.core.params.DTYPE_CODES; invalid codes are
    # flagged by the validity check and clipped here): activation bytes, weight bytes read per parameter
    act_b = 2.0 + 2.0 * x.is_fp32
    w_read_b = np.take(_W_READ_BYTES, x.dt, mode="clip")
    inv_rate = 1.0 / (x.peak_tf * (1e12 * x.ke * x.gemm_eff))
    # common factors, computed once (T = tokens per micro-batch on one tp-group of GPUs)
    inv_t = 1.0 / x.t
    s_loc = x.s / x.c
    T = x.b * s_loc
    aT = act_b * T
    moe_frac = sh["n_moe_layers"] / x.L
    Ls_moe = x.Ls * moe_frac
    ramp_flops = P.gemm_ramp_flops_per_sm * x.sm
    wh, wrt = ramp_flops * inv_rate, w_read_b * inv_t
    inv_rate_16, wh_16, wrt_16 = inv_rate, wh, wrt
    if x.head_16bit.any():
        inv16 = 1.0 / (x.peaks[0] * (1e12 * x.ke * x.gemm_eff_16))
        inv16 = np.where(np.isnan(inv16), inv_rate, inv16)  # no 16-bit peak: the row's own rate
        low = x.head_16bit
        inv_rate_16 = np.where(low, inv16, inv_rate)
        wh_16 = np.where(low, ramp_flops * inv16, wh)
        wrt_16 = np.where(low, 2.0 * inv_t, wrt)
    return Rates(
        sh=sh, pc=pc, any_moe=bool(np.any(x.E > 0)), any_cp=bool(np.any(x.c > 1)), any_ep=bool(np.any(x.e > 1)),
        q=sh["q_dim"], kvd=sh["kv_dim"], Ls_moe=Ls_moe, Ls_dense=x.Ls - Ls_moe,
        n_fwd_passes=1.0 + (x.rc == Recompute.FULL),
        act_b=act_b, w_read_b=w_read_b, inv_rate=inv_rate, inv_hbm=1.0 / x.hbm_bw,
        attn_rate=x.attn_peak_tf * (1e12 * P.attn_eff * x.ke), inv_t=inv_t, s_loc=s_loc, T=T,
        Tt2=(2.0 * T) * inv_t,  # 2 T / t: FLOPs per weight per token-batch on one GPU
        aT=aT, aTt=aT * inv_t, wrt=wrt, h2=2.0 * x.h, n_mats=sh["mlp_mats"],
        # GEMM-size ramp: w_half = gemm_ramp_flops_per_sm x SMs extra FLOPs per GEMM call, as time at the GEMM rate
        wh=wh, inv_rate_16=inv_rate_16, wh_16=wh_16, wrt_16=wrt_16,
    )


#: weight bytes read per parameter, by dtype code (models.core.params.DTYPE_CODES)
_W_READ_BYTES = np.array([2.0, 2.0, 1.0, 1.0, 1.0, 0.5, 4.0, 4.0])


def attention_gemms(x: Inputs, r: Rates) -> np.ndarray:
    """QKV and output projections of one layer, forward, per GPU (s): roofline of the split GEMMs."""
    attn_m = r.sh["attn_matmul"]
    attn_bytes = r.wrt * attn_m + r.aT * r.h2 + r.aTt * (2.0 * (r.q + r.kvd))
    if x.tp2d is not None:  # 2-D rows: the GEMMs read and write the grid's gathered activations (models.physics.tp2d)
        io_attn = tp2d.gemm_io_elems_per_token(x.h, r.q, r.kvd, x.arch["ffn_dim"], r.n_mats, x.t, x.grid2d)[0]
        attn_bytes = np.where(x.tp2d, r.wrt * attn_m + r.aT * io_attn, attn_bytes)
    t_attn_gemm = np.maximum(r.Tt2 * attn_m * r.inv_rate + 2.0 * r.wh, attn_bytes * r.inv_hbm)  # QKV, output
    # MLA rows: duplicated down-projections, split up-projections (models.arch.mla)
    if (ms := x.arch.get("mla")) is not None:
        t_mla = mla.attn_gemm_time(mla.attn_gemms(ms, x.h, x.heads, x.t, x.sp), r.T, r.inv_rate, r.inv_hbm,
                                   r.w_read_b, r.act_b, r.wh, ms["n_gemms"])
        t_attn_gemm = np.where(ms["mla"], t_mla, t_attn_gemm)
    return t_attn_gemm


def dense_mlp_gemms(x: Inputs, r: Rates) -> np.ndarray:
    """The dense MLP of one layer, forward, per GPU (s)."""
    mlp_m = r.sh["dense_mlp_matmul"]
    mlp_bytes_d = r.wrt * mlp_m + r.aT * r.h2 + r.aTt * (r.n_mats * x.arch["ffn_dim"])
    if x.tp2d is not None:
        io_mlp = tp2d.gemm_io_elems_per_token(x.h, r.q, r.kvd, x.arch["ffn_dim"], r.n_mats, x.t, x.grid2d)[1]
        mlp_bytes_d = np.where(x.tp2d, r.wrt * mlp_m + r.aT * io_mlp, mlp_bytes_d)
    return np.maximum(r.Tt2 * mlp_m * r.inv_rate + r.n_mats * r.wh, mlp_bytes_d * r.inv_hbm)


def moe_mlp_gemms(x: Inputs, r: Rates) -> tuple[np.ndarray, np.ndarray]:
    """The MoE MLP of one layer, forward, per GPU (s): top_k + shared experts' GEMMs on every token, one GEMM
    call per local expert, the router; and the sharded FFN width F_moe its element-wise traffic reads. The most
    loaded EP rank runs rho x the mean routed tokens; its routed-expert weights are split over etp, i.e. tp/etp x
    the tp-split bytes (models.arch.moe; both factors exactly 1 at the defaults)."""
    k, ns = x.k, x.ns
    k_rho = k * x.rho
    kns = moe.routed_tokens_factor(k, ns, x.rho)  # k rho + n_shared
    F_moe = kns * x.arch["expert_ffn_dim"]
    e_local = np.where(x.E > 0, x.E / x.e, 0.0)
    exp_m, rout_m = r.sh["expert_matmul"], r.sh["router_matmul"]
    w_bytes = r.wrt * ((e_local * moe.expert_weight_scale(x.t, x.et) + ns) * exp_m + rout_m)
    mlp_bytes_m = w_bytes + r.aT * (r.h2 * (1.0 + k_rho)) + r.aTt * (r.n_mats * F_moe)
    if x.tp2d is not None:
        io_moe = tp2d.moe_io_elems_per_token(x.h, k, F_moe, r.n_mats, x.t, x.grid2d)
        mlp_bytes_m = np.where(x.tp2d, w_bytes + r.aT * io_moe, mlp_bytes_m)
    # the router GEMM is not a Transformer Engine module (Megatron-Core TopKRouter: a plain matmul, in fp32 with
    # --moe-router-dtype fp32): it stays at the 16-bit rate under low-precision recipes
    t_mlp_m = np.maximum(r.Tt2 * (kns * exp_m * r.inv_rate + rout_m * r.inv_rate_16)
                         + (r.n_mats * r.wh) * (e_local + ns), mlp_bytes_m * r.inv_hbm)
    return t_mlp_m, F_moe


#: HBM bytes a low-precision recipe moves per element it quantizes for a GEMM, by dtype code
#: (models.core.params.DTYPE_CODES): read the 16-bit tensor (2 B) and write it twice in the low-precision format, the
#: row-wise copy for the forward/dgrad GEMM and the column-wise (transposed) copy for the wgrad GEMM (Transformer
#: Engine `cast_transpose` for FP8; MXFP8 and NVFP4 quantize row- and column-wise with their own block scales,
#: 1 E8M0 byte per 32 values and 1 E4M3 byte per 16 values). fp8-cs (per-tensor current scaling) reads the tensor
#: once more for its amax before casting (TE Float8CurrentScaling: amax kernel, then cast). 16-bit and fp32: 0.
_CAST_BYTES = np.array([0.0, 0.0, 2.0 + 2.0, 2.0 + 2.0 + 2.0, 2.0 + 2.0 * (1.0 + 1.0 / 32.0),
                        2.0 + 2.0 * (0.5 + 1.0 / 16.0), 0.0, 0.0])


def quantize_casts(x: Inputs, r: Rates, cast_bytes: np.ndarray, F: np.ndarray, routed: np.ndarray | float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Quantize kernels of one layer of a low-precision row, (forward s, backward s) per GPU: each low-precision
    GEMM casts its 16-bit input (``_CAST_BYTES`` per element). Forward: the output projection's input (q) and the
    second MLP GEMM's input (F); the QKV and first MLP GEMMs' inputs are cast inside the fused LayerNorm (TE
    LayerNormLinear writes the low-precision copies instead of the 16-bit output the element-wise traffic already
    counts), except for MoE experts, whose dispatched token copies (``routed`` x h) are cast on their own.
    Backward: the gradient of every GEMM output, (q + 2 kv) + (mats - 1) F + ``routed`` x h split over tp, and
    the two row-parallel outputs' gradients of h, whole on every tensor-parallel rank."""
    fwd = r.T * ((r.q + F + routed * x.h) * r.inv_t)
    bwd = r.T * ((r.q + 2.0 * r.kvd + (r.n_mats - 1.0) * F + routed * x.h) * r.inv_t + 2.0 * x.h)
    scale = cast_bytes * r.inv_hbm
    return fwd * scale, bwd * scale


def moe_permute_elems(top_k, ep, n_experts):
    """Element-wise HBM traffic of the MoE token dispatcher, forward, per token per MoE layer, in units of
    d_model elements (reads + writes), following Megatron-Core's all-to-all dispatcher (MoEAlltoAllTokenDispatcher,
    megatron/core/transformer/moe/token_dispatcher.py): `permute` reads each token once and writes its top_k
    copies, `unpermute` reads the top_k expert outputs and writes their weighted sum: 2 (top_k + 1). With experts
    spread over ep > 1 ranks and several experts per rank, the received tokens are sorted by local expert
    (`sort_chunks_by_idxs`) and unsorted on the way back: 2 x (read + write of top_k copies) = 4 top_k more."""
    local = np.where(n_experts > 0, n_experts / ep, 0.0)
    return 2.0 * (top_k + 1.0) + np.where((ep > 1) & (local > 1), 4.0 * top_k, 0.0)


def compute(x: Inputs, r: Rates, P: PhysParams, casts: bool = True) -> Compute:
    """Forward, backward (2x GEMMs) and recompute of the stage's layers for one micro-batch, the LM head, the
    MTP and hybrid hooks, and the host time to issue the micro-batch's ops."""
    rc, inv_hbm = x.rc, r.inv_hbm
    t_attn_gemm = attention_gemms(x, r)
    t_mlp_d = dense_mlp_gemms(x, r)
    F_dense = x.arch["ffn_dim"]
    # --- attention core (forward) ---
    sq_t = (r.s_loc * x.s) * (x.b * r.inv_t)  # query x key pairs per GPU
    t_core = (4.0 * P.attn_causal_work_fraction) * sq_t * r.q / r.attn_rate
    # --- element-wise (forward): HBM traffic ---
    ef = np.where(x.act == Activation.GELU, P.elementwise_f_elems_gelu, P.elementwise_f_elems_swiglu)
    ew_common = r.aT * ((P.elementwise_h_elems_fwd + P.elementwise_elems_per_dropout * P.dropout_mask_elems) * x.h)
    if x.sp.any():
        ew_common = np.where(x.sp, ew_common * r.inv_t, ew_common)
    ew_scores = r.act_b * (P.attn_scores_stored * 4.0) * x.heads * sq_t
    ew_base = ew_common + ew_scores
    aTt_ef = r.aTt * ef
    t_ew_d = (ew_base + aTt_ef * F_dense) * inv_hbm
    # per-layer forward, backward (2x), recompute
    gemm_core_d = t_attn_gemm + t_mlp_d + t_core
    cast = np.take(_CAST_BYTES, x.dt, mode="clip")  # low-precision rows: quantize kernels (``quantize_casts``)
    any_cast = casts and bool(np.any(cast > 0))  # layers kept in 16 bits cast nothing
    cf_d, cb_d = quantize_casts(x, r, cast, F_dense, 0.0) if any_cast else (0.0, 0.0)
    fwd_layers = r.Ls_dense * (gemm_core_d + t_ew_d + cf_d)
    bwd_gemm = 1.0 + x.wgrad  # backward GEMMs per forward GEMM: the data gradient, and the weight gradient if trained
    bwd_layers = r.Ls_dense * (bwd_gemm * (t_attn_gemm + t_mlp_d) + 2.0 * t_core + P.elementwise_bwd_factor * t_ew_d
                               + cb_d)
    Ls_moe = r.Ls_moe
    t_mlp_m = 0.0
    if r.any_moe:
        t_mlp_m, F_moe = moe_mlp_gemms(x, r)
        t_ew_m = (ew_base + aTt_ef * F_moe + r.aTt * x.h * moe_permute_elems(x.k, x.e, x.E)) * inv_hbm
        gemm_core_m = t_attn_gemm + t_mlp_m + t_core
        cf_m, cb_m = quantize_casts(x, r, cast, F_moe, moe.routed_tokens_factor(x.k, x.ns, x.rho)) if any_cast \
            else (0.0, 0.0)
        fwd_layers = fwd_layers + Ls_moe * (gemm_core_m + t_ew_m + cf_m)
        bwd_layers = bwd_layers + Ls_moe * (bwd_gemm * (t_attn_gemm + t_mlp_m) + 2.0 * t_core
                                            + P.elementwise_bwd_factor * t_ew_m + cb_m)
    tp_per_stage = 2.0 * x.Ls  # TP collective pairs per pass: 2 per transformer layer, 1 per hybrid block
    Ls_attn = x.Ls
    if (hy := x.hy) is not None:  # hybrid rows: blocks of one mixer each (models.arch.mamba, docs/model.md)
        hb = hybrid_stage(hy, x.arch, r.pc, dict(
            L=x.L, Ls=x.Ls, T=r.T, t=x.t, e=x.e, rho=x.rho, scale_e=moe.expert_weight_scale(x.t, x.et), aT=r.aT, aTt=r.aTt, wrt=r.wrt, Tt2=r.Tt2, h2=r.h2, act_b=r.act_b,
            inv_rate=r.inv_rate, inv_hbm=inv_hbm, wh=r.wh, peaks=x.peaks, ke=x.ke, t_attn_gemm=t_attn_gemm,
            t_core=t_core, t_mlp_d=t_mlp_d, ew_common=ew_common, ew_scores=ew_scores, aTt_ef=aTt_ef,
            F_dense=F_dense, n_mats=r.n_mats), P)
        fwd_layers = np.where(hy["hybrid"], hb["fwd"], fwd_layers)
        bwd_layers = np.where(hy["hybrid"], hb["bwd"], bwd_layers)
        Ls_attn = np.where(hy["hybrid"], hb["Ls_attn"], x.Ls)
        Ls_moe = np.where(hy["hybrid"], hb["Ls_moe"], Ls_moe)
        tp_per_stage = np.where(hy["hybrid"], x.Ls, tp_per_stage)
    recompute_layers = recomputed_work(rc, fwd_layers, Ls_attn * (t_core + ew_scores * inv_hbm))
    if x.xla is not None:
        recompute_layers = recompute_layers - remat_skipped_gemm(x, r, t_mlp_d, t_mlp_m)
    t_lm = lm_head(x, r) * ((2.0 + x.wgrad) / 3.0)  # forward + data gradient (+ weight gradient if trained)
    compute_mb = fwd_layers + bwd_layers + recompute_layers + t_lm
    lm_bwd = (1.0 + x.wgrad) / (2.0 + x.wgrad) * t_lm
    bwd_mb = bwd_layers + lm_bwd
    last_mb, last_bwd, mtp_counts = t_lm, lm_bwd, (0.0, 0.0, 0.0)
    if (mtp := x.arch.get("mtp")) is not None:  # MTP modules on the last stage: a block of the last layer's kind each
        last_moe = r.sh["n_moe_layers"] > 0
        g1, e1 = (np.where(last_moe, gemm_core_m, gemm_core_d), np.where(last_moe, t_ew_m, t_ew_d)) if r.any_moe \
            else (gemm_core_d, t_ew_d)
        rc1 = recomputed_work(rc, g1 + e1, t_core + ew_scores * inv_hbm)
        t_mtp, b_mtp = mla.mtp_stage_time(mtp, g1 + e1, 2.0 * g1 + P.elementwise_bwd_factor * e1, rc1, t_lm, r.Tt2,
                                          x.h, r.wrt, r.aT, r.aTt, r.inv_rate, inv_hbm, r.wh)
        compute_mb, bwd_mb, tp_per_stage = compute_mb + t_mtp, bwd_mb + b_mtp, tp_per_stage + 2.0 * mtp
        Ls_attn, Ls_moe = Ls_attn + mtp, Ls_moe + mtp * last_moe
        last_mb, last_bwd, mtp_counts = last_mb + t_mtp, last_bwd + b_mtp, (mtp, mtp * last_moe, 2.0 * mtp)
    # host (CPU) time to issue the ops of one micro-batch; the GPU waits for it when kernels are short
    # ops the recompute repeats, by code (models.core.params.Recompute: none, selective, full)
    ops_rc = np.take(np.array([0.0, P.ops_attn_core_fwd, P.ops_per_layer_fwd]), rc, mode="clip")
    host_mb = (0.5 * tp_per_stage) * P.host_overhead_s_per_op * (
        P.ops_per_layer_fwd * (1.0 + P.elementwise_bwd_factor) + ops_rc)
    return Compute(compute_mb=compute_mb, bwd_mb=bwd_mb, host_mb=host_mb, t_core=t_core, Ls_attn=Ls_attn,
                   Ls_moe=Ls_moe, tp_per_stage=tp_per_stage, last_mb=last_mb, last_bwd=last_bwd,
                   mtp_counts=mtp_counts, rc_core=t_core + ew_scores * inv_hbm)


def remat_skipped_gemm(x: Inputs, r: Rates, t_mlp_d: np.ndarray, t_mlp_m: np.ndarray | float) -> np.ndarray:
    """Time (s per micro-batch) a full-recompute row compiled by XLA does not spend recomputing: each layer's last
    GEMM, the MLP's down-projection (one of its ``mlp_mats`` equal GEMMs; the routed and shared experts' for an MoE
    layer). JAX's remat recomputes only what the backward needs: ``remat_partial_eval`` (jax/_src/ad_checkpoint.py)
    dead-code-eliminates the staged forward (``pe.dce_jaxpr``) down to the residuals of the linearized
    computation, and a matmul's VJP needs its inputs, not its output, which only the residual sum and the next layer
    read. PyTorch's ``torch.utils.checkpoint`` re-runs the forward up to its last saving op (the down-projection
    saves its input as it runs) and Megatron-Core's re-runs it whole: other rows recompute every GEMM. Hybrid rows
    (their own block costs, ``models.arch.mamba``) are left whole."""
    skip = x.xla & (x.rc == Recompute.FULL)
    if x.hy is not None:
        skip = skip & ~x.hy["hybrid"]
    saved = (r.Ls_dense * t_mlp_d + r.Ls_moe * t_mlp_m) / r.n_mats
    return np.where(skip, saved, 0.0)


def last_stage_balance(x: Inputs, cm: Compute) -> Compute:
    """The stage that paces the pipeline of a DeepSeek-V3-class model (MLA rows) whose layers do not split evenly.

    ``compute`` puts ceil(n_layers / pp) layers and the LM head (+ MTP modules) on one stage. Megatron-Core splits
    unevenly only by an explicit layout, and Megatron-Bridge's DeepSeek-V3 recipes set one
    (``set_deepseek_v3_pipeline_model_parallel_layout``) that gives the last stage the remainder of the 61 layers
    beside the MTP module and the loss: 16/16/16/13 + MTP + loss at pp 4 (also as 4 x 4 virtual stages of 4, the
    last 1 + MTP + loss), 8 x 7 + 5 + MTP + loss at pp 8, 4 x 15 + 1 + MTP + loss at pp 16. So there the other
    stages hold ceil(L / pp) layers, the last one L - (pp - 1) ceil(L / pp) with the head and the MTP modules, and
    the slower of the two paces the step; the traffic counts are the busier stage's. Other rows, and an even
    split, are unchanged (measured: the same rule on every row, e.g. Llama 3.1 405B's 126 layers at pp 16, made
    Megatron-Bridge's GB200 405B runs 10-20 points too fast; docs/changelog.md)."""
    Ls_last = clip(x.L - (x.p - 1.0) * x.Ls, 0.0, x.Ls)
    ms = x.arch.get("mla")
    short = (Ls_last < x.Ls) & (ms["mla"] if ms is not None else False)
    if not np.any(short):
        return cm
    ratio = np.where(x.Ls > 0, Ls_last / np.where(x.Ls > 0, x.Ls, 1.0), 1.0)
    layers, layers_bwd = cm.compute_mb - cm.last_mb, cm.bwd_mb - cm.last_bwd
    last = layers * ratio + cm.last_mb
    mid = short & (layers > last)  # a full stage paces: no head, no MTP module on it
    lst = short & ~mid

    def count(c, extra):  # the busier of the two stages' counts (its exposed traffic adds to its compute)
        base = c - extra
        return np.where(short, np.maximum(base, base * ratio + extra), c)
    ca, cmoe, ctp = cm.mtp_counts
    return replace(cm, compute_mb=np.where(short, np.maximum(layers, last), cm.compute_mb),
                   bwd_mb=np.where(mid, layers_bwd, np.where(lst, layers_bwd * ratio + cm.last_bwd, cm.bwd_mb)),
                   Ls_attn=count(cm.Ls_attn, ca), Ls_moe=count(cm.Ls_moe, cmoe),
                   tp_per_stage=count(cm.tp_per_stage, ctp))


def _activation_time(r: Rates) -> np.ndarray:
    """HBM time of an MLP's activation function per element of its width, one layer forward: it reads its
    n_mats - 1 inputs and writes 1."""
    return r.aTt * r.n_mats * r.inv_hbm


def _mlp_forward(x: Inputs, r: Rates, gemm_share: np.ndarray | float = 1.0) -> tuple[np.ndarray, np.ndarray | float]:
    """One layer's MLP forward as the recompute parts repeat it, (dense, MoE) in s: ``gemm_share`` of its GEMMs
    (all of them, or the input GEMMs only) and its activation function; MoE 0.0 where no row has experts."""
    act = _activation_time(r)
    dense = gemm_share * dense_mlp_gemms(x, r) + act * x.arch["ffn_dim"]
    if not r.any_moe:
        return dense, 0.0
    t_mlp_m, F_moe = moe_mlp_gemms(x, r)
    return dense, gemm_share * t_mlp_m + act * F_moe


def module_recompute(x: Inputs, r: Rates, cm: Compute) -> Compute:
    """``cm`` plus the forward work Megatron-Core's ``recompute_modules`` (selective rows; bits of
    models.memory.model.RECOMPUTE_MODULE_BITS) repeat during backward, per micro-batch: ``mlp`` the dense layers' MLP
    GEMMs and activation, ``moe`` the MoE layers' expert GEMMs and activation, ``shared_experts`` the shared
    experts' FLOP share of those, ``moe_act`` the routed experts' activation function (n_mats elements of the
    routed width through HBM), ``layernorm`` the MoE layers' pre-MLP norm (read and write h), ``mla_up_proj`` the
    MLA query and key/value up-projection GEMMs (RoPE's element-wise work not counted). The token exchange around a
    recomputed MoE layer is not repeated here. ``cm`` itself where no row has a module list."""
    if (code := active_module_code(x.rc_modules, x.rc)) is None:
        return cm
    bit = {k: (code & v) > 0 for k, v in BITS.items()}
    Ls_dense = r.Ls_dense
    if (hy := x.hy) is not None:
        Ls_dense = np.where(hy["hybrid"], x.Ls * mamba.block_shares(hy)[2], Ls_dense)
    dense, whole = _mlp_forward(x, r)
    extra = bit["mlp"] * Ls_dense * dense
    if r.any_moe:
        kns = moe.routed_tokens_factor(x.k, x.ns, x.rho)
        norm = r.aT * r.h2 * r.inv_hbm * np.where(x.sp, r.inv_t, 1.0)
        per = np.where(bit["moe"], whole, bit["shared_experts"] * whole * x.ns / np.where(kns > 0, kns, 1.0)
                       + bit["moe_act"] * _activation_time(r) * (kns - x.ns) * x.arch["expert_ffn_dim"]
                       + bit["layernorm"] * norm)
        extra = extra + cm.Ls_moe * per
    if (ms := x.arch.get("mla")) is not None:
        up = [g for g in mla.attn_gemms(ms, x.h, x.heads, x.t, x.sp) if g[0] in ("q_up", "kv_up")]
        t_up = mla.attn_gemm_time(up, r.T, r.inv_rate, r.inv_hbm, r.w_read_b, r.act_b, r.wh, 2.0)
        extra = extra + (bit["mla_up_proj"] & ms["mla"]) * cm.Ls_attn * t_up
    return replace(cm, compute_mb=cm.compute_mb + extra)


def save_list_recompute(x: Inputs, r: Rates, cm: Compute) -> Compute:
    """``cm`` with the recompute of the selective rows that state a save list (``x.save_list``: a MaxText
    remat_policy, models.memory.model SAVE_LIST_RECOMPUTE) in place of the attention core ``compute`` charges them:
    per layer the core (+ stored scores) where the list does not keep the context, the QKV and output projection
    GEMMs where it keeps neither, and the MLP's input GEMMs (gate and up; for MoE layers the experts' and shared
    experts') with the activation where it keeps them not. Hybrid blocks keep the attention-core rule. ``cm``
    itself where no row states one."""
    if x.save_list is None:
        return cm
    code = np.nan_to_num(x.save_list).astype(np.int64)
    on = (code > SELECTIVE_OP_SAC) & (x.rc == Recompute.SELECTIVE)  # MaxText's save lists
    if x.hy is not None:
        on = on & ~x.hy["hybrid"]
    if not np.any(on):
        return cm
    core, qkv, out, mlp_in = (np.take(SAVE_LIST_RECOMPUTE[:, j], code, mode="clip") for j in range(4))
    attn_m = r.sh["attn_matmul"]
    t_attn = attention_gemms(x, r)  # QKV + output projection, split by their weights' shares
    out_share = np.where(attn_m > 0, r.q * x.h / np.maximum(attn_m, 1.0), 0.0)
    extra = cm.Ls_attn * ((core - 1.0) * cm.rc_core + qkv * (1.0 - out_share) * t_attn + out * out_share * t_attn)
    # the MLP's input GEMMs: gate and up of n_mats matrices (1 of 2 for a plain MLP)
    dense, moe_mlp = _mlp_forward(x, r, (r.n_mats - 1.0) / r.n_mats)
    mlp = r.Ls_dense * dense + (r.Ls_moe * moe_mlp if r.any_moe else 0.0)
    extra = np.where(on, extra + mlp_in * mlp, 0.0)
    return replace(cm, compute_mb=cm.compute_mb + extra)


def layers_kept_in_16bit(x: Inputs, r: Rates, cm: Compute, P: PhysParams) -> Compute:
    """A low-precision recipe that keeps its last ``n_layers_16bit`` layers (blocks, for hybrids) in 16 bits
    (Megatron-Core ``--first-last-layers-bf16`` / ``--num-layers-at-end-in-bf16``; recipes: models.core.precision):
    those layers sit on the last pipeline stage, which is the one that paces the step (it also holds the LM head),
    so that stage runs min(n, layers per stage) of its layers at the 16-bit rates. The stage's compute is
    interpolated between all-low-precision and all-16-bit by that share (the layers are alike)."""
    rows = x.layers_16bit > 0
    if not rows.any():
        return cm
    cm16 = compute(x, replace(r, inv_rate=r.inv_rate_16, wh=r.wh_16, wrt=r.wrt_16), P, casts=False)
    share = np.minimum(x.layers_16bit, x.Ls) / x.Ls
    return replace(cm, compute_mb=np.where(rows, cm.compute_mb + share * (cm16.compute_mb - cm.compute_mb),
                                           cm.compute_mb),
                   bwd_mb=np.where(rows, cm.bwd_mb + share * (cm16.bwd_mb - cm.bwd_mb), cm.bwd_mb))


def lm_head(x: Inputs, r: Rates) -> np.ndarray:
    """LM head + cross-entropy on the last stage, forward + 2x backward (s).

    Low-precision recipes keep the head in 16 bits: Megatron-Core builds ``output_layer`` as a plain
    ``tensor_parallel.ColumnParallelLinear``, outside Transformer Engine's FP8/FP4 autocast (which converts only TE
    modules); an FP8 head is an opt-in (``fp8_output_proj``, MXFP8 only, Megatron-LM pull request 4825, 2026).
    torchtitan's float8/MXFP8 recipes filter the ``output`` layer (``filter_fqns = ["output"]``), and the NVFP4
    pretraining recipe (NVIDIA, arXiv:2509.25149, section 4) retains the output projection head in BF16. So for
    those rows the head's GEMMs run at the 16-bit peak with the 16-bit GEMM efficiency and read 2-byte weights."""
    Vh = x.V * x.h
    lm_bytes = r.wrt_16 * Vh + r.aT * x.h + (12.0 * r.T) * x.V * r.inv_t
    return 3.0 * np.maximum(r.Tt2 * Vh * r.inv_rate_16 + r.wh_16, lm_bytes * r.inv_hbm)


def hybrid_stage(hy: Mapping[str, np.ndarray], arch: Mapping[str, np.ndarray], pc: Mapping, v: Mapping,
                 P: PhysParams) -> dict[str, np.ndarray]:
    """Forward and backward time of one micro-batch through the stage's blocks of hybrid rows (docs/model.md,
    "Hybrid Mamba-Transformer blocks"). ``v``: the compute part's per-row quantities (L, Ls, T, t, e, rho and
    scale_e of models.arch.moe, aT, aTt, wrt,
    Tt2, h2, act_b, inv_rate, inv_hbm, wh, peaks, t_attn_gemm, t_core, t_mlp_d, ew_common, ew_scores, aTt_ef,
    F_dense, n_mats). The stage holds Ls = ceil(n_layers/pp) blocks in the proportions of the pattern; a block
    carries half of a transformer layer's h-wide element-wise traffic (one norm and one residual add)."""
    hc = pc["hybrid_counts"]
    frac = v["Ls"] / v["L"]
    nM, nA, nF, nE = (frac * hy[c_] for c_ in mamba.COUNT_COLUMNS)
    inv_rate, inv_hbm, wh, Tt2, aT, aTt, wrt = (v[x] for x in ("inv_rate", "inv_hbm", "wh", "Tt2", "aT", "aTt",
                                                                "wrt"))
    n_mats, aTt_ef = v["n_mats"], v["aTt_ef"]
    ew_half = 0.5 * v["ew_common"]
    # attention and MLP blocks: the transformer's GEMMs, core and element-wise traffic, split by block
    gemm_attn = v["t_attn_gemm"] + v["t_core"]
    t_ew_attn = (ew_half + v["ew_scores"]) * inv_hbm
    t_ew_mlp = (ew_half + aTt_ef * v["F_dense"]) * inv_hbm
    # MoE blocks: routed experts (latent width when given), shared experts, router (+ latent projections)
    k, ns, fe = arch["top_k"], arch["n_shared_experts"], arch["expert_ffn_dim"]
    rho = v["rho"]  # the most loaded EP rank's routed tokens / the mean; experts split over etp (models.arch.moe)
    kns = moe.routed_tokens_factor(k, ns, rho)
    exp_w, moe_act = hc["expert_matmul"], hc["moe_active_matmul"]
    moe_flops = moe_act if np.all(rho == 1.0) else moe_act + (k * (rho - 1.0)) * exp_w
    lat = hy["moe_latent_size"]
    n_lat_gemms = 2.0 * (np.isfinite(lat) & (lat > 0))
    moe_bytes = wrt * (np.where(arch["n_experts"] > 0, arch["n_experts"] / v["e"], 0.0) * exp_w * v["scale_e"]
                       + moe_act - k * exp_w) + aT * (v["h2"] * (1.0 + k * rho)) + aTt * (n_mats * kns * fe)
    calls = np.where(arch["n_experts"] > 0, arch["n_experts"] / v["e"], 0.0) + ns  # one GEMM per local expert
    t_moe = np.maximum(Tt2 * moe_flops * inv_rate + (n_mats * calls + n_lat_gemms) * wh, moe_bytes * inv_hbm)
    perm = moe_permute_elems(k, v["e"], arch["n_experts"])
    t_ew_moe = (ew_half + aTt_ef * (kns * fe) + aTt * (0.5 * v["h2"]) * perm) * inv_hbm
    # Mamba blocks: in_proj + out_proj GEMMs, SSD scan (16-bit tensor-core roofline), conv + norm traffic
    mm = hc["mamba_matmul"]
    m_bytes = wrt * mm + aT * v["h2"] + aTt * (hy["in_proj_out"] + hy["d_inner"])
    t_m_gemm = np.maximum(Tt2 * mm * inv_rate + 2.0 * wh, m_bytes * inv_hbm)
    ssd_rate = v["peaks"][0] * (1e12 * P.attn_eff) * v["ke"]
    shape = (hy["mamba_n_heads"], hy["mamba_head_dim"], hy["mamba_n_groups"], hy["mamba_state_dim"],
             hy["mamba_chunk_size"])
    tok_t = v["T"] / v["t"]  # heads and groups (Mamba-1: d_inner) are split over tp
    t_ssd_flops = tok_t * mamba.ssd_flops_per_token(*shape) / ssd_rate
    t_scan = np.maximum(t_ssd_flops, tok_t * mamba.ssd_bytes_per_token(*shape, v["act_b"]) * inv_hbm)
    # backward: 2x the FLOPs, but about 3x the forward's traffic (models.arch.mamba, "SSD traffic")
    t_scan_bwd = np.maximum(2.0 * t_ssd_flops, tok_t * mamba.ssd_bwd_bytes_per_token(*shape, v["act_b"]) * inv_hbm)
    t_ew_m = (ew_half + aTt * mamba.elementwise_elems_per_token(hy["conv_dim"], hy["d_inner"])) * inv_hbm
    if np.any(m1 := hy["mamba1"]):  # Mamba-1 rows (Jamba, models.arch.mamba): 4 GEMMs, selective scan on CUDA cores
        di, xo, N1 = hy["d_inner"], hy["x_proj_out"], hy["mamba_state_dim"]
        # in_proj / out_proj as above; x_proj reads u and writes dt, B, C, dt_proj reads dt and writes delta
        m1_bytes = m_bytes + aTt * (2.0 * di + 2.0 * xo)
        t_m1_gemm = np.maximum(Tt2 * mm * inv_rate + 4.0 * wh, m1_bytes * inv_hbm)
        vec = v["peaks"][6]  # fp32 non-tensor peak (models.physics.hardware.peak_table); none: 16-bit peak / 16
        vec = np.where(np.isfinite(vec) & (vec > 0), vec, v["peaks"][0] / mamba.TENSOR_TO_FP32_VECTOR)
        scan_rate = vec * (1e12 * P.attn_eff) * v["ke"]
        t_scan1 = np.maximum(tok_t * mamba.selective_scan_flops_per_token(di, N1) / scan_rate,
                             tok_t * mamba.selective_scan_bytes_per_token(di, N1, v["act_b"]) * inv_hbm)
        t_ew_m1 = (ew_half + aTt * mamba.mamba1_elementwise_elems_per_token(di, xo)) * inv_hbm
        t_m_gemm, t_scan, t_scan_bwd, t_ew_m = (np.where(m1, x1, x2) for x1, x2 in (
            (t_m1_gemm, t_m_gemm), (t_scan1, t_scan), (2.0 * t_scan1, t_scan_bwd), (t_ew_m1, t_ew_m)))
    m_core = np.nan_to_num(t_m_gemm + t_scan)
    scan_bwd_extra = np.nan_to_num(t_scan_bwd - 2.0 * t_scan)  # the SSD backward beyond 2x its forward
    t_ew_m = np.nan_to_num(t_ew_m)
    gemm = nA * gemm_attn + nF * v["t_mlp_d"] + nE * t_moe + nM * m_core
    ew = nA * t_ew_attn + nF * t_ew_mlp + nE * t_ew_moe + nM * t_ew_m
    return {"fwd": gemm + ew, "bwd": 2.0 * gemm + nM * scan_bwd_extra + P.elementwise_bwd_factor * ew,
            "Ls_attn": nA, "Ls_moe": nE}


# ---------------------------------------------------------------------------------------------- communication

def tp_comm(x: Inputs, r: Rates, cm: Compute) -> np.ndarray:
    """Tensor parallel, per micro-batch (s, before overlap): 2 all-reduces (or AG+RS pairs) per layer per forward
    pass, 2 in backward (hybrids: 1 per block, + a small all-reduce per Mamba-1 block: models.arch.mamba); 2-D rows: 4 all-gathers / reduce-scatters on the grid's c-group and 4 on its r-group per
    layer and pass (models.physics.tp2d)."""
    tp_bw, tp_a = network.ring_link(x.net, x.t)
    tp_bytes = r.aT * x.h * quantized_gather_share(x, r)
    tp_one = coll.ring_all_reduce_time(tp_bytes, x.t, tp_bw, tp_a)
    tp_total = cm.tp_per_stage * (r.n_fwd_passes + 1.0) * tp_one
    if (hy := x.hy) is not None and np.any(hy["mamba1"]):  # Mamba-1 blocks: + x_proj's (R + 2N)-wide all-reduce
        xp = coll.ring_all_reduce_time(r.aT * np.nan_to_num(hy["x_proj_out"]), x.t, tp_bw, tp_a)
        tp_total = tp_total + np.where(hy["mamba1"], x.Ls * (hy["n_mamba_layers"] / x.L) * (r.n_fwd_passes + 1.0)
                                       * xp, 0.0)
    if x.tp2d is not None:
        F = x.arch["ffn_dim"]
        F_moe = (x.k + x.ns) * x.arch["expert_ffn_dim"] if r.any_moe else F
        tp_2d = tp2d.stage_comm_s(x.net, r.Ls_dense, r.Ls_moe, r.n_fwd_passes + 1.0, r.T, x.h, r.q, r.kvd, F, F_moe,
                                  r.n_mats, x.t, r.act_b, x.grid2d)
        tp_total = np.where(x.tp2d, tp_2d, tp_total)
    return tp_total + expert_tp_comm(x, r, cm, tp_bytes, tp_one)


def quantized_gather_share(x: Inputs, r: Rates) -> np.ndarray | float:
    """The TP traffic of a low-precision TransformerEngine row with sequence parallelism, as a share of the 16-bit
    traffic: of each all-gather / reduce-scatter pair, the all-gather moves the GEMM input already quantized (its
    bytes per element, models.core.precision.SAVED_GEMM_INPUT_BYTES: 1 for FP8, 1 + 1/32 for MXFP8 with its block
    scales, 0.5 + 1/16 for NVFP4), the reduce-scatter the 16-bit GEMM output. TransformerEngine quantizes the
    LayerNorm output (forward) and the output gradient (backward) before the sequence-parallel all-gather
    (transformer_engine/pytorch/module/layernorm_linear.py and linear.py: ``gather_along_first_dim`` with the
    input / grad-output quantizer gathers the quantized tensor). ``x.quantized_gather``: the TransformerEngine rows
    (stacks whose low-precision GEMMs keep quantized inputs, models.memory.stacks ``quantized_saves``); other
    stacks, 16-bit rows and rows without sequence parallelism (an all-reduce of the 16-bit output) keep 1.0."""
    rows = x.quantized_gather
    if rows is None:
        return 1.0
    q_b = saved_gemm_input_bytes(x.dt)
    return np.where(rows & x.sp & (q_b < r.act_b), 0.5 * (1.0 + q_b / r.act_b), 1.0)


def expert_tp_comm(x: Inputs, r: Rates, cm: Compute, tp_bytes, tp_one) -> np.ndarray | float:
    """What expert tensor parallelism and the load imbalance change in the TP traffic of one micro-batch (s):
    each MoE layer's expert-side collective pair (all-gather of the dispatched tokens, reduce-scatter after) runs
    over etp ranks with ``models.arch.moe.expert_tp_bytes`` instead of the tp pair ``tp_one`` (none at etp = 1).
    0.0 where etp = tp and the load is balanced (today's TP pair, bit for bit). 2-D rows keep their own MoE
    traffic (models.physics.tp2d)."""
    if not r.any_moe:
        return 0.0
    moved = (x.E > 0) & ((x.et != x.t) | (x.rho != 1.0))
    if x.tp2d is not None:
        moved = moved & ~x.tp2d
    if not np.any(moved):
        return 0.0
    et = x.et
    etp_bw, etp_a = network.ring_link(x.net, et)
    etp_one = coll.ring_all_reduce_time(moe.expert_tp_bytes(tp_bytes, x.t, et, x.rho), et, etp_bw, etp_a)
    return np.where(moved, cm.Ls_moe * (r.n_fwd_passes + 1.0) * (etp_one - tp_one), 0.0)


def cp_comm(x: Inputs, r: Rates, cm: Compute) -> tuple[np.ndarray, np.ndarray]:
    """Context parallel, per micro-batch: (exposed s, s hidden behind the attention core). Ring exchange of K,V
    per layer (fwd), K,V + dK,dV (bwd)."""
    if not r.any_cp:
        return np.zeros(x.n), np.zeros(x.n)
    c, t, n_fwd_passes = x.c, x.t, r.n_fwd_passes
    cp_bw, cp_a = network.ring_link(x.net, c, t)
    kv_bytes = r.aTt * (2.0 * r.kvd)
    cp_step = coll.p2p_time(kv_bytes, cp_bw, cp_a)
    cp_total = np.where(c > 1, cm.Ls_attn * (c - 1.0) * cp_step * (n_fwd_passes + 2.0), 0.0)
    core_total = cm.Ls_attn * cm.t_core * (n_fwd_passes + 2.0)
    hidden_cp = np.minimum(cp_total, core_total)  # ring attention hides K/V passing behind the core
    cp_mb = cp_total - hidden_cp
    if (hy := x.hy) is not None:  # Mamba blocks: head-split all-to-alls, exposed (models.arch.mamba)
        pre, post = mamba.cp_all_to_all_elems_per_token(hy["d_inner"], hy["mamba_n_groups"],
                                                        hy["mamba_state_dim"], hy["mamba_n_heads"], t, c)
        cp_a2a = coll.all_to_all_time(r.aT * pre, c, cp_bw, cp_a) + coll.all_to_all_time(r.aT * post, c, cp_bw, cp_a)
        cp_mamba = x.Ls * (hy["n_mamba_layers"] / x.L) * (n_fwd_passes + 1.0) * cp_a2a
        cp_mb = cp_mb + np.where(hy["hybrid"] & (c > 1), np.nan_to_num(cp_mamba), 0.0)
    return cp_mb, hidden_cp


_FLEX_MEMO = IdentityMemo(4)  # the last few `_flex_share` results


def _flex_share(x: Inputs, ep_rpn: np.ndarray) -> np.ndarray:
    """The share of the EP all-to-all that leaves the node (models.arch.moe.flex_remote_share on flex-dispatcher rows,
    (ep - ep_rpn)/ep on the others). It reads only layout and architecture arrays (``ep_rpn`` is derived from
    node, tp, cp and etp), so it is reused when the same arrays come again (`models.core.memo`: the calibration's
    re-predictions of the same runs decode them once); read-only."""
    return _FLEX_MEMO.get((x.k, x.E, x.e, x.node, x.t, x.c, x.et, x.flex), (), lambda: np.where(
        x.flex, moe.flex_remote_share(x.k, x.E, x.e, ep_rpn), (x.e - ep_rpn) / x.e))


def ep_comm(x: Inputs, r: Rates, cm: Compute) -> np.ndarray:
    """Expert parallel, per micro-batch (s, before overlap): dispatch + combine all-to-all per MoE layer fwd,
    2 more in bwd. The most loaded rank receives (dispatch) and sends (combine) rho x the mean; the group is ep
    ranks ``models.arch.moe.ep_stride`` apart (etp on Megatron-Core's expert grid, tp*cp at etp = tp), ``ep_rpn`` of
    them in one scale-up domain; across domains the share that leaves the node goes through the rank's own NIC
    (``models.physics.collectives.ep_all_to_all``)."""
    if not r.any_ep:
        return np.zeros(x.n)
    stride = moe.ep_stride(x.t, x.c, x.et)
    ep_rpn = network.ranks_per_domain(x.net, x.e, stride)
    ep_bytes = r.aTt * (x.k * x.h) * x.rho
    share = None  # the flex dispatcher (DeepEP/HybridEP) sends one copy per remote node (models.arch.moe)
    if np.any(x.flex):
        share = _flex_share(x, ep_rpn)
    ep_one = coll.ep_all_to_all(x.net, ep_bytes, x.e, stride, ep_rpn, share)
    return cm.Ls_moe * (2.0 * r.n_fwd_passes + 2.0) * ep_one


def pp_comm(x: Inputs, r: Rates) -> np.ndarray:
    """Pipeline point-to-point, per micro-batch (s, before overlap): activation forward + gradient backward per
    chunk boundary."""
    pp_bw, pp_a = network.p2p_link(x.net, x.p, x.t * x.c * x.d)  # neighbouring stages are tp*cp*dp ranks apart
    pp_bytes = r.aTt * x.h
    return np.where(x.p > 1, 2.0 * x.v * coll.p2p_time(pp_bytes, pp_bw, pp_a), 0.0)


def ep_a2a_hidden(cm: Compute, ep_total: np.ndarray, merged: np.ndarray | float) -> np.ndarray | float:
    """EP all-to-all (s per micro-batch) the EP A2A overlap can hide (Megatron-Core ``--overlap-moe-expert-
    parallel-comm``): in a merged pass pair (``models.arch.moe.a2a_merged_fraction``, share ``merged``) "EP A2A in
    forward step is hidden by the attention/mlp computation in the backward step, and vice versa"
    (megatron/core/pipeline_parallel/combined_1f1b.py). So the forward's dispatch + combine (half the traffic: the
    overlap excludes full recompute, one forward pass) hide at most the other micro-batch's backward compute, the
    backward's at most its forward compute. 0.0 when no row overlaps."""
    if not np.any(merged):
        return 0.0
    half = 0.5 * ep_total
    fwd_mb = np.maximum(cm.compute_mb - cm.bwd_mb, 0.0)
    return merged * (np.minimum(half, cm.bwd_mb) + np.minimum(half, fwd_mb))


def overlap(cm: Compute, cp_mb: np.ndarray, hidden_cp: np.ndarray, tp_total: np.ndarray, ep_total: np.ndarray,
            pp_total: np.ndarray, P: PhysParams, a2a: np.ndarray | float = 0.0,
            tp_overlap: np.ndarray | float | None = None) -> Overlap:
    """One overlap budget per micro-batch: TP, EP and PP traffic hide behind the compute not already hiding CP
    traffic, in that order, never more than it (an overlap of 1 hides all of it only while compute lasts). EP
    hides ``ep_overlap`` of its traffic, or what the EP A2A overlap of the row's recipe hides (``ep_a2a_hidden``;
    ``a2a`` its merged share), whichever is more. TP hides ``tp_overlap`` of its traffic (per row; ``P.tp_overlap``
    when None): all of it where the compiler overlaps it (TPUs, models.physics.hardware.compiler_overlaps_tp)."""
    budget = np.maximum(cm.compute_mb - hidden_cp, 0.0)
    hidden_tp = np.minimum((P.tp_overlap if tp_overlap is None else tp_overlap) * tp_total, budget)
    hidden_ep = np.minimum(np.maximum(P.ep_overlap * ep_total, ep_a2a_hidden(cm, ep_total, a2a)), budget - hidden_tp)
    hidden_pp = np.minimum(P.pp_overlap * pp_total, budget - hidden_tp - hidden_ep)
    return Overlap(tp_mb=tp_total - hidden_tp, cp_mb=cp_mb, ep_mb=ep_total - hidden_ep, pp_mb=pp_total - hidden_pp,
                   hidden_comm=hidden_cp + hidden_tp + hidden_ep + hidden_pp)


def dp_comm(x: Inputs, r: Rates, mem: Mapping[str, np.ndarray], cm: Compute, ov: Overlap,
            P: PhysParams, stage_gathered: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Data parallel: (exposed s per step, exposed gathers s per micro-batch). Gradient sync (all-reduce; ZeRO:
    reduce-scatter + all-gather of the updated weights; HSDP: inside the node, then across), ZeRO-3 / FSDP / HSDP
    parameter gathers in forward and backward; dense weights over dp*cp, routed experts over
    tp*cp*dp/(etp*ep) ranks etp*ep apart (models.arch.moe.expert_dp_size; dp*cp/ep at etp = tp). Weights a recipe keeps
    as quantized parameters (``mem`` quantized_*_params_local) gather models.core.precision.PARAM_GATHER_BYTES each.
    ``stage_gathered`` rows (FSDP under PyTorch's pipelining, models.memory.stacks.stage_gathered) gather their
    stage's weights once per step, in the first micro-batch's forward (prefetched behind its compute as far as
    ``fsdp_gather_overlap`` goes), and reduce-scatter the accumulated gradients once, after the last backward."""
    shard, t, e, n = x.shard, x.t, x.e, x.n
    dense_local = mem["dense_params_local"]
    expert_local = mem["expert_params_local"]
    nd = x.d * x.c
    ne = moe.expert_dp_size(t, x.c, x.d, e, x.et)
    dp_rpn = network.ranks_per_domain(x.net, nd, t)
    dp_bw, dp_a = network.ring_link(x.net, nd, t, dp_rpn)
    any_exp = r.any_moe
    if any_exp:
        # dense rows of a block with MoE rows: an expert group of one rank, so no expert collective (and no latency)
        ne = np.where(x.E > 0, ne, 1.0)
        epd_bw, epd_a = network.ring_link(x.net, ne, x.et * e)
    hs = dp_rpn  # HSDP shards over the data-parallel ranks of one node
    # a LoRA run reduces the gradients of its trained weights only (x.wgrad: their share)
    gbytes_d = dense_local * P.grad_reduce_bytes * x.wgrad
    gbytes_e = expert_local * P.grad_reduce_bytes * x.wgrad if any_exp else 0.0
    wb = r.act_b  # 16-bit weights, 4 bytes for fp32/tf32 runs
    w_d, w_e = dense_local * wb, (expert_local * wb if any_exp else 0.0)  # bytes of the weight all-gathers
    if "quantized_dense_params_local" in mem:  # weights kept quantized (fp8_param_gather; models.memory.model)
        qg = param_gather_bytes(x.dt, wb) - wb  # Float8Tensor weights gather their uint8 buffer (1 B), MXFP8 2 B
        w_d = w_d + qg * mem["quantized_dense_params_local"]
        w_e = w_e + qg * mem["quantized_expert_params_local"] if any_exp else w_e
    full_shard = (shard == Sharding.ZERO3) | (shard == Sharding.FSDP)
    # sharding codes in this block (unknown codes above HSDP in one bin past it)
    present = np.bincount(np.clip(shard, 0, Sharding.HSDP + 1), minlength=Sharding.HSDP + 2) > 0
    has = lambda *codes: bool(present[list(codes)].any())  # noqa: E731
    zero = np.zeros(n)
    # plain DP: all-reduce grads; ZeRO-1/2: reduce-scatter grads + all-gather updated weights
    ar_d = coll.all_reduce_time(gbytes_d, nd, dp_bw, dp_a) if has(Sharding.NONE) else zero
    zero_fsdp = (Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3, Sharding.FSDP)
    rs_d = coll.reduce_scatter_time(gbytes_d, nd, dp_bw, dp_a) if has(*zero_fsdp) else zero
    ag_w = coll.all_gather_time(w_d, nd, dp_bw, dp_a) if has(*zero_fsdp) else zero
    if any_exp:
        ar_d = ar_d + coll.all_reduce_time(gbytes_e, ne, epd_bw, epd_a)
        rs_d = rs_d + coll.reduce_scatter_time(gbytes_e, ne, epd_bw, epd_a)
        ag_w = ag_w + coll.all_gather_time(w_e, ne, epd_bw, epd_a)
    # ZeRO-1/2 re-gather the weights the optimizer updated: all of them, or a LoRA run's trained ones
    ag_upd = ag_w
    if np.any(np.asarray(x.wgrad) < 1.0) and has(Sharding.ZERO1, Sharding.ZERO2):
        ag_upd = coll.all_gather_time(w_d * x.wgrad, nd, dp_bw, dp_a)
        if any_exp:
            ag_upd = ag_upd + coll.all_gather_time(w_e * x.wgrad, ne, epd_bw, epd_a)
    # HSDP: reduce-scatter inside the node, all-reduce of the 1/hs shard across nodes
    if has(Sharding.HSDP):
        hs_bw_in, hs_a_in = network.ring_link(x.net, hs, t, hs)  # the node's dp ranks: inside the domain
        hs_bw_x, hs_a_x = network.ring_link(x.net, nd / hs, t * hs, 1.0)  # one rank per domain in each ring
        hsdp_red = coll.reduce_scatter_time(gbytes_d + gbytes_e, hs, hs_bw_in, hs_a_in) + coll.all_reduce_time(
            (gbytes_d + gbytes_e) / hs, nd / hs, hs_bw_x, hs_a_x
        )
        hsdp_ag = coll.all_gather_time((dense_local + expert_local) * wb, hs, hs_bw_in, hs_a_in)
    else:
        hsdp_red = hsdp_ag = zero
    # codes outside 0..5 are invalid rows (ERR_CATEGORY, NaN outputs)
    grad_sync = np.where(shard == Sharding.NONE, ar_d, np.where(shard == Sharding.HSDP, hsdp_red, rs_d))
    # ZeRO-3 / FSDP / HSDP: parameter all-gathers in forward and backward of every micro-batch
    gathers = np.where(full_shard, 2.0 * ag_w, np.where(shard == Sharding.HSDP, 2.0 * hsdp_ag, 0.0))
    # one overlap budget per micro-batch: compute already hiding CP/TP/EP/PP traffic cannot hide
    # the gathers, and the final gradient reduction only hides behind backward compute of
    # the last micro-batch that hides neither (keeps step time monotone in compute speed)
    once = None
    if stage_gathered is not None:  # the stage's weights stay gathered over the step: one gather, not one per pass
        once = stage_gathered & full_shard
        gathers = np.where(once, 0.0, gathers)
    hidden_comm = ov.hidden_comm
    hidden_gathers = np.minimum(gathers, np.maximum(P.fsdp_gather_overlap * cm.compute_mb - hidden_comm, 0.0))
    gather_exposed_mb = gathers - hidden_gathers
    # a pipelined stage idles through half the bubble after its last backward (cool-down) and half before its
    # first forward (warm-up): the gradient reduction of the chunks already done runs in the one, the next step's
    # weight all-gather in the other (Megatron-Core overlap_grad_reduce / overlap_param_gather), as far as the
    # era overlaps DP traffic at all (dp_overlap)
    idle_half = 0.5 * (x.p - 1.0) / x.v * (cm.compute_mb + ov.tp_mb + ov.cp_mb + ov.ep_mb + ov.pp_mb)
    dp_hide = np.maximum(P.dp_overlap * (cm.bwd_mb + idle_half) - hidden_gathers - hidden_comm, 0.0)
    dp_exposed = np.maximum(grad_sync - dp_hide, 0.0)
    ag_hide = P.dp_overlap * idle_half
    zero12 = (shard == Sharding.ZERO1) | (shard == Sharding.ZERO2)
    dp_exposed = dp_exposed + np.where(zero12, np.maximum(ag_upd - ag_hide, 0.0), 0.0)
    if once is not None:  # the one gather of the step, behind the first micro-batch's forward compute
        fwd_mb = np.maximum(cm.compute_mb - cm.bwd_mb, 0.0)
        dp_exposed = dp_exposed + np.where(once, np.maximum(ag_w - P.fsdp_gather_overlap * fwd_mb, 0.0), 0.0)
    dp_exposed = np.where(nd > 1, dp_exposed, 0.0)
    gather_exposed_mb = np.where(nd > 1, gather_exposed_mb, 0.0)
    return dp_exposed, gather_exposed_mb


# ---------------------------------------------------------------------------------------------- optimizer, step

def optimizer(x: Inputs, mem: Mapping[str, np.ndarray], P: PhysParams) -> np.ndarray:
    """The optimizer update (s): HBM traffic of the parameters whose optimizer state this GPU holds."""
    opt_params = mem["optimizer_params_local"]  # dense + expert parameters whose optimizer state this GPU holds
    return opt_params * P.optimizer_update_bytes / x.hbm_bw


def step_time(x: Inputs, cm: Compute, ov: Overlap, gather_exposed_mb: np.ndarray, dp_exposed: np.ndarray,
              optimizer_s: np.ndarray, straggler_cv: float = 0.0) -> Step:
    """The step: micro-batches and the pipeline bubble, exposed DP traffic, the optimizer, and the host."""
    m = x.m
    t_mb = cm.compute_mb + ov.tp_mb + ov.cp_mb + ov.ep_mb + ov.pp_mb + gather_exposed_mb
    bubble_mb = (x.p - 1.0) / x.v
    step = t_mb * (m + bubble_mb) + dp_exposed + optimizer_s
    # the host issues the ops while the GPU runs earlier ones (asynchronous launch), so the step
    # is max(GPU time, host issue time); a soft maximum (p-norm, p = HOST_P) because the two
    # overlap imperfectly near the crossover (queue drains, syncs). >= max, monotone in both.
    # The GPU's wait for the host is counted in compute_s.
    host_step = (m + bubble_mb) * cm.host_mb + optimizer_s
    r = host_step / step
    host_wait = step * (np.sqrt(np.sqrt(1.0 + (r * r) * (r * r))) - 1.0)
    lag = straggler(x, (m + bubble_mb) * cm.compute_mb, straggler_cv)
    return Step(step=step + host_wait + lag, straggler=lag, t_mb=t_mb, bubble_mb=bubble_mb, host_wait=host_wait)


def expected_max_normal(n) -> np.ndarray:
    """E[max of n independent standard normal draws], Blom's approximation Phi^-1((n - 0.375) / (n + 0.25))
    (Blom 1958; within 0.5% of the exact order statistic for n >= 2); 0 for n = 1."""
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    return normal_quantile((n - 0.375) / (n + 0.25))


# Acklam's rational approximation of the standard normal quantile (relative error < 1.2e-9 on (0, 1)); numpy
# only, so that serving does not import scipy.special (0.6 s at start-up)
_A = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
      -3.066479806614716e+01, 2.506628277459239e+00)
_B = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
      -1.328068155288572e+01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
      4.374664141464968e+00, 2.938163982698783e+00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00)


def normal_quantile(p) -> np.ndarray:
    """Phi^-1(p) of the standard normal, elementwise, p in (0, 1)."""
    p = np.asarray(p, dtype=float)
    q = np.minimum(p, 1.0 - p)
    low = q < 0.02425
    r = np.sqrt(-2.0 * np.log(np.where(low, q, 0.5)))
    tail = (((((_C[0] * r + _C[1]) * r + _C[2]) * r + _C[3]) * r + _C[4]) * r + _C[5]) / \
        ((((_D[0] * r + _D[1]) * r + _D[2]) * r + _D[3]) * r + 1.0)
    u = p - 0.5
    t = u * u
    mid = (((((_A[0] * t + _A[1]) * t + _A[2]) * t + _A[3]) * t + _A[4]) * t + _A[5]) * u / \
        (((((_B[0] * t + _B[1]) * t + _B[2]) * t + _B[3]) * t + _B[4]) * t + 1.0)
    return np.where(low, np.where(p < 0.5, tail, -tail), mid)


def straggler(x: Inputs, compute_s: np.ndarray, cv: float) -> np.ndarray:
    """The wait for the slowest of the job's N accelerators (s): each one's compute time per step varies with
    coefficient of variation `cv` (PhysParams.straggler_cv), and every step synchronizes all of them, so the step
    takes the expected largest of N draws. It grows with N as sqrt(2 ln N): one of the effects that make per-GPU
    throughput fall with cluster size although no message grows."""
    return compute_s * cv * expected_max_normal(x.N)


def flops_per_token(x: Inputs, r: Rates) -> tuple[np.ndarray, np.ndarray]:
    """Model and hardware (recompute included) FLOPs per token: 6 x active matmul parameters + the attention
    core; hybrid and MTP rows by their own counts."""
    L, s, q, rc, pc = x.L, x.s, r.q, x.rc, r.pc
    model_fpt = 6.0 * pc["matmul_params_active"] + 12.0 * L * s * q
    attn_fwd = 4.0 * L * s * q
    hw_fpt = model_fpt + recompute_flops(rc, pc["matmul_params_layers_active"], attn_fwd)
    if x.xla is not None:  # XLA's full recompute skips each layer's down-projection (``remat_skipped_gemm``)
        sh = r.sh
        down = (sh["n_dense_mlp_layers"] * sh["dense_mlp_matmul"]
                + np.nan_to_num(sh["n_moe_layers"] * (x.k + x.ns) * sh["expert_matmul"])) / sh["mlp_mats"]
        hw_fpt = hw_fpt - np.where(x.xla & (rc == Recompute.FULL), 2.0 * down, 0.0)
    if (hy := x.hy) is not None:
        h_model, h_hw = hybrid_flops_per_token(x.arch, pc, s, rc)
        model_fpt, hw_fpt = np.where(hy["hybrid"], h_model, model_fpt), np.where(hy["hybrid"], h_hw, hw_fpt)
    if x.arch.get("mtp") is not None:
        m_model, m_hw = mla.mtp_flops_per_token(x.arch, r.sh, s, rc)
        model_fpt, hw_fpt = model_fpt + m_model, hw_fpt + m_hw
    return model_fpt, hw_fpt
