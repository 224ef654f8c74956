"""A run whose GPU count has an odd factor is read with a pipeline degree carrying it (`search_pp`): MT-NLG 530B's
3,360 GPUs (Smith et al. 2022: tp 8 x pp 35 x dp 12) are predicted, where powers of two alone left no layout whose
data-parallel degree divides the batch."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from models.runs_adapter import SEARCH_PP, search_pp
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
