"""Ingest assets: reference tables and measured runs into the DuckDB store (thin: read, call, write, report)."""


import dagster as dg
from dagster import AssetExecutionContext
from dagster_duckdb import DuckDBResource

from pipeline import store
from pipeline.resources import MeasurementsResource

GROUP = "ingest"

REFERENCE = {
    # table: (file, key column, required columns)
    "hardware": ("hardware_specs.csv", "id", ("id", "name", "peak_bf16_tflops", "peak_fp32_tflops", "memory_gb",
                                              "memory_bw_gbps", "intra_node_bw_gbps", "gpus_per_node_typical",
                                              "inter_node_bw_gbps", "source_ref")),
    "architectures": ("architectures.csv", "id", ("id", "name", "n_layers", "d_model", "n_heads", "n_kv_heads",
                                                  "ffn_dim", "vocab", "activation", "n_experts", "top_k",
                                                  "tied_embeddings", "aliases", "source")),
    "cloud_prices": ("cloud_prices.csv", "", ("accelerator_id", "cloud", "instance_type", "accelerator_count",
                                              "price_usd_per_hour", "catalog_file", "catalog_commit")),
}


def _load_reference(table: str, measurements: MeasurementsResource, duckdb: DuckDBResource) -> dg.MaterializeResult:
    file, key, required = REFERENCE[table]
    path = measurements.path(file)
    frame = store.read_reference_csv(path, key, required)
    with duckdb.get_connection() as con:
        store.replace_table(con, table, frame)
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


@dg.asset(group_name=GROUP, kinds={"duckdb"}, deps=[hardware, architectures],
          description="Measured runs in long form: measured_runs.csv plus the vTrain single-node file through its "
                      "adapter; the vTrain multi-node file is recognised as a duplicate of rows already present.")
def run_metrics(context: AssetExecutionContext, measurements: MeasurementsResource,
                duckdb: DuckDBResource) -> dg.MaterializeResult:
    with duckdb.get_connection() as con:
        reports = [
            store.ingest_file(con, measurements.measured_runs),
            store.ingest_file(con, measurements.vtrain_single, kind="vtrain_single"),
            store.check_vtrain_multi(con, measurements.vtrain_multi),
        ]
        counts = store.row_counts(con, ("run_metrics", "rejected_rows"))
    for rep in reports:
        for warning in rep.warnings:
            context.log.warning(warning)
        context.log.info(f"{rep.file}: {rep.status} ({rep.rows_accepted} accepted, {rep.rows_rejected} rejected, "
                         f"{rep.rows_duplicate} duplicate) {rep.message}")
    return dg.MaterializeResult(metadata={
        "rows": dg.MetadataValue.int(counts["run_metrics"]),
        "rejected_rows": dg.MetadataValue.int(counts["rejected_rows"]),
        "files": dg.MetadataValue.md("\n".join(
            f"- `{r.file}`: {r.status}, {r.rows_accepted} accepted, {r.rows_rejected} rejected, "
            f"{r.rows_duplicate} duplicate" for r in reports)),
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
