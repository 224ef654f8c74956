"""Split/cross conformal intervals on the log ratio, normalised by a novelty score (pure numpy + sklearn).

Score of a run: |e| / sigma(x), with e = log(measured / predicted) of an out-of-group prediction and
sigma(x) = 1 + kappa * d(x): d is the distance from x to its k-th nearest training configuration in
standardised feature space, divided by the median such distance inside the training set. A configuration
like the training data has sigma ~ 1 + kappa; new hardware or a new scale sits far away and gets a wider
interval (normalised conformal prediction, Papadopoulos et al. 2008; Lei et al. 2018, section 5.2).

The interval for level 1 - alpha is predicted * exp(+- q * sigma(x)), q = the ceil((n + 1)(1 - alpha))-th
smallest of n calibration scores (split conformal; finite-sample marginal coverage >= 1 - alpha when the
scores are exchangeable, Vovk et al. 2005).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

K_NEIGHBOURS = 5


def conformal_quantile(scores: np.ndarray, alpha: float = 0.1) -> float:
    """The ceil((n+1)(1-alpha))-th smallest score (inf when n is too small for the level)."""
    s = np.sort(np.asarray(scores, dtype=float)[np.isfinite(scores)])
    n = len(s)
    k = int(np.ceil((n + 1) * (1.0 - alpha)))
    if n == 0 or k > n:
        return float("inf")
    return float(s[k - 1])


@dataclass
class Novelty:
    """kNN distance to a reference set in standardised feature space, relative to the set's own spread."""

    mean: np.ndarray
    scale: np.ndarray
    reference: np.ndarray
    typical: float

    @classmethod
    def fit(cls, X: np.ndarray, k: int = K_NEIGHBOURS) -> "Novelty":
        mean = X.mean(axis=0)
        scale = X.std(axis=0)
        scale = np.where(scale > 1e-12, scale, 1.0)
        Z = (X - mean) / scale
        d = _kth_distance(Z, Z, k + 1)  # +1: each point is its own nearest neighbour
        typical = float(np.median(d)) if len(d) else 1.0
        return cls(mean=mean, scale=scale, reference=Z, typical=max(typical, 1e-9))

    def distance(self, X: np.ndarray, k: int = K_NEIGHBOURS) -> np.ndarray:
        Z = (X - self.mean) / self.scale
        return _kth_distance(Z, self.reference, k) / self.typical


def _kth_distance(Q: np.ndarray, R: np.ndarray, k: int) -> np.ndarray:
    from sklearn.neighbors import NearestNeighbors

    k = max(1, min(k, len(R)))
    nn = NearestNeighbors(n_neighbors=k).fit(R)
    dist, _ = nn.kneighbors(Q)
    return dist[:, -1]


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
