"""Your cluster in a few runs: the served fit adapted to a source's own measurements (models.fitting.adapt,
pipeline.adaptation, `--calibrate-on FILE`, `--source NAME`, `stepcast list sources`, the k-shot protocol)."""

from __future__ import annotations

import json
import math

import duckdb
import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from models.fitting.adapt import AdaptationRule, adapt, select_rule, shrinkage_penalty
from pipeline.adaptation import source_table
from pipeline.cli import app

runner = CliRunner()
FEW_HEADER = "run_id,model_name,gpu,n_gpus,global_batch_seqs,seq_len,tp,pp,sharding,metric,value,unit\n"
LAYOUTS = [("llama3-8b", 8, 32, 1, 1), ("llama3-8b", 16, 64, 1, 1), ("llama3-70b", 64, 128, 8, 1)]
OTHER = [("llama3-8b", 64, 256, 1, 1), ("llama3-70b", 256, 512, 8, 1), ("llama3-70b", 512, 1024, 8, 4)]


def _rows(layouts, values=None) -> str:
    out = FEW_HEADER
    for i, (m, n, b, tp, pp) in enumerate(layouts):
        v = "" if values is None else f"{values[i]:.6g}"
        out += f"r{i},{m},h100-sxm5-80gb,{n},{b},8192,{tp},{pp},fsdp,{'tokens_per_s_per_gpu' if values else ''}," \
               f"{v},{'tokens/s/GPU' if values else ''}\n"
    return out


