"""Low-precision recipes: what a published FP8/FP4 recipe keeps in 16 bits (pure).

The step-time model runs every decoder GEMM of a low-precision row at the row's low-precision rate, except:

* the LM head, always in 16 bits (``models.physics.parts.lm_head``: Megatron-Core's ``output_layer`` is outside
  Transformer Engine's autocast; torchtitan filters ``output``; the NVFP4 recipe keeps the head in BF16);
* the attention core (softmax and the two batched GEMMs), at the 16-bit peak (``models.physics.parts.compute``);
* the MoE router GEMM, a plain matmul outside Transformer Engine (Megatron-Core ``TopKRouter``; fp32 with
  ``--moe-router-dtype fp32``), at the 16-bit rate (``models.physics.parts.moe_mlp_gemms``);
* the last ``n_layers_16bit`` layers (blocks, for hybrids) where the run's recipe keeps them in BF16
  (``models.physics.parts.layers_kept_in_16bit``; Megatron-Core ``--first-last-layers-bf16`` with
  ``--num-layers-at-end-in-bf16``). The generic recipes keep none: Megatron-Bridge's ``MixedPrecisionConfig``
  defaults ``num_layers_at_start_in_bf16 = num_layers_at_end_in_bf16 = 0`` and ``bf16_with_nvfp4_mixed`` does not
  change them. A model's own published recipe may: ``RECIPE_LAYERS_16BIT``.

Each low-precision GEMM also pays its quantize kernels (``models.physics.parts.quantize_casts``).

A command may state ``n_layers_16bit`` itself (``stepcast predict --layers-16bit N``); otherwise, and for every
measured run (the measurement schema has no such column), the table below applies to the model and precision it
names, listed in the prediction's assumptions.
"""

from __future__ import annotations

from models.core.params import DTYPE_CODES

#: (architecture id, dtype) -> layers the model's published recipe keeps in BF16 at the end of the stack.
#: nemotron-3-super / nvfp4: Megatron-Bridge src/megatron/bridge/training/mixed_precision.py
#: ``nemotron_3_super_bf16_with_nvfp4_mixed`` (``first_last_layers_bf16 = True``, ``num_layers_at_end_in_bf16 =
#: 14``: 14 of its 88 blocks, the ~15% the NVFP4 pretraining paper keeps in BF16, NVIDIA arXiv:2509.25149).
RECIPE_LAYERS_16BIT: dict[tuple[str, str], int] = {
    ("nemotron-3-super", "nvfp4"): 14,
}

RECIPE_SOURCE = {
    ("nemotron-3-super", "nvfp4"): "Megatron-Bridge recipe nemotron_3_super_bf16_with_nvfp4_mixed",
}


def recipe_layers_16bit(arch_id: str | None, dtype: str | None) -> int | None:
    """Layers the published recipe of ``arch_id`` at ``dtype`` keeps in BF16 (None: no such recipe: none)."""
    if not arch_id or not dtype:
        return None
    return RECIPE_LAYERS_16BIT.get((str(arch_id).lower(), str(dtype).lower()))


# ---- bytes of what a low-precision GEMM keeps for its backward ----------------------------------------------------
#: Bytes per element of the copy of a GEMM input that Transformer Engine keeps for the weight-gradient GEMM, by dtype.
#: TE quantizes a Linear's input for the forward GEMM and saves that quantized tensor, not the 16-bit one, with its
#: row-wise data discarded (transformer_engine/pytorch/module/linear.py: ``inputmat.update_usage(rowwise_usage=False,
#: columnwise_usage=True)``, "Discard row-wise data since it is not needed in backward pass"; layernorm_linear.py
#: keeps one usage of ``ln_out``, the row-wise one only where tensor-scaled FP8 must be all-gathered for sequence
#: parallelism; grouped_linear.py, the MoE experts, the same as linear.py). One usage costs:
#:   fp8 / fp8-cs  1 B (E4M3 data; one fp32 scale per tensor)
#:   mxfp8         1 B + one E8M0 scale byte per 32 elements (transformer_engine/pytorch/constants.py
#:                 MXFP8_BLOCK_SCALING_SIZE = 32)
#:   nvfp4         0.5 B (E2M1) + one E4M3 scale byte per 16 elements (constants.py NVFP4_BLOCK_SCALING_SIZE = 16)
#: 16-bit dtypes keep the 2-byte input itself.
SAVED_GEMM_INPUT_BYTES: dict[str, float] = {
    "fp8": 1.0,
    "fp8-cs": 1.0,
    "mxfp8": 1.0 + 1.0 / 32.0,
    "nvfp4": 0.5 + 1.0 / 16.0,
}


