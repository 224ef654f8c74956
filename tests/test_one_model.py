"""One model, one answer: every path predicts through models.predictor with the same fit, so the same
configuration gets the same step time, interval, MFU and HFU wherever it is asked (predict, search fixed to
the layout, plan, the hardware_choice table behind v_hardware_choice)."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from models.hardware import resolve_hardware
from models.predictor import Calibration, Predictor, predict, predict_arrays
from models.search import search
from pipeline import catalog, fits
from pipeline.cli import app
from pipeline.settings import Settings

runner = CliRunner()
MODELS = ("gpt3-175b", "llama3-8b", "llama3-70b", "mixtral-8x7b")
GPUS = ("a100-sxm4-80gb", "h100-sxm5-80gb", "b200", "v100-sxm2-32gb", "mi300x")


@pytest.fixture(scope="module")
def fit(built_store):
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        bundle = fits.load_promoted_fit(con)
    finally:
        con.close()
    assert isinstance(bundle, Calibration)
    return bundle


def _random_configs(n: int, seed: int = 0) -> list[dict]:
    """Random valid layouts over several models, accelerators and cluster sizes."""
    rng = np.random.default_rng(seed)
    meas = Settings.load().measurements
    out = []
    while len(out) < n:
        arch = catalog.find_architecture(meas, str(rng.choice(MODELS)))
        hw = catalog.find_hardware(meas, str(rng.choice(GPUS)))
        tp = int(rng.choice([1, 2, 4, 8]))
        pp = int(rng.choice([1, 2, 4, 8]))
        dp = int(rng.choice([1, 2, 4, 16, 64]))
        if arch["n_heads"] % tp or pp > arch["n_layers"]:
            continue
        mb = int(rng.choice([1, 2]))
        m = int(rng.choice([1, 4, 8, 16])) * pp
        out.append(dict(arch=arch, hw=hw, tp=tp, pp=pp, dp=dp, cp=1, ep=1, vpp=1, micro_batch=mb,
                        global_batch=dp * mb * m, seq_len=int(rng.choice([2048, 4096])),
                        sharding=str(rng.choice(["zero1", "fsdp", "none"])) if dp > 1 else "none",
                        recompute=str(rng.choice(["none", "selective", "full"])),
                        dtype="bf16"))
    return out


def _frame(c: dict) -> pl.DataFrame:
    hw = resolve_hardware(pl.DataFrame([c["hw"]]), strict=False).row(0, named=True)
    row = {k: c["arch"].get(k) for k in catalog.ARCH_MODEL_COLUMNS}
    n = c["tp"] * c["pp"] * c["dp"]
    row.update(seq_len=c["seq_len"], global_batch_seqs=c["global_batch"], micro_batch=c["micro_batch"], n_gpus=n,
               tp=c["tp"], pp=c["pp"], dp=c["dp"], cp=1, ep=1, vpp=1, sharding=c["sharding"],
               recompute=c["recompute"], sequence_parallel=c["tp"] > 1, dtype=c["dtype"],
               gpus_per_node=int(min(hw["scaleup_size"], n)))
    return pl.DataFrame([row]).hstack(pl.DataFrame([{k: v for k, v in hw.items() if k not in row}]))


def test_predict_and_search_agree_on_a_few_hundred_configurations(fit):
    """predict (the polars front-end every command uses) and search fixed to the same layout give the same step,
    interval, MFU and HFU to 0.1 %; HFU >= MFU; ranking by search equals ranking by predict."""
    model = Predictor(fit)
    configs = _random_configs(240)
    steps_pred, steps_search = [], []
    for c in configs:
        p = predict(_frame(c), model).row(0, named=True)
        hw = resolve_hardware(pl.DataFrame([c["hw"]]), strict=False).row(0, named=True)
        n = c["tp"] * c["pp"] * c["dp"]
        fixed = dict(tp=c["tp"], pp=c["pp"], dp=c["dp"], cp=1, ep=1, vpp=1, micro_batch=c["micro_batch"],
                     sharding=c["sharding"], recompute=c["recompute"], sequence_parallel=c["tp"] > 1, tp_mode="1d", etp=c["tp"])  # predict's defaults
        s = search(c["arch"], hw, n, c["global_batch"], c["seq_len"], fixed=fixed, top_k=1, params=model,
                   gpus_per_node=int(min(hw["scaleup_size"], n)))
        if p["step_time_s"] is None:
            continue
        if not p["feasible"]:
            assert s.height == 0  # an infeasible configuration is never ranked
            continue
        assert s.height == 1
        r = s.row(0, named=True)
        for col in ("step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu", "mfu", "hfu"):
            assert r[col] == pytest.approx(p[col], rel=1e-3), col
        assert r["fit_version"] == p["fit_version"] == fit.version
        assert r["calibration_domain"] == p["calibration_domain"]
        assert p["hfu"] >= p["mfu"] - 1e-12
        parts = sum(p[k] for k in ("compute_s", "tp_comm_s", "pp_bubble_s", "pp_comm_s", "dp_comm_exposed_s",
                                   "cp_comm_s", "ep_comm_s", "optimizer_s"))
        assert parts == pytest.approx(p["step_time_s"], rel=1e-9)
        steps_pred.append(p["tokens_per_s_per_gpu"])
        steps_search.append(r["tokens_per_s_per_gpu"])
    assert len(steps_pred) >= 100
    assert list(np.argsort(steps_pred, kind="stable")) == list(np.argsort(steps_search, kind="stable"))


def test_arrays_and_frame_front_ends_are_one_function(fit):
    configs = pl.concat([_frame(c) for c in _random_configs(60, seed=1)], how="diagonal_relaxed")
    from models.predictor import encode

    a = predict_arrays(encode(configs), fit)
    f = predict(configs, fit)
    np.testing.assert_allclose(f["step_time_s"].fill_null(np.nan).to_numpy(), a["step_time_s"], rtol=1e-12)
    ok = np.isfinite(a["hfu"])
    assert (a["hfu"][ok] >= a["mfu"][ok] - 1e-12).all()


def test_plan_and_hardware_choice_view_agree(built_store, monkeypatch):
    """`stepcast plan` and the v_hardware_choice view answer the same target with the same fit and numbers."""
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        row = con.sql("select * from v_hardware_choice where target_id = 'llama3-70b-15t' "
                      "and hardware = 'h100-sxm5-80gb'").pl()
        target = con.sql("select * from hardware_choice limit 1").pl()
    finally:
        con.close()
    if row.height == 0:
        pytest.skip("no H100 row within 90 days in v_hardware_choice")
    r = row.row(0, named=True)
    assert target.height
    monkeypatch.setenv("STEPCAST_STORE", str(built_store))
    res = runner.invoke(app, ["plan", "--model", "llama3-70b", "--tokens", str(r["tokens"]), "--hardware",
                              "h100-sxm5-80gb", "--max-gpus", str(r["n_gpus"]), "--deadline-days", "90",
                              "--seq-len", "8192", "--global-batch-tokens", "4194304", "--top", "50",
                              "--format", "json"])
    assert res.exit_code == 0, res.output
    plans = [p for p in json.loads(res.stdout) if p["n_gpus"] == r["n_gpus"]]
    assert plans, "plan does not list the view's cluster size"
    p = plans[0]
    assert p["fit_version"] == r["fit_version"]
    assert p["days"] == pytest.approx(r["days"], rel=1e-3)
    assert p["cost_usd"] == pytest.approx(r["cost_usd"], rel=1e-3)
    assert p["mfu"] == pytest.approx(r["mfu"], rel=1e-3)


def test_invalid_layout_exits_with_the_reason(monkeypatch):
    res = runner.invoke(app, ["predict", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "8",
                              "--global-batch", "64", "--seq-len", "4096", "--tp", "3"])
    assert res.exit_code == 2
    assert "not divisible by tp*pp*cp" in res.output or "n_heads" in res.output
    res = runner.invoke(app, ["predict", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "8",
                              "--global-batch", "64", "--seq-len", "4096", "--dp", "4"])
    assert res.exit_code == 2 and "tp*pp*cp*dp != n_gpus" in res.output


def test_fp4_is_faster_than_fp8_on_b200_and_refused_where_there_is_no_fp4():
    """NVFP4 runs at the dense FP4 peak (hardware table, peak_fp4_tflops); a part without one refuses it."""
    base = ["predict", "--model", "llama3-70b", "--gpus", "64", "-b", "64", "-s", "8192", "--tp", "8", "--format", "json"]
    step = {dt: json.loads(runner.invoke(app, base + ["--gpu", "b200", "--dtype", dt]).stdout)[0]["step_time_s"]
            for dt in ("bf16", "fp8", "nvfp4")}
    assert step["nvfp4"] < step["fp8"] < step["bf16"]
    res = runner.invoke(app, base + ["--gpu", "h100-sxm5-80gb", "--dtype", "nvfp4"])
    assert res.exit_code == 2 and "has no FP4 tensor-core peak" in res.output
    res = runner.invoke(app, base + ["--gpu", "a100-sxm4-80gb", "--dtype", "fp8"])
    assert res.exit_code == 2 and "has no FP8 tensor-core peak" in res.output


def test_a_rows_answer_does_not_depend_on_the_rows_asked_with_it():
    """The same configuration gets the same answer alone or in a batch with other models (the physics is
    vectorized over rows; a branch taken for a MoE row must not touch a dense row's figures). Before the fix, a
    dense data-parallel row beside a MoE row paid the latency of an expert gradient collective of its own size."""
    from models.step_time import predict as physics

    rows = [_frame(c) for c in _random_configs(40, seed=3)]
    dense = pl.concat(rows, how="diagonal_relaxed").filter(pl.col("n_experts").fill_null(0) == 0)
    moe = pl.concat(rows, how="diagonal_relaxed").filter(pl.col("n_experts").fill_null(0) > 0)
    assert dense.height >= 10 and moe.height >= 1
    alone = physics(dense)
    mixed = physics(pl.concat([dense, moe], how="diagonal_relaxed")).head(dense.height)
    for col in ("step_time_s", "dp_comm_exposed_s", "memory_gb_per_gpu"):
        a, b = alone[col].to_numpy(), mixed[col].to_numpy()
        assert np.array_equal(a, b, equal_nan=True), col
