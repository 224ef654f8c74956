"""Process-pool maps for CPU-bound pure work (the calibration's cross-validation folds; the curves, frontier and
hardware-choice searches, one accelerator per job).

Workers are started with `spawn` (polars and DuckDB run threads: a forked child could inherit a held lock).
`STEPCAST_WORKERS` caps the number of processes (default: the CPUs this process may use); 1 runs in-process.
A worker runs its BLAS on one thread: the workers already fill the CPUs, and a second BLAS thread per worker
only waits for a core (an SVD of the fit's small Jacobian took up to 0.5 s instead of 1 ms on a busy machine)."""

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


_BLAS_LIMIT = None


def single_thread_blas() -> None:
    """Limit this process's BLAS/OpenMP thread pools to one thread (a pool worker's initializer)."""
    global _BLAS_LIMIT
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # libraries not loaded yet
        os.environ[var] = "1"
    try:
        import numpy  # noqa: F401 - loaded now, so that the limit below reaches their BLAS
        import scipy.linalg  # noqa: F401
        from threadpoolctl import threadpool_limits
    except ImportError:  # without threadpoolctl the libraries keep their defaults
        return
    _BLAS_LIMIT = threadpool_limits(limits=1)


def pool_map(fn, jobs) -> list:
    """`list(map(fn, jobs))`, in a pool of `workers()` processes when there is more than one job and CPU."""
    jobs = list(jobs)
    n = min(workers(), len(jobs))
    if n <= 1:
        return [fn(j) for j in jobs]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn"), initializer=single_thread_blas) as ex:
        return list(ex.map(fn, jobs))


def map_jobs(fn, jobs: list[tuple[tuple, dict]], n_workers: int) -> list:
    """fn(*args, **kwargs) for every job, in order, in worker processes (spawned: no fork of a process holding the
    store) when there is more than one job and one worker (``workers()``: STEPCAST_WORKERS, else the CPUs this
    process may use)."""
    if n_workers <= 1 or len(jobs) <= 1:
        return [fn(*a, **k) for a, k in jobs]
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(max_workers=min(n_workers, len(jobs)), mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(fn, *a, **k) for a, k in jobs]
        return [f.result() for f in futures]
