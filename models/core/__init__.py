"""The vocabulary every other package speaks: the physical parameters and their sourced priors (`PhysParams`,
`DEFAULT`), the category codes (`Dtype`, `Sharding`, `Recompute`, `TpMode`, `Activation`), the decoded block of
configurations both the time and the memory model read (`Inputs`), the calibration domains, the software eras,
the low-precision recipes, the recompute-FLOPs rule and the numeric helpers of the hot path.

Imports nothing from the other sub-packages."""

from models.core.inputs import Inputs
from models.core.params import DEFAULT, Activation, Dtype, PhysParams, Recompute, Sharding, TpMode

__all__ = ["DEFAULT", "Activation", "Dtype", "Inputs", "PhysParams", "Recompute", "Sharding", "TpMode"]
