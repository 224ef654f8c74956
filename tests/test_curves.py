"""Scaling curves, the knee, the frontier and their CLI (models/planning/curves.py, models/planning/frontier.py)."""

import json

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from models.planning.curves import (best_layouts, critical_batch_seqs, round_batch,
                           efficiencies, knee, n_sweep, pareto_mask, policy_batches, scaling_curve)
from models.planning.frontier import dense_arch_for_params, frontier_summary, frontier_sweep
from models.physics.hardware import resolve_hardware
from models.planning.search import search
from pipeline import catalog
from pipeline.settings import PROJECT_ROOT

MEAS = PROJECT_ROOT / "measurements"


def hw(gpu):
    return resolve_hardware(pl.DataFrame([catalog.find_hardware(MEAS, gpu)]), strict=False).row(0, named=True)


def arch(name):
    return catalog.find_architecture(MEAS, name)


# ------------------------------------------------------------------ knee detection, known answers

def test_knee_of_a_curve_that_saturates_at_256():
    n = np.array([8, 16, 32, 64, 128, 256, 512, 1024, 2048], dtype=float)
    x = np.where(n <= 256, 100.0 * n, 100.0 * 256 + 20.0 * (n - 256))  # linear, then 20 % per added GPU
    pe, me, mask = efficiencies(n, x)
    assert mask.all()
    assert me[:6] == pytest.approx(1.0)
    assert me[6] == pytest.approx(0.2)
    assert knee(n, me, 0.5) == 512  # the first size whose added GPUs bring < 50 %
    assert knee(n, me, 0.1) != knee(n, me, 0.1)  # NaN: never below 0.1
    assert pe[-1] == pytest.approx((100 * 256 + 20 * 1792) / 2048 / 100)


def test_knee_of_a_usl_curve_matches_the_analytic_derivative():
    from models.planning.usl import usl_throughput

    n = 8.0 * 2 ** np.arange(0, 14)
    x = usl_throughput(n / 8, 1.0, 0.0, 1e-4)
    _, me, _ = efficiencies(n, x)
    k = knee(n, me, 0.5)
    # the secant slope halves between the previous size and k: check on both sides
    i = int(np.flatnonzero(n == k)[0])
    assert me[i] < 0.5 <= me[i - 1]


def test_dominated_sizes_are_skipped():
    n = np.array([8, 16, 24, 32, 48, 64], dtype=float)
    per = np.array([10, 10, 7, 10, 9.5, 9.9])
    mask = pareto_mask(n, per * n)
    assert mask.tolist() == [True, True, False, True, False, True]
    _, me, _ = efficiencies(n, per * n)
    assert np.isnan(me[2]) and np.isnan(me[4]) and me[5] == pytest.approx((9.9 * 64 - 320) / 32 / 10)


def test_sweep_batches_and_rounding():
    assert n_sweep(8, 100) == [8, 16, 24, 32, 48, 64, 96]
    assert n_sweep(72, 600) == [72, 144, 216, 288, 432, 576]
    assert [round_batch(v) for v in (1, 5, 7000, 5461)] == [1, 4, 6144, 4096]
    # DeepSeek LLM 2024: 0.2920 * C^0.3271 tokens; GPT-3's compute -> 1.42e7 tokens = 6,930 seqs of 2,048 -> 6,144
    assert critical_batch_seqs(3.15e23, 2048) == 6144
    assert policy_batches("weak", [8, 16], per_gpu_batch_seqs=2).tolist() == [16, 32]
    assert policy_batches("critical", [8, 4096], per_gpu_batch_seqs=1, ceiling_seqs=1536).tolist() == [8, 1536]
    with pytest.raises(ValueError, match="policy must be one of"):
        policy_batches("huge", [8])


@pytest.mark.parametrize("name,gpu,n,batch,seq", [("gpt3-175b", "h100-sxm5-80gb", 1024, 1536, 2048),
                                                   ("mixtral-8x7b", "h100-sxm5-80gb", 256, 1024, 4096),
                                                   ("gpt3-175b", "gb200", 1152, 1536, 2048)])
