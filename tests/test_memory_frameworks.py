"""Framework memory presets (models/memory/presets.py) against published memory figures and the stacks' source code."""

from dataclasses import fields, replace

import numpy as np
import polars as pl
import pytest

from models.arch.accounting import layer_shapes, normalize_arch, param_counts
from models.memory.presets import finetune_mode, lora_trainable_frac, reported_memory_gb, source_interleave
from models.memory.stacks import (
    framework_preset,
    pipeline_micro_batch,
    preset_table,
    sequence_parallel_default,
    stack_columns,
    stack_memory_options,
    stage_gathered,
)
from models.memory.model import CAPACITY_BYTES_PER_GB, MemoryOptions, capacity_bytes, memory_inputs, memory_per_gpu
from models.core.params import DEFAULT
from models.corpus.recipes import source_layout
from pipeline.catalog import recipes, stacks
from tests.conftest import MEASUREMENTS

GIB = 2.0**30
STACKS = stacks(MEASUREMENTS)
memory_options = STACKS.memory_options
LLAMA31 = {  # Llama 3.1 configs (meta-llama params.json): layers, d_model, heads, kv heads, ffn, vocab
    "8b": (32, 4096, 32, 8, 14336, 128256),
    "70b": (80, 8192, 64, 8, 28672, 128256),
    "405b": (126, 16384, 128, 8, 53248, 128256),
}


def _arch(L, h, a, kv, ffn, V, act=1, tied=0):
    d = dict(n_layers=L, d_model=h, n_heads=a, n_kv_heads=kv, ffn_dim=ffn, vocab=V, activation=act,
             tied_embeddings=tied)
    ar = normalize_arch({k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in d.items()})
    return ar, layer_shapes(ar)


def _mem(ar, sh, *, preset=None, s, b=1, m=1, tp=1, pp=1, dp=1, cp=1, vpp=1, sharding=4, rc=2, sp=None, **extra):
    options = memory_options(np.array([preset]), pp=np.array([pp])) if preset else MemoryOptions()
    one = lambda x: np.array([float(x)])  # noqa: E731
    x = memory_inputs(ar, seq_len=one(s), micro_batch=one(b), n_micro=one(m), tp=one(tp), pp=one(pp), dp=one(dp),
                      cp=one(cp), vpp=one(vpp), sharding=np.array([sharding]), recompute=np.array([rc]),
                      sequence_parallel=np.array([tp > 1 if sp is None else sp]), node_size=one(8))
    return memory_per_gpu(x, sh, DEFAULT, replace(options, **extra))


# pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Grand Teton H100 96 GB, seq 8192 unless stated):
# the published Memory(GiB) is the peak memory the caching allocator reserved, i.e. the live bytes the model counts
# plus the allocator's slack; the model must lie within [0.75, 1.0] of it. Layouts as the tables state them; the
# pipeline tables split the local batch into pp micro-batches (torchtitan's default n_microbatches).
TORCHTITAN_TABLES = [
    # id, model, seq, micro_batch, n_micro, tp, pp, dp(FSDP), cp, recompute (1 selective op, 2 full), GiB
    ("T1 FSDP 8 GPUs", "8b", 8192, 2, 1, 1, 1, 8, 1, 1, 82.4),
    ("T3 FSDP 128 GPUs", "8b", 8192, 2, 1, 1, 1, 128, 1, 1, 67.0),
    ("T2 FSDP 8 CP 1, seq 32768", "8b", 32768, 1, 1, 1, 1, 8, 1, 2, 83.9),
    ("T2 FSDP 1 CP 8, seq 262144", "8b", 262144, 1, 1, 1, 1, 1, 8, 2, 84.5),
    ("T4 2D FSDP 32 TP 8", "70b", 8192, 16, 1, 8, 1, 32, 1, 2, 71.9),
    ("T5 3D 1F1B FSDP 8 TP 8 PP 8", "405b", 8192, 4, 8, 8, 8, 8, 1, 2, 82.5),
    ("T6 4D FSDP 8 CP 1, seq 32768", "405b", 32768, 1, 8, 8, 8, 8, 1, 2, 75.3),
]


