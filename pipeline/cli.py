"""The `stepcast` command line.

Heavy imports (Dagster, scikit-learn, Altair) happen inside the commands that need them, so `stepcast predict`
and `stepcast search` start quickly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from pipeline import api
from pipeline.settings import Settings

app = typer.Typer(
    name="stepcast",
    help=(
        "Predict how long one LLM training step takes on a given cluster and parallel layout, what a run costs, "
        "and where adding accelerators stops paying off.\n\n"
        "Start with `stepcast build` (ingests the shipped measurements into the DuckDB store and publishes a "
        "read-only snapshot), then `stepcast info` to see where everything went."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


class State:
    store: Optional[Path] = None


state = State()


def settings(reports: Optional[Path] = None) -> Settings:
    return Settings.load(store=state.store, reports=reports)


@app.callback()
def main_options(
    store: Optional[Path] = typer.Option(
        None, "--store", envvar="STEPCAST_STORE", metavar="PATH",
        help="DuckDB store the writer uses (default: out/stepcast.duckdb in the project; env STEPCAST_STORE).",
    ),
) -> None:
    state.store = store


# ---------------------------------------------------------------- build

@app.command()
def build(
    reports_dir: Optional[Path] = typer.Option(None, "--reports-dir", metavar="DIR",
                                               help="Where the report site goes (default: <store folder>/site)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the summary."),
) -> None:
    """Run the main job on the embedded store: ingest, predict, checks, publish the read-only snapshot.

    Example: `stepcast build` then `duckdb out/snapshot/stepcast.duckdb -c "select count(*) from runs"`.
    """
    from pipeline.build import run_build

    cfg = settings(reports_dir)
    ok = run_build(cfg, console=console, quiet=quiet)
    raise typer.Exit(0 if ok else 1)


# ---------------------------------------------------------------- ingest

@app.command()
def ingest(
    files: list[Path] = typer.Argument(..., metavar="FILE...", help="Measurement-schema files: CSV, TSV, Parquet, JSON, JSON Lines or a Markdown table."),
    publish: bool = typer.Option(True, "--publish/--no-publish", help="Publish a fresh snapshot after a change."),
    batch_rows: int = typer.Option(250_000, "--batch-rows", min=1, metavar="N",
                                   help="Rows parsed, validated and inserted at a time when ingesting many files "
                                        "(bounds memory; the whole command is one transaction)."),
) -> None:
    """Ingest measurement files into the store (same code path as the pipeline).

    A file that cannot be read, or lacks a required column, changes nothing. Rows that fail validation go to
    `rejected_rows`; the command prints file, line, column and reason for each and exits with status 1 when
    anything was rejected. Ingesting the same file twice changes nothing; a changed file replaces its earlier
    rows. Many files are read ahead in parallel and written in batches of about `--batch-rows` rows (one
    update of `runs` per batch), all in one transaction: a failure while writing leaves the store as it was
    before the command. A progress bar shows files and rows.

    Example: `stepcast ingest my_runs.csv` or `stepcast ingest drop/*.csv`
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pipeline import store

    cfg = settings()
    failed = False
    changed = False
    try:
        lock = store.writer_lock(cfg.store)
        lock.__enter__()
    except store.StoreBusy as err:
        _fail(str(err), 1)
    con = store.connect(cfg.store)
    try:
        store.ensure_schema(con)
        if not store.table_exists(con, "hardware"):
            from pipeline.build import load_reference_tables

            load_reference_tables(con, cfg)
        show = len(files) > 1 and err_console.is_terminal
        rows = {"n": 0}
        with Progress(TextColumn("ingest"), BarColumn(), MofNCompleteColumn(), TextColumn("files"),
                      TextColumn("{task.fields[rows]:,} rows read"), TimeElapsedColumn(), console=err_console,
                      disable=not show, transient=True) as progress:
            task = progress.add_task("ingest", total=len(files), rows=0)

            def on_read(_name: str, n: int) -> None:
                rows["n"] += n
                progress.update(task, rows=rows["n"])

            def on_file(rep) -> None:
                progress.advance(task)
                nonlocal failed, changed
                if rep.error is not None:
                    failed = True
                    print(f"rejected: {rep.error}", file=sys.stderr)
                    return
                for warning in rep.warnings:
                    progress.console.print(f"[yellow]warning[/yellow] {warning}")
                changed |= rep.status != "unchanged"
                console.print(f"{rep.file}: [bold]{rep.status}[/bold] — {rep.rows_accepted} accepted, "
                              f"{rep.rows_rejected} rejected, {rep.rows_duplicate} duplicate. {rep.message}")
                if rep.rejections is not None and rep.rejections.height:
                    failed = True
                    for r in rep.rejections.iter_rows(named=True):
                        col = r["column"] or "-"
                        print(f"{r['file']}:{r['line']}: column {col} = {r['value']!r}: {r['reason']}",
                              file=sys.stderr)

            store.ingest_files(con, files, max_batch_rows=batch_rows, on_read=on_read, on_file=on_file)
    finally:
        con.close()
        lock.__exit__(None, None, None)
    if changed and publish:
        store.publish_snapshot(cfg.store, cfg.snapshot)
        console.print(f"snapshot published: {cfg.snapshot}")
    raise typer.Exit(1 if failed else 0)


