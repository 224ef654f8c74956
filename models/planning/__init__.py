"""What to do with a prediction: the exhaustive layout search at N accelerators (`enumerate_layouts`, ranked by
models.planning.search.search), scaling curves with their inflection point and Universal Scalability Law fit
(`scaling_curve`, `inflection`), the compute frontier of an accelerator (`frontier_table`), and time, cost and
energy of a whole run (`plan_rows`).

Every number comes from models.fitting.predict. Imports every other sub-package but models.corpus."""

from models.core.lazy import entry_points

__getattr__, __dir__, __all__ = entry_points(__name__, {
    "frontier_table": "models.planning.frontier",
    "inflection": "models.planning.curves",
    "plan_rows": "models.planning.plan",
    "scaling_curve": "models.planning.curves",
    "enumerate_layouts": "models.planning.search",
})
