"""`import stepcast`: each function answers exactly what its command prints with `--format json`, raises the
command's message on bad input, and importing it stays light."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

import stepcast
from pipeline.api import clean
from pipeline.cli import app

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "measurements" / "measured_runs.csv"
HF = ROOT / "tests" / "data" / "hf"
runner = CliRunner()


def cli_json(store: Path, *args: str):
    result = runner.invoke(app, ["--store", str(store), *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def records(frame: pl.DataFrame) -> list[dict]:
    """A frame as the commands print it in JSON (NaN and inf as null)."""
    return json.loads(json.dumps([{k: clean(v) for k, v in r.items()} for r in frame.iter_rows(named=True)],
                                 default=str))


def as_json(doc: dict) -> dict:
    return json.loads(json.dumps({k: records(v) if isinstance(v, pl.DataFrame) else v for k, v in doc.items()},
                                 default=str))


def test_predict_equals_the_cli(built_store):
    args = dict(model="llama3-70b", gpu="h100", global_batch=1024, seq_len=8192, tp=8, pp=4)
    rows = stepcast.predict(gpus=[512, 1024], store=built_store, **args)
    assert rows["n_gpus"].to_list() == [512, 1024]
    assert rows["fit_version"].null_count() == 0 and rows["calibration_domain"].null_count() == 0
    for i, n in enumerate((512, 1024)):
        expected = cli_json(built_store, "predict", "--model", "llama3-70b", "--gpu", "h100", "--gpus", str(n),
                            "--global-batch", "1024", "--seq-len", "8192", "--tp", "8", "--pp", "4")
        assert records(rows[i]) == expected
    assert list(expected[0]) == rows.columns  # the same columns, in the same order


def test_predict_from_an_arch_file_a_dict_and_ideal_assumptions(built_store):
    hf = HF / "llama-3-8b.json"
    expected = cli_json(built_store, "predict", "--arch-file", str(hf), "--gpu", "a100-sxm4-80gb", "--gpus", "16",
                        "--global-batch", "128", "--seq-len", "4096", "--tp", "2", "--assumptions", "ideal")
    kw = dict(gpu="a100-sxm4-80gb", gpus=16, global_batch=128, seq_len=4096, tp=2, assumptions="ideal",
              store=built_store)
    assert records(stepcast.predict(arch=hf, **kw)) == expected
    assert records(stepcast.predict(arch=str(hf), **kw)) == expected
    assert records(stepcast.predict(arch=json.loads(hf.read_text()), **kw))[0]["step_time_s"] == \
        expected[0]["step_time_s"]


def test_predict_frame_equals_predict_runs(built_store):
    expected = cli_json(built_store, "predict", "--runs", str(RUNS))
    assert records(stepcast.predict_frame(RUNS, store=built_store)) == expected
    as_text = pl.read_csv(RUNS, infer_schema_length=0)  # cells as strings, as the file is read
    assert records(stepcast.predict_frame(as_text, store=built_store)) == expected


def test_predict_frame_takes_typed_columns():
    runs = pl.DataFrame({"run_id": ["a", "b"], "model_name": ["llama3-8b", "llama3-70b"],
                         "gpu": ["h100-sxm5-80gb"] * 2, "n_gpus": [8, 64], "tp": [1, 8], "pp": [1, 4],
                         "global_batch_seqs": [64, 256], "seq_len": [8192, 8192],
                         "sharding": ["zero1", "zero1"]})
    out = stepcast.predict_frame(runs)
    assert out["run_id"].to_list() == ["a", "b"]
    assert out["feasible"].to_list() == [True, True] and out["step_time_s"].is_not_null().all()


def test_an_architecture_id_in_the_arch_column_is_the_model_it_names():
    """A user who writes the architecture's id or alias where the schema wants its family gets that model (its
    family filled from the table), not an "architecture without expert shapes" refusal."""
    runs = pl.DataFrame({"run_id": ["by-arch", "by-name"], "arch": ["llama3-405b", "dense"],
                         "model_name": [None, "Llama 3.1 405B"], "gpu": ["h100-sxm5-80gb"] * 2,
                         "n_gpus": [2048, 2048], "tp": [8, 8], "pp": [16, 16], "global_batch_seqs": [512, 512],
                         "seq_len": [8192, 8192]})
    out = stepcast.predict_frame(runs)
    assert out["error"].is_null().all() or out["feasible"].is_not_null().all()
    assert out["step_time_s"].is_not_null().all()
    assert out["step_time_s"][0] == out["step_time_s"][1]


def test_a_file_of_only_unusable_rows_says_why_per_row_instead_of_failing():
    runs = pl.DataFrame({"run_id": ["r1", "r2"], "model_name": ["no-such-model", "llama3-8b"], "gpu": ["H100", "H100"],
                         "n_gpus": ["8", None], "metric": ["tokens_per_s_per_gpu"] * 2, "value": ["100", "200"]})
    out = stepcast.predict_frame(runs)
    assert out["run_id"].to_list() == ["r1", "r2"] and out["step_time_s"].is_null().all()
    assert "architecture shape unknown" in out["error"][0] and "n_gpus not stated" in out["error"][1]
    assert out["measured_tokens_per_s_per_gpu"].to_list() == [100.0, 200.0]


def test_a_run_in_a_precision_its_accelerator_lacks_says_so_by_name():
    runs = pl.DataFrame({"run_id": ["fp4-on-h100", "fp4-on-b200"], "model_name": ["llama3-8b"] * 2,
                         "gpu": ["h100-sxm5-80gb", "b200"], "n_gpus": [8, 8], "global_batch_seqs": [64, 64],
                         "seq_len": [8192, 8192], "dtype": ["nvfp4", "nvfp4"]})
    out = stepcast.predict_frame(runs)
    assert "no peak for this dtype" in out["error"][0] and "bandwidth" not in out["error"][0]
    assert out["step_time_s"][1] is not None and out["error"][1] is None


def test_search_equals_the_cli(built_store):
    expected = cli_json(built_store, "search", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "1024",
                        "--global-batch", "1536", "--seq-len", "2048", "--top", "5")
    got = stepcast.search(model="gpt3-175b", gpu="a100-sxm4-80gb", gpus=1024, global_batch=1536, seq_len=2048,
                          top=5, store=built_store)
    assert records(got) == expected and got["rank"].to_list() == [1, 2, 3, 4, 5]


def test_search_with_network_overrides_equals_the_cli(built_store):
    net = ("--scaleup-size", "4", "--scaleup-gbps", "150", "--scaleout-gbps", "12.5")
    expected = cli_json(built_store, "search", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "1024",
                        "--global-batch", "1536", "--seq-len", "2048", "--top", "3", *net)
    kw = dict(model="gpt3-175b", gpu="a100-sxm4-80gb", gpus=1024, global_batch=1536, seq_len=2048, top=3,
              store=built_store)
    got = stepcast.search(scaleup_size=4, scaleup_gbps=150, scaleout_gbps=12.5, **kw)
    assert records(got) == expected
    # a slower, smaller scale-up domain and network never make the best layout faster than the accelerator's own
    assert got["tokens_per_s_per_gpu"][0] <= stepcast.search(**kw)["tokens_per_s_per_gpu"][0]


def test_network_tiers_equal_the_cli(built_store):
    """`oversubscription=` and `pod_size=` are the CLI's `--oversubscription` / `--pod-size`, on every command."""
    net = ("--oversubscription", "3", "--pod-size", "256")
    args = ("--model", "llama3-70b", "--gpu", "h100", "--gpus", "512", "--global-batch", "1024", "--seq-len", "8192")
    kw = dict(model="llama3-70b", gpu="h100", gpus=512, global_batch=1024, seq_len=8192, store=built_store)
    got = stepcast.predict(tp=8, pp=4, oversubscription=3, pod_size=256, **kw)
    assert records(got) == cli_json(built_store, "predict", *args, "--tp", "8", "--pp", "4", *net)
    assert got["step_time_s"][0] > stepcast.predict(tp=8, pp=4, **kw)["step_time_s"][0]
    assert records(stepcast.search(top=2, oversubscription=3, pod_size=256, **kw)) == cli_json(
        built_store, "search", *args, "--top", "2", *net)
    curve = stepcast.curve(model="llama3-8b", gpu="h100-sxm5-80gb", max_gpus=128, oversubscription=3,
                           store=built_store)
    assert as_json(curve) == cli_json(built_store, "curve", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb",
                                      "--max-gpus", "128", "--oversubscription", "3")
    assert curve["network"] == {"oversubscription": 3, "pod_size": None}


