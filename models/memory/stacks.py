"""The training stacks a run may name, as data (pure: frames in, one immutable `Stacks` out).

The same word means different bytes in different stacks: "selective" recompute is the attention core only in
Megatron-LM/NeMo (Korthikanti et al. 2022) but a matmul-output save list in torchtitan; gradients are fp32
``main_grad`` buffers in Megatron-LM but 2-byte partitions in the ZeRO paper's accounting; llm-foundry's loss never
materialises fp32 logits; torchtitan with pipeline parallelism keeps each stage's weights gathered. Each stack (its
memory preset) fixes these choices in one sourced row of measurements/stacks.csv, and the words people write for a
stack in a run's `framework` column are sourced rows of measurements/stack_words.csv (columns and units:
measurements/DATA_CARD.md). The pipeline reads the files (``pipeline.catalog.stacks``) and ``stacks_from_frames``
builds the one ``Stacks``; nothing here reads a file.

What the object gives:

- ``framework_preset``: a run's `framework` words -> its stack id (the ``memory_preset`` label column);
- ``has_words``: whether a `framework` names a stack of a family (FSDP, Megatron-based, PyTorch-native kernels, XLA):
  the runs adapter's reading rules;
- ``sequence_parallel_default``, ``default_sharding``, ``pipeline_micro_batch``, ``interleaving_stacks``: a stack's
  layout defaults;
- ``stack_columns``: the stack's memory values as per-row columns of a configuration (``STACK_COLUMNS``), which the
  step-time model turns into ``models.memory.model.MemoryOptions`` with ``stack_memory_options`` (no table needed
  there: the values travel with the configuration).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce
from types import MappingProxyType

import numpy as np
import polars as pl

from models.core.params import SHARDING_CODES
from models.core.tables import Column, Kinds, TableError, table_rows
from models.memory.model import (
    PIPELINE_SCHEDULES,
    RECOMPUTE_MODULE_BITS,
    SELECTIVE_ATTENTION_CORE,
    SELECTIVE_OP_SAC,
    MemoryOptions,
    recompute_modules_code,
)

#: the stack of a run whose words name none (models.core.params.DEFAULT's choices)
DEFAULT_STACK = "default"
#: what recompute = "selective" stores, as the stacks table writes it -> models.memory.model SELECTIVE_* code
SELECTIVE_POLICIES: Mapping[str, int] = MappingProxyType({
    "attention_core": SELECTIVE_ATTENTION_CORE, "op_sac": SELECTIVE_OP_SAC})
#: a NeMo container release as the performance summaries and recipes name it ("NeMo 25.02", "NeMo Framework 25.04.01",
#: "Megatron-Bridge / NeMo 26.04"); not MLPerf's "NVIDIA NeMo Framework Release 24.09" (its own implementation)
NEMO_RELEASE_PATTERN = r"(?i)nemo(?: framework)?[^0-9a-z]{0,3}(\d\d\.\d\d)(?:\.\d+)?\b"
#: a run with no year is read as of no earlier era (the `before_year` rule does not apply)
_NO_YEAR = 2100
#: the families a word may flag (stack_words.csv columns, the runs adapter's reading rules)
FAMILIES = ("fsdp", "megatron_based", "native_kernels", "xla", "names_deepspeed", "names_megatron")


@dataclass(frozen=True)
class Stack:
    """One row of measurements/stacks.csv: what a stack's words mean for memory and its layout defaults."""

    selective_policy: int  # what recompute = "selective" stores (models.memory.model SELECTIVE_* codes)
    grad_bytes: float  # bytes per gradient element held during accumulation, 16-bit runs
    logits_bytes: float  # bytes per logit element the loss keeps for backward
    logits_chunks: float  # token chunks the loss runs over (1 = whole micro-batch at once)
    act_offload_frac: float  # share of stored layer activations offloaded to host memory
    sequence_parallel_with_tp: bool | None  # tp > 1 implies sequence parallelism; None: the stack does not say
    unsharded_weights_with_pp: bool  # FSDP keeps stage weights gathered and grads unsharded when pp > 1
    default_sharding: str  # sharding when the source states none (models.core.params.SHARDING_CODES)
    # low-precision GEMMs keep their quantized input for backward (Transformer Engine Linear/LayerNormLinear/
    # GroupedLinear: models.core.precision.SAVED_GEMM_INPUT_BYTES); False where the stack's FP8 keeps 16-bit inputs or
    # is unknown (torchao Float8Linear saves the high-precision input and weight for its backward casts)
    quantized_saves: bool
    # the MoE layers' dispatched token copies are quantized too (``quantized_saves`` = with_dispatch: DeepSeek-V3
    # quantizes the activation before the MoE up-projections to FP8 and then dispatches it, arXiv:2412.19437 3.3.2)
    quantized_dispatch: bool
    local_batch_per_dp_rank: bool  # the stated micro-batch is the local batch, split into pp x stages micro-batches
    interleaves_pipeline: bool  # a pipelined run that states no interleave takes the typical one
    # the stack's pipeline schedule for memory (models.memory.model.PIPELINE_SCHEDULES, read from the
    # `interleaves_pipeline` cell: true/false = Megatron-style 1F1B, dualpipe, balanced_interleave)
    pipeline_schedule: int
    before_year: int | None  # a run of this stack from before this year reads as `before_year_reads_as`
    before_year_reads_as: str | None
    nemo_release_from: str | None  # a NeMo release (YY.MM) from this one on reads as `nemo_release_reads_as`
    nemo_release_reads_as: str | None
    rules_source: str | None  # the source of the layout and reading rules above
    source: str  # the source of the memory values
    # bytes of optimizer state per parameter of 16-bit runs (None: PhysParams' 12, fp32 master + Adam m + v; NaN in
    # the configuration's column)
    optimizer_bytes: float | None = None
    # Megatron-Core module names (models.memory.model.RECOMPUTE_MODULE_BITS) that recompute = selective also
    # recomputes in this stack, as a bitmask (0: none)
    recompute_modules: int = 0
    # the shardings the stack can run (empty: any): the search and the plan try only these for it
    sharding_options: tuple = ()


