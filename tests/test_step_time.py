"""Step-time model: collectives, hardware resolution, validity, properties (published measurements:
tests/test_published_figures.py)."""

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models import collectives as coll
from models.hardware import HardwareSpecError, peak_tflops_for, resolve_hardware
from models.params import DEFAULT, PhysParams
from models.step_time import HARDWARE_COLUMNS, predict, predict_arrays

ROOT = Path(__file__).resolve().parents[1] / "measurements"


@pytest.fixture(scope="module")
def hw():
    return resolve_hardware(pl.read_csv(ROOT / "hardware_specs.csv", infer_schema_length=0), strict=False)


def hw_row(hw, hid):
    return hw.filter(pl.col("id") == hid).select(HARDWARE_COLUMNS).to_dicts()[0]


# ---------------- collectives ----------------
@pytest.mark.parametrize("n", [2, 4, 8, 64, 1000])
def test_collective_volumes_closed_forms(n):
    B = 1e9
    assert coll.ring_all_reduce_bytes(B, n) == pytest.approx(2 * (n - 1) / n * B)
    assert coll.ring_reduce_scatter_bytes(B, n) == pytest.approx((n - 1) / n * B)
    assert coll.ring_all_gather_bytes(B, n) == pytest.approx((n - 1) / n * B)
    # all-reduce == reduce-scatter + all-gather (volume and time)
    assert coll.ring_all_reduce_bytes(B, n) == pytest.approx(2 * coll.ring_reduce_scatter_bytes(B, n))
    bw, a = 100e9, 5e-6
    assert coll.ring_all_reduce_time(B, n, bw, a) == pytest.approx(
        coll.reduce_scatter_time(B, n, bw, a) + coll.all_gather_time(B, n, bw, a))
    assert coll.ring_all_reduce_time(B, n, bw, a) == pytest.approx(2 * (n - 1) * a + 2 * (n - 1) / n * B / bw)
    assert coll.all_to_all_time(B, n, bw, a) == pytest.approx((n - 1) * a + (n - 1) / n * B / bw)
    assert coll.tree_all_reduce_time(B, n, bw, a) == pytest.approx(2 * np.ceil(np.log2(n)) * a + 2 * B / bw)
    assert coll.all_reduce_time(1e3, n, bw, a) <= coll.ring_all_reduce_time(1e3, n, bw, a)


def test_single_rank_collectives_are_free_and_group_link():
    assert coll.ring_all_reduce_time(1e9, 1, 1e9, 1e-5) == 0
    bw, a = coll.group_link(8, 8, 300e9, 25e9, 3e-6, 1e-5)
    assert bw == 300e9 and a == 3e-6
    bw, a = coll.group_link(16, 1, 300e9, 25e9, 3e-6, 1e-5)
    assert bw == 25e9 and a == 1e-5
    bw, _ = coll.group_link(64, 8, 300e9, 25e9, 3e-6, 1e-5)
    assert bw == 200e9  # 8 NICs per node drive 8 rings
    h_pipe = coll.hierarchical_all_reduce_time(1e9, 64, 8, 300e9, 25e9, 0, 0, pipelined=True)
    h_seq = coll.hierarchical_all_reduce_time(1e9, 64, 8, 300e9, 25e9, 0, 0, pipelined=False)
    assert h_pipe < h_seq
    assert h_pipe == pytest.approx(2 * 7 / 8 * 1e9 / 8 / 25e9)


# ---------------- hardware ----------------
def test_resolve_hardware_rules(hw):
    r = {d["id"]: d for d in hw.to_dicts()}
    assert r["gtx-580"]["fp32_only"] and r["gtx-580"]["peak_bf16_tflops"] == r["gtx-580"]["peak_fp32_tflops"]
    assert not r["p100-sxm2-16gb"]["fp32_only"]
    assert r["tpu-v4"]["scaleup_size"] == 4096 and r["gb200"]["scaleup_size"] == 72
    assert r["rtx-4090"]["scaleup_size_fallback"] and r["rtx-4090"]["scaleup_size"] == 8
    assert r["a100-pcie-80gb"]["inter_node_bw_fallback"] and r["a100-pcie-80gb"]["inter_node_bw_gbps"] == 12.5
    assert r["gtx-580"]["inter_node_bw_gbps"] == 8.0  # capped by its PCIe 2.0 link
    assert not r["h100-sxm5-80gb"]["inter_node_bw_fallback"]
    assert r["tpu-v4"]["memory_gb"] == pytest.approx(32 * 1.073741824)
    assert r["tpu-v3"]["hardware_error"] is not None and "intra_node_bw_gbps" in r["tpu-v3"]["hardware_error"]