@pytest.mark.parametrize("case", TORCHTITAN_TABLES, ids=[c[0] for c in TORCHTITAN_TABLES])
def test_torchtitan_published_peak_memory_within_25pct_below(case):
    _, model, s, b, m, tp, pp, dp, cp, rc, gib = case
    ar, sh = _arch(*LLAMA31[model])
    got = _mem(ar, sh, preset="torchtitan", s=s, b=b, m=m, tp=tp, pp=pp, dp=dp, cp=cp, rc=rc)["mem_total_bytes"][0]
    assert 0.75 <= got / GIB / gib <= 1.0


def test_torchtitan_fsdp_8_vs_128_gpus_difference_is_the_sharded_states():
    """Tables 1 and 3 differ only in the FSDP degree (8 vs 128 GPUs): 82.4 - 67.0 = 15.4 GiB; within 15 %."""
    ar, sh = _arch(*LLAMA31["8b"])
    t1, t3 = (_mem(ar, sh, preset="torchtitan", s=8192, b=2, dp=d, rc=1)["mem_total_bytes"][0] for d in (8, 128))
    assert (t1 - t3) / GIB == pytest.approx(15.4, rel=0.15)


# Korthikanti et al. 2022, Table 3 configurations (seq 2048, micro-batch 1 except 22B at 4, TP 8)
KORTHIKANTI_MODELS = [  # name, heads, hidden, layers, pp
    ("22B", 64, 6144, 48, 1),
    ("175B", 96, 12288, 96, 8),
    ("530B", 128, 20480, 105, 35),
    ("1T", 160, 25600, 128, 64),
]


@pytest.mark.parametrize("model", KORTHIKANTI_MODELS, ids=[m[0] for m in KORTHIKANTI_MODELS])
def test_korthikanti_sequence_parallel_plus_selective_cuts_activations_5x(model):
    """Korthikanti et al. 2022 abstract: sequence parallelism + selective recompute 'reduce activation memory by
    5x' against tensor parallelism alone (their Fig. 7 across 22B-1T); within 25 %, with the Megatron preset."""
    _, a, h, L, p = model
    ar, sh = _arch(L, h, a, a, 4 * h, 51200, act=0, tied=1)
    from models.core.params import MEGATRON_2022  # Korthikanti's accounting: scores materialised, dropout masks kept

    def acts(sp, rc):
        one = lambda x: np.array([float(x)])  # noqa: E731
        x = memory_inputs(ar, seq_len=one(2048), micro_batch=one(1), n_micro=one(p), tp=one(8), pp=one(p),
                          sharding=np.array([1]), recompute=np.array([rc]), sequence_parallel=np.array([sp]))
        return memory_per_gpu(x, sh, MEGATRON_2022, memory_options(np.array(["megatron"]), pp=np.array([p])))[
            "mem_activations_bytes"][0]

    ratio = acts(False, 0) / acts(True, 1)
    assert ratio == pytest.approx(5.0, rel=0.25)


def test_korthikanti_175b_first_stage_activations_megatron_preset():
    """175B, t8 p8 (Table 3), SP + selective: the first stage holds L (1 + 0) layers' worth (eq. 5, v = 1) of
    s b h 34/t = 2048 x 12288 x 96 x 34/8 bytes = 10.27 GB, within 1 %."""
    ar, sh = _arch(96, 12288, 96, 96, 49152, 51200, act=0, tied=1)
    from models.core.params import MEGATRON_2022
    one = lambda x: np.array([float(x)])  # noqa: E731
    x = memory_inputs(ar, seq_len=one(2048), micro_batch=one(1), n_micro=one(64), tp=one(8), pp=one(8),
                      sharding=np.array([1]), recompute=np.array([1]), sequence_parallel=np.array([True]))
    mem = memory_per_gpu(x, sh, MEGATRON_2022, memory_options(np.array(["megatron"]), pp=np.array([8])))
    assert mem["mem_activations_bytes"][0] == pytest.approx(2048 * 12288 * 96 * 34 / 8, rel=0.01)


