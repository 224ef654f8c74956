"""What a training stack's words mean for per-GPU memory: named, sourced presets (pure data + polars expressions).

The same word means different bytes in different stacks. "selective" recompute is the attention core only in
Megatron-LM/NeMo (Korthikanti et al. 2022) but a matmul-output save list in torchtitan; gradients are fp32
``main_grad`` buffers in Megatron-LM but 2-byte partitions in the ZeRO paper's accounting; llm-foundry's loss never
materialises fp32 logits; torchtitan with pipeline parallelism keeps each stage's weights gathered. Each preset
below fixes these choices for one stack, with the source of every value, and ``memory_options`` turns a column of
preset names into the ``models.memory.model.MemoryOptions`` of ``memory_per_gpu``.

Mapping from a source's words: ``framework_preset(framework, year)`` (the ``framework`` column as the source wrote
it), ``finetune_mode(model_name)`` (LoRA runs), ``reported_memory_gb(gpu_as_reported)`` (a capacity the source
states, e.g. torchtitan's Grand Teton "H100-HBM2e-96GB" that the hardware table maps to the 80 GB SKU) and
``source_layout(runs)`` (a layout a source leaves unstated: the one it states for the same model elsewhere, else the
stack's documented default) and ``source_interleave(runs)`` (a pipeline interleave a source leaves unstated: the
one it states for the same model and stage split elsewhere).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np
import polars as pl

from models.memory.model import (
    MAXTEXT_REMAT,
    SELECTIVE_ATTENTION_CORE,
    SELECTIVE_OP_SAC,
    MemoryOptions,
    recompute_modules_code,
)


@dataclass(frozen=True)
class MemoryPreset:
    """Memory-relevant behaviour of one training stack: what ``memory_options`` gives
    ``models.memory.model.MemoryOptions``, and the layout defaults the runs adapter reads (sequence parallelism,
    sharding, FSDP with pipeline parallelism)."""

    selective_policy: int  # what recompute = "selective" stores (models.memory.model SELECTIVE_* codes)
    grad_bytes: float  # bytes per gradient element held during accumulation, 16-bit runs
    logits_bytes: float  # bytes per logit element the loss keeps for backward
    logits_chunks: float  # token chunks the loss runs over (1 = whole micro-batch at once)
    act_offload_frac: float  # share of stored layer activations offloaded to host memory
    sequence_parallel_with_tp: bool | None  # tp > 1 implies sequence parallelism; None: the preset does not say
    unsharded_weights_with_pp: bool  # FSDP keeps stage weights gathered and grads unsharded when pp > 1
    default_sharding: str  # sharding when the source states none (models.core.params.SHARDING_CODES)
    source: str
    # low-precision GEMMs keep their quantized input for backward (Transformer Engine Linear/LayerNormLinear/
    # GroupedLinear: models.core.precision.SAVED_GEMM_INPUT_BYTES); False where the stack's FP8 keeps 16-bit inputs or is
    # unknown (torchao Float8Linear saves the high-precision input and weight for its backward casts)
    quantized_saves: bool = False


#: Megatron-LM / Megatron-Core / NeMo / Megatron-Bridge.
_MEGATRON = MemoryPreset(
    selective_policy=SELECTIVE_ATTENTION_CORE,
    grad_bytes=4.0, logits_bytes=6.0, logits_chunks=1.0, act_offload_frac=0.0,
    sequence_parallel_with_tp=True, unsharded_weights_with_pp=False, default_sharding="zero1",
    quantized_saves=True,
    source="--recompute-granularity selective checkpoints the core attention only (Korthikanti et al. 2022, "
           "section 5; Megatron-Core TransformerConfig recompute_granularity='selective' -> core_attention). "
           "Gradients: megatron/training/arguments.py, 'bfloat16 requires gradient accumulation and all-reduce "
           "to be done in fp32' (accumulate_allreduce_grads_in_fp32 forced on for --bf16; NeMo 2 bf16_mixed "
           "grad_reduce_in_fp32=True) -> 4-byte main_grad buffers. Loss: vocab_parallel_cross_entropy works in "
           "place on an fp32 copy of the vocab-parallel logits (calculate_logits_max: .float()), next to the bf16 "
           "logits (forward) or the bf16 cast of its gradient (backward): 6 B/element, V/t per GPU. Distributed "
           "optimizer = zero1 (data card); sequence parallelism with TP (Korthikanti et al. 2022).",
)


PRESETS: dict[str, MemoryPreset] = {
    "megatron": _MEGATRON,
    # Megatron-DeepSpeed (BLOOM, vTrain, Habana MLPerf GPT-3): Megatron 2021/2022 layer code under DeepSpeed.
    "megatron_deepspeed": MemoryPreset(
        selective_policy=SELECTIVE_ATTENTION_CORE,
        grad_bytes=4.0, logits_bytes=6.0, logits_chunks=1.0, act_offload_frac=0.0,
        sequence_parallel_with_tp=None, unsharded_weights_with_pp=False, default_sharding="zero1",
        source="Megatron-DeepSpeed keeps Megatron-LM's arguments.py bf16 rule (fp32 gradient accumulation); "
               "--checkpoint-activations-granularity=selective is Megatron's attention-core checkpoint "
               "(HabanaAI/Model-References MLPERF3.0 gpt3/run_gpt.sh). Sequence parallelism arrived with its 2023 "
               "rebase on Megatron-LM and the sources do not say whether their runs used it: None (the caller's "
               "rule stays).",
    ),
    # pytorch/torchtitan (FSDP2 + DTensor TP/PP/CP).
    "torchtitan": MemoryPreset(
        selective_policy=SELECTIVE_OP_SAC,
        grad_bytes=4.0, logits_bytes=12.0, logits_chunks=1.0, act_offload_frac=0.0,
        sequence_parallel_with_tp=True, unsharded_weights_with_pp=True, default_sharding="fsdp",
        source="torchtitan/parallelisms/parallelize_llama.py: selective_ac_option='op' saves mm outputs except "
               "every second, SDPA and reduce_scatter outputs (models.memory.model.SELECTIVE_OP_SAC); 'full' wraps each "
               "TransformerBlock in checkpoint_wrapper (block input only); apply_tp puts SequenceParallel on "
               "attention_norm/ffn_norm/norm and shards the output layer's logits over the vocabulary (loss "
               "parallel); apply_fsdp uses reshard_after_forward=False when pp is enabled, and "
               "torch.distributed.pipelining's stage calls set_requires_gradient_sync(last_backward), so a PP stage "
               "accumulates unsharded gradients (upcast to reduce_dtype fp32) over its micro-batches; "
               "MixedPrecisionPolicy reduce_dtype fp32 on fp32 sharded parameters -> 4-byte gradients. Loss: "
               "train.py cross_entropy(pred.float()): bf16 logits 2 B + fp32 copy 4 B + fp32 log-softmax 4 B in "
               "the forward; in backward the saved log-softmax 4 B + its gradient 4 B + the input gradient 4 B "
               "= 12 B per logit element at the peak.",
    ),
    # mosaicml/llm-foundry on Composer (PyTorch FSDP1).
    "llm_foundry": MemoryPreset(
        selective_policy=SELECTIVE_ATTENTION_CORE,
        grad_bytes=4.0, logits_bytes=4.0, logits_chunks=1.0, act_offload_frac=0.0,
        sequence_parallel_with_tp=False, unsharded_weights_with_pp=False, default_sharding="fsdp",
        source="llm-foundry ComposerMPTCausalLM: loss_fn defaults to 'fused_crossentropy' = "
               "flash_attn.losses.cross_entropy.CrossEntropyLoss, a fused kernel on the bf16 logits that keeps no "
               "fp32 copy: the saved bf16 logits 2 B + their bf16 gradient 2 B = 4 B/element at the peak (per-row "
               "log-sum-exp only). FSDP1 FULL_SHARD with fp32 flat parameters: "
               "sharded fp32 gradients. activation_checkpointing = per-block (full).",
    ),
    # PyTorch FSDP training scripts (IBM fms-fsdp, Llama recipes): eager cross-entropy on fp32 logits.
    "pytorch_fsdp": MemoryPreset(
        selective_policy=SELECTIVE_ATTENTION_CORE,
        grad_bytes=4.0, logits_bytes=12.0, logits_chunks=1.0, act_offload_frac=0.0,
        sequence_parallel_with_tp=False, unsharded_weights_with_pp=False, default_sharding="fsdp",
        source="PyTorch FSDP MixedPrecision: sharded parameters and their gradients stay fp32 (4 B); "
               "torch.nn.functional.cross_entropy under autocast runs in fp32: the same op sequence as torchtitan's "
               "loss, 12 B per logit element at the backward peak.",
    ),
    # JAX/XLA SPMD stacks: AI-Hypercomputer/maxtext and google/paxml (TPU and GPU).
    "jax_spmd": MemoryPreset(
        selective_policy=SELECTIVE_ATTENTION_CORE,
        grad_bytes=4.0, logits_bytes=4.0, logits_chunks=1.0, act_offload_frac=0.0,
        sequence_parallel_with_tp=False, unsharded_weights_with_pp=False, default_sharding="fsdp",
        source="MaxText/configs/base.yml: ici_fsdp_parallelism: -1 ('recommended ICI axis to be auto-sharded': "
               "every chip of the slice shards parameters, gradients and optimizer state), weight_dtype float32 "
               "(fp32 gradients). remat_policy 'full' = the decoder layer input only (as Megatron full). Paxml "
               "(paxml/tasks/lm/params/c4.py, C4SpmdGpt3AdamOrgHP*): ICI_MESH_SHAPE [replica, data, mdl], "
               "weights and optimizer state sharded over data x mdl (e.g. [1, 256, 12] on 3,072 chips).",
    ),
    # DeepSpeed ZeRO as accounted by Rajbhandari et al. 2020 (16-bit gradients, K = 12 optimizer bytes).
    "deepspeed_zero": MemoryPreset(
        selective_policy=SELECTIVE_ATTENTION_CORE,
        grad_bytes=2.0, logits_bytes=4.0, logits_chunks=1.0, act_offload_frac=0.0,
        sequence_parallel_with_tp=False, unsharded_weights_with_pp=False, default_sharding="zero1",
        source="Rajbhandari et al. 2020 (ZeRO), section 3.1: mixed-precision Adam holds 2 psi fp16 parameters, "
               "2 psi fp16 gradients and K psi = 12 psi fp32 optimizer state.",
    ),
    # Megatron-Bridge's performance recipes (the runs of its performance summary): Megatron-Core with 16-bit
    # gradient buffers.
    "megatron_bridge": replace(
        _MEGATRON, grad_bytes=2.0,
        source="NeMo 2 performance recipes (container 24.12 on: NEMO2_PERF_RELEASE) set "
               "recipe.trainer.plugins.grad_reduce_in_fp32 = False (NVIDIA/NeMo nemo/collections/llm/recipes/*, "
               "performance_mode; scripts/performance/llm). "
               "Megatron-Bridge performance scripts set cfg.mixed_precision.grad_reduce_in_fp32 = False and "
               "cfg.ddp.grad_reduce_in_fp32 = False for every model they benchmark (25.11-26.06: "
               "scripts/performance/configs/<model>/*_llm_pretrain.py and llama3_llm_finetune.py; 26.08: "
               "src/megatron/bridge/perf_recipes/_common.py), so Megatron-Core's DistributedDataParallel allocates "
               "its gradient buffer in the parameter dtype (bf16, 2 B) instead of fp32. Otherwise as 'megatron' "
               "(attention-core selective recompute, distributed optimizer, sequence parallelism with TP; the "
               "cross-entropy override cross_entropy_fusion_impl='te' keeps a bf16 logits tensor and an fp32 "
               "gradient, TransformerEngine transformer_engine/pytorch/triton/cross_entropy.py: 6 B/element).",
    ),
    # Unknown stack: the model as it was before presets (models.core.params.DEFAULT's choices).
    "default": MemoryPreset(
        selective_policy=SELECTIVE_ATTENTION_CORE,
        grad_bytes=4.0, logits_bytes=4.0, logits_chunks=1.0, act_offload_frac=0.0,
        sequence_parallel_with_tp=None, unsharded_weights_with_pp=True, default_sharding="none",
        source="models.core.params.DEFAULT (grad_bytes 4, fp32 logits, Korthikanti selective); sequence parallelism by "
               "the runs adapter's era rule (models.corpus.runs_adapter.UNKNOWN_STACK_SP_YEAR). FSDP (zero3/fsdp/hsdp) with "
               "pp > 1 keeps the stage gathered over the step, as the stacks that run the two together do: "
               "PyTorch's pipelining with FSDP2 (torchtitan apply_fsdp: reshard_after_forward=False when pp is "
               "enabled) and Meta's Llama 3 4D parallelism (Dubey et al. 2024, section 3.3.2: model weights not "
               "resharded after the forward pass); DeepSpeed's pipeline engine refuses ZeRO-2/3 "
               "(deepspeed/runtime/pipe/engine.py: 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism', "
               "because their gathers would run on every one of the 10s-100s of micro-batches).",
    ),
}

#: words in a source's `framework` column -> preset, first match wins (lower-case substring match)
FRAMEWORK_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torchtitan", ("torchtitan",)),
    ("llm_foundry", ("llm-foundry", "composer", "mosaic")),
    ("jax_spmd", ("maxtext", "pax")),
    # GPT-NeoX: "based on NVIDIA's Megatron Language Model and augmented with techniques from DeepSpeed" (EleutherAI
    # gpt-neox README; Black et al. 2022)
    ("megatron_deepspeed", ("megatron-deepspeed", "bigscience", "deepspeed", "neox")),
    # NVIDIA's MLPerf GPT-3 submissions name the container ("PyTorch NVIDIA Release 23.09"); the same
    # submissions' other rows name NeMo Megatron, the only GPT-3 175B stack NVIDIA submitted.
    # Megatron-Bridge names its performance-summary runs "Megatron-Bridge / NeMo <container>"
    ("megatron_bridge", ("megatron-bridge",)),
    # ByteDance's MegaScale is built on Megatron-LM (Jiang et al., NSDI 2024, "MegaScale: Scaling Large Language
    # Model Training to More Than 10,000 GPUs")
    ("megatron", ("megatron", "nemo", "nvidia release", "megascale")),
    ("pytorch_fsdp", ("fms", "fsdp")),
)


def framework_preset(framework, year=None) -> pl.Expr:
    """Preset name for a `framework` column (name or polars expression); `year` (name, expression or None): Megatron
    stacks before 2022 ran without sequence parallelism (Korthikanti et al. 2022 introduced it), which is the
    ``megatron_deepspeed`` preset's behaviour. Unknown stacks get ``default``."""
    fw = (pl.col(framework) if isinstance(framework, str) else framework).fill_null("").str.to_lowercase()
    yr = None if year is None else (pl.col(year) if isinstance(year, str) else year)
    expr = pl.when(pl.lit(False)).then(pl.lit(None, dtype=pl.Utf8))
    for name, words in FRAMEWORK_WORDS:
        hit = pl.lit(False)
        for w in words:
            hit = hit | fw.str.contains(w, literal=True)
        if name == "megatron" and yr is not None:
            expr = expr.when(hit & (yr.fill_null(2100) < 2022)).then(pl.lit("megatron_deepspeed"))
        if name == "megatron":  # NeMo 2's performance recipes (container 24.12 on): 16-bit gradient buffers
            release = fw.str.extract(NEMO2_RELEASE_PATTERN, 1)
            expr = expr.when(hit & release.is_not_null() & (release >= NEMO2_PERF_RELEASE)).then(
                pl.lit("megatron_bridge"))
        expr = expr.when(hit).then(pl.lit(name))
    return expr.otherwise(pl.lit("default")).alias("memory_preset")


