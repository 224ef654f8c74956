"""The fast element-wise helpers give the numpy results on the values the model feeds them."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from models.physics import collectives as coll
from models.core.fastops import ceil_log2, clip, divisible

ints = st.integers(min_value=0, max_value=2**40)


@settings(max_examples=300, deadline=None)
@given(st.lists(ints, min_size=1, max_size=50), st.lists(st.integers(min_value=1, max_value=4096), min_size=1,
                                                         max_size=50))
def test_divisible_matches_mod(a, b):
    n = min(len(a), len(b))
    x, y = np.array(a[:n], dtype=float), np.array(b[:n], dtype=float)
    assert np.array_equal(divisible(x, y), np.mod(x, y) == 0)


def test_divisible_zero_and_nan_divisor_is_false():
    assert not divisible(np.array([4.0]), np.array([0.0]))[0]
    assert not divisible(np.array([4.0]), np.array([np.nan]))[0]
    assert not divisible(np.array([np.nan]), np.array([2.0]))[0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e12), min_size=1, max_size=50))
def test_ceil_log2_matches_numpy(xs):
    x = np.array(xs)
    assert np.array_equal(ceil_log2(x), np.ceil(np.log2(np.maximum(x, 1.0))))


def test_clip_matches_numpy_including_inverted_bounds():
    x = np.array([-3.0, 0.5, 2.0, 9.0, np.nan])
    assert np.array_equal(clip(x, 1.0, 4.0), np.clip(x, 1.0, 4.0), equal_nan=True)
    hi = np.array([0.5, 0.5, 8.0, 3.0, 1.0])
    assert np.array_equal(clip(x, 1.0, hi), np.clip(x, 1.0, hi), equal_nan=True)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=4096), st.floats(min_value=1e3, max_value=1e10),
       st.floats(min_value=1e9, max_value=1e12), st.floats(min_value=1e-7, max_value=1e-4))
def test_fused_auto_all_reduce_is_the_faster_of_ring_and_tree(n, nbytes, bw, alpha):
    ring = coll.ring_all_reduce_time(nbytes, n, bw, alpha)
    tree = coll.tree_all_reduce_time(nbytes, n, bw, alpha)
    auto = coll.all_reduce_time(nbytes, n, bw, alpha)
    assert np.isclose(auto, min(ring, tree), rtol=1e-12, atol=0.0)
