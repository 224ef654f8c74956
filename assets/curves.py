"""Scaling curves, inflection points and the compute frontier (thin: read tables, call models/, write, report).

Calibration: when `pipeline.fits.load_promoted_fit` returns a promoted fit, its fitted physics drive the layout
search and `models.calibration.apply_calibration` gives the intervals; otherwise the curves are analytical only
and say so (`calibrated` false, `calibration_note`).
"""


import time

import dagster as dg
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.ingest import architectures, hardware
from models.curves import (DEFAULT_N_MAX, DEFAULT_PER_GPU_BATCH_SEQS, DEFAULT_THRESHOLD, POLICIES, REFERENCE_RUNS,
                           calibrate_curves, calibration_from_bundle, default_dtype, explain, inflection, scaling_curve)
from models.frontier import frontier_summary, frontier_sweep
from models.hardware import resolve_hardware
from pipeline import store

try:  # run after the calibration fit, so that a newly promoted fit drives the curves
    from assets.fit import calibrated_predictions as _fit_asset

    CALIBRATION_DEPS = [_fit_asset]
except ImportError:  # no calibration assets: analytical curves
    CALIBRATION_DEPS = []

GROUP = "curves"
FRONTIER_MONTHS = 3.0
FRONTIER_MIN_UTILIZATION = 0.8
# weak scaling is swept only where the corpus has measured weak-scaling series to set it beside (Megatron-Core
# on H100, Megatron-LM SC'21 on A100 80GB, llm-foundry on A100 40GB); strong and critical run everywhere.
# `stepcast curve --policy weak` computes it for any accelerator. Keeps the asset at ~10 s on 2 cores.
WEAK_POLICY_HARDWARE = ("h100-sxm5-80gb", "a100-sxm4-80gb", "a100-sxm4-40gb")


def promoted_calibration(con):
    """(hook, params, note) from the store's promoted fit; analytical when there is none (or no fits code)."""
    try:
        from pipeline.fits import load_promoted_fit
    except ImportError:
        return calibration_from_bundle(None)
    try:
        bundle = load_promoted_fit(con)
    except Exception as err:  # noqa: BLE001 - a store without fits tables: analytical, and say why
        hook, params, _ = calibration_from_bundle(None)
        return hook, params, f"analytical only: no promoted fit could be loaded ({err})"
    return calibration_from_bundle(bundle)


def _price(row: dict) -> float | None:
    v = row.get("cloud_usd_per_hour")
    return float(v) if v is not None else None


@dg.asset(group_name=GROUP, kinds={"duckdb"}, deps=[hardware, architectures, *CALIBRATION_DEPS],
          description="Scaling curves: for every accelerator x reference run (GPT-3 175B, Llama 3 8B) x batch policy "
                      "(strong and critical everywhere, weak where measured weak-scaling series exist) the best layout at each N with throughput, MFU, step time, "
                      "time-to-train, cost, parallel and marginal efficiency (+ intervals when calibrated). Also "
                      "writes `inflection_points`: the knee of each curve with its interval and a USL fit.")
def scaling_curves(context: dg.AssetExecutionContext, duckdb: DuckDBResource) -> dg.MaterializeResult:
    start = time.perf_counter()
    with duckdb.get_connection() as con:
        hw = resolve_hardware(con.sql("select * from hardware").pl(), strict=False)
        arch = con.sql("select * from architectures").pl()
        hook, params, note = promoted_calibration(con)
    context.log.info(note)
    raws, keys_list = [], []
    for h in hw.sort("id").iter_rows(named=True):
        if h.get("hardware_error"):
            context.log.warning(f"no curves for {h['id']}: {h['hardware_error']}")
            continue
        for ref in REFERENCE_RUNS:
            a = arch.filter(pl.col("id") == ref["arch_id"])
            if a.height != 1:
                raise ValueError(f"architectures has no row '{ref['arch_id']}' (needed by models.curves.REFERENCE_RUNS)")
            for policy in POLICIES:
                if policy == "weak" and h["id"] not in WEAK_POLICY_HARDWARE:
                    continue
                raws.append(scaling_curve(a.row(0, named=True), h, policy, seq_len=ref["seq_len"], tokens=ref["tokens"],
                                          global_batch_seqs=ref["global_batch_seqs"],
                                          per_gpu_batch_seqs=DEFAULT_PER_GPU_BATCH_SEQS, n_max=DEFAULT_N_MAX,
                                          dtype=default_dtype(h), params=params, usd_per_gpu_hour=_price(h),
                                          defer_calibration=True))
                keys_list.append(({"curve_id": f"{h['id']}/{ref['arch_id']}/{policy}", "gpu": h["id"],
                                   "arch_id": ref["arch_id"]},
                                  {"policy": policy, "seq_len": ref["seq_len"], "tokens": ref["tokens"],
                                   "global_batch_seqs": ref["global_batch_seqs"], "dtype": default_dtype(h)}))
    curves, knees = [], []
    for c, (keys, extra) in zip(calibrate_curves(raws, hook), keys_list):
        curves.append(c.with_columns(pl.lit(v).alias(k) for k, v in keys.items()))
        rec = inflection(c, DEFAULT_THRESHOLD)
        notes = c.filter(pl.col("feasible"))["calibration_note"]
        knees.append(keys | extra | rec | {"explanation": explain(rec),
                                           "calibration_note": notes[0] if notes.len() else "no feasible layout"})
    table = pl.concat(curves, how="diagonal_relaxed")
    lead = ["curve_id", "gpu", "arch_id", "policy"]
    table = table.select(lead + [c for c in table.columns if c not in lead])
    knee_table = pl.DataFrame(knees, infer_schema_length=None)
    with duckdb.get_connection() as con:
        store.replace_table(con, "scaling_curves", table)
        store.replace_table(con, "inflection_points", knee_table)
    found = knee_table.filter(pl.col("knee_found"))
    h100 = knee_table.filter(pl.col("gpu") == "h100-sxm5-80gb")
    md = ["| curve | knee N | interval | USL σ | USL κ | USL peak N |", "|---|---:|---|---:|---:|---:|"]
    for r in h100.iter_rows(named=True):
        fmt = lambda v, f="{:,.0f}": "—" if v is None else f.format(v)  # noqa: E731
        md.append(f"| {r['curve_id']} | {fmt(r['inflection_n'])} | {fmt(r['inflection_n_lo'])}–"
                  f"{fmt(r['inflection_n_hi'])} | {fmt(r['usl_sigma'], '{:.3g}')} | {fmt(r['usl_kappa'], '{:.3g}')} | "
                  f"{fmt(r['usl_peak_n'])} |")
    return dg.MaterializeResult(metadata={
        "rows_scaling_curves": dg.MetadataValue.int(table.height),
        "rows_inflection_points": dg.MetadataValue.int(knee_table.height),
        "curves": dg.MetadataValue.int(len(curves)),
        "curves_with_knee": dg.MetadataValue.int(found.height),
        "calibration": dg.MetadataValue.text(note),
        "seconds": dg.MetadataValue.float(round(time.perf_counter() - start, 2)),
        "h100_inflection_points": dg.MetadataValue.md("\n".join(md)),
    })