def test_search_by_shape_and_fixed_dimensions_equals_the_cli(built_store):
    expected = cli_json(built_store, "search", "--layers", "24", "--d-model", "2048", "--heads", "16", "--gpu",
                        "h100", "--gpus", "16", "-b", "64", "-s", "2048", "--tp", "2", "--rank-by", "cost")
    got = stepcast.search(layers=24, d_model=2048, heads=16, gpu="h100", gpus=16, global_batch=64, seq_len=2048,
                          tp=2, rank_by="cost", store=built_store)
    assert records(got) == expected and set(got["tp"]) == {2}


def test_curve_equals_the_cli(built_store):
    expected = cli_json(built_store, "curve", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--max-gpus", "256",
                        "--policy", "weak", "--scaleout-gbps", "25")
    got = stepcast.curve(model="llama3-8b", gpu="h100-sxm5-80gb", max_gpus=256, policy="weak", scaleout_gbps=25,
                         store=built_store)
    assert isinstance(got["points"], pl.DataFrame)
    assert as_json(got) == expected


def test_frontier_equals_the_cli(built_store):
    expected = cli_json(built_store, "frontier", "--gpu", "v100-sxm2-32gb", "--months", "1", "--table")
    got = stepcast.frontier(gpu="v100-sxm2-32gb", months=1, table=True, store=built_store)
    assert isinstance(got["levels"], pl.DataFrame)
    assert as_json(got) == expected
    assert "levels" not in stepcast.frontier(gpu="v100-sxm2-32gb", months=1, store=built_store)


