"""`stepcast search`: ranked feasible layouts; fixed dimensions respected; clear errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from pipeline.cli import app

runner = CliRunner()
GPT3 = ["search", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "1024", "--global-batch", "1536",
        "--seq-len", "2048"]


def test_search_ranks_feasible_layouts_best_first():
    result = runner.invoke(app, GPT3 + ["--top", "5", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 5
    assert all(r["feasible"] for r in rows)
    tput = [r["tokens_per_s_per_gpu"] for r in rows]
    assert tput == sorted(tput, reverse=True)
    for r in rows:
        assert r["tp"] * r["pp"] * r["dp"] * r["cp"] == 1024
        assert r["memory_gb_per_gpu"] <= 80


def test_search_respects_fixed_dimensions():
    result = runner.invoke(app, ["search", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "64",
                                 "-b", "256", "-s", "8192", "--tp", "1", "--pp", "1", "--sharding", "fsdp",
                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows and all(r["tp"] == 1 and r["pp"] == 1 and r["sharding"] == "fsdp" for r in rows)


def test_search_nothing_fits_says_so():
    result = runner.invoke(app, ["search", "--model", "gpt3-175b", "--gpu", "a100-sxm4-40gb", "--gpus", "8",
                                 "-b", "8", "-s", "2048"])
    assert result.exit_code == 1
    assert "no feasible layout" in result.output


def test_search_with_architecture_flags_and_bad_flags():
    ok = runner.invoke(app, ["search", "--layers", "24", "--d-model", "2048", "--heads", "16", "--gpu",
                             "a100-sxm4-80gb", "--gpus", "8", "-b", "64", "-s", "2048", "--format", "csv"])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(app, GPT3 + ["--rank-by", "speed"])
    assert bad.exit_code == 2 and "--rank-by" in bad.output
    bad = runner.invoke(app, ["search", "--gpu", "a100-sxm4-80gb", "--gpus", "8", "-b", "8", "-s", "2048"])
    assert bad.exit_code == 2 and "--model" in bad.output
