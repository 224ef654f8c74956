"""Megatron-Bridge MoE performance recipes: whether a benchmark run overlapped its EP all-to-all (pure).

Megatron-Bridge publishes its pre-training throughput per NeMo container release (the corpus's ``mbYYMM-`` runs:
mb2511 = container 25.11, mb2602 = 26.02, ...), each measured with that release's performance recipe for the model,
accelerator and precision. Some of those recipes set ``comm_overlap.overlap_moe_expert_parallel_comm = True`` (with
``delay_wgrad_compute``): Megatron-Core's combined 1F1B schedule runs the forward pass of one micro-batch together
with the backward pass of another, so that "EP A2A in forward step is hidden by the attention/mlp computation in the
backward step, and vice versa" (Megatron-LM megatron/core/pipeline_parallel/combined_1f1b.py,
``combined_1f1b_schedule_for_no_pipelining``; the physics is ``models.arch.moe.a2a_merged_fraction`` and
``models.physics.parts.ep_a2a_hidden``). The measurement schema has no such column, so the recipe decides, by release.

``RECIPE_A2A_OVERLAP`` lists every (release, architecture id, accelerator, dtype) of the corpus whose recipe turns
the overlap on. Each entry names the recipe it was read from, in the Megatron-Bridge repository at that release's
branch (r0.1.0 = 25.09, r0.2.0 = 25.11, r0.3.0 = 26.02, r0.4.0 = 26.04, r0.5.0 = 26.06, r0.6.0 = 26.08; the release notes in
docs/performance-summary.md of each branch name the container). Up to r0.5.0 the recipes are
``scripts/performance/configs/<family>/*workload_base_configs.py`` presets (``moe_a2a_overlap=True``, applied by
``scripts/performance/utils`` as ``overlap_moe_expert_parallel_comm = True``); r0.6.0 moved them to
``src/megatron/bridge/perf_recipes/<family>/<gpu>/*.py``. The preset matched to a run is the one whose layout (GPUs,
tp, pp, vpp, ep, global and micro batch) is the run's; where the published run's layout differs from every preset of
its release the nearest preset is used and the entry says so. Every MoE run of a release not listed here ran a
recipe without the overlap (the presets' ``moe_a2a_overlap=False``, the default of ``CommOverlapConfig``).

Expert tensor parallelism: ``expert_tensor_parallel_size`` is 1 in every MoE preset of the corpus's releases
(``RECIPE_ETP``); ``resolve_recipe_etp`` states it on the runs, where the adapter would otherwise infer it (etp = tp,
or the largest etp that folds: the same 1 on the corpus's tp-2 runs, whose ep does not fold with etp = tp).
Other recipe fields, checked and not changing the model: ``moe_router_force_load_balancing``
is True (balanced routing: ``PhysParams.moe_imbalance`` 1.0 already), and the token dispatcher
(``moe_flex_dispatcher_backend`` "hybridep" on GB200/most Blackwell presets, "deepep" on some H100/B200 presets, the
all-to-all dispatcher otherwise; a preset's backend takes effect only where the recipe selects the flex dispatcher:
``apply_flex_dispatcher_backend`` from r0.4.0's ``set_workload_base_configs``, or the model's recipe function) is
recorded in ``RECIPE_DISPATCHER`` for the overlapped entries. Its cost differs from the all-to-all dispatcher's
only where the EP group spans nodes (one copy per remote node: ``models.arch.moe.flex_remote_share``); ``RECIPE_FLEX``
names the corpus's node-spanning runs that ran it.
"""

from __future__ import annotations

import re

import polars as pl

from models.memory.presets import recipe_container

#: container release of a Megatron-Bridge performance run id ("mb2606-..." -> "26.06")
RUN_RELEASE_PATTERN = r"^mb(\d\d)(\d\d)-"
_RUN_RELEASE = re.compile(RUN_RELEASE_PATTERN)

