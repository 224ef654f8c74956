"""2-D tensor parallelism (models.tp2d): grid rule, bytes per GPU against 1-D, monotonicity, validity."""

import numpy as np
import pytest

from models import tp2d


def test_grid_rule():
    r, c = tp2d.grid(np.array([1, 2, 4, 6, 8, 12, 16, 32, 64, 512, 7, 0.5]))
    assert r[:11].tolist() == [1, 1, 2, 2, 2, 3, 4, 4, 8, 16, 1]
    assert (r[:11] * c[:11]).tolist() == [1, 2, 4, 6, 8, 12, 16, 32, 64, 512, 7]
    assert np.isnan(r[11]) and np.isnan(c[11])


@pytest.mark.parametrize("tp", [4, 16, 64, 256, 1024])
def test_square_grid_ratio_to_megatron(tp):
    # MHA (q = kv = h), F = 4h, GeLU (n_mats 2), square grid: 2-D / 1-D = 4 / (sqrt(tp) + 1) (module docstring)
    T, h = 4096.0, 8192.0
    r, c = tp2d.grid(tp)
    row, col = tp2d.comm_bytes_per_layer(T, h, h, h, 4 * h, 2, r, c)
    ratio = (row + col) / tp2d.megatron_bytes_per_layer(T, h, tp)
    assert ratio == pytest.approx(4.0 / (np.sqrt(tp) + 1.0), rel=1e-12)


def test_shrinks_relative_to_1d_as_tp_grows():
    T, h = 2048.0, 12288.0
    tps = np.array([4, 16, 64, 256, 1024, 4096])
    r, c = tp2d.grid(tps)
    row, col = tp2d.comm_bytes_per_layer(T, h, h, h, 4 * h, 2, r, c)
    ratio = (row + col) / tp2d.megatron_bytes_per_layer(T, h, tps)
    assert np.all(np.diff(ratio) < 0)
    assert ratio[2] == pytest.approx(4.0 / 9.0, rel=1e-12)  # tp = 64: 8 x 8


def test_prime_tp_is_megatron_with_sequence_parallelism():
    # a 1 x tp grid sends exactly 1-D's bytes (all-gather + reduce-scatter = all-reduce)
    T, h = 1024.0, 4096.0
    for tp in (2, 3, 5, 7):
        r, c = tp2d.grid(tp)
        row, col = tp2d.comm_bytes_per_layer(T, h, h, h, 4 * h, 2, r, c)
        assert row == 0.0
        assert col == pytest.approx(tp2d.megatron_bytes_per_layer(T, h, tp), rel=1e-14)


def test_more_bandwidth_never_slower():
    rng = np.random.default_rng(0)
    n = 2000
    tp = 2.0 ** rng.integers(2, 10, n)
    node = 2.0 ** rng.integers(0, 7, n)
    bw_up, bw_out = rng.uniform(1e9, 1e12, n), rng.uniform(1e8, 1e11, n)
    args = (4096.0, 8192.0, 8192.0, 2048.0, 28672.0, 3.0, tp, node)
    t0 = tp2d.comm_time_per_layer_s(*args, bw_up, bw_out, 3e-6, 1e-5)
    for k_up, k_out in ((2.0, 1.0), (1.0, 2.0), (1.5, 3.0)):
        t1 = tp2d.comm_time_per_layer_s(*args, bw_up * k_up, bw_out * k_out, 3e-6, 1e-5)
        assert np.all(t1 <= t0)
    assert np.all(t0 > 0)


def test_gemm_io_square_grid():
    a, m = tp2d.gemm_io_elems_per_token(1024.0, 1024.0, 1024.0, 4096.0, 2, 16)
    assert a == pytest.approx(2 * 1024 / 4 + 4 * 1024 / 4)
    assert m == pytest.approx(2 * 1024 / 4 + 2 * 4096 / 4)


def test_validity():
    ok = tp2d.valid(np.array([64, 64, 64, 64]), np.array([12288, 12290, 12288, 12288]),
                    np.array([49152, 49152, 49160, 49152]), np.array([2048, 2048, 2048, 2044]))
    assert ok.tolist() == [True, False, False, False]
    moe = tp2d.valid(16, 4096, 16384, 4096, expert_ffn=np.array([1408, 1400]), n_experts=np.array([64, 64]))
    assert moe.tolist() == [True, False]
