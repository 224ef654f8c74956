"""2-D tensor parallelism: d_model and d_ff (and the heads) split over an r x c grid of the tp ranks.

Beside Megatron's 1-D tensor parallelism (``tp_mode`` "1d": every weight split along one dimension over all tp
ranks, two all-reduces of the full T x h activations per layer and pass), the "2d" mode is the 2-D
weight-stationary layout of Pope et al. 2022 ("Efficiently Scaling Transformer Inference", arXiv:2211.05102,
section 3.2): each weight is split in both dimensions over the grid and never moves; only activations move, and a
GPU's share of them shrinks with the grid. This is the form of 2-D tensor parallelism Erdil & Schneider-Joseph
2024 ("Data movement limits to frontier model training", arXiv:2411.01137) assume: communication per GPU falling
as 1/sqrt(tp). (Optimus, Xu et al. 2021, arXiv:2104.05343, as implemented in ColossalAI's legacy parallel_2d
layers, is a SUMMA algorithm on a q x q grid that broadcasts weight blocks as well as activation blocks in every
GEMM: it moves ~h f / q weight elements per GEMM per GPU besides the activations, more than the layout here
whenever a micro-batch holds fewer than ~f tokens per grid row; it is not modelled.)

Grid (``grid``): r = the largest divisor of tp that is <= sqrt(tp), c = tp / r (r <= c; prime tp gives 1 x tp,
which is Megatron's 1-D layout with sequence parallelism: the same bytes). GPU (i, j), i < r, j < c, holds

  weights   W_qkv[h/r (i), (q + 2 kv)/c (j)], W_o[q/c (j), h/r (i)], W_1[h/r (i), (n_mats - 1) F/c (j)],
            W_2[F/c (j), h/r (i)]: every weight, its gradient and optimizer state split over all r c = tp ranks
            (the memory of 1-D tensor parallelism).
  between layers  the residual stream X[T/c (j), h/r (i)]: tokens over the c-group, d_model over the r-group
            (T = tokens of one micro-batch on one context-parallel rank). LayerNorm statistics need a T/c-row
            all-reduce over the r-group: 2 numbers per token, neglected.

Forward of one layer on GPU (i, j) (Pope et al.'s 2-D weight-stationary sequence, written out per collective):

  attention  all-gather X over the c-group           -> X[T, h/r]            c-group, buffer T h / r
             partial X W_qkv, reduce-scatter over r   -> QKV[T, (q+2kv)/tp]   r-group, buffer T (q + 2 kv) / c
             attention core on heads / tp (all T tokens; as in 1-D)
             all-gather the output over the r-group   -> O[T, q/c]            r-group, buffer T q / c
             partial O W_o, reduce-scatter over c     -> X[T/c, h/r]          c-group, buffer T h / r
  MLP        all-gather X over the c-group           -> X[T, h/r]            c-group, buffer T h / r
             partial X W_1, reduce-scatter over r     -> [T, (n_mats-1)F/tp]  r-group, buffer T (n_mats - 1) F / c
             activation (GeLU, or SwiGLU's gate x up) on F / tp
             all-gather over the r-group              -> [T, F/c]             r-group, buffer T F / c
             partial . W_2, reduce-scatter over c     -> X[T/c, h/r]          c-group, buffer T h / r

Bytes each GPU sends per layer and forward pass (ring all-gather / reduce-scatter of a B-byte buffer over n ranks
send (n - 1)/n B, models.physics.collectives; a = bytes per activation element):

  c-group   4 (c - 1)/c  a T h / r
  r-group     (r - 1)/r  a T (2 q + 2 kv + n_mats F) / c

The backward pass runs the transposed collectives (every all-gather a reduce-scatter and vice versa): the same bytes
again, as the 1-D model charges its all-reduces again in backward; the weight gradients are local (weights are
stationary). Inputs the weight gradients need are re-gathered in backward, as Megatron's sequence parallelism does,
and like the 1-D model (whose sequence-parallel backward all-gathers are not charged either) that is not counted.
Megatron's 1-D layer sends 2 all-reduces of a T h: 4 (tp - 1)/tp a T h. For multi-head attention, F = 4 h, GeLU
(n_mats = 2) on a square grid r = c = sqrt(tp) the ratio 2-D / 1-D is 4 / (sqrt(tp) + 1): 4/9 at tp = 64, 1/4 at
tp = 225 (derived from the two sums above; tested). At the aspect r/c = 4 h / (2 q + 2 kv + n_mats F) the sum is
smallest (Pope et al.'s optimum); the near-square rule is kept (for F = 4 h, MHA the optimum is r ~ sqrt(tp/3),
and the square grid sends at most ~15 % more).

Tiers: the r-group (the larger bytes per GPU) is r consecutive ranks (stride 1: inside a node when r <= the node),
the c-group c ranks r apart (stride r), each paying the tiers it spans (``models.physics.network.ring_link``).

Compute: the same FLOPs per GPU as 1-D (each GEMM is 1/tp of the layer's); the GEMMs read and write the gathered
activations: per token h/r in and out of the QKV / W_1 GEMMs and of the W_o / W_2 ones, (q + 2 kv)/c, q/c,
(n_mats - 1) F/c and F/c on the split side (``gemm_io_elems_per_token``) instead of 1-D's full h and the /tp split.
Element-wise traffic and activation memory are those of 1-D with sequence parallelism (everything split over tp).

Validity (``valid``): heads (and kv heads) split over tp as in 1-D; d_model divisible by r; ffn_dim (routed
experts: expert_ffn_dim) divisible by tp; tokens per micro-batch and context-parallel rank divisible by c. Hybrid
Mamba-Transformer, MLA and MTP rows are not modelled in 2-D (refused).
"""

