"""`stepcast predict`: step time, throughput, MFU, memory and the breakdown of one configuration, or of every run of
a measurement file (--runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pipeline.commands.common import command, computations, console, err_console, fail, settings
from pipeline.options import PredictOptions
from pipeline.output import FORMATS, render

TABLE_COLUMNS = ["run_id", "feasible", "step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu",
                 "mfu", "memory_gb_per_gpu", "compute_s", "tp_comm_s", "pp_bubble_s", "dp_comm_exposed_s", "error"]
RUNS_TABLE_COLUMNS = ["run_id", "step_time_s", "tokens_per_s_per_gpu", "measured_tokens_per_s_per_gpu", "error_pct",
                      "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "memory_fits", "calibration_domain",
                      "error"]
#: the resolved inputs the table format prints above the result
INPUT_COLUMNS = ["model", "gpu", "n_gpus", "tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch",
                 "global_batch_seqs", "seq_len", "sharding", "recompute", "sequence_parallel", "dtype", "gpus_per_node",
                 "inter_node_bw_gbps"]


@command(PredictOptions)
def predict(o: PredictOptions, fmt: str, out: Optional[Path]) -> None:
    """Predict step time, throughput, MFU, memory and the time breakdown of one configuration.

    The promoted calibration of the store (or its snapshot) answers: fitted physical parameters inside the
    fit's domain, the residual correction and a 90% interval (`step_time_lo_s` .. `step_time_hi_s`). Every
    row says which parameters answered (`fit_version`), under which `assumptions` (with every default the
    command applied) and whether the configuration is inside the fit's domain or extrapolated
    (`calibration_domain`). The breakdown columns are scaled to the calibrated step, so they add up to it.

    Examples:

    `stepcast predict --model gpt3-175b --gpu a100-sxm4-80gb --gpus 1024 --global-batch 1536 --seq-len 2048 --tp 8 --pp 8`

    `stepcast predict --runs measurements/measured_runs.csv --format csv --out predictions.csv`

    `stepcast predict --runs rest.csv --calibrate-on my3runs.csv` (your cluster learned from three of its runs)

    `stepcast predict --model llama3-70b --gpu h100 --gpus 512 --global-batch 1024 --seq-len 8192 --tp 8 --pp 4 --vpp 5 --trace step.json` (the step's timeline, for ui.perfetto.dev)

    With `--runs`, every distinct run_id gets one row, with the measured throughput and the error beside the
    prediction when the file carries a measurement; unstated fields are inferred by documented rules (listed
    in `assumptions`); a run the memory model calls too big is still predicted (`memory_fits` false, with
    `memory_gb_per_gpu` beside `memory_capacity_gb`: the stated capacity's binary GB in decimal GB). Only
    file-level problems exit non-zero. An invalid layout (e.g. tp x pp x cp x dp != N) exits 2 with the reason.
    """
    api = computations()
    if fmt not in FORMATS:
        fail(f"--format must be table, csv or json, got '{fmt}'")
    cfg = settings()
    if o.runs is not None:
        if o.trace is not None:
            fail("--trace draws one configuration's step; not with --runs")
        try:
            result = api.run_predictions(cfg, o.runs, assumptions=o.assumptions, analytical_only=o.analytical_only,
                                         calibrate_on=o.calibrate_on, source=o.source)
        except api.InputError as err:
            fail(str(err), err.exit_code)
        render(result, fmt, out, title=api.title_of("predict --runs", result), table_columns=RUNS_TABLE_COLUMNS)
        if out is not None or fmt == "table":  # csv/json on stdout stay machine-readable alone
            err_console.print(api.runs_summary(result))
        return
    try:  # by name, or from --arch-file / --hardware-file
        result = api.prediction(cfg, o)
    except api.InputError as err:
        fail(str(err), err.exit_code)
    if fmt == "table" and out is None:
        inputs = result.select(INPUT_COLUMNS).row(0, named=True)
        console.print("inputs: " + ", ".join(f"{k}={v}" for k, v in inputs.items()))
        console.print(f"assumptions: {result['assumptions'][0]}")
        if not result["feasible"][0]:
            console.print(f"[yellow]does not fit in memory[/yellow]: {result['error'][0]}")
    render(result, fmt, out, title=api.title_of("predict", result), table_columns=TABLE_COLUMNS)
