"""Hybrid Mamba-Transformer models (models/arch/mamba.py): parameter counts and FLOPs against published figures, the
Hugging Face config round trip, the block composition of the step-time model, and bit-identity of every other
row."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from models.arch import mamba
from models.arch.accounting import ARCH_COLUMNS, model_flops_per_token, param_counts
from models.arch.archfile import architecture_from_mapping
from models.physics.step_time import ERR_CP_SEQ, ERR_HEADS_TP, ERR_HYBRID, HARDWARE_COLUMNS, predict_arrays
from tests.conftest import MEASUREMENTS
from tests.test_archfile import HF, hybrid_params, table_row
from tests.test_step_time import _same, config_rows, hw, random_layouts  # noqa: F401 (hw is a fixture)

REL = 0.03  # stated tolerance of the published totals


def arrays(arch: dict) -> dict[str, np.ndarray]:
    """One architecture dict (table row or parsed config) -> the arrays models.arch.accounting reads."""
    a = {c: np.array([np.nan if arch.get(c) is None else float(arch[c])]) for c in ARCH_COLUMNS if c != "activation"}
    a["activation"] = np.array([arch["activation"]])
    a.update({k: np.array([v]) for k, v in mamba.pattern_counts(arch.get("layer_pattern")).items()})
    a.update({c: np.array([np.nan if arch.get(c) is None else float(arch[c])]) for c in mamba.SHAPE_COLUMNS})
    return a


def counts(arch: dict) -> dict[str, float]:
    return {k: float(v[0]) for k, v in param_counts(arrays(arch)).items() if k != "hybrid_counts"}


@pytest.mark.parametrize("arch_id, total_b, active_b, source", [
    ("nemotron-h-8b", 8.0, None, "Nemotron-H paper (arXiv:2504.03624): 8B"),
    ("nemotron-h-47b", 47.0, None, "Nemotron-H paper: 47B"),
    ("nemotron-h-56b", 56.0, None, "Nemotron-H paper: 56B"),
    ("nemotron-3-nano", 31.6, 3.6, "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B model card: 31.6B total, 3.6B active "
                                   "including embeddings"),
    ("nemotron-3-super", 120.0, None, "NVIDIA-Nemotron-3-Super-120B-A12B: 120B total, with the latent MoE width "
                                      "(moe_latent_size 1024, Megatron-Bridge Nemotron3SuperProvider)"),
    ("jamba-v0.1", 52.0, 12.0, "Lieber et al. 2024 (arXiv:2403.19887) and the ai21labs/Jamba-v0.1 card: 52B total, "
                               "12B active; Mamba-1 mixers (counted 51.57 / 12.11)"),
])
def test_hybrid_param_counts_reproduce_published_totals(arch_id, total_b, active_b, source):
    c = counts(table_row(arch_id))
    assert c["params"] / 1e9 == pytest.approx(total_b, rel=REL), source
    if active_b is not None:
        assert c["active_params"] / 1e9 == pytest.approx(active_b, rel=REL), source


@pytest.mark.parametrize("arch_id", ["nemotron-h-8b", "nemotron-h-47b", "nemotron-h-56b"])
def test_accounting_equals_the_block_by_block_count(arch_id):
    """models/arch/accounting.py counts exactly the per-block sum of tests/test_archfile.py (Megatron-Core modules)."""
    a = table_row(arch_id)
    assert counts(a)["params"] == pytest.approx(hybrid_params(a), rel=1e-12)


def test_hugging_face_config_round_trips_to_the_table_counts():
    cfg = json.loads((HF / "nemotron-h-8b.json").read_text())
    parsed = architecture_from_mapping(cfg, "nemotron-h-8b.json")
    assert counts(parsed) == pytest.approx(counts(table_row("nemotron-h-8b")), rel=1e-12)
    f = [float(model_flops_per_token(arrays(x), 8192)[0]) for x in (parsed, table_row("nemotron-h-8b"))]
    assert f[0] == pytest.approx(f[1], rel=1e-12)


def test_model_flops_match_megatron_bridge_reported_tflops():
    """Nemotron 3 Nano on GB200 (Megatron-Bridge performance summary, 26.06, in measured_runs.csv): the reported
    model TFLOP/s per GPU over the reported tokens/s per GPU is Megatron's FLOPs per token (training.py
    hybrid_flops); ours (SSD scan instead of Megatron's 7 d_inner N) agree within the stated tolerance."""
    runs = pl.read_csv(MEASUREMENTS / "measured_runs.csv", infer_schema_length=0).filter(
        pl.col("run_id") == "mb2606-pre-training-nemotron-3-nano-gb200-8gpu-mxfp8-gbs512")
    v = {r["metric"]: float(r["value"]) for r in runs.iter_rows(named=True)}
    megatron = v["model_tflops_per_gpu"] * 1e12 / v["tokens_per_s_per_gpu"]
    ours = float(model_flops_per_token(arrays(table_row("nemotron-3-nano")), 8192)[0])
    assert ours == pytest.approx(megatron, rel=REL)


def test_ssd_scan_flops_near_megatrons_estimate():
    a = table_row("nemotron-h-8b")
    ssd = mamba.ssd_flops_per_token(a["mamba_n_heads"], a["mamba_head_dim"], a["mamba_n_groups"],
                                    a["mamba_state_dim"], a["mamba_chunk_size"])
    d_inner = a["mamba_n_heads"] * a["mamba_head_dim"]
    assert ssd == pytest.approx(7.0 * d_inner * a["mamba_state_dim"], rel=0.15)  # Megatron training.py


def test_ssd_traffic_matches_the_kernel_by_kernel_count():
    """Nemotron-H 56B (H 256, P 64, G 8, N 256, Q 128) at tp 1, 16-bit: summing the reads and writes of each
    mamba_ssm kernel (state-spaces/mamba ssd_*.py) gives 588,288 B forward and about 1.86 MB backward per token and
    layer (the backward's per-head fp32 terms depend on autotuned block sizes: within 1 %); the backward moves
    about 3x the forward, not the 2x every other block is taken to."""
    a = table_row("nemotron-h-56b")
    shape = (a["mamba_n_heads"], a["mamba_head_dim"], a["mamba_n_groups"], a["mamba_state_dim"],
             a["mamba_chunk_size"] or mamba.DEFAULT_CHUNK)
    assert shape == (256, 64, 8, 256, 128)
    fwd = mamba.ssd_bytes_per_token(*shape, 2.0)
    bwd = mamba.ssd_bwd_bytes_per_token(*shape, 2.0)
    assert fwd == pytest.approx(588_288, rel=1e-9)
    # by hand: 34 d + 54 g + 32 c + 34 s + 174 H with d 16,384, g 2,048, c 1,024, s 32,768, H 256
    assert bwd == pytest.approx(557_056 + 110_592 + 32_768 + 1_114_112 + 44_544, rel=1e-9)
    assert bwd == pytest.approx(1.86e6, rel=0.01) and 2.9 < bwd / fwd < 3.3
    # splitting heads and groups over tp splits every term: per-token bytes scale with the local heads
    half = (128, 64, 4, 256, 128)
    assert mamba.ssd_bwd_bytes_per_token(*half, 2.0) == pytest.approx(bwd / 2, rel=1e-9)


def test_pattern_counts_polars_equals_python():
    pats = ["M-M*-E", None, "MEMEM*E"]
    got = pl.DataFrame({"layer_pattern": pats}).select(mamba.pattern_count_exprs()).to_dicts()
    for p, g in zip(pats, got):
        want = mamba.pattern_counts(p)
        assert all((g[k] is None and np.isnan(want[k])) or g[k] == want[k] for k in want)


# ---------------------------------------------------------------- step-time model

def hybrid_rows(hw, arch_id="nemotron-h-8b", n=4, **over):  # noqa: F811
    lay = dict(seq_len=8192.0, global_batch_seqs=64.0, micro_batch=1.0, n_gpus=64.0, tp=8.0, pp=1.0, dp=8.0, cp=1.0,
               ep=1.0, vpp=1.0, sharding=1, recompute=1, sequence_parallel=1.0, dtype=0, gpus_per_node=8.0)
    return config_rows(arrays(table_row(arch_id)), hw, "h100-sxm5-80gb", lay | over, n)


def test_non_hybrid_rows_are_bit_identical_with_hybrid_columns_and_rows(hw):  # noqa: F811
    """Dense/MoE rows: the same outputs without the hybrid columns, with them all NaN, and beside hybrid rows in
    the same block (the formula path of a row without a pattern is untouched; checked against the code before
    hybrids existed on 24,000 random configurations when it was written)."""
    a = random_layouts(hw)
    base = predict_arrays(a)
    n = len(a["tp"])
    assert (base["error_code"] == 0).sum() > 300
    nan = {k: np.full(n, np.nan) for k in mamba.HYBRID_COLUMNS}
    _same(base, predict_arrays(a | nan))
    h = hybrid_rows(hw, n=7)
    full = a | nan
    keys = set(full) | set(h)
    fill = lambda d, k, m: d[k] if k in d else np.full(m, np.nan)  # noqa: E731
    mixed = {k: np.concatenate([fill(full, k, n), fill(h, k, 7)]) for k in keys}
    res = predict_arrays(mixed)
    _same(base, res, rows=slice(0, n))
    assert np.all(res["error_code"][n:] == 0) and np.all(np.isfinite(res["step_time_s"][n:]))


def test_hybrid_blocks_compose(hw):  # noqa: F811
    r = predict_arrays(hybrid_rows(hw, n=1))
    assert r["error_code"][0] == 0 and 0.2 < r["mfu"][0] < 0.8
    # a hybrid block issues one TP collective pair per pass: half a transformer layer's
    assert r["tp_comm_s"][0] > 0 and r["cp_comm_s"][0] == 0
    # more Mamba state costs time and memory
    a = hybrid_rows(hw, n=1)
    big = predict_arrays(a | {"mamba_state_dim": a["mamba_state_dim"] * 2})
    assert big["step_time_s"][0] > r["step_time_s"][0] and big["memory_gb_per_gpu"][0] > r["memory_gb_per_gpu"][0]
    full = predict_arrays(a | {"recompute": np.array([2])})
    assert full["mem_activations_gb"][0] < r["mem_activations_gb"][0] <= predict_arrays(
        a | {"recompute": np.array([0])})["mem_activations_gb"][0]
    assert full["step_time_s"][0] > r["step_time_s"][0]


def test_hybrid_tp_cp_rules(hw):  # noqa: F811
    # Megatron-Core MambaMixer: ngroups (8) % tp == 0; MambaContextParallel: nheads % (tp*cp) == 0
    r = predict_arrays(hybrid_rows(hw, n=1, tp=16.0, dp=4.0))
    assert r["error_code"][0] & ERR_HEADS_TP
    r = predict_arrays(hybrid_rows(hw, n=1, cp=2.0, dp=4.0))
    assert r["error_code"][0] == 0 and r["cp_comm_s"][0] > 0
    r = predict_arrays(hybrid_rows(hw, n=1, tp=1.0, cp=256.0, dp=1.0, n_gpus=256.0, global_batch_seqs=8.0))
    assert r["error_code"][0] & ERR_CP_SEQ


# ---------------------------------------------------------------- Mamba-1 (Jamba)

def tiny_mamba1() -> dict:
    """A two-block Mamba-1 hybrid small enough to count by hand: d_model 8, expand 2 (d_inner 16), N 4, R 2, K 4,
    one Mamba-1 block and one SwiGLU MLP block (ffn 12), vocab 10, untied."""
    return dict(n_layers=2, d_model=8, n_heads=2, n_kv_heads=2, head_dim=4, ffn_dim=12, vocab=10,
                activation="swiglu", n_experts=0, top_k=0, expert_ffn_dim=None, n_shared_experts=0, n_dense_layers=2,
                tied_embeddings=False, layer_pattern="M-", mamba_state_dim=4, mamba_dt_rank=2, mamba_expand=2,
                mamba_conv_kernel=4)


def test_mamba1_parameters_and_flops_by_hand():
    c = counts(tiny_mamba1())
    # in_proj 8x32 + x_proj 16x(2+8) + dt_proj 2x16 + out_proj 16x8 = 256 + 160 + 32 + 128
    matmul = 576
    # conv 16x(4+1) + dt bias 16 + A_log 16x4 + D 16 + dt/B/C norm gains 2+4+4
    other = 80 + 16 + 64 + 16 + 10
    mlp = 3 * 8 * 12
    assert c["params"] == matmul + other + mlp + 2 * 8 + 2 * 10 * 8 + 8  # + block norms, embeddings, final norm
    assert c["matmul_params_active"] == matmul + mlp + 10 * 8  # + LM head
    # selective scan forward: d_inner (7 N + 8) = 16 x 36
    scan = 16 * (7 * 4 + 8)
    assert mamba.selective_scan_flops_per_token(16.0, 4.0) == scan
    f = float(model_flops_per_token(arrays(tiny_mamba1()), 2048)[0])
    assert f == 6 * (matmul + mlp + 80) + 3 * scan  # no attention block: no s-dependent term


def test_jamba_hugging_face_config_round_trips_to_the_table_counts():
    cfg = json.loads((HF / "jamba-v0.1.json").read_text())
    parsed = architecture_from_mapping(cfg, "jamba-v0.1.json")
    table = table_row("jamba-v0.1")
    assert parsed["n_layers"] == 64 == len(parsed["layer_pattern"]) and parsed["mamba_dt_rank"] == 256
    assert counts(parsed) == pytest.approx(counts(table), rel=1e-12)
    f = [float(model_flops_per_token(arrays(x), 4096)[0]) for x in (parsed, table)]
    assert f[0] == pytest.approx(f[1], rel=1e-12)
    auto = architecture_from_mapping(cfg | {"mamba_dt_rank": "auto"}, "jamba-auto.json")  # ceil(4096 / 16)
    assert auto["mamba_dt_rank"] == 256


def test_jamba_mixer_shape():
    """Jamba v0.1's Mamba-1 mixer: 105,308,448 parameters (transformers JambaMambaMixer), scan forward
    8192 (7 x 16 + 8) FLOPs per token."""
    a = table_row("jamba-v0.1")
    sh = mamba.mamba1_shapes(4096.0, a["mamba_expand"], a["mamba_state_dim"], a["mamba_dt_rank"],
                             a["mamba_conv_kernel"])
    assert sh["d_inner"] == 8192 and sh["matmul"] + sh["other"] == 105_308_448
    assert mamba.selective_scan_flops_per_token(sh["d_inner"], 16.0) == 8192 * 120


def test_mamba1_hybrid_composes(hw):  # noqa: F811
    r = predict_arrays(hybrid_rows(hw, "jamba-v0.1", n=1, tp=4.0, dp=16.0, ep=8.0, seq_len=4096.0))
    assert r["error_code"][0] == 0 and 0.2 < r["mfu"][0] < 0.8, r["error_code"][0]
    assert r["tp_comm_s"][0] > 0 and r["cp_comm_s"][0] == 0
    a = hybrid_rows(hw, "jamba-v0.1", n=1, tp=4.0, dp=16.0, ep=8.0, seq_len=4096.0)
    big = predict_arrays(a | {"mamba_state_dim": a["mamba_state_dim"] * 4})
    assert big["step_time_s"][0] > r["step_time_s"][0] and big["memory_gb_per_gpu"][0] > r["memory_gb_per_gpu"][0]
    # x_proj's row-parallel output is all-reduced: a larger dt rank costs TP time
    wide = predict_arrays(a | {"mamba_dt_rank": a["mamba_dt_rank"] * 8})
    assert wide["tp_comm_s"][0] > r["tp_comm_s"][0]
    full = predict_arrays(a | {"recompute": np.array([2])})
    assert full["mem_activations_gb"][0] < r["mem_activations_gb"][0]


def test_mamba1_tp_must_divide_d_inner_and_cp_is_refused(hw):  # noqa: F811
    from models.physics.step_time import ERROR_MESSAGES

    # d_inner = expand x d_model = 4097 (odd): tp 2 cannot split it (vLLM MambaMixer splits d_inner over tp)
    odd = {"mamba_expand": np.array([4097.0 / 4096.0])}
    r = predict_arrays(hybrid_rows(hw, "jamba-v0.1", n=1, tp=2.0, dp=32.0) | odd)
    assert r["error_code"][0] & ERR_HEADS_TP
    r = predict_arrays(hybrid_rows(hw, "jamba-v0.1", n=1, tp=1.0, dp=64.0) | odd)
    assert not r["error_code"][0] & ERR_HEADS_TP
    # no context-parallel selective scan: cp > 1 is refused for Mamba-1 rows, and the message says so
    r = predict_arrays(hybrid_rows(hw, "jamba-v0.1", n=1, tp=4.0, cp=2.0, dp=8.0, seq_len=4096.0))
    assert r["error_code"][0] & ERR_CP_SEQ and np.isnan(r["step_time_s"][0])
    assert "Mamba-1" in ERROR_MESSAGES[ERR_CP_SEQ]


def test_mamba1_cli_answers_and_refuses_cp():
    from typer.testing import CliRunner

    from pipeline.cli import app

    def args(cp, ep):
        return ["predict", "--model", "jamba", "--gpu", "h100-sxm5-80gb", "--gpus", "64", "--tp", "4", "--pp", "2",
                "--cp", str(cp), "--ep", str(ep), "--global-batch", "256", "--seq-len", "4096", "--format", "json",
                "--analytical-only"]

    result = CliRunner().invoke(app, args(1, 8))
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)[0]
    assert row["step_time_s"] > 0 and row["params"] == pytest.approx(51.57e9, rel=1e-3)
    result = CliRunner().invoke(app, args(2, 4))
    assert result.exit_code == 2 and "Mamba-1 mixers" in result.stderr and "use cp=1" in result.stderr


