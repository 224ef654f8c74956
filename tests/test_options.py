"""Every option of `stepcast predict`, `search`, `curve`, `frontier` and `plan` reaches every layer: the CLI's
flags (the click parameters typer builds), the keywords of the Python function of the same name
(`stepcast.predict`, ...) and the query parameters of the explorer's `/api/<command>` (predict, search, curve,
frontier). The options are defined once (pipeline/options.py); these tests read each layer as a user meets it, so
an option one layer drops fails here. The options that drifted before that (`tp_mode` and `layers_16bit` of
predict, `tp_mode` of search, `tp_form` of frontier) are checked to act in Python and in the explorer as the flag
does in the CLI.

No built store: every command answers on the analytical priors (tests/conftest.py points STEPCAST_STORE at an empty
folder), the CLI and the Python API alike.
"""

from __future__ import annotations

import inspect
import json

import polars as pl
import pytest
import typer
from typer.testing import CliRunner

import stepcast
from pipeline import serve
from pipeline.cli import app
from pipeline.settings import Settings

COMMANDS = ("predict", "search", "curve", "frontier", "plan")
PYTHON = {"predict": stepcast.predict, "search": stepcast.search, "curve": stepcast.curve,
          "frontier": stepcast.frontier, "plan": stepcast.plan}
EXPLORER = {"predict": "/api/predict", "search": "/api/search", "curve": "/api/curve", "frontier": "/api/frontier"}

#: CLI options that only shape the printout (the Python functions return values, the explorer answers JSON)
PRINTOUT_ONLY = {"format", "out"}
#: search's hidden --intervals/--no-intervals does nothing (the interval is always part of the prediction); it is
#: kept only so that old scripts still parse
NO_OP = {"intervals"}
#: options naming a file on the machine that runs the command: the explorer reads no file a request names (the
#: `arch_json` parameter carries a config.json's text instead of --arch-file)
FILE_OPTIONS = {"arch_file", "hardware_file", "runs", "price_file", "calibrate_on", "trace"}  # the explorer reads no file

runner = CliRunner()


def cli_params(command: str) -> dict:
    """The command's options (click parameters) as the CLI declares them, by long flag with dashes as
    underscores."""
    params = typer.main.get_command(app).commands[command].params
    return {next(f for f in p.opts if f.startswith("--"))[2:].replace("-", "_"): p for p in params
            if p.param_type_name == "option"}


def python_keywords(command: str) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(PYTHON[command]).parameters)


def explorer_parameters(command: str) -> set[str]:
    spec, _ = serve.ENDPOINTS[EXPLORER[command]]
    return set(spec)


