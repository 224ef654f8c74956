"""alpha-beta cost model of collectives (vectorized; every argument may be an array).

time = steps * alpha + algorithm_factor * bytes / bw

``bytes`` is always the size of the FULL logical buffer (the all-reduced tensor, the
gathered result, the per-rank all-to-all send buffer), ``bw`` the per-rank, one-direction
bandwidth in bytes/s *already multiplied by an efficiency*, ``n`` the number of ranks.

Per-rank bytes sent (closed forms, tested in tests/test_step_time.py):
  ring all-reduce       2 (n-1)/n * B     (reduce-scatter + all-gather; Patarasuk & Yuan 2009)
  ring reduce-scatter     (n-1)/n * B
  ring all-gather         (n-1)/n * B
  all-to-all (pairwise)   (n-1)/n * B
  tree all-reduce       ~ 2 B             (reduce + broadcast; latency 2 ceil(log2 n) alpha)
  point-to-point            B
Hierarchical all-reduce (intra-node reduce-scatter over g ranks, inter-node all-reduce of
B/g over n/g nodes, intra-node all-gather) is provided in a sequential and a pipelined
(slower-tier) form; the step-time model uses ``group_link`` - the pipelined form expressed
as an effective bandwidth - see docs/model.md. The expert-parallel all-to-all across scale-up domains is
``ep_all_to_all_time``: its network share leaves through each rank's own NIC, not the ring's g NICs.
"""

from __future__ import annotations

import numpy as np

from models.core.fastops import ceil_log2, clip


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


# --- volumes -----------------------------------------------------------------------------
def ring_all_reduce_bytes(nbytes, n):
    n = _f(n)
    return 2.0 * (n - 1.0) / n * _f(nbytes)


def ring_reduce_scatter_bytes(nbytes, n):
    n = _f(n)
    return (n - 1.0) / n * _f(nbytes)


ring_all_gather_bytes = ring_reduce_scatter_bytes
all_to_all_bytes = ring_reduce_scatter_bytes


def tree_all_reduce_bytes(nbytes, n):
    n = _f(n)
    return np.where(n > 1, 2.0 * _f(nbytes), 0.0)


# --- times -------------------------------------------------------------------------------
def ring_all_reduce_time(nbytes, n, bw, alpha):
    n = _f(n)
    return np.where(n > 1, 2.0 * (n - 1.0) * _f(alpha) + ring_all_reduce_bytes(nbytes, n) / _f(bw), 0.0)


def tree_all_reduce_time(nbytes, n, bw, alpha):
    n = _f(n)
    steps = 2.0 * ceil_log2(n)
    return np.where(n > 1, steps * _f(alpha) + tree_all_reduce_bytes(nbytes, n) / _f(bw), 0.0)


def all_reduce_time(nbytes, n, bw, alpha, algorithm: str = "auto"):
    """ring | tree | auto (the faster of the two, as NCCL's tuner picks per size)."""
    if algorithm == "ring":
        return ring_all_reduce_time(nbytes, n, bw, alpha)
    if algorithm == "tree":
        return tree_all_reduce_time(nbytes, n, bw, alpha)
    if algorithm == "auto":  # the two formulas above, fused (one pass instead of three np.where)
        n = _f(n)
        a = _f(alpha)
        x = _f(nbytes) / _f(bw)
        nm1 = n - 1.0
        ring = nm1 * (a + x / n)
        # ceil(log2 n) for n > 1 (rows with n <= 1 are 0 below): the binary exponent of
        # ceil(n) - 1 = ceil(n - 1), as in fastops.ceil_log2
        tree = np.frexp(np.ceil(nm1))[1] * a + x
        return np.where(n > 1, 2.0 * np.minimum(ring, tree), 0.0)
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r}")


def reduce_scatter_time(nbytes, n, bw, alpha):
    n = _f(n)
    return np.where(n > 1, (n - 1.0) * _f(alpha) + ring_reduce_scatter_bytes(nbytes, n) / _f(bw), 0.0)


all_gather_time = reduce_scatter_time


def all_to_all_time(nbytes, n, bw, alpha):
    n = _f(n)
    return np.where(n > 1, (n - 1.0) * _f(alpha) + all_to_all_bytes(nbytes, n) / _f(bw), 0.0)


