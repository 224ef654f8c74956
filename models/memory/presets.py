"""What a source's words mean for per-GPU memory beyond its training stack (pure polars expressions).

A stack's own memory behaviour (what "selective" recompute stores, gradient and logits bytes, FSDP with pipeline
parallelism) is a sourced row of measurements/stacks.csv, read into ``models.memory.stacks.Stacks``. This module
reads the rest of a run's words: ``remat_words(policy)`` (a MaxText ``remat_policy``), ``finetune_mode(model_name)``
(LoRA runs), ``reported_memory_gb(gpu_as_reported)`` (a capacity the source states, e.g. torchtitan's Grand Teton
"H100-HBM2e-96GB" that the hardware table maps to the 80 GB SKU) and ``source_interleave(runs, stacks)`` (a pipeline
interleave a source leaves unstated: the one it states for the same model and stage split elsewhere). What a run's
named recipe sets beyond its stack (recompute, offloading, the optimizer's bytes, FP8 weights, a stack's default
layout) is data, measurements/recipes/, applied by ``models.corpus.recipes``.
"""

from __future__ import annotations

import polars as pl

from models.memory.model import MAXTEXT_REMAT
from models.memory.stacks import Stacks, framework_preset


def remat_words(policy) -> pl.Expr:
    """(recompute, selective_policy) for a MaxText ``remat_policy`` word: 'full' -> full recompute (the layer input
    only), 'none' -> none, a save-list policy -> selective with its models.memory.model code; a struct column with
    fields ``recompute`` (str) and ``selective_policy`` (int, null when the word is not a MaxText policy)."""
    w = (pl.col(policy) if isinstance(policy, str) else policy).fill_null("").str.to_lowercase() \
        .str.replace_all(r"[^a-z0-9]", "")  # "save_qkv_proj", "SAVE-QKV-PROJ", "save qkv proj" alike
    code = w.replace_strict({k.replace("_", ""): v for k, v in MAXTEXT_REMAT.items()}, default=None,
                            return_dtype=pl.Int64)
    rc = (pl.when(w == "full").then(pl.lit("full")).when(w == "none").then(pl.lit("none"))
          .when(code.is_not_null()).then(pl.lit("selective")).otherwise(pl.lit(None, dtype=pl.Utf8)))
    return pl.struct(rc.alias("recompute"), code.alias("selective_policy")).alias("remat")


# ---- fine-tuning --------------------------------------------------------------------------------------------------
#: NeMo 2 / Megatron-Bridge LoRA defaults (nemo.collections.llm.peft.LoRA): target_modules = linear_qkv, linear_proj,
#: linear_fc1, linear_fc2; dim (rank) 32. Each adapter is A (in x r) + B (r x out).
LORA_RANK = 32


def finetune_mode(model_name) -> pl.Expr:
    """'lora' when the source names a LoRA run (e.g. "LLAMA3_70B LoRA"), else 'full'."""
    name = (pl.col(model_name) if isinstance(model_name, str) else model_name).fill_null("").str.to_lowercase()
    return pl.when(name.str.contains("lora", literal=True)).then(pl.lit("lora")).otherwise(pl.lit("full")) \
        .alias("finetune_mode")


def lora_trainable_frac(n_layers, d_model, q_dim, kv_dim, ffn_dim, gated, params, rank: float = LORA_RANK):
    """Share of the parameters a LoRA run trains: rank x (in + out) per adapted matrix on QKV, attention output,
    FC1 (gate + up when gated) and FC2, every layer, over the model's parameters. Plain arithmetic, so the
    arguments may be numpy arrays or polars expressions (``gated`` 0/1 or bool)."""
    fc1_out = ffn_dim * (1 + gated)
    per_layer = rank * ((d_model + q_dim + 2 * kv_dim) + (q_dim + d_model) + (d_model + fc1_out) + (ffn_dim + d_model))
    return n_layers * per_layer / params


# ---- capacity the source states ----------------------------------------------------------------------------------
def reported_memory_gb(gpu_as_reported) -> pl.Expr:
    """Capacity in GB written in the accelerator string (e.g. 'H100-HBM2e-96GB' -> 96; Meta's Grand Teton H100s,
    data card: 96 GB HBM2e, mapped to the 80 GB SKU's id); null when the string states none."""
    s = pl.col(gpu_as_reported) if isinstance(gpu_as_reported, str) else gpu_as_reported
    return s.str.extract(r"(?i)(\d+(?:\.\d+)?)\s*GB", 1).cast(pl.Float64).alias("reported_memory_gb")


# ---- a pipeline interleave a source leaves unstated ------------------------------------------------------------
def source_interleave(runs: pl.DataFrame, stacks: Stacks) -> pl.DataFrame:
    """`runs` with `vpp` filled where a pipelined run (pp > 1) leaves the interleave unstated but the same source
    states one for the same architecture, stack (memory preset) and (tp, pp) in its other rows (the most frequent;
    the largest on a tie), and a boolean column `vpp_from_source`. An interleave is a property of the stage split
    (layers per stage / chunks), not of the cluster size: MLPerf's GPT-3 submissions state vpp 12 with tp 4 x pp 8
    in v3.0 and leave it unstated in v3.1 for the same configuration. Other rows keep their vpp (null: 1 later).
    Needs columns source, arch_id, framework, year, tp, pp, vpp; `stacks` reads the framework words."""
    keyed = runs.with_columns(framework_preset(stacks, "framework", "year").alias("_stack"))
    key = ["source", "arch_id", "_stack", "tp", "pp"]
    stated = keyed.filter(pl.col("vpp").is_not_null() & (pl.col("pp") > 1) & pl.col("arch_id").is_not_null())
    sib = (stated.group_by(*key, "vpp").len()
           .sort(["len", "vpp"], descending=[True, True])
           .group_by(*key, maintain_order=True).first()
           .select(*key, pl.col("vpp").alias("_sib_vpp")))
    out = keyed.join(sib, on=key, how="left", nulls_equal=True)
    use = pl.col("vpp").is_null() & (pl.col("pp") > 1) & pl.col("_sib_vpp").is_not_null()
    return out.with_columns(
        pl.when(use).then(pl.col("_sib_vpp")).otherwise(pl.col("vpp")).cast(pl.Int64).alias("vpp"),
        use.fill_null(False).alias("vpp_from_source"),
    ).drop("_sib_vpp", "_stack")
