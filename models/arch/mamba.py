"""Hybrid Mamba-Transformer blocks (Nemotron-H, Nemotron 3, Jamba): block counts, Mamba-2 and Mamba-1 mixer shapes,
FLOPs, bytes, activations and tensor/context-parallel traffic (pure, vectorized over configurations).

A hybrid is a stack of single-mixer blocks (Nemotron-H, arXiv:2504.03624; Megatron-Core MambaStack /
`hybrid_override_pattern`): each block is RMSNorm -> one mixer -> residual add, the mixer being a Mamba layer
(M), self-attention (*), a dense MLP (-) or a MoE layer (E); `layer_pattern` has one character per block and
n_layers counts blocks. A transformer layer is two such blocks (attention + MLP), and so is a Jamba layer (a
Mamba or attention mixer, then an MLP or MoE: 32 Jamba layers are 64 blocks). The Mamba blocks of a row are
Mamba-1 (selective scan; Jamba) when the row gives `mamba_dt_rank`, else Mamba-2 (SSD; Nemotron): see
"Mamba-1 mixer" below.

Mamba-2 mixer (Megatron-Core megatron/core/ssm/mamba_mixer.py `MambaMixer`; Dao & Gu 2024, "Transformers are
SSMs", arXiv:2405.21060), with H heads of head dim P, d_inner = H*P, G groups of B/C, state size N, conv width K:

    in_proj   d_model -> 2*d_inner + 2*G*N + H   (z, x, B, C, dt; ColumnParallelLinear, no bias)
    conv1d    depthwise over conv_dim = d_inner + 2*G*N channels, K taps + bias
    dt_bias, A_log, D: H each; gated RMSNorm gain: d_inner
    out_proj  d_inner -> d_model                  (RowParallelLinear, no bias)

Tensor parallelism splits heads and groups (nheads % tp == 0 and ngroups % tp == 0 are asserted in MambaMixer):
per block one column-parallel / row-parallel pair, i.e. the all-reduce (or AG + RS with sequence parallelism)
pattern of one MLP. Context parallelism (megatron/core/ssm/mamba_context_parallel.py `MambaContextParallel`):
all-to-all of z, x, B, C, dt from sequence- to head-sharding before the conv/scan (`_all_to_all_cp2hp`) and of
the scan output back (`_all_to_all_hp2cp`); B and C are repeated cp / (G/tp) times when a CP rank holds less
than one group; nheads % (tp*cp) == 0 is required.

SSD FLOPs (forward, per token, per layer), derived from the four steps of the SSD algorithm (Dao & Gu 2024,
section 6, chunk length Q): intra-chunk C B^T per group 2*Q*N*G and its product with X per head 2*Q*P*H;
chunk states B^T X 2*N*P*H; state passing between chunks 2*N*P*H/Q; state-to-output C h 2*N*P*H:

    ssd_fwd = 2*Q*N*G + 2*Q*P*H + 4*N*P*H + 2*N*P*H/Q

(Megatron-LM training.py `mamba_layer_flops` uses the coarser 7*d_inner*N for the scan: 7.3e6 against 6.6e6
for Nemotron-H 8B.) The SSD kernels are batched matmuls on tensor cores in 16 bits (the point of SSD, section 6;
FP8 recipes cast only the Linear layers), so the scan is timed as a roofline of these FLOPs at the 16-bit peak
times the fused-attention efficiency and of the bytes the kernels move.

SSD traffic (state-spaces/mamba mamba_ssm/ops/triton/ssd_*.py, as Megatron-Core's MambaMixer calls
`mamba_split_conv1d_scan_combined` without the norm and out_proj weights: z enters the scan, which writes the
gated output and the ungated out_x; the RMSNorm then runs on its own, ungated). Per token and layer, with
d = H*P, g = G*N, c = G*Q (C B^T), s = H*P*N/Q (chunk states), A bytes per activation and 4 per fp32 value, each
kernel reading each input once and writing each output once (repeats across a launch's programs are taken to hit
L2):

    forward  (_mamba_chunk_scan_combined_fwd: cumsum, chunk states, state passing to 16-bit states, C B^T in
              fp32, chunk scan reading C B^T, x, z, C, states, dt and writing out and out_x)
             = A*(5d + 4g) + (A + 24)*H + 8c + (8 + 2A)*s         (10d + 8g + 26H + 8c + 12s at A = 2)
    backward (_mamba_chunk_scan_combined_bwd: the forward's cumsum, C B^T, chunk states and state passing
              recomputed in fp32, then dz, dstates, state-passing backward, dx/ddt, dB, dC, dCB and the two
              C B^T backward products, ddA cumsums)
             = (A/2)*(34d + 54g) + 32c + 34s + 174*H

The backward moves about 3x the forward (Nemotron-H 56B at tp 1: 0.59 MB forward, 1.86 MB backward per token
and layer, two thirds of it chunk states); its FLOPs are taken as 2x the forward's, as for every block.

Mamba-1 mixer (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces",
arXiv:2312.00752; mamba_ssm/modules/mamba_simple.py `Mamba`; Jamba: Hugging Face transformers
models/jamba/modeling_jamba.py `JambaMambaMixer`), d_inner = expand * d_model, state size N, conv width K, dt
rank R:

    in_proj   d_model -> 2*d_inner                (x, z; Jamba mamba_proj_bias false: no bias)
    conv1d    depthwise over d_inner channels, K taps + bias (mamba_conv_bias true)
    x_proj    d_inner -> R + 2*N                  (dt, B, C; no bias)
    dt/B/C RMSNorms (Jamba only: dt_layernorm R, b_layernorm N, c_layernorm N gains)
    dt_proj   R -> d_inner                        (+ bias d_inner, added inside the scan kernel)
    A_log     d_inner x N;  D: d_inner
    out_proj  d_inner -> d_model                  (no bias)

matmul weights h*2*d_inner + d_inner*(R + 2N) + R*d_inner + d_inner*h; other parameters d_inner*(K+1) (conv) +
d_inner (dt bias) + d_inner*N (A_log) + d_inner (D) + R + 2N (Jamba's norms; 2N + R more than plain Mamba-1:
288 of 105.3 M per Jamba mixer). Jamba v0.1: 105,308,448 per mixer; 51.57 B total, 12.11 B active (published 52 B /
12 B, Lieber et al. 2024, arXiv:2403.19887).

Selective scan (the recurrence h_t = exp(dt A) h_t-1 + dt B_t x_t, y_t = C_t h_t + D x_t, gated by silu(z)), forward
FLOPs per token and layer: per channel and state element exp's argument dt*A (1), the exponential (counted 1),
B*(dt*x) (1), the state update (2: multiply-add) and C*h (2: multiply-add) = 7; per channel softplus(dt + bias) (2),
dt*x (1), + D*x (2), silu(z) (2) and the gate product (1) = 8:

    scan_fwd = d_inner * (7*N + 8)

(Megatron-LM's mamba_layer_flops counts the same 7*d_inner*N for its scan.) It is a recurrence, not a matmul: the
mamba_ssm selective_scan_fwd CUDA kernel runs it element-wise on the CUDA cores in fp32 (no tensor cores), each
thread block holding one slice of channels with its d_inner x N state in registers / SRAM ("hardware-aware"
scan, paper section 3.3: load dt, A, B, C from HBM to SRAM, discretize and scan there, write only the (B, L, D)
output). It is timed as a roofline of these FLOPs at the fp32 non-tensor peak (`peak_fp32_tflops`; a part
without one: 1/16 of its 16-bit tensor peak, the A100 and H100 ratio) times the fused-kernel efficiency
`attn_eff`, and of the HBM bytes the kernel moves: u (the conv output), dt, z read and out, out_z written
(16-bit; the kernel writes the ungated `out` as well, saved for backward), B, C read (2N), and the fp32 chunk-
boundary states (2*d_inner*N per 2048-token chunk, kChunkSize) written. Jamba: 82.5 kB and 0.98 MFLOP per token
and layer (before the tp split), on an H100 at the default efficiencies 29.0 ns of HBM traffic against 29.4 ns of
fp32 arithmetic: the two sides of the roofline are about equal. Backward 2x the forward, as for every block.

Mamba-1 TP: no training framework for Jamba is published (Lieber et al. 2024 name an in-house framework with
FSDP, tensor, sequence and expert parallelism, not the layout). Modelled on the one public tensor-parallel Mamba-1
layout, vLLM's `MambaMixer` (vllm/model_executor/layers/mamba/mamba_mixer.py, which serves Jamba): in_proj, conv1d
and dt_proj column-parallel over d_inner, A and D split over d_inner, x_proj and out_proj row-parallel. So d_inner
must divide by tp, each block does the block's usual h-wide collective pair, and x_proj's row-parallel output (R +
2N per token, replicated) is all-reduced in forward; in backward the gradients of the replicated dt (into
dt_proj) and of B, C (each rank scans only its channels) are all-reduced the same size: one more (R + 2N)-wide
all-reduce per block and pass, over the whole sequence of the micro-batch (not sequence-sharded).
Mamba-1 CP: refused (cp > 1 is an invalid layout for Mamba-1 rows): no context-parallel selective scan is
published (Megatron-Core's MambaContextParallel is for its Mamba-2 mixer).

Mamba-1 activations (training, per token and layer, 16-bit unless noted): the Jamba mixer cannot use mamba_ssm's
fused `mamba_inner_fn` (the dt/B/C norms sit between x_proj and the scan, transformers' comment), so each op
saves its inputs: the in_proj output 2*d_inner (x as the conv input and z, both views of it), the conv output u
(d_inner; also x_proj's input), x_proj's output dt, B, C (R + 2N, the norms' inputs) and the normed dt, B, C (R +
2N; dt_proj's input and the scan's B, C), dt_proj's output delta (d_inner), the scan's `out` (d_inner) and
out_z (d_inner, out_proj's input), and the fp32 chunk states x (`SelectiveScanFn.save_for_backward(u, delta, A,
B, C, D, z, delta_bias, x, out)`); the scan's per-step states are recomputed in backward from x (paper section
3.3, recomputation). The R + 2N tensors are replicated over tp but counted as split with the rest (1.2 % of
Jamba's 100.0 kB per token and Mamba layer).
"""

