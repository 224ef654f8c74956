"""MoE options (models.moe): load imbalance, dropless vs capacity factor, expert tensor parallelism."""

from __future__ import annotations

import numpy as np

from models import moe


def test_effective_imbalance_dropless_capacity_and_padding():
    rho = np.array([1.5, 1.5, 1.5, 1.0, 1.5])
    cf = np.array([np.nan, 1.25, 2.0, 1.25, 1.25])
    pad = np.array([False, False, False, True, True])
    got = moe.effective_imbalance(rho, cf, pad)
    # dropless keeps the imbalance; a capacity below it caps the slowest rank; a capacity above it changes
    # nothing without padding; padded, every expert runs its full capacity (cf x mean) whatever the imbalance
    assert np.array_equal(got, [1.5, 1.25, 1.5, 1.25, 1.25])
    assert moe.effective_imbalance(1.0, np.nan) == 1.0  # the default is exactly 1


def test_capacity_factor_validity():
    assert list(moe.capacity_factor_valid([np.nan, 1.0, 0.5, 0.0, -1.0, np.inf])) == [True, True, True, False,
                                                                                       False, False]


def test_folding_rule_of_megatron_core():
    # tp*cp*dp per stage must be a multiple of etp*ep (parallel_state: world_size % (etp*ep*pp) == 0)
    tp, cp, dp = np.array([4, 4, 4, 2, 1]), np.array([1, 1, 2, 1, 1]), np.array([8, 8, 8, 32, 64])
    ep = np.array([8, 8, 64, 64, 64])
    etp = np.array([4, 2, 1, 2, 1.5])
    assert list(moe.folding_valid(tp, cp, dp, ep, etp)) == [True, True, True, False, False]


def test_resolve_etp_defaults_to_tp_and_folds_when_it_must():
    tp, cp, dp, ep = np.array([4, 2, 4, 8]), np.array([1, 1, 1, 1]), np.array([8, 32, 6, 4]), np.array([8, 64, 8, 16])
    etp, inferred = moe.resolve_etp(np.full(4, np.nan), tp, cp, dp, ep)
    # ep | dp: Megatron-Core's default etp = tp; ep = 64 on tp 2 x dp 32: only etp = 1 folds; tp 4 x dp 6 with
    # ep 8: 24/8 = 3, gcd(4, 3) = 1; tp 8 x dp 4, ep 16: 32/16 = 2, gcd(8, 2) = 2
    assert list(etp) == [4, 1, 1, 2] and list(inferred) == [False, True, True, True]
    assert moe.folding_valid(tp, cp, dp, ep, etp).all()
    # a stated etp is kept as stated (the validity rule judges it)
    etp2, inf2 = moe.resolve_etp(np.array([3.0, 1, 1, 1]), tp, cp, dp, ep)
    assert list(etp2) == [3, 1, 1, 1] and not inf2.any()


def test_expert_scales_are_exactly_one_at_the_defaults():
    t = np.array([1.0, 2.0, 4.0, 8.0])
    assert np.array_equal(moe.expert_weight_scale(t, t), np.ones(4))
    assert np.array_equal(moe.routed_tokens_factor(np.array([2.0, 8.0]), np.array([0.0, 1.0]), 1.0), [2.0, 9.0])
    assert np.array_equal(moe.expert_dp_size(t, 1.0, np.array([8.0, 8, 8, 8]), 4.0, t), [2.0, 2, 2, 2])
    assert np.array_equal(moe.ep_stride(t, 2.0, t), 2.0 * t)
    # etp = 1: experts / ep instead of / (ep tp); edp grows by tp; EP ranks are neighbours
    assert np.array_equal(moe.expert_weight_scale(t, 1.0), t)
    assert np.array_equal(moe.expert_dp_size(t, 1.0, 8.0, 4.0, 1.0), 2.0 * t)
    assert np.array_equal(moe.ep_stride(t[1:], 2.0, 1.0), [1.0, 1.0, 1.0])
