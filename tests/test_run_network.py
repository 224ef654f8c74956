"""A run's own scale-out network (`inter_node_bw_gbps` in the measurement schema) overrides the hardware's
typical one: stored, migrated into older stores, used by the model."""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl
import pytest

from models.corpus.evaluate import prepare_configs
from models.physics.step_time import predict
from pipeline import fits, store
from pipeline.measurements import COLUMNS


@pytest.fixture(scope="module")
def prepared(built_store):
    """(the built store's runs as the fit prepares them, the hardware table)."""
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        runs, hw, _ = fits.read_inputs(con)
    finally:
        con.close()
    return prepare_configs(runs, hw, fits.input_recipes())[0], hw


def test_vtrain_runs_carry_their_clusters_network_into_the_model(prepared):
    ok, hw = prepared
    a100 = ok.filter(pl.col("gpu") == "a100-sxm4-80gb")
    vtrain = a100.filter(pl.col("run_id").str.starts_with("vtrain_m"))
    bloom = a100.filter(pl.col("source") == "bigscience-bloom")
    others = a100.filter(~pl.col("run_id").str.starts_with("vtrain_m") & (pl.col("source") != "bigscience-bloom"))
    typical = hw.filter(pl.col("id") == "a100-sxm4-80gb")["inter_node_bw_gbps"][0]
    # vTrain's configs: 800 Gb/s per 8-GPU node = 12.5 GB/s per GPU; the DGX A100 spec row: 25
    assert vtrain.height == 109 and set(vtrain["inter_node_bw_gbps"]) == {12.5}
    # Jean Zay (BLOOM paper, section 3.4): four 100 Gb/s Omni-Path links per 8-GPU node = 6.25 GB/s per GPU
    assert bloom.height >= 2 and set(bloom["inter_node_bw_gbps"]) == {6.25}
    assert typical == 25 and set(others["inter_node_bw_gbps"]) == {typical}

    # the hardware's faster network never slows a step, and it speeds up every run whose TP spans nodes
    slow = predict(vtrain)
    fast = predict(vtrain.with_columns(pl.lit(typical, dtype=pl.Float64).alias("inter_node_bw_gbps")))
    assert np.all(fast["step_time_s"].to_numpy() <= slow["step_time_s"].to_numpy() * (1 + 1e-12))
    spans = (vtrain["tp"] > vtrain["gpus_per_node"]).to_numpy()
    assert spans.sum() >= 5
    assert np.all(fast["tp_comm_s"].to_numpy()[spans] < slow["tp_comm_s"].to_numpy()[spans])


def test_a_store_from_before_the_column_gets_it_and_keeps_its_rows(tmp_path):
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    try:
        old = [c for c in COLUMNS if c != "inter_node_bw_gbps"]
        con.execute(f"create table run_metrics ({', '.join(f'{c} VARCHAR' for c in old)}, "
                    "source_file VARCHAR NOT NULL, source_line BIGINT NOT NULL)")
        con.execute("insert into run_metrics (run_id, metric, source_file, source_line) values ('r1', 'mfu', 'f', 2)")
        store.ensure_schema(con)
        cols = [r[0] for r in con.execute("describe run_metrics").fetchall()]
        row = con.execute("select run_id, inter_node_bw_gbps from run_metrics").fetchall()
    finally:
        con.close()
    assert "inter_node_bw_gbps" in cols and row == [("r1", None)]


def test_bloomberggpt_carries_the_p4d_network_the_instance_table_gives(prepared):
    """BloombergGPT ran on 64 AWS p4d.24xlarge (its paper); the run's scale-out figure is the one
    measurements/instance_networks.csv derives for that instance (400 Gb/s EFA per 8 GPUs), not the DGX A100's."""
    from pipeline.catalog import instance_network

    ok, hw = prepared
    bbg = ok.filter(pl.col("run_id") == "bloomberggpt")
    bw, _ = instance_network("p4d.24xlarge")
    assert bbg.height == 1 and bw == 6.25 and bbg["inter_node_bw_gbps"][0] == bw
    typical = hw.filter(pl.col("id") == "a100-sxm4-40gb")["inter_node_bw_gbps"][0]
    assert typical == 25
