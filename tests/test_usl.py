"""The bounded Universal Scalability Law fit recovers known parameters."""

import math

import numpy as np
import pytest

from models.planning.usl import fit_usl, peak_units, usl_throughput

N = 8 * np.array([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512])


@pytest.mark.parametrize("lam,sigma,kappa", [(1000.0, 0.03, 2e-4), (5e4, 0.2, 0.0), (300.0, 0.0, 1e-3),
                                             (1.0, 0.5, 5e-5)])
def test_recovers_known_parameters(lam, sigma, kappa):
    fit = fit_usl(N, usl_throughput(N / 8, lam, sigma, kappa))
    assert fit.lambda_ == pytest.approx(lam, rel=1e-3)
    assert fit.sigma == pytest.approx(sigma, abs=1e-4)
    assert fit.kappa == pytest.approx(kappa, rel=1e-2, abs=1e-8)
    assert fit.n0 == 8 and fit.n_points == len(N)
    if kappa > 0:
        assert fit.peak_n == pytest.approx(8 * math.sqrt((1 - sigma) / kappa), rel=1e-2)
    else:
        assert fit.peak_n > 1e6 * N.max() or math.isinf(fit.peak_n)


def test_noisy_points_still_close():
    rng = np.random.default_rng(7)
    x = usl_throughput(N / 8, 1000.0, 0.03, 2e-4) * np.exp(rng.normal(0, 0.01, len(N)))
    fit = fit_usl(N, x)
    assert fit.sigma == pytest.approx(0.03, abs=0.005)
    assert fit.kappa == pytest.approx(2e-4, rel=0.1)
    assert fit.rmse_log < 0.02


def test_bounds_hold_for_superlinear_and_flat_data():
    fit = fit_usl(N, N ** 1.1)  # better than linear: the bounded fit stays at sigma = kappa = 0
    assert fit.sigma >= 0 and fit.kappa >= 0 and fit.sigma <= 1
    flat = fit_usl(N, np.full(len(N), 100.0))  # no gain at all: contention ~ 1
    assert flat.sigma == pytest.approx(1.0, abs=0.02)


def test_too_few_points_and_peak_formula():
    assert fit_usl([8, 16], [1.0, 2.0]) is None
    assert fit_usl([8, 16, 32], [1.0, float("nan"), 2.0]) is None
    assert peak_units(0.0, 0.0) == math.inf
    assert peak_units(0.19, 0.01) == pytest.approx(9.0)
