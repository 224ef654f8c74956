"""Low-precision activation memory (models.memory.model.low_precision_saved_inputs, models.core.precision.SAVED_GEMM_INPUT_BYTES)
and what Megatron-Bridge's performance recipes set (models.memory.presets megatron_bridge preset, measurements/recipes/
memory.csv), against
Korthikanti et al. 2022's activation formula and the measured runs of Megatron-Bridge's performance summary."""

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from models.arch.accounting import layer_shapes, normalize_arch
from models.memory.model import memory_inputs, memory_per_gpu
from models.core.params import DEFAULT, DTYPE_CODES, MEGATRON_2022
from models.core.precision import SAVED_GEMM_INPUT_BYTES, saved_gemm_input_bytes
from pipeline.catalog import recipes, stacks
from tests.conftest import MEASUREMENTS

memory_options = stacks(MEASUREMENTS).memory_options  # a stack's memory values (measurements/stacks.csv)

GPT3_175B = (96, 12288, 96, 96, 49152, 51200)  # layers, d_model, heads, kv heads, ffn, vocab (Korthikanti Table 3)


def _arch(L, h, a, kv, ffn, V, act=0):
    d = dict(n_layers=L, d_model=h, n_heads=a, n_kv_heads=kv, ffn_dim=ffn, vocab=V, activation=act, tied_embeddings=1)
    ar = normalize_arch({k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in d.items()})
    return ar, layer_shapes(ar)


def _acts(dtype, rc, *, preset="megatron", params=MEGATRON_2022, layers_16bit=None, pp=8, tp=8):
    """Activation bytes of the first stage of GPT-3 175B, t8 p8, SP, seq 2048, micro-batch 1, 64 micro-batches."""
    ar, sh = _arch(*GPT3_175B)
    one = lambda x: np.array([float(x)])  # noqa: E731
    x = memory_inputs(ar, seq_len=one(2048), micro_batch=one(1), n_micro=one(64), tp=one(tp), pp=one(pp),
                      sharding=np.array([1]), recompute=np.array([rc]), sequence_parallel=np.array([tp > 1]),
                      dtype=np.array([DTYPE_CODES[dtype]]), layers_16bit=one(layers_16bit or 0))
    return memory_per_gpu(x, sh, params, memory_options(np.array([preset]), pp=np.array([pp])))[
        "mem_activations_bytes"][0]


def test_saved_bytes_per_element_follow_the_formats():
    """FP8: one byte; MXFP8: a byte plus an E8M0 scale per 32; NVFP4: half a byte plus an E4M3 scale per 16."""
    assert SAVED_GEMM_INPUT_BYTES == {"fp8": 1.0, "fp8-cs": 1.0, "mxfp8": 1.03125, "nvfp4": 0.5625}
    codes = np.array([DTYPE_CODES[d] for d in ("bf16", "fp16", "fp8", "fp8-cs", "mxfp8", "nvfp4", "fp32")])
    assert saved_gemm_input_bytes(codes).tolist() == [2.0, 2.0, 1.0, 1.0, 1.03125, 0.5625, 2.0]


@pytest.mark.parametrize("dtype", ["bf16", "fp8", "fp8-cs", "mxfp8", "nvfp4"])
def test_korthikanti_175b_first_stage_with_quantized_gemm_inputs(dtype):
    """Korthikanti et al. 2022 (SP + selective recompute): s b h 34/t per layer, of which the GEMM inputs are the QKV
    input 2, the MLP input 2, the output projection's input 2 (the attention core is recomputed, so only the
    projection keeps it) and the fc2 input 2 x 4 (ffn = 4h). Saved at b bytes per element they become
    s b h (20 + 7 b)/t: 34/t for bf16, 27/t for FP8. The first stage holds 96 layers' worth (12 layers x 8 in flight);
    within 1 %."""
    b = SAVED_GEMM_INPUT_BYTES.get(dtype, 2.0)
    expected = 2048 * 12288 * 96 * (20.0 + 7.0 * b) / 8
    assert _acts(dtype, 1) == pytest.approx(expected, rel=0.01)


