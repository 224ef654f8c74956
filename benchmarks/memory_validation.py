"""Memory model against measured peak memory: every run of measurements/measured_memory.csv predicted through the
path of `stepcast predict --runs` (pipeline.predict_runs.predict_file with the model the command uses), the
predicted bytes compared with the measured peak per accelerator.

    uv run python benchmarks/memory_validation.py [--csv OUT] [--file measurements/measured_memory.csv]

Units: the file's `peak_memory_gib` is GiB (2^30 bytes per accelerator); the prediction's `memory_gb_per_gpu` is
decimal GB (models.physics.step_time: bytes / 1e9), so the prediction is converted to GiB (x 1e9 / 2^30) before the
two are compared. Error = predicted / measured - 1.

Which counter each source measured (data card of the shared data, `measured_memory.csv`): torchtitan and torchao
`reserved_bytes.all.peak`, Megatron-LM CI `allocated_bytes.all.peak` on the last rank, torchtune
`active_bytes.all.peak`, ms-swift not stated. The memory model's total is what the device must hold (the capacity
check); each counter is compared with the part of it that counter holds (models.memory.model.counter_bytes: reserved
= total - the fixed allowance for CUDA context and NCCL; allocated/active = reserved / (1 + the allocator's reserve
share); ms-swift, counter unknown: the total).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from models.core.params import DEFAULT, PhysParams  # noqa: E402
from models.memory.model import counter_bytes  # noqa: E402
from pipeline.predict_runs import predict_file  # noqa: E402  (the function `stepcast predict --runs` uses)

GIB = 2.0**30
#: the memory metric of the file and the prediction's unit (decimal GB, models.physics.step_time)
METRIC = "peak_memory_gib"
PRED_BYTES_PER_UNIT = 1e9
#: counter each source measured (by source prefix; the file's notes say the same per row), as
#: models.memory.model.MEMORY_COUNTERS names them ("device" for ms-swift: its counter is not stated, the total is read)
COUNTERS = (("torchtitan", "reserved"), ("torchao", "reserved"), ("megatron-lm", "allocated"),
            ("torchtune", "active"), ("ms-swift", "device"))
#: targets (the issue): share predicted, median |error|, share within +-20 %, runs called over capacity
TARGETS = {"predicted_share": 0.95, "median_abs_err": 0.10, "within20_share": 0.85, "over_capacity": 0}


def counter_of(source: str) -> str:
    s = (source or "").lower()
    return next((c for p, c in COUNTERS if s.startswith(p)), "device")


def _model(measurements: Path, analytical_only: bool = False):
    """The model `stepcast predict --runs` answers with (pipeline.calibrated.model_for: the promoted calibration,
    or the priors where the store has none)."""
    try:
        from pipeline import calibrated
        from pipeline.settings import Settings

        return calibrated.model_for(Settings.load(), analytical_only, "realistic")
    except Exception as err:  # no store configured: the priors, as the command would without a promoted fit
        print(f"(no calibrated model: {err}; priors used)", file=sys.stderr)
        return None


def measured_frame(path: Path) -> pl.DataFrame:
    """run_id, source, counter, measured GiB of every memory row of the file."""
    raw = pl.read_csv(path, infer_schema_length=0)
    return (raw.filter(pl.col("metric") == METRIC)
            .select("run_id", "source", pl.col("value").cast(pl.Float64).alias("measured_gib"))
            .with_columns(pl.col("source").map_elements(counter_of, return_dtype=pl.Utf8).alias("counter")))


def validate(path: Path, measurements: Path, model=None, params: PhysParams = DEFAULT) -> pl.DataFrame:
    """One row per memory run: the measurement, the prediction in GiB (`device_gib`: the total the capacity check
    uses; `predicted_gib`: what the source's counter holds of it), the signed error and `memory_fits`. `params`:
    the memory allowances the prediction used (the promoted fit keeps the priors' memory fields)."""
    meas = measured_frame(path)
    pred = predict_file(path, measurements, model)
    pred = pred.select("run_id", "memory_gb_per_gpu", "memory_capacity_gb", "memory_fits", "error",
                       "sharding", "recompute", "micro_batch", "tp", "pp", "dp", "cp", "ep")
    out = meas.join(pred, on="run_id", how="left").with_columns(
        (pl.col("memory_gb_per_gpu") * PRED_BYTES_PER_UNIT / GIB).alias("device_gib"))
    # the part of the total the source's counter holds (models.memory.model.counter_bytes), in GiB
    read = [float(counter_bytes(t * PRED_BYTES_PER_UNIT, c, params)) / GIB if t is not None else None
            for t, c in zip(out["memory_gb_per_gpu"].to_list(), out["counter"].to_list())]
    out = out.with_columns(pl.Series("predicted_gib", read, dtype=pl.Float64))
    return out.with_columns((pl.col("predicted_gib") / pl.col("measured_gib") - 1.0).alias("err"))


def summary(v: pl.DataFrame) -> dict:
    ok = v.filter(pl.col("predicted_gib").is_not_null())
    e = ok["err"]
    return {
        "runs": v.height, "predicted": ok.height, "predicted_share": ok.height / max(v.height, 1),
        "median_abs_err": float(e.abs().median()) if ok.height else float("nan"),
        "median_err": float(e.median()) if ok.height else float("nan"),
        "within20_share": float((e.abs() <= 0.20).mean()) if ok.height else 0.0,
        "over_capacity": int((ok["memory_fits"] == False).sum()),  # noqa: E712
    }


def groups(v: pl.DataFrame, by: str) -> pl.DataFrame:
    ok = v.filter(pl.col("predicted_gib").is_not_null())
    return (ok.group_by(by).agg(pl.len().alias("n"), (100 * pl.col("err").median()).round(1).alias("median_err_pct"),
                                (100 * pl.col("err").abs().median()).round(1).alias("median_abs_err_pct"),
                                (100 * (pl.col("err").abs() <= 0.2).mean()).round(0).alias("within20_pct"))
            .sort(by))


def report(v: pl.DataFrame) -> str:
    s = summary(v)
    lines = [
        f"memory runs: {s['runs']}; predicted {s['predicted']} ({100 * s['predicted_share']:.0f}%, target "
        f">= {100 * TARGETS['predicted_share']:.0f}%)",
        f"median |error| {100 * s['median_abs_err']:.1f}% (target <= {100 * TARGETS['median_abs_err']:.0f}%); "
        f"median signed {100 * s['median_err']:+.1f}%",
        f"within +-20%: {100 * s['within20_share']:.0f}% (target >= {100 * TARGETS['within20_share']:.0f}%)",
        f"called over capacity (memory_fits False): {s['over_capacity']} (target {TARGETS['over_capacity']})",
    ]
    with pl.Config(tbl_rows=100, tbl_cols=20, tbl_width_chars=200, fmt_str_lengths=64, tbl_hide_dataframe_shape=True,
                   tbl_hide_column_data_types=True):
        lines += ["", "per source:", str(groups(v, "source")), "", "per counter:", str(groups(v, "counter")), "",
                  "per run:", str(v.filter(pl.col("predicted_gib").is_not_null()).select(
                      "run_id", "counter", pl.col("measured_gib").round(2), pl.col("predicted_gib").round(2),
                      pl.col("device_gib").round(2),
                      (100 * pl.col("err")).round(1).alias("err_pct"), "memory_fits"))]
    missed = v.filter(pl.col("predicted_gib").is_null())
    lines += ["", f"not predicted: {missed.height}"]
    lines += [f"  {r['run_id']}: {r['error'] or 'no prediction row'}" for r in missed.iter_rows(named=True)]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, help="write the per-run comparison here")
    ap.add_argument("--file", type=Path, default=ROOT / "measurements" / "measured_memory.csv")
    ap.add_argument("--measurements", type=Path, default=ROOT / "measurements")
    ap.add_argument("--analytical-only", action="store_true", help="the priors, as predict --analytical-only")
    a = ap.parse_args(argv)
    v = validate(a.file, a.measurements, _model(a.measurements, a.analytical_only))
    print(report(v))
    if a.csv is not None:
        v.write_csv(a.csv)
        print(f"\nwrote {v.height} rows to {a.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
