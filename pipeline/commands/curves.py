"""`stepcast curve` (a scaling curve with its inflection point) and `stepcast frontier` (the largest training
compute an accelerator sustains at good utilization within a time limit)."""

from __future__ import annotations

import json
import math
import sys
from typing import Optional

import typer

from pipeline.cli import _fail, app, settings

CURVE_COLUMNS = ["n_gpus", "global_batch_seqs", "tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "sharding",
                 "recompute", "step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s", "tokens_per_s_lo",
                 "tokens_per_s_hi", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "mfu",
                 "time_to_train_days", "cost_usd", "parallel_efficiency", "marginal_efficiency",
                 "marginal_efficiency_lo", "marginal_efficiency_hi", "pareto_optimal", "feasible", "reason",
                 "calibrated", "fit_version"]
CURVE_TABLE = ["n_gpus", "global_batch_seqs", "tp", "pp", "dp", "vpp", "micro_batch", "sharding", "recompute",
               "tokens_per_s_per_gpu", "mfu", "time_to_train_days", "cost_usd", "parallel_efficiency",
               "marginal_efficiency"]
FRONTIER_KEYS = ["max_training_flop", "n_gpus", "tp", "pp", "dp", "ep", "cp", "utilization", "params", "tokens",
                 "cost_usd"]
BREAKDOWN_KEYS = ["step_time_s", "compute_s", "tp_comm_s", "pp_bubble_s", "pp_comm_s", "dp_comm_exposed_s",
                  "cp_comm_s", "ep_comm_s", "optimizer_s"]


def _calibration():
    """(hook, params, note) from the promoted fit in the published snapshot (else the store); analytical when
    there is no store or no fit."""
    from models.curves import calibration_from_bundle
    from pipeline.calibrated import promoted_fit

    return calibration_from_bundle(promoted_fit(settings()))


def _hardware(gpu: str) -> dict:
    import polars as pl

    from models.hardware import resolve_hardware
    from pipeline import catalog

    try:
        hw_row = catalog.find_hardware(settings().measurements, gpu)
    except catalog.UnknownName as err:
        _fail(str(err))
    hw = resolve_hardware(pl.DataFrame([hw_row]), strict=False).row(0, named=True)
    if hw.get("hardware_error"):
        _fail(f"--gpu {gpu}: {hw['hardware_error']}", 1)
    return hw


def _clean(v):
    return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v