_B = "Megatron-Bridge"
#: (release, arch id, gpu id, dtype) -> the recipe (path, release branch, preset) that sets the EP A2A overlap
#: 25.09 (Megatron-Bridge 0.1.0rc3, branch r0.1.0): scripts/performance/run_script.py sets the overlap (with
#: delay_wgrad_compute) and the flex dispatcher with DeepEP (moe_enable_deepep) for DeepSeek-V3 on H100 only
#: (A2A_1F1B = enable_deepep = gpu == "h100"); every other 25.09 MoE preset runs the all-to-all dispatcher without it
_R0_1_DSV3_H100 = (f"{_B} r0.1.0 scripts/performance/run_script.py (A2A_1F1B, enable_deepep: gpu h100) with "
                   "scripts/performance/configs/deepseek/deepseek_v3_llm_pretrain.yaml perf_matrix.h100.num_gpus_1024")
RECIPE_A2A_OVERLAP: dict[tuple[str, str, str, str], str] = {
    **{("25.09", "deepseek-v3", "h100-sxm5-80gb", d): _R0_1_DSV3_H100 for d in ("bf16", "fp8", "fp8-cs")},
    # 25.11 (r0.2.0): the H100 and B200 Qwen3 presets
    ("25.11", "qwen3-235b-a22b", "h100-sxm5-80gb", "fp8-cs"):
        f"{_B} r0.2.0 scripts/performance/configs/qwen3/workload_base_configs.py QWEN3_235B_A22B_H100_FP8_CS_BASE_CONFIG",
    ("25.11", "qwen3-235b-a22b", "b200", "mxfp8"):
        f"{_B} r0.2.0 scripts/performance/configs/qwen3/workload_base_configs.py QWEN3_235B_A22B_B200_FP8_MX_BASE_CONFIG "
        "(preset vpp 4, the run states 2)",
    ("25.11", "qwen3-30b-a3b", "h100-sxm5-80gb", "fp8-cs"):
        f"{_B} r0.2.0 scripts/performance/configs/qwen3/workload_base_configs.py QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG "
        "(preset vpp 12 micro-batch 1, the run states vpp 24 micro-batch 2)",
    # 26.02 (r0.3.0)
    ("26.02", "qwen3-235b-a22b", "h100-sxm5-80gb", "fp8"):
        f"{_B} r0.3.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
        "QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2",
    # the B300 preset of tag v0.3.0 (pp 8, vpp 4, ep 8, micro-batch 1: the 26.02 and 26.02.01 rows' layout); the
    # branch later dropped its overlap (v0.3.1: vpp None, deepep, moe_a2a_overlap False)
    ("26.02", "qwen3-235b-a22b", "b300", "mxfp8"):
        f"{_B} r0.3.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
        "QWEN3_235B_A22B_PRETRAIN_CONFIG_B300_FP8_MX_V2 (tag v0.3.0)",
    # 26.04 (r0.4.0)
    ("26.04", "qwen3-235b-a22b", "h100-sxm5-80gb", "fp8"):
        f"{_B} r0.4.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
        "QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2",
    ("26.04", "gpt-oss-120b", "gb200", "bf16"):
        f"{_B} r0.4.0 scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py "
        "GPT_OSS_120B_PRETRAIN_CONFIG_GB200_BF16_V2",
    # 26.06 (r0.5.0): the GB200 MXFP8 presets
    ("26.06", "deepseek-v3", "gb200", "mxfp8"):
        f"{_B} r0.5.0 scripts/performance/configs/deepseek/deepseek_workload_base_configs.py "
        "DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V2",
    ("26.06", "gpt-oss-120b", "gb200", "mxfp8"):
        f"{_B} r0.5.0 scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py "
        "GPT_OSS_120B_PRETRAIN_CONFIG_GB200_FP8_MX_V2",
    ("26.06", "qwen3-30b-a3b", "gb200", "mxfp8"):
        f"{_B} r0.5.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
        "QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1",
    ("26.06", "qwen3-235b-a22b", "gb200", "mxfp8"):
        f"{_B} r0.5.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
        "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2",
    # 26.06 (r0.5.0): the GB300 MXFP8 presets and the B300 Qwen3 30B one. Not listed: DeepSeek-V3 and Qwen3 235B on
    # B300, whose presets of tag v0.5.0 (the 26.06 row's pp 8, micro-batch 2, no vpp for DeepSeek-V3) set
    # moe_a2a_overlap False; the branch turned it on later (v0.5.1: "Update DSV3 B300 perf recipe", vpp 2 / 3)
    ("26.06", "deepseek-v3", "gb300", "mxfp8"):
        f"{_B} r0.5.0 scripts/performance/configs/deepseek/deepseek_workload_base_configs.py "
        "DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_V2 (and its GBS 15360 variant DEEPSEEK_V3_PRETRAIN_CONFIG_GB300_FP8_MX_GBS15360)",
    ("26.06", "gpt-oss-120b", "gb300", "mxfp8"):
        f"{_B} r0.5.0 scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py "
        "GPT_OSS_120B_PRETRAIN_CONFIG_GB300_FP8_MX_V2",
    ("26.06", "qwen3-30b-a3b", "gb300", "mxfp8"):
        f"{_B} r0.5.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
        "QWEN3_30B_A3B_PRETRAIN_CONFIG_GB300_FP8_MX_V1",
    ("26.06", "qwen3-30b-a3b", "b300", "mxfp8"):
        f"{_B} r0.5.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
        "QWEN3_30B_A3B_PRETRAIN_CONFIG_B300_FP8_MX_V1",
    ("26.06", "qwen3-235b-a22b", "gb300", "mxfp8"):
        f"{_B} r0.5.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
        "QWEN3_235B_A22B_PRETRAIN_CONFIG_GB300_FP8_MX_V2",
    # 26.08 (r0.6.0): perf_recipes
    ("26.08", "deepseek-v3", "gb200", "mxfp8"):
        f"{_B} r0.6.0 src/megatron/bridge/perf_recipes/deepseek/common.py _enable_deepseek_full_iteration_mxfp8 "
        "(deepseek/gb200/deepseek_v3.py deepseek_v3_pretrain_256gpu_gb200_fp8mx_config)",
    ("26.08", "gpt-oss-120b", "gb200", "mxfp8"):
        f"{_B} r0.6.0 src/megatron/bridge/perf_recipes/gpt_oss/common.py _apply_gpt_oss_120b_full_iter_fp8mx_configs "
        "(gpt_oss/gb200/gpt_oss.py gpt_oss_120b_pretrain_64gpu_gb200_fp8mx_config)",
    ("26.08", "qwen3-30b-a3b", "gb200", "mxfp8"):
        f"{_B} r0.6.0 src/megatron/bridge/perf_recipes/qwen/common.py _enable_hybridep_full_iteration_mxfp8 "
        "(qwen/gb200/qwen3_moe.py qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config)",
    ("26.08", "qwen3-235b-a22b", "gb200", "mxfp8"):
        f"{_B} r0.6.0 src/megatron/bridge/perf_recipes/qwen/common.py _enable_hybridep_full_iteration_mxfp8 "
        "(qwen/gb200/qwen3_moe.py qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_config)",
    # 26.08 (r0.6.0): the GB300 and B300 MXFP8 perf_recipes
    ("26.08", "deepseek-v3", "gb300", "mxfp8"):
        f"{_B} r0.6.0 src/megatron/bridge/perf_recipes/deepseek/common.py _enable_deepseek_full_iteration_mxfp8 "
        "(deepseek/gb300/deepseek_v3.py deepseek_v3_pretrain_256gpu_gb300_fp8mx_config)",
    ("26.08", "deepseek-v3", "b300", "mxfp8"):
        f"{_B} r0.6.0 src/megatron/bridge/perf_recipes/deepseek/common.py _enable_deepseek_full_iteration_mxfp8 "
        "(deepseek/b300/deepseek_v3.py deepseek_v3_pretrain_256gpu_b300_fp8mx_config)",
    ("26.08", "gpt-oss-120b", "gb300", "mxfp8"):
        f"{_B} r0.6.0 src/megatron/bridge/perf_recipes/gpt_oss/common.py _apply_gpt_oss_120b_full_iter_fp8mx_configs "
        "(gpt_oss/gb300/gpt_oss.py gpt_oss_120b_pretrain_64gpu_gb300_fp8mx_config)",
    ("26.08", "qwen3-30b-a3b", "gb300", "mxfp8"):
        f"{_B} r0.6.0 src/megatron/bridge/perf_recipes/qwen/common.py _enable_hybridep_full_iteration_mxfp8 "
        "(qwen/gb300/qwen3_moe.py qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config)",
    ("26.08", "qwen3-30b-a3b", "b300", "mxfp8"):
        f"{_B} r0.6.0 src/megatron/bridge/perf_recipes/qwen/common.py _enable_hybridep_full_iteration_mxfp8 "
        "(qwen/b300/qwen3_moe.py qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config)",
    ("26.08", "qwen3-235b-a22b", "gb300", "mxfp8"):
        f"{_B} r0.6.0 src/megatron/bridge/perf_recipes/qwen/common.py _enable_hybridep_full_iteration_mxfp8 "
        "(qwen/gb300/qwen3_moe.py qwen3_235b_a22b_pretrain_256gpu_gb300_fp8mx_config)",
    ("26.08", "qwen3-235b-a22b", "b300", "mxfp8"):
        f"{_B} r0.6.0 src/megatron/bridge/perf_recipes/qwen/common.py _enable_hybridep_full_iteration_mxfp8 "
        "(qwen/b300/qwen3_moe.py qwen3_235b_a22b_pretrain_256gpu_b300_fp8mx_config)",
}

