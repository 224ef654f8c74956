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

def test_gtx580_counterfactual_matches_epoch_ai():
    """Epoch AI, "Introducing the Distributed Training Interactive Simulator" (2024; the model of Erdil &
    Schneider-Joseph 2024, arXiv:2411.01137): with GTX 580s (3 GB, AlexNet's GPU) under ideal conditions, the
    largest run in 3 months at >= 80 % utilization is about 1e26 FLOP on about 16 million GPUs, with 1024-way data
    x 32-way pipeline x 512-way tensor parallelism. Within 3x (FLOP, GPUs) and 4x (TP, PP).

    Epoch's model ties the batch to the critical batch size of the loss reached (McCandlish et al. 2018; Kaplan et
    al. 2020), so the Kaplan rule is used here; DeepSeek's rule grows faster with compute (C^0.327 vs C^0.238)
    and allows a larger run."""
    sweep, s = frontier(gtx580_3gb(), "ideal", batch_rule="kaplan")
    assert s["found"]
    assert within(s["training_flop"], 1e26, 3.0), s["training_flop"]
    assert within(s["n_gpus"], 16e6, 3.0), s["n_gpus"]
    assert within(s["tp"], 512, 4.0) and within(s["pp"], 32, 4.0), (s["tp"], s["pp"])
    assert s["tp"] * s["pp"] * s["dp"] * s["cp"] == s["n_gpus"]
    assert s["time_to_train_days"] <= 3 * 30.4375 and s["utilization"] >= 0.8 * s["best_utilization"]
    assert s["cost_basis"].startswith("purchase") and within(s["cost_usd"], 5e9, 3.0)  # Epoch: about $5 billion
    assert (sweep["assumptions"] == "ideal").all()


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
    assert (ok["n_gpus"] <= 1_000_000_000).all() and (ok["utilization"] <= 1.0 + 1e-9).all()
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
