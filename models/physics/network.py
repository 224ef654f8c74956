"""The network of a block of configurations: a list of tiers, inner to outer, and what a parallel group pays on it.

Tiers (``Tier``; ``build`` makes the list, the one place that knows which tiers exist):

  0  the scale-up domain: ``node`` accelerators (``gpus_per_node`` / ``scaleup_size``) on NVLink, xGMI, ICI or the
     PCIe/host tier, at the hardware row's ``intra_node_bw_gbps`` per accelerator
  1  the scale-out network joining domains: the NIC per accelerator (``inter_node_bw_gbps``), up to the pod
  2  (when a row of the block has one) the oversubscribed tier above the pods (``pod_size``, ``oversubscription``,
     ``NETWORK_COLUMNS``): the same NICs, their bandwidth divided by the oversubscription

The outermost tier is unbounded (``accelerators`` inf). A tier between two of these (a rack tier between an NVL72
domain and the data centre; the data-centre network between TPU slices) is one more entry in ``build`` and its
columns in ``decode``: the rules below read the list, whatever its length.

What a group pays. A group of n ranks ``stride`` ranks apart (stride = the product of the degrees inside it in
Megatron's rank order tp, cp, ep, dp, pp) fits in one unit of a tier (``accelerators`` per unit) when
n <= max(floor(accelerators / stride), 1): units are aligned to rank blocks, as nodes are. A group that does not fit
in one unit of tier k - 1 reaches tier k (``spans``), and every tier it reaches bounds it:

  ring collectives (``ring_link``)  inside one domain: the scale-up bandwidth and latency. Spanning domains:
      min(scale-up bw, g x the smallest bw / oversubscription of the tiers it reaches), g = its ranks per domain
      (NCCL builds one ring per NIC, so the g ranks of a domain drive g NICs: the pipelined hierarchical bound,
      the slowest tier bounding the pipelined ring); the latency of the outermost tier it reaches.
  EP all-to-all (``models.physics.collectives.ep_all_to_all``)  each rank's own NIC: the smallest
      ``a2a_bw_Bps`` / oversubscription of the tiers it reaches (``outer_bw``).
  pipeline point-to-point (``p2p_link``)  the next stage ``stride`` ranks away is in the same domain when
      stride < the domain's accelerators; else min(scale-up bw, the smallest bw / oversubscription of the tiers the
      pipeline group reaches), at the latency of the outermost of them.

Bandwidths are bytes/s per accelerator and direction with their efficiencies applied, latencies seconds per
algorithm step. Every function is vectorized: a tier's fields are arrays of the block's length or scalars.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from models.core.fastops import clip
from models.core.params import PhysParams
from models.physics.hardware import is_pcie

#: optional columns of a configuration that describe the cluster's network beyond the hardware row: an
#: oversubscribed tier above pods of ``pod_size`` accelerators (``decode``); NaN or missing = a non-blocking network
NETWORK_COLUMNS = ("oversubscription", "pod_size")

#: measured: the EP all-to-all's fraction of the per-GPU NIC line rate. DeepEP's normal kernels (NVLink + RDMA
#: forwarding) move 43 GB/s per GPU over RDMA in an internode EP16 dispatch and in its combine, on H800s with one
#: ConnectX-7 InfiniBand 400 Gb/s NIC per GPU, "~50 GB/s maximum bandwidth" (deepseek-ai/DeepEP docs/legacy.md,
#: "Normal kernels with NVLink and RDMA forwarding"): 43 / 50. Its EP32 and EP64 rows (57-58, 50-51 GB/s) reach or
#: pass the line rate because they count logical bytes (DeepEP V2's README: "the results are logical bandwidth"),
#: so the two-node row is the physical figure. Applied to ``inter_node_bw_gbps`` (per GPU) in place of the fitted
#: ``scaleout_eff`` of the ring collectives.
A2A_RDMA_EFF = 43.0 / 50.0


@dataclass(frozen=True, slots=True)
class Tier:
    """One tier of the network (module docstring). Fields are arrays of the block's length or scalars."""

    name: str
    accelerators: np.ndarray | float  # one unit of the tier joins (the domain, a pod); inf: the outermost
    bw_Bps: np.ndarray | float  # ring collectives and point-to-point, bytes/s per accelerator, efficiency applied
    a2a_bw_Bps: np.ndarray | float  # the EP all-to-all, bytes/s per accelerator (beyond the domain: A2A_RDMA_EFF)
    alpha_s: np.ndarray | float  # latency per algorithm step, s
    oversubscription: np.ndarray | float = 1.0  # a group reaching the tier gets bw / oversubscription (1: non-blocking)


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _is_one(x) -> bool:
    """A scalar 1: a non-blocking tier, whose bandwidth is used as it is."""
    return np.ndim(x) == 0 and x == 1.0


# ------------------------------------------------------------------------------------------ building the list

