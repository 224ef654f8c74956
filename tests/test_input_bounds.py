"""Numbers a user gives that no answer can come from are refused in one line naming the value and the bound, in
every layer through the same check: a config.json with NaN or a 4,000-digit integer, `months=1e308`,
`--tokens 1e30`, a layout whose heads or batch do not split (the message says the numbers). The explorer's side of
the same refusals (400, never 500; a foreign Host header 403) is in tests/test_serve.py.

No built store: refusals come before any answer (tests/conftest.py points STEPCAST_STORE at an empty folder); the
layouts refused after the model ran are judged on the analytical priors.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import stepcast
from models.core import limits
from models.core.limits import JSONRefused, strict_json
from pipeline.cli import app
from pipeline.options import (CurveOptions, FrontierOptions, InputError, PlanOptions, PredictOptions, SearchOptions,
                              check_bounds)

runner = CliRunner()
CONFIG = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
LAYOUT = ["--gpu", "h100-sxm5-80gb", "--gpus", "8", "--global-batch", "64", "--seq-len", "8192"]


def refused_in_one_line(args: list[str]) -> str:
    """The CLI's refusal of `args`: exit 2, one `error:` line on stderr, no traceback; returns the line."""
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (r.output, r.exception)
    assert isinstance(r.exception, SystemExit), r.exception  # not an exception escaping the command
    line = r.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line and "Traceback" not in r.output, r.output
    return line


def config_file(tmp_path, text: str):
    path = tmp_path / "config.json"
    path.write_text(text)
    return path


# ------------------------------------------------------------------ config.json: NaN, infinities, huge integers

@pytest.mark.parametrize("value, needle", [
    ("NaN", "'hidden_size' = NaN, not a finite number"),
    ("-Infinity", "'hidden_size' = -Infinity, not a finite number"),
    ("1e400", "'hidden_size' = Infinity, not a finite number"),
    ("9" * 4000, "'hidden_size' = a 4000-digit integer, above the largest 9007199254740992"),
    ("9" * 5000, "'hidden_size' = a 5000-digit integer"),  # past Python's 4,300-digit conversion limit
])
def test_a_config_json_with_a_number_no_field_holds_is_one_line(tmp_path, value, needle):
    path = config_file(tmp_path, json.dumps(CONFIG).replace("4096", value))
    line = refused_in_one_line(["predict", "--arch-file", str(path), *LAYOUT])
    assert str(path) in line and needle in line
    with pytest.raises(InputError, match=re.escape(needle.split(",")[0])):
        stepcast.predict(arch=str(path), gpu="h100-sxm5-80gb", gpus=8, global_batch=64, seq_len=8192)


def test_the_cli_prints_no_traceback_in_a_real_process(tmp_path):
    path = config_file(tmp_path, json.dumps(CONFIG).replace("4096", "NaN"))
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "predict", "--arch-file", str(path), *LAYOUT],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"error: {path}: 'hidden_size' = NaN, not a finite number (JSON has no NaN or Infinity)"