#: the token dispatcher of the overlapped recipes (``moe_flex_dispatcher_backend``; None: the all-to-all dispatcher)
RECIPE_DISPATCHER: dict[tuple[str, str, str, str], str | None] = {
    **{("25.09", "deepseek-v3", "h100-sxm5-80gb", d): "deepep" for d in ("bf16", "fp8", "fp8-cs")},
    ("25.11", "qwen3-235b-a22b", "h100-sxm5-80gb", "fp8-cs"): None,
    ("25.11", "qwen3-235b-a22b", "b200", "mxfp8"): None,
    ("25.11", "qwen3-30b-a3b", "h100-sxm5-80gb", "fp8-cs"): None,
    # the preset names "deepep", but r0.3.0's qwen3_235b_a22b_pretrain_config_h100 sets the alltoall dispatcher and
    # that release's set_workload_base_configs does not apply a preset's backend: the run used the all-to-all one
    ("26.02", "qwen3-235b-a22b", "h100-sxm5-80gb", "fp8"): None,
    ("26.04", "qwen3-235b-a22b", "h100-sxm5-80gb", "fp8"): None,
    ("26.04", "gpt-oss-120b", "gb200", "bf16"): None,
    # tag v0.3.0's B300 preset names no backend and r0.3.0 does not apply one: the Qwen3 provider's "alltoall"
    ("26.02", "qwen3-235b-a22b", "b300", "mxfp8"): None,
    **{k: "hybridep" for k in RECIPE_A2A_OVERLAP if k[0] in ("26.06", "26.08")},
}