def test_resolve_hardware_strict_raises_with_id_and_column():
    df = pl.read_csv(ROOT / "hardware_specs.csv", infer_schema_length=0)
    with pytest.raises(HardwareSpecError) as ei:
        resolve_hardware(df)
    assert ei.value.hw_id == "tpu-v3" and ei.value.column == "intra_node_bw_gbps"
    bad = df.filter(pl.col("id") == "h100-sxm5-80gb").with_columns(pl.lit("").alias("memory_gb"))
    with pytest.raises(HardwareSpecError, match="h100-sxm5-80gb.*memory_gb"):
        resolve_hardware(bad)


def test_peak_selection(hw):
    h100 = {k: np.array([v]) for k, v in hw_row(hw, "h100-sxm5-80gb").items()}
    a100 = {k: np.array([v]) for k, v in hw_row(hw, "a100-sxm4-80gb").items()}
    v100 = {k: np.array([v]) for k, v in hw_row(hw, "v100-sxm2-32gb").items()}
    k80 = {k: np.array([v]) for k, v in hw_row(hw, "k80").items()}
    assert peak_tflops_for(np.array(["bf16"]), h100)[0][0] == 989.4
    assert peak_tflops_for(np.array(["fp8"]), h100)[0][0] == 1978.9
    p, f = peak_tflops_for(np.array(["nvfp4"]), h100)
    assert np.isnan(p[0])  # no FP4 peak: nvfp4 cannot run there (an error upstream, never a silent fallback)
    p, f = peak_tflops_for(np.array(["nvfp4"]), dict(h100, peak_fp4_tflops=np.array([9000.0])))
    assert p[0] == 9000.0 and not f[0]  # the dense FP4 peak where the part has one
    p, f = peak_tflops_for(np.array(["fp8"]), a100)
    assert p[0] == 312 and f[0]  # no fp8 on A100 -> bf16, flagged
    p, f = peak_tflops_for(np.array(["bf16"]), v100)
    assert p[0] == 125 and f[0]  # no bf16 on V100 -> fp16 tensor peak
    assert peak_tflops_for(np.array(["tf32"]), a100)[0][0] == 156
    assert peak_tflops_for(np.array(["bf16"]), k80)[0][0] == 8.74


# ---------------- validity ----------------
def cfg(hw, hid="a100-sxm4-80gb", **over):
    d = dict(n_layers=96, d_model=12288, n_heads=96, ffn_dim=49152, vocab=51200, activation="gelu",
             tied_embeddings=True, seq_len=2048, global_batch_seqs=64, micro_batch=1, n_gpus=64, tp=8, pp=8, dp=1,
             vpp=3, recompute="selective", sequence_parallel=True, sharding="none", dtype="bf16", gpus_per_node=8)
    d.update(hw_row(hw, hid))
    d.update(over)
    return pl.DataFrame([d])


@pytest.mark.parametrize("over,needle", [
    (dict(dp=2), "tp*pp*cp*dp != n_gpus"),
    (dict(micro_batch=3), "not divisible by dp*micro_batch"),
    (dict(tp=64, pp=1, vpp=1), "n_heads"),
    (dict(ep=2), "invalid ep"),
    (dict(sharding="zero9"), "unknown activation/sharding"),
    (dict(pp=1, tp=8, dp=8, vpp=2), "invalid vpp"),
])
def test_invalid_inputs_get_errors(hw, over, needle):
    out = predict(cfg(hw, **over))
    assert not out["feasible"][0]
    assert needle in out["error"][0]
    assert out["step_time_s"][0] is None


def test_breakdown_sums_to_step_time(hw):
    out = predict(pl.concat([cfg(hw), cfg(hw, vpp=1, recompute="full", sequence_parallel=False)]))
    parts = ["compute_s", "tp_comm_s", "pp_bubble_s", "pp_comm_s", "dp_comm_exposed_s", "cp_comm_s", "ep_comm_s",
             "optimizer_s"]
    for row in out.to_dicts():
        assert row["error"] is None and row["feasible"]
        assert sum(row[p] for p in parts) == pytest.approx(row["step_time_s"], rel=1e-9)
        assert 0 < row["mfu"] <= row["hfu"] < 1


