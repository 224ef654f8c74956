"""Rules that decide how a fit transfers to runs it has not seen: the typical pipeline interleave of an unstated
layout (models/corpus/runs_adapter.py), the PyTorch-native kernel efficiency per hardware generation
(models/fitting/predictor.py, models/fitting/calibration.py), and the validation figures with every source weighing the same
(models/fitting/calibration.py `_metrics`, pipeline/fits.py promotion)."""

from __future__ import annotations

import dataclasses

import duckdb
import numpy as np
import polars as pl
import pytest

from models.fitting import calibration as cal
from models.fitting.predictor import GEN_KEY, NATIVE_GEN_KEY, Calibration, native_kernel_effs, predict
from models.corpus.runs_adapter import INTERLEAVES_COLUMN, TYPICAL_LAYERS_PER_CHUNK, infer_layout
from models.memory.stacks import interleaving_stacks, stack_columns
from pipeline import fits
from tests.test_one_model import _frame
from pipeline import catalog
from pipeline.settings import Settings
from tests.conftest import MEASUREMENTS as MEASUREMENTS_ROOT


# ---------------------------------------------------------------- unstated interleave

def _layout_frame(**over) -> pl.DataFrame:
    row = dict(n_gpus=256, year=2024, scaleup_size=8, tp=4, pp=8, dp=8, cp=1, ep=1, micro_batch=1, seq_len=2048,
               global_batch_seqs=512, framework="NeMo 24.07 (Megatron-Core)", vpp=None, n_layers=96,
               software_preset="default", memory_preset="megatron", assumptions=None)
    row.update(over)
    frame = pl.DataFrame([row], schema_overrides={"vpp": pl.Int64, "assumptions": pl.Utf8})
    # the stack's interleave rule, as the corpus reader writes it (models.memory.stacks)
    return frame.with_columns(pl.col("memory_preset").is_in(interleaving_stacks(catalog.stacks(MEASUREMENTS_ROOT)))
                              .alias(INTERLEAVES_COLUMN))


def test_unstated_interleave_of_a_megatron_class_pipeline_is_chunks_of_two_layers():
    out = infer_layout(_layout_frame(), catalog.stacks(MEASUREMENTS_ROOT)).row(0, named=True)
    # 96 layers / pp 8 = 12 per stage -> 6 chunks of 2 layers; 512 / 8 = 64 micro-batches, a multiple of pp
    assert TYPICAL_LAYERS_PER_CHUNK == 2 and out["vpp"] == 6
    assert "vpp=6 (interleaved in chunks of 2 layers" in out["assumptions"]


@pytest.mark.parametrize("over, why", [
    (dict(vpp=1), "stated"),
    (dict(pp=1, tp=4, dp=64), "no pipeline"),
    (dict(software_preset="pytorch_native", memory_preset="torchtitan", framework="torchtitan"), "torchtitan 1F1B"),
    (dict(software_preset="megatron_2022", memory_preset="megatron_deepspeed", framework="Megatron-DeepSpeed"),
     "DeepSpeed pipeline"),
    (dict(global_batch_seqs=8 * 12), "12 micro-batches, not a multiple of pp 8"),
    (dict(n_layers=24), "3 layers per stage: one chunk"),
])
def test_interleave_is_not_assumed_where_the_stack_or_the_batch_does_not_allow_it(over, why):
    assert infer_layout(_layout_frame(**over), catalog.stacks(MEASUREMENTS_ROOT))["vpp"][0] == 1, why


# ---------------------------------------------------------------- PyTorch-native kernel efficiency

def test_a_later_generation_without_its_own_native_kernel_efficiency_takes_the_latest_earlier_one():
    over = {NATIVE_GEN_KEY + "Hopper": {"kernel_eff": 0.6}, "pytorch_native": {"kernel_eff": 0.9}}
    assert native_kernel_effs(over) == {"Hopper": 0.6, "Blackwell": 0.6}
    assert native_kernel_effs({NATIVE_GEN_KEY + "Blackwell": {"kernel_eff": 0.7}}) == {"Blackwell": 0.7}
    assert native_kernel_effs(None) == {} and native_kernel_effs({"pytorch_native": {"kernel_eff": 0.9}}) == {}


def test_an_ampere_native_kernel_efficiency_carries_to_hopper_at_the_mma_sync_share_of_its_peak():
    """FlashAttention-3 (section 2.2): Hopper's mma.sync reaches about 2/3 of its tensor peak; the Ampere-class kernels
    of the native stacks keep their efficiency relative to that path, so an Ampere fit of 0.9 answers 0.6 on
    Hopper, and Blackwell (no published share) keeps Hopper's; a generation with its own value keeps it."""
    from models.fitting.predictor import LEGACY_MMA_SHARE, _mma_scale_note

    effs = native_kernel_effs({NATIVE_GEN_KEY + "Ampere": {"kernel_eff": 0.9}})
    assert effs["Ampere"] == 0.9 and effs["Ada"] == pytest.approx(0.9)
    assert effs["Hopper"] == pytest.approx(0.6) and effs["Blackwell"] == pytest.approx(0.6)
    both = native_kernel_effs({NATIVE_GEN_KEY + "Ampere": {"kernel_eff": 0.9},
                               NATIVE_GEN_KEY + "Hopper": {"kernel_eff": 0.7}})
    assert both["Hopper"] == 0.7 and both["Blackwell"] == pytest.approx(0.7)
    assert all(0.0 < v <= 1.0 for v in LEGACY_MMA_SHARE.values())
    assert _mma_scale_note("Ampere", "Hopper") == " x 0.67, the mma.sync share of Hopper's tensor peak"
    assert _mma_scale_note("Hopper", "Blackwell") == ""


