"""pipeline.parallel: the process-pool maps, alone and inside the build's shared pools."""

import os

from pipeline import parallel


def _add(a, b=0):
    return a + b


def _pid(_=None):
    return os.getpid()


def test_map_jobs_and_pool_map_keep_the_order_in_and_out_of_shared_pools(monkeypatch):
    monkeypatch.setenv("STEPCAST_WORKERS", "2")
    jobs = [((i,), {"b": 10 * i}) for i in range(7)]
    want = [11 * i for i in range(7)]
    assert parallel.map_jobs(_add, jobs, 1) == want  # in-process
    assert parallel.map_jobs(_add, jobs, 2) == want  # a pool of its own
    assert parallel.shared_executor() is None
    with parallel.shared_pools():
        ex = parallel.shared_executor()
        assert ex is not None
        assert parallel.map_jobs(_add, jobs, 2) == want
        assert parallel.pool_map(_add, range(5)) == list(range(5))
        first = set(parallel.map_jobs(_pid, [((), {})] * 6, 2))
        again = set(parallel.map_jobs(_pid, [((), {})] * 6, 2))
        assert os.getpid() not in first and len(first | again) <= 2  # the same two workers each time
        with parallel.shared_pools():  # nested: the outer pools stay
            assert parallel.shared_executor() is ex
    assert parallel.shared_executor() is None


def test_shared_pools_are_skipped_on_one_cpu(monkeypatch):
    monkeypatch.setenv("STEPCAST_WORKERS", "1")
    with parallel.shared_pools():
        assert parallel.shared_executor() is None
        assert parallel.map_jobs(_add, [((1,), {}), ((2,), {})], parallel.workers()) == [1, 2]