def test_vectorized_enumeration_finds_the_same_best_layout_as_search(name, gpu, n, batch, seq):
    grid = dict(micro_batch=[1, 2], recompute=["none", "selective", "full"], vpp=[1, 2], cp=[1],
                sharding=["none", "zero1", "zero3", "hsdp"])
    best, _ = best_layouts(arch(name), hw(gpu), [n], [batch], seq, grid=grid)
    ref = search(arch(name), hw(gpu), n, batch, seq, fixed=grid, top_k=1)
    assert best["tokens_per_s_per_gpu"][0] == pytest.approx(ref["tokens_per_s_per_gpu"][0], rel=1e-12)


# ------------------------------------------------------------------ whole curves

def test_strong_curve_facts():
    h = hw("h100-sxm5-80gb")
    c = scaling_curve(arch("gpt3-175b"), h, "strong", seq_len=2048, tokens=300e9, global_batch_seqs=1536, n_max=2048,
                      usd_per_gpu_hour=h["cloud_usd_per_hour"])
    ok = c.filter(pl.col("feasible"))
    assert c["n_gpus"].to_list() == n_sweep(8, 2048)
    assert (ok["tp"] * ok["pp"] * ok["dp"] * ok["cp"] == ok["n_gpus"]).all()
    assert (ok["global_batch_seqs"] == 1536).all()
    assert ok["time_to_train_days"].to_numpy() == pytest.approx(300e9 / ok["tokens_per_s"].to_numpy() / 86400)
    assert ok["cost_usd"].to_numpy() == pytest.approx(
        ok["time_to_train_days"].to_numpy() * 24 * ok["n_gpus"].to_numpy() * h["cloud_usd_per_hour"])
    # 175B needs several nodes: the smallest sizes are infeasible with a reason naming memory
    assert not c["feasible"][0] and "memory" in c["reason"][0]
    assert ok["parallel_efficiency"][0] == 1.0 and ok["marginal_efficiency"][0] == 1.0
    assert not ok["calibrated"].any() and ok["calibration_note"][0].startswith("analytical only")
    assert (ok["tokens_per_s_per_gpu_lo"] == ok["tokens_per_s_per_gpu"]).all()


def test_weak_curve_without_price_has_no_cost():
    c = scaling_curve(arch("llama3-8b"), hw("gaudi2"), "weak", seq_len=8192, tokens=15e12, per_gpu_batch_seqs=1,
                      n_max=256, usd_per_gpu_hour=None)
    assert (c["global_batch_seqs"] == c["n_gpus"]).all()
    assert c["cost_usd"].null_count() == c.height


def test_calibration_hook_gives_bands_and_knee_interval():
    from models.planning.curves import inflection

    def hook(analytical, configs):
        assert analytical.height == configs.height and "peak_bf16_tflops" in configs.columns
        t = analytical["tokens_per_s_per_gpu"]
        return pl.DataFrame({"step_time_s": analytical["step_time_s"], "step_time_lo_s": analytical["step_time_s"] / 1.2,
                             "step_time_hi_s": analytical["step_time_s"] * 1.2, "tokens_per_s_per_gpu": t,
                             "tokens_per_s_per_gpu_lo": t / 1.2, "tokens_per_s_per_gpu_hi": t * 1.2,
                             "fit_version": ["test-fit"] * analytical.height})

    c = scaling_curve(arch("llama3-8b"), hw("h100-sxm5-80gb"), "strong", seq_len=8192, tokens=15e12,
                      global_batch_seqs=512, n_max=4096, calibrate=hook)
    ok = c.filter(pl.col("feasible"))
    assert ok["calibrated"].all() and (ok["fit_version"] == "test-fit").all()
    assert (ok["tokens_per_s_lo"] < ok["tokens_per_s"]).all() and (ok["tokens_per_s"] < ok["tokens_per_s_hi"]).all()
    assert (ok["time_to_train_days_lo"] < ok["time_to_train_days_hi"]).all()
    rec = inflection(c)
    if rec["inflection_n"] is not None:
        assert rec["inflection_n_lo"] <= rec["inflection_n"] <= rec["inflection_n_hi"]

    def broken(analytical, configs):
        raise ValueError("no bf16 peak")

    c2 = scaling_curve(arch("llama3-8b"), hw("h100-sxm5-80gb"), "strong", seq_len=8192, tokens=15e12,
                       global_batch_seqs=512, n_max=64, calibrate=broken)
    assert not c2["calibrated"].any() and "no bf16 peak" in c2["calibration_note"][0]


