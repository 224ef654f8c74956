"""Hardware choice for target runs: every priced accelerator x cluster size, best layout, days and dollars."""

import dagster as dg
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.fit import calibrated_predictions
from assets.ingest import architectures, hardware
from models.fitting.predictor import Calibration, Predictor
from models.physics.hardware import resolve_hardware
from models.planning import plan as P
from pipeline import store
from pipeline.fits import load_promoted_fit
from pipeline.parallel import map_jobs, workers
from pipeline.resources import MeasurementsResource

#: the largest cluster the hardware-choice table considers
MAX_GPUS = 32_768


@dg.asset(group_name="plan", kinds={"duckdb"}, deps=[hardware, architectures, calibrated_predictions],
          description="For each target run in measurements/target_runs.csv (a named model, token budget, sequence "
                      "and batch, with its source): every accelerator with a price x node-aligned cluster size up to "
                      f"{MAX_GPUS:,}, the best layout, days with and without interruptions, cost (median cloud price), "
                      "energy and MFU, from the promoted fit through the one prediction function (the same numbers as "
                      "`stepcast plan`). Table `hardware_choice`; view `v_hardware_choice` keeps the cheapest size per "
                      "target x accelerator that finishes within 90 days.")
def hardware_choice(measurements: MeasurementsResource, duckdb: DuckDBResource) -> dg.MaterializeResult:
    targets = pl.read_csv(measurements.path("target_runs.csv"))
    with duckdb.get_connection() as con:
        hw = con.sql("select * from hardware").pl()
        arch = con.sql("select * from architectures").pl()
        promoted = load_promoted_fit(con)
    if promoted is not None and not isinstance(promoted, Calibration):
        promoted = None  # a fit of an earlier format: the priors answer until the next fit
    hw = resolve_hardware(hw, strict=False)
    priced = hw.filter(pl.col("cloud_usd_per_hour").is_not_null() & pl.col("hardware_error").is_null())
    rows = list(priced.iter_rows(named=True))
    prices = dict(zip(priced["id"], priced["cloud_usd_per_hour"]))
    model = Predictor(promoted)  # the same prediction function and fit as `stepcast plan`
    runs = []
    for t in targets.iter_rows(named=True):
        a = arch.filter(pl.col("id") == t["model"])
        if a.height != 1:
            raise ValueError(f"target_runs.csv: model '{t['model']}' of target {t['id']} is not in architectures")
        seqs = max(int(t["global_batch_tokens"]) // int(t["seq_len"]), 1)
        runs.append((t, a.row(0, named=True), seqs))
    # the layout searches (nearly all the time) per target x accelerator, in worker processes; each target's rows
    # are then put back in the accelerators' order, as one `plan_rows` call over all of them would make them
    found = map_jobs(P.best_layouts, [((a_row, [h], seqs, int(t["seq_len"]), MAX_GPUS), {"params": model})
                                      for t, a_row, seqs in runs for h in rows], workers())
    frames = []
    for i, (t, a_row, seqs) in enumerate(runs):
        best = [r for part in found[i * len(rows):(i + 1) * len(rows)] for r in part]
        f = P.plan_rows(a_row, rows, float(t["tokens"]), seqs, int(t["seq_len"]), MAX_GPUS, prices, model=model,
                        rows=best)
        if f.height == 0:
            continue
        frames.append(f.select(
            pl.lit(t["id"]).alias("target_id"), pl.lit(t["model"]).alias("model"),
            pl.lit(float(t["tokens"])).alias("tokens"), "hardware", "n_gpus", "tp", "pp", "dp", "cp", "ep", "vpp",
            "micro_batch", "sharding", "recompute", "step_time_s", "step_time_lo_s", "step_time_hi_s",
            "tokens_per_s_per_gpu", "mfu", "hfu", "memory_gb_per_gpu", "usd_per_gpu_hour", "days_ideal", "days",
            "days_lo", "days_hi", "goodput", "expected_interruptions", "checkpoint_interval_min", "checkpoint_write_s",
            "mtbf_h", "cost_usd", "cost_usd_lo", "cost_usd_hi", "cost_usd_ideal", "energy_mwh", "fit_version",
            "assumptions", "calibration_domain",
        ).with_columns([pl.col(c).fill_nan(None) for c in ("days", "cost_usd", "energy_mwh")]))
    table = pl.concat(frames, how="vertical_relaxed")
    with duckdb.get_connection() as con:
        store.replace_table(con, "hardware_choice", table)
        con.execute("""
            create or replace view v_hardware_choice as
            select * from (
              select *, row_number() over (partition by target_id, hardware order by cost_usd) as rank_in_hardware
              from hardware_choice where days <= 90
            ) where rank_in_hardware = 1
            order by target_id, cost_usd""")
        n_view = con.execute("select count(*) from v_hardware_choice").fetchall()[0][0]
    return dg.MaterializeResult(metadata={
        "rows": dg.MetadataValue.int(table.height),
        "targets": dg.MetadataValue.int(targets.height),
        "v_hardware_choice_rows": dg.MetadataValue.int(n_view),
    })


@dg.asset(group_name="plan", kinds={"duckdb"}, deps=[hardware_choice, "scaling_curves"],
          description="Documented SQL views for hardware selection in the published snapshot: v_best_layout (best "
                      "layout per architecture x hardware x batch policy x N), v_inflection (where extra "
                      "accelerators stop paying off, per curve), v_hardware_choice (cheapest cluster per target run "
                      "and accelerator within 90 days).")
def sql_views(duckdb: DuckDBResource) -> dg.MaterializeResult:
    with duckdb.get_connection() as con:
        con.execute("""
            create or replace view v_best_layout as
            select arch_id, gpu as hardware, policy, n_gpus, tp, pp, dp, cp, ep, vpp, micro_batch, sharding,
                   recompute, step_time_s, step_time_lo_s, step_time_hi_s, tokens_per_s_per_gpu, tokens_per_s, mfu,
                   memory_gb_per_gpu, time_to_train_days, cost_usd, parallel_efficiency, marginal_efficiency,
                   calibrated, fit_version
            from scaling_curves where feasible
            order by arch_id, hardware, policy, n_gpus""")
        con.execute("""
            create or replace view v_inflection as
            select curve_id, arch_id, gpu as hardware, policy, threshold, inflection_n, inflection_n_lo,
                   inflection_n_hi, knee_found, n_best_throughput, usl_sigma, usl_kappa, usl_peak_n, explanation
            from inflection_points
            order by arch_id, hardware, policy""")
        counts = {v: con.execute(f"select count(*) from {v}").fetchall()[0][0]
                  for v in ("v_best_layout", "v_inflection", "v_hardware_choice")}
    return dg.MaterializeResult(metadata={f"{k}_rows": dg.MetadataValue.int(v) for k, v in counts.items()})
