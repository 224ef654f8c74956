"""Measured runs -> model configurations, with every assumption made explicit (pure, vectorized).

Published runs leave parts of their layout unstated. `configs_from_runs` fills each gap with a documented
rule and lists the rules it applied per run in `assumptions` (a `;`-separated string), so a prediction
never silently rests on a guess:

| gap | rule | why |
|---|---|---|
| tp, pp, cp, ep, vpp empty | 1 | the sources state every degree they use |
| dp empty | n_gpus / (tp*pp*cp) | definition of dp in the data card |
| micro_batch empty | 1 | smallest micro-batch; Megatron's default |
| sharding empty | `fsdp` for FSDP stacks (llm-foundry, torchtitan, fms-fsdp), `zero1` for Megatron/NeMo (distributed optimizer is their default), else `none` | framework defaults |
| recompute empty/unknown | the cheapest mode that fits in memory: none, else selective, else full | a run that was measured did fit |
| sequence_parallel | true for Megatron/NeMo stacks with tp > 1 | Megatron-Core's default with TP (Korthikanti et al. 2022) |
| dtype empty | bf16 (fp32 on fp32-only parts) | the corpus' dominant precision |
| gpus_per_node empty | the hardware's scale-up domain, capped at n_gpus | typical deployment |
| inter_node_bw_gbps empty | the hardware's scale-out bandwidth per accelerator | typical deployment (a run that states its cluster's network uses it) |
| activation unknown | swiglu when ffn_dim/d_model < 3.9, else gelu | gated MLPs use ~8/3·d (Llama) or 3.5·d; GELU MLPs use 4·d |
| ffn_dim empty | 4·d_model | GPT convention (Brown et al. 2020) |
| n_kv_heads empty | n_heads | multi-head attention |
| vocab empty | 51,200 | GPT-2 BPE padded (Megatron default) |
| tied_embeddings empty | false | |
| software era | `megatron_2022` (attention scores materialised, full-square softmax, no DP overlap: `models.params.MEGATRON_2022`) for DeepSpeed-based stacks and for Megatron stacks reported up to 2022; `default` (FlashAttention-era) otherwise | FlashAttention (Dao 2022) became the default attention in Megatron-Core/TE, PyTorch SDPA, llm-foundry and torchtitan after 2022 |

A run that cannot be predicted at all (no n_gpus, no sequence length or global batch, no architecture
shape) keeps its row with the reason in `config_error`.
"""

from __future__ import annotations

import polars as pl

FSDP_STACKS = ("fsdp", "llm-foundry", "torchtitan", "composer", "fms")
MEGATRON_STACKS = ("megatron", "nemo", "bigscience", "deepspeed")


def _has_any(col: str, words: tuple[str, ...]) -> pl.Expr:
    low = pl.col(col).fill_null("").str.to_lowercase()
    expr = pl.lit(False)
    for w in words:
        expr = expr | low.str.contains(w, literal=True)
    return expr


#: hardware columns a run can state for its own cluster (the run's value wins over the hardware table's)
RUN_HARDWARE_OVERRIDES = ("inter_node_bw_gbps",)


