"""Step-time model: collectives, hardware resolution, validity, properties (published measurements:
tests/test_published_figures.py)."""

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.physics import collectives as coll
from models.physics.hardware import HardwareSpecError, peak_tflops_for, resolve_hardware
from models.core.params import DEFAULT, PhysParams
from models.physics.step_time import HARDWARE_COLUMNS, predict, predict_arrays

ROOT = Path(__file__).resolve().parents[1] / "measurements"


@pytest.fixture(scope="module")
def hw():
    return resolve_hardware(pl.read_csv(ROOT / "hardware_specs.csv", infer_schema_length=0), strict=False)


def hw_row(hw, hid):
    return hw.filter(pl.col("id") == hid).select(HARDWARE_COLUMNS).to_dicts()[0]


def config_rows(arch: dict, hw, hid: str, layout: dict, n: int = 1) -> dict[str, np.ndarray]:
    """`n` copies of one configuration as step-time arrays: an architecture's arrays (one row each), a layout
    (floats; sharding, recompute and dtype as codes) and the hardware row `hid`."""
    a = dict(arch)
    a.update({k: np.array([float(v)]) for k, v in layout.items()})
    a.update({k: np.array([np.nan if v is None else float(v)]) for k, v in hw_row(hw, hid).items()})
    for k in ("activation", "sharding", "recompute", "dtype"):
        a[k] = a[k].astype(np.int64) if k != "activation" else (a[k] == "swiglu").astype(np.int64)
    return {k: np.repeat(v, n) for k, v in a.items()}


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
    # capacities stay as stated; every one is binary (models.memory.model.capacity_bytes): TPU v4's 32 GiB = 34.4e9 bytes
    assert r["tpu-v4"]["memory_gb"] == 32.0
    from models.memory.model import capacity_bytes
    assert float(capacity_bytes(r["tpu-v4"]["memory_gb"])) == pytest.approx(32 * 2**30)
    assert r["tpu-v3"]["hardware_error"] is not None and "intra_node_bw_gbps" in r["tpu-v3"]["hardware_error"]


def test_resolve_hardware_strict_raises_with_id_and_column():
    df = pl.read_csv(ROOT / "hardware_specs.csv", infer_schema_length=0)
    with pytest.raises(HardwareSpecError) as ei:
        resolve_hardware(df)
    assert ei.value.hw_id == "tpu-v3" and ei.value.column == "intra_node_bw_gbps"
    bad = df.filter(pl.col("id") == "h100-sxm5-80gb").with_columns(pl.lit("").alias("memory_gb"))
    with pytest.raises(HardwareSpecError, match="h100-sxm5-80gb.*memory_gb"):
        resolve_hardware(bad)


def test_added_accelerators_resolve_as_their_generation_and_deployment(hw):
    """GH200 (both HBM versions), H100 NVL and A800 are usable rows: Hopper/Ampere generation codes (so the fitted
    Hopper/Ampere parameters apply), GH200's 4-GPU HPE Cray EX node with 25 GB/s Slingshot per GPU, and the
    documented fallbacks where the table has no node or network (H100 NVL: PCIe card; A800: no layout sourced)."""
    r = {d["id"]: d for d in hw.to_dicts()}
    for hid in ("gh200", "gh200-144gb", "h100-nvl-94gb", "a800-sxm4-80gb"):
        assert r[hid]["hardware_error"] is None and not r[hid]["sm_count_fallback"], hid
    hopper, ampere = r["h100-sxm5-80gb"]["generation_code"], r["a100-sxm4-80gb"]["generation_code"]
    assert r["gh200"]["generation_code"] == r["gh200-144gb"]["generation_code"] == hopper
    assert r["h100-nvl-94gb"]["generation_code"] == hopper and r["a800-sxm4-80gb"]["generation_code"] == ampere
    assert r["gh200"]["scaleup_size"] == 4 and r["gh200"]["inter_node_bw_gbps"] == 25
    assert not r["gh200"]["scaleup_size_fallback"] and not r["gh200"]["inter_node_bw_fallback"]


