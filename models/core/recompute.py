"""What activation recomputation repeats, per recompute code (models.core.params.Recompute): the one rule the FLOP
counts (models.arch.accounting, models.arch.mla, models.physics.parts.flops_per_token) and the step time
(models.physics.parts.compute) apply.

Full recompute runs every layer's forward once more, from the layer input it stored, before that layer's backward
(the LM head is not recomputed); selective recompute runs the forward attention core once more (Korthikanti et al.
2022, section 5); no recompute repeats nothing. Hardware FLOPs per token (the HFU numerator, docs/model.md "FLOP
convention") therefore add 2 x the layers' matmul parameters + the forward attention core (+ the forward scan of
Mamba blocks) under full recompute, and the forward attention core under selective recompute.
"""

from __future__ import annotations

import numpy as np

from models.core.params import Recompute


def recomputed_work(recompute, full, selective):
    """Per row: ``full`` (one forward of the layers) where ``recompute`` is FULL, ``selective`` (the forward
    attention core) where it is SELECTIVE, 0.0 elsewhere (NONE; an unknown code, whose row is flagged invalid).
    The work may be FLOPs or seconds."""
    rc = np.asarray(recompute)
    return np.where(rc == Recompute.FULL, full, np.where(rc == Recompute.SELECTIVE, selective, 0.0))


def recompute_flops(recompute, layer_matmul_params, attn_core_fwd_flops, scan_fwd_flops=None):
    """Hardware FLOPs recomputation adds, per token (every caller's counts are per token): full recompute
    2 x ``layer_matmul_params`` (the matmul weights of the recomputed layers, LM head excluded) +
    ``attn_core_fwd_flops`` (+ ``scan_fwd_flops``, the Mamba blocks' forward scan); selective recompute
    ``attn_core_fwd_flops``."""
    full = 2.0 * layer_matmul_params + attn_core_fwd_flops
    if scan_fwd_flops is not None:
        full = full + scan_fwd_flops
    return recomputed_work(recompute, full, attn_core_fwd_flops)
