"""Measured runs -> model configurations, with every assumption made explicit (pure, vectorized).

Published runs leave parts of their layout unstated. `configs_from_runs` fills each gap with a documented
rule and lists the rules it applied per run in `assumptions` (a `;`-separated string), so a prediction
never silently rests on a guess. The rules, one per gap, each with its source: docs/run-rules.md.

A run that cannot be predicted at all (no n_gpus, no architecture shape, an accelerator that is not known)
keeps its row with the reason in `config_error`. Memory never refuses a measured run: its time is predicted
and the memory model's figure is reported beside the capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from models.arch.accounting import hybrid_params_b, normalize_arch, param_counts
from models.arch.archfile import APPROXIMATED_ARCHITECTURES, APPROXIMATED_NOTE
from models.arch.moe import resolve_etp
from models.arch.shapes import dense_shapes_for_params
from models.core.precision import RECIPE_LAYERS_16BIT, RECIPE_SOURCE
from models.core.software import predict_by_preset
from models.corpus import moe_recipes as mr
from models.corpus.recipes import (Recipes, recipe_fp8_params, recipe_memory, recipe_micro_batch, recipe_optimizer,
                                   recipe_run_memory)
from models.memory import presets as fw
from models.memory import stacks as st
from models.memory.stacks import Stacks

#: from this year on, a stack of unknown name with tp > 1 is read with sequence parallelism: the TP of the stacks
#: of that era shards the norm and dropout activations over the tensor-parallel group (Megatron-LM and every stack
#: built on it since Korthikanti et al. 2022; torchtitan's TP plan puts SequenceParallel on the norms)
UNKNOWN_STACK_SP_YEAR = 2023
#: from this year on a DeepSpeed run that is not Megatron-DeepSpeed runs Hugging Face models with SDPA attention
#: (FlashAttention-2 kernels): Transformers v4.36 (Dec 2023) made ``attn_implementation="sdpa"`` the default
DEEPSPEED_SDPA_YEAR = 2024
# The words of a run's `framework` column and the families they flag (measurements/stack_words.csv, read into
# models.memory.stacks.Stacks): `fsdp` (PyTorch FSDP stacks: no gradient accumulation by default), `megatron_based`,
# `native_kernels` (PyTorch's own kernels, SDPA's FlashAttention-2, rather than TransformerEngine's: software preset
# ``pytorch_native``) and `xla` (stacks compiled by XLA: on a GPU their kernels are XLA's fusions, cuBLAS/cuBLASLt GEMMs
# and cuDNN attention, read in the non-TransformerEngine kernel class; on a TPU XLA *is* the vendor's stack: those rows
# keep the reference preset).
#: from this year on a TPU run's XLA overlaps the tensor-parallel collectives with the matmuls (async collective
#: fusion and collective matmul: Wang et al., ASPLOS 2023; the LIBTPU flags every MaxText TPU recipe sets from its
#: 2023 releases on, models.physics.hardware.compiler_overlaps_tp). An earlier TPU run (PaLM, 2022) is read with the TP
#: traffic exposed, as a GPU stack's
XLA_ASYNC_COLLECTIVES_YEAR = 2023
#: the two XLA rules as `assumptions` states them (here and in `stepcast predict`, pipeline.api.predict_config)
XLA_TP_NOTE = "TP traffic hidden behind the matmuls while compute lasts (XLA on a TPU)"
XLA_REMAT_NOTE = ("full recompute under XLA: each layer's down-projection not recomputed (JAX remat keeps only what "
                  "the backward needs)")


#: hardware columns a run can state for its own cluster (the run's value wins over the hardware table's)
RUN_HARDWARE_OVERRIDES = ("inter_node_bw_gbps",)
#: Megatron stacks before this year recomputed every layer's activations unless told otherwise: Narayanan et al.
#: 2021 (SC'21) count the recomputation in every result (eq. 3, 96 B s l h^2: four forward passes' worth) and
#: Megatron-LM's example scripts of the time pass --checkpoint-activations; selective recomputation came with
#: Korthikanti et al. 2022 (Megatron-LM v3.0, 2022)
SELECTIVE_RECOMPUTE_YEAR = 2022
# recompute modes an unstated recompute of a measured run may resolve to, cheapest first (never full: docstring)
INFERRED_RECOMPUTE = ("none", "selective")


def _era_seq_len(year: np.ndarray) -> np.ndarray:
    """Typical context of the run's era: GPT-3/OPT/BLOOM 2,048 (<= 2022), Llama 2 4,096 (2023), Llama 3 8,192."""
    y = np.nan_to_num(year, nan=2024.0)
    return np.where(y <= 2022, 2048.0, np.where(y <= 2023, 4096.0, 8192.0))


def _era_batch_tokens(year: np.ndarray) -> np.ndarray:
    """Typical global batch in tokens of the run's era: 0.5M (<= 2020: Megatron-LM 2019, 512 x 1,024), 3.1M
    (2021-22: GPT-3 175B's 1,536 x 2,048, Brown et al. 2020), 4M (2023: Llama 2, Touvron et al. 2023), 16M
    (>= 2024: Llama 3 405B, Dubey et al. 2024)."""
    y = np.nan_to_num(year, nan=2024.0)
    return np.where(y <= 2020, 524288.0, np.where(y <= 2022, 1536.0 * 2048, np.where(y <= 2023, 4.0e6, 16.0e6)))


