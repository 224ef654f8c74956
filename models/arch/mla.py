"""Multi-head Latent Attention (MLA) and multi-token prediction (MTP) of DeepSeek-V2/V3 (pure, vectorized over
configurations).

MLA (DeepSeek-V2, arXiv:2405.04434 section 2.1; DeepSeek-V3, arXiv:2412.19437 section 2.1; Hugging Face
modeling_deepseek.py `DeepseekV2Attention` / `DeepseekV3Attention`). With h = d_model, a heads, q_lora_rank d_c',
kv_lora_rank d_c, per-head dims nope d_h, rope d_h^R and v_head d_v, one layer has the weight matrices

    W_DQ   h x d_c'                   query down-projection (q_a_proj); absent when q_lora_rank is empty (V2-Lite):
    W_Q    h x a (d_h + d_h^R)        then a plain query projection replaces W_DQ and W_UQ
    W_UQ   d_c' x a (d_h + d_h^R)     query up-projection (q_b_proj), no-RoPE and RoPE parts of every head
    W_DKV  h x (d_c + d_h^R)          joint KV down-projection and the shared RoPE key (kv_a_proj_with_mqa)
    W_UK   d_c x a d_h                key up-projection  } kv_b_proj (Megatron-Core: one linear_kv_up_proj)
    W_UV   d_c x a d_v                value up-projection}
    W_O    a d_v x h                  output projection

plus RMSNorm gains on the two latents (q_a_layernorm d_c', kv_a_layernorm d_c). The attention core runs a heads
with a query/key head dim of d_h + d_h^R and a value head dim of d_v: per token and layer, forward, over the
full (non-causal) square of the FLOP convention (models.arch.accounting), Q K^T is 2 s a (d_h + d_h^R) FLOPs and the
attention-weighted V 2 s a d_v. Writing that as the MHA term 4 s q gives the core width

    q_core = a (d_h + d_h^R + d_v) / 2

which `models.arch.accounting.layer_shapes` uses as q_dim and kv_dim of MLA rows: then the core time and FLOPs
(4 s q per token forward), the stored Q, K, V and attention output (4 q + 4 kv bytes, models.memory.model) and the
context-parallel K/V exchange (2 kv per token) are the MLA ones, with no MLA branch where they are computed.

Tensor parallelism (Megatron-Core megatron/core/transformer/multi_latent_attention.py `MLASelfAttention`): the
up-projections linear_q_up_proj and linear_kv_up_proj are column-parallel (gather_output=False; heads split
over tp), linear_proj (W_O) is row-parallel, and the down-projections linear_q_down_proj / linear_kv_down_proj are
built as TELinear with parallel_mode='duplicated': replicated on every TP rank (not divided by tp), reading the
sequence-sharded input [s/tp, b, h] under sequence parallelism (each rank projects its own tokens) and the whole
sequence without it. `attn_gemms` lists these GEMMs per GPU. The latent all-gathers of sequence parallelism
(q_lora_rank + kv_lora_rank + rope wide instead of MHA's h-wide all-gather) are not modelled: the TP traffic
stays the transformer's.

MTP (DeepSeek-V3 section 2.2): `mtp_layers` sequential modules; module k = RMSNorm of the previous depth's
hidden state and of the embedding of token i+k (enorm, hnorm), the projection M_k (2h x h, eh_proj), one
transformer block of the model's last-layer kind (MoE for V3), and the output head with its RMSNorm
(shared_head.norm); embedding and output head are shared with the main model. Per token each module runs one
more block, the projection and one more LM head + cross-entropy. Megatron-Core places the MTP block on the last
pipeline stage (GPTModel `mtp_process`), which also builds an embedding there (`if self.pre_process or
self.mtp_process: self.embedding = ...`): with pp > 1 the last stage holds a copy of the embedding. The
DeepSeek-V3 671B / 37B figures exclude the MTP module; the Hugging Face checkpoint holds 685B, the 14B
difference being the MTP module as stored (its block, projection and norms plus its own copies of the embedding
and output head, `mtp_params(...)["stored"]`).
"""

from __future__ import annotations

import numpy as np

from models.core.recompute import recompute_flops