def decode(col: Callable[[str], np.ndarray], n_gpus: np.ndarray) -> dict:
    """The network columns of a block as ``build`` reads them, checked (none depends on the model's parameters, so
    the step-time model decodes them once per block of input arrays). ``col(name)``: the column's array, NaN where
    missing. Keys: ``domain`` (accelerators of one scale-up domain: min(gpus_per_node, scaleup_size, n_gpus), at
    least 1), ``up_gbps``, ``pcie`` (rows on the PCIe/host tier, models.physics.hardware ``scaleup_link_code``;
    None: no such row), ``out_gbps``, ``a2a_Bps`` (the NIC at ``A2A_RDMA_EFF``), ``pod`` and ``ratio`` (the pod tier,
    both None when no row crosses an oversubscribed tier) and ``bad`` (rows with invalid network columns).

    The pod tier: ``oversubscription`` (ratio >= 1; NaN = 1, non-blocking) is the ratio of the bandwidth the
    accelerators of a pod offer the tier above it to the bandwidth that tier carries: 3 = a 3:1 oversubscribed
    fat-tree, where traffic crossing the pod tier gets 1/3 of the scale-out bandwidth. ``pod_size``: accelerators
    below that tier (NaN: no pod boundary, all traffic leaving the scale-up domain crosses it); a pod smaller than
    the scale-up domain is invalid. ``bad`` marks rows with a ratio < 1, a non-finite one or an invalid pod (NaN is
    the default, not bad). A job inside one pod (n_gpus <= pod) never crosses the tier: its ratio is 1."""
    su, gpn = col("scaleup_size"), col("gpus_per_node")
    domain = np.where(np.isnan(gpn), su, np.minimum(gpn, np.where(np.isnan(su), gpn, su)))
    ratio, pod_size = col("oversubscription"), col("pod_size")
    bad = ~np.isnan(ratio) & ~(np.isfinite(ratio) & (ratio >= 1.0))
    bad |= ~np.isnan(pod_size) & ~(np.isfinite(pod_size) & (pod_size >= 1.0) & ~(pod_size < domain))
    pod = np.where(np.isnan(pod_size), domain, pod_size)
    ratio = np.where(~bad & (pod < n_gpus) & (ratio > 1.0), ratio, 1.0)
    crossed = np.any(ratio != 1.0)
    pcie = is_pcie(col("scaleup_link_code"))
    out_gbps = col("inter_node_bw_gbps")
    return dict(domain=np.maximum(np.minimum(domain, n_gpus), 1.0), up_gbps=col("intra_node_bw_gbps"),
                pcie=pcie if pcie.any() else None, out_gbps=out_gbps, a2a_Bps=out_gbps * 1e9 * A2A_RDMA_EFF,
                pod=pod if crossed else None, ratio=ratio if crossed else None, bad=bad)


def build(cols: dict, P: PhysParams) -> tuple[Tier, ...]:
    """The network's tiers, inner to outer, from ``decode``'s columns and the efficiencies and latencies of ``P``:
    the scale-up domain (``scaleup_eff``, ``alpha_scaleup_s``; PCIe/host rows ``pcie_eff``, ``alpha_pcie_s``: the
    NVLink-class constants are fitted on NVLink/xGMI/ICI runs), the scale-out network (``scaleout_eff`` for the
    rings, ``A2A_RDMA_EFF`` for the all-to-all, ``alpha_scaleout_s``) and, where a row crosses one, the
    oversubscribed tier above the pods (the same NICs and latency)."""
    up_Bps, alpha_up = cols["up_gbps"] * 1e9 * P.scaleup_eff, P.alpha_scaleup_s
    if (pcie := cols["pcie"]) is not None:
        up_Bps = np.where(pcie, cols["up_gbps"] * 1e9 * P.pcie_eff, up_Bps)
        alpha_up = np.where(pcie, P.alpha_pcie_s, alpha_up)
    out_Bps, a2a_Bps, alpha_out = cols["out_gbps"] * 1e9 * P.scaleout_eff, cols["a2a_Bps"], P.alpha_scaleout_s
    pod = cols["pod"]
    tiers = [Tier("scale-up", cols["domain"], up_Bps, up_Bps, alpha_up),
             Tier("scale-out", np.inf if pod is None else pod, out_Bps, a2a_Bps, alpha_out)]
    if pod is not None:
        tiers.append(Tier("above the pods", np.inf, out_Bps, a2a_Bps, alpha_out, cols["ratio"]))
    return tuple(tiers)


def of_links(domain, bw_up, bw_out, alpha_up, alpha_out, bw_a2a=None, pods=None) -> tuple[Tier, ...]:
    """The network given by its links, for a hand calculation or a test: a scale-up domain of ``domain``
    accelerators (NaN when the caller gives each group's ranks per domain), the scale-out network (``bw_a2a``: its
    all-to-all bandwidth, default ``bw_out``) and, with ``pods`` = (pod size, oversubscription), the tier above the
    pods. Bandwidths in bytes/s with their efficiencies, latencies in s."""
    a2a = bw_out if bw_a2a is None else bw_a2a
    tiers = [Tier("scale-up", domain, bw_up, bw_up, alpha_up),
             Tier("scale-out", np.inf if pods is None else pods[0], bw_out, a2a, alpha_out)]
    if pods is not None:
        tiers.append(Tier("above the pods", np.inf, bw_out, a2a, alpha_out, pods[1]))
    return tuple(tiers)