def cli_json(command: str, *args: str):
    r = runner.invoke(app, [command, *args, "--format", "json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def rows(frame: pl.DataFrame) -> list[dict]:
    """A frame as the CLI's JSON has it (NaN and infinities as null)."""
    return json.loads(json.dumps(serve.finite(frame.to_dicts()), default=str))


# ------------------------------------------------------------------ every CLI option in every layer

def test_the_excluded_options_are_options():
    """The exclusion lists name real flags (a renamed flag must not hide behind a stale name)."""
    every = set().union(*(cli_params(c) for c in COMMANDS))
    assert PRINTOUT_ONLY | NO_OP | FILE_OPTIONS <= every


@pytest.mark.parametrize("command", COMMANDS)
def test_every_cli_option_is_a_keyword_of_the_python_function(command):
    options = set(cli_params(command)) - PRINTOUT_ONLY - NO_OP
    assert len(options) > 10
    missing = options - set(python_keywords(command))
    assert not missing, f"stepcast.{command} lacks keywords for {sorted(missing)}"


@pytest.mark.parametrize("command", sorted(EXPLORER))
def test_every_cli_option_is_a_parameter_of_the_explorer_api(command):
    options = set(cli_params(command)) - PRINTOUT_ONLY - NO_OP - FILE_OPTIONS
    missing = options - explorer_parameters(command)
    assert not missing, f"{EXPLORER[command]} lacks parameters for {sorted(missing)}"


@pytest.mark.parametrize("command", COMMANDS)
def test_the_python_defaults_are_the_cli_defaults(command):
    keywords = python_keywords(command)
    for name, param in cli_params(command).items():
        if name in keywords:
            assert keywords[name].default == param.default, (command, name)


@pytest.mark.parametrize("command", sorted(EXPLORER))
def test_the_explorer_takes_nothing_the_cli_does_not(command):
    """Beside the CLI's options, the explorer has only `arch_json` (a pasted --arch-file) and `calibrate_json` (the
    runs of a --calibrate-on FILE)."""
    assert explorer_parameters(command) - set(cli_params(command)) <= {"arch_json", "calibrate_json"}


# ------------------------------------------------------------------ the options that had drifted act as the flags do

L8 = ("--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "64", "--global-batch", "256", "--seq-len",
      "8192")
L8_KW = dict(model="llama3-8b", gpu="h100-sxm5-80gb", gpus=64, global_batch=256, seq_len=8192)


def explorer(command: str, **params) -> object:
    """The explorer's answer to /api/<command> with these parameters (as the query string carries them)."""
    spec, answer = serve.ENDPOINTS[EXPLORER[command]]
    pairs = [(k, "true" if v is True else str(v)) for k, v in params.items()]
    return serve.finite(answer(Settings.load(), serve.parse_query(pairs, spec, EXPLORER[command])))


def test_predict_tp_mode_as_the_cli():
    expected = cli_json("predict", *L8, "--tp", "4", "--tp-mode", "2d")
    got = stepcast.predict(tp=4, tp_mode="2d", **L8_KW)
    assert rows(got) == expected and got["tp_mode"].to_list() == ["2d"]
    assert got["step_time_s"][0] != stepcast.predict(tp=4, **L8_KW)["step_time_s"][0]  # the 2-D form is modelled
    assert explorer("predict", tp=4, tp_mode="2d", **L8_KW) == expected


def test_predict_layers_16bit_as_the_cli():
    args = ("--model", "nemotron-3-super", "--gpu", "b200", "--gpus", "64", "--global-batch", "512", "--seq-len",
            "8192", "--dtype", "nvfp4")
    kw = dict(model="nemotron-3-super", gpu="b200", gpus=64, global_batch=512, seq_len=8192, dtype="nvfp4")
    expected = cli_json("predict", *args, "--layers-16bit", "4")
    got = stepcast.predict(layers_16bit=4, **kw)
    assert rows(got) == expected
    recipe = stepcast.predict(**kw)  # the published recipe's 14 layers in BF16, said in assumptions
    assert "n_layers_16bit=14" in recipe["assumptions"][0] and "n_layers_16bit" not in got["assumptions"][0]
    assert got["step_time_s"][0] != recipe["step_time_s"][0]
    assert explorer("predict", layers_16bit=4, **kw) == expected


def test_search_tp_mode_as_the_cli():
    expected = cli_json("search", *L8, "--tp", "4", "--tp-mode", "2d", "--top", "3")
    got = stepcast.search(tp=4, tp_mode="2d", top=3, **L8_KW)
    assert rows(got) == expected and set(got["tp_mode"]) == {"2d"}
    assert explorer("search", tp=4, tp_mode="2d", top=3, **L8_KW) == expected


def test_frontier_tp_form_as_the_cli():
    """On a GTX 580 within 3 months under ideal conditions the 2-D form lets a larger run keep its utilization (the
    realistic frontier of the priors ends at memory pressure first, where the form does not matter)."""
    args = ("--gpu", "gtx-580-3gb", "--months", "3", "--assumptions", "ideal")
    expected = cli_json("frontier", *args, "--tp-form", "2d")
    got = stepcast.frontier(gpu="gtx-580-3gb", months=3, assumptions="ideal", tp_form="2d")
    assert json.loads(json.dumps(got, default=str)) == expected and got["layout"]["tp_mode"] == "2d"
    one_d = stepcast.frontier(gpu="gtx-580-3gb", months=3, assumptions="ideal")
    assert got["max_training_flop"] > one_d["max_training_flop"]
    assert explorer("frontier", gpu="gtx-580-3gb", months=3, assumptions="ideal", tp_form="2d") == expected


def test_arch_file_is_the_keyword_of_arch_file(tmp_path):
    """`arch_file=` (the CLI's --arch-file) reads the file as `arch=` does; both at once is refused."""
    path = "tests/data/hf/llama-3-8b.json"
    kw = dict(gpu="a100-sxm4-80gb", gpus=16, global_batch=128, seq_len=4096, tp=2)
    expected = cli_json("predict", "--arch-file", path, "--gpu", "a100-sxm4-80gb", "--gpus", "16", "--global-batch",
                        "128", "--seq-len", "4096", "--tp", "2")
    assert rows(stepcast.predict(arch_file=path, **kw)) == expected == rows(stepcast.predict(arch=path, **kw))
    with pytest.raises(stepcast.InputError, match="arch and arch_file both given"):
        stepcast.predict(arch=path, arch_file=path, **kw)