@pytest.mark.parametrize("sharding,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_fig1_with_deepspeed_zero_preset(sharding, expected_gb):
    """Rajbhandari et al. 2020 Fig. 1 / section 3: 7.5B parameters, 64-way data parallel, K = 12: model states of
    120 / 31.4 / 16.6 / 1.9 GB per GPU for baseline / P_os / P_os+g / P_os+g+p, from the deepspeed_zero preset
    (2-byte gradients) - within 2 %, scaled to this architecture's exact parameter count."""
    ar, sh = _arch(36, 4096, 32, 32, 16384, 51200, act=0, tied=1)
    mem = _mem(ar, sh, preset="deepspeed_zero", s=2048, dp=64, sharding=sharding, rc=0)
    psi = param_counts(ar)["params"][0]
    states = mem["mem_weights_bytes"] + mem["mem_grads_bytes"] + mem["mem_optimizer_bytes"]
    if sharding == 3:  # ZeRO-3 also keeps two gathered layers as prefetch buffers (not in the paper's figure)
        states = states - 2 * 2 * (sh["attn_matmul"] + sh["attn_bias"] + sh["norm_params"] + sh["dense_mlp_matmul"]
                                   + sh["mlp_bias"])
    assert states[0] / 1e9 == pytest.approx(expected_gb * psi / 7.5e9, rel=0.02)


def test_op_sac_stores_the_torchtitan_save_list():
    """torchtitan op SAC on Llama 3.1 8B, t = 1: block input h + wq q + wv kv + w1 F + w2 h + SDPA output q, 2 bytes
    each = 2 (4096 + 4096 + 1024 + 14336 + 4096 + 4096) = 63,488 bytes per token per layer, plus once the rest of
    one layer's working set recomputed in its backward (139,264 - 63,488: Korthikanti's 8h + 4q + 4kv + 6F without
    dropout masks); logits left out."""
    ar, sh = _arch(*LLAMA31["8b"])
    mem = _mem(ar, sh, preset="torchtitan", s=8192, rc=1, sharding=0, logits_bytes=np.array([0.0]))
    assert mem["mem_activations_bytes"][0] == pytest.approx((63488 * 32 + 139264 - 63488) * 8192, rel=1e-9)


def test_op_sac_between_full_and_no_recompute():
    ar, sh = _arch(*LLAMA31["70b"])
    act = [_mem(ar, sh, preset="torchtitan", s=8192, tp=8, dp=4, rc=rc)["mem_activations_bytes"][0] for rc in (0, 1, 2)]
    assert act[0] > act[1] > act[2]


def test_default_arguments_keep_the_model_unchanged():
    """memory_options('default') reproduces the model without any preset option, for every output."""
    ar, sh = _arch(*LLAMA31["70b"])
    for rc in (0, 1, 2):
        a = _mem(ar, sh, s=4096, tp=4, pp=2, m=8, dp=8, rc=rc, sharding=1)
        b = _mem(ar, sh, preset="default", s=4096, tp=4, pp=2, m=8, dp=8, rc=rc, sharding=1)
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=0, atol=0)