@pytest.mark.parametrize("n_ampere, n_hopper, own, shared", [
    (40, 40, {"Ampere", "Hopper"}, False),  # each generation its own value, no shared one
    (0, 40, {"Hopper"}, False),  # Ampere rows then keep the prior: a later generation's value never goes back
    (10, 10, set(), True),  # no generation with enough runs: one value from all of them
])
def test_native_kernel_efficiency_is_fitted_per_generation(n_ampere, n_hopper, own, shared):
    from models.fitting.calibration import NATIVE, _slots

    n = n_ampere + n_hopper
    configs = pl.DataFrame({"software_preset": [NATIVE] * n, "dtype": ["bf16"] * n,
                            "gpu": ["a100-sxm4-80gb"] * n_ampere + ["h100-sxm5-80gb"] * n_hopper,
                            "generation": ["Ampere"] * n_ampere + ["Hopper"] * n_hopper})
    slots = _slots(configs)
    assert {p[len(NATIVE_GEN_KEY):] for p, f in slots if p and p.startswith(NATIVE_GEN_KEY)} == own
    assert ((NATIVE, "kernel_eff") in slots) == shared
    effs = native_kernel_effs({NATIVE_GEN_KEY + g: {"kernel_eff": 0.5} for g in own})
    assert "Ampere" not in effs or "Ampere" in own


@pytest.fixture(scope="module")
def served(built_store) -> Calibration:
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        return fits.load_promoted_fit(con)
    finally:
        con.close()


def _native_row(gpu: str, preset: str) -> pl.DataFrame:
    meas = Settings.load().measurements
    c = dict(arch=catalog.find_architecture(meas, "llama3-8b"), hw=catalog.find_hardware(meas, gpu), tp=1, pp=1,
             dp=8, micro_batch=1, global_batch=64, seq_len=4096, sharding="fsdp", recompute="none", dtype="bf16")
    return _frame(c).with_columns(pl.lit(preset).alias("software_preset"))


def test_the_native_kernel_efficiency_of_a_generation_slows_only_that_generations_native_rows(served):
    shared = float((served.preset_overrides.get("pytorch_native") or {}).get("kernel_eff", 1.0))
    base = {k: v for k, v in served.preset_overrides.items() if not k.startswith(NATIVE_GEN_KEY)}
    slow = dataclasses.replace(served, preset_overrides=base | {NATIVE_GEN_KEY + "Hopper": {"kernel_eff": shared / 2}})
    plain = dataclasses.replace(served, preset_overrides=base)
    tput = lambda gpu, preset, fit: predict(_native_row(gpu, preset), fit)["tokens_per_s_per_gpu"][0]  # noqa: E731
    for gpu in ("h100-sxm5-80gb", "b200"):  # Blackwell takes Hopper's value
        assert tput(gpu, "pytorch_native", slow) < 0.8 * tput(gpu, "pytorch_native", plain), gpu
        assert tput(gpu, "default", slow) == pytest.approx(tput(gpu, "default", plain), rel=1e-12), gpu
    assert tput("a100-sxm4-80gb", "pytorch_native", slow) == pytest.approx(
        tput("a100-sxm4-80gb", "pytorch_native", plain), rel=1e-12)


# ---------------------------------------------------------------- every source weighing the same

def test_balanced_figures_weigh_every_source_the_same():
    rel = np.array([0.01] * 10 + [0.30, 0.50])
    src = np.array(["big"] * 10 + ["b", "c"])
    m = cal._metrics(rel, src)
    assert m["mdape"] == pytest.approx(0.01) and m["mdape_balanced"] == pytest.approx(0.30)
    assert m["mape_balanced"] == pytest.approx((0.01 + 0.30 + 0.50) / 3)
    assert cal._metrics(rel)["mdape_balanced"] is None


def _oof(errors, sources, folds, scheme="loso"):
    return pl.DataFrame({"scheme": scheme, "run_id": [f"r{i}" for i in range(len(errors))], "fold": folds,
                         "log_pred": np.log1p(errors), "log_target": 0.0, "source": sources})


def test_promotion_compares_with_every_source_weighing_the_same():
    # served: the big source 2% off, two small sources 30% off; the candidate trades 1 point on the big one for
    # 20 points on each small one. Pooled over runs it is worse (3% vs 2%); with sources equal it is better.
    src = ["big"] * 20 + ["b"] * 2 + ["c"] * 2
    folds = [f"f{i % 2}" for i in range(len(src))]  # two folds alike: no fold-to-fold noise margin
    served = _oof([0.02] * 20 + [0.30] * 4, src, folds).drop("source")
    cand = _oof([0.03] * 20 + [0.10] * 4, src, folds)
    ok, reason, detail = fits.promotion_decision("v1", cand, served, None)
    assert ok, reason
    loso = detail["schemes"][0]
    assert loso["candidate_mdape"] == pytest.approx(0.10) and loso["served_mdape"] == pytest.approx(0.30)
    ok_pooled, _, _ = fits.promotion_decision("v1", cand.drop("source"), served, None)
    assert not ok_pooled


