"""Named architectures and hardware for the CLI, read straight from measurements/ (no store needed).

`--model ID` accepts an architecture id (`llama3-70b`), case-insensitively, or one of its aliases
(`LLAMA3_70B`, `Llama 3 70B`); `--gpu ID` accepts a hardware id (`h100-sxm5-80gb`).
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path

import polars as pl

ARCH_MODEL_COLUMNS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab", "activation",
                      "n_experts", "top_k", "expert_ffn_dim", "n_shared_experts", "n_dense_layers", "tied_embeddings")


class UnknownName(ValueError):
    pass


@lru_cache(maxsize=4)
def architectures(measurements: Path) -> pl.DataFrame:
    return pl.read_csv(measurements / "architectures.csv", infer_schema_length=None)


@lru_cache(maxsize=4)
def hardware(measurements: Path) -> pl.DataFrame:
    return pl.read_csv(measurements / "hardware_specs.csv", infer_schema_length=None)


def _suggest(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name.lower(), options, n=3, cutoff=0.5)
    return f" Did you mean {', '.join(close)}?" if close else ""


def find_architecture(measurements: Path, name: str) -> dict:
    arch = architectures(measurements)
    key = name.strip().lower()
    hit = arch.filter(pl.col("id").str.to_lowercase() == key)
    if hit.height == 0:
        aliases = arch.select("id", pl.col("aliases").fill_null("").str.split("|")).explode("aliases")
        ids = aliases.filter(pl.col("aliases").str.strip_chars().str.to_lowercase() == key)["id"].unique()
        hit = arch.filter(pl.col("id").is_in(ids))
    if hit.height != 1:
        raise UnknownName(f"unknown model '{name}': expected an id from measurements/architectures.csv "
                          f"(e.g. gpt3-175b, llama3-70b, mixtral-8x7b).{_suggest(key, arch['id'].to_list())}")
    return hit.row(0, named=True)


def find_hardware(measurements: Path, gpu: str) -> dict:
    hw = hardware(measurements)
    hit = hw.filter(pl.col("id") == gpu.strip().lower())
    if hit.height != 1:
        raise UnknownName(f"unknown hardware '{gpu}': expected an id from measurements/hardware_specs.csv "
                          f"(e.g. h100-sxm5-80gb, a100-sxm4-80gb, gb200).{_suggest(gpu, hw['id'].to_list())}")
    return hit.row(0, named=True)


def fill_from_architectures(runs: pl.DataFrame, measurements: Path) -> pl.DataFrame:
    """Fill empty architecture columns of run rows from the architecture whose alias is the run's model_name
    (the same rule the store's `runs` table applies)."""
    arch = architectures(measurements)
    alias = (arch.select("id", pl.col("aliases").fill_null("").str.split("|").alias("alias")).explode("alias")
             .with_columns(pl.col("alias").str.strip_chars()).filter(pl.col("alias") != ""))
    out = runs.join(alias.rename({"id": "arch_id"}), left_on="model_name", right_on="alias", how="left")
    shapes = arch.select("id", *[c for c in ARCH_MODEL_COLUMNS if c in arch.columns]).rename(
        {c: f"_a_{c}" for c in ARCH_MODEL_COLUMNS if c in arch.columns})
    out = out.join(shapes, left_on="arch_id", right_on="id", how="left")
    exprs = []
    for c in ARCH_MODEL_COLUMNS:
        if f"_a_{c}" not in out.columns:
            continue
        if c in out.columns:
            exprs.append(pl.coalesce(pl.col(c), pl.col(f"_a_{c}").cast(out.schema[c], strict=False)).alias(c))
        else:
            exprs.append(pl.col(f"_a_{c}").alias(c))
    return out.with_columns(exprs).drop([c for c in out.columns if c.startswith("_a_")])