from __future__ import annotations

import numpy as np

from models.core.fastops import divisible
from models.core.params import TP_MODE_CODES
from models.physics import collectives as coll
from models.physics import network

TP_MODES = tuple(TP_MODE_CODES)


#: the smallest tensor-parallel degree the searches try the 2-D grid at: a 2 x 2 grid sends a T h + a T (2q + 2kv +
#: n_mats F) / 4 per layer against Megatron's 3 a T h, more whenever 2 kv + n_mats F > 6 h at q = h (every usual shape)
MIN_TP = 4


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def grid(tp):
    """(r, c): r the largest divisor of tp with r <= sqrt(tp), c = tp / r (vectorized; tp < 1 or non-integer -> NaN)."""
    t = _f(tp)
    ok = np.isfinite(t) & (t >= 1) & (t == np.floor(t))
    ti = np.where(ok, t, 1.0).astype(np.int64)
    r = np.ones_like(ti)
    for d in range(2, int(np.sqrt(ti.max(initial=1))) + 1):  # d <= sqrt(max tp): at most a few thousand steps
        r = np.where((ti % d == 0) & (d * d <= ti), d, r)
    r = np.where(ok, r.astype(np.float64), np.nan)
    return r, np.where(ok, t / r, np.nan)


def _grid(tp, rc):
    """``rc`` (the caller's ``grid(tp)``, computed once per block) or ``grid(tp)``."""
    return grid(tp) if rc is None else rc


def comm_bytes_per_layer(tokens, d_model, q_dim, kv_dim, ffn, n_mats, r, c, act_bytes=2.0):
    """(r-group bytes, c-group bytes) each GPU sends per layer in one forward pass (module docstring)."""
    r, c = _f(r), _f(c)
    aT = _f(act_bytes) * _f(tokens)
    col = 4.0 * (c - 1.0) / c * aT * _f(d_model) / r
    row = (r - 1.0) / r * aT * (2.0 * _f(q_dim) + 2.0 * _f(kv_dim) + _f(n_mats) * _f(ffn)) / c
    return row, col


def megatron_bytes_per_layer(tokens, d_model, tp, act_bytes=2.0):
    """Bytes each GPU sends per layer and forward pass in Megatron's 1-D form: 2 ring all-reduces of a T h."""
    return 2.0 * coll.ring_all_reduce_bytes(_f(act_bytes) * _f(tokens) * _f(d_model), tp)


def links(tiers, tp, rc=None):
    """Bandwidth and latency of the (r-group, c-group) on the network ``tiers`` (models.physics.network):
    ``((bw_r, a_r), (bw_c, a_c))``. The r-group is r consecutive ranks, the c-group c ranks r apart (module
    docstring, "Tiers"). ``rc``: ``grid(tp)`` when the caller has it."""
    r, c = _grid(tp, rc)
    return network.ring_link(tiers, r), network.ring_link(tiers, c, r)


def layer_comm_s(tiers, tokens, d_model, q_dim, kv_dim, ffn, n_mats, tp, act_bytes=2.0, rc=None, lk=None):
    """Time of one layer's 2-D tensor-parallel collectives in one pass (forward; backward is the same) on the
    network ``tiers``, seconds: 4 ring all-gathers/reduce-scatters on the c-group and 4 on the r-group (module
    docstring), run in series. ``rc``: ``grid(tp)``, ``lk``: ``links(tiers, tp, rc)``, when the caller has them."""
    rc = _grid(tp, rc)
    r, c = rc
    aT = _f(act_bytes) * _f(tokens)
    (bw_r, a_r), (bw_c, a_c) = links(tiers, tp, rc) if lk is None else lk
    t_col = 4.0 * coll.all_gather_time(aT * _f(d_model) / r, c, bw_c, a_c)
    q, kv, F, nm = _f(q_dim), _f(kv_dim), _f(ffn), _f(n_mats)
    t_row = (coll.reduce_scatter_time(aT * (q + 2.0 * kv) / c, r, bw_r, a_r)
             + coll.all_gather_time(aT * q / c, r, bw_r, a_r)
             + coll.reduce_scatter_time(aT * (nm - 1.0) * F / c, r, bw_r, a_r)
             + coll.all_gather_time(aT * F / c, r, bw_r, a_r))
    return t_row + t_col


