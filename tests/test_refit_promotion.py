"""Promotion on equal terms (pipeline/fits.py): the rule on synthetic out-of-fold rows, the stored decision,
a person's `stepcast fit --promote`, and `stepcast info` showing the served fit and the latest candidate."""

from __future__ import annotations

import dataclasses
import json

import duckdb
import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from models.fitting import calibration as cal
from models.corpus.evaluate import predict_runs, prepare_configs
from pipeline import fits
from pipeline.cli import app

runner = CliRunner()


def oof(scheme: str, errors: list[float], folds: list[str], prefix: str = "r") -> pl.DataFrame:
    """Out-of-fold rows whose relative error of run i is errors[i] (target 1 token/s)."""
    return pl.DataFrame({"scheme": scheme, "run_id": [f"{prefix}{i}" for i in range(len(errors))], "fold": folds,
                         "log_pred": np.log1p(errors), "log_target": 0.0})


FOLDS = ["a"] * 4 + ["b"] * 4 + ["c"] * 4


def test_candidate_worse_beyond_one_standard_error_on_any_scheme_is_refused():
    served = pl.concat([oof("loso", [0.05] * 4 + [0.10] * 4 + [0.20] * 4, FOLDS),
                        oof("loho", [0.10] * 12, FOLDS)])
    # loso: served MdAPE 0.10, per-fold MdAPE 0.05/0.10/0.20 -> one standard error 0.044
    se = np.std([0.05, 0.10, 0.20], ddof=1) / np.sqrt(3)
    within = pl.concat([oof("loso", [0.14] * 12, FOLDS), oof("loho", [0.10] * 12, FOLDS)])
    ok, reason, detail = fits.promotion_decision("v1", within, served, None)
    assert ok, reason
    loso = next(c for c in detail["schemes"] if c["scheme"] == "loso")
    assert loso["margin"] == pytest.approx(se) and loso["served_mdape"] == pytest.approx(0.10)
    beyond = pl.concat([oof("loso", [0.10 + se + 0.01] * 12, FOLDS), oof("loho", [0.10] * 12, FOLDS)])
    ok, reason, _ = fits.promotion_decision("v1", beyond, served, None)
    assert not ok and reason.startswith("not promoted: worse than the served fit v1 on equal terms")
    # worse on loho alone (its folds agree: margin 0) is enough to refuse
    loho_worse = pl.concat([oof("loso", [0.10] * 12, FOLDS), oof("loho", [0.11] * 12, FOLDS)])
    assert not fits.promotion_decision("v1", loho_worse, served, None)[0]


def test_a_single_fold_scheme_takes_the_medians_standard_error():
    # one fold (the `scale` protocol): no fold-to-fold spread; the margin is half the distance between the
    # order statistics bracketing the median's 68% interval: ranks 50 -+ 5 of 100 errors 0.00, 0.01, ...
    errors = [i / 100 for i in range(100)]
    assert fits.median_standard_error(np.array(errors)) == pytest.approx((0.55 - 0.45) / 2)
    served = oof("scale", errors, ["big"] * 100)
    ok, _, detail = fits.promotion_decision("v1", oof("scale", [e + 0.04 for e in errors], ["big"] * 100), served, None)
    assert ok and detail["schemes"][0]["margin"] == pytest.approx(0.05)
    assert not fits.promotion_decision("v1", oof("scale", [e + 0.06 for e in errors], ["big"] * 100), served,
                                       None)[0]


def test_equal_terms_are_the_runs_both_were_scored_on_and_new_runs_are_reported_apart():
    served = oof("loso", [0.10] * 12, FOLDS)
    # the candidate has 4 more runs, predicted badly (they are new: not part of the comparison) and is
    # scored against today's target (the served rows' stale target is ignored)
    cand = pl.concat([oof("loso", [0.10] * 12, FOLDS), oof("loso", [0.9] * 4, ["d"] * 4, prefix="new")])
    stale = served.with_columns(pl.lit(0.5).alias("log_target"))
    ok, _, detail = fits.promotion_decision("v1", cand, stale, None)
    loso = detail["schemes"][0]
    assert ok and loso["n_common"] == 12 and loso["n_new"] == 4
    assert loso["candidate_mdape"] == pytest.approx(0.10) and loso["candidate_new_mdape"] == pytest.approx(0.9)


def served_on_new(outside: list[bool]) -> pl.DataFrame:
    return pl.DataFrame({"covered": [not o for o in outside], "tokens_per_s_per_gpu": [2.0 if o else 1.0 for o in outside],
                         "measured_tokens_per_s_per_gpu": 1.0})


def test_new_runs_far_outside_the_served_interval_contradict_it():
    served = oof("loso", [0.10] * 12, FOLDS)
    cand = oof("loso", [0.10] * 12, FOLDS)
    # 4 of 4 outside a 90% interval: P = 0.1^4 = 1e-4 < 0.01
    surprise = fits.new_runs_surprise(served_on_new([True] * 4), 0.10)
    assert surprise["p_value"] == pytest.approx(1e-4) and surprise["contradicts"]
    ok, reason, _ = fits.promotion_decision("v1", cand, served, surprise)
    assert not ok and "contradict" in reason and "4 of 4 new runs outside" in reason
    # 1 of 8 outside is what a 90% interval promises: promoted
    calm = fits.new_runs_surprise(served_on_new([True] + [False] * 7), 0.10)
    assert calm["p_value"] == pytest.approx(1 - 0.9 ** 8) and not calm["contradicts"]
    assert fits.promotion_decision("v1", cand, served, calm)[0]
    assert fits.new_runs_surprise(None, 0.10) is None


