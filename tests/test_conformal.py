"""Conformal intervals (models.conformal): statistical validity on synthetic data with a known answer."""

import numpy as np
import pytest

from models import conformal


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