def preset_table() -> pl.DataFrame:
    """One row per preset with its memory parameters and source."""
    return pl.DataFrame([{"memory_preset": k} | asdict(v) for k, v in PRESETS.items()])


def remat_words(policy) -> pl.Expr:
    """(recompute, selective_policy) for a MaxText ``remat_policy`` word: 'full' -> full recompute (the layer input
    only), 'none' -> none, a save-list policy -> selective with its models.memory.model code; a struct column with
    fields ``recompute`` (str) and ``selective_policy`` (int, null when the word is not a MaxText policy)."""
    w = (pl.col(policy) if isinstance(policy, str) else policy).fill_null("").str.to_lowercase() \
        .str.replace_all(r"[^a-z0-9]", "")  # "save_qkv_proj", "SAVE-QKV-PROJ", "save qkv proj" alike
    code = w.replace_strict({k.replace("_", ""): v for k, v in MAXTEXT_REMAT.items()}, default=None,
                            return_dtype=pl.Int64)
    rc = (pl.when(w == "full").then(pl.lit("full")).when(w == "none").then(pl.lit("none"))
          .when(code.is_not_null()).then(pl.lit("selective")).otherwise(pl.lit(None, dtype=pl.Utf8)))
    return pl.struct(rc.alias("recompute"), code.alias("selective_policy")).alias("remat")


# ---- fine-tuning --------------------------------------------------------------------------------------------------
#: NeMo 2 / Megatron-Bridge LoRA defaults (nemo.collections.llm.peft.LoRA): target_modules = linear_qkv, linear_proj,
#: linear_fc1, linear_fc2; dim (rank) 32. Each adapter is A (in x r) + B (r x out).
LORA_RANK = 32


