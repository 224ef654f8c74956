"""`stepcast predict --runs FILE`: predict every run of a measurement-schema file through the one prediction
function, with the measured throughput and the error beside each prediction when the file carries one."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from models.corpus.runs_adapter import configs_from_runs, resolve_unstated
from models.corpus.targets import derive_flop_targets, measured_throughput
from models.fitting.predictor import predict
from models.memory.model import CAPACITY_BYTES_PER_GB
from models.memory.stacks import names_a_stack
from models.memory.presets import remat_words
from models.physics.hardware import HOST_COLUMN, resolve_hardware
from models.physics.step_time import BREAKDOWN as STEP_PARTS
from models.physics.step_time import predict as physics
from pipeline import catalog
from pipeline.measurements import (
    BATCH_TOKENS_HEADERS,
    COLUMN_SYNONYMS,
    COLUMNS,
    ENUMS,
    GRAD_ACCUM_HEADERS,
    LOCAL_BATCH_HEADERS,
    METRICS,
    MIXED_PRECISION,
    NODES_HEADERS,
    PARALLELISM_HEADERS,
    SCHEMA,
    canonical_dtype,
    canonical_word,
    header_key,
    metric_synonym,
    metric_value_key,
    samples_synonym,
)
from pipeline.readers import FileRejected, read_measurement_file

BREAKDOWN = list(STEP_PARTS)
RUN_COLUMNS = ["run_id", "gpu", "model_name", "n_gpus", "tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch",
               "global_batch_seqs", "seq_len", "sharding", "recompute", "sequence_parallel", "dtype", "software_preset"]
OUT_COLUMNS = ["feasible", "error", "step_time_s", "step_time_lo_s", "step_time_hi_s", "analytical_step_time_s",
               "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "mfu", "hfu",
               "memory_gb_per_gpu", "memory_gb", "memory_capacity_gb", "memory_fits"] + BREAKDOWN + [
               "fit_version", "assumptions", "calibration_domain"]


#: what an answer adds where it applies: the interval's parts and the adaptation that answered
ANSWER_EXTRAS = ("interval_residual", "interval_extrapolation", "interval_settings", "adapted_to", "adaptation_runs",
                 "throughput_factor")


def number_text(expr: pl.Expr) -> pl.Expr:
    """A number cell as written by hand, ready to cast: thousands separators (',' '_' or a space between digit
    groups: "1,024", "16_384") dropped, surrounding spaces stripped; empty -> null."""
    t = expr.cast(pl.Utf8).str.strip_chars()
    for _ in range(3):  # "1,024,000,000": one group per pass
        t = t.str.replace_all(r"(\d)[,_ ](\d{3})(\D|$)", "$1$2$3")
    return t.replace("", None)


#: counts a table may write with a K suffix ("16K" GPUs, a "4K" context): K = 1,024 (Llama 3's "16K H100s" are
#: 16,384; a "4K" context is 4,096 tokens)
K_COUNT_COLUMNS = ("n_gpus", "seq_len", "global_batch_seqs", "micro_batch")
#: a count with a K suffix, as `number_text` leaves it ("4K", "1.5k")
_K_COUNT = r"(?i)^(\d+(?:\.\d+)?)\s*k$"


#: architecture-table columns (measurements/architectures.csv) a run file may state beyond the measurement schema:
#: the expert, hybrid-block and MLA shape of a model the table lacks. A stated cell wins over the table's value
#: (`catalog.fill_from_architectures` fills only empty cells); read in the table's types (`arch_cell`)
ARCH_STATED: tuple[str, ...] = tuple(c for c in (*catalog.ARCH_MODEL_COLUMNS, *catalog.ARCH_HYBRID_COLUMNS,
                                                 *catalog.ARCH_MLA_COLUMNS) if c not in COLUMNS)
#: other names of those columns, as Hugging Face configs (Mixtral, Qwen-MoE, DeepSeek) and Megatron-Core's
#: arguments write them, by `header_key`
ARCH_SYNONYMS: dict[str, str] = {
    **{c: c for c in ARCH_STATED},
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "num_routed_experts", "moe_num_experts",
                     "experts", "n_expert"), "n_experts"),
    **dict.fromkeys(("num_experts_per_tok", "moe_router_topk", "moe_top_k", "topk", "experts_per_token"), "top_k"),
    **dict.fromkeys(("moe_intermediate_size", "moe_ffn_hidden_size", "expert_intermediate_size",
                     "expert_ffn_hidden_size"), "expert_ffn_dim"),
    **dict.fromkeys(("num_shared_experts", "shared_experts"), "n_shared_experts"),
    **dict.fromkeys(("first_k_dense_replace", "num_dense_layers"), "n_dense_layers"),
    **dict.fromkeys(("kv_channels", "head_size"), "head_dim"),
    "tie_word_embeddings": "tied_embeddings",
}


def arch_cell(c: str) -> pl.Expr:
    """The file's cell of architecture column `c` (`ARCH_STATED`) in the architecture table's type: text for the
    activation and a hybrid's layer pattern, true/false for tied embeddings, a whole number >= 0 otherwise; a cell
    that is none of these is read as empty here and refuses its run (`arch_cells_error`)."""
    t = pl.col(c).cast(pl.Utf8).str.strip_chars().replace("", None)
    if c in ("activation", "layer_pattern"):
        return t.alias(c)
    if c == "tied_embeddings":
        low = t.str.to_lowercase()
        return (pl.when(low.is_in(["true", "yes", "1"])).then(True).when(low.is_in(["false", "no", "0"]))
                .then(False).otherwise(None).alias(c))
    num = number_text(pl.col(c)).cast(pl.Float64, strict=False)
    return pl.when((num == num.round(0)) & (num >= 0)).then(num).otherwise(None).cast(pl.Int64).alias(c)


def arch_cells_error(columns) -> pl.Expr:
    """Per row, the stated architecture cells (`ARCH_STATED`, of `columns`) that `arch_cell` reads as empty, as
    "column top_k = '2.5': not a whole number" (null where every cell reads)."""
    parts = []
    for c in columns:
        if c in ("activation", "layer_pattern"):  # text: every cell reads
            continue
        raw = pl.col(c).cast(pl.Utf8).str.strip_chars().replace("", None)
        want = "true or false" if c == "tied_embeddings" else "a whole number"
        parts.append(pl.when(raw.is_not_null() & arch_cell(c).is_null())
                     .then(pl.format("column {} = '{}': not {}", pl.lit(c), raw, pl.lit(want))))
    if not parts:
        return pl.lit(None, dtype=pl.Utf8).alias("_arch_error")
    return pl.concat_str(parts, separator="; ", ignore_nulls=True).replace("", None).alias("_arch_error")


def count_text(expr: pl.Expr) -> pl.Expr:
    """A count as written (`number_text`), a K suffix read as x 1,024 ("4K" -> "4096"; "1.5K" -> "1536")."""
    t = number_text(expr)
    k = t.str.extract_groups(_K_COUNT)
    val = k.struct.field("1").cast(pl.Float64, strict=False) * 1024.0
    return pl.when(val.is_not_null()).then(val.round(0).cast(pl.Int64).cast(pl.Utf8)).otherwise(t)


def _batch_cells_in_tokens(frame: pl.DataFrame) -> pl.DataFrame:
    """A global-batch cell that states tokens ("4M tokens", "16M", "2.1M tok") moves to the batch in tokens
    (`_batch_tokens`, read by `stated_otherwise` with the row's seq_len) where the row has none there."""
    if "global_batch_seqs" not in frame.columns:
        return frame
    cell = pl.col("global_batch_seqs").cast(pl.Utf8).str.strip_chars()
    tokens = cell.str.contains(r"(?i)tok|^\s*[\d.,]+\s*[mbg]\s*$").fill_null(False)
    if not frame.select(tokens.any()).item():
        return frame
    have = pl.col("_batch_tokens") if "_batch_tokens" in frame.columns else pl.lit(None, dtype=pl.Utf8)
    move = tokens & have.is_null()
    return frame.with_columns(
        pl.when(move).then(cell.str.replace(r"(?i)\s*(tokens?|tok)\s*$", "")).otherwise(have).alias("_batch_tokens"),
        pl.when(move).then(None).otherwise(pl.col("global_batch_seqs")).alias("global_batch_seqs"))


def _nodes_in_count_cells(frame: pl.DataFrame) -> pl.DataFrame:
    """A GPU-count cell that counts nodes ("128 nodes", "16 hosts") moves to the node count (`_nodes`, read by
    `stated_otherwise` as nodes x GPUs per node) where the row has none there; "16 nodes x 8" / "16 x 8 GPUs" is
    read as the product where it stays."""
    if "n_gpus" not in frame.columns:
        return frame
    cell = pl.col("n_gpus").cast(pl.Utf8).str.strip_chars()
    prod = cell.str.extract_groups(r"(?i)^\s*(\d+)\s*(?:nodes?|hosts?|servers?)?\s*[x×*]\s*(\d+)\s*(?:gpus?|chips?|"
                                   r"devices?|accelerators?)?(?:\s*(?:each|per\s+node))?\s*$")
    product = (prod.struct.field("1").cast(pl.Float64, strict=False) * prod.struct.field("2").cast(pl.Float64,
                                                                                                  strict=False))
    nodes = cell.str.extract(r"(?i)^\s*([\d,]+)\s*(?:nodes?|hosts?|servers?)\s*$", 1)
    if not frame.select((product.is_not_null() | nodes.is_not_null()).any()).item():
        return frame
    have = pl.col("_nodes").cast(pl.Utf8) if "_nodes" in frame.columns else pl.lit(None, dtype=pl.Utf8)
    move = nodes.is_not_null() & have.is_null()
    return frame.with_columns(
        pl.when(move).then(number_text(nodes)).otherwise(have).alias("_nodes"),
        pl.when(move).then(None).when(product.is_not_null()).then(product.round(0).cast(pl.Int64).cast(pl.Utf8))
        .otherwise(pl.col("n_gpus")).alias("n_gpus"))


def _hardware_in_count_cells(frame: pl.DataFrame) -> pl.DataFrame:
    """A GPU-count cell that names the accelerator too ("512x A100 80GB" under "GPUs") is the row's hardware cell
    where the row has no gpu (`catalog.resolve_gpu_cells` then reads its count), and no count of its own."""
    if "n_gpus" not in frame.columns or "gpu" not in frame.columns:
        return frame
    cell = pl.col("n_gpus").cast(pl.Utf8).str.strip_chars()
    named = cell.str.contains(r"[A-Za-z]").fill_null(False) & pl.col("gpu").cast(pl.Utf8).str.strip_chars() \
        .replace("", None).is_null()
    if not frame.select(named.any()).item():
        return frame
    return frame.with_columns(pl.when(named).then(cell).otherwise(pl.col("gpu")).alias("gpu"),
                              pl.when(named).then(None).otherwise(pl.col("n_gpus")).alias("n_gpus"))


def size_in_billions(expr: pl.Expr) -> pl.Expr:
    """A parameter count as written ("1.7B", "70b", "125M", "1T", "175"): billions (a bare number is already in
    billions, the schema's unit)."""
    t = number_text(expr).str.to_lowercase().str.strip_chars()
    m = t.str.extract_groups(r"^(\d+(?:\.\d+)?)\s*([bmt]?)(?:\s*(?:params|parameters))?$")
    unit = m.struct.field("2").replace_strict({"": 1.0, "b": 1.0, "m": 1e-3, "t": 1e3}, default=None,
                                              return_dtype=pl.Float64)
    v = m.struct.field("1").cast(pl.Float64, strict=False) * unit
    # a bare number of 100,000 or more is a raw parameter count ("6658859008"), not billions
    return pl.when((m.struct.field("2") == "") & (v >= 1e5)).then(v / 1e9).otherwise(v)


#: a model name that marks a mixture of experts: an active size ("A3B", "A22B"), experts x size ("8x7B"), "MoE"
MOE_NAME_MARK = r"(^|[^a-z0-9])a\d+(\.\d+)?b([^a-z0-9]|$)|\d\s*x\s*\d|moe|mixture"


def params_from_name(runs: pl.DataFrame) -> pl.DataFrame:
    """Rows whose model_name names no architecture, with params_b empty and no other reading of the name on record:
    params_b = the size the name states ("Mystery 70B" -> 70; `catalog.SIZE_TOKEN`), from which a dense model gets
    a shape by rule (`models.corpus.runs_adapter.infer_dense_shape`), noted in `model_name_note`. Not for a name that marks
    a mixture of experts (`MOE_NAME_MARK`) or a row whose `arch` says it is not dense: their size fixes no shape."""
    if "model_name" not in runs.columns or not runs.height:
        return runs
    low = pl.col("model_name").cast(pl.Utf8).str.to_lowercase()
    size = catalog.name_size_b(low)
    err = pl.col("model_name_error") if "model_name_error" in runs.columns else pl.lit(None, dtype=pl.Utf8)
    arch = pl.col("arch").cast(pl.Utf8) if "arch" in runs.columns else pl.lit(None, dtype=pl.Utf8)
    unread = pl.col("arch_id").is_null() & pl.col("params_b").is_null() & err.is_null()  # nothing read the name
    marks_moe = low.str.contains(MOE_NAME_MARK).fill_null(False)
    todo = unread & size.is_not_null() & ~marks_moe & (arch.is_null() | (arch == "dense"))
    note = pl.format("params_b={} from the model name '{}' (it names no architecture in "
                     "measurements/architectures.csv)", size.round(3).cast(pl.Utf8).str.replace(r"\.0$", ""),
                     pl.col("model_name"))
    old = pl.col("model_name_note") if "model_name_note" in runs.columns else pl.lit(None, dtype=pl.Utf8)
    moe = unread & marks_moe
    why_moe = pl.format("'{}' names no architecture in measurements/architectures.csv, and a mixture of experts' size "
                        "fixes no shape: give n_layers, d_model, n_heads and n_experts, top_k, expert_ffn_dim, or add "
                        "the model to that table", pl.col("model_name"))
    return runs.with_columns(pl.when(todo).then(size).otherwise(pl.col("params_b")).alias("params_b"),
                             pl.when(todo).then(note).otherwise(old).alias("model_name_note"),
                             pl.when(moe).then(why_moe).otherwise(err).alias("model_name_error"))


def _metrics_of(frame: pl.DataFrame, runs: pl.DataFrame) -> pl.DataFrame:
    """The file's metric rows in the run_metrics shape `models.corpus.targets.measured_throughput` reads, with each run's
    accelerator count, sequence length and global batch as `runs` reads them (typed, and from a node count, a batch
    in tokens or a layout cell where the file states them so: `stated_otherwise`), so a step time converts alike
    whichever way the file writes them."""
    need = ("run_id", "metric", "value")
    shape = ("n_gpus", "seq_len", "global_batch_seqs")
    if not all(c in frame.columns for c in need):
        return pl.DataFrame(schema={"run_id": pl.Utf8, "metric": pl.Utf8, "value": pl.Float64, "derived": pl.Utf8,
                                    "notes": pl.Utf8, "n_gpus": pl.Int64, "seq_len": pl.Int64,
                                    "global_batch_seqs": pl.Int64})
    rows = frame.select(
        pl.col("run_id").str.strip_chars(), pl.col("metric").str.strip_chars(),
        number_text(pl.col("value")).cast(pl.Float64, strict=False),
        *[pl.col(c).str.strip_chars().alias(c) if c in frame.columns else pl.lit(None, dtype=pl.Utf8).alias(c)
          for c in ("derived", "notes")],
    ).filter(pl.col("run_id").is_not_null() & pl.col("value").is_not_null())
    read = runs.select("run_id", *[pl.col(c).cast(pl.Int64, strict=False) if c in runs.columns
                                   else pl.lit(None, dtype=pl.Int64).alias(c) for c in shape])
    return rows.join(read, on="run_id", how="left")


#: footnote marks a table puts after a number ("405*", "41.0%†", "9.5¹")
_FOOTNOTE = r"[\s*†‡§¶¹²³⁴⁵⁶⁷⁸⁹⁰]+$"
#: a measured value's unit words after the number ("2.1 s", "512k tokens/s", "390 TFLOP/s"): stripped
_UNIT_WORDS = r"(?i)\s*(ms|s|sec|secs|seconds?|tokens?\s*/\s*s(ec)?|tok\s*/\s*s|t/s|tflops?(\s*/\s*s)?|x)$"
#: a rate's decimal multiplier written after the number ("512k" tokens/s)
_RATE_MULTIPLIER = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9}