def test_without_recompute_the_attention_output_is_kept_twice():
    """With the attention core kept (no recompute), the fused attention keeps its 16-bit output for its own backward
    and the output projection its quantized copy: no recompute stores exactly 2 s b h/t per layer more than
    attention-core recompute in FP8 (flash attention: no scores either way), and nothing more in bf16."""
    per_layer = 2048 * 12288 * 2 / 8
    assert _acts("fp8", 0, params=DEFAULT) - _acts("fp8", 1, params=DEFAULT) == pytest.approx(96 * per_layer, rel=1e-9)
    assert _acts("bf16", 0, params=DEFAULT) == pytest.approx(_acts("bf16", 1, params=DEFAULT), rel=1e-12)


def test_layers_kept_in_bf16_save_nothing():
    """A recipe that keeps half the layers in BF16 saves half as much; the full-recompute checkpoint (the 16-bit block
    input) is never quantized."""
    full = _acts("bf16", 1) - _acts("fp8", 1)
    half = _acts("bf16", 1) - _acts("fp8", 1, layers_16bit=48)
    assert full > 0 and half == pytest.approx(full / 2, rel=1e-9)
    assert _acts("fp8", 2) < _acts("bf16", 2)  # the recomputed layer's working set only
    assert _acts("fp8", 2, pp=1) - _acts("bf16", 2, pp=1) == pytest.approx(_acts("fp8", 2) - _acts("bf16", 2), rel=1e-9)


def test_stacks_whose_fp8_keeps_16bit_inputs_are_unchanged():
    """torchtitan's FP8 (torchao Float8Linear) saves the high-precision input: no quantized saves."""
    assert _acts("fp8", 1, preset="torchtitan") == _acts("bf16", 1, preset="torchtitan")


def test_megatron_bridge_preset_has_16bit_gradient_buffers():
    assert memory_options(np.array(["megatron_bridge"])).grad_bytes[0] == 2.0
    assert memory_options(np.array(["megatron"])).grad_bytes[0] == 4.0


def test_recipe_table_names_a_source_for_every_entry():
    for key, (rc, offloaded, source) in recipes(MEASUREMENTS).memory.items():
        assert rc in ("none", "selective", "full") and offloaded >= 0 and "Megatron-Bridge" in source, key


def test_recipe_memory_of_gb300_and_b300_runs_names_the_source():
    """Llama 3 70B FP8 on GB300 offloads 20 of its 80 layers (FSDP, pp 1); DeepSeek-V3 MXFP8 on B300 (26.02, a row
    of another file: its framework names the container) recomputes the recipe's mla_up_proj."""
    from models.corpus.recipes import recipe_memory

    frame = pl.DataFrame({
        "memory_preset": ["megatron_bridge"] * 2, "arch_id": ["llama3-70b", "deepseek-v3"],
        "model_name": ["LLAMA3_70B", "DeepSeekV3"], "gpu": ["gb300", "b300"], "dtype": ["fp8", "mxfp8"],
        "recompute": [None, None], "n_layers": [80, 61], "pp": [1, 16], "assumptions": [None, None],
        "framework": ["Megatron-Bridge / NeMo 26.04.01", "Megatron-Bridge / NeMo 26.02"]})
    out = recipe_memory(frame, recipes(MEASUREMENTS))
    assert out["recompute"].to_list() == ["none", "selective"]
    assert out["act_offload_frac"][0] == 0.25 and out["act_offload_frac"][1] is None
    a = out["assumptions"].to_list()
    assert "activations of 20 layers offloaded" in a[0] and "LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_CS_V2" in a[0]
    assert "recompute_modules=['mla_up_proj']" in a[1] and "DEEPSEEK_V3_PRETRAIN_CONFIG_B300_FP8_MX_V2" in a[1]
    assert out["recompute_modules"][1] > 0


