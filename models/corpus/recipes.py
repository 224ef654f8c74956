"""What the named recipe of a measured run sets, as tables (pure: DataFrames in, one immutable `Recipes` out).

A published run was measured with its stack's recipe for the model, accelerator and precision: Megatron-Bridge's
performance recipes (per NeMo container release), the NeMo Framework Launcher's configs, a stack's documented
default layout. What such a recipe sets and the measurement schema has no column for (recompute, activation
offloading, the optimizer's bytes, FP8 weights, the EP all-to-all overlap, ...) is a sourced row of a table in
measurements/recipes/ (one CSV per table of ``TABLES``, its columns and units in measurements/DATA_CARD.md). The
pipeline reads the files (``pipeline.catalog.recipes``) and passes the one ``Recipes`` that
``recipes_from_frames`` builds to ``models.corpus.runs_adapter.configs_from_runs``; nothing here reads a file.

The functions below apply the memory tables to a configuration frame (``recipe_micro_batch``, ``recipe_memory``,
``recipe_fp8_params``, ``recipe_optimizer``) and a stack's default layout to runs that state none
(``source_layout``); ``models.corpus.moe_recipes`` applies the MoE tables. Each records what it set, with the
row's source, in the run's `assumptions`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

import polars as pl

from models.core.params import DTYPE_CODES, RECOMPUTE_CODES, SHARDING_CODES
from models.core.tables import Column, Kinds, TableError, table_rows
from models.memory.model import RECOMPUTE_MODULE_BITS, attention_scores_share, recompute_modules_code
from models.memory.stacks import Stacks, framework_preset


# ---- one row of each table (the values after its key columns) --------------------------------------------------------
class MemoryRecipe(NamedTuple):
    recompute: str
    act_offload_layers: int
    source: str


class ModulesRecipe(NamedTuple):
    recompute_modules: tuple[str, ...]
    source: str
    notes: str | None


class ShardingRecipe(NamedTuple):
    sharding: str
    source: str


class MicroBatchRecipe(NamedTuple):
    stated_micro_batch: int
    micro_batch: int
    source: str


class OptimizerRecipe(NamedTuple):
    recompute: str
    optimizer_bytes_per_param: float
    grad_bytes_per_param: float
    source: str


class PrecisionRecipe(NamedTuple):
    precision_config: str
    source: str


class Sourced(NamedTuple):
    source: str


class CrossEntropyRecipe(NamedTuple):
    logits_bytes_per_element: float
    source: str


class DefaultLayout(NamedTuple):
    tp: int
    pp: int
    sharding: str | None
    source: str


class OverlapRecipe(NamedTuple):
    dispatcher_backend: str | None
    source: str
    notes: str | None


class ExpertTpRecipe(NamedTuple):
    etp: int
    source: str


class RunMemoryRecipe(NamedTuple):
    optimizer_bytes_per_param: float | None
    grad_bytes_per_param: float | None
    logits_bytes_per_element: float | None
    act_offload_frac: str | None  # a share, as its text ("share" kind)
    sequence_parallel: str | None  # "true" / "false" ("flag" kind)
    attention_score_bytes: float | None
    recompute_modules: tuple[str, ...] | None
    eager_block: str | None  # "true" / "false" ("flag" kind)
    ac_every_n_layers: int | None
    source: str
    notes: str | None


# ---- the tables' columns ---------------------------------------------------------------------------------------------
_ID = re.compile(r"^[a-z0-9][a-z0-9._+-]*$")
_CONTAINER = re.compile(r"^\d\d\.\d\d$")
_WHOLE = re.compile(r"^\d+$")
_DECIMAL = re.compile(r"^\d+(\.\d+)?$")
#: the tasks a run's model name gives (``recipe_task``)
TASKS = ("pretrain", "sft", "lora")


def _modules(cell: str) -> tuple[str, ...] | None:
    names = tuple(cell.split("|"))
    return names if all(n in RECOMPUTE_MODULE_BITS for n in names) else None


#: kind of a column -> (what a cell must be, cell text -> value, None where it is not one)
KINDS: Kinds = MappingProxyType({
    "text": ("a non-empty text", lambda s: s),
    "id": ("a lower-case id (letters, digits, '.', '_', '+', '-')", lambda s: s if _ID.match(s) else None),
    "container": ("a NeMo container release YY.MM (e.g. 26.04)", lambda s: s if _CONTAINER.match(s) else None),
    "task": (f"one of {', '.join(TASKS)}", lambda s: s if s in TASKS else None),
    "dtype": (f"one of {', '.join(DTYPE_CODES)}", lambda s: s if s in DTYPE_CODES else None),
    "recompute": (f"one of {', '.join(RECOMPUTE_CODES)}", lambda s: s if s in RECOMPUTE_CODES else None),
    "sharding": (f"one of {', '.join(SHARDING_CODES)}", lambda s: s if s in SHARDING_CODES else None),
    # a stack id of measurements/stacks.csv or *: the id's spelling here, the table's ids in `parse_table`
    "preset": ("a memory preset (a stack id of measurements/stacks.csv) or * (any)",
               lambda s: s if s == "*" or _ID.match(s) else None),
    "modules": (f"Megatron-Core recompute modules separated by '|' (each one of {', '.join(RECOMPUTE_MODULE_BITS)})",
                _modules),
    "whole": ("a whole number >= 0", lambda s: int(s) if _WHOLE.match(s) else None),
    "positive": ("a whole number >= 1", lambda s: int(s) if _WHOLE.match(s) and int(s) >= 1 else None),
    "bytes": ("a number of bytes >= 0 (e.g. 2 or 4.5)", lambda s: float(s) if _DECIMAL.match(s) else None),
    # kept as their text (a number between 0 and 1; true/false), read by the function that applies the row
    "share": ("a share between 0 and 1 (e.g. 0.5)", lambda s: s if _DECIMAL.match(s) and float(s) <= 1.0 else None),
    "flag": ("true or false", lambda s: s if s in ("true", "false") else None),
    "run": ("a run id of the measurement files (no '|')", lambda s: s if s.strip() and "|" not in s else None),
})


@dataclass(frozen=True)
class Table:
    name: str  # the file measurements/recipes/<name>.csv and the `Recipes` field
    row: type  # the NamedTuple of the value columns
    key: tuple[Column, ...]
    values: tuple[Column, ...]
    what: str

    @property
    def columns(self) -> tuple[Column, ...]:
        return self.key + self.values


_ARCH = Column("arch_id", "id", "architecture id (measurements/architectures.csv)")
_TASK = Column("task", "task", "pretrain, sft or lora, from the run's model_name (`recipe_task`)")
_GPU = Column("gpu", "id", "hardware id (measurements/hardware_specs.csv)")
_DTYPE = Column("dtype", "dtype", "the run's dtype as the measurement schema writes it")
_CONTAINER_COL = Column("container", "container", "NeMo container release (YY.MM) the run was measured with")
_SOURCE = Column("source", "text", "where the value was read: repository, file, release branch, preset")
_NOTES = Column("notes", "text", "what else the source says about the row", optional=True)

TABLES: Mapping[str, Table] = MappingProxyType({t.name: t for t in (
    Table("memory", MemoryRecipe, (_ARCH, _TASK, _GPU, _DTYPE), (
        Column("recompute", "recompute", "recompute the recipe sets (none: no recompute_granularity)"),
        Column("act_offload_layers", "whole", "layers whose activations the recipe offloads to host memory "
                                              "(cpu_offloading_num_layers; 0: none)"),
        _SOURCE), "what a Megatron-Bridge performance recipe sets for memory"),
    Table("recompute_modules", ModulesRecipe, (_ARCH, _TASK, _GPU, _DTYPE, _CONTAINER_COL), (
        Column("recompute_modules", "modules", "Megatron-Core recompute_modules the recipe sets ('|'-separated; "
                                               "with recompute_granularity selective)"),
        _SOURCE, _NOTES), "module recompute of a Megatron-Bridge performance recipe"),
    Table("sharding", ShardingRecipe, (_ARCH, _TASK, _GPU, _DTYPE, _CONTAINER_COL), (
        Column("sharding", "sharding", "the sharding the recipe's Megatron-FSDP is read as"),
        _SOURCE), "a Megatron-Bridge performance recipe that shards with Megatron-FSDP"),
    Table("micro_batch", MicroBatchRecipe, (_ARCH, _TASK, _GPU, _DTYPE, _CONTAINER_COL), (
        Column("stated_micro_batch", "positive", "the micro-batch (sequences) the summary's row states: another "
                                                 "system's"),
        Column("micro_batch", "positive", "the micro-batch (sequences) the run's recipe runs"),
        _SOURCE), "a performance-summary row whose micro-batch is another system's"),
    Table("optimizer", OptimizerRecipe, (_ARCH, _TASK, _CONTAINER_COL), (
        Column("recompute", "recompute", "the recipe's activations_checkpoint_granularity (null: none)"),
        Column("optimizer_bytes_per_param", "bytes", "optimizer state, bytes per parameter"),
        Column("grad_bytes_per_param", "bytes", "gradient buffer, bytes per parameter"),
        _SOURCE), "a NeMo Framework Launcher recipe with its own optimizer"),
    Table("fp8_param_gather", PrecisionRecipe, (_CONTAINER_COL, _DTYPE), (
        Column("precision_config", "text", "the recipe's mixed-precision config, which keeps the GEMM weights as "
                                           "FP8 parameters (fp8_param_gather = True)"),
        _SOURCE), "Megatron-Bridge precision configs that keep FP8 weights"),
    Table("fp8_param_gather_off", Sourced, (_ARCH, _DTYPE), (_SOURCE,),
          "models whose recipe turns the FP8 weights off again"),
    Table("inplace_cross_entropy", CrossEntropyRecipe, (_CONTAINER_COL,), (
        Column("logits_bytes_per_element", "bytes", "bytes per logit element the fused cross-entropy keeps"),
        _SOURCE), "containers whose TE fused cross-entropy writes its gradient in place"),
    Table("default_layouts", DefaultLayout, (
        Column("memory_preset", "preset", "the stack (an id of measurements/stacks.csv; * any)"),
        Column("gpu_prefix", "id", "hardware ids starting with it (empty: any)", optional=True)), (
        Column("tp", "positive", "tensor-parallel GPUs"),
        Column("pp", "positive", "pipeline stages"),
        Column("sharding", "sharding", "the sharding where the run states none (empty: the run's)",
               optional=True),
        _SOURCE), "a stack's documented layout for a run that states none (first matching row wins)"),
    Table("a2a_overlap", OverlapRecipe, (_CONTAINER_COL, _ARCH, _GPU, _DTYPE), (
        Column("dispatcher_backend", "id", "the recipe's moe_flex_dispatcher_backend (empty: the all-to-all "
                                           "dispatcher)", optional=True),
        _SOURCE, _NOTES), "Megatron-Bridge recipes that overlap the EP all-to-all with another micro-batch"),
    Table("expert_tp", ExpertTpRecipe, (_CONTAINER_COL,), (
        Column("etp", "positive", "expert_tensor_parallel_size of every MoE recipe of the release (GPUs)"),
        _SOURCE), "the expert tensor-parallel size of a release's Megatron-Bridge MoE recipes"),
    Table("flex_dispatcher", Sourced, (_CONTAINER_COL, _ARCH, _GPU, _DTYPE), (_SOURCE,),
          "node-spanning EP runs whose recipe ran Megatron-Core's flex dispatcher"),
    Table("run_memory", RunMemoryRecipe, (
        Column("source_id", "run", "the run's `source` (the measurement files' source id)"),
        Column("run_id", "run", "the run's `run_id`")), (
        Column("optimizer_bytes_per_param", "bytes", "optimizer state, bytes per parameter, where the run's "
                                                     "settings give their own (empty: the stack's)", optional=True),
        Column("grad_bytes_per_param", "bytes", "gradient bytes per parameter held at the peak (0: the optimizer "
                                                "steps in the backward and frees each gradient; empty: the "
                                                "stack's)", optional=True),
        Column("logits_bytes_per_element", "bytes", "bytes per logit element the run's loss keeps at the backward "
                                                    "peak (empty: the stack's)", optional=True),
        Column("act_offload_frac", "share", "share of the stored layer activations the run offloads to host "
                                            "memory (empty: the stack's)", optional=True),
        Column("sequence_parallel", "flag", "whether the run shards the norm/dropout activations over tp "
                                            "(empty: the stack's rule)", optional=True),
        Column("attention_score_bytes", "bytes", "bytes per element of each layer's a x s x s attention score matrix "
                                                 "the run's unfused attention core keeps (Korthikanti's 5: softmax "
                                                 "output 2, dropout mask 1, dropout output 2; 2 without attention "
                                                 "dropout; empty: the stack's fused attention, none)", optional=True),
        Column("recompute_modules", "modules", "Megatron-Core recompute_modules the run's selective recompute names "
                                               "('|'-separated; empty: none)", optional=True),
        Column("eager_block", "flag", "whether the run executes torchtitan's Llama block eagerly, without "
                                      "torch.compile (fp32 RMSNorm and RoPE copies, repeated K/V, the SiLU output: "
                                      "models.memory.model.eager_block_elems; empty: no)", optional=True),
        Column("ac_every_n_layers", "positive", "per-layer selective AC: every n-th block fully checkpointed, the "
                                                "others store everything (torchtitan selective_ac_option = n; "
                                                "empty: the stack's selective policy)", optional=True),
        _SOURCE, _NOTES), "what a measured run's own settings (its source's command or notes) set for memory "
                          "and the schema has no column for"),
)})


#: tables a caller may leave out (read as empty): the per-run table, which holds measured runs only
OPTIONAL_TABLES = ("run_memory",)


@dataclass(frozen=True)
class Recipes:
    """Every recipe table, each {key tuple (the table's key columns): row (its value columns)}, read-only. Built by
    ``recipes_from_frames``; the fields are the tables of ``TABLES`` and the `Stacks` they were checked against.
    `default_layouts` keeps the file's order."""

    memory: Mapping[tuple[str, str, str, str], MemoryRecipe]
    recompute_modules: Mapping[tuple[str, str, str, str, str], ModulesRecipe]
    sharding: Mapping[tuple[str, str, str, str, str], ShardingRecipe]
    micro_batch: Mapping[tuple[str, str, str, str, str], MicroBatchRecipe]
    optimizer: Mapping[tuple[str, str, str], OptimizerRecipe]
    fp8_param_gather: Mapping[tuple[str, str], PrecisionRecipe]
    fp8_param_gather_off: Mapping[tuple[str, str], Sourced]
    inplace_cross_entropy: Mapping[tuple[str], CrossEntropyRecipe]
    default_layouts: Mapping[tuple[str, str | None], DefaultLayout]
    a2a_overlap: Mapping[tuple[str, str, str, str], OverlapRecipe]
    expert_tp: Mapping[tuple[str], ExpertTpRecipe]
    flex_dispatcher: Mapping[tuple[str, str, str, str], Sourced]
    run_memory: Mapping[tuple[str, str], RunMemoryRecipe]
    # the training stacks the tables' `memory_preset` keys name, and the words runs write for them
    # (measurements/stacks.csv, stack_words.csv; models.memory.stacks): what the runs adapter reads a run's stack with
    stacks: Stacks




class RecipeTableError(TableError):
    """A recipe table that cannot be read (models.core.tables.TableError)."""


def parse_table(table: Table, frame: pl.DataFrame, stacks: tuple[str, ...] | None = None) -> Mapping[tuple, tuple]:
    """{key: row} of one table's frame (its cells as text; an optional `LINE_COLUMN`), checked: the table's columns
    and no other, each cell of its column's kind (``KINDS``; a memory preset one of the `stacks` ids when given), no
    key twice. Raises RecipeTableError."""
    def check(col: Column, value) -> str | None:
        if col.kind == "preset" and stacks is not None and value not in (*stacks, "*"):
            return f"a memory preset ({', '.join(stacks)}) or * (any)"
        return None

    rows: dict[tuple, tuple] = {}
    seen: dict[tuple, int] = {}
    n_key = len(table.key)
    for line, values in table_rows(table.name, table.columns, frame, KINDS, RecipeTableError, check):
        key = tuple(values[:n_key])
        if key in rows:
            raise RecipeTableError(table.name, line, ", ".join(c.name for c in table.key),
                                   f"a key no other row has (line {seen[key]} has it too)", "|".join(map(str, key)))
        rows[key], seen[key] = table.row(*values[n_key:]), line
    return MappingProxyType(rows)


def recipes_from_frames(frames: Mapping[str, pl.DataFrame], stacks: Stacks) -> Recipes:
    """The `Recipes` of one frame per table of ``TABLES`` (cells as text, as a CSV is read), each checked by
    ``parse_table`` against the `stacks` (``models.memory.stacks.stacks_from_frames``), which the `Recipes` carries.
    Raises RecipeTableError for a missing or unknown table or a malformed one."""
    for name in frames:
        if name not in TABLES:
            raise RecipeTableError(name, None, None, f"one of the recipe tables ({', '.join(TABLES)})", name)
    for name in TABLES:
        if name not in frames and name not in OPTIONAL_TABLES:
            raise RecipeTableError(name, None, None, "the table (one frame per recipe table)")
    frames = {**{n: pl.DataFrame({c.name: [] for c in TABLES[n].columns}, schema={c.name: pl.Utf8 for c in
                                                                              TABLES[n].columns})
                 for n in OPTIONAL_TABLES if n not in frames}, **frames}
    return Recipes(**{name: parse_table(table, frames[name], stacks.ids) for name, table in TABLES.items()},
                   stacks=stacks)


# ---- a run's key in a table ------------------------------------------------------------------------------------------
#: a NeMo container release in a run's `framework`: "NeMo 26.04", "Megatron-Bridge / NeMo 26.04 (Megatron-Core)",
#: "NeMo 26.04.01" (a patch of 26.04's recipes) or "Megatron-Bridge 26.04" (the release its performance summary names)
CONTAINER_PATTERN = r"(?i)(?:NeMo|Megatron[- ]Bridge)[^0-9]{0,3}(\d\d\.\d\d)(?:\.\d+)?\b"


def recipe_container() -> pl.Expr:
    """The NeMo container release a run's `framework` names ("NeMo 26.04" -> "26.04"; null when it names none)."""
    return pl.col("framework").cast(pl.Utf8).fill_null("").str.extract(CONTAINER_PATTERN, 1)


def recipe_task(model_name) -> pl.Expr:
    """'lora', 'sft' or 'pretrain' from a run's model name (e.g. "LLAMA3_70B SFT")."""
    name = (pl.col(model_name) if isinstance(model_name, str) else model_name).fill_null("").str.to_lowercase()
    return (pl.when(name.str.contains("lora", literal=True)).then(pl.lit("lora"))
            .when(name.str.contains(r"\bsft\b")).then(pl.lit("sft")).otherwise(pl.lit("pretrain")))


def _bridge_parts() -> list[pl.Expr]:
    """A Megatron-Bridge recipe table's key parts of a run: architecture id, task (`recipe_task`), gpu, dtype."""
    return [pl.col("arch_id").cast(pl.Utf8).str.to_lowercase(), recipe_task("model_name"), pl.col("gpu").cast(pl.Utf8),
            pl.col("dtype").cast(pl.Utf8).str.to_lowercase()]


def _recipe_key(preset: str, parts: list[pl.Expr]) -> pl.Expr:
    """A run's key in a recipe table (its `parts` joined by '|'), null for a run not of memory preset `preset`."""
    return pl.when(pl.col("memory_preset") == preset).then(pl.concat_str(parts, separator="|"))


def lookup(key: pl.Expr, table: Mapping[tuple, tuple], field: str | Callable, dtype) -> pl.Expr:
    """`field` of the row of `table` that `key` (the key's parts joined by '|') names: a column name of the row, or
    a function of it; null where the table has none."""
    get = field if callable(field) else (lambda v: getattr(v, field))
    return key.replace_strict({"|".join(k): get(v) for k, v in table.items()}, default=None, return_dtype=dtype)


# ---- what a named recipe sets ----------------------------------------------------------------------------------------
def recipe_micro_batch(frame: pl.DataFrame, recipes: Recipes) -> pl.DataFrame:
    """`frame` with the micro-batch of the run's recipe where its row states another system's
    (`recipes.micro_batch`, ``megatron_bridge`` preset runs), recorded in `assumptions`. Needs memory_preset,
    arch_id, model_name, gpu, dtype, micro_batch, framework and assumptions; a frame without them is returned as
    it is."""
    need = ("memory_preset", "arch_id", "model_name", "gpu", "dtype", "micro_batch", "framework", "assumptions")
    if not frame.height or any(c not in frame.columns for c in need):
        return frame
    key = _recipe_key("megatron_bridge", [*_bridge_parts(), recipe_container()])
    stated = lookup(key, recipes.micro_batch, "stated_micro_batch", pl.Int64)
    recipe = lookup(key, recipes.micro_batch, "micro_batch", pl.Int64)
    src = lookup(key, recipes.micro_batch, "source", pl.Utf8)
    use = (pl.col("micro_batch").cast(pl.Int64) == stated).fill_null(False)
    why = pl.format("micro_batch={} (the row's {} is another system's: its GA does not tile its batch at this "
                    "layout; the run's recipe: {})", recipe, pl.col("micro_batch"), src)
    return frame.with_columns(
        pl.when(use).then(recipe).otherwise(pl.col("micro_batch").cast(pl.Int64)).alias("micro_batch"),
        pl.when(use).then(pl.concat_str([pl.col("assumptions"), why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


def recipe_memory(frame: pl.DataFrame, recipes: Recipes) -> pl.DataFrame:
    """`frame` with the recompute (where unstated) and `act_offload_frac` that the run's recipe sets
    (`recipes.memory`, for the ``megatron_bridge`` preset's runs), each recorded in `assumptions`, and
    `recompute_modules` (bits, models.memory.model.RECOMPUTE_MODULE_BITS; with recompute = selective) of
    `recipes.recompute_modules`, `logits_bytes` of the containers whose TE fused cross-entropy works in place
    (`recipes.inplace_cross_entropy`; null: the preset's), and the recipe's sharding where the row's came from the
    framework's default (`recipes.sharding`; the runs adapter's frames, with `sharding_from_default`). The offloaded
    share is of the layers one pipeline stage holds. Needs memory_preset, arch_id, model_name, gpu, dtype, recompute,
    n_layers, pp, assumptions (and framework for the container); a frame without them is returned with those
    columns null."""
    need = ("memory_preset", "arch_id", "model_name", "gpu", "dtype", "recompute", "n_layers", "pp")
    if not frame.height or any(c not in frame.columns for c in need):
        return frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("act_offload_frac"),
                                  pl.lit(None, dtype=pl.Float64).alias("logits_bytes"),
                                  pl.lit(None, dtype=pl.Float64).alias("recompute_modules"))
    key = _recipe_key("megatron_bridge", _bridge_parts())
    rc = lookup(key, recipes.memory, "recompute", pl.Utf8)
    off = lookup(key, recipes.memory, lambda v: float(v.act_offload_layers), pl.Float64)
    src = lookup(key, recipes.memory, "source", pl.Utf8)
    container = recipe_container() if "framework" in frame.columns else pl.lit(None, dtype=pl.Utf8)
    logits = lookup(container, recipes.inplace_cross_entropy, "logits_bytes_per_element", pl.Float64)
    logits_why = lookup(container, recipes.inplace_cross_entropy, lambda v: (
        f"logits {v.logits_bytes_per_element:g} B/element (the container's TE fused cross-entropy writes its "
        "gradient in place)"), pl.Utf8)
    inplace_ce = (pl.col("memory_preset") == "megatron_bridge") & logits.is_not_null()

    mkey = _recipe_key("megatron_bridge", [*_bridge_parts(), container])
    mcode = lookup(mkey, recipes.recompute_modules, lambda v: float(recompute_modules_code(v.recompute_modules)),
                   pl.Float64)
    mwhy = lookup(mkey, recipes.recompute_modules, lambda v: f"recompute_modules={list(v.recompute_modules)} (the "
                                                             f"run's recipe: {v.source})", pl.Utf8)
    # the recipe's modules apply where the run's recompute is unstated or selective (the granularity they set)
    use_mods = mcode.is_not_null() & (pl.col("recompute").is_null() | (pl.col("recompute") == "selective"))
    rc = pl.when(use_mods).then(pl.lit("selective")).otherwise(rc)
    stage_layers = (pl.col("n_layers").cast(pl.Float64) / pl.col("pp").cast(pl.Float64).fill_null(1.0)).ceil()
    frac = pl.min_horizontal(off / stage_layers, pl.lit(1.0))
    fill_rc = pl.col("recompute").is_null() & rc.is_not_null()
    why = pl.concat_str([
        pl.when(fill_rc).then(pl.format("recompute={} (the run's recipe)", rc)),
        pl.when(off > 0).then(pl.format("activations of {} layers offloaded to host (the run's recipe)",
                                        off.cast(pl.Int64))),
    ], separator="; ", ignore_nulls=True)
    why = pl.when(rc.is_not_null()).then(pl.concat_str([why, pl.format("[{}]", src)], separator=" ",
                                                       ignore_nulls=True))
    why = pl.concat_str([why, pl.when(use_mods).then(mwhy)], separator="; ", ignore_nulls=True)
    why = pl.concat_str([why, pl.when(inplace_ce.fill_null(False)).then(logits_why)], separator="; ",
                        ignore_nulls=True)
    # the recipe's sharding where the row's came from the framework's default
    reshard = {"sharding", "sharding_from_default"} <= set(frame.columns)  # the runs adapter's frames
    sh = lookup(mkey, recipes.sharding, "sharding", pl.Utf8)
    use_sh = sh.is_not_null() & pl.col("sharding_from_default").fill_null(False) if reshard else pl.lit(False)
    why = pl.concat_str([why, pl.when(use_sh).then(pl.format("sharding={} (the run's recipe: {})", sh, lookup(
        mkey, recipes.sharding, "source", pl.Utf8)))], separator="; ", ignore_nulls=True).str.strip_chars("; ")
    return frame.with_columns(
        *([pl.when(use_sh).then(sh).otherwise(pl.col("sharding")).alias("sharding")] if reshard else []),
        pl.when(fill_rc).then(rc).otherwise(pl.col("recompute")).alias("recompute"),
        pl.when(off > 0).then(frac).otherwise(pl.lit(None, dtype=pl.Float64)).alias("act_offload_frac"),
        pl.when(inplace_ce.fill_null(False)).then(logits).otherwise(pl.lit(None, dtype=pl.Float64))
        .alias("logits_bytes"),
        pl.when(use_mods).then(mcode).otherwise(pl.lit(None, dtype=pl.Float64)).alias("recompute_modules"),
        pl.when(why.is_not_null() & (why.str.len_chars() > 0))
        .then(pl.concat_str([pl.col("assumptions"), why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


def recipe_fp8_params(frame: pl.DataFrame, recipes: Recipes) -> pl.DataFrame:
    """`frame` with `fp8_param_gather` 1.0 where the run's Megatron-Bridge performance recipe keeps its GEMM weights as
    FP8 parameters (its container and dtype in `recipes.fp8_param_gather`, pretraining and full fine-tuning, the
    model and dtype not in `recipes.fp8_param_gather_off`; null elsewhere: 16-bit weights), recorded in
    `assumptions`. LoRA runs are left out (their frozen base weights under PEFT are not read). Needs memory_preset,
    arch_id, model_name, dtype, framework, assumptions; a frame without them gets a null column."""
    need = ("memory_preset", "arch_id", "model_name", "dtype", "framework")
    if not frame.height or any(c not in frame.columns for c in need):
        return frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("fp8_param_gather"))
    dt = pl.col("dtype").cast(pl.Utf8).str.to_lowercase()
    arch = pl.col("arch_id").cast(pl.Utf8).str.to_lowercase()
    off = pl.lit(False)
    for a, d in recipes.fp8_param_gather_off:
        off = off | ((arch == a) & (dt == d)).fill_null(False)
    config = lookup(pl.concat_str([recipe_container(), dt], separator="|"), recipes.fp8_param_gather,
                    "precision_config", pl.Utf8)
    on = ((pl.col("memory_preset") == "megatron_bridge") & config.is_not_null()
          & recipe_task("model_name").is_in(["pretrain", "sft"]) & ~off).fill_null(False)
    why = pl.format("fp8_param_gather (the run's recipe: Megatron-Bridge {} keeps FP8 weights, no 16-bit copy)", config)
    return frame.with_columns(
        pl.when(on).then(pl.lit(1.0)).otherwise(pl.lit(None, dtype=pl.Float64)).alias("fp8_param_gather"),
        pl.when(on).then(pl.concat_str([pl.col("assumptions"), why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


def recipe_optimizer(frame: pl.DataFrame, recipes: Recipes) -> pl.DataFrame:
    """`frame` with `optimizer_bytes` and `grad_bytes` (per parameter; null: the preset's) where the run's NeMo
    Framework Launcher recipe configures its own optimizer (`recipes.optimizer`, the ``megatron`` preset's runs whose
    `framework` names the container), and the recipe's recompute where the run states none, recorded in
    `assumptions`. Needs memory_preset, arch_id, model_name, framework, recompute, assumptions; a frame without them
    gets null columns."""
    need = ("memory_preset", "arch_id", "model_name", "framework", "recompute")
    if not frame.height or any(c not in frame.columns for c in need):
        return frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("optimizer_bytes"),
                                  pl.lit(None, dtype=pl.Float64).alias("grad_bytes"))
    key = _recipe_key("megatron", [pl.col("arch_id").cast(pl.Utf8).str.to_lowercase(), recipe_task("model_name"),
                                   recipe_container()])
    table = recipes.optimizer
    rc = lookup(key, table, "recompute", pl.Utf8)
    ob = lookup(key, table, "optimizer_bytes_per_param", pl.Float64)
    gb = lookup(key, table, "grad_bytes_per_param", pl.Float64)
    fill_rc = (pl.col("recompute").is_null() & rc.is_not_null()).fill_null(False)
    what = lookup(key, table, lambda v: f"optimizer state {v.optimizer_bytes_per_param:g} B and gradients "
                                        f"{v.grad_bytes_per_param:g} B per parameter", pl.Utf8)
    src = lookup(key, table, "source", pl.Utf8)
    why = pl.concat_str([what, pl.when(fill_rc).then(pl.format(", recompute={}", rc)),
                         pl.format(" (the run's recipe: {})", src)], ignore_nulls=True)
    return frame.with_columns(
        ob.alias("optimizer_bytes"), gb.alias("grad_bytes"),
        pl.when(fill_rc).then(rc).otherwise(pl.col("recompute")).alias("recompute"),
        pl.when(what.is_not_null()).then(pl.concat_str([pl.col("assumptions"), why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


def recipe_run_memory(frame: pl.DataFrame, recipes: Recipes) -> pl.DataFrame:
    """`frame` with what a measured run's own settings set for memory (`recipes.run_memory`, keyed by the run's
    source and run_id): `optimizer_bytes`, `grad_bytes`, `logits_bytes`, `act_offload_frac` (each where the row
    gives one), `sequence_parallel`, `attn_scores_stored` (the share of Korthikanti's attention-score bytes an
    unfused attention core keeps, models.memory.model.attention_scores_share of the row's bytes; null elsewhere),
    `recompute_modules` (bits, models.memory.model.RECOMPUTE_MODULE_BITS), `eager_block` (1.0: the Llama block run
    eagerly, models.memory.model.eager_block_elems) and `checkpointed_layer_share` (1 / the row's
    `ac_every_n_layers`), recorded in `assumptions` with the row's source. Needs source, run_id, assumptions; a frame
    without them (or a table without rows) is returned as it is."""
    table = recipes.run_memory
    if not table or not frame.height or any(c not in frame.columns for c in ("source", "run_id", "assumptions")):
        return frame
    key = pl.concat_str([pl.col("source").cast(pl.Utf8), pl.col("run_id").cast(pl.Utf8)], separator="|")
    sets = []
    for field, col in (("optimizer_bytes_per_param", "optimizer_bytes"), ("grad_bytes_per_param", "grad_bytes"),
                       ("logits_bytes_per_element", "logits_bytes"), ("act_offload_frac", "act_offload_frac")):
        v = lookup(key, table, lambda r, f=field: None if getattr(r, f) is None else float(getattr(r, f)),
                   pl.Float64)
        old = pl.col(col).cast(pl.Float64) if col in frame.columns else pl.lit(None, dtype=pl.Float64)
        sets.append(pl.coalesce(v, old).alias(col))
    if "sequence_parallel" in frame.columns:
        sp = lookup(key, table, lambda r: None if r.sequence_parallel is None else r.sequence_parallel == "true",
                    pl.Boolean)
        old_sp = pl.col("sequence_parallel")
        sets.append(pl.when(sp.is_not_null()).then(sp).otherwise(old_sp.cast(pl.Boolean)).alias("sequence_parallel"))
    scores = lookup(key, table, lambda r: None if r.attention_score_bytes is None
                    else float(attention_scores_share(r.attention_score_bytes)), pl.Float64)
    old_sc = pl.col("attn_scores_stored").cast(pl.Float64) if "attn_scores_stored" in frame.columns \
        else pl.lit(None, dtype=pl.Float64)
    sets.append(pl.coalesce(scores, old_sc).alias("attn_scores_stored"))
    mods = lookup(key, table, lambda r: None if r.recompute_modules is None
                  else float(recompute_modules_code(r.recompute_modules)), pl.Float64)
    old_mods = pl.col("recompute_modules").cast(pl.Float64) if "recompute_modules" in frame.columns \
        else pl.lit(None, dtype=pl.Float64)
    sets.append(pl.coalesce(mods, old_mods).alias("recompute_modules"))
    eager = lookup(key, table, lambda r: None if r.eager_block is None else float(r.eager_block == "true"),
                   pl.Float64)
    old_eager = pl.col("eager_block").cast(pl.Float64) if "eager_block" in frame.columns \
        else pl.lit(None, dtype=pl.Float64)
    sets.append(pl.coalesce(eager, old_eager).alias("eager_block"))
    every = lookup(key, table, lambda r: None if r.ac_every_n_layers is None else 1.0 / r.ac_every_n_layers,
                   pl.Float64)
    old_every = pl.col("checkpointed_layer_share").cast(pl.Float64) if "checkpointed_layer_share" in frame.columns \
        else pl.lit(None, dtype=pl.Float64)
    sets.append(pl.coalesce(every, old_every).alias("checkpointed_layer_share"))
    what = lookup(key, table, lambda v: ", ".join(f"{n}={x:g}" if isinstance(x, float) else f"{n}={x}" for n, x in (
        ("optimizer_bytes_per_param", v.optimizer_bytes_per_param), ("grad_bytes_per_param", v.grad_bytes_per_param),
        ("logits_bytes_per_element", v.logits_bytes_per_element), ("act_offload_frac", v.act_offload_frac),
        ("sequence_parallel", v.sequence_parallel), ("attention_score_bytes", v.attention_score_bytes),
        ("recompute_modules", None if v.recompute_modules is None else "|".join(v.recompute_modules)),
        ("eager_block", v.eager_block), ("ac_every_n_layers", v.ac_every_n_layers))
        if x is not None) + f" (the run's settings: {v.source})",
        pl.Utf8)
    sets.append(pl.when(what.is_not_null()).then(pl.concat_str([pl.col("assumptions"), what], separator="; ",
                                                               ignore_nulls=True))
                .otherwise(pl.col("assumptions")).alias("assumptions"))
    return frame.with_columns(*sets)


# ---- layouts a source leaves unstated --------------------------------------------------------------------------------
def source_layout(runs: pl.DataFrame, recipes: Recipes) -> pl.DataFrame:
    """`runs` with tp/pp (and sharding) filled where the source states neither tp nor pp, and a column
    `layout_rule` naming the rule (null where nothing was filled):

    1. the layout the same source states for the same architecture on the same stack (memory preset) in its other
       rows (most frequent (tp, pp));
    2. the stack's documented default (`recipes.default_layouts`, the first row that matches): MaxText/Paxml shard
       everything over the slice (FSDP); Habana's MLPerf GPT-3 runs TP 8 x PP 8.
    Needs columns run_id, source, arch_id, framework, gpu, tp, pp, sharding, year."""
    unstated = pl.col("tp").is_null() & pl.col("pp").is_null()
    keyed = runs.with_columns(framework_preset(recipes.stacks, "framework", "year").alias("_stack"))
    key = ["source", "arch_id", "_stack"]
    stated = keyed.filter(pl.col("tp").is_not_null() & pl.col("pp").is_not_null() & pl.col("arch_id").is_not_null())
    sib = (stated.group_by(*key, "tp", "pp").len()
           .sort(["len", "tp", "pp"], descending=[True, False, False])
           .group_by(*key, maintain_order=True).first()
           .select(*key, pl.col("tp").alias("_sib_tp"), pl.col("pp").alias("_sib_pp")))
    out = keyed.join(sib, on=key, how="left", nulls_equal=True)
    preset = pl.col("_stack")
    d_tp = d_pp = d_sh = d_rule = pl.lit(None)
    for (name, gpu), lay in reversed(list(recipes.default_layouts.items())):  # the first row that matches wins
        cond = pl.lit(True) if name == "*" else (preset == name)
        if gpu:
            cond = cond & pl.col("gpu").fill_null("").str.starts_with(gpu)
        d_tp = pl.when(cond).then(pl.lit(lay.tp)).otherwise(d_tp)
        d_pp = pl.when(cond).then(pl.lit(lay.pp)).otherwise(d_pp)
        d_sh = pl.when(cond).then(pl.lit(lay.sharding)).otherwise(d_sh)
        d_rule = pl.when(cond).then(pl.lit(f"layout tp={lay.tp} pp={lay.pp} ({lay.source})")).otherwise(d_rule)
    use_sib = unstated & pl.col("_sib_tp").is_not_null()
    use_def = unstated & ~use_sib & d_tp.is_not_null()
    return out.with_columns(
        pl.when(use_sib).then(pl.col("_sib_tp")).when(use_def).then(d_tp).otherwise(pl.col("tp"))
        .cast(pl.Int64).alias("tp"),
        pl.when(use_sib).then(pl.col("_sib_pp")).when(use_def).then(d_pp).otherwise(pl.col("pp"))
        .cast(pl.Int64).alias("pp"),
        pl.when(use_def & pl.col("sharding").is_null()).then(d_sh.cast(pl.Utf8)).otherwise(pl.col("sharding"))
        .alias("sharding"),
        pl.when(use_sib).then(pl.format("layout tp={} pp={} (stated by the same source for this architecture)",
                                        pl.col("_sib_tp"), pl.col("_sib_pp")))
        .when(use_def).then(d_rule.cast(pl.Utf8)).otherwise(pl.lit(None, dtype=pl.Utf8)).alias("layout_rule"),
    ).drop("_sib_tp", "_sib_pp", "_stack")