# ---------------------------------------------------------------- predict

PREDICT_COLUMNS = api.PREDICT_COLUMNS
TABLE_COLUMNS = ["run_id", "feasible", "step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu",
                 "mfu", "memory_gb_per_gpu", "compute_s", "tp_comm_s", "pp_bubble_s", "dp_comm_exposed_s", "error"]
RUNS_TABLE_COLUMNS = ["run_id", "step_time_s", "tokens_per_s_per_gpu", "measured_tokens_per_s_per_gpu", "error_pct",
                      "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "memory_fits", "calibration_domain",
                      "error"]
FORMAT_HELP = "Output: table, csv or json."
ASSUMPTIONS_HELP = ("realistic (the calibrated model: fitted parameters, residual correction, 90% interval) or "
                    "ideal (Epoch AI's ideal conditions: no host overhead or GEMM-size ramp, perfect overlap, no "
                    "memory allowance; latency stays).")
TP_MODE_HELP = ("Tensor-parallel form: 1d (Megatron: weights split along one dimension) or 2d (d_model and d_ff "
                "split over an r x c grid of the tp ranks, r the largest divisor of tp <= sqrt(tp); models.physics.tp2d).")
ANALYTICAL_HELP = "The analytical model with the prior parameters: no fit, no correction, no interval."
# the network-tier flags (predict, search, curve, frontier, plan) override the accelerator's row
SCALEUP_SIZE_HELP = "Accelerators per scale-up domain."
SCALEUP_GBPS_HELP = "Scale-up bandwidth per accelerator, GB/s per direction."
SCALEOUT_GBPS_HELP = "Scale-out (network) bandwidth per accelerator, GB/s per direction."
OVERSUBSCRIPTION_HELP = ("Oversubscription of the network tier above the pods, a ratio >= 1 [default: 1, "
                         "non-blocking]: 3 = a 3:1 oversubscribed fat-tree: traffic crossing the pod tier gets 1/3 "
                         "of the scale-out bandwidth. Without --pod-size, all traffic leaving a scale-up domain "
                         "crosses it.")
POD_SIZE_HELP = ("Accelerators per pod, below the oversubscribed tier (at least the scale-up domain) [default: no "
                 "pod boundary]. A parallel group whose ranks span pods pays the oversubscription; a job within "
                 "one pod never does.")


def _fail(message: str, code: int = 2) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


