"""Every asset check fails on the table it guards when that table is wrong, and passes when it is right.

Each check runs on a small store (reference tables, three synthetic runs, two fits) that a test then breaks
in one way by hand, as someone editing the store would."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import duckdb
import pytest
from dagster_duckdb import DuckDBResource

from assets import checks
from assets import fit as fit_assets
from pipeline import fits, store
from tests.test_ingest import BASE, write_rows

T0 = dt.datetime(2026, 1, 1)


@pytest.fixture(scope="module")
def clean_store(tmp_path_factory) -> Path:
    from pipeline.build import load_reference_tables
    from pipeline.settings import Settings

    path = tmp_path_factory.mktemp("checks") / "s.duckdb"
    con = store.connect(path)
    try:
        store.ensure_schema(con)
        load_reference_tables(con, Settings.load(store=path))
        rows = [dict(BASE, run_id=f"c-{i}", value=str(5000 + i)) for i in range(3)]
        store.ingest_file(con, write_rows(path.parent / "runs.csv", rows))
        fits._ensure(con)
        # the served fit (promoted at T0 + 1 h) and an older candidate it replaced
        for version, created, promoted, promoted_at in (("old", T0, False, T0), ("served", T0, True, T0 + dt.timedelta(hours=1))):
            con.execute("insert into fits (version, created_at, promoted, promoted_at, mdape, analytical_mdape, "
                        "coverage_90, loho_coverage_90, n_train, promotion_reason) values (?, ?, ?, ?, 0.08, 0.3, "
                        "0.9, 0.88, 100, 'first fit')", [version, created, promoted, promoted_at])
    finally:
        con.close()
    return path


@pytest.fixture()
def broken(clean_store, tmp_path):
    """A copy of the clean store and a function that runs SQL on it."""
    import shutil

    path = tmp_path / "s.duckdb"
    shutil.copyfile(clean_store, path)

    def run(*sql: str) -> Path:
        con = duckdb.connect(str(path))
        try:
            for s in sql:
                con.execute(s)
        finally:
            con.close()
        return path

    return run


def evaluate(check, path: Path) -> dg.AssetCheckResult:
    return check(duckdb=DuckDBResource(database=str(path)))


ROW = ("insert into run_metrics (run_id, source, source_ref, model_name, gpu, metric, value, unit, source_file, "
       "source_line) values ")
BREAKAGES = {
    "run_metrics_columns_and_types": ("alter table run_metrics alter value type varchar",),
    "run_metrics_units_and_ranges": (ROW + "('x', 's', 'r', 'Llama 3 8B', 'h100-sxm5-80gb', 'mfu', 45, 'fraction', 'f', 1)",),
    "run_metrics_hardware_known": (ROW + "('x', 's', 'r', 'Llama 3 8B', 'h900', 'mfu', 0.4, 'fraction', 'f', 1)",),
    "run_metrics_unique": ("insert into run_metrics select * from run_metrics where run_id = 'c-0'",),
    "run_metrics_provenance": (ROW + "('x', ' ', 'r', 'Llama 3 8B', 'h100-sxm5-80gb', 'mfu', 0.4, 'fraction', 'f', 1)",),
    "hardware_sane": ("update hardware set memory_gb = 0 where id = 'h100-sxm5-80gb'",),
    "runs_one_row_per_run": ("insert into runs select * from runs where run_id = 'c-0'",),
    "grouped_coverage_in_band": ("update fits set coverage_90 = 0.6 where promoted",),
    "no_promoted_regression": ("update fits set mdape = 0.5 where promoted",),
    "latest_fit_promoted": ("insert into fits (version, created_at, promoted, n_train, promotion_reason) values "
                            "('refused', '2026-01-02', false, 104, 'not promoted: the runs new since the served fit "
                            "served contradict it')",),
}
CHECKS = {next(iter(c.check_specs)).name: c
          for c in [checks.run_metrics_columns_and_types, checks.run_metrics_units_and_ranges,
                    checks.run_metrics_hardware_known, checks.run_metrics_unique, checks.run_metrics_provenance,
                    checks.hardware_sane, checks.runs_one_row_per_run, fit_assets.grouped_coverage_in_band,
                    fit_assets.no_promoted_regression, fit_assets.latest_fit_promoted]}


def test_every_check_of_the_graph_is_covered():
    from pipeline.definitions import ALL_CHECKS

    names = {spec.name for c in ALL_CHECKS for spec in c.check_specs}
    assert names == set(BREAKAGES) == set(CHECKS)


@pytest.mark.parametrize("name", sorted(BREAKAGES))
def test_check_passes_on_the_clean_store_and_fails_on_the_broken_one(name, clean_store, broken):
    assert evaluate(CHECKS[name], clean_store).passed, name
    result = evaluate(CHECKS[name], broken(*BREAKAGES[name]))
    assert not result.passed, (name, result.description)


def test_two_promoted_fits_fail_and_a_later_decision_by_hand_passes(clean_store, broken):
    path = broken("update fits set promoted = true")
    result = evaluate(fit_assets.no_promoted_regression, path)
    assert not result.passed and result.description == "2 promoted fits (expected 1)"
    # a refused candidate, then a person promotes the older fit on purpose: the decision was made, pass
    path = broken("update fits set promoted = false where version = 'old'",
                  *BREAKAGES["latest_fit_promoted"])
    refused = evaluate(fit_assets.latest_fit_promoted, path)
    assert not refused.passed
    assert refused.description.startswith("candidate refused (n_train 104) refused, serving served: not promoted")
    path = broken("update fits set promoted = false", "update fits set promoted = true, "
                  "promoted_at = '2026-01-03' where version = 'old'")
    assert evaluate(fit_assets.latest_fit_promoted, path).passed
