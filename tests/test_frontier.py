"""The compute frontier under Epoch AI's ideal conditions and the calibrated ('realistic') model
(models/planning/frontier.py, models/fitting/assumptions.py, `stepcast frontier`)."""

import json
import math

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from models.fitting.assumptions import ASSUMPTIONS, params_for
from models.planning.curves import batch_tokens, default_dtype
from models.planning.frontier import frontier_summary, frontier_sweep, latency_wall_s
from models.physics.hardware import resolve_hardware
from models.core.params import DEFAULT
from models.planning.search import enumerate_layouts
from pipeline import catalog
from pipeline.settings import PROJECT_ROOT

MEAS = PROJECT_ROOT / "measurements"
RATES = ("peak_fp32_tflops", "peak_tf32_tflops", "peak_bf16_tflops", "peak_fp16_tflops", "peak_fp8_tflops",
         "memory_bw_gbps", "intra_node_bw_gbps", "inter_node_bw_gbps")


def hw(gpu, **override):
    row = dict(catalog.find_hardware(MEAS, gpu))
    row.update(override)
    return resolve_hardware(pl.DataFrame([row]), strict=False).row(0, named=True)


def gtx580_3gb():
    """AlexNet's card, the 3 GB GTX 580: the `gtx-580-3gb` row when the catalog has it, else `gtx-580` with 3 GB."""
    try:
        return hw("gtx-580-3gb")
    except catalog.UnknownName:
        return hw("gtx-580", memory_gb=3.0)


def frontier(h, assumptions, **kw):
    sweep = frontier_sweep(h, 3.0, params=params_for(assumptions, DEFAULT), dtype=default_dtype(h),
                           assumptions=assumptions, **kw)
    return sweep, frontier_summary(sweep, 0.8)


def within(x, ref, factor):
    return ref / factor <= x <= ref * factor


# ------------------------------------------------------------------ assumptions

def test_ideal_assumptions_set_epochs_conditions_and_keep_latency():
    p = params_for("ideal", DEFAULT)
    assert p.tp_overlap == p.dp_overlap == p.fsdp_gather_overlap == p.pp_overlap == p.ep_overlap == 1.0
    assert p.host_overhead_s_per_op == 0.0 and p.mem_overhead_gb == 0.0 and p.mem_fragmentation_frac == 0.0
    assert p.matmul_eff_16bit == p.matmul_eff_32bit == p.attn_eff == 1.0
    assert all(getattr(p, f) == 0.0 for f in ("gemm_half_flops", "gemm_ramp_s", "gemm_ramp_flops_per_sm")
               if hasattr(p, f))
    assert any(hasattr(p, f) for f in ("gemm_half_flops", "gemm_ramp_s", "gemm_ramp_flops_per_sm"))
    assert (p.alpha_scaleup_s, p.alpha_scaleout_s) == (DEFAULT.alpha_scaleup_s, DEFAULT.alpha_scaleout_s)
    assert params_for("realistic", DEFAULT) is DEFAULT
    with pytest.raises(ValueError, match="assumptions must be one of ideal, realistic, got 'optimistic'"):
        params_for("optimistic", DEFAULT)
    assert ASSUMPTIONS == ("ideal", "realistic")


def test_tensor_parallelism_may_leave_the_scale_up_domain():
    h = hw("gtx-580")  # AlexNet's 2-GPU box is its scale-up domain
    lay = enumerate_layouts(catalog.find_architecture(MEAS, "gpt3-175b"), h, 32, 64, 2048,
                            fixed={"sharding": "zero1", "recompute": "full"})
    assert lay["tp"].max() == 16 > h["scaleup_size"]  # 16 | 96 heads


# ------------------------------------------------------------------ Epoch AI's GTX 580 counterfactual