def _cell_number(expr: pl.Expr) -> pl.Expr:
    """A measured value as written: a number (`number_text`), or a percentage ("41.2%") as its fraction; footnote
    marks and unit words after it dropped, a k/M/B multiplier applied ("512k" -> 512,000)."""
    t = expr.cast(pl.Utf8).str.strip_chars().str.replace(_FOOTNOTE, "").str.replace(_UNIT_WORDS, "") \
        .str.strip_chars()
    mult = t.str.extract(r"(?i)\d\s*([kmbg])$", 1).str.to_lowercase().replace_strict(
        _RATE_MULTIPLIER, default=1.0, return_dtype=pl.Float64).fill_null(1.0)
    num = number_text(t.str.strip_suffix("%").str.replace(r"(?i)(\d)\s*[kmbg]$", "$1")).cast(pl.Float64,
                                                                                            strict=False)
    return pl.when(t.str.ends_with("%")).then(num / 100.0).otherwise(num * mult)


def _cell_seconds(expr: pl.Expr) -> pl.Expr:
    """The time unit a cell states after its number: 1e-3 for "ms", 1.0 for "s"/"sec"/"seconds", null for none."""
    t = expr.cast(pl.Utf8).str.strip_chars().str.replace(_FOOTNOTE, "").str.to_lowercase()
    return pl.when(t.str.contains(r"\d\s*ms$")).then(pl.lit(1e-3)).when(
        t.str.contains(r"\d\s*(s|sec|secs|seconds?)$")).then(pl.lit(1.0)).otherwise(pl.lit(None, dtype=pl.Float64))


