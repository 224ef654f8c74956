"""`stepcast search`: every valid layout for a model on N accelerators, infeasible ones dropped, best first."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from pipeline.commands.common import command, computations, fail, settings
from pipeline.options import SearchOptions
from pipeline.output import FORMATS, render

TABLE_COLUMNS = ["rank", "tp", "tp_mode", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "sharding", "recompute",
                 "step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu", "mfu", "memory_gb_per_gpu"]


@command(SearchOptions)
def search(o: SearchOptions, intervals: bool, fmt: str, out: Optional[Path]) -> None:
    """Best feasible layouts (tp, pp, dp, cp, ep, interleave, micro-batch, sharding, recompute) at N accelerators.

    Every valid layout is predicted; layouts that do not fit in memory are dropped; the rest are ranked by
    throughput (or by cost). Fix any dimension with its flag.

    Examples:

    `stepcast search --model gpt3-175b --gpu a100-sxm4-80gb --gpus 1024 --global-batch 1536 --seq-len 2048`

    `stepcast search --model llama3-8b --gpu h100-sxm5-80gb --gpus 64 -b 256 -s 8192 --tp 1 --pp 1 --sharding fsdp`
    """
    api = computations()
    start = time.perf_counter()
    if fmt not in FORMATS:
        fail(f"--format must be table, csv or json, got '{fmt}'")
    try:
        result, n_evaluated, arch, gpu = api.layout_search(settings(), o)
    except api.NoResult as err:
        print(str(err), file=sys.stderr)
        raise typer.Exit(1)
    except api.InputError as err:
        fail(str(err), err.exit_code)
    elapsed = time.perf_counter() - start
    title = (f"{arch['id']} on {o.gpus} x {gpu}, batch {o.global_batch} x {o.seq_len}: best {result.height} of "
             f"{n_evaluated:,} layouts ({elapsed:.2f} s) — {api.title_of('search', result).split(' — ', 1)[-1]}"
             + api.overrides_note(o))
    if fmt == "table":
        render(result, fmt, out, title=title, table_columns=TABLE_COLUMNS)
    else:
        print(title, file=sys.stderr)
        render(result, fmt, out)
