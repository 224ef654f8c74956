"""MoE options (models.arch.moe): load imbalance, dropless vs capacity factor, expert tensor parallelism."""

from __future__ import annotations

import numpy as np

from models.arch import moe


def test_effective_imbalance_dropless_capacity_and_padding():
    rho = np.array([1.5, 1.5, 1.5, 1.0, 1.5])
    cf = np.array([np.nan, 1.25, 2.0, 1.25, 1.25])
    pad = np.array([False, False, False, True, True])
    got = moe.effective_imbalance(rho, cf, pad)
    # dropless keeps the imbalance; a capacity below it caps the slowest rank; a capacity above it changes
    # nothing without padding; padded, every expert runs its full capacity (cf x mean) whatever the imbalance
    assert np.array_equal(got, [1.5, 1.25, 1.5, 1.25, 1.25])
    assert moe.effective_imbalance(1.0, np.nan) == 1.0  # the default is exactly 1


def test_capacity_factor_validity():
    assert list(moe.capacity_factor_valid([np.nan, 1.0, 0.5, 0.0, -1.0, np.inf])) == [True, True, True, False,
                                                                                       False, False]


def test_folding_rule_of_megatron_core():
    # tp*cp*dp per stage must be a multiple of etp*ep (parallel_state: world_size % (etp*ep*pp) == 0)
    tp, cp, dp = np.array([4, 4, 4, 2, 1]), np.array([1, 1, 2, 1, 1]), np.array([8, 8, 8, 32, 64])
    ep = np.array([8, 8, 64, 64, 64])
    etp = np.array([4, 2, 1, 2, 1.5])
    assert list(moe.folding_valid(tp, cp, dp, ep, etp)) == [True, True, True, False, False]


def test_resolve_etp_defaults_to_tp_and_folds_when_it_must():
    tp, cp, dp, ep = np.array([4, 2, 4, 8]), np.array([1, 1, 1, 1]), np.array([8, 32, 6, 4]), np.array([8, 64, 8, 16])
    etp, inferred = moe.resolve_etp(np.full(4, np.nan), tp, cp, dp, ep)
    # ep | dp: Megatron-Core's default etp = tp; ep = 64 on tp 2 x dp 32: only etp = 1 folds; tp 4 x dp 6 with
    # ep 8: 24/8 = 3, gcd(4, 3) = 1; tp 8 x dp 4, ep 16: 32/16 = 2, gcd(8, 2) = 2
    assert list(etp) == [4, 1, 1, 2] and list(inferred) == [False, True, True, True]
    assert moe.folding_valid(tp, cp, dp, ep, etp).all()
    # a stated etp is kept as stated (the validity rule judges it)
    etp2, inf2 = moe.resolve_etp(np.array([3.0, 1, 1, 1]), tp, cp, dp, ep)
    assert list(etp2) == [3, 1, 1, 1] and not inf2.any()


def test_expert_scales_are_exactly_one_at_the_defaults():
    t = np.array([1.0, 2.0, 4.0, 8.0])
    assert np.array_equal(moe.expert_weight_scale(t, t), np.ones(4))
    assert np.array_equal(moe.routed_tokens_factor(np.array([2.0, 8.0]), np.array([0.0, 1.0]), 1.0), [2.0, 9.0])
    assert np.array_equal(moe.expert_dp_size(t, 1.0, np.array([8.0, 8, 8, 8]), 4.0, t), [2.0, 2, 2, 2])
    assert np.array_equal(moe.ep_stride(t, 2.0, t), 2.0 * t)
    # etp = 1: experts / ep instead of / (ep tp); edp grows by tp; EP ranks are neighbours
    assert np.array_equal(moe.expert_weight_scale(t, 1.0), t)
    assert np.array_equal(moe.expert_dp_size(t, 1.0, 8.0, 4.0, 1.0), 2.0 * t)
    assert np.array_equal(moe.ep_stride(t[1:], 2.0, 1.0), [1.0, 1.0, 1.0])


# ------------------------------------------------------------------ in the step-time and memory models

import polars as pl  # noqa: E402
import pytest  # noqa: E402