#: headers of quantities the schema states another way (pipeline.measurements) -> the column `read_headers` keeps
#: them under until `stated_otherwise` reads them, and its type there
STATED_OTHERWISE = ((NODES_HEADERS, "_nodes", pl.Float64), (BATCH_TOKENS_HEADERS, "_batch_tokens", pl.Utf8),
                    (PARALLELISM_HEADERS, "_parallelism", pl.Utf8), (LOCAL_BATCH_HEADERS, "_local_batch", pl.Float64),
                    (GRAD_ACCUM_HEADERS, "_grad_accum", pl.Float64))


def read_headers(frame: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """A hand-written run file (cells as strings) in the measurement schema's shape, and what was read how:

    * a header the schema knows under another spelling (`pipeline.measurements.COLUMN_SYNONYMS`: num_gpus,
      global_batch_size, tensor_model_parallel_size, ...) is renamed, unless the schema's own column is there too;
    * a column per measured quantity (`METRIC_SYNONYMS`: tokens_per_second_per_gpu, "Step time (ms)", "MFU (%)",
      ...) becomes one long-form metric row per run, in the schema's unit (ms -> s, % -> fraction, samples/s x
      seq_len -> tokens/s: `SAMPLES_SYNONYMS`), beside any
      `metric`/`value` rows the file has; a `metric` value spelled that way, or the schema's own
      metric name in another case ("MFU"), is read the same way (`METRIC_VALUE_KEYS`);
    * an `mfu` or `hfu` above 1 (and at most 100) is read as a percentage;
    * without a run_id column, every row is one run, named by its line ("line 2").
    Returns (frame, notes): one note per reading, for every row's `assumptions`."""
    notes: list[str] = []
    present = set(frame.columns)
    renames, wide = {}, {}
    for c in frame.columns:
        if c in present & set(COLUMNS) or c == "_line":
            continue
        key = header_key(c)
        target = key if key in COLUMNS else COLUMN_SYNONYMS.get(key) or ARCH_SYNONYMS.get(key)
        if target is not None and target not in present and target not in renames.values():
            renames[c] = target
            notes.append(f"column '{c}' read as {target}")
        elif target is None and (metric := metric_synonym(key)) is not None:
            wide[c] = metric
        elif target is None and (samples := samples_synonym(key)) is not None:
            wide[c] = (samples, "seq_len")  # sequences per second: x the row's seq_len
        elif target is None and (um := unit_metric(c)) is not None and um[1] == "inverse":
            wide[c] = um  # steps per second ("it/s", "iter/s"): a step time of 1 / the value
        elif key in FSDP_FLAG_HEADERS and "sharding" not in present and "sharding" not in renames.values():
            # NeMo's performance tables: an "FSDP" column of 0/1 (or a degree): 1 or more is FSDP, 0 states nothing
            frame = frame.with_columns(pl.col(c).map_elements(_fsdp_flag, return_dtype=pl.Utf8).alias(c))
            renames[c] = "sharding"
            notes.append(f"column '{c}' read as sharding (fsdp where it is 1 or more; 0 states no sharding)")
        elif (names := degree_names(key)) and "_parallelism" not in renames.values():
            # "TP/PP/DP" over "8/16/64": the degrees in the header's order, read as a layout cell
            frame = frame.with_columns(pl.col(c).map_elements(lambda t, n=names: _named_degrees(n, t),
                                                              return_dtype=pl.Utf8).alias(c))
            renames[c] = "_parallelism"
            notes.append(f"column '{c}' read as the degrees {', '.join(names)} in that order")
        else:  # a quantity the schema states another way: kept for `stated_otherwise` (the first such column)
            kept = next((col for headers, col, _ in STATED_OTHERWISE if key in headers), None)
            if kept is not None and kept not in renames.values():
                renames[c] = kept
    frame = frame.rename(renames)
    frame, unit_notes = _metric_from_unit(frame)
    notes += unit_notes
    if "run_id" not in frame.columns:
        line = pl.col("_line").cast(pl.Utf8) if "_line" in frame.columns else \
            (pl.int_range(pl.len()) + 2).cast(pl.Utf8)
        frame = frame.with_columns(pl.format("line {}", line).alias("run_id"))
        notes.append("no run_id column: each row is one run, named by its line")
    if wide:
        base = frame.drop(list(wide))
        for c in ("metric", "value"):
            if c not in base.columns:
                base = base.with_columns(pl.lit(None, dtype=pl.Utf8).alias(c))
        parts = [base]
        for c, (metric, factor) in wide.items():
            v = _cell_number(pl.col(c))
            if factor == "seq_len":  # samples are sequences: tokens = samples x the row's seq_len
                scale = number_text(pl.col("seq_len")).cast(pl.Float64, strict=False) if "seq_len" in frame.columns \
                    else pl.lit(None, dtype=pl.Float64)
                said = " (x seq_len: a sample is one sequence)"
            elif factor == "inverse":  # steps per second: the step time is its reciprocal
                v = 1.0 / v
                scale, said = pl.lit(1.0), " (1 / the value: steps per second)"
            elif metric == "step_time_s":  # a cell that states its own time unit ("2100 ms") is read in it
                scale = pl.coalesce(_cell_seconds(pl.col(c)), pl.lit(factor))
                said = f" (x {factor:g})" if factor != 1.0 else ""
            else:
                scale, said = pl.lit(factor), (f" (x {factor:g})" if factor != 1.0 else "")
            v = v * scale
            parts.append(frame.filter(v.is_not_null()).with_columns(
                pl.lit(metric).alias("metric"), v.cast(pl.Utf8).alias("value")
            ).select(base.columns))
            notes.append(f"column '{c}' read as metric {metric}{said}")
        frame = pl.concat(parts, how="vertical")
    if "metric" in frame.columns and "value" in frame.columns:
        # the file's metric spellings other than the schema's own name and unit, each looked up once by its header
        # key (so the schema's names in any case, "MFU" or "Step_Time_S", are read too)
        keys = {m: header_key(m) for m in frame["metric"].drop_nulls().unique().to_list()}
        spellings = {m: v for m, k in keys.items() if (v := metric_value_key(k)) is not None and v != (m, 1.0)}
        spelled = pl.col("metric").is_in(list(spellings))
        name = pl.col("metric").replace_strict({k: v[0] for k, v in spellings.items()}, default=None,
                                               return_dtype=pl.Utf8)
        factor = pl.col("metric").replace_strict({k: v[1] for k, v in spellings.items()}, default=None,
                                                 return_dtype=pl.Float64)
        value = _cell_number(pl.col("value"))
        if spellings:
            notes.append("metric " + ", ".join(f"'{m}'" for m in sorted(spellings)) +
                         " read in the schema's names and units")
        frame = frame.with_columns(
            pl.when(spelled).then(name).otherwise(pl.col("metric")).alias("metric"),
            pl.when(spelled).then(value * factor).otherwise(value).cast(pl.Utf8).alias("value"))
        frame, unit_said = _metric_units(frame)
        notes.extend(unit_said)
        value = _cell_number(pl.col("value"))
        pct = pl.col("metric").is_in(["mfu", "hfu"]) & (value > 1.0) & (value <= 100.0)
        if frame.select(pct.fill_null(False).any()).item():
            notes.append("an mfu/hfu above 1 read as a percentage")
            frame = frame.with_columns(pl.when(pct).then((value / 100.0).cast(pl.Utf8)).otherwise(pl.col("value"))
                                       .alias("value"))
    return frame, notes


#: headers of a measured number and of its unit, for a file that names the quantity by its unit alone ("Throughput"
#: 1500 in "tokens/sec/GPU", "Result" 12.5 in "s/step"; no `metric` column)
VALUE_HEADERS = ("value", "throughput", "result", "results", "measurement", "measured", "measured_value",
                 "performance", "perf", "speed", "score")
UNIT_HEADERS = ("unit", "units", "metric_unit", "unit_of_measure", "measure")
#: a unit read as a step time, in seconds per unit ("s/step", "ms per iteration"), or as steps per second
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0, "ms": 1e-3, "msec": 1e-3,
               "millisecond": 1e-3, "milliseconds": 1e-3, "min": 60.0, "minute": 60.0, "minutes": 60.0}
