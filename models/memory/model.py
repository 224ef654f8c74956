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

The entry is ``memory_per_gpu(x, shapes, params, options)``: ``x`` the block's decoded ``Inputs``
(models.core.inputs, the object the step-time model reads; ``memory_inputs`` builds one for a memory question
alone). What a training stack's words mean (selective = attention core in Megatron, a save list in torchtitan and
MaxText; fp32 main_grad vs 16-bit gradients; the loss's logits bytes; LoRA; FSDP with pipeline parallelism) enters
through ``options`` (``MemoryOptions``); models.memory.stacks turns a training stack's sourced row
(measurements/stacks.csv) into them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping

import numpy as np

from models.arch import mamba, mla
from models.arch.accounting import hybrid_param_counts
from models.core.fastops import clip
from models.core.inputs import Inputs
from models.core.params import DEFAULT, Dtype, PhysParams, Recompute, Sharding, is_32bit
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
#: Pipeline schedules a training stack runs, as codes of ``MemoryOptions.pipeline_schedule`` (measurements/stacks.csv
#: writes them in its `interleaves_pipeline` column). What the most loaded pipeline rank holds under each:
#:  0 ``1f1b`` / 1 ``interleaved``: Megatron-LM's 1F1B, interleaved when vpp > 1 (Korthikanti et al. 2022 eq. 5;
#:    megatron/core/pipeline_parallel/schedules.py: the first rank runs (pp-1)*2 + (vpp-1)*pp warm-up chunk forwards,
#:    i.e. pp + (pp-1)/vpp stages' worth of micro-batches), the module docstring's rule.
#:  2 ``dualpipe``: DeepSeek's DualPipe (deepseek-ai/DualPipe README, "Pipeline Bubbles and Memory Usage Comparison":
#:    2x parameters and PP+1 micro-batches of activations per device; examples/example_dualpipe.py gives rank r the
#:    stages r and pp-1-r, so rank 0 holds the embedding, the output head and the MTP module together, as
#:    arXiv:2412.19437 section 3.2.3 "Shared Embedding and Output Head for Multi-Token Prediction" says).
#:  3 ``balanced_interleave``: Llama 3's interleaved schedule (Dubey et al. 2024, arXiv:2407.21783 section 3.3.2):
#:    "we reduce one Transformer layer each from the first and the last stages ... the first model chunk on the first
#:    stage has only the embedding, and the last model chunk on the last stage has only output projection and loss
#:    calculation". The first rank's extra warm-up micro-batches (the (pp-1) beyond pp) sit on its first chunk, which
#:    holds no layer: the first stage keeps min(pp, m) micro-batches of ceil((L + 2) / pp) - 1 layers.
PIPELINE_SCHEDULES = {"1f1b": 0, "interleaved": 1, "dualpipe": 2, "balanced_interleave": 3}
SCHEDULE_DUALPIPE = PIPELINE_SCHEDULES["dualpipe"]
SCHEDULE_BALANCED = PIPELINE_SCHEDULES["balanced_interleave"]

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
    recompute=Recompute.NONE,
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

    recompute: a models.core.params.Recompute code (the full-recompute value excludes the one-layer
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
    return scale * np.where(rc == Recompute.FULL, checkpoint,
                            np.where(rc == Recompute.SELECTIVE, kept, kept + scores))


def hybrid_activation_bytes(hy, act_args, q_dim, kv_dim, mlp_width, moe_width, recompute, scores_stored,
                            dropout_mask_elems):
    """Hybrid rows (models.arch.mamba): (stored elements of the mean block, working set of the heaviest block) for
    one micro-batch, in the units of ``_activation_elems``. Each block keeps its norm input and mixer input
    (replicated 4 + half the dropout masks, i.e. half of a transformer layer's 8 + m_d) and its mixer's sharded
    tensors: attention 4q + 4kv (+ scores on attention blocks only), MLP c_f F, MoE c_f F_moe + dispatch copies,
    Mamba-2 `models.arch.mamba.activation_bytes_per_token`, Mamba-1 `mamba1_activation_bytes_per_token`. Selective
    recompute drops the attention scores (Megatron's core-attention recompute; Mamba blocks have no selective
    option); full recompute keeps each block's input 2h and the working set of its heaviest block."""
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
    stored = np.where(rc == Recompute.FULL, checkpoint,
                      np.where(rc == Recompute.SELECTIVE, kept, kept + nA * scores))
    heaviest = np.maximum(np.maximum((nA > 0) * a_sh, (nF > 0) * mlp_width), np.maximum((nE > 0) * moe_width,
                                                                                      (nM > 0) * m_sh))
    work = _activation_elems(*act_args, heaviest, rep, scores_stored)[0] + (nA > 0) * scores
    return stored, (rc == Recompute.FULL) * work


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
    proj = np.where(np.asarray(rc) == Recompute.SELECTIVE, d, saved_bytes) * q_dim
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
    on = (code > 0) & (np.asarray(rc) == Recompute.SELECTIVE)
    return np.where(on, code, 0.0).astype(np.int64) if np.any(on) else None


def module_list_keeps_scores(code, rc) -> np.ndarray | float:
    """Rows whose selective recompute names a module list without ``core_attn`` (1.0; 0.0 elsewhere): Megatron-Core
    checkpoints the core attention only when the list names it (megatron/core/transformer/attention.py:
    ``checkpoint_core_attention = recompute_granularity == 'selective' and "core_attn" in recompute_modules``), so
    such a row stores what the core attention saves, its score matrices included, as recompute = none does."""
    if (mods := active_module_code(code, rc)) is None:
        return 0.0
    return ((mods > 0) & ~_bit(mods, "core_attn")).astype(np.float64)


def eager_block_elems(q_dim, kv_dim, F, gated):
    """(replicated, sharded) extra stored elements per token of one layer, in the units of ``_activation_elems``
    (bytes at 2 B per element), when the Llama block of pytorch/torchtitan runs eagerly, without torch.compile
    (torchtitan/models/norms.py RMSNorm, torchtitan/models/llama/model.py Attention and FeedForward, at 9dec370
    (2024-12) and 3996b634 (2025-02)); autograd saves a mul's operand only where the other one needs a gradient:
      replicated  8 h: each of the two RMSNorms (``self._norm(x.float()).type_as(x) * self.weight``) keeps the fp32
                  copy of its input (4 h, saved by ``pow`` and by ``x * rsqrt``) and its bf16 normalized value (2 h,
                  saved by the weight's mul) besides its output (the GEMM input Korthikanti counts), where Korthikanti
                  counts its 16-bit input (2 h; the block input itself is not saved): + 4 h per norm.
      sharded     4 (q - kv) + 2 q (+ 2 F for a gated MLP): ``repeat_kv`` materialises K and V at the query width
                  before scaled_dot_product_attention, which saves them (2 q each where Korthikanti counts 2 kv each;
                  nothing where kv = q, as repeat_kv then returns its input); the attention output is saved twice,
                  by SDPA (its ``out``) and, after ``transpose(1, 2).contiguous()``, by ``wo``; ``self.w2(F.silu(
                  self.w1(x)) * self.w3(x))`` keeps silu's output (saved by the product) beside its input, the up
                  projection and the product (Korthikanti's c_f = 6 counts three). RoPE keeps no fp32 copy (the
                  complex mul's other operand, ``freqs_cis``, needs no gradient).
    torch.compile fuses these ops (its partitioner saves the block's inputs and recomputes the copies); op-level SAC
    keeps its save list, and the eager copies are part of a layer's recomputed working set only."""
    return 8.0, 4.0 * (q_dim - kv_dim) + 2.0 * q_dim + 2.0 * F * gated


def attention_scores_share(score_bytes) -> np.ndarray:
    """``MemoryOptions.attn_scores_stored`` of an unfused attention core that keeps ``score_bytes`` bytes per element
    of each layer's a x s x s score matrix: Korthikanti et al. 2022 (section 4.1) count 5 (softmax output 2, dropout
    mask 1, dropout output 2), so the share is score_bytes / 5; 2 without attention dropout (torch.nn.Dropout(p=0)
    returns its input: only the softmax output, which the probabilities-times-V matmul reuses)."""
    return _f(score_bytes) / 5.0


def row_scores_stored(row, params: PhysParams = DEFAULT):
    """Per row, the share of Korthikanti's attention-score bytes stored: ``MemoryOptions.attn_scores_stored`` where
    a row gives one, else ``params.attn_scores_stored`` (a scalar when no row gives one)."""
    if row is None:
        return params.attn_scores_stored
    r = _f(row)
    if np.all(np.isnan(r)):
        return params.attn_scores_stored
    return np.where(np.isnan(r), params.attn_scores_stored, r)


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


def _module_recompute_elems(code, rc, arch, shapes, act_args, local, any_moe, k_r, cf, saved_bytes, lp_frac):
    """Stored elements (units of ``_activation_elems``) one layer no longer keeps under ``recompute_modules``
    (``module_recompute_savings``), on selective-recompute rows with a module list; 0.0 where no row has one."""
    if (code := active_module_code(code, rc)) is None:
        return 0.0
    on = code > 0
    moe_w = local["moe_frac"] if any_moe else 0.0
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


def _local_params(x: Inputs, shapes, any_moe, etp=None) -> dict:
    """Parameters on one GPU of the stage: ``dense`` (attention, norms, dense MLPs, shared experts, routers,
    embeddings of a first/last stage), ``expert`` (its routed experts), and the per-layer counts the prefetch
    buffers read (``plc`` attention + norms, ``dense_mlp``, ``moe_mlp`` shared + local routed experts of one MoE
    layer; ``is_moe`` rows with MoE layers; ``moe_frac`` their share of the layers). Routed experts are divided
    by ep * etp (``etp`` expert tensor parallelism, models.arch.moe; None = tp)."""
    arch = x.arch
    h, L, V, E, ns = arch["d_model"], arch["n_layers"], arch["vocab"], arch["n_experts"], arch["n_shared_experts"]
    tp, pp, ep, layers_per_stage = x.t, x.p, x.e, x.Ls
    inv_tp = 1.0 / tp
    n_moe = shapes["n_moe_layers"]
    plc = shapes["attn_matmul"] + shapes["attn_bias"] + shapes["norm_params"]
    dense_mlp = shapes["dense_mlp_matmul"] + shapes["mlp_bias"]
    Vh = V * h
    tied = arch["tied_embeddings"]
    if np.ndim(tied) and not np.count_nonzero(tied):  # untied everywhere: 2 V h on a single stage
        embed_stage = Vh * (2.0 - (pp > 1))
    else:
        embed_stage = np.where(pp > 1, Vh, Vh * (2.0 - clip(tied, 0, 1)))
    out = {"plc": plc, "dense_mlp": dense_mlp, "embed": embed_stage * inv_tp}
    if any_moe:
        moe_frac = n_moe / L
        moe_layers = layers_per_stage * moe_frac
        dense_layers = layers_per_stage - moe_layers
        expert = shapes["expert_matmul"] + shapes["expert_bias"]
        ep_ranks = np.maximum(ep, 1.0)
        ns_expert = ns * expert
        dense_local = (layers_per_stage * plc + dense_layers * dense_mlp
                       + moe_layers * (ns_expert + shapes["router_matmul"]) + embed_stage) * inv_tp
        experts_per_ep_rank = E * expert / ep_ranks
        if etp is not None:  # expert tensor parallelism: x tp / etp, exactly 1.0 at etp = tp (models.arch.moe)
            experts_per_ep_rank = experts_per_ep_rank * (tp / _f(etp))
        expert_local = moe_layers * experts_per_ep_rank * inv_tp
        out.update(moe_frac=moe_frac, is_moe=moe_frac > 0, moe_mlp=ns_expert + experts_per_ep_rank)
    else:
        dense_local = (layers_per_stage * plc + layers_per_stage * dense_mlp + embed_stage) * inv_tp
        expert_local = np.zeros(np.shape(dense_local))
    if arch.get("mla") is not None or arch.get("mtp") is not None:
        # MLA: duplicated down-projections; MTP modules on the last stage
        dense_local, expert_local = mla.local_params(arch, shapes, dense_local, expert_local, layers_per_stage, tp,
                                                     pp, ep, etp=etp)
    hy = arch.get("hybrid")
    if hy is not None:  # hybrid rows: the stage holds layers_per_stage of the n_layers blocks (models.arch.mamba)
        hyb = hy["hybrid"]
        hc = hybrid_param_counts(arch, shapes)
        frac = layers_per_stage / L
        ep_h = np.maximum(ep, 1.0)
        if etp is not None:  # routed experts / (ep etp) (models.arch.moe)
            ep_h = ep_h * (_f(etp) / tp)
        dense_local = np.where(hyb, (frac * hc["blocks_dense"] + embed_stage) * inv_tp, dense_local)
        expert_local = np.where(hyb, frac * hc["blocks_expert"] / ep_h * inv_tp, expert_local)
    out.update(dense=dense_local, expert=expert_local)
    return out


def _held_params(x: Inputs, local, shard, any_moe, etp_scale=None) -> dict:
    """Parameters per GPU whose weights (``weights``), gradients (``grads``) and optimizer state (``optimizer``)
    this GPU holds, and ``unsharded`` (all of the stage's). Sharding (models.core.params.Sharding): weights from
    ZERO3 on, gradients from ZERO2 on, optimizer state from ZERO1 on; the data-parallel group is dp*cp (routed
    experts: dp*cp/ep, x tp/etp = ``etp_scale`` with expert tensor parallelism, models.arch.moe.expert_dp_size);
    HSDP shards inside the node."""
    dense_local, expert_local = local["dense"], local["expert"]
    dp_group = x.d * x.c
    inv_tp = 1.0 / x.t
    hs_any = bool(np.any(shard == Sharding.HSDP))
    if hs_any:
        node_group = clip(np.floor(_f(x.node) * inv_tp), 1.0, dp_group)  # HSDP's group: the node's dp ranks
        is_hsdp = shard == Sharding.HSDP
        dense_group = np.where(is_hsdp, node_group, dp_group)
    else:
        dense_group = dp_group
    unsharded = dense_local + expert_local
    if any_moe:
        expert_group = dp_group / np.maximum(x.e, 1.0)
        expert_group = np.maximum(expert_group * etp_scale if etp_scale is not None else expert_group, 1.0)
        if hs_any:
            expert_group = np.where(is_hsdp, np.minimum(node_group, expert_group), expert_group)
        sharded = dense_local / dense_group + expert_local / expert_group
    else:
        sharded = dense_local / dense_group
    return {"unsharded": unsharded, "weights": np.where(shard >= Sharding.ZERO3, sharded, unsharded),
            "grads": np.where(shard >= Sharding.ZERO2, sharded, unsharded),
            "optimizer": np.where(shard >= Sharding.ZERO1, sharded, unsharded)}


def _weights(x: Inputs, local, held, shard, is_fp32, weight_bytes, any_moe, fsdp_unsharded_stage) -> np.ndarray:
    """Weight bytes: the held 16-bit (fp32 runs: 4-byte) copy, plus two gathered layers as prefetch buffers
    under ZeRO-3 / FSDP / HSDP (or the whole gathered stage: FSDP without reshard-after-forward)."""
    gathers_weights = shard >= Sharding.ZERO3
    # PyTorch FSDP/HSDP (MixedPrecision param_dtype=bf16) keeps only the fp32 sharded
    # parameters - the master copy counted in the optimizer state - and casts to 16 bits on
    # all-gather, so no separate 16-bit shard exists (PyTorch FSDP docs, MixedPrecision:
    # "sharded parameters ... remain in full precision"); DeepSpeed ZeRO-3 keeps a 16-bit
    # partition next to the fp32 master in the optimizer.
    no16 = (shard >= Sharding.FSDP) & ~is_fp32
    weights = (weight_bytes * held["weights"]) * ~no16 if np.any(no16) else weight_bytes * held["weights"]
    if np.any(gathers_weights):  # ZeRO-3/FSDP/HSDP: two gathered layers as prefetch buffers
        plc, dense_mlp = local["plc"], local["dense_mlp"]
        inv_tp = 1.0 / x.t
        if any_moe:
            layer_local = (plc + np.where(local["is_moe"], local["moe_mlp"], dense_mlp)) * inv_tp
        else:
            layer_local = (plc + dense_mlp) * inv_tp
        if (hy := x.arch.get("hybrid")) is not None:  # two of the stage's blocks (mean block)
            layer_local = np.where(hy["hybrid"], 2.0 * (local["dense"] + local["expert"]) / np.maximum(x.Ls, 1.0),
                                   layer_local)
        prefetch = 2.0 * weight_bytes * layer_local
        if fsdp_unsharded_stage is not None and np.any(fsdp_unsharded_stage):
            # FSDP without reshard-after-forward (torchtitan with pp > 1): the whole stage's 16-bit
            # weights stay gathered from forward to backward, in place of the two prefetch buffers
            prefetch = np.where(np.asarray(fsdp_unsharded_stage, dtype=bool), weight_bytes * held["unsharded"],
                                prefetch)
        weights = weights + gathers_weights * prefetch
    return weights


def _grads_optimizer(held, shard, is_fp32, n_micro, params, options: MemoryOptions):
    """(gradient bytes, optimizer-state bytes, parameters whose optimizer state this GPU holds). NaN in
    ``options.grad_bytes`` / ``options.optimizer_bytes`` (16-bit rows): ``params``' value."""
    held_grads, held_optimizer = held["grads"], held["optimizer"]
    grad_bytes, fsdp_unsharded_stage = options.grad_bytes, options.fsdp_unsharded_stage
    gb, gb32 = (params.grad_bytes if grad_bytes is None else _f(grad_bytes)), 4.0
    if grad_bytes is not None and np.any(np.isnan(gb)):
        gb = np.where(np.isnan(gb), params.grad_bytes, gb)
    grads = (gb * held_grads) if np.all(gb == gb32) else np.where(is_fp32, gb32, gb) * held_grads
    ob_m, ob_32 = params.optimizer_state_bytes_mixed, params.optimizer_state_bytes_fp32
    if options.optimizer_bytes is not None and not np.all(np.isnan(ob_row := _f(options.optimizer_bytes))):
        ob_m = np.where(np.isnan(ob_row), ob_m, ob_row)
    ob = np.where(is_fp32, ob_32, ob_m) if np.any(is_fp32) else ob_m
    optimizer = ob * held_optimizer
    if fsdp_unsharded_stage is not None and np.any(fsdp_unsharded_stage):
        accumulating = np.asarray(fsdp_unsharded_stage, dtype=bool) * (shard >= Sharding.ZERO3) * (n_micro > 1)
        grads = grads + accumulating * (gb * held["unsharded"])
    if options.trainable_frac is not None:  # LoRA: frozen weights have no gradient and no optimizer state
        tf = _f(options.trainable_frac)
        grads = grads * tf
        optimizer = optimizer * tf
        held_optimizer = held_optimizer * tf
    return grads, optimizer, held_optimizer


def _activations(x: Inputs, shapes, local, weight_bytes, any_moe, params, options: MemoryOptions, moe_rho=None,
                 saved_bytes=None, lp_frac=None) -> tuple[np.ndarray, np.ndarray]:
    """(activation bytes of the most loaded stage, in-flight micro-batches): stored per layer and micro-batch,
    one layer's working set (full recompute; recomputed save-list tensors), logits on the last stage, MTP.
    ``moe_rho``: the most loaded EP rank stores rho x the mean routed copies (models.arch.moe; None = 1).
    ``saved_bytes``/``lp_frac``: quantized GEMM inputs of low-precision rows (``low_precision_saved_inputs``)."""
    # activations (per layer, per micro-batch; models.memory.model docstring, Korthikanti et al. 2022).
    # The stored bytes are linear in the sharded FFN width F, so a stage mixing dense and MoE
    # layers stores per layer what one layer of the layer-weighted mean width stores:
    # F_mix = F_dense + moe_frac (F_moe - F_dense).
    arch = x.arch
    h, V, k, ns = arch["d_model"], arch["vocab"], arch["top_k"], arch["n_shared_experts"]
    ms, mtp, hy = arch.get("mla"), arch.get("mtp"), arch.get("hybrid")
    tp, pp, vpp, n_micro, rc = x.t, x.p, x.v, x.m, x.rc
    inv_tp = 1.0 / tp
    scale = 0.5 * weight_bytes  # the Korthikanti coefficients are for 2-byte activations
    s_loc = x.s / x.c
    tokens = s_loc * x.b
    rep_div_inv = np.where(x.sp, inv_tp, 1.0) if np.any(x.sp) else 1.0
    cf = 2.0 * shapes["mlp_mats"]  # 4 for GeLU (input, output), 6 for SwiGLU (gate, up, product)
    attn_part = 4.0 * (shapes["q_dim"] + shapes["kv_dim"])
    F_d = arch["ffn_dim"]
    any_full = bool(np.any(rc == Recompute.FULL))
    k_r = k * _f(moe_rho) if moe_rho is not None else k  # the most loaded EP rank's routed copies (models.arch.moe)
    if any_moe:
        # the MoE dispatch copies 2h*top_k are added to the sharded part via the FFN width
        F_experts = (k_r + ns) * arch["expert_ffn_dim"]
        F_m = F_experts + 2.0 * h * k_r / cf
        F_mix = F_d + local["moe_frac"] * (F_m - F_d)
        F_work = np.where(local["is_moe"], F_m, F_d) if any_full else F_mix  # full recompute: the heaviest layer
    else:
        F_mix = F_work = F_d
    ass = row_scores_stored(options.attn_scores_stored, params)
    act_args = (tokens, x.s, h, arch["n_heads"], inv_tp, rep_div_inv)
    rep_elems = 8.0 + params.dropout_mask_elems
    if ms is not None:  # MLA rows: the latents, kept replicated over tp (models.arch.mla)
        rep_elems = rep_elems + np.where(ms["mla"], mla.activation_bytes_per_token(ms, h)[0], 0.0)
    if saved_bytes is not None and np.any(saved_bytes < 2.0):  # low-precision GEMM inputs (TE)
        moe_frac = local["moe_frac"] if any_moe else 0.0
        F_fc2 = F_d + moe_frac * (F_experts - F_d) if any_moe else F_d
        d_rep, d_sh = low_precision_saved_inputs(shapes["q_dim"], F_fc2, 1.0 - moe_frac, rc, saved_bytes, lp_frac)
        rep_elems, attn_part = rep_elems + d_rep, attn_part + d_sh
        if any_moe and options.quantized_dispatch is not None and np.any(options.quantized_dispatch):
            qd = np.asarray(options.quantized_dispatch, dtype=bool)
            attn_part = attn_part + qd * moe_frac * quantized_dispatch_elems(h, k_r, saved_bytes, lp_frac)
    if options.eager_block is not None and np.any(eager := np.nan_to_num(_f(options.eager_block)) > 0):
        d_rep, d_sh = eager_block_elems(shapes["q_dim"], shapes["kv_dim"], F_mix, shapes["mlp_mats"] > 2)
        rep_elems, attn_part = rep_elems + eager * d_rep, attn_part + eager * d_sh
    kept, scores, checkpoint = _activation_elems(*act_args, attn_part + cf * F_mix, rep_elems, ass)
    stored = np.where(rc == Recompute.NONE, kept + scores, kept) if np.any(ass) else kept
    recomputed = 0.0
    selective_policy = options.selective_policy
    if selective_policy is not None and np.any(
            listed := (np.asarray(selective_policy) > SELECTIVE_ATTENTION_CORE) & (rc == Recompute.SELECTIVE)):
        code = np.asarray(selective_policy).astype(np.int64)
        saved = _save_list_elems(act_args, shapes, F_mix, tp, code)
        stored = np.where(listed, saved, stored)
        # during a layer's backward its unsaved tensors are recomputed: the rest of its working set, once
        recomputed = scale * (listed * np.maximum(kept - saved, 0.0))
    if any_full:
        is_full = rc == Recompute.FULL
        stored = np.where(is_full, checkpoint, stored)
        kept_work = kept if F_work is F_mix else _activation_elems(*act_args, attn_part + cf * F_work, rep_elems,
                                                                   ass)[0]
        working = scale * (is_full * (kept_work + scores))  # one layer's full working set during its backward
    else:
        working = 0.0
    working = working + recomputed
    if options.checkpointed_layer_share is not None and np.any(
            layer_ac := (np.nan_to_num(_f(options.checkpointed_layer_share)) > 0) & (rc == Recompute.SELECTIVE)):
        # per-layer selective AC: a share of the layers fully checkpointed, the others store everything; the
        # backward of a checkpointed layer holds its recomputed working set once
        share = np.where(layer_ac, np.nan_to_num(_f(options.checkpointed_layer_share)), 0.0)
        stored = np.where(layer_ac, share * checkpoint + (1.0 - share) * (kept + scores), stored)
        working = np.where(layer_ac, scale * (kept + scores), working)
    mod_saved = _module_recompute_elems(options.recompute_modules, rc, arch, shapes, act_args, local, any_moe, k_r, cf,
                                        saved_bytes, lp_frac)
    if np.any(ass):  # a module list without core_attn keeps the attention core and its scores
        stored = stored + module_list_keeps_scores(options.recompute_modules, rc) * scores
    if hy is not None:
        h_stored, h_working = hybrid_activation_bytes(
            hy, act_args, shapes["q_dim"], shapes["kv_dim"], cf * F_d,
            cf * ((k_r + ns) * arch["expert_ffn_dim"]) + moe_dispatch_elems(h, k_r, hy), rc, ass,
            params.dropout_mask_elems)
        stored = np.where(hy["hybrid"], h_stored, stored)
        working = np.where(hy["hybrid"], scale * h_working, working)
    if np.any(mod_saved):  # module recompute: not stored; one layer's recomputed tensors live in its backward
        stored, working = stored - mod_saved, working + scale * mod_saved
    stage_acts = scale * stored * x.Ls
    if options.act_offload_frac is not None:
        stage_acts = stage_acts * (1.0 - _f(options.act_offload_frac))
    if np.any(vpp > 1):
        inflight = np.where(vpp > 1, pp + (pp - 1.0) / vpp, pp)
        inflight = np.maximum(np.minimum(inflight, n_micro), 1.0)
    else:
        inflight = np.maximum(np.minimum(pp, n_micro), 1.0)
    lb = 4.0 if options.logits_bytes is None else _f(options.logits_bytes)
    if options.logits_chunks is not None:
        lb = lb / np.maximum(_f(options.logits_chunks), 1.0)
    logits = (lb * tokens) * V * inv_tp
    # first stage: all in-flight micro-batches; last stage: one, plus the fp32 logits. With
    # pp = 1 the in-flight count is 1 and both are the same stage (max = stage + logits).
    act_last = stage_acts + working + logits
    if mtp is not None:  # MTP: one more layer's activations and logits per module on the last stage
        act_last = act_last + mtp * (scale * stored + logits)
    activations = np.maximum(stage_acts * inflight + working, act_last)
    if mtp is not None and np.any(pp > 1):  # with pp > 1 this is the last stage (models.arch.mla) ...
        activations = np.where(pp > 1, act_last, activations)
    dual, balanced = _schedule_rows(options.pipeline_schedule, pp)
    if balanced is not None:  # the extra warm-up micro-batches sit on the layerless first chunk
        plain = np.maximum(np.minimum(pp, n_micro), 1.0)
        inflight = np.where(balanced, plain, inflight)
        activations = np.where(balanced, np.maximum(stage_acts * plain + working, act_last), activations)
    if dual is not None:  # DualPipe: PP + 1 micro-batches of a stage, and rank 0 has the head (and MTP) too
        d_in = dualpipe_inflight(pp, n_micro)
        inflight = np.where(dual, d_in, inflight)
        activations = np.where(dual, stage_acts * (d_in - 1.0) + act_last, activations)
    return activations, inflight


def low_precision_layer_share(layers_16bit, arch) -> np.ndarray:
    """The share of a row's layers its low-precision recipe runs in low precision: all but the ``layers_16bit`` it
    keeps in BF16 (models.core.precision; None or NaN: none kept)."""
    l16 = 0.0 if layers_16bit is None else np.nan_to_num(_f(layers_16bit), nan=0.0)
    return clip(1.0 - l16 / np.maximum(arch["n_layers"], 1.0), 0.0, 1.0)


def quantized_weights(local, shard, weight_bytes, fp8_param_gather, dtype_code, non_tn_fp8, layers_16bit, arch):
    """(change of the weight bytes, {``quantized_dense_params_local``, ``quantized_expert_params_local``}) of rows
    whose recipe keeps its GEMM weights as Transformer Engine quantized parameters (Megatron-Core
    ``fp8_param_gather``): each such weight holds ``models.core.precision.QUANTIZED_PARAM_BYTES`` per element (fp8 / fp8-cs
    1 B where ``non_tn_fp8``, the device runs non-TN FP8 GEMMs, else 2 B with the Hopper transpose; mxfp8 2.0625 B,
    row- and column-wise copies) in place of the 16-bit ``weight_bytes``; the fp32 master (optimizer state) and the
    gradients are unchanged. (0.0, {}) where no row has the flag.

    Quantized: the decoder layers' weights (attention, MLP, experts; their norms, biases and routers, under 0.1 % of
    a layer, counted with them) in the share of layers run in low precision (the ``layers_16bit`` a recipe keeps in
    BF16 are built outside ``fp8_model_init``). Embeddings and the output layer stay 16-bit (not TE modules). Only
    layouts with whole weights on each rank (no sharding, ZeRO-1/2: Megatron-Core's DDP parameter buffer); ZeRO-3 /
    FSDP rows keep the 16-bit accounting, and so do dtypes without a layout."""
    if fp8_param_gather is None or dtype_code is None or not np.any(_f(fp8_param_gather) > 0):
        return 0.0, {}
    qb = quantized_param_bytes(dtype_code, False if non_tn_fp8 is None else non_tn_fp8)
    on = (_f(fp8_param_gather) > 0) & (np.asarray(shard) < Sharding.ZERO3) & ~np.isnan(qb)
    frac = on * low_precision_layer_share(layers_16bit, arch)
    q_dense = frac * np.maximum(local["dense"] - local["embed"], 0.0)
    q_expert = frac * local["expert"]
    dw = np.where(on, qb - weight_bytes, 0.0) * (q_dense + q_expert)
    return dw, {"quantized_dense_params_local": q_dense, "quantized_expert_params_local": q_expert}


def _saved_input_bytes(quantized_saves, dtype_code, layers_16bit, arch):
    """(bytes per saved GEMM input element, share of layers in low precision) of each row, or (None, None) where no
    row keeps quantized inputs (``MemoryOptions.quantized_saves``)."""
    if quantized_saves is None or dtype_code is None or not np.any(quantized_saves):
        return None, None
    b = np.where(np.asarray(quantized_saves, dtype=bool), saved_gemm_input_bytes(dtype_code), 2.0)
    return b, low_precision_layer_share(layers_16bit, arch)


def _sharding_codes(sharding) -> np.ndarray:
    """Integer sharding codes (models.core.params.Sharding); NaN -> -1, unknown codes (above HSDP) behave like NONE
    (the row is invalid anyway)."""
    shard = np.asarray(sharding)
    if shard.dtype.kind not in "iu":
        shard = np.nan_to_num(shard.astype(np.float64), nan=-1.0).astype(np.int64)
    if shard.ndim and (shard > Sharding.HSDP).any():
        shard = np.where(shard > Sharding.HSDP, Sharding.NONE, shard)
    elif not shard.ndim and shard > Sharding.HSDP:
        shard = np.zeros_like(shard)
    return shard


#: The memory counters a source may report, and which part of ``memory_per_gpu``'s total each one holds. The total
#: (``mem_total_bytes``, ``memory_gb_per_gpu``) is what the device must hold, the figure compared with the capacity:
#:   device     the total: the modelled tensors, the caching allocator's share, and the fixed allowance (CUDA context,
#:              NCCL and cuBLAS workspaces; ``PhysParams.mem_overhead_gb``), roughly what nvidia-smi shows;
#:   reserved   torch.cuda.memory_stats()["reserved_bytes.all.peak"] (torchtitan's "memory: X GiB" log): the caching
#:              allocator's segments = the modelled tensors + the allocator's reserve over them
#:              (``ALLOCATOR_RESERVE_FRAC``, the fragmentation share of ``_overhead``); without the fixed allowance,
#:              which lives outside the allocator;
#:   allocated  ["allocated_bytes.all.peak"] (Megatron-LM's mem-max-allocated-bytes): the modelled tensors only;
#:   active     ["active_bytes.all.peak"] (torchtune's peak_memory_active): as allocated (active blocks are the
#:              allocated ones plus blocks freed but not yet reused by a pending stream; the model does not split them).
#: Data card of the shared measured_memory.csv: none of these counters includes the CUDA context or communication
#: buffers (nvidia-smi shows 0.5-3 GiB more); PyTorch docs, torch.cuda.memory_stats: reserved = allocated + cached.
MEMORY_COUNTERS = ("device", "reserved", "allocated", "active")
#: the caching allocator's reserve over the allocated bytes, as a share of them: ``PhysParams.mem_fragmentation_frac``
#: (prior 0.05), named here for the counters (``counter_bytes``)
ALLOCATOR_RESERVE_FRAC = DEFAULT.mem_fragmentation_frac


def counter_bytes(total_bytes, counter: str, params: PhysParams = DEFAULT, fixed_bytes=None) -> np.ndarray:
    """The bytes a memory counter (``MEMORY_COUNTERS``) reads of a prediction whose total is ``total_bytes`` (the
    ``mem_total_bytes`` of ``memory_per_gpu``, i.e. ``memory_gb_per_gpu`` x 1e9): the total less the fixed allowance
    (``fixed_bytes``; default ``params.mem_overhead_gb``, the allowance of every row without a capacity share) for
    ``reserved``, and further less the allocator's reserve (``params.mem_fragmentation_frac``) for ``allocated`` and
    ``active``. An unknown counter reads the total (``device``)."""
    total = _f(total_bytes)
    fixed = params.mem_overhead_gb * GB if fixed_bytes is None else _f(fixed_bytes)
    c = (counter or "").strip().lower()
    if c == "reserved":
        return total - fixed
    if c in ("allocated", "active"):
        return (total - fixed) / (1.0 + params.mem_fragmentation_frac)
    return total


def _overhead(modelled, params, options: MemoryOptions) -> np.ndarray:
    """Allowance: the fragmentation share of the modelled bytes + a fixed part (or a share of the device)."""
    if options.overhead_frac_of_capacity is not None and options.capacity_gb is not None:
        fixed = _f(options.overhead_frac_of_capacity) * capacity_bytes(options.capacity_gb)
    else:
        fixed = params.mem_overhead_gb * GB
    return params.mem_fragmentation_frac * modelled + fixed


@dataclass(frozen=True)
class MemoryOptions:
    """What a training stack and a run's recipe set for memory beyond the layout: per-row arrays (or scalars), each
    None to keep ``PhysParams``' behaviour. models.memory.stacks.stack_memory_options fills them from a stack's values;
    the step-time model adds the values a run's recipe states (models.physics.step_time.ROW_MEMORY_OPTIONS)."""

    # bytes per gradient element of 16-bit runs (4 = Megatron fp32 ``main_grad``, 2 = 16-bit gradients); fp32/tf32
    # runs keep 4; NaN: ``PhysParams.grad_bytes``
    grad_bytes: np.ndarray | None = None
    # bytes of optimizer state per parameter of 16-bit runs (NaN: ``PhysParams.optimizer_state_bytes_mixed``, 12 =
    # fp32 master + Adam m + v; 4 = a recipe that keeps Adam's m and v in bf16 and no master copy); fp32/tf32 runs
    # keep theirs
    optimizer_bytes: np.ndarray | None = None
    # share of the parameters that get gradients and optimizer state (LoRA: the adapters; frozen base weights keep
    # only their 16-bit copy)
    trainable_frac: np.ndarray | None = None
    # what recompute = selective stores (``SELECTIVE_ATTENTION_CORE`` Megatron-LM/Korthikanti: everything but the
    # attention core; ``SELECTIVE_OP_SAC`` torchtitan op-level SAC; ``MAXTEXT_REMAT`` policies: ``_SAVE_LISTS``)
    selective_policy: np.ndarray | None = None
    logits_bytes: np.ndarray | None = None  # bytes per logit element the loss keeps for backward (None: 4, fp32)
    logits_chunks: np.ndarray | None = None  # token chunks the loss runs over (only one chunk's logits live)
    act_offload_frac: np.ndarray | None = None  # share of the stored layer activations offloaded to host memory
    # FSDP with pipeline parallelism (torchtitan): the stage's 16-bit weights stay gathered from forward to backward
    # (``reshard_after_forward=False``) and gradients accumulate unsharded over the micro-batches
    # (torch.distributed.pipelining ``set_requires_gradient_sync(last_backward)``), upcast to ``grad_bytes``
    fsdp_unsharded_stage: np.ndarray | None = None
    # the fixed allowance as ``overhead_frac_of_capacity`` of a ``capacity_gb`` device instead of
    # ``PhysParams.mem_overhead_gb`` (portable; both needed)
    capacity_gb: np.ndarray | None = None
    overhead_frac_of_capacity: np.ndarray | None = None
    # low-precision GEMMs keep their quantized input for backward (``low_precision_saved_inputs``)
    quantized_saves: np.ndarray | None = None
    # weights kept as quantized parameters, no 16-bit copy (``quantized_weights``); ``non_tn_fp8``: the device runs
    # non-TN FP8 GEMMs (no transposed copy)
    fp8_param_gather: np.ndarray | None = None
    non_tn_fp8: np.ndarray | None = None
    # Megatron-Core module recompute bits of selective rows (``RECOMPUTE_MODULE_BITS``, ``module_recompute_savings``)
    recompute_modules: np.ndarray | None = None
    # with ``quantized_saves``: the MoE layers' dispatched token copies are quantized as well
    # (``quantized_dispatch_elems``; DeepSeek-V3 dispatches FP8 tokens)
    quantized_dispatch: np.ndarray | None = None
    # the stack's pipeline schedule (``PIPELINE_SCHEDULES`` codes; None or 0/1: Megatron-style 1F1B)
    pipeline_schedule: np.ndarray | None = None
    # per row, what an unfused attention core keeps of its score matrices, as a multiple of Korthikanti's
    # 5 a s^2 b bytes per layer and micro-batch (``attention_scores_share``; NaN: ``PhysParams.attn_scores_stored``,
    # 0 for the FlashAttention-style kernels of the stacks): a run's own attention backend
    attn_scores_stored: np.ndarray | None = None
    # per row, 1.0 where the run executes the Llama block eagerly with its upcasts (``eager_block_elems``)
    eager_block: np.ndarray | None = None
    # per row, the share of the layers a per-layer selective AC checkpoints whole (torchtitan
    # ``selective_ac_option = n``: every n-th block, 1/n; NaN: the stack's selective policy)
    checkpointed_layer_share: np.ndarray | None = None


NO_OPTIONS = MemoryOptions()


def _schedule_rows(schedule, pp):
    """(DualPipe rows, balanced-interleave rows) among the pipelined rows (pp > 1) of ``MemoryOptions.
    pipeline_schedule`` (``PIPELINE_SCHEDULES``), each None where no row has it."""
    if schedule is None:
        return None, None
    code = np.nan_to_num(_f(schedule)).astype(np.int64)
    piped = _f(pp) > 1
    dual, bal = piped & (code == SCHEDULE_DUALPIPE), piped & (code == SCHEDULE_BALANCED)
    return (dual if np.any(dual) else None), (bal if np.any(bal) else None)


def balanced_first_stage_layers(n_layers, pp, layers_per_stage):
    """Transformer layers on the first (and last) stage of Llama 3's balanced pipeline (``PIPELINE_SCHEDULES``
    ``balanced_interleave``; arXiv:2407.21783 section 3.3.2): the embedding and the output head each take one layer's
    slot, so the L + 2 slots split evenly over pp stages and the first and last stages hold one fewer layer
    (126 layers on 16 stages: 7 on each end, 8 in between). Never more than ``layers_per_stage``."""
    slots = np.ceil((_f(n_layers) + 2.0) / np.maximum(_f(pp), 1.0))
    return np.minimum(np.maximum(slots - 1.0, 1.0), _f(layers_per_stage))


def dualpipe_inflight(pp, n_micro):
    """Micro-batches of one stage's activations a DualPipe rank holds: PP + 1 (deepseek-ai/DualPipe README, the
    memory comparison table), at most the step's micro-batches."""
    return np.maximum(np.minimum(_f(pp) + 1.0, _f(n_micro)), 1.0)


def quantized_dispatch_elems(h, k_r, saved_bytes, lp_frac):
    """Change of a MoE layer's stored elements per token (units of ``_activation_elems``: bytes at 2 B/element)
    when its dispatched token copies are quantized (DeepSeek-V3, arXiv:2412.19437 section 3.3.2: "we quantize the
    activation before MoE up-projections into FP8 and then apply dispatch components, which is compatible with FP8
    Fprop in MoE up-projections"): the k_r copies of h elements, Korthikanti's 2 bytes each in
    ``moe_dispatch_elems``, take ``saved_bytes`` each (the cached FP8 input of the up-projection). 0 where saved_bytes
    is 2."""
    return _f(lp_frac) * (_f(saved_bytes) < 2.0) * (_f(saved_bytes) - 2.0) * _f(h) * _f(k_r)


def memory_per_gpu(x: Inputs, shapes: Mapping[str, np.ndarray], params: PhysParams = DEFAULT,
                   options: MemoryOptions = NO_OPTIONS) -> dict[str, np.ndarray]:
    """Bytes per GPU on the most loaded stage: weights, grads, optimizer, activations, overhead.

    ``x``: the block's decoded inputs, of which the memory model reads the architecture (``arch``, a normalized
    architecture, models.arch.accounting.normalize_arch; ``E``) and the layout (``s``, ``b``, ``m``, ``t``, ``p``,
    ``d``, ``c``, ``e``, ``v``, ``Ls``, ``shard``, ``rc``, ``dt``, ``sp``, ``is_fp32``, ``node``, ``layers_16bit``;
    ``et`` and ``rho`` where the block has routed experts); ``memory_inputs`` builds them without a decoded block.
    ``shapes``: the architecture's layer_shapes. ``params``: bytes per value, the allowance, what attention stores.
    ``options``: what the training stack and the run's recipe set (``MemoryOptions``).
    Returns bytes (not GB) and the in-flight micro-batch count; ``optimizer_params_local`` is the parameter count
    whose optimizer state this GPU holds (optimizer bytes / state bytes).

    Implementation note: few numpy calls per row block (the step-time model's hot path): block-level branches skip
    terms of absent rows (MoE, sharding modes, full recompute); categories are compared as integer codes.

    Parts (one function each): ``_local_params`` (parameters on the stage's GPU, dense and routed experts),
    ``_held_params`` (ZeRO / FSDP / HSDP), ``_weights`` (+ prefetch), ``quantized_weights``, ``_grads_optimizer``,
    ``_activations``, ``_overhead``.
    """
    shard = _sharding_codes(x.shard)
    is_fp32 = np.asarray(x.is_fp32, dtype=bool)
    weight_bytes = 2.0 + 2.0 * is_fp32.astype(np.float64)  # 16-bit, fp32: 4 B (also per activation element)
    any_moe = bool(np.any(shapes["n_moe_layers"] > 0))
    # expert tensor parallelism and the most loaded EP rank's share: read where the block has routed experts
    has_experts = bool(np.any(x.E > 0))
    etp = x.et if has_experts else None
    moe_rho = x.rho if has_experts else None

    dual, balanced = _schedule_rows(options.pipeline_schedule, x.p)
    if balanced is not None:  # Llama 3's balanced stages: the first (and last) stage holds one layer fewer
        x = replace(x, Ls=np.where(balanced, balanced_first_stage_layers(x.arch["n_layers"], x.p, x.Ls), x.Ls))
    local = _local_params(x, shapes, any_moe, etp)
    if dual is not None:  # DualPipe: rank 0 holds the first stage (embedding) and the last (head, MTP) together
        x_first = replace(x, arch={k: a for k, a in x.arch.items() if k != "mtp"}) if x.arch.get("mtp") is not None \
            else x
        first_stage = _local_params(x_first, shapes, any_moe, etp)
        local = {**local, "dense": np.where(dual, local["dense"] + first_stage["dense"], local["dense"]),
                 "expert": np.where(dual, local["expert"] + first_stage["expert"], local["expert"])}
    held = _held_params(x, local, shard, any_moe, None if etp is None else x.t / _f(etp))
    dw, q_out = quantized_weights(local, shard, weight_bytes, options.fp8_param_gather, x.dt, options.non_tn_fp8,
                                  x.layers_16bit, x.arch)
    weights = _weights(x, local, held, shard, is_fp32, weight_bytes, any_moe, options.fsdp_unsharded_stage) + dw
    grads, optimizer, optimizer_params = _grads_optimizer(held, shard, is_fp32, x.m, params, options)
    activations, inflight = _activations(
        x, shapes, local, weight_bytes, any_moe, params, options, moe_rho,
        *_saved_input_bytes(options.quantized_saves, x.dt, x.layers_16bit, x.arch))
    modelled = weights + grads + optimizer + activations
    overhead = _overhead(modelled, params, options)
    total = modelled + overhead
    out = {
        "mem_weights_bytes": weights,
        "mem_grads_bytes": grads,
        "mem_optimizer_bytes": optimizer,
        "mem_activations_bytes": activations,
        "mem_overhead_bytes": overhead,
        "mem_total_bytes": total,
        "inflight_microbatches": inflight,
        "dense_params_local": local["dense"],
        "expert_params_local": local["expert"],
        "optimizer_params_local": optimizer_params,
        **q_out,  # weights held quantized (models.physics.parts.dp_comm)
    }
    if x.arch.get("mtp") is not None and np.any(x.p > 1):  # the first stage, without the MTP modules, may hold more
        first = memory_per_gpu(replace(x, arch={k: a for k, a in x.arch.items() if k != "mtp"}), shapes, params,
                               options)
        use = (x.p > 1) & (first["mem_total_bytes"] > total)
        if dual is not None:  # DualPipe's rank 0 already holds both ends
            use = use & ~dual
        out.update({k: np.where(use, first[k], out[k]) for k in out if k.startswith("mem_") or k.startswith("infl")})
    return out


def memory_inputs(arch: Mapping[str, np.ndarray], *, seq_len, micro_batch, n_micro, tp=1.0, pp=1.0, dp=1.0, cp=1.0,
                  ep=1.0, vpp=1.0, sharding=Sharding.NONE, recompute=Recompute.NONE, sequence_parallel=False,
                  dtype=Dtype.BF16, node_size=8.0, layers_16bit=0.0, etp=None, moe_rho=1.0) -> Inputs:
    """The ``Inputs`` of a memory question asked without a decoded block (a test, a notebook): ``arch`` a normalized
    architecture (models.arch.accounting.normalize_arch), the layout as arrays or scalars (codes: models.core.params
    Sharding, Recompute, Dtype); ``node_size`` the GPUs of one scale-up domain (HSDP's group), ``etp`` None = tp,
    ``moe_rho`` the most loaded EP rank's routed tokens / the mean. The fields only the time model reads (hardware
    rates, traffic) are None."""
    f = lambda v: np.asarray(v, dtype=np.float64)  # noqa: E731
    tp_degree, pp_degree, dtype_code = f(tp), f(pp), np.asarray(dtype, dtype=np.int64)
    given = dict(
        arch=arch, hy=arch.get("hybrid"), L=arch["n_layers"], E=arch["n_experts"], s=f(seq_len), b=f(micro_batch),
        m=f(n_micro), t=tp_degree, p=pp_degree, d=f(dp), c=f(cp), e=f(ep), v=f(vpp),
        Ls=np.ceil(arch["n_layers"] / pp_degree), shard=np.asarray(sharding, dtype=np.int64),
        rc=np.asarray(recompute, dtype=np.int64), dt=dtype_code, sp=np.asarray(sequence_parallel, dtype=bool),
        is_fp32=is_32bit(dtype_code), node=f(node_size), layers_16bit=f(layers_16bit),
        et=tp_degree if etp is None else f(etp), rho=f(moe_rho))
    given["n"] = int(np.broadcast(*(given[k] for k in ("L", "s", "b", "m", "t", "p", "d"))).size)
    return Inputs(**{fl.name: given.get(fl.name) for fl in fields(Inputs)})
