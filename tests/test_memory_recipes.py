"""One test per memory rule a measured run's settings state (measurements/recipes/run_memory.csv, the torchtune row of
measurements/stacks.csv; docs/memory.md): the recipe row reaches the run's configuration, and the model option it sets
moves the prediction by the bytes the rule says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from models.arch.accounting import layer_shapes, normalize_arch
from models.core.params import Recompute
from models.corpus.recipes import recipe_run_memory
from models.memory.model import MemoryOptions, memory_inputs, memory_per_gpu
from models.memory.stacks import framework_preset
from pipeline import catalog

MEASUREMENTS = Path(__file__).resolve().parents[1] / "measurements"
# Llama 3.2 3B (the torchtune runs' model)
ARCH = dict(n_layers=28, d_model=3072, n_heads=24, n_kv_heads=8, ffn_dim=8192, vocab=128256)
S, B = 4096, 2


@pytest.fixture(scope="module")
def recipes():
    return catalog.recipes(MEASUREMENTS)


def _mem(options: MemoryOptions = MemoryOptions(), **lay):
    ar = normalize_arch({k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in ARCH.items()})
    layout = dict(seq_len=S, micro_batch=B, n_micro=1) | lay
    x = memory_inputs(ar, **{k: np.atleast_1d(v) for k, v in layout.items()})
    return memory_per_gpu(x, layer_shapes(ar), options=options)


def _frame(source, run_id, **cols):
    base = dict(source=[source], run_id=[run_id], assumptions=[None], optimizer_bytes=[None], grad_bytes=[None],
                logits_bytes=[None], act_offload_frac=[None], sequence_parallel=[True])
    return pl.DataFrame(base | {k: [v] for k, v in cols.items()},
                        schema_overrides={c: pl.Float64 for c in ("optimizer_bytes", "grad_bytes", "logits_bytes",
                                                                   "act_offload_frac")} | {"assumptions": pl.Utf8})


def test_run_rows_reach_only_their_run(recipes):
    out = recipe_run_memory(pl.concat([
        _frame("torchtune-readme", "torchtune-a100-llama3.2-3b-fft-adamw8bit"),
        _frame("torchtune-readme", "not-a-listed-run"),
        _frame("other-source", "torchtune-a100-llama3.2-3b-fft-adamw8bit")]), recipes)
    r = out.row(0, named=True)
    assert (r["optimizer_bytes"], r["grad_bytes"], r["logits_bytes"], r["act_offload_frac"]) == (2.0, 0.0, 2.25, 1.0)
    assert "the run's settings" in r["assumptions"]
    for i in (1, 2):  # another run, or the same run id of another source: untouched
        r = out.row(i, named=True)
        assert r["optimizer_bytes"] is None and r["grad_bytes"] is None and r["assumptions"] is None


def test_sequence_parallel_row_turns_it_off(recipes):
    out = recipe_run_memory(_frame("megatron-lm-ci-golden", "mlm-ci-gpt3_7b_tp4_pp1_memory_speed-h100"), recipes)
    assert out["sequence_parallel"].to_list() == [False]


def test_torchtune_word_names_the_torchtune_stack(recipes):
    st = recipes.stacks
    got = pl.DataFrame({"framework": ["torchtune full_finetune_single_device"], "year": [2024]}).select(
        framework_preset(st, "framework", "year"))
    assert got.item() == "torchtune"
    row = st.stacks["torchtune"]
    assert (row.grad_bytes, row.optimizer_bytes, row.logits_bytes) == (2.0, 4.0, 12.0)


def test_optimizer_bytes_rule_bf16_adamw_and_8bit_adamw():
    """torchtune: bf16 AdamW 4 B per parameter (no master), 8-bit AdamW 2 B: the difference is 2 B x parameters."""
    four = _mem(MemoryOptions(optimizer_bytes=np.array([4.0])))
    two = _mem(MemoryOptions(optimizer_bytes=np.array([2.0])))
    n = float(four["optimizer_params_local"][0])
    assert float(four["mem_optimizer_bytes"][0] - two["mem_optimizer_bytes"][0]) == pytest.approx(2.0 * n)


def test_optimizer_in_backward_rule_holds_no_gradients():
    none = _mem(MemoryOptions(grad_bytes=np.array([0.0])))
    two = _mem(MemoryOptions(grad_bytes=np.array([2.0])))
    assert float(none["mem_grads_bytes"][0]) == 0.0
    assert float(two["mem_total_bytes"][0]) > float(none["mem_total_bytes"][0])


def test_logits_rule_compiled_loss_keeps_4_bytes_per_element():
    """torchtitan's compiled loss: 4 B per logit element instead of the eager 12 B: 8 B x tokens x vocab less."""
    eager = _mem(MemoryOptions(logits_bytes=np.array([12.0])))
    compiled = _mem(MemoryOptions(logits_bytes=np.array([4.0])))
    diff = float(eager["mem_activations_bytes"][0] - compiled["mem_activations_bytes"][0])  # logits with them
    assert diff == pytest.approx(8.0 * S * B * ARCH["vocab"], rel=1e-6)


def test_activation_offload_rule_frees_the_checkpoints():
    kept = _mem(recompute=np.array([Recompute.FULL]))
    off = _mem(MemoryOptions(act_offload_frac=np.array([1.0])), recompute=np.array([Recompute.FULL]))
    assert float(off["mem_total_bytes"][0]) < float(kept["mem_total_bytes"][0])


def test_no_sequence_parallel_rule_keeps_the_replicated_activations_whole():
    """Korthikanti et al. 2022: tp without SP keeps 10 s b h per layer whole on every rank (34/t with SP)."""
    sp = _mem(tp=4, sequence_parallel=np.array([True]))
    nosp = _mem(tp=4, sequence_parallel=np.array([False]))
    assert float(nosp["mem_activations_bytes"][0]) > float(sp["mem_activations_bytes"][0])