#: architecture columns of MLA rows (measurements/architectures.csv)
COLUMNS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
#: number of multi-token-prediction modules a run trains (0 or empty: none)
MTP_COLUMN = "mtp_layers"
#: every MLA/MTP input of the step-time model
ARCH_COLUMNS = COLUMNS + (MTP_COLUMN,)


def _get(a, key, n_like):
    v = a.get(key) if hasattr(a, "get") else None
    if v is None:
        return np.full(np.shape(n_like), np.nan)
    return np.asarray(v, dtype=np.float64)


def mla_shapes(a, d_model, n_heads) -> dict[str, np.ndarray] | None:
    """Per-layer MLA shapes of rows given as a dict of float arrays (COLUMNS), or None when no row is MLA (a row
    is MLA when kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim and v_head_dim are given and positive; an empty
    q_lora_rank means a plain query projection, V2-Lite). Non-MLA rows get zeros. Keys: mla (mask), the five
    dims, qk_head (nope + rope), matmul (every attention weight), replicated (W_DQ + W_DKV: duplicated over tp),
    norm (latent RMSNorm gains), core_dim (q_core of the module docstring), n_gemms (GEMM calls per forward)."""
    h, heads = np.asarray(d_model, dtype=np.float64), np.asarray(n_heads, dtype=np.float64)
    kvr = _get(a, "kv_lora_rank", h)
    if not np.any(kvr > 0):  # the common case (NaN > 0 is False): one pass
        return None
    rope, nope, vh = (_get(a, k, h) for k in COLUMNS[2:])
    mla = np.isfinite(kvr) & (kvr > 0) & np.isfinite(rope) & (rope >= 0) & np.isfinite(nope) & (nope > 0) \
        & np.isfinite(vh) & (vh > 0)
    if not np.any(mla):
        return None
    z = lambda x: np.where(mla, np.nan_to_num(x), 0.0)  # noqa: E731
    qr, kvr, rope, nope, vh = z(_get(a, "q_lora_rank", h)), z(kvr), z(rope), z(nope), z(vh)
    has_q = qr > 0
    qk = nope + rope
    w = weights(h, heads, qr, kvr, rope, nope, vh)
    replicated = w["W_DQ"] + w["W_DKV"]
    matmul = replicated + w["W_Q"] + w["W_UQ"] + w["W_UK"] + w["W_UV"] + w["W_O"]
    return {"mla": mla, "q_lora_rank": qr, "kv_lora_rank": kvr, "qk_rope_head_dim": rope, "qk_nope_head_dim": nope,
            "v_head_dim": vh, "qk_head": qk, "matmul": np.where(mla, matmul, 0.0),
            "replicated": np.where(mla, replicated, 0.0), "norm": qr + kvr,
            "core_dim": core_dim(heads, qk, vh), "n_gemms": np.where(has_q, 5.0, 4.0)}


def weights(h, heads, qr, kvr, rope, nope, vh) -> dict[str, np.ndarray]:
    """The MLA weight matrices of one layer (element counts, module docstring); q_lora_rank 0 -> W_Q, else
    W_DQ + W_UQ."""
    has_q = np.asarray(qr) > 0
    qk = nope + rope
    return {"W_DQ": h * qr, "W_Q": np.where(has_q, 0.0, h * heads * qk), "W_UQ": qr * heads * qk,
            "W_DKV": h * (kvr + rope), "W_UK": kvr * heads * nope, "W_UV": kvr * heads * vh, "W_O": heads * vh * h}


def core_dim(n_heads, qk_head, v_head):
    """q_core = a (d_qk + d_v) / 2: the width whose 4 s q_core is the MLA core's forward FLOPs per token."""
    return 0.5 * n_heads * (qk_head + v_head)


def core_flops_per_token(seq_len, n_heads, qk_head, v_head):
    """Forward FLOPs of the attention core per token and layer over the full square: Q K^T 2 s a d_qk plus the
    attention-weighted V 2 s a d_v."""
    return 2.0 * seq_len * n_heads * qk_head + 2.0 * seq_len * n_heads * v_head


