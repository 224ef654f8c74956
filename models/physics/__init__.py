"""The analytical step time and its named parts: hardware rows resolved into model inputs (`resolve_hardware`), the
alpha-beta collectives over the network's tiers, 2-D tensor parallelism, and one vectorized function per part
(compute; TP, CP, EP, PP and DP communication; overlap; the optimizer; the step's assembly).

`predict` takes a table of configurations and returns a table of predictions with the per-part breakdown
(`predict_arrays` the same on a dict of arrays). Imports models.core, models.arch and models.memory."""

from models.physics.hardware import resolve_hardware
from models.physics.step_time import predict, predict_arrays

__all__ = ["predict", "predict_arrays", "resolve_hardware"]