from __future__ import annotations

import numpy as np
import polars as pl

#: block counts derived from layer_pattern (one character per block)
COUNT_COLUMNS = ("n_mamba_layers", "n_attn_layers", "n_mlp_layers", "n_moe_layers")
PATTERN_CHARS = {"n_mamba_layers": "M", "n_attn_layers": "*", "n_mlp_layers": "-", "n_moe_layers": "E"}
#: architecture columns of the Mamba mixer and of the Nemotron 3 MoE blocks, carried for hybrid rows
SHAPE_COLUMNS = ("mamba_state_dim", "mamba_n_heads", "mamba_head_dim", "mamba_n_groups", "mamba_chunk_size",
                 "mamba_conv_kernel", "shared_expert_ffn_dim", "moe_latent_size", "mamba_dt_rank", "mamba_expand")
#: every numeric hybrid input of the step-time model
HYBRID_COLUMNS = COUNT_COLUMNS + SHAPE_COLUMNS
#: Megatron-Core MambaMixer defaults (megatron/core/ssm/mamba_mixer.py: chunk_size=128, d_conv=4), used when
#: a row leaves them empty (the Nemotron-H 47B/56B rows; the 8B config states the same values)
DEFAULT_CHUNK = 128.0
DEFAULT_CONV_KERNEL = 4.0
#: fp32 bytes of the SSD kernels' chunk states and C B^T (mamba_ssm ssd_combined.py: float32 states and CB)
FP32_BYTES = 4.0
#: Mamba-1: mamba_ssm `Mamba` default expand (a row with mamba_dt_rank and no mamba_expand), the selective scan
#: kernel's chunk of tokens per saved state (csrc/selective_scan: kChunkSize = kNThreads * kNItems = 2048), and the
#: 16-bit tensor peak / fp32 non-tensor peak of the A100 and H100 (312 / 19.5, 989 / 67), used when a part has no
#: fp32 peak (module docstring)
DEFAULT_EXPAND = 2.0
SCAN_CHUNK = 2048.0
TENSOR_TO_FP32_VECTOR = 16.0
#: bytes per head per token of the SSD backward's small fp32 per-head tensors (dt, dA cumsum and their gradients,
#: the atomic partial sums and the flip/cumsum of ddA: 158 + 8 Q/BLOCK_M, with the 128-token chunk and a 64-row
#: block), module docstring "SSD traffic"
SSD_BWD_BYTES_PER_HEAD = 174.0