# ---- the measured runs of Megatron-Bridge's performance summary -----------------------------------------------------
#: runs the memory model called infeasible before the sourced facts (16-bit gradients, quantized GEMM inputs, the
#: recipes' recompute and offloading) and that fit now: measured, so they did fit. The three DeepSeek-V3 B200 runs fit
#: with the adapter's inferred attention-core recompute, a stand-in for their recipe's recompute_modules
#: ["mla_up_proj"], which the memory model does not represent (with no recompute they need 189 GB).
FIXED = [
    "mb2511-pre-training-deepseekv3-w-mtp-b200-256gpu-mxfp8-gbs2048",
    "mb2511-pre-training-llama3-1-405b-b200-128gpu-fp8-cs-gbs64",
    "mb2511-pre-training-llama3-1-405b-b200-128gpu-mxfp8-gbs64-alt",
    "mb2511-pre-training-llama3-1-405b-h100-1024gpu-fp8-cs-gbs512",
    "mb2511-pre-training-llama3-70b-h100-64gpu-fp8-cs-gbs128",
    "mb2511-pre-training-qwen3-30b-a3b-h100-16gpu-fp8-cs-gbs512",
    "mb2602-pre-training-deepseekv3-b200-256gpu-mxfp8-gbs4096",
    "mb2602-pre-training-llama3-1-405b-gb200-256gpu-nvfp4-gbs1536",
    "mb2602-pre-training-llama3-1-405b-h100-1024gpu-fp8-gbs1536",
    "mb2602-pre-training-llama3-70b-h100-64gpu-fp8-gbs256",
    "mb2604-pre-training-deepseekv3-b200-256gpu-mxfp8-gbs4096",
    "mb2604-pre-training-llama3-1-405b-gb200-256gpu-nvfp4-gbs1536",
    "mb2604-pre-training-llama3-70b-h100-64gpu-fp8-gbs256",
    "mb2604-pre-training-qwen3-30b-a3b-b200-8gpu-mxfp8-gbs512",
    "mb2606-pre-training-llama3-1-405b-gb200-256gpu-nvfp4-gbs1536",
    "mb2606-pre-training-llama3-1-405b-h100-1024gpu-fp8-gbs1536",
    "mb2606-sft-llama3-70b-gb200-32gpu-fp8-gbs32",
    "mb2606-sft-llama3-70b-gb200-32gpu-mxfp8-gbs32",
    "mb2606-sft-llama3-70b-h100-32gpu-fp8-gbs32",
]


def test_megatron_bridge_runs_fixed_by_their_recipes_fit(corpus):
    rows = corpus.filter(pl.col("run_id").is_in(FIXED))
    assert rows.height == len(FIXED)
    assert rows.filter(~pl.col("memory_fits"))["run_id"].to_list() == []


def test_recipe_settings_are_listed_in_assumptions(corpus):
    """The recipe's recompute replaces the adapter's inference, and says so; Llama 3 70B FP8 on GB200 offloads 40 of
    its 80 layers' activations (half of what the memory model held before)."""
    r = corpus.filter(pl.col("run_id") == "mb2602-pre-training-llama3-1-405b-h100-1024gpu-fp8-gbs1536").row(0, named=True)
    assert r["recompute"] == "none" and "recompute=none (the run's recipe)" in r["assumptions"]
    r = corpus.filter(pl.col("run_id") == "mb2604-pre-training-llama3-70b-gb200-64gpu-fp8-gbs256").row(0, named=True)
    assert "activations of 40 layers offloaded to host (the run's recipe)" in r["assumptions"]
    assert r["memory_gb_per_gpu"] < 0.5 * 414.0
    # containers 25.11-26.06: TE 2.9-2.16 writes the fused cross-entropy's gradient into the bf16 logits; 26.08: not
    assert "logits 2 B/element" in r["assumptions"]
    r = corpus.filter(pl.col("run_id") == "mb2608-pre-training-qwen3-30b-a3b-gb200-8gpu-mxfp8-gbs512").row(0, named=True)
    assert "logits 2 B/element" not in r["assumptions"]