def test_lora_keeps_frozen_weights_without_grads_or_optimizer_state():
    """NeMo/Megatron-Bridge LoRA (rank 32 on linear_qkv, linear_proj, linear_fc1, linear_fc2) on Llama 3 70B trains
    80 x 32 x ((8192+8192+2048) + (8192+8192) + (8192+57344) + (28672+8192)) = 0.3 % of 70.6B parameters."""
    ar, sh = _arch(*LLAMA31["70b"])
    psi = param_counts(ar)["params"][0]
    frac = lora_trainable_frac(80, 8192, 8192, 1024, 28672, 1, psi)
    assert frac * psi == pytest.approx(80 * 32 * (18432 + 16384 + 65536 + 36864))
    full = _mem(ar, sh, preset="megatron", s=4096, tp=2, pp=4, m=32, sharding=1, rc=2)
    lora = _mem(ar, sh, preset="megatron", s=4096, tp=2, pp=4, m=32, sharding=1, rc=2, trainable_frac=np.array([frac]))
    assert lora["mem_weights_bytes"][0] == full["mem_weights_bytes"][0]
    assert lora["mem_grads_bytes"][0] + lora["mem_optimizer_bytes"][0] < 0.01 * (
        full["mem_grads_bytes"][0] + full["mem_optimizer_bytes"][0])


def test_torchtitan_pp_keeps_the_stage_gathered():
    """With pp > 1 torchtitan's FSDP keeps the stage's bf16 weights and unsharded fp32 gradients: +6 B per stage
    parameter (TP-local) over the sharded layout."""
    ar, sh = _arch(*LLAMA31["405b"])
    pp = _mem(ar, sh, preset="torchtitan", s=8192, b=4, m=8, tp=8, pp=8, dp=8, rc=2)
    plain = _mem(ar, sh, s=8192, b=4, m=8, tp=8, pp=8, dp=8, rc=2)
    stage = pp["dense_params_local"][0]
    extra = (pp["mem_weights_bytes"] + pp["mem_grads_bytes"] - plain["mem_weights_bytes"] - plain["mem_grads_bytes"])[0]
    prefetch = 2 * 2 * (sh["attn_matmul"] + sh["norm_params"] + sh["dense_mlp_matmul"])[0] / 8
    assert extra == pytest.approx(6 * stage - prefetch, rel=1e-9)


def test_capacity_is_binary_like_nvidia_smi():
    """nvidia-smi memory.total: A100-SXM4-80GB 81920 MiB, A100-SXM4-40GB 40960 MiB."""
    assert capacity_bytes(80.0) == 81920 * 2**20
    assert capacity_bytes(40.0) == 40960 * 2**20
    assert CAPACITY_BYTES_PER_GB > 1e9


def test_capacity_fraction_allowance_scales_with_the_device():
    ar, sh = _arch(24, 2048, 16, 16, 8192, 50368, act=0, tied=1)
    small, big = (_mem(ar, sh, s=2048, rc=0, sharding=0, capacity_gb=np.array([c]),
                       overhead_frac_of_capacity=np.array([0.0125]))["mem_overhead_bytes"][0] for c in (1.5, 80.0))
    assert big - small == pytest.approx(0.0125 * (80.0 - 1.5) * CAPACITY_BYTES_PER_GB)


# ---- words -> presets ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("framework,year,preset", [
    ("torchtitan (PyTorch FSDP2/DTensor)", 2024, "torchtitan"),
    ("llm-foundry / Composer (PyTorch FSDP)", 2023, "llm_foundry"),
    ("Megatron-Bridge / NeMo 26.06 (Megatron-Core)", 2026, "megatron_bridge"),
    ("NeMo 24.07 (Megatron-Core)", 2024, "megatron"),
    # NeMo 2 performance recipes, container 24.12 on: grad_reduce_in_fp32 = False (16-bit gradient buffers)
    ("NeMo 24.12", 2024, "megatron_bridge"), ("NeMo 25.02 (Megatron-Core)", 2025, "megatron_bridge"),
    ("NeMo Framework 25.04.01", 2025, "megatron_bridge"), ("NeMo 24.03.01 (Megatron-Core)", 2024, "megatron"),
    ("NVIDIA NeMo Framework Release 24.09", 2024, "megatron"),  # MLPerf's own implementation
    ("PyTorch NVIDIA Release 23.09", 2023, "megatron"),
    ("Megatron-LM", 2021, "megatron_deepspeed"),
    ("Megatron-DeepSpeed", 2024, "megatron_deepspeed"),
    ("maxtext", 2024, "jax_spmd"),
    ("PAX", 2023, "jax_spmd"),
    ("PyTorch FSDP (fms-fsdp)", 2024, "pytorch_fsdp"),
    ("MegaScale (Megatron-LM based)", 2024, "megatron"), ("MegaScale", 2024, "megatron"),
    ("GPT-NeoX", 2023, "megatron_deepspeed"),
    ("PyTorch 2.1.1", 2024, "default"),
    (None, None, "default"),
])
def test_framework_words_map_to_presets(framework, year, preset):
    df = pl.DataFrame({"framework": [framework], "year": [year]}, schema={"framework": pl.Utf8, "year": pl.Int64})
    assert df.select(framework_preset(STACKS, "framework", "year"))["memory_preset"][0] == preset