def test_plan_equals_the_cli(built_store):
    expected = cli_json(built_store, "plan", "--model", "llama3-70b", "--tokens", "15e12", "--deadline-days", "90",
                        "--hardware", "h100,b200", "--top", "5")
    got = stepcast.plan(model="llama3-70b", tokens=15e12, deadline_days=90, hardware=["h100", "b200"], top=5,
                        store=built_store)
    assert records(got) == expected
    assert got["fit_version"].null_count() == 0


def test_plan_without_a_deadline_warns_as_the_cli_does():
    with pytest.warns(UserWarning, match="no --deadline-days given"):
        stepcast.plan(model="llama3-70b", tokens=15e12, hardware="v100-sxm2-32gb", top=3)


# ---------------------------------------------------------------- bad input: the command's message

BAD = [
    (stepcast.predict, dict(model="llama3-8b", gpu="h100", gpus=8, global_batch=64, seq_len=8192, sharding="zero9"),
     ["predict", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "-b", "64", "-s", "8192", "--sharding",
      "zero9"]),
    (stepcast.predict, dict(model="nosuch", gpu="h100", gpus=8, global_batch=64, seq_len=8192),
     ["predict", "--model", "nosuch", "--gpu", "h100", "--gpus", "8", "-b", "64", "-s", "8192"]),
    (stepcast.predict, dict(model="llama3-8b", gpu="h100", gpus=8, global_batch=64, seq_len=8192, tp=3),
     ["predict", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "-b", "64", "-s", "8192", "--tp", "3"]),
    (stepcast.predict, dict(model="llama3-8b", gpus=8), ["predict", "--model", "llama3-8b", "--gpus", "8"]),
    (stepcast.predict_frame, dict(frame="/nonexistent/runs.csv"), ["predict", "--runs", "/nonexistent/runs.csv"]),
    (stepcast.search, dict(model="llama3-8b", gpu="h100", gpus=64, global_batch=256, seq_len=8192, rank_by="speed"),
     ["search", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "64", "-b", "256", "-s", "8192", "--rank-by",
      "speed"]),
    (stepcast.search, dict(model="llama3-8b", gpu="h100", gpus=64, global_batch=256, seq_len=8192, scaleout_gbps=0),
     ["search", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "64", "-b", "256", "-s", "8192",
      "--scaleout-gbps", "0"]),
    (stepcast.predict, dict(model="llama3-8b", gpu="h100", gpus=64, global_batch=256, seq_len=8192,
                            oversubscription=0.5),
     ["predict", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "64", "-b", "256", "-s", "8192",
      "--oversubscription", "0.5"]),
    (stepcast.search, dict(model="llama3-8b", gpu="h100", gpus=64, global_batch=256, seq_len=8192, pod_size=4),
     ["search", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "64", "-b", "256", "-s", "8192",
      "--pod-size", "4"]),
    (stepcast.plan, dict(model="llama3-70b", tokens=15e12, hardware="h100", oversubscription=0),
     ["plan", "--model", "llama3-70b", "--tokens", "15e12", "--hardware", "h100", "--oversubscription", "0"]),
    (stepcast.search, dict(layers=24, gpu="h100", gpus=16, global_batch=64, seq_len=2048),
     ["search", "--layers", "24", "--gpu", "h100", "--gpus", "16", "-b", "64", "-s", "2048"]),
    (stepcast.curve, dict(model="llama3-8b", gpu="h100-sxm5-80gb", policy="bogus"),
     ["curve", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--policy", "bogus"]),
    (stepcast.curve, dict(model="llama3-8b", gpu="h100-sxm5-80gb", scaleup_gbps=-1),
     ["curve", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--scaleup-gbps", "-1"]),
    (stepcast.frontier, dict(gpu="h100-sxm5-80gb", months=0), ["frontier", "--gpu", "h100-sxm5-80gb", "--months", "0"]),
    (stepcast.frontier, dict(gpu="h100-sxm5-80gb", batch_rule="huge"),
     ["frontier", "--gpu", "h100-sxm5-80gb", "--batch-rule", "huge"]),
    (stepcast.plan, dict(tokens=15e12), ["plan", "--tokens", "15e12"]),
    (stepcast.plan, dict(model="llama3-70b", tokens=15e12, price_source="bogus"),
     ["plan", "--model", "llama3-70b", "--tokens", "15e12", "--price-source", "bogus"]),
]


@pytest.mark.parametrize("fn, kwargs, argv", BAD, ids=[" ".join(b[2][:1] + b[2][-2:]) for b in BAD])
def test_bad_input_raises_the_cli_message(fn, kwargs, argv):
    cli = runner.invoke(app, argv)
    assert cli.exit_code in (1, 2)
    with pytest.raises(stepcast.InputError) as err:
        fn(**kwargs)
    assert f"error: {err.value}" in cli.stderr
    assert err.value.exit_code == cli.exit_code


def test_no_answer_raises_no_result_with_the_cli_message():
    argv = ["search", "--model", "llama3-405b", "--gpu", "h100", "--gpus", "8", "-b", "8", "-s", "8192", "--tp", "1",
            "--pp", "1"]
    cli = runner.invoke(app, argv)
    assert cli.exit_code == 1
    with pytest.raises(stepcast.NoResult) as err:
        stepcast.search(model="llama3-405b", gpu="h100", gpus=8, global_batch=8, seq_len=8192, tp=1, pp=1)
    assert str(err.value).startswith("no feasible layout among") and str(err.value) in cli.stderr
    with pytest.raises(stepcast.NoResult, match="no option meets the ask"):
        stepcast.plan(model="llama3-70b", tokens=15e12, deadline_days=1)


def test_a_bound_the_cli_declares_is_checked():
    with pytest.raises(stepcast.InputError, match="--gpus 0 is below its minimum 1"):
        stepcast.predict(model="llama3-8b", gpu="h100", gpus=0, global_batch=64, seq_len=8192)


def test_the_keywords_are_a_signature():
    """An unknown keyword is a TypeError, as for a written-out signature; a required option left out is the
    InputError the command's own check gives."""
    with pytest.raises(TypeError, match="tp_degree"):
        stepcast.predict(model="llama3-8b", gpu="h100", gpus=8, global_batch=64, seq_len=8192, tp_degree=2)
    with pytest.raises(stepcast.InputError, match="missing --gpu"):
        stepcast.curve(model="llama3-8b")
    assert inspect.signature(stepcast.search).parameters["tp"].default is None  # search fixes what it is given
    assert inspect.signature(stepcast.predict).parameters["tp"].default == 1


def test_import_stepcast_is_light_and_works_from_any_folder(tmp_path):
    code = ("import sys, stepcast; heavy = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'dagster', 'sklearn', 'altair', 'duckdb', 'typer'}); print(stepcast.__file__); print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    path, heavy = out.stdout.splitlines()
    assert Path(path) == ROOT / "stepcast" / "__init__.py"
    assert heavy == "[]"


def test_the_docstring_examples_run(built_store, monkeypatch):
    import doctest

    import stepcast.api

    monkeypatch.setenv("STEPCAST_STORE", str(built_store))
    for module in (stepcast, stepcast.api):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


@pytest.mark.parametrize("spelling, dtype", [
    ("bfloat16", "bf16"), ("BF16", "bf16"), ("torch.bfloat16", "bf16"), ("float16", "fp16"), ("half", "fp16"),
    ("float32", "fp32"), ("float8", "fp8"), ("fp8 (delayed scaling)", "fp8"), ("FP8 delayed", "fp8"),
    ("e4m3", "fp8"), ("fp8 current scaling", "fp8-cs"), ("tensorwise", "fp8-cs"), ("FP8-CS", "fp8-cs"),
    ("MXFP8", "mxfp8"), ("fp4", "nvfp4"), ("NVFP4", "nvfp4"), ("tf32", "tf32")])
def test_a_common_dtype_spelling_reads_as_the_schemas_dtype(spelling, dtype):
    from pipeline.measurements import canonical_dtype

    assert pl.select(canonical_dtype(pl.lit(spelling))).item() == dtype


def test_dtype_spellings_are_predicted_as_their_dtype_and_say_so():
    """"bfloat16" and "fp8 (delayed scaling)" predict exactly as bf16 and fp8; "mixed"/"amp" are bf16 on an H100 and
    fp16 on a V100 (no BF16); each reading is in the row's assumptions; an unknown spelling is refused by name."""
    spell = ["bf16", "bfloat16", "fp8", "fp8 (delayed scaling)", "mixed", "amp", "AMP", "fp16", "fp9"]
    gpus = ["h100-sxm5-80gb"] * 6 + ["v100-sxm2-32gb"] * 2 + ["h100-sxm5-80gb"]
    runs = pl.DataFrame({"run_id": [f"r{i}" for i in range(len(spell))], "model_name": ["llama3-8b"] * len(spell),
                         "gpu": gpus, "n_gpus": [8] * len(spell), "tp": [1] * len(spell),
                         "pp": [1] * len(spell), "global_batch_seqs": [64] * len(spell),
                         "seq_len": [2048] * len(spell), "sharding": ["zero1"] * len(spell),
                         "recompute": ["full"] * len(spell), "dtype": spell})
    out = stepcast.predict_frame(runs)
    t = dict(zip(out["run_id"], out["step_time_s"]))
    a = dict(zip(out["run_id"], out["assumptions"].fill_null("")))
    assert t["r1"] == t["r0"] and t["r3"] == t["r2"] and t["r4"] == t["r0"] and t["r5"] == t["r0"]
    assert t["r2"] < t["r0"]
    assert out["dtype"].to_list()[:8] == ["bf16", "bf16", "fp8", "fp8", "bf16", "bf16", "fp16", "fp16"]
    assert "dtype 'bfloat16' read as bf16" in a["r1"] and "dtype 'fp8 (delayed scaling)' read as fp8" in a["r3"]
    assert "dtype 'mixed' read as bf16" in a["r4"] and "dtype 'AMP' read as fp16" in a["r6"]
    assert "dtype" not in a["r0"] and "dtype" not in a["r7"]  # the schema's own value is not an assumption
    assert t["r6"] == t["r7"] and t["r6"] is not None  # on the V100, AMP is its fp16
    assert t["r8"] is None and "unknown dtype 'fp9'" in out.filter(pl.col("run_id") == "r8")["error"][0]


def test_the_ingest_still_rejects_a_dtype_spelling():
    """The spelling table is the lenient predict path's: a measurement file must use the vocabulary itself."""
    from pipeline.measurements import ENUMS

    assert "bfloat16" not in ENUMS["dtype"] and "mixed" not in ENUMS["dtype"]