def test_widened_catalog_rows_resolve_as_their_generation(hw):
    """A100 PCIe 40GB, T4, L4, MI250 and MI210 are usable rows of their vendor generation (Ampere, Turing = pre-Ampere,
    Ada, CDNA2 = AMD); the Trainium rows carry their own generation (outside every fit: 'unknown', so extrapolated)
    and, with the NeuronLink bandwidth AWS's Neuron docs give (halved to per direction), are usable: a 16-chip instance
    is their scale-up domain, EFA per chip their scale-out."""
    from models.core.domains import GENERATION_GROUPS

    r = {d["id"]: d for d in hw.to_dicts()}
    group = {hid: GENERATION_GROUPS[int(r[hid]["generation_code"])] for hid in r}
    assert {h: group[h] for h in ("a100-pcie-40gb", "t4", "l4", "mi250", "mi210", "trn1", "trn2")} == {
        "a100-pcie-40gb": "Ampere", "t4": "pre-Ampere", "l4": "Ada", "mi250": "AMD", "mi210": "AMD",
        "trn1": "unknown", "trn2": "unknown"}
    for hid in ("a100-pcie-40gb", "t4", "l4", "mi250", "mi210", "trn1", "trn2"):
        assert r[hid]["hardware_error"] is None, hid
    # AWS: 384 GiB/s per Trainium device, 1,024 GB/s intra-instance per Trainium2 chip (halved: per direction);
    # 16 chips per trn1.32xlarge / trn2.48xlarge; EFA 800 / 3,200 Gbps per instance over 16 chips
    assert r["trn1"]["intra_node_bw_gbps"] == 192 and r["trn2"]["intra_node_bw_gbps"] == 512
    assert r["trn1"]["scaleup_size"] == r["trn2"]["scaleup_size"] == 16
    assert r["trn1"]["inter_node_bw_gbps"] == 6.25 and r["trn2"]["inter_node_bw_gbps"] == 25
    assert not r["trn2"]["scaleup_size_fallback"] and not r["trn2"]["inter_node_bw_fallback"]
    assert r["l4"]["peak_bf16_tflops"] == 121 and r["trn2"]["peak_bf16_tflops"] == 667  # dense, not sparse
    assert r["h100-nvl-94gb"]["inter_node_bw_fallback"] and r["h100-nvl-94gb"]["inter_node_bw_gbps"] == 12.5
    assert r["a800-sxm4-80gb"]["scaleup_size_fallback"] and r["a800-sxm4-80gb"]["intra_node_bw_gbps"] == 200


def test_volta_and_ampere_pcie_cards_resolve_on_pcie_with_datasheet_peaks(hw):
    """V100 PCIe 16/32GB (Volta), RTX A6000, RTX 3090 and A10 (Ampere) resolve without error, on the PCIe tier, with
    dense tensor peaks: the RTX 3090's is the GeForce FP32-accumulate rate (71, half of the FP16-accumulate 142)."""
    from models.core.domains import GENERATION_GROUPS

    r = {d["id"]: d for d in hw.to_dicts()}
    new = ("v100-pcie-16gb", "v100-pcie-32gb", "rtx-a6000", "rtx-3090", "a10")
    for hid in new:
        assert r[hid]["hardware_error"] is None and r[hid]["scaleup_link"] == "pcie", hid
    assert {h: GENERATION_GROUPS[int(r[h]["generation_code"])] for h in new} == {
        "v100-pcie-16gb": "pre-Ampere", "v100-pcie-32gb": "pre-Ampere", "rtx-a6000": "Ampere", "rtx-3090": "Ampere",
        "a10": "Ampere"}
    assert r["v100-pcie-16gb"]["peak_fp16_tflops"] == 112 and r["v100-pcie-32gb"]["memory_gb"] == 32
    assert r["rtx-3090"]["peak_bf16_tflops"] == r["rtx-3090"]["peak_fp16_tflops"] == 71
    assert r["rtx-a6000"]["peak_bf16_tflops"] == 154.8 and r["a10"]["peak_fp16_tflops"] == 125