_STEP_WORDS = ("step", "steps", "iter", "iters", "iteration", "iterations", "it", "batch")


def unit_metric(unit: str | None) -> tuple[str, float | str] | None:
    """(the schema's metric, factor) a unit names: a metric spelling (`metric_value_key`: "tokens/sec/GPU", "MFU",
    "TFLOPS/GPU"), "%" (MFU in percent), samples or sequences per second ("seq_len": x the row's seq_len), a time
    per step ("s/step", "ms/iter", "seconds") or steps per second ("iter/s", "it/s": "inverse", 1 / the value);
    None for a unit none of these reads."""
    if unit is None or not str(unit).strip():
        return None
    key = header_key(unit)
    if key in ("pct", "percent"):
        return "mfu", 0.01
    if (m := metric_value_key(key)) is not None:
        return m
    if (smp := samples_synonym(key)) is not None:
        return smp, "seq_len"
    words = [w for w in key.split("_") if w and w != "per"]  # "ms per iteration", "s/step": the unit words
    if words and words[0] in _TIME_UNITS and all(w in _STEP_WORDS for w in words[1:]):
        return "step_time_s", _TIME_UNITS[words[0]]
    if len(words) == 2 and words[0] in _STEP_WORDS and words[1] in ("s", "sec", "second"):
        return "step_time_s", "inverse"
    return None


def _column_of(frame: pl.DataFrame, headers) -> str | None:
    """The first column of `frame` whose header key is one of `headers`, or None."""
    by_key = {header_key(c): c for c in frame.columns}
    return next((by_key[k] for k in headers if k in by_key), None)


def _in_schema_unit(frame: pl.DataFrame, value: pl.Expr, factor: float | str) -> pl.Expr:
    """`value` in the schema's unit for a `unit_metric` factor: x the row's seq_len ("seq_len"), its reciprocal
    ("inverse"), else x the factor."""
    if factor == "seq_len":
        seq = number_text(pl.col("seq_len")).cast(pl.Float64, strict=False) if "seq_len" in frame.columns else \
            pl.lit(None, dtype=pl.Float64)
        return value * seq
    return 1.0 / value if factor == "inverse" else value * factor


def _factor_note(factor: float | str) -> str:
    return ("" if factor == 1.0 else " (x seq_len)" if factor == "seq_len" else " (1 / the value)"
            if factor == "inverse" else f" (x {factor:g})")


