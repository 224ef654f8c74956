"""The build's partitioned work is independent of where it runs: one accelerator's frontier and scaling curves,
materialized alone by Dagster's in-process executor (as a Kubernetes or Celery executor runs one partition per
worker), give exactly the rows the whole build's multiprocess run gave for that accelerator, and leave every
other accelerator's rows as they were."""

from __future__ import annotations

import dagster as dg
import duckdb
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipeline.definitions import make_definitions
from tests.test_automation import _settings

#: accelerators whose partitions are quick to recompute: a historical GPU and one the fit knows
PARTITIONS = ("gtx-580", "a100-sxm4-80gb")


def _table(store, name: str) -> pl.DataFrame:
    con = duckdb.connect(str(store), read_only=True)
    try:
        frame = con.sql(f"select * from {name}").pl()
    finally:
        con.close()
    return frame.sort(frame.columns, nulls_last=True)


@pytest.mark.parametrize("asset,gpu_column", [("frontier", "gpu"), ("scaling_curves", "gpu")])
def test_one_partition_alone_gives_the_whole_build_s_rows(built_store, tmp_path, monkeypatch, asset, gpu_column):
    cfg = _settings(tmp_path, built_store, monkeypatch)  # a copy of the built store
    monkeypatch.setenv("STEPCAST_WORKERS", "1")
    target = cfg.store
    before = _table(target, asset)
    # the partitioned run rewrites only its accelerator's rows: blank them first, so equality shows it computed them
    con = duckdb.connect(str(target))
    try:
        con.execute(f"delete from {asset} where {gpu_column} in ({', '.join('?' * len(PARTITIONS))})", PARTITIONS)
    finally:
        con.close()
    job = make_definitions(cfg).resolve_job_def("build")
    for key in PARTITIONS:
        result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), partition_key=key,
                                        asset_selection=[dg.AssetKey(asset)], raise_on_error=True)
        assert result.success
        (event,) = result.get_asset_materialization_events()
        assert event.materialization.partition == key
    after = _table(target, asset)
    assert set(before[gpu_column].unique()) == set(after[gpu_column].unique())
    assert before.filter(pl.col(gpu_column).is_in(PARTITIONS)).height > 0
    assert_frame_equal(after.select(before.columns), before, check_exact=True)
