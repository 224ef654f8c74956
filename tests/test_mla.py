"""Multi-head Latent Attention and multi-token prediction (models/arch/mla.py): parameter counts against the published
DeepSeek-V2/V3 figures, the attention-core FLOPs, the tensor-parallel split, bit-identity of every other row, the
MTP cost and how a run's model_name decides whether it trains with MTP."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from models.arch import mla
from models.arch.accounting import ARCH_COLUMNS, layer_shapes, model_flops_per_token, normalize_arch, param_counts
from models.corpus.runs_adapter import resolve_mtp_layers
from models.physics.step_time import predict_arrays
from pipeline import catalog
from tests.conftest import MEASUREMENTS
from tests.test_archfile import table_row
from tests.test_step_time import _same, config_rows, hw, hw_row, random_layouts  # noqa: F401 (hw is a fixture)


def arrays(arch: dict, mtp: bool = True) -> dict[str, np.ndarray]:
    """A table row -> the arrays models.arch.accounting reads, with the MLA columns (and mtp_layers unless `mtp` is
    False)."""
    cols = [c for c in ARCH_COLUMNS if c != "activation"] + [c for c in mla.ARCH_COLUMNS if mtp or c != "mtp_layers"]
    a = {c: np.array([np.nan if arch.get(c) is None else float(arch[c])]) for c in cols}
    a["activation"] = np.array([arch["activation"]])
    return a


def counts(arch_id: str) -> dict[str, float]:
    return {k: float(v[0]) for k, v in param_counts(arrays(table_row(arch_id))).items()}


# ---------------------------------------------------------------- published sizes

@pytest.mark.parametrize("arch_id, total_b, active_b, rel, source", [
    ("deepseek-v3", 671, 37, 0.02, "DeepSeek-AI 2024 (arXiv:2412.19437) section 4.2: 671B total, 37B activated"),
    ("deepseek-v2", 236, 21, 0.03, "DeepSeek-AI 2024 (arXiv:2405.04434) section 3.1: 236B total, 21B activated"),
])
def test_mla_counts_reproduce_the_published_sizes(arch_id, total_b, active_b, rel, source):
    """The main model: MTP modules are not in params / active_params (the papers' sizes exclude them)."""
    c = counts(arch_id)
    assert c["params"] / 1e9 == pytest.approx(total_b, rel=rel), source
    assert c["active_params"] / 1e9 == pytest.approx(active_b, rel=rel), source


def test_deepseek_v2_lite_if_the_table_has_it():
    arch = catalog.architectures(MEASUREMENTS)
    if "deepseek-v2-lite" not in arch["id"].to_list():
        pytest.skip("measurements/architectures.csv has no DeepSeek-V2-Lite row")
    c = counts("deepseek-v2-lite")  # arXiv:2405.04434 appendix B: 15.7B total, 2.4B activated
    assert c["params"] / 1e9 == pytest.approx(15.7, rel=0.03)
    # the activated count leaves out the input embedding (a lookup, 102,400 x 2,048 = 0.21B): with it 2.66B,
    # 11% over; V2 and V3 are within 2-3% either way (their embeddings are 2-3% of the activated count)
    assert (c["active_params"] - 102_400 * 2_048) / 1e9 == pytest.approx(2.4, rel=0.03)


def test_deepseek_v3_mtp_module_is_the_14b_of_the_checkpoint():
    """arXiv:2412.19437 (section 4.2 / the model card): 685B weights on Hugging Face = 671B main model + 14B MTP
    module; the checkpoint stores the module with its own embedding and output-head copies."""
    a = normalize_arch(arrays(table_row("deepseek-v3")))
    mp = mla.mtp_params(a, layer_shapes(a))
    assert float(mp["stored"][0]) / 1e9 == pytest.approx(685 - 671, rel=0.10)
    c = counts("deepseek-v3")
    assert c["mtp_params"] == pytest.approx(float(mp["total"][0]))
    assert (c["params"] + float(mp["stored"][0])) / 1e9 == pytest.approx(685, rel=0.02)


def test_mla_weights_of_one_deepseek_v3_layer():
    """config.json of deepseek-ai/DeepSeek-V3: hidden 7168, 128 heads, q_lora_rank 1536, kv_lora_rank 512, nope 128,
    rope 64, v 128 (q_a_proj 7168x1536, q_b_proj 1536x24576, kv_a_proj_with_mqa 7168x576, kv_b_proj 512x32768,
    o_proj 16384x7168)."""
    a = normalize_arch(arrays(table_row("deepseek-v3")))
    want = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * (128 + 128) + 128 * 128 * 7168
    assert layer_shapes(a)["attn_matmul"][0] == want == 187_105_280
    assert a["mla"]["replicated"][0] == 7168 * 1536 + 7168 * 576


def test_v2_lite_style_row_has_a_plain_query_projection():
    """An empty q_lora_rank (DeepSeek-V2-Lite): W_Q h x a (nope + rope) instead of W_DQ + W_UQ."""
    a = arrays(table_row("deepseek-v3"))
    a["q_lora_rank"] = np.array([np.nan])
    ms = normalize_arch(a)["mla"]
    h, heads = 7168, 128
    assert ms["matmul"][0] == h * heads * 192 + h * 576 + 512 * heads * 256 + heads * 128 * h
    assert ms["replicated"][0] == h * 576 and ms["n_gemms"][0] == 4


# ---------------------------------------------------------------- FLOPs

def test_attention_core_flops_hand_computed():
    """Per token and layer, forward, full square: Q K^T 2 s a (nope + rope) + attention-weighted V 2 s a v_head.
    DeepSeek-V3 at s = 4096: 2*4096*128*192 + 2*4096*128*128 = 335,544,320."""
    assert mla.core_flops_per_token(4096, 128, 192, 128) == 335_544_320
    a = arrays(table_row("deepseek-v3"), mtp=False)
    ar = normalize_arch(a)
    assert "mtp" not in ar
    f = model_flops_per_token(a, 4096)[0]
    six_n = 6.0 * param_counts(a)["matmul_params_active"][0]
    assert f - six_n == pytest.approx(3 * 61 * 335_544_320)  # forward + backward of 61 layers


def megatron_flops_per_token(mtp: bool) -> list[float]:
    """Megatron-Bridge's own model FLOPs per token of its DeepSeek-V3 runs (seq 4096): the model TFLOP/s/GPU over
    the tokens/s/GPU the performance summary reports for the same run (measurements/measured_runs.csv)."""
    runs = pl.read_csv(MEASUREMENTS / "measured_runs.csv", infer_schema_length=0).filter(
        pl.col("source").eq("megatron-bridge-docs") & pl.col("model_name").str.starts_with("DeepSeekV3")
        & (pl.col("model_name").str.contains("w/o MTP", literal=True) != mtp))
    wide = runs.pivot(on="metric", index="run_id", values="value").drop_nulls()
    return [float(f) * 1e12 / float(t) for f, t in zip(wide["model_tflops_per_gpu"], wide["tokens_per_s_per_gpu"])]


@pytest.mark.parametrize("mtp", [False, True])
def test_flops_per_token_match_megatrons_count(mtp):
    """Megatron counts the causal half of the attention square, stepcast the full square (models.arch.accounting): with
    half the core taken off, the MLA + MTP count is Megatron's within 1 % (w/o MTP 249.1-249.6 GFLOP/token vs
    250.4; with MTP 259.8-260.4 vs 260.6). The former 128 x 128 MHA stand-in counted 347.8 (+39 %)."""
    got = megatron_flops_per_token(mtp)
    assert len(got) >= 2
    core = 3 * mla.core_flops_per_token(4096, 128, 192, 128) * (61 + mtp)
    ours = model_flops_per_token(arrays(table_row("deepseek-v3"), mtp=mtp), 4096)[0] - core / 2
    for f in got:
        assert ours == pytest.approx(f, rel=0.01)


def test_mtp_adds_its_flops_per_token():
    with_mtp = model_flops_per_token(arrays(table_row("deepseek-v3")), 4096)[0]
    without = model_flops_per_token(arrays(table_row("deepseek-v3"), mtp=False), 4096)[0]
    a = normalize_arch(arrays(table_row("deepseek-v3")))
    sh = layer_shapes(a)
    # one MoE block (attention + 8 routed + 1 shared expert + router), eh_proj 2h x h and the LM head, + one core
    active = sh["attn_matmul"][0] + 9 * 3 * 7168 * 2048 + 7168 * 256 + 2 * 7168 ** 2 + 129280 * 7168
    assert with_mtp - without == pytest.approx(6 * active + 3 * 335_544_320)


# ---------------------------------------------------------------- tensor parallelism

def test_down_projections_are_replicated_over_tp():
    """Megatron-Core MLASelfAttention: linear_q_down_proj / linear_kv_down_proj are duplicated (TELinear
    parallel_mode='duplicated'); the up-projections and linear_proj are split over tp."""
    ms = normalize_arch(arrays(table_row("deepseek-v3")))["mla"]
    for tp in (1.0, 8.0):
        g = mla.attn_gemms(ms, 7168.0, 128.0, np.array([tp]), np.array([False]))
        w = sum(k * n for _, _, k, n in g)[0]
        assert w == pytest.approx(ms["replicated"][0] + (ms["matmul"][0] - ms["replicated"][0]) / tp)
        # with sequence parallelism a duplicated projection sees the rank's 1/tp of the tokens
        g_sp = mla.attn_gemms(ms, 7168.0, 128.0, np.array([tp]), np.array([True]))
        assert [float(s[0]) for _, s, _, _ in g_sp][:3:2] == [1 / tp, 1 / tp]


# ---------------------------------------------------------------- step-time model

def v3_rows(hw, n=1, **over):  # noqa: F811
    lay = dict(seq_len=4096.0, global_batch_seqs=1024.0, micro_batch=1.0, n_gpus=256.0, tp=2.0, pp=8.0, dp=16.0,
               cp=1.0, ep=16.0, vpp=1.0, sharding=1, recompute=1, sequence_parallel=1.0, dtype=2, gpus_per_node=8.0)
    return config_rows(arrays(table_row("deepseek-v3")), hw, "b200", lay | over, n)


def test_non_mla_rows_are_bit_identical_with_mla_columns_and_rows(hw):  # noqa: F811
    """llama3-70b and random dense/MoE rows: the same outputs without the MLA/MTP columns and with them all NaN;
    beside DeepSeek-V3 rows in one block, the same outputs as beside the V3 rows without their MLA/MTP columns
    (MoE rows in a block already touch dense rows' data-parallel terms by a latency, before MLA existed)."""
    llama = table_row("llama3-70b")
    a = {c: np.array([np.nan if llama.get(c) is None else float(llama[c])]) for c in ARCH_COLUMNS
         if c != "activation"} | {"activation": np.array([1])}
    lay = dict(seq_len=8192.0, global_batch_seqs=512.0, micro_batch=1.0, n_gpus=64.0, tp=8.0, pp=2.0, dp=4.0, cp=1.0,
               ep=1.0, vpp=1.0, sharding=np.array([1]), recompute=np.array([1]), sequence_parallel=1.0,
               dtype=np.array([0]), gpus_per_node=8.0)
    a |= {k: np.atleast_1d(v) for k, v in lay.items()}
    a |= {k: np.array([np.nan if v is None else float(v)]) for k, v in hw_row(hw, "h100-sxm5-80gb").items()}
    fill = lambda d, k, m: d[k] if k in d else np.full(m, np.nan)  # noqa: E731
    for base_a in (a, random_layouts(hw)):
        n = len(base_a["tp"])
        base = predict_arrays(base_a)
        assert np.all(base["error_code"] == 0) if base_a is a else (base["error_code"] == 0).sum() > 300
        nan = {k: np.full(n, np.nan) for k in mla.ARCH_COLUMNS}
        _same(base, predict_arrays(base_a | nan))
        v3 = v3_rows(hw, n=3)
        out = []
        for rows in ({k: v for k, v in v3.items() if k not in mla.ARCH_COLUMNS}, v3):
            keys = set(base_a) | set(rows)
            out.append(predict_arrays({k: np.concatenate([fill(base_a, k, n), fill(rows, k, 3)]) for k in keys}))
        _same(out[0], out[1], rows=slice(0, n))
        assert np.all(out[1]["error_code"][n:] == 0) and np.all(np.isfinite(out[1]["step_time_s"][n:]))


def test_mla_replaces_the_mha_approximation(hw):  # noqa: F811
    a = v3_rows(hw)
    r = predict_arrays(a)
    mha = predict_arrays({k: v for k, v in a.items() if k not in mla.COLUMNS})
    assert r["error_code"][0] == 0
    # fewer attention weights (187M vs 470M per layer): fewer parameters, less weight memory
    assert r["params"][0] < mha["params"][0] and r["mem_weights_gb"][0] < mha["mem_weights_gb"][0]
    assert r["params"][0] / 1e9 == pytest.approx(671, rel=0.02)


def test_mtp_makes_a_deepseek_v3_step_slower(hw):  # noqa: F811
    a = v3_rows(hw)
    on = predict_arrays(a)
    off = predict_arrays(a | {"mtp_layers": np.array([0.0])})
    none = predict_arrays({k: v for k, v in a.items() if k != "mtp_layers"})
    _same(off, none)
    assert on["step_time_s"][0] > off["step_time_s"][0]
    # at pp 8 the last stage holds 5 of the 61 layers (Megatron-Bridge's layout), the MTP module and the head: it
    # paces the step with the module, but the other stages' 8 layers keep the most TP collectives
    assert on["compute_s"][0] > off["compute_s"][0] and on["tp_comm_s"][0] >= off["tp_comm_s"][0]
    single = v3_rows(hw, pp=1.0, dp=128.0, ep=64.0)
    assert predict_arrays(single)["tp_comm_s"][0] > predict_arrays(single | {"mtp_layers": np.array([0.0])})[
        "tp_comm_s"][0]
    assert on["model_flops_per_token"][0] > off["model_flops_per_token"][0]
    # with pp > 1 the MTP modules sit on the last stage and the first stage (in-flight micro-batches) holds more
    assert on["memory_gb_per_gpu"][0] == off["memory_gb_per_gpu"][0]
    one = v3_rows(hw, pp=1.0, dp=128.0, ep=64.0)
    assert predict_arrays(one)["memory_gb_per_gpu"][0] > predict_arrays(
        one | {"mtp_layers": np.array([0.0])})["memory_gb_per_gpu"][0]
    assert on["params"][0] == off["params"][0]  # the main model's size


# ---------------------------------------------------------------- which runs train with MTP

def test_w_o_mtp_names_resolve_to_zero_mtp_layers():
    names = ["DeepSeekV3 (w/o MTP)", "deepseekv3 (W/O  mtp)", "DeepSeek-V3 without MTP", "DeepSeekV3 (w/ MTP)",
             "DeepSeekV3", "Llama 3 70B"]
    runs = catalog.fill_from_architectures(pl.DataFrame({"model_name": names}), MEASUREMENTS)
    runs = resolve_mtp_layers(runs.with_columns(pl.lit(None, dtype=pl.Utf8).alias("assumptions")))
    assert runs["mtp_layers"].to_list() == [0, 0, 0, 1, 1, None]
    notes = runs["assumptions"].to_list()
    assert all("w/o MTP" in s for s in notes[:3])
    assert "mtp_layers=1 (model_name says w/ MTP)" in notes[3]
    assert "mtp_layers=1 (architecture table" in notes[4] and notes[5] is None


def test_hybrid_rows_train_without_mtp():
    """Nemotron 3 Super states mtp_layers 1; MTP of hybrids is not modelled (models.arch.mla), so none is assumed."""
    runs = catalog.fill_from_architectures(pl.DataFrame({"model_name": ["Nemotron 3 Super"]}), MEASUREMENTS)
    runs = resolve_mtp_layers(runs.with_columns(pl.lit(None, dtype=pl.Utf8).alias("assumptions")))
    assert runs["mtp_layers"].to_list() == [None] and runs["assumptions"].to_list() == [None]


def test_predict_model_deepseek_v3_says_it_uses_the_table_mtp():
    from typer.testing import CliRunner

    from pipeline.cli import app

    result = CliRunner().invoke(app, ["predict", "--model", "DeepSeek-V3", "--gpu", "b200", "--gpus", "256",
                                      "--global-batch", "1024", "--seq-len", "4096", "--pp", "8", "--ep", "32",
                                      "--dtype", "fp8", "--format", "json", "--analytical-only"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)[0]
    assert "mtp_layers=1 (architecture table)" in row["assumptions"]


# ---------------------------------------------------------------- the recipe's pipeline layout

def test_a_deepseek_v3_pipeline_gives_its_last_stage_the_remaining_layers(hw):  # noqa: F811
    """Megatron-Bridge's DeepSeek-V3 layout at pp 16 (set_deepseek_v3_pipeline_model_parallel_layout): embedding + 4
    layers, 14 stages of 4, and 1 layer + MTP + loss, about as much work as a stage of 4 (the MTP module is a layer
    and one more head). So the MTP module adds little (it added three quarters of a stage when the last stage held 4
    layers too), and 64 layers (an even split: 4 + MTP + loss on the last stage) cost far more than 61."""
    lay = dict(pp=16.0, dp=16.0, tp=1.0, ep=8.0)
    on = predict_arrays(v3_rows(hw, **lay))["compute_s"][0]
    off = predict_arrays(v3_rows(hw, **lay) | {"mtp_layers": np.array([0.0])})["compute_s"][0]
    assert off <= on < 1.2 * off
    even = predict_arrays(v3_rows(hw, **lay) | {"n_layers": np.array([64.0])})["compute_s"][0]
    assert even > 1.4 * off  # 4 layers + head + MTP against 4 layers


def test_a_model_without_the_recipes_layout_keeps_its_head_on_a_full_stage(hw):  # noqa: F811
    """Rows without such a layout (a dense Llama, 126 layers at pp 16): ceil(126 / 16) = 8 layers and the head on the
    pacing stage, as with 128 layers."""
    a = arrays(table_row("llama3-405b"), mtp=False)
    lay = dict(seq_len=8192.0, global_batch_seqs=512.0, micro_batch=1.0, n_gpus=512.0, tp=8.0, pp=16.0, dp=4.0,
               cp=1.0, ep=1.0, vpp=1.0, sharding=1, recompute=1, sequence_parallel=1.0, dtype=1, gpus_per_node=8.0)
    rows = config_rows(a, hw, "h100-sxm5-80gb", lay)
    r126 = predict_arrays(rows | {"n_layers": np.array([126.0])})
    r128 = predict_arrays(rows | {"n_layers": np.array([128.0])})
    assert r126["compute_s"][0] == pytest.approx(r128["compute_s"][0], rel=1e-12)
