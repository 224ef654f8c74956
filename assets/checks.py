"""Asset checks on the ingested tables. Blocking where a bad table would poison later assets.

Row-level validation already keeps bad rows out at ingest; these checks are the safety net that looks at
the stored tables as a whole (for instance after someone edits the store by hand)."""


import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.ingest import hardware, run_metrics, runs
from pipeline.measurements import COLUMNS, SCHEMA
from pipeline.store import _SQL_TYPES


def _violations(duckdb: DuckDBResource, sql: str, limit: int = 5) -> tuple[int, list[tuple]]:
    with duckdb.get_connection() as con:
        n = con.execute(f"select count(*) from ({sql})").fetchall()[0][0]
        sample = con.execute(f"select * from ({sql}) limit {limit}").fetchall()
    return n, sample


def _result(n: int, sample: list[tuple], what: str) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=n == 0,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{n} {what}" if n else f"no {what}",
        metadata={"violations": dg.MetadataValue.int(n), "sample": dg.MetadataValue.text(repr(sample))},
    )


@dg.asset_check(asset=run_metrics, blocking=True, description="Every schema column is present with its type.")
def run_metrics_columns_and_types(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    with duckdb.get_connection() as con:
        have = dict(con.execute(
            "select column_name, data_type from information_schema.columns where table_name = 'run_metrics'"
        ).fetchall())
    wrong = [(c, have.get(c), _SQL_TYPES[SCHEMA[c]]) for c in COLUMNS if have.get(c) != _SQL_TYPES[SCHEMA[c]]]
    return _result(len(wrong), wrong, "columns missing or of the wrong type")


@dg.asset_check(asset=run_metrics, blocking=True,
                description="Units and ranges: times > 0, 0 < mfu/hfu <= 1, degrees >= 1, tp*pp*dp*cp = n_gpus.")
def run_metrics_units_and_ranges(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    n, sample = _violations(duckdb, """
        select run_id, metric, value from run_metrics where
          (metric in ('step_time_s', 'time_to_train_min', 'tokens_per_s', 'tokens_per_s_per_gpu',
                      'model_tflops_per_gpu', 'gpu_hours') and not value > 0)
          or (metric in ('mfu', 'hfu') and not (value > 0 and value <= 1))
          or least(tp, pp, dp, cp, ep, vpp, n_gpus) < 1
          or (tp is not null and pp is not null and dp is not null and n_gpus is not null
              and tp * pp * dp * coalesce(cp, 1) <> n_gpus)
          or not isfinite(value)""")
    return _result(n, sample, "rows outside units/ranges")


@dg.asset_check(asset=run_metrics, blocking=True, additional_deps=[hardware],
                description="Every run's hardware id is in the hardware table.")
def run_metrics_hardware_known(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    n, sample = _violations(duckdb, "select run_id, gpu from run_metrics where gpu not in (select id from hardware)")
    return _result(n, sample, "rows with unknown hardware ids")


@dg.asset_check(asset=run_metrics, blocking=True, description="(run_id, metric) is unique.")
def run_metrics_unique(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    n, sample = _violations(duckdb, "select run_id, metric, count(*) from run_metrics group by all having count(*) > 1")
    return _result(n, sample, "duplicate (run_id, metric) pairs")


@dg.asset_check(asset=run_metrics, blocking=True, description="Provenance: source, source_ref, file and line.")
def run_metrics_provenance(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    n, sample = _violations(duckdb, """
        select run_id, metric from run_metrics where coalesce(trim(source), '') = '' or
          coalesce(trim(source_ref), '') = '' or source_file is null or source_line is null""")
    return _result(n, sample, "rows without provenance")


@dg.asset_check(asset=hardware, blocking=True,
                description="Hardware: ids unique, memory > 0, at least one positive peak per accelerator.")
def hardware_sane(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    n, sample = _violations(duckdb, """
        select id from hardware where not coalesce(memory_gb > 0, false)
          or not coalesce(greatest(peak_fp32_tflops, peak_bf16_tflops, peak_fp16_tflops) > 0, false)
        union all select id from hardware group by id having count(*) > 1""")
    return _result(n, sample, "bad hardware rows")


@dg.asset_check(asset=runs, blocking=True, description="One row per run id, and every run has at least one metric.")
def runs_one_row_per_run(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    n, sample = _violations(duckdb, """
        select run_id from runs group by run_id having count(*) > 1
        union all select run_id from runs where n_metrics < 1
        union all select run_id from (select distinct run_id from run_metrics) where run_id not in (select run_id from runs)""")
    return _result(n, sample, "runs not one-to-one with run_metrics")

