"""Parameter counts and FLOP accounting (vectorized over configurations).

The one FLOP convention of stepcast (docs/model.md, "FLOP convention"):

    model_flops_per_token = 6 * matmul_params_active + 12 * n_layers * seq_len * (n_heads * head_dim)

* ``matmul_params_active``: weights of every matrix multiply a token goes through - Q, K, V
  and output projections, the dense MLP (2 matrices for 'gelu', 3 for 'swiglu'), for MoE
  layers the top_k routed experts + the shared experts + the router, and the LM head
  (counted even when tied to the input embedding, because the logits matmul is executed).
  Biases and norm gains are not matmuls and are excluded; the embedding lookup is excluded.
* attention core (Q K^T and attention-weighted V): 2 * 2 * s * (a * d_head) FLOPs per token
  per layer forward, times 3 for forward + backward -> 12 * l * s * a * d_head. The FULL
  (non-causal) square is counted, as in Narayanan et al. 2021 (eq. 3) and PaLM (Chowdhery
  et al. 2022, App. B: 6N + 12 L H Q T), so MFU values are directly comparable with theirs.
  GQA does not change it (the score matmuls still run per query head).
* Hardware FLOPs (HFU numerator) add recomputation that is physically executed:
  full recompute: + one forward of every transformer layer (2 * layer matmul params +
  4 * l * s * a * d_head per token; the LM head is not recomputed);
  selective recompute: + the forward attention core (4 * l * s * a * d_head per token).
  With full recompute this reproduces Narayanan's 96 B s l h^2 (1 + s/6h + V/16lh) exactly
  for a GPT with ffn = 4h (no biases in the FLOPs).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import polars as pl

from models.arch import mamba, mla
from models.core.params import ACTIVATION_CODES, Activation
from models.core.recompute import recompute_flops

ArrayDict = Mapping[str, np.ndarray]

ARCH_COLUMNS = (
    "n_layers",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "ffn_dim",
    "vocab",
    "activation",
    "n_experts",
    "top_k",
    "expert_ffn_dim",
    "n_shared_experts",
    "n_dense_layers",
    "tied_embeddings",
)


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _get(a: ArrayDict, key: str, default: float) -> np.ndarray:
    if key in a and a[key] is not None:
        v = a[key]
        if key == "activation":
            v = np.asarray(v)
            if v.dtype.kind in "OUS":
                v = np.array([ACTIVATION_CODES.get(str(x).lower(), -1) for x in np.atleast_1d(v)], dtype=np.float64)
        return _fill(_f(v), default)
    return np.asarray(default, dtype=np.float64)


def _fill(v: np.ndarray, fill, bad: np.ndarray | None = None) -> np.ndarray:
    """``np.where(bad, fill, v)`` with ``bad`` = isnan(v) by default, without the where when no
    value (or every value) is bad - the common cases of a column that is given or absent."""
    if bad is None:
        bad = np.isnan(v)
    if v.ndim:
        nbad = np.count_nonzero(bad)
        if nbad == 0:
            return v
        if nbad == v.size:
            if np.ndim(fill) == 0:
                return np.full(v.shape, fill, dtype=np.float64)
            if np.shape(fill) == v.shape:
                return fill
    return np.where(bad, fill, v)


def normalize_arch(a: ArrayDict) -> dict[str, np.ndarray]:
    """Fill the documented defaults of the architecture columns (float arrays).

    head_dim NaN -> d_model / n_heads; n_kv_heads NaN -> n_heads; n_experts NaN -> 0;
    top_k NaN -> 0 for dense and 1 for MoE (numbers of routed experts per token must be
    given for MoE models; 1 is the Switch default); expert_ffn_dim NaN -> ffn_dim;
    n_shared_experts / n_dense_layers NaN -> 0; tied_embeddings NaN -> 0 (untied);
    activation code: 0 = gelu, 1 = swiglu (see models.core.params.ACTIVATION_CODES).
    A column given in full is returned as is (no copy); a filled column may be the array it
    was filled from (e.g. n_kv_heads is n_heads): treat the result as read-only.
    """
    L = _f(a["n_layers"])
    h = _f(a["d_model"])
    heads = _f(a["n_heads"])
    kv = _get(a, "n_kv_heads", np.nan)
    kv = _fill(kv, heads)
    hd = _get(a, "head_dim", np.nan)
    if hd.ndim and np.count_nonzero(np.isnan(hd)) == hd.size:
        hd = h / heads
    else:
        hd = np.where(np.isnan(hd) | (hd <= 0), h / heads, hd)
    ffn = _f(a["ffn_dim"])
    E = _get(a, "n_experts", 0.0)
    topk = _get(a, "top_k", np.nan)
    nan_k = np.isnan(topk)
    if np.any(nan_k):
        topk = np.where(nan_k, (E > 0).astype(np.float64), topk)
    fe = _get(a, "expert_ffn_dim", np.nan)
    fe = _fill(fe, ffn)
    ns = _get(a, "n_shared_experts", 0.0)
    nd = _get(a, "n_dense_layers", 0.0)
    tied = _get(a, "tied_embeddings", 0.0)
    act = _get(a, "activation", float(Activation.GELU))
    out = {
        "n_layers": L,
        "d_model": h,
        "n_heads": heads,
        "n_kv_heads": kv,
        "head_dim": hd,
        "ffn_dim": ffn,
        "vocab": _f(a["vocab"]),
        "activation": act,
        "n_experts": E,
        "top_k": topk,
        "expert_ffn_dim": fe,
        "n_shared_experts": ns,
        "n_dense_layers": nd,
        "tied_embeddings": tied,
    }
    if "mla" in a or "mtp" in a:  # already normalized
        out.update({k: a[k] for k in ("mla", "mtp") if k in a})
    elif any(a.get(k) is not None for k in mla.ARCH_COLUMNS):  # MLA attention, MTP modules (models.arch.mla)
        ms, depth = mla.mla_shapes(a, h, heads), mla.mtp_depth(a, L)
        out.update({k: v for k, v in (("mla", ms), ("mtp", depth)) if v is not None})
    if "hybrid" in a:  # already normalized (the shared-expert multiple is applied)
        out["hybrid"] = a["hybrid"]
    elif any(a.get(k) is not None for k in mamba.COUNT_COLUMNS):
        hy = mamba.hybrid_shapes(a, L, h)
        if np.any(hy["hybrid"]):
            out["hybrid"] = hy
            # Nemotron 3: one shared expert of shared_expert_ffn_dim = an integer multiple of expert_ffn_dim;
            # counted as that many expert-sized shared experts (same weights, FLOPs and bytes)
            sf = hy["shared_expert_ffn_dim"]
            wide = hy["hybrid"] & np.isfinite(sf) & (sf > 0) & (fe > 0)
            if np.any(wide):
                out["n_shared_experts"] = np.where(wide, np.minimum(ns, 1.0) * sf / np.where(wide, fe, 1.0), ns)
            if "mtp" in out:  # MTP modules of hybrids (Nemotron 3) are not modelled: their rows train without
                out["mtp"] = np.where(hy["hybrid"], 0.0, out["mtp"])
                if not np.any(out["mtp"] > 0):
                    del out["mtp"]
    return out


def hybrid_param_counts(ar: ArrayDict, sh: ArrayDict) -> dict[str, np.ndarray]:
    """Parameters of hybrid rows (``ar["hybrid"]``, models.arch.mamba) by block kind: every block carries an RMSNorm
    gain (d_model) and one mixer; no biases (Nemotron-H configs: attention_bias, mlp_bias, use_bias false).
    MoE blocks: router h*E, routed experts mlp_mats x w x expert_ffn with w = moe_latent_size when given
    (Megatron-Core latent MoE: fc1/fc2_latent_proj h <-> latent, 2 h latent) else d_model, shared experts on
    d_model. Returns blocks_dense (every block parameter but the routed experts), blocks_expert (routed experts),
    params, active_params, matmul_params_layers_active and, per block, attn / mlp / moe_active / mamba matmul
    weights."""
    hy = ar["hybrid"]
    h, V, E, k, ns = ar["d_model"], ar["vocab"], ar["n_experts"], ar["top_k"], ar["n_shared_experts"]
    fe, mats = ar["expert_ffn_dim"], sh["mlp_mats"]
    nM, nA, nF, nE = (hy[c] for c in mamba.COUNT_COLUMNS)
    lat = hy["moe_latent_size"]
    has_lat = np.isfinite(lat) & (lat > 0)
    expert = mats * np.where(has_lat, lat, h) * fe
    moe_common = h * E + ns * mats * h * fe + np.where(has_lat, 2.0 * h * np.where(has_lat, lat, 0.0), 0.0)
    mamba_m = np.nan_to_num(hy["matmul"])
    blocks_dense = nA * sh["attn_matmul"] + nF * sh["dense_mlp_matmul"] + nE * moe_common \
        + nM * (mamba_m + np.nan_to_num(hy["other"])) + (nA + nF + nE + nM) * h
    blocks_expert = nE * E * expert
    tied = np.minimum(np.maximum(ar["tied_embeddings"], 0.0), 1.0)
    embed = V * h * (2.0 - tied)
    moe_active = k * expert + moe_common
    matmul_layers = nA * sh["attn_matmul"] + nF * sh["dense_mlp_matmul"] + nE * moe_active + nM * mamba_m
    return {
        "blocks_dense": blocks_dense,
        "blocks_expert": blocks_expert,
        "params": blocks_dense + blocks_expert + embed + h,
        "active_params": blocks_dense + nE * k * expert + embed + h,
        "matmul_params_layers_active": matmul_layers,
        "embedding_params": embed,
        "expert_matmul": expert,
        "moe_active_matmul": moe_active,
        "mamba_matmul": mamba_m,
    }


def hybrid_flops_per_token(ar: ArrayDict, pc: ArrayDict, seq_len, recompute):
    """(model, hardware) FLOPs per token of hybrid rows: 6 x matmul params + attention core of the attention
    blocks only (12 n_attn s q) + 3 x the scan forward of the Mamba blocks (SSD for Mamba-2, the selective scan
    for Mamba-1: models.arch.mamba); recompute as for
    transformers: full + one forward of every block, selective + the attention core."""
    hy = ar["hybrid"]
    s = _f(seq_len)
    q = ar["n_heads"] * ar["head_dim"]
    nA, nM = hy["n_attn_layers"], hy["n_mamba_layers"]
    ssd = nM * np.nan_to_num(mamba.ssd_flops_per_token(hy["mamba_n_heads"], hy["mamba_head_dim"],
                                                       hy["mamba_n_groups"], hy["mamba_state_dim"],
                                                       hy["mamba_chunk_size"]))
    if np.any(hy["mamba1"]):  # Mamba-1 rows (Jamba): the selective scan instead of SSD
        ssd = np.where(hy["mamba1"], nM * mamba.selective_scan_flops_per_token(hy["d_inner"], hy["mamba_state_dim"]),
                       ssd)
    attn_fwd = 4.0 * nA * s * q
    model = 6.0 * pc["matmul_params_active"] + 3.0 * attn_fwd + 3.0 * ssd
    return model, model + recompute_flops(recompute, pc["matmul_params_layers_active"], attn_fwd, ssd)


def layer_shapes(arch: ArrayDict) -> dict[str, np.ndarray]:
    """Per-layer parameter groups of a normalized architecture.

    Returns q_dim, kv_dim, attn_matmul (Q,K,V,O weights), attn_bias, mlp_mats (2 or 3),
    (MLA rows, models.arch.mla: q_dim = kv_dim = the core width q_core, attn_matmul the MLA matrices,
    norm_params + the latent norms),
    dense_mlp_matmul, expert_matmul (one expert), router_matmul, n_moe_layers,
    n_dense_mlp_layers, norm_params (per layer), has_bias (gelu = GPT-style biases +
    LayerNorm with bias; swiglu = Llama-style, no biases, RMSNorm gain only).
    Entries that are equal may be the same array (treat the result as read-only).
    """
    h = arch["d_model"]
    hd = arch["head_dim"]
    q = arch["n_heads"] * hd
    kvd = q if arch["n_kv_heads"] is arch["n_heads"] else arch["n_kv_heads"] * hd
    ms = arch.get("mla")
    if ms is not None:  # MLA rows: the core width q_core stands for q and kv (models.arch.mla)
        q, kvd = np.where(ms["mla"], ms["core_dim"], q), np.where(ms["mla"], ms["core_dim"], kvd)
    has_bias = (arch["activation"] == Activation.GELU).astype(np.float64)
    mats = 3.0 - has_bias  # 2 matrices for gelu, 3 for swiglu
    qk = q + kvd
    h2 = 2.0 * h
    attn_matmul = h2 * qk  # Q and O: h*q each; K and V: h*kv each
    if ms is not None:  # MLA rows: W_DQ, W_UQ (or W_Q), W_DKV, W_UK, W_UV, W_O (models.arch.mla)
        attn_matmul = np.where(ms["mla"], ms["matmul"], attn_matmul)
    attn_bias = has_bias * (qk + kvd + h)
    mh = mats * h
    ffn = arch["ffn_dim"]
    dense_mlp = mh * ffn
    mlp_bias = has_bias * (ffn + h)
    fe = arch["expert_ffn_dim"]
    if fe is ffn:
        expert, expert_bias = dense_mlp, mlp_bias
    else:
        expert = mh * fe
        expert_bias = has_bias * (fe + h)
    E = arch["n_experts"]
    moe = E > 0
    L = arch["n_layers"]
    if np.any(moe):
        n_moe = np.where(moe, np.maximum(L - arch["n_dense_layers"], 0.0), 0.0)
        n_dense_mlp = L - n_moe
    else:
        n_moe = np.zeros(np.shape(moe))
        n_dense_mlp = L + n_moe  # L as a fresh array (broadcast like the other entries)
    router = h * E if not np.any(E < 0) else np.where(moe, h * E, 0.0)
    norm = h2 * (1.0 + has_bias)  # LayerNorm gain + bias x 2 (gelu) or RMSNorm gain x 2
    if ms is not None:  # + the RMSNorm gains of the two MLA latents
        norm = norm + ms["norm"]
    return {
        "q_dim": q,
        "kv_dim": kvd,
        "attn_matmul": attn_matmul,
        "attn_bias": attn_bias,
        "mlp_mats": mats,
        "dense_mlp_matmul": dense_mlp,
        "mlp_bias": mlp_bias,
        "expert_matmul": expert,
        "expert_bias": expert_bias,
        "router_matmul": router,
        "n_moe_layers": n_moe,
        "n_dense_mlp_layers": n_dense_mlp,
        "norm_params": norm,
        "has_bias": has_bias,
    }


def param_counts(a: ArrayDict, *, normalized: bool = False, shapes: ArrayDict | None = None) -> dict[str, np.ndarray]:
    """Total and active parameter counts, and the matmul params used by the FLOP convention.

    Shared experts are assumed to have ``expert_ffn_dim`` (DeepSeek-MoE convention).
    Embeddings: V*h input; + V*h LM head when untied. Final norm: 2h (gelu) or h (swiglu).
    Learned position embeddings (GPT-2/3, Megatron) are not modelled (s*h params, <0.3 %
    for the models in the tests).
    """
    ar = a if normalized else normalize_arch(a)
    sh = layer_shapes(ar) if shapes is None else shapes
    h, V, L = ar["d_model"], ar["vocab"], ar["n_layers"]
    E, k, ns = ar["n_experts"], ar["top_k"], ar["n_shared_experts"]
    plc = sh["attn_matmul"] + sh["attn_bias"] + sh["norm_params"]
    dense_mlp = sh["dense_mlp_matmul"] + sh["mlp_bias"]
    has_bias = sh["has_bias"] if "has_bias" in sh else (ar["activation"] == Activation.GELU).astype(np.float64)
    final_norm = h + has_bias * h  # 2h for gelu (gain + bias), h for swiglu
    lm_head = V * h
    tied = ar["tied_embeddings"]
    if np.ndim(tied) and not np.count_nonzero(tied):
        embed = 2.0 * lm_head
    else:
        embed = lm_head * (2.0 - np.minimum(np.maximum(tied, 0.0), 1.0))
    ndm = sh["n_dense_mlp_layers"]
    n_moe = sh["n_moe_layers"]
    base = L * plc + ndm * dense_mlp + embed + final_norm
    matmul_layers_active = L * sh["attn_matmul"] + ndm * sh["dense_mlp_matmul"]
    if np.any(n_moe):
        if sh["expert_matmul"] is sh["dense_mlp_matmul"] and sh["expert_bias"] is sh["mlp_bias"]:
            expert = dense_mlp
        else:
            expert = sh["expert_matmul"] + sh["expert_bias"]
        kns = k + ns
        router = sh["router_matmul"]
        total = base + n_moe * ((E + ns) * expert + router)
        active = base + n_moe * (kns * expert + router)
        matmul_layers_active = matmul_layers_active + n_moe * (kns * sh["expert_matmul"] + router)
    else:
        total = base
        active = base.copy() if isinstance(base, np.ndarray) else base
    out = {
        "params": total,
        "active_params": active,
        "matmul_params_layers_active": matmul_layers_active,
        "lm_head_params": lm_head,
        "matmul_params_active": matmul_layers_active + lm_head,
        "embedding_params": embed,
    }
    if "mtp" in ar:  # MTP modules (models.arch.mla): not in params / active_params (the published sizes exclude them)
        mp = mla.mtp_params(ar, sh)
        out["mtp_params"], out["mtp_matmul_params_active"] = mp["total"], mp["active_matmul"]
    if "hybrid" in ar:  # hybrid rows: counted by block kind (models.arch.mamba); other rows as above
        hyb = ar["hybrid"]["hybrid"]
        hc = hybrid_param_counts(ar, sh)
        for key in ("params", "active_params", "matmul_params_layers_active", "embedding_params"):
            out[key] = np.where(hyb, hc[key], out[key])
        out["matmul_params_active"] = out["matmul_params_layers_active"] + lm_head
        out["hybrid_counts"] = hc
    return out


def model_flops_per_token(a: ArrayDict, seq_len) -> np.ndarray:
    """stepcast model FLOPs per token (forward + backward), see module docstring; + the MTP modules' (models.arch.mla)."""
    ar = normalize_arch(a)
    sh = layer_shapes(ar)
    pc = param_counts(ar, normalized=True, shapes=sh)
    s = _f(seq_len)
    q = sh["q_dim"]  # n_heads * head_dim; MLA rows: the core width (models.arch.mla)
    out = 6.0 * pc["matmul_params_active"] + 12.0 * ar["n_layers"] * s * q
    if "mtp" in ar:
        out = out + mla.mtp_flops_per_token(ar, sh, s, 0)[0]
    if "hybrid" in ar:
        out = np.where(ar["hybrid"]["hybrid"], hybrid_flops_per_token(ar, pc, s, 0)[0], out)
    return out