#: measured: the EP all-to-all's fraction of the per-GPU NIC line rate. DeepEP's normal kernels (NVLink + RDMA
#: forwarding) move 43 GB/s per GPU over RDMA in an internode EP16 dispatch and in its combine, on H800s with one
#: ConnectX-7 InfiniBand 400 Gb/s NIC per GPU, "~50 GB/s maximum bandwidth" (deepseek-ai/DeepEP docs/legacy.md,
#: "Normal kernels with NVLink and RDMA forwarding"): 43 / 50. Its EP32 and EP64 rows (57-58, 50-51 GB/s) reach or
#: pass the line rate because they count logical bytes (DeepEP V2's README: "the results are logical bandwidth"),
#: so the two-node row is the physical figure. Applied to ``inter_node_bw_gbps`` (per GPU) in place of the fitted
#: ``scaleout_eff`` of the ring collectives.
A2A_RDMA_EFF = 43.0 / 50.0


def ep_all_to_all_time(nbytes, n, g, bw_intra, bw_nic, alpha_intra, alpha_inter, stride=1.0, tiers=None,
                       remote_share=None):
    """All-to-all of ``nbytes`` per rank over ``n`` ranks of which ``g`` share a scale-up domain (the EP dispatch or
    combine; ``bw_nic`` the per-GPU NIC bandwidth, efficiency applied: ``A2A_RDMA_EFF``).

    Inside one domain (n <= g): ``all_to_all_time`` over the scale-up link, bit for bit. Spanning domains, each rank
    sends (n - g) / n of its buffer to the ranks of other domains, through its own NIC: every GPU of a node has its
    NIC (one per GPU in the hardware table) and every GPU of the node runs an all-to-all of its own EP group at the
    same time, so, unlike a ring (``group_link``: the g ranks of a node drive g NICs for one ring), a rank cannot
    borrow its neighbours' NICs. Every byte also crosses the scale-up link once: the local peers' directly, the
    remote peers' on their way to or from the NIC on the destination's rail (NCCL's PXN; DeepEP/HybridEP's NVLink
    forwarding behind RDMA), so that leg costs what the all-to-all costs inside one domain. The two legs stream
    concurrently: time = the slower of them, plus one latency per peer (g - 1 over the scale-up link, n - g over the
    network). A group spanning pods (``tiers``, ``stride``) divides the NIC bandwidth by the oversubscription.
    ``remote_share`` (None: (n - g)/n) replaces the share of the buffer that crosses the network: a hierarchical
    dispatcher sends one copy per remote node (``models.arch.moe.flex_remote_share``)."""
    n = _f(n)
    g = np.minimum(np.maximum(_f(g), 1.0), np.maximum(n, 1.0))
    inside = all_to_all_time(nbytes, n, bw_intra, alpha_intra)
    spans = n > g
    if not np.any(spans):
        return inside
    nic = _f(bw_nic) / pod_ratio(n, stride, tiers)
    share = (n - g) / n if remote_share is None else _f(remote_share)
    remote_s = share * _f(nbytes) / nic
    local_s = all_to_all_bytes(nbytes, n) / _f(bw_intra)
    cross = (g - 1.0) * _f(alpha_intra) + (n - g) * _f(alpha_inter) + np.maximum(local_s, remote_s)
    return np.where(spans, cross, inside)


def p2p_time(nbytes, bw, alpha):
    return _f(alpha) + _f(nbytes) / _f(bw)


def hierarchical_all_reduce_time(nbytes, n, g, bw_intra, bw_inter, alpha_intra, alpha_inter, pipelined=True):
    """Two-level all-reduce: RS inside the node (g ranks), AR of B/g across n/g nodes, AG inside.

    pipelined=True returns the slower tier (the phases of NCCL's multi-ring/tree algorithms
    stream chunk by chunk, so the slower tier bounds the time); False returns the sum.
    """
    n, g = _f(n), _f(g)
    g = clip(g, 1.0, n)
    nodes = n / g
    intra = reduce_scatter_time(nbytes, g, bw_intra, alpha_intra) + all_gather_time(nbytes, g, bw_intra, alpha_intra)
    inter = ring_all_reduce_time(_f(nbytes) / g, nodes, bw_inter, alpha_inter)
    return np.maximum(intra, inter) if pipelined else intra + inter