def _pow2_divisor_at_most(n: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """The largest power of two that divides n and is <= cap (elementwise, n >= 1)."""
    out = np.ones_like(n)
    k = np.ones_like(n)
    for _ in range(12):
        k = k * 2
        ok = (np.mod(n, k) == 0) & (k <= cap)
        out = np.where(ok, k, out)
    return out


def _largest_divisor_at_most(n: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """The largest divisor of n that is <= cap (elementwise; small caps: micro-batches)."""
    out = np.ones_like(n)
    for d in range(2, 257):
        ok = (np.mod(n, d) == 0) & (d <= cap)
        out = np.where(ok, float(d), out)
    return out


#: layers per virtual pipeline chunk when a pipelined run of a Megatron-class or unnamed FlashAttention-era stack
#: states no interleave: the median of the corpus's pipelined runs that state one (22 configurations of
#: Megatron-Core, NeMo, Megatron-Bridge and MLPerf: 1 to 4 layers per chunk, median 2; e.g. NeMo's Llama 3 70B
#: recipe pp 4 x vpp 5 = 4 layers, Llama 3.1 405B pp 8 x vpp 8 = 2, MLPerf GPT-3 pp 8 x vpp 12 = 1). Llama 3's
#: 405B training used the interleaved schedule too (Dubey et al. 2024, section 3.3.2).
TYPICAL_LAYERS_PER_CHUNK = 2
#: per row: the run's stack interleaves a pipeline whose run states no interleave (models.memory.stacks
#: ``interleaves_pipeline``), written by `configs_from_runs` for `infer_layout` and `resolve_layout`
INTERLEAVES_COLUMN = "stack_interleaves_pipeline"


def _interleaving_stack(frame: pl.DataFrame) -> np.ndarray:
    """Rows whose stack interleaves its pipeline by default: FlashAttention-era (`software_preset` default) with a
    stack whose row says so (`stack_interleaves_pipeline`, written by `configs_from_runs` from the stack's
    ``interleaves_pipeline``: Megatron-class or unnamed). DeepSpeed's and torchtitan's default schedules are not
    interleaved."""
    if "software_preset" not in frame.columns or INTERLEAVES_COLUMN not in frame.columns:
        return np.zeros(frame.height, dtype=bool)
    return ((frame["software_preset"] == "default") & frame[INTERLEAVES_COLUMN]).fill_null(False).to_numpy()


def typical_vpp(interleaving: np.ndarray, n_layers: np.ndarray, pp: np.ndarray,
                micro_batches: np.ndarray) -> np.ndarray:
    """The stack's typical interleave, chunks of TYPICAL_LAYERS_PER_CHUNK layers, of the rows that take one: an
    interleaving stack (`interleaving`, the caller's mask), pp > 1, a multiple of pp micro-batches and at least pp,
    more than one chunk a stage; NaN elsewhere."""
    with np.errstate(invalid="ignore", divide="ignore"):
        v = np.maximum(np.floor(np.floor(n_layers / pp) / TYPICAL_LAYERS_PER_CHUNK), 1.0)
        ok = interleaving & (pp > 1) & (micro_batches >= pp) & (np.mod(micro_batches, pp) == 0)
    return np.where(ok & np.isfinite(v) & (v > 1), v, np.nan)


def infer_layout(frame: pl.DataFrame, stacks: Stacks) -> pl.DataFrame:
    """Fill tp, pp, dp, cp, ep, vpp, micro_batch, seq_len and global_batch_seqs by the documented rules (module
    docstring) and append what was inferred to `assumptions`. Needs `scaleup_size` (the hardware joined),
    `n_gpus`, `year`, `framework`; `stacks` reads the framework words. Adds `layout_unstated` for `resolve_layout`."""
    f = lambda c: frame[c].cast(pl.Float64).to_numpy()  # noqa: E731
    n, year, node = f("n_gpus"), f("year"), f("scaleup_size")
    tp0, pp0, dp0, cp0, ep0, mb0 = f("tp"), f("pp"), f("dp"), f("cp"), f("ep"), f("micro_batch")
    seq0, B0 = f("seq_len"), f("global_batch_seqs")
    fsdp = frame.select(st.has_words(stacks, "framework", "fsdp").alias("fsdp"))["fsdp"].to_numpy()
    node = np.where(np.isfinite(node), np.minimum(node, np.nan_to_num(n, nan=1.0)), 8.0)
    notes: list[list[str]] = [[] for _ in range(frame.height)]

    def note(mask, text):
        for i in np.flatnonzero(mask):
            notes[i].append(text if isinstance(text, str) else text[i])

    cp = np.nan_to_num(cp0, nan=1.0)
    ep = np.nan_to_num(ep0, nan=1.0)
    seq = np.where(np.isnan(seq0), _era_seq_len(year), seq0)
    note(np.isnan(seq0), [f"seq_len={x:.0f} (the era's typical context)" for x in seq])
    # Megatron layout when only dp is stated: tensor parallel inside the node, pipeline across
    mp = n / (dp0 * cp)
    from_dp = np.isnan(tp0) & np.isnan(pp0) & np.isfinite(dp0) & np.isfinite(mp) & (mp >= 1) & (mp == np.floor(mp))
    tp_dp = _pow2_divisor_at_most(np.where(from_dp, mp, 1.0), node)
    tp = np.where(from_dp, tp_dp, np.nan_to_num(tp0, nan=1.0))
    pp = np.where(from_dp, np.where(from_dp, mp, 1.0) / tp_dp, np.nan_to_num(pp0, nan=1.0))
    note(from_dp, [f"tp={a:.0f}, pp={b:.0f} (model-parallel size n/dp: tp inside the node, pp across)"
                   for a, b in zip(tp, pp)])
    note(np.isnan(tp0) & ~from_dp, "tp=1 (not stated)")
    note(np.isnan(pp0) & ~from_dp, "pp=1 (not stated)")
    layout_unstated = np.isnan(tp0) & np.isnan(pp0) & np.isnan(dp0)
    base = tp * pp * cp
    dp = np.where(np.isnan(dp0), n / base, dp0)
    note(np.isnan(dp0), "dp=n_gpus/(tp*pp*cp)")
    bad = np.isfinite(dp0) & (base * dp != n)
    fold_ep = bad & (base * dp0 * ep == n)
    dp = np.where(fold_ep, dp0 * ep, dp)
    note(fold_ep, "dp=dp*ep (the source counted dp without the expert ranks)")
    refit = bad & ~fold_ep & (np.mod(n, base) == 0)
    dp = np.where(refit, n / base, dp)
    note(refit, "dp=n_gpus/(tp*pp*cp) (the stated dp did not complete n_gpus)")
    # MoE runs: expert tensor parallelism and dropping are never columns of the schema (models.arch.moe)
    moe_run = (np.nan_to_num(f("n_experts"), nan=0.0) > 0 if "n_experts" in frame.columns
               else np.zeros(frame.height, dtype=bool))
    if "n_experts" in frame.columns:

        etp, folded = resolve_etp(np.full(frame.height, np.nan), tp, cp, dp, ep)
        note(moe_run & folded, [f"etp={x:.0f} (ep={e:.0f} does not fold with etp=tp: the largest etp dividing tp "
                                f"with etp*ep | tp*cp*dp, as Megatron-Core needs)" for x, e in zip(etp, ep)])
        note(moe_run & ~folded & (tp > 1), "etp=tp (not stated: Megatron-Core's default)")
        says_dropless = (frame["notes"].fill_null("").str.to_lowercase().str.contains("dropless", literal=True)
                         .to_numpy() if "notes" in frame.columns else np.zeros(frame.height, dtype=bool))
        note(moe_run & ~says_dropless, "dropless (no capacity factor: Megatron-Core's default)")
    mb = np.nan_to_num(mb0, nan=1.0)
    note(np.isnan(mb0), "micro_batch=1")
    # global batch: FSDP stacks take no gradient accumulation by default; others the era's typical batch
    era_B = np.ceil(_era_batch_tokens(year) / seq / (dp * mb)) * dp * mb
    B = np.where(np.isnan(B0), np.where(fsdp, dp * mb, era_B), B0)
    note(np.isnan(B0) & fsdp, "global_batch_seqs=dp*micro_batch (FSDP default: no gradient accumulation)")
    note(np.isnan(B0) & ~fsdp, [f"global_batch_seqs={x:.0f} (the era's typical batch in tokens)" for x in B])
    round_up = np.isfinite(B0) & ~layout_unstated & (np.mod(B, dp) != 0) & np.isfinite(dp) & (dp >= 1)
    B = np.where(round_up, np.ceil(B / (dp * mb)) * dp * mb, B)
    note(round_up, "global_batch_seqs rounded up to a multiple of dp*micro_batch")
    per = B / dp
    mb_fix = np.isfinite(per) & (per == np.floor(per)) & (np.mod(per, mb) != 0)
    mb = np.where(mb_fix, _largest_divisor_at_most(np.where(mb_fix, per, 1.0), mb), mb)
    note(mb_fix, "micro_batch lowered to a divisor of global_batch/dp")
    vpp0 = f("vpp")
    # a pipelined run of a FlashAttention-era Megatron-class or unnamed stack that states no interleave (nor does
    # its source for the same stage split): interleaved in chunks of two layers (TYPICAL_LAYERS_PER_CHUNK)
    v_typ = typical_vpp(_interleaving_stack(frame) & np.isnan(vpp0), f("n_layers"), pp, B / (dp * mb))
    typical = np.isfinite(v_typ)
    vpp = np.where(typical, v_typ, np.nan_to_num(vpp0, nan=1.0))
    note(typical, [f"vpp={x:.0f} (interleaved in chunks of {TYPICAL_LAYERS_PER_CHUNK} layers: the stack's typical "
                   f"schedule at pp > 1)" for x in vpp])
    note(np.isnan(vpp0) & (pp > 1) & ~typical, "vpp=1 (not stated)")
    text = ["; ".join(x) for x in notes]
    return frame.with_columns(
        pl.Series("tp", tp).cast(pl.Int64, strict=False), pl.Series("pp", pp).cast(pl.Int64, strict=False),
        pl.Series("dp", np.where(np.isfinite(dp), np.round(dp), np.nan)).cast(pl.Int64, strict=False),
        pl.Series("cp", cp).cast(pl.Int64), pl.Series("ep", ep).cast(pl.Int64), pl.Series("vpp", vpp).cast(pl.Int64),
        pl.Series("micro_batch", mb).cast(pl.Int64),
        pl.Series("seq_len", seq).cast(pl.Int64, strict=False),
        pl.Series("global_batch_seqs", B).cast(pl.Int64, strict=False),
        pl.Series("layout_unstated", layout_unstated), pl.Series("micro_batch_stated", np.isfinite(mb0)),
        pl.Series("batch_per_replica", np.isnan(B0) & fsdp),
        pl.Series("vpp_stated", np.isfinite(vpp0)),
        pl.Series("ep_unstated", np.isnan(ep0) & moe_run),
        pl.concat_str([pl.col("assumptions"), pl.Series(text)], separator="; ", ignore_nulls=True)
        .str.strip_chars("; ").replace("", None).alias("assumptions"),
    )


def _recipe_moe_options(frame: pl.DataFrame, recipes: Recipes) -> pl.DataFrame:
    """MoE options a Megatron-Bridge performance run's recipe sets and the schema has no column for
    (`models.corpus.moe_recipes`): the expert tensor-parallel size, the token dispatcher of a node-spanning EP group and the
    EP all-to-all overlap."""
    return mr.resolve_a2a_overlap(mr.resolve_recipe_dispatcher(mr.resolve_recipe_etp(frame, recipes), recipes), recipes)


def infer_dense_shape(frame: pl.DataFrame) -> pl.DataFrame:
    """Rows of a dense (or unnamed) model whose size `params_b` is stated but whose shape (n_layers, d_model,
    n_heads) is not, nor expert or hybrid columns: the shape of `models.planning.frontier`'s compute-optimal GPT-style rule
    (`dense_shapes_for_params`: d_model/n_layers 108-152 around GPT-3's 128, the head count the power of two nearest
    d_model/128, GeLU MLP of 4 d_model, tied embeddings; Brown et al. 2020, Kaplan et al. 2020) whose parameter
    count with the row's vocab (51,200 when unstated, the rule's and this module's default) is closest to
    params_b, keeping the shape fields the row states where a shape of the rule has them. The stated fields win;
    ffn_dim, activation and tied_embeddings are filled only where empty. `assumptions` names the shape and its
    counted size (models.arch.accounting); `arch` becomes dense."""
    need = ("params_b", "n_layers", "d_model", "n_heads")
    if not frame.height or not all(c in frame.columns for c in need):
        return frame

    shape_cols = ("n_layers", "d_model", "n_heads")
    moe = pl.col("n_experts").cast(pl.Float64, strict=False).fill_null(0.0) > 0 if "n_experts" in frame.columns \
        else pl.lit(False)
    hybrid = pl.col("layer_pattern").is_not_null() if "layer_pattern" in frame.columns else pl.lit(False)
    dense = pl.col("arch").is_null() | (pl.col("arch") == "dense") if "arch" in frame.columns else pl.lit(True)
    todo = frame.select((pl.any_horizontal([pl.col(c).is_null() for c in shape_cols])
                         & (pl.col("params_b").cast(pl.Float64, strict=False) > 0) & dense & ~moe & ~hybrid)
                        .fill_null(False)).to_series().to_numpy()
    if not todo.any():
        return frame
    sub = frame.filter(pl.Series(todo))
    g = lambda c: sub[c].cast(pl.Float64, strict=False).to_numpy() if c in sub.columns \
        else np.full(sub.height, np.nan)  # noqa: E731
    shp = dense_shapes_for_params(g("params_b") * 1e9, g("vocab"), g("n_layers"), g("d_model"), g("n_heads"))
    L, d, h = (np.where(np.isnan(g(c)), shp[c], g(c)) for c in shape_cols)
    ffn = np.where(np.isnan(g("ffn_dim")), 4.0 * d, g("ffn_dim"))
    act = sub["activation"].fill_null("gelu") if "activation" in sub.columns else pl.Series(["gelu"] * sub.height)
    tied = (sub["tied_embeddings"].cast(pl.Float64, strict=False).fill_null(1.0).to_numpy()
            if "tied_embeddings" in sub.columns else np.ones(sub.height))
    counted = param_counts({"n_layers": L, "d_model": d, "n_heads": h, "n_kv_heads": g("n_kv_heads"),
                            "ffn_dim": ffn, "vocab": shp["vocab"], "activation": (act == "swiglu").cast(pl.Float64)
                            .to_numpy(), "tied_embeddings": tied})["params"]
    why = [f"shape from params_b={p:g}: n_layers={a:.0f}, d_model={b:.0f}, n_heads={c:.0f}, ffn_dim={e:.0f} "
           f"({n / 1e9:.2f} B counted; models.planning.frontier's GPT-style rule: d_model/n_layers 108-152, heads the power of "
           f"two nearest d_model/128, GeLU MLP of 4 d_model and tied embeddings where not stated)"
           for p, a, b, c, e, n in zip(g("params_b"), L, d, h, ffn, counted)]
    filled = sub.with_columns(
        pl.Series("n_layers", L).cast(frame.schema["n_layers"]), pl.Series("d_model", d).cast(frame.schema["d_model"]),
        pl.Series("n_heads", h).cast(frame.schema["n_heads"]),
        pl.Series("ffn_dim", ffn).cast(frame.schema.get("ffn_dim", pl.Int64)),
        act.alias("activation"), pl.Series("tied_embeddings", tied > 0),
        pl.lit("dense").alias("arch"), pl.Series("_shape_note", why))
    idx = frame.with_row_index("_row")
    out = pl.concat([idx.filter(~pl.Series(todo)), filled.with_columns(
        pl.Series("_row", np.flatnonzero(todo)).cast(pl.UInt32))], how="diagonal_relaxed").sort("_row").drop("_row")
    return out


def _tpu_ids(hardware: pl.DataFrame) -> list[str]:
    """Hardware ids of TPUs: scale-up link ICI (models.physics.hardware.resolve_hardware's ``scaleup_link``, the test
    models.physics.hardware.compiler_overlaps_tp makes on the arrays), whose only compiler is XLA."""
    idcol = "id" if "id" in hardware.columns else "gpu"
    if "scaleup_link" not in hardware.columns:
        return []
    return hardware.filter(pl.col("scaleup_link") == "ici")[idcol].cast(pl.Utf8).to_list()


#: what a run's stated accelerators per node is read as where the domain spans hosts (`configs_from_runs`)
HOST_SPANNING_DOMAIN_NOTE = ("gpus_per_node={} read as one host's: {} joins the hosts of {}'s scale-up domain, {} "
                             "accelerators")


def spans_hosts(size: pl.Expr, per_host: pl.Expr) -> pl.Expr:
    """Whether a hardware row's scale-up domain (`scaleup_size` of models.physics.hardware.resolve_hardware) spans
    hosts: it joins more accelerators than one host holds (the hardware table's `accelerators_per_host`), as a TPU
    pod's ICI (4 or 8 chips per host) or an NVL72 rack's NVLink Switch trays (4 GPUs per compute tray) do. Null where
    the table states no host size."""
    return size > per_host


@dataclass(frozen=True)
class StackReading:
    """How a run's `framework` (with its `year`, `gpu` and `sharding`) reads as a training stack: expressions."""

    megatron: pl.Expr  # a Megatron-based stack
    on_xla: pl.Expr  # a TPU: its only compiler is XLA
    fsdp_unnamed: pl.Expr  # no framework named, but FSDP/HSDP sharding: PyTorch's FullyShardedDataParallel
    xla_gpu: pl.Expr  # an XLA-compiled stack on a GPU
    software_preset: pl.Expr  # the software era of the time model (models.core.software.PRESETS)


def stack_reading(stacks: Stacks, hardware: pl.DataFrame, has_sharding: bool = True) -> StackReading:
    """The expressions that read a run's `framework` words as its stack (measurements/stack_words.csv), shared by
    the run files and `--stack NAME`. A TPU's stack is XLA whatever it shards (MaxText's and Pax's FSDP are XLA's
    sharding), so an unnamed FSDP run on a TPU is not PyTorch's."""
    megatron = st.has_words(stacks, "framework", "megatron_based")
    on_xla = pl.col("gpu").is_in(_tpu_ids(hardware)).fill_null(False)
    fsdp_unnamed = ((pl.col("framework").fill_null("").str.strip_chars() == "") & ~on_xla
                    & pl.col("sharding").is_in(["fsdp", "hsdp"]).fill_null(False)) if has_sharding else pl.lit(False)
    xla_gpu = st.has_words(stacks, "framework", "xla") & ~megatron & ~on_xla
    preset = (
        pl.when(st.has_words(stacks, "framework", "names_deepspeed")
                & ~st.has_words(stacks, "framework", "names_megatron")
                & (pl.col("year").fill_null(0) >= DEEPSPEED_SDPA_YEAR)).then(pl.lit("pytorch_native"))
        .when(st.has_words(stacks, "framework", "names_deepspeed")
              | (megatron & (pl.col("year").fill_null(2100) <= 2022)))
        .then(pl.lit("megatron_2022"))
        .when(st.has_words(stacks, "framework", "native_kernels") & ~megatron).then(pl.lit("pytorch_native"))
        .when(fsdp_unnamed | xla_gpu).then(pl.lit("pytorch_native"))
        .otherwise(pl.lit("default")))
    return StackReading(megatron, on_xla, fsdp_unnamed, xla_gpu, preset)


def with_stack_memory(r: pl.DataFrame, stacks: Stacks, fsdp_unnamed: pl.Expr) -> pl.DataFrame:
    """`memory_preset` (the stack's label), its memory values for the step-time model (`STACK_COLUMNS`) and whether
    it interleaves a pipeline (`INTERLEAVES_COLUMN`), from the `framework` and `year` columns."""
    r = r.with_columns(st.framework_preset(stacks, "framework", "year"))
    r = r.with_columns(pl.when(fsdp_unnamed).then(pl.lit("pytorch_fsdp")).otherwise(pl.col("memory_preset"))
                       .alias("memory_preset"))  # and its memory behaviour is PyTorch FSDP's
    return r.with_columns(*st.stack_columns(stacks, pl.col("memory_preset")),
                          pl.col("memory_preset").is_in(st.interleaving_stacks(stacks)).alias(INTERLEAVES_COLUMN))


def stack_settings(framework: str, gpu: str, hardware: pl.DataFrame, stacks: Stacks, sharding: str | None = None,
                   year: int | None = None) -> dict:
    """What a stack named as people write it (`--stack NAME`, a run file's `framework`) sets for a configuration on
    `gpu`: `memory_preset` (the stack's row of measurements/stacks.csv; `default`, the generic row, for a name the
    words do not know), `software_preset`, `xla_compiled`, its memory values (`STACK_COLUMNS`), `known` (whether any
    word of measurements/stack_words.csv names it), and the stack's default sharding (`default_sharding`)."""
    r = pl.DataFrame({"framework": [framework], "gpu": [gpu], "sharding": [sharding], "year": [year]},
                     schema={"framework": pl.Utf8, "gpu": pl.Utf8, "sharding": pl.Utf8, "year": pl.Int64})
    sr = stack_reading(stacks, hardware, True)
    r = with_stack_memory(r, stacks, sr.fsdp_unnamed)
    r = r.with_columns(sr.software_preset.alias("software_preset"),
                       st.names_a_stack(stacks, "framework").alias("known"),
                       pl.when(sr.xla_gpu).then(pl.lit(1.0)).otherwise(pl.lit(None, dtype=pl.Float64))
                       .alias("xla_compiled"),
                       st.default_sharding(stacks, pl.col("memory_preset")).alias("default_sharding"))
    return r.row(0, named=True)


def configs_from_runs(runs: pl.DataFrame, hardware: pl.DataFrame, recipes: Recipes) -> pl.DataFrame:
    """`runs` rows (the store's runs table) + resolved hardware -> model input columns.

    `hardware` is the output of `models.physics.hardware.resolve_hardware` (one row per hardware id); `recipes` what
    the runs' named recipes set (`models.corpus.recipes`, read from measurements/recipes/ by the pipeline). Returns one
    row per run with run_id, the architecture/layout/hardware columns `models.physics.step_time.predict` needs,
    `assumptions` and `config_error`. Recompute is not resolved here (see `resolve_recompute`), nor a wholly
    unstated layout (see `resolve_layout`).
    """
    r = infer_dense_shape(runs)
    for c, dtype in (("activation", pl.Utf8), ("n_experts", pl.Int64), ("top_k", pl.Int64),
                     ("expert_ffn_dim", pl.Int64), ("n_shared_experts", pl.Int64), ("n_dense_layers", pl.Int64),
                     ("tied_embeddings", pl.Boolean), ("head_dim", pl.Int64), ("framework", pl.Utf8),
                     ("cp", pl.Int64), ("ep", pl.Int64), ("vpp", pl.Int64), ("gpus_per_node", pl.Int64),
                     ("year", pl.Int64), ("micro_batch", pl.Int64), ("seq_len", pl.Int64),
                     ("global_batch_seqs", pl.Int64), ("tp", pl.Int64), ("pp", pl.Int64), ("dp", pl.Int64)):
        if c not in r.columns:
            r = r.with_columns(pl.lit(None, dtype=dtype).alias(c))
    notes: list[pl.Expr] = []

    stacks = recipes.stacks  # the training stacks and their words (measurements/stacks.csv, stack_words.csv)
    if "source" in r.columns and "arch_id" in r.columns:
        r = fw.source_interleave(r, stacks)
    else:
        r = r.with_columns(pl.lit(False).alias("vpp_from_source"))

    def note(cond: pl.Expr, text: str) -> None:
        notes.append(pl.when(cond).then(pl.lit(text)))

    if "model_name_note" in r.columns:  # a name read without its size token (pipeline.catalog)
        notes.append(pl.col("model_name_note"))
    if "_shape_note" in r.columns:  # a shape from the stated size (infer_dense_shape)
        notes.append(pl.col("_shape_note"))
    sr = stack_reading(stacks, hardware, "sharding" in r.columns)
    megatron, on_xla, fsdp_unnamed, xla_gpu = sr.megatron, sr.on_xla, sr.fsdp_unnamed, sr.xla_gpu
    note(fsdp_unnamed, "software stack pytorch_native (no framework stated; FSDP/HSDP sharding is PyTorch's)")
    note(xla_gpu, "software stack pytorch_native (an XLA-compiled stack on a GPU: kernels outside "
                  "TransformerEngine)")
    if "arch_id" in r.columns:

        note(pl.col("arch_id").is_in(APPROXIMATED_ARCHITECTURES).fill_null(False), APPROXIMATED_NOTE)
    r = with_stack_memory(r, stacks, fsdp_unnamed)
    ratio = pl.col("ffn_dim").cast(pl.Float64) / pl.col("d_model").cast(pl.Float64)
    note(pl.col("vpp_from_source"), "vpp from the same source's runs of this model and tp x pp")
    note(pl.col("sharding").is_null(), "sharding from framework default")
    # no sharding stated and no stack whose default is known (none named, or one `models.memory.stacks.framework_preset` does not know):
    # `resolve_sharding` may read a measured run as sharded
    r = r.with_columns((pl.col("sharding").is_null() & (pl.col("memory_preset") == "default")).alias("sharding_open"))
    note(pl.col("dtype").is_null(), "dtype=bf16")
    note(pl.col("gpus_per_node").is_null(), "gpus_per_node=scale-up domain")
    note(pl.col("activation").is_null() & pl.col("ffn_dim").is_not_null(), "activation from ffn/d ratio")
    note(pl.col("ffn_dim").is_null(), "ffn_dim=4*d_model")
    note((pl.col("n_experts").fill_null(0) > 0) & pl.col("expert_ffn_dim").is_null(),
         "expert_ffn_dim=ffn_dim (not stated: experts as wide as the dense MLP)")
    note(pl.col("n_kv_heads").is_null(), "n_kv_heads=n_heads")
    note(pl.col("vocab").is_null(), "vocab=51200")
    note((on_xla | xla_gpu) & (pl.col("recompute") == "full").fill_null(False), XLA_REMAT_NOTE)

    out = r.with_columns(
        pl.when(xla_gpu).then(pl.lit(1.0)).otherwise(pl.lit(None, dtype=pl.Float64)).alias("xla_compiled"),
        pl.col("sharding").is_null().alias("sharding_from_default"),  # a recipe may say otherwise (recipe_memory)
        pl.coalesce(pl.col("sharding"), st.default_sharding(stacks, pl.col("memory_preset"))).alias("sharding"),
        pl.col("recompute").replace("unknown", None).alias("recompute"),
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
        sr.software_preset.alias("software_preset"),
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
    # TPUs: whether the run's XLA overlaps its TP collectives (its era), said where it has TP traffic
    early = on_xla & (pl.col("year").fill_null(XLA_ASYNC_COLLECTIVES_YEAR) < XLA_ASYNC_COLLECTIVES_YEAR)
    has_tp = pl.col("tp") > 1
    tp_note = (pl.when(early & has_tp).then(pl.lit(f"TP traffic exposed (a TPU run before XLA's async collectives, "
                                                   f"{XLA_ASYNC_COLLECTIVES_YEAR})"))
               .when(on_xla & has_tp).then(pl.lit(XLA_TP_NOTE)))
    out = out.with_columns(
        pl.when(early).then(pl.lit(0.0)).otherwise(pl.lit(None, dtype=pl.Float64)).alias("xla_async_collectives"),
        pl.concat_str([pl.col("assumptions"), tp_note], separator="; ", ignore_nulls=True).str.strip_chars("; ")
        .replace("", None).alias("assumptions"))
    out = infer_layout(out, stacks)
    out = recipe_micro_batch(out, recipes)  # a summary row that states another system's micro-batch
    out = _recipe_moe_options(out, recipes)
    # a scale-up domain that spans hosts (a TPU pod's ICI, an NVL72 rack's NVLink Switch trays): a stated count
    # below it is one host's (4 TPU chips or 4 GB200s per host), not the domain (HOST_SPANNING_DOMAIN_NOTE)
    domain = pl.min_horizontal(pl.col("scaleup_size"), pl.col("n_gpus"))
    host_count = (spans_hosts(pl.col("scaleup_size"), pl.col("accelerators_per_host"))
                  & pl.col("gpus_per_node").is_not_null() & (pl.col("gpus_per_node") < domain)).fill_null(False)
    out = out.with_columns(
        pl.when(host_count).then(domain).otherwise(pl.coalesce(pl.col("gpus_per_node"), domain))
        .cast(pl.Int64).alias("gpus_per_node"),
        pl.concat_str([pl.col("assumptions"), pl.when(host_count).then(pl.format(
            HOST_SPANNING_DOMAIN_NOTE, pl.col("gpus_per_node"),
            pl.when(pl.col("scaleup_link") == "ici").then(pl.lit("the pod's ICI")).otherwise(pl.lit("NVLink Switch")),
            pl.col("gpu"), domain.cast(pl.Int64)))],
            separator="; ", ignore_nulls=True).alias("assumptions"),
        # a preset that does not say (Megatron-DeepSpeed, an unknown stack): a Megatron stack's tp, or any tp from
        # UNKNOWN_STACK_SP_YEAR on
        st.sequence_parallel_default(stacks, pl.col("memory_preset"), pl.col("tp"), (pl.col("tp") > 1) & (
            megatron | (pl.col("year").fill_null(UNKNOWN_STACK_SP_YEAR) >= UNKNOWN_STACK_SP_YEAR))),
        st.pipeline_micro_batch(stacks, pl.col("memory_preset"), pl.col("micro_batch"), pl.col("pp"), pl.col("vpp")),
    )
    if "gpu_as_reported" in out.columns:  # a capacity the source states wins (e.g. Grand Teton H100s, 96 GB)
        out = out.with_columns(pl.coalesce(fw.reported_memory_gb("gpu_as_reported"), pl.col("memory_gb"))
                               .alias("memory_gb"))
    out = _lora_fraction(out)
    out = resolve_mtp_layers(out)
    out = resolve_layers_16bit(out)
    out = recipe_memory(out, recipes).drop("sharding_from_default", strict=False)  # what a named recipe sets:
    # recompute, activation offloading, Megatron-FSDP (models.corpus.recipes)
    era_full = (pl.col("recompute").is_null() & megatron
                & (pl.col("year").fill_null(2100) < SELECTIVE_RECOMPUTE_YEAR))
    out = out.with_columns(
        pl.when(era_full).then(pl.lit("full")).otherwise(pl.col("recompute")).alias("recompute"),
        pl.when(era_full).then(pl.concat_str([pl.col("assumptions"), pl.lit(
            "recompute=full (Megatron before selective recomputation: every layer's activations recomputed)")],
            separator="; ", ignore_nulls=True)).otherwise(pl.col("assumptions")).alias("assumptions"))
    out = recipe_fp8_params(out, recipes)  # a named recipe's FP8 weights (fp8_param_gather)
    out = recipe_optimizer(out, recipes)  # a named recipe's optimizer state and gradient bytes
    out = recipe_run_memory(out, recipes)  # what a measured run's own settings set for memory (per run)
    out, hybrid = hybrid_problems(out)
    problems = [
        pl.when(pl.col("n_gpus").is_null()).then(pl.lit(
            "n_gpus not stated: give the accelerator count (n_gpus, or a header such as '# GPUs' or 'Number of "
            "GPUs'), or nodes with gpus_per_node; a whole-run total without it cannot be predicted")),
        pl.when(pl.col("n_layers").is_null() | pl.col("d_model").is_null() | pl.col("n_heads").is_null())
        .then(pl.concat_str([pl.lit("architecture shape unknown (no n_layers/d_model/n_heads and no architectures "
                                    "alias)"),
                             pl.col("model_name_error") if "model_name_error" in out.columns else pl.lit(None)],
                            separator=": ", ignore_nulls=True)),
        pl.when((pl.col("arch") != "dense") & ~pl.col("arch").str.contains("hybrid") & (pl.col("n_experts") == 0))
        .then(pl.format("{} architecture without expert shapes: give n_experts and top_k (and expert_ffn_dim), or "
                        "name a model of measurements/architectures.csv", pl.col("arch"))),
        pl.when((pl.col("n_experts") > 0) & (pl.col("top_k") <= 0))
        .then(pl.lit("n_experts stated without top_k: give the experts each token is routed to (top_k)")),
        hybrid,
        pl.when(pl.col("gpu").is_null()).then(pl.lit(
            "no accelerator stated: give a gpu column (an id or a name such as h100-sxm5-80gb, 'H100' or 'TPU v5p')"))
        .when(pl.col("scaleup_size").is_null()).then(pl.lit("hardware not resolvable")),
    ]
    if "hardware_error" in out.columns:
        problems.append(pl.col("hardware_error"))
    return out.with_columns(pl.concat_str(problems, separator="; ", ignore_nulls=True).replace("", None)
                            .alias("config_error"))


def _mtp_words(col: str = "model_name") -> tuple[pl.Expr, pl.Expr]:
    """(says without MTP, says with MTP) of a model name, compared without case and spaces: "w/o MTP" or
    "without MTP"; "w/ MTP" or "with MTP"."""
    key = pl.col(col).cast(pl.Utf8).fill_null("").str.to_lowercase().str.replace_all(r"\s+", "")
    without = key.str.contains("w/omtp", literal=True) | key.str.contains("withoutmtp", literal=True)
    with_ = ~without & (key.str.contains("w/mtp", literal=True) | key.str.contains("withmtp", literal=True))
    return without, with_


def resolve_mtp_layers(frame: pl.DataFrame) -> pl.DataFrame:
    """`mtp_layers` a run trains with (models.arch.mla; the module docstring's rule): 0 when its model_name says
    "w/o MTP", else the architecture table's value (filled into `mtp_layers` before), recorded in `assumptions`.
    A frame without an `mtp_layers` column, or rows with none, are left alone (no MTP); hybrid rows (a
    `layer_pattern`) get none: their MTP modules are not modelled."""
    if "mtp_layers" not in frame.columns or not frame.height:
        return frame
    name = "model_name" if "model_name" in frame.columns else None
    without, with_ = _mtp_words(name) if name else (pl.lit(False), pl.lit(False))
    d = pl.col("mtp_layers").cast(pl.Float64, strict=False)
    if "layer_pattern" in frame.columns:  # hybrids: MTP is not modelled (models.arch.mla), their rows train without
        d = pl.when(pl.col("layer_pattern").is_null()).then(d)
    has = d.is_not_null() & (d > 0)
    why = (pl.when(without).then(pl.lit("mtp_layers=0 (model_name says w/o MTP)"))
           .when(has & with_).then(pl.format("mtp_layers={} (model_name says w/ MTP)", d.cast(pl.Int64)))
           .when(has).then(pl.format("mtp_layers={} (architecture table; model_name does not say)", d.cast(pl.Int64))))
    return frame.with_columns(
        pl.when(without).then(pl.lit(0.0)).otherwise(d).alias("mtp_layers"),
        pl.when(why.is_not_null()).then(pl.concat_str([pl.col("assumptions"), why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


def resolve_layers_16bit(frame: pl.DataFrame) -> pl.DataFrame:
    """`n_layers_16bit` of a low-precision run that does not state it: the layers its model's published recipe
    keeps in BF16 (`models.core.precision.RECIPE_LAYERS_16BIT`, by architecture id and dtype), recorded in
    `assumptions`; none otherwise."""

    if not frame.height or "arch_id" not in frame.columns or "dtype" not in frame.columns:
        return frame
    if "n_layers_16bit" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("n_layers_16bit"))
    key = pl.concat_str([pl.col("arch_id").cast(pl.Utf8).str.to_lowercase(),
                         pl.col("dtype").cast(pl.Utf8).str.to_lowercase()], separator="|")
    n = key.replace_strict({f"{a}|{d}": float(v) for (a, d), v in RECIPE_LAYERS_16BIT.items()}, default=None,
                           return_dtype=pl.Float64)
    why = key.replace_strict({f"{a}|{d}": f"n_layers_16bit={v} ({RECIPE_SOURCE[(a, d)]})"
                              for (a, d), v in RECIPE_LAYERS_16BIT.items()}, default=None, return_dtype=pl.Utf8)
    fill = pl.col("n_layers_16bit").is_null() & n.is_not_null()
    return frame.with_columns(
        pl.when(fill).then(n).otherwise(pl.col("n_layers_16bit").cast(pl.Float64, strict=False)).alias("n_layers_16bit"),
        pl.when(fill).then(pl.concat_str([pl.col("assumptions"), why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


#: what a hybrid row needs for the step-time model (models.arch.mamba; chunk size and conv width have defaults):
#: Mamba-2 mixers the heads, head dim, groups and state size; Mamba-1 mixers (Jamba) the dt rank and state size
#: (expand defaults to 2)
HYBRID_SHAPE_COLUMNS = ("layer_pattern", "mamba_n_heads", "mamba_head_dim", "mamba_n_groups", "mamba_state_dim")
MAMBA1_SHAPE_COLUMNS = ("mamba_dt_rank", "mamba_state_dim")


def hybrid_problems(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.Expr]:
    """Why a hybrid row cannot be predicted, as an expression over `frame` (null for a row that can), and `frame`
    with the hybrid shape columns it lacks added empty. Hybrids are modelled block by block (models.arch.mamba) when the
    row has a layer_pattern and, with Mamba blocks, the Mamba-2 heads, head dim, groups and state size (Mamba-1
    blocks: the dt rank and state size); and its
    counted parameters are within HYBRID_SIZE_TOLERANCE of the architecture table's stated size (`arch_params_b`)
    - else a part of the shape is missing from the table (Nemotron 3 Super's latent MoE width, moe_latent_size)
    and a prediction would rest on a wrong model. `configs_from_runs` and `stepcast predict` refuse with it."""

    frame = frame.with_columns([pl.lit(None, dtype=pl.Utf8 if c == "layer_pattern" else pl.Int64).alias(c)
                                for c in (*HYBRID_SHAPE_COLUMNS, *MAMBA1_SHAPE_COLUMNS) if c not in frame.columns])
    mamba = pl.col("layer_pattern").cast(pl.Utf8).str.contains("M", literal=True).fill_null(True)
    mamba2 = pl.all_horizontal([pl.col(c).is_not_null() for c in HYBRID_SHAPE_COLUMNS[1:]])
    mamba1 = pl.all_horizontal([pl.col(c).is_not_null() for c in MAMBA1_SHAPE_COLUMNS]) \
        & pl.col("mamba_n_heads").is_null()
    shape = pl.col("layer_pattern").is_not_null() & (~mamba | mamba2 | mamba1)
    incomplete = pl.when(pl.col("arch").str.contains("hybrid") & ~shape).then(pl.format(
        "{} architecture without a complete Mamba shape (layer_pattern with, for Mamba-2 mixers, mamba_n_heads, "
        "mamba_head_dim, mamba_n_groups, mamba_state_dim; for Mamba-1 mixers such as Jamba's, mamba_dt_rank and "
        "mamba_state_dim)", pl.col("arch")))
    if "arch_params_b" not in frame.columns or not frame.height:
        return frame, incomplete
    counted = pl.Series(hybrid_params_b(frame))
    off = (counted / pl.col("arch_params_b") - 1.0).abs() > HYBRID_SIZE_TOLERANCE
    size = pl.when(pl.col("layer_pattern").is_not_null() & off).then(pl.format(
        "hybrid shape incomplete: {} B parameters counted, the architecture table states {} B (a part such as a "
        "latent MoE width, moe_latent_size, is not in the table)", counted.round(1),
        pl.col("arch_params_b").cast(pl.Utf8).str.replace(r"\.0$", "")))  # 120, not 120.0
    return frame, pl.coalesce(incomplete, size)


#: counted vs stated size of a hybrid row beyond which its table shape is taken as incomplete (nominal sizes in
#: model names are rounded: Nemotron 3 Nano "30B" is 31.6 B)
HYBRID_SIZE_TOLERANCE = 0.25


def _lora_fraction(out: pl.DataFrame) -> pl.DataFrame:
    """`trainable_frac`: the share of parameters a LoRA run trains (models.memory.presets, NeMo's rank-32 adapters);
    1 for full training."""

    if "model_name" not in out.columns or not out.height:
        return out.with_columns(pl.lit(1.0).alias("trainable_frac"))
    lora = out.select(fw.finetune_mode("model_name"))["finetune_mode"].to_numpy() == "lora"
    if not lora.any():
        return out.with_columns(pl.lit(1.0).alias("trainable_frac"))
    cols = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab", "n_experts", "top_k",
            "expert_ffn_dim", "n_shared_experts", "n_dense_layers", "tied_embeddings")
    arr = {c: out[c].cast(pl.Float64, strict=False).fill_null(np.nan).to_numpy() for c in cols if c in out.columns}
    arr["activation"] = (out["activation"] == "swiglu").cast(pl.Float64).to_numpy()
    arch = normalize_arch(arr)
    params = param_counts(arch, normalized=True)["params"]
    hd = arch["head_dim"]
    frac = fw.lora_trainable_frac(arch["n_layers"], arch["d_model"], arch["n_heads"] * hd, arch["n_kv_heads"] * hd,
                                  arch["ffn_dim"], arr["activation"], params)
    frac = np.where(lora & np.isfinite(frac), np.clip(frac, 0.0, 1.0), 1.0)
    return out.with_columns(pl.Series("trainable_frac", frac))


#: model-parallel layouts tried, in order, for a run that states none and whose sharding shards the weights (FSDP
#: class) or whose stack is a 2021-22 Megatron one: tp inside the node first, then pp
LAYOUT_CANDIDATES = ((1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4), (8, 8), (8, 16), (8, 32), (8, 64))
#: degrees `resolve_layout` searches for a run of another stack that states no layout: tp (up to the scale-up
#: domain, dividing the heads) and pp (up to the layers: these powers of two and every divisor of the layer count,
#: `search_pp`), and for an MoE run that states no ep every power of two dividing the experts and dp x cp; cp and
#: the micro-batch keep their rules (stated, else 1: searching them too chose context parallelism for 2,048-token
#: GPT-3 runs and scored worse on runs outside the corpus)
SEARCH_TP = (1, 2, 4, 8, 16, 32, 64)
SEARCH_PP = (1, 2, 4, 8, 16, 32, 64)


def search_pp(n_layers: float) -> list[int]:
    """The pipeline degrees searched for a model of `n_layers` layers: SEARCH_PP and every divisor of the layer
    count, none above it. A cluster whose GPU count has an odd factor needs a pipeline degree with it: MT-NLG 530B
    (105 layers) ran tp 8 x pp 35 x dp 12 on 3,360 GPUs (Smith et al. 2022, section 2.3), where powers of two
    leave a data-parallel degree of 105/8ths that no batch of 1,920 divides."""
    if not np.isfinite(n_layers) or n_layers < 1:
        return [p for p in SEARCH_PP if p == 1]
    L = int(n_layers)
    return sorted({p for p in SEARCH_PP if p <= L} | {d for d in range(1, L + 1) if L % d == 0})


_LAYOUT_NOTES = r"tp=1 \(not stated\); |pp=1 \(not stated\); |vpp=1 \(not stated\); "


def _strip_layout_notes(col: str = "assumptions") -> pl.Expr:
    return pl.col(col).str.replace_all(_LAYOUT_NOTES, "").str.replace_all(
        r"vpp=\d+ \(interleaved in chunks of \d+ layers: the stack's typical schedule at pp > 1\); ", "")


def _search_candidates(todo: pl.DataFrame) -> pl.DataFrame:
    """Every layout `resolve_layout` weighs for the rows of `todo` (a `_row` column and the row's fixed inputs):
    `_row`, tp, pp, cp, dp, ep, micro_batch, vpp, valid by divisibility (the model judges the rest). vpp follows
    the stack's typical interleave (`typical_vpp`) unless the row states one."""
    g = lambda c, d=np.nan: todo[c].cast(pl.Float64).fill_null(d).to_numpy() if c in todo.columns \
        else np.full(todo.height, d)  # noqa: E731
    n, B, heads, node, L = g("n_gpus"), g("global_batch_seqs"), g("n_heads"), g("scaleup_size", 8.0), g("n_layers")
    E = np.nan_to_num(g("n_experts", 0.0), nan=0.0)
    cp, mb, ep0, vpp0 = g("cp", 1.0), g("micro_batch", 1.0), g("ep", 1.0), g("vpp", 1.0)
    ep_open = todo["ep_unstated"].fill_null(False).to_numpy() if "ep_unstated" in todo.columns \
        else np.zeros(todo.height, bool)
    vpp_st = todo["vpp_stated"].fill_null(False).to_numpy() if "vpp_stated" in todo.columns \
        else np.zeros(todo.height, bool)
    rows = []  # (row of todo, tp, pp, dp, ep)
    for i in range(todo.height):
        # layouts whose dp tiles the batch; where none does (a stated batch and a GPU count with a factor no
        # layout tried absorbs), every layout, the batch then read as the nearest that tiles (`resolve_batch_tiling`)
        for tiled in (True, False):
            for tp in SEARCH_TP:
                if tp > node[i] or np.mod(heads[i], tp):
                    continue
                for pp in search_pp(L[i]):
                    dp = n[i] / (tp * pp * cp[i])
                    if dp < 1 or dp != np.floor(dp) or (tiled and np.mod(B[i], dp * mb[i])):
                        continue
                    eps = [e for e in (2 ** k for k in range(11)) if e <= E[i] and not np.mod(E[i], e)
                           and not np.mod(dp * cp[i], e)] if (ep_open[i] and E[i] > 0) else [ep0[i]]
                    rows.extend((i, tp, pp, dp, ep) for ep in eps)
            if rows and rows[-1][0] == i:
                break
    i, tp, pp, dp, ep = (np.array(c, dtype=float) for c in zip(*rows)) if rows else (np.zeros(0),) * 5
    i = i.astype(int)
    v_typ = typical_vpp(_interleaving_stack(todo)[i] & ~vpp_st[i], L[i], pp, B[i] / (dp * mb[i]))
    vpp = np.where(vpp_st[i], vpp0[i], np.nan_to_num(v_typ, nan=1.0))
    return pl.DataFrame({"_row": todo["_row"].to_numpy()[i].astype(np.int64), "tp": tp, "pp": pp, "cp": cp[i],
                         "dp": dp, "ep": ep, "micro_batch": mb[i], "vpp": vpp})


def _prediction(configs: pl.DataFrame, predict, judge=None) -> pl.DataFrame:
    """The prediction frame (feasible, step_time_s, memory_gb_per_gpu, ...) of `configs`: `judge`'s (configs ->
    prediction frame; `stepcast predict --runs` passes the served model, which ranks as `stepcast search` does), or
    the physics `predict` with each row's software preset. The memory model has no fitted constant, so both say
    the same of what fits."""
    return judge(configs) if judge is not None else predict_by_preset(configs, predict)


def _fastest_layout(todo: pl.DataFrame, predict, judge=None) -> pl.DataFrame:
    """For each row of `todo` (with `_row`), the fastest of `_search_candidates` (`_prediction`) that fits in memory
    with the row's recompute (selective where unstated), else the one needing the least memory per GPU: columns
    `_row`, tp, pp, cp, dp, ep, micro_batch, vpp, `_fits`."""
    cand = _search_candidates(todo)
    if not cand.height:
        return cand.with_columns(pl.lit(False).alias("_fits"))
    lay = ("tp", "pp", "cp", "dp", "ep", "micro_batch", "vpp")
    base = todo.with_columns(pl.col("recompute").fill_null("selective"))
    trial = cand.join(base.drop(*lay, strict=False), on="_row", how="left").with_columns(
        *[pl.col(c).cast(pl.Int64) for c in lay], (pl.col("tp") > 1).alias("sequence_parallel")).drop("_row")
    # a batch no layout tiles: the nearest that tiles (resolve_batch_tiling)
    trial = trial.with_columns(pl.Series("global_batch_seqs", nearest_tiling(
        trial["global_batch_seqs"].cast(pl.Float64).to_numpy(),
        (trial["dp"] * trial["micro_batch"]).cast(pl.Float64).to_numpy()), nan_to_null=True).cast(pl.Int64))
    pred = _prediction(trial, predict, judge)
    open_ = trial["sharding_open"].fill_null(False) & (trial["sharding"] == "none") \
        if "sharding_open" in trial.columns else pl.Series([False] * trial.height)
    fits = pred["feasible"].fill_null(False)
    step = pred["step_time_s"].cast(pl.Float64)
    if (open_ & ~fits).any():  # an open sharding may be read as ZeRO-3 (`resolve_sharding`)
        z3 = _prediction(trial.with_columns(pl.lit("zero3").alias("sharding")), predict, judge)
        use = (open_ & ~fits & z3["feasible"].fill_null(False))
        step = pl.select(pl.when(use).then(z3["step_time_s"].cast(pl.Float64)).otherwise(step)).to_series()
        fits = fits | use
    scored = cand.with_columns(pl.Series("_fits", fits), pl.Series("_step", step),
                               pl.Series("_mem", pred["memory_gb_per_gpu"].cast(pl.Float64)))
    ok = scored.filter(pl.col("_step").is_finite() & pl.col("_step").is_not_null())
    best_fit = ok.filter(pl.col("_fits")).sort("_row", "_step").group_by("_row", maintain_order=True).first()
    rest = ok.filter(~pl.col("_row").is_in(best_fit["_row"].to_list()) & pl.col("_mem").is_finite()) \
        .sort("_row", "_mem").group_by("_row", maintain_order=True).first()
    return pl.concat([best_fit, rest]).drop("_step", "_mem")


def resolve_layout(configs: pl.DataFrame, predict, judge=None) -> pl.DataFrame:
    """Runs that state no layout at all (`layout_unstated`).

    A run of a stack that shards its weights over the data-parallel ranks (fsdp, hsdp, zero3: FSDP stacks start from
    pure data parallelism), or of a 2021-22 Megatron stack (software preset `megatron_2022`: tensor parallelism
    inside the node first, pipeline across, as Narayanan et al. 2021 section 3.3 lay out, with no interleave), that
    cannot run as pure data parallel (the batch does not split over n_gpus replicas, or the model does not fit): the
    first of LAYOUT_CANDIDATES (then tp 8 with each other divisor of the layer count, ascending: `search_pp`) whose
    tp fits the scale-up domain and divides the heads, whose dp divides the batch and that fits in memory with the
    recompute the run will be predicted with: its stated one, else selective (the most `resolve_recompute` ever
    assumes for a measured run). Where none fits, the valid candidate whose dp divides the batch with the least
    memory per GPU.

    Any other run: the fastest layout the model finds among the valid ones that fit in memory with that recompute
    (`_search_candidates`: tp, pp (powers of two and the divisors of the layer count) and an MoE run's unstated
    ep; cp and the micro-batch by their own rules, vpp by the stack's typical interleave), else the one needing the
    least memory. A published measurement is of a tuned run, and its tuner chose by speed, as `stepcast search`
    ranks; the smallest model parallelism that fits, the rule before, put a 671B MoE on tp 8 x pp 16 with every
    expert on every GPU.
    `predict` is `models.physics.step_time.predict`; `judge` (configs -> prediction frame), where given, predicts the
    layouts instead (`_prediction`: `stepcast predict --runs` passes the served model)."""
    drop = ("vpp_stated",)
    if "layout_unstated" not in configs.columns or not configs["layout_unstated"].any():
        return configs.drop(*drop, strict=False)
    df = configs.with_row_index("_row")
    todo_all = df.filter(pl.col("layout_unstated"))
    # FSDP-class stacks and 2021-22 Megatron stacks keep the first-fitting rule (docstring)
    first = todo_all["sharding"].fill_null("none").is_in(list(WEIGHT_SHARDING)).to_numpy()
    if "software_preset" in todo_all.columns:
        first |= (todo_all["software_preset"] == "megatron_2022").fill_null(False).to_numpy()
    fitting = todo_all.filter(pl.Series(first))
    searched = todo_all.filter(pl.Series(~first))
    parts = [df.filter(~pl.col("layout_unstated"))]
    if searched.height:
        best = _fastest_layout(searched, predict, judge)
        cols = ("tp", "pp", "cp", "dp", "ep", "micro_batch", "vpp")
        upd = searched.drop(*cols).join(best, on="_row", how="left")
        got = upd["_fits"].is_not_null()
        fits = upd["_fits"].fill_null(False)
        upd = upd.with_columns(
            *[pl.coalesce(pl.col(c).cast(pl.Int64), searched[c]) for c in cols],
        ).with_columns(
            pl.when(pl.Series(got)).then(pl.col("tp") > 1).otherwise(pl.col("sequence_parallel"))
            .alias("sequence_parallel"),
            pl.when(pl.Series(got)).then(pl.concat_str([_strip_layout_notes(), pl.format(
                "{} ({})", pl.when(pl.col("n_experts").cast(pl.Float64).fill_null(0.0) > 0).then(pl.format(
                    "tp={}, pp={}, ep={}, vpp={}", "tp", "pp", "ep", "vpp")).otherwise(pl.format(
                    "tp={}, pp={}, vpp={}", "tp", "pp", "vpp")), pl.when(pl.Series(fits)).then(pl.lit(
                    "no layout stated: the fastest valid layout the model finds that fits in memory, as a published "
                    "run is a tuned one")).otherwise(pl.lit(
                    "no layout stated and none fits the memory model: the layout needing the least memory per "
                    "GPU")))], separator="; ", ignore_nulls=True).str.strip_chars("; "))
            .otherwise(pl.col("assumptions")).alias("assumptions"),
        ).drop("_fits")
        if "ep_unstated" in upd.columns:  # the search chose the ep of an MoE run that states none
            upd = upd.with_columns((pl.col("ep_unstated").fill_null(False) & ~pl.Series(got)).alias("ep_unstated"))
        parts.append(upd.select(df.columns))
    if fitting.height:
        parts.append(_first_fitting_layout(fitting, predict).select(df.columns))
    return pl.concat(parts, how="vertical_relaxed").sort("_row").drop("_row", *drop)


def _first_fitting_layout(todo: pl.DataFrame, predict) -> pl.DataFrame:
    """`resolve_layout` for FSDP-class and 2021-22 Megatron rows (with `_row`): the first of LAYOUT_CANDIDATES that
    fits."""
    trial0 = todo.drop("_row").with_columns(pl.col("recompute").fill_null("selective").alias("recompute"))
    ok0 = predict_by_preset(trial0, predict)["feasible"].to_numpy()
    B = todo["global_batch_seqs"].cast(pl.Float64).to_numpy()
    n = todo["n_gpus"].cast(pl.Float64).to_numpy()
    need = ~ok0 | (np.mod(B, n) != 0)
    chosen_tp = np.full(todo.height, np.nan)
    chosen_pp = np.full(todo.height, np.nan)
    heads = todo["n_heads"].cast(pl.Float64).to_numpy()
    node = todo["scaleup_size"].cast(pl.Float64).to_numpy()
    # the least-memory valid candidate of each row, for rows no candidate fits (its memory figure: finite only for
    # a row whose inputs are valid apart from memory)
    least_mem = np.full(todo.height, np.inf)
    least_tp = np.full(todo.height, np.nan)
    least_pp = np.full(todo.height, np.nan)
    # a stated micro-batch is kept (it must tile each replica's batch), else 1
    mbv = np.where(todo["micro_batch_stated"].fill_null(False).to_numpy(),
                   todo["micro_batch"].cast(pl.Float64).fill_null(1.0).to_numpy(), 1.0) \
        if "micro_batch_stated" in todo.columns else np.ones(todo.height)
    # rows whose sharding is open (`resolve_sharding` may read them sharded) fit a layout that fits with ZeRO-3
    open_ = todo["sharding_open"].fill_null(False).to_numpy() & (todo["sharding"] == "none").to_numpy() \
        if "sharding_open" in todo.columns else np.zeros(todo.height, dtype=bool)
    # then tp 8 with the other divisors of the layer count (`search_pp`: a GPU count with an odd factor)
    L = todo["n_layers"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    more = sorted({d for x in np.unique(L[need & np.isfinite(L)]) for d in search_pp(x)} - set(SEARCH_PP))
    for tp, pp in LAYOUT_CANDIDATES + tuple((8, d) for d in more):
        left = need & np.isnan(chosen_tp)
        if not left.any():
            break
        dp = n / (tp * pp)
        cand = left & (dp >= 1) & (dp == np.floor(dp)) & (tp <= node) & (np.mod(heads, tp) == 0)
        if pp not in SEARCH_PP:
            cand &= np.mod(L, pp) == 0
        cand &= np.mod(B, np.where(dp >= 1, dp, 1.0) * mbv) == 0
        if not cand.any():
            continue
        trial = trial0.with_columns(pl.lit(tp).alias("tp"), pl.lit(pp).alias("pp"),
                                    pl.Series("dp", np.maximum(np.floor(dp), 1.0)).cast(pl.Int64),
                                    pl.Series("micro_batch", mbv).cast(pl.Int64),
                                    pl.lit(tp > 1).alias("sequence_parallel"))
        pred = predict_by_preset(trial, predict)
        fits = pred["feasible"].to_numpy()
        if (cand & open_ & ~fits).any():
            fits = fits | (open_ & predict_by_preset(trial.with_columns(pl.lit("zero3").alias("sharding")),
                                                     predict)["feasible"].to_numpy())
        hit = cand & fits
        chosen_tp[hit], chosen_pp[hit] = tp, pp
        mem = pred["memory_gb_per_gpu"].cast(pl.Float64).fill_null(np.nan).to_numpy()
        less = cand & ~fits & np.isfinite(mem) & (mem < least_mem)
        least_mem[less], least_tp[less], least_pp[less] = mem[less], tp, pp
    got = np.isfinite(chosen_tp)
    least = need & ~got & np.isfinite(least_tp)  # nothing fits: the layout needing the least memory per GPU
    chosen_tp[least], chosen_pp[least] = least_tp[least], least_pp[least]
    if not (got | least).any():
        return todo
    why = np.where(least, "no layout stated and none fits the memory model: the layout needing the least memory "
                          "per GPU", "no layout stated: the smallest model parallelism that fits and splits the batch")
    got = got | least
    tpv = np.where(got, chosen_tp, todo["tp"].cast(pl.Float64).to_numpy())
    ppv = np.where(got, chosen_pp, todo["pp"].cast(pl.Float64).to_numpy())
    return todo.with_columns(
        pl.Series("tp", tpv).cast(pl.Int64), pl.Series("pp", ppv).cast(pl.Int64),
        pl.Series("dp", np.where(got, n / (tpv * ppv), todo["dp"].cast(pl.Float64).to_numpy())).cast(pl.Int64),
        pl.when(pl.Series(got)).then(pl.Series(mbv).cast(pl.Int64)).otherwise(pl.col("micro_batch"))
        .alias("micro_batch"),
        pl.when(pl.Series(got)).then(pl.Series(tpv) > 1).otherwise(pl.col("sequence_parallel"))
        .alias("sequence_parallel"),
        pl.when(pl.Series(got)).then(pl.concat_str([pl.col("assumptions"), pl.format(
            "tp={}, pp={} ({})", pl.Series(tpv).cast(pl.Int64), pl.Series(ppv).cast(pl.Int64), pl.Series(why))],
            separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    ).with_columns(  # the (tp=1, pp=1) notes no longer apply
        pl.col("assumptions").str.replace_all(r"tp=1 \(not stated\); |pp=1 \(not stated\); ", ""))


def _measured_rows(configs: pl.DataFrame, measured) -> pl.Series:
    """The resolvers' `measured` argument as a boolean Series per row of `configs`: None means every row (the
    corpus, whose runs all carry a measurement); nulls are rows without one."""
    return pl.Series([True] * configs.height) if measured is None else pl.Series(measured).fill_null(False)


def nearest_tiling(batch: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """`batch` where it splits into `unit` (dp x micro-batch) sequences, else the nearest multiple of `unit`, at
    least one (`resolve_batch_tiling`)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        off = np.isfinite(batch) & np.isfinite(unit) & (unit >= 1) & (np.mod(batch, unit) != 0)
        return np.where(off, np.maximum(np.round(batch / np.where(off, unit, 1.0)), 1.0) * unit, batch)


#: micro-batches `resolve_micro_batch` weighs for a measured run that states none
SEARCH_MICRO_BATCH = (1, 2, 4, 8, 16, 32)


def resolve_micro_batch(configs: pl.DataFrame, predict, measured=None, judge=None) -> pl.DataFrame:
    """A measured run that states no micro-batch: of SEARCH_MICRO_BATCH dividing its per-replica batch (B / dp; an
    FSDP stack's run that states no batch either takes no gradient accumulation, so its batch is dp x micro-batch
    and every candidate qualifies), the fastest in sequences per second (`_prediction`) that fits in memory with
    its recompute (selective where unstated); where none fits, 1. Drops `micro_batch_stated`, `batch_per_replica`."""
    drop = ("micro_batch_stated", "batch_per_replica")
    if "micro_batch_stated" not in configs.columns:
        return configs.drop(*drop, strict=False)
    measured = _measured_rows(configs, measured)
    todo = (~configs["micro_batch_stated"].fill_null(True) & measured).to_numpy()
    if not todo.any():
        return configs.drop(*drop, strict=False)
    sub = configs.filter(pl.Series(todo)).with_columns(pl.col("recompute").fill_null(INFERRED_RECOMPUTE[-1]))
    per_rep = sub["batch_per_replica"].fill_null(False).to_numpy() if "batch_per_replica" in sub.columns \
        else np.zeros(sub.height, bool)
    B, dp = sub["global_batch_seqs"].cast(pl.Float64).to_numpy(), sub["dp"].cast(pl.Float64).to_numpy()
    best, best_tput = sub["micro_batch"].cast(pl.Float64).to_numpy(), np.full(sub.height, -np.inf)
    for mb in SEARCH_MICRO_BATCH:
        Bc = np.where(per_rep, dp * mb, B)
        valid = np.isfinite(Bc) & (np.mod(Bc, dp * mb) == 0)
        if not valid.any():
            continue
        pred = _prediction(sub.with_columns(pl.lit(mb).cast(pl.Int64).alias("micro_batch"),
                                            pl.Series("global_batch_seqs", Bc).cast(pl.Int64)).filter(pl.Series(valid)),
                           predict, judge)
        tput = np.full(sub.height, -np.inf)  # sequences per second: the batch may move with the micro-batch
        tput[valid] = np.where(pred["feasible"].fill_null(False).to_numpy(),
                               Bc[valid] / pred["step_time_s"].cast(pl.Float64).fill_null(np.inf).to_numpy(), -np.inf)
        better = tput > best_tput
        best, best_tput = np.where(better, mb, best), np.where(better, tput, best_tput)
    mb0 = configs["micro_batch"].cast(pl.Float64).to_numpy()
    chosen = mb0.copy()
    chosen[todo] = best
    hit = chosen != mb0
    batch = configs["global_batch_seqs"].cast(pl.Float64).to_numpy()
    per_rep_all = np.zeros(configs.height, bool)
    per_rep_all[todo] = per_rep
    text = pl.Series([f"micro_batch={m:.0f} (not stated: the fastest that fits, as a published run is a tuned one)"
                      if h else None for m, h in zip(chosen, hit)], dtype=pl.Utf8)
    return configs.with_columns(
        pl.Series("micro_batch", chosen).cast(pl.Int64),
        pl.Series("global_batch_seqs", np.where(hit & per_rep_all, configs["dp"].cast(pl.Float64).to_numpy() * chosen,
                                                batch)).cast(pl.Int64),
        pl.when(pl.Series(hit)).then(pl.concat_str(
            [pl.col("assumptions").str.replace_all(r"(^|; )micro_batch=1(; |$)", "$1").str.strip_chars("; "), text],
            separator="; ", ignore_nulls=True)).otherwise(pl.col("assumptions")).alias("assumptions"),
    ).drop(*drop)


def resolve_batch_tiling(configs: pl.DataFrame, measured=None) -> pl.DataFrame:
    """A measured run whose global batch does not split into its data-parallel replicas' micro-batches (B not a
    multiple of dp x micro-batch: a stated batch beside a layout inferred, or stated, that cannot have run with it)
    is predicted with the nearest batch that does, at least one micro-batch per replica, and says so: the run ran,
    so some layout tiled its batch, and its throughput per GPU hardly moves with a batch a few percent off (its
    measured throughput keeps the batch as stated). Rows without a measurement keep the batch (and the error)."""
    need = ("global_batch_seqs", "dp", "micro_batch")
    if configs.height == 0 or any(c not in configs.columns for c in need):
        return configs
    measured = _measured_rows(configs, measured)
    B, dp, mb = (configs[c].cast(pl.Float64).to_numpy() for c in need)
    tiled = np.where(measured.to_numpy(), nearest_tiling(B, dp * mb), B)
    off = np.isfinite(B) & (tiled != B)
    if not off.any():
        return configs
    text = pl.Series([f"global_batch_seqs={t:.0f} (the stated {b:.0f} does not split into dp={d:.0f} x "
                      f"micro_batch={m:.0f}: the nearest batch that does)" if o else None
                      for t, b, d, m, o in zip(tiled, B, dp, mb, off)], dtype=pl.Utf8)
    return configs.with_columns(
        pl.Series("global_batch_seqs", tiled, nan_to_null=True).cast(pl.Int64),
        pl.concat_str([pl.col("assumptions"), text], separator="; ", ignore_nulls=True).alias("assumptions"),
    )


#: the shardings `resolve_sharding` tries, least first
INFERRED_SHARDING = ("zero1", "zero2", "zero3")


def resolve_sharding(configs: pl.DataFrame, predict, measured=None) -> pl.DataFrame:
    """A measured run with no sharding stated on a stack whose default is unknown (none named, or one
    `models.memory.stacks.framework_preset` does not know: `sharding_open`), dp > 1, that does not fit in the
    memory model unsharded: the least sharding that fits (`INFERRED_SHARDING`), with its stated recompute, else
    selective (the most `resolve_recompute` gives a measured run). A run that was measured fitted, and every
    data-parallel stack offers optimizer-state sharding; where none fits the row keeps `none` (its memory figure
    stays on the row, `memory_fits` False). Rows without a measurement keep the default. Drops `sharding_open`.
    `predict` is `models.physics.step_time.predict`."""
    if "sharding_open" not in configs.columns:
        return configs
    measured = _measured_rows(configs, measured)
    open_ = (configs["sharding_open"].fill_null(False) & measured & (configs["sharding"] == "none")
             & (configs["dp"].fill_null(1) > 1))
    if not open_.any():
        return configs.drop("sharding_open")
    rc = configs["recompute"].fill_null(INFERRED_RECOMPUTE[-1])
    fits_now = predict_by_preset(configs.with_columns(rc.alias("recompute")), predict)["feasible"]
    todo = open_ & ~fits_now
    chosen = pl.Series("sharding", [None] * configs.height, dtype=pl.Utf8)
    for mode in INFERRED_SHARDING:
        if not (todo & chosen.is_null()).any():
            break
        trial = configs.with_columns(rc.alias("recompute"), pl.lit(mode).alias("sharding"))
        fits = predict_by_preset(trial, predict)["feasible"]
        chosen = pl.select(pl.when(chosen.is_null() & todo & fits).then(pl.lit(mode)).otherwise(chosen)).to_series()
    hit = chosen.is_not_null()
    return configs.with_columns(
        pl.when(hit).then(chosen).otherwise(pl.col("sharding")).alias("sharding"),
        pl.when(hit).then(
            pl.concat_str([pl.col("assumptions"), pl.format(
                "sharding={} (no sharding stated, the stack's default unknown, and the measured run does not fit "
                "unsharded: the least sharding that fits)", chosen)], separator="; ", ignore_nulls=True
            ).str.strip_chars("; ")
        ).otherwise(pl.col("assumptions")).alias("assumptions"),
    ).drop("sharding_open")


#: sharding modes that shard the weights themselves (and so an MoE layer's experts) over the data-parallel ranks
WEIGHT_SHARDING = ("fsdp", "hsdp", "zero3")


def resolve_ep(configs: pl.DataFrame, predict, measured=None, judge=None) -> pl.DataFrame:
    """A measured MoE run that states no expert-parallel degree (`ep_unstated`) and whose sharding leaves the
    weights whole on every rank (not `WEIGHT_SHARDING`): of 1 and every power of two that divides the experts and
    dp x cp (the ranks Megatron-Core carves expert parallelism from with etp = tp), the fastest (`_prediction`)
    that fits with the run's recompute (selective where unstated); where none fits, the largest (the least expert
    memory). A published measurement is of a tuned run, and every MoE stack shards its experts (Megatron-Core's
    --expert-model-parallel-size, torchtitan's and MaxText's expert axis); the smallest degree that fits, the rule
    before, kept every expert on every GPU wherever that fitted. `measured`: a boolean Series per row (default:
    every row, as in the corpus). Rows that state ep keep it. `predict` is `models.physics.step_time.predict`."""
    if "ep_unstated" not in configs.columns:
        return configs
    measured = _measured_rows(configs, measured)
    # FSDP-class sharding (fsdp, hsdp, zero3) shards the expert weights already; EP is what shards them otherwise
    replicated = ~configs["sharding"].fill_null("none").is_in(list(WEIGHT_SHARDING))
    todo = (configs["ep_unstated"].fill_null(False) & measured & replicated).to_numpy()
    if not todo.any():
        return configs.drop("ep_unstated")
    sub = configs.filter(pl.Series(todo)).with_columns(pl.col("recompute").fill_null(INFERRED_RECOMPUTE[-1]))
    E = sub["n_experts"].cast(pl.Float64).fill_null(0.0).to_numpy()
    ranks = (sub["dp"].cast(pl.Float64).fill_null(1.0) * sub["cp"].cast(pl.Float64).fill_null(1.0)).to_numpy()
    best, best_t, largest = np.full(sub.height, np.nan), np.full(sub.height, np.inf), np.ones(sub.height)
    e = 1.0
    while (e <= np.maximum(np.minimum(E, ranks), 1.0)).any():
        valid = (np.mod(E, e) == 0) & (np.mod(ranks, e) == 0)
        if valid.any():
            pred = _prediction(sub.filter(pl.Series(valid)).with_columns(pl.lit(e).cast(pl.Int64).alias("ep")),
                               predict, judge)
            t = np.full(sub.height, np.inf)
            t[valid] = np.where(pred["feasible"].fill_null(False).to_numpy(),
                                pred["step_time_s"].cast(pl.Float64).fill_null(np.inf).to_numpy(), np.inf)
            better = t < best_t
            best, best_t = np.where(better, e, best), np.where(better, t, best_t)
            largest = np.where(valid, e, largest)
        e *= 2.0
    pick = np.where(np.isfinite(best), best, largest)
    why = np.where(np.isfinite(best), "the fastest expert-parallel degree dividing the experts and dp x cp that "
                   "fits, as a published run is a tuned one", "no degree fits: the largest dividing the experts and "
                   "dp x cp, the least expert memory")
    ep = configs["ep"].cast(pl.Float64).to_numpy().copy()
    notes = [None] * configs.height
    for j, (p, w) in zip(np.flatnonzero(todo), zip(pick, why)):
        if p > 1:
            ep[j], notes[j] = p, f"ep={p:.0f} (not stated: {w})"
    return configs.with_columns(
        pl.Series("ep", ep).cast(pl.Int64),
        pl.concat_str([pl.col("assumptions"), pl.Series(notes, dtype=pl.Utf8)], separator="; ", ignore_nulls=True)
        .str.strip_chars("; ").alias("assumptions"),
    ).drop("ep_unstated")


def resolve_recompute(configs: pl.DataFrame, predict, measured=None) -> pl.DataFrame:
    """Fill unknown recompute with the cheapest mode that fits: none, else selective; full only for a row that
    carries no measurement.

    A measured run fitted, so for it the memory model only chooses between none and selective: when neither fits
    in the memory model, the run gets selective (the model's memory figure stays on the row, `memory_fits` False),
    not full recompute, whose extra forward pass would turn the memory model's error into a third more compute
    (module docstring). A row without a measurement (a planned configuration) may resolve to full when nothing
    cheaper fits. `measured`: a boolean Series per row (default: every row is a measured run, as in the corpus).
    `predict` is `models.physics.step_time.predict` (passed in to keep this module free of import cycles)."""
    unknown = configs["recompute"].is_null()
    if not unknown.any():
        return configs.with_columns(pl.lit(False).alias("recompute_assumed"))
    measured = _measured_rows(configs, measured)
    chosen = pl.Series("recompute", [None] * configs.height, dtype=pl.Utf8)
    planned = ~measured & unknown  # rows without a measurement may still resolve to full
    for mode in INFERRED_RECOMPUTE + (("full",) if planned.any() else ()):
        trial = configs.with_columns(pl.lit(mode).alias("recompute"))
        fits = predict_by_preset(trial, predict)["feasible"]
        if mode not in INFERRED_RECOMPUTE:
            fits = fits & planned
        chosen = pl.select(pl.when(chosen.is_null() & fits).then(pl.lit(mode)).otherwise(chosen)).to_series()
    why = pl.select(pl.when(chosen.is_null() & measured).then(pl.lit(
        "measured, so it fitted: neither none nor selective fits the memory model, and full is never assumed for a "
        "measured run")).otherwise(pl.lit("cheapest that fits"))).to_series()
    chosen = pl.select(pl.when(chosen.is_not_null()).then(chosen).when(measured).then(pl.lit(INFERRED_RECOMPUTE[-1]))
                       .otherwise(pl.lit("full"))).to_series()
    return configs.with_columns(
        pl.when(unknown).then(chosen).otherwise(pl.col("recompute")).alias("recompute"),
        unknown.alias("recompute_assumed"),
        pl.when(unknown).then(
            pl.concat_str([pl.col("assumptions"), pl.format("recompute={} ({})", chosen, why)],
                          separator="; ", ignore_nulls=True).str.strip_chars("; ")
        ).otherwise(pl.col("assumptions")).alias("assumptions"),
    )


def resolve_unstated(configs: pl.DataFrame, predict, measured=None, judge=None) -> pl.DataFrame:
    """Every setting a run leaves out, in the one order the fit (`models.corpus.evaluate.prepare_configs`) and `stepcast
    predict --runs` share: the layout, the expert-parallel degree, the micro-batch, a batch that must tile, the
    sharding and the recompute (each `resolve_*` above). `measured`: a boolean Series per row (default: every row,
    as in the corpus); `judge` ranks the searched settings (`_prediction`: `predict --runs` passes the served
    model). `predict` is `models.physics.step_time.predict`."""
    ok = resolve_layout(configs, predict, judge=judge)
    ok = resolve_ep(ok, predict, measured=measured, judge=judge)
    ok = resolve_micro_batch(ok, predict, measured=measured, judge=judge)
    ok = resolve_batch_tiling(ok, measured=measured)
    ok = resolve_sharding(ok, predict, measured=measured)
    return resolve_recompute(ok, predict, measured=measured)