def recompute_flops_per_token(a: ArrayDict, seq_len, recompute) -> np.ndarray:
    """Extra (hardware) FLOPs per token from recomputation of an architecture, by recompute code
    (models.core.params.Recompute; the rule: models.core.recompute.recompute_flops); the MTP modules'
    (models.arch.mla) added, hybrid rows by their blocks (``hybrid_flops_per_token``)."""
    ar = normalize_arch(a)
    sh = layer_shapes(ar)
    pc = param_counts(ar, normalized=True, shapes=sh)
    s = _f(seq_len)
    attn_fwd = 4.0 * ar["n_layers"] * s * sh["q_dim"]
    rc = np.asarray(recompute)
    out = recompute_flops(rc, pc["matmul_params_layers_active"], attn_fwd)
    if "mtp" in ar:
        model, hw = mla.mtp_flops_per_token(ar, sh, s, rc)
        out = out + (hw - model)
    if "hybrid" in ar:
        model, hw = hybrid_flops_per_token(ar, pc, s, rc)
        out = np.where(ar["hybrid"]["hybrid"], hw - model, out)
    return out


def hardware_flops_per_token(a: ArrayDict, seq_len, recompute) -> np.ndarray:
    return model_flops_per_token(a, seq_len) + recompute_flops_per_token(a, seq_len, recompute)


