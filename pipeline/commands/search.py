"""`stepcast search`: every valid layout for a model on N accelerators, infeasible ones dropped, best first."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from pipeline.cli import (ANALYTICAL_HELP, ASSUMPTIONS_HELP, SCALEOUT_GBPS_HELP, SCALEUP_GBPS_HELP,
                          SCALEUP_SIZE_HELP, _fail, app, settings)

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
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Accelerator id or name, e.g. a100-sxm4-80gb."),
    arch_file: Optional[Path] = typer.Option(None, "--arch-file", metavar="PATH",
                                             help="Architecture from a file instead of --model: a row of the "
                                                  "architectures schema (CSV/JSON) or a Hugging Face config.json."),
    hardware_file: Optional[Path] = typer.Option(None, "--hardware-file", metavar="PATH",
                                                 help="Accelerator from a file instead of --gpu: a row of the "
                                                      "hardware_specs schema (CSV/JSON)."),
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
    assumptions: str = typer.Option("realistic", "--assumptions", help=ASSUMPTIONS_HELP),
    analytical_only: bool = typer.Option(False, "--analytical-only", help=ANALYTICAL_HELP),
    scaleup_size: Optional[int] = typer.Option(None, "--scaleup-size", help=SCALEUP_SIZE_HELP),
    scaleup_gbps: Optional[float] = typer.Option(None, "--scaleup-gbps", help=SCALEUP_GBPS_HELP),
    scaleout_gbps: Optional[float] = typer.Option(None, "--scaleout-gbps", help=SCALEOUT_GBPS_HELP),
    intervals: bool = typer.Option(True, "--intervals/--no-intervals", hidden=True,
                                   help="Kept for scripts: the interval is always part of the prediction."),
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
        if model or arch_file:
            arch = catalog.resolve_architecture(model, arch_file, measurements=cfg.measurements)
        else:
            missing = [f for f, v in (("--layers", layers), ("--d-model", d_model), ("--heads", heads)) if v is None]
            if missing:
                _fail(f"give --model ID, --arch-file PATH or the architecture flags ({', '.join(missing)} missing)")
            arch = dict(id="custom", n_layers=layers, d_model=d_model, n_heads=heads, n_kv_heads=kv_heads or heads,
                        ffn_dim=ffn_dim or 4 * d_model, vocab=vocab, activation=activation, n_experts=0, top_k=0,
                        tied_embeddings=False)
        hw_row = catalog.resolve_hardware_row(gpu, hardware_file, measurements=cfg.measurements)
    except catalog.UnknownName as err:
        _fail(str(err))
    gpu = gpu or hw_row.get("id")
    fixed = {k: v for k, v in dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, micro_batch=micro_batch,
                                   sharding=sharding, recompute=recompute).items() if v is not None}
    from pipeline import api

    try:
        overrides = api.network_overrides(scaleup_size, scaleup_gbps, scaleout_gbps)
        result, n_evaluated, _ = api.search_layouts(cfg, arch=arch, hw_row=hw_row, gpus=gpus, global_batch=global_batch,
                                                    seq_len=seq_len, fixed=fixed, dtype=dtype, top=top,
                                                    rank_by=rank_by, analytical_only=analytical_only,
                                                    assumptions=assumptions, hw_overrides=overrides)
    except api.InputError as err:
        _fail(str(err))
    if result.height == 0:
        print(no_layout_message(arch["id"], gpu, gpus, global_batch, seq_len, fixed, n_evaluated), file=sys.stderr)
        raise typer.Exit(1)
    result = ranked(result)
    elapsed = time.perf_counter() - start
    title = (f"{arch['id']} on {gpus} x {gpu}, batch {global_batch} x {seq_len}: best {result.height} of "
             f"{n_evaluated:,} layouts ({elapsed:.2f} s) — {api.title_of('search', result).split(' — ', 1)[-1]}")
    if fmt == "table":
        render(result, fmt, out, title=title, table_columns=TABLE_COLUMNS)
    else:
        print(title, file=sys.stderr)
        render(result, fmt, out)


def ranked(result):
    """The layouts as `stepcast search` prints them (and `stepcast serve` answers): a 1-based `rank`, then
    SEARCH_COLUMNS, then the rest."""
    result = result.with_row_index("rank", offset=1)
    extra = [c for c in result.columns if c not in SEARCH_COLUMNS]
    return result.select([c for c in SEARCH_COLUMNS if c in result.columns] + extra)


def no_layout_message(arch_id: str, gpu: str, gpus: int, global_batch: int, seq_len: int, fixed: dict,
                      n_evaluated: int) -> str:
    return (f"no feasible layout among {n_evaluated:,} evaluated for {arch_id} on {gpus} x {gpu} "
            f"(batch {global_batch} x {seq_len}{', fixed ' + str(fixed) if fixed else ''}). Try more GPUs, a "
            f"smaller micro-batch, recompute, or sharding.")