# ------------------------------------------------------------------ frontier

def test_dense_shape_rule_reproduces_gpt3():
    # GPT-3 175B (Brown et al. 2020, Table 2.1): d_model 12,288, 96 layers; heads a power of two (128 of 96)
    a = dense_arch_for_params(175e9)
    assert (a["d_model"], a["n_layers"], a["n_heads"], a["head_dim"]) == (12288, 96, 128, 96)
    assert a["params"] == pytest.approx(175e9, rel=0.02)


def test_frontier_point_is_the_largest_compute_above_the_threshold():
    sweep = frontier_sweep(hw("h100-sxm5-80gb"), 3.0)
    s = frontier_summary(sweep, 0.8)
    ok = sweep.filter(pl.col("feasible"))
    assert s["found"] and s["utilization"] >= 0.8 * s["best_utilization"]
    # the best utilization held over three consecutive levels, at most the single best level
    assert s["best_utilization"] <= ok["utilization"].max() == pytest.approx(s["peak_utilization"])
    # the first level after the best one whose utilization falls below the threshold ends the frontier
    after = sweep.sort("training_flop").filter((pl.col("training_flop") > s["training_flop"])
                                                & (pl.col("training_flop") > s["best_utilization_flop"]))
    assert after.height and not (after["feasible"][0] and after["utilization"][0] >= s["utilization_threshold"])
    assert s["time_to_train_days"] <= 3 * 30.4375
    assert s["tokens"] == pytest.approx(20 * s["params"])
    assert 1e25 < s["training_flop"] < 1e29  # beyond GPT-4-class compute, below Epoch's 1e31 latency wall
    with pytest.raises(ValueError, match="min_utilization"):
        frontier_summary(sweep, 1.5)


def test_frontier_of_a_historical_fp32_part():
    sweep = frontier_sweep(hw("gtx-580"), 3.0, dtype="fp32")
    s = frontier_summary(sweep, 0.8)
    assert s["found"] and s["cost_basis"].startswith("purchase")  # no cloud price: launch price x N
    assert s["cost_usd"] == pytest.approx(499 * s["n_gpus"])
    assert sweep.height == 65 and sweep["training_flop"].max() > 5e31  # swept to the end, through infeasible levels
    assert set(sweep.filter(~pl.col("feasible"))["binding"]) <= {"memory", "time", "latency", "batch"}


