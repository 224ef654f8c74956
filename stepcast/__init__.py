"""stepcast as a Python library: the same functions as the `stepcast` command line, on plain Python and
polars inputs.

    >>> import stepcast
    >>> row = stepcast.predict(model="llama3-8b", gpu="h100", gpus=64, global_batch=512, seq_len=8192, tp=8)
    >>> row["feasible"][0]
    True

| function                  | command                      | returns                                       |
|---------------------------|------------------------------|-----------------------------------------------|
| `predict(...)`            | `stepcast predict`           | polars DataFrame, one row per configuration   |
| `predict_frame(frame)`    | `stepcast predict --runs`    | polars DataFrame, one row per run_id          |
| `search(...)`             | `stepcast search`            | polars DataFrame, best layout first           |
| `curve(...)`              | `stepcast curve`             | dict (the JSON document; points as DataFrame) |
| `frontier(...)`           | `stepcast frontier`          | dict (the JSON document)                      |
| `plan(...)`               | `stepcast plan`              | polars DataFrame, best option first           |

Keyword arguments are the command's options (`--global-batch` -> `global_batch`) with the same defaults: all
but `--format` and `--out`, which shape the printout (pipeline/options.py defines them once for the command
line, these functions and the explorer). Bad input raises `InputError` with the message the command prints;
valid input without an answer (no feasible layout, no plan within the ask) raises its subclass `NoResult`. The
store the answers come from (its promoted calibration fit) is the command's: `STEPCAST_STORE` or
out/stepcast.duckdb in the project; pass `store=` to use another. Guide with examples: docs/python-api.md.
"""

from pipeline.api import InputError, NoResult
from stepcast.api import curve, frontier, plan, predict, predict_frame, search

__all__ = ["InputError", "NoResult", "curve", "frontier", "plan", "predict", "predict_frame", "search"]