def finetune_mode(model_name) -> pl.Expr:
    """'lora' when the source names a LoRA run (e.g. "LLAMA3_70B LoRA"), else 'full'."""
    name = (pl.col(model_name) if isinstance(model_name, str) else model_name).fill_null("").str.to_lowercase()
    return pl.when(name.str.contains("lora", literal=True)).then(pl.lit("lora")).otherwise(pl.lit("full")) \
        .alias("finetune_mode")


def lora_trainable_frac(n_layers, d_model, q_dim, kv_dim, ffn_dim, gated, params, rank: float = LORA_RANK):
    """Share of the parameters a LoRA run trains: rank x (in + out) per adapted matrix on QKV, attention output,
    FC1 (gate + up when gated) and FC2, every layer, over the model's parameters. Plain arithmetic, so the
    arguments may be numpy arrays or polars expressions (``gated`` 0/1 or bool)."""
    fc1_out = ffn_dim * (1 + gated)
    per_layer = rank * ((d_model + q_dim + 2 * kv_dim) + (q_dim + d_model) + (d_model + fc1_out) + (ffn_dim + d_model))
    return n_layers * per_layer / params


# ---- capacity the source states ----------------------------------------------------------------------------------
def reported_memory_gb(gpu_as_reported) -> pl.Expr:
    """Capacity in GB written in the accelerator string (e.g. 'H100-HBM2e-96GB' -> 96; Meta's Grand Teton H100s,
    data card: 96 GB HBM2e, mapped to the 80 GB SKU's id); null when the string states none."""
    s = pl.col(gpu_as_reported) if isinstance(gpu_as_reported, str) else gpu_as_reported
    return s.str.extract(r"(?i)(\d+(?:\.\d+)?)\s*GB", 1).cast(pl.Float64).alias("reported_memory_gb")


# ---- layouts a source leaves unstated ------------------------------------------------------------------------------
#: documented defaults for runs whose source states no tp/pp and no sibling row states one:
#: (preset or "*", gpu prefix or "", tp, pp, sharding or None, source)
DEFAULT_LAYOUTS: tuple[tuple[str, str, int, int, str | None, str], ...] = (
    ("jax_spmd", "", 1, 1, "fsdp", "MaxText base.yml: ici_fsdp_parallelism -1, ici_tensor_parallelism 1, no "
     "pipeline; Paxml shards weights over its data x mdl mesh"),
    ("*", "gaudi", 8, 8, "none", "HabanaAI/Model-References MLPERF3.0 gpt3/run_gpt.sh: TP=8, PP=8, ZERO_STAGE=0"),
)


def source_layout(runs: pl.DataFrame) -> pl.DataFrame:
    """`runs` with tp/pp (and sharding) filled where the source states neither tp nor pp, and a column
    `layout_rule` naming the rule (null where nothing was filled):

    1. the layout the same source states for the same architecture on the same stack (memory preset) in its other
       rows (most frequent (tp, pp));
    2. the stack's documented default (``DEFAULT_LAYOUTS``): MaxText/Paxml shard everything over the slice (FSDP);
       Habana's MLPerf GPT-3 runs TP 8 x PP 8.
    Needs columns run_id, source, arch_id, framework, gpu, tp, pp, sharding, year."""
    unstated = pl.col("tp").is_null() & pl.col("pp").is_null()
    keyed = runs.with_columns(framework_preset("framework", "year").alias("_stack"))
    key = ["source", "arch_id", "_stack"]
    stated = keyed.filter(pl.col("tp").is_not_null() & pl.col("pp").is_not_null() & pl.col("arch_id").is_not_null())
    sib = (stated.group_by(*key, "tp", "pp").len()
           .sort(["len", "tp", "pp"], descending=[True, False, False])
           .group_by(*key, maintain_order=True).first()
           .select(*key, pl.col("tp").alias("_sib_tp"), pl.col("pp").alias("_sib_pp")))
    out = keyed.join(sib, on=key, how="left", nulls_equal=True)
    preset = pl.col("_stack")
    d_tp = d_pp = d_sh = d_rule = pl.lit(None)
    for name, gpu, tp, pp, sh, src in reversed(DEFAULT_LAYOUTS):
        cond = pl.lit(True) if name == "*" else (preset == name)
        if gpu:
            cond = cond & pl.col("gpu").fill_null("").str.starts_with(gpu)
        d_tp = pl.when(cond).then(pl.lit(tp)).otherwise(d_tp)
        d_pp = pl.when(cond).then(pl.lit(pp)).otherwise(d_pp)
        d_sh = pl.when(cond).then(pl.lit(sh)).otherwise(d_sh)
        d_rule = pl.when(cond).then(pl.lit(f"layout tp={tp} pp={pp} ({src})")).otherwise(d_rule)
    use_sib = unstated & pl.col("_sib_tp").is_not_null()
    use_def = unstated & ~use_sib & d_tp.is_not_null()
    return out.with_columns(
        pl.when(use_sib).then(pl.col("_sib_tp")).when(use_def).then(d_tp).otherwise(pl.col("tp"))
        .cast(pl.Int64).alias("tp"),
        pl.when(use_sib).then(pl.col("_sib_pp")).when(use_def).then(d_pp).otherwise(pl.col("pp"))
        .cast(pl.Int64).alias("pp"),
        pl.when(use_def & pl.col("sharding").is_null()).then(d_sh.cast(pl.Utf8)).otherwise(pl.col("sharding"))
        .alias("sharding"),
        pl.when(use_sib).then(pl.format("layout tp={} pp={} (stated by the same source for this architecture)",
                                        pl.col("_sib_tp"), pl.col("_sib_pp")))
        .when(use_def).then(d_rule.cast(pl.Utf8)).otherwise(pl.lit(None, dtype=pl.Utf8)).alias("layout_rule"),
    ).drop("_sib_tp", "_sib_pp", "_stack")


def source_interleave(runs: pl.DataFrame) -> pl.DataFrame:
    """`runs` with `vpp` filled where a pipelined run (pp > 1) leaves the interleave unstated but the same source
    states one for the same architecture, stack (memory preset) and (tp, pp) in its other rows (the most frequent;
    the largest on a tie), and a boolean column `vpp_from_source`. An interleave is a property of the stage split
    (layers per stage / chunks), not of the cluster size: MLPerf's GPT-3 submissions state vpp 12 with tp 4 x pp 8
    in v3.0 and leave it unstated in v3.1 for the same configuration. Other rows keep their vpp (null: 1 later).
    Needs columns source, arch_id, framework, year, tp, pp, vpp."""
    keyed = runs.with_columns(framework_preset("framework", "year").alias("_stack"))
    key = ["source", "arch_id", "_stack", "tp", "pp"]
    stated = keyed.filter(pl.col("vpp").is_not_null() & (pl.col("pp") > 1) & pl.col("arch_id").is_not_null())
    sib = (stated.group_by(*key, "vpp").len()
           .sort(["len", "vpp"], descending=[True, True])
           .group_by(*key, maintain_order=True).first()
           .select(*key, pl.col("vpp").alias("_sib_vpp")))
    out = keyed.join(sib, on=key, how="left", nulls_equal=True)
    use = pl.col("vpp").is_null() & (pl.col("pp") > 1) & pl.col("_sib_vpp").is_not_null()
    return out.with_columns(
        pl.when(use).then(pl.col("_sib_vpp")).otherwise(pl.col("vpp")).cast(pl.Int64).alias("vpp"),
        use.fill_null(False).alias("vpp_from_source"),
    ).drop("_sib_vpp", "_stack")


# ---- what a named recipe sets (Megatron-Bridge's performance recipes) ----------------------------------------------
_MB = "NVIDIA-NeMo/Megatron-Bridge "
_MB_LLAMA3 = (_MB + "scripts/performance/configs/llama3/workload_base_configs.py (25.11), "
              "configs/llama/llama3_workload_base_configs.py (26.02-26.06), src/megatron/bridge/perf_recipes/llama/"
              "<gpu>/llama3.py (26.08); llama3_70b_pretrain_config sets no recompute")
_MB_LLAMA31 = (_MB + "configs/llama/llama31_workload_base_configs.py LLAMA31_405B_PRETRAIN_CONFIG_<gpu>_<dtype>_V2 "
               "(26.02-26.06; the 256-GPU GB200 layout of the 25.11 run) and *_BASE_CONFIG (25.11, B200/H100): no "
               "recompute_num_layers, recompute_modules or cpu_offloading (V2 resets the V1 FSDP offload and NVFP4 "
               "recompute to None)")
_MB_QWEN3 = (_MB + "configs/qwen3/qwen3_llm_pretrain.py set_qwen3_common_configs (25.11; configs/qwen/ 26.02-26.06, "
             "perf_recipes/qwen/<gpu>/qwen3_moe.py 26.08): recompute_granularity = recompute_method = "
             "recompute_num_layers = None, and no workload config names recompute_modules")
