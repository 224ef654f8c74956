"""Megatron-Core module recompute (``recompute_modules``; models.memory.model.module_recompute_savings, models.physics.parts
.module_recompute) against Korthikanti et al. 2022's per-layer activation terms, and the Megatron-Bridge
performance recipes that set it (measurements/recipes/recompute_modules.csv)."""

from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from models.arch.accounting import layer_shapes, normalize_arch
from models.memory.model import (RECOMPUTE_MODULE_BITS, memory_inputs, memory_per_gpu, module_recompute_savings,
                                 recompute_modules_code)
from models.core.params import DTYPE_CODES, MEGATRON_2022
from models.physics.step_time import predict_arrays
from pipeline.catalog import recipes, stacks
from tests.conftest import MEASUREMENTS

memory_options = stacks(MEASUREMENTS).memory_options  # a stack's memory values (measurements/stacks.csv)

H, A, S = 12288, 96, 2048  # GPT-3 175B (Korthikanti Table 3): d_model, heads, sequence


def _save(mods, *, cf=4.0, F=4.0 * H, E=4.0 * H, k=1.0, ns=0.0, moe_w=0.0, fc2=2.0, ms=None):
    """(replicated coefficient of h, sharded bytes per token) one layer stops storing, Korthikanti units."""
    rep, sh = module_recompute_savings(np.array([recompute_modules_code(mods)]), H, A, F, E, k, ns, cf, moe_w,
                                       1.0 - moe_w, fc2, ms)
    return float(np.asarray(rep).ravel()[0]), float(np.asarray(sh).ravel()[0])


def test_each_module_drops_korthikanti_terms():
    """Per layer, in s b h units of Korthikanti et al. 2022 section 4.1 (GPT, ffn = 4h, GeLU, 2-byte activations):
    mlp drops the GeLU input 8 + GeLU output 8 = 16 (its own input, the 2 s b h MLP input, stays as the checkpoint's
    input); moe_act the GeLU output 8 (the fc2 input); layernorm the 2 s b h MLP input (MoE layers); mla_up_proj the
    Q, K 4 + V 2 = 6 (heads x head dims = h); moe the experts' 16 plus the dispatched copy 2; shared_experts a shared
    expert's 16; core_attn nothing beyond what recompute = selective drops (the 5 a s / h scores)."""
    assert _save(["mlp"]) == (0.0, 16.0 * H)
    assert _save(["moe_act"], moe_w=1.0) == (0.0, 8.0 * H)
    assert _save(["layernorm"], moe_w=1.0) == (2.0, 0.0)
    assert _save(["layernorm"], moe_w=0.0) == (0.0, 0.0)  # dense layers: the norm is fused into fc1 (not counted)
    d = H / A
    ms = {"mla": np.array([True]), "qk_head": np.array([d]), "v_head_dim": np.array([d])}
    assert _save(["mla_up_proj"], ms=ms) == (0.0, 6.0 * H)
    assert _save(["moe"], moe_w=1.0) == (0.0, 16.0 * H + 2.0 * H)
    assert _save(["moe", "moe_act", "shared_experts"], moe_w=1.0, ns=1.0) == _save(["moe"], moe_w=1.0, ns=1.0)
    assert _save(["shared_experts"], moe_w=1.0, ns=1.0, k=0.0) == (0.0, 16.0 * H)
    assert _save(["core_attn"]) == (0.0, 0.0)
    # a quantized fc2 input (TE keeps the original with moe_act, discarded with it): the bytes charged for it
    assert _save(["moe_act"], moe_w=1.0, fc2=1.03125)[1] == pytest.approx(1.03125 * 4.0 * H)


def _gpt(rc, mods=None, pp=1):
    d = dict(n_layers=96, d_model=H, n_heads=A, n_kv_heads=A, ffn_dim=4 * H, vocab=51200, activation=0,
             tied_embeddings=1)
    ar = normalize_arch({k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in d.items()})
    one = lambda x: np.array([float(x)])  # noqa: E731
    x = memory_inputs(ar, seq_len=one(S), micro_batch=one(1), n_micro=one(64), tp=one(8), pp=one(pp),
                      sharding=np.array([1]), recompute=np.array([rc]), sequence_parallel=np.array([True]),
                      dtype=np.array([DTYPE_CODES["bf16"]]))
    options = replace(memory_options(np.array(["megatron"]), pp=np.array([pp])),
                      recompute_modules=None if mods is None else one(recompute_modules_code(mods)))
    return memory_per_gpu(x, layer_shapes(ar), MEGATRON_2022, options)["mem_activations_bytes"][0]


