"""Process-pool maps for CPU-bound pure work (the calibration's cross-validation folds; the curves, frontier and
hardware-choice searches, one accelerator per job).

Workers are started with `spawn` (polars and DuckDB run threads: a forked child could inherit a held lock).
`STEPCAST_WORKERS` caps the number of processes (default: the CPUs this process may use); 1 runs in-process.
A worker runs its BLAS on one thread: the workers already fill the CPUs, and a second BLAS thread per worker
only waits for a core (an SVD of the fit's small Jacobian took up to 0.5 s instead of 1 ms on a busy machine).
`stepcast build` runs its steps in processes of their own (Dagster's multiprocess executor), each step with its
own pool; their workers take turns on `workers()` CPU slots (`cpu_slot`), so two steps sweeping at the same time
run no more jobs at once than there are CPUs."""

from __future__ import annotations

import contextlib
import os
import time


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


#: a folder of CPU slot files shared by the processes of one `stepcast build` (its steps run in processes of their
#: own, each with its pool): a pool worker holds a slot (an flock) while it runs a job, so the pools of steps
#: running at the same time never run more jobs at once than there are slots (`workers()`)
SLOTS_ENV = "STEPCAST_CPU_SLOTS"


@contextlib.contextmanager
def cpu_slot():
    """Hold one of the build's CPU slots (see SLOTS_ENV) while the block runs; no-op outside such a build."""
    folder = os.environ.get(SLOTS_ENV)
    if not folder or not os.path.isdir(folder):
        yield
        return
    import fcntl

    n = workers()
    held = None
    while held is None:
        for i in range(n):
            fh = open(os.path.join(folder, f"slot{i}"), "a")
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                continue
            held = fh
            break
        else:
            time.sleep(0.02)
    try:
        yield
    finally:
        held.close()


class _InSlot:
    """``fn`` run while holding a CPU slot (picklable: the pool's workers get it by reference)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        with cpu_slot():
            return self.fn(*args, **kwargs)


def slots_dir():
    """The slot files' folder (one per user: builds running at the same time share the CPUs too)."""
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.gettempdir()) / f"stepcast-cpu-slots-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    return folder


def _slotted(fn):
    return _InSlot(fn) if os.environ.get(SLOTS_ENV) else fn


def pool_map(fn, jobs) -> list:
    """`list(map(fn, jobs))`, in a pool of `workers()` processes when there is more than one job and CPU (the
    build's pool when `shared_pools` holds one)."""
    jobs = list(jobs)
    n = min(workers(), len(jobs))
    if n <= 1:
        return [fn(j) for j in jobs]
    if "blas1" in _SHARED:
        return list(_SHARED["blas1"].map(fn, jobs))
    with _pool(n, single_thread_blas) as ex:
        return list(ex.map(_slotted(fn), jobs))


def map_jobs(fn, jobs: list[tuple[tuple, dict]], n_workers: int) -> list:
    """fn(*args, **kwargs) for every job, in order, in worker processes (spawned: no fork of a process holding the
    store) when there is more than one job and one worker (``workers()``: STEPCAST_WORKERS, else the CPUs this
    process may use); in the build's pool when `shared_pools` holds one."""
    if n_workers <= 1 or len(jobs) <= 1:
        return [fn(*a, **k) for a, k in jobs]
    if _SHARED_N and n_workers >= _SHARED_N:
        pool = shared_executor()
        futures = [pool.submit(fn, *a, **k) for a, k in jobs]
        return [f.result() for f in futures]
    with _pool(min(n_workers, len(jobs)), single_thread_blas) as pool:
        fn = _slotted(fn)
        futures = [pool.submit(fn, *a, **k) for a, k in jobs]
        return [f.result() for f in futures]


def _pool(n: int, initializer=None):
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    return ProcessPoolExecutor(max_workers=n, mp_context=get_context("spawn"), initializer=initializer)


_SHARED: dict = {}  # the pool `shared_pools` holds open: "blas1" (pool_map's and map_jobs')
_SHARED_N = 0


def shared_executor():
    """The build's pool for `map_jobs` (a ``concurrent.futures`` executor) while `shared_pools` is open, else None:
    the fit's pool, whose workers are already started and run their BLAS on one thread (with a BLAS thread pool per
    worker, the plan's searches took ~13 s instead of ~10 s on two cores)."""
    if not _SHARED_N:
        return None
    return _SHARED["blas1"]


#: what the fit's workers import before their first task (the modules of its fold tasks), while ingest runs
_WARM = ("models.fitting.calibration", "scipy.optimize")


def _warm(modules: tuple[str, ...]) -> None:
    import importlib

    for name in modules:
        importlib.import_module(name)


@contextlib.contextmanager
def shared_pools():
    """Keep one worker pool open for `pool_map` and `map_jobs` while the block runs (a run of several assets in one
    process; `stepcast build` runs each step in a process of its own, so its steps do not share one): it is spawned
    once and every later call reuses it instead of spawning and importing again (2-3 s per pool on two cores).
    It starts at once and its workers import the fit's modules while the first, serial steps (ingest) leave a core
    free; each worker runs its BLAS on one thread (`single_thread_blas`). Workers hold no state between tasks
    besides imported modules and their caches."""
    global _SHARED_N
    n = workers()
    if n <= 1 or _SHARED_N:  # one CPU, or already inside shared_pools
        yield
        return
    fit_pool = _pool(n, single_thread_blas)
    for _ in range(n):
        fit_pool.submit(_warm, _WARM)
    _SHARED["blas1"] = fit_pool
    _SHARED_N = n
    try:
        yield
    finally:
        pools = list(_SHARED.values())
        _SHARED.clear()
        _SHARED_N = 0
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)
