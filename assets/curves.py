"""Scaling curves, inflection points and the compute frontier (thin: read tables, call models/, write, report).

Calibration: when `pipeline.fits.load_promoted_fit` returns a promoted fit, its fitted physics drive the layout
search and `models.fitting.calibration.apply_calibration` gives the intervals; otherwise the curves are analytical only
and say so (`calibrated` false, `calibration_note`).
"""


import time
import warnings

import dagster as dg
import polars as pl
from dagster_duckdb import DuckDBResource

from assets.ingest import architectures, hardware
from models.fitting.predictor import Calibration
from models.physics.hardware import resolve_hardware
from models.planning.curves import (
    DEFAULT_THRESHOLD,
    POLICIES,
    REFERENCE_RUNS,
    calibrate_curves,
    calibration_from_bundle,
    default_dtype,
    explain,
    inflection,
    reference_curves,
)
from models.planning.frontier import frontier_table
from pipeline import store
from pipeline.fits import load_promoted_fit
from pipeline.parallel import map_jobs, workers
from pipeline.settings import Settings

try:  # run after the calibration fit, so that a newly promoted fit drives the curves
    from assets.fit import calibrated_predictions as _fit_asset

    CALIBRATION_DEPS = [_fit_asset]
except ImportError:  # no calibration assets: analytical curves
    CALIBRATION_DEPS = []

GROUP = "curves"
FRONTIER_MONTHS = 3.0
FRONTIER_MIN_UTILIZATION = 0.8
FRONTIER_ASSUMPTIONS = ("ideal", "realistic")  # models.planning.frontier.frontier_table's default, in its order
# weak scaling is swept only where the corpus has measured weak-scaling series to set it beside (Megatron-Core
# on H100, Megatron-LM SC'21 on A100 80GB, llm-foundry on A100 40GB); strong and critical run everywhere.
# `stepcast curve --policy weak` computes it for any accelerator. Keeps the asset at ~10 s on 2 cores.
WEAK_POLICY_HARDWARE = ("h100-sxm5-80gb", "a100-sxm4-80gb", "a100-sxm4-40gb")


def promoted_calibration(con):
    """(hook, params, note) from the store's promoted fit; analytical when there is none."""
    try:
        bundle = load_promoted_fit(con)
    except Exception as err:  # noqa: BLE001 - a store without fits tables: analytical, and say why
        hook, params, _ = calibration_from_bundle(None)
        return hook, params, f"analytical only: no promoted fit could be loaded ({err})"

    if bundle is not None and not isinstance(bundle, Calibration):  # a fit of an earlier format
        hook, params, _ = calibration_from_bundle(None)
        return hook, params, "analytical only: the promoted fit is of an earlier format"
    return calibration_from_bundle(bundle)


def _price(row: dict) -> float | None:
    v = row.get("cloud_usd_per_hour")
    return float(v) if v is not None else None


_CURVES_ASSET = dict(
    group_name=GROUP, kinds={"duckdb"}, deps=[hardware, architectures, *CALIBRATION_DEPS],
    description="Scaling curves (partitioned by accelerator): for every accelerator x reference run (GPT-3 175B, "
                "Llama 3 8B) x batch policy (strong and critical everywhere, weak where measured weak-scaling series "
                "exist) the best layout at each N with throughput, MFU, step time, time-to-train, cost, parallel and "
                "marginal efficiency (+ intervals when calibrated). Also writes `inflection_points`: the knee of "
                "each curve with its interval and a USL fit. A run without a partition (the build) computes every "
                "accelerator in worker processes and calibrates all curves in one call.")


def _scaling_curves(context: dg.AssetExecutionContext, duckdb: DuckDBResource) -> dg.MaterializeResult:
    start = time.perf_counter()
    keys_sel = list(context.partition_keys) if context.has_partition_key or context.has_partition_key_range else None
    with duckdb.get_connection() as con:
        hw = resolve_hardware(con.sql("select * from hardware").pl(), strict=False)
        arch = con.sql("select * from architectures").pl()
        hook, params, note = promoted_calibration(con)
    context.log.info(note)
    if keys_sel is not None:
        hw = hw.filter(pl.col("id").is_in(keys_sel))
    archs = {r["id"]: r for r in arch.filter(pl.col("id").is_in([x["arch_id"] for x in REFERENCE_RUNS]))
             .iter_rows(named=True)}
    jobs = []
    for h in hw.sort("id").iter_rows(named=True):
        if h.get("hardware_error"):
            context.log.warning(f"no curves for {h['id']}: {h['hardware_error']}")
            continue
        pols = tuple(p for p in POLICIES if p != "weak" or h["id"] in WEAK_POLICY_HARDWARE)
        # one job per accelerator and target: small jobs leave the workers less uneven an end
        jobs += [((h, archs, params), {"policies": pols, "usd_per_gpu_hour": _price(h), "refs": (ref,)})
                 for ref in REFERENCE_RUNS]
    per_gpu = map_jobs(reference_curves, jobs, workers())
    done = [x for part in per_gpu for x in part]
    raws = [(raw, configs) for raw, configs, _, _ in done]
    keys_list = [(k, e) for _, _, k, e in done]
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
        for name, frame in (("scaling_curves", table), ("inflection_points", knee_table)):
            if keys_sel is not None and store.table_exists(con, name):  # one partition: that accelerator's rows
                old = con.sql(f"select * from {name}").pl().filter(~pl.col("gpu").is_in(keys_sel))
                frame = pl.concat([old, frame], how="diagonal_relaxed")
            store.replace_table(con, name, frame)
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
        "partitions": dg.MetadataValue.text("all" if keys_sel is None else ", ".join(keys_sel)),
    })


