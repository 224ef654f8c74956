"""Split/cross conformal intervals on the log ratio (pure numpy).

Score of a run: |e| / sigma, with e = log(measured / predicted) of an out-of-group prediction; the
calibration uses sigma = 1 and one quantile per domain class (inside the fit's domain / extrapolated,
models.fitting.calibration), the normalised form (sigma > 1 where a configuration is far from the data) stays
available (normalised conformal prediction, Papadopoulos et al. 2008; Lei et al. 2018, section 5.2).

The interval for level 1 - alpha is predicted * exp(+- q * sigma(x)), q = the ceil((n + 1)(1 - alpha))-th
smallest of n calibration scores (split conformal; finite-sample marginal coverage >= 1 - alpha when the
scores are exchangeable, Vovk et al. 2005).
"""

from __future__ import annotations

import numpy as np


def conformal_quantile(scores: np.ndarray, alpha: float = 0.1) -> float:
    """The ceil((n+1)(1-alpha))-th smallest score (inf when n is too small for the level)."""
    s = np.sort(np.asarray(scores, dtype=float)[np.isfinite(scores)])
    n = len(s)
    k = int(np.ceil((n + 1) * (1.0 - alpha)))
    if n == 0 or k > n:
        return float("inf")
    return float(s[k - 1])


def sigma(distance: np.ndarray, kappa: float) -> np.ndarray:
    return 1.0 + kappa * np.asarray(distance, dtype=float)


def interval(pred: np.ndarray, q: float, sig: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Multiplicative interval of a positive prediction: pred * exp(-+ q sigma)."""
    w = q * np.asarray(sig, dtype=float)
    return pred * np.exp(-w), pred * np.exp(w)


def grouped_coverage(abs_err: np.ndarray, sig: np.ndarray, groups: np.ndarray, alpha: float = 0.1):
    """Leave-one-group-out conformal: the quantile for group g comes only from the other groups' scores.

    abs_err: |log(measured / out-of-group prediction)|; sig: sigma of each run w.r.t. the fold that
    predicted it. Returns (covered per run (bool), q per run, relative width per run (hi - lo) / pred)."""
    scores = abs_err / sig
    covered = np.zeros(len(abs_err), dtype=bool)
    qs = np.zeros(len(abs_err))
    for g in np.unique(groups):
        inside = groups == g
        q = conformal_quantile(scores[~inside], alpha)
        qs[inside] = q
        covered[inside] = abs_err[inside] <= q * sig[inside]
    width = np.exp(qs * sig) - np.exp(-qs * sig)
    return covered, qs, width