# ---------------- properties ----------------
N_HYP = 200
layout = st.fixed_dictionaries({
    "arch": st.sampled_from([(24, 2048, 16, 16, 8192, 0), (32, 4096, 32, 8, 14336, 1), (48, 6144, 48, 48, 24576, 0),
                             (32, 4096, 32, 8, 14336, 1, 8, 2)]),
    "tp": st.sampled_from([1, 2, 4, 8]),
    "pp": st.sampled_from([1, 2, 4]),
    "cp": st.sampled_from([1, 2]),
    "dp": st.sampled_from([1, 2, 4, 8, 16]),
    "mb": st.sampled_from([1, 2]),
    "m": st.sampled_from([1, 4, 8]),
    "sharding": st.integers(0, 5),
    "recompute": st.integers(0, 2),
    "sp": st.booleans(),
    "dtype": st.sampled_from([0, 1, 2]),
    "hw": st.sampled_from(["a100-sxm4-80gb", "h100-sxm5-80gb", "mi300x", "l40s", "b200"]),
    "seq": st.sampled_from([1024, 4096]),
    "vpp": st.sampled_from([1, 2]),
})


def arrays_from(hw, x):
    arch = x["arch"]
    L, h, a, kv, f, act = arch[:6]
    E, k = (arch[6], arch[7]) if len(arch) > 6 else (0, 0)
    ep = 2 if (E and x["dp"] % 2 == 0) else 1
    vpp = x["vpp"] if (x["pp"] > 1 and x["m"] % x["pp"] == 0) else 1
    n = x["tp"] * x["pp"] * x["cp"] * x["dp"]
    d = dict(n_layers=L, d_model=h, n_heads=a, n_kv_heads=kv, ffn_dim=f, vocab=32000, activation=act,
             n_experts=E, top_k=k, seq_len=x["seq"], global_batch_seqs=x["dp"] * x["mb"] * x["m"],
             micro_batch=x["mb"], n_gpus=n, tp=x["tp"], pp=x["pp"], dp=x["dp"], cp=x["cp"], ep=ep, vpp=vpp,
             sharding=x["sharding"], recompute=x["recompute"], sequence_parallel=x["sp"], dtype=x["dtype"],
             gpus_per_node=8)
    d.update(hw_row(hw, x["hw"]))
    return {k_: np.array([np.nan if v is None else v], dtype=float) for k_, v in d.items()}


@settings(max_examples=N_HYP, deadline=None)
@given(x=layout, factor=st.floats(1.01, 10.0), which=st.sampled_from(
    ["intra_node_bw_gbps", "inter_node_bw_gbps", "memory_bw_gbps", "peak", "memory_gb"]))
def test_more_resources_never_hurt(hw, x, factor, which):
    a = arrays_from(hw, x)
    b = dict(a)
    if which == "peak":
        for c in ("peak_fp32_tflops", "peak_tf32_tflops", "peak_bf16_tflops", "peak_fp16_tflops", "peak_fp8_tflops"):
            b[c] = a[c] * factor
    else:
        b[which] = a[which] * factor
    ra, rb = predict_arrays(a), predict_arrays(b)
    if ra["error_code"][0] & ~(1 << 10):
        return  # invalid layout: nothing to compare
    assert rb["step_time_s"][0] <= ra["step_time_s"][0] * (1 + 1e-12)
    if ra["feasible"][0]:
        assert rb["feasible"][0]


@settings(max_examples=N_HYP, deadline=None)
@given(x=layout)
def test_outputs_positive_and_finite_for_valid_inputs(hw, x):
    r = predict_arrays(arrays_from(hw, x))
    if r["error_code"][0] & ~(1 << 10):
        return
    for c in ("step_time_s", "tokens_per_s_per_gpu", "mfu", "hfu", "memory_gb_per_gpu", "compute_s", "params",
              "model_flops_per_token"):
        assert np.isfinite(r[c][0]) and r[c][0] > 0, c
    for c in ("tp_comm_s", "pp_bubble_s", "pp_comm_s", "dp_comm_exposed_s", "cp_comm_s", "ep_comm_s", "optimizer_s"):
        assert np.isfinite(r[c][0]) and r[c][0] >= 0, c
    assert r["mfu"][0] <= r["hfu"][0] < 1.0


def test_one_row_equals_many_rows(hw):
    one = predict(cfg(hw))
    many = predict(pl.concat([cfg(hw)] * 20000 + [cfg(hw, vpp=1)]))
    assert many["step_time_s"][0] == one["step_time_s"][0]
    assert many["step_time_s"][19999] == one["step_time_s"][0]


def test_params_roundtrip():
    p = DEFAULT.with_(matmul_eff_16bit=0.7)
    assert PhysParams.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError):
        PhysParams.from_dict({"nope": 1.0})