def network_tiers(domain, n_gpus, pod_size, oversubscription):
    """The oversubscribed pod tier of a network: ``(tiers, bad)``.

    ``oversubscription`` (ratio >= 1; NaN = 1, non-blocking) is the ratio of the bandwidth the
    accelerators of a pod offer the tier above it to the bandwidth that tier carries: 3 = a 3:1
    oversubscribed fat-tree, where traffic crossing the pod tier gets 1/3 of the scale-out bandwidth.
    ``pod_size``: accelerators below that tier (NaN: no pod boundary - all traffic leaving the
    scale-up ``domain`` crosses it); a pod smaller than the scale-up domain is invalid. ``bad``
    marks rows with a ratio < 1, a non-finite one or an invalid pod (NaN is the default, not bad).
    ``tiers`` is None when no row crosses an oversubscribed tier (every link is then ``group_link``'s
    two-tier one, bit for bit), else ``(pod, ratio)`` for ``pod_ratio``: a job inside one pod
    (n_gpus <= pod) never crosses the tier, so its ratio is 1.
    """
    ratio = _f(oversubscription)
    pod_size = _f(pod_size)
    bad = ~np.isnan(ratio) & ~(np.isfinite(ratio) & (ratio >= 1.0))
    bad |= ~np.isnan(pod_size) & ~(np.isfinite(pod_size) & (pod_size >= 1.0) & ~(pod_size < _f(domain)))
    pod = np.where(np.isnan(pod_size), _f(domain), pod_size)
    ratio = np.where(~bad & (pod < _f(n_gpus)) & (ratio > 1.0), ratio, 1.0)
    return (None if not np.any(ratio != 1.0) else (pod, ratio)), bad


def pod_ratio(n, stride, tiers):
    """The bandwidth divisor of a group of ``n`` ranks ``stride`` ranks apart (the product of the inner
    degrees: rank order tp, cp, ep, dp, pp): the tier's ratio where the group spans more than one pod
    (more members than floor(pod / stride), pods aligned to rank blocks as nodes are), else 1."""
    if tiers is None:
        return 1.0
    pod, ratio = tiers
    return np.where(_f(n) > np.maximum(np.floor(pod / _f(stride)), 1.0), ratio, 1.0)


def group_link(n, ranks_per_node, bw_intra, bw_inter, alpha_intra, alpha_inter, stride=1.0, tiers=None):
    """Effective per-rank bandwidth and per-step latency of a communicator.

    n ranks, of which ``ranks_per_node`` share a scale-up domain. Inside one domain
    (n <= ranks_per_node): the scale-up link. Spanning domains: NCCL builds one ring per
    NIC, so the g ranks of a node together drive g NICs and the per-rank "bus bandwidth"
    is min(scale-up bw, g * NIC bw per GPU) - the pipelined hierarchical bound
    (``hierarchical_all_reduce_time(..., pipelined=True)`` has the same bandwidth term).
    A group spanning pods (``tiers`` from ``network_tiers``, ``stride`` its members' rank distance)
    gets the NIC bandwidth divided by the oversubscription: the slowest tier bounds the pipelined ring.
    Latency across pods is the scale-out one.
    """
    n = _f(n)
    # g = clip(ranks_per_node, 1, max(n, 1)); n <= g <=> n <= max(ranks_per_node, 1), and
    # outside a domain (n > g) the upper clip is inactive, so only the lower one is needed
    g = np.maximum(_f(ranks_per_node), 1.0)
    inside = n <= g
    bw_intra, bw_inter = _f(bw_intra), _f(bw_inter)
    shape = np.broadcast(inside, bw_intra, bw_inter, alpha_intra, alpha_inter).shape
    k = np.count_nonzero(inside)
    if k == inside.size:  # every row inside one domain
        return np.array(np.broadcast_to(bw_intra, shape)), np.full(shape, alpha_intra, dtype=np.float64)
    if tiers is not None:
        bw_inter = bw_inter / pod_ratio(n, stride, tiers)
    bw_x = np.minimum(bw_intra, g * bw_inter)
    if k == 0:
        return np.array(np.broadcast_to(bw_x, shape)), np.full(shape, alpha_inter, dtype=np.float64)
    bw = np.where(inside, bw_intra, bw_x)
    alpha = np.where(inside, _f(alpha_intra), _f(alpha_inter))
    return bw, alpha
