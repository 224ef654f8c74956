"""An MoE run that states no expert-parallel degree (models.runs_adapter.resolve_ep): a measured run fitted, so
where every expert on every GPU does not fit, the smallest degree that does is read, and said; a stated degree, a
run that fits with ep = 1 and an FSDP-class run (its experts already sharded) keep theirs."""

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


def test_an_unstated_ep_that_does_not_fit_is_the_smallest_that_does(tmp_path):
    """Qwen3 235B-A22B (128 experts) on 256 H100 at tp 4, pp 4 with the distributed optimizer: its 235 B
    parameters do not fit 80 GB with every expert on every GPU; the smallest power of two dividing the experts and
    dp that fits is read. Stated, the same degree gives the same prediction; fitting at ep 1 (a small MoE) or FSDP
    keeps ep 1."""
    rows = _rows(tmp_path, [
        "a,qwen3-235b-a22b,h100-sxm5-80gb,256,1024,4096,4,4,,zero1,selective,tokens_per_s_per_gpu,800",
        "b,qwen3-235b-a22b,h100-sxm5-80gb,256,1024,4096,4,4,1,zero1,selective,tokens_per_s_per_gpu,800",
        "c,qwen3-235b-a22b,h100-sxm5-80gb,256,1024,4096,4,4,,fsdp,selective,tokens_per_s_per_gpu,800",
        "d,olmoe-1b-7b,h100-sxm5-80gb,8,64,4096,1,1,,zero1,selective,tokens_per_s_per_gpu,8000",
    ])
    a = rows["a"]
    assert a["ep"] > 1 and a["memory_fits"] and "not stated, and the measured run does not fit" in a["assumptions"]
    assert 128 % a["ep"] == 0 and 16 % a["ep"] == 0  # dp = 256 / (4 x 4)
    smaller = _rows(tmp_path, [f"s,qwen3-235b-a22b,h100-sxm5-80gb,256,1024,4096,4,4,{a['ep'] // 2},zero1,selective,"
                               "tokens_per_s_per_gpu,800"])["s"]
    assert not smaller["memory_fits"]  # the one below did not fit: the smallest that fits was read
    same = _rows(tmp_path, [f"e,qwen3-235b-a22b,h100-sxm5-80gb,256,1024,4096,4,4,{a['ep']},zero1,selective,"
                            "tokens_per_s_per_gpu,800"])["e"]
    assert same["step_time_s"] == pytest.approx(a["step_time_s"], rel=1e-12)
    assert rows["b"]["ep"] == 1 and not rows["b"]["memory_fits"]  # stated: kept, beside its memory figure
    assert rows["c"]["ep"] == 1 and rows["d"]["ep"] == 1
    assert "ep=" not in (rows["d"]["assumptions"] or "")