def pattern_count_exprs(col: str = "layer_pattern") -> list[pl.Expr]:
    """Polars expressions for COUNT_COLUMNS from a layer_pattern column (null pattern -> null counts)."""
    s = pl.col(col).cast(pl.Utf8).str.strip_chars()
    return [s.str.count_matches(ch, literal=True).cast(pl.Float64).alias(name)
            for name, ch in PATTERN_CHARS.items()]


def pattern_counts(pattern) -> dict[str, float]:
    """COUNT_COLUMNS of one pattern string (NaN when no pattern): for architecture dicts."""
    if pattern is None or not str(pattern).strip():
        return {name: np.nan for name in COUNT_COLUMNS}
    p = str(pattern).strip()
    return {name: float(p.count(ch)) for name, ch in PATTERN_CHARS.items()}


def mixer_shapes(d_model, n_heads, head_dim, n_groups, state_dim, conv_kernel) -> dict[str, np.ndarray]:
    """Mamba-2 mixer widths and parameters (module docstring): d_inner, in_proj_out, conv_dim, matmul (in_proj
    + out_proj weights) and other (conv weight + bias, dt_bias, A_log, D, gated-norm gain) parameters."""
    d_inner = n_heads * head_dim
    bc = 2.0 * n_groups * state_dim
    in_out = 2.0 * d_inner + bc + n_heads
    conv_dim = d_inner + bc
    matmul = d_model * in_out + d_inner * d_model
    other = conv_dim * (conv_kernel + 1.0) + 3.0 * n_heads + d_inner
    return {"d_inner": d_inner, "bc": bc, "in_proj_out": in_out, "conv_dim": conv_dim, "matmul": matmul,
            "other": other}


