"""`stepcast list models` and `stepcast list gpus`: the architectures and accelerators the commands know by name."""

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
list_app = typer.Typer(help="Print the named architectures (`list models`) or accelerators (`list gpus`).",
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
