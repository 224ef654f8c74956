"""The decoded inputs of one block of configurations, as the step-time and memory models read them.

``models.physics.step_time`` decodes a block of input arrays into ``Inputs`` (documented defaults filled, categories as
integer codes, hardware rates with their efficiencies applied); ``models.physics.parts`` (the time model's parts) and
``models.memory.model`` (per-GPU memory) read it. Single-letter fields follow the formulas' notation (Korthikanti et
al. 2022: s sequence length, b micro-batch, h d_model; t, p, d, c, e, v the tp, pp, dp, cp, ep, vpp degrees); each
field's comment says what it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np


@dataclass(slots=True)
class Inputs:
    """Decoded inputs of one block of configurations (``models.physics.step_time._decode``): architecture, layout,
    hardware, network. The time model's parts (models.physics.parts) and the memory model
    (models.memory.model.memory_per_gpu, which reads the architecture and layout fields) read the same object.
    Category fields hold integer codes (models.core.params: Sharding, Recompute, Dtype, TpMode, Activation)."""

    n: int
    arch: Mapping[str, np.ndarray]  # normalized architecture (models.arch.accounting.normalize_arch)
    hy: Mapping[str, np.ndarray] | None  # hybrid Mamba-Transformer arrays (models.arch.mamba); None: no hybrid row
    # architecture
    L: np.ndarray  # layers
    h: np.ndarray  # d_model
    heads: np.ndarray
    kvh: np.ndarray  # key/value heads
    V: np.ndarray  # vocabulary
    E: np.ndarray  # routed experts (0: dense)
    k: np.ndarray  # top_k
    ns: np.ndarray  # shared experts
    act: np.ndarray  # activation code (0 GeLU, 1 SwiGLU)
    # layout
    s: np.ndarray  # sequence length
    B: np.ndarray  # global batch (sequences)
    b: np.ndarray  # micro-batch (sequences)
    N: np.ndarray  # GPUs
    t: np.ndarray  # tp
    p: np.ndarray  # pp
    d: np.ndarray  # dp
    c: np.ndarray  # cp
    e: np.ndarray  # ep
    v: np.ndarray  # vpp
    m: np.ndarray  # micro-batches per step = B / (d b)
    Ls: np.ndarray  # layers per stage = ceil(L / p)
    shard: np.ndarray  # sharding code (models.core.params.SHARDING_CODES)
    rc: np.ndarray  # recompute code
    dt: np.ndarray  # dtype code
    sp: np.ndarray  # sequence parallel (bool; always on for 2-D tensor-parallel rows)
    tp_mode: np.ndarray  # tensor-parallel form code (models.core.params.TP_MODE_CODES: 0 Megatron 1-D, 1 the 2-D grid)
    tp2d: np.ndarray | None  # 2-D tensor-parallel rows (models.physics.tp2d); None: no such row in the block
    grid2d: tuple | None  # models.physics.tp2d.grid(t), computed once per block; None when there is no 2-D row
    is_fp32: np.ndarray
    # hardware (efficiencies applied)
    mem_cap: np.ndarray  # memory_gb
    ke: np.ndarray | float  # kernel efficiency of the software stack
    tp_ov: np.ndarray | float  # share of TP traffic that may hide behind compute (``overlap``; 1 on TPUs)
    gemm_eff: np.ndarray  # GEMM efficiency of the row's dtype
    head_16bit: np.ndarray  # the LM head runs in 16 bits (low-precision recipes; ``lm_head``)
    layers_16bit: np.ndarray  # layers a low-precision recipe keeps in 16 bits (``layers_kept_in_16bit``; 0: none)
    gemm_eff_16: np.ndarray  # the row's 16-bit GEMM efficiency
    hbm_bw: np.ndarray  # bytes/s
    sm: np.ndarray  # SM count (A100-equivalent when not given)
    peaks: np.ndarray  # peak table (models.physics.hardware.peak_table)
    peak_tf: np.ndarray  # TFLOPS of the row's dtype
    peak_fb: np.ndarray  # peak fell back to another dtype's
    attn_peak_tf: np.ndarray  # TFLOPS of the attention core (16-bit, fp32 for fp32 runs)
    # network
    node: np.ndarray  # GPUs of one scale-up domain (<= n_gpus): the size of the network's first tier
    # the network's tiers, inner to outer (models.physics.network.Tier: size, bandwidths per accelerator in bytes/s
    # with efficiencies applied, latency per step, oversubscription), built by models.physics.network.build
    net: tuple
    net_bad: np.ndarray  # rows whose network columns are invalid (an oversubscription < 1, a pod below the domain)
    # MoE options (models.arch.moe)
    et: np.ndarray  # expert tensor-parallel degree (tp by default; tp for dense rows)
    moe_cf: np.ndarray  # capacity factor (NaN: dropless)
    rho: np.ndarray | float  # the most loaded EP rank's routed tokens / the mean (1.0: balanced)
    a2a: np.ndarray | float  # passes run merged with another micro-batch's by the EP A2A overlap (0: no overlap)
    flex: np.ndarray | bool  # the flex dispatcher (DeepEP/HybridEP; models.arch.moe.DISPATCHER_FLEX); False: all-to-all
    # Megatron-Core recompute_modules bits (models.memory.model.RECOMPUTE_MODULE_BITS); None: no row has them
    rc_modules: np.ndarray | None = None
    save_list: np.ndarray | None = None  # selective_policy codes a row states (models.memory.model); None: no row does
    # share of the GEMM weights whose gradient the backward computes (``compute``, ``dp_comm``): 1.0, or a LoRA
    # run's trainable share (its frozen base weights get no weight-gradient GEMM and no gradient traffic)
    wgrad: np.ndarray | float = 1.0
    # rows whose stack all-gathers quantized GEMM inputs under sequence parallelism (``quantized_gather_share``: the
    # TransformerEngine presets); None: no such row
    quantized_gather: np.ndarray | None = None
    # rows compiled by XLA (a TPU, or an XLA stack such as MaxText on a GPU), whose full recompute skips the layer's
    # last GEMM (``remat_skipped_gemm``); None: no such row
    xla: np.ndarray | None = None
