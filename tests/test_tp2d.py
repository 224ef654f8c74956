"""2-D tensor parallelism (models.physics.tp2d): grid rule, bytes per GPU against 1-D, monotonicity, validity."""

import numpy as np
import pytest

from models.physics import tp2d


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


def test_stage_total_is_layers_times_passes():
    args = (4096.0, 4096.0, 4096.0, 1024.0)
    link = (16.0, 8.0, 300e9, 25e9, 3e-6, 1e-5, 2.0)
    one = tp2d.comm_time_per_layer_s(*args, 14336.0, 3.0, *link)
    moe = tp2d.comm_time_per_layer_s(*args, 2 * 14336.0, 3.0, *link)
    tot = tp2d.tp_comm_s(30.0, 2.0, 3.0, *args, 14336.0, 2 * 14336.0, 3.0, *link)
    assert tot == pytest.approx(3.0 * (30.0 * one + 2.0 * moe), rel=1e-14)


# ---------------- wired into the step-time model ----------------
import polars as pl  # noqa: E402

from models.physics.hardware import resolve_hardware  # noqa: E402
from models.physics.step_time import ERR_TP2D, predict, predict_arrays  # noqa: E402
from tests.test_step_time import ROOT, random_layouts  # noqa: E402


@pytest.fixture(scope="module")
def hw():
    return resolve_hardware(pl.read_csv(ROOT / "hardware_specs.csv", infer_schema_length=0), strict=False)


def _same(r1, r2):
    for k in r1:
        assert np.array_equal(np.asarray(r1[k]), np.asarray(r2[k]), equal_nan=True), k


def test_tp_mode_1d_is_bit_identical_to_no_column(hw):
    a = random_layouts(hw, seed=11)
    n = len(a["tp"])
    _same(predict_arrays(a), predict_arrays(a | {"tp_mode": np.zeros(n, dtype=np.int64)}))
    _same(predict_arrays(a), predict_arrays(a | {"tp_mode": np.zeros(n)}))


def test_prime_grid_is_megatron_with_sequence_parallelism(hw):
    a = random_layouts(hw, seed=12)
    n = len(a["tp"])
    a["tp"] = np.full(n, 2.0)
    a["n_gpus"] = a["tp"] * a["pp"] * a["cp"] * a["dp"]
    a["sequence_parallel"] = np.ones(n, dtype=bool)
    r1 = predict_arrays(a)
    r2 = predict_arrays(a | {"tp_mode": np.ones(n, dtype=np.int64)})
    ok = (r1["error_code"] == 0) & (r2["error_code"] == 0)
    assert ok.sum() > 300
    for k in ("step_time_s", "tp_comm_s", "compute_s", "memory_gb_per_gpu"):
        assert np.allclose(r2[k][ok], r1[k][ok], rtol=1e-12, atol=0), k


def test_2d_sends_less_than_1d_across_nodes(hw):
    a = random_layouts(hw, seed=13)
    n = len(a["tp"])
    a["tp"] = np.full(n, 32.0)  # 4 x 8 grid, spanning 4 nodes of 8
    a["n_gpus"] = a["tp"] * a["pp"] * a["cp"] * a["dp"]
    r1 = predict_arrays(a)
    r2 = predict_arrays(a | {"tp_mode": np.ones(n, dtype=np.int64)})
    ok = (r1["error_code"] & ~(1 << 10) == 0) & (r2["error_code"] & ~(1 << 10) == 0)
    assert ok.sum() > 100
    assert np.all(r2["tp_comm_s"][ok] < r1["tp_comm_s"][ok])


def test_more_bandwidth_never_slows_a_2d_step(hw):
    a = random_layouts(hw, seed=14)
    n = len(a["tp"])
    rng = np.random.default_rng(15)
    a["tp"] = rng.choice(np.array([4.0, 8.0, 16.0, 32.0]), n)
    a["n_gpus"] = a["tp"] * a["pp"] * a["cp"] * a["dp"]
    a["tp_mode"] = np.ones(n, dtype=np.int64)
    base = predict_arrays(a)
    ok = base["error_code"] & ~(1 << 10) == 0
    assert ok.sum() > 200
    for key in ("intra_node_bw_gbps", "inter_node_bw_gbps", "memory_bw_gbps", "peak_bf16_tflops"):
        faster = predict_arrays(a | {key: a[key] * (1.0 + 3.0 * rng.random(n))})
        assert np.all(faster["step_time_s"][ok] <= base["step_time_s"][ok] * (1 + 1e-12)), key


def test_invalid_grid_is_refused_with_a_message(hw):
    row = dict(n_layers=32, d_model=4098, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab=32000, activation="swiglu",
               seq_len=4096, global_batch_seqs=64, micro_batch=1, n_gpus=64, tp=16, pp=1, dp=4, tp_mode="2d")
    row.update(hw.filter(pl.col("id") == "h100-sxm5-80gb").select(
        [c for c in hw.columns if c.startswith("peak_") or c in ("memory_gb", "memory_bw_gbps", "intra_node_bw_gbps",
                                                                 "inter_node_bw_gbps", "scaleup_size", "sm_count")]
    ).to_dicts()[0])
    bad = predict(pl.DataFrame([row]))  # 16 = 4 x 4: d_model 4098 is not divisible by r = 4
    assert bad["error_code"][0] & ERR_TP2D and bad["step_time_s"][0] is None
    assert "tp_mode 2d" in bad["error"][0] and "d_model must be divisible by r" in bad["error"][0]
    assert predict(pl.DataFrame([row | {"tp_mode": "1d"}]))["error"][0] is None  # the same shape is valid in 1-D
    good = predict(pl.DataFrame([row | {"d_model": 4096}]))
    assert good["error"][0] is None and good["step_time_s"][0] > 0
    unknown = predict(pl.DataFrame([row | {"d_model": 4096, "tp_mode": "3d"}]))
    assert "unknown" in unknown["error"][0] and "tp_mode" in unknown["error"][0]
