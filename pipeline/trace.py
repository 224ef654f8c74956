"""`stepcast predict --trace FILE`: one optimizer step of the predicted configuration as a Chrome / Perfetto trace.

The events come from the same prediction `stepcast predict` prints: the configuration and model `pipeline.api`
predicted with are predicted once more with the physics' parts kept (`models.fitting.predictor.predict_arrays(...,
detail=True)`), laid out in time by `models.physics.timeline`, and scaled by the ratio of the served step time to
the physics step (the residual correction and a cluster's adaptation multiply the analytical time), so the last event
ends at the served `step_time_s`. docs/timeline.md says what the tracks mean.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import polars as pl

from models.fitting.predictor import encode, predict_arrays
from models.physics.step_time import TIMELINE_COLUMNS
from models.physics.timeline import chrome_trace, schedule_of, step_timeline

#: chunk passes (micro-batches x model chunks x stages) a trace may draw: a larger step is refused with the reason
MAX_PASSES = 20_000
#: the prediction's fields the trace's metadata repeats (the breakdown its events add up to)
META_FIELDS = ("model", "gpu", "n_gpus", "tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "global_batch_seqs",
               "seq_len", "sharding", "recompute", "dtype", "n_microbatches", "step_time_s", "compute_s", "tp_comm_s",
               "pp_bubble_s", "pp_comm_s", "dp_comm_exposed_s", "cp_comm_s", "ep_comm_s", "optimizer_s",
               "fit_version", "assumptions", "calibration_domain")


class TraceRefused(ValueError):
    """A trace that cannot be drawn (an invalid configuration, too many passes): the message says why."""


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def trace_document(configs: pl.DataFrame, model, result: pl.DataFrame) -> dict:
    """The Chrome trace (JSON object with `traceEvents`) of the one configuration of `configs`, predicted by `model`
    as `result` (the frame `pipeline.api.prediction` returns)."""
    row = result.row(0, named=True)
    out = predict_arrays(encode(configs), model, detail=True)
    parts = {c: float(out[c][0]) for c in TIMELINE_COLUMNS}
    step = float(out["step_time_s"][0])
    if not all(math.isfinite(v) for v in parts.values()) or not math.isfinite(step) or parts["tl_step_s"] <= 0:
        raise TraceRefused(f"no timeline: the configuration has no step time ({row.get('error') or 'invalid'})")
    pp, vpp, m = int(row["pp"]), int(row["vpp"] or 1), int(round(float(out["n_microbatches"][0])))
    if m * vpp * pp > MAX_PASSES:
        raise TraceRefused(f"no timeline: {m} micro-batches x {vpp} chunks x {pp} stages = {m * vpp * pp:,} passes, "
                           f"more than the {MAX_PASSES:,} a trace draws; a larger --micro-batch makes fewer")
    code = configs["stack_pipeline_schedule"][0] if "stack_pipeline_schedule" in configs.columns else None
    schedule, exact, sentence = schedule_of(code, pp, vpp)
    scale = step / parts["tl_step_s"]
    meta = {k: _clean(row.get(k)) for k in META_FIELDS if k in row}
    meta.update(schedule=schedule, schedule_exact=exact, schedule_note=sentence,
                physics_step_time_s=parts["tl_step_s"], scale=scale,
                scale_note=("Every event is the physics' time" if abs(scale - 1.0) < 1e-12 else
                            f"Every event is the physics' time x {scale:.6g}: the served step_time_s is the calibrated "
                            "one (residual correction or adaptation), and the timeline is scaled to it"),
                drawn=("every stage with the times of the stage that paces the pipeline; each stream's traffic of a "
                       "micro-batch split between its forward and backward in the ratio of their compute; the "
                       "recompute inside the forward pass; the host's wait as one block (docs/timeline.md)"))
    events = step_timeline(parts, pp, vpp, m, scale)
    return chrome_trace(events, pp, meta)


def write_trace(path: Path, doc: Mapping) -> None:
    """Write `doc` as JSON to `path` (its folder must exist); OSError as the system says it."""
    Path(path).write_text(json.dumps(doc, separators=(",", ":")))
