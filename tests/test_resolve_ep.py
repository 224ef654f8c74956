"""An MoE run that states no expert-parallel degree (models.corpus.runs_adapter.resolve_ep): a published run is a tuned
one, so the degree the model finds fastest among those that fit is read, and said; a stated degree and an
FSDP-class run (its experts already sharded) keep theirs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeline.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def no_store(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "none" / "stepcast.duckdb"))


def _rows(tmp_path, lines: list[str]) -> dict:
    path = tmp_path / "runs.csv"
    path.write_text("run_id,model_name,gpu,n_gpus,global_batch_seqs,seq_len,tp,pp,ep,sharding,recompute,metric,value\n"
                    + "".join(x + "\n" for x in lines))
    result = runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    return {r["run_id"]: r for r in json.loads(result.output)}


def test_an_unstated_ep_is_the_fastest_that_fits(tmp_path):
    """Qwen3 235B-A22B (128 experts) on 256 H100 at tp 4, pp 4 with the distributed optimizer: its 235 B
    parameters do not fit 80 GB with every expert on every GPU; of the powers of two dividing the experts and dp
    (16), the one the model finds fastest among those that fit is read: every other, stated, is slower or does not
    fit, and stated it gives the same prediction. OLMoE (64 experts) on 8 H100 fits with every degree: it gets the
    fastest of them too. Stated ep 1, and FSDP, keep ep 1."""
    rows = _rows(tmp_path, [
        "a,qwen3-235b-a22b,h100-sxm5-80gb,256,1024,4096,4,4,,zero1,selective,tokens_per_s_per_gpu,800",
        "b,qwen3-235b-a22b,h100-sxm5-80gb,256,1024,4096,4,4,1,zero1,selective,tokens_per_s_per_gpu,800",
        "c,qwen3-235b-a22b,h100-sxm5-80gb,256,1024,4096,4,4,,fsdp,selective,tokens_per_s_per_gpu,800",
        "d,olmoe-1b-7b,h100-sxm5-80gb,8,64,4096,1,1,,zero1,selective,tokens_per_s_per_gpu,8000",
    ])
    a = rows["a"]
    assert a["ep"] > 1 and a["memory_fits"] and "the fastest expert-parallel degree" in a["assumptions"]
    assert 128 % a["ep"] == 0 and 16 % a["ep"] == 0  # dp = 256 / (4 x 4)
    others = _rows(tmp_path, [f"e{e},qwen3-235b-a22b,h100-sxm5-80gb,256,1024,4096,4,4,{e},zero1,selective,"
                              "tokens_per_s_per_gpu,800" for e in (1, 2, 4, 8, 16)])
    assert others[f"e{a['ep']}"]["step_time_s"] == pytest.approx(a["step_time_s"], rel=1e-12)
    for r in others.values():
        assert not r["memory_fits"] or r["step_time_s"] >= a["step_time_s"] * (1 - 1e-12), r["ep"]
    assert not others["e1"]["memory_fits"]
    assert rows["b"]["ep"] == 1 and not rows["b"]["memory_fits"]  # stated: kept, beside its memory figure
    assert rows["c"]["ep"] == 1
    d = rows["d"]
    assert 64 % d["ep"] == 0 and 8 % d["ep"] == 0
    alt = _rows(tmp_path, [f"d{e},olmoe-1b-7b,h100-sxm5-80gb,8,64,4096,1,1,{e},zero1,selective,tokens_per_s_per_gpu,"
                           "8000" for e in (1, 2, 4, 8)])
    assert all(r["memory_fits"] for r in alt.values())
    assert min(r["step_time_s"] for r in alt.values()) == pytest.approx(d["step_time_s"], rel=1e-12)
