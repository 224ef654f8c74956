"""Measured runs as the model reads them: every run of a published source or a user's file turned into a model
configuration, each unstated setting filled by a sourced rule that the run's `assumptions` names
(`configs_from_runs`, `resolve_unstated`; docs/run-rules.md), the measured throughput every prediction is compared
with (`measured_throughput`), and the error of every run (`predict_runs`).

Imports models.core, models.arch, models.memory and models.physics."""

from models.corpus.evaluate import predict_runs
from models.corpus.runs_adapter import configs_from_runs, resolve_unstated
from models.corpus.targets import measured_throughput

__all__ = ["configs_from_runs", "measured_throughput", "predict_runs", "resolve_unstated"]
