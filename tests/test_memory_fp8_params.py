"""Weights kept as Transformer Engine quantized parameters (Megatron-Core ``fp8_param_gather``): bytes per weight
element from TE's tensor layouts, the rows Megatron-Bridge's performance recipes flag, and the measured runs."""

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from models.corpus.recipes import recipe_fp8_params
from models.memory.model import MemoryOptions, memory_inputs, memory_per_gpu
from models.core.params import DTYPE_CODES
from models.core.precision import PARAM_GATHER_BYTES, QUANTIZED_PARAM_BYTES, param_gather_bytes, quantized_param_bytes
from pipeline.catalog import recipes
from tests.conftest import MEASUREMENTS
from tests.test_memory_low_precision import GPT3_175B, _arch


def test_bytes_per_weight_follow_the_te_tensor_layouts():
    """transformer_engine/pytorch/tensor/float8_tensor.py Float8Quantizer.make_empty: uint8 data + (columnwise) a
    uint8 transpose, which storage/float8_tensor_storage.py update_usage drops where non-TN FP8 GEMMs run;
    tensor/mxfp8_tensor.py MXFP8Quantizer.make_empty: row- and column-wise uint8 data, each with a uint8 (E8M0) scale
    per MXFP8_BLOCK_SCALING_SIZE = 32 elements."""
    assert QUANTIZED_PARAM_BYTES["fp8"] == QUANTIZED_PARAM_BYTES["fp8-cs"] == (1.0, 1.0 + 1.0)
    assert QUANTIZED_PARAM_BYTES["mxfp8"] == (2 * (1 + 1 / 32),) * 2 == (2.0625, 2.0625)
    assert "nvfp4" not in QUANTIZED_PARAM_BYTES  # fp4_param_gather: not modelled, 16-bit weights
    codes = np.array([DTYPE_CODES[d] for d in ("fp8", "fp8-cs", "mxfp8", "bf16", "nvfp4")])
    np.testing.assert_allclose(quantized_param_bytes(codes, np.ones(5, bool)), [1, 1, 2.0625, np.nan, np.nan])
    np.testing.assert_allclose(quantized_param_bytes(codes, np.zeros(5, bool)), [2, 2, 2.0625, np.nan, np.nan])
    # the all-gather: Float8Tensor weights gather their uint8 buffer; MXFP8 gathers 16-bit values and quantizes after
    assert PARAM_GATHER_BYTES == {"fp8": 1.0, "fp8-cs": 1.0}
    np.testing.assert_allclose(param_gather_bytes(codes, 2.0), [1, 1, 2, 2, 2])


def _weights(dtype, flag, *, blackwell=True, sharding=1, layers_16bit=None):
    """Weight bytes and quantized-weight counts of GPT-3 175B on one stage of t8 p8 (ZeRO-1 by default)."""
    ar, sh = _arch(*GPT3_175B)
    one = lambda x: np.array([float(x)])  # noqa: E731
    x = memory_inputs(ar, seq_len=one(2048), micro_batch=one(1), n_micro=one(64), tp=one(8), pp=one(8), dp=one(8),
                      sharding=np.array([sharding]), recompute=np.array([1]), sequence_parallel=np.array([True]),
                      dtype=np.array([DTYPE_CODES[dtype]]), layers_16bit=one(layers_16bit or 0))
    return memory_per_gpu(x, sh, options=MemoryOptions(fp8_param_gather=one(flag), non_tn_fp8=np.array([blackwell])))


@pytest.mark.parametrize("dtype, blackwell, per_weight", [("fp8", True, 1.0), ("fp8-cs", True, 1.0),
                                                         ("fp8", False, 2.0), ("mxfp8", True, 2.0625)])
def test_flagged_weights_hold_their_quantized_bytes_in_place_of_16_bits(dtype, blackwell, per_weight):
    base, q = _weights(dtype, 0.0, blackwell=blackwell), _weights(dtype, 1.0, blackwell=blackwell)
    decoder = q["quantized_dense_params_local"][0]
    # the stage's decoder weights: 12 layers of 12 h^2 (+ norms, biases) / t; the first stage's embedding stays 16-bit
    h = 12288.0
    assert decoder == pytest.approx(12 * 12 * h * h / 8, rel=1e-3)
    assert base["dense_params_local"][0] - decoder == pytest.approx(51200 * h / 8, rel=1e-9)
    dw = q["mem_weights_bytes"][0] - base["mem_weights_bytes"][0]
    assert dw == pytest.approx((per_weight - 2.0) * decoder, rel=1e-12)
    for k in ("mem_grads_bytes", "mem_optimizer_bytes", "mem_activations_bytes"):  # fp32 master and grads unchanged
        assert q[k][0] == base[k][0]


