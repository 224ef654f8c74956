"""One model, one answer: every path predicts through models.fitting.predictor with the same fit, so the same
configuration gets the same step time, interval, MFU and HFU wherever it is asked (predict, search fixed to
the layout, plan, the hardware_choice table behind v_hardware_choice)."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from models.physics.hardware import resolve_hardware
from models.fitting.predictor import BREAKDOWN, Calibration, Predictor, predict, predict_arrays
from models.planning.search import search
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
        parts = sum(p[k] for k in BREAKDOWN)
        assert parts == pytest.approx(p["step_time_s"], rel=1e-9)
        steps_pred.append(p["tokens_per_s_per_gpu"])
        steps_search.append(r["tokens_per_s_per_gpu"])
    assert len(steps_pred) >= 100
    assert list(np.argsort(steps_pred, kind="stable")) == list(np.argsort(steps_search, kind="stable"))


def test_arrays_and_frame_front_ends_are_one_function(fit):
    configs = pl.concat([_frame(c) for c in _random_configs(60, seed=1)], how="diagonal_relaxed")
    from models.fitting.predictor import encode

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
    assert "--gpus 8 is not divisible by tp 3 x pp 1 x cp 1 = 3" in res.output
    res = runner.invoke(app, ["predict", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "8",
                              "--global-batch", "64", "--seq-len", "4096", "--dp", "4"])
    assert res.exit_code == 2 and "tp 1 x pp 1 x cp 1 x dp 4 = 4 is not --gpus 8" in res.output


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
    from models.physics.step_time import predict as physics

    rows = [_frame(c) for c in _random_configs(40, seed=3)]
    dense = pl.concat(rows, how="diagonal_relaxed").filter(pl.col("n_experts").fill_null(0) == 0)
    moe = pl.concat(rows, how="diagonal_relaxed").filter(pl.col("n_experts").fill_null(0) > 0)
    assert dense.height >= 10 and moe.height >= 1
    alone = physics(dense)
    mixed = physics(pl.concat([dense, moe], how="diagonal_relaxed")).head(dense.height)
    for col in ("step_time_s", "dp_comm_exposed_s", "memory_gb_per_gpu"):
        a, b = alone[col].to_numpy(), mixed[col].to_numpy()
        assert np.array_equal(a, b, equal_nan=True), col


# hybrid Mamba-Transformer rows (models.arch.mamba) and MLA/MTP rows (models.arch.mla): search, curve, frontier and plan pass the
# model every architecture column predict passes (models.physics.step_time.encode_arch). Before, search modelled a hybrid as
# a plain transformer (nemotron-h-8b: 12.4 B parameters instead of 8.1 B) and ranked Jamba layouts at cp = 2, which
# predict refuses (Mamba-1 has no context-parallel model).
LAYOUT_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch", "sharding", "recompute", "sequence_parallel",
               "tp_mode")


@pytest.mark.parametrize("model, gpu, dtype, gpus, batch, seq, params_b", [
    ("nemotron-h-8b", "h100-sxm5-80gb", "bf16", 64, 512, 8192, 8.10),
    ("nemotron-3-nano", "h100-sxm5-80gb", "bf16", 64, 512, 8192, 31.58),
    ("jamba-v0.1", "h100-sxm5-80gb", "bf16", 64, 512, 8192, 51.57),
    ("deepseek-v3", "h100-sxm5-80gb", "bf16", 256, 1024, 4096, 671.0),
    # the recipe keeps 14 blocks in BF16 (models.core.precision), which predict applies by default
    ("nemotron-3-super", "b200", "nvfp4", 64, 512, 8192, 120.67),
])
def test_search_ranks_what_predict_predicts_for_hybrid_and_mla_rows(model, gpu, dtype, gpus, batch, seq, params_b):
    """The top layouts of `stepcast search`, re-predicted with `stepcast predict`'s function, give the same step time,
    memory, parameter count and MFU (rel 1e-9); the parameter count is the hybrid's block-by-block count."""
    from pipeline import api

    cfg = Settings.load()
    res, _, arch, _ = api.layout_search(cfg, model=model, gpu=gpu, gpus=gpus, global_batch=batch, seq_len=seq,
                                        dtype=dtype, top=4)
    assert res.height == 4
    for r in res.iter_rows(named=True):
        layout = {k: r[k] for k in LAYOUT_KEYS if r.get(k) is not None}
        if not float(arch.get("n_experts") or 0):
            layout.pop("etp", None)
        p = api.prediction(cfg, model=model, gpu=gpu, gpus=gpus, global_batch=batch, seq_len=seq, dtype=dtype,
                           **layout).row(0, named=True)
        for col in ("step_time_s", "memory_gb_per_gpu", "params", "active_params", "mfu", "tokens_per_s_per_gpu"):
            assert p[col] == pytest.approx(r[col], rel=1e-9), (col, layout)
        assert r["params"] == pytest.approx(params_b * 1e9, rel=2e-3)


