"""Per-GPU memory model (vectorized). Bytes of the most loaded pipeline stage.

Model states (Rajbhandari et al. 2020, ZeRO): 16-bit weights (4 B for fp32/tf32 runs),
gradients (``PhysParams.grad_bytes``, fp32 main grads by default), optimizer state (12 B
fp32 master + Adam m + v; 8 B for fp32 runs; a recipe's own, ``optimizer_bytes``).
Divided by tp (and ep for routed experts);
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
MLA rows (models.arch.mla): q = kv = the core width, the duplicated down-projections whole on every tp rank and the
latents replicated over tp; MTP modules: their weights, one layer's activations and logits on the last stage
(with pp > 1 the larger of the first stage without them and the last stage with them is reported).
Allowance: ``mem_overhead_gb`` + ``mem_fragmentation_frac`` x modelled bytes (priors); with ``capacity_gb`` and
``overhead_frac_of_capacity`` the fixed part is a fraction of the device instead (portable).
Capacity: vendor "GB" are binary (``CAPACITY_BYTES_PER_GB``; compare with ``capacity_bytes``).

What a training stack's words mean (selective = attention core in Megatron, a save list in torchtitan and
MaxText; fp32 main_grad vs 16-bit gradients; the loss's logits bytes; LoRA; FSDP with pipeline parallelism) enters
through keyword arguments of ``memory_per_gpu``; models.memory.presets holds the sourced presets that fill them.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from models.arch import mamba, mla
from models.arch.accounting import hybrid_param_counts
from models.core.fastops import clip
from models.core.params import DEFAULT, PhysParams
from models.core.precision import quantized_param_bytes, saved_gemm_input_bytes

GB = 1e9

#: Bytes in one "GB" of an accelerator's memory capacity as vendors state it. HBM/GDDR capacities are binary:
#: nvidia-smi reports memory.total 81920 MiB for an "A100-SXM4-80GB" and 81559 MiB for an "H100 80GB HBM3"
#: (85.9e9 and 85.5e9 bytes), 40960 MiB for an "A100-SXM4-40GB", 143771 MiB for a "141 GB" H200 (HBM stacks are
#: 2^k GiB: five 16 GiB HBM3 stacks = 80 GiB). The model's bytes (decimal GB in its outputs) compare with
#: ``capacity_bytes(memory_gb)``, not ``memory_gb * 1e9``, which understates every capacity by 7.4 %.
CAPACITY_BYTES_PER_GB = 2.0**30

#: Portable fixed allowance (CUDA context, NCCL and cuBLAS workspaces) as a fraction of the device capacity.
#: prior: the 1.0 GB of ``PhysParams.mem_overhead_gb`` was set on A100/H100 80 GB parts (1.0e9 / (80 x 2^30));
#: as a fraction it scales with the device instead of charging a 1.5 GB GTX 580 a whole GB.
OVERHEAD_FRAC_OF_CAPACITY = 1.0e9 / (80.0 * CAPACITY_BYTES_PER_GB)


def capacity_bytes(memory_gb) -> np.ndarray:
    """Usable bytes of a device whose capacity is stated as ``memory_gb`` vendor "GB" (binary, see
    CAPACITY_BYTES_PER_GB)."""
    return _f(memory_gb) * CAPACITY_BYTES_PER_GB


def _f(x) -> np.ndarray:
    """float64 array of x: x itself (no copy, no wrapper call) when it already is one."""
    return x if type(x) is np.ndarray and x.dtype == np.float64 else np.asarray(x, dtype=np.float64)


def _activation_elems(tokens, seq_len, d_model, n_heads, inv_t, rep_div_inv, sharded_width, replicated_elems,
                      scores_stored):
    """Activation elements (2 bytes each) one layer stores for one micro-batch on one GPU, in three parts
    (the formula of the module docstring, shared by ``activation_bytes_per_layer`` and ``memory_per_gpu``):
    kept = tokens (replicated h / (t with SP, else 1) + sharded width / t), the attention scores
    5 a s_loc s b / t (0.0 when not stored), and the checkpoint full recompute keeps, 2 s_loc b h / (t with SP)."""
    kept = tokens * (replicated_elems * d_model * rep_div_inv + sharded_width * inv_t)
    scores = (scores_stored * 5.0 * n_heads) * tokens * seq_len * inv_t if np.any(scores_stored) else 0.0
    checkpoint = (2.0 * d_model) * tokens * rep_div_inv
    return kept, scores, checkpoint


#: What recompute = selective stores, by ``selective_policy`` code, for save-list policies: bytes per token per layer
#: as coefficients of (block input h [sequence-sharded with SP], extra h-wide replicated tensors when tp > 1,
#: q, kv, F, extra F of a gated MLP, h-wide tensors sharded by t, h-wide tensors not divided by t); 2 bytes per
#: saved element (Korthikanti's byte coefficients). Code 0 is Korthikanti's attention-core recompute (the formula
#: of the module docstring), not a save list.
#:  1 torchtitan op-level SAC (``selective_ac_option = "op"``; pytorch/torchtitan
#:    torchtitan/parallelisms/parallelize_llama.py ``_save_list``/``_custom_policy``): inside each TransformerBlock
#:    checkpoint, outputs of aten.mm except every second one (block order wq, wk, wv, wo, w1, w3, w2 -> wq, wv, w1,
#:    w2), of scaled-dot-product attention and of reduce_scatter are saved: block input 2h, wq 2q, wv 2kv, w1 2F,
#:    attention output 2q, w2's local matmul output 2h (its full-sequence partial sum before the reduce-scatter,
#:    not divided by t) and with TP the two reduce-scatter outputs 2 x 2h/t (torchtitan's TP plan puts
#:    SequenceParallel on the norms, so they are sequence-sharded).
#:  2-6 MaxText ``remat_policy`` (AI-Hypercomputer/maxtext decoders.py get_remat_policy): the scanned decoder
#:    layer's input plus the named projections - 2 ``minimal`` (checkpoint_dots_with_no_batch_dims: query, key,
#:    value, out, mlpwi (gate and up), mlpwo), 3 ``save_dot_except_mlpwi`` (query, key, value, out_proj, mlpwo),
#:    4 ``save_dot_except_mlp`` (query, key, value, out_proj), 5 ``save_qkv_proj`` (query, key, value),
#:    6 ``save_dot_with_context_except_mlp`` (query, key, value, context, out_proj).
#:  7-10 the other policies of the same function: 7 ``qkv_proj_offloaded`` and 8 ``minimal_offloaded``
#:    (save_and_offload_only_these_names / offload_dot_with_no_batch_dims with offload_dst "pinned_host": the
#:    named projections go to host memory, the device keeps the layer input), 9 ``minimal_flash`` (minimal's dots
#:    and the attention context), 10 ``save_out_proj`` (out_proj only). ``custom`` names its tensors in the run's
#:    config (tensors_on_device, tensors_to_offload), which a row does not give: it is read as an unknown recompute.
SELECTIVE_ATTENTION_CORE = 0
SELECTIVE_OP_SAC = 1
MAXTEXT_REMAT = {"minimal": 2, "save_dot_except_mlpwi": 3, "save_dot_except_mlp": 4, "save_qkv_proj": 5,
                 "save_dot_with_context_except_mlp": 6, "qkv_proj_offloaded": 7, "minimal_offloaded": 8,
                 "minimal_flash": 9, "save_out_proj": 10}
#: What the backward recomputes under each ``selective_policy`` code (the forward values it needs that the policy
#: does not keep), per layer, as flags for (attention core, QKV projections, attention output projection, the MLP's
#: input GEMMs and activation): the core from the saved q, k, v unless the context is saved; the QKV GEMMs unless
#: saved; the output projection unless saved and when the core is (its input, the context, is then recomputed for
#: its weight gradient); the MLP's input GEMMs (mlpwi, gate and up) and activation unless saved, as mlpwo's weight
#: gradient needs their output (mlpwo's own output is not needed: the residual add's backward reads no value).
#: Codes 0 and 1 recompute the attention core (Megatron's selective; torchtitan's op SAC keeps its SDPA output but
#: the time model charges it the same, as before the save lists).
SAVE_LIST_RECOMPUTE = np.array([
    # core, qkv, out_proj, mlp_in
    [1, 0, 0, 0],  # 0 attention core (Megatron-LM selective)
    [1, 0, 0, 0],  # 1 torchtitan op SAC
    [1, 0, 0, 0],  # 2 minimal: every weight GEMM's output kept
    [1, 0, 0, 1],  # 3 save_dot_except_mlpwi
    [1, 0, 0, 1],  # 4 save_dot_except_mlp
    [1, 0, 1, 1],  # 5 save_qkv_proj
    [0, 0, 0, 1],  # 6 save_dot_with_context_except_mlp
    [1, 0, 1, 1],  # 7 qkv_proj_offloaded (as save_qkv_proj, the saved projections on the host)
    [1, 0, 0, 0],  # 8 minimal_offloaded (as minimal, on the host)
    [0, 0, 0, 0],  # 9 minimal_flash
    [1, 1, 0, 1],  # 10 save_out_proj
], dtype=np.float64)
_SAVE_LISTS = np.array([
    # rep_h, rep_h_tp, q, kv, F, F_gated, h_sharded, h_full
    [0, 0, 0, 0, 0, 0, 0, 0],  # 0: not a save list (attention-core recompute)
    [2, 4, 4, 2, 2, 0, 0, 2],  # 1: torchtitan op SAC
    [2, 0, 2, 4, 2, 2, 4, 0],  # 2: MaxText minimal
    [2, 0, 2, 4, 0, 0, 4, 0],  # 3: MaxText save_dot_except_mlpwi
    [2, 0, 2, 4, 0, 0, 2, 0],  # 4: MaxText save_dot_except_mlp
    [2, 0, 2, 4, 0, 0, 0, 0],  # 5: MaxText save_qkv_proj
    [2, 0, 4, 4, 0, 0, 2, 0],  # 6: MaxText save_dot_with_context_except_mlp
    [2, 0, 0, 0, 0, 0, 0, 0],  # 7: MaxText qkv_proj_offloaded (the layer input on the device)
    [2, 0, 0, 0, 0, 0, 0, 0],  # 8: MaxText minimal_offloaded (the layer input on the device)
    [2, 0, 4, 4, 2, 2, 4, 0],  # 9: MaxText minimal_flash (minimal + the attention context)
    [2, 0, 0, 0, 0, 0, 2, 0],  # 10: MaxText save_out_proj
], dtype=np.float64)


def _save_list_elems(act_args, shapes, F, t, code):
    """Stored bytes of one layer for one micro-batch under a save-list selective policy (``_SAVE_LISTS``)."""
    h = act_args[2]
    c = [np.take(_SAVE_LISTS[:, j], code, mode="clip") for j in range(_SAVE_LISTS.shape[1])]
    gated = shapes["mlp_mats"] > 2
    rep = c[0] + c[1] * (t > 1)
    sharded = c[2] * shapes["q_dim"] + c[3] * shapes["kv_dim"] + (c[4] + c[5] * gated) * F + c[6] * h + c[7] * h * t
    return _activation_elems(*act_args, sharded, rep, 0.0)[0]


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
    inv_t = 1.0 / t
    tokens = s / c * b
    kept, scores, checkpoint = _activation_elems(
        tokens, s, h, a, inv_t, np.where(sp, inv_t, 1.0), 4.0 * q + 4.0 * kv + _f(ffn_coeff) * F,
        8.0 + _f(dropout_mask_elems), _f(attn_scores_stored))
    return scale * np.where(rc == 2, checkpoint, np.where(rc == 1, kept, kept + scores))


def hybrid_activation_bytes(hy, act_args, q_dim, kv_dim, mlp_width, moe_width, recompute, scores_stored,
                            dropout_mask_elems):
    """Hybrid rows (models.arch.mamba): (stored elements of the mean block, working set of the heaviest block) for
    one micro-batch, in the units of ``_activation_elems``. Each block keeps its norm input and mixer input
    (replicated 4 + half the dropout masks, i.e. half of a transformer layer's 8 + m_d) and its mixer's sharded
    tensors: attention 4q + 4kv (+ scores on attention blocks only), MLP c_f F, MoE c_f F_moe + dispatch copies,
    Mamba-2 `models.arch.mamba.activation_bytes_per_token`, Mamba-1 `mamba1_activation_bytes_per_token`. Selective recompute drops the attention scores (Megatron's
    core-attention recompute; Mamba blocks have no selective option); full recompute keeps each block's input
    2h and the working set of its heaviest block."""

    nM, nA, nF, nE = mamba.block_shares(hy)
    rep, m_sh = mamba.activation_bytes_per_token(act_args[2], hy["d_inner"], hy["bc"], hy["mamba_n_heads"],
                                                 dropout_mask_elems)
    if np.any(m1 := hy["mamba1"]):  # Mamba-1 mixers (Jamba): what the unfused ops save
        m_sh = np.where(m1, mamba.mamba1_activation_bytes_per_token(hy["d_inner"], hy["x_proj_out"],
                                                                      hy["mamba_state_dim"]), m_sh)
    m_sh = np.nan_to_num(m_sh)
    a_sh = 4.0 * (q_dim + kv_dim)
    mean_sh = nA * a_sh + nF * mlp_width + nE * moe_width + nM * m_sh
    kept, scores, checkpoint = _activation_elems(*act_args, mean_sh, rep, scores_stored)
    rc = np.asarray(recompute)
    stored = np.where(rc == 2, checkpoint, np.where(rc == 1, kept, kept + nA * scores))
    heaviest = np.maximum(np.maximum((nA > 0) * a_sh, (nF > 0) * mlp_width), np.maximum((nE > 0) * moe_width,
                                                                                      (nM > 0) * m_sh))
    work = _activation_elems(*act_args, heaviest, rep, scores_stored)[0] + (nA > 0) * scores
    return stored, (rc == 2) * work


def moe_dispatch_elems(h, k_r, hy=None):
    """Per token, in the units of ``_activation_elems``: what a MoE layer stores for its routed tokens besides the
    experts' own tensors: the dispatched copies, 2 x width x k_r (the experts' fc1 input), and with a latent MoE
    (``hy["moe_latent_size"]``, Megatron-Core ``moe_latent_size``) the fc2_latent_proj input, 2 x latent. Without a
    latent the width is h (2 h k_r). With one, Megatron-Core projects the tokens to the latent width before the
    dispatch (megatron/core/transformer/moe/moe_layer.py: ``preprocess`` runs ``fc1_latent_proj`` ahead of
    ``dispatch_preprocess``; ``postprocess`` runs ``fc2_latent_proj`` after the combine), so each copy is latent wide
    and the combined latent output is kept for fc2_latent_proj's weight gradient; fc1_latent_proj's input is the
    pre-MLP norm output, already in the replicated part."""
    if hy is None or "moe_latent_size" not in hy:
        return 2.0 * h * k_r
    lat = hy["moe_latent_size"]
    has = hy["hybrid"] & np.isfinite(lat) & (lat > 0)
    if not np.any(has):
        return 2.0 * h * k_r
    lat0 = np.where(has, lat, 0.0)
    return np.where(has, 2.0 * lat0 * k_r + 2.0 * lat0, 2.0 * h * k_r)


def low_precision_saved_inputs(q_dim, F_fc2, dense_frac, rc, saved_bytes, lp_frac):
    """(replicated, sharded) change of one layer's stored activations, in the units of ``_activation_elems``, when a
    low-precision GEMM keeps the quantized copy of its input for backward (``models.core.precision.SAVED_GEMM_INPUT_BYTES``,
    ``saved_bytes`` per element) instead of Korthikanti's 2-byte one. 0 where ``saved_bytes`` is 2.

    The GEMM inputs of a layer and what replaces their 2 bytes per element:
      replicated  QKV input h (the norm output, TE LayerNormLinear) and, in dense layers (``dense_frac``), the MLP
                  input h (LayerNormLinear/LayerNormMLP fc1): saved_bytes each. The norm inputs stay 16-bit, and so do
                  a MoE layer's norm output (it also feeds the router) and its dispatched token copies.
      sharded     the fc2 input ``F_fc2`` (dense: ffn; MoE: the routed + shared experts' widths, TE GroupedLinear):
                  saved_bytes. The attention output q feeds the output projection: with the attention core kept
                  (``rc`` 0 none; 2 full, whose one-layer working set is all of it) the fused attention keeps its
                  16-bit output for its own backward (TE dot_product_attention/backends.py saves q, k, v, out), so the
                  quantized copy is one more tensor, + saved_bytes q; with the core recomputed (1 selective) the copy
                  replaces it. Q, K, V, softmax statistics and the activation function's inputs stay 16-bit.
    ``lp_frac``: the share of the layers in low precision (a recipe may keep some in BF16)."""
    on = lp_frac * (saved_bytes < 2.0)
    d = saved_bytes - 2.0  # per element, against Korthikanti's 2 bytes
    rep = on * d * (1.0 + dense_frac)
    proj = np.where(np.asarray(rc) == 1, d, saved_bytes) * q_dim
    return rep, on * (d * F_fc2 + proj)


#: Megatron-Core ``recompute_modules`` (TransformerConfig, with ``recompute_granularity = "selective"``) as bits of
#: the per-row ``recompute_modules`` input; ``module_recompute_savings`` says what each one stops storing.
RECOMPUTE_MODULE_BITS = {"core_attn": 1, "moe_act": 2, "layernorm": 4, "mla_up_proj": 8, "mlp": 16, "moe": 32,
                         "shared_experts": 64}


def recompute_modules_code(modules) -> int:
    """The ``recompute_modules`` bitmask of a list of Megatron-Core module names (``RECOMPUTE_MODULE_BITS``)."""
    return sum(RECOMPUTE_MODULE_BITS[m] for m in set(modules))


def _bit(code, name) -> np.ndarray:
    return (np.asarray(code).astype(np.int64) & RECOMPUTE_MODULE_BITS[name]) > 0


def active_module_code(code, rc):
    """The ``recompute_modules`` bits of the selective-recompute rows that have a module list (0 elsewhere), or None
    where no row has one (the module-recompute terms are then skipped)."""
    if code is None:
        return None
    code = np.nan_to_num(_f(code))
    on = (code > 0) & (np.asarray(rc) == 1)
    return np.where(on, code, 0.0).astype(np.int64) if np.any(on) else None


def module_recompute_savings(code, h, n_heads, F_d, expert_ffn, k_r, ns, cf, moe_w, dense_w, fc2_bytes, ms=None,
                             dispatch=None):
    """(replicated, sharded) drop of one layer's stored activations, in the units of ``_activation_elems`` (the
    Korthikanti byte coefficients per token, replicated ones as multiples of h), under Megatron-Core's module
    recompute ``code`` (``RECOMPUTE_MODULE_BITS``; megatron/core/transformer/transformer_layer.py, moe/experts.py,
    moe/moe_layer.py, multi_latent_attention.py). ``moe_w``/``dense_w``: the share of the stage's layers (or hybrid
    blocks) that are MoE / dense MLP; ``fc2_bytes``: bytes per element charged for an fc2 input (2, or the quantized
    copy of ``low_precision_saved_inputs``); ``ms``: MLA shapes (models.arch.mla) or None; ``dispatch``: the dispatched
    copies' elements per token (``moe_dispatch_elems``; None: 2 h k_r).
      core_attn       0 here: the attention scores 5 a s / h are what ``recompute`` = selective already drops
                      (nothing more with fused attention: the checkpoint keeps its inputs Q, K, V).
      moe_act         CheckpointWithoutOutput around the routed experts' activation function: its output, the fc2
                      input (Korthikanti's 8 s b h GeLU output of a 4h MLP), k_r expert_ffn elements at
                      ``fc2_bytes`` (with FP8/FP4 fc2 saves the original input, which is discarded with it).
      layernorm       CheckpointWithoutOutput around pre_mlp_layernorm: the MoE layers' MLP input 2h (Korthikanti's
                      2 s b h MLP-input term; the layer specs give MoE layers a separate pre-MLP norm). The input norm
                      is separate only in some specs (fused into the QKV GEMM in others): not counted.
      mla_up_proj     CheckpointWithoutOutput around the MLA up-projections and RoPE, freed after the core
                      attention: Q and K (2 a d_qk each) and V (2 a d_v), Korthikanti's 4 s b h (Q, K) + 2 s b h (V).
      mlp             tensor_parallel.checkpoint of a dense (non-MoE) layer's MLP: everything inside it, c_f F
                      (Korthikanti's 8 s b h + 8 s b h GeLU input and output), the fc2 input at ``fc2_bytes``.
      moe             checkpoint of the whole MoE layer: the experts' c_f F_experts and the 2h k_r dispatched copies
                      (latent MoE: ``dispatch``).
      shared_experts  checkpoint of the shared experts: c_f ns expert_ffn (not with ``moe``, which holds them)."""
    moe, act, sh = _bit(code, "moe"), _bit(code, "moe_act"), _bit(code, "shared_experts")
    dfc2 = fc2_bytes - 2.0  # the fc2 input's charge against Korthikanti's 2 bytes
    routed = k_r * expert_ffn
    whole = (cf + dfc2) * (routed + ns * expert_ffn) + (2.0 * h * k_r if dispatch is None else dispatch)
    parts = act * fc2_bytes * routed + sh * (cf + dfc2) * ns * expert_ffn
    sharded = moe_w * np.where(moe, whole, parts) + _bit(code, "mlp") * dense_w * (cf + dfc2) * F_d
    if ms is not None:
        qkv = 2.0 * n_heads * (2.0 * ms["qk_head"] + ms["v_head_dim"])
        sharded = sharded + (_bit(code, "mla_up_proj") & ms["mla"]) * np.nan_to_num(qkv)
    rep = 2.0 * moe_w * (_bit(code, "layernorm") & ~moe)
    return rep, sharded


def _module_recompute_elems(code, rc, arch, shapes, act_args, lp, any_moe, k_r, cf, saved_bytes, lp_frac):
    """Stored elements (units of ``_activation_elems``) one layer no longer keeps under ``recompute_modules``
    (``module_recompute_savings``), on selective-recompute rows with a module list; 0.0 where no row has one."""
    if (code := active_module_code(code, rc)) is None:
        return 0.0
    on = code > 0
    moe_w = lp["moe_frac"] if any_moe else 0.0
    dense_w = 1.0 - moe_w
    fc2 = 2.0 if saved_bytes is None else 2.0 + lp_frac * (saved_bytes < 2.0) * (saved_bytes - 2.0)
    dispatch = None
    if (hy := arch.get("hybrid")) is not None:  # hybrid rows: shares of MoE / MLP blocks, no quantized saves

        dispatch = moe_dispatch_elems(act_args[2], k_r, hy)
        _, _, mlp_share, moe_share = mamba.block_shares(hy)
        moe_w = np.where(hy["hybrid"], moe_share, moe_w)
        dense_w = np.where(hy["hybrid"], mlp_share, dense_w)
        fc2 = np.where(hy["hybrid"], 2.0, fc2)
    rep, sharded = module_recompute_savings(code, act_args[2], arch["n_heads"], arch["ffn_dim"],
                                            arch["expert_ffn_dim"], k_r, arch["n_shared_experts"], cf, moe_w,
                                            dense_w, fc2, arch.get("mla"), dispatch)
    return on * _activation_elems(*act_args, sharded, rep, 0.0)[0]


def _local_params(arch, shapes, Ls, t, p, e, any_moe, etp=None) -> dict:
    """Parameters on one GPU of the stage: ``dense`` (attention, norms, dense MLPs, shared experts, routers,
    embeddings of a first/last stage), ``expert`` (its routed experts), and the per-layer counts the prefetch
    buffers read (``plc`` attention + norms, ``dense_mlp``, ``moe_mlp`` shared + local routed experts of one MoE
    layer; ``is_moe`` rows with MoE layers; ``moe_frac`` their share of the layers). Routed experts are divided
    by ep * etp (``etp`` expert tensor parallelism, models.arch.moe; None = tp)."""
    h, L, V, E, ns = arch["d_model"], arch["n_layers"], arch["vocab"], arch["n_experts"], arch["n_shared_experts"]
    inv_t = 1.0 / t
    n_moe = shapes["n_moe_layers"]
    plc = shapes["attn_matmul"] + shapes["attn_bias"] + shapes["norm_params"]
    dense_mlp = shapes["dense_mlp_matmul"] + shapes["mlp_bias"]
    Vh = V * h
    tied = arch["tied_embeddings"]
    if np.ndim(tied) and not np.count_nonzero(tied):  # untied everywhere: 2 V h on a single stage
        embed_stage = Vh * (2.0 - (p > 1))
    else:
        embed_stage = np.where(p > 1, Vh, Vh * (2.0 - clip(tied, 0, 1)))
    out = {"plc": plc, "dense_mlp": dense_mlp, "embed": embed_stage * inv_t}
    if any_moe:
        moe_frac = n_moe / L
        Ls_moe = Ls * moe_frac
        Ls_dense = Ls - Ls_moe
        expert = shapes["expert_matmul"] + shapes["expert_bias"]
        e1 = np.maximum(e, 1.0)
        ns_expert = ns * expert
        dense_local = (Ls * plc + Ls_dense * dense_mlp + Ls_moe * (ns_expert + shapes["router_matmul"])
                       + embed_stage) * inv_t
        E_expert_e = E * expert / e1
        if etp is not None:  # expert tensor parallelism: x tp / etp, exactly 1.0 at etp = tp (models.arch.moe)
            E_expert_e = E_expert_e * (t / _f(etp))
        expert_local = Ls_moe * E_expert_e * inv_t
        out.update(moe_frac=moe_frac, is_moe=moe_frac > 0, moe_mlp=ns_expert + E_expert_e)
    else:
        dense_local = (Ls * plc + Ls * dense_mlp + embed_stage) * inv_t
        expert_local = np.zeros(np.shape(dense_local))
    if arch.get("mla") is not None or arch.get("mtp") is not None:
        # MLA: duplicated down-projections; MTP modules on the last stage

        dense_local, expert_local = mla.local_params(arch, shapes, dense_local, expert_local, Ls, t, p, e,
                                                     etp=etp)
    hy = arch.get("hybrid")
    if hy is not None:  # hybrid rows: the stage holds Ls of the n_layers blocks (models.arch.mamba)

        hyb = hy["hybrid"]
        hc = hybrid_param_counts(arch, shapes)
        frac = Ls / L
        e_h = np.maximum(e, 1.0)
        if etp is not None:  # routed experts / (ep etp) (models.arch.moe)
            e_h = e_h * (_f(etp) / t)
        dense_local = np.where(hyb, (frac * hc["blocks_dense"] + embed_stage) * inv_t, dense_local)
        expert_local = np.where(hyb, frac * hc["blocks_expert"] / e_h * inv_t, expert_local)
    out.update(dense=dense_local, expert=expert_local)
    return out


def _state_shares(lp, shard, d, c, e, node_size, inv_t, any_moe, etp_scale=None) -> dict:
    """Parameters per GPU whose weights (``S_w``), gradients (``S_g``) and optimizer state (``S_o``) this GPU
    holds, and ``S_none`` (unsharded). Sharding: weights by codes 3-5, gradients by 2-5, optimizer state by 1-5;
    the data-parallel group is dp*cp (routed experts: dp*cp/ep, x tp/etp = ``etp_scale`` with expert tensor
    parallelism, models.arch.moe.expert_dp_size); HSDP (5) shards inside the node."""
    dense_local, expert_local = lp["dense"], lp["expert"]
    nd = d * c
    hs_any = bool(np.any(shard == 5))
    if hs_any:
        hs = clip(np.floor(_f(node_size) * inv_t), 1.0, nd)
        is5 = shard == 5
        D = np.where(is5, hs, nd)
    else:
        D = nd
    S_none = dense_local + expert_local
    if any_moe:
        ne = nd / np.maximum(e, 1.0)
        ne = np.maximum(ne * etp_scale if etp_scale is not None else ne, 1.0)
        De = np.where(is5, np.minimum(hs, ne), ne) if hs_any else ne
        S_full = dense_local / D + expert_local / De
    else:
        S_full = dense_local / D
    return {"S_none": S_none, "S_w": np.where(shard >= 3, S_full, S_none),
            "S_g": np.where(shard >= 2, S_full, S_none), "S_o": np.where(shard >= 1, S_full, S_none)}


def _weights(lp, S, shard, fp32, wb, Ls, inv_t, any_moe, hy, fsdp_unsharded_stage) -> np.ndarray:
    """Weight bytes: the held 16-bit (fp32 runs: 4-byte) copy, plus two gathered layers as prefetch buffers
    under ZeRO-3 / FSDP / HSDP (or the whole gathered stage: FSDP without reshard-after-forward)."""
    w_sh = shard >= 3
    # PyTorch FSDP/HSDP (MixedPrecision param_dtype=bf16) keeps only the fp32 sharded
    # parameters - the master copy counted in the optimizer state - and casts to 16 bits on
    # all-gather, so no separate 16-bit shard exists (PyTorch FSDP docs, MixedPrecision:
    # "sharded parameters ... remain in full precision"); DeepSpeed ZeRO-3 keeps a 16-bit
    # partition next to the fp32 master in the optimizer.
    no16 = (shard >= 4) & ~fp32
    weights = (wb * S["S_w"]) * ~no16 if np.any(no16) else wb * S["S_w"]
    if np.any(w_sh):  # ZeRO-3/FSDP/HSDP: two gathered layers as prefetch buffers
        plc, dense_mlp = lp["plc"], lp["dense_mlp"]
        if any_moe:
            layer_local = (plc + np.where(lp["is_moe"], lp["moe_mlp"], dense_mlp)) * inv_t
        else:
            layer_local = (plc + dense_mlp) * inv_t
        if hy is not None:  # two of the stage's blocks (mean block)
            layer_local = np.where(hy["hybrid"], 2.0 * (lp["dense"] + lp["expert"]) / np.maximum(Ls, 1.0),
                                   layer_local)
        prefetch = 2.0 * wb * layer_local
        if fsdp_unsharded_stage is not None and np.any(fsdp_unsharded_stage):
            # FSDP without reshard-after-forward (torchtitan with pp > 1): the whole stage's 16-bit
            # weights stay gathered from forward to backward, in place of the two prefetch buffers
            prefetch = np.where(np.asarray(fsdp_unsharded_stage, dtype=bool), wb * S["S_none"], prefetch)
        weights = weights + w_sh * prefetch
    return weights


def _grads_optimizer(S, shard, fp32, m, params, grad_bytes, trainable_frac, fsdp_unsharded_stage,
                     optimizer_bytes=None):
    """(gradient bytes, optimizer-state bytes, parameters whose optimizer state this GPU holds). NaN in
    ``grad_bytes`` / ``optimizer_bytes`` (16-bit rows): ``params``' value."""
    S_g, S_o = S["S_g"], S["S_o"]
    gb, gb32 = (params.grad_bytes if grad_bytes is None else _f(grad_bytes)), 4.0
    if grad_bytes is not None and np.any(np.isnan(gb)):
        gb = np.where(np.isnan(gb), params.grad_bytes, gb)
    grads = (gb * S_g) if np.all(gb == gb32) else np.where(fp32, gb32, gb) * S_g
    ob_m, ob_32 = params.optimizer_state_bytes_mixed, params.optimizer_state_bytes_fp32
    if optimizer_bytes is not None and not np.all(np.isnan(ob_row := _f(optimizer_bytes))):
        ob_m = np.where(np.isnan(ob_row), ob_m, ob_row)
    ob = np.where(fp32, ob_32, ob_m) if np.any(fp32) else ob_m
    optimizer = ob * S_o
    if fsdp_unsharded_stage is not None and np.any(fsdp_unsharded_stage):
        grads = grads + (np.asarray(fsdp_unsharded_stage, dtype=bool) * (shard >= 3) * (m > 1)) * (gb * S["S_none"])
    if trainable_frac is not None:  # LoRA: frozen weights have no gradient and no optimizer state
        tf = _f(trainable_frac)
        grads = grads * tf
        optimizer = optimizer * tf
        S_o = S_o * tf
    return grads, optimizer, S_o


def _activations(arch, shapes, lp, s, b, t, p, c, v, m, rc, sp, wb, Ls, any_moe, params, selective_policy,
                 logits_bytes, logits_chunks, act_offload_frac, moe_rho=None, saved_bytes=None,
                 lp_frac=None, recompute_modules=None) -> tuple[np.ndarray, np.ndarray]:
    """(activation bytes of the most loaded stage, in-flight micro-batches): stored per layer and micro-batch,
    one layer's working set (full recompute; recomputed save-list tensors), logits on the last stage, MTP.
    ``moe_rho``: the most loaded EP rank stores rho x the mean routed copies (models.arch.moe; None = 1).
    ``saved_bytes``/``lp_frac``: quantized GEMM inputs of low-precision rows (``low_precision_saved_inputs``)."""
    # activations (per layer, per micro-batch; models.memory.model docstring, Korthikanti et al. 2022).
    # The stored bytes are linear in the sharded FFN width F, so a stage mixing dense and MoE
    # layers stores per layer what one layer of the layer-weighted mean width stores:
    # F_mix = F_dense + moe_frac (F_moe - F_dense).
    h, V, k, ns = arch["d_model"], arch["vocab"], arch["top_k"], arch["n_shared_experts"]
    ms, mtp, hy = arch.get("mla"), arch.get("mtp"), arch.get("hybrid")
    inv_t = 1.0 / t
    scale = 0.5 * wb  # the Korthikanti coefficients are for 2-byte activations
    s_loc = s / c
    tokens = s_loc * b
    rep_div_inv = np.where(sp, inv_t, 1.0) if np.any(sp) else 1.0
    cf = 2.0 * shapes["mlp_mats"]  # 4 for GeLU (input, output), 6 for SwiGLU (gate, up, product)
    attn_part = 4.0 * (shapes["q_dim"] + shapes["kv_dim"])
    F_d = arch["ffn_dim"]
    any_full = bool(np.any(rc == 2))
    k_r = k * _f(moe_rho) if moe_rho is not None else k  # the most loaded EP rank's routed copies (models.arch.moe)
    if any_moe:
        # the MoE dispatch copies 2h*top_k are added to the sharded part via the FFN width
        F_experts = (k_r + ns) * arch["expert_ffn_dim"]
        F_m = F_experts + 2.0 * h * k_r / cf
        F_mix = F_d + lp["moe_frac"] * (F_m - F_d)
        F_work = np.where(lp["is_moe"], F_m, F_d) if any_full else F_mix  # full recompute: the heaviest layer
    else:
        F_mix = F_work = F_d
    ass = params.attn_scores_stored
    act_args = (tokens, s, h, arch["n_heads"], inv_t, rep_div_inv)
    rep_elems = 8.0 + params.dropout_mask_elems
    if ms is not None:  # MLA rows: the latents, kept replicated over tp (models.arch.mla)

        rep_elems = rep_elems + np.where(ms["mla"], mla.activation_bytes_per_token(ms, h)[0], 0.0)
    if saved_bytes is not None and np.any(saved_bytes < 2.0):  # low-precision GEMM inputs (TE)
        moe_frac = lp["moe_frac"] if any_moe else 0.0
        F_fc2 = F_d + moe_frac * (F_experts - F_d) if any_moe else F_d
        d_rep, d_sh = low_precision_saved_inputs(shapes["q_dim"], F_fc2, 1.0 - moe_frac, rc, saved_bytes, lp_frac)
        rep_elems, attn_part = rep_elems + d_rep, attn_part + d_sh
    kept, scores, checkpoint = _activation_elems(*act_args, attn_part + cf * F_mix, rep_elems, ass)
    stored = np.where(rc == 0, kept + scores, kept) if ass else kept
    recomputed = 0.0
    if selective_policy is not None and np.any(listed := (np.asarray(selective_policy) > 0) & (rc == 1)):
        code = np.asarray(selective_policy).astype(np.int64)
        saved = _save_list_elems(act_args, shapes, F_mix, t, code)
        stored = np.where(listed, saved, stored)
        # during a layer's backward its unsaved tensors are recomputed: the rest of its working set, once
        recomputed = scale * (listed * np.maximum(kept - saved, 0.0))
    if any_full:
        is_full = rc == 2
        stored = np.where(is_full, checkpoint, stored)
        kept_work = kept if F_work is F_mix else _activation_elems(*act_args, attn_part + cf * F_work, rep_elems,
                                                                   ass)[0]
        working = scale * (is_full * (kept_work + scores))  # one layer's full working set during its backward
    else:
        working = 0.0
    working = working + recomputed
    mod_saved = _module_recompute_elems(recompute_modules, rc, arch, shapes, act_args, lp, any_moe, k_r, cf,
                                        saved_bytes, lp_frac)
    if hy is not None:
        h_stored, h_working = hybrid_activation_bytes(
            hy, act_args, shapes["q_dim"], shapes["kv_dim"], cf * F_d,
            cf * ((k_r + ns) * arch["expert_ffn_dim"]) + moe_dispatch_elems(h, k_r, hy), rc, ass,
            params.dropout_mask_elems)
        stored = np.where(hy["hybrid"], h_stored, stored)
        working = np.where(hy["hybrid"], scale * h_working, working)
    if np.any(mod_saved):  # module recompute: not stored; one layer's recomputed tensors live in its backward
        stored, working = stored - mod_saved, working + scale * mod_saved
    stage_acts = scale * stored * Ls
    if act_offload_frac is not None:
        stage_acts = stage_acts * (1.0 - _f(act_offload_frac))
    if np.any(v > 1):
        inflight = np.where(v > 1, p + (p - 1.0) / v, p)
        inflight = np.maximum(np.minimum(inflight, m), 1.0)
    else:
        inflight = np.maximum(np.minimum(p, m), 1.0)
    lb = 4.0 if logits_bytes is None else _f(logits_bytes)
    if logits_chunks is not None:
        lb = lb / np.maximum(_f(logits_chunks), 1.0)
    logits = (lb * tokens) * V * inv_t
    # first stage: all in-flight micro-batches; last stage: one, plus the fp32 logits. With
    # pp = 1 the in-flight count is 1 and both are the same stage (max = stage + logits).
    act_last = stage_acts + working + logits
    if mtp is not None:  # MTP: one more layer's activations and logits per module on the last stage
        act_last = act_last + mtp * (scale * stored + logits)
    activations = np.maximum(stage_acts * inflight + working, act_last)
    if mtp is not None and np.any(p > 1):  # with pp > 1 this is the last stage (models.arch.mla) ...
        activations = np.where(p > 1, act_last, activations)
    return activations, inflight


def low_precision_layer_share(layers_16bit, arch) -> np.ndarray:
    """The share of a row's layers its low-precision recipe runs in low precision: all but the ``layers_16bit`` it
    keeps in BF16 (models.core.precision; None or NaN: none kept)."""
    l16 = 0.0 if layers_16bit is None else np.nan_to_num(_f(layers_16bit), nan=0.0)
    return clip(1.0 - l16 / np.maximum(arch["n_layers"], 1.0), 0.0, 1.0)


def quantized_weights(lp, shard, wb, fp8_param_gather, dtype_code, non_tn_fp8, layers_16bit, arch):
    """(change of the weight bytes, {``quantized_dense_params_local``, ``quantized_expert_params_local``}) of rows
    whose recipe keeps its GEMM weights as Transformer Engine quantized parameters (Megatron-Core
    ``fp8_param_gather``): each such weight holds ``models.core.precision.QUANTIZED_PARAM_BYTES`` per element (fp8 / fp8-cs
    1 B where ``non_tn_fp8``, the device runs non-TN FP8 GEMMs, else 2 B with the Hopper transpose; mxfp8 2.0625 B,
    row- and column-wise copies) in place of the 16-bit ``wb``; the fp32 master (optimizer state) and the gradients
    are unchanged. (0.0, {}) where no row has the flag.

    Quantized: the decoder layers' weights (attention, MLP, experts; their norms, biases and routers, under 0.1 % of
    a layer, counted with them) in the share of layers run in low precision (the ``layers_16bit`` a recipe keeps in
    BF16 are built outside ``fp8_model_init``). Embeddings and the output layer stay 16-bit (not TE modules). Only
    layouts with whole weights on each rank (no sharding, ZeRO-1/2: Megatron-Core's DDP parameter buffer); ZeRO-3 /
    FSDP rows keep the 16-bit accounting, and so do dtypes without a layout."""
    if fp8_param_gather is None or dtype_code is None or not np.any(_f(fp8_param_gather) > 0):
        return 0.0, {}

    qb = quantized_param_bytes(dtype_code, False if non_tn_fp8 is None else non_tn_fp8)
    on = (_f(fp8_param_gather) > 0) & (np.asarray(shard) < 3) & ~np.isnan(qb)
    frac = on * low_precision_layer_share(layers_16bit, arch)
    q_dense = frac * np.maximum(lp["dense"] - lp["embed"], 0.0)
    q_expert = frac * lp["expert"]
    dw = np.where(on, qb - wb, 0.0) * (q_dense + q_expert)
    return dw, {"quantized_dense_params_local": q_dense, "quantized_expert_params_local": q_expert}


def _saved_input_bytes(quantized_saves, dtype_code, layers_16bit, arch):
    """(bytes per saved GEMM input element, share of layers in low precision) of each row, or (None, None) where no
    row keeps quantized inputs (``memory_per_gpu``'s ``quantized_saves``)."""
    if quantized_saves is None or dtype_code is None or not np.any(quantized_saves):
        return None, None

    b = np.where(np.asarray(quantized_saves, dtype=bool), saved_gemm_input_bytes(dtype_code), 2.0)
    return b, low_precision_layer_share(layers_16bit, arch)


def _sharding_codes(sharding) -> np.ndarray:
    """Integer sharding codes (models.core.params.SHARDING_CODES); NaN -> -1, unknown codes (> 5) behave like "none" (the
    row is invalid anyway)."""
    shard = np.asarray(sharding)
    if shard.dtype.kind not in "iu":
        shard = np.nan_to_num(shard.astype(np.float64), nan=-1.0).astype(np.int64)
    if shard.ndim and (shard > 5).any():
        shard = np.where(shard > 5, 0, shard)
    elif not shard.ndim and shard > 5:
        shard = np.zeros_like(shard)
    return shard


def _overhead(modelled, params, capacity_gb, overhead_frac_of_capacity) -> np.ndarray:
    """Allowance: the fragmentation share of the modelled bytes + a fixed part (or a share of the device)."""
    if overhead_frac_of_capacity is not None and capacity_gb is not None:
        fixed = _f(overhead_frac_of_capacity) * capacity_bytes(capacity_gb)
    else:
        fixed = params.mem_overhead_gb * GB
    return params.mem_fragmentation_frac * modelled + fixed


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
    layers_per_stage=None,
    act_bytes=None,
    grad_bytes=None,
    trainable_frac=None,
    selective_policy=None,
    logits_bytes=None,
    logits_chunks=None,
    act_offload_frac=None,
    fsdp_unsharded_stage=None,
    capacity_gb=None,
    overhead_frac_of_capacity=None,
    etp=None,
    moe_rho=None,
    quantized_saves=None,
    dtype_code=None,
    layers_16bit=None,
    fp8_param_gather=None, non_tn_fp8=None, recompute_modules=None, optimizer_bytes=None,
) -> dict[str, np.ndarray]:
    """Bytes per GPU on the most loaded stage: weights, grads, optimizer, activations, overhead.

    All arguments are arrays (or scalars) of equal length; ``sharding`` and ``recompute`` are integer codes
    (models.core.params.SHARDING_CODES / RECOMPUTE_CODES), ``arch`` a normalized architecture
    (models.arch.accounting.normalize_arch) and ``shapes`` its layer_shapes. Optional, when the caller already has them:
    ``layers_per_stage`` = ceil(n_layers / pp), ``act_bytes`` = 4 for fp32/tf32 runs else 2.
    Returns bytes (not GB) and the in-flight micro-batch count; ``optimizer_params_local`` is the parameter count
    whose optimizer state this GPU holds (optimizer bytes / state bytes).

    Framework-dependent terms (models.memory.presets presets; each None keeps the behaviour of
    ``params``, i.e. the model before presets existed):
    ``grad_bytes``       bytes per gradient element of 16-bit runs (4 = Megatron fp32
                         ``main_grad``, 2 = 16-bit gradients); fp32/tf32 runs keep 4; NaN: ``params``'.
    ``optimizer_bytes``  bytes of optimizer state per parameter of 16-bit runs (NaN or None:
                         ``params.optimizer_state_bytes_mixed``, 12 = fp32 master + Adam m + v; 4 = a recipe
                         that keeps Adam's m and v in bf16 and no master copy); fp32/tf32 runs keep theirs.
    ``trainable_frac``   fraction of the parameters that get gradients and optimizer state
                         (LoRA: the adapters; frozen base weights keep only their 16-bit copy).
    ``selective_policy`` what ``recompute`` = selective stores: 0 Megatron-LM/Korthikanti
                         (everything but the attention core), 1 torchtitan op-level SAC, 2-6
                         MaxText remat policies (``_SAVE_LISTS``, ``MAXTEXT_REMAT``).
    ``logits_bytes``     bytes per logit element the loss keeps for backward (default 4: fp32).
    ``logits_chunks``    the loss runs over this many token chunks (only one chunk's logits live).
    ``act_offload_frac`` fraction of the stored layer activations offloaded to host memory.
    ``fsdp_unsharded_stage`` FSDP with pipeline parallelism (torchtitan): the stage's 16-bit
                         weights stay gathered from forward to backward (``reshard_after_forward=False``)
                         and gradients accumulate unsharded over the micro-batches (torch.distributed.pipelining
                         ``set_requires_gradient_sync(last_backward)``), upcast to ``grad_bytes``.
    ``capacity_gb`` + ``overhead_frac_of_capacity``: the fixed allowance is this fraction of the
                         device's capacity instead of ``params.mem_overhead_gb`` (portable).
    ``etp``              expert tensor-parallel degree (models.arch.moe): routed experts / (ep etp), their
                         data-parallel group tp*cp*dp / (etp ep); None = tp.
    ``moe_rho``          the most loaded EP rank's routed tokens / the mean (models.arch.moe.effective_imbalance):
                         scales its routed activations; None = 1.
    ``quantized_saves``, ``dtype_code``, ``layers_16bit``: quantized GEMM inputs (``low_precision_saved_inputs``).
    ``fp8_param_gather``, ``non_tn_fp8``: quantized weights, no 16-bit copy (``quantized_weights``).
    ``recompute_modules`` Megatron-Core module recompute bits of selective rows (``module_recompute_savings``).

    Implementation note: few numpy calls per row block (the step-time model's hot path): block-level branches skip
    terms of absent rows (MoE, sharding modes, full recompute); categories are compared as integer codes.

    Parts (one function each): ``_local_params`` (parameters on the stage's GPU, dense and routed experts),
    ``_state_shares`` (ZeRO / FSDP / HSDP), ``_weights`` (+ prefetch), ``quantized_weights``, ``_grads_optimizer``,
    ``_activations``, ``_overhead``.
    """
    args = dict(locals())  # for the stage without the MTP modules (below)
    t, p, d, c, e, v, m = (_f(x) for x in (tp, pp, dp, cp, ep, vpp, n_micro))
    shard = _sharding_codes(sharding)
    rc = np.asarray(recompute)
    fp32 = np.asarray(is_fp32, dtype=bool)
    wb = _f(act_bytes) if act_bytes is not None else 2.0 + 2.0 * fp32.astype(np.float64)  # 16-bit, fp32: 4 B
    Ls = np.ceil(arch["n_layers"] / p) if layers_per_stage is None else _f(layers_per_stage)
    any_moe = bool(np.any(shapes["n_moe_layers"] > 0))
    inv_t = 1.0 / t

    lp = _local_params(arch, shapes, Ls, t, p, e, any_moe, etp)
    S = _state_shares(lp, shard, d, c, e, node_size, inv_t, any_moe, None if etp is None else t / _f(etp))
    dw, q_out = quantized_weights(lp, shard, wb, fp8_param_gather, dtype_code, non_tn_fp8, layers_16bit, arch)
    weights = _weights(lp, S, shard, fp32, wb, Ls, inv_t, any_moe, arch.get("hybrid"), fsdp_unsharded_stage) + dw
    grads, optimizer, S_o = _grads_optimizer(S, shard, fp32, m, params, grad_bytes, trainable_frac,
                                             fsdp_unsharded_stage, optimizer_bytes)
    activations, inflight = _activations(
        arch, shapes, lp, _f(seq_len), _f(micro_batch), t, p, c, v, m, rc,
        np.asarray(sequence_parallel, dtype=bool), wb, Ls, any_moe, params, selective_policy, logits_bytes,
        logits_chunks, act_offload_frac, moe_rho, *_saved_input_bytes(quantized_saves, dtype_code, layers_16bit, arch),
        recompute_modules)
    modelled = weights + grads + optimizer + activations
    overhead = _overhead(modelled, params, capacity_gb, overhead_frac_of_capacity)
    total = modelled + overhead
    out = {
        "mem_weights_bytes": weights,
        "mem_grads_bytes": grads,
        "mem_optimizer_bytes": optimizer,
        "mem_activations_bytes": activations,
        "mem_overhead_bytes": overhead,
        "mem_total_bytes": total,
        "inflight_microbatches": inflight,
        "dense_params_local": lp["dense"],
        "expert_params_local": lp["expert"],
        "optimizer_params_local": S_o, **q_out,  # q_out: weights held quantized (models.physics.parts.dp_comm)
    }
    if arch.get("mtp") is not None and np.any(p > 1):  # the first stage, without the MTP modules, may hold more
        first = memory_per_gpu(**(args | {"arch": {k: x for k, x in arch.items() if k != "mtp"}}))
        use = (p > 1) & (first["mem_total_bytes"] > total)
        out.update({k: np.where(use, first[k], out[k]) for k in out if k.startswith("mem_") or k.startswith("infl")})
    return out