def test_h20_a40_l40_b100_mi100_and_tpus_resolve_as_their_generation_with_dense_peaks(hw):
    """H20 (Hopper), A40 (Ampere), L40 (Ada), B100 (Blackwell), MI100 (CDNA = AMD), TPU v2 and TPU7x (TPU) fall in
    their fitted generation groups with dense tensor peaks; the PCIe cards talk over PCIe, the TPUs over ICI across
    their pod. TPU v2, like TPU v3, has no sourced per-direction ICI bandwidth: listed, but refused by the model."""
    from models.core.domains import GENERATION_GROUPS

    r = {d["id"]: d for d in hw.to_dicts()}
    new = ("h20", "a40", "l40", "b100", "mi100", "tpu-v2", "tpu-v7")
    assert {h: GENERATION_GROUPS[int(r[h]["generation_code"])] for h in new} == {
        "h20": "Hopper", "a40": "Ampere", "l40": "Ada", "b100": "Blackwell", "mi100": "AMD", "tpu-v2": "TPU",
        "tpu-v7": "TPU"}
    for hid in ("h20", "a40", "l40", "b100", "mi100", "tpu-v7"):
        assert r[hid]["hardware_error"] is None and not r[hid]["fp32_only"], hid
    assert r["tpu-v2"]["hardware_error"] is not None and "intra_node_bw_gbps" in r["tpu-v2"]["hardware_error"]
    assert {r[h]["scaleup_link"] for h in ("a40", "l40", "mi100")} == {"pcie"}
    assert r["h20"]["scaleup_link"] == r["b100"]["scaleup_link"] == "nvlink" and r["h20"]["intra_node_bw_gbps"] == 450
    assert r["tpu-v7"]["scaleup_size"] == 9216 and r["tpu-v2"]["scaleup_size"] == 256
    # dense, not the sparse datasheet figures: H20 148 BF16 (not the H200's 989), L40 181.05, B100 1,750
    assert r["h20"]["peak_bf16_tflops"] == 148 and r["h20"]["peak_fp8_tflops"] == 296
    assert r["a40"]["peak_bf16_tflops"] == 149.7 and r["l40"]["peak_bf16_tflops"] == 181.05
    assert r["b100"]["peak_bf16_tflops"] == 1750 and r["b100"]["peak_fp4_tflops"] == 7000
    assert r["mi100"]["peak_fp16_tflops"] == 184.6 and r["mi100"]["peak_bf16_tflops"] == 92.3
    assert r["tpu-v7"]["peak_bf16_tflops"] == 2307 and r["tpu-v7"]["peak_fp8_tflops"] == 4614
    # no sourced SM count for the H20: the peak-based fallback; the others carry theirs
    assert r["h20"]["sm_count_fallback"] and not any(r[h]["sm_count_fallback"] for h in ("a40", "l40", "b100", "mi100"))


def _small_dense(hw, hid, tp, dp):
    """A 24-layer, d_model 2048 dense model (BF16, ZeRO-1, selective recompute) on `hid`, node = its scale-up domain."""
    d = dict(n_layers=24, d_model=2048, n_heads=16, n_kv_heads=16, ffn_dim=8192, vocab=32000, activation=0, n_experts=0,
             top_k=0, seq_len=4096, global_batch_seqs=dp * 8, micro_batch=1, n_gpus=tp * dp, tp=tp, pp=1, dp=dp, cp=1,
             ep=1, vpp=1, sharding=1, recompute=1, sequence_parallel=tp > 1, dtype=0, gpus_per_node=np.nan)
    d.update(hw_row(hw, hid))
    return predict_arrays({k: np.array([np.nan if v is None else v], dtype=float) for k, v in d.items()})


@pytest.mark.parametrize("tp,dp", [(1, 1), (4, 1), (2, 2)])
def test_gh200_is_no_slower_than_h100_sxm_inside_one_node(hw, tp, dp):
    """GH200's GPU has the H100 SXM5's peaks and SMs with more, faster HBM (4.0 / 4.9 TB/s vs 3.35) and the same
    450 GB/s NVLink per GPU, so a layout inside one 4-GPU GH200 node is predicted (no error) and no slower."""
    h100, gh200, gh200e = (_small_dense(hw, h, tp, dp) for h in ("h100-sxm5-80gb", "gh200", "gh200-144gb"))
    for r in (h100, gh200, gh200e):
        assert r["error_code"][0] == 0 and np.isfinite(r["step_time_s"][0])
    assert gh200e["step_time_s"][0] <= gh200["step_time_s"][0] <= h100["step_time_s"][0]