_MB_SFT = (_MB + "configs/llama/llama3_workload_base_configs.py _LLAMA3_70B_SFT_CONFIG_<gpu> (26.06): no recompute")
_MB_LLAMA31_X300 = (_MB + "configs/llama/llama31_workload_base_configs.py LLAMA31_405B_PRETRAIN_CONFIG_{GB300,B300}_"
                    "<dtype>_V2 (26.02-26.06; FP8_CS_V2 use_megatron_fsdp=False) and perf_recipes/llama/{gb300,b300}/"
                    "llama31.py llama31_405b_pretrain_*_{fp8cs,fp8mx,nvfp4}_config (26.08): no recompute_num_layers, "
                    "recompute_modules or cpu_offloading (the 25.11 GB300 FP8-CS run states the 256-GPU tp 2, pp 8, "
                    "cp 2, vpp 4 layout of these, not r0.2.0's 128-GPU FSDP LLAMA31_405B_GB300_FP8_CS_BASE_CONFIG "
                    "with cpu_offloading_num_layers=10)")
#: (architecture id, task, gpu, dtype) -> (recompute, layers whose activations are offloaded to host memory, source):
#: what a Megatron-Bridge performance recipe sets for a run of its performance summary (task: pretrain, sft or lora,
#: from the run's model_name). The recipes' "fp8" is FP8 current scaling (the performance scripts offer fp8_cs,
#: fp8_mx, fp8_sc, bf16 and nvfp4: scripts/performance/utils/precision.py get_precision_config). Only what the
#: memory model can represent is listed: module lists such as ["layernorm", "moe_act"] (GPT-OSS), ["mla_up_proj"]
#: (DeepSeek-V3) are in ``RECIPE_RECOMPUTE_MODULES``; block recompute of N layers (Llama 3 8B on H100, LoRA on H100)
#: is not represented, and those runs keep the adapter's inference. cpu_offloading_num_layers N:
#: set_recompute_overrides sets cpu_offloading = True, cpu_offloading_weights = False (activations only).
RECIPE_MEMORY: dict[tuple[str, str, str, str], tuple[str, int, str]] = {
    **{("llama3-70b", "pretrain", "gb200", d): ("none", 40, _MB_LLAMA3 + "; LLAMA3_70B_*GB200_FP8_CS*: "
                                                "use_megatron_fsdp=True, cpu_offloading_num_layers=40")
       for d in ("fp8", "fp8-cs")},
    **{("llama3-70b", "pretrain", "gb200", d): ("none", 0, _MB_LLAMA3) for d in ("mxfp8", "nvfp4")},
    **{("llama3-70b", "pretrain", "gb300", d): ("none", 20, _MB_LLAMA3 + "; LLAMA3_70B_GB300_FP8_CS_BASE_CONFIG (r0.2.0), "
                                                "LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_CS_V2 (r0.3.0-r0.5.0), "
                                                "llama3_70b_pretrain_64gpu_gb300_fp8cs_config (r0.6.0): "
                                                "use_megatron_fsdp=True, cpu_offloading_num_layers=20")
       for d in ("fp8", "fp8-cs")},
    **{("llama3-70b", "pretrain", "gb300", d): ("none", 0, _MB_LLAMA3) for d in ("mxfp8", "nvfp4")},
    **{("llama3-70b", "pretrain", "b300", d): ("none", 0, _MB_LLAMA3 + "; LLAMA3_70B_PRETRAIN_CONFIG_B300_FP8_CS_V2 "
                                               "(r0.3.0-r0.5.0), llama3_70b_pretrain_64gpu_b300_fp8cs_config (r0.6.0): "
                                               "use_megatron_fsdp=True, no cpu_offloading")
       for d in ("fp8", "mxfp8", "nvfp4")},
    **{("llama3-70b", "pretrain", "h100-sxm5-80gb", d): ("none", 0, _MB_LLAMA3) for d in ("fp8", "fp8-cs")},
    **{("llama3-8b", "pretrain", g, d): ("none", 0, _MB_LLAMA3)
       for g in ("b200", "gb200", "gb300") for d in ("fp8-cs", "mxfp8")},
    **{("llama3-8b", "pretrain", "b300", d): ("none", 0, _MB_LLAMA3) for d in ("fp8", "mxfp8", "nvfp4")},
    **{("llama3-405b", "pretrain", g, d): ("none", 0, _MB_LLAMA31)
       for g in ("gb200", "b200", "h100-sxm5-80gb") for d in ("fp8", "fp8-cs", "mxfp8", "nvfp4")},
    **{("llama3-405b", "pretrain", g, d): ("none", 0, _MB_LLAMA31_X300)
       for g, ds in (("gb300", ("fp8", "fp8-cs", "mxfp8", "nvfp4")), ("b300", ("fp8", "mxfp8", "nvfp4"))) for d in ds},
    **{(a, "pretrain", g, d): ("none", 0, _MB_QWEN3) for a in ("qwen3-235b-a22b", "qwen3-30b-a3b")
       for g in ("gb200", "b200", "h100-sxm5-80gb", "gb300", "b300") for d in ("bf16", "fp8", "fp8-cs", "mxfp8")},
    **{("llama3-70b", "sft", g, d): ("none", 0, _MB_SFT)
       for g, d in (("gb200", "fp8"), ("gb200", "mxfp8"), ("h100-sxm5-80gb", "fp8"), ("gb300", "fp8"), ("gb300", "mxfp8"))},
}


