"""`stepcast list models`, `list gpus` and `list sources`: the architectures and accelerators the commands know by name, and the sources of the store's runs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import polars as pl
import typer

from pipeline import catalog
from pipeline.catalog import VARIANT_WORD_RE, UnknownName, resolve_gpu
from pipeline.commands.common import fail, settings
from pipeline.output import FORMATS, render

#: `stepcast list`, registered by pipeline.cli
list_app = typer.Typer(help="Print the named architectures (`list models`), accelerators (`list gpus`) or the "
                            "store's sources (`list sources`).",
                       no_args_is_help=True)

MODEL_COLUMNS = ["id", "name", "arch", "params_b", "active_params_b", "n_layers", "d_model", "n_heads", "n_kv_heads",
                 "ffn_dim", "vocab", "n_experts", "top_k", "expert_ffn_dim", "n_shared_experts", "n_dense_layers",
                 "aliases"]
MODEL_TABLE = ["id", "name", "arch", "params_b", "active_params_b", "n_layers", "d_model", "n_experts", "top_k",
               "aliases"]
GPU_COLUMNS = ["id", "name", "short_names", "vendor", "generation", "release_year", "sm_count", "peak_bf16_tflops",
               "peak_fp8_tflops", "peak_fp4_tflops", "memory_gb", "memory_bw_gbps", "intra_node_bw_gbps",
               "gpus_per_node_typical", "inter_node_bw_gbps"]
GPU_TABLE = ["id", "name", "short_names", "generation", "peak_bf16_tflops", "peak_fp8_tflops", "peak_fp4_tflops",
             "memory_gb", "memory_bw_gbps", "gpus_per_node_typical"]


def _check(fmt: str) -> None:
    if fmt not in FORMATS:
        fail(f"--format must be table, csv or json, got '{fmt}'")


def gpu_short_names(hw: pl.DataFrame) -> list[str]:
    """Per row, the words of its id that `--gpu` resolves to that row (`h100` -> h100-sxm5-80gb, the
    documented default of the H100 variants), `|`-separated."""
    out = []
    for hw_id in hw["id"].to_list():
        words = [w for w in hw_id.split("-")
                 if w != hw_id and any(ch.isdigit() for ch in w) and not VARIANT_WORD_RE.match(w)]
        names = []
        for w in words:
            try:
                if resolve_gpu(hw, w)[0]["id"] == hw_id:
                    names.append(w.upper())
            except UnknownName:
                pass
        out.append("|".join(names))
    return out


@list_app.command("models")
def list_models(
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the result to this file."),
) -> None:
    """The architectures of measurements/architectures.csv: id, name, aliases and shape.

    `--model` (and a measurement file's model_name) accepts the id, the name or any alias, ignoring case,
    spaces, '-', '_' and '.'. Example: `stepcast list models --format csv`."""
    _check(fmt)
    arch = catalog.architectures(settings().measurements)
    frame = arch.select([c for c in MODEL_COLUMNS if c in arch.columns])
    render(frame, fmt, out, title="stepcast list models", table_columns=MODEL_TABLE)


@list_app.command("gpus")
def list_gpus(
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the result to this file."),
) -> None:
    """The accelerators of measurements/hardware_specs.csv: id, name, short names and key figures (dense peaks
    in TFLOP/s, memory in GB, bandwidths in GB/s per direction).

    `--gpu` accepts the id, the name, or words of them (`H100`, `A100 80GB`, `gb200`); a short name that fits
    several variants of one chip takes the SXM/OAM part with the most memory and says so.
    Example: `stepcast list gpus --format json`."""
    _check(fmt)
    hw = catalog.hardware(settings().measurements)
    frame = hw.with_columns(pl.Series("short_names", gpu_short_names(hw), dtype=pl.Utf8))
    frame = frame.select([c for c in GPU_COLUMNS if c in frame.columns])
    render(frame, fmt, out, title="stepcast list gpus", table_columns=GPU_TABLE)


def sources_frame(cfg) -> pl.DataFrame:
    """One row per source of the store's runs: its run count, accelerators and stacks, and the adaptation of the
    served fit its runs give (`source_adaptations`, written by `stepcast fit`); empty adaptation columns for a
    source without a predictable measured run. Reads the snapshot (else the store)."""
    # start-up time: the store's reader (DuckDB) and the model load only for `list sources`
    from pipeline import store
    from pipeline.adaptation import TABLE  # start-up time: as above
    from pipeline.calibrated import from_readable_store  # start-up time: as above

    def read(con, _path):
        if not store.table_exists(con, "runs"):
            return None
        runs = con.execute("select source, count(*) as runs, string_agg(distinct gpu, ', ' order by gpu) as "
                           "accelerators, string_agg(distinct framework, '; ' order by framework) as frameworks "
                           "from runs group by source").pl()
        if not store.table_exists(con, TABLE):
            return runs.sort("runs", descending=True)
        ad = con.execute(f"select source, n_runs, throughput_factor, raw_factor, interval_factor, fit_version "
                         f"from {TABLE}").pl()
        return runs.join(ad, on="source", how="left").sort("runs", descending=True)

    out = from_readable_store(cfg, read)
    if out is None:
        raise typer.BadParameter("no store yet: run `stepcast build` first")
    return out


@list_app.command("sources")
def list_sources(
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the result to this file."),
) -> None:
    """The sources of the store's measured runs (a publication, a vendor page, your cluster ingested under a
    `source` name): runs, accelerators, stacks, and the adaptation of the served fit their runs give.

    `throughput_factor` is what `--source NAME` multiplies the served fit's throughput by (the runs' own mean
    factor `raw_factor`, shrunk toward 1 by how many runs there are); `interval_factor` is the 90% interval's
    hi/prediction after that many runs (the k-shot protocol's). `n_runs` counts the runs with a measurement the
    fit can predict; `runs` every run. Example: `stepcast list sources --format csv`; in SQL:
    `select * from source_adaptations`."""
    _check(fmt)
    try:
        frame = sources_frame(settings())
    except typer.BadParameter as err:
        fail(str(err))
    render(frame, fmt, out, title="stepcast list sources",
           table_columns=["source", "runs", "n_runs", "throughput_factor", "raw_factor", "interval_factor",
                          "accelerators"])


@list_app.command("stacks")
def list_stacks(
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the result to this file."),
) -> None:
    """The training stacks of measurements/stacks.csv and the words that name each (measurements/stack_words.csv):
    what `--stack NAME` and a run file's `framework` column read.

    A name containing one of a stack's words is that stack (`--stack "NeMo 24.09"` is megatron, then
    megatron_bridge from release 24.12); words without a stack only flag a family (PyTorch-native kernels, XLA).
    `--stack generic` asks for the generic row with the wider interval. Example: `stepcast list stacks --format
    json`."""
    _check(fmt)
    stacks = catalog.stacks(settings().measurements)
    rows = []
    for sid, s in stacks.stacks.items():
        rows.append({"stack": sid, "words": ", ".join(w for w, r in stacks.words.items() if r.stack == sid),
                     "default_sharding": s.default_sharding, "selective_policy": s.selective_policy,
                     "grad_bytes": s.grad_bytes, "logits_bytes": s.logits_bytes,
                     "interleaves_pipeline": s.interleaves_pipeline, "source": s.source})
    families = [{"stack": "(family only)", "words": w, "default_sharding": None, "selective_policy": None,
                 "grad_bytes": None, "logits_bytes": None, "interleaves_pipeline": None,
                 "source": ", ".join(sorted(r.families))} for w, r in stacks.words.items() if r.stack is None]
    frame = pl.DataFrame(rows + families, infer_schema_length=None)
    render(frame, fmt, out, title="stepcast list stacks",
           table_columns=["stack", "words", "default_sharding", "grad_bytes", "logits_bytes"])
