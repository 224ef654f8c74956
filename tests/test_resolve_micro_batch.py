"""A measured run that states no micro-batch (models.corpus.runs_adapter.resolve_micro_batch): a published run is a tuned
one, so the micro-batch the model finds fastest among those that fit is read, and said; a stated one is kept; an
FSDP stack's run that states no batch either takes no gradient accumulation (its batch is dp x micro-batch)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeline.cli import app

runner = CliRunner()
HEAD = "run_id,model_name,gpu,n_gpus,global_batch_seqs,seq_len,tp,pp,micro_batch,framework,sharding,recompute,metric,value\n"


@pytest.fixture(autouse=True)
def no_store(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "none" / "stepcast.duckdb"))


def _rows(tmp_path, lines: list[str]) -> dict:
    path = tmp_path / "runs.csv"
    path.write_text(HEAD + "".join(x + "\n" for x in lines))
    result = runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    return {r["run_id"]: r for r in json.loads(result.output)}


def test_an_unstated_micro_batch_is_the_fastest_that_fits(tmp_path):
    """Llama 3 8B on 8 H100 at tp 2 (Megatron-Core) states no micro-batch: the one read is the fastest of
    1, 2, 4, 8, 16, 32 that fits, each stated beside it slower or over the capacity, and stated it predicts the same."""
    run = "llama3-8b,h100-sxm5-80gb,8,128,8192,2,1,{mb},Megatron-Core,zero1,selective,tokens_per_s_per_gpu,800"
    a = _rows(tmp_path, ["a," + run.format(mb="")])["a"]
    assert "micro_batch=" in a["assumptions"] and "the fastest that fits" in a["assumptions"] or a["micro_batch"] == 1
    assert a["memory_fits"] is True
    alt = _rows(tmp_path, [f"m{m}," + run.format(mb=m) for m in (1, 2, 4, 8, 16, 32)])
    assert alt[f"m{a['micro_batch']}"]["step_time_s"] == pytest.approx(a["step_time_s"], rel=1e-12)
    for r in alt.values():
        assert not r["memory_fits"] or r["tokens_per_s_per_gpu"] <= a["tokens_per_s_per_gpu"] * (1 + 1e-12), \
            r["micro_batch"]


def test_a_stated_micro_batch_is_kept(tmp_path):
    row = _rows(tmp_path, ["s,llama3-8b,h100-sxm5-80gb,8,128,8192,1,1,1,Megatron-Core,zero1,selective,"
                           "tokens_per_s_per_gpu,9000"])["s"]
    assert row["micro_batch"] == 1 and "micro_batch=" not in (row["assumptions"] or "")


def test_an_fsdp_run_with_no_batch_takes_no_gradient_accumulation(tmp_path):
    """torchtitan's Llama 3 8B on 8 H100 with neither batch nor micro-batch: one micro-batch per step, so the global
    batch is dp x micro-batch, the micro-batch the fastest that fits."""
    row = _rows(tmp_path, ["t,llama3-8b,h100-sxm5-80gb,8,,8192,,,,torchtitan,fsdp,selective,"
                           "tokens_per_s_per_gpu,6000"])["t"]
    assert row["global_batch_seqs"] == row["dp"] * row["micro_batch"]
    assert row["memory_fits"] is True