def configs_from_runs(runs: pl.DataFrame, hardware: pl.DataFrame) -> pl.DataFrame:
    """`runs` rows (the store's runs table) + resolved hardware -> model input columns.

    `hardware` is the output of `models.hardware.resolve_hardware` (one row per hardware id). Returns one
    row per run with run_id, the architecture/layout/hardware columns `models.step_time.predict` needs,
    `assumptions` and `config_error`. Recompute is not resolved here (see `resolve_recompute`).
    """
    r = runs
    for c, dtype in (("activation", pl.Utf8), ("n_experts", pl.Int64), ("top_k", pl.Int64),
                     ("expert_ffn_dim", pl.Int64), ("n_shared_experts", pl.Int64), ("n_dense_layers", pl.Int64),
                     ("tied_embeddings", pl.Boolean), ("head_dim", pl.Int64), ("framework", pl.Utf8),
                     ("cp", pl.Int64), ("ep", pl.Int64), ("vpp", pl.Int64), ("gpus_per_node", pl.Int64)):
        if c not in r.columns:
            r = r.with_columns(pl.lit(None, dtype=dtype).alias(c))
    notes: list[pl.Expr] = []

    def note(cond: pl.Expr, text: str) -> None:
        notes.append(pl.when(cond).then(pl.lit(text)))

    fsdp = _has_any("framework", FSDP_STACKS)
    megatron = _has_any("framework", MEGATRON_STACKS)
    tp = pl.col("tp").fill_null(1)
    pp = pl.col("pp").fill_null(1)
    cp = pl.col("cp").fill_null(1)
    ratio = pl.col("ffn_dim").cast(pl.Float64) / pl.col("d_model").cast(pl.Float64)
    for c in ("tp", "pp"):
        note(pl.col(c).is_null(), f"{c}=1 (not stated)")
    note(pl.col("dp").is_null(), "dp=n_gpus/(tp*pp*cp)")
    note(pl.col("micro_batch").is_null(), "micro_batch=1")
    note(pl.col("sharding").is_null(), "sharding from framework default")
    note(pl.col("dtype").is_null(), "dtype=bf16")
    note(pl.col("gpus_per_node").is_null(), "gpus_per_node=scale-up domain")
    note(pl.col("activation").is_null() & pl.col("ffn_dim").is_not_null(), "activation from ffn/d ratio")
    note(pl.col("ffn_dim").is_null(), "ffn_dim=4*d_model")
    note(pl.col("n_kv_heads").is_null(), "n_kv_heads=n_heads")
    note(pl.col("vocab").is_null(), "vocab=51200")

    out = r.with_columns(
        tp.alias("tp"), pp.alias("pp"), cp.alias("cp"),
        pl.col("ep").fill_null(1).alias("ep"),
        pl.col("vpp").fill_null(1).alias("vpp"),
        pl.coalesce(pl.col("dp"), pl.col("n_gpus") // (tp * pp * cp)).alias("dp"),
        pl.col("micro_batch").fill_null(1).alias("micro_batch"),
        pl.coalesce(
            pl.col("sharding"),
            pl.when(fsdp).then(pl.lit("fsdp")).when(megatron).then(pl.lit("zero1")).otherwise(pl.lit("none")),
        ).alias("sharding"),
        pl.col("recompute").replace("unknown", None).alias("recompute"),
        (megatron & (tp > 1)).alias("sequence_parallel"),
        pl.col("dtype").fill_null("bf16").alias("dtype"),
        pl.coalesce(
            pl.col("activation"),
            pl.when(ratio < 3.9).then(pl.lit("swiglu")).otherwise(pl.lit("gelu")),
        ).alias("activation"),
        pl.coalesce(pl.col("ffn_dim"), pl.col("d_model") * 4).alias("ffn_dim"),
        pl.coalesce(pl.col("n_kv_heads"), pl.col("n_heads")).alias("n_kv_heads"),
        pl.col("vocab").fill_null(51200).alias("vocab"),
        pl.col("n_experts").fill_null(0).alias("n_experts"),
        pl.col("top_k").fill_null(0).alias("top_k"),
        pl.col("n_shared_experts").fill_null(0).alias("n_shared_experts"),
        pl.col("n_dense_layers").fill_null(0).alias("n_dense_layers"),
        pl.col("tied_embeddings").fill_null(False).alias("tied_embeddings"),
        pl.concat_str(notes, separator="; ", ignore_nulls=True).alias("assumptions"),
        pl.when(_has_any("framework", ("deepspeed",)) |
                (megatron & (pl.col("year").fill_null(2100) <= 2022)))
        .then(pl.lit("megatron_2022")).otherwise(pl.lit("default")).alias("software_preset"),
    )
    hw = hardware.rename({"id": "gpu"}) if "id" in hardware.columns else hardware
    # a run may state its cluster's scale-out network (`inter_node_bw_gbps`); else the hardware's typical one
    override = [c for c in RUN_HARDWARE_OVERRIDES if c in out.columns and c in hw.columns]
    hw = hw.rename({c: f"_hw_{c}" for c in override})
    hw_cols = [c for c in hw.columns if c not in out.columns or c == "gpu"]
    out = out.join(hw.select(hw_cols), on="gpu", how="left")
    if override:
        out = out.with_columns([pl.coalesce(c, f"_hw_{c}").alias(c) for c in override]).drop(
            [f"_hw_{c}" for c in override])
    out = out.with_columns(
        pl.coalesce(pl.col("gpus_per_node"),
                    pl.min_horizontal(pl.col("scaleup_size"), pl.col("n_gpus"))).alias("gpus_per_node"),
    )
    problems = [
        pl.when(pl.col("n_gpus").is_null()).then(pl.lit("n_gpus not stated (whole-run totals cannot be predicted)")),
        pl.when(pl.col("seq_len").is_null()).then(pl.lit("seq_len not stated")),
        pl.when(pl.col("global_batch_seqs").is_null()).then(pl.lit("global_batch_seqs not stated")),
        pl.when(pl.col("n_layers").is_null() | pl.col("d_model").is_null() | pl.col("n_heads").is_null())
        .then(pl.lit("architecture shape unknown (no n_layers/d_model/n_heads and no architectures alias)")),
        pl.when((pl.col("arch") != "dense") & (pl.col("n_experts") == 0))
        .then(pl.format("{} architecture without expert shapes", pl.col("arch"))),
        pl.when(pl.col("scaleup_size").is_null()).then(pl.lit("hardware not resolvable")),
    ]
    if "hardware_error" in out.columns:
        problems.append(pl.col("hardware_error"))
    return out.with_columns(pl.concat_str(problems, separator="; ", ignore_nulls=True).replace("", None)
                            .alias("config_error"))


PRESETS = ("default", "megatron_2022")


def preset_params(name: str, base=None, overrides=None):
    """The PhysParams of a software preset (`base` overrides DEFAULT, e.g. with fitted values; `overrides`
    {preset: {field: value}} are values fitted for one preset only, e.g. its host overhead per op)."""
    from models.params import DEFAULT, MEGATRON_2022

    base = base or DEFAULT
    extra = dict((overrides or {}).get(name, {}))
    if name == "default":
        return base.with_(**extra) if extra else base
    if name == "megatron_2022":
        diff = {k: v for k, v in MEGATRON_2022.to_dict().items() if DEFAULT.to_dict()[k] != v}
        return base.with_(**(diff | extra))
    raise ValueError(f"unknown software preset {name!r}; expected one of {PRESETS}")


def predict_by_preset(configs: pl.DataFrame, predict, base=None, overrides=None) -> pl.DataFrame:
    """Predict each row with the PhysParams of its `software_preset` (row order kept)."""
    if "software_preset" not in configs.columns:
        return predict(configs, preset_params("default", base, overrides))
    idx = configs.with_row_index("_i")
    parts = []
    for name in PRESETS:
        sub = idx.filter(pl.col("software_preset") == name)
        if sub.height:
            parts.append(sub.select("_i").hstack(predict(sub.drop("_i"), preset_params(name, base, overrides))))
    return pl.concat(parts, how="diagonal_relaxed").sort("_i").drop("_i")


def resolve_recompute(configs: pl.DataFrame, predict) -> pl.DataFrame:
    """Fill unknown recompute with the cheapest mode that fits: none, else selective, else full.

    `predict` is `models.step_time.predict` (passed in to keep this module free of import cycles)."""
    unknown = configs["recompute"].is_null()
    if not unknown.any():
        return configs.with_columns(pl.lit(False).alias("recompute_assumed"))
    chosen = pl.Series("recompute", [None] * configs.height, dtype=pl.Utf8)
    for mode in ("none", "selective", "full"):
        trial = configs.with_columns(pl.lit(mode).alias("recompute"))
        fits = predict_by_preset(trial, predict)["feasible"]
        chosen = pl.select(pl.when(chosen.is_null() & fits).then(pl.lit(mode)).otherwise(chosen)).to_series()
    chosen = pl.select(pl.coalesce(chosen, pl.lit("full"))).to_series()
    return configs.with_columns(
        pl.when(unknown).then(chosen).otherwise(pl.col("recompute")).alias("recompute"),
        unknown.alias("recompute_assumed"),
        pl.when(unknown).then(
            pl.concat_str([pl.col("assumptions"), pl.format("recompute={} (cheapest that fits)", chosen)],
                          separator="; ", ignore_nulls=True).str.strip_chars("; ")
        ).otherwise(pl.col("assumptions")).alias("assumptions"),
    )
