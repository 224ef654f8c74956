"""Calibration: versioned fits, grouped validation, leakage guard, intervals, serving (models/fitting/calibration.py,
pipeline/fits.py, assets/fit.py, `stepcast predict` / `stepcast fit`)."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from models.fitting.predictor import BREAKDOWN
from models.fitting import calibration as cal
from models.corpus.evaluate import predict_runs, prepare_configs
from pipeline import fits
from pipeline.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def inputs(built_store):
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        runs, hw, metrics = fits.read_inputs(con)
        bundle = fits.load_promoted_fit(con)
        fit_rows = con.sql("select * from fits").pl()
        fm = con.sql("select * from fit_metrics").pl()
    finally:
        con.close()
    recipes = fits.input_recipes()
    ok, _ = prepare_configs(runs, hw, recipes)
    targets = predict_runs(runs, hw, metrics, recipes)
    data = cal.fit_data(ok, targets.select("run_id", "measured_tokens_per_s_per_gpu", "whole_run_average"))
    return dict(ok=ok, data=data, bundle=bundle, fits=fit_rows, fit_metrics=fm, runs=runs, hw=hw, metrics=metrics,
                recipes=recipes)


def test_same_data_same_version_and_changed_data_new_version(inputs):
    d = inputs["data"]
    ok, _ = prepare_configs(inputs["runs"], inputs["hw"], inputs["recipes"])
    targets = predict_runs(inputs["runs"], inputs["hw"], inputs["metrics"], inputs["recipes"])
    again = cal.fit_data(ok, targets.select("run_id", "measured_tokens_per_s_per_gpu", "whole_run_average"))
    assert cal.fit_version(again) == cal.fit_version(d) == inputs["bundle"].version
    changed = cal.FitData(d.configs, d.log_target + np.where(np.arange(len(d.log_target)) == 0, 0.01, 0.0), d.weight)
    assert cal.fit_version(changed) != cal.fit_version(d)


def test_a_change_to_the_model_code_is_a_new_version(inputs, monkeypatch):
    # a fit stored before a physics change must not be reused for the same data: its parameters were fitted
    # through the old physics
    d = inputs["data"]
    before = cal.fit_version(d)
    monkeypatch.setattr(cal, "_CODE_DIGEST", "another physics")
    assert cal.fit_version(d) != before
    monkeypatch.setattr(cal, "_CODE_DIGEST", None)
    assert cal.fit_version(d) == before and len(cal.physics_code_digest()) == 64


def test_promoted_fit_is_validated_under_every_transfer_protocol(inputs):
    f = inputs["fits"]
    assert f.filter(pl.col("promoted")).height == 1
    row = f.filter(pl.col("promoted")).row(0, named=True)
    fm = inputs["fit_metrics"].filter(pl.col("version") == row["version"])
    overall = fm.filter((pl.col("grouping") == "source") & (pl.col("group") == "ALL")
                        & (pl.col("predictor") == "calibrated"))
    assert set(overall["scheme"]) >= {"loso", "logo", "lofo", "lopo", "scale"}
    # the held-out figures, not the in-sample one: leave-one-source-out within 12 % MdAPE (issue target 10 %;
    # this guards against a regression) and half the priors' error; every protocol's interval covers 80-100 %,
    # except a whole architecture family held out: with the second data release the dense family (2,130 runs) is
    # predicted from the 130 MoE and hybrid runs alone, 18.5 % off with 71 % coverage (docs/calibration.md, "What
    # the corpus cannot yet tell"); this guards that figure against getting worse
    assert row["mdape"] <= 0.12 and row["mdape"] <= 0.5 * row["analytical_mdape"]
    for r in overall.iter_rows(named=True):
        assert r["n_runs"] > 0 and r["mdape"] >= 0
        low = 0.68 if r["scheme"] == "lofo" else 0.80
        assert low <= r["coverage_90"] <= 1.0, r
    params = json.loads(row["physical_params"])
    assert params["host_overhead_s_per_op"] > 0 and 0 < params["matmul_eff_16bit"] <= 0.95
    assert 1e5 <= params["gemm_ramp_flops_per_sm"] <= 2e9  # per SM: portable across devices
    per_group = fm.filter((pl.col("scheme") == "loso") & (pl.col("predictor") == "calibrated")
                          & (pl.col("grouping") == "source"))
    assert per_group.height > 5 and (per_group["mdape"].drop_nulls() >= 0).all()


def test_leakage_guard_held_out_group_never_reaches_its_fit(inputs):
    """Change every target of one held-out source: its out-of-group predictions must not move at all."""
    d = inputs["data"]
    src = d.group("source")
    pick = np.flatnonzero(np.isin(src, ["llm-foundry", "megatron-bridge-docs", "torchtitan"]))
    small = d.subset(pick[::3])
    folds = small.group("source")
    held = folds == "torchtitan"
    assert held.sum() >= 3
    cv1 = cal.grouped_cv(small, "loso", max_nfev=3)
    poisoned = cal.FitData(small.configs, np.where(held, small.log_target + 3.0, small.log_target), small.weight)
    cv2 = cal.grouped_cv(poisoned, "loso", max_nfev=3)
    np.testing.assert_array_equal(cv1.log_pred["ridge"][held], cv2.log_pred["ridge"][held])
    assert not set(cv1.fold_train_ids["torchtitan"]) & set(small.run_id[held].tolist())
    # and the training data does matter: poisoning a training source moves the held-out prediction
    poisoned2 = cal.FitData(small.configs, np.where(folds == "llm-foundry", small.log_target + 1.0,
                                                    small.log_target), small.weight)
    cv3 = cal.grouped_cv(poisoned2, "loso", max_nfev=3)
    assert not np.allclose(cv1.log_pred["ridge"][held], cv3.log_pred["ridge"][held])


def test_protocol_folds_hold_out_whole_groups(inputs):
    d = inputs["data"]
    for scheme, labels in (("logo", d.labels("logo")), ("lopo", d.labels("lopo")), ("lofo", d.labels("lofo"))):
        folds, held = cal.protocol_folds(d, scheme)
        for g in held:
            inside = set(labels[folds == g])
            # a fold is one whole group (or the pooled small groups), never part of one
            for lab in inside:
                assert (folds[labels == lab] == g).all(), (scheme, lab)
    folds, held = cal.protocol_folds(d, "scale")
    n = d.configs["n_gpus"].to_numpy()
    assert held == ["n>256"] and (n[folds == "n>256"] > 256).all() and (n[folds != "n>256"] <= 256).all()


def _one_config(inputs, **over):
    cfg = inputs["ok"].filter(pl.col("source") == "llm-foundry").head(1)
    return cfg.with_columns(**{k: pl.lit(v) for k, v in over.items()}) if over else cfg


def test_outside_the_domain_the_interval_widens_and_the_output_says_why(inputs):
    from models.physics.hardware import resolve_hardware
    from models.fitting.predictor import predict

    b = inputs["bundle"]
    cfg = _one_config(inputs)
    near = predict(cfg, b).row(0, named=True)
    assert near["calibration_domain"] == "inside" and near["fit_version"] == b.version
    assert near["step_time_lo_s"] < near["step_time_s"] < near["step_time_hi_s"]
    old = resolve_hardware(inputs["hw"].filter(pl.col("id") == "v100-sxm2-32gb"), strict=False)
    far_cfg = cfg.drop([c for c in old.columns if c in cfg.columns and c != "gpu"]).with_columns(
        pl.lit("v100-sxm2-32gb").alias("gpu")).join(old.rename({"id": "gpu"}), on="gpu")
    far = predict(far_cfg, b).row(0, named=True)
    assert far["calibration_domain"].startswith("extrapolated: hardware generation pre-Ampere not in the fit")
    # the interval is step x exp(+-q x scale): q_inside inside the domain, the wider q_extrapolated (the transfer
    # protocols' out-of-fold conformal quantile) outside it; scale = exp(width features . width_coef), the same
    # for both rows (same family, precision, size and software era)
    from models.fitting.predictor import encode, width_scale

    rel = lambda o: o["step_time_hi_s"] / o["step_time_lo_s"]  # noqa: E731
    scale = lambda c: float(np.atleast_1d(width_scale(b, encode(c), c.height))[0])  # noqa: E731
    q_in, q_out = b.q_inside, b.q_extrapolated
    assert q_out > q_in > 0 and b.width_coef is not None
    assert scale(far_cfg) == pytest.approx(scale(cfg), rel=1e-12)
    assert np.log(rel(near)) == pytest.approx(2 * q_in * scale(cfg), rel=1e-9)
    assert np.log(rel(far)) == pytest.approx(2 * q_out * scale(cfg), rel=1e-9)
    big_cfg = cfg.with_columns((pl.col("n_gpus") * 4096).alias("n_gpus"), (pl.col("dp") * 4096).alias("dp"),
                               (pl.col("global_batch_seqs") * 4096).alias("global_batch_seqs"))
    big = predict(big_cfg, b).row(0, named=True)
    assert "accelerators > the largest cluster in the fit" in big["calibration_domain"]
    assert np.log(rel(big)) == pytest.approx(2 * q_out * scale(big_cfg), rel=1e-9)


def test_apply_calibration_wraps_the_one_function(inputs):
    from models.fitting.predictor import predict

    b = inputs["bundle"]
    cfg = _one_config(inputs)
    out = cal.apply_calibration(b, cfg, cfg)
    assert out["step_time_s"][0] == pytest.approx(predict(cfg, b)["step_time_s"][0], rel=1e-12)
    with pytest.raises(ValueError, match="analytical has 2 rows but features_input has 1"):
        cal.apply_calibration(b, pl.concat([cfg, cfg]), cfg)


def test_predict_uses_promoted_fit_and_analytical_only(built_store, inputs, monkeypatch):
    monkeypatch.setenv("STEPCAST_STORE", str(built_store))
    args = ["predict", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "1024", "--global-batch", "1536",
            "--seq-len", "2048", "--tp", "8", "--pp", "8", "--format", "json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)[0]
    assert row["fit_version"] == inputs["bundle"].version
    assert row["assumptions"].startswith("realistic") and row["calibration_domain"] == "inside"
    assert row["step_time_lo_s"] < row["step_time_s"] < row["step_time_hi_s"]
    assert row["tokens_per_s_per_gpu_lo"] < row["tokens_per_s_per_gpu"] < row["tokens_per_s_per_gpu_hi"]
    parts = sum(row[c] for c in BREAKDOWN)
    assert parts == pytest.approx(row["step_time_s"], rel=1e-9)
    assert row["hfu"] >= row["mfu"]
    r2 = runner.invoke(app, args + ["--analytical-only"])
    row2 = json.loads(r2.stdout)[0]
    assert row2["fit_version"] is None and row2["step_time_lo_s"] == row2["step_time_s"]
    assert row2["analytical_step_time_s"] == row2["step_time_s"] and row2["calibration_domain"] == "analytical"
    r3 = runner.invoke(app, args + ["--assumptions", "ideal"])
    row3 = json.loads(r3.stdout)[0]
    assert row3["assumptions"].startswith("ideal") and row3["step_time_s"] <= row2["step_time_s"]


def test_data_hash_ignores_last_bit_noise_but_not_real_changes():
    """The fit version hashes the data: a floating-point last-bit difference in a derived input (from a
    reordering of operations) must not make a new version; a real change of a value must."""
    import numpy as np
    import polars as pl

    from models.fitting.calibration import FitData, data_hash

    base = pl.DataFrame({"run_id": ["a", "b"], "measured_tokens_per_s_per_gpu": [1234.5678901234567, 42.0],
                         "tp": [1, 2]})
    fd = FitData(base, np.log(base["measured_tokens_per_s_per_gpu"].to_numpy()), np.ones(2))
    noisy = base.with_columns(pl.Series("measured_tokens_per_s_per_gpu",
                                        np.nextafter(base["measured_tokens_per_s_per_gpu"].to_numpy(), np.inf)))
    changed = base.with_columns(pl.Series("measured_tokens_per_s_per_gpu", [1234.57, 42.0]))
    assert data_hash(FitData(noisy, fd.log_target, fd.weight)) == data_hash(fd)
    assert data_hash(FitData(changed, fd.log_target, fd.weight)) != data_hash(fd)
