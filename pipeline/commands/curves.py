"""`stepcast curve` (a scaling curve with its inflection point) and `stepcast frontier` (the largest training
compute an accelerator sustains at good utilization within a time limit)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Optional

import typer

from pipeline.api import InputError, check_network
from pipeline.cli import (ANALYTICAL_HELP, ASSUMPTIONS_HELP, SCALEOUT_GBPS_HELP, SCALEUP_GBPS_HELP,
                          SCALEUP_SIZE_HELP, _fail, app, settings)
from pipeline.settings import Settings

# help of the options curve and frontier share (the network-tier flags' help is pipeline.cli's)
BATCH_RULE_HELP = ("Batch ceiling: deepseek (0.292 C^0.3271 tokens), kaplan (critical batch, Kaplan et al. 2020) "
                   "or fixed (4M tokens).")

CURVE_COLUMNS = ["n_gpus", "global_batch_seqs", "tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "sharding",
                 "recompute", "step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s", "tokens_per_s_lo",
                 "tokens_per_s_hi", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "mfu",
                 "time_to_train_days", "cost_usd", "parallel_efficiency", "marginal_efficiency",
                 "marginal_efficiency_lo", "marginal_efficiency_hi", "pareto_optimal", "feasible", "reason",
                 "calibrated", "fit_version", "assumptions"]
CURVE_TABLE = ["n_gpus", "global_batch_seqs", "tp", "pp", "dp", "vpp", "micro_batch", "sharding", "recompute",
               "tokens_per_s_per_gpu", "mfu", "time_to_train_days", "cost_usd", "parallel_efficiency",
               "marginal_efficiency"]
FRONTIER_KEYS = ["max_training_flop", "n_gpus", "tp", "pp", "dp", "ep", "cp", "utilization", "params", "tokens",
                 "cost_usd"]
BREAKDOWN_KEYS = ["step_time_s", "compute_s", "tp_comm_s", "pp_bubble_s", "pp_comm_s", "dp_comm_exposed_s",
                  "cp_comm_s", "ep_comm_s", "optimizer_s"]


def _hardware(cfg: Settings, gpu: str, *, scaleup_size: Optional[int] = None, scaleup_gbps: Optional[float] = None,
              scaleout_gbps: Optional[float] = None, memory_gb: Optional[float] = None) -> dict:
    """The resolved hardware row, with the network tiers (and memory) overridden where a flag gives them."""
    import polars as pl

    from models.hardware import resolve_hardware
    from pipeline import catalog

    check_network(scaleup_size, scaleup_gbps, scaleout_gbps, memory_gb)
    try:
        hw_row = catalog.find_hardware(cfg.measurements, gpu)
    except catalog.UnknownName as err:
        raise InputError(str(err)) from None
    hw_row = dict(hw_row)
    if memory_gb is not None:
        hw_row["memory_gb"] = float(memory_gb)
    if scaleup_gbps is not None:
        hw_row["intra_node_bw_gbps"] = float(scaleup_gbps)
    if scaleout_gbps is not None:
        hw_row["inter_node_bw_gbps"] = float(scaleout_gbps)
    hw = resolve_hardware(pl.DataFrame([hw_row]), strict=False).row(0, named=True)
    if hw.get("hardware_error"):
        err = InputError(f"--gpu {gpu}: {hw['hardware_error']}")
        err.exit_code = 1
        raise err
    if scaleup_size is not None:
        hw["scaleup_size"] = float(scaleup_size)
        hw["gpus_per_node_typical"] = int(scaleup_size)
    return hw


def _overrides(scaleup_size, scaleup_gbps, scaleout_gbps, memory_gb=None) -> str:
    parts = [f"{k} {v:g}" for k, v in (("scale-up size", scaleup_size), ("scale-up GB/s", scaleup_gbps),
                                       ("scale-out GB/s", scaleout_gbps), ("memory GB", memory_gb)) if v is not None]
    return f" (overridden: {', '.join(parts)})" if parts else ""


def _physics(cfg: Settings, assumptions: str, residual: bool = True, analytical_only: bool = False):
    """(residual hook, model, note) under an assumption set, from the promoted fit (`models.predictor`, the one
    prediction function): 'realistic' is the fit (``residual=False``: the frontier ranks and reports with the
    model directly, no post-hoc hook); 'ideal' is Epoch AI's ideal conditions on the fit's physics, no residual.
    Without a fit the priors answer."""
    from models.assumptions import check_assumptions, params_for
    from models.curves import calibration_from_bundle
    from models.params import DEFAULT
    from models.predictor import Predictor
    from pipeline.calibrated import promoted_fit

    try:
        check_assumptions(assumptions)
    except ValueError as err:
        raise InputError(f"--{err}") from None
    bundle = None if analytical_only else promoted_fit(cfg)
    if analytical_only:
        if assumptions == "ideal":
            return None, params_for("ideal", DEFAULT), "ideal: Epoch AI's ideal conditions on the priors"
        return None, DEFAULT, "analytical: the prior parameters (--analytical-only)"
    if bundle is None:
        if assumptions == "ideal":
            return None, params_for("ideal", DEFAULT), "ideal: Epoch AI's ideal conditions on the priors"
        return None, DEFAULT, "realistic: analytical only: no promoted calibration fit"
    if assumptions == "ideal":
        return None, Predictor(bundle, "ideal"), (f"ideal: Epoch AI's ideal conditions on fit {bundle.version}'s "
                                                  "physics (no residual)")
    if not residual:
        return None, Predictor(bundle), f"realistic: calibrated with fit {bundle.version}"
    hook, params, note = calibration_from_bundle(bundle)
    return hook, params, f"realistic: {note}"


def _check_rule(batch_rule: str) -> None:
    from models.curves import BATCH_RULES

    if batch_rule not in BATCH_RULES:
        raise InputError(f"--batch-rule must be one of {', '.join(BATCH_RULES)}, got '{batch_rule}'")


def _clean(v):
    return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v


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
) -> None:
    """A scaling curve: the best layout at each cluster size N (one node up to --max-gpus, powers of two and the
    node-aligned sizes between), with throughput, MFU, time-to-train, cost, parallel and marginal efficiency,
    and the inflection point (smallest N whose marginal efficiency < --threshold) with a USL fit.

    Example: `stepcast curve --model gpt3-175b --gpu h100-sxm5-80gb --policy strong --tokens 300e9`
    """
    if fmt not in ("table", "csv", "json"):
        _fail(f"--format must be table, csv or json, got '{fmt}'")
    try:
        doc, out, header = curve_result(settings(), model=model, arch_file=arch_file, gpu=gpu, policy=policy,
                                        tokens=tokens, seq_len=seq_len, global_batch=global_batch,
                                        per_gpu_batch=per_gpu_batch, max_gpus=max_gpus, threshold=threshold,
                                        dtype=dtype, assumptions=assumptions, batch_rule=batch_rule,
                                        scaleup_size=scaleup_size, scaleup_gbps=scaleup_gbps,
                                        scaleout_gbps=scaleout_gbps, analytical_only=analytical_only)
    except InputError as err:
        _fail(str(err), err.exit_code)
    if fmt == "json":
        print(json.dumps(doc, indent=2, default=str))
        return
    from pipeline.output import render

    print(header, file=sys.stderr)
    if fmt == "csv":
        render(out, "csv")
    else:
        render(out.filter(out["feasible"]).select(CURVE_TABLE), "table", title=header)
    print(f"inflection: {doc['explanation']}", file=sys.stderr if fmt == "csv" else sys.stdout)


def curve_result(cfg: Settings, *, model: Optional[str] = None, arch_file: Optional[Path] = None,
                 arch: Optional[dict] = None, gpu: str, policy: str = "strong", tokens: Optional[float] = None,
                 seq_len: int = 2048, global_batch: Optional[int] = None, per_gpu_batch: float = 1.0,
                 max_gpus: int = 16384, threshold: float = 0.5, dtype: Optional[str] = None,
                 assumptions: str = "realistic", batch_rule: str = "deepseek", scaleup_size: Optional[int] = None,
                 scaleup_gbps: Optional[float] = None, scaleout_gbps: Optional[float] = None,
                 analytical_only: bool = False):
    """`stepcast curve`'s answer (the CLI and `stepcast serve` call this): (the document `--format json` prints,
    the curve's rows, the header line). The architecture is `arch` when given, else `--arch-file` or `--model`.
    Bad input raises InputError with the message the CLI prints."""
    import polars as pl

    from models.curves import POLICIES, _arch_params, default_dtype, explain, inflection, round_batch, scaling_curve
    from pipeline import catalog

    if policy not in POLICIES:
        raise InputError(f"--policy must be one of {', '.join(POLICIES)}, got '{policy}'")
    if tokens is not None and not (tokens > 0 and math.isfinite(tokens)):
        raise InputError(f"--tokens must be a positive number of tokens, got {tokens}")
    if not 0 < threshold <= 1:
        raise InputError(f"--threshold must be in (0, 1], got {threshold}")
    if policy != "strong" and per_gpu_batch <= 0:
        raise InputError(f"--per-gpu-batch must be > 0 for the {policy} policy, got {per_gpu_batch}")
    if dtype is not None and dtype not in ("bf16", "fp16", "fp8", "fp8-cs", "mxfp8", "nvfp4", "fp32", "tf32"):
        raise InputError(f"--dtype must be one of bf16, fp16, fp8, fp8-cs, mxfp8, nvfp4, fp32, tf32, got '{dtype}'")
    if arch is None:
        try:
            arch = catalog.resolve_architecture(model, arch_file, measurements=cfg.measurements)
        except catalog.UnknownName as err:
            raise InputError(str(err)) from None
    _check_rule(batch_rule)
    hook, params, note = _physics(cfg, assumptions, analytical_only=analytical_only)
    hw = _hardware(cfg, gpu, scaleup_size=scaleup_size, scaleup_gbps=scaleup_gbps, scaleout_gbps=scaleout_gbps)
    n_params = _arch_params(arch)
    tokens = tokens if tokens is not None else 20.0 * n_params
    batch = global_batch or round_batch(4 * 2**20 / seq_len)
    try:
        c = scaling_curve(arch, hw, policy, seq_len=seq_len, tokens=tokens, global_batch_seqs=batch,
                          per_gpu_batch_seqs=per_gpu_batch, n_max=max_gpus, dtype=dtype or default_dtype(hw),
                          params=params, usd_per_gpu_hour=hw.get("cloud_usd_per_hour"), calibrate=hook,
                          batch_rule=batch_rule)
    except ValueError as err:
        raise InputError(str(err)) from None
    rec = inflection(c, threshold)
    price = hw.get("cloud_usd_per_hour")
    c = c.with_columns(pl.lit(assumptions).alias("assumptions"))
    header = (f"{arch['id']} on {gpu}{_overrides(scaleup_size, scaleup_gbps, scaleout_gbps)}, {assumptions} "
              f"assumptions, {policy} scaling, seq {seq_len}, {tokens:.3g} tokens"
              + (f", batch {batch} seqs" if policy == "strong" else f", {per_gpu_batch:g} seq/GPU")
              + f"; {note}; cost: " + (f"${price}/GPU-h (hardware.cloud_usd_per_hour)" if price else
                                       "none (no price for this accelerator)"))
    out = c.select([x for x in CURVE_COLUMNS if x in c.columns])
    doc = {"model": arch["id"], "gpu": gpu, "assumptions": assumptions, "batch_rule": batch_rule,
           "policy": policy, "seq_len": seq_len, "tokens": tokens,
           "calibration": note, "inflection": {k: _clean(v) for k, v in rec.items()},
           "explanation": explain(rec),
           "points": [{k: _clean(v) for k, v in r.items()} for r in out.iter_rows(named=True)]}
    return doc, out, header


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
    memory_gb: Optional[float] = typer.Option(None, "--memory-gb", help="Memory per accelerator, GB (overrides the "
                                                                         "hardware row)."),
) -> None:
    """The largest training compute (Chinchilla-optimal dense model, tokens = 20 x params) that one accelerator
    type trains within --months while its best layout keeps utilization >= --min-utilization x its best: the
    first crossing below that threshold, sweeping 1e16 to 1e32 FLOP and up to 1e9 accelerators.

    Example: `stepcast frontier --gpu h100-sxm5-80gb --months 3 --min-utilization 0.8 --assumptions ideal --table`
    """
    if fmt not in ("table", "json"):
        _fail(f"--format must be table or json, got '{fmt}'")
    try:
        result, sweep, title = frontier_result(settings(), gpu=gpu, months=months, min_utilization=min_utilization,
                                               dtype=dtype, analytical_only=analytical_only, assumptions=assumptions,
                                               batch_rule=batch_rule, scaleup_size=scaleup_size,
                                               scaleup_gbps=scaleup_gbps, scaleout_gbps=scaleout_gbps,
                                               memory_gb=memory_gb)
    except InputError as err:
        _fail(str(err), err.exit_code)
    if result.get("found") is False:
        if fmt == "json" and table:
            print(json.dumps({k: v for k, v in result.items() if k != "error"}, indent=2, default=str))
        elif table:
            _print_levels(sweep, title)
        print(f"error: {result['error']}", file=sys.stderr)
        raise typer.Exit(1)
    if fmt == "json":
        out = dict(result)
        if not table:
            out.pop("levels")
        print(json.dumps(out, indent=2, default=str))
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


def frontier_result(cfg: Settings, *, gpu: str, months: float = 3.0, min_utilization: float = 0.8,
                    dtype: Optional[str] = None, analytical_only: bool = False, assumptions: str = "realistic",
                    batch_rule: str = "deepseek", scaleup_size: Optional[int] = None,
                    scaleup_gbps: Optional[float] = None, scaleout_gbps: Optional[float] = None,
                    memory_gb: Optional[float] = None):
    """`stepcast frontier`'s answer (the CLI and `stepcast serve` call this): (the document `--format json
    --table` prints, the sweep, the title). Without a trainable level the document is `found` false with the
    `reason`, and `error` the message the CLI prints. Bad input raises InputError with the CLI's message."""
    from models.curves import default_dtype
    from models.frontier import frontier_summary, frontier_sweep

    if not (months > 0 and math.isfinite(months)):
        raise InputError(f"--months must be > 0, got {months}")
    if not 0 < min_utilization <= 1:
        raise InputError(f"--min-utilization must be in (0, 1], got {min_utilization}")
    _check_rule(batch_rule)
    _, params, note = _physics(cfg, assumptions, residual=False, analytical_only=analytical_only)
    hw = _hardware(cfg, gpu, scaleup_size=scaleup_size, scaleup_gbps=scaleup_gbps, scaleout_gbps=scaleout_gbps,
                   memory_gb=memory_gb)
    dt = dtype or default_dtype(hw)
    sweep = frontier_sweep(hw, months, params=params, dtype=dt, usd_per_gpu_hour=hw.get("cloud_usd_per_hour"),
                           assumptions=assumptions, batch_rule=batch_rule)
    s = frontier_summary(sweep, min_utilization)
    over = _overrides(scaleup_size, scaleup_gbps, scaleout_gbps, memory_gb)
    title = (f"frontier of {gpu}{over}: {assumptions} assumptions, {months:g} months, >= {min_utilization:g} x best "
             f"utilization, {batch_rule} batch rule ({note})")
    levels = [{k: _clean(v) for k, v in r.items()} for r in sweep.select(
        [c for c in LEVEL_COLUMNS if c in sweep.columns]).iter_rows(named=True)]
    if not s["found"]:
        return ({"found": False, "reason": s["reason"], "assumptions": assumptions, "levels": levels,
                 "error": f"no compute level is trainable on {gpu} within {months:g} months ({assumptions} "
                          f"assumptions): {s['reason']}"}, sweep, title)
    result = {"max_training_flop": s["training_flop"], "n_gpus": s["n_gpus"], "tp": s["tp"], "pp": s["pp"],
              "dp": s["dp"], "ep": s["ep"], "cp": s["cp"], "utilization": s["utilization"], "params": s["params"],
              "tokens": s["tokens"], "cost_usd": _clean(s["cost_usd"]), "assumptions": assumptions,
              "batch_rule": batch_rule, "binding": s["binding"], "crossing_flop": s["crossing_flop"],
              "ended_by": s["ended_by"], "cost_basis": s["cost_basis"],
              "latency_wall_days": s["latency_wall_days"],
              "breakdown": {k: s[k] for k in BREAKDOWN_KEYS},
              "layout": {k: s[k] for k in ("vpp", "micro_batch", "sharding", "recompute", "global_batch_seqs")},
              "model": {k: s[k] for k in ("arch_id", "d_model", "n_layers", "n_heads", "seq_len")},
              "gpu": gpu, "network": {"scaleup_size": hw.get("scaleup_size"),
                                      "scaleup_gbps": hw.get("intra_node_bw_gbps"),
                                      "scaleout_gbps": hw.get("inter_node_bw_gbps"), "memory_gb": hw.get("memory_gb")},
              "dtype": dt, "months": months, "min_utilization": min_utilization,
              "best_utilization": s["best_utilization"], "best_utilization_flop": s["best_utilization_flop"],
              "utilization_threshold": s["utilization_threshold"],
              "time_to_train_days": s["time_to_train_days"], "usd_per_gpu_hour": _clean(s["usd_per_gpu_hour"]),
              "launch_price_usd": _clean(s["launch_price_usd"]), "model_flop": s["model_flop"],
              "calibration": note,
              "training_flop_convention": "6 x params x tokens (Chinchilla); utilization = MFU (stepcast FLOPs)"}
    result = {k: _clean(v) for k, v in result.items()}
    result["levels"] = levels
    return result, sweep, title


LEVEL_COLUMNS = ["assumptions", "training_flop", "params", "n_gpus", "tp", "pp", "dp", "cp", "vpp", "micro_batch",
                 "sharding", "recompute", "global_batch_seqs", "utilization", "time_to_train_days",
                 "latency_wall_days", "feasible", "binding", "reason", "cost_usd"]


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