from models.core.params import DEFAULT  # noqa: E402
from models.physics.step_time import ERR_EP, INVALID_MASK, predict, predict_arrays  # noqa: E402
from tests.test_mla import arrays  # noqa: E402
from tests.test_archfile import table_row  # noqa: E402
from tests.test_step_time import _same, config_rows, hw, hw_row  # noqa: E402,F401 (hw is a fixture)

MOE_IDS = ("deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "gpt-oss-120b")


def layouts(arch_id: str, hw, hid: str = "h100-sxm5-80gb", seed: int = 0, n: int = 64) -> dict[str, np.ndarray]:
    """n random valid-ish layouts of one architecture with ep | dp (the default etp = tp always folds)."""
    rng = np.random.default_rng(seed)
    E = float(table_row(arch_id)["n_experts"])
    rows = []
    for _ in range(n):
        tp, pp, dp = (int(rng.choice(x)) for x in ([1, 2, 4, 8], [1, 2, 4], [2, 4, 8, 16]))
        ep = int(rng.choice([e for e in (1, 2, 4, 8, 16) if dp % e == 0 and E % e == 0]))
        rows.append(dict(seq_len=4096, global_batch_seqs=dp * 8, micro_batch=1, n_gpus=tp * pp * dp, tp=tp, pp=pp,
                         dp=dp, cp=1, ep=ep, vpp=1, sharding=int(rng.choice([0, 1, 3])),
                         recompute=int(rng.choice([0, 1, 2])), sequence_parallel=tp > 1, dtype=0, gpus_per_node=8))
    parts = [config_rows(arrays(table_row(arch_id)), hw, hid, r) for r in rows]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@pytest.mark.parametrize("arch_id", MOE_IDS)
def test_defaults_are_bit_identical_to_no_moe_columns(hw, arch_id):
    a = layouts(arch_id, hw)
    base = predict_arrays(a)
    assert ((base["error_code"] & INVALID_MASK) == 0).sum() > 20
    n = len(a["tp"])
    _same(base, predict_arrays(a | {"etp": a["tp"].copy(), "moe_capacity_factor": np.full(n, np.nan),
                                    "moe_pad_to_capacity": np.zeros(n)}))
    _same(base, predict_arrays(a, DEFAULT.with_(moe_imbalance=1.0)))
    # a capacity factor at or above a balanced load drops nothing and pads nothing: the same step
    _same(base, predict_arrays(a | {"moe_capacity_factor": np.full(n, 1.25)}))


def test_expert_tp_divides_expert_memory_by_ep_etp(hw):
    # Mixtral 8x7B on tp 4 x dp 4, ep 2: experts / (ep tp) = / 8 by default, / (ep etp) = / 2 with etp = 1
    a = layouts("mixtral-8x7b", hw, n=1)
    a |= {k: np.array([v]) for k, v in dict(tp=4.0, pp=1.0, dp=4.0, ep=2.0, n_gpus=16.0, global_batch_seqs=32.0,
                                             sharding=0, sequence_parallel=1.0).items()}
    a["sharding"] = a["sharding"].astype(np.int64)
    from models.arch.accounting import layer_shapes, normalize_arch
    from models.memory.model import memory_inputs, memory_per_gpu

    arch = normalize_arch({k: a[k] for k in ("n_layers", "d_model", "n_heads", "ffn_dim", "vocab", "n_kv_heads",
                                              "head_dim", "n_experts", "top_k", "expert_ffn_dim", "n_shared_experts",
                                              "n_dense_layers", "tied_embeddings", "activation")})
    kw = dict(seq_len=4096.0, micro_batch=1.0, n_micro=8.0, tp=4.0, dp=4.0, ep=2.0, recompute=1,
              sequence_parallel=True)
    sh = layer_shapes(arch)
    m_tp, m_1 = (memory_per_gpu(memory_inputs(arch, **kw, etp=etp), sh) for etp in (4.0, 1.0))
    assert m_1["expert_params_local"][()] == pytest.approx(4.0 * m_tp["expert_params_local"][()], rel=1e-12)
    assert m_1["dense_params_local"][()] == m_tp["dense_params_local"][()]
    assert memory_per_gpu(memory_inputs(arch, **kw), sh)["expert_params_local"][()] == \
        m_tp["expert_params_local"][()]  # None = tp
    # in the step: weights, grads and optimizer grow by the expert parameters' 3 extra quarters
    r4, r1 = predict_arrays(a | {"etp": np.array([4.0])}), predict_arrays(a | {"etp": np.array([1.0])})
    extra = 3.0 * m_tp["expert_params_local"][()]
    assert (r1["mem_weights_gb"] - r4["mem_weights_gb"])[0] * 1e9 == pytest.approx(2.0 * extra, rel=1e-9)
    assert (r1["mem_grads_gb"] - r4["mem_grads_gb"])[0] * 1e9 == pytest.approx(DEFAULT.grad_bytes * extra, rel=1e-9)
    # etp = 1 removes the expert-TP collective pair (less TP traffic) and puts tp x more ranks in the expert
    # data-parallel reduction
    assert r1["tp_comm_s"][0] < r4["tp_comm_s"][0]


@pytest.mark.parametrize("arch_id", MOE_IDS)
def test_imbalance_slows_an_ep_step_and_never_speeds_one(hw, arch_id):
    a = layouts(arch_id, hw, seed=3)
    base = predict_arrays(a)
    slow = predict_arrays(a, DEFAULT.with_(moe_imbalance=1.5))
    ok = (base["error_code"] & INVALID_MASK) == 0
    assert np.all(slow["step_time_s"][ok] >= base["step_time_s"][ok])
    ep = ok & (a["ep"] > 1)
    assert ep.any() and np.all(slow["step_time_s"][ep] > base["step_time_s"][ep])
    assert np.all(slow["ep_comm_s"][ep] > base["ep_comm_s"][ep])  # the slowest rank receives 1.5 x the tokens
    assert np.all(slow["memory_gb_per_gpu"][ok] >= base["memory_gb_per_gpu"][ok])
    with pytest.raises(ValueError, match="moe_imbalance"):
        predict_arrays(a, DEFAULT.with_(moe_imbalance=0.9))


def test_capacity_factor_below_the_imbalance_is_faster_than_dropless(hw):
    a = layouts("qwen3-30b-a3b", hw, seed=5)
    n = len(a["tp"])
    P = DEFAULT.with_(moe_imbalance=1.5)
    dropless = predict_arrays(a, P)
    capped = predict_arrays(a | {"moe_capacity_factor": np.full(n, 1.25)}, P)
    above = predict_arrays(a | {"moe_capacity_factor": np.full(n, 2.0)}, P)
    padded = predict_arrays(a | {"moe_capacity_factor": np.full(n, 2.0), "moe_pad_to_capacity": np.ones(n)}, P)
    ok = (dropless["error_code"] & INVALID_MASK) == 0
    assert np.all(capped["step_time_s"][ok] < dropless["step_time_s"][ok])
    _same(above, dropless)  # a capacity above the load drops nothing; unpadded it costs nothing
    assert np.all(padded["step_time_s"][ok] > dropless["step_time_s"][ok])  # padded: every expert runs 2 x mean


def test_megatron_core_refuses_an_expert_grid_that_does_not_fold(hw):
    # Megatron-Core MoE README, "MoE Parallel Folding": attention TP=4, CP=2, DP=8, PP=4 -> MoE ETP=1, EP=64,
    # EDP=1 (256 GPUs); with the default ETP = TP = 4 an EP of 64 does not tile the 64 GPUs of a stage
    assert moe.folding_valid(4, 2, 8, 64, 1) and not moe.folding_valid(4, 2, 8, 64, 4)
    assert moe.expert_dp_size(4, 2, 8, 64, 1) == 1.0
    row = {**{k: v for k, v in table_row("deepseek-v3").items() if not isinstance(v, str) or k == "activation"},
           "seq_len": 4096, "global_batch_seqs": 64, "micro_batch": 1, "n_gpus": 256, "tp": 4, "pp": 4, "dp": 8,
           "cp": 2, "ep": 64, "vpp": 1, "sharding": "zero1", "recompute": "full", "sequence_parallel": True,
           "dtype": "bf16", "gpus_per_node": 72}
    row |= hw_row(hw, "gb200") if "gb200" in set(hw["id"].to_list()) else hw_row(hw, "b200")
    df = pl.DataFrame([row | {"etp": 1}, row | {"etp": 4}, row | {"etp": None}], infer_schema_length=None)
    res = predict(df)
    assert (res["error_code"][0] & ERR_EP) == 0
    assert res["error_code"][1] & ERR_EP and "etp*ep | tp*cp*dp" in res["error"][1]
    # unstated: the largest etp that folds (here 1), the same prediction as etp = 1
    assert res["step_time_s"][2] == res["step_time_s"][0]


def test_dispatcher_permutation_traffic_follows_megatron_cores_all_to_all_dispatcher():
    """models.physics.parts.moe_permute_elems: permute + unpermute move 2 (top_k + 1) d_model-elements per token; the sort
    and unsort by local expert (`sort_chunks_by_idxs`, only with ep > 1 and more than one expert per rank) move
    4 top_k more. Qwen3-30B-A3B (top-8, 128 experts) at ep 8: 18 + 32 = 50; at ep 1: 18; 128 experts on ep 128
    (one per rank): 18."""
    from models.physics.parts import moe_permute_elems

    k, E = np.array([8.0, 8.0, 8.0]), np.array([128.0, 128.0, 128.0])
    assert moe_permute_elems(k, np.array([8.0, 1.0, 128.0]), E).tolist() == [50.0, 18.0, 18.0]


# ---------------------------------------------------------------------------------------------- EP A2A overlap

def test_a2a_merged_fraction_follows_megatron_cores_combined_1f1b_schedule():
    m = np.array([5.0, 64.0, 64.0, 64.0, 5.0, 5.0, 1.0, 2.0])
    pp = np.array([1.0, 4.0, 2.0, 4.0, 1.0, 1.0, 1.0, 8.0])
    vpp = np.array([1.0, 4.0, 1.0, 4.0, 1.0, 1.0, 1.0, 3.0])
    E = np.array([64.0, 256.0, 128.0, 256.0, 64.0, 0.0, 128.0, 128.0])
    ep = np.array([64.0, 64.0, 8.0, 64.0, 1.0, 1.0, 8.0, 32.0])
    rc = np.array([1, 1, 1, 2, 1, 1, 1, 1])
    got = moe.a2a_merged_fraction(np.ones(8), m, pp, vpp, E, ep, rc)
    # pp 1: every pair but the first forward and the last backward (m - 1) / m; pp 4 x vpp 4, m 64: 2 (4 - 1)
    # + 3 x 4 + 1 = 19 warm-up chunks of 256 unmerged; pp > 1 without interleaving, full recompute, ep 1, a dense
    # row: no overlap; one micro-batch: nothing to merge with; more warm-up than chunks: none
    want = [0.8, (256.0 - 19.0) / 256.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert np.allclose(got, want)
    assert not moe.a2a_merged_fraction(np.zeros(8), m, pp, vpp, E, ep, rc).any()


@pytest.mark.parametrize("arch_id", MOE_IDS)
def test_a2a_overlap_never_slows_a_step_and_hides_at_most_the_overlapped_compute(hw, arch_id):
    a = layouts(arch_id, hw, seed=7)
    n = len(a["tp"])
    base = predict_arrays(a)
    _same(base, predict_arrays(a | {"moe_a2a_overlap": np.zeros(n)}))  # off: today's step, bit for bit
    on = predict_arrays(a | {"moe_a2a_overlap": np.ones(n)})
    ok = (base["error_code"] & INVALID_MASK) == 0
    # (to rounding: under ZeRO-3 / FSDP the compute that hides all-to-all no longer hides parameter gathers, so
    # what one saves the other exposes)
    assert np.all(on["step_time_s"][ok] <= base["step_time_s"][ok] * (1.0 + 1e-12))
    hidden = base["ep_comm_s"] - on["ep_comm_s"]  # per step: m x the hidden all-to-all of a micro-batch
    assert np.all(hidden[ok] >= 0.0)
    # never more than the compute of the micro-batches it overlaps (m - 1 of m at pp 1)
    assert np.all(hidden[ok] <= base["compute_s"][ok] * (1.0 + 1e-12))
    merged = ok & (a["ep"] > 1) & (a["recompute"] != 2) & (a["pp"] == 1) & (a["global_batch_seqs"] / a["dp"] > 1)
    assert merged.any() and np.all(hidden[merged] > 0.0)
    untouched = ok & ((a["ep"] == 1) | (a["recompute"] == 2) | (a["pp"] > 1))  # pp > 1 here: no interleaving
    assert np.array_equal(on["step_time_s"][untouched], base["step_time_s"][untouched])


def test_ep_a2a_hidden_is_bounded_by_the_other_passes_compute():
    from models.physics.parts import Compute, ep_a2a_hidden

    z = np.zeros(3)
    cm = Compute(compute_mb=np.array([3.0, 3.0, 3.0]), bwd_mb=np.array([2.0, 2.0, 2.0]), host_mb=z, t_core=z,
                 Ls_attn=z, Ls_moe=z, tp_per_stage=z)
    ep = np.array([1.0, 3.0, 10.0])
    # forward half behind the 2 s backward, backward half behind the 1 s forward
    got = ep_a2a_hidden(cm, ep, np.ones(3))
    assert np.allclose(got, [1.0, 1.5 + 1.0, 2.0 + 1.0])
    assert np.allclose(ep_a2a_hidden(cm, ep, np.full(3, 0.5)), 0.5 * got)
    assert ep_a2a_hidden(cm, ep, 0.0) == 0.0



def _shipped_recipes():
    """The recipe tables of measurements/recipes/ (the Megatron-Bridge releases' MoE settings)."""
    from pipeline.catalog import recipes
    from tests.conftest import MEASUREMENTS

    return recipes(MEASUREMENTS)


def test_recipe_table_names_the_a2a_overlap_of_a_megatron_bridge_run():
    from models.corpus import moe_recipes as mr
    rec = _shipped_recipes()

    dsv3 = ("deepseek-v3", "gb200", "mxfp8")
    # 26.06 turned the overlap on for DeepSeek-V3 on GB200 (r0.5.0 DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V2);
    # 26.04's preset of the same layout did not; a run of another source: nothing known
    assert mr.recipe_a2a_overlap("mb2606-pre-training-deepseekv3-gb200-256gpu-mxfp8-gbs4096", *dsv3, rec) is True
    assert mr.recipe_a2a_overlap("mb2604-pre-training-deepseekv3-gb200-256gpu-mxfp8-gbs4096", *dsv3, rec) is False
    assert mr.recipe_a2a_overlap("nemo-docs-deepseek-v3", *dsv3, rec) is None
    assert "r0.5.0" in rec.a2a_overlap[("26.06", *dsv3)].source
    assert mr.run_release("mb2511-pre-training-x") == "25.11"
    assert rec.a2a_overlap[("26.06", *dsv3)].dispatcher_backend == "hybridep"
    frame = pl.DataFrame({
        "run_id": ["mb2606-pre-training-deepseekv3-gb200-256gpu-mxfp8-gbs4096", "mb2604-x", "other", "mb2606-y"],
        "arch_id": ["deepseek-v3"] * 4, "gpu": ["gb200"] * 4, "dtype": ["mxfp8"] * 4,
        "moe_a2a_overlap": [None, None, None, 0.0], "assumptions": ["x", None, None, None]})
    out = mr.resolve_a2a_overlap(frame, rec)
    assert out["moe_a2a_overlap"].to_list() == [1.0, 0.0, None, 0.0]  # a stated value wins
    assert "moe_a2a_overlap=1 (Megatron-Bridge r0.5.0" in out["assumptions"][0]
    assert out["assumptions"][1] is None


def test_recipe_table_names_the_a2a_overlap_of_gb300_and_b300_runs():
    """GB300/B300 runs of the summary take their release's preset: by run id (mbYYMM-) or by the container their
    framework names (a row of another file); 26.06's DeepSeek-V3 B300 preset (tag v0.5.0) did not overlap."""
    from models.corpus import moe_recipes as mr
    rec = _shipped_recipes()

    frame = pl.DataFrame({
        "run_id": ["mb2608-pre-training-qwen3-235b-a22b-gb300-256gpu-mxfp8-gbs8192",
                   "mbh-26.06-qwen3-30b-a3b-b300-8-mxfp8-gbs512-tp1pp1ep8",
                   "mbh-26.02.01-qwen3-235b-a22b-b300-256-mxfp8-gbs8192-tp1pp8ep8",
                   "mbh-26.06-deepseekv3-b300-256-mxfp8-gbs4096-tp1pp8ep8"],
        "framework": ["Megatron-Bridge / NeMo 26.08 (Megatron-Core)", "Megatron-Bridge / NeMo 26.06",
                      "Megatron-Bridge / NeMo 26.02.01", "Megatron-Bridge / NeMo 26.06"],
        "arch_id": ["qwen3-235b-a22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3"],
        "gpu": ["gb300", "b300", "b300", "b300"], "dtype": ["mxfp8"] * 4, "assumptions": [None] * 4})
    out = mr.resolve_a2a_overlap(frame, rec)
    assert out["moe_a2a_overlap"].to_list() == [1.0, 1.0, 1.0, 0.0]
    a = out["assumptions"].to_list()
    assert "r0.6.0" in a[0] and "qwen/gb300/qwen3_moe.py qwen3_235b_a22b_pretrain_256gpu_gb300_fp8mx_config" in a[0]
    assert "r0.5.0" in a[1] and "QWEN3_30B_A3B_PRETRAIN_CONFIG_B300_FP8_MX_V1" in a[1]
    assert "QWEN3_235B_A22B_PRETRAIN_CONFIG_B300_FP8_MX_V2 (tag v0.3.0)" in a[2]
    assert a[3] is None
    assert rec.a2a_overlap[("26.06", "deepseek-v3", "gb300", "mxfp8")].dispatcher_backend == "hybridep"
    assert rec.a2a_overlap[("26.02", "qwen3-235b-a22b", "b300", "mxfp8")].dispatcher_backend is None


def test_recipe_etp_states_the_megatron_bridge_presets_expert_tp():
    from models.corpus import moe_recipes as mr
    rec = _shipped_recipes()

    # every MoE preset of the releases sets expert_tensor_parallel_size=1, the tp-2 Qwen3-235B H100 run's too
    assert mr.recipe_etp("mb2604-pre-training-qwen3-235b-a22b-h100-256gpu-fp8-gbs8192", rec) == 1
    assert mr.recipe_etp("mb2511-pre-training-qwen3-235b-a22b-h100-256gpu-fp8-cs-gbs2048", rec) == 1
    assert mr.recipe_etp("nemo-docs-mixtral", rec) is None and mr.recipe_etp("mb2701-x", rec) is None
    note = "dropless; etp=1 (ep=32 does not fold with etp=tp: the largest etp dividing tp with etp*ep | tp*cp*dp, " \
           "as Megatron-Core needs); recompute=none"
    frame = pl.DataFrame({
        "run_id": ["mb2604-pre-training-qwen3-235b-a22b-h100-256gpu-fp8-gbs8192", "mb2604-dense", "other-moe",
                   "mb2606-stated"],
        "n_experts": [128, 0, 8, 64], "etp": [None, None, None, 2.0], "assumptions": [note, None, "etp=tp (x)", None]})
    out = mr.resolve_recipe_etp(frame, rec)
    assert out["etp"].to_list() == [1.0, None, None, 2.0]  # dense, other sources and a stated etp are kept
    a = out["assumptions"][0]
    assert "etp=1 (Megatron-Bridge r0.4.0" in a and "does not fold" not in a and a.startswith("dropless; ")
    assert out["assumptions"][2] == "etp=tp (x)"


def test_the_25_09_release_recipes():
    """Container 25.09 (Megatron-Bridge r0.1.0): scripts/performance/run_script.py overlaps the EP all-to-all and
    dispatches with DeepEP for DeepSeek-V3 on H100 only; every 25.09 MoE preset sets etp 1; DeepSeek-V3 recomputes
    mla_up_proj and mlp on H100, mla_up_proj on B200/GB200."""
    from models.corpus import moe_recipes as mr
    rec = _shipped_recipes()

    h100 = "mb2509-pre-training-deepseekv3-dropless-h100-1024gpu-fp8-gbs8192"
    assert mr.recipe_a2a_overlap(h100, "deepseek-v3", "h100-sxm5-80gb", "fp8", rec) is True
    assert mr.recipe_a2a_overlap("mb2509-pre-training-deepseekv3-tokendrop-b200-256gpu-fp8-gbs2048", "deepseek-v3",
                                 "b200", "fp8", rec) is False
    assert mr.recipe_a2a_overlap("mb2509-pre-training-qwen3-235b-a22b-tokendrop-h100-256gpu-fp8-gbs2048",
                                 "qwen3-235b-a22b", "h100-sxm5-80gb", "fp8", rec) is False
    assert mr.recipe_etp(h100, rec) == 1 and "r0.1.0" in rec.expert_tp[("25.09",)].source
    assert rec.a2a_overlap[("25.09", "deepseek-v3", "h100-sxm5-80gb", "fp8")].dispatcher_backend == "deepep"
    assert ("25.09", "deepseek-v3", "h100-sxm5-80gb", "fp8-cs") in rec.flex_dispatcher
    modules = rec.recompute_modules
    assert modules[("deepseek-v3", "pretrain", "h100-sxm5-80gb", "fp8", "25.09")].recompute_modules == \
        ("mla_up_proj", "mlp")
    assert modules[("deepseek-v3", "pretrain", "gb200", "fp8-cs", "25.09")].recompute_modules == ("mla_up_proj",)


def test_cross_node_all_to_all_uses_each_ranks_own_nic():
    from models.physics import collectives as coll

    B, up, nic, a_up, a_out = 64e6, 450e9 * 0.95, 50e9 * coll.A2A_RDMA_EFF, 2e-6, 10e-6
    # inside one domain: the plain all-to-all over the scale-up link, bit for bit
    for n in (2.0, 8.0):
        assert coll.ep_all_to_all_time(B, n, 8.0, up, nic, a_up, a_out) == coll.all_to_all_time(B, n, up, a_up)
    # EP 32 over 4 nodes of 8: 24/32 of the buffer leaves the node through the rank's own NIC (not 8 NICs)
    t = coll.ep_all_to_all_time(B, 32.0, 8.0, up, nic, a_up, a_out)
    assert t == pytest.approx(7 * a_up + 24 * a_out + 0.75 * B / nic, rel=1e-12)
    assert coll.A2A_RDMA_EFF == pytest.approx(43.0 / 50.0)


def test_cross_node_all_to_all_never_beats_one_domain_and_more_nic_never_slows_it():
    from models.physics import collectives as coll

    rng = np.random.default_rng(7)
    n = rng.choice([2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0], 400)
    g = np.minimum(rng.choice([1.0, 2.0, 4.0, 8.0], 400), n)
    B = rng.uniform(1e5, 1e9, 400)
    up = rng.uniform(20e9, 900e9, 400)
    nic = rng.uniform(5e9, 900e9, 400)
    a_up = rng.uniform(0.0, 5e-6, 400)
    a_out = a_up + rng.uniform(0.0, 20e-6, 400)
    cross = coll.ep_all_to_all_time(B, n, g, up, nic, a_up, a_out)
    one_domain = coll.all_to_all_time(B, n, up, a_up)
    assert np.all(cross >= one_domain)
    assert np.all(coll.ep_all_to_all_time(B, n, g, up, 2.0 * nic, a_up, a_out) <= cross)
    # more of the group inside one node never slows it
    assert np.all(coll.ep_all_to_all_time(B, n, np.minimum(2.0 * g, n), up, nic, a_up, a_out) <= cross + 1e-15)
    # a 3:1 oversubscribed pod tier the group crosses divides the NIC bandwidth
    tiers = (np.full(400, 16.0), np.full(400, 3.0))
    over = coll.ep_all_to_all_time(B, n, g, up, nic, a_up, a_out, 1.0, tiers)
    assert np.all(over >= cross) and np.any(over[n > 16] > cross[n > 16])


def test_ep_comm_across_nodes_is_nic_bound(hw):
    # Qwen3-30B-A3B, ep 16 over two 8-GPU H100 nodes vs the same ep 8 inside one: the node-crossing all-to-all
    # is slower per micro-batch, and with the ring's g NICs it would have been about as fast as NVLink
    a = layouts("qwen3-30b-a3b", hw, n=1)
    one = a | {k: np.array([v]) for k, v in dict(tp=1.0, pp=1.0, dp=16.0, ep=8.0, n_gpus=16.0,
                                                 global_batch_seqs=128.0, sequence_parallel=0.0).items()}
    two = one | {"ep": np.array([16.0])}
    r1, r2 = predict_arrays(one), predict_arrays(two)
    assert ((r1["error_code"] | r2["error_code"]) & INVALID_MASK)[0] == 0
    # same bytes per rank; 8/16 of them over one 50 GB/s NIC against 7/8 over NVLink
    assert r2["ep_comm_s"][0] > 3.0 * r1["ep_comm_s"][0]


def test_flex_dispatcher_sends_one_copy_per_remote_node():
    # Qwen3-30B-A3B (top-8 of 128) on EP 16 over two 8-GPU nodes: a token's experts miss the other node with
    # probability C(64, 8)/C(128, 8), so HybridEP sends 1 - that of a copy where the all-to-all dispatcher sends 4
    from math import comb

    got = moe.flex_remote_share(8, 128, 16, 8)
    assert got == pytest.approx((1.0 - comb(64, 8) / comb(128, 8)) / 8.0, rel=1e-12)
    rng = np.random.default_rng(3)
    k = rng.choice([1.0, 2.0, 4.0, 8.0, 22.0], 300)
    E = k * rng.choice([1.0, 4.0, 16.0, 64.0], 300)
    ep = rng.choice([8.0, 16.0, 32.0, 64.0, 128.0], 300)
    g = np.minimum(rng.choice([1.0, 4.0, 8.0], 300), ep)
    share = moe.flex_remote_share(k, E, ep, g)
    flat = (ep - g) / ep
    assert np.all(share <= flat + 1e-15) and np.all(share >= 0.0)  # never more than the all-to-all dispatcher
    assert np.all(share[g == ep] == 0.0)
    # one expert per token: every copy goes to one node, the same share as the all-to-all dispatcher
    assert moe.flex_remote_share(1, 64, 32, 8) == pytest.approx(24 / 32, rel=1e-12)


def test_recipe_dispatcher_names_the_flex_runs_only():
    from models.corpus import moe_recipes as mr
    rec = _shipped_recipes()

    frame = pl.DataFrame({
        "run_id": ["mb2604-pre-training-qwen3-30b-a3b-h100-16gpu-fp8-gbs1024",
                   "mb2602-pre-training-qwen3-235b-a22b-h100-256gpu-fp8-gbs8192", "other"],
        "arch_id": ["qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-30b-a3b"],
        "gpu": ["h100-sxm5-80gb"] * 3, "dtype": ["fp8"] * 3, "assumptions": [None, "x", None]})
    out = mr.resolve_recipe_dispatcher(frame, rec)
    assert out["moe_dispatcher"].to_list() == [1.0, None, None]
    assert "moe_dispatcher=flex (Megatron-Bridge r0.4.0" in out["assumptions"][0]
    assert out["assumptions"][1] == "x"
    # 26.02's Qwen3-235B H100 preset names deepep, but its recipe ran the all-to-all dispatcher
    assert rec.a2a_overlap[("26.02", "qwen3-235b-a22b", "h100-sxm5-80gb", "fp8")].dispatcher_backend is None
