"""`stepcast search`: every valid layout for a model on N accelerators, infeasible ones dropped, best first."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from pipeline import api
from pipeline.cli import (ANALYTICAL_HELP, ASSUMPTIONS_HELP, OVERSUBSCRIPTION_HELP, POD_SIZE_HELP,
                          SCALEOUT_GBPS_HELP, SCALEUP_GBPS_HELP, SCALEUP_SIZE_HELP, _fail, app, settings)

TP_MODE_FIX_HELP = "Fix the tensor-parallel form: 1d or 2d [default: both for tp >= 4, the search chooses]."

SEARCH_COLUMNS = api.SEARCH_COLUMNS
TABLE_COLUMNS = ["rank", "tp", "tp_mode", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "sharding", "recompute",
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
    tp_mode: Optional[str] = typer.Option(None, "--tp-mode", help=TP_MODE_FIX_HELP),
    pp: Optional[int] = typer.Option(None, "--pp", min=1, help="Fix the pipeline-parallel degree."),
    dp: Optional[int] = typer.Option(None, "--dp", min=1, help="Fix the data-parallel degree."),
    cp: Optional[int] = typer.Option(None, "--cp", min=1, help="Fix the context-parallel degree."),
    ep: Optional[int] = typer.Option(None, "--ep", min=1, help="Fix the expert-parallel degree."),
    etp: Optional[int] = typer.Option(None, "--etp", min=1, help="Fix the expert tensor-parallel degree of the MoE "
                                      "layers [default: searched over 1 and tp]."),
    capacity_factor: Optional[float] = typer.Option(None, "--capacity-factor", min=0.001,
                                                    help="MoE expert capacity factor [default: dropless]."),
    vpp: Optional[int] = typer.Option(None, "--vpp", min=1, help="Fix the interleaving (chunks per stage)."),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", min=1, help="Fix the micro-batch."),
    sharding: Optional[str] = typer.Option(None, "--sharding", help="Fix: none, zero1, zero2, zero3, fsdp, hsdp."),
    recompute: Optional[str] = typer.Option(None, "--recompute", help="Fix: none, selective, full."),
    assumptions: str = typer.Option("realistic", "--assumptions", help=ASSUMPTIONS_HELP),
    analytical_only: bool = typer.Option(False, "--analytical-only", help=ANALYTICAL_HELP),
    scaleup_size: Optional[int] = typer.Option(None, "--scaleup-size", help=SCALEUP_SIZE_HELP),
    scaleup_gbps: Optional[float] = typer.Option(None, "--scaleup-gbps", help=SCALEUP_GBPS_HELP),
    scaleout_gbps: Optional[float] = typer.Option(None, "--scaleout-gbps", help=SCALEOUT_GBPS_HELP),
    oversubscription: Optional[float] = typer.Option(None, "--oversubscription", help=OVERSUBSCRIPTION_HELP),
    pod_size: Optional[int] = typer.Option(None, "--pod-size", help=POD_SIZE_HELP),
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
    from pipeline.output import render

    if fmt not in ("table", "csv", "json"):
        _fail(f"--format must be table, csv or json, got '{fmt}'")
    try:
        result, n_evaluated, arch, gpu = api.layout_search(
            settings(), model=model, layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads, ffn_dim=ffn_dim,
            vocab=vocab, activation=activation, gpu=gpu, arch_file=arch_file, hardware_file=hardware_file, gpus=gpus,
            global_batch=global_batch, seq_len=seq_len, dtype=dtype, top=top, rank_by=rank_by, tp=tp, pp=pp, dp=dp,
            cp=cp, ep=ep, vpp=vpp, micro_batch=micro_batch, sharding=sharding, recompute=recompute,
            tp_mode=tp_mode, assumptions=assumptions, analytical_only=analytical_only, scaleup_size=scaleup_size,
            scaleup_gbps=scaleup_gbps, scaleout_gbps=scaleout_gbps, oversubscription=oversubscription,
            pod_size=pod_size, etp=etp, capacity_factor=capacity_factor)
    except api.NoResult as err:
        print(str(err), file=sys.stderr)
        raise typer.Exit(1)
    except api.InputError as err:
        _fail(str(err), err.exit_code)
    elapsed = time.perf_counter() - start
    title = (f"{arch['id']} on {gpus} x {gpu}, batch {global_batch} x {seq_len}: best {result.height} of "
             f"{n_evaluated:,} layouts ({elapsed:.2f} s) — {api.title_of('search', result).split(' — ', 1)[-1]}"
             + api.overrides_note(scaleup_size, scaleup_gbps, scaleout_gbps, None, oversubscription, pod_size))
    if fmt == "table":
        render(result, fmt, out, title=title, table_columns=TABLE_COLUMNS)
    else:
        print(title, file=sys.stderr)
        render(result, fmt, out)