# ---------------------------------------------------------------------------------------
# Conventions used by the measured sources
# ---------------------------------------------------------------------------------------
def megatron_flops_per_iteration(batch_seqs, seq_len, n_layers, d_model, vocab) -> np.ndarray:
    """Narayanan et al. 2021 eq. (3): 96 B s l h^2 (1 + s/6h + V/16lh).

    Includes the full-recompute forward pass, so it is a *hardware* FLOP count (HFU).
    """
    B, s, l, h, V = (_f(x) for x in (batch_seqs, seq_len, n_layers, d_model, vocab))
    return 96.0 * B * s * l * h**2 * (1.0 + s / (6.0 * h) + V / (16.0 * l * h))


def korthikanti_model_flops_per_iteration(batch_seqs, seq_len, n_layers, d_model, vocab) -> np.ndarray:
    """Korthikanti et al. 2022 model FLOPs: 72 B s l h^2 (1 + s/6h + V/12lh) (= stepcast for ffn=4h)."""
    B, s, l, h, V = (_f(x) for x in (batch_seqs, seq_len, n_layers, d_model, vocab))
    return 72.0 * B * s * l * h**2 * (1.0 + s / (6.0 * h) + V / (12.0 * l * h))


def korthikanti_selective_hfu_flops_per_iteration(batch_seqs, seq_len, n_layers, d_model, vocab) -> np.ndarray:
    """Korthikanti et al. 2022 hardware FLOPs with selective recompute: 72 B s l h^2 (1 + s/3h + V/12lh).

    Note: this adds 12 B s^2 l h over the model FLOPs, three times the forward attention
    core that is physically recomputed (stepcast's HFU adds 4 B s^2 l h).
    """
    B, s, l, h, V = (_f(x) for x in (batch_seqs, seq_len, n_layers, d_model, vocab))
    return 72.0 * B * s * l * h**2 * (1.0 + s / (3.0 * h) + V / (12.0 * l * h))