@dataclass(frozen=True)
class StackWord:
    """One row of measurements/stack_words.csv: a word of a run's `framework` column (lower case, matched as a
    substring of the lower-cased cell)."""

    stack: str | None  # the stack the word names (None: the word only flags families)
    order: int | None  # words are tried in this order; the first that matches names the stack
    families: frozenset[str]  # the FAMILIES the word flags
    source: str


class StackTableError(TableError):
    """A stack table that cannot be read (models.core.tables.TableError)."""


# ---- the tables' columns ---------------------------------------------------------------------------------------------
_ID = re.compile(r"^[a-z0-9][a-z0-9_]*$")
_WORD = re.compile(r"^[^A-Z]+$")
_DECIMAL = re.compile(r"^\d+(\.\d+)?$")
_WHOLE = re.compile(r"^\d+$")
_RELEASE = re.compile(r"^\d\d\.\d\d$")
_BOOL = {"true": True, "false": False}
#: `quantized_saves` cells: true / false, or with_dispatch (the dispatched MoE token copies quantized too)
_QSAVES = {"true": 1, "false": 0, "with_dispatch": 2}
#: `interleaves_pipeline` cells: true / false (Megatron-style interleaved / plain 1F1B), or a named schedule
_SCHEDULE_CELLS = {"true": "interleaved", "false": "1f1b", "dualpipe": "dualpipe",
                   "balanced_interleave": "balanced_interleave"}


def _modules_code(cell: str):
    names = [n.strip() for n in cell.split("|")]
    return recompute_modules_code(names) if names and all(n in RECOMPUTE_MODULE_BITS for n in names) else None

