"""Layout search: feasibility, fixed dimensions, ranking."""

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.physics.hardware import resolve_hardware
from models.planning.search import enumerate_layouts, search
from models.physics.step_time import predict_arrays

ROOT = Path(__file__).resolve().parents[1] / "measurements"
LLAMA3_8B = dict(n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab=128256,
                 activation="swiglu", tied_embeddings=False)
MIXTRAL = dict(LLAMA3_8B, vocab=32000, n_experts=8, top_k=2)
GPT3 = dict(n_layers=96, d_model=12288, n_heads=96, ffn_dim=49152, vocab=51200, activation="gelu",
            tied_embeddings=True)


@pytest.fixture(scope="module")
def hw():
    df = resolve_hardware(pl.read_csv(ROOT / "hardware_specs.csv", infer_schema_length=0), strict=False)
    return {r["id"]: r for r in df.to_dicts()}


def test_search_returns_feasible_sorted_valid_layouts(hw):
    df, count = search(GPT3, hw["a100-sxm4-80gb"], 1024, 1536, 2048, top_k=20, return_count=True)
    assert count > 1000 and 0 < len(df) <= 20
    assert df["feasible"].all()
    assert (df["tp"] * df["pp"] * df["cp"] * df["dp"] == 1024).all()
    assert (1536 % (df["dp"] * df["micro_batch"]) == 0).all()
    tps = df["tokens_per_s_per_gpu"].to_numpy()
    assert (np.diff(tps) <= 1e-9).all()
    assert (df["memory_gb_per_gpu"] <= 80 * 2**30 / 1e9).all()  # an "80 GB" part holds 80 GiB (models.memory.model)


@settings(max_examples=15, deadline=None)
@given(fixed=st.fixed_dictionaries({}, optional={
    "tp": st.sampled_from([1, 2, 4, 8]),
    "pp": st.sampled_from([1, 2, 4]),
    "sharding": st.sampled_from(["none", "zero1", "fsdp", "hsdp"]),
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "micro_batch": st.sampled_from([1, 2]),
}), gpu=st.sampled_from(["h100-sxm5-80gb", "a100-sxm4-40gb", "mi300x"]))
def test_search_respects_fixed_and_never_infeasible(hw, fixed, gpu):
    df = search(LLAMA3_8B, hw[gpu], 64, 512, 4096, fixed=fixed, top_k=50)
    if df.is_empty():  # e.g. tp=pp=1 without sharding: 18 B/param x 8B params > 80 GB, nothing fits
        assert fixed.get("sharding") in ("none", None) or fixed.get("tp", 1) * fixed.get("pp", 1) == 1
        return
    for k, v in fixed.items():
        assert (df[k] == v).all(), k
    assert df["feasible"].all()
    # every returned row re-predicts identically and fits in memory
    assert (df["memory_gb_per_gpu"] <= hw[gpu]["memory_gb"] * 2**30 / 1e9).all()  # binary capacity (models.memory.model)


def test_enumerate_covers_moe_expert_parallel(hw):
    lay = enumerate_layouts(MIXTRAL, hw["h100-sxm5-80gb"], 64, 256, 4096, fixed={"tp": 2, "pp": 1})
    assert set(np.unique(lay["ep"])) >= {1, 2, 4, 8}
    assert (np.mod(lay["dp"], lay["ep"]) == 0).all()
    r = predict_arrays(lay)
    assert r["feasible"].any()
    best = search(MIXTRAL, hw["h100-sxm5-80gb"], 64, 256, 4096, top_k=1)
    assert best["feasible"][0] and best["ep_comm_s"][0] >= 0


def test_rank_by_cost_and_impossible_search(hw):
    df = search(LLAMA3_8B, hw["h100-sxm5-80gb"], 16, 256, 4096, rank_by="cost", usd_per_gpu_hour=3.0, top_k=5)
    assert (np.diff(df["gpu_s_per_mtoken"].to_numpy()) >= -1e-12).all()
    assert "usd_per_mtoken" in df.columns
    # 405B params cannot fit on one 24 GB card: empty result, not an infeasible row
    big = dict(LLAMA3_8B, n_layers=126, d_model=16384, n_heads=128, ffn_dim=53248)
    assert len(search(big, hw["rtx-4090"], 1, 8, 4096)) == 0
    with pytest.raises(ValueError):
        search(LLAMA3_8B, hw["h100-sxm5-80gb"], 16, 256, 4096, rank_by="vibes")


def test_more_gpus_never_slower_at_best_layout(hw):
    """Strong-scaling sanity: doubling GPUs at a fixed global batch does not lose more than 10 % of the
    whole-job throughput of the best layout (extra data parallelism only adds reduction cost)."""
    a = search(GPT3, hw["h100-sxm5-80gb"], 256, 1024, 2048, top_k=1)
    b = search(GPT3, hw["h100-sxm5-80gb"], 512, 1024, 2048, top_k=1)
    assert b["tokens_per_s_per_gpu"][0] * 512 >= 0.9 * a["tokens_per_s_per_gpu"][0] * 256