def test_first_fit_legacy_served_fit_and_candidate_without_rows():
    rows = oof("loso", [0.1] * 12, FOLDS)
    assert fits.promotion_decision(None, rows, rows.clear(), None)[:2] == (True, "first fit")
    ok, reason, _ = fits.promotion_decision("old", rows, rows.clear(), None)
    assert ok and "no stored out-of-fold rows" in reason
    ok, reason, _ = fits.promotion_decision("old", rows.clear(), rows, None)
    assert not ok and reason.startswith("not promoted: no out-of-fold rows")


# ---------------------------------------------------------------- stored fits, by hand, info

@pytest.fixture(scope="module")
def inputs(built_store):
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        runs, hw, metrics = fits.read_inputs(con)
        bundle = fits.load_promoted_fit(con)
        served_oof = fits.stored_oof(con, bundle.version)
        fm = con.sql("select * from fit_metrics").pl()
    finally:
        con.close()
    recipes = fits.input_recipes()
    ok, _ = prepare_configs(runs, hw, recipes)
    targets = predict_runs(runs, hw, metrics, recipes)
    data = cal.fit_data(ok, targets.select("run_id", "measured_tokens_per_s_per_gpu", "whole_run_average"))
    return dict(data=data, bundle=bundle, oof=served_oof, fit_metrics=fm)


def test_built_store_keeps_the_out_of_fold_rows_of_its_fit(inputs):
    o, d = inputs["oof"], inputs["data"]
    assert "loso" in set(o["scheme"]) and len(set(o["scheme"])) > 1
    assert o.filter(pl.col("scheme") == "loso").height == len(d.run_id)
    loso = o.filter(pl.col("scheme") == "loso")
    mdape = float(((loso["log_pred"] - loso["log_target"]).exp() - 1).abs().median())
    row = inputs["fit_metrics"].filter((pl.col("version") == inputs["bundle"].version) & (pl.col("scheme") == "loso")
                                       & (pl.col("grouping") == "source") & (pl.col("group") == "ALL")
                                       & (pl.col("predictor") == "calibrated"))
    assert mdape == pytest.approx(row["mdape"][0], rel=1e-9)  # the stored rows are the ones scored


def test_refused_fit_is_kept_a_person_promotes_it_and_info_shows_both(store_copy, inputs, monkeypatch):
    b, served = inputs["bundle"], inputs["oof"]
    report = {"metrics": inputs["fit_metrics"].filter(pl.col("version") == b.version).drop("version")}
    con = duckdb.connect(str(store_copy))
    try:
        worse = dataclasses.replace(b, version="worse0000000000")
        # every loso prediction 30% high: worse than the served fit on the same runs
        shifted = served.with_columns(pl.when(pl.col("scheme") == "loso").then(pl.col("log_pred") + np.log(1.3))
                                      .otherwise(pl.col("log_pred")).alias("log_pred"))
        row = fits.save_fit(con, worse, {**report, "oof_long": shifted}, inputs["data"])
        assert row["promoted"] is False and "worse than the served fit " + b.version in row["promotion_reason"]
        detail = json.loads(row["promotion_detail"])
        assert detail["served"] == b.version and {c["scheme"] for c in detail["schemes"]} == set(served["scheme"])
        assert con.execute("select count(*) from fit_oof where version = 'worse0000000000'").fetchone()[0] == \
            served.height
        same = dataclasses.replace(b, version="same00000000000")
        assert fits.save_fit(con, same, {**report, "oof_long": served}, inputs["data"])["promoted"] is True
        assert con.execute("select count(*) from fits where promoted").fetchone()[0] == 1
    finally:
        con.close()

    monkeypatch.setenv("STEPCAST_STORE", str(store_copy))
    r = runner.invoke(app, ["fit", "--promote", "nope", "--no-publish"])
    assert r.exit_code == 1 and "no stored fit 'nope'" in r.output
    r = runner.invoke(app, ["fit", "--promote", "worse0000000000", "--no-publish"])
    assert r.exit_code == 0, r.output
    assert "serving fit worse0000000000" in r.output and "promoted by hand" in r.output
    con = duckdb.connect(str(store_copy), read_only=True)
    try:
        assert con.execute("select version from fits where promoted").fetchall() == [("worse0000000000",)]
        assert con.execute("select distinct fit_version from calibrated_predictions").fetchall() == \
            [("worse0000000000",)]
    finally:
        con.close()
    info = runner.invoke(app, ["info", "--format", "json"])
    assert info.exit_code == 0, info.output
    status = json.loads(info.output)["fits"]
    assert status["served"]["version"] == "worse0000000000"
    assert status["latest"]["version"] == "same00000000000"
    text = runner.invoke(app, ["info"]).output
    assert "served fit: worse0000000000" in text and "latest candidate: same00000000000" in text