@pytest.mark.parametrize("rule", ["kaplan", "deepseek"])
def test_gtx580_counterfactual_matches_epoch_ai(rule):
    """Epoch AI, "Introducing the Distributed Training Interactive Simulator" (2024; the model of Erdil &
    Schneider-Joseph 2024, arXiv:2411.01137): with GTX 580s (3 GB, AlexNet's GPU) under ideal conditions, the
    largest run in 3 months at >= 80 % utilization is about 1e26 FLOP on about 16 million GPUs, with 1024-way data
    x 32-way pipeline x 512-way tensor parallelism. Within 3x (FLOP, GPUs, cost) and 4x (TP, PP).

    Epoch's model ties the batch to the critical batch size of the loss reached (McCandlish et al. 2018; Kaplan et
    al. 2020): the Kaplan rule; DeepSeek's rule (the default) grows faster with compute (C^0.327 vs C^0.238) and
    must stay within the same tolerance once the frontier ends at the first level below 80 %."""
    sweep, s = frontier(gtx580_3gb(), "ideal", batch_rule=rule)
    assert s["found"]
    assert within(s["training_flop"], 1e26, 3.0), s["training_flop"]
    assert within(s["n_gpus"], 16e6, 3.0), s["n_gpus"]
    assert within(s["tp"], 512, 4.0) and within(s["pp"], 32, 4.0), (s["tp"], s["pp"])
    assert s["tp"] * s["pp"] * s["dp"] * s["cp"] == s["n_gpus"]
    assert s["time_to_train_days"] <= 3 * 30.4375 and s["utilization"] >= 0.8 * s["best_utilization"]
    assert s["cost_basis"].startswith("purchase") and within(s["cost_usd"], 5e9, 3.0)  # Epoch: about $5 billion
    assert (sweep["assumptions"] == "ideal").all()


def test_h100_frontier_matches_epoch_ai_and_says_what_ends_it():
    """Epoch AI (Erdil & Schneider-Joseph 2024): under ideal conditions H100 utilization holds to about 1e28 FLOP
    (2e28) in 3 months. Kaplan's critical batch (Epoch's law) within [3e27, 3e28]; DeepSeek's larger batches move
    it up, by less than 10x. What ends it is named and explained."""
    h = hw("h100-sxm5-80gb")
    ks, k = frontier(h, "ideal", batch_rule="kaplan")
    ds, d = frontier(h, "ideal", batch_rule="deepseek")
    assert 3e27 <= k["training_flop"] <= 3e28, k["training_flop"]
    assert k["training_flop"] <= d["training_flop"] <= 10 * k["training_flop"], (k["training_flop"], d["training_flop"])
    for sweep, s in ((ks, k), (ds, d)):
        end = _next_level(sweep, s["training_flop"])  # the level that ends it: below 80 % of the best
        assert not end["feasible"] or end["utilization"] < s["utilization_threshold"]
        assert s["ended_by"] == end["binding"] and s["ended_by"] in ("bandwidth", "batch", "latency", "memory", "time")
        assert s["ended_by_reason"].startswith(f"at {end['training_flop']:.3g} FLOP")
        assert s["training_flop"] <= s["crossing_flop"] <= end["training_flop"]


def _next_level(sweep, flop):
    return sweep.sort("training_flop").filter(pl.col("training_flop") > flop).row(0, named=True)


# ------------------------------------------------------------------ the exit rule, the best, the reach

def _series(utilization, binding=None):
    """A synthetic sweep: one compute level per utilization (0 or None: infeasible), a quarter decade apart."""
    n = len(utilization)
    return pl.DataFrame({"training_flop": [1e20 * 10 ** (i / 4) for i in range(n)],
                         "utilization": [u or None for u in utilization], "feasible": [bool(u) for u in utilization],
                         "binding": binding or ["compute"] * n,
                         "reason": [None if u else "no layout" for u in utilization],
                         "latency_wall_days": [1.0] * n, "months": [3.0] * n, "n_gpus": list(range(1, n + 1))})


def test_the_first_level_below_the_threshold_ends_the_frontier():
    """Epoch's "not fall below": a one-level dip ends the frontier, whatever recovers after it."""
    u = [0.50, 0.90, 0.95, 0.94, 0.93, 0.70, 0.92, 0.91, 0.50, 0.40]
    s = frontier_summary(_series(u, ["compute"] * 5 + ["bandwidth"] + ["compute"] * 4), 0.8)
    c = [1e20 * 10 ** (i / 4) for i in range(len(u))]
    assert s["best_utilization"] == pytest.approx(0.93)  # held over 3 levels: 0.95, 0.94, 0.93
    assert s["utilization_threshold"] == pytest.approx(0.744)
    assert s["training_flop"] == pytest.approx(c[4]) and s["ended_by"] == "bandwidth"  # not c[7] after the recovery
    assert c[4] < s["crossing_flop"] < c[5]
    # an infeasible level is a dip as well
    s = frontier_summary(_series([0.9, 0.9, 0.9, None, 0.9, 0.9]), 0.8)
    assert s["training_flop"] == pytest.approx(c[2]) and s["largest_feasible_flop"] == pytest.approx(c[5])
    # no level below: the frontier is the grid's last level, and the sentence says so
    s = frontier_summary(_series([0.9, 0.9, 0.9, 0.85]), 0.8)
    assert s["training_flop"] == pytest.approx(c[3]) and s["ended_by"] is None and "grid ends" in s["ended_by_reason"]


