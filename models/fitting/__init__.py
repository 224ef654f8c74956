"""The one prediction function and what calibrates it: `predict` answers every command, table and view (physics with
the parameters of the configuration's domain, the residual correction and the 90% interval; `Predictor` holds a
fit, `Calibration` is one), `fit_calibration` fits the physical parameters, the residual regression and the
interval widths on measured runs and scores them under the held-out transfer protocols (docs/calibration.md); an
`Adaptation` adapts a fit to one source's runs by the rule `select_rule` chooses on the k-shot protocol.

Imports models.core, models.arch, models.memory and models.physics."""

from models.core.lazy import entry_points

__getattr__, __dir__, __all__ = entry_points(__name__, {
    "Calibration": "models.fitting.predictor",
    "Adaptation": "models.fitting.adapt",
    "select_rule": "models.fitting.adapt",
    "Predictor": "models.fitting.predictor",
    "fit_calibration": "models.fitting.calibration",
    "predict": "models.fitting.predictor",
})