#: kind of a column -> (what a cell must be, cell text -> value, None where it is not one)
KINDS: Kinds = MappingProxyType({
    "text": ("a non-empty text", lambda s: s),
    "id": ("a lower-case id (letters, digits, '_')", lambda s: s if _ID.match(s) else None),
    "word": ("a word in lower case (a run's framework cell is matched lower-cased)",
             lambda s: s if _WORD.match(s) and s.strip() == s else None),
    "policy": (f"one of {', '.join(SELECTIVE_POLICIES)}", lambda s: SELECTIVE_POLICIES.get(s)),
    "bytes": ("a number of bytes >= 0 (e.g. 2 or 4.5)", lambda s: float(s) if _DECIMAL.match(s) else None),
    "count": ("a number >= 1", lambda s: float(s) if _DECIMAL.match(s) and float(s) >= 1 else None),
    "share": ("a share between 0 and 1", lambda s: float(s) if _DECIMAL.match(s) and float(s) <= 1 else None),
    "bool": ("true or false", lambda s: _BOOL.get(s)),
    "qsaves": ("true, false or with_dispatch", lambda s: _QSAVES.get(s)),
    "schedule": (f"one of {', '.join(_SCHEDULE_CELLS)}", lambda s: _SCHEDULE_CELLS.get(s)),
    "modules": (f"Megatron-Core module names joined by '|' ({', '.join(RECOMPUTE_MODULE_BITS)})", _modules_code),
    "sharding": (f"one of {', '.join(SHARDING_CODES)}", lambda s: s if s in SHARDING_CODES else None),
    "shardings": (f"sharding names joined by '|' ({', '.join(SHARDING_CODES)})",
                  lambda s: tuple(s.split("|")) if s and all(x in SHARDING_CODES for x in s.split("|")) else None),
    "year": ("a year (e.g. 2022)", lambda s: int(s) if _WHOLE.match(s) and len(s) == 4 else None),
    "release": ("a NeMo container release YY.MM (e.g. 24.12)", lambda s: s if _RELEASE.match(s) else None),
    "order": ("a whole number >= 1", lambda s: int(s) if _WHOLE.match(s) and int(s) >= 1 else None),
})


#: measurements/stacks.csv: the id, then one column per ``Stack`` field, in order
STACK_TABLE = "stacks"
STACK_FILE_COLUMNS: tuple[Column, ...] = (
    Column("id", "id", "the stack (memory preset) id"),
    Column("selective_policy", "policy", "what recompute = selective stores (attention_core: everything but the "
                                         "attention core; op_sac: torchtitan's op-level save list)"),
    Column("grad_bytes_per_element", "bytes", "bytes per gradient element held during accumulation, 16-bit runs"),
    Column("logits_bytes_per_element", "bytes", "bytes per logit element the loss keeps for backward"),
    Column("logits_chunks", "count", "token chunks the loss runs over (1: the whole micro-batch at once)"),
    Column("act_offload_frac", "share", "share of the stored layer activations offloaded to host memory"),
    Column("sequence_parallel_with_tp", "bool", "tp > 1 implies sequence parallelism (empty: the stack does not "
                                                "say)", optional=True),
    Column("unsharded_weights_with_pp", "bool", "FSDP keeps a stage's weights gathered and its gradients unsharded "
                                                "over the step when pp > 1"),
    Column("default_sharding", "sharding", "the sharding of a run that states none"),
    Column("quantized_saves", "qsaves", "low-precision GEMMs keep their quantized input for backward "
                                        "(with_dispatch: and the MoE dispatched token copies are quantized)"),
    Column("local_batch_per_dp_rank", "bool", "the stated micro-batch is the local batch per data-parallel rank, "
                                              "split into pp x (stages per rank) micro-batches"),
    Column("interleaves_pipeline", "schedule", "a pipelined run that states no interleave runs the typical one "
                                               "(true); or the stack's own schedule: dualpipe, balanced_interleave "
                                               "(models.memory.model.PIPELINE_SCHEDULES)"),
    Column("before_year", "year", "a run of this stack from before this year reads as before_year_reads_as",
           optional=True),
    Column("before_year_reads_as", "id", "the stack such a run reads as", optional=True),
    Column("nemo_release_from", "release", "a run naming a NeMo release from this one on reads as "
                                           "nemo_release_reads_as", optional=True),
    Column("nemo_release_reads_as", "id", "the stack such a run reads as", optional=True),
    Column("rules_source", "text", "where the layout and reading rules were read (needed when one applies)",
           optional=True),
    Column("source", "text", "where the memory values were read"),
    Column("optimizer_bytes_per_param", "bytes", "bytes of optimizer state per parameter, 16-bit runs (empty: "
                                                 "12, fp32 master + Adam m + v)", optional=True),
    Column("recompute_modules", "modules", "what recompute = selective also recomputes in this stack, as "
                                           "Megatron-Core recompute_modules names joined by '|'", optional=True),
    Column("sharding_options", "shardings", "the shardings the stack can run, joined by '|' (empty: any): what "
                                            "search and plan try with --stack", optional=True),
)
#: measurements/stack_words.csv
WORD_TABLE = "stack_words"
WORD_FILE_COLUMNS: tuple[Column, ...] = (
    Column("word", "word", "a word of a run's framework column (lower case; matched as a substring)"),
    Column("stack", "id", "the stack the word names (empty: it only flags families)", optional=True),
    Column("order", "order", "words are tried in this order, the first that matches names the stack (needed with "
                             "a stack)", optional=True),
    Column("fsdp", "bool", "a PyTorch FSDP stack (no gradient accumulation by default)"),
    Column("megatron_based", "bool", "a stack built on Megatron-LM"),
    Column("native_kernels", "bool", "a stack on PyTorch's own kernels rather than TransformerEngine's"),
    Column("xla", "bool", "a stack compiled by XLA (JAX)"),
    Column("names_deepspeed", "bool", "the word names DeepSpeed"),
    Column("names_megatron", "bool", "the word names Megatron"),
    Column("source", "text", "where the word's meaning was read"),
)


