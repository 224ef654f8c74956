"""Per-GPU memory model (vectorized). Bytes of the most loaded pipeline stage.

Model states (Rajbhandari et al. 2020, ZeRO): 16-bit weights (4 B for fp32/tf32 runs),
gradients (``PhysParams.grad_bytes``, fp32 main grads by default), optimizer state (12 B
fp32 master + Adam m + v; 8 B for fp32 runs). Divided by tp (and ep for routed experts);
ZeRO-1 shards the optimizer over the data-parallel group, ZeRO-2 also the gradients,
ZeRO-3/FSDP also the weights (+ two gathered layers as prefetch buffers; FSDP/HSDP keep no
16-bit shard: the fp32 master is the parameter), HSDP shards all
three inside the node (``floor(node_size / tp)`` ranks) and replicates across nodes. The
data-parallel group of dense weights is dp*cp; of routed experts dp*cp/ep.

Activations (Korthikanti et al. 2022, section 4): per layer and micro-batch, 16-bit,
    s b h (34 + 5 a s / h)               no parallelism
    s b h (10 + 24/t + 5 a s / (h t))    tensor parallel
    s b h (34/t + 5 a s / (h t))         tensor + sequence parallel
    selective recompute drops the 5 a s / h term; full recompute keeps 2 s b h per layer
    (/t with sequence parallelism) plus one layer's full working set during its backward.
Generalisation used here (reduces to the above for MHA and ffn = 4h GeLU):
    replicated part  (8 + m_d) h           (2 LayerNorm inputs 4h, QKV input 2h, MLP input
                                            2h, 2 dropout masks m_d = 2h, 0 without dropout)
    sharded part     4 q + 4 kv + c_f F    (Q, K, V, attention output; q = a*d_head,
                                            kv = n_kv*d_head; c_f = 4 for GeLU (its input and
                                            output), 6 for SwiGLU (gate, up, product))
    F = ffn for dense layers; MoE layers: (top_k + shared) * expert_ffn + 2h * top_k
    (dispatched token copies).
Context parallelism divides the token dimension by cp (scores: local queries x all keys).
In-flight micro-batches on the first stage: 1F1B holds min(pp, m) micro-batches of its
layers; interleaved 1F1B holds pp + (pp-1)/vpp (Korthikanti eq. 5: L (1 + (p-1)/(p v))
layers' worth in total). The last stage additionally holds fp32 logits 4 s b V / t.
Allowance: ``mem_overhead_gb`` + ``mem_fragmentation_frac`` x modelled bytes (priors).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from models.fastops import clip
from models.params import DEFAULT, PhysParams

GB = 1e9


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def activation_bytes_per_layer(
    seq_len,
    micro_batch,
    d_model,
    n_heads,
    *,
    tp=1,
    sequence_parallel=False,
    recompute=0,
    q_dim=None,
    kv_dim=None,
    ffn_eff=None,
    ffn_coeff=4.0,
    cp=1,
    attn_scores_stored=1.0,
    dtype_bytes=2.0,
    dropout_mask_elems=2.0,
    return_no_recompute=False,
):
    """Stored activation bytes of one transformer layer for one micro-batch, per GPU.

    recompute: 0 none, 1 selective, 2 full (the full-recompute value excludes the one-layer
    working set, which ``memory_per_gpu`` adds once). Defaults reproduce Korthikanti et al.
    2022 for a GPT (MHA, ffn = 4h, GeLU) with 2-byte activations; ``dropout_mask_elems`` = 0
    drops their two dropout masks (2 s b h) for recipes trained without dropout.
    """
    s = _f(seq_len)
    b = _f(micro_batch)
    h = _f(d_model)
    a = _f(n_heads)
    t = _f(tp)
    c = _f(cp)
    q = h if q_dim is None else _f(q_dim)
    kv = h if kv_dim is None else _f(kv_dim)
    F = 4.0 * h if ffn_eff is None else _f(ffn_eff)
    sp = np.asarray(sequence_parallel, dtype=bool)
    rc = np.asarray(recompute)
    scale = _f(dtype_bytes) / 2.0  # the Korthikanti coefficients are for 2-byte activations
    s_loc = s / c
    tokens = s_loc * b
    replicated = (8.0 + _f(dropout_mask_elems)) * h
    sharded = 4.0 * q + 4.0 * kv + _f(ffn_coeff) * F
    rep_div = np.where(sp, t, 1.0)
    per_token = replicated / rep_div + sharded / t
    scores = _f(attn_scores_stored) * 5.0 * a * s_loc * s * b / t
    full_layer = scale * (tokens * per_token + scores)
    selective = scale * tokens * per_token
    full_rc = scale * 2.0 * tokens * h / rep_div
    if return_no_recompute:  # memory_per_gpu also needs the no-recompute value (working set of full recompute)
        return np.where(rc == 2, full_rc, np.where(rc == 1, selective, full_layer)), full_layer
    return np.where(rc == 2, full_rc, np.where(rc == 1, selective, full_layer))


def memory_per_gpu(
    *,
    arch: Mapping[str, np.ndarray],
    shapes: Mapping[str, np.ndarray],
    seq_len,
    micro_batch,
    n_micro,
    tp,
    pp,
    dp,
    cp,
    ep,
    vpp,
    sharding,
    recompute,
    sequence_parallel,
    is_fp32,
    node_size,
    params: PhysParams = DEFAULT,
) -> dict[str, np.ndarray]:
    """Bytes per GPU on the most loaded stage: weights, grads, optimizer, activations, overhead.

    All arguments are arrays (or scalars) of equal length; ``sharding`` and ``recompute`` are
    integer codes (models.params.SHARDING_CODES / RECOMPUTE_CODES), ``arch`` a normalized
    architecture (models.accounting.normalize_arch) and ``shapes`` its layer_shapes.
    Returns bytes (not GB) and the in-flight micro-batch count.
    """
    t, p, d, c, e, v = (_f(x) for x in (tp, pp, dp, cp, ep, vpp))
    m = _f(n_micro)
    s = _f(seq_len)
    b = _f(micro_batch)
    shard = np.asarray(sharding)
    rc = np.asarray(recompute)
    sp = np.asarray(sequence_parallel, dtype=bool)
    fp32 = np.asarray(is_fp32, dtype=bool)
    h = arch["d_model"]
    L = arch["n_layers"]
    V = arch["vocab"]
    E = arch["n_experts"]
    k = arch["top_k"]
    ns = arch["n_shared_experts"]

    Ls = np.ceil(L / p)
    moe_frac = shapes["n_moe_layers"] / L
    Ls_moe = Ls * moe_frac
    Ls_dense = Ls - Ls_moe
    per_layer_common = shapes["attn_matmul"] + shapes["attn_bias"] + shapes["norm_params"]
    expert = shapes["expert_matmul"] + shapes["expert_bias"]
    dense_mlp = shapes["dense_mlp_matmul"] + shapes["mlp_bias"]
    embed_stage = np.where(p > 1, V * h, V * h * (2.0 - clip(arch["tied_embeddings"], 0, 1)))
    dense_local = (
        Ls * per_layer_common + Ls_dense * dense_mlp + Ls_moe * (ns * expert + shapes["router_matmul"]) + embed_stage
    ) / t
    expert_local = Ls_moe * E * expert / (np.maximum(e, 1.0) * t)
    layer_local = (per_layer_common + np.where(moe_frac > 0, 0.0, dense_mlp)) / t + np.where(
        moe_frac > 0, (ns * expert + E * expert / np.maximum(e, 1.0)) / t, 0.0
    )

    wb = np.where(fp32, 4.0, 2.0)
    gb = np.where(fp32, 4.0, params.grad_bytes)
    ob = np.where(fp32, params.optimizer_state_bytes_fp32, params.optimizer_state_bytes_mixed)

    nd = d * c
    ne = np.maximum(nd / np.maximum(e, 1.0), 1.0)
    hs = clip(np.floor(_f(node_size) / t), 1.0, nd)
    hs_e = np.minimum(hs, ne)
    full_shard = (shard == 3) | (shard == 4)
    dense_div = np.where(full_shard, nd, np.where(shard == 5, hs, 1.0))
    expert_div = np.where(full_shard, ne, np.where(shard == 5, hs_e, 1.0))
    grad_shard = full_shard | (shard == 2) | (shard == 5)
    opt_shard = grad_shard | (shard == 1)

    # PyTorch FSDP/HSDP (MixedPrecision param_dtype=bf16) keeps only the fp32 sharded
    # parameters - the master copy counted in the optimizer state - and casts to 16 bits on
    # all-gather, so no separate 16-bit shard exists (PyTorch FSDP docs, MixedPrecision:
    # "sharded parameters ... remain in full precision"); DeepSpeed ZeRO-3 keeps a 16-bit
    # partition next to the fp32 master in the optimizer.
    fsdp_like = (shard == 4) | (shard == 5)
    weights = np.where(fsdp_like & ~fp32, 0.0, wb) * (dense_local / dense_div + expert_local / expert_div)
    weights = weights + np.where(full_shard | (shard == 5), 2.0 * layer_local * wb, 0.0)
    grads = gb * (
        dense_local / np.where(grad_shard, np.where(shard == 5, hs, nd), 1.0)
        + expert_local / np.where(grad_shard, np.where(shard == 5, hs_e, ne), 1.0)
    )
    optimizer = ob * (
        dense_local / np.where(opt_shard, np.where(shard == 5, hs, nd), 1.0)
        + expert_local / np.where(opt_shard, np.where(shard == 5, hs_e, ne), 1.0)
    )

    # activations (per layer, per micro-batch); MoE variant only computed when present
    gelu = arch["activation"] == 0
    ffn_coeff = np.where(gelu, 4.0, 6.0)
    act_bytes = np.where(fp32, 4.0, 2.0)
    any_moe = bool(np.any(moe_frac > 0))
    any_full = bool(np.any(rc == 2))
    common = dict(
        tp=t,
        sequence_parallel=sp,
        q_dim=shapes["q_dim"],
        kv_dim=shapes["kv_dim"],
        cp=c,
        attn_scores_stored=params.attn_scores_stored,
        dtype_bytes=act_bytes,
        dropout_mask_elems=params.dropout_mask_elems,
        ffn_coeff=ffn_coeff,
    )
    h_ = arch["n_heads"]
    # one call gives the stored bytes under the run's recompute mode and, for full recompute,
    # the working set of one layer (its no-recompute bytes)
    a_dense, work = activation_bytes_per_layer(s, b, h, h_, recompute=rc, ffn_eff=arch["ffn_dim"],
                                               return_no_recompute=True, **common)
    if any_moe:
        # the MoE dispatch copies 2h*top_k are added to the sharded part via ffn_eff
        moe_F = (k + ns) * arch["expert_ffn_dim"] + 2.0 * h * k / ffn_coeff
        a_moe, work_moe = activation_bytes_per_layer(s, b, h, h_, recompute=rc, ffn_eff=moe_F,
                                                     return_no_recompute=True, **common)
        per_layer = np.where(moe_frac > 0, (Ls_dense * a_dense + Ls_moe * a_moe) / Ls, a_dense)
        if any_full:
            work = np.where(moe_frac > 0, work_moe, work)
    else:
        per_layer = a_dense
    working = np.where(rc == 2, work, 0.0) if any_full else 0.0
    inflight = np.where(v > 1, p + (p - 1.0) / v, p)
    inflight = np.maximum(np.minimum(inflight, m), 1.0)
    logits = 4.0 * s / c * b * V / t
    stage_acts = per_layer * Ls
    act_first = stage_acts * inflight + working
    act_last = stage_acts + working + logits
    activations = np.where(p > 1, np.maximum(act_first, act_last), act_first + logits)

    modelled = weights + grads + optimizer + activations
    overhead = params.mem_overhead_gb * GB + params.mem_fragmentation_frac * modelled
    total = modelled + overhead
    return {
        "mem_weights_bytes": weights,
        "mem_grads_bytes": grads,
        "mem_optimizer_bytes": optimizer,
        "mem_activations_bytes": activations,
        "mem_overhead_bytes": overhead,
        "mem_total_bytes": total,
        "inflight_microbatches": inflight,
        "dense_params_local": dense_local,
        "expert_params_local": expert_local,
    }