def test_stack_names_and_row_columns_give_the_same_arguments():
    names = np.array(["torchtitan", "megatron", "nonsense", "llm_foundry"])
    by_name = memory_options(names, pp=np.array([8, 8, 8, 1]))
    cols = pl.DataFrame({"p": names}).select(stack_columns(STACKS, pl.col("p")))  # as the corpus reader writes them
    by_row = stack_memory_options({c: cols[c].to_numpy() for c in cols.columns}, pp=np.array([8, 8, 8, 1]))
    for f in fields(MemoryOptions):
        np.testing.assert_array_equal(getattr(by_name, f.name), getattr(by_row, f.name))
    assert by_name.logits_bytes.tolist() == [12.0, 6.0, 4.0, 4.0]  # unknown -> default
    # with pp > 1 torchtitan and an unknown stack keep the stage gathered (when they shard it: FSDP), Megatron does not
    assert by_name.fsdp_unsharded_stage.tolist() == [True, False, True, False]


def test_every_preset_names_its_source():
    t = preset_table(STACKS)
    assert set(t["memory_preset"]) == set(STACKS.ids)
    assert t["source"].str.len_chars().min() > 40


def test_source_words_for_lora_capacity_and_micro_batches():
    df = pl.DataFrame({"model_name": ["LLAMA3_70B LoRA", "Llama 3 70B", None],
                       "gpu_as_reported": ["H100-HBM2e-96GB", "A100-40GB", "H100"]})
    out = df.select(finetune_mode("model_name"), reported_memory_gb("gpu_as_reported"))
    assert out["finetune_mode"].to_list() == ["lora", "full", "full"]
    assert out["reported_memory_gb"].to_list() == [96.0, 40.0, None]
    mb = pl.DataFrame({"p": ["torchtitan", "torchtitan", "megatron"], "mb": [32, 16, 4], "pp": [8, 1, 8],
                       "vpp": [None, None, None]}, schema_overrides={"vpp": pl.Int64})
    got = mb.select(pipeline_micro_batch(STACKS, pl.col("p"), pl.col("mb"), pl.col("pp"), pl.col("vpp")))["micro_batch"]
    assert got.to_list() == [4, 16, 4]
    sp = pl.DataFrame({"p": ["torchtitan", "llm_foundry", "megatron_deepspeed"], "tp": [8, 8, 8]})
    assert sp.select(sequence_parallel_default(STACKS, pl.col("p"), pl.col("tp"), otherwise=pl.lit(True)))[
        "sequence_parallel"].to_list() == [True, False, True]


