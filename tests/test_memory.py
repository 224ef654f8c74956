"""Memory model against Korthikanti et al. 2022 and Rajbhandari et al. 2020 (ZeRO)."""

import numpy as np
import polars as pl
import pytest

from models.arch.accounting import layer_shapes, normalize_arch, param_counts
from models.memory.model import activation_bytes_per_layer, memory_inputs, memory_per_gpu
from models.core.params import DEFAULT, DTYPE_CODES, MEGATRON_2022, RECOMPUTE_CODES, SHARDING_CODES
from models.physics.step_time import predict

S, B1 = 2048, 1
GPT3 = dict(h=12288, a=96)
MTNLG = dict(h=20480, a=128)


def sbh(h):
    return S * B1 * h


# Korthikanti et al. 2022 Table 2, evaluated by hand (2-byte activations, t = 8):
#   none      s b h (34 + 5as/h)             TP        s b h (10 + 24/t + 5as/(ht))
#   TP+SP     s b h (34/t + 5as/(ht))        TP+sel    s b h (10 + 24/t)
#   TP+SP+sel s b h 34/t                     full      2 s b h
# with 5as/h = 80 for GPT-3 175B and 64 for MT-NLG 530B.
CASES = [
    # model, tp, sp, recompute, coefficient of s*b*h
    ("gpt3", 1, False, 0, 34 + 80),
    ("gpt3", 8, False, 0, 10 + 3 + 10),
    ("gpt3", 8, True, 0, (34 + 80) / 8),
    ("gpt3", 8, False, 1, 13),
    ("gpt3", 8, True, 1, 4.25),
    ("gpt3", 8, False, 2, 2),
    ("mtnlg", 1, False, 0, 34 + 64),
    ("mtnlg", 8, False, 0, 10 + 3 + 8),
    ("mtnlg", 8, True, 0, (34 + 64) / 8),
    ("mtnlg", 8, True, 1, 4.25),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-t{c[1]}-sp{int(c[2])}-rc{c[3]}" for c in CASES])
def test_korthikanti_per_layer_activation_within_1pct(case):
    name, t, sp, rc, coeff = case
    m = GPT3 if name == "gpt3" else MTNLG
    got = activation_bytes_per_layer(S, B1, m["h"], m["a"], tp=t, sequence_parallel=sp, recompute=rc)
    assert abs(float(got) / (coeff * sbh(m["h"])) - 1) < 0.01


def test_gpt3_absolute_numbers():
    # 114 * 2048 * 12288 bytes = 2.87 GB per layer without parallelism; 107 MB with TP8+SP+selective
    assert float(activation_bytes_per_layer(S, 1, 12288, 96)) == pytest.approx(2.869e9, rel=1e-3)
    got = activation_bytes_per_layer(S, 1, 12288, 96, tp=8, sequence_parallel=True, recompute=1)
    assert float(got) == pytest.approx(106.95e6, rel=1e-3)


def test_gqa_swiglu_adaptation_reduces_to_mha_gelu():
    h = 4096
    mha = activation_bytes_per_layer(S, 1, h, 32, q_dim=h, kv_dim=h, ffn_eff=4 * h, ffn_coeff=4.0)
    gqa = activation_bytes_per_layer(S, 1, h, 32, q_dim=h, kv_dim=h / 4, ffn_eff=4 * h, ffn_coeff=4.0)
    swi = activation_bytes_per_layer(S, 1, h, 32, q_dim=h, kv_dim=h, ffn_eff=4 * h, ffn_coeff=6.0)
    assert float(mha) == pytest.approx(S * h * (34 + 5 * 32 * S / h))
    assert float(gqa) == pytest.approx(float(mha) - S * 3 * h)  # 4 kv shrinks 4h -> h
    assert float(swi) == pytest.approx(float(mha) + S * 8 * h)  # 6F vs 4F with F = 4h


def _mem(arch, params=DEFAULT, **lay):
    """Memory of one layout (memory_inputs' defaults: tp = pp = dp = cp = ep = vpp = 1, no sharding, no
    recompute, no SP, bf16, 8 GPUs per node)."""
    ar = normalize_arch({k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in arch.items()})
    layout = dict(seq_len=S, micro_batch=1, n_micro=1) | lay
    x = memory_inputs(ar, **{k: np.atleast_1d(v) for k, v in layout.items()})
    return ar, memory_per_gpu(x, layer_shapes(ar), params)


def test_interleaved_inflight_factor_korthikanti():
    """530B, t8 p35 v3: the first stage holds L (1 + (p-1)/(p v)) = 139 layers' worth of activations."""
    arch = dict(n_layers=105, d_model=20480, n_heads=128, ffn_dim=81920, vocab=51200, tied_embeddings=1, activation=0)
    # Korthikanti's accounting (dropout masks included) is the MEGATRON_2022 preset
    _, mem = _mem(arch, tp=8, pp=35, vpp=3, n_micro=280, recompute=1, sequence_parallel=True, params=MEGATRON_2022)
    per_layer = float(activation_bytes_per_layer(S, 1, 20480, 128, tp=8, sequence_parallel=True, recompute=1))
    assert mem["mem_activations_bytes"][0] == pytest.approx(per_layer * 105 * (1 + 34 / (35 * 3)), rel=1e-3)
    _, mem1 = _mem(arch, tp=8, pp=35, vpp=1, n_micro=280, recompute=1, sequence_parallel=True, params=MEGATRON_2022)
    assert mem1["mem_activations_bytes"][0] == pytest.approx(per_layer * 105, rel=1e-3)


@pytest.mark.parametrize("sharding,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_model_states_rajbhandari_fig1(sharding, expected_gb):
    """ZeRO paper Fig. 1: 7.5B params, 64-way DP, K=12, 2-byte grads: 120 / 31.4 / 16.6 / 1.9 GB."""
    arch = dict(n_layers=36, d_model=4096, n_heads=32, ffn_dim=16384, vocab=51200, tied_embeddings=1, activation=0)
    P = DEFAULT.with_(grad_bytes=2.0)
    ar = normalize_arch({k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in arch.items()})
    sh = layer_shapes(ar)
    mem = memory_per_gpu(memory_inputs(ar, seq_len=S, micro_batch=1, n_micro=1, dp=64, sharding=np.array([sharding])),
                         sh, P)
    psi = param_counts(ar)["params"][0]
    states = mem["mem_weights_bytes"] + mem["mem_grads_bytes"] + mem["mem_optimizer_bytes"]
    if sharding == 3:  # ZeRO-3 also keeps two gathered layers as prefetch buffers
        states = states - 2 * 2 * (sh["attn_matmul"] + sh["attn_bias"] + sh["norm_params"] + sh["dense_mlp_matmul"]
                                   + sh["mlp_bias"])
    assert states[0] / 1e9 == pytest.approx(expected_gb * psi / 7.5e9, rel=0.02)


def _cfg(**over):
    d = dict(n_layers=96, d_model=12288, n_heads=96, ffn_dim=49152, vocab=51200, activation="gelu",
             tied_embeddings=True, seq_len=2048, global_batch_seqs=64, micro_batch=1, n_gpus=64, tp=8, pp=8, dp=1,
             vpp=1, recompute="selective", sequence_parallel=True, sharding="none", dtype="bf16", gpus_per_node=8,
             peak_fp32_tflops=19.5, peak_tf32_tflops=156.0, peak_bf16_tflops=312.0, peak_fp16_tflops=312.0,
             peak_fp8_tflops=None, memory_gb=80.0, memory_bw_gbps=2039.0, intra_node_bw_gbps=300.0,
             inter_node_bw_gbps=25.0, scaleup_size=8.0)
    d.update(over)
    return pl.DataFrame([d])


def test_infeasible_reason_names_components():
    out = predict(_cfg(recompute="none", sequence_parallel=False, tp=1, pp=8, dp=8), MEGATRON_2022)
    assert not out["feasible"][0]
    msg = out["error"][0]
    assert msg.startswith("memory ") and "> 85.9 GB capacity" in msg and "activations" in msg and "optimizer" in msg
    assert out["step_time_s"][0] is not None  # the time is still reported, flagged infeasible


def test_sharding_reduces_memory_and_full_recompute_smallest_activations():
    a = predict(pl.concat([_cfg(tp=1, pp=8, dp=8, global_batch_seqs=64, sharding=s) for s in
                           ("none", "zero1", "zero2", "zero3")]))
    mem = a["memory_gb_per_gpu"].to_list()
    assert mem[0] > mem[1] > mem[2] > mem[3]
    b = predict(pl.concat([_cfg(recompute=r) for r in ("none", "selective", "full")]), MEGATRON_2022)
    act = b["mem_activations_gb"].to_list()
    assert act[0] > act[1] > act[2]


@pytest.mark.parametrize("over", [
    {},  # GPT-3 175B on t8 p8 with SP and selective recompute
    dict(tp=1, pp=8, dp=8, sharding="zero3", recompute="full", sequence_parallel=False),
    dict(tp=2, pp=4, dp=8, vpp=3, sharding="hsdp", recompute="none", dtype="fp32"),
    dict(tp=8, pp=1, dp=8, ep=2, n_experts=8, top_k=2, expert_ffn_dim=12288, sharding="zero1"),
])
def test_memory_inputs_give_the_bytes_predict_reports(over):
    """A memory question alone (memory_inputs, then memory_per_gpu) gives the bytes `predict` reports for the same
    row: both read the same fields of the decoded Inputs."""
    cfg = _cfg(**over)
    out = predict(cfg, MEGATRON_2022)
    r = cfg.row(0, named=True)
    arch = {k: r.get(k, 0.0) for k in ("n_layers", "d_model", "n_heads", "ffn_dim", "vocab", "n_experts", "top_k",
                                        "expert_ffn_dim")} | dict(tied_embeddings=1.0, activation=0.0)
    ar = normalize_arch({k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in arch.items()})
    one = lambda v: np.array([float(v)])  # noqa: E731
    x = memory_inputs(ar, seq_len=one(r["seq_len"]), micro_batch=one(r["micro_batch"]),
                      n_micro=one(r["global_batch_seqs"] / (r["dp"] * r["micro_batch"])), tp=one(r["tp"]),
                      pp=one(r["pp"]), dp=one(r["dp"]), ep=one(r.get("ep", 1)), vpp=one(r["vpp"]),
                      sharding=np.array([SHARDING_CODES[r["sharding"]]]),
                      recompute=np.array([RECOMPUTE_CODES[r["recompute"]]]),
                      sequence_parallel=np.array([r["sequence_parallel"]]), dtype=np.array([DTYPE_CODES[r["dtype"]]]),
                      node_size=one(r["gpus_per_node"]))
    mem = memory_per_gpu(x, layer_shapes(ar), MEGATRON_2022)
    for part in ("weights", "grads", "optimizer", "activations", "overhead"):
        assert mem[f"mem_{part}_bytes"][0] / 1e9 == out[f"mem_{part}_gb"][0], part
