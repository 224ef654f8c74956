"""`stepcast curve` (a scaling curve with its inflection point) and `stepcast frontier` (the largest training
compute an accelerator sustains at good utilization within a time limit)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import polars as pl
import typer
from rich.console import Console
from rich.table import Table

from pipeline.commands.common import command, computations, fail, settings
from pipeline.options import CurveOptions, FrontierOptions
from pipeline.output import FORMATS, json_rows, render

CURVE_TABLE = ["n_gpus", "global_batch_seqs", "tp", "pp", "dp", "vpp", "micro_batch", "sharding", "recompute",
               "tokens_per_s_per_gpu", "mfu", "time_to_train_days", "cost_usd", "parallel_efficiency",
               "marginal_efficiency", "efficient", "note"]
FRONTIER_KEYS = ["max_training_flop", "n_gpus", "tp", "pp", "dp", "ep", "cp", "utilization", "params", "tokens",
                 "cost_usd"]


@command(CurveOptions)
def curve(o: CurveOptions, fmt: str, out: Optional[Path]) -> None:
    """A scaling curve: the best layout at each cluster size N (one node up to --max-gpus, powers of two and the
    node-aligned sizes between), with throughput, MFU, time-to-train, cost, parallel and marginal efficiency,
    and the inflection point (smallest N whose marginal efficiency < --threshold) with a USL fit.

    Example: `stepcast curve --model gpt3-175b --gpu h100-sxm5-80gb --policy strong --tokens 300e9`
    (`--out curve.csv` writes the points).
    """
    api = computations()
    if fmt not in FORMATS:
        fail(f"--format must be table, csv or json, got '{fmt}'")
    try:
        doc, header = api.scaling_curve(settings(), o)
    except api.InputError as err:
        fail(str(err), err.exit_code)
    points = doc["points"]
    knee = doc["explanation"]
    if fmt == "json":
        text = json.dumps(api.curve_document(doc), indent=2, default=str)
        if out is None:
            print(text)
            return
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        print(f"wrote the curve of {points.height} point(s) to {out}", file=sys.stderr)
        return
    print(header, file=sys.stderr)
    if fmt == "csv" or out is not None:  # a file gets every point as CSV
        render(points, "csv", out)
    else:  # the table numbers each size's layout_note and prints the notes under it
        shown = points.filter(points["feasible"])
        marks = shown["layout_note"].is_not_null().cum_sum()
        shown = shown.with_columns(pl.when(pl.col("layout_note").is_not_null()).then(pl.format("[{}]", marks))
                                   .otherwise(pl.lit("")).alias("note"))
        render(shown.select(CURVE_TABLE), "table", title=header)
        for mark, n, text in shown.filter(pl.col("layout_note").is_not_null()) \
                .select("note", "n_gpus", "layout_note").rows():
            print(f"{mark} N = {n:,}: {text}")
    print(f"inflection: {knee}", file=sys.stderr if fmt == "csv" or out is not None else sys.stdout)


@command(FrontierOptions)
def frontier(o: FrontierOptions, fmt: str) -> None:
    """The largest training compute (Chinchilla-optimal dense model, tokens = 20 x params) that one accelerator
    type trains within --months while its best layout keeps utilization >= --min-utilization x its best: the
    first crossing below that threshold, sweeping 1e16 to 1e32 FLOP and up to 1e9 accelerators.

    Example: `stepcast frontier --gpu h100-sxm5-80gb --months 3 --min-utilization 0.8 --assumptions ideal --table`
    """
    api = computations()
    if fmt not in ("table", "json"):
        fail(f"--format must be table or json, got '{fmt}'")
    try:
        result, sweep, title = api.compute_frontier(settings(), o)
    except api.NoResult as err:
        sweep, title = err.detail["sweep"], err.detail["title"]
        if fmt == "json" and o.table:
            print(json.dumps({"found": False, "reason": err.detail["reason"], "assumptions": o.assumptions,
                              "levels": json_rows(api.frontier_levels(sweep))}, indent=2, default=str))
        elif o.table:
            _print_levels(sweep, title)
        print(f"error: {err}", file=sys.stderr)
        raise typer.Exit(1)
    except api.InputError as err:
        fail(str(err), err.exit_code)
    if fmt == "json":
        print(json.dumps(api.frontier_document(result, sweep, o.table), indent=2, default=str))
        return
    if o.table:
        _print_levels(sweep, title)
    t = Table("field", "value", title=title)
    for k in FRONTIER_KEYS + ["best_utilization", "peak_utilization", "time_to_train_days", "binding", "ended_by",
                              "ended_by_reason", "crossing_flop", "largest_feasible_flop", "reach_ended_by",
                              "reach_reason", "latency_wall_days", "latency_wall_flop", "cost_basis"]:
        v = result[k]
        t.add_row(k, "—" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v))
    for rule, x in result["batch_rules"].items():  # the band between the batch laws
        flop = x["max_training_flop"]
        t.add_row(f"frontier, {rule} batch law", "—" if flop is None else
                  f"{flop:.3g} FLOP on {x['n_gpus']:,} (ended by {x['ended_by'] or 'the grid'}; trainable to "
                  f"{x['largest_feasible_flop']:.3g})")
    for k, v in result["layout"].items():
        t.add_row(k, str(v))
    for k, v in result["breakdown"].items():
        t.add_row(k, f"{v:.4g}")
    Console(width=140).print(t)


def _print_levels(sweep, title: str) -> None:
    t = Table("training FLOP", "N", "layout tp×pp×dp×cp", "utilization", "days", "latency wall (days)", "binding",
              title=f"every level — {title}")
    for r in sweep.sort("training_flop").iter_rows(named=True):
        lay = f"{r['tp']}×{r['pp']}×{r['dp']}×{r['cp']}" if r.get("tp") is not None else "—"
        u = r.get("utilization")
        days = r.get("time_to_train_days")
        t.add_row(f"{r['training_flop']:.3g}", f"{r['n_gpus']:,}" if r.get("n_gpus") is not None else "—", lay,
                  f"{u:.3f}" if u is not None else "—", f"{days:.1f}" if days is not None else "—",
                  f"{r['latency_wall_days']:.3g}", r["binding"] or "—")
    Console(width=140).print(t)
