"""The physical bound of every interval: no step faster than the compute roofline of the work it does."""

from __future__ import annotations

import numpy as np


def bound_interval(res: dict, up: np.ndarray, down: np.ndarray) -> dict:
    """Set the interval of `res` to step x exp(-down) .. step x exp(up) (throughput inversely), with the physical
    bound: no step faster than the compute roofline of the work the step does (hardware FLOPs at the peak: HFU
    <= 1, hence MFU <= 1), so exp(down) is capped at 1 / HFU. Returns `res`."""
    step, tput = res["step_time_s"], res["tokens_per_s_per_gpu"]
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.asarray(res.get("hfu", np.full(len(np.atleast_1d(step)), np.nan)), dtype=float)
        cap = np.where(np.isfinite(h) & (h > 0), np.log(np.maximum(1.0 / h, 1.0)), np.inf)
    down = np.minimum(down, cap)
    res["step_time_lo_s"], res["step_time_hi_s"] = step * np.exp(-down), step * np.exp(up)
    res["tokens_per_s_per_gpu_lo"], res["tokens_per_s_per_gpu_hi"] = tput * np.exp(-up), tput * np.exp(down)
    return res