def test_gh200_data_parallel_across_nodes_pays_for_its_smaller_nic(hw):
    """Across nodes the order flips: 64-way data parallelism crosses 16 GH200 nodes at 25 GB/s per GPU (Slingshot
    200 Gb/s) against 8 DGX H100 nodes at 50 GB/s (NDR 400 Gb/s), so the exposed gradient all-reduce is larger."""
    h100, gh200 = (_small_dense(hw, h, 1, 64) for h in ("h100-sxm5-80gb", "gh200"))
    assert gh200["error_code"][0] == 0 and h100["error_code"][0] == 0
    assert gh200["dp_comm_exposed_s"][0] > h100["dp_comm_exposed_s"][0]
    assert gh200["compute_s"][0] <= h100["compute_s"][0]


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
    from models.fitting.predictor import BREAKDOWN as parts  # start-up time: a test's own import, kept local

    assert "straggler_s" in parts
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
    for c in ("tp_comm_s", "pp_bubble_s", "pp_comm_s", "dp_comm_exposed_s", "cp_comm_s", "ep_comm_s", "optimizer_s",
              "straggler_s"):
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


# ---------------- network tiers: oversubscription and the pod tier ----------------
OVERSUB_ARCHS = np.array([(24, 2048, 16, 16, 8192, 0, 0, 0), (32, 4096, 32, 8, 14336, 1, 0, 0),
                          (32, 4096, 32, 8, 14336, 1, 8, 2)], dtype=float)


def random_layouts(hw, n=300, seed=0, hids=("a100-sxm4-80gb", "h100-sxm5-80gb", "b200")):
    """n random configurations per accelerator (8 per scale-up domain, up to 512 accelerators), as arrays;
    some are invalid (NaN outputs on both sides of a comparison)."""
    rng = np.random.default_rng(seed)
    parts = []
    for hid in hids:
        pick = lambda vals: rng.choice(np.asarray(vals, dtype=float), n)  # noqa: E731
        arch = OVERSUB_ARCHS[rng.integers(0, len(OVERSUB_ARCHS), n)]
        tp, pp, cp, dp = pick([1, 2, 4, 8]), pick([1, 2, 4]), pick([1, 2]), pick([1, 2, 4, 8, 16, 32])
        mb, m = pick([1, 2]), pick([1, 4, 8])
        moe = arch[:, 6] > 0
        a = dict(n_layers=arch[:, 0], d_model=arch[:, 1], n_heads=arch[:, 2], n_kv_heads=arch[:, 3],
                 ffn_dim=arch[:, 4], activation=arch[:, 5].astype(np.int64), n_experts=arch[:, 6], top_k=arch[:, 7],
                 vocab=np.full(n, 32000.0), seq_len=pick([1024, 4096]), global_batch_seqs=dp * mb * m,
                 micro_batch=mb, n_gpus=tp * pp * cp * dp, tp=tp, pp=pp, dp=dp, cp=cp,
                 ep=np.where(moe & (dp % 2 == 0), 2.0, 1.0), vpp=np.where((pp > 1) & (m % pp == 0), pick([1, 2]), 1.0),
                 sharding=rng.integers(0, 6, n), recompute=rng.integers(0, 3, n),
                 sequence_parallel=rng.random(n) < 0.5, dtype=rng.integers(0, 2, n), gpus_per_node=np.full(n, 8.0))
        a.update({k: np.full(n, np.nan if v is None else float(v)) for k, v in hw_row(hw, hid).items()})
        parts.append(a)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _same(r1, r2, rows=slice(None)):
    for k in r1:
        assert np.array_equal(np.asarray(r1[k])[rows], np.asarray(r2[k])[rows], equal_nan=True), k