def attn_gemms(ms, d_model, n_heads, tp, sequence_parallel) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """The attention GEMMs of one MLA layer on one GPU (module docstring, Megatron-Core MLASelfAttention), each as
    (name, token share, input width, output width): a GEMM runs on token share x the micro-batch's T tokens with
    a weight of input x output width per GPU. Down-projections are duplicated (full weight on every TP rank, on
    the rank's own 1/tp of the tokens with sequence parallelism); up-projections column-parallel (output / tp);
    W_O row-parallel (input / tp)."""
    h, a = d_model, n_heads
    inv_t = 1.0 / np.asarray(tp, dtype=np.float64)
    down_share = np.where(np.asarray(sequence_parallel, dtype=bool), inv_t, 1.0)
    one = np.ones_like(down_share)
    qr, kvr, rope, qk, vh = (ms[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_head",
                                              "v_head_dim"))
    has_q = qr > 0
    return [
        # query: W_DQ (duplicated) + W_UQ (column), or W_Q (column) without a query latent
        ("q_down", down_share, np.where(has_q, h, 0.0), qr),
        ("q_up", one, np.where(has_q, qr, h), a * qk * inv_t),
        ("kv_down", down_share, h + 0.0 * qr, kvr + rope),
        ("kv_up", one, kvr, a * (ms["qk_nope_head_dim"] + vh) * inv_t),  # W_UK and W_UV: one linear_kv_up_proj
        ("out", one, a * vh * inv_t, h + 0.0 * qr),
    ]


def attn_gemm_time(gemms, T, inv_rate, inv_hbm, w_read_b, act_b, wh, n_gemms):
    """Forward time of the MLA attention GEMMs of one layer and micro-batch on one GPU, one roofline over the
    list as for the transformer's QKV + output pair (models.physics.step_time): max(FLOPs at the GEMM rate + one
    GEMM-size ramp per call, weight + activation bytes at the HBM rate)."""
    flops = sum(2.0 * T * share * k * n for _, share, k, n in gemms)
    nbytes = sum(w_read_b * k * n + act_b * T * share * (k + n) for _, share, k, n in gemms)
    return np.maximum(flops * inv_rate + n_gemms * wh, nbytes * inv_hbm)


def replicated_params_local(ms, layers_per_stage, tp):
    """Parameters a GPU holds beyond the tp-split share of its stage's attention weights: the duplicated
    down-projections, (1 - 1/tp) of them per layer (models.memory.model divides the layer weights by tp)."""
    return layers_per_stage * ms["replicated"] * (1.0 - 1.0 / np.asarray(tp, dtype=np.float64))


def local_params(arch, shapes, dense_local, expert_local, layers_per_stage, tp, pp, ep, etp=None):
    """(dense, expert) parameters per GPU of the most loaded stage (models.memory.model) with the MLA and MTP terms: the
    duplicated MLA down-projections of the stage's layers (`replicated_params_local`) and, on the last stage, the
    MTP modules (dense part / tp, routed experts / (ep tp), their down-projections duplicated) and, with pp > 1,
    the embedding copy Megatron-Core builds on the MTP stage. ``etp`` (expert tensor parallelism, models.arch.moe):
    the MTP modules' routed experts / (ep etp) instead."""
    ms, D = arch.get("mla"), arch.get("mtp")
    t = np.asarray(tp, dtype=np.float64)
    if ms is not None:
        dense_local = dense_local + replicated_params_local(ms, layers_per_stage, t)
    if D is not None:
        mp = mtp_params(arch, shapes)
        emb = (np.asarray(pp) > 1) * (D > 0) * arch["vocab"] * arch["d_model"]
        dense_local = dense_local + (mp["dense"] + emb) / t
        if ms is not None:
            dense_local = dense_local + replicated_params_local(ms, D, t)
        et = t if etp is None else np.asarray(etp, dtype=np.float64)
        expert_local = expert_local + mp["expert"] / (np.maximum(np.asarray(ep, dtype=np.float64), 1.0) * et)
    return dense_local, expert_local


def activation_bytes_per_token(ms, d_model):
    """Stored activation bytes of one MLA layer per token, as (replicated coefficient of d_model, sharded bytes),
    16-bit: the compressed latents c_Q and c_KV are kept twice (the RMSNorm's input and the up-projection's
    input, 2 + 2 bytes per element) and the RoPE key k^R once, replicated over tp (sequence-sharded with sequence
    parallelism); the per-head Q, K (a d_qk each), V and attention output (a d_v each), 2 bytes each, are split
    over tp: 4 a (d_qk + d_v) = 4 q_core + 4 q_core, the transformer's 4 q + 4 kv with q = kv = q_core."""
    rep = (4.0 * (ms["q_lora_rank"] + ms["kv_lora_rank"]) + 2.0 * ms["qk_rope_head_dim"]) / d_model
    return rep, 8.0 * ms["core_dim"]