def test_mlp_recompute_on_gpt3_175b():
    """t 8 with SP, pp 1: mlp stops storing 16 s b h / t in each of the 96 layers and holds one layer's 16 s b h / t
    again during that layer's backward: 95 x 16 s b h / t less (exact). Megatron-Core checkpoints the core attention
    only when the list names core_attn (megatron/core/transformer/attention.py), so a list of mlp alone keeps the
    2021-22 unfused core's score matrices, as recompute none does."""
    assert _gpt(1, ["core_attn"]) == _gpt(1)
    drop = _gpt(1, ["core_attn"]) - _gpt(1, ["core_attn", "mlp"])
    assert drop == pytest.approx(95 * 16.0 * S * H / 8, rel=1e-12)
    assert _gpt(1, ["mlp"]) > _gpt(1, ["core_attn", "mlp"])


def test_module_list_only_with_selective_recompute():
    """recompute_modules apply with recompute_granularity = selective only: none and full rows are unchanged."""
    for rc in (0, 2):
        assert _gpt(rc, ["mlp", "moe_act"]) == _gpt(rc)


def _row(**kw):
    base = dict(n_layers=61.0, d_model=7168.0, n_heads=128.0, n_kv_heads=128.0, ffn_dim=18432.0, vocab=129280.0,
                n_experts=256.0, top_k=8.0, expert_ffn_dim=2048.0, n_shared_experts=1.0, n_dense_layers=3.0,
                activation=1.0, q_lora_rank=1536.0, kv_lora_rank=512.0, qk_rope_head_dim=64.0,
                qk_nope_head_dim=128.0, v_head_dim=128.0, seq_len=4096.0, global_batch_seqs=4096.0, micro_batch=1.0,
                n_gpus=256.0, tp=1.0, pp=4.0, dp=64.0, cp=1.0, ep=64.0, vpp=4.0, sharding=1, recompute=1,
                dtype=DTYPE_CODES["bf16"], peak_fp32_tflops=80.0, peak_tf32_tflops=1250.0, peak_bf16_tflops=2500.0,
                peak_fp16_tflops=2500.0, peak_fp8_tflops=5000.0, peak_fp4_tflops=10000.0, memory_gb=186.0,
                memory_bw_gbps=8000.0,
                intra_node_bw_gbps=900.0, inter_node_bw_gbps=400.0, gpus_per_node=72.0, scaleup_size=72.0)
    base.update(kw)
    return {k: np.atleast_1d(np.asarray(v)) for k, v in base.items()}


def test_row_without_modules_is_unchanged():
    """The input absent, 0 or null: every output bit-identical."""
    ref = predict_arrays(_row())
    assert (int(ref["error_code"][0]) & ~1024) == 0 and np.isfinite(ref["step_time_s"][0])
    for v in (0.0, np.nan):
        out = predict_arrays(_row(recompute_modules=v))
        for k, x in ref.items():
            np.testing.assert_array_equal(np.asarray(out[k]), np.asarray(x), err_msg=k)


@pytest.mark.parametrize("mods", [[m] for m in RECOMPUTE_MODULE_BITS] + [["mla_up_proj", "layernorm", "moe_act"]])
def test_recompute_never_makes_a_step_faster(mods):
    """Every module (DeepSeek-V3 on a GB200-like row, selective): the step is never shorter, compute never less."""
    ref = predict_arrays(_row())
    out = predict_arrays(_row(recompute_modules=float(recompute_modules_code(mods))))
    assert out["step_time_s"][0] >= ref["step_time_s"][0]
    assert out["compute_s"][0] >= ref["compute_s"][0]
    if set(mods) - {"core_attn"}:
        assert out["compute_s"][0] > ref["compute_s"][0]


def test_recipe_modules_are_sourced():
    """Every recipe entry names its file, its release branch and its container, and only Megatron-Core modules."""
    for (arch, task, gpu, dtype, container), (mods, src, _notes) in recipes(MEASUREMENTS).recompute_modules.items():
        assert set(mods) <= set(RECOMPUTE_MODULE_BITS)
        assert "Megatron-Bridge" in src and f", {container})" in src and "(r0." in src


def test_deepseek_v3_gb200_recipe_rows_now_fit(corpus):
    """DeepSeek-V3 on 256 GB200, MXFP8, 26.02-26.08: the recipe's recompute_modules (mla_up_proj; mlp in 26.04) are
    in the row's assumptions, and the memory model now fits the measured runs within the 186 GiB."""
    ds = corpus.filter(pl.col("run_id").str.contains("deepseekv3-gb200-256gpu-mxfp8-gbs4096")).unique("run_id")
    assert ds.height == 4
    assert ds["assumptions"].str.contains("recompute_modules=").all()
    assert ds["memory_fits"].all()
    assert (ds["recompute"] == "selective").all()
