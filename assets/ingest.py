"""Ingest assets: reference tables and measured runs into the DuckDB store (thin: read, call, write, report)."""


from pathlib import Path

import dagster as dg
from dagster import AssetExecutionContext
from dagster_duckdb import DuckDBResource

from pipeline import automation, store
from pipeline.resources import MeasurementsResource

GROUP = "ingest"

def _load_reference(table: str, measurements: MeasurementsResource, duckdb: DuckDBResource) -> dg.MaterializeResult:
    path = measurements.path(store.REFERENCE[table][0])
    with duckdb.get_connection() as con:
        frame = store.load_reference(con, table, Path(measurements.root))
    return dg.MaterializeResult(metadata={
        "rows": dg.MetadataValue.int(frame.height),
        "columns": dg.MetadataValue.int(frame.width),
        "file": dg.MetadataValue.path(str(path)),
        "sha256": store.sha256_file(path),
    })


@dg.asset(group_name=GROUP, kinds={"duckdb"}, description="Accelerator specs (measurements/hardware_specs.csv).")
def hardware(measurements: MeasurementsResource, duckdb: DuckDBResource) -> dg.MaterializeResult:
    return _load_reference("hardware", measurements, duckdb)


@dg.asset(group_name=GROUP, kinds={"duckdb"}, description="Named architectures (measurements/architectures.csv).")
def architectures(measurements: MeasurementsResource, duckdb: DuckDBResource) -> dg.MaterializeResult:
    return _load_reference("architectures", measurements, duckdb)


@dg.asset(group_name=GROUP, kinds={"duckdb"}, description="Cloud prices per instance (measurements/cloud_prices.csv).")
def cloud_prices(measurements: MeasurementsResource, duckdb: DuckDBResource) -> dg.MaterializeResult:
    return _load_reference("cloud_prices", measurements, duckdb)


@dg.asset(group_name=GROUP, kinds={"duckdb"}, deps=[hardware, architectures], output_required=False,
          description="Measured runs in long form: measured_runs.csv plus the vTrain single-node file through its "
                      "adapter; the vTrain multi-node file is recognised as a duplicate of rows already present. "
                      "A sensor run ingests the incoming files its tags name; when it brings no new rows (every "
                      "named file quarantined or unchanged), nothing downstream runs (no re-fit, no publish).")
def run_metrics(context: AssetExecutionContext, measurements: MeasurementsResource, duckdb: DuckDBResource):
    names = automation.tagged_files(context.run.tags)
    with duckdb.get_connection() as con:
        reports = [
            store.ingest_file(con, measurements.measured_runs),
            store.ingest_file(con, measurements.vtrain_single, kind="vtrain_single"),
            store.check_vtrain_multi(con, measurements.vtrain_multi),
        ]
        # the drop folder (pipeline/automation.py): processed/ files again, then new files, moved after
        incoming = automation.ingest_incoming(con, measurements.incoming, context.log, names=names) \
            if measurements.incoming else None
        counts = store.row_counts(con, ("run_metrics", "rejected_rows"))
    for rep in reports:
        for warning in rep.warnings:
            context.log.warning(warning)
        context.log.info(f"{rep.file}: {rep.status} ({rep.rows_accepted} accepted, {rep.rows_rejected} rejected, "
                         f"{rep.rows_duplicate} duplicate) {rep.message}")
    shipped_changed = any(rep.status not in ("unchanged", "duplicate") for rep in reports)
    if names is not None and not shipped_changed and not (incoming and incoming.changed):
        context.log.info(f"the files this run names ({', '.join(names)}) brought no new rows: quarantined "
                         f"{incoming.quarantined if incoming else []}; nothing downstream runs")
        return
    yield dg.MaterializeResult(metadata={
        "rows": dg.MetadataValue.int(counts["run_metrics"]),
        "rejected_rows": dg.MetadataValue.int(counts["rejected_rows"]),
        "files": dg.MetadataValue.md("\n".join(
            f"- `{r.file}`: {r.status}, {r.rows_accepted} accepted, {r.rows_rejected} rejected, "
            f"{r.rows_duplicate} duplicate" for r in reports)),
        **({"incoming_accepted": dg.MetadataValue.int(len(incoming.accepted)),
            "incoming_quarantined": dg.MetadataValue.int(len(incoming.quarantined)),
            "incoming_processed_files": dg.MetadataValue.int(len(incoming.reprocessed) + len(incoming.accepted))}
           if incoming is not None else {}),
    })


@dg.asset(group_name=GROUP, kinds={"duckdb"}, deps=[run_metrics, architectures],
          description="One row per measured run: architecture (filled by alias from architectures), layout, "
                      "hardware and the metrics pivoted into columns.")
def runs(duckdb: DuckDBResource) -> dg.MaterializeResult:
    with duckdb.get_connection() as con:
        store.rebuild_runs(con)
        by_source = con.sql("select source, count(*) as runs from runs group by source order by runs desc").pl()
        n = con.execute("select count(*) from runs").fetchall()[0][0]
        filled = con.execute("select count(*) from runs where arch_filled").fetchall()[0][0]
    return dg.MaterializeResult(metadata={
        "rows": dg.MetadataValue.int(n),
        "architecture_filled_from_table": dg.MetadataValue.int(filled),
        "runs_by_source": dg.MetadataValue.md(
            "\n".join(f"- {s}: {c}" for s, c in by_source.iter_rows())),
    })