def _accelerator_ids() -> list[str]:
    """The partition keys: the hardware ids of the shipped catalog (measurements/hardware_specs.csv)."""
    import csv


    try:
        with open(Settings.load().measurements / "hardware_specs.csv", newline="", encoding="utf-8") as f:
            return sorted({r["id"].strip() for r in csv.DictReader(f) if (r.get("id") or "").strip()})
    except (OSError, KeyError):
        return []


ACCELERATORS = dg.StaticPartitionsDefinition(_accelerator_ids())


_FRONTIER_ASSET = dict(group_name=GROUP, kinds={"duckdb"}, deps=[hardware, *CALIBRATION_DEPS],
                       partitions_def=ACCELERATORS, backfill_policy=dg.BackfillPolicy.single_run(), description="The compute frontier per accelerator (partitioned by accelerator; historical ones included), "
                      "under both assumption sets (`assumptions`: ideal = Epoch AI's ideal conditions, realistic = "
                      "the calibrated physics): every level from 1e16 to 1e32 FLOP of Chinchilla-optimal dense "
                      "models within 3 months, with its layout, utilization, latency wall and binding constraint; "
                      "`is_frontier` marks the first crossing below 0.8 x that accelerator's best utilization. A "
                      "run without a partition (the build) sweeps every accelerator in worker processes.")


def _frontier(context: dg.AssetExecutionContext, duckdb: DuckDBResource) -> dg.MaterializeResult:
    start = time.perf_counter()
    keys = list(context.partition_keys) if context.has_partition_key or context.has_partition_key_range else None
    with duckdb.get_connection() as con:
        hw = resolve_hardware(con.sql("select * from hardware").pl(), strict=False)
        hook, params, note = promoted_calibration(con)
    if keys is not None:
        hw = hw.filter(pl.col("id").is_in(keys))
    parts, jobs = [], []
    for h in hw.sort("id").iter_rows(named=True):
        if h.get("hardware_error"):
            parts.append(pl.DataFrame({"gpu": [h["id"]], "feasible": [False], "reason": [h["hardware_error"]],
                                       "is_frontier": [False]}))
            continue
        jobs.append((h, params))
    n_workers = workers()
    # one job per accelerator and assumption set (small jobs leave the workers less uneven an end), in the order
    # one frontier_table call per accelerator concatenates them
    parts += map_jobs(frontier_table, [((h, p), {"months": FRONTIER_MONTHS, "min_utilization": FRONTIER_MIN_UTILIZATION,
                                                "dtype": default_dtype(h), "usd_per_gpu_hour": _price(h), "note": note,
                                                "assumptions": (a,)})
                                       for h, p in jobs for a in FRONTIER_ASSUMPTIONS], n_workers)
    table = pl.concat(parts, how="diagonal_relaxed")
    lead = ["gpu", "assumptions", "months", "training_flop", "is_frontier", "feasible", "binding"]
    table = table.select([c for c in lead if c in table.columns] + [c for c in table.columns if c not in lead])
    with duckdb.get_connection() as con:
        if keys is None or not store.table_exists(con, "frontier"):
            store.replace_table(con, "frontier", table)
        else:  # one partition: replace that accelerator's rows only
            old = con.sql("select * from frontier").pl().filter(~pl.col("gpu").is_in(keys))
            store.replace_table(con, "frontier", pl.concat([old, table], how="diagonal_relaxed"))
    top = table.filter(pl.col("is_frontier"))
    md = ["| accelerator | assumptions | max training FLOP | GPUs | utilization | best | ended by |",
          "|---|---|---:|---:|---:|---:|---|"]
    for r in top.sort(["gpu", "assumptions"]).iter_rows(named=True):
        md.append(f"| {r['gpu']} | {r['assumptions']} | {r['training_flop']:.3g} | {r['n_gpus']:,} | "
                  f"{r['utilization']:.3f} | {r['best_utilization']:.3f} | {r.get('ended_by') or 'the grid'} |")
    return dg.MaterializeResult(metadata={
        "rows_frontier": dg.MetadataValue.int(table.height),
        "accelerators": dg.MetadataValue.int(table["gpu"].n_unique()),
        "partitions": dg.MetadataValue.text("all" if keys is None else ", ".join(keys)),
        "workers": dg.MetadataValue.int(min(n_workers, max(len(jobs), 1))),
        "months": dg.MetadataValue.float(FRONTIER_MONTHS),
        "min_utilization": dg.MetadataValue.float(FRONTIER_MIN_UTILIZATION),
        "calibration": dg.MetadataValue.text(note),
        "seconds": dg.MetadataValue.float(round(time.perf_counter() - start, 2)),
        "frontier": dg.MetadataValue.md("\n".join(md)),
    })


with warnings.catch_warnings():  # backfill_policy is a beta parameter of dagster.asset
    warnings.simplefilter("ignore", dg.BetaWarning)
    frontier = dg.asset(name="frontier", **_FRONTIER_ASSET)(_frontier)
    scaling_curves = dg.asset(name="scaling_curves", partitions_def=ACCELERATORS,
                              backfill_policy=dg.BackfillPolicy.single_run(), **_CURVES_ASSET)(_scaling_curves)
