"""`stepcast curve` (a scaling curve with its inflection point) and `stepcast frontier` (the largest training
compute an accelerator sustains at good utilization within a time limit)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from pipeline import api
from pipeline.cli import (ANALYTICAL_HELP, ASSUMPTIONS_HELP, OVERSUBSCRIPTION_HELP, POD_SIZE_HELP,
                          SCALEOUT_GBPS_HELP, SCALEUP_GBPS_HELP, SCALEUP_SIZE_HELP, _fail, app, settings)
from pipeline.output import json_rows

# help of the options curve and frontier share (the network-tier flags' help is pipeline.cli's)
BATCH_RULE_HELP = ("Batch ceiling: deepseek (0.292 C^0.3271 tokens), kaplan (critical batch, Kaplan et al. 2020) "
                   "or fixed (4M tokens).")

CURVE_COLUMNS = api.CURVE_COLUMNS
CURVE_TABLE = ["n_gpus", "global_batch_seqs", "tp", "pp", "dp", "vpp", "micro_batch", "sharding", "recompute",
               "tokens_per_s_per_gpu", "mfu", "time_to_train_days", "cost_usd", "parallel_efficiency",
               "marginal_efficiency"]
FRONTIER_KEYS = ["max_training_flop", "n_gpus", "tp", "pp", "dp", "ep", "cp", "utilization", "params", "tokens",
                 "cost_usd"]
BREAKDOWN_KEYS = api.BREAKDOWN_KEYS


@app.command()
def curve(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Architecture id or name, e.g. llama3-8b."),
    arch_file: Optional[Path] = typer.Option(None, "--arch-file", metavar="PATH",
                                             help="Architecture from a file instead of --model: a row of the "
                                                  "architectures schema (CSV/JSON) or a Hugging Face config.json."),
    analytical_only: bool = typer.Option(False, "--analytical-only", help=ANALYTICAL_HELP),
    gpu: str = typer.Option(..., "--gpu", help="Hardware id, e.g. h100-sxm5-80gb."),
    policy: str = typer.Option("strong", "--policy", help="strong (fixed global batch), weak (fixed per-GPU batch) "
                                                          "or critical (weak up to the critical batch size)."),
    tokens: Optional[float] = typer.Option(None, "--tokens", help="Training tokens (default 20 x parameters)."),
    seq_len: int = typer.Option(2048, "--seq-len", "-s", min=1, help="Tokens per sequence."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", "-b", min=1,
                                               help="Strong scaling batch in sequences (default 4M tokens)."),
    per_gpu_batch: float = typer.Option(1.0, "--per-gpu-batch", min=0.0, help="Weak/critical: sequences per GPU."),
    max_gpus: int = typer.Option(16384, "--max-gpus", min=1, help="Largest cluster swept."),
    threshold: float = typer.Option(0.5, "--threshold", help="Marginal-efficiency threshold of the knee."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Precision (default: bf16; fp16 without BF16; fp32 "
                                                              "on fp32-only parts)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
    assumptions: str = typer.Option("realistic", "--assumptions", help=ASSUMPTIONS_HELP),
    batch_rule: str = typer.Option("deepseek", "--batch-rule", help=BATCH_RULE_HELP),
    scaleup_size: Optional[int] = typer.Option(None, "--scaleup-size", help=SCALEUP_SIZE_HELP),
    scaleup_gbps: Optional[float] = typer.Option(None, "--scaleup-gbps", help=SCALEUP_GBPS_HELP),
    scaleout_gbps: Optional[float] = typer.Option(None, "--scaleout-gbps", help=SCALEOUT_GBPS_HELP),
    oversubscription: Optional[float] = typer.Option(None, "--oversubscription", help=OVERSUBSCRIPTION_HELP),
    pod_size: Optional[int] = typer.Option(None, "--pod-size", help=POD_SIZE_HELP),
) -> None:
    """A scaling curve: the best layout at each cluster size N (one node up to --max-gpus, powers of two and the
    node-aligned sizes between), with throughput, MFU, time-to-train, cost, parallel and marginal efficiency,
    and the inflection point (smallest N whose marginal efficiency < --threshold) with a USL fit.

    Example: `stepcast curve --model gpt3-175b --gpu h100-sxm5-80gb --policy strong --tokens 300e9`
    """
    from pipeline.output import render

    if fmt not in ("table", "csv", "json"):
        _fail(f"--format must be table, csv or json, got '{fmt}'")
    try:
        doc, header = api.scaling_curve(
            settings(), gpu=gpu, model=model, arch_file=arch_file, policy=policy, tokens=tokens, seq_len=seq_len,
            global_batch=global_batch, per_gpu_batch=per_gpu_batch, max_gpus=max_gpus, threshold=threshold,
            dtype=dtype, assumptions=assumptions, batch_rule=batch_rule, scaleup_size=scaleup_size,
            scaleup_gbps=scaleup_gbps, scaleout_gbps=scaleout_gbps, analytical_only=analytical_only,
            oversubscription=oversubscription, pod_size=pod_size)
    except api.InputError as err:
        _fail(str(err), err.exit_code)
    out = doc["points"]
    knee = doc["explanation"]
    if fmt == "json":
        print(json.dumps(api.curve_document(doc), indent=2, default=str))
        return
    print(header, file=sys.stderr)
    if fmt == "csv":
        render(out, "csv")
    else:
        render(out.filter(out["feasible"]).select(CURVE_TABLE), "table", title=header)
    print(f"inflection: {knee}", file=sys.stderr if fmt == "csv" else sys.stdout)


@app.command()
def frontier(
    gpu: str = typer.Option(..., "--gpu", help="Hardware id, e.g. h100-sxm5-80gb, v100-sxm2-32gb, gtx-580."),
    months: float = typer.Option(3.0, "--months", help="Time limit of the training run, in months (30.4 days)."),
    min_utilization: float = typer.Option(0.8, "--min-utilization",
                                          help="Fraction of the accelerator's best utilization to keep (0-1]."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Precision (default as `stepcast curve`)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json."),
    analytical_only: bool = typer.Option(False, "--analytical-only", help=ANALYTICAL_HELP),
    table: bool = typer.Option(False, "--table", help="Also print every compute level: FLOP, N, layout, "
                                                      "utilization and the binding constraint."),
    assumptions: str = typer.Option("realistic", "--assumptions", help=ASSUMPTIONS_HELP),
    batch_rule: str = typer.Option("deepseek", "--batch-rule", help=BATCH_RULE_HELP),
    scaleup_size: Optional[int] = typer.Option(None, "--scaleup-size", help=SCALEUP_SIZE_HELP),
    scaleup_gbps: Optional[float] = typer.Option(None, "--scaleup-gbps", help=SCALEUP_GBPS_HELP),
    scaleout_gbps: Optional[float] = typer.Option(None, "--scaleout-gbps", help=SCALEOUT_GBPS_HELP),
    oversubscription: Optional[float] = typer.Option(None, "--oversubscription", help=OVERSUBSCRIPTION_HELP),
    pod_size: Optional[int] = typer.Option(None, "--pod-size", help=POD_SIZE_HELP),
    memory_gb: Optional[float] = typer.Option(None, "--memory-gb", help="Memory per accelerator, GB (overrides the "
                                                                         "hardware row)."),
    tp_form: str = typer.Option("1d", "--tp-form", help="Tensor-parallel form the layouts may use: 1d (Megatron; "
                                                        "the default, as Epoch AI's counterfactuals), 2d (the 2-D "
                                                        "grid for tp >= 4) or any (the better of the two)."),
) -> None:
    """The largest training compute (Chinchilla-optimal dense model, tokens = 20 x params) that one accelerator
    type trains within --months while its best layout keeps utilization >= --min-utilization x its best: the
    first crossing below that threshold, sweeping 1e16 to 1e32 FLOP and up to 1e9 accelerators.

    Example: `stepcast frontier --gpu h100-sxm5-80gb --months 3 --min-utilization 0.8 --assumptions ideal --table`
    """
    if fmt not in ("table", "json"):
        _fail(f"--format must be table or json, got '{fmt}'")
    try:
        result, sweep, title = api.compute_frontier(
            settings(), gpu=gpu, months=months, min_utilization=min_utilization, dtype=dtype, assumptions=assumptions,
            batch_rule=batch_rule, scaleup_size=scaleup_size, scaleup_gbps=scaleup_gbps, scaleout_gbps=scaleout_gbps,
            memory_gb=memory_gb, analytical_only=analytical_only, oversubscription=oversubscription,
            pod_size=pod_size, tp_form=tp_form)
    except api.NoResult as err:
        sweep, title = err.detail["sweep"], err.detail["title"]
        if fmt == "json" and table:
            print(json.dumps({"found": False, "reason": err.detail["reason"], "assumptions": assumptions,
                              "levels": json_rows(api.frontier_levels(sweep))}, indent=2, default=str))
        elif table:
            _print_levels(sweep, title)
        print(f"error: {err}", file=sys.stderr)
        raise typer.Exit(1)
    except api.InputError as err:
        _fail(str(err), err.exit_code)
    if fmt == "json":
        print(json.dumps(api.frontier_document(result, sweep, table), indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    if table:
        _print_levels(sweep, title)
    t = Table("field", "value", title=title)
    for k in FRONTIER_KEYS + ["best_utilization", "time_to_train_days", "binding", "ended_by", "crossing_flop",
                              "latency_wall_days", "cost_basis"]:
        v = result[k]
        t.add_row(k, "—" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v))
    for k, v in result["layout"].items():
        t.add_row(k, str(v))
    for k, v in result["breakdown"].items():
        t.add_row(k, f"{v:.4g}")
    Console(width=140).print(t)


LEVEL_COLUMNS = api.LEVEL_COLUMNS


def _print_levels(sweep, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

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
