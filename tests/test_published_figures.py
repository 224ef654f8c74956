"""The analytical step-time model (prior parameters, Megatron-2022 preset, no calibration) against published
measurements, each at the source's own precision with the model's bias stated.

| source                                   | published figure                      | tolerance here                     |
|------------------------------------------|---------------------------------------|------------------------------------|
| vTrain (Bang et al., MICRO 2024), 109    | vTrain's own simulator: 14.7% MAPE    | MAPE < 14.7%; median ratio within  |
| multi-node runs (measured_runs.csv)      | on these runs                         | ±5%; no row > 14.7% slow           |
| Narayanan et al. SC21, GPT-3 175B on     | 140 TFLOP/s per GPU (step 31.5 s by   | step within -15% / +0%: the model  |
| 1024 A100 (t8 p8 d16, batch 1536)        | the paper's FLOP formula)             | is fast (bias stated below)        |
| Korthikanti et al. 2022 Table 5, 9 rows  | step times 1.10-94.42 s               | every row within -15% / +5%        |
| Korthikanti et al. 2022 Table 5, 175B    | full / selective recompute = 1.32     | ±10%                               |

The model predicts fast on these Megatron runs: it has no term for the per-iteration work Megatron does
outside the modelled kernels and collectives (data loading, the optimizer's non-GEMM kernels at full
precision, launch gaps), so its errors are one-sided; the bands say so instead of allowing ±20-25% both ways.
"""

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from models.arch.accounting import megatron_flops_per_iteration
from models.physics.hardware import resolve_hardware
from models.core.params import MEGATRON_2022
from models.physics.step_time import HARDWARE_COLUMNS, predict

ROOT = Path(__file__).resolve().parents[1] / "measurements"

#: vTrain (Bang et al., MICRO 2024) reports its own simulator's MAPE on the multi-node runs as 14.7%
VTRAIN_MAPE = 0.147
#: the bound on the median ratio (a systematic bias): vTrain publishes MAPE only, so this one is ours, a third
#: of vTrain's MAPE; a model uniformly 20% slow or fast fails it
VTRAIN_MEDIAN_BIAS = 0.05


@pytest.fixture(scope="module")
def hw():
    return resolve_hardware(pl.read_csv(ROOT / "hardware_specs.csv", infer_schema_length=0), strict=False)


@pytest.fixture(scope="module")
def measured():
    return pl.read_csv(ROOT / "measured_runs.csv", infer_schema_length=0).filter(pl.col("metric") == "step_time_s")


def gpt_configs(hw, rows: list[dict]) -> pl.DataFrame:
    """Megatron GPT configurations on A100-SXM4-80GB (fp16, vocab padded to 51200, seq 2048, 8 GPUs a node)."""
    a100 = hw.filter(pl.col("id") == "a100-sxm4-80gb").select(HARDWARE_COLUMNS).to_dicts()[0]
    recs = [dict(n_layers=r["L"], d_model=r["h"], n_heads=r["a"], ffn_dim=4 * r["h"], vocab=51200, activation="gelu",
                 tied_embeddings=True, seq_len=2048, global_batch_seqs=r["B"], micro_batch=r["b"], n_gpus=r["n"],
                 tp=r["t"], pp=r["p"], dp=r["d"], vpp=r.get("v", 1), recompute=r["rc"],
                 sequence_parallel=r["rc"] == "selective", sharding="none", dtype="fp16", gpus_per_node=8, **a100)
            for r in rows]
    for rec, r in zip(recs, rows):
        if r.get("net"):  # the run's own scale-out network (as a measurement's inter_node_bw_gbps)
            rec["inter_node_bw_gbps"] = r["net"]
    return pl.DataFrame(recs)


def test_vtrain_multinode_within_vtrains_own_mape(hw, measured):
    """vTrain's released multi-node ground truth: GPT 3.6B-175B on 64-512 A100, Megatron-DeepSpeed, full
    recompute (use_checkpoint=true), each run on its cluster's network as vTrain's configs state it
    (inter_node_bw_gbps, 800 Gb/s per 8-GPU node)."""
    runs = measured.filter(pl.col("source").str.starts_with("vTrain"))
    rows = [dict(L=int(r["n_layers"]), h=int(r["d_model"]), a=int(r["n_heads"]), B=int(r["global_batch_seqs"]),
                 b=int(r["micro_batch"]), n=int(r["n_gpus"]), t=int(r["tp"]), p=int(r["pp"]), d=int(r["dp"]),
                 rc="full", net=float(r["inter_node_bw_gbps"])) for r in runs.to_dicts()]
    out = predict(gpt_configs(hw, rows), MEGATRON_2022)
    ratio = out["step_time_s"].to_numpy() / runs["value"].cast(pl.Float64).to_numpy()
    assert len(ratio) == 109 and np.isfinite(ratio).all()
    # today: MAPE 8.1%, median ratio 0.997, slowest row 1.10 (fastest 0.52: a TP=16 run across nodes)
    assert np.mean(np.abs(ratio - 1)) < VTRAIN_MAPE
    assert abs(np.median(ratio) - 1) < VTRAIN_MEDIAN_BIAS
    assert ratio.max() < 1 + VTRAIN_MAPE


