"""Conformal intervals (models.fitting.conformal): statistical validity on synthetic data with a known answer."""

import numpy as np
import pytest

from models.fitting import conformal


def test_split_conformal_coverage_across_seeds():
    """y = 2x + heavy-tailed noise; the model is known, the interval uses only the calibration scores.
    Split conformal promises E[coverage] = ceil((n+1)(1-a))/(n+1) = 0.9005 for n = 200, a = 0.1."""
    covs = []
    for seed in range(200):
        rng = np.random.default_rng(seed)
        x_cal, x_test = rng.uniform(0, 1, 200), rng.uniform(0, 1, 1000)
        y_cal = 2 * x_cal + rng.standard_t(3, 200)
        y_test = 2 * x_test + rng.standard_t(3, 1000)
        q = conformal.conformal_quantile(np.abs(y_cal - 2 * x_cal), 0.1)
        covs.append(np.mean(np.abs(y_test - 2 * x_test) <= q))
    covs = np.array(covs)
    assert abs(covs.mean() - 181 / 201) < 0.006
    # per seed it is Beta(181, 20)-distributed (sd 0.021) plus test-sample noise (sd 0.009): within ~4 sd
    assert covs.min() > 0.80 and covs.max() < 0.99
    assert 0.015 < covs.std() < 0.03


def test_grouped_coverage_exchangeable_groups_and_misspecified_group():
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(20), 50)
    err = np.abs(rng.normal(0, 0.1, len(groups)))
    cov, q, width = conformal.grouped_coverage(err, np.ones(len(err)), groups, 0.1)
    assert 0.87 < cov.mean() < 0.93
    assert np.all(width > 0) and np.allclose(width, np.exp(q) - np.exp(-q))
    # a group whose errors are 5x larger than the others' is not covered: its own scores never calibrate it
    err2 = err.copy()
    err2[groups == 0] *= 5
    cov2, _, _ = conformal.grouped_coverage(err2, np.ones(len(err)), groups, 0.1)
    assert cov2[groups == 0].mean() < 0.6


def test_quantile_needs_enough_scores():
    assert conformal.conformal_quantile(np.ones(5), 0.1) == float("inf")  # ceil(6 * 0.9) = 6 > 5
    assert conformal.conformal_quantile(np.arange(1, 20), 0.1) == 18.0  # ceil(20 * 0.9) = 18th smallest


# ------------------------------------------------------------------ the width model (normalized conformal)

def test_width_model_covers_each_kind_of_run_where_a_constant_width_does_not():
    """Errors of MoE runs 3x those of dense runs (a known answer). A constant half-width calibrated on the mix
    over-covers the dense runs and under-covers the MoE ones; the width model (models.fitting.calibration.fit_width_model,
    the serving function's `width_features`) finds most of the factor and covers both within 85-95 %."""
    from models.fitting.calibration import fit_width_model
    from models.fitting.predictor import WIDTH_FEATURES

    rng = np.random.default_rng(7)
    n = 6000
    moe = rng.random(n) < 0.3
    F = np.zeros((n, len(WIDTH_FEATURES)))
    F[:, 0], F[:, WIDTH_FEATURES.index("is_moe")] = 1.0, moe
    err = np.abs(rng.normal(0.0, np.where(moe, 0.3, 0.1)))  # held-out errors of about 8 % and 24 % (median)
    cal, test = np.arange(n) < n // 2, np.arange(n) >= n // 2
    coef = fit_width_model(F[cal], err[cal], np.ones(cal.sum()))
    # the factor on the log scale of |error| + 0.01 (the floor pulls it a little below 3)
    assert 2.3 < np.exp(coef[WIDTH_FEATURES.index("is_moe")]) < 3.2
    s = np.exp(F @ coef)
    q = conformal.conformal_quantile(err[cal] / s[cal], 0.1)
    q_const = conformal.conformal_quantile(err[cal], 0.1)
    for grp in (moe, ~moe):
        assert 0.85 < np.mean(err[test & grp] <= q * s[test & grp]) < 0.95
    assert np.mean(err[test & moe] <= q_const) < 0.80 and np.mean(err[test & ~moe] <= q_const) > 0.97


def test_served_interval_follows_the_width_model_and_old_fits_keep_constant_widths():
    """A calibration with a width model widens a MoE configuration's interval by exp(coef_moe) against a dense one
    of the same layout; a fit stored without one (width_coef None) keeps the constant half-width."""
    from models.fitting.predictor import WIDTH_FEATURES, width_features, width_scale

    a = {"n_experts": np.array([0.0, 64.0]), "n_gpus": np.array([64.0, 64.0]), "dtype": np.array([0, 0])}
    F = width_features(a, 2)
    assert F.shape == (2, len(WIDTH_FEATURES)) and F[:, WIDTH_FEATURES.index("is_moe")].tolist() == [0.0, 1.0]
    assert np.allclose(F[:, WIDTH_FEATURES.index("log2_n_gpus_over_10")], 0.6)

    class Cal:
        width_coef = np.zeros(len(WIDTH_FEATURES))

    Cal.width_coef[WIDTH_FEATURES.index("is_moe")] = 0.4
    s = width_scale(Cal, a, 2)
    assert np.isclose(s[1] / s[0], np.exp(0.4))

    class Old:
        pass

    assert width_scale(Old, a, 2) == 1.0