def _metric_units(frame: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """A `metric` column beside a `unit` column (`UNIT_HEADERS`): a step time whose unit is another time per step
    ("ms", "ms/iter") is read in seconds, and a metric the schema does not name ("throughput", "speed") is read as
    the quantity its unit names ("tokens/sec/GPU", "samples/s": `unit_metric`). A schema metric (`METRICS`) keeps its
    own name whatever the unit says (an MFU in "%": the percentage rule below). Unchanged without a unit column."""
    ucol = _column_of(frame, UNIT_HEADERS)
    if ucol is None or "metric" not in frame.columns or "value" not in frame.columns:
        return frame, []
    value = _cell_number(pl.col("value"))
    metric, scaled, said = pl.col("metric"), value, []
    for m, u in frame.select("metric", ucol).drop_nulls().unique(maintain_order=True).rows():
        if (um := unit_metric(u)) is None:
            continue
        name, f = um
        if m in METRICS and not (m == name == "step_time_s" and f not in (1.0, "inverse")):
            continue
        hit = (pl.col("metric") == m) & (pl.col(ucol) == u)
        metric = pl.when(hit).then(pl.lit(name)).otherwise(metric)
        scaled = pl.when(hit).then(_in_schema_unit(frame, value, f)).otherwise(scaled)
        said.append(f"metric '{m}' in '{u}' read as {name}{_factor_note(f)}")
    if not said:
        return frame, []
    return frame.with_columns(metric.alias("metric"), scaled.cast(pl.Utf8).alias("value")), ["; ".join(said)]


def _metric_from_unit(frame: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """`frame` with `metric` and `value` from a value column and a unit column (`VALUE_HEADERS`, `UNIT_HEADERS`)
    when it has no `metric` column: each row's quantity read from its unit (`unit_metric`), its value in the
    schema's unit; a row whose unit reads as nothing keeps no measurement. Unchanged otherwise."""
    if "metric" in frame.columns:
        return frame, []
    vcol, ucol = _column_of(frame, VALUE_HEADERS), _column_of(frame, UNIT_HEADERS)
    if vcol is None or ucol is None:
        return frame, []
    units = {u: unit_metric(u) for u in frame[ucol].drop_nulls().unique().to_list()}
    read = {u: m for u, m in units.items() if m is not None}
    if not read:
        return frame, []
    value = _cell_number(pl.col(vcol))
    metric, scaled = pl.lit(None, dtype=pl.Utf8), pl.lit(None, dtype=pl.Float64)
    for u, (m, f) in read.items():
        hit = pl.col(ucol) == u
        metric = pl.when(hit).then(pl.lit(m)).otherwise(metric)
        scaled = pl.when(hit).then(_in_schema_unit(frame, value, f)).otherwise(scaled)
    out = frame.with_columns(metric.alias("metric"), scaled.cast(pl.Utf8).alias("value"))
    if vcol != "value":
        out = out.drop(vcol)
    if ucol != "unit":
        out = out.drop(ucol)
    said = ", ".join(f"'{u}' as {m}{_factor_note(f)}" for u, (m, f) in sorted(read.items()))
    unread = sorted(u for u, m in units.items() if m is None)
    return out, [f"column '{vcol}' read as the value of the quantity column '{ucol}' names: {said}"
                 + (f"; unit(s) {', '.join(repr(u) for u in unread)} not read: those rows keep no measurement"
                    if unread else "")]


#: a layout cell's degrees ("TP8 PP16 DP64", "tp=8, pp=4", "FSDP 32, TP 8", "8-way TP"): a dimension's name next to
#: its degree, in either order. FSDP/HSDP/ZeRO-k n are data parallelism of degree n with that sharding
_DEGREE_NAMES = r"vpp|tp|pp|dp|cp|ep|sp|fsdp|hsdp|ddp|zero[-_ ]?[123]"
_DEGREE_RE = (rf"(?i)(?:\b({_DEGREE_NAMES})\s*[=:x×]?\s*(\d+)\b)"
              rf"|(?:\b(\d+)\s*(?:-?\s*way)?\s*({_DEGREE_NAMES})\b)")
_SHARDING_OF = {"fsdp": "fsdp", "hsdp": "hsdp", "ddp": "none", "zero1": "zero1", "zero2": "zero2", "zero3": "zero3"}
#: a token count's unit suffix ("16M" tokens): decimal, and the binary multiple when only that gives a whole number
#: of sequences (Llama 3's "16M" tokens are 2,048 sequences of 8,192 = 16 x 2^20)
_TOKEN_SUFFIX = {"k": (1e3, 2.0 ** 10), "m": (1e6, 2.0 ** 20), "b": (1e9, 2.0 ** 30), "g": (1e9, 2.0 ** 30)}


#: headers of an FSDP flag or degree column (NeMo's performance summary: "FSDP" 0/1)
FSDP_FLAG_HEADERS = ("fsdp", "fsdp_size", "fsdp_degree", "use_fsdp")


def _fsdp_flag(text: str | None) -> str | None:
    """An FSDP column's cell: "fsdp" for 1 or more (or yes/true), None for 0, no or an empty cell."""
    t = str(text or "").strip().lower()
    if t in ("yes", "true", "y", "on"):
        return "fsdp"
    try:
        return "fsdp" if float(t.replace(",", "")) >= 1 else None
    except ValueError:
        return None


#: a header naming only parallel degrees, in order ("TP/PP/DP", "tp-pp-cp-dp", "(DP, TP, PP)")
_DEGREE_HEADER_RE = re.compile(r"^(tp|pp|dp|cp|ep)(_(tp|pp|dp|cp|ep))+$")


def degree_names(key: str) -> list[str]:
    """The degrees a header key names in order (["tp", "pp", "dp"] for "TP/PP/DP"), [] for any other header."""
    key = re.sub(r"_?(degree|degrees|size|sizes)$", "", key)
    key = re.sub(r"[,;*x×]+(?=_|$)|(?<=_)[,;*x×]+_|_?[,;]_?", "_", key).strip("_")  # "(TP, PP, DP)", "TP x PP x DP"
    key = re.sub(r"_+", "_", key)
    return key.split("_") if _DEGREE_HEADER_RE.match(key) and len(set(key.split("_"))) == len(key.split("_")) else []


def _named_degrees(names: list[str], text: str | None) -> str | None:
    """A cell of a degrees header ("8/16/64" under TP/PP/DP) as a layout cell ("tp8 pp16 dp64"); None when the
    cell does not hold one whole number per degree."""
    nums = re.findall(r"\d+", str(text or ""))
    if len(nums) != len(names) or re.search(r"[^\d\s/,;:x*()\[\]-]", str(text or "")):
        return None
    return " ".join(f"{n}{d}" for n, d in zip(names, nums))


#: a dimension written out ("tensor parallel 8", "pipeline-parallel size 4", "expert model parallelism 64") -> its
#: short name; and the "x" that joins degrees ("TP8xPP4")
_SPELLED_DEGREES = (
    (r"virtual[\s_-]*pipeline(?:[\s_-]*model)?[\s_-]*parallel(?:ism)?(?:[\s_-]*size)?", "vpp"),
    (r"tensor(?:[\s_-]*model)?[\s_-]*parallel(?:ism)?(?:[\s_-]*size)?", "tp"),
    (r"pipeline(?:[\s_-]*model)?[\s_-]*parallel(?:ism)?(?:[\s_-]*size)?", "pp"),
    (r"data[\s_-]*parallel(?:ism)?(?:[\s_-]*size)?", "dp"),
    (r"context[\s_-]*parallel(?:ism)?(?:[\s_-]*size)?", "cp"),
    (r"expert(?:[\s_-]*model)?[\s_-]*parallel(?:ism)?(?:[\s_-]*size)?", "ep"),
)
_DEGREE_JOIN_RE = re.compile(r"(?i)(\d)\s*[x×]\s*(?=[a-z])")


def _spelled_degrees(text: str) -> str:
    for pattern, short in _SPELLED_DEGREES:
        text = re.sub(rf"(?i)\b{pattern}\b", short, text)
    return text


def parse_layout(text: str | None) -> dict[str, int | str]:
    """The degrees a layout cell states ({"tp": 8, "pp": 16, "dp": 64}; FSDP/HSDP/ZeRO-k/DDP n as "dp": n and
    "sharding"); {} for an empty cell. Sequence parallelism ("SP") is not a degree of its own and is skipped."""
    out: dict[str, int | str] = {}
    text = _DEGREE_JOIN_RE.sub(r"\1 ", _spelled_degrees(text or ""))  # "TP8xPP4xDP32" -> "TP8 PP4 DP32"
    for m in re.finditer(_DEGREE_RE, text):
        name, deg = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        name = re.sub(r"[-_ ]", "", name.lower())
        if name == "sp":
            continue
        if name in _SHARDING_OF:
            out.setdefault("sharding", _SHARDING_OF[name])
            name = "dp"
        out.setdefault(name, int(deg))
    for m in re.finditer(r"(?i)\b(fsdp|hsdp|zero[-_ ]?[123])\b(?!\s*[=:x×]?\s*\d)", text or ""):
        out.setdefault("sharding", _SHARDING_OF[re.sub(r"[-_ ]", "", m.group(1).lower())])  # "ZeRO-3, TP 8"
    return out


def token_count(text: str | None, seq_len: float | None) -> tuple[float | None, bool]:
    """A batch in tokens as written ("16,777,216", "16M", "4.2M") and whether a binary multiple was read (`_TOKEN_SUFFIX`:
    decimal unless only 2^10k makes a whole number of `seq_len` sequences)."""
    t = re.sub(r"(\d)[,_ ](?=\d{3}\b)", r"\1", str(text or "").strip()).lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmbg]?)(?:\s*tokens?)?", t)
    if not m:
        return None, False
    v = float(m.group(1))
    if not m.group(2):
        return v, False
    dec, bin_ = (v * f for f in _TOKEN_SUFFIX[m.group(2)])
    whole = lambda x: seq_len is not None and seq_len > 0 and abs(x / seq_len - round(x / seq_len)) < 1e-9  # noqa: E731
    return (bin_, True) if not whole(dec) and whole(bin_) else (dec, False)


