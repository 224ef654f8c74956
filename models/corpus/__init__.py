"""Measured runs as the model reads them: every run of a published source or a user's file turned into a model
configuration, each unstated setting filled by a sourced rule that the run's `assumptions` names
(`configs_from_runs`, `resolve_unstated`; docs/run-rules.md), the measured throughput every prediction is compared
with (`measured_throughput`), and the error of every run (`predict_runs`).

Imports models.core, models.arch, models.memory and models.physics."""

from models.core.lazy import entry_points

__getattr__, __dir__, __all__ = entry_points(__name__, {
    "configs_from_runs": "models.corpus.runs_adapter",
    "measured_throughput": "models.corpus.targets",
    "predict_runs": "models.corpus.evaluate",
    "resolve_unstated": "models.corpus.runs_adapter",
})
