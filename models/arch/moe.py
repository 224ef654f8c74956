"""MoE as trained today: load imbalance, dropless vs capacity factor, expert tensor parallelism (pure, vectorized).

The step-time model (models.physics.step_time) and the memory model (models.memory.model) call these functions in their MoE
places; every function takes arrays (or scalars) of equal length and returns arrays. docs/model.md, "MoE: load
imbalance, capacity factor, expert tensor parallelism", states the formulas.

**Load imbalance.** Top-k routing does not give every expert-parallel (EP) rank the same number of tokens. The
all-to-all and the grouped GEMMs of one MoE layer are synchronous over the EP group, so the layer lasts as long
as its most loaded rank: that rank receives ``imbalance`` x the mean routed token copies (k T / tp per GPU), which
scales its routed-expert GEMM FLOPs, the HBM traffic of the routed activations, its all-to-all volume (dispatch
receive, combine send) and the activations it stores. ``PhysParams.moe_imbalance`` (>= 1) is that factor. No
published per-rank figure of dropless training was found that could serve as a default (MegaBlocks, Gale et al.
2022, plots per-expert token counts but states no max/mean over ranks; Wang et al. 2024, the auxiliary-loss-free
balancing DeepSeek-V3 uses, reports MaxVio per *expert*, not per rank, on 1B/3B models), so the default is 1.0
(balanced) - which is also what the Megatron-Bridge performance tables measure: their MoE benchmarks
force-balanced token routing (their footnote). It is a calibration candidate, not a fitted value.

**Dropless vs capacity factor** (Megatron-Core ``--moe-expert-capacity-factor``, ``--moe-pad-expert-input-to-
capacity``; megatron/core/transformer/moe/moe_utils.py ``get_capacity``, ``apply_router_token_dropping``). Empty
(NaN) capacity factor = dropless (Megatron-Core's default, None): the slowest rank processes ``imbalance`` x the
mean. With a capacity factor cf each expert keeps at most capacity = ceil(cf x tokens x k / n_experts) tokens
(computed per source rank over its local tokens); the rest are dropped. Without padding (Megatron-Core's default,
``--moe-pad-expert-input-to-capacity`` off) the slowest rank processes min(imbalance, cf) x the mean; with padding
(GShard/Switch static shapes, Megatron-Core with the pad flag: ``final_map = capacity_mask``) every expert
processes exactly its capacity, cf x the mean, whatever the imbalance - through the all-to-all too. The dropped
tokens still count in the model FLOPs (MFU convention: k experts per token).

**Expert tensor parallelism** (Megatron-Core ``--expert-tensor-parallel-size``, default = tp; MoE parallel
folding, Liu et al. 2025, arXiv:2504.14960; megatron/core/parallel_state.py ``initialize_model_parallel``).
Attention layers run on tp x cp x dp (x pp), MoE layers on etp x ep x edp (x pp) over the same GPUs of a stage:
the expert grid needs ``world_size % (etp * ep * pp) == 0`` (RuntimeError otherwise), i.e. per stage
tp*cp*dp divisible by etp*ep, and ``num_experts % ep == 0``; edp = tp*cp*dp / (etp*ep). Rank order of the
expert grid: etp fastest, then ep (EP groups are ranks ``etp`` apart), then edp. Consequences modelled:

* routed-expert weights, gradients and optimizer state per GPU: / (ep * etp) instead of / (ep * tp)
  (``expert_weight_scale`` = tp / etp multiplies the model's per-GPU expert parameters, which divide by tp);
  shared experts stay on the attention TP group (Megatron-Core ``SharedExpertMLP`` uses the TP group);
* routed-expert FLOPs per GPU do not change (the etp ranks split each expert and see etp x the tokens), but the
  expert weight bytes each GPU reads are / etp instead of / tp;
* the expert-TP collective pair of each MoE layer (the alltoall dispatcher's all-gather of the dispatched
  tokens over the expert-TP group before the experts and the reduce-scatter after, ``token_dispatcher.py``
  ``gather_from_sequence_parallel_region(..., group=self.tp_group)`` with ``tp_group = pg_collection.expt_tp``)
  runs over etp ranks, not tp; etp = 1 has none. Its volume follows the model's convention for the MoE layer's
  second TP pair (T h per micro-batch at etp = tp), scaled by etp / tp and by the slowest rank's factor
  (``expert_tp_bytes``; see the caveat in docs/model.md: the dispatched copies are k x that);
* the EP all-to-all volume per GPU is unchanged by etp (each GPU sends its own T/tp tokens' k copies); its
  group is ep ranks ``etp`` apart (``ep_stride``);
* the expert-data-parallel gradient reduction runs over edp = tp*cp*dp / (etp*ep) ranks ``etp*ep`` apart.

Every function reduces to today's model bit for bit at the defaults (etp = tp, dropless, imbalance 1.0): the
factors are exactly 1.0 there (x * 1.0 == x in IEEE arithmetic) or the callers select today's value.
"""