def test_oversubscription_one_is_bit_identical_to_no_column(hw):
    a = random_layouts(hw)
    base = predict_arrays(a)
    n = len(a["tp"])
    assert (base["error_code"] == 0).sum() > 300  # enough valid rows to mean something
    rng = np.random.default_rng(1)
    pods = rng.choice(np.array([np.nan, 8, 16, 64, 256]), n)
    _same(base, predict_arrays(a | {"oversubscription": np.ones(n), "pod_size": pods}))
    _same(base, predict_arrays(a | {"oversubscription": np.full(n, np.nan)}))
    # a pod holding the whole job (never below the scale-up domain of 8): nothing crosses the oversubscribed tier
    job = np.maximum(a["n_gpus"], 8.0)
    _same(base, predict_arrays(a | {"oversubscription": np.full(n, 4.0), "pod_size": job * 2}))
    _same(base, predict_arrays(a | {"oversubscription": np.full(n, 4.0), "pod_size": job}))


def test_more_oversubscription_never_makes_a_step_faster(hw):
    a = random_layouts(hw, seed=2)
    n = len(a["tp"])
    rng = np.random.default_rng(3)
    pods = rng.choice(np.array([np.nan, 8, 16, 64]), n)
    ratio = 1.0 + 3.0 * rng.random(n)
    r1 = predict_arrays(a | {"oversubscription": ratio, "pod_size": pods})
    r2 = predict_arrays(a | {"oversubscription": ratio * (1.0 + 4.0 * rng.random(n)), "pod_size": pods})
    base = predict_arrays(a)
    ok = base["error_code"] & ~(1 << 10) == 0
    assert np.all(r2["step_time_s"][ok] >= r1["step_time_s"][ok] * (1 - 1e-12))
    assert np.all(r1["step_time_s"][ok] >= base["step_time_s"][ok] * (1 - 1e-12))
    multi = ok & (a["n_gpus"] > 8) & (a["dp"] * a["cp"] > 1)
    assert np.mean(r2["step_time_s"][multi] > base["step_time_s"][multi]) > 0.5  # it does bite across nodes


def test_layouts_inside_one_scaleup_domain_ignore_oversubscription(hw):
    a = random_layouts(hw, seed=4)
    inside = a["n_gpus"] <= 8  # gpus_per_node 8: every group stays in one scale-up domain
    assert inside.sum() > 50
    n = len(a["tp"])
    _same(predict_arrays(a), predict_arrays(a | {"oversubscription": np.full(n, 16.0)}), inside)


def test_dp_allreduce_across_nodes_scales_by_the_ratio(hw):
    """By hand: 64 x H100 (8 per node) on 200 Gb/s NICs (25 GB/s per accelerator), tp = pp = 1, dp = 64, no
    sharding, no overlap (dp_overlap 0), so the exposed DP time is the gradient all-reduce,
    2 (n-1) (alpha + x/n) per ring (the auto choice at this size), x = bytes / bw. The group spans nodes with
    g = 8 ranks each: bw = min(scale-up, 8 x NIC) = 8 x 25 x 0.85 = 170 GB/s < 450 x 0.75; the pod tier (no pod:
    every inter-node hop crosses it) divides the NIC term by 3, so x triples:
    dp(3) = 3 dp(1) - 4 (n-1) alpha_scaleout. (With the H100's own 50 GB/s NIC, 8 x 50 x 0.85 = 340 GB/s is
    above the scale-up link's 337.5, which binds at 1:1, so 3:1 slows the bandwidth term by 337.5/113.3 = 2.98.)"""
    row = hw_row(hw, "h100-sxm5-80gb") | {"inter_node_bw_gbps": 25.0}
    a = {k: np.array([np.nan if v is None else float(v)]) for k, v in row.items()}
    a.update({k: np.array([float(v)]) for k, v in dict(
        n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab=128256, seq_len=4096,
        global_batch_seqs=128, micro_batch=1, n_gpus=64, tp=1, pp=1, dp=64, gpus_per_node=8).items()})
    a.update(activation=np.array([1]), sharding=np.array([0]), recompute=np.array([2]), dtype=np.array([0]))
    P = DEFAULT.with_(dp_overlap=0.0)
    assert 8 * row["inter_node_bw_gbps"] * P.scaleout_eff < row["intra_node_bw_gbps"] * P.scaleup_eff / 1.0
    one = predict_arrays(a, P)
    three = predict_arrays(a | {"oversubscription": np.array([3.0])}, P)
    d1, d3 = one["dp_comm_exposed_s"][0], three["dp_comm_exposed_s"][0]
    assert d1 > 0.1  # bandwidth-bound: ~0.1 s of 16 GB of bf16 gradients
    assert d3 == pytest.approx(3.0 * d1 - 4.0 * 63 * P.alpha_scaleout_s, rel=1e-12)
    # the step grows by that (up to the host-issue soft maximum, which takes a little back)
    assert three["step_time_s"][0] - one["step_time_s"][0] == pytest.approx(d3 - d1, rel=1e-3)
    # a 32-accelerator pod: the 64-rank DP group still spans two pods, same answer; a 64-pod: no crossing
    assert predict_arrays(a | {"oversubscription": np.array([3.0]), "pod_size": np.array([32.0])}, P)[
        "dp_comm_exposed_s"][0] == d3
    assert predict_arrays(a | {"oversubscription": np.array([3.0]), "pod_size": np.array([64.0])}, P)[
        "dp_comm_exposed_s"][0] == d1


