"""Low-precision recipes: what a published FP8/FP4 recipe keeps in 16 bits (pure).

The step-time model runs every decoder GEMM of a low-precision row at the row's low-precision rate, except:

* the LM head, always in 16 bits (``models.parts.lm_head``: Megatron-Core's ``output_layer`` is outside
  Transformer Engine's autocast; torchtitan filters ``output``; the NVFP4 recipe keeps the head in BF16);
* the attention core (softmax and the two batched GEMMs), at the 16-bit peak (``models.parts.compute``);
* the MoE router GEMM, a plain matmul outside Transformer Engine (Megatron-Core ``TopKRouter``; fp32 with
  ``--moe-router-dtype fp32``), at the 16-bit rate (``models.parts.moe_mlp_gemms``);
* the last ``n_layers_16bit`` layers (blocks, for hybrids) where the run's recipe keeps them in BF16
  (``models.parts.layers_kept_in_16bit``; Megatron-Core ``--first-last-layers-bf16`` with
  ``--num-layers-at-end-in-bf16``). The generic recipes keep none: Megatron-Bridge's ``MixedPrecisionConfig``
  defaults ``num_layers_at_start_in_bf16 = num_layers_at_end_in_bf16 = 0`` and ``bf16_with_nvfp4_mixed`` does not
  change them. A model's own published recipe may: ``RECIPE_LAYERS_16BIT``.

Each low-precision GEMM also pays its quantize kernels (``models.parts.quantize_casts``).

A command may state ``n_layers_16bit`` itself (``stepcast predict --layers-16bit N``); otherwise, and for every
measured run (the measurement schema has no such column), the table below applies to the model and precision it
names, listed in the prediction's assumptions.
"""

from __future__ import annotations

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
    ``models.params.DTYPE_CODES``; 2.0 for the dtypes that keep the 16-bit input (4.0 is never returned: fp32 rows'
    activation bytes are handled by ``act_bytes``)."""
    import numpy as np

    from models.params import DTYPE_CODES

    lut = np.full(max(DTYPE_CODES.values()) + 1, 2.0)
    for name, b in SAVED_GEMM_INPUT_BYTES.items():
        lut[DTYPE_CODES[name]] = b
    return np.take(lut, np.asarray(dtype_code, dtype=np.int64), mode="clip")