def test_one_levels_spike_does_not_set_the_best():
    """The best utilization is the best sustained over 3 consecutive levels: a lone spike at the grid's low end
    (the compute-optimal model is then mostly its vocabulary) would put the threshold above the plateau."""
    u = [0.60, 0.69, 0.53, 0.57, 0.57, 0.60, 0.55, 0.54, 0.50, 0.44, 0.30]
    s = frontier_summary(_series(u), 0.8)
    assert s["peak_utilization"] == pytest.approx(0.69) and s["best_utilization"] == pytest.approx(0.57)
    assert s["training_flop"] == pytest.approx(1e20 * 10 ** (8 / 4))  # 0.50 >= 0.456; 0.44 ends it
    # fewer levels than a run of 3: the best level
    assert frontier_summary(_series([0.5, 0.7]), 0.8)["best_utilization"] == pytest.approx(0.7)


def test_realistic_gtx580_frontier_is_a_run_not_an_artefact():
    """The calibrated model's GTX 580 3 GB: the frontier is a multi-GPU run, not the grid's first levels, and lies
    below the ideal one; its best utilization is held over three levels."""
    sweep, s = frontier(gtx580_3gb(), "realistic")
    _, ideal = frontier(gtx580_3gb(), "ideal")
    assert s["found"] and s["training_flop"] >= 1e19 and s["n_gpus"] >= 8, (s["training_flop"], s["n_gpus"])
    assert s["training_flop"] <= ideal["training_flop"] and s["best_utilization"] <= ideal["best_utilization"]
    u = sweep.sort("training_flop")["utilization"].fill_null(0.0).to_numpy()
    held = [min(u[i:i + 3]) for i in range(len(u) - 2)]
    assert max(held) == pytest.approx(s["best_utilization"]) and s["peak_utilization"] >= s["best_utilization"]


def test_no_cap_below_the_wall_the_sweep_says_what_ends_it():
    """No accelerator cap: levels needing more than 1e9 accelerators are searched (bounded only by the degrees a
    model allows); the reach (trainable at any utilization) runs into the latency-wall region and says what ends it.
    A fixed 4M-token batch puts the kernel-latency wall inside the grid."""
    sweep, s = frontier(hw("h100-sxm5-80gb"), "ideal")
    big = sweep.filter(pl.col("n_gpus_min") > 1e9)
    assert big.height and (big["n_gpus"] > 1e9).all() and (big["n_gpus"] <= big["n_gpus_max"]).all()
    assert not big["reason"].str.contains("more than 1,000,000,000").any()
    assert s["largest_feasible_flop"] >= 3e29 and s["largest_feasible_flop"] > s["training_flop"]
    assert s["reach_ended_by"] in ("bandwidth", "batch", "latency", "memory", "compute")
    after = _next_level(sweep, s["largest_feasible_flop"])
    assert s["reach_reason"].startswith(f"at {after['training_flop']:.3g} FLOP") and not after["feasible"]
    _, f = frontier(hw("h100-sxm5-80gb"), "ideal", batch_rule="fixed")
    assert f["latency_wall_flop"] is not None and 1e27 < f["latency_wall_flop"] < 1e30
    assert s["latency_wall_flop"] is None or s["latency_wall_flop"] > f["latency_wall_flop"]


# ------------------------------------------------------------------ properties

