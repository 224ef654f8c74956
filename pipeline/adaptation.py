"""The served fit adapted to a cluster's own runs: `--calibrate-on FILE` (in process) and `--source NAME` (stored).

`from_file` reads a run file (the measurement schema, or the spellings `stepcast predict --runs` reads), predicts its
runs with the served fit, and adapts the fit to their measured throughput by the fit's adaptation rule
(`models.fitting.adapt`): nothing is written. `source_table` computes, for every source of the store, the same
adaptation from its ingested runs' measured throughput against the served fit (`calibrated_predictions`), which
`stepcast fit` and the scheduled and sensor re-fits store as the table `source_adaptations`; `from_source` reads
one row of it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl

from models.fitting.adapt import Adaptation, AdaptationRule, adapt
from pipeline import store
from pipeline.predict_runs import count_text, predict_frame, read_headers
from pipeline.readers import FileRejected, read_measurement_file

#: the table `stepcast fit` writes: one row per source of the store (SQL: `select * from source_adaptations`)
TABLE = "source_adaptations"
#: numeric cells a calibration file must state as numbers where it states them (the measured value, the layout)
STRICT_NUMBERS = ("value", "tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "seq_len", "params_b")


class AdaptationError(ValueError):
    """A calibration file or source that cannot adapt the fit; the message says why and what to do."""


def rule_of(model) -> AdaptationRule:
    """The adaptation rule of a Predictor's calibration, or AdaptationError."""
    cal = getattr(model, "calibration", None)
    rule = getattr(cal, "adaptation_rule", None)
    if cal is None:
        raise AdaptationError("no promoted calibration fit to adapt: run `stepcast build` (or `stepcast fit`) first")
    if rule is None:
        raise AdaptationError(f"the promoted fit {cal.version} was stored without an adaptation rule (an earlier "
                              "fit code): run `stepcast fit` to make a current one")
    return rule


def check_cells(path: Path, frame: pl.DataFrame) -> None:
    """A stated number that is not one is an error naming file, line and column (the lenient `predict --runs`
    reading would drop it and predict with a default: a calibration must not rest on a guess)."""
    frame, _ = read_headers(frame)
    for col in STRICT_NUMBERS:
        if col not in frame.columns:
            continue
        cell = pl.col(col).cast(pl.Utf8).str.strip_chars().replace("", None)
        parsed = count_text(pl.col(col)).cast(pl.Float64, strict=False)
        bad = frame.filter(cell.is_not_null() & (parsed.is_null() | ~parsed.is_finite()
                                                 | ((parsed <= 0) if col == "value" else (parsed < 0))))
        if bad.height:
            line = bad["_line"][0] if "_line" in bad.columns else None
            what = "a positive number" if col == "value" else "a number"
            raise FileRejected(str(path), f"'{bad[col][0]}' is not {what}", line=int(line) if line else None,
                               column=col)


def from_file(path, measurements: Path, model) -> Adaptation:
    """The adaptation of `model` (a realistic Predictor of the served fit) to the runs of the file at `path` (or of
    a frame in the measurement schema: the Python API's, the explorer's `calibrate_json`; its `_line` numbers rows).
    FileRejected for a bad row; AdaptationError when no run can adapt it (the message says why each failed)."""
    rule = rule_of(model)
    if isinstance(path, pl.DataFrame):  # the runs themselves (the Python API's frame, the explorer's records)
        frame, path = path, Path("calibration runs")
        if "_line" not in frame.columns:
            frame = frame.with_columns(pl.int_range(1, frame.height + 1).cast(pl.Int64).alias("_line"))
        frame = frame.with_columns(pl.col(c).cast(pl.Utf8) for c in frame.columns if c != "_line")
    else:
        path = Path(path)
        if not path.exists():
            raise AdaptationError(f"--calibrate-on {path}: no such file")
        frame = read_measurement_file(path).frame
    check_cells(path, frame)
    pred = predict_frame(frame, measurements, model, source=str(path))
    have = "measured_tokens_per_s_per_gpu" in pred.columns
    usable = pred.filter(pl.col("tokens_per_s_per_gpu").is_not_null() & (pl.col("tokens_per_s_per_gpu") > 0)
                         & (pl.col("measured_tokens_per_s_per_gpu") > 0)) if have else pred.clear()
    if not usable.height:
        why = []
        if not have:
            why.append("no row states a measurement (metric and value: step_time_s, tokens_per_s_per_gpu, mfu, ...)")
        failed = pred.filter(pl.col("step_time_s").is_null())
        for r in failed.head(3).iter_rows(named=True):
            why.append(f"run {r['run_id']}: {r.get('error') or 'not predictable'}")
        raise AdaptationError(f"--calibrate-on {path}: no run with both a measurement and a prediction to adapt the "
                              f"fit with ({pred.height} run(s) read" + ("; " + "; ".join(why) if why else "") + ")")
    errors = np.log(usable["measured_tokens_per_s_per_gpu"].to_numpy() / usable["tokens_per_s_per_gpu"].to_numpy())
    return adapt(errors, rule, name=path.name, fit_version=model.calibration.version)


