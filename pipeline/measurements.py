"""The measurement schema and its row-level validation (pure: DataFrames in, DataFrames out).

A measurement file is long form: one row = one number (`metric`, `value`, `unit`) for one run (`run_id`),
with the run's architecture, layout and hardware repeated on each of its rows and its provenance
(`source`, `source_ref`). `measurements/DATA_CARD.md` describes every column.

`validate(frame, file, known_hardware)` takes the file's cells as strings plus a `_line` column (the
1-based line of the row in the file; for Parquet the 1-based row number) and splits it into accepted rows
(typed) and rejected rows `(file, line, column, value, reason)`. Every rule is a vectorized polars
expression, so a million rows validate in about a second.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

#: every column of the measurement schema, in file order
COLUMNS: tuple[str, ...] = (
    "run_id", "source", "source_ref", "year", "model_name", "arch", "params_b", "active_params_b",
    "n_layers", "d_model", "n_heads", "n_kv_heads", "ffn_dim", "vocab", "seq_len", "global_batch_seqs",
    "micro_batch", "gpu", "gpu_as_reported", "n_gpus", "gpus_per_node", "framework", "dtype", "tp", "pp",
    "dp", "cp", "ep", "vpp", "sharding", "recompute", "metric", "value", "unit", "derived", "notes",
)
#: a file without any of these is rejected whole
REQUIRED: tuple[str, ...] = ("run_id", "source", "source_ref", "model_name", "gpu", "metric", "value", "unit")

INT_COLUMNS: dict[str, tuple[int, int]] = {
    # column: (min, max) inclusive; the max is an absurd-magnitude guard, not a physical limit
    "year": (1990, 2100),
    "n_layers": (1, 10_000),
    "d_model": (1, 1_000_000),
    "n_heads": (1, 100_000),
    "n_kv_heads": (1, 100_000),
    "ffn_dim": (1, 10_000_000),
    "vocab": (1, 100_000_000),
    "seq_len": (1, 100_000_000),
    "global_batch_seqs": (1, 100_000_000),
    "micro_batch": (1, 1_000_000),
    "n_gpus": (1, 100_000_000),
    "gpus_per_node": (1, 100_000),
    "tp": (1, 1_000_000),
    "pp": (1, 1_000_000),
    "dp": (1, 100_000_000),
    "cp": (1, 1_000_000),
    "ep": (1, 1_000_000),
    "vpp": (1, 10_000),
}
FLOAT_COLUMNS: dict[str, tuple[float, float]] = {
    "params_b": (1e-6, 1e6),
    "active_params_b": (1e-6, 1e6),
}
ENUMS: dict[str, tuple[str, ...]] = {
    "arch": ("dense", "moe", "hybrid-mamba-moe"),
    "dtype": ("fp32", "tf32", "bf16", "fp16", "fp8", "fp8-cs", "mxfp8", "nvfp4"),
    "sharding": ("none", "zero1", "zero2", "zero3", "fsdp", "hsdp"),
    "recompute": ("none", "selective", "full", "unknown"),
    "derived": ("yes", "no"),
}
#: metric -> (accepted units, lower bound (exclusive), upper bound (inclusive))
METRICS: dict[str, tuple[tuple[str, ...], float, float]] = {
    "step_time_s": (("s",), 0.0, 86_400.0),
    "tokens_per_s": (("tokens/s",), 0.0, 1e11),
    "tokens_per_s_per_gpu": (("tokens/s/GPU",), 0.0, 1e7),
    "model_tflops_per_gpu": (("TFLOP/s/GPU",), 0.0, 50_000.0),
    "mfu": (("fraction",), 0.0, 1.0),
    "hfu": (("fraction",), 0.0, 1.0),
    "time_to_train_min": (("min",), 0.0, 1e7),
    "gpu_hours": (("GPU-hours", "chip-hours", "GPU-hours per 1T tokens"), 0.0, 1e11),
}
#: columns that describe the run; every row of one run must agree on them (source_ref may differ: one run's
#: numbers can come from different tables of one publication)
RUN_COLUMNS: tuple[str, ...] = tuple(
    c for c in COLUMNS if c not in ("metric", "value", "unit", "derived", "notes", "source_ref")
)
#: the longest cell accepted (a guard against runaway quoting and binary junk)
MAX_FIELD_CHARS = 10_000

SCHEMA: dict[str, pl.DataType] = {
    c: (pl.Int64 if c in INT_COLUMNS else pl.Float64 if c in FLOAT_COLUMNS or c == "value" else pl.Utf8)
    for c in COLUMNS
}


@dataclass
class Validated:
    accepted: pl.DataFrame  # typed, COLUMNS + source_line
    rejected: pl.DataFrame  # file, line, column, value, reason
    duplicates_dropped: int  # exact duplicate (run_id, metric, value) rows dropped


REJECT_SCHEMA = {"file": pl.Utf8, "line": pl.Int64, "column": pl.Utf8, "value": pl.Utf8, "reason": pl.Utf8}


def empty_rejections() -> pl.DataFrame:
    return pl.DataFrame(schema=REJECT_SCHEMA)


def missing_required(columns: list[str]) -> list[str]:
    return [c for c in REQUIRED if c not in columns]


def _blank(col: str) -> pl.Expr:
    return pl.col(col).is_null() | (pl.col(col).str.strip_chars() == "")


def _rule(mask: pl.Expr, column: str, reason: pl.Expr | str) -> pl.Expr:
    """One rejection rule: a struct (column, reason) where `mask` is true, else null."""
    reason_expr = pl.lit(reason) if isinstance(reason, str) else reason
    return pl.when(mask).then(pl.struct(pl.lit(column).alias("column"), reason_expr.alias("reason")))


def _number_rules(col: str, lo: float, hi: float, integer: bool) -> list[pl.Expr]:
    raw = pl.col(col).str.strip_chars()
    num = raw.cast(pl.Float64, strict=False)
    present = ~_blank(col)
    kind = "an integer" if integer else "a number"
    rules = [
        _rule(present & num.is_null(), col, f"expected {kind}"),
        _rule(present & num.is_nan(), col, "NaN is not a measurement"),
        _rule(present & num.is_infinite(), col, "infinite value"),
        _rule(present & num.is_finite() & ((num < lo) | (num > hi)), col, f"out of range: expected {lo:g}..{hi:g}"),
    ]
    if integer:
        rules.append(_rule(present & num.is_finite() & (num != num.round(0)), col, "expected an integer"))
    return rules


def _rules(known_hardware: set[str] | None) -> list[pl.Expr]:
    rules: list[pl.Expr] = []
    for col in ("run_id", "source", "source_ref", "model_name", "gpu", "metric", "value", "unit"):
        what = "provenance" if col in ("source", "source_ref") else "a value"
        rules.append(_rule(_blank(col), col, f"missing {what} (required)"))
    rules.append(_rule(pl.col("run_id").str.contains(r"[\s,;]"), "run_id", "run_id must not contain spaces, commas or semicolons"))
    for col, (lo, hi) in INT_COLUMNS.items():
        rules += _number_rules(col, lo, hi, integer=True)
    for col, (lo, hi) in FLOAT_COLUMNS.items():
        rules += _number_rules(col, lo, hi, integer=False)
    for col, allowed in ENUMS.items():
        rules.append(
            _rule(~_blank(col) & ~pl.col(col).str.strip_chars().is_in(list(allowed)), col,
                  f"expected one of {', '.join(allowed)}")
        )
    metric = pl.col("metric").str.strip_chars()
    rules.append(_rule(~_blank("metric") & ~metric.is_in(list(METRICS)), "metric",
                       f"unknown metric; expected one of {', '.join(METRICS)}"))
    value = pl.col("value").str.strip_chars().cast(pl.Float64, strict=False)
    present = ~_blank("value")
    rules.append(_rule(present & value.is_null(), "value", "expected a number"))
    rules.append(_rule(present & value.is_nan(), "value", "NaN is not a measurement"))
    rules.append(_rule(present & value.is_infinite(), "value", "infinite value"))
    for name, (units, lo, hi) in METRICS.items():
        is_metric = metric == name
        rules.append(_rule(is_metric & ~_blank("unit") & ~pl.col("unit").str.strip_chars().is_in(list(units)), "unit",
                           f"unit for {name} must be {' or '.join(units)}"))
        finite = is_metric & value.is_finite()
        if name in ("mfu", "hfu"):
            rules.append(_rule(finite & (value > 1.0) & (value <= 100.0), "value",
                               f"{name} looks like a percent; give a fraction 0 < {name} <= 1"))
            rules.append(_rule(finite & ((value <= 0.0) | (value > 100.0)), "value",
                               f"{name} out of range: expected 0 < {name} <= 1"))
        elif name == "step_time_s":
            rules.append(_rule(finite & (value <= 0.0), "value", "time must be > 0"))
            rules.append(_rule(finite & (value > hi), "value", f"absurd step time: expected <= {hi:g} s"))
        else:
            rules.append(_rule(finite & ((value <= lo) | (value > hi)), "value",
                               f"out of range for {name}: expected {lo:g} < value <= {hi:g}"))
    if known_hardware is not None:
        rules.append(_rule(~_blank("gpu") & ~pl.col("gpu").str.strip_chars().is_in(sorted(known_hardware)), "gpu",
                           "unknown hardware id (see the hardware table / measurements/hardware_specs.csv)"))
    # degrees consistent with the job size where all are given (cp counts as 1 when empty; EP is carved
    # out of DP in every source, so it does not multiply)
    deg = {c: pl.col(c).str.strip_chars().cast(pl.Float64, strict=False) for c in ("tp", "pp", "dp", "cp", "n_gpus")}
    all_given = deg["tp"].is_not_null() & deg["pp"].is_not_null() & deg["dp"].is_not_null() & deg["n_gpus"].is_not_null()
    product = deg["tp"] * deg["pp"] * deg["dp"] * deg["cp"].fill_null(1.0)
    rules.append(_rule(all_given & (product != deg["n_gpus"]), "n_gpus",
                       pl.format("inconsistent degrees: tp*pp*dp*cp = {} but n_gpus = {}",
                                 product.cast(pl.Int64), deg["n_gpus"].cast(pl.Int64))))
    for col in COLUMNS:
        rules.append(_rule(pl.col(col).str.len_chars() > MAX_FIELD_CHARS, col,
                           f"field longer than {MAX_FIELD_CHARS} characters"))
    return rules


def validate(frame: pl.DataFrame, file: str, known_hardware: set[str] | None) -> Validated:
    """Validate string cells; returns typed accepted rows and (file, line, column, value, reason) rejections."""
    for col in COLUMNS:
        if col not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=pl.Utf8).alias(col))
    frame = frame.select([*COLUMNS, "_line"]).with_columns(
        [pl.col(c).cast(pl.Utf8) for c in COLUMNS]
    ).with_row_index("_row")
    # normalise: strip surrounding blanks, empty -> null
    frame = frame.with_columns(
        [pl.when(_blank(c)).then(None).otherwise(pl.col(c).str.strip_chars()).alias(c) for c in COLUMNS]
    )
    rules = _rules(known_hardware)
    checked = frame.with_columns(pl.concat_list(rules).list.drop_nulls().alias("_problems"))
    bad = (
        checked.filter(pl.col("_problems").list.len() > 0)
        .select("_row", "_line", "_problems")
        .explode("_problems")
        .unnest("_problems")
    )
    if bad.height:
        bad = bad.join(frame.select("_row", *COLUMNS), on="_row", how="left")
        bad = bad.with_columns(
            pl.struct(["column", *COLUMNS]).map_elements(
                lambda s: s[s["column"]], return_dtype=pl.Utf8
            ).alias("value")
        )
    good = checked.filter(pl.col("_problems").list.len() == 0).drop("_problems")
    typed = good.with_columns(
        [pl.col(c).cast(SCHEMA[c], strict=True) for c in COLUMNS if SCHEMA[c] != pl.Utf8]
    )
    extra_rejects: list[pl.DataFrame] = []

    # (run_id, metric) duplicates: identical values collapse to the first row, different values reject all
    dup_groups = typed.group_by("run_id", "metric").agg(
        pl.col("value").n_unique().alias("_n_values"), pl.len().alias("_n"), pl.col("_line").alias("_lines")
    ).filter(pl.col("_n") > 1)
    duplicates_dropped = 0
    if dup_groups.height:
        conflicting = dup_groups.filter(pl.col("_n_values") > 1)
        if conflicting.height:
            lines = conflicting.with_columns(pl.col("_lines").list.eval(pl.element().cast(pl.Utf8)).list.join(", ").alias("_where"))
            conf_rows = typed.join(lines.select("run_id", "metric", "_where"), on=["run_id", "metric"], how="inner")
            extra_rejects.append(conf_rows.select(
                pl.col("_row"), pl.col("_line"), pl.lit("value").alias("column"),
                pl.col("value").cast(pl.Utf8).alias("value"),
                pl.format("duplicate (run_id, metric) = ({}, {}) with different values on lines {}",
                          pl.col("run_id"), pl.col("metric"), pl.col("_where")).alias("reason"),
            ))
            typed = typed.join(conflicting.select("run_id", "metric"), on=["run_id", "metric"], how="anti")
        before = typed.height
        typed = typed.unique(subset=["run_id", "metric"], keep="first", maintain_order=True)
        duplicates_dropped = before - typed.height

    # every row of one run must describe the same run
    run_cols = [c for c in RUN_COLUMNS if c != "run_id"]
    disagree = typed.group_by("run_id").agg(
        [(pl.col(c).drop_nulls().n_unique() > 1).alias(c) for c in run_cols]
    )
    disagree = disagree.unpivot(index="run_id", variable_name="column", value_name="bad").filter(pl.col("bad"))
    if disagree.height:
        first_col = disagree.group_by("run_id").agg(pl.col("column").sort().first())
        rows = typed.join(first_col, on="run_id", how="inner")
        extra_rejects.append(rows.select(
            "_row", "_line", "column",
            pl.struct(["column", *COLUMNS]).map_elements(lambda s: None if s[s["column"]] is None else str(s[s["column"]]),
                                                         return_dtype=pl.Utf8).alias("value"),
            pl.format("rows of run {} disagree on {}", pl.col("run_id"), pl.col("column")).alias("reason"),
        ))
        typed = typed.join(first_col.select("run_id"), on="run_id", how="anti")

    parts = []
    if bad.height:
        parts.append(bad.select("_row", "_line", "column", "value", "reason"))
    parts.extend(extra_rejects)
    if parts:
        rejected = pl.concat([p.with_columns(pl.col("value").cast(pl.Utf8)) for p in parts], how="vertical_relaxed")
        rejected = rejected.sort("_row", "column").select(
            pl.lit(file).alias("file"), pl.col("_line").cast(pl.Int64).alias("line"), "column",
            pl.col("value").str.slice(0, 200), "reason",
        )
    else:
        rejected = empty_rejections()
    accepted = typed.sort("_row").select(*COLUMNS, pl.col("_line").cast(pl.Int64).alias("source_line"))
    return Validated(accepted=accepted, rejected=rejected, duplicates_dropped=duplicates_dropped)