@dataclass(frozen=True)
class Stacks:
    """Every stack {id: Stack} and every word {word: StackWord}, in file order, read-only. Built by
    ``stacks_from_frames``."""

    stacks: Mapping[str, Stack]
    words: Mapping[str, StackWord]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self.stacks)

    def family(self, name: str) -> tuple[str, ...]:
        """The words that flag family `name` (one of FAMILIES), in file order."""
        return tuple(w for w, row in self.words.items() if name in row.families)

    def with_rule(self, rule: str) -> list[str]:
        """Ids of the stacks whose boolean field `rule` is true, in file order."""
        return [k for k, v in self.stacks.items() if getattr(v, rule) is True]

    def word_groups(self) -> list[tuple[str, tuple[str, ...]]]:
        """(stack, words) in the words' order, consecutive words of the same stack in one group."""
        named = sorted(((w.order, word, w.stack) for word, w in self.words.items() if w.stack is not None))
        groups: list[tuple[str, list[str]]] = []
        for _, word, stack in named:
            if groups and groups[-1][0] == stack:
                groups[-1][1].append(word)
            else:
                groups.append((stack, [word]))
        return [(s, tuple(ws)) for s, ws in groups]

    def row_arrays(self, names) -> dict[str, np.ndarray]:
        """The ``STACK_COLUMNS`` arrays of an array of stack ids (unknown ids: the default stack's values), as a
        configuration's columns carry them to the step-time model."""
        a = np.asarray(names).astype(str)
        rows = [self.stacks.get(n, self.stacks[DEFAULT_STACK]) for n in a.ravel()]
        return {c: np.array([_num(getattr(r, f)) for r in rows], dtype=np.float64).reshape(a.shape)
                for c, f in STACK_COLUMNS.items()}

    def memory_options(self, names, pp=None) -> MemoryOptions:
        """``stack_memory_options`` of an array of stack ids."""
        return stack_memory_options(self.row_arrays(names), pp)


# ---- reading the tables ----------------------------------------------------------------------------------------------
def _cells(table: str, columns: tuple[Column, ...], frame: pl.DataFrame) -> list[tuple[int, dict]]:
    """(line, {column: value}) of every row of a frame (cells as text), checked (models.core.tables.table_rows)."""
    return [(line, dict(zip((c.name for c in columns), values)))
            for line, values in table_rows(table, columns, frame, KINDS, StackTableError)]