def test_search_never_ranks_layouts_the_hybrid_model_refuses():
    """Jamba's Mamba-1 mixers have no context-parallel model: no feasible layout has cp > 1 (and fixing cp = 2
    finds none); Nemotron-H's Mamba-2 mixers split heads and groups over tp (8 groups: tp 16 is refused although it
    divides the 32 attention heads)."""
    from pipeline import api

    meas = Settings.load().measurements
    hw = resolve_hardware(pl.DataFrame([catalog.find_hardware(meas, "h100-sxm5-80gb")]), strict=False).row(0, named=True)
    jamba = catalog.find_architecture(meas, "jamba-v0.1")
    every = search(jamba, hw, 64, 512, 8192, top_k=10**9, dedupe=False)
    assert every.height > 100 and every["cp"].max() == 1
    assert search(jamba, hw, 64, 512, 8192, fixed={"cp": 2}, top_k=5).height == 0
    with pytest.raises(api.NoResult):
        api.layout_search(Settings.load(), model="jamba-v0.1", gpu="h100-sxm5-80gb", gpus=64, global_batch=512,
                          seq_len=8192, cp=2)
    nem = catalog.find_architecture(meas, "nemotron-h-8b")
    every = search(nem, hw, 64, 512, 8192, top_k=10**9, dedupe=False)
    tps = set(every["tp"].to_list())
    assert tps and all(nem["mamba_n_groups"] % t == 0 and nem["mamba_n_heads"] % t == 0 for t in tps)
    assert search(nem, hw, 64, 512, 8192, fixed={"tp": 16}, top_k=5).height == 0


def test_curve_counts_a_hybrids_parameters_block_by_block():
    """`stepcast curve`'s default token budget is 20 x the parameters predict counts (8.10 B for Nemotron-H 8B, not
    the 12.4 B of its transformer-only reading)."""
    from pipeline import api

    doc, _ = api.scaling_curve(Settings.load(), gpu="h100-sxm5-80gb", model="nemotron-h-8b", seq_len=8192,
                               max_gpus=64)
    assert doc["tokens"] == pytest.approx(20 * 8.10e9, rel=2e-3)


def test_search_refuses_a_hybrid_predict_refuses(tmp_path):
    """A hybrid row whose table shape is incomplete (Nemotron 3 Super without moe_latent_size) is refused by search
    with the same reason as predict, not ranked on a wrong model."""
    row = pl.read_csv(Settings.load().measurements / "architectures.csv", infer_schema_length=0).filter(
        pl.col("id") == "nemotron-3-super").drop("moe_latent_size").with_columns(pl.lit("super-no-latent").alias("id"))
    row.write_csv(tmp_path / "super.csv")
    res = runner.invoke(app, ["search", "--arch-file", str(tmp_path / "super.csv"), "--gpu", "gb200", "--gpus", "64",
                              "--global-batch", "512", "--seq-len", "8192"])
    assert res.exit_code == 2 and "moe_latent_size" in res.output and "120 B" in res.output
