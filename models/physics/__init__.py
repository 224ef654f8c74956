"""The analytical step time and its named parts: hardware rows resolved into model inputs (`resolve_hardware`), the
alpha-beta collectives over the network's tiers, 2-D tensor parallelism, and one vectorized function per part
(compute; TP, CP, EP, PP and DP communication; overlap; the optimizer; the step's assembly).

`predict` takes a table of configurations and returns a table of predictions with the per-part breakdown
(`predict_arrays` the same on a dict of arrays); `step_timeline` lays one configuration's parts out as the events of
one optimizer step (the pipeline schedule's passes, bubble, traffic, optimizer). Imports models.core, models.arch and models.memory."""

from models.core.lazy import entry_points

__getattr__, __dir__, __all__ = entry_points(__name__, {
    "predict": "models.physics.step_time",
    "predict_arrays": "models.physics.step_time",
    "resolve_hardware": "models.physics.hardware",
    "step_timeline": "models.physics.timeline",
})