#: expert_tensor_parallel_size of the Megatron-Bridge MoE performance recipes, per release: 1 in every preset (none of
#: the releases' presets or per-GPU recipes sets another value; grep of ``expert_tensor_parallel_size`` at each branch)
RECIPE_ETP: dict[str, tuple[int, str]] = {
    "25.09": (1, f"{_B} r0.1.0 scripts/performance/configs/{{deepseek,qwen3}}/*_llm_pretrain.yaml etp: 1 (the "
                 "recipes also set expert_tensor_parallel_size=1)"),
    "25.11": (1, f"{_B} r0.2.0 scripts/performance/configs/{{deepseek,gpt_oss,qwen3}}/workload_base_configs.py "
                 "BASE_*_CONFIG expert_tensor_parallel_size=1"),
    "26.02": (1, f"{_B} r0.3.0 scripts/performance/configs/{{deepseek,gpt_oss,qwen,nemotronh}}/*workload_base_configs.py "
                 "BASE_*_CONFIG expert_tensor_parallel_size=1"),
    "26.04": (1, f"{_B} r0.4.0 scripts/performance/configs/{{deepseek,gpt_oss,qwen,nemotronh}}/*workload_base_configs.py "
                 "BASE_*_CONFIG expert_tensor_parallel_size=1"),
    "26.06": (1, f"{_B} r0.5.0 scripts/performance/configs/{{deepseek,gpt_oss,qwen,nemotronh}}/*workload_base_configs.py "
                 "BASE_*_CONFIG expert_tensor_parallel_size=1"),
    "26.08": (1, f"{_B} r0.6.0 src/megatron/bridge/perf_recipes/{{deepseek/common.py,gpt_oss,qwen,nemotronh}} "
                 "cfg.model.expert_tensor_parallel_size = 1"),
}
#: the adapter's inferred-etp notes (models.corpus.runs_adapter.infer_layout) a recipe's stated etp replaces
_INFERRED_ETP_NOTE = r"etp=(\d+|tp) \([^)]*\)(; )?"


