"""Low-precision recipes (models.core.precision): layers kept in 16 bits, their defaults and their errors."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from models.physics.hardware import resolve_hardware
from models.core.params import DEFAULT
from models.physics.step_time import predict_arrays
from pipeline.cli import app
from tests.conftest import MEASUREMENTS
from tests.test_step_time import hw_row

runner = CliRunner()


@pytest.fixture(scope="module")
def hw():
    return resolve_hardware(pl.read_csv(MEASUREMENTS / "hardware_specs.csv", infer_schema_length=0), strict=False)


@pytest.fixture(autouse=True)
def no_store(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "none" / "stepcast.duckdb"))


def _compute(hw, dtype, layers_16bit=None, pp=1, hid="b200"):
    d = dict(n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab=128256, activation=1,
             n_experts=0, top_k=0, seq_len=8192, global_batch_seqs=16, micro_batch=1, n_gpus=pp, tp=1, pp=pp, dp=1,
             cp=1, ep=1, vpp=1, sharding=0, recompute=1, sequence_parallel=0, dtype=dtype, gpus_per_node=8)
    if layers_16bit is not None:
        d["n_layers_16bit"] = layers_16bit
    d.update(hw_row(hw, hid))
    out = predict_arrays({k: np.array([np.nan if v is None else v], dtype=float) for k, v in d.items()}, DEFAULT)
    return float(out["compute_s"][0]), float(out["step_time_s"][0])


@pytest.mark.parametrize("dtype", [2, 5])  # fp8, nvfp4
def test_every_layer_in_16_bits_is_the_16_bit_run(hw, dtype):
    """A low-precision recipe that keeps all its layers in 16 bits computes like the bf16 run (up to the host's
    soft maximum in the step); none kept is the plain low-precision run; more kept never makes a step faster."""
    bf16 = _compute(hw, 0)[0]
    assert _compute(hw, dtype, 32)[0] == pytest.approx(bf16, rel=0.02)
    assert _compute(hw, dtype, 0) == _compute(hw, dtype)
    steps = [_compute(hw, dtype, n)[1] for n in (0, 4, 8, 16, 32, 64)]
    assert all(a < b for a, b in zip(steps[:4], steps[1:5])) and steps[5] == steps[4]  # capped at the stack


def test_16_bit_layers_sit_on_the_last_stage(hw):
    """With pp = 4 the last stage holds 8 layers: keeping 8 in 16 bits makes that stage all-16-bit, and keeping
    more costs nothing more (the last stage paces the step)."""
    assert _compute(hw, 2, 8, pp=4)[1] == _compute(hw, 2, 30, pp=4)[1]
    assert _compute(hw, 2, 4, pp=4)[1] < _compute(hw, 2, 8, pp=4)[1]


def test_bf16_rows_ignore_the_column(hw):
    assert _compute(hw, 0, 16) == _compute(hw, 0)


def test_measured_nvfp4_nemotron_3_super_runs_take_the_recipes_bf16_layers(tmp_path):
    """`predict --runs` fills n_layers_16bit from the model's NVFP4 recipe and says so; its other runs keep none."""
    lines = (MEASUREMENTS / "measured_runs.csv").read_text().splitlines()
    path = tmp_path / "super.csv"
    path.write_text("\n".join([lines[0]] + [ln for ln in lines[1:] if "Nemotron_3_Super" in ln]) + "\n")
    r = runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    nv = [x for x in rows if x["dtype"] == "nvfp4"]
    other = [x for x in rows if x["dtype"] != "nvfp4"]
    assert nv and other
    assert all("n_layers_16bit=14 (Megatron-Bridge recipe nemotron_3_super_bf16_with_nvfp4_mixed)" in x["assumptions"]
               for x in nv)
    assert not any("n_layers_16bit" in (x["assumptions"] or "") for x in other)


def test_predict_states_the_recipe_default_and_refuses_bad_values():
    base = ["predict", "--model", "Nemotron 3 Super", "--gpu", "gb200", "--gpus", "64", "--ep", "8",
            "--global-batch", "1024", "--seq-len", "8192", "--format", "json"]
    r = runner.invoke(app, base + ["--dtype", "nvfp4"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.output)[0]
    assert "n_layers_16bit=14 (Megatron-Bridge recipe nemotron_3_super_bf16_with_nvfp4_mixed)" in row["assumptions"]
    r0 = runner.invoke(app, base + ["--dtype", "nvfp4", "--layers-16bit", "0"])
    assert json.loads(r0.output)[0]["step_time_s"] < row["step_time_s"]
    bad = runner.invoke(app, base + ["--dtype", "bf16", "--layers-16bit", "4"])
    assert bad.exit_code != 0 and "--layers-16bit keeps layers of a low-precision recipe" in bad.output
    bad = runner.invoke(app, base + ["--dtype", "nvfp4", "--layers-16bit", "500"])
    assert bad.exit_code != 0 and "--layers-16bit must be between 0 and the model's 88 layers" in bad.output


def test_quantize_kernels_move_the_bytes_of_their_recipe(hw):
    """The recipes differ only in what their quantize kernels move per element (models.physics.parts._CAST_BYTES): per-tensor
    current scaling (fp8-cs) reads each tensor once more for its amax (2 B), MXFP8 writes one E8M0 scale per 32
    values in each of its two copies (2/32 B) - so with the same FP8 peak the extra time of fp8-cs over delayed
    scaling is 32 x that of MXFP8."""
    base = _compute(hw, 2, hid="h100-sxm5-80gb")[0]
    cs = _compute(hw, 3, hid="h100-sxm5-80gb")[0] - base
    mx = _compute(hw, 4, hid="h100-sxm5-80gb")[0] - base
    assert cs > 0 and mx > 0
    assert cs / mx == pytest.approx(32.0, rel=0.02)