@app.command()
def predict(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Architecture id, name or alias, e.g. "
                                        "llama3-70b, DeepSeek-V3 (`stepcast list models`)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Hardware id or name, e.g. h100-sxm5-80gb, H100 "
                                      "(`stepcast list gpus`)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", "-n", min=1, help="Accelerators in the job (N)."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", "-b", min=1, help="Sequences per step."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", "-s", min=1, help="Tokens per sequence."),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", min=1,
                                              help="Sequences per micro-batch [default: 1]."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree."),
    tp_mode: str = typer.Option("1d", "--tp-mode", help=TP_MODE_HELP),
    pp: int = typer.Option(1, "--pp", min=1, help="Pipeline-parallel degree."),
    dp: Optional[int] = typer.Option(None, "--dp", min=1, help="Data-parallel degree [default: N / (tp x pp x cp)]."),
    cp: int = typer.Option(1, "--cp", min=1, help="Context-parallel degree."),
    ep: int = typer.Option(1, "--ep", min=1, help="Expert-parallel degree (carved out of dp, or folded over "
                           "tp x cp x dp with a smaller --etp)."),
    etp: Optional[int] = typer.Option(None, "--etp", min=1, help="Expert tensor-parallel degree of the MoE layers "
                                      "(Megatron-Core --expert-tensor-parallel-size; etp x ep must divide tp x cp x dp) "
                                      "[default: tp, or the largest that folds]."),
    capacity_factor: Optional[float] = typer.Option(None, "--capacity-factor", min=0.001,
                                                    help="MoE expert capacity factor: an expert keeps at most cf x "
                                                         "the mean tokens, the rest are dropped [default: dropless]."),
    vpp: Optional[int] = typer.Option(None, "--vpp", min=1, help="Interleaved pipeline chunks per stage (default 1 = "
                                      "plain 1F1B, listed in assumptions at pp > 1)."),
    sharding: Optional[str] = typer.Option(None, "--sharding",
                                           help="none, zero1, zero2, zero3, fsdp or hsdp [default: zero1]."),
    recompute: Optional[str] = typer.Option(
        None, "--recompute", help="none, selective or full [default: selective], or a MaxText remat_policy "
                                  "(minimal, save_qkv_proj, qkv_proj_offloaded, ...: selective with its save list)."),
    sequence_parallel: Optional[bool] = typer.Option(None, "--sequence-parallel/--no-sequence-parallel",
                                                     help="Megatron sequence parallelism [default: on when tp > 1]."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16, fp8, fp8-cs, mxfp8, nvfp4, fp32 or tf32."),
    layers_16bit: Optional[int] = typer.Option(
        None, "--layers-16bit", min=0, metavar="N",
        help="Layers (blocks, for hybrids) at the end of the stack that a low-precision recipe keeps in BF16 "
             "(Megatron-Core --num-layers-at-end-in-bf16) [default: the model's published recipe, e.g. 14 for "
             "Nemotron 3 Super in NVFP4, else 0]."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=1,
                                                help="Scale-up domain used [default: the accelerator's]."),
    inter_node_gbps: Optional[float] = typer.Option(
        None, "--inter-node-gbps", min=0.001, metavar="GB/S",
        help="Your cluster's scale-out bandwidth per accelerator, GB/s one way [default: the accelerator's typical "
             "deployment; e.g. 12.5 for 4 x 200 Gb/s NICs per 8-GPU node]."),
    scaleup_size: Optional[int] = typer.Option(None, "--scaleup-size", help=SCALEUP_SIZE_HELP + " Same as "
                                               "--gpus-per-node (give one)."),
    scaleup_gbps: Optional[float] = typer.Option(None, "--scaleup-gbps", help=SCALEUP_GBPS_HELP),
    scaleout_gbps: Optional[float] = typer.Option(None, "--scaleout-gbps", help=SCALEOUT_GBPS_HELP + " Same as "
                                                  "--inter-node-gbps (give one)."),
    oversubscription: Optional[float] = typer.Option(None, "--oversubscription", help=OVERSUBSCRIPTION_HELP),
    pod_size: Optional[int] = typer.Option(None, "--pod-size", help=POD_SIZE_HELP),
    arch_file: Optional[Path] = typer.Option(
        None, "--arch-file", metavar="PATH", help="Architecture from a file instead of --model: a row of the "
        "architectures.csv schema (CSV/JSON) or a Hugging Face config.json."),
    hardware_file: Optional[Path] = typer.Option(
        None, "--hardware-file", metavar="PATH", help="Accelerator from a file instead of --gpu: a row of the "
        "hardware_specs.csv schema (CSV/JSON)."),
    runs: Optional[Path] = typer.Option(None, "--runs", metavar="FILE",
                                        help="Predict every run of a measurement-schema file instead (CSV, TSV, Parquet, JSON, JSON Lines or a Markdown table)."),
    assumptions: str = typer.Option("realistic", "--assumptions", help=ASSUMPTIONS_HELP),
    analytical_only: bool = typer.Option(False, "--analytical-only", help=ANALYTICAL_HELP),
    fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP),
    out: Optional[Path] = typer.Option(None, "--out", "-o", metavar="FILE", help="Write the result to this file."),
) -> None:
    """Predict step time, throughput, MFU, memory and the time breakdown of one configuration.

    The promoted calibration of the store (or its snapshot) answers: fitted physical parameters inside the
    fit's domain, the residual correction and a 90% interval (`step_time_lo_s` .. `step_time_hi_s`). Every
    row says which parameters answered (`fit_version`), under which `assumptions` (with every default the
    command applied) and whether the configuration is inside the fit's domain or extrapolated
    (`calibration_domain`). The breakdown columns are scaled to the calibrated step, so they add up to it.

    Examples:

    `stepcast predict --model gpt3-175b --gpu a100-sxm4-80gb --gpus 1024 --global-batch 1536 --seq-len 2048 --tp 8 --pp 8`

    `stepcast predict --runs measurements/measured_runs.csv --format csv --out predictions.csv`

    With `--runs`, every distinct run_id gets one row, with the measured throughput and the error beside the
    prediction when the file carries a measurement; unstated fields are inferred by documented rules (listed
    in `assumptions`); a run the memory model calls too big is still predicted (`memory_fits` false, with
    `memory_gb_per_gpu` beside `memory_capacity_gb`: the stated capacity's binary GB in decimal GB). Only
    file-level problems exit non-zero. An invalid layout (e.g. tp x pp x cp x dp != N) exits 2 with the reason.
    """
    from pipeline.output import render

    if fmt not in ("table", "csv", "json"):
        _fail(f"--format must be table, csv or json, got '{fmt}'")
    cfg = settings()
    if runs is not None:
        try:
            result = api.run_predictions(cfg, runs, assumptions=assumptions, analytical_only=analytical_only)
        except api.InputError as err:
            _fail(str(err), err.exit_code)
        render(result, fmt, out, title=api.title_of("predict --runs", result), table_columns=RUNS_TABLE_COLUMNS)
        if out is not None or fmt == "table":  # csv/json on stdout stay machine-readable alone
            err_console.print(api.runs_summary(result))
        return
    try:  # by name, or from --arch-file / --hardware-file
        result = api.prediction(cfg, model=model, gpu=gpu, arch_file=arch_file, hardware_file=hardware_file, gpus=gpus,
                                global_batch=global_batch, seq_len=seq_len, micro_batch=micro_batch, tp=tp, pp=pp,
                                dp=dp, cp=cp, ep=ep, vpp=vpp, sharding=sharding, recompute=recompute,
                                tp_mode=tp_mode, sequence_parallel=sequence_parallel, dtype=dtype, gpus_per_node=gpus_per_node,
                                inter_node_gbps=inter_node_gbps, analytical_only=analytical_only,
                                assumptions=assumptions, scaleup_size=scaleup_size, scaleup_gbps=scaleup_gbps,
                                scaleout_gbps=scaleout_gbps, oversubscription=oversubscription, pod_size=pod_size,
                                etp=etp, capacity_factor=capacity_factor, layers_16bit=layers_16bit)
    except api.InputError as err:
        _fail(str(err), err.exit_code)
    if fmt == "table" and out is None:
        inputs = result.select("model", "gpu", "n_gpus", "tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch",
                               "global_batch_seqs", "seq_len", "sharding", "recompute", "sequence_parallel", "dtype",
                               "gpus_per_node", "inter_node_bw_gbps").row(0, named=True)
        console.print("inputs: " + ", ".join(f"{k}={v}" for k, v in inputs.items()))
        console.print(f"assumptions: {result['assumptions'][0]}")
        if not result["feasible"][0]:
            console.print(f"[yellow]does not fit in memory[/yellow]: {result['error'][0]}")
    render(result, fmt, out, title=api.title_of("predict", result), table_columns=TABLE_COLUMNS)