def comm_time_per_layer_s(tokens, d_model, q_dim, kv_dim, ffn, n_mats, tp, node, bw_up, bw_out, a_up, a_out,
                          act_bytes=2.0, pods=None, rc=None):
    """``layer_comm_s`` on the network given by its links (``network.of_links``: a scale-up domain of ``node``
    accelerators; ``pods`` = (pod size, oversubscription) of an oversubscribed tier above pods)."""
    tiers = network.of_links(_f(node), bw_up, bw_out, a_up, a_out, pods=pods)
    return layer_comm_s(tiers, tokens, d_model, q_dim, kv_dim, ffn, n_mats, tp, act_bytes, rc)


def gemm_io_elems_per_token(d_model, q_dim, kv_dim, ffn, n_mats, tp, rc=None):
    """Activation elements per token the forward GEMMs of one GPU read and write: (attention, MLP). Attention: X
    h/r into W_qkv, (q + 2 kv)/c out, q/c into W_o, h/r out; MLP: h/r in, (n_mats - 1) F/c out, F/c in, h/r out."""
    r, c = _grid(tp, rc)
    h2r = 2.0 * _f(d_model) / r
    return h2r + (2.0 * _f(q_dim) + 2.0 * _f(kv_dim)) / c, h2r + _f(n_mats) * _f(ffn) / c


def valid(tp, d_model, ffn, tokens, expert_ffn=None, n_experts=None, rc=None):
    """Rows whose 2-D grid splits the shapes evenly (module docstring, "Validity"); heads are checked as in 1-D."""
    t = _f(tp)
    r, c = _grid(t, rc)
    ok = np.isfinite(r) & divisible(_f(d_model), r) & divisible(_f(ffn), t) & divisible(_f(tokens), c)
    if expert_ffn is not None and n_experts is not None:
        moe = _f(n_experts) > 0
        ok &= ~moe | divisible(_f(expert_ffn), t)
    return ok


def moe_io_elems_per_token(d_model, top_k, ffn_moe, n_mats, tp, rc=None):
    """Activation elements per token the forward expert GEMMs of one GPU read and write (MoE layers): the
    dispatched copies' h/r in and out ((1 + top_k) 2 h / r, as 1-D counts (1 + top_k) 2 h) and n_mats F_moe / c."""
    r, c = _grid(tp, rc)
    return (1.0 + _f(top_k)) * 2.0 * _f(d_model) / r + _f(n_mats) * _f(ffn_moe) / c


def stage_comm_s(tiers, Ls_dense, Ls_moe, n_passes, tokens, d_model, q_dim, kv_dim, ffn, ffn_moe, n_mats, tp,
                 act_bytes, rc=None):
    """Tensor-parallel communication of one micro-batch on a stage of ``Ls_dense`` dense and ``Ls_moe`` MoE layers
    over ``n_passes`` passes (forward, backward, a recomputed forward) on the network ``tiers``, seconds. ``rc``:
    ``grid(tp)`` when the caller has it."""
    rc = _grid(tp, rc)
    lk = links(tiers, tp, rc)  # the same grid and links for the dense and the MoE layers
    per = _f(Ls_dense) * layer_comm_s(tiers, tokens, d_model, q_dim, kv_dim, ffn, n_mats, tp, act_bytes, rc, lk)
    if np.any(_f(Ls_moe) > 0):
        per = per + _f(Ls_moe) * layer_comm_s(tiers, tokens, d_model, q_dim, kv_dim, ffn_moe, n_mats, tp, act_bytes,
                                              rc, lk)
    return _f(n_passes) * per


def tp_comm_s(Ls_dense, Ls_moe, n_passes, tokens, d_model, q_dim, kv_dim, ffn, ffn_moe, n_mats, tp, node, bw_up,
              bw_out, a_up, a_out, act_bytes, pods=None, rc=None):
    """``stage_comm_s`` on the network given by its links (as ``comm_time_per_layer_s``)."""
    tiers = network.of_links(_f(node), bw_up, bw_out, a_up, a_out, pods=pods)
    return stage_comm_s(tiers, Ls_dense, Ls_moe, n_passes, tokens, d_model, q_dim, kv_dim, ffn, ffn_moe, n_mats, tp,
                        act_bytes, rc)