# ---------------------------------------------------------------------------------------------- MTP

def mtp_depth(a, n_like) -> np.ndarray | None:
    """MTP modules per row (0 where empty), or None when no row trains with MTP."""
    d = _get(a, MTP_COLUMN, n_like)
    if not np.any(d > 0):  # NaN > 0 is False
        return None
    return np.where(np.isfinite(d) & (d > 0), d, 0.0)


def mtp_params(arch, shapes) -> dict[str, np.ndarray]:
    """Parameters of the MTP modules of normalized rows (``arch["mtp"]`` modules each): block (one transformer
    layer of the last layer's kind: attention + MoE when the model has MoE layers, else the dense MLP; its two
    norms), projection (eh_proj 2h x h) and the three RMSNorm gains (enorm, hnorm, shared_head.norm). Keys:
    total (every module parameter, embedding and head shared: what training adds), dense / expert (routed experts)
    parts of it, active_matmul (matmul weights one token goes through, LM head included: the 6N term), and
    stored (total + one embedding and one output-head copy per module, the Hugging Face checkpoint's layout)."""
    D = arch["mtp"]
    h, V, E, k, ns = arch["d_model"], arch["vocab"], arch["n_experts"], arch["top_k"], arch["n_shared_experts"]
    moe = shapes["n_moe_layers"] > 0
    attn = shapes["attn_matmul"] + shapes["attn_bias"] + shapes["norm_params"]
    expert = shapes["expert_matmul"] + shapes["expert_bias"]
    dense = attn + np.where(moe, ns * expert + shapes["router_matmul"], shapes["dense_mlp_matmul"]
                            + shapes["mlp_bias"]) + 2.0 * h * h + 3.0 * h
    routed = np.where(moe, E * expert, 0.0)
    mlp_active = np.where(moe, (k + ns) * shapes["expert_matmul"] + shapes["router_matmul"],
                          shapes["dense_mlp_matmul"])
    active_matmul = shapes["attn_matmul"] + mlp_active + 2.0 * h * h + V * h
    return {"total": D * (dense + routed), "dense": D * dense, "expert": D * routed,
            "active_matmul": D * active_matmul, "stored": D * (dense + routed + 2.0 * V * h)}


def mtp_flops_per_token(arch, shapes, seq_len, recompute):
    """(model, hardware) FLOPs per token of the MTP modules, forward + backward, in the 6N + 12 l s q convention of
    models.arch.accounting: 6 x their active matmul weights (block, projection, LM head) + the attention core of one
    layer per module; recompute as for the main layers (full: + one forward of the block and projection,
    selective: + the forward attention core)."""
    D, s, q = arch["mtp"], seq_len, shapes["q_dim"]
    mp = mtp_params(arch, shapes)
    attn_fwd = 4.0 * D * s * q
    model = 6.0 * mp["active_matmul"] + 3.0 * attn_fwd
    block = mp["active_matmul"] - D * arch["vocab"] * arch["d_model"]  # the head is not recomputed
    return model, model + recompute_flops(recompute, block, attn_fwd)


def mtp_stage_time(D, fwd_layer, bwd_layer, recompute_layer, t_lm, Tt2, h, wrt, aT, aTt, inv_rate, inv_hbm, wh):
    """Time of the MTP modules per micro-batch on the last stage: per module one block (forward, backward,
    recompute: the caller's per-layer times of the last layer's kind), the eh_proj GEMM (2h -> h, split over tp;
    forward + 2x backward) and one more LM head + cross-entropy (``t_lm``, forward + backward). Returns (all,
    backward part)."""
    w = 2.0 * h * h
    t_proj = np.maximum(Tt2 * w * inv_rate + wh, (wrt * w + aT * h + aTt * 2.0 * h) * inv_hbm)
    total = D * (fwd_layer + bwd_layer + recompute_layer + 3.0 * t_proj + t_lm)
    bwd = D * (bwd_layer + 2.0 * t_proj + 2.0 / 3.0 * t_lm)
    return total, bwd