@pytest.mark.parametrize("gpu,base", [("h100-sxm5-80gb", {}), ("v100-sxm2-32gb", {})])
def test_more_bandwidth_memory_or_speed_never_lowers_the_frontier(gpu, base):
    h0 = hw(gpu, **base)
    _, s0 = frontier(h0, "ideal")
    more_bw = hw(gpu, **base, intra_node_bw_gbps=4 * h0["intra_node_bw_gbps"],
                 inter_node_bw_gbps=4 * h0["inter_node_bw_gbps"])
    more_mem = hw(gpu, **base, memory_gb=2 * h0["memory_gb"])
    for h in (more_bw, more_mem):
        _, s = frontier(h, "ideal")
        assert s["training_flop"] >= s0["training_flop"]
    # a faster accelerator: every rate doubled, its links' too, and the collectives' per-step latencies halved. On
    # the same latencies it need not hold: near the frontier the run is memory-bound (as many accelerators as the
    # model's state needs, whatever their speed), so a faster one spends a larger share of its step in latency and
    # its utilization falls below 80% of its best earlier (H100 ideal: 9.8e28 FLOP -> 5.7e28 FLOP)
    faster = hw(gpu, **base, **{k: 2 * h0[k] for k in RATES if h0.get(k)})
    quick = DEFAULT.with_(**{a: getattr(DEFAULT, a) / 2 for a in ("alpha_scaleup_s", "alpha_scaleout_s", "alpha_pcie_s")})
    sweep = frontier_sweep(faster, 3.0, params=params_for("ideal", quick), dtype=default_dtype(faster),
                           assumptions="ideal")
    assert frontier_summary(sweep, 0.8)["training_flop"] >= s0["training_flop"]


@pytest.mark.parametrize("gpu", ["h100-sxm5-80gb", "a100-sxm4-80gb"])
def test_ideal_is_at_least_realistic(gpu):
    si_sweep, si = frontier(hw(gpu), "ideal")
    sr_sweep, sr = frontier(hw(gpu), "realistic")
    assert si["training_flop"] >= sr["training_flop"]
    both = si_sweep.join(sr_sweep, on="target_flop", suffix="_r").filter(pl.col("feasible") & pl.col("feasible_r"))
    assert both.height > 20 and (both["utilization"] >= both["utilization_r"] - 1e-9).all()


def test_latency_wall_moves_with_the_batch_rule():
    h = hw("h100-sxm5-80gb")
    walls = {rule: frontier_sweep(h, 3.0, params=params_for("ideal", DEFAULT), assumptions="ideal", batch_rule=rule,
                                  flops=[1e24, 1e27, 1e30]) for rule in ("deepseek", "kaplan", "fixed")}
    c = walls["deepseek"]["training_flop"].to_numpy()
    for rule, sw in walls.items():
        assert np.array_equal(sw["training_flop"].to_numpy(), c)  # same models, only the batch differs
        # the wall is (tokens / batch ceiling) steps of one micro-batch's kernels through every layer
        expect = latency_wall_s(sw["n_layers"].to_numpy(), sw["tokens"].to_numpy(), batch_tokens(c, rule),
                                params_for("ideal", DEFAULT)) / 86400
        assert sw["latency_wall_days"].to_numpy() == pytest.approx(expect, rel=1e-12)
    # a bigger batch, fewer steps: the wall ratio is the inverse of the batch ratio (up to whole steps)
    ratio = walls["fixed"]["latency_wall_days"].to_numpy() / walls["deepseek"]["latency_wall_days"].to_numpy()
    assert ratio == pytest.approx(batch_tokens(c, "deepseek") / batch_tokens(c, "fixed"), rel=1e-3)
    # a fixed 4M-token batch puts 1e30 FLOP behind the wall for 3 months; the growing DeepSeek batch does not
    f, d = walls["fixed"].row(2, named=True), walls["deepseek"].row(2, named=True)
    assert f["binding"] == "latency" and not f["feasible"] and d["latency_wall_days"] < 3 * 30.4375
    # Kaplan's B_crit grows as C^(alpha_C / alpha_B) = C^0.238, slower than DeepSeek's C^0.3271
    k = batch_tokens(c, "kaplan")
    assert np.log(k[2] / k[0]) / np.log(c[2] / c[0]) == pytest.approx(0.050 / 0.21, rel=0.01)


