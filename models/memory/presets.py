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
``source_interleave(runs)`` (a pipeline interleave a source leaves unstated: the one it states for the same model
and stage split elsewhere). What a run's named recipe sets beyond its stack's preset (recompute, offloading, the
optimizer's bytes, FP8 weights, a stack's default layout) is data, measurements/recipes/, applied by
``models.corpus.recipes``.
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
#: the first NeMo container whose performance recipes (NeMo 2, scripts/performance/llm and the recipes'
#: performance_mode) set ``recipe.trainer.plugins.grad_reduce_in_fp32 = False``: a run of a NeMo release from this one
#: on (the NeMo performance summaries 24.12-25.09, NVIDIA's DGX Cloud benchmarking recipes) keeps its gradient buffer
#: in bf16, as Megatron-Bridge's recipes, their successors, do (preset ``megatron_bridge``)
NEMO2_PERF_RELEASE = "24.12"
#: a NeMo container release as the performance summaries and recipes name it ("NeMo 25.02", "NeMo Framework 25.04.01",
#: "Megatron-Bridge / NeMo 26.04"); not MLPerf's "NVIDIA NeMo Framework Release 24.09" (its own implementation)
NEMO2_RELEASE_PATTERN = r"(?i)nemo(?: framework)?[^0-9a-z]{0,3}(\d\d\.\d\d)(?:\.\d+)?\b"


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


# ---- a pipeline interleave a source leaves unstated ------------------------------------------------------------
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
