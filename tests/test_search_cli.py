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


def test_search_ranks_with_the_oversubscription():
    """4:1 above every scale-up domain makes cross-node traffic dearer: the best layout of Llama 3 70B on 512 H100
    does not take a larger data-parallel degree (here it drops from 64 to 16), and its step time is the one
    `predict` gives that layout with the same flag (the ranking is computed with it)."""
    args = ["search", "--model", "llama3-70b", "--gpu", "h100-sxm5-80gb", "--gpus", "512", "-b", "1024", "-s",
            "8192", "--analytical-only", "--top", "1", "--format", "json"]
    base = json.loads(runner.invoke(app, args).stdout)[0]
    r = runner.invoke(app, args + ["--oversubscription", "4"])
    assert r.exit_code == 0, r.output
    over = json.loads(r.stdout)[0]
    assert over["dp"] * over["cp"] <= base["dp"] * base["cp"] and over["dp"] <= base["dp"]
    assert over["step_time_s"] > base["step_time_s"]
    assert "4:1 oversubscribed" in over["assumptions"]
    lay = [f"--{k.replace('_', '-')}={over[k]}" for k in ("tp", "pp", "dp", "cp", "vpp", "micro_batch", "sharding",
                                                          "recompute")]
    sp = "--sequence-parallel" if over["sequence_parallel"] else "--no-sequence-parallel"
    p = runner.invoke(app, ["predict"] + args[1:12] + ["--format", "json", "--oversubscription", "4", sp] + lay)
    assert p.exit_code == 0, p.output
    assert json.loads(p.stdout)[0]["step_time_s"] == over["step_time_s"]
    bad = runner.invoke(app, args + ["--oversubscription", "0.5"])
    assert bad.exit_code == 2 and "--oversubscription must be a ratio >= 1" in bad.output
    bad = runner.invoke(app, args + ["--pod-size", "4"])
    assert bad.exit_code == 2 and "--pod-size must be at least the scale-up domain" in bad.output