@pytest.mark.parametrize("row, needle", [
    ({**CONFIG, "hidden_size": float("nan")}, "'hidden_size' = NaN is not a finite number"),
    ({**CONFIG, "hidden_size": 10**4000}, "'hidden_size' = a 4001-digit integer is above the largest"),
    ({**CONFIG, "num_hidden_layers": "many"}, "a field that must be a whole number is not"),
    ({**CONFIG, "hidden_size": 2**30}, "'d_model' = 1073741824 is above the largest 16777216 this tool plans for"),
    ({"n_layers": "nan", "d_model": 4096, "n_heads": 32, "ffn_dim": 14336, "vocab": 32000},
     "'n_layers' = NaN is not a finite number"),
    ({"n_layers": 32, "d_model": "9" * 5000, "n_heads": 32, "ffn_dim": 14336, "vocab": 32000},
     "'d_model' = a 5000-digit integer is above the largest 16777216"),
])
def test_an_architecture_given_as_a_mapping_is_checked_alike(row, needle):
    """The Python API takes the config as a dict, which can hold what JSON cannot (NaN, any integer)."""
    with pytest.raises(InputError) as err:
        stepcast.predict(arch=row, gpu="h100-sxm5-80gb", gpus=8, global_batch=64, seq_len=8192)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_hardware_file_with_an_infinite_bandwidth_is_refused(tmp_path):
    path = tmp_path / "hw.json"
    path.write_text('{"id": "x", "memory_gb": 80, "memory_bw_gbps": 1e400, "intra_node_bw_gbps": 450, '
                    '"peak_bf16_tflops": 989}')
    line = refused_in_one_line(["predict", "--model", "llama3-8b", "--hardware-file", str(path), "--gpus", "8",
                                "--global-batch", "64", "--seq-len", "8192"])
    assert "'memory_bw_gbps' = Infinity" in line
    path.write_text('{"id": "x", "memory_gb": 1e9, "memory_bw_gbps": 3350, "intra_node_bw_gbps": 450, '
                    '"peak_bf16_tflops": 989}')
    line = refused_in_one_line(["predict", "--model", "llama3-8b", "--hardware-file", str(path), "--gpus", "8",
                                "--global-batch", "64", "--seq-len", "8192"])
    assert "'memory_gb' = 1000000000 is above the largest 1000000 this tool plans for" in line


def test_strict_json_names_the_key_of_the_first_bad_number():
    assert strict_json('{"a": [1, 2.5, {"b": -9007199254740992}]}') == {"a": [1, 2.5, {"b": -9007199254740992}]}
    for text, message in (('{"a": {"b": [1, [NaN]]}}', "'b' = NaN"), ('[Infinity]', "a value is Infinity"),
                          ('{"a": 9007199254740993}', "'a' = 9007199254740993, above the largest"),
                          ('{"a": 1', "not valid JSON")):
        with pytest.raises(JSONRefused, match=re.escape(message)):
            strict_json(text)


# ------------------------------------------------------------------ the options' bounds, every layer

def test_months_1e308_is_refused_with_the_bound():
    line = refused_in_one_line(["frontier", "--gpu", "h100-sxm5-80gb", "--months", "1e308"])
    assert line == "error: --months 1e308 is above the largest 1200 this tool plans for"
    with pytest.raises(InputError) as err:
        stepcast.frontier(gpu="h100-sxm5-80gb", months=1e308)
    assert f"error: {err.value}" == line
    assert refused_in_one_line(["frontier", "--gpu", "h100-sxm5-80gb", "--months", "nan"]) \
        == "error: --months NaN is not a finite number"


