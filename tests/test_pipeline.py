"""Dagster wiring: Definitions load, the whole graph materializes, checks pass and block bad tables."""

from __future__ import annotations

import dagster as dg
import duckdb
import pytest

from pipeline.definitions import defs, make_definitions
from pipeline.settings import Settings


def test_definitions_load():
    dg.Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert {"hardware", "architectures", "cloud_prices", "run_metrics", "runs", "store_snapshot"} <= keys
    assert defs.resolve_job_def("build") is not None


def test_build_materializes_everything_and_checks_pass(built_store):
    # built_store ran the whole build job; the snapshot beside it is complete and opens read-only
    snapshot = built_store.parent / "snapshot" / built_store.name
    con = duckdb.connect(str(snapshot), read_only=True)
    try:
        assert con.execute("select count(*) from runs").fetchall()[0][0] == 2311
        with pytest.raises(duckdb.Error):
            con.execute("create table x (a int)")
    finally:
        con.close()


def test_blocking_check_stops_downstream(tmp_path, monkeypatch):
    """A hardware table that fails its blocking check keeps run_metrics from materializing."""
    import shutil

    from tests.conftest import MEASUREMENTS

    meas = tmp_path / "measurements"
    shutil.copytree(MEASUREMENTS, meas, ignore=shutil.ignore_patterns("incoming"))
    text = (meas / "hardware_specs.csv").read_text().splitlines()
    header = text[0].split(",")
    mem = header.index("memory_gb")
    # zero the memory of the first accelerator (a simple unquoted row in the shipped file)
    first = text[1].split(",")
    first[mem] = "0"
    text[1] = ",".join(first)
    (meas / "hardware_specs.csv").write_text("\n".join(text) + "\n")
    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "s.duckdb"))
    monkeypatch.setenv("STEPCAST_MEASUREMENTS", str(meas))
    cfg = Settings.load()
    result = make_definitions(cfg).resolve_job_def("build").execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["hardware_sane"] is False
    materialized = {m.asset_key.to_user_string() for m in result.get_asset_materialization_events()}
    assert "run_metrics" not in materialized and "store_snapshot" not in materialized