def _stack(line: int, r: dict, ids: set[str]) -> Stack:
    for rule, target in (("before_year", "before_year_reads_as"), ("nemo_release_from", "nemo_release_reads_as")):
        if (r[rule] is None) != (r[target] is None):
            raise StackTableError(STACK_TABLE, line, target if r[target] is None else rule,
                                  f"{rule} and {target} both given or both empty")
        if r[target] is not None and r[target] not in ids:
            raise StackTableError(STACK_TABLE, line, target, f"a stack id of the table ({', '.join(sorted(ids))})",
                                  r[target])
    rules = r["local_batch_per_dp_rank"] or r["interleaves_pipeline"] != "1f1b" or r["before_year"] is not None \
        or r["nemo_release_from"] is not None
    if rules and r["rules_source"] is None:
        raise StackTableError(STACK_TABLE, line, "rules_source", "the source of the row's layout and reading rules")
    return Stack(
        selective_policy=r["selective_policy"], grad_bytes=r["grad_bytes_per_element"],
        logits_bytes=r["logits_bytes_per_element"], logits_chunks=r["logits_chunks"],
        act_offload_frac=r["act_offload_frac"], sequence_parallel_with_tp=r["sequence_parallel_with_tp"],
        unsharded_weights_with_pp=r["unsharded_weights_with_pp"], default_sharding=r["default_sharding"],
        quantized_saves=r["quantized_saves"] >= 1, quantized_dispatch=r["quantized_saves"] == 2,
        local_batch_per_dp_rank=r["local_batch_per_dp_rank"],
        interleaves_pipeline=r["interleaves_pipeline"] in ("interleaved", "balanced_interleave"),
        pipeline_schedule=PIPELINE_SCHEDULES[r["interleaves_pipeline"]], before_year=r["before_year"],
        before_year_reads_as=r["before_year_reads_as"], nemo_release_from=r["nemo_release_from"],
        nemo_release_reads_as=r["nemo_release_reads_as"], rules_source=r["rules_source"], source=r["source"],
        optimizer_bytes=r["optimizer_bytes_per_param"],
        recompute_modules=r["recompute_modules"] or 0, sharding_options=r.get("sharding_options") or ())


def stacks_from_frames(stacks: pl.DataFrame, words: pl.DataFrame) -> Stacks:
    """The `Stacks` of the stacks table and the words table (cells as text, as a CSV is read; an optional
    `LINE_COLUMN`). Checked: each table's columns, each cell of its kind, ids and words unique, the default stack
    present, every stack a word or rule names in the table, an order for every word that names a stack and no order
    twice. Raises StackTableError naming the table, line and column."""
    rows = _cells(STACK_TABLE, STACK_FILE_COLUMNS, stacks)
    seen: dict[str, int] = {}
    for line, r in rows:
        if r["id"] in seen:
            raise StackTableError(STACK_TABLE, line, "id", f"an id no other row has (line {seen[r['id']]} has it "
                                                           f"too)", r["id"])
        seen[r["id"]] = line
    if DEFAULT_STACK not in seen:
        raise StackTableError(STACK_TABLE, None, "id", f"a row for the {DEFAULT_STACK!r} stack (a run naming none)")
    table = {r["id"]: _stack(line, r, set(seen)) for line, r in rows}
    out: dict[str, StackWord] = {}
    lines: dict[str, int] = {}
    orders: dict[int, int] = {}
    for line, r in _cells(WORD_TABLE, WORD_FILE_COLUMNS, words):
        w = r["word"]
        if w in lines:
            raise StackTableError(WORD_TABLE, line, "word", f"a word no other row has (line {lines[w]} has it too)", w)
        if r["stack"] is not None and r["stack"] not in table:
            raise StackTableError(WORD_TABLE, line, "stack", f"a stack id of {STACK_TABLE} ({', '.join(table)})",
                                  r["stack"])
        if (r["stack"] is None) != (r["order"] is None):
            raise StackTableError(WORD_TABLE, line, "order", "an order exactly when the word names a stack",
                                  r["order"])
        if r["order"] is not None:
            if r["order"] in orders:
                raise StackTableError(WORD_TABLE, line, "order", f"an order no other word has (line "
                                                                 f"{orders[r['order']]} has it too)", r["order"])
            orders[r["order"]] = line
        lines[w] = line
        out[w] = StackWord(stack=r["stack"], order=r["order"], families=frozenset(f for f in FAMILIES if r[f]),
                           source=r["source"])
    return Stacks(stacks=MappingProxyType(table), words=MappingProxyType(out))


# ---- words -> stacks -------------------------------------------------------------------------------------------------
def _expr(c) -> pl.Expr:
    return pl.col(c) if isinstance(c, str) else c


