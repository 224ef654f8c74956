"""A run whose GPU count has an odd factor is read with a pipeline degree carrying it (`search_pp`): MT-NLG 530B's
3,360 GPUs (Smith et al. 2022: tp 8 x pp 35 x dp 12) are predicted, where powers of two alone left no layout whose
data-parallel degree divides the batch."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from models.corpus.runs_adapter import SEARCH_PP, search_pp
from pipeline.cli import app

runner = CliRunner()


def test_search_pp_adds_the_layer_counts_divisors_and_nothing_above_it():
    assert search_pp(105) == sorted(set(SEARCH_PP) | {3, 5, 7, 15, 21, 35, 105}) == \
        [1, 2, 3, 4, 5, 7, 8, 15, 16, 21, 32, 35, 64, 105]
    assert search_pp(24) == [1, 2, 3, 4, 6, 8, 12, 16, 24]
    assert max(search_pp(12)) == 12
    assert search_pp(float("nan")) == [1]


@pytest.fixture
def no_store(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "none" / "stepcast.duckdb"))


@pytest.mark.parametrize("framework", ["", "Megatron-DeepSpeed"])
def test_mt_nlg_on_3360_gpus_gets_a_layout_that_tiles_its_batch(tmp_path, no_store, framework):
    """No layout stated: the search (no stack named) and the first-fitting rule (a 2021-22 Megatron stack) both
    find one whose pipeline degree divides the 105 layers."""
    path = tmp_path / "runs.csv"
    path.write_text("run_id,model_name,gpu,n_gpus,seq_len,global_batch_seqs,dtype,framework,year,"
                    "tokens_per_s_per_gpu\n"
                    f"mtnlg,MT-NLG 530B,a100-sxm4-80gb,3360,2048,1920,bf16,{framework},2022,300\n")
    result = runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    (r,) = json.loads(result.output)
    assert r["error"] is None and r["feasible"], r
    assert r["tp"] * r["pp"] * r["dp"] * r["cp"] == 3360
    assert 1920 % (r["dp"] * r["micro_batch"]) == 0
    assert 105 % r["pp"] == 0 and r["pp"] not in SEARCH_PP


def test_a_stated_batch_no_layout_tiles_is_read_as_the_nearest_that_does(tmp_path, no_store):
    """Llama 3 70B on 2,304 GPUs (2^8 x 9) with a stated batch of 2,048 and no layout: no tp x pp the search weighs
    leaves a dp dividing 2,048 (the 80 layers have no factor 3), yet the run ran. It is predicted on the fastest
    layout with the nearest batch its replicas tile, said in `assumptions`; its measured throughput keeps the batch
    as stated."""
    head = "run_id,model_name,gpu,n_gpus,seq_len,global_batch_seqs,dtype,tp,pp,tokens_per_s_per_gpu\n"
    path = tmp_path / "runs.csv"
    path.write_text(head + "a,Llama 3 70B,h100-sxm5-80gb,2304,8192,2048,bf16,,,800\n")
    result = runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["run_id"]: r for r in json.loads(result.output)}
    a = rows["a"]
    assert a["error"] is None and a["memory_fits"] is True
    unit = a["dp"] * a["micro_batch"]
    assert a["tp"] * a["pp"] * a["dp"] == 2304 and a["global_batch_seqs"] % unit == 0
    assert abs(a["global_batch_seqs"] - 2048) <= unit / 2
    assert "does not split into" in a["assumptions"] and "the stated 2048" in a["assumptions"]
    assert a["measured_tokens_per_s_per_gpu"] == 800


def test_resolve_batch_tiling_leaves_queries_and_tiled_batches_alone():
    from models.corpus.runs_adapter import resolve_batch_tiling

    cfg = pl.DataFrame({"global_batch_seqs": [2048, 2048, 1980], "dp": [144, 144, 36], "micro_batch": [1, 1, 1],
                        "assumptions": ["x", "x", "x"]})
    out = resolve_batch_tiling(cfg, measured=[True, False, True])
    assert out["global_batch_seqs"].to_list() == [2016, 2048, 1980]
    assert out["assumptions"].to_list()[1:] == ["x", "x"]


def test_resolve_batch_tiling_keeps_a_row_without_a_batch_beside_one_it_tiles():
    """A row with no batch (null) beside a row it tiles: the null stays null (it raised on the integer cast)."""
    from models.corpus.runs_adapter import resolve_batch_tiling

    cfg = pl.DataFrame({"global_batch_seqs": [2048, None], "dp": [144, 4], "micro_batch": [1, 1],
                        "assumptions": ["x", "x"]})
    out = resolve_batch_tiling(cfg)
    assert out["global_batch_seqs"].to_list() == [2016, None]
    assert out["assumptions"][1] == "x"