def test_source_layout_fills_from_siblings_then_stack_defaults():
    runs = pl.DataFrame({
        "run_id": ["a", "b", "c", "d", "e", "f"],
        "source": ["mlperf"] * 5 + ["other"],
        "arch_id": ["gpt3"] * 6,
        "framework": ["NeMo", "NeMo", "PyTorch NVIDIA Release 23.09", "maxtext", "PyTorch 2.1.1", "NeMo"],
        "gpu": ["h100", "h100", "h100", "tpu-v5p", "gaudi2", "h100"],
        "tp": [4, 4, None, None, None, None], "pp": [8, 8, None, None, None, None],
        "sharding": ["zero1", "zero1", None, None, None, None], "year": [2023] * 6,
    }, schema_overrides={"tp": pl.Int64, "pp": pl.Int64, "sharding": pl.Utf8})
    out = source_layout(runs, recipes(MEASUREMENTS)).sort("run_id")
    assert out["tp"].to_list() == [4, 4, 4, 1, 8, None]
    assert out["pp"].to_list() == [8, 8, 8, 1, 8, None]
    assert out["sharding"].to_list() == ["zero1", "zero1", None, "fsdp", "none", None]
    rules = out["layout_rule"].to_list()
    assert rules[0] is None and "same source" in rules[2] and "MaxText" in rules[3] and "Habana" in rules[4]
    assert rules[5] is None


def test_source_interleave_takes_the_same_sources_vpp_for_the_same_stage_split_only():
    """MLPerf v3.0 states vpp 12 for GPT-3 at tp 4 x pp 8; v3.1 rows of the same configuration leave it out."""
    runs = pl.DataFrame({
        "run_id": ["v30", "v31", "v31-tp8", "v31-pp1", "stated", "elsewhere"],
        "source": ["mlperf"] * 5 + ["other"],
        "arch_id": ["gpt3"] * 6,
        "framework": ["NeMo"] * 6, "year": [2023] * 6,
        "tp": [4, 4, 8, 4, 4, 4], "pp": [8, 8, 8, 1, 8, 8], "vpp": [12, None, None, None, 2, None],
    }, schema_overrides={"vpp": pl.Int64})
    out = source_interleave(runs, STACKS).sort("run_id")
    got = dict(zip(out["run_id"], out["vpp"]))
    assert got == {"v30": 12, "v31": 12, "v31-tp8": None, "v31-pp1": None, "stated": 2, "elsewhere": None}
    assert dict(zip(out["run_id"], out["vpp_from_source"]))["v31"] is True
    assert sum(out["vpp_from_source"]) == 1


def test_maxtext_remat_policies_order_as_documented():
    """MaxText docs (guides, 'Provided Remat policies'): minimal, save_dot_with_context_except_mlp,
    save_dot_except_mlpwi, save_dot_except_mlp, save_qkv_proj, ..., full run from highest to lowest HBM usage."""
    from models.memory.model import MAXTEXT_REMAT
    ar, sh = _arch(*LLAMA31["8b"])
    order = ["minimal", "save_dot_with_context_except_mlp", "save_dot_except_mlpwi", "save_dot_except_mlp",
             "save_qkv_proj"]
    acts = [_mem(ar, sh, s=8192, rc=1, selective_policy=np.array([MAXTEXT_REMAT[w]]),
                 logits_bytes=np.array([0.0]))["mem_activations_bytes"][0] for w in order]
    acts.append(_mem(ar, sh, s=8192, rc=2, logits_bytes=np.array([0.0]))["mem_activations_bytes"][0])
    assert all(a >= b for a, b in zip(acts, acts[1:])) and acts[0] > acts[-2] > acts[-1]
    # save_qkv_proj: layer input h + q + k + v = 4096 + 4096 + 2 x 1024 elements of 2 bytes per token per layer,
    # plus once the recomputed rest of one layer's working set (139,264 bytes per token in all)
    saved = 2 * (4096 + 4096 + 2048)
    assert acts[4] == pytest.approx((saved * 32 + 139264 - saved) * 8192)


def test_remat_words():
    from models.memory.presets import remat_words
    df = pl.DataFrame({"w": ["full", "save_dot_except_mlp", "none", "unknown", None]})
    out = df.select(remat_words("w")).unnest("remat")
    assert out["recompute"].to_list() == ["full", "selective", "none", None, None]
    assert out["selective_policy"].to_list() == [None, 4, None, None, None]