#: (release, arch id, gpu id, dtype) of the corpus's runs whose EP group spans nodes and whose recipe ran Megatron-Core's
#: flex dispatcher (DeepEP or HybridEP; ``moe_dispatcher`` = 1, cost: ``models.arch.moe.flex_remote_share``). From r0.4.0
#: on, ``scripts/performance/utils/overrides.py set_workload_base_configs`` calls ``apply_flex_dispatcher_backend``
#: (moe_token_dispatcher_type "flex") for a preset that names a backend, else sets "alltoall". The node-spanning runs
#: not listed ran the all-to-all dispatcher: Qwen3-235B on H100 (25.11, 26.02, 26.04: the H100 recipe function sets
#: "alltoall"; 26.02's preset names "deepep", which r0.3.0 does not apply) and GPT-OSS 120B BF16 on B200 and on B300
#: (26.02: the r0.3.0 recipe's default "alltoall"; tag v0.3.0's GPT_OSS_120B_PRETRAIN_CONFIG_B300_BF16_V2 is ep 64 with
#: no backend). Runs inside one scale-up domain are not listed: there the model costs both dispatchers alike (every
#: other GB300 run, ep <= 64 in the 72-GPU NVLink domain, and every other B300 run, ep 8 in the 8-GPU node).
RECIPE_FLEX: dict[tuple[str, str, str, str], str] = {
    **{("25.09", "deepseek-v3", "h100-sxm5-80gb", d): _R0_1_DSV3_H100 + " (DeepEP)" for d in ("bf16", "fp8", "fp8-cs")},
    ("26.04", "nemotron-3-super", "b200", "mxfp8"):
        f"{_B} r0.4.0 scripts/performance/configs/nemotronh/nemotron_3_workload_base_configs.py "
        "NEMOTRON_3_SUPER_PRETRAIN_CONFIG_B200_FP8_MX_V1 (hybridep)",
    ("26.04", "nemotron-3-super", "b200", "nvfp4"):
        f"{_B} r0.4.0 scripts/performance/configs/nemotronh/nemotron_3_workload_base_configs.py "
        "NEMOTRON_3_SUPER_PRETRAIN_CONFIG_B200_NVFP4_V1 (hybridep)",
    ("26.04", "qwen3-30b-a3b", "h100-sxm5-80gb", "fp8"):
        f"{_B} r0.4.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
        "QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 (hybridep; qwen3_llm_pretrain.py sets flex)",
    ("26.06", "qwen3-30b-a3b", "h100-sxm5-80gb", "fp8"):
        f"{_B} r0.5.0 scripts/performance/configs/qwen/qwen3_workload_base_configs.py "
        "QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 (hybridep; qwen3_llm_pretrain.py sets flex)",
}