def _degree(c: str) -> pl.Expr:
    """A parallel degree as a float, an unstated one counted 1 (the runs adapter's rule)."""
    return pl.col(c).cast(pl.Float64).fill_null(1.0)


def _dp_or_implied() -> pl.Expr:
    """dp as stated, else n_gpus / (tp pp cp), an unstated degree counted 1 (the runs adapter's rule)."""
    return pl.coalesce(pl.col("dp").cast(pl.Float64), pl.col("n_gpus").cast(pl.Float64) / (_degree("tp") *
                                                                                         _degree("pp") * _degree("cp")))


def _fill_global_batch(runs: pl.DataFrame, seqs: pl.Expr, notes: list[str], note: str,
                       micro: pl.Expr | None = None) -> pl.DataFrame:
    """`runs` with global_batch_seqs = `seqs` (rounded) where it is empty and `seqs` is at least 1, `note` appended
    to `notes` when a row takes it; and micro_batch = `micro` on those rows where it is empty."""
    b = seqs.round(0)
    use = pl.col("global_batch_seqs").is_null() & b.is_not_null() & (b >= 1)
    if runs.select(use.any()).item():
        notes.append(note)
    cols = [pl.when(use).then(b.cast(pl.Int64)).otherwise(pl.col("global_batch_seqs")).alias("global_batch_seqs")]
    if micro is not None:
        cols.append(pl.when(use & pl.col("micro_batch").is_null()).then(micro).otherwise(pl.col("micro_batch"))
                    .alias("micro_batch"))
    return runs.with_columns(cols)


def stated_otherwise(runs: pl.DataFrame, hardware: pl.DataFrame, notes: list[str]) -> tuple[pl.DataFrame, list[str]]:
    """`runs` (gpu as hardware ids) with what the file states another way, where the schema's own column is empty:
    the degrees of a layout cell (`_parallelism`, `parse_layout`), n_gpus from a node count (`_nodes` x
    gpus_per_node, else the hardware table's `accelerators_per_host` or `gpus_per_node_typical`), global_batch_seqs from a batch in tokens
    (`_batch_tokens` / seq_len, `token_count`) or from a batch per data-parallel rank (`_local_batch` x dp, dp =
    n_gpus / (tp pp cp) where unstated; no gradient accumulation: the local batch is also the micro-batch) or from
    the micro-batch and the gradient accumulation steps (`_grad_accum`: micro_batch x steps x dp); `notes` with what
    was read so."""
    notes = list(notes)
    if "_parallelism" in runs.columns:
        parsed = [parse_layout(t) for t in runs["_parallelism"].to_list()]
        cols, said = [], set()
        for c in ("tp", "pp", "dp", "cp", "ep", "vpp", "sharding"):
            vals = [p.get(c) for p in parsed]
            if not any(v is not None for v in vals):
                continue
            dtype = pl.Utf8 if c == "sharding" else pl.Int64
            cur = pl.col(c).cast(dtype) if c in runs.columns else pl.lit(None, dtype=dtype)
            cols.append(pl.coalesce(cur, pl.Series(f"_{c}", vals, dtype=dtype)).alias(c))
            said.add(c)
        if said:
            notes.append("the layout column read as its degrees (" + ", ".join(sorted(said)) + ")")
        runs = runs.with_columns(cols).drop("_parallelism")
    if "_nodes" in runs.columns:
        # one host's accelerators (8 on an HGX board, 4 per GB200/GB300 NVL72 compute tray, 4 or 8 TPU chips); a
        # hardware file that does not state it: its typical node
        per_host = pl.coalesce([pl.col(c).cast(pl.Float64, strict=False) for c in (HOST_COLUMN, "gpus_per_node_typical")
                                if c in hardware.columns] or [pl.lit(None, dtype=pl.Float64)])
        per = hardware.select(pl.col("id").alias("gpu"), per_host.alias("_per_node")).unique("gpu", keep="first")
        runs = runs.join(per, on="gpu", how="left")
        n = (pl.col("_nodes") * pl.coalesce(pl.col("gpus_per_node").cast(pl.Float64), pl.col("_per_node")))
        use = pl.col("n_gpus").is_null() & n.is_not_null()
        if runs.select(use.any()).item():
            notes.append("n_gpus = nodes x GPUs per node (the stated gpus_per_node, else the accelerator's typical "
                         "node: 8 for HGX/DGX, 4 per GB200/GB300 compute tray, the chips of a TPU host)")
        runs = runs.with_columns(pl.when(use).then(n.round(0).cast(pl.Int64)).otherwise(pl.col("n_gpus"))
                                 .alias("n_gpus")).drop("_nodes", "_per_node")
    # every degree of a layout that states dp: its product is the GPU count (an unstated degree counts 1)
    by_degrees = pl.col("n_gpus").is_null() & pl.col("dp").is_not_null()
    if runs.select(by_degrees.any()).item():
        notes.append("n_gpus = dp x tp x pp x cp (no GPU count stated; an unstated degree counts 1)")
        n = _degree("dp") * _degree("tp") * _degree("pp") * _degree("cp")
        runs = runs.with_columns(pl.when(by_degrees).then(n.round(0).cast(pl.Int64)).otherwise(pl.col("n_gpus"))
                                 .alias("n_gpus"))
    if "_batch_tokens" in runs.columns:
        read = [token_count(t, s) for t, s in zip(runs["_batch_tokens"].to_list(), runs["seq_len"].to_list())]
        tokens = pl.Series("_tokens", [v for v, _ in read], dtype=pl.Float64)
        runs = _fill_global_batch(runs, tokens / pl.col("seq_len").cast(pl.Float64), notes,
                                  "global_batch_seqs = the batch in tokens / seq_len" +
                                  (" (a K/M/B suffix read as 2^10/2^20/2^30 where only that makes whole sequences)"
                                   if any(binary for _, binary in read) else "")).drop("_batch_tokens")
    if "_local_batch" in runs.columns:
        acc = pl.col("_grad_accum").fill_null(1.0) if "_grad_accum" in runs.columns else pl.lit(1.0)
        # with pipeline stages the local batch is split into pipeline micro-batches (torchtitan's default micro-batch
        # size 1, as a pipeline needs several micro-batches); without, it is one micro-batch
        piped = pl.col("pp").cast(pl.Float64).fill_null(1.0) > 1
        runs = _fill_global_batch(runs, pl.col("_local_batch") * acc * _dp_or_implied(), notes,
                                  "global_batch_seqs = the batch per data-parallel rank x dp (x the gradient "
                                  "accumulation steps where stated; micro_batch = that batch where unstated, 1 with "
                                  "pipeline stages)",
                                  micro=pl.when(piped).then(pl.lit(1, dtype=pl.Int64))
                                  .otherwise(pl.col("_local_batch").round(0).cast(pl.Int64))).drop("_local_batch")
    if "_grad_accum" in runs.columns:  # micro-batch x gradient accumulation x dp (dp = n_gpus / (tp pp cp))
        runs = _fill_global_batch(runs, pl.col("micro_batch").cast(pl.Float64) * pl.col("_grad_accum") *
                                  _dp_or_implied(), notes,
                                  "global_batch_seqs = micro_batch x gradient accumulation steps x dp"
                                  ).drop("_grad_accum")
    return runs, notes


