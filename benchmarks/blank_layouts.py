"""How much a stated layout is worth, and how well the inference rules stand in for a missing one: the shipped
corpus's runs predicted by a store's served fit as they are, then with their micro-batch blanked, with their layout blanked (tp, pp, dp, cp, ep,
vpp, micro_batch, recompute, sharding), then with the global batch blanked too, as a new user's file that states
only the model, the accelerator and its count would be read (`stepcast predict --runs`, models.corpus.runs_adapter). Prints
MdAPE, MAPE, the share within 10% and the 90% interval's coverage of tokens/s per accelerator for each reading, with
every source weighing the same beside the pooled figures, and the sources the blanking moves most.

The served fit was trained on these runs as stated, so the first row is in-sample; the gaps to it are what the
inference rules cost.

    uv run python benchmarks/blank_layouts.py [--store out/snapshot/stepcast.duckdb]
"""

from __future__ import annotations

import argparse

import duckdb
import numpy as np
import polars as pl

from models.fitting.calibration import source_weights, weighted_median
from pipeline.fits import load_promoted_fit
from pipeline.readers import read_measurement_file
from pipeline.predict_runs import predict_frame
from pipeline.settings import PROJECT_ROOT

M = PROJECT_ROOT / "measurements"
LAYOUT = ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "recompute", "sharding")


def score(pred: pl.DataFrame, source: dict) -> tuple[dict, pl.DataFrame]:
    p = pred.filter(pl.col("error_pct").is_not_null())
    e = np.abs(p["error_pct"].to_numpy()) / 100.0
    m, lo, hi = (p[c].cast(pl.Float64).to_numpy() for c in ("measured_tokens_per_s_per_gpu", "tokens_per_s_per_gpu_lo",
                                                            "tokens_per_s_per_gpu_hi"))
    cov = (lo <= m) & (m <= hi)
    src = np.array([source.get(r, "?") for r in p["run_id"].to_list()])
    w = source_weights(src)
    figs = {"runs": len(e), "MdAPE": np.median(e), "MAPE": e.mean(), "within 10%": (e <= 0.10).mean(),
            "coverage": cov.mean(), "MdAPE, sources equal": weighted_median(e, w),
            "MAPE, sources equal": float(np.sum(w * e) / np.sum(w))}
    per = pl.DataFrame({"source": src, "ape": e}).group_by("source").agg(pl.len().alias("n"), pl.col("ape").median())
    return figs, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=str(PROJECT_ROOT / "out" / "snapshot" / "stepcast.duckdb"))
    args = ap.parse_args()
    con = duckdb.connect(args.store, read_only=True)
    model = load_promoted_fit(con)
    if model is None:
        raise SystemExit(f"{args.store}: no promoted fit (run `uv run stepcast build` first)")
    frame = read_measurement_file(M / "measured_runs.csv").frame
    source = dict(frame.select("run_id", "source").unique("run_id").iter_rows())
    readings = {
        "as stated": frame,
        "micro-batch blanked": frame.with_columns(pl.lit(None, dtype=pl.Utf8).alias("micro_batch")),
        "layout blanked": frame.with_columns(pl.lit(None, dtype=pl.Utf8).alias(c) for c in LAYOUT),
        "layout and batch blanked": frame.with_columns(
            pl.lit(None, dtype=pl.Utf8).alias(c) for c in LAYOUT + ("global_batch_seqs",)),
    }
    print(f"served fit {getattr(model, 'version', '?')} of {args.store}")
    rows, per = [], {}
    for name, f in readings.items():
        figs, per[name] = score(predict_frame(f, M, model, source=name), source)
        rows.append({"reading": name, **figs})
    out = pl.DataFrame(rows).with_columns(pl.col(c).mul(100).round(1) for c in rows[0] if c not in ("reading", "runs"))
    with pl.Config(tbl_cols=-1, tbl_width_chars=200, tbl_hide_dataframe_shape=True):
        print(out)
        moved = per["as stated"].join(per["layout blanked"], on=["source", "n"], suffix=" blanked").with_columns(
            (pl.col("ape blanked") - pl.col("ape")).alias("moved")).sort(pl.col("moved").abs(), descending=True)
        print("MdAPE per source, as stated and with the layout blanked (largest moves first):")
        print(moved.head(8).with_columns(pl.col("ape", "ape blanked", "moved").mul(100).round(1)))


if __name__ == "__main__":
    main()