def _predict_runs(store, path, *extra) -> list[dict]:
    res = runner.invoke(app, ["--store", str(store), "predict", "--runs", str(path), "--format", "json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_the_adaptation_is_the_ridge_regression_scikit_learn_fits():
    from sklearn.linear_model import Ridge

    rule = AdaptationRule(alpha=1.0, prior_dof=2.0, sigma2=0.02)
    for e in ([-0.2], [-0.2, -0.25, -0.1], [0.3, -0.1, 0.05, 0.0, 0.12]):
        e = np.array(e)
        want = Ridge(alpha=shrinkage_penalty(e, rule), fit_intercept=False).fit(np.ones((len(e), 1)), e).coef_[0]
        assert adapt(e, rule, "x").level == pytest.approx(want, rel=1e-9)


def test_one_run_moves_the_answer_less_than_five_runs_that_agree():
    rule = AdaptationRule(alpha=1.0, prior_dof=2.0, sigma2=0.02)
    one = adapt([-0.2], rule, "x").level
    five = adapt([-0.2] * 5, rule, "x").level
    assert -0.2 < five < one < 0  # shrunk toward the global fit, less with more evidence
    scattered = adapt([-0.6, 0.2, -0.2], rule, "x").level
    agreeing = adapt([-0.2, -0.2, -0.2], rule, "x").level
    assert abs(scattered) < abs(agreeing)  # runs that scatter are trusted less than runs that agree


def test_the_protocol_chooses_a_rule_that_beats_no_adaptation_on_synthetic_units():
    rng = np.random.default_rng(1)
    levels = rng.normal(0, 0.15, 12)
    errors = np.concatenate([lv + rng.normal(0, 0.05, 20) for lv in levels])
    units = np.repeat([f"u{i}" for i in range(12)], 20)
    rule, rows = select_rule(errors, units)
    overall = {(r["k"], r["predictor"]): r for r in rows if r["group"] == "ALL"}
    assert overall[(3, "adapted")]["mdape_balanced"] < overall[(0, "adapted")]["mdape_balanced"] / 2
    assert rule.half_width(3) < rule.half_width(0)  # the interval narrows with evidence


def test_a_source_20pct_slower_is_learned_from_three_runs_within_3pct(built_store, tmp_path):
    plain = tmp_path / "plain.csv"
    plain.write_text(_rows(LAYOUTS))
    served = [r["tokens_per_s_per_gpu"] for r in _predict_runs(built_store, plain)]
    few = tmp_path / "few.csv"
    few.write_text(_rows(LAYOUTS, [t / 1.2 for t in served]))  # every step 20% slower than the served fit says
    other = tmp_path / "other.csv"
    other.write_text(_rows(OTHER))
    before = [r["tokens_per_s_per_gpu"] for r in _predict_runs(built_store, other)]
    after = _predict_runs(built_store, other, "--calibrate-on", str(few))
    for b, a in zip(before, after):
        assert a["tokens_per_s_per_gpu"] / (b / 1.2) == pytest.approx(1.0, abs=0.03)
        assert a["adaptation_runs"] == 3 and "adapted to few.csv from 3 run(s)" in a["assumptions"]
        # the interval is the k-shot protocol's after 3 runs: it replaces the residual and extrapolation parts
        assert a["interval_extrapolation"] == pytest.approx(1.0)
        assert a["tokens_per_s_per_gpu"] / a["tokens_per_s_per_gpu_lo"] == pytest.approx(
            a["interval_residual"] * a["interval_settings"], rel=1e-6)


def test_three_runs_of_a_source_never_change_another_sources_adaptation(built_store):
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        cal = con.execute("select source, tokens_per_s_per_gpu, measured_tokens_per_s_per_gpu "
                          "from calibrated_predictions").pl()
        rule = con.execute("select version from fits where promoted").fetchone()
    finally:
        con.close()
    r = AdaptationRule(alpha=1.0, prior_dof=1.0, sigma2=0.02, q_by_k=((0, 0.3), (3, 0.2)))
    before = source_table(cal, r, rule[0])
    new = pl.DataFrame({"source": ["my cluster"] * 3, "tokens_per_s_per_gpu": [100.0, 200.0, 300.0],
                        "measured_tokens_per_s_per_gpu": [80.0, 170.0, 240.0]})
    after = source_table(pl.concat([cal, new], how="diagonal_relaxed"), r, rule[0])
    assert after.filter(pl.col("source") != "my cluster").equals(before)
    mine = after.filter(pl.col("source") == "my cluster").row(0, named=True)
    assert mine["n_runs"] == 3 and 0.8 < mine["throughput_factor"] < 1.0


def test_a_calibration_file_with_a_bad_row_is_refused_naming_file_line_and_column(built_store, tmp_path):
    few = tmp_path / "few.csv"
    few.write_text(_rows(LAYOUTS, [6000, 5900, 650]).replace(",8192,8,1,fsdp", ",8192,eight,1,fsdp"))
    other = tmp_path / "other.csv"
    other.write_text(_rows(OTHER))
    res = runner.invoke(app, ["--store", str(built_store), "predict", "--runs", str(other), "--calibrate-on", str(few)])
    assert res.exit_code == 1
    assert f"{few}, line 4, column tp: 'eight' is not a number" in res.output


def test_a_calibration_file_without_a_usable_run_is_an_error(built_store, tmp_path):
    few = tmp_path / "few.csv"
    few.write_text(_rows(LAYOUTS))  # no measurement
    res = runner.invoke(app, ["--store", str(built_store), "predict", "-m", "llama3-8b", "--gpu", "h100-sxm5-80gb",
                              "-n", "8", "-b", "32", "-s", "8192", "--calibrate-on", str(few)])
    assert res.exit_code == 1
    assert "no run with both a measurement and a prediction" in res.output


def test_adapting_a_bound_or_the_priors_is_refused(built_store, tmp_path):
    few = tmp_path / "few.csv"
    few.write_text(_rows(LAYOUTS, [6000, 5900, 650]))
    base = ["--store", str(built_store), "predict", "-m", "llama3-8b", "--gpu", "h100-sxm5-80gb", "-n", "8", "-b", "32",
            "-s", "8192", "--calibrate-on", str(few)]
    for extra, words in ((["--assumptions", "ideal"], "is a bound"), (["--analytical-only"], "priors alone")):
        res = runner.invoke(app, base + extra)
        assert res.exit_code == 2 and words in res.output


def test_source_answers_with_its_stored_adaptation_and_unknown_names_list_known(built_store):
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        table = con.execute("select * from source_adaptations").pl()
    finally:
        con.close()
    row = table.sort("n_runs", descending=True).row(0, named=True)
    base = ["--store", str(built_store), "predict", "-m", "llama3-8b", "--gpu", "h100-sxm5-80gb", "-n", "8", "-b",
            "32", "-s", "8192", "--format", "json"]
    plain = json.loads(runner.invoke(app, base).stdout)[0]
    res = runner.invoke(app, base + ["--source", row["source"]])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)[0]
    assert got["tokens_per_s_per_gpu"] / plain["tokens_per_s_per_gpu"] == pytest.approx(row["throughput_factor"])
    res = runner.invoke(app, base + ["--source", "no such cluster"])
    assert res.exit_code == 1 and "no such source" in res.output and "stepcast list sources" in res.output


def test_list_sources_shows_run_counts_and_adaptations(built_store):
    res = runner.invoke(app, ["--store", str(built_store), "list", "sources", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        n = dict(con.execute("select source, count(*) from runs group by source").fetchall())
    finally:
        con.close()
    assert {r["source"]: r["runs"] for r in rows} == n
    assert any(r["throughput_factor"] is not None and r["interval_factor"] > 1 for r in rows)


def test_the_kshot_protocol_is_in_fit_metrics_and_error_falls_with_k(built_store):
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        k = con.execute("""select m.k_shot, m.predictor, m.mdape_balanced, m.coverage_90, m.median_width
                           from fit_metrics m join fits f using(version)
                           where f.promoted and m.scheme = 'kshot' and m."group" = 'ALL' order by m.k_shot""").pl()
    finally:
        con.close()
    adapted = k.filter(pl.col("predictor") == "adapted")
    assert adapted["k_shot"].to_list() == [0, 1, 3, 5]
    err = adapted["mdape_balanced"].to_list()
    assert err[0] > err[1] > err[2] >= err[3] - 0.002  # every unit weighing the same
    width = adapted["median_width"].to_list()
    assert width[0] > width[2]  # the interval narrows as far as the protocol shows
    for c in adapted["coverage_90"].to_list():
        assert 0.85 <= c <= 0.95
    naive = k.filter(pl.col("predictor") == "naive")["mdape_balanced"].to_list()
    assert err[1] < naive[1] and err[2] < naive[2]  # the shrunk level beats shifting by the runs' median
    assert math.isfinite(err[2])
