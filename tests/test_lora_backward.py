"""Two facts of the stacks in the time model. LoRA (models.physics.parts ``wgrad``): the frozen base weights get no
weight-gradient GEMM and no gradient traffic; the corpus's LoRA runs, which the model predicted 16-29% too slow without it, land near their
measurements. TransformerEngine's low-precision rows all-gather quantized activations for sequence parallelism
(models.physics.parts.quantized_gather_share)."""

import numpy as np
import pytest

from models.arch.accounting import normalize_arch, param_counts
from models.memory.presets import lora_trainable_frac
from models.core.params import DEFAULT, DTYPE_CODES
from models.physics.step_time import predict_arrays

# Llama 3 70B (meta-llama params.json) on 8 H100 SXM5 at tp 4, pp 2 (NeMo 24.07's LoRA layout): 80 layers
L, H, HEADS, KV, FFN, V = 80, 8192, 64, 8, 28672, 128256


def _row(**kw):
    base = dict(n_layers=float(L), d_model=float(H), n_heads=float(HEADS), n_kv_heads=float(KV), ffn_dim=float(FFN),
                vocab=float(V), activation=1.0, seq_len=4096.0, global_batch_seqs=32.0, micro_batch=1.0, n_gpus=8.0,
                tp=4.0, pp=2.0, dp=1.0, cp=1.0, vpp=1.0, sharding=1, recompute=0, dtype=DTYPE_CODES["bf16"],
                sequence_parallel=1.0, peak_fp32_tflops=66.9, peak_tf32_tflops=494.7, peak_bf16_tflops=989.4,
                peak_fp16_tflops=989.4, peak_fp8_tflops=1978.9, memory_gb=80.0, memory_bw_gbps=3350.0,
                intra_node_bw_gbps=450.0, inter_node_bw_gbps=50.0, gpus_per_node=8.0, scaleup_size=8.0)
    base.update(kw)
    return {k: np.atleast_1d(np.asarray(v)) for k, v in base.items()}