@pytest.mark.parametrize("over", [dict(oversubscription=0.5), dict(oversubscription=np.inf),
                                  dict(oversubscription=-1.0), dict(pod_size=4.0), dict(pod_size=np.inf),
                                  dict(pod_size=0.0)])
def test_bad_network_tiers_are_hardware_errors(hw, over):
    out = predict(cfg(hw, **over))
    assert not out["feasible"][0] and out["step_time_s"][0] is None
    assert "oversubscription < 1" in out["error"][0]


def test_network_tier_columns_in_the_polars_front_end(hw):
    base = predict(cfg(hw))["step_time_s"][0]
    assert predict(cfg(hw, oversubscription=None, pod_size=None))["step_time_s"][0] == base
    assert predict(cfg(hw, oversubscription=1.0))["step_time_s"][0] == base
    assert predict(cfg(hw, oversubscription=4.0))["step_time_s"][0] > base  # 64 GPUs: pp spans nodes


@pytest.mark.parametrize("hid, dtype", [("h100-sxm5-80gb", 2), ("b200", 2), ("b200", 5)])
def test_low_precision_recipes_keep_the_lm_head_in_16_bits(hw, hid, dtype):
    """The LM head of an FP8/FP4 recipe runs in 16 bits (Megatron-Core's output_layer is outside Transformer
    Engine's autocast; torchtitan filters "output"; NVFP4 paper arXiv:2509.25149 keeps the head in BF16): the time
    a larger vocabulary adds is the same as under bf16, while the layers themselves are faster."""
    def step(vocab, dt):
        d = dict(n_layers=16, d_model=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab=vocab, activation=1,
                 n_experts=0, top_k=0, seq_len=4096, global_batch_seqs=8, micro_batch=1, n_gpus=1, tp=1, pp=1,
                 dp=1, cp=1, ep=1, vpp=1, sharding=0, recompute=0, sequence_parallel=0, dtype=dt, gpus_per_node=8)
        d.update(hw_row(hw, hid))
        out = predict_arrays({k: np.array([np.nan if v is None else v], dtype=float) for k, v in d.items()},
                             DEFAULT)
        return float(out["compute_s"][0])

    head_16 = step(256_000, 0) - step(32_000, 0)
    head_low = step(256_000, dtype) - step(32_000, dtype)
    # equal up to the host's soft maximum in the step (models.physics.parts.step_time), which moves with the step's length;
    # with the head at the low-precision rate the difference was 43%
    assert head_16 > 0 and head_low == pytest.approx(head_16, rel=0.02)
    assert step(32_000, dtype) < step(32_000, 0)  # the decoder's GEMMs do run in low precision