def test_unflagged_fsdp_and_bf16_kept_layers_keep_16_bit_weights():
    base = _weights("fp8", 0.0)
    assert "quantized_dense_params_local" not in base  # no flag: the model as before
    for sharding in (3, 4):  # ZeRO-3 / FSDP: the 16-bit accounting stays
        assert _weights("fp8", 1.0, sharding=sharding)["mem_weights_bytes"][0] == \
            _weights("fp8", 0.0, sharding=sharding)["mem_weights_bytes"][0]
    assert _weights("bf16", 1.0)["mem_weights_bytes"][0] == base["mem_weights_bytes"][0]
    half = _weights("fp8", 1.0, layers_16bit=48)  # half of the 96 layers built outside fp8_model_init
    full = _weights("fp8", 1.0)
    assert half["quantized_dense_params_local"][0] == pytest.approx(0.5 * full["quantized_dense_params_local"][0])


def test_recipe_flags_megatron_bridge_fp8_and_mxfp8_pretraining_and_sft_only():
    f = pl.DataFrame({
        "memory_preset": ["megatron_bridge"] * 6 + ["megatron"],
        "arch_id": ["llama3-70b", "llama3-70b", "llama3-70b", "llama3-70b", "gpt-oss-20b", "llama3-70b", "llama3-70b"],
        "model_name": ["LLAMA3_70B", "LLAMA3_70B SFT", "LLAMA3_70B LoRA", "LLAMA3_70B", "GPT OSS 20B", "LLAMA3_70B",
                       "LLAMA3_70B"],
        "dtype": ["mxfp8", "fp8", "fp8", "nvfp4", "mxfp8", "bf16", "fp8"],
        "framework": ["Megatron-Bridge / NeMo 26.02 (Megatron-Core)"] * 6 + ["NeMo 24.07 (Megatron-Core)"],
        "assumptions": [None] * 7,
    })
    out = recipe_fp8_params(f, recipes(MEASUREMENTS))
    assert out["fp8_param_gather"].to_list() == [1.0, 1.0, None, None, None, None, None]
    assert "bf16_with_mxfp8_mixed" in out["assumptions"][0]
    assert "bf16_with_fp8_current_scaling_mixed" in out["assumptions"][1]


# ---- the measured runs ----------------------------------------------------------------------------------------------
LLAMA405_GB200_FP8 = "mb2602-pre-training-llama3-1-405b-gb200-256gpu-fp8-gbs1536"


def test_llama31_405b_fp8_on_gb200_holds_one_byte_weights(corpus):
    """t4 p16 on GB200 (non-TN FP8 GEMMs): each GPU's ~6.3e9 decoder weights hold 1 B instead of 2 B, about 6.7 GB
    less with the fragmentation share (204.8 -> 198.1 GB), which fits the 186 GiB (199.7e9 bytes) of a GB200; with
    16-bit weights it would not."""
    r = corpus.filter(pl.col("run_id") == LLAMA405_GB200_FP8).row(0, named=True)
    assert "fp8_param_gather" in r["assumptions"]
    assert r["memory_gb_per_gpu"] == pytest.approx(198.1, abs=0.3)
    assert r["memory_fits"] and r["memory_capacity_gb"] == pytest.approx(199.7, abs=0.1)


def test_runs_without_the_flag_are_unchanged(corpus):
    """bf16, nvfp4 and non-Megatron-Bridge runs carry no flag; Hopper FP8 weights keep 2 B (data + transpose)."""
    flagged = corpus.filter(pl.col("assumptions").fill_null("").str.contains("fp8_param_gather"))
    assert set(flagged["dtype"].unique()) == {"fp8", "fp8-cs", "mxfp8"}
    assert flagged["run_id"].str.starts_with("mb2").all()  # Megatron-Bridge's performance summary only
    r = corpus.filter(pl.col("run_id") == "mb2602-pre-training-llama3-70b-h100-64gpu-fp8-gbs256").row(0, named=True)
    assert "fp8_param_gather" in r["assumptions"] and r["memory_gb_per_gpu"] == pytest.approx(74.24, abs=0.05)