def test_every_level_is_swept_and_says_what_binds():
    sweep, s = frontier(hw("h100-sxm5-80gb"), "ideal")
    assert sweep["training_flop"].min() < 2e16 and sweep["training_flop"].max() > 5e31
    assert sweep["binding"].null_count() == 0
    assert set(sweep["binding"]) <= {"compute", "bandwidth", "batch", "latency", "memory", "time"}
    assert (sweep.filter(~pl.col("feasible"))["reason"].null_count()) == 0
    ok = sweep.filter(pl.col("feasible"))
    assert (ok["n_gpus"] <= ok["n_gpus_max"]).all() and (ok["utilization"] <= 1.0 + 1e-9).all()
    assert (ok["global_batch_seqs"] * 2048 <= ok["critical_batch_tokens"] + 2048).all()
    assert (ok["global_batch_seqs"] % (ok["dp"] * ok["micro_batch"]) == 0).all()
    assert s["ended_by"] in ("bandwidth", "batch", "latency", "memory", "time")


# ------------------------------------------------------------------ CLI

def test_cli_frontier_names_assumptions_and_prints_every_level():
    from pipeline.cli import app

    r = CliRunner().invoke(app, ["frontier", "--gpu", "h100-sxm5-80gb", "--assumptions", "ideal", "--format", "json",
                                 "--table", "--scaleout-gbps", "100"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["assumptions"] == "ideal" and out["network"]["scaleout_gbps"] == 100
    assert len(out["levels"]) == 65 and all(lv["assumptions"] == "ideal" for lv in out["levels"])
    assert {lv["binding"] for lv in out["levels"]} >= {"compute", "time"}
    # the band between the batch laws, and what ends the frontier and the reach
    laws = out["batch_rules"]
    assert set(laws) == {"deepseek", "kaplan"} and laws["deepseek"]["max_training_flop"] == out["max_training_flop"]
    flops = [x["max_training_flop"] for x in laws.values()]
    assert out["batch_rule_band_flop"] == [min(flops), max(flops)]
    assert out["ended_by"] and out["ended_by_reason"] and out["largest_feasible_flop"] >= out["max_training_flop"]
    k = json.loads(CliRunner().invoke(app, ["frontier", "--gpu", "h100-sxm5-80gb", "--assumptions", "ideal",
                                            "--format", "json", "--batch-rule", "kaplan", "--scaleout-gbps",
                                            "100"]).stdout)
    assert k["max_training_flop"] == laws["kaplan"]["max_training_flop"] and k["batch_rules"] == laws
    t = CliRunner().invoke(app, ["frontier", "--gpu", "v100-sxm2-32gb", "--table"])
    assert t.exit_code == 0 and "realistic assumptions" in t.stdout and "binding" in t.stdout
    bad = CliRunner().invoke(app, ["frontier", "--gpu", "h100-sxm5-80gb", "--assumptions", "best"])
    assert bad.exit_code == 2 and "--assumptions must be one of ideal, realistic, got 'best'" in bad.output
    bad = CliRunner().invoke(app, ["frontier", "--gpu", "h100-sxm5-80gb", "--batch-rule", "huge"])
    assert bad.exit_code == 2 and "--batch-rule must be one of deepseek, kaplan, fixed" in bad.output
    bad = CliRunner().invoke(app, ["frontier", "--gpu", "h100-sxm5-80gb", "--scaleup-gbps", "-5"])
    assert bad.exit_code == 2 and "--scaleup-gbps must be a positive number" in bad.output


def test_cli_curve_under_ideal_assumptions():
    from pipeline.cli import app

    args = ["curve", "--model", "llama3-8b", "--gpu", "a100-sxm4-80gb", "--policy", "critical", "--tokens", "1e12",
            "--seq-len", "4096", "--max-gpus", "256", "--format", "json"]
    ideal = json.loads(CliRunner().invoke(app, args + ["--assumptions", "ideal", "--scaleup-size", "16"]).stdout)
    real = json.loads(CliRunner().invoke(app, args).stdout)
    assert ideal["assumptions"] == "ideal" and real["assumptions"] == "realistic"
    assert all(p["assumptions"] == "ideal" for p in ideal["points"])
    pairs = [(a["mfu"], b["mfu"]) for a, b in zip(ideal["points"], real["points"]) if a["feasible"] and b["feasible"]]
    assert pairs and all(a >= b for a, b in pairs)
    assert math.isfinite(ideal["points"][0]["tokens_per_s_per_gpu"])