_DS = _MB + "scripts/performance/configs/deepseek/"
_DS_WB = "deepseek_workload_base_configs.py DEEPSEEK_V3_PRETRAIN_CONFIG_"
_OSS = _MB + "scripts/performance/configs/gpt_oss/"
#: (architecture id, task, gpu, dtype, NeMo container) -> (Megatron-Core recompute_modules, source): the module
#: recompute a Megatron-Bridge performance recipe sets (models.memory.model.RECOMPUTE_MODULE_BITS), for the corpus runs
#: whose layout (tp, pp, vpp, ep) is the recipe's. Setting recompute_modules also sets recompute_granularity =
#: "selective" (scripts/performance/utils/helpers.py set_recompute_overrides 25.11, utils/overrides.py 26.02-26.06;
#: perf_recipes/deepseek/common.py _deepseek_v3_common 26.08). Containers -> releases: 25.11 r0.2.0, 26.02 r0.3.0,
#: 26.04 r0.4.0, 26.06 r0.5.0, 26.08 r0.6.0. Not listed (the run's layout is not its recipe's): DeepSeek-V3 B200
#: 26.04 (the FP8_MX_V2 recipe is pp 8, vpp 2, ep 32; ["mla_up_proj", "mlp"]), DeepSeek-V3 GB200 MXFP8 25.11
#: (pp 8, ep 32), GPT-OSS 120B B200 25.11 and 26.04 (ep 8 against the recipe's 64), DeepSeek-V3 GB300 25.11 (the
#: r0.2.0 DEEPSEEK_V3_GB300_BASE_CONFIG is pp 4, vpp 4, ep 64 with ["moe_act"]; the run states pp 2, ep 32), and
#: DeepSeek-V3 GB300 MXFP8 26.06 and 26.08, whose recipes set recompute_modules = [] (selective granularity that
#: recomputes nothing: r0.5.0 DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V2, r0.6.0 deepseek/gb300/deepseek_v3.py
#: deepseek_v3_pretrain_256gpu_gb300_fp8mx_config), which a module list cannot state.
RECIPE_RECOMPUTE_MODULES: dict[tuple[str, str, str, str, str], tuple[tuple[str, ...], str]] = {
    # 25.09 (r0.1.0): scripts/performance/run_script.py's DeepSeek-V3 recompute_modules, selective granularity
    **{("deepseek-v3", "pretrain", "h100-sxm5-80gb", d, "25.09"): (
        ("mla_up_proj", "mlp"), _MB + "scripts/performance/run_script.py DeepSeek-V3 on h100 (r0.1.0, 25.09)")
       for d in ("bf16", "fp8", "fp8-cs")},
    **{("deepseek-v3", "pretrain", g, d, "25.09"): (
        ("mla_up_proj",), _MB + f"scripts/performance/run_script.py DeepSeek-V3 on {g}, the branch's cherry-picked "
        "perf configs whose layouts the 25.09 table states (r0.1.0, 25.09)")
       for g in ("b200", "gb200") for d in ("bf16", "fp8", "fp8-cs", "mxfp8")},
    ("deepseek-v3", "pretrain", "gb200", "bf16", "25.11"): (
        ("mla_up_proj",), _DS + "workload_base_configs.py DEEPSEEK_V3_GB200_BASE_CONFIG (r0.2.0, 25.11)"),
    ("deepseek-v3", "pretrain", "b200", "mxfp8", "25.11"): (
        ("mla_up_proj",), _DS + "workload_base_configs.py DEEPSEEK_V3_B200_BASE_CONFIG (r0.2.0, 25.11)"),
    ("deepseek-v3", "pretrain", "gb200", "mxfp8", "26.02"): (
        ("mla_up_proj",), _DS + _DS_WB + "GB200_FP8_MX_V2 = GB200_V1 with GBS 4096 (r0.3.0, 26.02)"),
    ("deepseek-v3", "pretrain", "b200", "mxfp8", "26.02"): (
        ("mla_up_proj",), _DS + _DS_WB + "B200_FP8_MX_V2 = B200_V1 with GBS 4096 (r0.3.0, 26.02)"),
    ("deepseek-v3", "pretrain", "gb200", "mxfp8", "26.04"): (
        ("mlp",), _DS + _DS_WB + "GB200_FP8_MX_V2 = GB200_V1 with GBS 4096 (r0.4.0, 26.04)"),
    ("deepseek-v3", "pretrain", "gb200", "mxfp8", "26.06"): (
        ("mla_up_proj",), _DS + _DS_WB + "GB200_FP8_MX_V2 = GB200_FP8_MX_V1 with GBS 4096 (r0.5.0, 26.06)"),
    ("deepseek-v3", "pretrain", "gb200", "mxfp8", "26.08"): (
        ("mla_up_proj",), _MB + "src/megatron/bridge/perf_recipes/deepseek/gb200/deepseek_v3.py "
        "deepseek_v3_pretrain_256gpu_gb200_fp8mx_config (r0.6.0, 26.08)"),
    # GB300 and B300: DeepSeek-V3 MXFP8 (the presets' layouts are the rows': GB300 pp 2, vpp 8, ep 32, micro-batch 2;
    # B300 26.02 and 26.04 pp 16, ep 8, micro-batch 1, the branch's later pp 8, micro-batch 2 of 26.04.01 and of tag
    # v0.5.0 (26.06) has the same module list)
    **{("deepseek-v3", "pretrain", "gb300", "mxfp8", c): (
        ("mla_up_proj",), _DS + _DS_WB + f"GB300_FP8_MX_V2 = GB300_V1 with GBS 4096 ({r}, {c})")
       for c, r in (("26.02", "r0.3.0"), ("26.04", "r0.4.0"))},
    **{("deepseek-v3", "pretrain", "b300", "mxfp8", c): (
        ("mla_up_proj",), _DS + _DS_WB + f"B300_FP8_MX_V2 ({r}, {c})")
       for c, r in (("26.02", "r0.3.0 tag v0.3.0"), ("26.04", "r0.4.0"), ("26.06", "r0.5.0 tag v0.5.0"))},
    ("deepseek-v3", "pretrain", "b300", "mxfp8", "26.08"): (
        ("mla_up_proj",), _MB + "src/megatron/bridge/perf_recipes/deepseek/b300/deepseek_v3.py "
        "deepseek_v3_pretrain_256gpu_b300_fp8mx_config (r0.6.0, 26.08)"),
    # Kimi K2 on GB300 (pp 4, vpp 4, ep 64, micro-batch 2: the rows' layout); the r0.3.0 preset was added after tag
    # v0.3.0 (the 26.02.01 row)
    **{("kimi-k2", "pretrain", "gb300", "mxfp8", c): (
        ("mla_up_proj",), _MB + f"scripts/performance/configs/kimi/kimi_workload_base_configs.py "
        f"KIMI_K2_PRETRAIN_CONFIG_GB300_FP8_MX = KIMI_K2_PRETRAIN_CONFIG_GB300 ({r}, {c})")
       for c, r in (("26.02", "r0.3.0"), ("26.04", "r0.4.0"), ("26.06", "r0.5.0"))},
    ("kimi-k2", "pretrain", "gb300", "mxfp8", "26.08"): (
        ("mla_up_proj",), _MB + "src/megatron/bridge/perf_recipes/kimi/gb300/kimi_k2.py "
        "kimi_k2_pretrain_256gpu_gb300_fp8mx_config (r0.6.0, 26.08)"),
    # Nemotron 3 Super NVFP4 on B300 (ep 8; its MXFP8 preset sets no modules)
    **{("nemotron-3-super", "pretrain", "b300", "nvfp4", c): (
        ("moe_act", "layernorm"), _MB + "scripts/performance/configs/nemotronh/nemotron_3_workload_base_configs.py "
        f"NEMOTRON_3_SUPER_PRETRAIN_CONFIG_B300_NVFP4_V1 ({r}, {c})")
       for c, r in (("26.04", "r0.4.0"), ("26.06", "r0.5.0"))},
    ("nemotron-3-super", "pretrain", "b300", "nvfp4", "26.08"): (
        ("moe_act", "layernorm"), _MB + "src/megatron/bridge/perf_recipes/nemotronh/b300/nemotronh.py "
        "nemotron_3_super_pretrain_64gpu_b300_nvfp4_config (r0.6.0, 26.08)"),
    # Nemotron 3 Ultra on GB200: the routed experts' activation recomputed (its input, fc1's output, is offloaded
    # to the host: cfg.model.fine_grained_activation_offloading, offload_modules ["fused_group_mlp"], not counted)
    ("nemotron-3-ultra", "pretrain", "gb200", "mxfp8", "26.08"): (
        ("moe_act",), _MB + "src/megatron/bridge/perf_recipes/nemotronh/gb200/nemotronh.py "
        "nemotron_3_ultra_pretrain_256gpu_gb200_fp8mx_config (r0.6.0, 26.08): recompute_granularity selective, "
        "recompute_modules ['moe_act']"),
    ("nemotron-3-ultra", "pretrain", "gb300", "mxfp8", "26.08"): (
        ("moe_act",), _MB + "src/megatron/bridge/perf_recipes/nemotronh/gb300/nemotronh.py "
        "_nemotron_3_ultra_gb300_fp8mx_config (r0.6.0, 26.08): recompute_granularity selective, "
        "recompute_modules ['moe_act']"),
    ("nemotron-3-super", "pretrain", "b200", "mxfp8", "26.04"): (
        ("moe_act", "layernorm"), _MB + "scripts/performance/configs/nemotronh/nemotron_3_workload_base_configs.py "
        "NEMOTRON_3_SUPER_PRETRAIN_CONFIG_B200_FP8_MX_V1 = BASE_NEMOTRON_3_SUPER_CONFIG_B200 (r0.4.0, 26.04)"),
    **{("gpt-oss-120b", "pretrain", g, "bf16", c): (
        ("layernorm", "moe_act"), _OSS + (f"workload_base_configs.py GPT_OSS_120B_{g.split('-')[0].upper()}_BF16_BASE_"
                                          "CONFIG (r0.2.0, 25.11)" if c == "25.11" else
                                          f"gpt_oss_workload_base_configs.py GPT_OSS_120B_PRETRAIN_CONFIG_"
                                          f"{g.split('-')[0].upper()}_BF16_V2 = _V1 with GBS 1280 ({r}, {c})"))
       for g, c, r in (("h100-sxm5-80gb", "25.11", "r0.2.0"), ("gb200", "25.11", "r0.2.0"),
                       ("h100-sxm5-80gb", "26.02", "r0.3.0"), ("gb200", "26.02", "r0.3.0"), ("b200", "26.02", "r0.3.0"),
                       ("h100-sxm5-80gb", "26.04", "r0.4.0"), ("gb200", "26.04", "r0.4.0"))},
}


#: (architecture id, task, gpu, dtype, NeMo container) -> (the micro-batch the summary's row states, the recipe's,
#: source): a row of Megatron-Bridge's performance summary whose MBS and GA are another system's. The 25.11 H100
#: GPT-OSS 120B row states MBS 4 and GA 2, the B200 row's values (pp 1, dp 64: 512 / (4 x 64) = 2); at its pp 4, dp
#: is 16 and 4 x 2 x 16 = 128, not its GBS 512. The release's recipe runs micro-batch 1 (read at micro-batch 4 the
#: memory model puts it at 108 GB on an 80 GB card; at 1 it fits, and it is predicted as its 26.02 and 26.04
#: siblings, which state micro-batch 1).
RECIPE_MICRO_BATCH: dict[tuple[str, str, str, str, str], tuple[int, int, str]] = {
    ("gpt-oss-120b", "pretrain", "h100-sxm5-80gb", "bf16", "25.11"): (
        4, 1, _OSS + "workload_base_configs.py GPT_OSS_120B_H100_BF16_BASE_CONFIG = BASE_GPT_OSS_120B_CONFIG "
        "(micro_batch_size=1) with pipeline_model_parallel_size=4 (tag v0.2.0, r0.2.0, 25.11)"),
}


