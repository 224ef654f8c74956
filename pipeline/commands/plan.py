"""`stepcast plan`: which accelerator, how many, which layout, how long, how much, how sure."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from pipeline import api
from pipeline.cli import (ANALYTICAL_HELP, ASSUMPTIONS_HELP, OVERSUBSCRIPTION_HELP, POD_SIZE_HELP,
                          SCALEOUT_GBPS_HELP, SCALEUP_GBPS_HELP, SCALEUP_SIZE_HELP, _fail, app, settings)

PLAN_COLUMNS = api.PLAN_COLUMNS
TABLE_COLUMNS = ["rank", "hardware", "n_gpus", "tp", "pp", "dp", "cp", "days", "days_lo", "days_hi", "cost_usd",
                 "energy_mwh", "mfu", "goodput"]
NO_DEADLINE_HORIZON_DAYS = api.NO_DEADLINE_HORIZON_DAYS
OPTIMAL_COLUMNS = api.OPTIMAL_COLUMNS


@app.command()
def plan(
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="Architecture id or name, e.g. llama3-70b (not used with --optimal)."),
    arch_file: Optional[Path] = typer.Option(None, "--arch-file", metavar="PATH",
                                             help="Architecture from a file instead of --model: a row of the "
                                                  "architectures schema (CSV/JSON) or a Hugging Face config.json."),
    tokens: Optional[float] = typer.Option(None, "--tokens", "-t", help="Training tokens, e.g. 15e12."),
    deadline_days: Optional[float] = typer.Option(None, "--deadline-days", help="Finish within this many days."),
    budget_usd: Optional[float] = typer.Option(None, "--budget-usd", help="Spend at most this many dollars."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="Comma-separated hardware ids (default: every "
                                                                     "accelerator with a price)."),
    max_gpus: int = typer.Option(65536, "--max-gpus", min=1, help="Largest cluster to consider."),
    price_source: str = typer.Option("median", "--price-source",
                                     help="median (cross-cloud median), cloud:NAME (aws, gcp, lambda, nebius, "
                                          "runpod, vast) or custom:FILE (CSV hardware,usd_per_gpu_hour)."),
    price_file: Optional[Path] = typer.Option(None, "--price-file", help="Same as --price-source custom:FILE."),
    seq_len: int = typer.Option(8192, "--seq-len", min=1, help="Tokens per sequence (Llama 3 pre-training: 8192)."),
    batch_tokens: int = typer.Option(4_194_304, "--global-batch-tokens", min=1,
                                     help="Tokens per optimizer step (Llama 3 405B started at 4M)."),
    dtype: str = typer.Option("bf16", "--dtype", help="Precision of the matmuls."),
    optimal: bool = typer.Option(False, "--optimal", help="Choose the model size too: the compute-optimal "
                                                          "(Chinchilla) size and token count for the budget."),
    top: int = typer.Option(10, "--top", "-k", min=1, help="How many options to show."),
    assumptions: str = typer.Option("realistic", "--assumptions", help=ASSUMPTIONS_HELP),
    analytical_only: bool = typer.Option(False, "--analytical-only", help=ANALYTICAL_HELP),
    scaleup_size: Optional[int] = typer.Option(None, "--scaleup-size", help=SCALEUP_SIZE_HELP + " (every "
                                               "accelerator considered)"),
    scaleup_gbps: Optional[float] = typer.Option(None, "--scaleup-gbps", help=SCALEUP_GBPS_HELP),
    scaleout_gbps: Optional[float] = typer.Option(None, "--scaleout-gbps", help=SCALEOUT_GBPS_HELP),
    oversubscription: Optional[float] = typer.Option(None, "--oversubscription", help=OVERSUBSCRIPTION_HELP),
    pod_size: Optional[int] = typer.Option(None, "--pod-size", help=POD_SIZE_HELP),
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the result to this file."),
) -> None:
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
    from pipeline.output import render

    if fmt not in ("table", "csv", "json"):
        _fail(f"--format must be table, csv or json, got '{fmt}'")
    try:
        result, title = api.training_plan(
            settings(), model=model, arch_file=arch_file, tokens=tokens, deadline_days=deadline_days,
            budget_usd=budget_usd, hardware=hardware, max_gpus=max_gpus, price_source=price_source,
            price_file=price_file, seq_len=seq_len, global_batch_tokens=batch_tokens, dtype=dtype, optimal=optimal,
            top=top, assumptions=assumptions, analytical_only=analytical_only, scaleup_size=scaleup_size,
            scaleup_gbps=scaleup_gbps, scaleout_gbps=scaleout_gbps, oversubscription=oversubscription,
            pod_size=pod_size,
            warn=lambda message: print(f"warning: {message}", file=sys.stderr))
    except api.NoResult as err:
        print(str(err), file=sys.stderr)
        if fmt == "json" and err.detail.get("empty_json"):
            print("[]")
        raise typer.Exit(1)
    except api.InputError as err:
        _fail(str(err), err.exit_code)
    if optimal:
        render(result, fmt, out, title=title)
    elif fmt == "table":
        render(result, fmt, out, title=title, table_columns=TABLE_COLUMNS)
    else:
        print(title, file=sys.stderr)
        render(result, fmt, out)