def mamba1_shapes(d_model, expand, state_dim, dt_rank, conv_kernel) -> dict[str, np.ndarray]:
    """Mamba-1 mixer widths and parameters (module docstring, Jamba's JambaMambaMixer): d_inner, in_proj_out
    (2 d_inner), conv_dim (d_inner), bc (2 N), x_proj_out (R + 2N), matmul (in_proj, x_proj, dt_proj, out_proj
    weights) and other (conv weight + bias, dt bias, A_log, D, the dt/B/C norm gains) parameters."""
    d_inner = expand * d_model
    bc = 2.0 * state_dim
    x_out = dt_rank + bc
    matmul = d_model * (2.0 * d_inner) + d_inner * x_out + dt_rank * d_inner + d_inner * d_model
    other = d_inner * (conv_kernel + 1.0) + d_inner * (state_dim + 2.0) + x_out
    return {"d_inner": d_inner, "bc": bc, "in_proj_out": 2.0 * d_inner, "conv_dim": d_inner, "x_proj_out": x_out,
            "matmul": matmul, "other": other}


def selective_scan_flops_per_token(d_inner, state_dim) -> np.ndarray:
    """Forward FLOPs of the Mamba-1 selective scan per token and layer: 7 per channel and state element, 8 per
    channel (module docstring)."""
    return d_inner * (7.0 * state_dim + 8.0)


def selective_scan_bytes_per_token(d_inner, state_dim, act_bytes) -> np.ndarray:
    """HBM bytes of the mamba_ssm selective_scan_fwd kernel per token and layer: u, delta, z read, out and out_z
    written, B and C read (16-bit), fp32 chunk-boundary states written (module docstring)."""
    return act_bytes * (5.0 * d_inner + 2.0 * state_dim) + FP32_BYTES * 2.0 * d_inner * state_dim / SCAN_CHUNK


def mamba1_elementwise_elems_per_token(d_inner, x_proj_out) -> np.ndarray:
    """Elements the Mamba-1 mixer's memory-bound kernels outside the scan read + write per token, forward: the
    causal conv1d with fused SiLU (d_inner in, d_inner out) and the dt/B/C RMSNorms (R + 2N in and out); the
    gate and D skip are inside the scan kernel."""
    return 2.0 * d_inner + 2.0 * x_proj_out