def test_a_nemo_2_performance_run_keeps_16_bit_gradients_and_fits():
    """DGX Cloud's NeMo 25.02 recipe for Llama 3.1 8B on one H100 node (dp 4 x cp 2, no recompute) ran; with the
    fp32 gradient buffer of NeMo 1.x it would need 16 GB more (8e9 x 2 B) and not fit 80 GB, with NeMo 2's bf16
    buffer it fits."""
    from pipeline.predict_runs import predict_frame
    from pipeline.settings import Settings

    def row(framework):
        frame = pl.DataFrame({"run_id": ["r"], "model_name": ["Llama 3.1 8B"], "gpu": ["h100-sxm5-80gb"],
                              "n_gpus": [8], "seq_len": [8192], "global_batch_seqs": [128], "micro_batch": [1],
                              "tp": [1], "pp": [1], "cp": [2], "dp": [4], "recompute": ["none"], "dtype": ["bf16"],
                              "framework": [framework], "year": [2025],
                              "metric": ["tokens_per_s_per_gpu"], "value": [10256.0]})
        return predict_frame(frame, Settings.load().measurements).row(0, named=True)

    nemo1, nemo2 = row("NeMo 24.07 (Megatron-Core)"), row("NeMo 25.02")
    # 2 bytes per parameter, with the allocator's fragmentation allowance on top (models.core.params)
    assert nemo1["memory_gb_per_gpu"] - nemo2["memory_gb_per_gpu"] == pytest.approx(
        8.03e9 * 2 / 1e9 * (1 + DEFAULT.mem_fragmentation_frac), rel=0.01)
    assert nemo2["memory_fits"] and not nemo1["memory_fits"]



def test_unnamed_stack_with_fsdp_and_pp_keeps_the_stage_gathered():
    """A stack the adapter does not name (memory preset `default`) that runs FSDP with pp > 1 does what the stacks
    that run the two together do (PyTorch's pipelining, Meta's Llama 3 4D parallelism): one all-gather of the stage
    per step, not two per micro-batch; the memory model holds the stage gathered, as torchtitan's preset does."""
    from models.physics.step_time import predict_arrays

    assert stage_gathered(STACKS.row_arrays(np.array(["default", "default", "megatron"])), np.array([8, 1, 8])
                          ).tolist() == [True, False, False]
    row = dict(n_layers=126.0, d_model=16384.0, n_heads=128.0, n_kv_heads=8.0, ffn_dim=53248.0, vocab=128256.0,
               activation=1.0, seq_len=8192.0, global_batch_seqs=2048.0, micro_batch=1.0, n_gpus=8192.0, tp=8.0,
               pp=16.0, dp=64.0, cp=1.0, vpp=1.0, sharding=3, recompute=0, dtype=0, peak_fp32_tflops=66.9,
               peak_tf32_tflops=494.7, peak_bf16_tflops=989.4, peak_fp16_tflops=989.4, peak_fp8_tflops=1978.9,
               memory_gb=80.0, memory_bw_gbps=3350.0, intra_node_bw_gbps=450.0, inter_node_bw_gbps=50.0,
               gpus_per_node=8.0, scaleup_size=8.0)
    a = {k: np.atleast_1d(np.asarray(v)) for k, v in row.items()}
    once = predict_arrays({**a, **STACKS.row_arrays(np.array(["default"]))}, DEFAULT)
    every = predict_arrays({**a, **STACKS.row_arrays(np.array(["pytorch_fsdp"]))}, DEFAULT)
    assert once["dp_comm_exposed_s"][0] < 0.1 * every["dp_comm_exposed_s"][0]
    assert once["step_time_s"][0] < every["step_time_s"][0]
    assert once["memory_gb_per_gpu"][0] > every["memory_gb_per_gpu"][0]
