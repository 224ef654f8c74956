"""`--stack NAME`: a training stack read as a run file's framework is, on every predicting command; the search ranks
only the shardings the stack can run; an unknown name lists the known stacks; `--stack generic` is the generic row
with the wider interval; `stepcast list stacks` shows the table."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeline.cli import app

runner = CliRunner()
L8 = ["-m", "llama3-8b", "--gpu", "h100-sxm5-80gb", "-n", "64", "-b", "256", "-s", "8192"]


def _json(args):
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.parametrize("stack, allowed", [("DeepSpeed", {"none", "zero1", "zero2", "zero3"}),
                                            ("torchtitan", {"none", "fsdp", "hsdp"}),
                                            ("NeMo 24.09", {"none", "zero1", "fsdp"})])
def test_the_search_ranks_only_what_the_stack_can_run(stack, allowed):
    rows = _json(["search", *L8, "--stack", stack, "--top", "20", "--format", "json"])
    assert rows and {r["sharding"] for r in rows} <= allowed
    assert all(f"stack {stack}: read as" in r["assumptions"] for r in rows)


def test_the_stack_changes_the_answer_and_says_how_it_was_read():
    mega = _json(["predict", *L8, "--stack", "Megatron-LM", "--format", "json"])[0]
    titan = _json(["predict", *L8, "--stack", "torchtitan", "--format", "json"])[0]
    assert "stack torchtitan: read as torchtitan" in titan["assumptions"]
    assert "sharding=fsdp (the stack's default)" in titan["assumptions"]
    assert mega["step_time_s"] != titan["step_time_s"] and mega["memory_gb_per_gpu"] != titan["memory_gb_per_gpu"]


def test_an_unknown_stack_lists_the_known_ones_and_generic_widens_the_interval(built_store):
    res = runner.invoke(app, ["predict", *L8, "--stack", "FooTrain 3"])
    assert res.exit_code == 2 and "no stack of measurements/stack_words.csv is named so" in res.output
    assert "torchtitan" in res.output and "--stack generic" in res.output
    store = ["--store", str(built_store)]
    generic = _json([*store, "predict", *L8, "--stack", "generic", "--format", "json"])[0]
    known = _json([*store, "predict", *L8, "--stack", "Megatron-LM", "--format", "json"])[0]
    assert generic["calibration_domain"].startswith("extrapolated: training stack not in the stack table")
    assert known["calibration_domain"] == "inside" and generic["interval_extrapolation"] > 1.0


def test_list_stacks_shows_every_stack_and_its_words():
    rows = _json(["list", "stacks", "--format", "json"])
    by = {r["stack"]: r for r in rows}
    assert {"megatron", "torchtitan", "jax_spmd", "default"} <= set(by)
    assert "maxtext" in by["jax_spmd"]["words"] and "nemo" in by["megatron"]["words"]