@dg.asset(group_name=GROUP, kinds={"duckdb"}, deps=[hardware, *CALIBRATION_DEPS],
          description="The compute frontier per accelerator (historical ones included): utilization vs training "
                      "compute for Chinchilla-optimal dense models within 3 months, and the largest compute whose "
                      "best layout keeps utilization >= 0.8 x that accelerator's best (`is_frontier` row).")
def frontier(context: dg.AssetExecutionContext, duckdb: DuckDBResource) -> dg.MaterializeResult:
    start = time.perf_counter()
    with duckdb.get_connection() as con:
        hw = resolve_hardware(con.sql("select * from hardware").pl(), strict=False)
        hook, params, note = promoted_calibration(con)
    parts, md = [], ["| accelerator | max training FLOP | GPUs | utilization | best |", "|---|---:|---:|---:|---:|"]
    for h in hw.sort("id").iter_rows(named=True):
        if h.get("hardware_error"):
            parts.append(pl.DataFrame({"gpu": [h["id"]], "feasible": [False], "reason": [h["hardware_error"]],
                                       "is_frontier": [False]}))
            continue
        sweep = frontier_sweep(h, FRONTIER_MONTHS, params=params, dtype=default_dtype(h), usd_per_gpu_hour=_price(h))
        summ = frontier_summary(sweep, FRONTIER_MIN_UTILIZATION)
        sweep = sweep.with_columns(
            pl.lit(h["id"]).alias("gpu"), pl.lit(default_dtype(h)).alias("dtype"),
            pl.lit(FRONTIER_MIN_UTILIZATION).alias("min_utilization"),
            pl.lit(summ.get("best_utilization"), dtype=pl.Float64).alias("best_utilization"),
            pl.lit(summ.get("utilization_threshold"), dtype=pl.Float64).alias("utilization_threshold"),
            ((pl.col("training_flop") == summ.get("training_flop")) if summ["found"] else pl.lit(False))
            .fill_null(False).alias("is_frontier"),
            pl.lit(note).alias("calibration_note"))
        parts.append(sweep)
        if summ["found"]:
            md.append(f"| {h['id']} | {summ['training_flop']:.3g} | {summ['n_gpus']:,} | {summ['utilization']:.3f} | "
                      f"{summ['best_utilization']:.3f} |")
        else:
            md.append(f"| {h['id']} | — | — | — | {summ['reason']} |")
    table = pl.concat(parts, how="diagonal_relaxed")
    lead = ["gpu", "months", "training_flop", "is_frontier", "feasible"]
    table = table.select([c for c in lead if c in table.columns] + [c for c in table.columns if c not in lead])
    with duckdb.get_connection() as con:
        store.replace_table(con, "frontier", table)
    return dg.MaterializeResult(metadata={
        "rows_frontier": dg.MetadataValue.int(table.height),
        "accelerators": dg.MetadataValue.int(table["gpu"].n_unique()),
        "months": dg.MetadataValue.float(FRONTIER_MONTHS),
        "min_utilization": dg.MetadataValue.float(FRONTIER_MIN_UTILIZATION),
        "calibration": dg.MetadataValue.text(note),
        "seconds": dg.MetadataValue.float(round(time.perf_counter() - start, 2)),
        "frontier": dg.MetadataValue.md("\n".join(md)),
    })