def run_release(run_id: str | None) -> str | None:
    """The NeMo container release of a Megatron-Bridge performance run id ("mb2606-..." -> "26.06"), else None."""
    m = _RUN_RELEASE.match(str(run_id or ""))
    return f"{m.group(1)}.{m.group(2)}" if m else None


def recipe_a2a_overlap(run_id: str | None, arch_id: str | None, gpu: str | None, dtype: str | None) -> bool | None:
    """Whether the Megatron-Bridge recipe of a named performance run overlapped its EP all-to-all: True where
    ``RECIPE_A2A_OVERLAP`` lists it, False for another run of a listed release (its recipe did not), None for a run
    that is not a Megatron-Bridge performance run (nothing known)."""
    rel = run_release(run_id)
    if rel is None:
        return None
    key = (rel, str(arch_id or "").lower(), str(gpu or "").lower(), str(dtype or "").lower())
    return key in RECIPE_A2A_OVERLAP


def _with_release(frame: pl.DataFrame, column: str) -> tuple[pl.DataFrame, pl.Expr]:
    """``frame`` with ``column`` (Float64) and ``assumptions`` present (null where absent), and the release ("26.04")
    a Megatron-Bridge run id names, else the NeMo container its `framework` names (``models.memory.presets
    .recipe_container``: a row of the same summary in another file), as an expression (null for other runs)."""
    if column not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Float64).alias(column))
    if "assumptions" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Utf8).alias("assumptions"))
    rid = pl.col("run_id").cast(pl.Utf8)
    rel = pl.concat_str([rid.str.extract(RUN_RELEASE_PATTERN, 1), rid.str.extract(RUN_RELEASE_PATTERN, 2)],
                        separator=".")
    if "framework" in frame.columns:  # a run of another file: the release its framework names ("NeMo 26.04")

        rel = pl.coalesce(rel, recipe_container())
    return frame, rel


