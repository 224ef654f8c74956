"""A process-pool `map` for CPU-bound pure work (the calibration's cross-validation folds).

Workers are started with `spawn` (polars and DuckDB run threads: a forked child could inherit a held lock).
`STEPCAST_WORKERS` caps the number of processes (default: the CPUs this process may use); 1 runs in-process."""

from __future__ import annotations

import os


def workers() -> int:
    env = os.environ.get("STEPCAST_WORKERS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def pool_map(fn, jobs) -> list:
    """`list(map(fn, jobs))`, in a pool of `workers()` processes when there is more than one job and CPU."""
    jobs = list(jobs)
    n = min(workers(), len(jobs))
    if n <= 1:
        return [fn(j) for j in jobs]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(fn, jobs))