def test_a_mamba1_row_with_mamba2_heads_is_refused(hw):  # noqa: F811
    """A row gives one mixer kind: mamba_dt_rank (Mamba-1) and mamba_n_heads (Mamba-2) together are refused."""
    a = hybrid_rows(hw, "jamba-v0.1", n=1, tp=1.0, dp=64.0)
    r = predict_arrays(a | {"mamba_n_heads": np.array([128.0])})
    assert r["error_code"][0] & ERR_HYBRID and np.isnan(r["step_time_s"][0])



def test_a_hybrid_whose_table_shape_is_incomplete_is_refused(tmp_path):
    """Nemotron 3 Super without its latent MoE width (moe_latent_size): full-width experts count 459 B for a model
    the row states at 120 B, so the row is refused with the missing part named, not predicted on a wrong model."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    row = pl.read_csv(MEASUREMENTS / "architectures.csv", infer_schema_length=0).filter(
        pl.col("id") == "nemotron-3-super").drop("moe_latent_size").with_columns(pl.lit("super-no-latent").alias("id"))
    row.write_csv(tmp_path / "super.csv")
    result = CliRunner().invoke(app, ["predict", "--arch-file", str(tmp_path / "super.csv"), "--gpu", "gb200",
                                      "--gpus", "64", "--global-batch", "512", "--seq-len", "8192", "--tp", "2",
                                      "--ep", "64"])
    assert result.exit_code == 2 and "moe_latent_size" in result.stderr and "120 B" in result.stderr