def test_cli_frontier_contract_and_errors():
    from pipeline.cli import app

    r = CliRunner().invoke(app, ["frontier", "--gpu", "v100-sxm2-32gb", "--months", "3", "--min-utilization", "0.8",
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    for key in ("max_training_flop", "n_gpus", "tp", "pp", "dp", "ep", "cp", "utilization", "params", "tokens",
                "cost_usd"):
        assert key in out
    assert out["tp"] * out["pp"] * out["dp"] * out["cp"] == out["n_gpus"]
    assert sum(v for k, v in out["breakdown"].items() if k != "step_time_s") == pytest.approx(
        out["breakdown"]["step_time_s"], rel=1e-9)
    bad = CliRunner().invoke(app, ["frontier", "--gpu", "h100-sxm5-80gb", "--min-utilization", "80"])
    assert bad.exit_code == 2 and "--min-utilization must be in (0, 1]" in bad.output
    unknown = CliRunner().invoke(app, ["frontier", "--gpu", "h900"])  # `h100` names the H100 (tests/test_names.py)
    assert unknown.exit_code == 2 and "unknown hardware 'h900'" in unknown.output


def test_cli_curve_json_and_bad_policy():
    from pipeline.cli import app

    r = CliRunner().invoke(app, ["curve", "--model", "llama3-8b", "--gpu", "a100-sxm4-80gb", "--policy", "critical",
                                 "--tokens", "1e12", "--seq-len", "4096", "--max-gpus", "512", "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["policy"] == "critical" and out["points"][0]["n_gpus"] == 8
    assert "inflection_n" in out["inflection"] and "analytical only" in out["calibration"]
    bad = CliRunner().invoke(app, ["curve", "--model", "llama3-8b", "--gpu", "a100-sxm4-80gb", "--policy", "linear"])
    assert bad.exit_code == 2 and "--policy must be one of strong, weak, critical" in bad.output


# ------------------------------------------------------------------ the curve tells the truth

def test_efficiency_is_against_the_best_smaller_size():
    # 24 beats 16 per accelerator; 32 is worse than 24: against the smallest size it would read 1.1 (> 1), against
    # the best smaller size 11/12
    n = np.array([16, 24, 32, 64], dtype=float)
    per = np.array([10.0, 12.0, 11.0, 9.0])
    pe, me, mask = efficiencies(n, per * n)
    assert pe == pytest.approx([1.0, 1.2, 11 / 12, 9 / 12])
    assert mask.tolist() == [True, True, True, True]  # 16 is beaten by 24, but the smallest size is the reference
    assert me[3] == pytest.approx((9 * 64 - 11 * 32) / 32 / 12)


def _odd_factor_missing(n: int, batch: int) -> bool:
    import math

    f = n // math.gcd(n, batch)
    while f % 2 == 0:
        f //= 2
    return f > 1


def check_curve_tells_the_truth(doc: dict) -> None:
    """A curve never calls a size efficient that is slower than a smaller one; its sentence names the largest size
    where extra accelerators pay and every smaller size not worth running; an odd point (super-linear, slower than a
    smaller size, beaten per accelerator by a larger one, held back by the batch's divisibility) says why."""
    import re

    from models.planning.curves import DOMINANCE_TOLERANCE

    pts = doc["points"].filter(pl.col("feasible")).sort("n_gpus")
    n, x, days = pts["n_gpus"].to_list(), pts["tokens_per_s"].to_list(), pts["time_to_train_days"].to_list()
    b, eff, notes = pts["global_batch_seqs"].to_list(), pts["efficient"].to_list(), pts["layout_note"].to_list()
    pe, me = pts["parallel_efficiency"].to_list(), pts["marginal_efficiency"].to_list()
    per = [a / c for a, c in zip(x, n)]
    text, rec = doc["explanation"], doc["inflection"]
    for i in range(len(n)):
        slower = i > 0 and x[i] <= max(x[:i])
        beaten = any(per[j] > per[i] * (1 + DOMINANCE_TOLERANCE) for j in range(i + 1, len(n)))
        if eff[i]:
            assert not slower and (i == 0 or days[i] < min(days[:i])), (n[i], text)
            assert not beaten and me[i] is not None and me[i] >= rec["threshold"]
        if slower:
            assert not eff[i] and f"slower than N = {n[x.index(max(x[:i]))]:,}" in notes[i]
        if pe[i] > 1:
            assert notes[i] and "super-linear" in notes[i], (n[i], pe[i])
        if beaten:
            assert not eff[i] and "not worth running" in notes[i]
            if _odd_factor_missing(n[i], b[i]):
                assert "has no factor" in notes[i], notes[i]
    top = max(v for v, e in zip(n, eff) if e)
    assert f"extra accelerators pay up to N = {top:,}" in text
    if rec["inflection_n"] is not None:
        assert top < rec["inflection_n"] and f"to N = {rec['inflection_n']:,.0f}" in text and "stays ≥" not in text
        assert not any(e for v, e in zip(n, eff) if v >= rec["inflection_n"])
    m = re.search(r"not worth running \(layout_note says why\): ([\d, ]+)", text)
    named = set(m.group(1).strip().split(", ")) if m else set()
    assert named == {f"{v:,}" for v, e in zip(n, eff) if v <= top and not e}, text


TRUTH_CASES = [
    dict(model="llama3-70b", gpu="h100-sxm5-80gb", policy="strong", seq_len=2048, max_gpus=16384),
    dict(model="llama3-70b", gpu="h100-sxm5-80gb", policy="critical", seq_len=2048, max_gpus=16384),
    dict(model="llama3-70b", gpu="h100-sxm5-80gb", policy="strong", seq_len=8192, max_gpus=16384, threshold=0.8),
    dict(model="gpt3-175b", gpu="a100-sxm4-80gb", policy="strong", seq_len=2048, global_batch=1536, max_gpus=8192),
    dict(model="llama3-8b", gpu="h100-sxm5-80gb", policy="weak", seq_len=8192, max_gpus=4096),
    dict(model="llama3-70b", gpu="gb200", policy="strong", seq_len=8192, max_gpus=16384),
    dict(model="llama3-405b", gpu="b200", policy="strong", seq_len=8192, max_gpus=32768),
]


@pytest.mark.parametrize("case", TRUTH_CASES, ids=lambda c: f"{c['model']}-{c['gpu']}-{c['policy']}-{c['seq_len']}")
def test_the_curve_tells_the_truth(case):
    from pipeline import api
    from pipeline.settings import Settings

    doc, _ = api.scaling_curve(Settings.load(), **case)
    check_curve_tells_the_truth(doc)


def test_the_rounded_sizes_of_llama3_70b_say_why():
    """Strong scaling with a power-of-two batch: the 3·2^k sizes put the 3 into the pipeline (64 heads take no 3),
    and every one a larger size beats says so; the sentence does not call 12,288 efficient."""
    from pipeline import api
    from pipeline.settings import Settings

    doc, _ = api.scaling_curve(Settings.load(), model="llama3-70b", gpu="h100-sxm5-80gb", policy="strong",
                               seq_len=2048, max_gpus=16384)
    row = doc["points"].filter(pl.col("n_gpus") == 12288).row(0, named=True)
    assert row["pp"] % 3 == 0 and not row["efficient"]
    assert "the batch of 2,048 sequences has no factor 3" in row["layout_note"] and "pp carries the 3" in row["layout_note"]
    assert "12,288" not in doc["explanation"].split("pay up to N = ")[1].split(";")[0]


def test_calibrated_curves_tell_the_truth(built_store, monkeypatch):
    """With the promoted fit (its correction can lift one size above another): the same properties."""
    from pipeline import api
    from pipeline.settings import Settings

    monkeypatch.setenv("STEPCAST_STORE", str(built_store))
    for case in (dict(policy="critical", seq_len=8192), dict(policy="strong", seq_len=2048)):
        doc, _ = api.scaling_curve(Settings.load(), model="llama3-70b", gpu="h100-sxm5-80gb", max_gpus=16384, **case)
        assert "calibrated with fit" in doc["calibration"]
        check_curve_tells_the_truth(doc)


def test_cli_curve_out_writes_the_points_as_csv_or_the_json_document(tmp_path):
    """`--out` as on predict, search and plan: the file gets every point (CSV) or what --format json prints."""
    from pipeline.cli import app

    args = ["curve", "--model", "llama3-8b", "--gpu", "a100-sxm4-80gb", "--max-gpus", "64"]
    printed = json.loads(CliRunner().invoke(app, [*args, "--format", "json"]).stdout)
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "c.csv")])
    assert r.exit_code == 0, r.output
    points = pl.read_csv(tmp_path / "c.csv")
    assert points["n_gpus"].to_list() == [p["n_gpus"] for p in printed["points"]]
    assert points["step_time_s"].to_list() == pytest.approx([p["step_time_s"] for p in printed["points"]])
    assert "inflection:" in r.stderr and r.stdout == ""
    r = CliRunner().invoke(app, [*args, "--format", "json", "--out", str(tmp_path / "c.json")])
    assert r.exit_code == 0 and json.loads((tmp_path / "c.json").read_text()) == printed