def resolve_word_spellings(runs: pl.DataFrame) -> pl.DataFrame:
    """`runs` with `sharding` and `recompute` in the schema's vocabulary: a common spelling ("ZeRO-3", "FULL_SHARD",
    "distributed optimizer", "gradient checkpointing", "true") mapped by `pipeline.measurements`
    SHARDING_SPELLINGS / RECOMPUTE_SPELLINGS; `_word_note` says what was read (null where the value was the schema's
    own, up to case), `_word_error` names a spelling the tables do not know (the value is kept)."""
    notes, errors, cols = [], [], []
    for col in ("sharding", "recompute"):
        if col not in runs.columns:
            continue
        raw = pl.col(col).cast(pl.Utf8).str.strip_chars()
        mapped = canonical_word(raw, col)
        cols.append(pl.coalesce(mapped, raw).alias(col))
        listed = pl.lit(False)
        if col == "recompute":  # a MaxText remat_policy: the save list memory and recompute time follow
            code = save_list_code(raw)
            cols.append(code)
            listed = code.is_not_null()
        notes.append(pl.when(mapped.is_not_null() & (raw.str.to_lowercase() != mapped))
                     .then(pl.format(f"{col} '{{}}' read as {{}}{{}}", raw, mapped, pl.when(listed).then(pl.lit(
                         " with that MaxText remat_policy's save list (memory: what it keeps on the device; time: "
                         "what the backward recomputes)")).otherwise(pl.lit("")))))
        errors.append(pl.when(raw.is_not_null() & mapped.is_null()).then(pl.format(
            f"unknown {col} '{{}}' (expected one of {', '.join(ENUMS[col])} or a common spelling such as "
            + ("ZeRO-3, FULL_SHARD, distributed optimizer, DDP" if col == "sharding" else
               "full, selective, none, gradient checkpointing, true/false") + ")", raw)))
    if not cols:
        return runs.with_columns(pl.lit(None, dtype=pl.Utf8).alias("_word_note"),
                                 pl.lit(None, dtype=pl.Utf8).alias("_word_error"))
    return runs.with_columns(*cols, pl.concat_str(notes, separator="; ", ignore_nulls=True).replace("", None)
                             .alias("_word_note"),
                             pl.concat_str(errors, separator="; ", ignore_nulls=True).replace("", None)
                             .alias("_word_error"))


def save_list_code(recompute: pl.Expr) -> pl.Expr:
    """`selective_policy`: the models.memory.model code of a recompute cell that names a MaxText remat_policy
    ("save_qkv_proj", "qkv_proj_offloaded", ...; what it keeps and what the backward recomputes), null otherwise
    (the stack's own selective recompute)."""
    return remat_words(recompute).struct.field("selective_policy").cast(pl.Float64).alias("selective_policy")


def resolve_dtype_spellings(runs: pl.DataFrame, hardware: pl.DataFrame) -> pl.DataFrame:
    """`runs` (with `gpu` as hardware ids) with `dtype` in the schema's vocabulary: a common spelling mapped by
    `pipeline.measurements.DTYPE_SPELLINGS` ("bfloat16" -> bf16, "fp8 (delayed scaling)" -> fp8, "fp4" -> nvfp4),
    and "mixed"/"amp" (mixed precision, no format named) as bf16 on an accelerator with a BF16 peak and fp16 on one
    without (`peak_bf16_tflops` empty: NVIDIA before Ampere, e.g. V100, whose AMP autocasts to FP16; bf16 when
    the accelerator is not known). `_dtype_note` says what was read (null when the value was the schema's own,
    up to case); `_dtype_error` names a spelling the table does not know (the value is kept)."""
    raw = pl.col("dtype").cast(pl.Utf8).str.strip_chars()
    mapped = canonical_dtype(raw)
    peak = hardware.select(pl.col("id").alias("gpu"), pl.col("peak_bf16_tflops").cast(pl.Float64, strict=False)
                           .alias("_bf16_peak")).unique("gpu", keep="first")
    out = runs.join(peak, on="gpu", how="left") if "gpu" in runs.columns else runs.with_columns(
        pl.lit(None, dtype=pl.Float64).alias("_bf16_peak"))
    no_bf16 = pl.col("gpu").is_in(peak["gpu"].to_list()) & pl.col("_bf16_peak").is_null()
    mixed = mapped == MIXED_PRECISION
    value = pl.when(mixed & no_bf16).then(pl.lit("fp16")).when(mixed).then(pl.lit("bf16")).otherwise(mapped)
    note = (pl.when(mixed & no_bf16).then(pl.format("dtype '{}' read as fp16 (mixed precision on an accelerator "
                                                    "without BF16: FP16 autocast)", raw))
            .when(mixed).then(pl.format("dtype '{}' read as bf16 (mixed precision on an accelerator with BF16)", raw))
            .when(mapped.is_not_null() & (raw.str.to_lowercase() != mapped))
            .then(pl.format("dtype '{}' read as {}", raw, mapped)))
    error = pl.when(raw.is_not_null() & mapped.is_null()).then(pl.format(
        "unknown dtype '{}' (expected one of {} or a common spelling such as bfloat16, float16, fp8 delayed "
        "scaling, fp8 current scaling, fp4, mixed)", raw, pl.lit(", ".join(ENUMS["dtype"]))))
    return out.with_columns(pl.coalesce(value, pl.col("dtype")).alias("dtype"), note.alias("_dtype_note"),
                            error.alias("_dtype_error")).drop("_bf16_peak")


def unknown_stacks(cfg: pl.DataFrame, stacks) -> pl.DataFrame:
    """A run whose `framework` names no stack the stack table knows (no word of measurements/stack_words.csv) is
    read with the generic stack row, says so in `assumptions`, and takes the wider interval of a stack the fit never
    saw (`stack_unknown`). Only in a user's file: the corpus's runs are the fit's own, their stacks seen."""
    if "framework" not in cfg.columns:
        return cfg
    stated = pl.col("framework").cast(pl.Utf8).str.strip_chars().fill_null("") != ""
    unknown = stated & ~names_a_stack(stacks, "framework")
    return cfg.with_columns(
        pl.when(unknown).then(pl.lit(1.0)).otherwise(pl.lit(0.0)).alias("stack_unknown"),
        pl.when(unknown).then(pl.concat_str([pl.col("assumptions"), pl.format(
            "framework '{}' names no stack of measurements/stack_words.csv: the generic stack row, wider interval",
            pl.col("framework"))], separator="; ", ignore_nulls=True)).otherwise(pl.col("assumptions"))
        .alias("assumptions"))


def measured_runs_ran(pred: pl.DataFrame, measured: pl.Series) -> pl.DataFrame:
    """A run with a measurement ran, so it fitted: where the memory model calls it over capacity, the row stays
    `feasible` (the prediction made with its stated settings) and says so in `assumptions`; `memory_fits` False and
    `memory_gb_per_gpu` keep the memory model's figure. Refusal is for configurations a user asks about."""
    over = pl.Series(measured).fill_null(False) & pl.col("error").str.starts_with("memory").fill_null(False)
    return pred.with_columns(
        pl.when(over).then(pl.concat_str([pl.col("assumptions"), pl.format(
            "measured, so it ran: predicted as stated although the memory model calls it over capacity ({})",
            pl.col("error"))], separator="; ", ignore_nulls=True)).otherwise(pl.col("assumptions")).alias("assumptions"),
        pl.when(over).then(pl.lit(True)).otherwise(pl.col("feasible")).alias("feasible"),
        pl.when(over).then(pl.lit(None, dtype=pl.Utf8)).otherwise(pl.col("error")).alias("error"),
    )


def predict_file(path: Path, measurements: Path, model=None) -> pl.DataFrame:
    """One row per distinct run_id of the file: the prediction (`models.fitting.predictor.predict` with `model`), or
    the reason it cannot be made, and -- when the file has a measurement -- `measured_tokens_per_s_per_gpu` and
    `error_pct` (100 x (predicted / measured - 1)).

    Unstated fields are inferred by the documented rules of `models.corpus.runs_adapter` (listed in `assumptions`
    after the assumption set). Memory never refuses a run: `memory_gb_per_gpu` is reported beside the
    capacity `memory_gb` (as the vendor states it), `memory_capacity_gb` (those binary GB in the model's decimal GB)
    and `memory_fits`. Cells are parsed leniently (a bad number becomes empty and the run
    says what is missing); only problems with the file as a whole raise FileRejected."""
    return predict_frame(read_measurement_file(path).frame, measurements, model, source=str(path))


