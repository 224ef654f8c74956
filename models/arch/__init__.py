"""What a model is: parameter counts and the one FLOP convention (`param_counts`, `model_flops_per_token`), MoE
routing and expert grids, MLA attention and multi-token prediction, hybrid Mamba blocks, the dense GPT-style shape
for a parameter count, and architecture or hardware descriptions from the files a user brings
(`architecture_from_mapping`: a schema row or a Hugging Face config.json).

Imports models.core only."""

from models.arch.accounting import model_flops_per_token, param_counts
from models.arch.archfile import architecture_from_mapping

__all__ = ["architecture_from_mapping", "model_flops_per_token", "param_counts"]
