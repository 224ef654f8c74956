"""Recipe facts that decide whether measured runs fit: a NeMo Framework Launcher recipe's optimizer (bf16 Adam state,
16-bit gradient buffer: measurements/recipes/optimizer.csv) and the latent MoE's dispatch width
(models.memory.model.moe_dispatch_elems). Each of the runs ran, so each must fit once its recipe's settings apply."""

from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from models.arch.accounting import layer_shapes, normalize_arch
from models.memory.model import (memory_inputs, memory_per_gpu, module_recompute_savings, moe_dispatch_elems,
                                 recompute_modules_code)
from models.core.params import DEFAULT

from pipeline.catalog import recipes, stacks
from tests.conftest import MEASUREMENTS

memory_options = stacks(MEASUREMENTS).memory_options  # a stack's memory values (measurements/stacks.csv)

NEMOTRON4_340B = dict(n_layers=96, d_model=18432, n_heads=96, n_kv_heads=8, ffn_dim=73728, vocab=256000,
                      activation=0, tied_embeddings=0)  # measurements/architectures.csv nemotron-4-340b


def _nemotron_340b(**extra):
    """Nemotron-4 340B as the NeMo 24.07 run lays it out: tp 8, pp 8, dp 2, distributed optimizer (zero1)."""
    ar = normalize_arch({k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in NEMOTRON4_340B.items()})
    one = lambda x: np.array([float(x)])  # noqa: E731
    x = memory_inputs(ar, seq_len=one(4096), micro_batch=one(1), n_micro=one(16), tp=one(8), pp=one(8), dp=one(2),
                      vpp=one(12), sharding=np.array([1]), recompute=np.array([1]), sequence_parallel=np.array([True]))
    return memory_per_gpu(x, layer_shapes(ar), DEFAULT,
                          replace(memory_options(np.array(["megatron"]), pp=one(8)), **extra))


def test_bf16_adam_without_master_copy_and_16bit_gradient_buffer():
    """apex DistributedFusedAdam with dtype = grad_sync_dtype = bf16 and no stored parameters: per parameter the
    16-bit weight 2 B, the whole gradient buffer 2 B and m + v 2 + 2 B over the data-parallel group (dp 2), so
    weights = gradients = optimizer state; the preset's Megatron states are 2 + 4 + 12 / 2 (fp32 main_grad, fp32
    master + m + v)."""
    base = _nemotron_340b()
    nfl = _nemotron_340b(optimizer_bytes=np.array([4.0]), grad_bytes=np.array([2.0]))
    w = base["mem_weights_bytes"][0]
    assert nfl["mem_weights_bytes"][0] == w
    assert nfl["mem_grads_bytes"][0] == pytest.approx(w) and base["mem_grads_bytes"][0] == pytest.approx(2 * w)
    assert nfl["mem_optimizer_bytes"][0] == pytest.approx(w) and base["mem_optimizer_bytes"][0] == pytest.approx(3 * w)
    assert nfl["mem_activations_bytes"][0] == base["mem_activations_bytes"][0]
    # 5.77 B parameters per GPU (340 B / tp 8 / pp 8 with the embedding on the first stage): 34.6 GB of states
    assert 3 * w / 1e9 == pytest.approx(34.6, abs=0.3)


def test_nan_row_values_keep_the_preset_and_params():
    """A NaN row value (no recipe) leaves the preset's gradient bytes and PhysParams' 12 B optimizer state."""
    base = _nemotron_340b()
    nan = _nemotron_340b(optimizer_bytes=np.array([np.nan]), grad_bytes=np.array([np.nan]))
    for k in ("mem_grads_bytes", "mem_optimizer_bytes", "mem_total_bytes"):
        assert nan[k][0] == base[k][0]


def test_latent_moe_dispatches_latent_wide_copies():
    """Nemotron 3 Super (h 4096, top-22, moe_latent_size 1024): 22 dispatched copies of 1024 plus the combined
    latent output fc2_latent_proj keeps, 2 x 1024 x 23 bytes per token, against 2 x 4096 x 22 at full width; rows
    without a latent (or not hybrid) keep 2 h k."""
    hy = {"hybrid": np.array([True, True, False]), "moe_latent_size": np.array([1024.0, np.nan, 1024.0])}
    got = moe_dispatch_elems(4096.0, 22.0, hy)
    assert list(got) == [2.0 * 1024 * 23, 2.0 * 4096 * 22, 2.0 * 4096 * 22]
    assert moe_dispatch_elems(4096.0, 22.0) == 2.0 * 4096 * 22
    # moe recompute (the whole MoE layer checkpointed) stops storing the latent copies, not full-width ones
    code = np.array([recompute_modules_code(["moe"])])
    one = np.array([1.0])
    _, full = module_recompute_savings(code, 4096.0, 32.0, 0.0, 2688.0, 22.0, 0.0, 4.0, one, 0 * one, 2.0)
    _, lat = module_recompute_savings(code, 4096.0, 32.0, 0.0, 2688.0, 22.0, 0.0, 4.0, one, 0 * one, 2.0,
                                      dispatch=got[:1])
    assert full[0] - lat[0] == pytest.approx(2.0 * 4096 * 22 - 2.0 * 1024 * 23)


def test_recipe_tables_name_their_sources():
    for (arch, task, container), (rc, ob, gb, src) in recipes(MEASUREMENTS).optimizer.items():
        assert rc in ("none", "selective", "full") and 0 < ob < 12 and gb in (2.0, 4.0)
        assert "NeMo-Framework-Launcher" in src and f"({container};" in src and "apex" in src, (arch, task)


# ---- the four measured runs the memory model called over capacity ---------------------------------------------------
FITS_WITH_RECIPE = {
    # run_id: (what its assumptions must say, recompute, micro_batch)
    "nemo2407-h100-nemotron-340b-pretrain-128gpu-gbs32": (
        "training/nemotron/nemotron_340b.yaml", "selective", 1),
    "nemo2407-h100-llama2-70b-sft-16gpu-gbs32": ("peft/llama/sft.yaml", "none", 1),
    "mb2604-pre-training-nemotron-3-super-b200-64gpu-mxfp8-gbs512": ("recompute_modules=['moe_act', 'layernorm']",
                                                                      "selective", 1),
    "mb2511-pre-training-gpt-oss-120b-h100-64gpu-bf16-gbs512": (
        "micro_batch=1 (the row's 4 is another system's", "selective", 1),
}


@pytest.mark.parametrize("run_id", sorted(FITS_WITH_RECIPE))
def test_measured_run_fits_with_its_recipe(corpus, run_id):
    """Before: 95.5, 102.8, 213.7 and 108.1 GB against 85.9 / 193.3 GB (bf16 Adam state and 16-bit gradients
    missing for the two NeMo 24.07 runs, full-width MoE dispatch copies for Nemotron 3 Super's latent MoE, the
    summary's MBS 4 for GPT-OSS 120B on H100)."""
    r = corpus.filter(pl.col("run_id") == run_id).row(0, named=True)
    says, rc, mb = FITS_WITH_RECIPE[run_id]
    assert says in r["assumptions"]
    assert r["recompute"] == rc and r["micro_batch"] == mb
    assert r["memory_fits"], (run_id, r["memory_gb_per_gpu"], r["memory_capacity_gb"])