# ---------------------------------------------------------------- info

@app.command()
def info(fmt: str = typer.Option("table", "--format", "-f", help="table or json")) -> None:
    """Print where the store, snapshot, reports and incoming folder are, the row counts of the main tables,
    the served (promoted) calibration fit and the latest candidate fit with the promotion decision's reason."""
    from pipeline import fits, store

    cfg = settings()
    out: dict = {
        "store": str(cfg.store), "snapshot": str(cfg.snapshot), "reports": str(cfg.reports),
        "incoming": str(cfg.incoming), "measurements": str(cfg.measurements),
        "store_exists": cfg.store.exists(), "snapshot_exists": cfg.snapshot.exists(), "tables": {},
    }
    source = cfg.store if cfg.store.exists() else cfg.snapshot if cfg.snapshot.exists() else None
    if source is not None:
        try:
            con = store.connect(source, read_only=True)
        except Exception:  # noqa: BLE001 - the writer holds the lock: read the snapshot instead
            source = cfg.snapshot if cfg.snapshot.exists() else None
            con = store.connect(source, read_only=True) if source else None
        if con is not None:
            try:
                out["tables"] = {k: v for k, v in store.row_counts(con).items() if v is not None}
                out["fits"] = fits.fit_status(con)
            finally:
                con.close()
    out["counted_from"] = str(source) if source else None
    if fmt == "json":
        print(json.dumps(out, indent=2))
        return
    if fmt != "table":
        raise typer.BadParameter("expected table or json", param_hint="--format")
    t = Table(show_header=False, box=None)
    for key in ("store", "snapshot", "reports", "incoming", "measurements"):
        t.add_row(key, out[key])
    console.print(t)
    if out["tables"]:
        counts = Table("table", "rows", title=f"row counts ({out['counted_from']})")
        for name, n in out["tables"].items():
            counts.add_row(name, f"{n:,}")
        console.print(counts)
    else:
        console.print("no store yet: run `stepcast build`")
    for role in ("served", "latest"):
        f = (out.get("fits") or {}).get(role)
        if f is None:
            continue
        state = "promoted" if f["promoted"] else "NOT promoted"
        label = "served fit" if role == "served" else "latest candidate"
        console.print(f"{label}: {f['version']} (n_train {f['n_train']}, created {f['created_at']}, {state}): "
                      f"{f['promotion_reason']}", highlight=False)