def framework_preset(stacks: Stacks, framework, year=None) -> pl.Expr:
    """Stack id (the ``memory_preset`` column) for a `framework` column (name or polars expression): the stack of
    the first word (``StackWord.order``) the lower-cased cell contains. `year` (name, expression or None) and the
    NeMo release the cell names apply the stack's reading rules (``Stack.before_year``, ``nemo_release_from``).
    Unknown stacks get ``DEFAULT_STACK``."""
    fw = _expr(framework).fill_null("").str.to_lowercase()
    yr = None if year is None else _expr(year)
    expr = pl.when(pl.lit(False)).then(pl.lit(None, dtype=pl.Utf8))
    for name, words in stacks.word_groups():
        hit = pl.lit(False)
        for w in words:
            hit = hit | fw.str.contains(w, literal=True)
        stack = stacks.stacks[name]
        if stack.before_year is not None and yr is not None:
            expr = expr.when(hit & (yr.fill_null(_NO_YEAR) < stack.before_year)).then(
                pl.lit(stack.before_year_reads_as))
        if stack.nemo_release_from is not None:
            release = fw.str.extract(NEMO_RELEASE_PATTERN, 1)
            expr = expr.when(hit & release.is_not_null() & (release >= stack.nemo_release_from)).then(
                pl.lit(stack.nemo_release_reads_as))
        expr = expr.when(hit).then(pl.lit(name))
    return expr.otherwise(pl.lit(DEFAULT_STACK)).alias("memory_preset")


def has_words(stacks: Stacks, framework, family: str) -> pl.Expr:
    """True where the lower-cased `framework` cell contains a word of `family` (one of FAMILIES)."""
    low = _expr(framework).fill_null("").str.to_lowercase()
    expr = pl.lit(False)
    for w in stacks.family(family):
        expr = expr | low.str.contains(w, literal=True)
    return expr


def names_a_stack(stacks: Stacks, framework) -> pl.Expr:
    """True where the lower-cased `framework` cell contains any word of the words table (one naming a stack or
    flagging a family): the stack table knows what the cell names."""
    low = _expr(framework).fill_null("").str.to_lowercase()
    return pl.any_horizontal([pl.lit(False), *(low.str.contains(w, literal=True) for w in stacks.words)])


def preset_table(stacks: Stacks) -> pl.DataFrame:
    """One row per stack with its values and sources."""
    return pl.DataFrame([{"memory_preset": k} | vars(v) for k, v in stacks.stacks.items()])


# ---- layout defaults -------------------------------------------------------------------------------------------------
def _is_one_of(preset: pl.Expr, ids: list[str]) -> pl.Expr:
    return reduce(lambda a, b: a | b, [preset == i for i in ids]) if ids else pl.lit(False)


def sequence_parallel_default(stacks: Stacks, preset: pl.Expr, tp: pl.Expr,
                              otherwise: pl.Expr | None = None) -> pl.Expr:
    """True where the preset's stack uses sequence parallelism whenever tp > 1, False where it never does; rows
    whose preset does not say (``sequence_parallel_with_tp`` None) take ``otherwise`` (default False)."""
    with_sp = [k for k, v in stacks.stacks.items() if v.sequence_parallel_with_tp is True]
    without = [k for k, v in stacks.stacks.items() if v.sequence_parallel_with_tp is False]
    rest = pl.lit(False) if otherwise is None else otherwise
    return (pl.when(preset.is_in(with_sp)).then(tp > 1).when(preset.is_in(without)).then(pl.lit(False))
            .otherwise(rest).alias("sequence_parallel"))


def default_sharding(stacks: Stacks, preset: pl.Expr) -> pl.Expr:
    """The preset's sharding when the source states none."""
    return preset.replace_strict({k: v.default_sharding for k, v in stacks.stacks.items()}, default="none") \
        .alias("sharding")