def test_tokens_1e30_is_refused_with_the_bound():
    line = refused_in_one_line(["plan", "--model", "llama3-70b", "--tokens", "1e30"])
    assert line == "error: --tokens 1e30 is above the largest 1e28 this tool plans for"
    assert "1e30 is above the largest 1e28" in refused_in_one_line(
        ["curve", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--tokens", "1e30"])
    with pytest.raises(InputError, match="--tokens 1e30 is above the largest 1e28"):
        stepcast.plan(model="llama3-70b", tokens=1e30)


OPTIONS = (PredictOptions, SearchOptions, CurveOptions, FrontierOptions, PlanOptions)
#: fractions in (0, 1] whose range the command checks with its own message (pipeline.api)
FRACTIONS = {"threshold", "min_utilization"}


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: o.COMMAND)
def test_every_numeric_option_has_an_upper_bound_that_is_enforced(options):
    numeric = [o for o in options.fields() if o.type in (int, float)]
    assert numeric
    for o in numeric:
        if o.name in FRACTIONS:
            continue
        assert o.max is not None, f"{options.COMMAND} {o.long_flag} has no upper bound"
        check_bounds(options, {o.name: o.type(o.max)})  # the bound itself is taken
        over = int(o.max) * 2 if o.type is int else o.max * 2
        with pytest.raises(InputError, match=f"^{o.long_flag} .* is above the largest .* this tool plans for$"):
            options(**{o.name: over})
        with pytest.raises(InputError, match="not a finite number|not a whole number"):
            options(**{o.name: math.nan})


def test_a_bound_is_no_tighter_than_what_the_shipped_tables_hold():
    """The bounds are limits with room, not tuned: every published model and accelerator is far inside them."""
    import polars as pl

    from tests.conftest import MEASUREMENTS

    arch = pl.read_csv(MEASUREMENTS / "architectures.csv", infer_schema_length=0)
    for col, hi in limits.ARCH_MAX.items():
        if col in arch.columns:
            values = arch[col].cast(pl.Float64, strict=False).drop_nulls()
            assert values.is_empty() or values.max() * 10 <= hi, col
    hw = pl.read_csv(MEASUREMENTS / "hardware_specs.csv", infer_schema_length=0)
    for col, hi in limits.HARDWARE_MAX.items():
        if col in hw.columns and col != "release_year":
            values = hw[col].cast(pl.Float64, strict=False).drop_nulls()
            assert values.is_empty() or values.max() * 10 <= hi, col


# ------------------------------------------------------------------ refusals name the numbers that broke the rule

def test_heads_against_tp_and_batch_against_dp_times_micro_batch_are_said_with_numbers():
    line = refused_in_one_line(["predict", "--model", "llama3-70b", "--gpu", "h100-sxm5-80gb", "--gpus", "96",
                                "--global-batch", "1000", "--seq-len", "2048", "--tp", "6", "--micro-batch", "4"])
    assert "n_heads 64 is not divisible by tp 6" in line
    assert "global batch 1000 is not a multiple of dp 16 x micro-batch 4 = 64" in line
    line = refused_in_one_line(["predict", "--model", "llama3-70b", "--gpu", "h100-sxm5-80gb", "--gpus", "96",
                                "--global-batch", "1024", "--seq-len", "2048", "--tp", "8", "--pp", "3", "--dp", "5"])
    assert "tp 8 x pp 3 x cp 1 x dp 5 = 120 is not --gpus 96" in line
    r = runner.invoke(app, ["search", "--model", "llama3-70b", "--gpu", "h100-sxm5-80gb", "--gpus", "96",
                            "--global-batch", "1000", "--seq-len", "2048", "--tp", "6"])
    assert r.exit_code == 1 and "n_heads 64 is not divisible by tp 6" in r.stderr
    with pytest.raises(stepcast.NoResult, match="global batch 1000 is not a multiple of dp 16 x micro-batch 4 = 64"):
        stepcast.search(model="llama3-70b", gpu="h100-sxm5-80gb", gpus=128, global_batch=1000, seq_len=2048, dp=16,
                        micro_batch=4)


# ------------------------------------------------------------------ the explorer's Host check (the served side: test_serve)

@pytest.mark.parametrize("bound, host, answered", [
    ("127.0.0.1", "127.0.0.1:8765", True), ("127.0.0.1", "localhost:8765", True), ("127.0.0.1", "[::1]:8765", True),
    ("127.0.0.1", "evil.example:8765", False), ("127.0.0.1", "127.0.0.1:9999", False),
    ("127.0.0.1", "192.168.1.5:8765", False), ("127.0.0.1", "localhost", False),
    ("0.0.0.0", "192.168.1.5:8765", True), ("0.0.0.0", "evil.example:8765", False),
    ("10.0.0.7", "10.0.0.7:8765", True), ("10.0.0.7", "10.0.0.8:8765", False),
    ("::", "[fe80::1]:8765", True),
])
def test_the_explorer_answers_only_its_own_names_at_its_port(bound, host, answered):
    from pipeline.serve import Bounded

    guard = Bounded(app=None, host=bound)
    problem = guard.host_problem({b"host": host.encode()}, {"server": (bound, 8765)})
    assert (problem is None) == answered, problem
    if not answered:
        assert problem[0] == 403 and f"Host '{host}' is not this server" in problem[1]
    assert guard.host_problem({}, {"server": (bound, 8765)})[0] == 400  # no Host header at all
