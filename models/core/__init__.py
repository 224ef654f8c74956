"""The vocabulary every other package speaks: the physical parameters and their sourced priors (`PhysParams`,
`DEFAULT`), the category codes (`Dtype`, `Sharding`, `Recompute`, `TpMode`, `Activation`), the decoded block of
configurations both the time and the memory model read (`Inputs`), the calibration domains, the software eras,
the low-precision recipes, the recompute-FLOPs rule and the numeric helpers of the hot path.

Imports nothing from the other sub-packages."""

from models.core.lazy import entry_points

__getattr__, __dir__, __all__ = entry_points(__name__, {
    "Activation": "models.core.params",
    "DEFAULT": "models.core.params",
    "Dtype": "models.core.params",
    "Inputs": "models.core.inputs",
    "PhysParams": "models.core.params",
    "Recompute": "models.core.params",
    "Sharding": "models.core.params",
    "TpMode": "models.core.params",
})
