"""What a model is: parameter counts and the one FLOP convention (`param_counts`, `model_flops_per_token`), MoE
routing and expert grids, MLA attention and multi-token prediction, hybrid Mamba blocks, the dense GPT-style shape
for a parameter count, and architecture or hardware descriptions from the files a user brings
(`architecture_from_mapping`: a schema row or a Hugging Face config.json).

Imports models.core only."""

from models.core.lazy import entry_points

__getattr__, __dir__, __all__ = entry_points(__name__, {
    "architecture_from_mapping": "models.arch.archfile",
    "model_flops_per_token": "models.arch.accounting",
    "param_counts": "models.arch.accounting",
})
