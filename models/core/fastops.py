"""Element-wise helpers that are several times faster than their numpy namesakes on the
8,192-row blocks the step-time model works in (``np.mod`` ~85 us, ``np.clip`` ~10 us,
``np.select`` ~95 us, ``np.log2`` ~10 us per block vs ~3 us for an add; measured with
timeit on the development machine). Same results as the numpy forms on the values the model
uses (finite integers below 2**53 for ``divisible``/``ceil_log2``).
"""

from __future__ import annotations

import numpy as np


def clip(x, lo, hi) -> np.ndarray:
    """``np.clip(x, lo, hi)``: ``minimum(maximum(x, lo), hi)``, which is exactly what np.clip computes."""
    return np.minimum(np.maximum(x, lo), hi)


def divisible(a, b) -> np.ndarray:
    """``np.mod(a, b) == 0`` for finite integer-valued floats: b * floor(a / b) == a. A zero or NaN
    divisor or a NaN dividend gives False, like the ``mod`` form (rows with infinite values are
    rejected by the model's input check before this matters)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return b * np.floor(a / b) == a


def ceil_log2(n) -> np.ndarray:
    """``ceil(log2(max(n, 1)))`` for finite n, via the binary exponent: ceil(log2 x) = ceil(log2 ceil(x)) for x >= 1,
    and for an integer k >= 1 ceil(log2 k) is the frexp exponent of k - 1."""
    k = np.ceil(np.maximum(n, 1.0)) - 1.0
    return np.frexp(k)[1].astype(np.float64)
