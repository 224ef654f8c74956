"""`stepcast plan`: which accelerator, how many, which layout, how long, how much, how sure."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from pipeline.commands.common import command, computations, fail, settings
from pipeline.options import PlanOptions
from pipeline.output import FORMATS, render

TABLE_COLUMNS = ["rank", "hardware", "n_gpus", "tp", "pp", "dp", "cp", "days", "days_lo", "days_hi", "cost_usd",
                 "energy_mwh", "mfu", "goodput"]


@command(PlanOptions)
def plan(o: PlanOptions, fmt: str, out: Optional[Path]) -> None:
    """Rank hardware x cluster size x layout by cost within a deadline (or by time within a budget).

    Each option has days (with the expected interruptions, checkpoints and restarts of a cluster that size; the
    failure-free `days_ideal` beside it), dollars, energy (MWh at TDP x PUE 1.1), MFU and, when a calibrated fit
    is promoted, the interval `days_lo..days_hi`. The reliability model and every constant with its source:
    `models/planning/plan.py`.

    Examples:

    `stepcast plan --model llama3-70b --tokens 15e12 --deadline-days 90 --format json`

    `stepcast plan --model llama3-70b --tokens 15e12 --budget-usd 20e6 --hardware h100-sxm5-80gb,b200`

    `stepcast plan --model llama3-70b --budget-usd 5e6 --deadline-days 60 --optimal`
    """
    api = computations()
    if fmt not in FORMATS:
        fail(f"--format must be table, csv or json, got '{fmt}'")
    try:
        result, title = api.training_plan(settings(), o,
                                          warn=lambda message: print(f"warning: {message}", file=sys.stderr))
    except api.NoResult as err:
        print(str(err), file=sys.stderr)
        if fmt == "json" and err.detail.get("empty_json"):
            print("[]")
        raise typer.Exit(1)
    except api.InputError as err:
        fail(str(err), err.exit_code)
    if o.optimal:
        render(result, fmt, out, title=title)
        return
    if fmt == "table":
        render(result, fmt, out, title=title, table_columns=TABLE_COLUMNS)
    else:
        print(title, file=sys.stderr)
        render(result, fmt, out)
    capped = [(r["rank"], r["batch_note"]) for r in result.iter_rows(named=True) if r.get("batch_note")]
    if capped:  # the batch cap of the best-ranked capped plan in full; the column has every row's
        also = [str(rank) for rank, _ in capped[1:]]
        print(f"batch (rank {capped[0][0]}): {capped[0][1]}" + (f" (also capped: rank {', '.join(also)}; "
              "batch_note)" if also else ""), file=sys.stdout if fmt == "table" and out is None else sys.stderr)