def source_table(calibrated: pl.DataFrame, rule: AdaptationRule | None, fit_version: str | None) -> pl.DataFrame:
    """One row per source of `calibrated` (the store's `calibrated_predictions`: each run's served prediction and
    measurement): its runs, the adaptation its runs give (throughput factor, the unshrunk mean error, the 90%
    half-width its run count earns) under the served fit's rule. Empty without a rule."""
    schema = {"source": pl.Utf8, "n_runs": pl.Int64, "throughput_factor": pl.Float64, "raw_factor": pl.Float64,
              "interval_factor": pl.Float64, "fit_version": pl.Utf8}
    if rule is None or calibrated.height == 0 or "tokens_per_s_per_gpu" not in calibrated.columns:
        return pl.DataFrame(schema=schema)
    ok = calibrated.filter((pl.col("tokens_per_s_per_gpu") > 0) & (pl.col("measured_tokens_per_s_per_gpu") > 0))
    rows = []
    for (src,), part in ok.group_by(["source"], maintain_order=True):
        e = np.log(part["measured_tokens_per_s_per_gpu"].to_numpy() / part["tokens_per_s_per_gpu"].to_numpy())
        ad = adapt(e, rule, name=str(src), fit_version=fit_version)
        rows.append({"source": str(src), "n_runs": ad.n_runs, "throughput_factor": ad.throughput_factor,
                     "raw_factor": math.exp(ad.raw_level),
                     "interval_factor": None if ad.half_width is None else math.exp(ad.half_width),
                     "fit_version": fit_version})
    return pl.DataFrame(rows, schema=schema).sort("source")


def from_source(con, name: str, model) -> Adaptation:
    """The stored adaptation of source `name` (`source_adaptations`), matched exactly, then case-insensitively;
    AdaptationError naming the known sources otherwise."""
    rule = rule_of(model)
    if not store.table_exists(con, TABLE):
        raise AdaptationError(f"--source {name}: the store has no {TABLE} table yet: run `stepcast fit`")
    table = con.execute(f"select * from {TABLE}").pl()
    hit = table.filter(pl.col("source") == name)
    if not hit.height:
        hit = table.filter(pl.col("source").str.to_lowercase() == name.lower())
    near = table.filter(pl.col("source").str.to_lowercase().str.contains(name.lower(), literal=True))
    if not hit.height and near.height == 1:  # a unique part of a source's name: that source
        hit = near
    if not hit.height:
        known = (near if near.height else table)["source"].to_list()
        raise AdaptationError(f"--source {name}: no such source in the store; "
                              + ("did you mean: " if near.height else "known: ") + "; ".join(known[:12])
                              + (", ..." if len(known) > 12 else "") + " (`stepcast list sources`)")
    r = hit.row(0, named=True)
    level = math.log(r["throughput_factor"])
    return Adaptation(name=r["source"], n_runs=int(r["n_runs"]), level=level, raw_level=math.log(r["raw_factor"]),
                      half_width=rule.half_width(int(r["n_runs"])), fit_version=r["fit_version"])