def palm_flops_per_token(n_params, n_layers, n_heads, head_dim, seq_len) -> np.ndarray:
    """PaLM (Chowdhery et al. 2022, App. B): 6 N + 12 L H Q T, N = total parameters."""
    return 6.0 * _f(n_params) + 12.0 * _f(n_layers) * _f(n_heads) * _f(head_dim) * _f(seq_len)


CONVENTIONS = ("stepcast", "stepcast_hfu", "megatron", "korthikanti_selective_hfu", "palm", "6n", "6n_active")


def flops_per_token(convention: str, a: ArrayDict, seq_len, recompute=0) -> np.ndarray:
    """FLOPs per token of an architecture under a named convention.

    stepcast            - the stepcast model-FLOP convention (MFU numerator)
    stepcast_hfu        - stepcast + recompute of ``recompute`` (HFU numerator)
    megatron            - Narayanan 2021 formula / tokens (HFU with full recompute; uses
                          d_model and vocab only, i.e. assumes ffn = 4h, MHA)
    korthikanti_selective_hfu - Korthikanti 2022 selective-recompute hardware FLOPs / tokens
    palm                - 6 N_total + 12 L H Q T
    6n                  - 6 N_total
    6n_active           - 6 N_active (MoE: routed top_k + shared)
    """
    ar = normalize_arch(a)
    s = _f(seq_len)
    if convention == "stepcast":
        return model_flops_per_token(ar, s)
    if convention == "stepcast_hfu":
        return hardware_flops_per_token(ar, s, recompute)
    if convention == "megatron":
        return megatron_flops_per_iteration(1.0, s, ar["n_layers"], ar["d_model"], ar["vocab"]) / s
    if convention == "korthikanti_selective_hfu":
        return korthikanti_selective_hfu_flops_per_iteration(1.0, s, ar["n_layers"], ar["d_model"], ar["vocab"]) / s
    pc = param_counts(ar)
    if convention == "palm":
        return palm_flops_per_token(pc["params"], ar["n_layers"], ar["n_heads"], ar["head_dim"], s)
    if convention == "6n":
        return 6.0 * pc["params"]
    if convention == "6n_active":
        return 6.0 * pc["active_params"]
    raise ValueError(f"unknown FLOP convention {convention!r}; expected one of {CONVENTIONS}")