@app.command()
def curve(
    model: str = typer.Option(..., "--model", "-m", help="Architecture id, e.g. gpt3-175b, llama3-8b."),
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
) -> None:
    """A scaling curve: the best layout at each cluster size N (one node up to --max-gpus, powers of two and the
    node-aligned sizes between), with throughput, MFU, time-to-train, cost, parallel and marginal efficiency,
    and the inflection point (smallest N whose marginal efficiency < --threshold) with a USL fit.

    Example: `stepcast curve --model gpt3-175b --gpu h100-sxm5-80gb --policy strong --tokens 300e9`
    """
    from models.curves import POLICIES, default_dtype, explain, inflection, round_batch, scaling_curve
    from pipeline import catalog
    from pipeline.output import render

    if fmt not in ("table", "csv", "json"):
        _fail(f"--format must be table, csv or json, got '{fmt}'")
    if policy not in POLICIES:
        _fail(f"--policy must be one of {', '.join(POLICIES)}, got '{policy}'")
    if tokens is not None and not (tokens > 0 and math.isfinite(tokens)):
        _fail(f"--tokens must be a positive number of tokens, got {tokens}")
    if not 0 < threshold <= 1:
        _fail(f"--threshold must be in (0, 1], got {threshold}")
    if policy != "strong" and per_gpu_batch <= 0:
        _fail(f"--per-gpu-batch must be > 0 for the {policy} policy, got {per_gpu_batch}")
    if dtype is not None and dtype not in ("bf16", "fp16", "fp8", "fp8-cs", "mxfp8", "nvfp4", "fp32", "tf32"):
        _fail(f"--dtype must be one of bf16, fp16, fp8, fp8-cs, mxfp8, nvfp4, fp32, tf32, got '{dtype}'")
    try:
        arch = catalog.find_architecture(settings().measurements, model)
    except catalog.UnknownName as err:
        _fail(str(err))
    hw = _hardware(gpu)
    hook, params, note = _calibration()
    from models.curves import _arch_params

    n_params = _arch_params(arch)
    tokens = tokens if tokens is not None else 20.0 * n_params
    batch = global_batch or round_batch(4 * 2**20 / seq_len)
    try:
        c = scaling_curve(arch, hw, policy, seq_len=seq_len, tokens=tokens, global_batch_seqs=batch,
                          per_gpu_batch_seqs=per_gpu_batch, n_max=max_gpus, dtype=dtype or default_dtype(hw),
                          params=params, usd_per_gpu_hour=hw.get("cloud_usd_per_hour"), calibrate=hook)
    except ValueError as err:
        _fail(str(err))
    rec = inflection(c, threshold)
    price = hw.get("cloud_usd_per_hour")
    header = (f"{arch['id']} on {gpu}, {policy} scaling, seq {seq_len}, {tokens:.3g} tokens"
              + (f", batch {batch} seqs" if policy == "strong" else f", {per_gpu_batch:g} seq/GPU")
              + f"; {note}; cost: " + (f"${price}/GPU-h (hardware.cloud_usd_per_hour)" if price else
                                       "none (no price for this accelerator)"))
    knee = explain(rec)
    out = c.select([x for x in CURVE_COLUMNS if x in c.columns])
    if fmt == "json":
        print(json.dumps({"model": arch["id"], "gpu": gpu, "policy": policy, "seq_len": seq_len, "tokens": tokens,
                          "calibration": note, "inflection": {k: _clean(v) for k, v in rec.items()},
                          "explanation": knee,
                          "points": [{k: _clean(v) for k, v in r.items()} for r in out.iter_rows(named=True)]},
                         indent=2, default=str))
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
) -> None:
    """The largest training compute (Chinchilla-optimal dense model, tokens = 20 x params) that one accelerator
    type trains within --months while its best layout keeps utilization >= --min-utilization x its best.

    Example: `stepcast frontier --gpu h100-sxm5-80gb --months 3 --min-utilization 0.8 --format json`
    """
    from models.curves import default_dtype
    from models.frontier import frontier_summary, frontier_sweep

    if fmt not in ("table", "json"):
        _fail(f"--format must be table or json, got '{fmt}'")
    if not (months > 0 and math.isfinite(months)):
        _fail(f"--months must be > 0, got {months}")
    if not 0 < min_utilization <= 1:
        _fail(f"--min-utilization must be in (0, 1], got {min_utilization}")
    hw = _hardware(gpu)
    hook, params, note = _calibration()
    dt = dtype or default_dtype(hw)
    sweep = frontier_sweep(hw, months, params=params, dtype=dt, usd_per_gpu_hour=hw.get("cloud_usd_per_hour"))
    s = frontier_summary(sweep, min_utilization)
    if not s["found"]:
        print(f"error: no compute level is trainable on {gpu} within {months:g} months: {s['reason']}",
              file=sys.stderr)
        raise typer.Exit(1)
    result = {"max_training_flop": s["training_flop"], "n_gpus": s["n_gpus"], "tp": s["tp"], "pp": s["pp"],
              "dp": s["dp"], "ep": s["ep"], "cp": s["cp"], "utilization": s["utilization"], "params": s["params"],
              "tokens": s["tokens"], "cost_usd": _clean(s["cost_usd"]),
              "breakdown": {k: s[k] for k in BREAKDOWN_KEYS},
              "layout": {k: s[k] for k in ("vpp", "micro_batch", "sharding", "recompute")},
              "model": {k: s[k] for k in ("arch_id", "d_model", "n_layers", "n_heads", "seq_len", "global_batch_seqs")},
              "gpu": gpu, "dtype": dt, "months": months, "min_utilization": min_utilization,
              "best_utilization": s["best_utilization"], "utilization_threshold": s["utilization_threshold"],
              "time_to_train_days": s["time_to_train_days"], "usd_per_gpu_hour": _clean(s["usd_per_gpu_hour"]),
              "model_flop": s["model_flop"], "calibration": note,
              "training_flop_convention": "6 x params x tokens (Chinchilla); utilization = MFU (stepcast FLOPs)"}
    if fmt == "json":
        print(json.dumps({k: _clean(v) for k, v in result.items()}, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table("field", "value", title=f"frontier of {gpu}: {months:g} months, >= {min_utilization:g} x best "
                                      f"utilization ({note})")
    for k in FRONTIER_KEYS + ["best_utilization", "time_to_train_days"]:
        v = result[k]
        t.add_row(k, "—" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v))
    for k, v in result["layout"].items():
        t.add_row(k, str(v))
    for k, v in result["breakdown"].items():
        t.add_row(k, f"{v:.4g}")
    Console(width=120).print(t)