def recipe_micro_batch(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with the micro-batch of the run's recipe where its row states another system's
    (``RECIPE_MICRO_BATCH``, ``megatron_bridge`` preset runs), recorded in `assumptions`. Needs memory_preset,
    arch_id, model_name, gpu, dtype, micro_batch, framework and assumptions; a frame without them is returned as
    it is."""
    need = ("memory_preset", "arch_id", "model_name", "gpu", "dtype", "micro_batch", "framework", "assumptions")
    if not frame.height or any(c not in frame.columns for c in need):
        return frame
    key = _recipe_key("megatron_bridge", [*_bridge_parts(), recipe_container()])
    stated = _entry(key, RECIPE_MICRO_BATCH, 0, pl.Int64)
    recipe = _entry(key, RECIPE_MICRO_BATCH, 1, pl.Int64)
    src = _entry(key, RECIPE_MICRO_BATCH, 2, pl.Utf8)
    use = (pl.col("micro_batch").cast(pl.Int64) == stated).fill_null(False)
    why = pl.format("micro_batch={} (the row's {} is another system's: its GA does not tile its batch at this "
                    "layout; the run's recipe: {})", recipe, pl.col("micro_batch"), src)
    return frame.with_columns(
        pl.when(use).then(recipe).otherwise(pl.col("micro_batch").cast(pl.Int64)).alias("micro_batch"),
        pl.when(use).then(pl.concat_str([pl.col("assumptions"), why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


#: NeMo containers of Megatron-Bridge's performance summary whose Transformer Engine writes the fused cross-entropy's
#: gradient in place into the 16-bit logits and saves that tensor (2 B per logit element): the performance overrides
#: set cross_entropy_fusion_impl = "te" (scripts/performance/utils/helpers.py 25.11, utils/overrides.py later), which
#: Megatron-Core's compute_language_model_loss sends to te_parallel_cross_entropy on the output layer's bf16 logits;
#: TE's transformer_engine/pytorch/cross_entropy.py saves ``_input`` after triton/cross_entropy.py wrote the gradient
#: into it, up to v2.17 (v2.18 allocates an fp32 gradient: 6 B, the preset's value). TE per container: Megatron-Bridge
#: docs/releases/software-versions.md (25.11: 2.9, 26.02: 2.12, 26.04: 2.14, 26.06: 2.16); 26.08's is not listed.
TE_INPLACE_CROSS_ENTROPY_CONTAINERS = ("25.11", "26.02", "26.04", "26.06")
TE_INPLACE_LOGITS_BYTES = 2.0


#: a NeMo container release in a run's `framework`: "NeMo 26.04", "Megatron-Bridge / NeMo 26.04 (Megatron-Core)",
#: "NeMo 26.04.01" (a patch of 26.04's recipes) or "Megatron-Bridge 26.04" (the release its performance summary names)
CONTAINER_PATTERN = r"(?i)(?:NeMo|Megatron[- ]Bridge)[^0-9]{0,3}(\d\d\.\d\d)(?:\.\d+)?\b"
#: the first NeMo container whose performance recipes (NeMo 2, scripts/performance/llm and the recipes'
#: performance_mode) set ``recipe.trainer.plugins.grad_reduce_in_fp32 = False``: a run of a NeMo release from this one
#: on (the NeMo performance summaries 24.12-25.09, NVIDIA's DGX Cloud benchmarking recipes) keeps its gradient buffer
#: in bf16, as Megatron-Bridge's recipes, their successors, do (preset ``megatron_bridge``)
NEMO2_PERF_RELEASE = "24.12"
#: a NeMo container release as the performance summaries and recipes name it ("NeMo 25.02", "NeMo Framework 25.04.01",
#: "Megatron-Bridge / NeMo 26.04"); not MLPerf's "NVIDIA NeMo Framework Release 24.09" (its own implementation)
NEMO2_RELEASE_PATTERN = r"(?i)nemo(?: framework)?[^0-9a-z]{0,3}(\d\d\.\d\d)(?:\.\d+)?\b"


def recipe_container() -> pl.Expr:
    """The NeMo container release a run's `framework` names ("NeMo 26.04" -> "26.04"; null when it names none)."""
    return pl.col("framework").cast(pl.Utf8).fill_null("").str.extract(CONTAINER_PATTERN, 1)


def recipe_task(model_name) -> pl.Expr:
    """'lora', 'sft' or 'pretrain' from a run's model name (e.g. "LLAMA3_70B SFT")."""
    name = (pl.col(model_name) if isinstance(model_name, str) else model_name).fill_null("").str.to_lowercase()
    return (pl.when(name.str.contains("lora", literal=True)).then(pl.lit("lora"))
            .when(name.str.contains(r"\bsft\b")).then(pl.lit("sft")).otherwise(pl.lit("pretrain")))


def _bridge_parts() -> list[pl.Expr]:
    """A Megatron-Bridge recipe table's key parts of a run: architecture id, task (`recipe_task`), gpu, dtype."""
    return [pl.col("arch_id").cast(pl.Utf8).str.to_lowercase(), recipe_task("model_name"), pl.col("gpu").cast(pl.Utf8),
            pl.col("dtype").cast(pl.Utf8).str.to_lowercase()]


def _recipe_key(preset: str, parts: list[pl.Expr]) -> pl.Expr:
    """A run's key in a recipe table (its `parts` joined by '|'), null for a run not of memory preset `preset`."""
    return pl.when(pl.col("memory_preset") == preset).then(pl.concat_str(parts, separator="|"))


def _entry(key: pl.Expr, table: dict, field, dtype) -> pl.Expr:
    """`field` of the entry of `table` (keyed by tuples) that `key` names: an index into the entry, or a function of
    it; null where the table has none."""
    get = field if callable(field) else (lambda v: v[field])
    return key.replace_strict({"|".join(k): get(v) for k, v in table.items()}, default=None, return_dtype=dtype)


def recipe_memory(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with the recompute (where unstated) and `act_offload_frac` that the run's recipe sets
    (``RECIPE_MEMORY``, for the ``megatron_bridge`` preset's runs), each recorded in `assumptions`, and
    `recompute_modules` (bits, models.memory.model.RECOMPUTE_MODULE_BITS; with recompute = selective) of
    ``RECIPE_RECOMPUTE_MODULES``, `logits_bytes` 2 for the containers whose TE fused cross-entropy works in place
    (``TE_INPLACE_CROSS_ENTROPY_CONTAINERS``; null: the preset's). The offloaded share is of the layers one pipeline
    stage holds. Needs memory_preset, arch_id, model_name, gpu, dtype, recompute, n_layers, pp, assumptions (and
    framework for the container); a frame without them is returned with those columns null."""
    need = ("memory_preset", "arch_id", "model_name", "gpu", "dtype", "recompute", "n_layers", "pp")
    if not frame.height or any(c not in frame.columns for c in need):
        return frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("act_offload_frac"),
                                  pl.lit(None, dtype=pl.Float64).alias("logits_bytes"),
                                  pl.lit(None, dtype=pl.Float64).alias("recompute_modules"))
    key = _recipe_key("megatron_bridge", _bridge_parts())
    rc = _entry(key, RECIPE_MEMORY, 0, pl.Utf8)
    off = _entry(key, RECIPE_MEMORY, lambda v: float(v[1]), pl.Float64)
    src = _entry(key, RECIPE_MEMORY, 2, pl.Utf8)
    container = recipe_container() if "framework" in frame.columns else pl.lit(None, dtype=pl.Utf8)
    inplace_ce = (pl.col("memory_preset") == "megatron_bridge") & container.is_in(TE_INPLACE_CROSS_ENTROPY_CONTAINERS)

    mkey = _recipe_key("megatron_bridge", [*_bridge_parts(), container])
    mcode = _entry(mkey, RECIPE_RECOMPUTE_MODULES, lambda v: float(recompute_modules_code(v[0])), pl.Float64)
    mwhy = _entry(mkey, RECIPE_RECOMPUTE_MODULES, lambda v: f"recompute_modules={list(v[0])} (the run's recipe: "
                                                            f"{v[1]})", pl.Utf8)
    # the recipe's modules apply where the run's recompute is unstated or selective (the granularity they set)
    use_mods = mcode.is_not_null() & (pl.col("recompute").is_null() | (pl.col("recompute") == "selective"))
    rc = pl.when(use_mods).then(pl.lit("selective")).otherwise(rc)
    stage_layers = (pl.col("n_layers").cast(pl.Float64) / pl.col("pp").cast(pl.Float64).fill_null(1.0)).ceil()
    frac = pl.min_horizontal(off / stage_layers, pl.lit(1.0))
    fill_rc = pl.col("recompute").is_null() & rc.is_not_null()
    why = pl.concat_str([
        pl.when(fill_rc).then(pl.format("recompute={} (the run's recipe)", rc)),
        pl.when(off > 0).then(pl.format("activations of {} layers offloaded to host (the run's recipe)",
                                        off.cast(pl.Int64))),
    ], separator="; ", ignore_nulls=True)
    why = pl.when(rc.is_not_null()).then(pl.concat_str([why, pl.format("[{}]", src)], separator=" ",
                                                       ignore_nulls=True))
    why = pl.concat_str([why, pl.when(use_mods).then(mwhy)], separator="; ", ignore_nulls=True)
    why = pl.concat_str([why, pl.when(inplace_ce.fill_null(False)).then(pl.format(
        "logits {} B/element (the container's TE fused cross-entropy writes its gradient in place)",
        pl.lit(int(TE_INPLACE_LOGITS_BYTES))))], separator="; ", ignore_nulls=True)
    # the recipe's sharding where the row's came from the framework's default (``RECIPE_SHARDING``)
    reshard = {"sharding", "sharding_from_default"} <= set(frame.columns)  # the runs adapter's frames
    sh = _entry(mkey, RECIPE_SHARDING, 0, pl.Utf8)
    use_sh = sh.is_not_null() & pl.col("sharding_from_default").fill_null(False) if reshard else pl.lit(False)
    why = pl.concat_str([why, pl.when(use_sh).then(pl.format("sharding={} (the run's recipe: {})", sh, _entry(
        mkey, RECIPE_SHARDING, 1, pl.Utf8)))], separator="; ", ignore_nulls=True).str.strip_chars("; ")
    return frame.with_columns(
        *([pl.when(use_sh).then(sh).otherwise(pl.col("sharding")).alias("sharding")] if reshard else []),
        pl.when(fill_rc).then(rc).otherwise(pl.col("recompute")).alias("recompute"),
        pl.when(off > 0).then(frac).otherwise(pl.lit(None, dtype=pl.Float64)).alias("act_offload_frac"),
        pl.when(inplace_ce.fill_null(False)).then(pl.lit(TE_INPLACE_LOGITS_BYTES)).otherwise(pl.lit(None, dtype=pl.Float64))
        .alias("logits_bytes"),
        pl.when(use_mods).then(mcode).otherwise(pl.lit(None, dtype=pl.Float64)).alias("recompute_modules"),
        pl.when(why.is_not_null() & (why.str.len_chars() > 0))
        .then(pl.concat_str([pl.col("assumptions"), why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


#: (architecture id, task, gpu, dtype, container) -> (sharding, source): a Megatron-Bridge performance recipe that
#: shards with Megatron-FSDP, for a summary row that states no sharding (the framework's default is the distributed
#: optimizer, zero1). Nemotron 3 Ultra's HSDP shards parameters, gradients and optimizer state inside an NVLink
#: domain and the optimizer state again across domains; stepcast's `hsdp` shards inside the node only, so it
#: counts more optimizer state than the run kept.
RECIPE_SHARDING: dict[tuple[str, str, str, str, str], tuple[str, str]] = {
    ("nemotron-3-ultra", "pretrain", "gb200", "mxfp8", "26.08"): (
        "hsdp", _MB + "src/megatron/bridge/perf_recipes/nemotronh/gb200/nemotronh.py "
        "nemotron_3_ultra_pretrain_256gpu_gb200_fp8mx_config and common.py _apply_nemotron_3_ultra_fsdp_hsdp "
        "(r0.6.0, 26.08): use_megatron_fsdp, data_parallel_sharding_strategy optim_grads_params, "
        "outer_dp_sharding_strategy optim"),
    ("nemotron-3-ultra", "pretrain", "gb300", "mxfp8", "26.08"): (
        "hsdp", _MB + "src/megatron/bridge/perf_recipes/nemotronh/gb300/nemotronh.py "
        "_nemotron_3_ultra_gb300_fp8mx_config and common.py _apply_nemotron_3_ultra_fsdp_hsdp (r0.6.0, 26.08): "
        "use_megatron_fsdp, data_parallel_sharding_strategy optim_grads_params, outer_dp_sharding_strategy optim"),
}


# ---- quantized weights (Megatron-Core fp8_param_gather) in Megatron-Bridge's performance recipes -----------------
#: dtypes whose Megatron-Bridge performance recipe keeps the GEMM weights as FP8 parameters: the performance scripts'
#: precision configs (scripts/performance/utils/helpers.py 25.11, utils/precision.py 26.02-26.08
#: get_precision_config; src/megatron/bridge/perf_recipes/_common.py 26.08 "identical to" it) are "fp8_cs" ->
#: bf16_with_fp8_current_scaling_mixed and "fp8_mx" -> bf16_with_mxfp8_mixed, which set fp8_param_gather = True
#: (with reuse_grad_buf_for_mxfp8_param_ag = True for MXFP8) in src/megatron/bridge/training/mixed_precision.py of
#: every release 25.11-26.08; MixedPrecisionConfig keeps fp8_param (Megatron-Core: build the model under TE
#: fp8_model_init) equal to it. "nvfp4" -> bf16_with_nvfp4_mixed sets fp8_param_gather = False (its fp4_param_gather,
#: True from 26.04, is not modelled: models.core.precision.QUANTIZED_PARAM_BYTES).
FP8_PARAM_GATHER_DTYPES = ("fp8", "fp8-cs", "mxfp8")
#: containers of Megatron-Bridge's performance summary whose recipes are read above
FP8_PARAM_GATHER_CONTAINERS = ("25.11", "26.02", "26.04", "26.06", "26.08")
#: (architecture id, dtype) whose model config turns the quantized weights off again: GPT-OSS 20B
#: (scripts/performance/configs/gpt_oss/gpt_oss_llm_pretrain.py get_gpt_oss_20b_precision_config, 26.06;
#: perf_recipes/gpt_oss/common.py _gpt_oss_20b_fp8mx_precision, 26.08: fp8_param_gather = False) and Kimi K2 with
#: MXFP8 (configs/kimi/kimi_llm_pretrain.py 26.02-26.06, perf_recipes/kimi/<gpu>/kimi_k2.py 26.08: "WAR: MXFP8's
#: fp8_param_gather ..." -> False). Qwen3 30B's GB200 fp8_param_gather = False configs are 16-GPU "dev" variants.
FP8_PARAM_GATHER_OFF = {("gpt-oss-20b", "mxfp8"), ("gpt-oss-20b", "fp8"), ("gpt-oss-20b", "fp8-cs"),
                        ("kimi-k2", "mxfp8")}


def recipe_fp8_params(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with `fp8_param_gather` 1.0 where the run's Megatron-Bridge performance recipe keeps its GEMM weights as
    FP8 parameters (``FP8_PARAM_GATHER_DTYPES`` in the ``FP8_PARAM_GATHER_CONTAINERS``, pretraining and full
    fine-tuning, not ``FP8_PARAM_GATHER_OFF``; null elsewhere: 16-bit weights), recorded in `assumptions`. LoRA runs
    are left out (their frozen base weights under PEFT are not read). Needs memory_preset, arch_id, model_name, dtype,
    framework, assumptions; a frame without them gets a null column."""
    need = ("memory_preset", "arch_id", "model_name", "dtype", "framework")
    if not frame.height or any(c not in frame.columns for c in need):
        return frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("fp8_param_gather"))
    dt = pl.col("dtype").cast(pl.Utf8).str.to_lowercase()
    arch = pl.col("arch_id").cast(pl.Utf8).str.to_lowercase()
    off = pl.lit(False)
    for a, d in FP8_PARAM_GATHER_OFF:
        off = off | ((arch == a) & (dt == d)).fill_null(False)
    container = recipe_container()
    on = ((pl.col("memory_preset") == "megatron_bridge") & dt.is_in(FP8_PARAM_GATHER_DTYPES)
          & container.is_in(FP8_PARAM_GATHER_CONTAINERS) & recipe_task("model_name").is_in(["pretrain", "sft"])
          & ~off).fill_null(False)
    why = pl.format("fp8_param_gather (the run's recipe: Megatron-Bridge {} keeps FP8 weights, no 16-bit copy)",
                    pl.when(dt == "mxfp8").then(pl.lit("bf16_with_mxfp8_mixed"))
                    .otherwise(pl.lit("bf16_with_fp8_current_scaling_mixed")))
    return frame.with_columns(
        pl.when(on).then(pl.lit(1.0)).otherwise(pl.lit(None, dtype=pl.Float64)).alias("fp8_param_gather"),
        pl.when(on).then(pl.concat_str([pl.col("assumptions"), why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


# ---- optimizer state and gradient buffers of NeMo Framework Launcher recipes (NeMo 1, apex DistributedFusedAdam) ----
_NFL = "NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/"
_APEX_BF16_ADAM = (
    " optim: distributed_fused_adam, dtype: bf16, grad_sync_dtype: bf16 (24.07). NVIDIA/NeMo nemo/collections/nlp/"
    "models/language_modeling/megatron_base_model.py setup_optimization (the same in v2.0.0rc0 and r2.0.0rc1, June-"
    "August 2024): store_params = False when the optimizer dtype is the model's (bf16 with megatron_amp_O2), so no "
    "master copy; NVIDIA/apex apex/contrib/optimizers/distributed_fused_adam.py: exp_avg_shard and exp_avg_sq_shard in "
    "dtype (2 + 2 B per parameter, sharded over the data-parallel group), _init_grad_buffer allocates the whole "
    "contiguous gradient buffer (contiguous_grad_buffer, NeMo's default) in grad_sync_dtype (2 B per parameter), which "
    "megatron_amp_O2 uses as main_grad")
#: (architecture id, task, NeMo container) -> (recompute, optimizer state bytes per parameter, gradient bytes per
#: parameter, source): what a NeMo Framework Launcher recipe of that release configures, for the NeMo
#: performance-summary runs of that model and task (task: pretrain, sft or lora, from the run's model_name): its
#: activations_checkpoint_granularity (null -> "none") and its optimizer. The launcher's config for the model is the
#: recipe; its layout (tp, pp, vpp, nodes) is the benchmark's own and comes from the run. Only recipes whose optimizer
#: differs from the preset's (12 B fp32 master + Adam m + v, 4 B fp32 main_grad) are listed, and only those that decide
#: a run's fit. Not listed (their runs fit either way): the launcher's default distributed_fused_adam (fp32 optimizer
#: on a bf16 model: store_param_remainders, 16-bit remainders + fp32 m, v = 10 B, fp32 gradient buffer 4 B;
#: training/gpt3/175b.yaml and most 24.07 configs) and training/gpt3/175b_fp8.yaml (the same with grad_sync_dtype
#: bf16: 10 B and 2 B).
RECIPE_OPTIMIZER: dict[tuple[str, str, str], tuple[str, float, float, str]] = {
    ("nemotron-4-340b", "pretrain", "24.07"): (
        "selective", 4.0, 2.0, _NFL + "training/nemotron/nemotron_340b.yaml (24.07; the release's only Nemotron-4 "
        "340B config, written for the 768-node pretraining: tp 8, pp 12, vpp 8): activations_checkpoint_granularity: "
        "selective;" + _APEX_BF16_ADAM),
    **{(a, "sft", "24.07"): (
        "none", 4.0, 2.0, _NFL + "peft/llama/sft.yaml (24.07; peft_scheme null = SFT, packed_sequence, the Llama "
        "config of the release's SFT stage): activations_checkpoint_granularity: null;" + _APEX_BF16_ADAM)
       for a in ("llama2-7b", "llama2-13b", "llama2-70b")},
}


def recipe_optimizer(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with `optimizer_bytes` and `grad_bytes` (per parameter; null: the preset's) where the run's NeMo
    Framework Launcher recipe configures its own optimizer (``RECIPE_OPTIMIZER``, the ``megatron`` preset's runs whose
    `framework` names the container), and the recipe's recompute where the run states none, recorded in
    `assumptions`. Needs memory_preset, arch_id, model_name, framework, recompute, assumptions; a frame without them
    gets null columns."""
    need = ("memory_preset", "arch_id", "model_name", "framework", "recompute")
    if not frame.height or any(c not in frame.columns for c in need):
        return frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("optimizer_bytes"),
                                  pl.lit(None, dtype=pl.Float64).alias("grad_bytes"))
    key = _recipe_key("megatron", [pl.col("arch_id").cast(pl.Utf8).str.to_lowercase(), recipe_task("model_name"),
                                   recipe_container()])
    rc = _entry(key, RECIPE_OPTIMIZER, 0, pl.Utf8)
    ob = _entry(key, RECIPE_OPTIMIZER, 1, pl.Float64)
    gb = _entry(key, RECIPE_OPTIMIZER, 2, pl.Float64)
    fill_rc = (pl.col("recompute").is_null() & rc.is_not_null()).fill_null(False)
    what = _entry(key, RECIPE_OPTIMIZER, lambda v: f"optimizer state {v[1]:g} B and gradients {v[2]:g} B per "
                                                   f"parameter", pl.Utf8)
    src = _entry(key, RECIPE_OPTIMIZER, 3, pl.Utf8)
    why = pl.concat_str([what, pl.when(fill_rc).then(pl.format(", recompute={}", rc)),
                         pl.format(" (the run's recipe: {})", src)], ignore_nulls=True)
    return frame.with_columns(
        ob.alias("optimizer_bytes"), gb.alias("grad_bytes"),
        pl.when(fill_rc).then(rc).otherwise(pl.col("recompute")).alias("recompute"),
        pl.when(what.is_not_null()).then(pl.concat_str([pl.col("assumptions"), why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


# ---- to MemoryOptions ----------------------------------------------------------------------------------------------
_FIELDS = ("selective_policy", "grad_bytes", "logits_bytes", "logits_chunks", "act_offload_frac",
           "quantized_saves")
#: integer code of each preset (for the array-level API, like models.core.params.*_CODES); -1/unknown -> "default"
PRESET_CODES: dict[str, int] = {k: i for i, k in enumerate(PRESETS)}
_TABLES = {f: np.array([getattr(v, f) for v in PRESETS.values()],
                       dtype=np.int64 if f == "selective_policy" else bool if f == "quantized_saves" else np.float64)
           for f in _FIELDS}
_KEEP_GATHERED = np.array([v.unsharded_weights_with_pp for v in PRESETS.values()])


def preset_codes(preset) -> np.ndarray:
    """Integer codes (PRESET_CODES) of an array of preset names or codes; unknown names -> the 'default' code."""
    a = np.asarray(preset)
    if a.dtype.kind in "iu":
        return np.where((a >= 0) & (a < len(PRESETS)), a, PRESET_CODES["default"]).astype(np.int64)
    uniq, inv = np.unique(a.astype(str), return_inverse=True)
    lut = np.array([PRESET_CODES.get(u, PRESET_CODES["default"]) for u in uniq], dtype=np.int64)
    return lut[inv].reshape(a.shape)


def keeps_stage_gathered(preset, pp) -> np.ndarray:
    """Per row: the stack's FSDP keeps a pipeline stage's weights gathered (and its gradients unsharded) across the
    micro-batches of a step, i.e. the preset says so (``unsharded_weights_with_pp``) and pp > 1. The memory model
    holds the whole stage's weights and gradients (``fsdp_unsharded_stage``) and the time model gathers the weights
    and reduce-scatters the gradients once per step, not per micro-batch (``models.physics.parts.dp_comm``)."""
    return _KEEP_GATHERED[preset_codes(preset)] & (np.asarray(pp, dtype=np.float64) > 1)


def memory_options(preset, pp=None) -> MemoryOptions:
    """The ``models.memory.model.MemoryOptions`` of an array of preset codes (fast: table lookups) or names. ``pp``
    turns on ``fsdp_unsharded_stage`` for presets whose FSDP keeps stage weights gathered."""
    idx = preset_codes(preset)
    out = {f: t[idx] for f, t in _TABLES.items()}
    if pp is not None:
        out["fsdp_unsharded_stage"] = keeps_stage_gathered(idx, pp)
    return MemoryOptions(**out)


def sequence_parallel_default(preset: pl.Expr, tp: pl.Expr, otherwise: pl.Expr | None = None) -> pl.Expr:
    """True where the preset's stack uses sequence parallelism whenever tp > 1, False where it never does; rows
    whose preset does not say (``sequence_parallel_with_tp`` None) take ``otherwise`` (default False)."""
    with_sp = [k for k, v in PRESETS.items() if v.sequence_parallel_with_tp is True]
    without = [k for k, v in PRESETS.items() if v.sequence_parallel_with_tp is False]
    rest = pl.lit(False) if otherwise is None else otherwise
    return (pl.when(preset.is_in(with_sp)).then(tp > 1).when(preset.is_in(without)).then(pl.lit(False))
            .otherwise(rest).alias("sequence_parallel"))


def default_sharding(preset: pl.Expr) -> pl.Expr:
    """The preset's sharding when the source states none."""
    return preset.replace_strict({k: v.default_sharding for k, v in PRESETS.items()}, default="none") \
        .alias("sharding")


def pipeline_micro_batch(preset: pl.Expr, micro_batch: pl.Expr, pp: pl.Expr, vpp: pl.Expr) -> pl.Expr:
    """Sequences per pipeline micro-batch. torchtitan sources state the local batch per data-parallel rank; its
    pipeline schedule splits it into pp x (stages per rank) micro-batches by default (torchtitan
    parallelisms/pipelining_utils.py build_pipeline_schedule: ``n_microbatches = pipeline_parallel_degree *
    len(stages)`` when ``pipeline_parallel_microbatches`` is unset). Other stacks state the micro-batch itself."""
    n_mb = pp * vpp.fill_null(1)
    split = (preset == "torchtitan") & (pp > 1) & (micro_batch % n_mb == 0)
    return pl.when(split).then(micro_batch // n_mb).otherwise(micro_batch).alias("micro_batch")