from __future__ import annotations

import numpy as np

from models.core.params import Recompute

#: optional config columns of the MoE options (null/NaN = the default: etp = tp, dropless, not padded, no EP
#: all-to-all overlap, the all-to-all dispatcher; ``moe_a2a_overlap`` 1 = Megatron-Core
#: ``--overlap-moe-expert-parallel-comm``; ``moe_dispatcher`` 1 = the flex dispatcher, DeepEP or HybridEP)
COLUMNS = ("etp", "moe_capacity_factor", "moe_pad_to_capacity", "moe_a2a_overlap", "moe_dispatcher")

#: ``moe_dispatcher`` codes: the all-to-all dispatcher (null/0, Megatron-Core's ``alltoall``: every token copy to
#: its expert's rank over NCCL) and the flex dispatcher with DeepEP or HybridEP (1: ``flex``)
DISPATCHER_FLEX = 1.0


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _int_ok(x) -> np.ndarray:
    """Finite integers >= 1."""
    x = _f(x)
    with np.errstate(invalid="ignore"):
        return np.isfinite(x) & (x >= 1) & (x == np.floor(x))


def _divides(a, b) -> np.ndarray:
    """a | b for positive integer-valued floats (False where either is not finite or a <= 0)."""
    a, b = _f(a), _f(b)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = b / a
        return np.isfinite(q) & (a > 0) & (q == np.floor(q))


def folding_valid(tp, cp, dp, ep, etp) -> np.ndarray:
    """Megatron-Core MoE parallel folding: the expert grid etp x ep must tile the stage's tp x cp x dp GPUs
    (parallel_state.initialize_model_parallel raises "world_size (..) is not divisible by
    expert_tensor_model_pipeline_parallel size (..)" otherwise) and etp must be a positive integer."""
    return _int_ok(etp) & _divides(_f(etp) * _f(ep), _f(tp) * _f(cp) * _f(dp))


def resolve_etp(etp, tp, cp, dp, ep) -> tuple[np.ndarray, np.ndarray]:
    """(etp per row, mask of rows where it was inferred rather than Megatron-Core's default etp = tp).

    Given (finite) etp: kept as stated (``folding_valid`` judges it). Empty (NaN): etp = tp - Megatron-Core's
    default - where that folds (ep | cp*dp); where it does not but ep | tp*cp*dp (an ep folded over the attention
    TP ranks, which Megatron-Core only runs with a smaller etp), the largest etp dividing tp that folds,
    gcd(tp, tp*cp*dp/ep) (ep=64 on tp=2 x dp=32: etp = 1); otherwise tp (the row is invalid anyway)."""
    e_in = _f(etp)
    t, c, d, e = _f(tp), _f(cp), _f(dp), _f(ep)
    given = np.isfinite(e_in)
    fits_tp = _divides(e, c * d)
    with np.errstate(invalid="ignore", divide="ignore"):
        x = t * c * d / e
    folds = ~fits_tp & _int_ok(x) & _int_ok(t)
    g = np.gcd(np.where(folds, t, 1.0).astype(np.int64), np.where(folds, x, 1.0).astype(np.int64)).astype(np.float64)
    inferred = ~given & folds
    out = np.where(given, e_in, np.where(inferred, g, t))
    return out, inferred