def resolve_a2a_overlap(frame: pl.DataFrame) -> pl.DataFrame:
    """`moe_a2a_overlap` (1: the EP all-to-all overlapped with another micro-batch's compute) of the Megatron-Bridge
    performance runs (`mbYYMM-` run ids) of a configuration frame that do not state it: the recipe of the run's
    release (`RECIPE_A2A_OVERLAP`), recorded in `assumptions` where on; 0 for the release's other runs; null (no
    overlap) for every other row. Needs run_id, arch_id, gpu, dtype (else the frame is returned unchanged).

    Applied by `models.corpus.runs_adapter.configs_from_runs` (docs/model.md, "EP all-to-all overlap")."""
    need = ("run_id", "arch_id", "gpu", "dtype")
    if not frame.height or any(c not in frame.columns for c in need):
        return frame
    frame, rel = _with_release(frame, "moe_a2a_overlap")
    key = pl.concat_str([rel, pl.col("arch_id").cast(pl.Utf8).str.to_lowercase(),
                         pl.col("gpu").cast(pl.Utf8).str.to_lowercase(),
                         pl.col("dtype").cast(pl.Utf8).str.to_lowercase()], separator="|")
    src = key.replace_strict({"|".join(k): v for k, v in RECIPE_A2A_OVERLAP.items()}, default=None,
                             return_dtype=pl.Utf8)
    fill = pl.col("moe_a2a_overlap").is_null() & rel.is_not_null()
    why = pl.when(fill & src.is_not_null()).then(pl.format("moe_a2a_overlap=1 ({})", src))
    return frame.with_columns(
        pl.when(fill).then(src.is_not_null().cast(pl.Float64))
        .otherwise(pl.col("moe_a2a_overlap").cast(pl.Float64, strict=False)).alias("moe_a2a_overlap"),
        pl.when(why.is_not_null()).then(pl.concat_str([pl.col("assumptions"), why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


def recipe_etp(run_id: str | None) -> int | None:
    """The expert tensor-parallel size of a Megatron-Bridge performance run's recipe (``RECIPE_ETP``), None for a run
    of another source or of a release not listed."""
    hit = RECIPE_ETP.get(run_release(run_id) or "")
    return hit[0] if hit else None


def resolve_recipe_etp(frame: pl.DataFrame) -> pl.DataFrame:
    """`etp` of the MoE Megatron-Bridge performance runs (`mbYYMM-` run ids, n_experts > 0) of a configuration frame
    that do not state it: the release's recipe value (`RECIPE_ETP`), recorded in `assumptions` in place of the
    adapter's inferred-etp note. Other rows keep their `etp` (null: the step-time model infers it). Needs run_id and
    n_experts (else the frame is returned unchanged)."""
    if not frame.height or any(c not in frame.columns for c in ("run_id", "n_experts")):
        return frame
    frame, rel = _with_release(frame, "etp")
    val = rel.replace_strict({k: float(v[0]) for k, v in RECIPE_ETP.items()}, default=None, return_dtype=pl.Float64)
    src = rel.replace_strict({k: v[1] for k, v in RECIPE_ETP.items()}, default=None, return_dtype=pl.Utf8)
    fill = (pl.col("etp").is_null() & (pl.col("n_experts").cast(pl.Float64, strict=False).fill_null(0.0) > 0)
            & val.is_not_null())
    kept = pl.col("assumptions").str.replace_all(_INFERRED_ETP_NOTE, "").str.strip_chars("; ").replace("", None)
    why = pl.format("etp={} ({})", val.cast(pl.Int64), src)
    return frame.with_columns(
        pl.when(fill).then(val).otherwise(pl.col("etp").cast(pl.Float64, strict=False)).alias("etp"),
        pl.when(fill).then(pl.concat_str([kept, why], separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )


def resolve_recipe_dispatcher(frame: pl.DataFrame) -> pl.DataFrame:
    """`moe_dispatcher` (1: the flex dispatcher, DeepEP/HybridEP) of the Megatron-Bridge performance runs `RECIPE_FLEX`
    lists that do not state it, recorded in `assumptions`; other rows keep theirs (null: the all-to-all dispatcher).
    Needs run_id, arch_id, gpu, dtype (else the frame is returned unchanged)."""
    need = ("run_id", "arch_id", "gpu", "dtype")
    if not frame.height or any(c not in frame.columns for c in need):
        return frame
    frame, rel = _with_release(frame, "moe_dispatcher")
    key = pl.concat_str([rel, pl.col("arch_id").cast(pl.Utf8).str.to_lowercase(),
                         pl.col("gpu").cast(pl.Utf8).str.to_lowercase(),
                         pl.col("dtype").cast(pl.Utf8).str.to_lowercase()], separator="|")
    src = key.replace_strict({"|".join(k): v for k, v in RECIPE_FLEX.items()}, default=None, return_dtype=pl.Utf8)
    fill = pl.col("moe_dispatcher").is_null() & src.is_not_null()
    return frame.with_columns(
        pl.when(fill).then(pl.lit(1.0)).otherwise(pl.col("moe_dispatcher").cast(pl.Float64, strict=False))
        .alias("moe_dispatcher"),
        pl.when(fill).then(pl.concat_str([pl.col("assumptions"), pl.format("moe_dispatcher=flex ({})", src)],
                                         separator="; ", ignore_nulls=True))
        .otherwise(pl.col("assumptions")).alias("assumptions"),
    )