def test_narayanan_gpt3_175b_on_1024_gpus(hw):
    """Narayanan et al. SC21: GPT-3 175B on 1024 A100 (t8 p8 d16, batch 1536, full recompute) at 140 TFLOP/s
    per GPU, i.e. a 31.5 s step by the paper's FLOP formula. The paper prints 3 significant digits; the model
    is fast here (today 27.6 s, -12.4%: see the module docstring), so the band is -15% / +0%."""
    step_ref = float(megatron_flops_per_iteration(1536, 2048, 96, 12288, 51200)) / (1024 * 140e12)
    out = predict(gpt_configs(hw, [dict(L=96, h=12288, a=96, B=1536, b=1, n=1024, t=8, p=8, d=16, rc="full")]),
                  MEGATRON_2022)
    assert out["feasible"][0]
    assert 0.85 <= out["step_time_s"][0] / step_ref <= 1.0


KORTHIKANTI_RUNS = [  # Korthikanti et al. 2022 Table 5 via measured_runs.csv: run_id, L, h, a, B, b, n, t, p, d, v, rc
    ("korthikanti_22B_fullrecompute", 48, 6144, 64, 4, 4, 8, 8, 1, 1, 1, "full"),
    ("korthikanti_22B_present", 48, 6144, 64, 4, 4, 8, 8, 1, 1, 1, "selective"),
    ("korthikanti_175B_fullrecompute", 96, 12288, 96, 64, 1, 64, 8, 8, 1, 3, "full"),
    ("korthikanti_175B_present", 96, 12288, 96, 64, 1, 64, 8, 8, 1, 3, "selective"),
    ("korthikanti_530B_fullrecompute", 105, 20480, 128, 280, 1, 280, 8, 35, 1, 3, "full"),
    ("korthikanti_530B_present", 105, 20480, 128, 280, 1, 280, 8, 35, 1, 3, "selective"),
    ("korthikanti_1T_fullrecompute", 128, 25600, 160, 512, 1, 512, 8, 64, 1, 1, "full"),
    ("korthikanti_1T_present", 128, 25600, 160, 512, 1, 512, 8, 64, 1, 1, "selective"),
    ("korthikanti_530B_dp8_present", 105, 20480, 128, 2240, 1, 2240, 8, 35, 8, 3, "selective"),
]
#: per row: predicted / measured step time within this band. One-sided like the model's error (fast on every
#: row; today 0.87-0.99); +5% leaves room for the table's 2-decimal rounding and nothing more
KORTHIKANTI_BAND = (0.85, 1.05)
#: Korthikanti et al. 2022 Table 5, 175B: 18.13 s full recompute / 13.75 s selective = 1.32
KORTHIKANTI_SPEEDUP_175B = 18.13 / 13.75


@pytest.fixture(scope="module")
def korthikanti(hw):
    keys = ("L", "h", "a", "B", "b", "n", "t", "p", "d", "v", "rc")
    out = predict(gpt_configs(hw, [dict(zip(keys, r[1:])) for r in KORTHIKANTI_RUNS]), MEGATRON_2022)
    assert out["feasible"].all(), out["error"].to_list()
    return dict(zip([r[0] for r in KORTHIKANTI_RUNS], out["step_time_s"].to_list()))


@pytest.mark.parametrize("run_id", [r[0] for r in KORTHIKANTI_RUNS])
def test_korthikanti_step_time_per_row(korthikanti, measured, run_id):
    meas = float(measured.filter(pl.col("run_id") == run_id)["value"][0])
    lo, hi = KORTHIKANTI_BAND
    assert lo <= korthikanti[run_id] / meas <= hi, (run_id, korthikanti[run_id], meas)


def test_korthikanti_selective_recompute_speedup(korthikanti):
    """The selective-recompute speed-up over full recompute, 175B: measured 1.32, within ±10% (today 1.41,
    +7%; the other sizes, not asserted: 22B 1.44 vs 1.29, 530B 1.37 vs 1.30, 1T 1.36 vs 1.32)."""
    speedup = korthikanti["korthikanti_175B_fullrecompute"] / korthikanti["korthikanti_175B_present"]
    assert speedup == pytest.approx(KORTHIKANTI_SPEEDUP_175B, rel=0.10)