# ------------------------------------------------------------------------------------------ what a group pays

def ranks_per_domain(tiers: tuple[Tier, ...], n, stride=1.0) -> np.ndarray:
    """Ranks of a group of ``n`` ranks ``stride`` apart in one scale-up domain: clip(floor(domain / stride), 1, n);
    consecutive ranks (stride 1): min(n, domain), the same for a domain's integer size."""
    domain = tiers[0].accelerators
    if isinstance(stride, float) and stride == 1.0:
        return np.minimum(n, domain)
    return clip(np.floor(domain / stride), 1.0, n)


def spans(accelerators, n, stride) -> np.ndarray:
    """Whether a group of ``n`` ranks ``stride`` apart spans more than one unit of ``accelerators``."""
    return _f(n) > np.maximum(np.floor(accelerators / _f(stride)), 1.0)


def outer_bw(tiers: tuple[Tier, ...], n, stride, field: str = "bw_Bps") -> np.ndarray:
    """Per-accelerator bandwidth (``field``: ``bw_Bps`` or ``a2a_bw_Bps``) of a group that leaves the scale-up domain:
    the smallest bandwidth / oversubscription of the tiers outside the domain it reaches (tier 1 always)."""
    bw = _f(getattr(tiers[1], field))
    if not _is_one(tiers[1].oversubscription):
        bw = bw / tiers[1].oversubscription
    for inner, tier in zip(tiers[1:-1], tiers[2:]):
        b = _f(getattr(tier, field))
        if not _is_one(tier.oversubscription):
            b = b / tier.oversubscription
        bw = np.where(spans(inner.accelerators, n, stride), np.minimum(bw, b), bw)
    return bw


def outer_alpha(tiers: tuple[Tier, ...], n, stride):
    """Per-step latency of a group that leaves the scale-up domain: the outermost tier's it reaches (a scalar while
    the tiers it may reach share one)."""
    alpha = tiers[1].alpha_s
    for inner, tier in zip(tiers[1:-1], tiers[2:]):
        a = tier.alpha_s
        if not (a is alpha or (np.ndim(a) == 0 and np.ndim(alpha) == 0 and a == alpha)):
            alpha = np.where(spans(inner.accelerators, n, stride), a, alpha)
    return alpha


def ring_link(tiers: tuple[Tier, ...], n, stride=1.0, per_domain=None) -> tuple[np.ndarray, np.ndarray]:
    """Effective per-rank bandwidth and per-step latency of a ring communicator of ``n`` ranks ``stride`` apart
    (module docstring): inside one domain (n <= its ranks per domain) the scale-up link; spanning domains
    min(scale-up bw, g x ``outer_bw``) at ``outer_alpha``. ``per_domain``: the group's ranks per domain when the
    caller has them (default ``ranks_per_domain``)."""
    n = _f(n)
    up = tiers[0]
    if per_domain is None:
        per_domain = ranks_per_domain(tiers, n, stride)
    # g = clip(per_domain, 1, max(n, 1)); n <= g <=> n <= max(per_domain, 1), and outside a domain (n > g) the
    # upper clip is inactive, so only the lower one is needed
    g = np.maximum(_f(per_domain), 1.0)
    inside = n <= g
    bw_up = _f(up.bw_Bps)
    shape = np.broadcast(inside, bw_up, tiers[1].bw_Bps, up.alpha_s, tiers[1].alpha_s).shape
    k = np.count_nonzero(inside)
    if k == inside.size:  # every row inside one domain
        return np.array(np.broadcast_to(bw_up, shape)), np.full(shape, up.alpha_s, dtype=np.float64)
    bw_x = np.minimum(bw_up, g * outer_bw(tiers, n, stride))
    alpha_x = outer_alpha(tiers, n, stride)
    if k == 0:
        return np.array(np.broadcast_to(bw_x, shape)), np.full(shape, alpha_x, dtype=np.float64)
    return np.where(inside, bw_up, bw_x), np.where(inside, _f(up.alpha_s), _f(alpha_x))


def p2p_link(tiers: tuple[Tier, ...], n, stride) -> tuple[np.ndarray, np.ndarray]:
    """Bandwidth and latency of the point-to-point transfer between neighbouring members of a group of ``n`` ranks
    ``stride`` apart (the pipeline's stages, stride tp*cp*dp): the scale-up link when the neighbour is in the same
    domain (stride < its accelerators), else min(scale-up bw, ``outer_bw``) at ``outer_alpha`` (one transfer, one
    NIC)."""
    up = tiers[0]
    inside = stride < up.accelerators
    bw_x = np.minimum(up.bw_Bps, outer_bw(tiers, n, stride))
    return np.where(inside, up.bw_Bps, bw_x), np.where(inside, up.alpha_s, outer_alpha(tiers, n, stride))