def predict_frame(frame: pl.DataFrame, measurements: Path, model=None, source: str = "frame") -> pl.DataFrame:
    """`predict_file` on the rows of a measurement-schema frame (cells as strings, as a file is read; other
    types are taken as their text). Raises FileRejected (naming `source`) without a run_id column."""
    frame = frame.with_columns(pl.col(c).cast(pl.Utf8) for c, t in frame.schema.items()
                               if t != pl.Utf8 and c != "_line")
    frame, header_notes = read_headers(frame)  # other spellings of the schema's headers and metrics
    if "run_id" not in frame.columns:
        raise FileRejected(source, "missing required column run_id", line=1)
    for c in COLUMNS:
        if c not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=pl.Utf8).alias(c))
    # a node count, a batch in tokens, a layout in one cell, a batch per data-parallel rank (`read_headers`): kept
    # beside the schema's columns until they can be read (`stated_otherwise`)
    frame = _batch_cells_in_tokens(frame)  # "4M tokens" under a global-batch header: a batch in tokens
    frame = _nodes_in_count_cells(frame)  # "128 nodes", "16 x 8" under a GPU-count header: nodes x per node
    frame = _hardware_in_count_cells(frame)  # "512x A100 80GB" under a GPU-count header: the hardware cell
    k_cols = [c for c in K_COUNT_COLUMNS if c in frame.columns and frame.select(
        number_text(pl.col(c)).str.contains(_K_COUNT).any()).item()]
    if k_cols:
        header_notes = [*header_notes, f"a K suffix in {', '.join(k_cols)} read as x 1,024"]
    extra = {c: t for _, c, t in STATED_OTHERWISE if c in frame.columns}
    typed = frame.select(
        [(size_in_billions(pl.col(c)) if c in ("params_b", "active_params_b") else
          count_text(pl.col(c)) if c in K_COUNT_COLUMNS else
          number_text(pl.col(c)) if dtype != pl.Utf8 else pl.col(c).str.strip_chars().replace("", None))
         .cast(dtype, strict=False).alias(c)
         for c, dtype in [(c, SCHEMA[c]) for c in COLUMNS if c not in ("metric", "value", "unit", "derived", "notes")]
         + list(extra.items())]
        + [arch_cell(c) for c in ARCH_STATED if c in frame.columns]  # a model's shape beyond the schema's columns
        + [arch_cells_error([c for c in ARCH_STATED if c in frame.columns])]
    ).filter(pl.col("run_id").is_not_null())
    runs = typed.group_by("run_id", maintain_order=True).first()
    runs = params_from_name(catalog.fill_from_architectures(runs, measurements))
    # `gpu` by id, name or a short name (`H100`: a documented default, recorded in assumptions; catalog.resolve_gpu);
    # n_gpus, where the row states none, from a count the cell writes ("8x H100", "v5p-128"; catalog.resolve_gpu_cells)
    runs = catalog.resolve_gpu_cells(runs, catalog.hardware(measurements))
    # `dtype` by a common spelling ("bfloat16", "fp8 delayed scaling", "amp"; recorded in assumptions)
    runs = resolve_dtype_spellings(runs, catalog.hardware(measurements))
    runs = resolve_word_spellings(runs)  # sharding and recompute by a common spelling ("ZeRO-3", "true")
    runs, header_notes = stated_otherwise(runs, catalog.hardware(measurements), header_notes)
    hw = resolve_hardware(catalog.hardware(measurements), strict=False)
    cfg = configs_from_runs(runs, hw, catalog.recipes(measurements))  # what the runs' named recipes set
    cfg = unknown_stacks(cfg, catalog.stacks(measurements))
    header_note = pl.lit("; ".join(header_notes) if header_notes else None, dtype=pl.Utf8)
    cfg = cfg.with_columns(pl.concat_str([header_note, "assumptions", "_dtype_note", "_word_note", "_gpu_note"],
                                         separator="; ", ignore_nulls=True).replace("", None).alias("assumptions")
                           ).drop("_gpu_note", "_dtype_note", "_word_note")
    unknown_gpu = ~cfg["gpu"].is_in(hw["id"].to_list())
    cfg = cfg.with_columns(
        pl.when(pl.Series(unknown_gpu)).then(pl.format("unknown hardware id '{}'", pl.col("gpu")))
        .otherwise(pl.coalesce("_arch_error", "_dtype_error", "_word_error", "config_error")).alias("config_error")
    ).drop("_arch_error", "_dtype_error", "_word_error")
    ok = cfg.filter(pl.col("config_error").is_null())
    # a row with a measurement ran, so it fitted (models.corpus.runs_adapter: full recompute is never assumed for it)
    measured_ids = frame.filter(pl.col("value").str.strip_chars().replace("", None).is_not_null())["run_id"] \
        if "value" in frame.columns else pl.Series([], dtype=pl.Utf8)
    measured = ok["run_id"].is_in(measured_ids.unique().to_list())
    # an unstated layout, expert-parallel degree or micro-batch: the fastest that fits by the served model, as
    # `stepcast search` ranks (models.corpus.runs_adapter._prediction)
    ok = resolve_unstated(ok, physics, measured=measured, judge=lambda c: predict(c, model))
    text = {"error", "fit_version", "assumptions", "calibration_domain"}
    good = pl.DataFrame(schema={c: pl.Boolean if c in ("feasible", "memory_fits") else pl.Utf8 if c in text
                                else pl.Float64 for c in [*OUT_COLUMNS, "peak_bf16_tflops", "model_flops_per_token",
                                                          "hardware_flops_per_token"]})  # no row to predict
    if ok.height:
        pred = predict(ok, model)
        pred = pred.with_columns(
            pl.concat_str([pl.col("assumptions"), pl.Series(ok["assumptions"])], separator="; ", ignore_nulls=True)
            .alias("assumptions"),
            pl.Series("memory_gb", ok["memory_gb"]).cast(pl.Float64),
        ).with_columns(  # the capacity in the model's decimal GB: a vendor's "80 GB" are binary (models.memory.model)
            (pl.col("memory_gb") * CAPACITY_BYTES_PER_GB / 1e9).alias("memory_capacity_gb"),
        ).with_columns((pl.col("memory_gb_per_gpu") <= pl.col("memory_capacity_gb")).alias("memory_fits"))
        pred = measured_runs_ran(pred, measured)
        good = ok.select([c for c in RUN_COLUMNS if c in ok.columns] + ["peak_bf16_tflops"]).hstack(
            pred.select(OUT_COLUMNS + [c for c in ANSWER_EXTRAS if c in pred.columns]
                        + ["model_flops_per_token", "hardware_flops_per_token"]))
    bad = cfg.filter(pl.col("config_error").is_not_null()).select(
        *[c for c in RUN_COLUMNS if c in cfg.columns and c not in ("recompute",)],
        pl.lit(False).alias("feasible"), pl.col("config_error").alias("error"))
    out = pl.concat([good, bad], how="diagonal_relaxed")
    # the measurement, where the file has one (the same target rules as the calibration)
    target = measured_throughput(_metrics_of(frame, runs))
    if target.height:
        out = derive_flop_targets(out.join(target, on="run_id", how="left"))
        out = out.with_columns(
            (100.0 * (pl.col("tokens_per_s_per_gpu") / pl.col("measured_tokens_per_s_per_gpu") - 1.0)).alias("error_pct"))
    out = out.drop([c for c in ("peak_bf16_tflops", "model_flops_per_token", "hardware_flops_per_token",
                                "measured_model_tflops_per_gpu", "measured_mfu", "measured_hfu") if c in out.columns])
    order = runs.select("run_id").with_row_index("_i")
    return out.join(order, on="run_id").sort("_i").drop("_i")
