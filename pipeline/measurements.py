"""The measurement schema and its row-level validation (pure: DataFrames in, DataFrames out).

A measurement file is long form: one row = one number (`metric`, `value`, `unit`) for one run (`run_id`),
with the run's architecture, layout and hardware repeated on each of its rows and its provenance
(`source`, `source_ref`). `measurements/DATA_CARD.md` describes every column.

`validate(frame, file, known_hardware)` takes the file's cells as strings plus a `_line` column (the
1-based line of the row in the file; for Parquet and JSON the 1-based row/record number) and splits it into accepted rows
(typed) and rejected rows `(file, line, column, value, reason)`. Every rule is a vectorized polars
expression evaluated in two passes (one boolean per row over all rules, then the reasons for the
flagged rows only); numbers are parsed once and the typed columns are those parsed numbers: about 0.45 s
per 250,000 rows on the shared 2-core development machine (benchmarks/bench_ingest.py). Several files can
be validated at once (a `_file` column).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from models.memory.model import MAXTEXT_REMAT

#: every column of the measurement schema, in file order
COLUMNS: tuple[str, ...] = (
    "run_id", "source", "source_ref", "year", "model_name", "arch", "params_b", "active_params_b",
    "n_layers", "d_model", "n_heads", "n_kv_heads", "ffn_dim", "vocab", "seq_len", "global_batch_seqs",
    "micro_batch", "gpu", "gpu_as_reported", "n_gpus", "gpus_per_node", "framework", "dtype", "tp", "pp",
    "dp", "cp", "ep", "vpp", "sharding", "recompute", "metric", "value", "unit", "derived", "notes",
    "inter_node_bw_gbps",
)
#: a file without any of these is rejected whole
REQUIRED: tuple[str, ...] = ("run_id", "source", "source_ref", "model_name", "gpu", "metric", "value", "unit")

INT_COLUMNS: dict[str, tuple[int, int]] = {
    # column: (min, max) inclusive; the max is an absurd-magnitude guard, not a physical limit
    "year": (1990, 2100),
    "n_layers": (1, 10_000),
    "d_model": (1, 1_000_000),
    "n_heads": (1, 100_000),
    "n_kv_heads": (1, 100_000),
    "ffn_dim": (1, 10_000_000),
    "vocab": (1, 100_000_000),
    "seq_len": (1, 100_000_000),
    "global_batch_seqs": (1, 100_000_000),
    "micro_batch": (1, 1_000_000),
    "n_gpus": (1, 100_000_000),
    "gpus_per_node": (1, 100_000),
    "tp": (1, 1_000_000),
    "pp": (1, 1_000_000),
    "dp": (1, 100_000_000),
    "cp": (1, 1_000_000),
    "ep": (1, 1_000_000),
    "vpp": (1, 10_000),
}
FLOAT_COLUMNS: dict[str, tuple[float, float]] = {
    "params_b": (1e-6, 1e6),
    "active_params_b": (1e-6, 1e6),
    # the cluster's scale-out network per accelerator, one direction, GB/s (the hardware table's unit), when it
    # differs from the hardware's typical one (e.g. 4 NICs per 8-GPU node instead of 8)
    "inter_node_bw_gbps": (1e-3, 1e5),
}
ENUMS: dict[str, tuple[str, ...]] = {
    "arch": ("dense", "moe", "hybrid-mamba-moe"),
    "dtype": ("fp32", "tf32", "bf16", "fp16", "fp8", "fp8-cs", "mxfp8", "nvfp4"),
    "sharding": ("none", "zero1", "zero2", "zero3", "fsdp", "hsdp"),
    "recompute": ("none", "selective", "full", "unknown"),
    "derived": ("yes", "no"),
}
#: common spellings of a training precision -> the schema's `dtype` vocabulary (ENUMS["dtype"]), for the lenient
#: `stepcast predict --runs` path only (`canonical_dtype`); a measurement file must still use the vocabulary itself.
#: Keys are compared by `dtype_key` (lower case, without spaces, '_', '-', '.', '(' and ')'). Sources: PyTorch's
#: dtype names (torch.bfloat16, torch.float16 / half, torch.float32); Lightning's precision flags ("bf16-mixed",
#: "16-mixed", "32-true"); TransformerEngine's FP8 recipes (DelayedScaling, the default, with E4M3 or HYBRID
#: E4M3/E5M2 formats -> fp8; Float8CurrentScaling and torchao's "tensorwise" float8 -> fp8-cs; MXFP8BlockScaling ->
#: mxfp8; NVFP4BlockScaling, E2M1 data -> nvfp4). "mixed"/"amp" name no format: `MIXED_PRECISION`, resolved by the
#: accelerator (`pipeline.predict_runs.resolve_dtype_spellings`).
MIXED_PRECISION = "mixed"
DTYPE_SPELLINGS: dict[str, str] = {
    **{k: "fp32" for k in ("fp32", "float32", "float", "single", "32", "32-true", "torch.float32", "full")},
    **{k: "tf32" for k in ("tf32", "tensorfloat32", "tensorfloat-32")},
    **{k: "bf16" for k in ("bf16", "bfloat16", "torch.bfloat16", "bf16-mixed", "bf16 mixed", "bf16 amp", "amp bf16",
                           "brainfloat16", "bf16-true")},
    **{k: "fp16" for k in ("fp16", "float16", "half", "torch.float16", "16", "16-mixed", "fp16 mixed", "fp16 amp",
                           "amp fp16", "16-true")},
    **{k: "fp8" for k in ("fp8", "float8", "fp8 delayed", "fp8 delayed scaling", "fp8 (delayed scaling)",
                          "delayed scaling", "fp8 e4m3", "e4m3", "fp8 hybrid", "fp8 (hybrid)", "te fp8",
                          "transformer engine fp8", "fp8 te")},
    **{k: "fp8-cs" for k in ("fp8-cs", "fp8 current scaling", "fp8 (current scaling)", "current scaling",
                             "fp8 tensorwise", "float8 tensorwise", "tensorwise", "fp8 per-tensor current scaling")},
    **{k: "mxfp8" for k in ("mxfp8", "mx fp8", "mxfp8 block scaling", "fp8 mx")},
    **{k: "nvfp4" for k in ("nvfp4", "fp4", "float4", "nv fp4", "e2m1", "fp4 e2m1")},
    **{k: MIXED_PRECISION for k in ("mixed", "mixed precision", "amp", "automatic mixed precision", "autocast",
                                    "torch.amp", "mp")},
}
_DTYPE_KEY_IGNORED = r"[\s_.()\-]"


def dtype_key(expr: pl.Expr) -> pl.Expr:
    """A dtype spelling as `DTYPE_SPELLINGS` compares it: lower case, without spaces, '_', '-', '.', '(' and ')'."""
    return expr.cast(pl.Utf8).str.strip_chars().str.to_lowercase().str.replace_all(_DTYPE_KEY_IGNORED, "")


#: DTYPE_SPELLINGS by `dtype_key`
_DTYPE_BY_KEY = {re.sub(_DTYPE_KEY_IGNORED, "", k.lower()): v for k, v in DTYPE_SPELLINGS.items()}


#: a dtype spelling the table does not list, by the words it contains (first match wins; on the lower-case text):
#: a block-scaled or 4-bit format before the plain FP8 it names, current/per-tensor/row-wise scaling (computed from
#: the tensor at each cast, as Transformer Engine's Float8CurrentScaling and torchao's tensorwise/rowwise recipes do)
#: before delayed scaling, the FP8 default of Transformer Engine
DTYPE_KEYWORDS: tuple[tuple[str, str], ...] = (
    (r"mx\s*-?\s*fp8|mxfp8|fp8.*\bmx\b|\bmx\b.*(fp8|float8)", "mxfp8"),
    (r"nvfp4|fp4|float4|e2m1", "nvfp4"),
    (r"(fp8|float8|e4m3|e5m2).*(current|tensorwise|tensor-wise|per[\s-]*tensor|rowwise|row-wise|dynamic)|"
     r"(current|tensorwise|rowwise|dynamic).*(fp8|float8)", "fp8-cs"),
    (r"fp8|float8|e4m3|e5m2", "fp8"),
    (r"bf16|bfloat", "bf16"),
    (r"fp16|float16|half", "fp16"),
    (r"tf32", "tf32"),
    (r"fp32|float32", "fp32"),
)


def by_keywords(expr: pl.Expr, rules: tuple[tuple[str, str], ...]) -> pl.Expr:
    """The word of the first rule whose pattern the lower-case text contains, null when none does."""
    text = expr.cast(pl.Utf8).str.to_lowercase()
    out = pl.lit(None, dtype=pl.Utf8)
    for pattern, word in reversed(rules):
        out = pl.when(text.str.contains(pattern)).then(pl.lit(word)).otherwise(out)
    return out


def canonical_dtype(expr: pl.Expr) -> pl.Expr:
    """The schema's dtype for a spelling (`DTYPE_SPELLINGS`; `MIXED_PRECISION` for "mixed"/"amp"), else by the words
    it contains (`DTYPE_KEYWORDS`: "FP8 (E4M3)", "float8 rowwise"), null for one neither knows (and for null)."""
    return pl.coalesce(dtype_key(expr).replace_strict(_DTYPE_BY_KEY, default=None, return_dtype=pl.Utf8),
                       by_keywords(expr, DTYPE_KEYWORDS))


#: metric -> (accepted units, lower bound (exclusive), upper bound (inclusive))
METRICS: dict[str, tuple[tuple[str, ...], float, float]] = {
    "step_time_s": (("s",), 0.0, 86_400.0),
    "tokens_per_s": (("tokens/s",), 0.0, 1e11),
    "tokens_per_s_per_gpu": (("tokens/s/GPU",), 0.0, 1e7),
    "model_tflops_per_gpu": (("TFLOP/s/GPU",), 0.0, 50_000.0),
    "mfu": (("fraction",), 0.0, 1.0),
    "hfu": (("fraction",), 0.0, 1.0),
    "time_to_train_min": (("min",), 0.0, 1e7),
    "gpu_hours": (("GPU-hours", "chip-hours", "GPU-hours per 1T tokens"), 0.0, 1e11),
}
#: common spellings of a data-parallel sharding and of an activation recomputation -> the schema's `sharding` and
#: `recompute` vocabularies (ENUMS), for the lenient `predict --runs` path only (`canonical_word`; compared by
#: `word_key`: lower case, letters and digits only). Sources: DeepSpeed's ZeRO stages ("zero_optimization.stage"
#: 0-3; Rajbhandari et al. 2020), PyTorch FSDP's ShardingStrategy (FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2,
#: NO_SHARD = DDP, HYBRID_SHARD = HSDP) and FSDP2's fully_shard, Megatron-LM's --use-distributed-optimizer (the
#: optimizer state sharded: ZeRO-1); Megatron-LM's --recompute-granularity full|selective and the older
#: --checkpoint-activations (full), Hugging Face's gradient_checkpointing (full), torchtitan's activation
#: checkpoint modes (full, selective / op SAC), MaxText's remat policies (full, minimal, save_*: selective).
SHARDING_SPELLINGS: dict[str, str] = {
    **dict.fromkeys(("none", "no", "ddp", "dataparallel", "distributeddataparallel", "plaindp", "nosharding",
                     "noshard", "zero0", "zerostage0", "stage0", "0", "false", "replicate", "replicated"), "none"),
    **dict.fromkeys(("zero1", "zerostage1", "stage1", "1", "distributedoptimizer", "distoptimizer", "distopt",
                     "usedistributedoptimizer", "optimizerstatesharding", "optimizersharding"), "zero1"),
    **dict.fromkeys(("zero2", "zerostage2", "stage2", "2", "shardgradop", "gradientsharding"), "zero2"),
    **dict.fromkeys(("zero3", "zerostage3", "stage3", "3", "zeroinfinity"), "zero3"),
    **dict.fromkeys(("fsdp", "fsdp1", "fsdp2", "fullshard", "fullyshard", "fullysharded", "fullyshardeddataparallel",
                     "fullyshardeddp", "torchfsdp", "pytorchfsdp"), "fsdp"),
    **dict.fromkeys(("hsdp", "hybridshard", "hybridsharded", "hybridfsdp", "fsdphybrid", "hybridshardeddataparallel",
                     "hybridshardzero2"), "hsdp"),
}
RECOMPUTE_SPELLINGS: dict[str, str] = {
    **dict.fromkeys(("none", "no", "false", "off", "0", "disabled", "noac", "norecompute", "noremat",
                     "noactivationcheckpointing", "nocheckpointing"), "none"),
    **dict.fromkeys(("selective", "selectiveac", "selectiverecompute", "selectiverecomputation", "op", "opsac",
                     "sac", "partial", "coreattention", "attention",
                     # MaxText's save-list remat policies (models.memory.model.MAXTEXT_REMAT: minimal, save_qkv_proj, ...)
                     *(k.replace("_", "") for k in MAXTEXT_REMAT)), "selective"),
    **dict.fromkeys(("full", "true", "yes", "on", "1", "fullac", "activationcheckpointing", "fullactivationcheckpointing",
                     "fullrecompute", "fullrecomputation", "activationrecomputation", "gradientcheckpointing",
                     "checkpointactivations", "block", "uniform", "fullremat", "remat"), "full"),
    # MaxText's remat_policy "custom" saves and offloads the tensors its config names (tensors_on_device,
    # tensors_to_offload), which a row does not give
    **dict.fromkeys(("unknown", "na", "n/a", "?", "custom"), "unknown"),
}


_WORD_KEY_IGNORED = r"[^a-z0-9]"


def word_key(expr: pl.Expr) -> pl.Expr:
    """A sharding or recompute spelling as the tables compare it: lower case, letters and digits only."""
    return expr.cast(pl.Utf8).str.strip_chars().str.to_lowercase().str.replace_all(_WORD_KEY_IGNORED, "")


#: SHARDING_SPELLINGS and RECOMPUTE_SPELLINGS by `word_key`, per schema column
_WORDS_BY_KEY = {col: {re.sub(_WORD_KEY_IGNORED, "", k.lower()): v for k, v in table.items()}
                 for col, table in (("sharding", SHARDING_SPELLINGS), ("recompute", RECOMPUTE_SPELLINGS))}


#: a sharding or recompute spelling the tables do not list, by the words it contains (first match wins, on the
#: lower-case text): the most specific first ("hybrid" before "shard", "selective" and its kinds before "full"
#: and before a bare "recompute"/"checkpointing", which without a qualifier means full, as in the tables above)
WORD_KEYWORDS: dict[str, tuple[tuple[str, str], ...]] = {
    "sharding": (
        (r"hsdp|hybrid", "hsdp"),
        (r"zero[\s_-]*(stage)?[\s_-]*3|stage[\s_-]*3", "zero3"),
        (r"zero[\s_-]*(stage)?[\s_-]*2|stage[\s_-]*2|grad(ient)?s?[\s_-]*(and|\+|&)?[\s_-]*opt", "zero2"),
        (r"fsdp|full(y)?[\s_-]*shard", "fsdp"),
        (r"zero[\s_-]*(stage)?[\s_-]*1|stage[\s_-]*1|dist(ributed)?[\s_-]*opt|optim\w*[\s_-]*(state[\s_-]*)?shard",
         "zero1"),
        (r"\bddp\b|\bnone\b|\bno\b|replicat", "none"),
    ),
    "recompute": (
        (r"selective|\bsac\b|core[\s_-]*att|attention[\s_-]*core|\bop\b|partial|save[\s_-]", "selective"),
        (r"\bfull\b|uniform|\bblock\b|every[\s_-]*layer|all[\s_-]*layers", "full"),
        (r"\bnone\b|\bno\b|\boff\b|disabled|\bfalse\b", "none"),
        (r"checkpoint|recomput|remat", "full"),
    ),
}


def canonical_word(expr: pl.Expr, column: str) -> pl.Expr:
    """The schema's word for a spelling of `column` ("sharding": SHARDING_SPELLINGS, "recompute":
    RECOMPUTE_SPELLINGS), else by the words it contains (`WORD_KEYWORDS`: "Megatron distributed optimizer",
    "full (uniform)", "per-op SAC"), null for one neither knows (and for null)."""
    return pl.coalesce(word_key(expr).replace_strict(_WORDS_BY_KEY[column], default=None, return_dtype=pl.Utf8),
                       by_keywords(expr, WORD_KEYWORDS[column]))


#: header spellings of hand-written run files -> the schema's column, for the lenient `predict --runs` path (the
#: ingest keeps the schema's own names). Keys are compared lower-case with spaces, '-' and '.' read as '_'; the
#: right-hand names follow Megatron-LM / Hugging Face argument names and common table headers.
COLUMN_SYNONYMS: dict[str, str] = {
    **dict.fromkeys(("id", "run", "run_name", "name", "experiment"), "run_id"),
    **dict.fromkeys(("model", "model_id", "model_name_or_path", "checkpoint"), "model_name"),
    **dict.fromkeys(("gpu_type", "gpu_model", "accelerator", "accelerator_type", "hardware", "device", "device_type",
                     "chip", "system", "gpu_name", "accelerator_name", "accelerator_model_name", "gpu_model_name"),
                    "gpu"),
    **dict.fromkeys(("num_gpus", "n_gpu", "gpus", "gpu_count", "world_size", "num_devices", "n_devices", "devices",
                     "num_accelerators", "n_accelerators", "num_chips", "n_chips", "chips", "num_gpu",
                     "total_gpus", "accelerators", "num_accelerator", "total_accelerators"), "n_gpus"),
    # MLPerf Training's system descriptions: "accelerators_per_node", "accelerator_model_name"
    **dict.fromkeys(("gpus_per_host", "num_gpus_per_node", "n_gpus_per_node", "devices_per_node", "gpus_node",
                     "gpu_per_node", "gpus_per_server", "chips_per_host", "gpus_host", "accelerators_per_node",
                     "chips_per_node", "accelerators_per_host", "devices_per_host"), "gpus_per_node"),
    **dict.fromkeys(("global_batch_size", "global_batch", "gbs", "batch_size", "global_batch_size_seqs",
                     "globalbatchsize", "global_batch_sequences", "batch_size_seqs"), "global_batch_seqs"),
    # llm-foundry's benchmark table: "MicroBatchSize", "SeqLen (T)"
    **dict.fromkeys(("micro_batch_size", "mbs", "micro_batch_seqs", "microbatchsize", "micro_bs"), "micro_batch"),
    **dict.fromkeys(("seq_length", "sequence_length", "seqlen", "max_seq_len", "max_seq_length", "context_length",
                     "encoder_seq_length", "seqlen_t", "seq_len_t", "sequence_length_t", "seq_len_tokens", "seq",
                     "sequence", "ctx_len", "context_len", "context_size", "context_window", "seq_length_tokens",
                     "sequence_len", "max_position_embeddings_used", "max_sequence_length"),
                    "seq_len"),
    **dict.fromkeys(("tensor_parallel", "tensor_parallel_size", "tensor_model_parallel_size", "tp_size"), "tp"),
    **dict.fromkeys(("pipeline_parallel", "pipeline_parallel_size", "pipeline_model_parallel_size", "pp_size"), "pp"),
    **dict.fromkeys(("data_parallel", "data_parallel_size", "dp_size"), "dp"),
    **dict.fromkeys(("context_parallel", "context_parallel_size", "cp_size"), "cp"),
    **dict.fromkeys(("expert_parallel", "expert_parallel_size", "expert_model_parallel_size", "ep_size"), "ep"),
    # NeMo's and Megatron-Bridge's performance tables: "VP"
    **dict.fromkeys(("virtual_pipeline", "virtual_pipeline_model_parallel_size", "vpp_size", "interleave", "vp",
                     "vp_size", "virtual_pipeline_parallel", "virtual_pipeline_size"), "vpp"),
    **dict.fromkeys(("precision", "data_type", "compute_dtype"), "dtype"),
    **dict.fromkeys(("num_layers", "layers", "n_layer", "num_hidden_layers"), "n_layers"),
    **dict.fromkeys(("hidden_size", "d_hidden", "n_embd"), "d_model"),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "attention_heads", "heads"), "n_heads"),
    **dict.fromkeys(("num_key_value_heads", "num_query_groups", "n_kv_head"), "n_kv_heads"),
    **dict.fromkeys(("intermediate_size", "ffn_hidden_size", "d_ff"), "ffn_dim"),
    **dict.fromkeys(("vocab_size", "padded_vocab_size"), "vocab"),
    **dict.fromkeys(("params_billion", "params_billions", "size_b", "model_size", "parameters", "params",
                     "num_params", "num_parameters", "parameter_count", "model_size_b", "numparams"), "params_b"),
    # DeepSpeed's ZeRO stage (0-3), PyTorch FSDP's sharding strategy (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD)
    **dict.fromkeys(("zero_stage", "zero", "deepspeed_zero_stage", "zero_optimization_stage", "sharding_strategy",
                     "fsdp_sharding_strategy", "fsdp_strategy", "mp_mode_sharding"), "sharding"),
    **dict.fromkeys(("activation_checkpointing", "recompute_granularity", "activation_recomputation"), "recompute"),
    **dict.fromkeys(("library", "trainer", "software", "stack"), "framework"),
}
#: headers of quantities the schema states another way: a node count (n_gpus = nodes x GPUs per node) and a global
#: batch in tokens (global_batch_seqs = tokens / seq_len); read by `pipeline.predict_runs.read_headers`
NODES_HEADERS = ("nodes", "num_nodes", "n_nodes", "node_count", "nnodes", "hosts", "num_hosts")
BATCH_TOKENS_HEADERS = ("global_batch_tokens", "batch_size_tokens", "tokens_per_batch", "batch_tokens",
                        "global_batch_size_tokens", "tokens_per_step", "gbs_tokens", "tokens_batch",
                        "batch_size_in_tokens", "global_batch_size_in_tokens", "global_batch_in_tokens",
                        "tokens_per_global_batch", "globalbatchsize_t", "global_batch_size_t", "gbs_t",
                        "global_batch_t")
#: headers of a layout written in one cell ("TP8 PP16 DP64", "FSDP 32, TP 8", "tp=8, pp=4") and of a batch per
#: data-parallel rank ("local batch size": torchtitan's tables; Hugging Face's per_device_train_batch_size), read by
#: `pipeline.predict_runs.stated_otherwise`
PARALLELISM_HEADERS = ("parallelism", "parallel_config", "parallelism_config", "layout", "parallel_layout",
                       "parallel_strategy", "parallelization", "parallelism_strategy", "sharding_parallelism")
GRAD_ACCUM_HEADERS = ("grad_accum", "gradient_accumulation_steps", "grad_accumulation", "gradient_accumulation",
                      "grad_acc", "grad_accum_steps", "accumulation_steps", "gas", "batch_accumulation_per_replica",
                      "ga", "gradaccum")
LOCAL_BATCH_HEADERS = ("local_batch_size", "local_batch", "local_bs", "batch_size_per_gpu", "per_gpu_batch_size",
                       "batch_per_gpu", "per_device_batch_size", "per_device_train_batch_size", "batch_size_per_device",
                       "batch_size_per_rank", "batch_size_dp", "batch_per_dp", "batch_size_per_dp",
                       "per_dp_batch_size")
#: spellings of a measured quantity, as a wide column (one per metric) or a `metric` value -> (the schema's metric,
#: factor to its unit): milliseconds to seconds, percent to a fraction
METRIC_SYNONYMS: dict[str, tuple[str, float]] = {
    **{k: ("tokens_per_s_per_gpu", 1.0) for k in (
        "tokens_per_s_per_gpu", "tokens_per_second_per_gpu", "tokens_per_sec_per_gpu", "tokens_s_gpu", "tok_s_gpu",
        "tgs", "tokens_per_gpu_per_s", "tokens_per_gpu_per_second", "throughput_tokens_per_s_per_gpu",
        "tokens_per_s_per_device", "tokens_per_second_per_device", "tokens_per_s_per_chip", "tokens_sec_gpu",
        "tokens_second_gpu", "tok_sec_gpu", "tokens_per_sec_gpu", "tokens_s_device",
        "tokens_sec_device", "tokens_s_chip", "tokens_per_gpu_per_sec",
        # torchtitan's training log: "wps" (words, i.e. tokens, per second on each rank)
        "wps",
        # "Throughput per GPU (tokens/s)"; torchtitan's "TPS/GPU" and its log's "tps" (tokens per second per device);
        # llm-foundry's "Throughput (T/s/GPU)"
        "throughput_per_gpu_tokens_s", "per_gpu_tokens_s", "tps_gpu", "tps_per_gpu", "tps", "t_s_gpu")},
    **{k: ("tokens_per_s", 1.0) for k in (
        "tokens_per_s", "tokens_per_second", "tokens_per_sec", "tokens_s", "throughput_tokens_per_s",
        # llm-foundry's "Throughput (T/s)"
        "t_s")},
    **{k: ("step_time_s", 1.0) for k in (
        "step_time_s", "step_time", "step_time_sec", "iteration_time", "iteration_time_s", "iter_time", "iter_time_s",
        "time_per_step", "time_per_step_s", "time_per_iteration", "seconds_per_step", "elapsed_time_per_iteration_s",
        # NeMo's log "train_step_timing in s"
        "step_timing_in_s", "step_timing_s", "step_timing")},
    **{k: ("step_time_s", 1e-3) for k in (
        "step_time_ms", "iteration_time_ms", "iter_time_ms", "time_per_step_ms", "elapsed_time_per_iteration_ms")},
    **{k: ("mfu", 1.0) for k in ("mfu", "bf16_mfu", "mfu_bf16", "model_flops_utilization", "model_flop_utilization")},
    **{k: ("mfu", 0.01) for k in ("mfu_pct", "mfu_percent", "bf16_mfu_pct", "mfu_bf16_pct",
                                   "model_flops_utilization_pct")},
    **{k: ("hfu", 1.0) for k in ("hfu", "hardware_flops_utilization", "hardware_flop_utilization")},
    **{k: ("hfu", 0.01) for k in ("hfu_pct", "hfu_percent", "hardware_flops_utilization_pct")},
    **{k: ("model_tflops_per_gpu", 1.0) for k in (
        "model_tflops_per_gpu", "tflops_per_gpu", "tflops", "model_tflops", "tflop_s_per_gpu", "tflops_gpu",
        "achieved_tflops_per_gpu", "tflops_per_device", "tflops_sec_gpu", "tflops_s_gpu", "tflop_s_gpu",
        "model_tflops_s_gpu", "model_tflop_s_gpu", "tflops_per_sec_per_gpu", "tflops_gpu_s",
        # the Megatron-LM README's "Achieved teraFLOP/s per GPU"
        "achieved_teraflop_s_per_gpu", "teraflop_s_per_gpu", "teraflops_per_gpu", "achieved_tflop_s_per_gpu")},
}
#: throughput counted in samples (sequences) -> the schema's token metric: value x the row's seq_len (Hugging Face
#: Trainer's train_samples_per_second, Megatron-LM's "samples per second" log)
SAMPLES_SYNONYMS: dict[str, str] = {
    **dict.fromkeys(("samples_per_second", "samples_per_sec", "samples_per_s", "samples_s", "samples_sec",
                     "train_samples_per_second", "sequences_per_second", "seqs_per_second", "seqs_s",
                     "throughput_samples_per_second", "throughput_samples_s"), "tokens_per_s"),
    **dict.fromkeys(("samples_per_second_per_gpu", "samples_per_sec_per_gpu", "samples_s_gpu", "samples_sec_gpu",
                     "samples_per_s_per_gpu", "sequences_per_second_per_gpu", "samples_per_second_per_device"),
                    "tokens_per_s_per_gpu"),
}
#: a `metric` value's header key -> (the schema's metric, factor to its unit): `METRIC_SYNONYMS` and every schema
#: metric under its own name, so that "MFU", "Step_Time_S" or "GPU hours" are read like mfu, step_time_s, gpu_hours
METRIC_VALUE_KEYS: dict[str, tuple[str, float]] = {**{m: (m, 1.0) for m in METRICS}, **METRIC_SYNONYMS}

#: word spellings `metric_key` reads alike, in order: "per" is dropped, a second is "s", a token is "tokens", a
#: device, chip or accelerator is a "gpu", a TFLOP/s is "tflops"
_METRIC_WORDS = (("_per_", "_"), ("_second_", "_s_"), ("_seconds_", "_s_"), ("_sec_", "_s_"), ("_tok_", "_tokens_"),
                 ("_token_", "_tokens_"), ("_device_", "_gpu_"), ("_chip_", "_gpu_"), ("_accelerator_", "_gpu_"),
                 ("_teraflops_", "_tflops_"), ("_teraflop_", "_tflops_"), ("_tflop_", "_tflops_"),
                 ("_tflops_s_", "_tflops_"))
#: leading words that qualify a measured quantity without changing it ("Throughput (tokens/s)", "Achieved TFLOPS")
_METRIC_QUALIFIERS = ("throughput", "achieved", "average", "avg", "mean", "measured", "training", "train", "perf",
                      "performance")


def metric_key(key: str) -> str:
    """A metric header key (`header_key`) in canonical words (`_METRIC_WORDS`, leading `_METRIC_QUALIFIERS`
    dropped): "Throughput (tokens/s)", "Tokens/sec/GPU", "model TFLOPS/GPU" and "tokens_per_second_per_device" read as
    tokens_s, tokens_s_gpu, model_tflops_gpu and tokens_s_gpu."""
    k = f"_{key}_"
    for a, b in _METRIC_WORDS:
        while a in k:
            k = k.replace(a, b)
    k = k.strip("_")
    head, _, rest = k.partition("_")
    while head in _METRIC_QUALIFIERS and rest:
        k = rest
        head, _, rest = k.partition("_")
    return k


def _by_metric_key(table: dict) -> dict:
    out: dict = {}
    for k, v in table.items():
        c = metric_key(k)
        if out.get(c, v) != v:
            raise ValueError(f"metric spellings {k!r} and another read alike ({c!r}) but mean different things")
        out[c] = v
    return out


_METRIC_CANON = _by_metric_key(METRIC_SYNONYMS)
_SAMPLES_CANON = _by_metric_key(SAMPLES_SYNONYMS)
_VALUE_CANON = _by_metric_key(METRIC_VALUE_KEYS)


def metric_synonym(key: str):
    """(the schema's metric, factor) a metric header key names in canonical words (`METRIC_SYNONYMS`), else None.
    Every spelling of the table reads as itself: `_by_metric_key` refuses two that read alike and differ."""
    return _METRIC_CANON.get(metric_key(key))


def samples_synonym(key: str):
    """The token metric a samples-per-second header key becomes (`SAMPLES_SYNONYMS`, in canonical words)."""
    return _SAMPLES_CANON.get(metric_key(key))


def metric_value_key(key: str):
    """(the schema's metric, factor) a `metric` cell's header key names (`METRIC_VALUE_KEYS`, in canonical words)."""
    return _VALUE_CANON.get(metric_key(key))


def header_key(name: str) -> str:
    """A header as `COLUMN_SYNONYMS` and `METRIC_SYNONYMS` compare it: lower case, '%' as 'pct', '#' and "number
    of" as 'num', spaces, brackets, '-', '.' and '/' as '_', runs of '_' collapsed ("MFU (%)" -> mfu_pct, "Step time
    [ms]" -> step_time_ms, "# GPUs" and "Number of GPUs" -> num_gpus)."""
    key = str(name).strip().lower().replace("%", "pct").replace("#", " num ")
    key = re.sub(r"_+", "_", re.sub(r"[\s\-./()\[\]]", "_", key)).strip("_")
    # "Number of GPUs", "No. of GPUs", "# of GPUs" -> num_gpus
    return re.sub(r"(^|_)(?:number|no|num)_of(?=_|$)", r"\1num", key)


#: columns that describe the run; every row of one run must agree on them (source_ref may differ: one run's
#: numbers can come from different tables of one publication)
RUN_COLUMNS: tuple[str, ...] = tuple(
    c for c in COLUMNS if c not in ("metric", "value", "unit", "derived", "notes", "source_ref")
)
#: the longest cell accepted (a guard against runaway quoting and binary junk)
MAX_FIELD_CHARS = 10_000

SCHEMA: dict[str, pl.DataType] = {
    c: (pl.Int64 if c in INT_COLUMNS else pl.Float64 if c in FLOAT_COLUMNS or c == "value" else pl.Utf8)
    for c in COLUMNS
}


@dataclass
class Validated:
    accepted: pl.DataFrame  # typed, COLUMNS + source_line
    rejected: pl.DataFrame  # file, line, column, value, reason
    duplicates_dropped: int  # exact duplicate (run_id, metric, value) rows dropped
    duplicates_by_file: dict[str, int] | None = None  # the same, per file (several files validated at once)


REJECT_SCHEMA = {"file": pl.Utf8, "line": pl.Int64, "column": pl.Utf8, "value": pl.Utf8, "reason": pl.Utf8}


def empty_rejections() -> pl.DataFrame:
    return pl.DataFrame(schema=REJECT_SCHEMA)


def missing_required(columns: list[str]) -> list[str]:
    return [c for c in REQUIRED if c not in columns]


def _blank(col: str) -> pl.Expr:
    return pl.col(col).is_null() | (pl.col(col).str.strip_chars() == "")


def _null(col: str) -> pl.Expr:
    """Blank cell, once cells are normalised (stripped, empty -> null) as `validate` does first."""
    return pl.col(col).is_null()


def _rule(mask: pl.Expr, column: str, reason: pl.Expr | str) -> tuple[pl.Expr, pl.Expr]:
    """One rejection rule: (mask, a struct (column, reason) where `mask` is true, else null)."""
    reason_expr = pl.lit(reason) if isinstance(reason, str) else reason
    return mask, pl.when(mask).then(pl.struct(pl.lit(column).alias("column"), reason_expr.alias("reason")))


def _num(col: str) -> pl.Expr:
    """The cell as a number (validate adds these columns once, so that rules do not re-parse strings)."""
    return pl.col(f"_num_{col}")


def _number_rules(col: str, lo: float, hi: float, integer: bool) -> list[tuple[pl.Expr, pl.Expr]]:
    num = _num(col)
    present = ~_null(col)
    kind = "an integer" if integer else "a number"
    rules = [
        _rule(present & num.is_null(), col, f"expected {kind}"),
        _rule(present & num.is_nan(), col, "NaN is not a measurement"),
        _rule(present & num.is_infinite(), col, "infinite value"),
        _rule(present & num.is_finite() & ((num < lo) | (num > hi)), col, f"out of range: expected {lo:g}..{hi:g}"),
    ]
    if integer:
        rules.append(_rule(present & num.is_finite() & (num != num.round(0)), col, "expected an integer"))
    return rules


NUMERIC_INPUTS: tuple[str, ...] = (*INT_COLUMNS, *FLOAT_COLUMNS, "value")


def _rules(known_hardware: set[str] | None) -> list[tuple[pl.Expr, pl.Expr]]:
    rules: list[tuple[pl.Expr, pl.Expr]] = []
    for col in ("run_id", "source", "source_ref", "model_name", "gpu", "metric", "value", "unit"):
        what = "provenance" if col in ("source", "source_ref") else "a value"
        rules.append(_rule(_null(col), col, f"missing {what} (required)"))
    rules.append(_rule(pl.col("run_id").str.contains(r"[\s,;]"), "run_id", "run_id must not contain spaces, commas or semicolons"))
    for col, (lo, hi) in INT_COLUMNS.items():
        rules += _number_rules(col, lo, hi, integer=True)
    for col, (lo, hi) in FLOAT_COLUMNS.items():
        rules += _number_rules(col, lo, hi, integer=False)
    for col, allowed in ENUMS.items():
        rules.append(
            _rule(~_null(col) & ~pl.col(col).is_in(list(allowed)), col,
                  f"expected one of {', '.join(allowed)}")
        )
    metric = pl.col("metric")
    rules.append(_rule(~_null("metric") & ~metric.is_in(list(METRICS)), "metric",
                       f"unknown metric; expected one of {', '.join(METRICS)}"))
    value = _num("value")
    present = ~_null("value")
    rules.append(_rule(present & value.is_null(), "value", "expected a number"))
    rules.append(_rule(present & value.is_nan(), "value", "NaN is not a measurement"))
    rules.append(_rule(present & value.is_infinite(), "value", "infinite value"))
    for name, (units, lo, hi) in METRICS.items():
        is_metric = metric == name
        rules.append(_rule(is_metric & ~_null("unit") & ~pl.col("unit").is_in(list(units)), "unit",
                           f"unit for {name} must be {' or '.join(units)}"))
        finite = is_metric & value.is_finite()
        if name in ("mfu", "hfu"):
            rules.append(_rule(finite & (value > 1.0) & (value <= 100.0), "value",
                               f"{name} looks like a percent; give a fraction 0 < {name} <= 1"))
            rules.append(_rule(finite & ((value <= 0.0) | (value > 100.0)), "value",
                               f"{name} out of range: expected 0 < {name} <= 1"))
        elif name == "step_time_s":
            rules.append(_rule(finite & (value <= 0.0), "value", "time must be > 0"))
            rules.append(_rule(finite & (value > hi), "value", f"absurd step time: expected <= {hi:g} s"))
        else:
            rules.append(_rule(finite & ((value <= lo) | (value > hi)), "value",
                               f"out of range for {name}: expected {lo:g} < value <= {hi:g}"))
    if known_hardware is not None:
        rules.append(_rule(~_null("gpu") & ~pl.col("gpu").is_in(sorted(known_hardware)), "gpu",
                           "unknown hardware id (see the hardware table / measurements/hardware_specs.csv)"))
    # degrees consistent with the job size where all are given (cp counts as 1 when empty; EP is carved
    # out of DP in every source, so it does not multiply)
    deg = {c: _num(c) for c in ("tp", "pp", "dp", "cp", "n_gpus")}
    all_given = deg["tp"].is_not_null() & deg["pp"].is_not_null() & deg["dp"].is_not_null() & deg["n_gpus"].is_not_null()
    product = deg["tp"] * deg["pp"] * deg["dp"] * deg["cp"].fill_null(1.0)
    rules.append(_rule(all_given & (product != deg["n_gpus"]), "n_gpus",
                       pl.format("inconsistent degrees: tp*pp*dp*cp = {} but n_gpus = {}",
                                 product.cast(pl.Int64), deg["n_gpus"].cast(pl.Int64))))
    for col in COLUMNS:
        rules.append(_rule(pl.col(col).str.len_chars() > MAX_FIELD_CHARS, col,
                           f"field longer than {MAX_FIELD_CHARS} characters"))
    return rules


def _cell_of(column: pl.Expr, columns: list[str]) -> pl.Expr:
    """The value of the cell named by `column` (a column-name expression), as a string; vectorized."""
    return pl.coalesce([pl.when(column == c).then(pl.col(c).cast(pl.Utf8)) for c in columns])


def validate(frame: pl.DataFrame, file: str | None, known_hardware: set[str] | None, *,
             blanks_are_spaces: bool = False) -> Validated:
    """Validate string cells; returns typed accepted rows and (file, line, column, value, reason) rejections.

    Several files can be validated at once: give `file=None` and a `_file` column naming each row's file;
    duplicate and consistency rules then apply within each file (the store decides between files).
    `blanks_are_spaces=True` promises that no cell holds a blank other than ' ' (ASCII cells without tab,
    line break, vertical tab or form feed; `readers.SimpleCsv.plain`): then only the columns with a cell that
    starts or ends with a space are stripped, which saves most of the normalisation's cost."""
    for col in COLUMNS:
        if col not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=pl.Utf8).alias(col))
    if file is not None or "_file" not in frame.columns:
        frame = frame.with_columns(pl.lit(file or "", dtype=pl.Utf8).alias("_file"))
    frame = frame.select([*COLUMNS, "_line", "_file"]).with_columns(
        [pl.col(c).cast(pl.Utf8) for c in COLUMNS]
    ).with_row_index("_row")
    # normalise: strip surrounding blanks, empty -> null
    strip = list(COLUMNS)
    if blanks_are_spaces and frame.height:
        padded = frame.select([(pl.col(c).str.starts_with(" ") | pl.col(c).str.ends_with(" ")).any().alias(c)
                               for c in COLUMNS]).row(0)
        strip = [c for c, p in zip(COLUMNS, padded) if p]
    frame = frame.with_columns([pl.col(c).str.strip_chars() for c in strip]).with_columns(
        [pl.when(pl.col(c).str.len_bytes() == 0).then(None).otherwise(pl.col(c)).alias(c) for c in COLUMNS]
    )
    rules = _rules(known_hardware)
    numeric = frame.select("_row", *COLUMNS, *[pl.col(c).cast(pl.Float64, strict=False).alias(f"_num_{c}")
                                               for c in NUMERIC_INPUTS])
    # two passes: one cheap boolean per row over all rules, then the (column, reason) details for the
    # flagged rows only, so that a mostly-good file costs little
    flagged = numeric.select(pl.any_horizontal([m for m, _ in rules]).fill_null(False)).to_series()
    bad = (
        numeric.filter(flagged)
        .select("_row", pl.concat_list([r for _, r in rules]).list.drop_nulls().alias("_problems"))
        .explode("_problems")
        .unnest("_problems")
        .join(frame.select("_row", "_line"), on="_row", how="left")
    )
    if bad.height:
        bad = bad.join(frame.select("_row", "_file", *COLUMNS), on="_row", how="left")
        bad = bad.with_columns(_cell_of(pl.col("column"), list(COLUMNS)).alias("value"))
    # the typed values are the numbers parsed once above: every rule passed, so each is finite, in range
    # and (for integers, which go through Float64 so that "64.0" and "1e3" are accepted) integral
    typed = numeric.filter(~flagged).select(
        "_row", *[(_num(c).cast(pl.Int64, strict=True) if SCHEMA[c] == pl.Int64 else _num(c)).alias(c)
                  if SCHEMA[c] != pl.Utf8 else pl.col(c) for c in COLUMNS])
    typed = typed.hstack(frame.select("_line", "_file").filter(~flagged))
    extra_rejects: list[pl.DataFrame] = []

    # (run_id, metric) duplicates: identical values collapse to the first row, different values reject all
    repeated = typed.filter(pl.struct("_file", "run_id", "metric").is_duplicated())  # usually empty: cheap
    dup_groups = repeated.group_by("_file", "run_id", "metric").agg(
        pl.col("value").n_unique().alias("_n_values"), pl.len().alias("_n"), pl.col("_line").alias("_lines")
    ).filter(pl.col("_n") > 1)
    duplicates_dropped = 0
    duplicates_by_file: dict[str, int] = {}
    if dup_groups.height:
        conflicting = dup_groups.filter(pl.col("_n_values") > 1)
        if conflicting.height:
            lines = conflicting.with_columns(pl.col("_lines").list.eval(pl.element().cast(pl.Utf8)).list.join(", ").alias("_where"))
            conf_rows = typed.join(lines.select("_file", "run_id", "metric", "_where"),
                                   on=["_file", "run_id", "metric"], how="inner")
            extra_rejects.append(conf_rows.select(
                pl.col("_row"), pl.col("_line"), pl.col("_file"), pl.lit("value").alias("column"),
                pl.col("value").cast(pl.Utf8).alias("value"),
                pl.format("duplicate (run_id, metric) = ({}, {}) with different values on lines {}",
                          pl.col("run_id"), pl.col("metric"), pl.col("_where")).alias("reason"),
            ))
            typed = typed.join(conflicting.select("_file", "run_id", "metric"), on=["_file", "run_id", "metric"],
                               how="anti")
        before = typed.group_by("_file").len()
        typed = typed.unique(subset=["_file", "run_id", "metric"], keep="first", maintain_order=True)
        after = typed.group_by("_file").len()
        per_file = before.join(after, on="_file", how="left", suffix="_after").with_columns(
            (pl.col("len") - pl.col("len_after").fill_null(0)).alias("_dropped")).filter(pl.col("_dropped") > 0)
        duplicates_by_file = dict(zip(per_file["_file"].to_list(), per_file["_dropped"].to_list()))
        duplicates_dropped = sum(duplicates_by_file.values())

    # every row of one run must describe the same run
    run_cols = [c for c in RUN_COLUMNS if c != "run_id"]
    # only runs whose rows are not all identical on the run columns can disagree: a row that differs
    # (nulls included) from the row before it of the same run, or a run whose rows are not consecutive
    same_run = ((pl.col("run_id") == pl.col("run_id").shift(1)) & (pl.col("_file") == pl.col("_file").shift(1))
                ).fill_null(False)
    marks = typed.select("_file", "run_id", (~same_run).alias("_start"), (same_run & pl.any_horizontal(
        [pl.col(c).ne_missing(pl.col(c).shift(1)) for c in run_cols])).alias("_differs"))
    starts = marks.filter("_start").select("_file", "run_id")
    suspect_keys = pl.concat([starts.filter(pl.struct("_file", "run_id").is_duplicated()),
                              marks.filter("_differs").select("_file", "run_id")])
    suspects = (typed.join(suspect_keys.unique(), on=["_file", "run_id"], how="semi") if suspect_keys.height
                else typed.clear())
    disagree = suspects.group_by("_file", "run_id").agg(
        [(pl.col(c).drop_nulls().n_unique() > 1).alias(c) for c in run_cols]
    )
    disagree = disagree.unpivot(index=["_file", "run_id"], variable_name="column", value_name="bad").filter(pl.col("bad"))
    if disagree.height:
        first_col = disagree.group_by("_file", "run_id").agg(pl.col("column").sort().first())
        rows = typed.join(first_col, on=["_file", "run_id"], how="inner")
        extra_rejects.append(rows.select(
            "_row", "_line", "_file", "column",
            _cell_of(pl.col("column"), list(COLUMNS)).alias("value"),
            pl.format("rows of run {} disagree on {}", pl.col("run_id"), pl.col("column")).alias("reason"),
        ))
        typed = typed.join(first_col.select("_file", "run_id"), on=["_file", "run_id"], how="anti")

    parts = []
    if bad.height:
        parts.append(bad.select("_row", "_line", "_file", "column", "value", "reason"))
    parts.extend(extra_rejects)
    if parts:
        rejected = pl.concat([p.with_columns(pl.col("value").cast(pl.Utf8)) for p in parts], how="vertical_relaxed")
        rejected = rejected.sort("_row", "column").select(
            pl.col("_file").alias("file"), pl.col("_line").cast(pl.Int64).alias("line"), "column",
            pl.col("value").str.slice(0, 200), "reason",
        )
    else:
        rejected = empty_rejections()
    accepted = typed.sort("_row").select(*COLUMNS, pl.col("_line").cast(pl.Int64).alias("source_line"),
                                         pl.col("_file").alias("source_file"))
    return Validated(accepted=accepted, rejected=rejected, duplicates_dropped=duplicates_dropped,
                     duplicates_by_file=duplicates_by_file)