def effective_imbalance(imbalance, capacity_factor=np.nan, pad_to_capacity=False) -> np.ndarray:
    """Tokens the most loaded EP rank's experts process, as a multiple of the mean (k T / tp per GPU).

    dropless (capacity_factor NaN): ``imbalance``; capacity factor cf without padding: min(imbalance, cf);
    padded to capacity: cf (every expert runs exactly its capacity; Megatron-Core ``apply_router_token_dropping``
    with ``pad_to_capacity``). Module docstring for the sources."""
    rho = _f(imbalance)
    cf = _f(capacity_factor)
    pad = np.asarray(pad_to_capacity, dtype=bool)
    capped = np.where(pad, cf, np.minimum(rho, cf))
    return np.where(np.isnan(cf), rho, capped) * np.ones(np.broadcast(rho, cf, pad).shape)


def capacity_factor_valid(capacity_factor) -> np.ndarray:
    """Empty (dropless) or a finite capacity factor > 0."""
    cf = _f(capacity_factor)
    return np.isnan(cf) | (np.isfinite(cf) & (cf > 0))


def expert_weight_scale(tp, etp) -> np.ndarray:
    """tp / etp: multiplies a per-GPU routed-expert parameter count the model divided by tp (exactly 1.0 at
    etp = tp), so the experts are divided by ep * etp."""
    return _f(tp) / _f(etp)


def expert_dp_size(tp, cp, dp, ep, etp) -> np.ndarray:
    """Expert-data-parallel ranks edp = tp*cp*dp / (etp*ep), the group of the routed experts' gradient reduction
    (and of their ZeRO/FSDP shards), at least 1. Written as (dp*cp/ep) x (tp/etp), the model's dp*cp/ep times
    exactly 1.0 at etp = tp."""
    return np.maximum(_f(dp) * _f(cp) / np.maximum(_f(ep), 1.0) * expert_weight_scale(tp, etp), 1.0)


def ep_stride(tp, cp, etp) -> np.ndarray:
    """Rank distance of the members of an EP group: etp on Megatron-Core's expert grid (etp fastest, then ep).
    At etp = tp the model keeps tp*cp, its EP-carved-out-of-dp placement (the same for cp = 1)."""
    t, c, et = _f(tp), _f(cp), _f(etp)
    return np.where(et == t, t * c, et)


def expert_tp_bytes(tp_pair_bytes, tp, etp, rho) -> np.ndarray:
    """Full-buffer bytes of the expert-TP collective pair of one MoE layer (all-gather of the dispatched tokens
    over etp, reduce-scatter after): the TP pair's bytes (T h per micro-batch at etp = tp) x etp / tp x the slowest
    rank's factor rho (it gathers rho x the mean tokens)."""
    return _f(tp_pair_bytes) * (_f(etp) / _f(tp)) * _f(rho)


def routed_tokens_factor(top_k, n_shared, rho) -> np.ndarray:
    """Experts per token on the slowest rank, rho k + n_shared (the shared experts are not routed): the
    multiplier of expert_ffn_dim in the MoE layer's FLOPs, activations and element-wise traffic (k + n_shared at
    rho = 1, exactly)."""
    return _f(top_k) * _f(rho) + _f(n_shared)


def etp_candidates(n_experts: int, tp: int) -> tuple[int, ...]:
    """The expert tensor-parallel degrees a layout search tries: 1 and tp for MoE with tp > 1 (Megatron-Core's
    default etp = tp, and etp = 1, the setting for fine-grained experts), else tp alone."""
    return (1, tp) if n_experts > 0 and tp > 1 else (tp,)