def test_every_software_preset_has_its_era_code():
    # a preset without its code was served as the default stack: PyTorch-native runs lost their fitted kernel_eff
    from models.core.domains import SOFTWARE_ERAS
    from models.fitting.predictor import ERA_CODES
    from models.core.software import PRESETS
    assert list(ERA_CODES) == list(PRESETS) == list(SOFTWARE_ERAS)
    assert [ERA_CODES[p] for p in PRESETS] == list(range(len(PRESETS)))


@pytest.mark.parametrize("n16, n8, free16, free8", [(0, 157, False, True), (40, 9, True, False), (40, 40, True, True)])
def test_a_precisions_gemm_fraction_is_fitted_only_where_its_runs_are(n16, n8, free16, free8):
    """A leave-one-precision-out fold without 16-bit runs keeps the 16-bit GEMM fraction at its prior (the LM
    heads and BF16-kept layers of low-precision runs would set it for every 16-bit run), and a fold with 9
    low-precision runs the 8-bit one: a precision needs MIN_GENERATION_RUNS // 3 = 10 runs of its own."""
    n = n16 + n8
    configs = pl.DataFrame({"software_preset": ["default"] * n, "gpu": ["h100-sxm5-80gb"] * n,
                            "generation": ["Hopper"] * n,
                            "dtype": ["bf16"] * n16 + ["fp8"] * n8, "source": ["a", "b"] * (n // 2) + ["a"] * (n % 2)})
    shared = {f for p, f in cal._slots(configs) if p is None}
    assert ("matmul_eff_16bit" in shared) == free16
    assert ("matmul_eff_8bit" in shared) == free8
    assert "attn_eff" in shared


@pytest.mark.parametrize("sources, fitted", [(["a"], False), (["a", "b"], True)])
def test_the_shared_gemm_efficiency_is_fitted_only_from_two_sources(sources, fitted):
    """The shared GEMM efficiency answers for every generation without its own: runs of one source (a
    leave-one-family-out fold trained on one source's MoE runs) tell that source's stack, not the hardware, so it is
    not fitted from them; a generation's own (Hopper, 40 runs) still is, as from a user's own cluster, and so is
    every other parameter."""
    n = 80
    configs = pl.DataFrame({"software_preset": ["default"] * n, "dtype": ["bf16", "fp8"] * (n // 2),
                            "gpu": ["a100-sxm4-80gb"] * 40 + ["h100-sxm5-80gb"] * 40,
                            "generation": ["Ampere"] * 40 + ["Hopper"] * 40,
                            "source": [sources[(i // 2) % len(sources)] for i in range(n)]})
    slots = cal._slots(configs)
    shared = {f for p, f in slots if p is None}
    assert ("matmul_eff_16bit" in shared) == fitted and ("matmul_eff_8bit" in shared) == fitted
    assert {f for p, f in slots if p == GEN_KEY + "Hopper"} == {"matmul_eff_16bit", "matmul_eff_8bit"}
    assert {"attn_eff", "gemm_ramp_flops_per_sm", "dp_overlap"} <= shared


def test_an_unseen_generation_takes_the_priors_gemm_efficiencies(served: Calibration):
    """The fit's shared GEMM efficiency is its largest generation's own (Ampere's); a generation the fit never saw
    (Ada: no run of the corpus is on an L40S or RTX 4090) is served the priors' instead, and an inside one (Ampere)
    the fitted value: the unseen row's physics equals the served model with the shared value replaced by the
    prior."""
    from models.core.params import DEFAULT

    assert "Ada" not in served.domain.generations and "Ampere" in served.domain.generations
    assert abs(served.params.matmul_eff_16bit - DEFAULT.matmul_eff_16bit) > 0.01  # else the test cannot tell
    rows = pl.concat([_native_row(g, "default") for g in ("l40s", "a100-sxm4-80gb")], how="diagonal_relaxed")
    got = predict(rows, served)["compute_s"].to_numpy()
    seen = dataclasses.replace(served, domain=dataclasses.replace(
        served.domain, generations=(*served.domain.generations, "Ada")))
    shared = predict(rows, seen)["compute_s"].to_numpy()
    faster = DEFAULT.matmul_eff_16bit > served.params.matmul_eff_16bit
    assert (got[0] < shared[0]) if faster else (got[0] > shared[0])
    assert got[1] == pytest.approx(shared[1], rel=1e-12)


@pytest.mark.parametrize("params_b, stated", [
    (7.0, {}), (1.3, {}), (70.0, {}), (0.125, {}), (7.0, {"n_layers": 32}), (13.0, {"vocab": 128256}),
    (30.0, {"n_layers": 48, "n_heads": 56})])
def test_a_dense_model_known_only_by_its_size_gets_a_shape_of_that_size(params_b, stated):
    """A row with params_b and no shape: models.planning.frontier's GPT-style shape whose parameters, counted by
    models.arch.accounting with the row's own stated fields, are within 10% of params_b; the stated fields are kept and
    the shape is in the assumptions."""
    import stepcast
    from models.arch.accounting import param_counts
    from models.corpus.runs_adapter import infer_dense_shape

    row = {"run_id": "r", "model_name": "my model", "params_b": params_b, "n_layers": None, "d_model": None,
           "n_heads": None, "ffn_dim": None, "vocab": None, "arch": None, **stated}
    frame = pl.DataFrame([row], schema_overrides={c: pl.Int64 for c in ("n_layers", "d_model", "n_heads", "ffn_dim",
                                                                       "vocab")} | {"arch": pl.Utf8})
    got = infer_dense_shape(frame).row(0, named=True)
    for k, v in stated.items():
        assert got[k] == v
    arr = {k: np.array([float(got[k] if got[k] is not None else 51200)]) for k in
           ("n_layers", "d_model", "n_heads", "ffn_dim", "vocab")}
    counted = param_counts({**arr, "activation": np.array([0.0]), "tied_embeddings": np.array([1.0])})["params"][0]
    assert abs(counted / (params_b * 1e9) - 1.0) < 0.10
    assert got["arch"] == "dense" and got["_shape_note"].startswith(f"shape from params_b={params_b:g}: ")
    runs = pl.DataFrame({"run_id": ["r"], "model_name": ["custom model"], "params_b": [str(params_b)],
                         "gpu": ["H100"], "n_gpus": ["64"], "global_batch_seqs": ["512"], "seq_len": ["2048"],
                         **{k: [str(v)] for k, v in stated.items()}})
    out = stepcast.predict_frame(runs).row(0, named=True)
    assert out["step_time_s"] is not None and f"shape from params_b={params_b:g}: " in out["assumptions"]


def test_a_size_without_a_shape_stays_refused_for_an_moe_model():
    import stepcast

    runs = pl.DataFrame({"run_id": ["moe", "dense"], "model_name": ["my moe", "my dense"], "arch": ["moe", "dense"],
                         "params_b": ["100", "7"], "gpu": ["H100"] * 2, "n_gpus": ["64"] * 2})
    out = stepcast.predict_frame(runs)
    assert out["step_time_s"][0] is None and "architecture shape unknown" in out["error"][0]
    assert out["step_time_s"][1] is not None


# ---------------------------------------------------------------- the software stack a framework name implies

@pytest.mark.parametrize("framework, year, preset", [
    ("torchtitan (FSDP2)", 2025, "pytorch_native"),
    ("nanotron", 2025, "pytorch_native"),
    ("Hugging Face Accelerate", 2024, "pytorch_native"),
    ("Colossal-AI", 2024, "pytorch_native"),
    ("DeepSpeed ZeRO-3", 2024, "pytorch_native"),      # Hugging Face models with SDPA attention (Transformers 4.36)
    ("DeepSpeed ZeRO-3", 2023, "megatron_2022"),       # before SDPA became the default: attention materialised
    ("Megatron-DeepSpeed", 2024, "megatron_2022"),     # Megatron 2021/22 layer code, whatever the year
    ("NeMo 24.07 (Megatron-Core)", 2024, "default"),   # TransformerEngine kernels
    ("MaxText", 2024, "pytorch_native"),             # XLA on a GPU: kernels outside TransformerEngine
    ("JAX + T5X", 2023, "pytorch_native"),
])
def test_a_framework_name_picks_its_kernel_stack(framework, year, preset):
    from pipeline.predict_runs import predict_frame

    frame = pl.DataFrame({"run_id": ["r"], "model_name": ["llama3-8b"], "gpu": ["H100"], "n_gpus": [64],
                          "framework": [framework], "year": [year], "seq_len": [4096], "global_batch_seqs": [256],
                          "metric": ["tokens_per_s_per_gpu"], "value": [5000.0]})
    out = predict_frame(frame, Settings.load().measurements).row(0, named=True)
    assert out["software_preset"] == preset
    assert out["tokens_per_s_per_gpu"] > 0


def test_an_xla_stack_keeps_the_reference_kernels_on_a_tpu_and_not_on_a_gpu():
    """XLA is the TPU's own compiler (the reference stack there); on an H100 it is not TransformerEngine, so the
    same MaxText row is predicted in the non-TE kernel class (its fitted kernel efficiency answers), and says so."""
    from pipeline.predict_runs import predict_frame

    def row(gpu, framework="MaxText"):
        frame = pl.DataFrame({"run_id": ["r"], "model_name": ["llama2-7b"], "gpu": [gpu], "n_gpus": [64],
                              "framework": [framework], "year": [2024], "seq_len": [4096],
                              "global_batch_seqs": [256], "sharding": ["fsdp"],
                              "metric": ["tokens_per_s_per_gpu"], "value": [5000.0]})
        return predict_frame(frame, Settings.load().measurements).row(0, named=True)

    tpu, gpu, te = row("tpu-v5p"), row("h100-sxm5-80gb"), row("h100-sxm5-80gb", "NeMo 24.07")
    assert tpu["software_preset"] == "default" and "XLA-compiled" not in (tpu["assumptions"] or "")
    assert gpu["software_preset"] == "pytorch_native" and "XLA-compiled stack on a GPU" in gpu["assumptions"]
    assert te["software_preset"] == "default" and "XLA-compiled" not in (te["assumptions"] or "")


def test_an_unstated_recompute_of_a_2021_megatron_run_is_full():
    """Narayanan et al. 2021 count activation recomputation in every result (eq. 3); selective recomputation came
    in 2022 (Korthikanti et al.): a Megatron run before 2022 that states no recompute recomputed every layer."""
    from pipeline.predict_runs import predict_frame

    def row(framework, year, recompute=None):
        frame = pl.DataFrame({"run_id": ["r"], "model_name": ["gpt3-175b"], "gpu": ["A100 80GB"], "n_gpus": [1024],
                              "framework": [framework], "year": [year], "seq_len": [2048],
                              "global_batch_seqs": [1536], "tp": [8], "pp": [8], "recompute": [recompute],
                              "metric": ["tokens_per_s_per_gpu"], "value": [1000.0]},
                             schema_overrides={"recompute": pl.Utf8})
        return predict_frame(frame, Settings.load().measurements).row(0, named=True)

    old = row("Megatron-LM", 2021)
    assert old["recompute"] == "full" and "Megatron before selective recomputation" in old["assumptions"]
    assert row("Megatron-LM", 2021, "selective")["recompute"] == "selective"  # a stated recompute wins
    assert row("Megatron-LM", 2023)["recompute"] in ("none", "selective")  # later: the cheapest that fits
    assert row("torchtitan", 2021)["recompute"] in ("none", "selective")  # not a Megatron stack
    assert old["step_time_s"] > row("Megatron-LM", 2021, "selective")["step_time_s"]  # the extra forward pass



@pytest.mark.parametrize("framework, year, tp, sp", [
    ("SomeTrainer", 2024, 8, True), (None, 2024, 8, True), (None, None, 4, True),   # an unknown stack, TP era
    ("SomeTrainer", 2022, 8, False),                                                # before sequence parallelism
    ("SomeTrainer", 2024, 1, False),                                                # no TP, nothing to shard over
    ("PyTorch FSDP (fms-fsdp)", 2024, 2, False), ("NeMo 24.07 (Megatron-Core)", 2024, 8, True)])
def test_an_unknown_stack_with_tensor_parallelism_shards_its_norm_activations_from_2023(framework, year, tp, sp):
    """Sequence parallelism with tp > 1 for a stack of unknown name from 2023 on (or no year stated: models.corpus.runs_adapter
    UNKNOWN_STACK_SP_YEAR); a known stack keeps its own rule (PyTorch FSDP's preset: never)."""
    from pipeline.predict_runs import predict_frame

    frame = pl.DataFrame({"run_id": ["r"], "model_name": ["llama3-70b"], "gpu": ["H100"], "n_gpus": [64],
                          "framework": [framework], "year": [year], "tp": [tp], "pp": [1], "seq_len": [8192],
                          "global_batch_seqs": [256], "metric": ["tokens_per_s_per_gpu"], "value": [500.0]},
                         schema_overrides={"framework": pl.Utf8, "year": pl.Int64})
    out = predict_frame(frame, Settings.load().measurements).row(0, named=True)
    assert out["sequence_parallel"] is sp and out["tokens_per_s_per_gpu"] > 0


@pytest.mark.parametrize("framework, overlap", [
    ("Megatron-Bridge 26.06", 1.0), ("NeMo 26.06.01", 1.0), ("Megatron-Bridge / NeMo 26.04 (Megatron-Core)", 0.0),
    ("Megatron-LM", None)])
def test_a_summary_row_of_another_file_takes_its_releases_recipe(framework, overlap):
    """A Megatron-Bridge summary row in a user's file (its own run id, not the corpus's mbYYMM-) takes the recipe of
    the NeMo container its framework names: Qwen3-235B-A22B on GB200 in MXFP8 overlapped its EP all-to-all in 26.06
    (measurements/recipes/a2a_overlap.csv), not in 26.04; a row naming no container is left to the physics'
    default."""
    from models.corpus.moe_recipes import resolve_a2a_overlap
    from pipeline.catalog import recipes
    from tests.conftest import MEASUREMENTS

    row = pl.DataFrame({"run_id": ["my-table-row-3"], "framework": [framework], "arch_id": ["qwen3-235b-a22b"],
                        "gpu": ["gb200"], "dtype": ["mxfp8"], "assumptions": ["realistic"]})
    out = resolve_a2a_overlap(row, recipes(MEASUREMENTS)).row(0, named=True)
    assert out["moe_a2a_overlap"] == overlap
    assert ("QWEN3_235B_A22B" in out["assumptions"]) == (overlap == 1.0)


# ---------------------------------------------------------------- FSDP under pipeline stages

def test_a_stage_that_stays_gathered_is_gathered_once_per_step_not_per_micro_batch():
    """torchtitan's FSDP with pp > 1 keeps a stage's weights gathered over the step (the memory model holds them:
    models.memory.presets ``unsharded_weights_with_pp``), so the time model gathers them once per step and the exposed
    data-parallel time does not grow with the micro-batches; a stack that reshards (PyTorch FSDP scripts without a
    pipeline schedule, preset ``pytorch_fsdp``) gathers in every micro-batch's forward and backward, so on a slow
    network four times the micro-batches cost more of it."""
    from models.physics.step_time import predict as physics

    meas = Settings.load().measurements
    base = dict(arch=catalog.find_architecture(meas, "llama3-70b"), hw=catalog.find_hardware(meas, "h100-sxm5-80gb"),
                tp=8, pp=4, dp=4, micro_batch=1, seq_len=4096, sharding="fsdp", recompute="full", dtype="bf16")

    def dp_time(preset, batch):
        f = _frame(base | {"global_batch": batch}).with_columns(pl.lit(2.0).alias("inter_node_bw_gbps"),
                                                                pl.lit(preset).alias("memory_preset"))
        f = f.with_columns(stack_columns(catalog.stacks(meas), pl.col("memory_preset")))  # the corpus reader's columns
        return physics(f)["dp_comm_exposed_s"][0]

    kept_small, kept_large = dp_time("torchtitan", 32), dp_time("torchtitan", 128)
    reshard_small, reshard_large = dp_time("pytorch_fsdp", 32), dp_time("pytorch_fsdp", 128)
    assert kept_large == pytest.approx(kept_small, rel=1e-9)
    assert reshard_large > 2.0 * reshard_small > 0.0
    assert kept_large < reshard_large


# ---------------------------------------------------------------- hardware models the fit never measured

def test_a_hardware_model_the_fit_never_measured_is_extrapolated_with_the_wider_interval(served):
    """The served fit records the hardware models of its runs; B100 (Blackwell, like the corpus's B200, GB200,
    B300 and GB300, but never measured there) keeps the fitted parameters and the Blackwell GEMM efficiencies, and
    takes q_extrapolated; the same configuration on GB200 is inside and takes q_inside."""
    from models.core.domains import Domain, hardware_code
    from models.fitting.predictor import DOMAIN_INSIDE, DOMAIN_NEW_HARDWARE, encode, predict_arrays

    assert "gb200" in served.domain.hardware and "b100" not in served.domain.hardware
    assert served.q_extrapolated > served.q_inside
    meas = Settings.load().measurements

    def one(gpu):
        c = dict(arch=catalog.find_architecture(meas, "llama3-70b"), hw=catalog.find_hardware(meas, gpu), tp=4,
                 pp=2, dp=8, micro_batch=1, global_batch=512, seq_len=8192, sharding="zero1", recompute="selective",
                 dtype="fp8")
        frame = _frame(c)
        res = predict_arrays(encode(frame), served)
        return res, predict(frame, served).row(0, named=True)

    (r300, p300), (r200, p200) = one("b100"), one("gb200")
    assert r300["domain_code"][0] == DOMAIN_NEW_HARDWARE and r200["domain_code"][0] == DOMAIN_INSIDE
    assert p300["calibration_domain"].startswith("extrapolated: hardware model not in the fit (its generation "
                                                 "Blackwell is: ")
    assert p200["calibration_domain"] == "inside"
    half = lambda p: np.log(p["step_time_hi_s"] / p["step_time_s"])  # noqa: E731
    assert half(p300) / half(p200) == pytest.approx(served.q_extrapolated / served.q_inside, rel=1e-9)
    # a fit stored before the domain recorded hardware treats every model as seen
    assert Domain().hardware_seen([hardware_code("gb300"), float("nan")]).all()
    assert not Domain.of(["Blackwell"], ["16-bit"], ["default"], [8], hardware=["GB200 "]).hardware_seen(
        [hardware_code("gb300")])[0]


def test_a_tpu_hides_its_tensor_parallel_traffic_behind_compute_and_a_gpu_does_not():
    """XLA on a TPU overlaps the TP collectives with the matmuls (models.physics.hardware.compiler_overlaps_tp): the same
    TPU configuration read as if its link were NVLink exposes the prior's TP traffic, on ICI none of it while compute
    lasts; the step is never slower for it."""
    from models.physics.hardware import LINK_CODES
    from models.physics.step_time import predict as physics

    meas = Settings.load().measurements
    c = dict(arch=catalog.find_architecture(meas, "llama3-70b"), hw=catalog.find_hardware(meas, "tpu-v5p"),
             tp=8, pp=1, dp=32, micro_batch=1, global_batch=256, seq_len=4096, sharding="fsdp", recompute="full",
             dtype="bf16")
    ici = physics(_frame(c)).row(0, named=True)
    nvl = physics(_frame(c).with_columns(pl.lit(float(LINK_CODES["nvlink"])).alias("scaleup_link_code"))).row(
        0, named=True)
    assert nvl["tp_comm_s"] > 0.05 * nvl["step_time_s"]
    assert ici["tp_comm_s"] == pytest.approx(0.0, abs=1e-12)
    assert ici["step_time_s"] < nvl["step_time_s"]


def test_a_tpu_run_before_xlas_async_collectives_keeps_its_tp_traffic_exposed():
    """PaLM's era (2022) predates the XLA async collective fusion MaxText's TPU recipes switch on from 2023: the same
    TPU run file row is read with the TP traffic exposed when it says 2022, hidden when it says 2024, and says so."""
    from pipeline.predict_runs import predict_frame

    def row(year):
        frame = pl.DataFrame({"run_id": ["r"], "model_name": ["llama2-70b"], "gpu": ["tpu-v5p"], "n_gpus": [256],
                              "framework": ["MaxText"], "year": [year], "seq_len": [4096],
                              "global_batch_seqs": [512], "tp": [8], "pp": [1], "sharding": ["fsdp"],
                              "recompute": ["full"], "metric": ["tokens_per_s_per_gpu"], "value": [500.0]})
        return predict_frame(frame, Settings.load().measurements).row(0, named=True)

    old, new = row(2022), row(2024)
    assert "TP traffic exposed (a TPU run before XLA's async collectives" in old["assumptions"]
    assert "TP traffic hidden behind the matmuls" in new["assumptions"]
    assert old["tp_comm_s"] > 0.05 * old["step_time_s"] and new["tp_comm_s"] < 0.5 * old["tp_comm_s"]
    assert new["step_time_s"] < old["step_time_s"]


def test_a_tpu_run_with_fsdp_and_no_framework_is_read_as_xla_and_predicted_as_predict_does():
    """A TPU row that names no framework but shards with FSDP is XLA's sharding, not PyTorch FSDP: it keeps the
    reference stack (sequence parallelism by the era rule, no PyTorch memory preset), so `predict --runs` and
    `predict` with the same flags give the same step (one model, one answer)."""
    import stepcast
    from pipeline.predict_runs import predict_frame

    frame = pl.DataFrame({"run_id": ["r"], "model_name": ["llama3-70b"], "gpu": ["tpu-v5p"], "n_gpus": [256],
                          "seq_len": [8192], "global_batch_seqs": [512], "micro_batch": [1], "tp": [4], "pp": [1],
                          "dp": [64], "sharding": ["fsdp"], "recompute": ["full"], "year": [2025],
                          "metric": ["tokens_per_s_per_gpu"], "value": [500.0]})
    run = predict_frame(frame, Settings.load().measurements).row(0, named=True)
    assert run["software_preset"] == "default" and "pytorch_native" not in (run["assumptions"] or "")
    one = stepcast.predict(model="llama3-70b", gpu="tpu-v5p", gpus=256, global_batch=512, seq_len=8192, tp=4, pp=1,
                           sharding="fsdp", recompute="full").row(0, named=True)
    assert run["step_time_s"] == pytest.approx(one["step_time_s"], rel=1e-9)


def test_a_native_stack_on_a_generation_without_its_own_kernel_efficiency_is_extrapolated(served):
    """torchtitan on a B200 takes Hopper's fitted PyTorch-native kernel efficiency (the corpus has no PyTorch-native
    Blackwell run): the parameter answering was not fitted there, so the row keeps it but takes the wider interval
    and says so; the same row on an H100 (its own fitted value) is inside."""
    from models.fitting.predictor import DOMAIN_INSIDE, DOMAIN_NATIVE_CARRIED, encode, native_kernel_own, predict_arrays

    assert {"Ampere", "Hopper"} <= native_kernel_own(served.preset_overrides)
    assert "Blackwell" not in native_kernel_own(served.preset_overrides)

    def one(gpu):
        frame = _native_row(gpu, "pytorch_native")
        return predict_arrays(encode(frame), served)["domain_code"][0], predict(frame, served).row(0, named=True)

    (c_b, p_b), (c_h, p_h) = one("b200"), one("h100-sxm5-80gb")
    assert c_b == DOMAIN_NATIVE_CARRIED and c_h == DOMAIN_INSIDE
    assert p_b["calibration_domain"].startswith("extrapolated: PyTorch-native kernels not fitted on Blackwell "
                                                "(Hopper's efficiency carried")
    assert p_h["calibration_domain"] == "inside"


# ------------------------------------------------- a generation's 16-bit fraction from its 8-bit one

def _gen_configs(n_ampere16: int, n_hopper16: int, n_hopper8: int, n_blackwell16: int, n_blackwell8: int):
    rows = ([("a100-sxm4-80gb", "bf16")] * n_ampere16 + [("h100-sxm5-80gb", "bf16")] * n_hopper16
            + [("h100-sxm5-80gb", "fp8")] * n_hopper8 + [("b200", "bf16")] * n_blackwell16
            + [("b200", "fp8")] * n_blackwell8)
    generation = {"a100-sxm4-80gb": "Ampere", "h100-sxm5-80gb": "Hopper", "b200": "Blackwell"}
    return pl.DataFrame({"software_preset": ["default"] * len(rows), "gpu": [g for g, _ in rows],
                         "generation": [generation[g] for g, _ in rows],
                         "dtype": [d for _, d in rows], "source": ["a", "b"] * (len(rows) // 2) + ["a"] * (len(rows) % 2)})


def _unpacked(configs: pl.DataFrame, u: float = 0.5):
    slots = cal._slots(configs)
    return slots, cal._unpack(slots, np.full(len(slots), u), cal.DEFAULT)[1]


def test_a_generation_with_its_own_8bit_fraction_only_takes_16bit_by_the_reference_generations_ratio():
    """Blackwell with 40 FP8 runs and 8 BF16 ones (too few for its own 16-bit fraction) takes its 8-bit fraction x
    Hopper's 16-bit / 8-bit (Hopper has both of its own): the device's derating shows in both precisions, the ratio
    between them is the tensor-core pipeline's."""
    slots, over = _unpacked(_gen_configs(200, 40, 40, 8, 40))
    assert (GEN_KEY + "Blackwell", "matmul_eff_16bit") not in slots  # not fitted: derived
    hop, bw = over[GEN_KEY + "Hopper"], over[GEN_KEY + "Blackwell"]
    ratio = hop["matmul_eff_16bit"] / hop["matmul_eff_8bit"]
    assert ratio != pytest.approx(1.0, abs=0.01)  # else the test could not tell the rule from a copy
    assert bw["matmul_eff_16bit"] == pytest.approx(bw["matmul_eff_8bit"] * ratio, rel=1e-12)


@pytest.mark.parametrize("counts, derived", [
    ((200, 5, 40, 8, 40), False),   # no generation with both of its own: nothing derived, the shared value answers
    ((200, 40, 40, 40, 40), False),  # Blackwell has its own 16-bit fraction: kept
    ((200, 40, 40, 8, 5), False),    # Blackwell has neither: the shared values
])
def test_no_16bit_fraction_is_derived_without_a_reference_or_over_a_generations_own(counts, derived):
    slots, over = _unpacked(_gen_configs(*counts), u=0.4)
    bw = over.get(GEN_KEY + "Blackwell", {})
    own16 = (GEN_KEY + "Blackwell", "matmul_eff_16bit") in slots
    if own16:  # its own fitted value, not the ratio's
        assert bw["matmul_eff_16bit"] == pytest.approx(cal._from_unit("matmul_eff_16bit", 0.4))
    else:
        assert ("matmul_eff_16bit" in bw) == derived


def test_the_reference_generations_fractions_move_the_derived_generations_16bit_rows():
    """The fit's Jacobian re-predicts only the parts a parameter can change: Hopper's fractions change Blackwell's
    BF16 rows through the derived 16-bit fraction, so every part is touched by them."""
    configs = _gen_configs(200, 40, 40, 8, 40)
    slots = cal._slots(configs)
    phys = cal.Physics(configs)
    phys.reference = cal._precision_reference(slots)
    assert phys.reference == GEN_KEY + "Hopper"
    assert phys.parts_touched((GEN_KEY + "Hopper", "matmul_eff_16bit")) == list(range(len(phys.parts)))


def test_a_generation_without_enough_16bit_runs_takes_the_derived_fraction():
    """A generation whose 8-bit GEMM fraction is its own but whose 16-bit one is not (too few 16-bit runs) takes
    16-bit = its 8-bit x the reference generation's 16-bit / 8-bit; one with both of its own keeps them."""
    from models.fitting.calibration import derive_16bit

    slots = [(GEN_KEY + "Hopper", "matmul_eff_16bit"), (GEN_KEY + "Hopper", "matmul_eff_8bit"),
             (GEN_KEY + "Blackwell", "matmul_eff_8bit"), (GEN_KEY + "AMD", "matmul_eff_16bit"),
             (GEN_KEY + "AMD", "matmul_eff_8bit")]
    over = {GEN_KEY + "Hopper": {"matmul_eff_16bit": 0.75, "matmul_eff_8bit": 0.60},
            GEN_KEY + "Blackwell": {"matmul_eff_8bit": 0.48}, GEN_KEY + "AMD": {"matmul_eff_16bit": 0.5,
                                                                              "matmul_eff_8bit": 0.4}}
    got = derive_16bit({k: dict(v) for k, v in over.items()}, slots)
    assert got[GEN_KEY + "Blackwell"]["matmul_eff_16bit"] == pytest.approx(0.48 * 0.75 / 0.60, rel=1e-12)
    assert got[GEN_KEY + "AMD"] == over[GEN_KEY + "AMD"] and got[GEN_KEY + "Hopper"] == over[GEN_KEY + "Hopper"]


def test_the_served_fit_answers_blackwell_bf16_with_its_own_fraction(served):
    """The second data release brought GB300 and B300 BF16 runs: Blackwell has 16-bit runs enough for its own
    16-bit fraction (not the derived one), and a B200 BF16 row is predicted with it; an Ampere row is unchanged."""
    hop, bw = served.preset_overrides[GEN_KEY + "Hopper"], served.preset_overrides[GEN_KEY + "Blackwell"]
    derived = bw["matmul_eff_8bit"] * hop["matmul_eff_16bit"] / hop["matmul_eff_8bit"]
    assert abs(bw["matmul_eff_16bit"] / derived - 1.0) > 1e-6
    shared = dataclasses.replace(served, preset_overrides={
        **served.preset_overrides, GEN_KEY + "Blackwell": {"matmul_eff_8bit": bw["matmul_eff_8bit"]}})
    tput = lambda gpu, fit: predict(_native_row(gpu, "default"), fit)["tokens_per_s_per_gpu"][0]  # noqa: E731
    own = bw["matmul_eff_16bit"] / served.params.matmul_eff_16bit
    assert tput("b200", served) / tput("b200", shared) == pytest.approx(own, rel=0.05)
    assert tput("a100-sxm4-80gb", served) == pytest.approx(tput("a100-sxm4-80gb", shared), rel=1e-12)