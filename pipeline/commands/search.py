"""`stepcast search`: every valid layout for a model on N accelerators, infeasible ones dropped, best first."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from pipeline.cli import _fail, app, settings

SEARCH_COLUMNS = ["rank", "tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "sharding", "recompute",
                  "sequence_parallel", "step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu",
                  "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "mfu", "memory_gb_per_gpu", "fit_version",
                  "compute_s", "tp_comm_s", "pp_bubble_s", "pp_comm_s", "dp_comm_exposed_s", "cp_comm_s",
                  "ep_comm_s", "optimizer_s"]
TABLE_COLUMNS = ["rank", "tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "sharding", "recompute",
                 "step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu", "mfu", "memory_gb_per_gpu"]


@app.command()
def search(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Architecture id, e.g. gpt3-175b."),
    layers: Optional[int] = typer.Option(None, "--layers", min=1, help="Architecture flags instead of --model."),
    d_model: Optional[int] = typer.Option(None, "--d-model", min=1),
    heads: Optional[int] = typer.Option(None, "--heads", min=1),
    kv_heads: Optional[int] = typer.Option(None, "--kv-heads", min=1, help="Default: --heads."),
    ffn_dim: Optional[int] = typer.Option(None, "--ffn-dim", min=1, help="Default: 4 x d_model."),
    vocab: int = typer.Option(51200, "--vocab", min=1),
    activation: str = typer.Option("gelu", "--activation", help="gelu or swiglu."),
    gpu: str = typer.Option(..., "--gpu", help="Hardware id, e.g. a100-sxm4-80gb."),
    gpus: int = typer.Option(..., "--gpus", "-n", min=1, help="Accelerators (N)."),
    global_batch: int = typer.Option(..., "--global-batch", "-b", min=1, help="Sequences per step."),
    seq_len: int = typer.Option(..., "--seq-len", "-s", min=1, help="Tokens per sequence."),
    dtype: str = typer.Option("bf16", "--dtype", help="Precision of the matmuls."),
    top: int = typer.Option(10, "--top", "-k", min=1, help="How many layouts to show."),
    rank_by: str = typer.Option("throughput", "--rank-by", help="throughput, or cost (GPU-time per token)."),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, help="Fix the tensor-parallel degree."),
    pp: Optional[int] = typer.Option(None, "--pp", min=1, help="Fix the pipeline-parallel degree."),
    dp: Optional[int] = typer.Option(None, "--dp", min=1, help="Fix the data-parallel degree."),
    cp: Optional[int] = typer.Option(None, "--cp", min=1, help="Fix the context-parallel degree."),
    ep: Optional[int] = typer.Option(None, "--ep", min=1, help="Fix the expert-parallel degree."),
    vpp: Optional[int] = typer.Option(None, "--vpp", min=1, help="Fix the interleaving (chunks per stage)."),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", min=1, help="Fix the micro-batch."),
    sharding: Optional[str] = typer.Option(None, "--sharding", help="Fix: none, zero1, zero2, zero3, fsdp, hsdp."),
    recompute: Optional[str] = typer.Option(None, "--recompute", help="Fix: none, selective, full."),
    analytical_only: bool = typer.Option(False, "--analytical-only",
                                         help="Prior physical parameters (default: the promoted fit's fitted ones)."),
    intervals: bool = typer.Option(False, "--intervals",
                                   help="Add the promoted fit's residual correction and 90% interval to the top "
                                        "layouts (loads scikit-learn: slower start-up)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the result to this file."),
) -> None:
    """Best feasible layouts (tp, pp, dp, cp, ep, interleave, micro-batch, sharding, recompute) at N accelerators.

    Every valid layout is predicted; layouts that do not fit in memory are dropped; the rest are ranked by
    throughput (or by cost). Fix any dimension with its flag.

    Examples:

    `stepcast search --model gpt3-175b --gpu a100-sxm4-80gb --gpus 1024 --global-batch 1536 --seq-len 2048`

    `stepcast search --model llama3-8b --gpu h100-sxm5-80gb --gpus 64 -b 256 -s 8192 --tp 1 --pp 1 --sharding fsdp`
    """
    start = time.perf_counter()
    import polars as pl

    from models.hardware import resolve_hardware
    from models.search import search as run_search
    from pipeline import catalog
    from pipeline.output import render

    if fmt not in ("table", "csv", "json"):
        _fail(f"--format must be table, csv or json, got '{fmt}'")
    if rank_by not in ("throughput", "cost"):
        _fail(f"--rank-by must be throughput or cost, got '{rank_by}'")
    for name, value, allowed in (("--sharding", sharding, ("none", "zero1", "zero2", "zero3", "fsdp", "hsdp")),
                                 ("--recompute", recompute, ("none", "selective", "full")),
                                 ("--activation", activation, ("gelu", "swiglu")),
                                 ("--dtype", dtype, ("bf16", "fp16", "fp8", "fp8-cs", "mxfp8", "nvfp4", "fp32",
                                                     "tf32"))):
        if value is not None and value not in allowed:
            _fail(f"{name} must be one of {', '.join(allowed)}, got '{value}'")
    cfg = settings()
    try:
        if model:
            arch = catalog.find_architecture(cfg.measurements, model)
        else:
            missing = [f for f, v in (("--layers", layers), ("--d-model", d_model), ("--heads", heads)) if v is None]
            if missing:
                _fail(f"give --model ID or the architecture flags ({', '.join(missing)} missing)")
            arch = dict(id="custom", n_layers=layers, d_model=d_model, n_heads=heads, n_kv_heads=kv_heads or heads,
                        ffn_dim=ffn_dim or 4 * d_model, vocab=vocab, activation=activation, n_experts=0, top_k=0,
                        tied_embeddings=False)
        hw_row = catalog.find_hardware(cfg.measurements, gpu)
    except catalog.UnknownName as err:
        _fail(str(err))
    hw = resolve_hardware(pl.DataFrame([hw_row]), strict=False).row(0, named=True)
    if hw.get("hardware_error"):
        _fail(f"hardware {gpu}: {hw['hardware_error']}")
    fixed = {k: v for k, v in dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, micro_batch=micro_batch,
                                   sharding=sharding, recompute=recompute).items() if v is not None}
    price = hw_row.get("cloud_usd_per_hour")
    from pipeline.calibrated import calibrate_rows, promoted_fit, promoted_params

    bundle, phys, version = None, None, None
    if intervals and not analytical_only:
        bundle = promoted_fit(cfg)  # loads scikit-learn: about 2-4 s more start-up
        if bundle is not None:
            phys, version = bundle.params_for("default"), bundle.version
    elif not analytical_only:
        phys, version = promoted_params(cfg)
    extra = {"params": phys} if phys is not None else {}
    result, n_evaluated = run_search(arch, hw, gpus, global_batch, seq_len, fixed=fixed, dtype=dtype, top_k=top,
                                     rank_by=rank_by, usd_per_gpu_hour=price, return_count=True, **extra)
    elapsed = time.perf_counter() - start
    if result.height == 0:
        print(f"no feasible layout among {n_evaluated:,} evaluated for {arch['id']} on {gpus} x {gpu} "
              f"(batch {global_batch} x {seq_len}{', fixed ' + str(fixed) if fixed else ''}). Try more GPUs, a "
              f"smaller micro-batch, recompute, or sharding.", file=sys.stderr)
        raise typer.Exit(1)
    if bundle is not None:
        cal = calibrate_rows(bundle, result.with_columns(pl.lit(gpu).alias("hardware")), arch, {gpu: hw}, seq_len,
                             global_batch, n_gpus=gpus)
        if cal is not None:
            result = result.with_columns(
                pl.col("step_time_s").alias("analytical_step_time_s"),
                *[cal[c] for c in ("step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu",
                                   "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "fit_version")],
                (pl.col("mfu") * cal["tokens_per_s_per_gpu"] / pl.col("tokens_per_s_per_gpu")).alias("mfu"),
            )
            if rank_by == "throughput":  # the correction can reorder the analytical top K
                result = result.sort("tokens_per_s_per_gpu", descending=True, maintain_order=True)
    result = result.with_row_index("rank", offset=1)
    extra = [c for c in result.columns if c not in SEARCH_COLUMNS]
    result = result.select([c for c in SEARCH_COLUMNS if c in result.columns] + extra)
    elapsed = time.perf_counter() - start
    if "fit_version" in result.columns and result["fit_version"][0]:
        fit_note = f"calibrated with interval, fit {result['fit_version'][0]}"
    elif version:
        result = result.with_columns(pl.lit(version).alias("fit_version"))
        fit_note = f"fitted physics of fit {version}; --intervals adds the correction and interval"
    else:
        fit_note = "analytical, prior parameters"
    title = (f"{arch['id']} on {gpus} x {gpu}, batch {global_batch} x {seq_len}: best {result.height} of "
             f"{n_evaluated:,} layouts ({elapsed:.2f} s, {fit_note})")
    if fmt == "table":
        render(result, fmt, out, title=title, table_columns=TABLE_COLUMNS)
    else:
        print(title, file=sys.stderr)
        render(result, fmt, out)