def pipeline_micro_batch(stacks: Stacks, preset: pl.Expr, micro_batch: pl.Expr, pp: pl.Expr, vpp: pl.Expr) -> pl.Expr:
    """Sequences per pipeline micro-batch. A stack whose sources state the local batch per data-parallel rank
    (``local_batch_per_dp_rank``: torchtitan) splits it into pp x (stages per rank) micro-batches. Other stacks state
    the micro-batch itself."""
    n_mb = pp * vpp.fill_null(1)
    split = _is_one_of(preset, stacks.with_rule("local_batch_per_dp_rank")) & (pp > 1) & (micro_batch % n_mb == 0)
    return pl.when(split).then(micro_batch // n_mb).otherwise(micro_batch).alias("micro_batch")


def interleaving_stacks(stacks: Stacks) -> list[str]:
    """Ids of the stacks that interleave a pipeline whose run states no interleave (``interleaves_pipeline``)."""
    return stacks.with_rule("interleaves_pipeline")


# ---- the stack's memory values as a configuration's columns ----------------------------------------------------------
#: configuration column -> ``Stack`` field: the stack's memory values, per row (floats; booleans 1.0/0.0), which the
#: step-time model reads (``stack_memory_options``); ``memory_preset`` stays the label
STACK_COLUMNS: Mapping[str, str] = MappingProxyType({
    "stack_selective_policy": "selective_policy", "stack_grad_bytes": "grad_bytes",
    "stack_logits_bytes": "logits_bytes", "stack_logits_chunks": "logits_chunks",
    "stack_act_offload_frac": "act_offload_frac", "stack_quantized_saves": "quantized_saves",
    "stack_unsharded_weights_with_pp": "unsharded_weights_with_pp", "stack_optimizer_bytes": "optimizer_bytes",
    "stack_recompute_modules": "recompute_modules", "stack_quantized_dispatch": "quantized_dispatch",
    "stack_pipeline_schedule": "pipeline_schedule"})


def _num(value) -> float:
    """A stack value as a configuration column carries it: a float (booleans 1.0/0.0), NaN where the stack does not
    say (None)."""
    return float("nan") if value is None else float(value)


def stack_columns(stacks: Stacks, preset: pl.Expr) -> list[pl.Expr]:
    """The ``STACK_COLUMNS`` of a column of stack ids (null or unknown: the default stack's values)."""
    p = preset.fill_null(DEFAULT_STACK)
    default = stacks.stacks[DEFAULT_STACK]
    return [p.replace_strict({k: _num(getattr(v, f)) for k, v in stacks.stacks.items()},
                             default=_num(getattr(default, f)), return_dtype=pl.Float64).alias(c)
            for c, f in STACK_COLUMNS.items()]


def has_stack_columns(a: Mapping) -> bool:
    """Whether arrays (or a frame's columns) carry a stack's memory values (every ``STACK_COLUMNS``)."""
    return all(a.get(c) is not None for c in STACK_COLUMNS) if isinstance(a, Mapping) \
        else all(c in a for c in STACK_COLUMNS)


def stage_gathered(a: Mapping[str, np.ndarray], pp) -> np.ndarray:
    """Per row: the stack's FSDP keeps a pipeline stage's weights gathered (and its gradients unsharded) across the
    micro-batches of a step, i.e. the stack says so (``unsharded_weights_with_pp``) and pp > 1. The memory model
    holds the whole stage's weights and gradients (``fsdp_unsharded_stage``) and the time model gathers the weights
    and reduce-scatters the gradients once per step, not per micro-batch (``models.physics.parts.dp_comm``)."""
    return (np.asarray(a["stack_unsharded_weights_with_pp"]) != 0) & (np.asarray(pp, dtype=np.float64) > 1)


def stack_memory_options(a: Mapping[str, np.ndarray], pp=None) -> MemoryOptions:
    """The ``models.memory.model.MemoryOptions`` of a configuration's ``STACK_COLUMNS`` arrays. ``pp`` turns on
    ``fsdp_unsharded_stage`` for stacks whose FSDP keeps stage weights gathered."""
    out = {"selective_policy": np.asarray(a["stack_selective_policy"]).astype(np.int64)}
    for f in ("grad_bytes", "logits_bytes", "logits_chunks", "act_offload_frac"):
        out[f] = np.array(a[f"stack_{f}"], dtype=np.float64)  # a copy: the options never alias the inputs
    out["quantized_saves"] = np.asarray(a["stack_quantized_saves"]) != 0
    # the values added for the published layouts (docs/memory.md); arrays without them keep PhysParams' behaviour
    if a.get("stack_optimizer_bytes") is not None:
        out["optimizer_bytes"] = np.array(a["stack_optimizer_bytes"], dtype=np.float64)
    if a.get("stack_recompute_modules") is not None:
        out["recompute_modules"] = np.nan_to_num(np.array(a["stack_recompute_modules"], dtype=np.float64))
    if a.get("stack_quantized_dispatch") is not None:
        out["quantized_dispatch"] = np.asarray(a["stack_quantized_dispatch"]) != 0
    if a.get("stack_pipeline_schedule") is not None:
        out["pipeline_schedule"] = np.nan_to_num(np.asarray(a["stack_pipeline_schedule"], dtype=np.float64)
                                                 ).astype(np.int64)
    if pp is not None:
        out["fsdp_unsharded_stage"] = stage_gathered(a, pp)
    return MemoryOptions(**out)