def saved_gemm_input_bytes(dtype_code):
    """Bytes per element of a saved GEMM input (``SAVED_GEMM_INPUT_BYTES``) for an array of
    ``models.core.params.DTYPE_CODES``; 2.0 for the dtypes that keep the 16-bit input (4.0 is never returned: fp32 rows'
    activation bytes are handled by ``act_bytes``)."""
    import numpy as np

    return np.take(_dtype_lut(SAVED_GEMM_INPUT_BYTES, 2.0), np.asarray(dtype_code, dtype=np.int64), mode="clip")


# ---- bytes of a weight kept as a quantized parameter (Megatron-Core fp8_param_gather) -----------------------------
#: Bytes per weight element of a decoder GEMM weight that Megatron-Core creates as a Transformer Engine quantized
#: parameter (``fp8_param_gather``: the model is built under TE ``fp8_model_init``; module/base.py reset_parameters
#: quantizes each weight with its forward quantizer, usage rowwise and columnwise, and the 16-bit weight is not kept;
#: the fp32 master stays in the distributed optimizer), as (devices with non-TN FP8 GEMMs, TN-only devices):
#:   fp8 / fp8-cs  Float8Tensor (tensor/float8_tensor.py make_empty: uint8 ``data`` and, for columnwise usage, a uint8
#:                 ``data_transpose``; one fp32 scale per tensor). tensor/storage/float8_tensor_storage.py
#:                 update_usage drops the transpose where ``is_non_tn_fp8_gemm_supported()`` (utils.py: compute
#:                 capability 10.x-11.x or >= 13: B200, GB200, B300, GB300) and creates it elsewhere (Hopper): 1 B, 2 B.
#:                 Megatron-Core's DDP puts ``data`` in a uint8 parameter buffer (distributed_data_parallel.py: "it is
#:                 necessary to use torch.uint8"; param_and_grad_buffer.py modify_underlying_storage).
#:   mxfp8         MXFP8Tensor (tensor/mxfp8_tensor.py make_empty: row-wise uint8 data + an E8M0 scale per 32
#:                 elements, and the same column-wise): 2 (1 + 1/32) = 2.0625 B on every device. Its 16-bit all-gather
#:                 copy lives in the gradient buffer (param_and_grad_buffer.py: "For MXFP8 param: Create a shared
#:                 buffer for param AG and grad RS"; reuse_grad_buf_for_mxfp8_param_ag), so nothing else is held.
#: Transformer Engine v2.9 (NeMo 25.11) through v2.16 keep these layouts. NVFP4 weights (``fp4_param_gather``) are not
#: listed: Megatron-Core's DDP gained an NVFP4 parameter buffer only in 0.18, and the layout is not modelled (16-bit).
QUANTIZED_PARAM_BYTES: dict[str, tuple[float, float]] = {
    "fp8": (1.0, 2.0),
    "fp8-cs": (1.0, 2.0),
    "mxfp8": (2.0 * (1.0 + 1.0 / 32.0), 2.0 * (1.0 + 1.0 / 32.0)),
}

#: Bytes per weight element the distributed optimizer's parameter all-gather moves for quantized parameters: the uint8
#: parameter buffer of Float8Tensor weights (1 B); MXFP8 weights gather their 16-bit values through the gradient buffer
#: and quantize after the gather (param_and_grad_buffer.py: ``param.data.copy_(param_slice)``), 2 B as without them.
PARAM_GATHER_BYTES: dict[str, float] = {"fp8": 1.0, "fp8-cs": 1.0}


def _dtype_lut(table, default, pick=lambda v: v):
    import numpy as np


    lut = np.full(max(DTYPE_CODES.values()) + 1, default)
    for name, v in table.items():
        lut[DTYPE_CODES[name]] = pick(v)
    return lut


def quantized_param_bytes(dtype_code, non_tn_fp8):
    """Bytes per weight element of a quantized parameter (``QUANTIZED_PARAM_BYTES``) for arrays of
    ``models.core.params.DTYPE_CODES`` and of "the device runs non-TN FP8 GEMMs"; NaN for dtypes without a layout."""
    import numpy as np

    code = np.asarray(dtype_code, dtype=np.int64)
    non_tn = _dtype_lut(QUANTIZED_PARAM_BYTES, np.nan, lambda v: v[0])
    tn = _dtype_lut(QUANTIZED_PARAM_BYTES, np.nan, lambda v: v[1])
    return np.where(np.asarray(non_tn_fp8, dtype=bool), np.take(non_tn, code, mode="clip"),
                    np.take(tn, code, mode="clip"))


def param_gather_bytes(dtype_code, default_bytes):
    """Bytes per quantized weight element of the parameter all-gather (``PARAM_GATHER_BYTES``; ``default_bytes``, the
    16-bit gather, for the other dtypes)."""
    import numpy as np

    lut = _dtype_lut(PARAM_GATHER_BYTES, np.nan)
    b = np.take(lut, np.asarray(dtype_code, dtype=np.int64), mode="clip")
    return np.where(np.isnan(b), default_bytes, b)
