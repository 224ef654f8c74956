"""Megatron-Bridge MoE performance recipes: the MoE options a benchmark run's recipe set (pure).

Megatron-Bridge publishes its pre-training throughput per NeMo container release (the corpus's ``mbYYMM-`` runs:
mb2511 = container 25.11, mb2602 = 26.02, ...), each measured with that release's performance recipe for the model,
accelerator and precision. Some of those recipes set ``comm_overlap.overlap_moe_expert_parallel_comm = True`` (with
``delay_wgrad_compute``): Megatron-Core's combined 1F1B schedule runs the forward pass of one micro-batch together
with the backward pass of another, so that "EP A2A in forward step is hidden by the attention/mlp computation in the
backward step, and vice versa" (Megatron-LM megatron/core/pipeline_parallel/combined_1f1b.py,
``combined_1f1b_schedule_for_no_pipelining``; the physics is ``models.arch.moe.a2a_merged_fraction`` and
``models.physics.parts.ep_a2a_hidden``). The measurement schema has no such column, so the recipe decides, by release.

The recipes' facts are tables (measurements/recipes/, read into ``models.corpus.recipes.Recipes``; columns and the
recipes read in measurements/DATA_CARD.md):

- ``a2a_overlap``: every (container, architecture id, accelerator, dtype) of the corpus whose recipe turns the
  overlap on, with the recipe it was read from and its token dispatcher backend. Every MoE run of a release not
  listed there ran a recipe without the overlap (the presets' ``moe_a2a_overlap=False``, the default of
  ``CommOverlapConfig``): ``resolve_a2a_overlap``.
- ``expert_tp``: the ``expert_tensor_parallel_size`` of a release's MoE recipes (1 in every one of the corpus's);
  ``resolve_recipe_etp`` states it on the runs, where the adapter would otherwise infer it (etp = tp, or the largest
  etp that folds: the same 1 on the corpus's tp-2 runs, whose ep does not fold with etp = tp).
- ``flex_dispatcher``: the corpus's node-spanning EP runs whose recipe ran Megatron-Core's flex dispatcher (DeepEP or
  HybridEP). Its cost differs from the all-to-all dispatcher's only where the EP group spans nodes (one copy per
  remote node: ``models.arch.moe.flex_remote_share``): ``resolve_recipe_dispatcher``.

Other recipe fields, checked and not changing the model: ``moe_router_force_load_balancing`` is True (balanced
routing: ``PhysParams.moe_imbalance`` 1.0 already).
"""

from __future__ import annotations

import re

import polars as pl

from models.corpus.recipes import Recipes, lookup, recipe_container

#: container release of a Megatron-Bridge performance run id ("mb2606-..." -> "26.06")
RUN_RELEASE_PATTERN = r"^mb(\d\d)(\d\d)-"
_RUN_RELEASE = re.compile(RUN_RELEASE_PATTERN)
#: the adapter's inferred-etp notes (models.corpus.runs_adapter.infer_layout) a recipe's stated etp replaces
_INFERRED_ETP_NOTE = r"etp=(\d+|tp) \([^)]*\)(; )?"


def run_release(run_id: str | None) -> str | None:
    """The NeMo container release of a Megatron-Bridge performance run id ("mb2606-..." -> "26.06"), else None."""
    m = _RUN_RELEASE.match(str(run_id or ""))
    return f"{m.group(1)}.{m.group(2)}" if m else None


def recipe_a2a_overlap(run_id: str | None, arch_id: str | None, gpu: str | None, dtype: str | None,
                       recipes: Recipes) -> bool | None:
    """Whether the Megatron-Bridge recipe of a named performance run overlapped its EP all-to-all: True where
    `recipes.a2a_overlap` lists it, False for another run of a listed release (its recipe did not), None for a run
    that is not a Megatron-Bridge performance run (nothing known)."""
    rel = run_release(run_id)
    if rel is None:
        return None
    key = (rel, str(arch_id or "").lower(), str(gpu or "").lower(), str(dtype or "").lower())
    return key in recipes.a2a_overlap


def _with_release(frame: pl.DataFrame, column: str) -> tuple[pl.DataFrame, pl.Expr]:
    """``frame`` with ``column`` (Float64) and ``assumptions`` present (null where absent), and the release ("26.04")
    a Megatron-Bridge run id names, else the NeMo container its `framework` names (``models.corpus.recipes
    .recipe_container``: a row of the same summary in another file), as an expression (null for other runs)."""
    if column not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Float64).alias(column))
    if "assumptions" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Utf8).alias("assumptions"))
    rid = pl.col("run_id").cast(pl.Utf8)
    rel = pl.concat_str([rid.str.extract(RUN_RELEASE_PATTERN, 1), rid.str.extract(RUN_RELEASE_PATTERN, 2)],
                        separator=".")
    if "framework" in frame.columns:  # a run of another file: the release its framework names ("NeMo 26.04")
        rel = pl.coalesce(rel, recipe_container())
    return frame, rel