def convert_flops_convention(value, from_convention: str, to_convention: str, a: ArrayDict, seq_len, recompute=0):
    """Convert a FLOP-proportional figure (TFLOP/s, MFU, HFU at the same wall time).

    value * F_to / F_from, where F is the per-token FLOPs of each convention for the same
    architecture and sequence length. E.g. a Megatron SC'21 "TFLOP/s per GPU" (recompute
    included) -> stepcast model TFLOP/s: convert_flops_convention(x, 'megatron', 'stepcast', ...).
    """
    f_from = flops_per_token(from_convention, a, seq_len, recompute)
    f_to = flops_per_token(to_convention, a, seq_len, recompute)
    return _f(value) * f_to / f_from


def hybrid_params_b(frame: pl.DataFrame) -> np.ndarray:
    """Total parameters (billions) of the rows of a config frame (architecture columns + layer_pattern), counted
    by `param_counts` (hybrid rows by block kind)."""
    arr = {c: frame[c].cast(pl.Float64, strict=False).fill_null(np.nan).to_numpy()
           for c in ARCH_COLUMNS if c in frame.columns and c != "activation"}
    arr["activation"] = (frame["activation"] == "swiglu").cast(pl.Float64).fill_null(0.0).to_numpy()
    enc = frame.select(mamba.pattern_count_exprs("layer_pattern")
                       + [pl.col(c).cast(pl.Float64, strict=False) if c in frame.columns
                          else pl.lit(None, dtype=pl.Float64).alias(c) for c in mamba.SHAPE_COLUMNS])
    arr.update({c: enc[c].fill_null(np.nan).to_numpy() for c in enc.columns})
    return param_counts(arr)["params"] / 1e9
