"""How low can the vTrain multi-node error go with this model family? (issue 4 analysis, prints figures)

    cd /work/main && uv run stepcast build && uv run python benchmarks/vtrain_fit_floor.py [--store PATH]

Reads the built store (read-only), then prints, for the 109 vTrain multi-node runs:
  1. leave-one-model-size-out MAPE per size for every predictor (the issue's protocol: the held-out size's
     runs never reach the physics fit or the residual model);
  2. the IN-SAMPLE MAPE of the physics fit (a) on all runs and (b) on the vTrain multi-node runs alone, with
     every size in the fit. A held-out protocol cannot beat (b): it is the floor of the analytical model's
     structure on this data (measurement noise plus effects the model does not represent).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import polars as pl

from models.fitting import calibration as cal
from models.corpus.evaluate import predict_runs, prepare_configs
from pipeline import store
from pipeline.fits import input_recipes, read_inputs
from pipeline.settings import Settings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default=None, help="store to read (default: the published snapshot)")
    args = ap.parse_args()
    path = args.store or str(Settings.load().snapshot)
    con = store.connect(path, read_only=True)
    runs, hw, metrics = read_inputs(con)
    recipes = input_recipes()
    ok, _ = prepare_configs(runs, hw, recipes)
    targets = predict_runs(runs, hw, metrics, recipes)
    data = cal.fit_data(ok, targets.select("run_id", "measured_tokens_per_s_per_gpu", "whole_run_average"))
    vm = np.array([str(r).startswith("vtrain_m") for r in data.run_id])
    t0 = time.perf_counter()
    cv = cal.grouped_cv(data, "vtrain_multi_lomso")
    print(f"leave-one-model-size-out on {int(vm.sum())} vTrain multi-node runs ({time.perf_counter() - t0:.0f} s):")
    df = data.configs.filter(pl.Series(vm)).select("d_model")
    for k, lp in cv.log_pred.items():
        df = df.with_columns(pl.Series(k, np.abs(np.exp(lp[vm] - data.log_target[vm]) - 1.0)))
    table = df.group_by("d_model").agg([pl.len().alias("runs")] + [pl.col(k).mean() for k in cv.log_pred]).sort(
        "d_model")
    with pl.Config(tbl_cols=20, float_precision=3, tbl_hide_dataframe_shape=True):
        print(table)
    print("overall MAPE: " + ", ".join(f"{k} {float(df[k].mean()):.3f}" for k in cv.log_pred))

    params, over = cal.fit_physics(data)
    rel = np.exp(cal.Physics(data.configs).log_tput(params, over) - data.log_target) - 1.0
    print(f"in-sample physics fit on all {len(rel)} runs: vTrain multi-node MAPE {np.mean(np.abs(rel[vm])):.3f}, "
          f"MdAPE {np.median(np.abs(rel[vm])):.3f}")
    sub = data.subset(np.flatnonzero(vm))
    p2, o2 = cal.fit_physics(sub, max_nfev=60)
    rel2 = np.exp(cal.Physics(sub.configs).log_tput(p2, o2) - sub.log_target) - 1.0
    print(f"in-sample physics fit on the vTrain multi-node runs alone: MAPE {np.mean(np.abs(rel2)):.3f}, "
          f"MdAPE {np.median(np.abs(rel2)):.3f} (the floor of this model structure on this data)")


if __name__ == "__main__":
    main()
