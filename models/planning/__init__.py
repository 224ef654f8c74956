"""What to do with a prediction: the exhaustive layout search at N accelerators (`search`), scaling curves with
their inflection point and Universal Scalability Law fit (`scaling_curve`, `inflection`), the compute frontier of
an accelerator (`frontier_table`), and time, cost and energy of a whole run (`plan_rows`).

Every number comes from models.fitting.predict. Imports every other sub-package but models.corpus."""

from models.planning.curves import inflection, scaling_curve
from models.planning.frontier import frontier_table
from models.planning.plan import plan_rows
from models.planning.search import search

__all__ = ["frontier_table", "inflection", "plan_rows", "scaling_curve", "search"]