def _run_key(rel: pl.Expr) -> pl.Expr:
    """A run's key in a (container, arch id, gpu, dtype) table: its parts joined by '|'."""
    return pl.concat_str([rel, pl.col("arch_id").cast(pl.Utf8).str.to_lowercase(),
                          pl.col("gpu").cast(pl.Utf8).str.to_lowercase(),
                          pl.col("dtype").cast(pl.Utf8).str.to_lowercase()], separator="|")


def resolve_a2a_overlap(frame: pl.DataFrame, recipes: Recipes) -> pl.DataFrame:
    """`moe_a2a_overlap` (1: the EP all-to-all overlapped with another micro-batch's compute) of the Megatron-Bridge
    performance runs (`mbYYMM-` run ids) of a configuration frame that do not state it: the recipe of the run's
    release (`recipes.a2a_overlap`), recorded in `assumptions` where on; 0 for the release's other runs; null (no
    overlap) for every other row. Needs run_id, arch_id, gpu, dtype (else the frame is returned unchanged).

    Applied by `models.corpus.runs_adapter.configs_from_runs` (docs/model.md, "EP all-to-all overlap")."""
    need = ("run_id", "arch_id", "gpu", "dtype")
    if not frame.height or any(c not in frame.columns for c in need):
        return frame
    frame, rel = _with_release(frame, "moe_a2a_overlap")
    src = lookup(_run_key(rel), recipes.a2a_overlap, "source", pl.Utf8)
    fill = pl.col("moe_a2a_overlap").is_null() & rel.is_not_null()
    why = pl.when(fill & src.is_not_null()).then(pl.format("moe_a2a_overlap=1 ({})", src))
    return frame.with_columns(
        pl.when(fill).then(src.is_not_null().cast(pl.Float64))
        .otherwise(pl.col("moe_a2a_overlap").cast(pl.Float64, strict=False)).alias("moe_a2a_overlap"),
        pl.when(why.is_not_null()).then(pl.concat_str([pl.col("assumptions"), why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


def recipe_etp(run_id: str | None, recipes: Recipes) -> int | None:
    """The expert tensor-parallel size of a Megatron-Bridge performance run's recipe (`recipes.expert_tp`), None for
    a run of another source or of a release not listed."""
    hit = recipes.expert_tp.get((run_release(run_id) or "",))
    return hit.etp if hit else None


def resolve_recipe_etp(frame: pl.DataFrame, recipes: Recipes) -> pl.DataFrame:
    """`etp` of the MoE Megatron-Bridge performance runs (`mbYYMM-` run ids, n_experts > 0) of a configuration frame
    that do not state it: the release's recipe value (`recipes.expert_tp`), recorded in `assumptions` in place of the
    adapter's inferred-etp note. Other rows keep their `etp` (null: the step-time model infers it). Needs run_id and
    n_experts (else the frame is returned unchanged)."""
    if not frame.height or any(c not in frame.columns for c in ("run_id", "n_experts")):
        return frame
    frame, rel = _with_release(frame, "etp")
    val = lookup(rel, recipes.expert_tp, lambda v: float(v.etp), pl.Float64)
    src = lookup(rel, recipes.expert_tp, "source", pl.Utf8)
    fill = (pl.col("etp").is_null() & (pl.col("n_experts").cast(pl.Float64, strict=False).fill_null(0.0) > 0)
            & val.is_not_null())
    kept = pl.col("assumptions").str.replace_all(_INFERRED_ETP_NOTE, "").str.strip_chars("; ").replace("", None)
    why = pl.format("etp={} ({})", val.cast(pl.Int64), src)
    return frame.with_columns(
        pl.when(fill).then(val).otherwise(pl.col("etp").cast(pl.Float64, strict=False)).alias("etp"),
        pl.when(fill).then(pl.concat_str([kept, why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


def resolve_recipe_dispatcher(frame: pl.DataFrame, recipes: Recipes) -> pl.DataFrame:
    """`moe_dispatcher` (1: the flex dispatcher, DeepEP/HybridEP) of the Megatron-Bridge performance runs
    `recipes.flex_dispatcher` lists that do not state it, recorded in `assumptions`; other rows keep theirs (null:
    the all-to-all dispatcher). Needs run_id, arch_id, gpu, dtype (else the frame is returned unchanged)."""
    need = ("run_id", "arch_id", "gpu", "dtype")
    if not frame.height or any(c not in frame.columns for c in need):
        return frame
    frame, rel = _with_release(frame, "moe_dispatcher")
    src = lookup(_run_key(rel), recipes.flex_dispatcher, "source", pl.Utf8)
    fill = pl.col("moe_dispatcher").is_null() & src.is_not_null()
    return frame.with_columns(
        pl.when(fill).then(pl.lit(1.0)).otherwise(pl.col("moe_dispatcher").cast(pl.Float64, strict=False))
        .alias("moe_dispatcher"),
        pl.when(fill).then(pl.concat_str([pl.col("assumptions"), pl.format("moe_dispatcher=flex ({})", src)],
                                         separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )
