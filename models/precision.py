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