def mamba1_activation_bytes_per_token(d_inner, x_proj_out, state_dim) -> np.ndarray:
    """Stored activation bytes (16-bit, fp32 chunk states) of one Mamba-1 mixer per token, split over tp with
    d_inner (module docstring): in_proj output 2 d_inner, conv output, delta, out, out_z (d_inner each), dt/B/C
    before and after their norms (2 (R + 2N)), fp32 chunk states 2 d_inner N per SCAN_CHUNK tokens."""
    return 2.0 * (6.0 * d_inner + 2.0 * x_proj_out) + FP32_BYTES * 2.0 * d_inner * state_dim / SCAN_CHUNK


def ssd_flops_per_token(n_heads, head_dim, n_groups, state_dim, chunk) -> np.ndarray:
    """Forward FLOPs of the SSD chunked scan per token and layer (module docstring)."""
    nph = state_dim * head_dim * n_heads
    return 2.0 * chunk * state_dim * n_groups + 2.0 * chunk * head_dim * n_heads + 4.0 * nph + 2.0 * nph / chunk


def ssd_bytes_per_token(n_heads, head_dim, n_groups, state_dim, chunk, act_bytes) -> np.ndarray:
    """HBM bytes the SSD kernels move per token and layer, forward: the five kernels of mamba_ssm
    `_mamba_chunk_scan_combined_fwd` as Megatron-Core's mem-eff path runs them (z passed to the scan), each input
    read once and each output written once (module docstring, "SSD traffic")."""
    d, g, c = n_heads * head_dim, n_groups * state_dim, n_groups * chunk
    s = n_heads * head_dim * state_dim / chunk  # chunk states per token
    a, f = act_bytes, FP32_BYTES
    return a * (5.0 * d + 4.0 * g) + (a + 6.0 * f) * n_heads + 2.0 * f * c + (2.0 * f + 2.0 * a) * s


def ssd_bwd_bytes_per_token(n_heads, head_dim, n_groups, state_dim, chunk, act_bytes) -> np.ndarray:
    """HBM bytes the SSD kernels move per token and layer, backward: the recomputed forward pieces (cumsum, C B^T,
    chunk states, state passing in fp32) and the twelve backward kernels of mamba_ssm
    `_mamba_chunk_scan_combined_bwd` (module docstring, "SSD traffic"); 16-bit activations scale with act_bytes."""
    d, g, c = n_heads * head_dim, n_groups * state_dim, n_groups * chunk
    s = n_heads * head_dim * state_dim / chunk
    return (act_bytes / 2.0) * (34.0 * d + 54.0 * g) + 32.0 * c + 34.0 * s + SSD_BWD_BYTES_PER_HEAD * n_heads


def elementwise_elems_per_token(conv_dim, d_inner) -> np.ndarray:
    """Elements the mixer's memory-bound kernels outside the scan read + write per token, forward: the causal
    conv1d with fused SiLU reads and writes conv_dim (causal_conv1d_fn); the RMSNorm reads y and writes d_inner (the
    z gate is applied inside the scan kernel, ``ssd_bytes_per_token``)."""
    return 2.0 * conv_dim + 2.0 * d_inner


def activation_bytes_per_token(d_model, d_inner, bc, n_heads, dropout_mask_elems):
    """Stored activation bytes (16-bit) of one Mamba block per token, as (replicated coefficient of d_model,
    sharded bytes): Megatron-Core's mem-eff path (mamba_ssm `MambaSplitConv1dScanCombinedFn`) saves the in_proj
    output zxbcdt (2*d_inner + 2*G*N + H) and the scan output y (d_inner) and recomputes the conv and the chunk
    states in backward; out_proj saves its input (d_inner), in_proj its input and the norm its input (2 + 2 bytes
    per d_model, replicated unless sequence parallel), plus the residual dropout mask (half a layer's masks)."""
    replicated = 4.0 + 0.5 * dropout_mask_elems
    sharded = 2.0 * (2.0 * d_inner + bc + n_heads) + 2.0 * d_inner + 2.0 * d_inner
    return replicated, sharded