# ---------------------------------------------------------------- serve

@app.command()
def serve(
    port: int = typer.Option(8765, "--port", "-p", min=1, max=65535, help="TCP port to listen on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind: loopback by default; 0.0.0.0 serves "
                                                         "every network this machine is on (prints a warning)."),
) -> None:
    """An interactive explorer in the browser: scaling curves, the frontier and the best layout of your choice
    of accelerators, model, tokens and network, redrawn as you change them; the URL keeps the view.

    It reads the promoted fit of the snapshot once at start-up and never writes. Beside the page, a JSON API
    answers `/api/predict`, `/api/search`, `/api/curve` and `/api/frontier` with the options of the commands
    of those names as query parameters and the JSON their `--format json` prints, e.g.
    `curl 'http://127.0.0.1:8765/api/predict?model=gpt3-175b&gpu=a100-sxm4-80gb&gpus=1024&global_batch=1536&seq_len=2048&tp=8&pp=8'`.

    Example: `stepcast serve` then open http://127.0.0.1:8765/ (Ctrl-C stops it).
    """
    from pipeline.serve import run

    run(settings(), host=host, port=port)


# Commands that live in their own modules register themselves on `app` when imported.
from pipeline import commands  # noqa: E402,F401
from pipeline.commands import listing  # noqa: E402,F401  (stepcast list models|gpus)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
