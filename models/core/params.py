"""Physical parameters of the analytical step-time model and the categorical codes.

Every default below names where it comes from. Three kinds of source are used:

* ``derived``  - follows from arithmetic on the data layout of a known implementation
  (e.g. bytes touched by an Adam update); the derivation is in the comment.
* ``published`` - a figure printed in a paper, datasheet or benchmark README that is named.
* ``prior``    - an engineering judgement. It is NOT a measured fact; it is the starting
  value that calibration (``log(measured / analytical)`` fits) is expected to replace.
  Priors are deliberately round numbers so nobody mistakes them for measurements.

``PhysParams`` is frozen; ``to_dict``/``from_dict`` round-trip it so a calibration fit can
store the values it fitted next to the fit version.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

import numpy as np

# ---------------------------------------------------------------------------------------
# Categorical codes used by the array-level API (``predict_arrays``). Strings are encoded
# to these integers outside the hot path; -1 means "unknown / not in the vocabulary".
# Each class below names the codes of one category (``rc == Recompute.FULL``) and its
# ``*_CODES`` dict maps the words a config table uses to them. The names are plain ints,
# not IntEnum members: numpy compares an array with a Python int on its fast path and with
# an int subclass on a slower one, and the model makes dozens of comparisons per block.
# ---------------------------------------------------------------------------------------
class Activation:
    """MLP activation codes (``ACTIVATION_CODES``)."""

    GELU = 0  # two matrices, GPT-style biases
    SWIGLU = 1  # three matrices (gate, up, down), no biases


class Sharding:
    """What the data-parallel group shards (``SHARDING_CODES``); each code shards what the one before it does and
    more (models.memory.model._held_params)."""

    NONE = 0  # nothing: every data-parallel rank holds the whole model state
    ZERO1 = 1  # the optimizer state
    ZERO2 = 2  # the optimizer state and the gradients
    ZERO3 = 3  # also the weights (DeepSpeed: a 16-bit weight partition beside the fp32 master)
    FSDP = 4  # also the weights (PyTorch FSDP: the fp32 sharded parameter is the master, no 16-bit shard)
    HSDP = 5  # as FSDP inside the node, replicated across nodes


class Recompute:
    """Activation recomputation codes (``RECOMPUTE_CODES``; what each repeats: models.core.recompute)."""

    NONE = 0
    SELECTIVE = 1  # the attention core (Megatron-LM), or the stack's save list (models.memory.model)
    FULL = 2  # every layer's forward, from the layer input it stored


class Dtype:
    """Precision of the matmuls (``DTYPE_CODES``)."""

    BF16 = 0
    FP16 = 1
    FP8 = 2
    FP8_CS = 3  # fp8 with per-tensor current scaling
    MXFP8 = 4
    NVFP4 = 5
    FP32 = 6
    TF32 = 7


class TpMode:
    """Tensor-parallel form codes (``TP_MODE_CODES``; models.physics.tp2d)."""

    ONE_D = 0  # Megatron's 1-D split
    TWO_D = 1  # the 2-D weight-stationary grid


ACTIVATION_CODES: Mapping[str, int] = {"gelu": Activation.GELU, "swiglu": Activation.SWIGLU}
SHARDING_CODES: Mapping[str, int] = {
    "none": Sharding.NONE,
    "zero1": Sharding.ZERO1,
    "zero2": Sharding.ZERO2,
    "zero3": Sharding.ZERO3,
    "fsdp": Sharding.FSDP,
    "hsdp": Sharding.HSDP,
}
RECOMPUTE_CODES: Mapping[str, int] = {"none": Recompute.NONE, "selective": Recompute.SELECTIVE, "full": Recompute.FULL}
DTYPE_CODES: Mapping[str, int] = {
    "bf16": Dtype.BF16,
    "fp16": Dtype.FP16,
    "fp8": Dtype.FP8,
    "fp8-cs": Dtype.FP8_CS,
    "mxfp8": Dtype.MXFP8,
    "nvfp4": Dtype.NVFP4,
    "fp32": Dtype.FP32,
    "tf32": Dtype.TF32,
}
TP_MODE_CODES: Mapping[str, int] = {"1d": TpMode.ONE_D, "2d": TpMode.TWO_D}
#: the low-precision formats (the fp8 family and nvfp4): GEMMs at the 8-bit efficiency, "low precision" in the
#: residual and interval features
LOW_PRECISION_DTYPES = ("fp8", "fp8-cs", "mxfp8", "nvfp4")
_LOW_CODES = np.array([DTYPE_CODES[d] for d in LOW_PRECISION_DTYPES])


def is_low_precision(dtype_code) -> np.ndarray:
    """Rows whose dtype code (DTYPE_CODES) is one of LOW_PRECISION_DTYPES."""
    return np.isin(dtype_code, _LOW_CODES)


def is_32bit(dtype_code) -> np.ndarray:
    """Rows whose dtype code is fp32 or tf32: 4-byte weights and activations, GEMMs at the 32-bit efficiency."""
    return (dtype_code == Dtype.FP32) | (dtype_code == Dtype.TF32)


def is_unknown_code(code: np.ndarray, codes: Mapping[str, int]) -> np.ndarray:
    """Rows whose integer code is none of ``codes`` (a ``*_CODES`` dict, codes 0..n-1)."""
    return (code < 0) | (code > len(codes) - 1)


@dataclass(frozen=True)
class PhysParams:
    """Named constants of the analytical model (see docs/model.md for the formulas)."""

    # --- compute -------------------------------------------------------------------
    # Fraction of the dense tensor-core peak a large, well-shaped GEMM sustains.
    # prior: cuBLAS/CUTLASS large-GEMM benchmarks typically land at 70-90 % of the dense
    # datasheet peak for 16-bit on A100/H100; end-to-end Megatron-LM reaches 52 % HFU
    # (Narayanan et al. 2021, Table 1) which bounds it from below. To be fitted.
    matmul_eff_16bit: float = 0.80
    # prior: FP8/FP4 GEMMs reach a smaller fraction of their (2x) peak than BF16 does (their
    # quantize kernels are timed on their own: models.physics.parts.quantize_casts).
    matmul_eff_8bit: float = 0.70
    # prior: FP32/TF32 (and fp32-only parts without tensor cores).
    matmul_eff_32bit: float = 0.80
    # published: FlashAttention-2 (Dao 2023) reports 50-73 % of A100 peak in the forward
    # pass and less in the backward; the low end is used for fwd+bwd.
    attn_eff: float = 0.50
    # Fraction of the square causal attention work actually executed by the kernel.
    # The FLOP *convention* always counts the full square (docs/model.md); this only changes
    # the predicted kernel time. derived 0.5: causal FlashAttention (Dao 2022/2023) skips
    # the fully masked key blocks, i.e. about half of the square; Megatron-LM 2021/2022
    # fused-softmax kernels compute the full masked square (1.0, see MEGATRON_2022).
    attn_causal_work_fraction: float = 0.5
    # Kernel efficiency of the software stack, relative to a fused TransformerEngine-class stack (Megatron-Core,
    # NeMo, NVIDIA's MLPerf submissions: fused norm/GEMM/RoPE/softmax kernels, cuDNN or FlashAttention-3
    # attention on Hopper). Multiplies every kernel rate (GEMM, attention, memory-bound). derived 1.0: the
    # reference stack by definition; stacks built on PyTorch-native kernels (torchtitan, FSDP, llm-foundry:
    # SDPA's FlashAttention-2, unfused elementwise kernels) get a fitted value (software preset
    # `pytorch_native`, `models.corpus.runs_adapter`), a fraction that means the same on every device.
    kernel_eff: float = 1.0
    # Achieved fraction of the HBM datasheet bandwidth for streaming kernels.
    # prior: STREAM-like copies reach ~85-92 % of HBM peak on A100/H100 class parts.
    hbm_eff: float = 0.85
    # GEMM efficiency ramps with the size of the GEMM: eff(w) = matmul_eff * w / (w + w_half), w = FLOPs of
    # one GEMM, i.e. each GEMM call is charged w_half extra FLOPs. The loss is tile and wave quantisation
    # (the partial last wave of output tiles over the streaming multiprocessors, prologue/epilogue), so
    # w_half is about half a wave of tile work: proportional to the number of SMs (compute units) the
    # GEMM must fill. Stated PER SM, w_half = gemm_ramp_flops_per_sm * sm_count, it means the same on every
    # device (a FLOP or a time per GEMM would not: it would charge a 16-SM GTX 580 for a 132-SM H100's
    # wave). prior: NVIDIA "Matrix Multiplication Background" (Deep Learning Performance Guide) shows A100
    # (108 SMs) 16-bit GEMMs of about 1024^3 (2 GFLOP) well below half the large-GEMM throughput, so
    # w_half ~ 1 GFLOP / 108 SMs ~ 1e7 FLOP per SM. Fitted.
    gemm_ramp_flops_per_sm: float = 1e7
    # Host-side (CPU) cost of issuing one GPU operation: Python + framework dispatch +
    # kernel launch. The CPU runs ahead of the GPU, so per micro-batch the model takes
    # max(GPU time, host time) - the overhead only shows when kernels are small.
    # prior: PyTorch eager dispatch + CUDA launch is ~5-20 us per op (PyTorch profiler
    # "CPU total" of small ops; CUDA launch latency ~5 us); fitted per software era.
    host_overhead_s_per_op: float = 10e-6
    # derived: GPU operations issued per transformer layer in the forward pass of one
    # micro-batch: 2 norms, QKV GEMM, bias/rotary/split, attention core (1 fused flash
    # kernel, or bmm + scale-mask-softmax + dropout + bmm), output GEMM, bias-dropout-add,
    # FC1, activation, FC2, bias-dropout-add, 2 TP collectives, casts/copies ~ 20.
    # Backward issues ``elementwise_bwd_factor`` (2) x as many; full recompute + 1 forward,
    # selective recompute + ``ops_attn_core_fwd``.
    ops_per_layer_fwd: float = 20.0
    # derived: the unfused attention core of Megatron-LM 2022 (bmm, scale-mask-softmax,
    # dropout, bmm) is 4 ops.
    ops_attn_core_fwd: float = 4.0
    # derived: element-wise HBM traffic per token per layer in the forward pass, in units
    # of d_model elements, without dropout (2 LayerNorms read+write 4, 2 residual adds
    # 2x(2 read + 1 write) = 6, bias adds ~ 1): 11 x d_model. Dropout adds
    # ``elementwise_elems_per_dropout`` per mask of ``dropout_mask_elems`` (16 x d_model
    # with Megatron GPT's 2 hidden dropouts, MEGATRON_2022), so the time model counts the
    # dropouts the memory model stores and no others.
    elementwise_h_elems_fwd: float = 11.0
    # derived: one dropout reads and writes its 2-byte input (2 elements) and writes a
    # 1-byte mask (half an element): 2.5 x d_model per mask.
    elementwise_elems_per_dropout: float = 2.5
    # derived: per ffn element, GeLU reads + writes (2); SwiGLU reads 2 writes 1 (3).
    elementwise_f_elems_gelu: float = 2.0
    elementwise_f_elems_swiglu: float = 3.0
    # derived: backward element-wise traffic is ~2x forward (reads saved input and grad,
    # writes grad).
    elementwise_bwd_factor: float = 2.0

    # --- communication ---------------------------------------------------------------
    # prior: fraction of the per-direction scale-up (NVLink/IF/ICI) bandwidth reached as
    # NCCL "bus bandwidth" on large messages (nccl-tests on DGX A100 report ~230 GB/s of
    # 300 GB/s for all_reduce). To be fitted per fabric.
    scaleup_eff: float = 0.75
    # prior: fraction of the per-GPU scale-out NIC bandwidth reached by large collectives
    # (InfiniBand/RoCE typically 85-95 % of line rate in nccl-tests).
    scaleout_eff: float = 0.85
    # prior: per-step latency (alpha) of a collective algorithm step inside the scale-up
    # domain and across the network (order of NCCL small-message latencies).
    alpha_scaleup_s: float = 3e-6
    alpha_scaleout_s: float = 10e-6
    # The PCIe/host tier: the scale-up domain of a part whose accelerators talk over PCIe (and the host), not
    # NVLink/xGMI/ICI (models.physics.hardware `scaleup_link` == "pcie": GTX 580, GTX 1080 Ti, K80, A100/H100 PCIe, H100
    # NVL, L40S, RTX 4090). `scaleup_eff` and `alpha_scaleup_s` (fitted on NVLink/xGMI/ICI runs) do not apply
    # there; these two do, as the fraction of `intra_node_bw_gbps` and the per-step latency. Priors, not fitted:
    # the corpus (measurements/measured_runs.csv) holds no run on a PCIe-only part.
    # published: NCCL models a PCIe link as width x per-lane rate / 80 GB/s with 60 / 120 / 240 (x 100 Mb/s per
    # lane) for 8 / 16 / 32 GT/s (NVIDIA/nccl src/graph/topo.cc, kvDictPciGen; topo.h `PCI_BW 12.0 // PCI Gen3
    # x16`), i.e. 6 / 12 / 24 / 48 GB/s for Gen2 / Gen3 / Gen4 / Gen5 x16: 0.75 of the per-direction datasheet
    # rate the hardware table holds (8 / 16 / 32 / 64 GB/s), the same fraction on every generation. Measured
    # all-reduce bus bandwidth of eight PCIe cards is lower when the ring crosses the CPU root complex or
    # sockets (NVIDIA/nccl issue 1639: 8 x RTX 5090, Gen5 x16, 28 GB/s = 0.44 of 64; 4 cards 35 GB/s).
    pcie_eff: float = 0.75
    # published: NCCL's per-step hardware latency of a ring (Simple protocol, the one large messages use) over
    # PCI, 5.7 us, against 3.4 us over NVLink (NVIDIA/nccl src/graph/tuning.cc, `hwLatencies`: PCI ring
    # LL / LL128 / Simple 1.0 / 2.5 / 5.7 us, NVLINK 0.6 / 1.9 / 3.4; tree Simple 4.0 on both).
    alpha_pcie_s: float = 5.7e-6
    # prior: fraction of tensor-parallel communication hidden behind GEMMs. 0 = Megatron-LM
    # 2021/2022 (blocking all-reduce); TE userbuffer overlap in newer stacks -> fitted.
    tp_overlap: float = 0.0
    # prior: fraction of the final gradient reduction hidden behind the backward compute
    # of the last micro-batch (Megatron-Core overlap_grad_reduce, DDP buckets).
    dp_overlap: float = 0.5
    # prior: fraction of ZeRO-3/FSDP parameter all-gathers hidden behind compute by
    # prefetching (FSDP forward/backward prefetch).
    fsdp_gather_overlap: float = 0.8
    # prior: fraction of pipeline point-to-point hidden behind compute.
    pp_overlap: float = 0.0
    # prior: fraction of MoE all-to-all hidden behind compute (0 = no overlap).
    ep_overlap: float = 0.0
    # Tokens the most loaded expert-parallel rank receives, as a multiple of the mean (>= 1): scales that rank's
    # routed-expert GEMMs, routed activations and all-to-all volume (the step waits for it; models.arch.moe). derived
    # 1.0 = balanced: no published per-rank max/mean of dropless training was found (models.arch.moe docstring), and
    # the Megatron-Bridge MoE benchmarks of the corpus force balanced routing. A calibration candidate (not in
    # FITTABLE_BOUNDS: no run in the corpus identifies it).
    moe_imbalance: float = 1.0
    # Stragglers and jitter: the coefficient of variation of one accelerator's compute time per step across the
    # accelerators of a job. Every step synchronizes all N of them (the gradient reduction, the pipeline's
    # hand-offs), so the step runs at the pace of the slowest: compute x (1 + cv x E[max of N standard normals])
    # (models.physics.parts.straggler). published: PRISM (Golden et al. 2025, arXiv 2510.15596) measured 9% GPU
    # time variability at 64k GPUs of a frontier training job (up to 14% on GEMM microbenchmarks); read as the
    # expected range of 65,536 normal draws (8.2 standard deviations), cv = 0.09 / 8.2 = 0.011. Not fitted: the
    # corpus's series are few and noisy at the ends that would identify it (docs/scaling.md).
    straggler_cv: float = 0.011

    # --- memory ----------------------------------------------------------------------
    # derived: bytes per gradient element held during accumulation. Megatron-LM keeps
    # fp32 ``main_grad`` buffers (accumulate_allreduce_grads_in_fp32); ZeRO's 16 B/param
    # accounting (Rajbhandari et al. 2020) uses 2-byte grads: set 2.0 to reproduce it.
    grad_bytes: float = 4.0
    # derived: bytes per gradient element on the wire for the DP reduction (fp32 main
    # grads in Megatron-LM; PyTorch FSDP MixedPrecision 'DEFAULT' reduce_dtype fp32).
    grad_reduce_bytes: float = 4.0
    # derived: mixed-precision Adam keeps fp32 master weights + m + v = 12 B/param
    # (Rajbhandari et al. 2020, section 3.1, K = 12).
    optimizer_state_bytes_mixed: float = 12.0
    # derived: fp32 training keeps only m + v (weights are already fp32).
    optimizer_state_bytes_fp32: float = 8.0
    # derived: HBM bytes touched per locally-updated parameter by one Adam step: read
    # fp32 grad 4 + read/write master 8 + m 8 + v 8 + write 16-bit weight 2 = 30.
    optimizer_update_bytes: float = 30.0
    # prior: fixed per-GPU allocation outside the model: CUDA context (~0.3-0.5 GB on
    # A100/H100 with lazy module loading), NCCL buffers and cuBLAS workspaces (~0.5 GB).
    mem_overhead_gb: float = 1.0
    # prior: caching-allocator fragmentation and temporary buffers as a fraction of the
    # modelled bytes. Bounded by measurement: llm-foundry runs that ran at the edge of
    # 40/80 GB (MPT-1b mb 10 on A100-40GB, MPT-3b seq 8192 on 80 GB) leave 3-6 % above the
    # modelled bytes, so 0.05 (a larger allowance calls some of them infeasible although they ran).
    mem_fragmentation_frac: float = 0.05
    # Whether the attention score/softmax/dropout tensors (Korthikanti's 5as/h term, and
    # their element-wise HBM traffic) are materialised: 0 = FlashAttention-style kernels
    # (Dao 2022; the default attention of Megatron-Core/TE, PyTorch SDPA, llm-foundry,
    # torchtitan), 1 = Megatron-LM 2021/2022 fused softmax (see MEGATRON_2022).
    attn_scores_stored: float = 0.0

    # Dropout-mask bytes per token per layer, in units of d_model (Korthikanti et al. 2022,
    # section 4.1: attention-output and MLP-output dropout masks, 1 byte per element each =
    # 2 h of their 34 s b h). derived: 2 for GPT-style training with hidden dropout
    # (MEGATRON_2022); 0 for recipes trained without dropout (Llama; MPT resid_pdrop = 0;
    # torchtitan; Megatron-Bridge/NeMo Llama recipes hidden_dropout = 0).
    dropout_mask_elems: float = 0.0

    def to_dict(self) -> dict[str, float]:
        # the fields in order, as `asdict` gives them (without its deep copy: every field is a number)
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PhysParams":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown PhysParams fields: {sorted(unknown)}")
        return cls(**{k: float(v) for k, v in d.items()})

    def with_(self, **kw: float) -> "PhysParams":
        return replace(self, **kw)


DEFAULT = PhysParams()

# Megatron-LM as used by Narayanan et al. 2021 and Korthikanti et al. 2022: materialised
# attention scores with a full-square fused softmax kernel, blocking gradient all-reduce
# after the last micro-batch (no DP overlap). Only these documented software differences
# change; the hardware-efficiency priors are the same as DEFAULT.
MEGATRON_2022 = DEFAULT.with_(attn_scores_stored=1.0, attn_causal_work_fraction=1.0, dp_overlap=0.0,
                              dropout_mask_elems=2.0)

# Fields a calibration fit may move, with their bounds (physically meaningful ranges).
# Everything else in PhysParams is derived from an implementation or a paper and stays put.
FITTABLE_BOUNDS: Mapping[str, tuple[float, float]] = {
    "matmul_eff_16bit": (0.3, 0.95),
    "matmul_eff_8bit": (0.2, 0.95),
    "attn_eff": (0.15, 0.9),
    "kernel_eff": (0.3, 1.2),
    "gemm_ramp_flops_per_sm": (1e5, 2e9),
    "host_overhead_s_per_op": (1e-7, 2e-4),
    "scaleup_eff": (0.2, 0.95),
    "scaleout_eff": (0.1, 0.95),
    "alpha_scaleup_s": (1e-7, 1e-4),
    "alpha_scaleout_s": (1e-7, 2e-4),
    "tp_overlap": (0.0, 0.9),
    "dp_overlap": (0.0, 0.95),
    "fsdp_gather_overlap": (0.0, 0.98),
    "straggler_cv": (0.0, 0.05),
}