def cp_all_to_all_elems_per_token(d_inner, n_groups, state_dim, n_heads, tp, cp):
    """Elements per local token and GPU of the two Mamba CP all-to-alls of one forward pass (module docstring):
    before the scan z, x (2*d_inner), B, C repeated r = max(cp*tp/G, 1) times and dt, all / tp; after it y."""
    r = np.maximum(cp * tp / np.maximum(n_groups, 1.0), 1.0)
    pre = (2.0 * d_inner + 2.0 * n_groups * state_dim * r + n_heads) / tp
    post = d_inner / tp
    return pre, post


def hybrid_shapes(a, n_layers, d_model) -> dict[str, np.ndarray]:
    """Filled hybrid arrays of rows given as a dict of float arrays (COUNT_COLUMNS, SHAPE_COLUMNS): `hybrid`
    (a pattern was given), the counts, the mixer shapes, chunk / conv defaults. Non-hybrid rows get NaN shapes."""
    get = lambda k: np.asarray(a[k], dtype=np.float64) if k in a and a[k] is not None else np.full(np.shape(n_layers), np.nan)  # noqa: E731
    counts = {k: get(k) for k in COUNT_COLUMNS}
    hybrid = np.isfinite(counts["n_attn_layers"])
    nh, P, G, N = (get(k) for k in ("mamba_n_heads", "mamba_head_dim", "mamba_n_groups", "mamba_state_dim"))
    Q = get("mamba_chunk_size")
    Q = np.where(np.isnan(Q), DEFAULT_CHUNK, Q)
    K = get("mamba_conv_kernel")
    K = np.where(np.isnan(K), DEFAULT_CONV_KERNEL, K)
    out = {k: np.where(hybrid, np.nan_to_num(v), 0.0) for k, v in counts.items()}
    out.update(hybrid=hybrid, mamba_n_heads=nh, mamba_head_dim=P, mamba_n_groups=G, mamba_state_dim=N,
               mamba_chunk_size=Q, mamba_conv_kernel=K,
               shared_expert_ffn_dim=get("shared_expert_ffn_dim"), moe_latent_size=get("moe_latent_size"))
    out.update(mixer_shapes(d_model, nh, P, G, N, K))
    # a hybrid needs the Mamba-2 shape whenever it has Mamba blocks, and its blocks must add up to n_layers
    need = hybrid & (out["n_mamba_layers"] > 0)
    shape_ok = np.isfinite(nh) & (nh > 0) & np.isfinite(P) & (P > 0) & np.isfinite(G) & (G > 0) \
        & np.isfinite(N) & (N > 0) & (Q > 0) & (K > 0)
    # Mamba-1 rows (Jamba): a dt rank given; their widths replace the Mamba-2 ones (np.where: the Mamba-2 rows'
    # values are untouched)
    R, X = get("mamba_dt_rank"), get("mamba_expand")
    m1 = hybrid & np.isfinite(R)
    out["mamba1"] = m1
    out.update(mamba_dt_rank=R, mamba_expand=X, x_proj_out=np.full(np.shape(m1), np.nan))
    if np.any(m1):
        X = np.where(np.isnan(X), DEFAULT_EXPAND, X)
        out["mamba_expand"] = X
        for k, v in mamba1_shapes(d_model, X, N, R, K).items():
            out[k] = np.where(m1, v, out[k]) if k in out else np.where(m1, v, np.nan)
        m1_ok = (R > 0) & np.isfinite(N) & (N > 0) & (X > 0) & (K > 0) & ~np.isfinite(nh)
        shape_ok = np.where(m1, m1_ok, shape_ok)
    total = sum(out[k] for k in COUNT_COLUMNS)
    out["shape_bad"] = (need & ~shape_ok) | (hybrid & (total != n_layers))
    return out


def block_shares(hy) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(Mamba, attention, MLP, MoE) blocks of a hybrid row as shares of all its blocks (``COUNT_COLUMNS`` order;
    rows without blocks count as one block, so their shares are 0)."""
    L = sum(hy[c] for c in COUNT_COLUMNS)
    L = np.where(L > 0, L, 1.0)
    return tuple(hy[c] / L for c in COUNT_COLUMNS)