def a2a_merged_fraction(a2a_overlap, n_micro, pp, vpp, n_experts, ep, recompute_code) -> np.ndarray:
    """Share of a stage's micro-batch passes that Megatron-Core's combined 1F1B schedule runs merged with another
    micro-batch's pass when the EP all-to-all overlap is on (``--overlap-moe-expert-parallel-comm``), else 0.

    Only merged passes can hide their all-to-all (``models.physics.parts.ep_a2a_hidden``). pp = 1
    (megatron/core/pipeline_parallel/combined_1f1b.py ``combined_1f1b_schedule_for_no_pipelining``): the first
    micro-batch's forward and the last one's backward run alone, the other m - 1 pairs merged: (m - 1) / m.
    pp > 1 needs the interleaved schedule (Megatron-Bridge ``CommOverlapConfig`` asserts a virtual pipeline size):
    of its m v micro-batch chunks the first stage runs W = 2 (pp - 1) + (vpp - 1) pp + 1 in warm-up (one more than
    without the overlap, "one extra micro-batch forward step before the 1f1b stages"; schedules.py
    ``get_pp_rank_microbatches`` with the default group size pp) and as many in cool-down, unmerged:
    (m v - W) / (m v), at least 0. Not applicable (0): no overlap, dense rows, ep = 1, pp > 1 without
    interleaving, and full recompute (``recompute_code`` Recompute.FULL; Megatron-Bridge asserts
    ``recompute_granularity != "full"`` with the overlap)."""
    m, p, v = _f(n_micro), _f(pp), _f(vpp)
    on = (_f(a2a_overlap) > 0) & (_f(n_experts) > 0) & (_f(ep) > 1) & (np.asarray(recompute_code) != Recompute.FULL)
    no_pp = (m - 1.0) / np.maximum(m, 1.0)
    chunks = m * v
    warm = 2.0 * (p - 1.0) + (v - 1.0) * p + 1.0
    interleaved = np.maximum(chunks - warm, 0.0) / np.maximum(chunks, 1.0)
    frac = np.where(p > 1, np.where(v > 1, interleaved, 0.0), no_pp)
    return np.where(on, np.clip(frac, 0.0, 1.0), 0.0)


def flex_remote_share(top_k, n_experts, ep, ep_per_node) -> np.ndarray:
    """Share of a token's k dispatched copies that a hierarchical dispatcher (DeepEP, HybridEP: Megatron-Core's flex
    dispatcher) sends over the network when the EP group spans nodes: one copy per remote node the token's experts
    sit on, not one per expert. DeepEP's internode layout counts ``num_tokens_per_rdma_rank`` (tokens per destination
    node) and sends each token once to the same-index GPU of a node, which forwards it over NVLink
    (deepseek-ai/DeepEP ``get_dispatch_layout``, "Normal kernels with NVLink and RDMA forwarding"); HybridEP sizes its
    ``rdma_token_buffer`` as tokens x (nodes - 1) x hidden: one copy per remote node (DeepEP hybrid-ep branch,
    docs/Hybrid-EP_Implementation.md). With balanced routing (the recipes force it: each token's k distinct experts
    uniform over the E experts, E/N of them on each of the N = ep / ep_per_node nodes) a given node holds none of a
    token's experts with probability P0 = C(E - E/N, k) / C(E, k), so a token goes to (N - 1)(1 - P0) remote nodes
    on average: the share is that over k (at most (N - 1)/N, the all-to-all dispatcher's share, by the union bound).
    Rows whose group does not span nodes (or without experts) get (ep - ep_per_node)/ep, 0 inside one node."""
    k, E = _f(top_k), _f(n_experts)
    ep, g = _f(ep), np.maximum(_f(ep_per_node), 1.0)
    N = np.maximum(ep / g, 1.0)
    flat = np.maximum(ep - g, 0.0) / np.maximum(ep, 1.0)
    En = E / N
    p0 = np.ones(np.broadcast(k, E, N).shape)
    for i in range(int(np.nanmax(np.where(np.isfinite(k), k, 0.0), initial=0.0))):
        with np.errstate(invalid="ignore", divide="ignore"):
            term = np.clip((E - En - i) / (E - i), 0.0, 1.0)
        p0 = p0 * np.where(i < k, np.nan_to_num(term), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = (N - 1.0) * (1.0 - p0) / k
    ok = (N > 1.0) & (k > 0) & (E >= k) & np.isfinite(share)
    return np.where(ok, np.minimum(share, flat), flat)
