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
from models.memory.model import (MemoryOptions, eager_block_elems, memory_inputs, memory_per_gpu,
                                 recompute_modules_code)
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


# ---- unfused attention, module lists without core_attn, eager blocks, per-layer AC (run_memory.csv) ------------------
def _layers(arch=ARCH):
    return arch["n_layers"]


def test_unfused_attention_rows_reach_their_runs(recipes):
    """attention_score_bytes / 5 (Korthikanti's 5 B per score element) becomes the run's `attn_scores_stored`:
    2 B without attention dropout (the MoE proxy), 5 B with Megatron-LM's default attention dropout 0.1."""
    out = recipe_run_memory(pl.concat([
        _frame("megatron-lm-ci-golden", "mlm-ci-moe-tp2pp2ep4-mla-memory_speed-h100"),
        _frame("megatron-lm-ci-golden", "mlm-ci-gpt3_mcore_te_tp1_pp1_dist_optimizer_no_mmap_bin_files-h100"),
        _frame("megatron-lm-ci-golden", "mlm-ci-gpt3_mcore_te_tp2_pp2_cp2-h100")]), recipes)  # flash: no row
    assert out["attn_scores_stored"].to_list() == [pytest.approx(0.4), pytest.approx(1.0), None]
    assert "attention_score_bytes=2" in out["assumptions"][0]


def test_unfused_attention_rule_stores_the_score_matrices():
    """Per layer and micro-batch an unfused core keeps share x 5 a s^2 b / t bytes (Korthikanti's 5as/h term)."""
    flash = _mem()
    unfused = _mem(MemoryOptions(attn_scores_stored=np.array([0.4])))
    diff = float(unfused["mem_activations_bytes"][0] - flash["mem_activations_bytes"][0])
    assert diff == pytest.approx(0.4 * 5.0 * ARCH["n_heads"] * S * S * B * _layers(), rel=1e-9)
    tp2 = _mem(MemoryOptions(attn_scores_stored=np.array([0.4])), tp=2, sequence_parallel=np.array([True]))
    tp2_flash = _mem(tp=2, sequence_parallel=np.array([True]))
    assert float(tp2["mem_activations_bytes"][0] - tp2_flash["mem_activations_bytes"][0]) == pytest.approx(diff / 2)
    # NaN: PhysParams' value (0, fused attention): the same as no option
    nan = _mem(MemoryOptions(attn_scores_stored=np.array([np.nan])))
    assert float(nan["mem_total_bytes"][0]) == pytest.approx(float(flash["mem_total_bytes"][0]))


def test_selective_recompute_row_names_its_modules(recipes):
    out = recipe_run_memory(_frame("megatron-lm-ci-golden", "mlm-ci-moe-tp2pp2ep4-mla-selective_recompute-h100"),
                            recipes)
    assert out["recompute_modules"].to_list() == [float(recompute_modules_code(
        ["layernorm", "mla_up_proj", "mlp", "moe_act"]))]


def test_module_list_without_core_attn_keeps_the_scores():
    """Megatron-Core checkpoints the core attention only when recompute_modules names core_attn: a selective row
    with another list stores the scores as recompute = none does; with core_attn, or without a list, it drops them."""
    sel = dict(recompute=np.array([Recompute.SELECTIVE]))
    scores = 1.0 * 5.0 * ARCH["n_heads"] * S * S * B * _layers()
    for mods, kept in ((["mlp"], True), (["core_attn", "mlp"], False)):
        code = np.array([float(recompute_modules_code(mods))])
        flash = _mem(MemoryOptions(recompute_modules=code), **sel)
        unfused = _mem(MemoryOptions(recompute_modules=code, attn_scores_stored=np.array([1.0])), **sel)
        diff = float(unfused["mem_activations_bytes"][0] - flash["mem_activations_bytes"][0])
        assert diff == pytest.approx(scores if kept else 0.0, abs=1.0), mods
    plain = _mem(MemoryOptions(attn_scores_stored=np.array([1.0])), **sel)  # no list: Korthikanti's selective
    assert float(plain["mem_activations_bytes"][0]) == pytest.approx(float(_mem(**sel)["mem_activations_bytes"][0]))


def test_eager_and_layer_ac_rows_reach_their_runs(recipes):
    out = recipe_run_memory(pl.concat([
        _frame("torchao-docs", "ao-f8nc-h100-llama3-8b-seq4k-sac-layer2-bf16-eager"),
        _frame("torchao-docs", "ao-f8nc-h100-llama3-8b-seq4k-sac-layer2-fp8-compile"),
        _frame("torchao-docs", "ao-f8nc-h100-llama3-8b-seq4k-noac-fp8-compile")]), recipes)  # compiled, no AC: none
    assert out["eager_block"].to_list() == [1.0, None, None]
    assert out["checkpointed_layer_share"].to_list() == [0.5, 0.5, None]


def test_eager_block_rule_keeps_the_upcasts_and_copies():
    """torchtitan's eager Llama block: + 8 h replicated (two RMSNorms' fp32 input and normalized value) and
    4 (q - kv) + 2 q + 2 F sharded (repeated K/V, the attention output twice, silu's output) bytes per token."""
    assert eager_block_elems(4096.0, 1024.0, 14336.0, True) == (8.0, 4.0 * 3072 + 2.0 * 4096 + 2.0 * 14336)
    compiled = _mem()
    eager = _mem(MemoryOptions(eager_block=np.array([1.0])))
    h, q = ARCH["d_model"], ARCH["n_heads"] * ARCH["d_model"] / ARCH["n_heads"]
    kv = ARCH["n_kv_heads"] * ARCH["d_model"] / ARCH["n_heads"]
    ar = normalize_arch({k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in ARCH.items()})
    gated = float(np.ravel(layer_shapes(ar)["mlp_mats"])[0] > 2)  # ARCH gives no activation: GeLU's 2 matrices
    per_token = 8.0 * h + 4.0 * (q - kv) + 2.0 * q + 2.0 * ARCH["ffn_dim"] * gated
    diff = float(eager["mem_activations_bytes"][0] - compiled["mem_activations_bytes"][0])
    assert diff == pytest.approx(per_token * S * B * _layers(), rel=1e-9)
    off = _mem(MemoryOptions(eager_block=np.array([0.0])))
    assert float(off["mem_total_bytes"][0]) == pytest.approx(float(compiled["mem_total_bytes"][0]))


def test_per_layer_ac_rule_checkpoints_every_nth_block():
    """torchtitan selective_ac_option = 2: half the blocks keep their checkpoint (2 s b h), half store everything,
    and one checkpointed block's working set lives in its backward: between full AC and none."""
    sel = dict(recompute=np.array([Recompute.SELECTIVE]))
    none = float(_mem()["mem_activations_bytes"][0])
    full = float(_mem(recompute=np.array([Recompute.FULL]))["mem_activations_bytes"][0])
    half = float(_mem(MemoryOptions(checkpointed_layer_share=np.array([0.5])), **sel)["mem_activations_bytes"][0])
    logits = 4.0 * S * B * ARCH["vocab"]
    layer = (none - logits) / _layers()  # one layer's stored bytes without AC
    ckpt = 2.0 * ARCH["d_model"] * S * B
    assert half == pytest.approx(_layers() / 2 * (layer + ckpt) + layer + logits, rel=1e-9)
    assert full < half < none + layer
