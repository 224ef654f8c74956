"""Properties of the 90% interval (models.fitting.predictor, pipeline.api settings_spread): stating a setting never
widens it, a configuration outside the fit's domain never gets a narrower one than the same configuration inside
it, no interval implies a step faster than the compute roofline (HFU, hence MFU, <= 1), and its parts are printed."""

from __future__ import annotations

import dataclasses
import json

import duckdb
import numpy as np
import pytest
from typer.testing import CliRunner

from models.fitting import predictor
from models.physics.hardware import resolve_hardware
from pipeline import catalog
from pipeline.cli import app
from pipeline.fits import load_promoted_fit
from tests.conftest import MEASUREMENTS

runner = CliRunner()
BASE = ["predict", "-m", "llama3-70b", "--gpu", "h100-sxm5-80gb", "-n", "512", "-b", "1024", "-s", "8192", "--tp", "8",
        "--pp", "4", "--format", "json"]
STATED = [("--recompute", "selective"), ("--micro-batch", "1"), ("--sharding", "zero1"), ("--vpp", "2"),
          ("--stack", "megatron"), ("--sequence-parallel", None)]


@pytest.fixture(scope="module")
def fit(built_store):
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        return load_promoted_fit(con)
    finally:
        con.close()


def _answer(store, extra):
    res = runner.invoke(app, ["--store", str(store), *BASE, *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)[0]


def _ratio(r):
    return r["step_time_hi_s"] / r["step_time_lo_s"]


def test_stating_a_setting_never_widens_the_interval(built_store):
    given: list[str] = []
    prev = _answer(built_store, given)
    assert prev["interval_settings"] > 1.0  # settings left open widen it
    for flag, value in STATED:
        given += [flag] + ([value] if value is not None else [])
        cur = _answer(built_store, given)
        assert _ratio(cur) <= _ratio(prev) * (1 + 1e-9), (flag, _ratio(cur), _ratio(prev))
        prev = cur
    assert prev["interval_settings"] == pytest.approx(1.0)  # a fully stated configuration has none
    for part in ("interval_residual", "interval_extrapolation", "interval_settings"):
        assert prev[part] >= 1.0


def test_an_extrapolated_row_is_never_narrower_than_the_same_row_inside(fit):
    hw = resolve_hardware(catalog.hardware(MEASUREMENTS), strict=False)
    from benchmarks.bench_model import random_configs

    a = random_configs(2000, hw, seed=3)
    inside = predictor.predict_arrays(a, fit)
    # the same configurations with a domain that holds none of them: every row extrapolated
    narrow = dataclasses.replace(fit, domain=dataclasses.replace(fit.domain, max_n_gpus=1.0))
    outside = predictor.predict_arrays(a, narrow)
    ok = np.isfinite(inside["step_time_s"]) & (inside["domain_code"] == predictor.DOMAIN_INSIDE) & (a["n_gpus"] > 1)
    assert ok.sum() > 100
    assert (outside["domain_code"][ok] != predictor.DOMAIN_INSIDE).all()
    w_in = np.log(inside["step_time_hi_s"][ok] / inside["step_time_s"][ok])
    w_out = np.log(outside["step_time_hi_s"][ok] / outside["step_time_s"][ok])
    assert (w_out >= w_in - 1e-12).all()


def test_no_interval_implies_a_step_faster_than_the_roofline(fit):
    hw = resolve_hardware(catalog.hardware(MEASUREMENTS), strict=False)
    from benchmarks.bench_model import random_configs

    a = random_configs(5000, hw, seed=4)
    res = predictor.predict_arrays(a, fit)
    ok = np.isfinite(res["step_time_s"]) & np.isfinite(res["hfu"]) & (res["hfu"] > 0)
    assert ok.sum() > 1000
    # the fastest step of the interval at the peak: HFU (and MFU) at most 1
    hfu_hi = res["hfu"][ok] * res["step_time_s"][ok] / res["step_time_lo_s"][ok]
    mfu_hi = res["mfu"][ok] * res["tokens_per_s_per_gpu_hi"][ok] / res["tokens_per_s_per_gpu"][ok]
    assert hfu_hi.max() <= 1.0 + 1e-9 and mfu_hi.max() <= 1.0 + 1e-9
    assert (res["step_time_lo_s"][ok] <= res["step_time_s"][ok]).all()