def _lora_frac():
    ar = normalize_arch({k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in dict(
        n_layers=L, d_model=H, n_heads=HEADS, n_kv_heads=KV, ffn_dim=FFN, vocab=V, activation=1,
        tied_embeddings=0).items()})
    psi = param_counts(ar)["params"][0]
    return float(lora_trainable_frac(L, H, H, KV * H // HEADS, FFN, 1, psi))


def test_lora_skips_the_frozen_weights_gradient_gemms():
    """Forward 1 + backward 2 GEMM passes for full training, 1 + 1 (the data gradient only) for LoRA: the layers'
    GEMM time drops by a third. Attention core, element-wise kernels and the recompute are the same, so the compute
    of a LoRA micro-batch is between 2/3 and 1 of the full one, and near 2/3 for a GEMM-bound 70B model."""
    full = predict_arrays(_row(), DEFAULT)
    lora = predict_arrays(_row(trainable_frac=_lora_frac()), DEFAULT)
    ratio = lora["compute_s"][0] / full["compute_s"][0]
    assert 2.0 / 3.0 < ratio < 0.8
    assert lora["step_time_s"][0] < full["step_time_s"][0]


def test_trainable_share_one_is_full_training_bit_for_bit():
    full = predict_arrays(_row(), DEFAULT)
    same = predict_arrays(_row(trainable_frac=1.0), DEFAULT)
    for k in ("step_time_s", "compute_s", "dp_comm_exposed_s", "tp_comm_s"):
        np.testing.assert_array_equal(same[k], full[k], err_msg=k)


def test_lora_reduces_only_the_adapter_gradients():
    """Data parallel over 2 nodes (dp 4 across InfiniBand): a full run reduce-scatters 70B/8 fp32 gradients per GPU
    and re-gathers the updated weights; a LoRA run only its 0.3 % adapters' (the exposed DP time all but vanishes)."""
    kw = dict(n_gpus=32.0, dp=4.0, global_batch_seqs=4.0, gpus_per_node=8.0)
    full = predict_arrays(_row(**kw), DEFAULT)["dp_comm_exposed_s"][0]
    lora = predict_arrays(_row(trainable_frac=_lora_frac(), **kw), DEFAULT)["dp_comm_exposed_s"][0]
    assert full > 0.1
    assert lora < 0.01 * full


@pytest.mark.parametrize("frac", [0.0, 0.003, 0.3, 1.0])
def test_more_trained_weights_never_make_a_step_faster(frac):
    lo = predict_arrays(_row(trainable_frac=frac), DEFAULT)["step_time_s"][0]
    hi = predict_arrays(_row(trainable_frac=min(1.0, frac + 0.1)), DEFAULT)["step_time_s"][0]
    assert hi >= lo


def test_corpus_lora_runs_are_predicted_near_their_measurements(built_store):
    """NeMo 24.07's H100 LoRA runs (Llama 2 7B, 13B, 70B on 8 GPUs) and Megatron-Bridge 26.06's Llama 3 70B LoRA on
    8 H100, as the build serves them: within 15% of the measured throughput (16-29% too slow while every weight got
    a weight-gradient GEMM)."""
    import duckdb

    with duckdb.connect(str(built_store), read_only=True) as con:
        preds = con.sql("select run_id, rel_error from calibrated_predictions where lower(run_id) like '%lora%' "
                        "and gpu like 'h100%'").pl()
    assert preds.height >= 4
    assert preds["rel_error"].abs().max() < 0.15


# ---- the sequence-parallel all-gather of TransformerEngine's low-precision rows (models.physics.parts.quantized_gather_share)

def _tp_row(dtype, preset, sp=1.0):
    from pipeline.catalog import stacks
    from tests.conftest import MEASUREMENTS

    # an FP4 peak for the NVFP4 row (any: the ratio is of TP traffic): the B200's dense 9,000 TFLOPS
    return _row(peak_fp4_tflops=9000.0, n_gpus=8.0, tp=8.0, pp=1.0, global_batch_seqs=64.0, micro_batch=16.0, dtype=DTYPE_CODES[dtype],
                sequence_parallel=sp, **stacks(MEASUREMENTS).row_arrays(np.array([preset])))


def _tp_bytes_share(dtype, preset, sp=1.0):
    """TP time of the row over the 16-bit row's, latency removed (same layout: equal ring steps)."""
    lo = predict_arrays(_tp_row(dtype, preset, sp), DEFAULT)["tp_comm_s"][0]
    hi = predict_arrays(_tp_row("bf16", preset, sp), DEFAULT)["tp_comm_s"][0]
    return lo / hi


def test_transformer_engine_gathers_fp8_inputs():
    """TransformerEngine quantizes the LayerNorm output and the output gradient before the all-gather: of each
    all-gather (1 B FP8, 1 + 1/32 B MXFP8, 0.5 + 1/16 B NVFP4 per element) + reduce-scatter (2 B) pair. Micro-batches
    of 16 x 4,096 tokens, so the ring steps' latency is a small part of each collective."""
    assert _tp_bytes_share("fp8", "megatron") == pytest.approx((1.0 + 2.0) / 4.0, rel=0.02)
    assert _tp_bytes_share("mxfp8", "megatron_bridge") == pytest.approx((1.0 + 1 / 32 + 2.0) / 4.0, rel=0.02)
    assert _tp_bytes_share("nvfp4", "megatron_bridge") == pytest.approx((0.5 + 1 / 16 + 2.0) / 4.0, rel=0.02)


def test_other_stacks_and_all_reduce_rows_keep_16bit_tp_traffic():
    """torchtitan's and an unknown stack's FP8 rows gather 16-bit activations (no quantized all-gather claimed);
    without sequence parallelism TP is an all-reduce of the 16-bit GEMM output."""
    assert _tp_bytes_share("fp8", "torchtitan") == pytest.approx(1.0, abs=1e-12)
    assert _tp_bytes_share("fp8", "default") == pytest.approx(1.0, abs=1e-12)
    assert _tp_bytes_share("fp8", "megatron", sp=0.0) == pytest.approx(1.0, abs=1e-12)
