"""Universal Scalability Law (Gunther 1993, 2007): a three-parameter explanation of a scaling curve.

    X(n) = λ·n / (1 + σ·(n − 1) + κ·n·(n − 1))

* ``n``  = N / N₀: cluster size in units of the smallest cluster of the curve (N₀ accelerators), so λ is the
  throughput of that smallest cluster and σ, κ are per N₀-sized step (the usual USL convention with a
  single-node baseline).
* ``σ`` (contention, 0 ≤ σ ≤ 1): the serial fraction — work that does not shrink with n (Amdahl's term):
  pipeline bubbles, fixed per-step overheads, the part of a fixed global batch that cannot be split further.
* ``κ`` (coherency, κ ≥ 0): pairwise crosstalk — cost that grows with n² such as collectives whose latency or
  volume per rank grows with the group. κ > 0 gives a throughput maximum at ``n* = sqrt((1 − σ)/κ)``, after
  which adding accelerators *reduces* throughput.

Fitting: ``n / X(n) = 1/λ + (σ/λ)(n−1) + (κ/λ)·n(n−1)`` is linear in (1/λ, σ/λ, κ/λ) ≥ 0, so a non-negative
least-squares solve gives the start; a bounded least-squares refinement on log X (relative errors, so the
small-n points weigh as much as the large ones) enforces 0 ≤ σ ≤ 1, κ ≥ 0, λ > 0. A σ or κ whose term adds
less than 1e-6 to the denominator at the largest n is reported as exactly 0 (no peak). Pure numpy/scipy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import least_squares, nnls

NEGLIGIBLE = 1e-6


@dataclass(frozen=True)
class USLFit:
    lambda_: float  # throughput of the smallest cluster (units of the input X), at n = 1
    sigma: float  # contention, 0..1
    kappa: float  # coherency, >= 0
    n0: float  # accelerators in the smallest cluster (the unit of n)
    peak_n: float  # accelerators at the throughput maximum, N0*sqrt((1-sigma)/kappa); inf when kappa == 0
    rmse_log: float  # root-mean-square error of log X over the fitted points
    n_points: int

    def to_dict(self) -> dict:
        return asdict(self)


def usl_throughput(n_units, lambda_: float, sigma: float, kappa: float) -> np.ndarray:
    """X(n) for n in units of the baseline cluster."""
    n = np.asarray(n_units, dtype=np.float64)
    return lambda_ * n / (1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0))


def peak_units(sigma: float, kappa: float) -> float:
    """n* = sqrt((1 − σ)/κ) in baseline units; inf when κ = 0."""
    return math.sqrt(max(1.0 - sigma, 0.0) / kappa) if kappa > 0 else math.inf


def fit_usl(n_gpus, throughput, n0: float | None = None) -> USLFit | None:
    """Fit the USL to (N, X) points. ``n0`` defaults to the smallest N. Needs ≥ 3 finite positive points;
    returns None otherwise."""
    N = np.asarray(n_gpus, dtype=np.float64)
    X = np.asarray(throughput, dtype=np.float64)
    ok = np.isfinite(N) & np.isfinite(X) & (N > 0) & (X > 0)
    N, X = N[ok], X[ok]
    if len(N) < 3:
        return None
    base = float(n0) if n0 else float(N.min())
    n = N / base
    # linear start: n/X = a + b(n-1) + c n(n-1), a,b,c >= 0 (weighted by 1/(n/X) for relative errors)
    y = n / X
    A = np.column_stack([np.ones_like(n), n - 1.0, n * (n - 1.0)]) / y[:, None]
    coef, _ = nnls(A, np.ones_like(y))
    a = coef[0] if coef[0] > 0 else float(np.min(y))
    lam0, sig0, kap0 = 1.0 / a, min(coef[1] / a, 1.0), coef[2] / a
    scale_k = 1.0 / max(n.max() ** 2, 1.0)

    def resid(p):
        lam, sig, kap = math.exp(p[0]), p[1], p[2] * scale_k
        return np.log(usl_throughput(n, lam, sig, kap)) - np.log(X)

    p0 = np.array([math.log(lam0), sig0, kap0 / scale_k])
    lo, hi = np.array([-np.inf, 0.0, 0.0]), np.array([np.inf, 1.0, np.inf])
    p0 = np.clip(p0, lo + [0, 0, 0], [np.inf, 1.0, np.inf])
    best = None
    # a few starts: the NNLS one and two that put the loss on one term only (the problem is small)
    for start in (p0, np.array([p0[0], min(max(p0[1], 1e-3), 1.0), 0.0]), np.array([p0[0], 0.0, max(p0[2], 1e-3)])):
        res = least_squares(resid, start, bounds=(lo, hi), method="trf", x_scale="jac", max_nfev=2000)
        if best is None or res.cost < best.cost:
            best = res
    lam, sig, kap = math.exp(best.x[0]), float(best.x[1]), float(best.x[2] * scale_k)
    # terms worth less than NEGLIGIBLE of the denominator at the largest n are numerical dust: report 0
    top = float(n.max())
    if kap * top * (top - 1.0) < NEGLIGIBLE:
        kap = 0.0
    if sig * (top - 1.0) < NEGLIGIBLE:
        sig = 0.0
    rmse = float(np.sqrt(np.mean(resid(best.x) ** 2)))
    pk = peak_units(sig, kap)
    return USLFit(lambda_=lam, sigma=sig, kappa=kap, n0=base, peak_n=base * pk if math.isfinite(pk) else math.inf,
                  rmse_log=rmse, n_points=int(len(N)))
