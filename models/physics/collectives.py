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
(slower-tier) form; the step-time model uses ``models.physics.network.ring_link`` - the pipelined form
expressed as an effective bandwidth over the network's tiers - see docs/model.md. The expert-parallel all-to-all
across scale-up domains is ``ep_all_to_all``: its network share leaves through each rank's own NIC, not the ring's
g NICs. ``group_link`` and ``ep_all_to_all_time`` take the network as its links (a hand calculation, a test).
"""

from __future__ import annotations

import numpy as np

from models.core.fastops import ceil_log2, clip
from models.physics import network
from models.physics.network import A2A_RDMA_EFF  # noqa: F401  (the EP all-to-all's NIC efficiency, named here too)


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


def ep_all_to_all(tiers, nbytes, n, stride=1.0, per_domain=None, remote_share=None):
    """All-to-all of ``nbytes`` per rank over ``n`` ranks ``stride`` apart on the network ``tiers``
    (models.physics.network; the EP dispatch or combine). ``per_domain``: the group's ranks per scale-up domain when the
    caller has them (default ``network.ranks_per_domain``).

    Inside one domain (n <= its ranks per domain g): ``all_to_all_time`` over the scale-up link, bit for bit.
    Spanning domains, each rank sends (n - g) / n of its buffer to the ranks of other domains, through its own NIC:
    every GPU of a node has its NIC (one per GPU in the hardware table) and every GPU of the node runs an all-to-all
    of its own EP group at the same time, so, unlike a ring (``network.ring_link``: the g ranks of a node drive g
    NICs for one ring), a rank cannot borrow its neighbours' NICs; that NIC gets the smallest all-to-all bandwidth /
    oversubscription of the tiers the group reaches (``network.outer_bw``). Every byte also crosses the scale-up
    link once: the local peers' directly, the remote peers' on their way to or from the NIC on the destination's
    rail (NCCL's PXN; DeepEP/HybridEP's NVLink forwarding behind RDMA), so that leg costs what the all-to-all costs
    inside one domain. The two legs stream concurrently: time = the slower of them, plus one latency per peer
    (g - 1 over the scale-up link, n - g at the outermost tier reached). ``remote_share`` (None: (n - g)/n) replaces
    the share of the buffer that crosses the network: a hierarchical dispatcher sends one copy per remote node
    (``models.arch.moe.flex_remote_share``)."""
    n = _f(n)
    up = tiers[0]
    if per_domain is None:
        per_domain = network.ranks_per_domain(tiers, n, stride)
    g = np.minimum(np.maximum(_f(per_domain), 1.0), np.maximum(n, 1.0))
    inside = all_to_all_time(nbytes, n, up.a2a_bw_Bps, up.alpha_s)
    spans = n > g
    if not np.any(spans):
        return inside
    nic = network.outer_bw(tiers, n, stride, "a2a_bw_Bps")
    share = (n - g) / n if remote_share is None else _f(remote_share)
    remote_s = share * _f(nbytes) / nic
    local_s = all_to_all_bytes(nbytes, n) / _f(up.a2a_bw_Bps)
    alpha_x = network.outer_alpha(tiers, n, stride)
    cross = (g - 1.0) * _f(up.alpha_s) + (n - g) * _f(alpha_x) + np.maximum(local_s, remote_s)
    return np.where(spans, cross, inside)


def ep_all_to_all_time(nbytes, n, g, bw_intra, bw_nic, alpha_intra, alpha_inter, stride=1.0, pods=None,
                       remote_share=None):
    """``ep_all_to_all`` on the network given by its links (``network.of_links``): ``g`` of the ``n`` ranks share a
    scale-up domain, ``bw_nic`` the per-GPU NIC bandwidth, efficiency applied (``A2A_RDMA_EFF``); ``pods`` =
    (pod size, oversubscription) of an oversubscribed tier above pods."""
    tiers = network.of_links(np.nan, bw_intra, bw_nic, alpha_intra, alpha_inter, pods=pods)
    return ep_all_to_all(tiers, nbytes, n, stride, g, remote_share)


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


def group_link(n, ranks_per_node, bw_intra, bw_inter, alpha_intra, alpha_inter, stride=1.0, pods=None):
    """Effective per-rank bandwidth and per-step latency of a communicator of ``n`` ranks ``stride`` apart, of which
    ``ranks_per_node`` share a scale-up domain, on the network given by its links (``network.of_links``; ``pods`` =
    (pod size, oversubscription) of an oversubscribed tier above pods): ``network.ring_link``. Inside one domain the
    scale-up link; spanning domains min(scale-up bw, g x NIC bw per GPU), the NIC bandwidth divided by the
    oversubscription where the group spans pods, at the scale-out latency."""
    tiers = network.of_links(np.nan, bw_intra, bw_inter, alpha_intra, alpha_inter, pods=pods)
    return network.ring_link(tiers, n, stride, ranks_per_node)
