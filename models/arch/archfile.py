"""Architecture and hardware descriptions from files the user brings (pure: the caller reads the file and passes
the parsed mapping plus the file name, which every error message names).

`architecture_from_mapping(obj, source)` accepts

* a row of our architecture schema (the columns of measurements/architectures.csv; CSV cells as strings or JSON
  values), or
* a Hugging Face `config.json`: Llama / Mistral, Qwen2 / Qwen3, Qwen2-MoE / Qwen3-MoE, Mixtral, DeepSeek-V2 /
  V3 (and Kimi K2, which uses the DeepSeek-V3 layout), Llama 4, gpt-oss, Nemotron-H (incl. Nemotron 3 MoE
  hybrids), Jamba, Gemma / Gemma 2 / Gemma 3 (text, or the text part of the multimodal config), Phi-3 / Phi-4 and
  Phi-3.5-MoE, OLMo (the transformers `-hf` config and the original OLMo config) / OLMo 2 / OLMo 3, Falcon
  (incl. the old RefinedWeb keys, multi-query and the new decoder architecture) and GPT-NeoX (incl. Pythia),

and returns our architecture dict: the columns `models.arch.accounting` reads (ARCH_COLUMNS) plus `id`, `name`,
`arch` (dense, moe, hybrid-mamba, hybrid-mamba-moe) and the extra fields below, kept even where the step-time
model does not use them yet (None when the architecture has no such part):

| key | meaning | from (Hugging Face) |
|---|---|---|
| q_lora_rank, kv_lora_rank | MLA low-rank query / key-value compression (DeepSeek-V2/V3) | same names |
| qk_rope_head_dim, qk_nope_head_dim, v_head_dim | MLA per-head dims: rotary and non-rotary part of q/k, value | same names |
| shared_expert_ffn_dim | hidden size of ONE shared expert when it differs from expert_ffn_dim | moe_shared_expert_intermediate_size / n_shared_experts, shared_expert_intermediate_size, Llama 4 intermediate_size |
| moe_layer_step | a MoE layer every k-th layer (Llama 4 Maverick 2, Jamba 2); 1 = every layer after n_dense_layers | interleave_moe_layer_step, expert_layer_period, decoder_sparse_step |
| mtp_layers | multi-token-prediction modules beyond the main stack (not in params_b) | num_nextn_predict_layers, mtp_num_layers |
| layer_pattern | hybrids: one character per block: M = Mamba mixer, * = attention, - = dense MLP, E = MoE (Nemotron-H `hybrid_override_pattern`; Jamba: mixer then MLP/MoE per layer) | hybrid_override_pattern; Jamba attn/expert period and offset |
| mamba_state_dim, mamba_n_heads, mamba_head_dim, mamba_n_groups, mamba_chunk_size, mamba_conv_kernel, mamba_expand | Mamba(-2) mixer shape: SSM state size N, heads, head dim, B/C groups, SSD chunk, conv width, expansion | ssm_state_size / mamba_d_state, mamba_num_heads, mamba_head_dim, n_groups, chunk_size, conv_kernel / mamba_d_conv, expand / mamba_expand |
| mamba_dt_rank | Mamba-1 mixers (Jamba): rank of the dt projection; a row that gives it has Mamba-1 (selective-scan) mixers, else Mamba-2 | mamba_dt_rank ("auto": ceil(hidden_size / 16), mamba_ssm's rule) |
| moe_latent_size | latent MoE: the routed experts work in this width, with down/up projections around them (Nemotron 3 Super) | moe_latent_size |
| sliding_window | tokens of local attention where layers use it: some layers (gpt-oss, Gemma 2/3; the notes say which) or every layer (Mistral 7B v0.1) | sliding_window |

A Hugging Face config also gives `notes`: what the step-time and memory model do not express of it and how it
is mapped (parallel attention and MLP as sequential, logit soft-capping, local attention windows, QK-norm,
partial rotary), as the `notes` of a measurements/architectures.csv row say it; None when nothing is approximated.
`hf_notes` holds the same text for a config (None for a schema row): a prediction for such a file says it in
`assumptions` (pipeline.api).

For hybrid rows `n_layers` counts blocks, one mixer each (Nemotron-H: the config's num_hidden_layers; Jamba: twice
its num_hidden_layers, each layer being a Mamba or attention block and an MLP or MoE block). Schema conventions kept from architectures.csv: a model whose every layer is MoE has
ffn_dim = expert_ffn_dim; squared-ReLU and GELU (non-gated, 2 matrices) MLPs are `gelu`, SiLU/GELU gated MLPs
(3 matrices) are `swiglu`; MLA attention and MTP modules are modelled from their fields (models/arch/mla.py).

`hardware_from_mapping(obj, source)` accepts a row of the hardware_specs.csv schema.

Every number is checked before it is used: NaN, an infinity or an integer of thousands of digits anywhere in the
mapping is refused naming the key, and each field of the result is at most its bound (models.core.limits
`ARCH_MAX`, `HARDWARE_MAX`: "'d_model' = 99999999 is above the largest 16777216 this tool plans for").
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, Mapping

from models.core.limits import ARCH_MAX, HARDWARE_MAX, JSON_MAX_INT, bound_problem, shown

#: architectures the step-time model only approximates (measurements/architectures.csv, each row's notes say
#: how): their runs are predicted, with a note in `assumptions`, but not fitted (models.fitting.calibration.fit_data), so
#: a cost the model lacks for them is not spread over every run's constants. DeepSeek-V4's attention (a 128-token
#: window plus compressed keys and values) is counted as dense MLA; Nemotron 3.5 Lightning trains with two MTP
#: depths, and the MTP of hybrids is not modelled.
APPROXIMATED_ARCHITECTURES = ("deepseek-v4-flash", "nemotron-3.5-lightning")
#: what a prediction for one of them says in `assumptions` (predict --runs, predict)
APPROXIMATED_NOTE = "architecture approximated (its measurements/architectures.csv notes say how): predicted, not fitted"

#: what an architecture dict carries beyond models.arch.accounting.ARCH_COLUMNS (see the module docstring)
EXTRA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                "shared_expert_ffn_dim", "moe_layer_step", "mtp_layers", "layer_pattern", "mamba_state_dim",
                "mamba_n_heads", "mamba_head_dim", "mamba_n_groups", "mamba_chunk_size", "mamba_conv_kernel",
                "mamba_expand", "moe_latent_size", "sliding_window", "mamba_dt_rank")
ARCH_FIELDS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab", "activation",
               "n_experts", "top_k", "expert_ffn_dim", "n_shared_experts", "n_dense_layers", "tied_embeddings")
INT_FIELDS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab", "n_experts", "top_k",
              "expert_ffn_dim", "n_shared_experts", "n_dense_layers", "q_lora_rank", "kv_lora_rank",
              "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "shared_expert_ffn_dim", "moe_layer_step",
              "mtp_layers", "mamba_state_dim", "mamba_n_heads", "mamba_head_dim", "mamba_n_groups",
              "mamba_chunk_size", "mamba_conv_kernel", "mamba_expand", "moe_latent_size", "sliding_window",
              "mamba_dt_rank")
#: schema columns a row of our architecture schema must fill
SCHEMA_REQUIRED = ("n_layers", "d_model", "n_heads", "ffn_dim", "vocab")
#: hardware_specs.csv columns the step-time model needs (models.physics.hardware.REQUIRED_COLUMNS + one peak)
HARDWARE_REQUIRED = ("id", "memory_gb", "memory_bw_gbps", "intra_node_bw_gbps")
HARDWARE_NUMERIC = ("peak_fp32_tflops", "peak_tf32_tflops", "peak_bf16_tflops", "peak_fp16_tflops", "peak_fp8_tflops",
                    "peak_fp4_tflops", "memory_gb", "memory_bw_gbps", "intra_node_bw_gbps", "gpus_per_node_typical",
                    "inter_node_bw_gbps", "tdp_w", "sm_count", "release_year",
                    "scaleup_domain_accelerators", "accelerators_per_host")

#: Hugging Face model_type -> reader; `architectures` class names map to the same readers
HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2",
                  "deepseek_v3", "kimi_k2", "llama4", "llama4_text", "gpt_oss", "nemotron_h", "jamba", "gemma",
                  "gemma2", "gemma3", "gemma3_text", "phi3", "phimoe", "olmo", "olmo2", "olmo3", "falcon",
                  "gpt_neox")
_CLASS_TO_TYPE = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                  "Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe",
                  "Qwen3MoeForCausalLM": "qwen3_moe", "DeepseekV2ForCausalLM": "deepseek_v2",
                  "DeepseekV3ForCausalLM": "deepseek_v3", "Llama4ForConditionalGeneration": "llama4",
                  "Llama4ForCausalLM": "llama4_text", "GptOssForCausalLM": "gpt_oss",
                  "NemotronHForCausalLM": "nemotron_h", "JambaForCausalLM": "jamba",
                  "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text",
                  "Gemma3ForConditionalGeneration": "gemma3", "Phi3ForCausalLM": "phi3",
                  "PhimoeForCausalLM": "phimoe", "OlmoForCausalLM": "olmo", "OLMoForCausalLM": "olmo",
                  "Olmo2ForCausalLM": "olmo2", "Olmo3ForCausalLM": "olmo3", "FalconForCausalLM": "falcon",
                  "RWForCausalLM": "falcon", "GPTNeoXForCausalLM": "gpt_neox"}
#: old Falcon checkpoints name their model_type after the RefinedWeb code they shipped with
_TYPE_ALIASES = {"RefinedWeb": "falcon", "RefinedWebModel": "falcon"}
#: tie_word_embeddings when a config omits it: the default of each transformers config class (False, but True for
#: GemmaConfig / Gemma2Config / Gemma3TextConfig and FalconConfig, which keeps PretrainedConfig's True)
_TIED_DEFAULT = False
_TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text", "falcon")
_GATED_ACTS = ("silu", "swish", "gelu_pytorch_tanh", "gelu_new", "gelu")  # activations of gated (3-matrix) MLPs


class ArchFileError(ValueError):
    """A file that does not describe an architecture or hardware row; the message names file and key."""


# ---------------------------------------------------------------- helpers

def _blank(v: Any) -> bool:
    return v is None or (isinstance(v, str) and v.strip() == "")


def _number(v: Any, source: str, key: str, bounds: Mapping[str, float], whole: bool) -> float | None:
    """The number of a cell (a JSON value or a CSV string), checked: finite, whole where `whole`, >= 0 and at
    most `bounds[key]`; ArchFileError naming the key and the value otherwise."""
    if _blank(v):
        return None
    digits = v.strip().lstrip("+-") if isinstance(v, str) else ""
    if digits.isdigit() and len(digits) > 16:  # beyond every bound: its size, not its digits (thousands of them)
        v = (-1 if v.strip().startswith("-") else 1) * 10 ** (len(digits) - 1)
    try:
        f = v if isinstance(v, Integral) and not isinstance(v, bool) else float(v)
    except (TypeError, ValueError, OverflowError):
        raise ArchFileError(f"{source}: '{key}' = {shown(v)} is not a number") from None
    problem = bound_problem(f"'{key}' =", f, 0, bounds.get(key), whole=whole)
    if problem:
        raise ArchFileError(f"{source}: {problem}")
    return f


def _int(v: Any, source: str, key: str) -> int | None:
    f = _number(v, source, key, ARCH_MAX, whole=True)
    return None if f is None else int(f)


def _float(v: Any, source: str, key: str, bounds: Mapping[str, float] = ARCH_MAX) -> float | None:
    f = _number(v, source, key, bounds, whole=False)
    return None if f is None else float(f)


def _finite_numbers(obj: Any, source: str, key: str = "") -> None:
    """ArchFileError naming the first key of `obj` (a parsed file, nested) whose number no field can hold: NaN, an
    infinity, an integer beyond 2^53 (a Python mapping can carry them even where a JSON reader would refuse)."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _finite_numbers(v, source, str(k))
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _finite_numbers(v, source, key)
    elif isinstance(obj, Integral) and not isinstance(obj, bool) and abs(int(obj)) > JSON_MAX_INT:
        raise ArchFileError(f"{source}: '{key}' = {shown(obj)} is above the largest {JSON_MAX_INT} (2^53) a field "
                            "holds")
    elif isinstance(obj, Real) and not isinstance(obj, Integral) and not math.isfinite(float(obj)):
        raise ArchFileError(f"{source}: '{key}' = {shown(obj)} is not a finite number")


def _bounded(d: dict, source: str) -> dict:
    """`d` (an architecture dict) when every numeric field is within its bound (ARCH_MAX) and not negative, else
    ArchFileError naming the field, its value and the bound."""
    for key, hi in ARCH_MAX.items():
        v = d.get(key)
        if v is None or isinstance(v, bool):
            continue
        problem = bound_problem(f"'{key}' =", v, 0, hi)
        if problem:
            raise ArchFileError(f"{source}: {problem}")
    return d


def _bool(v: Any, source: str, key: str) -> bool | None:
    if _blank(v):
        return None
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ArchFileError(f"{source}: '{key}' = {v!r} is not true/false")


def _need(cfg: Mapping, key: str, source: str, what: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ArchFileError(f"{source}: {what} lacks the key '{key}'")
    return cfg[key]


def _first(cfg: Mapping, keys: tuple[str, ...], source: str, what: str, default: Any = ...) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    if default is ...:
        raise ArchFileError(f"{source}: {what} lacks the key '{keys[0]}'"
                            + (f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""))
    return default


def _finish(d: dict) -> dict:
    out = {k: None for k in ("id", "name", "arch", *ARCH_FIELDS, *EXTRA_FIELDS, "notes")}
    out.update(d)
    return out


# ---------------------------------------------------------------- our schema

def from_schema_row(row: Mapping, source: str) -> dict:
    """A row of the measurements/architectures.csv schema -> architecture dict (types and bounds checked)."""
    _finite_numbers(row, source)
    missing = [c for c in SCHEMA_REQUIRED if _blank(row.get(c))]
    if missing:
        raise ArchFileError(f"{source}: architecture row lacks {', '.join(repr(c) for c in missing)} "
                            f"(the columns of measurements/architectures.csv)")
    d = {c: _int(row.get(c), source, c) for c in INT_FIELDS}
    d["activation"] = str(row.get("activation") or "").strip().lower() or None
    if d["activation"] not in (None, "gelu", "swiglu"):
        raise ArchFileError(f"{source}: 'activation' = {row.get('activation')!r}: expected gelu or swiglu")
    d["tied_embeddings"] = _bool(row.get("tied_embeddings"), source, "tied_embeddings")
    d["layer_pattern"] = str(row["layer_pattern"]).strip() if not _blank(row.get("layer_pattern")) else None
    d["id"] = str(row.get("id") or "custom").strip()
    d["name"] = str(row.get("name") or d["id"]).strip()
    arch = str(row.get("arch") or "").strip() or ("moe" if (d["n_experts"] or 0) > 0 else "dense")
    d["arch"] = arch
    if arch != "dense" and "hybrid" not in arch and not (d["n_experts"] or 0) > 0:
        raise ArchFileError(f"{source}: arch '{arch}' but 'n_experts' is empty or 0 (a MoE row needs n_experts, "
                            f"top_k and expert_ffn_dim)")
    for c in ("params_b", "active_params_b"):
        if c in row:
            d[c] = _float(row.get(c), source, c)
    return _finish(d)


# ---------------------------------------------------------------- Hugging Face configs

def _hf_common(cfg: Mapping, source: str, what: str, tied_default: bool = _TIED_DEFAULT) -> dict:
    heads = int(_need(cfg, "num_attention_heads", source, what))
    d_model = int(_need(cfg, "hidden_size", source, what))
    head_dim = _first(cfg, ("head_dim", "attention_head_dim"), source, what, None)
    return {
        "n_layers": int(_need(cfg, "num_hidden_layers", source, what)),
        "d_model": d_model,
        "n_heads": heads,
        "n_kv_heads": int(_first(cfg, ("num_key_value_heads",), source, what, heads)),
        "head_dim": int(head_dim) if head_dim is not None else None,
        "vocab": int(_need(cfg, "vocab_size", source, what)),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", tied_default)),
        "n_experts": 0, "top_k": 0, "n_shared_experts": 0, "n_dense_layers": 0,
    }


def _activation(cfg: Mapping) -> str:
    act = str(cfg.get("hidden_act") or "silu").lower()
    return "swiglu" if act in _GATED_ACTS else "gelu"


def _dense(cfg: Mapping, source: str, what: str) -> dict:
    d = _hf_common(cfg, source, what)
    d.update(arch="dense", ffn_dim=int(_need(cfg, "intermediate_size", source, what)), activation=_activation(cfg))
    return d


def _mixtral(cfg: Mapping, source: str, what: str) -> dict:
    d = _hf_common(cfg, source, what)
    ffn = int(_need(cfg, "intermediate_size", source, what))
    d.update(arch="moe", activation="swiglu", ffn_dim=ffn, expert_ffn_dim=ffn,
             n_experts=int(_need(cfg, "num_local_experts", source, what)),
             top_k=int(_need(cfg, "num_experts_per_tok", source, what)))
    return d


def _qwen_moe(cfg: Mapping, source: str, what: str) -> dict:
    d = _hf_common(cfg, source, what)
    fe = int(_need(cfg, "moe_intermediate_size", source, what))
    dense_layers = list(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step") or 1)
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    d.update(arch="moe", activation="swiglu", expert_ffn_dim=fe,
             ffn_dim=int(_need(cfg, "intermediate_size", source, what)) if dense_layers or step > 1 else fe,
             n_experts=int(_first(cfg, ("num_experts",), source, what)),
             top_k=int(_need(cfg, "num_experts_per_tok", source, what)),
             n_dense_layers=len(dense_layers), moe_layer_step=step,
             n_shared_experts=1 if shared else 0, shared_expert_ffn_dim=shared or None)
    if shared and shared % fe == 0:  # the table's convention: a wide shared expert as expert-sized shared experts
        d.update(n_shared_experts=shared // fe, shared_expert_ffn_dim=None)  # (Qwen1.5-MoE: 5632 = 4 x 1408)
    return d


def _deepseek(cfg: Mapping, source: str, what: str) -> dict:
    d = _hf_common(cfg, source, what)
    v_head = int(_need(cfg, "v_head_dim", source, what))
    d.update(arch="moe", activation="swiglu", head_dim=v_head, v_head_dim=v_head,
             ffn_dim=int(_need(cfg, "intermediate_size", source, what)),
             expert_ffn_dim=int(_need(cfg, "moe_intermediate_size", source, what)),
             n_experts=int(_need(cfg, "n_routed_experts", source, what)),
             top_k=int(_need(cfg, "num_experts_per_tok", source, what)),
             n_shared_experts=int(cfg.get("n_shared_experts") or 0),
             n_dense_layers=int(cfg.get("first_k_dense_replace") or 0),
             moe_layer_step=int(cfg.get("moe_layer_freq") or 1),
             q_lora_rank=int(cfg["q_lora_rank"]) if cfg.get("q_lora_rank") else None,
             kv_lora_rank=int(_need(cfg, "kv_lora_rank", source, what)),
             qk_rope_head_dim=int(_need(cfg, "qk_rope_head_dim", source, what)),
             qk_nope_head_dim=int(_need(cfg, "qk_nope_head_dim", source, what)),
             mtp_layers=int(cfg.get("num_nextn_predict_layers") or 0))
    return d


def _llama4(cfg: Mapping, source: str, what: str) -> dict:
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), Mapping) else cfg
    d = _hf_common(text, source, what + " text_config")
    fe = int(_need(text, "intermediate_size", source, what + " text_config"))
    step = int(text.get("interleave_moe_layer_step") or 1)
    n_layers = d["n_layers"]
    d.update(arch="moe", activation="swiglu", expert_ffn_dim=fe, moe_layer_step=step,
             ffn_dim=int(_need(text, "intermediate_size_mlp", source, what + " text_config")) if step > 1 else fe,
             n_experts=int(_need(text, "num_local_experts", source, what + " text_config")),
             top_k=int(_need(text, "num_experts_per_tok", source, what + " text_config")),
             n_shared_experts=1, n_dense_layers=n_layers - n_layers // step)
    if "tie_word_embeddings" in cfg:
        d["tied_embeddings"] = bool(cfg["tie_word_embeddings"])
    return d


def _gpt_oss(cfg: Mapping, source: str, what: str) -> dict:
    d = _hf_common(cfg, source, what)
    ffn = int(_need(cfg, "intermediate_size", source, what))
    d.update(arch="moe", activation="swiglu", ffn_dim=ffn, expert_ffn_dim=ffn,
             n_experts=int(_need(cfg, "num_local_experts", source, what)),
             top_k=int(_first(cfg, ("num_experts_per_tok", "experts_per_token"), source, what)),
             sliding_window=int(cfg["sliding_window"]) if cfg.get("sliding_window") else None)
    return d


def _nemotron_h(cfg: Mapping, source: str, what: str) -> dict:
    d = _hf_common(cfg, source, what)
    pattern = str(_need(cfg, "hybrid_override_pattern", source, what))
    if len(pattern) != d["n_layers"]:
        raise ArchFileError(f"{source}: hybrid_override_pattern has {len(pattern)} blocks but num_hidden_layers "
                            f"is {d['n_layers']}")
    moe = "E" in pattern
    d.update(arch="hybrid-mamba-moe" if moe else "hybrid-mamba", activation="gelu", layer_pattern=pattern,
             ffn_dim=int(_need(cfg, "intermediate_size", source, what)),
             mamba_state_dim=int(_need(cfg, "ssm_state_size", source, what)),
             mamba_n_heads=int(_need(cfg, "mamba_num_heads", source, what)),
             mamba_head_dim=int(_need(cfg, "mamba_head_dim", source, what)),
             mamba_n_groups=int(_need(cfg, "n_groups", source, what)),
             mamba_chunk_size=int(cfg["chunk_size"]) if cfg.get("chunk_size") else None,
             mamba_conv_kernel=int(cfg["conv_kernel"]) if cfg.get("conv_kernel") else None,
             mamba_expand=int(cfg["expand"]) if cfg.get("expand") else None,
             moe_latent_size=int(cfg["moe_latent_size"]) if cfg.get("moe_latent_size") else None)
    if moe:
        n_shared = int(cfg.get("n_shared_experts") or 0)
        shared = int(cfg.get("moe_shared_expert_intermediate_size") or 0)
        fe = int(_need(cfg, "moe_intermediate_size", source, what))
        d.update(n_experts=int(_need(cfg, "n_routed_experts", source, what)),
                 top_k=int(_need(cfg, "num_experts_per_tok", source, what)), expert_ffn_dim=fe,
                 n_shared_experts=n_shared,
                 shared_expert_ffn_dim=(shared // n_shared if n_shared and shared and shared // n_shared != fe
                                        else None))
    return d


def _jamba(cfg: Mapping, source: str, what: str) -> dict:
    d = _hf_common(cfg, source, what)
    attn_period = int(_need(cfg, "attn_layer_period", source, what))
    attn_offset = int(_need(cfg, "attn_layer_offset", source, what))
    exp_period = int(_need(cfg, "expert_layer_period", source, what))
    exp_offset = int(_need(cfg, "expert_layer_offset", source, what))
    n_experts = int(_need(cfg, "num_experts", source, what))
    ffn = int(_need(cfg, "intermediate_size", source, what))
    pattern = "".join(("*" if i % attn_period == attn_offset else "M")
                      + ("E" if n_experts > 1 and i % exp_period == exp_offset else "-")
                      for i in range(d["n_layers"]))
    n_moe = pattern.count("E")
    dt_rank = _need(cfg, "mamba_dt_rank", source, what)
    if dt_rank == "auto":  # JambaConfig / mamba_ssm Mamba: math.ceil(hidden_size / 16)
        dt_rank = -(-d["d_model"] // 16)
    d.update(arch="hybrid-mamba-moe" if n_moe else "hybrid-mamba", activation="swiglu", layer_pattern=pattern,
             ffn_dim=ffn, expert_ffn_dim=ffn, n_experts=n_experts if n_moe else 0,
             top_k=int(_need(cfg, "num_experts_per_tok", source, what)) if n_moe else 0,
             n_dense_layers=d["n_layers"] - n_moe, moe_layer_step=exp_period, n_layers=len(pattern),
             mamba_dt_rank=int(dt_rank), mamba_state_dim=int(_need(cfg, "mamba_d_state", source, what)),
             mamba_conv_kernel=int(cfg["mamba_d_conv"]) if cfg.get("mamba_d_conv") else None,
             mamba_expand=int(cfg["mamba_expand"]) if cfg.get("mamba_expand") else None)
    return d


# ---------------------------------------------------------------- Gemma, Phi-3, OLMo, Falcon, GPT-NeoX

def _notes(*parts: str) -> str | None:
    """The `notes` of an architecture read from a config: its approximations, '; '-joined (None for none)."""
    text = "; ".join(p for p in parts if p)
    return text or None


def _window(cfg: Mapping, n_layers: int, what: str) -> tuple[int | None, str]:
    """(sliding_window, its note) of a config whose layers mix local and global attention: the window where some
    layer uses it, and how many layers do (layer_types, else sliding_window_pattern = every k-th layer global, else
    `what`'s rule); the step-time and memory model count full attention on every layer."""
    w = cfg.get("sliding_window")
    if not w:
        return None, ""
    w = int(w)
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        local = sum(1 for t in types if "sliding" in str(t))
        where = f"{local} of {len(types)} layers"
        if local == 0:
            return None, ""
    elif cfg.get("sliding_window_pattern"):
        k = int(cfg["sliding_window_pattern"])
        where = f"{n_layers - n_layers // k} of {n_layers} layers (every {k}th layer global)"
    else:
        where = what
    return w, (f"local attention over a {w}-token window on {where}: counted as full attention (the step-time and "
               f"memory model have no windowed attention), so the attention core of long sequences is overstated")


def _gemma(cfg: Mapping, source: str, what: str) -> dict:
    """Gemma / Gemma 2 / Gemma 3 text: a GeGLU MLP (gate, up, down; gelu_pytorch_tanh) recorded as swiglu, an
    explicit head_dim, tied embeddings by default, RMSNorm gains; Gemma 2/3 add post-norms and local layers."""
    d = _hf_common(cfg, source, what, tied_default=True)
    mt = cfg.get("model_type")
    if d["head_dim"] is None:  # GemmaConfig's default head_dim is 256
        d["head_dim"] = 256
    d.update(arch="dense", activation="swiglu", ffn_dim=int(_need(cfg, "intermediate_size", source, what)))
    rule = "every other layer" if mt == "gemma2" else "the local layers"
    window, wnote = _window(cfg, d["n_layers"], rule)
    caps = [k for k in ("attn_logit_softcapping", "final_logit_softcapping") if cfg.get(k)]
    d.update(sliding_window=window, notes=_notes(
        "GeGLU MLP (gated GELU, 3 matrices) recorded as swiglu", wnote,
        f"{' and '.join(caps)} not modelled (elementwise, no weights)" if caps else "",
        "pre- and post-norms and QK-norm gains not counted (<0.01% of the weights)" if mt != "gemma" else ""))
    return d


#: Gemma3TextConfig's defaults: the multimodal Gemma 3 configs (4B, 12B, 27B) leave these keys out of text_config
_GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                         "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                         "sliding_window": 4096, "sliding_window_pattern": 6}


def _gemma3(cfg: Mapping, source: str, what: str) -> dict:
    """Gemma 3: the text model of a Gemma3ForConditionalGeneration config (text_config over Gemma3TextConfig's
    defaults; the SigLIP vision tower is not counted) or a gemma3_text config."""
    if isinstance(cfg.get("text_config"), Mapping):
        text = {**_GEMMA3_TEXT_DEFAULTS, **{k: v for k, v in cfg["text_config"].items() if v is not None},
                "model_type": "gemma3_text"}
        if "tie_word_embeddings" in cfg and "tie_word_embeddings" not in cfg["text_config"]:
            text["tie_word_embeddings"] = cfg["tie_word_embeddings"]
        d = _gemma(text, source, what + " text_config")
        d["notes"] = _notes("the text model only (the vision tower and projector are not counted)", d["notes"])
        return d
    return _gemma({**{k: v for k, v in _GEMMA3_TEXT_DEFAULTS.items() if k.startswith("sliding")}, **cfg},
                  source, what)


def _phi3(cfg: Mapping, source: str, what: str) -> dict:
    """Phi-3 / Phi-4 (model_type phi3): Llama-shaped with fused qkv and gate_up projections (same weights)."""
    d = _dense(cfg, source, what)
    notes = []
    w = cfg.get("sliding_window")
    if w and int(w) < int(cfg.get("max_position_embeddings") or 0):
        d["sliding_window"] = int(w)
        notes.append(f"sliding-window attention over {int(w)} tokens on every layer: counted as full attention")
    if cfg.get("partial_rotary_factor") not in (None, 1, 1.0):
        notes.append(f"rotary on {cfg['partial_rotary_factor']:g} of each head (no cost difference modelled)")
    d["notes"] = _notes(*notes)
    return d


def _phimoe(cfg: Mapping, source: str, what: str) -> dict:
    d = _mixtral(cfg, source, what)
    d["notes"] = _notes("LayerNorm, attention and LM-head biases not counted (<0.01%)")
    return d


def _olmo(cfg: Mapping, source: str, what: str) -> dict:
    """OLMo (model_type olmo): the transformers OlmoConfig (`-hf` checkpoints) or the original OLMo config
    (hf_olmo: d_model, n_layers, mlp_hidden_size or mlp_ratio holding both SwiGLU inputs, weight_tying,
    embedding_size); non-parametric LayerNorm, no biases."""
    if "hidden_size" in cfg or "d_model" not in cfg:
        d = _dense(cfg, source, what)
    else:
        h = int(_need(cfg, "d_model", source, what))
        heads = int(_need(cfg, "n_heads", source, what))
        act = str(cfg.get("activation_type") or "swiglu").lower()
        width = int(cfg.get("mlp_hidden_size") or int(_need(cfg, "mlp_ratio", source, what)) * h)
        gated = act == "swiglu"
        kv = 1 if cfg.get("multi_query_attention") else int(cfg.get("n_kv_heads") or heads)
        d = {"n_layers": int(_need(cfg, "n_layers", source, what)), "d_model": h, "n_heads": heads,
             "n_kv_heads": kv, "head_dim": None,
             "vocab": int(_first(cfg, ("embedding_size", "vocab_size"), source, what)),
             "tied_embeddings": bool(cfg.get("weight_tying", False)), "n_experts": 0, "top_k": 0,
             "n_shared_experts": 0, "n_dense_layers": 0, "arch": "dense",
             "activation": "swiglu" if gated else "gelu", "ffn_dim": width // 2 if gated else width}
    d["notes"] = _notes("non-parametric LayerNorm (no weights)" if cfg.get("model_type") == "olmo" else "",
                        f"qkv clipped at {cfg['clip_qkv']:g} (no cost)" if cfg.get("clip_qkv") else "")
    return d


def _olmo2(cfg: Mapping, source: str, what: str) -> dict:
    """OLMo 2 / OLMo 3: Llama-shaped (SwiGLU, RMSNorm) with post-norms and QK-norm over the whole q / k width;
    OLMo 3 adds local-attention layers (layer_types)."""
    d = _dense(cfg, source, what)
    window, wnote = _window(cfg, d["n_layers"], "the local layers")
    d.update(sliding_window=window, notes=_notes(
        "QK-norm and post-norm gains not counted (<0.01% of the weights)", wnote))
    return d


def _falcon(cfg: Mapping, source: str, what: str) -> dict:
    """Falcon (FalconConfig, or the RefinedWeb configs' n_layer / n_head / n_head_kv / n_embed): GELU MLP of
    ffn_hidden_size (4 x hidden_size when absent), no biases (bias false), tied embeddings. Key-value heads:
    num_kv_heads with new_decoder_architecture (grouped, Falcon-40B/180B), 1 with multi_query (Falcon-7B), else
    every head (transformers FalconAttention)."""
    h = int(_first(cfg, ("hidden_size", "n_embed"), source, what))
    heads = int(_first(cfg, ("num_attention_heads", "n_head"), source, what))
    layers = int(_first(cfg, ("num_hidden_layers", "n_layer"), source, what))
    # the RefinedWeb code (Falcon-40B's first config) is the new decoder architecture, RefinedWebModel (7B) the old
    new_arch = bool(cfg.get("new_decoder_architecture", cfg.get("model_type") == "RefinedWeb"))
    multi_query = bool(cfg.get("multi_query", True))
    if new_arch:
        kv = int(_first(cfg, ("num_kv_heads", "n_head_kv"), source, what, heads))
    else:
        kv = 1 if multi_query else heads
    act = str(cfg.get("activation") or "gelu").lower()
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
        raise ArchFileError(f"{source}: {what} has 'activation' = {act!r}; expected a non-gated GELU")
    parallel = bool(cfg.get("parallel_attn", True)) or new_arch
    d = {"n_layers": layers, "d_model": h, "n_heads": heads, "n_kv_heads": kv, "head_dim": None,
         "vocab": int(_need(cfg, "vocab_size", source, what)),
         "tied_embeddings": bool(cfg.get("tie_word_embeddings", True)), "n_experts": 0, "top_k": 0,
         "n_shared_experts": 0, "n_dense_layers": 0, "arch": "dense", "activation": "gelu",
         "ffn_dim": int(cfg.get("ffn_hidden_size") or 4 * h)}
    d["notes"] = _notes(
        "attention and MLP in parallel from the same input, counted as sequential (same FLOPs and weights)"
        if parallel else "",
        "no biases in the model; the gelu accounting counts GPT-style biases (<0.1%)" if not cfg.get("bias")
        else "",
        "ALiBi position biases (no weights)" if cfg.get("alibi") else "")
    return d


def _gpt_neox(cfg: Mapping, source: str, what: str) -> dict:
    """GPT-NeoX / Pythia: non-gated GELU MLP with biases and LayerNorms (the gelu accounting's GPT-style biases),
    untied embeddings by default (GPTNeoXConfig)."""
    d = _hf_common(cfg, source, what)
    d.update(arch="dense", activation="gelu", ffn_dim=int(_need(cfg, "intermediate_size", source, what)))
    pct = cfg.get("rotary_pct", 0.25)
    d["notes"] = _notes(
        "attention and MLP in parallel residual (use_parallel_residual), counted as sequential (same FLOPs and "
        "weights)" if cfg.get("use_parallel_residual", True) else "",
        f"rotary on {float(pct):g} of each head (no cost difference modelled)" if pct not in (None, 1, 1.0) else "")
    return d


_READERS = {"llama": _dense, "mistral": _dense, "qwen2": _dense, "qwen3": _dense, "mixtral": _mixtral,
            "qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe, "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
            "kimi_k2": _deepseek, "llama4": _llama4, "llama4_text": _llama4, "gpt_oss": _gpt_oss,
            "nemotron_h": _nemotron_h, "jamba": _jamba, "gemma": _gemma, "gemma2": _gemma, "gemma3": _gemma3,
            "gemma3_text": _gemma3, "phi3": _phi3, "phimoe": _phimoe, "olmo": _olmo, "olmo2": _olmo2,
            "olmo3": _olmo2, "falcon": _falcon, "gpt_neox": _gpt_neox}


def hf_model_type(cfg: Mapping) -> str | None:
    """The reader a Hugging Face config needs: its model_type, else its `architectures` class."""
    mt = cfg.get("model_type")
    mt = _TYPE_ALIASES.get(mt, mt)
    if mt in _READERS:
        return mt
    for cls in cfg.get("architectures") or []:
        if cls in _CLASS_TO_TYPE:
            return _CLASS_TO_TYPE[cls]
    return mt


def from_hf_config(cfg: Mapping, source: str) -> dict:
    """A Hugging Face config.json (parsed) -> architecture dict."""
    mt = hf_model_type(cfg)
    if mt not in _READERS:
        raise ArchFileError(f"{source}: Hugging Face model_type {mt!r} is not supported; supported: "
                            f"{', '.join(HF_MODEL_TYPES)} (or give a row of the measurements/architectures.csv "
                            f"schema)")
    what = f"Hugging Face config (model_type '{mt}')"
    _finite_numbers(cfg, source)
    try:
        d = _READERS[mt](cfg, source, what)
    except (TypeError, ValueError, OverflowError) as err:  # a field the reader reads as a whole number is not one
        if isinstance(err, ArchFileError):
            raise
        raise ArchFileError(f"{source}: {what}: a field that must be a whole number is not ({err})") from None
    _bounded(d, source)
    if d.get("expert_ffn_dim") is None and d["n_experts"]:
        d["expert_ffn_dim"] = d["ffn_dim"]
    # the model's name: `_name_or_path`, else the file's stem (unless it is the generic "config"), else its class
    stem = str(source).replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0]
    name = cfg.get("_name_or_path") or (stem if stem and stem != "config" else None) \
        or (cfg.get("architectures") or [mt])[0]
    d.setdefault("id", str(name))
    d.setdefault("name", str(name))
    d["hf_notes"] = d.get("notes")  # marks the notes as a config's approximations (pipeline.api assumptions)
    return _finish(d)


def is_hf_config(obj: Mapping) -> bool:
    return "model_type" in obj or "architectures" in obj or "hidden_size" in obj


def architecture_from_mapping(obj: Mapping, source: str) -> dict:
    """A schema row or a Hugging Face config (detected by its keys) -> architecture dict."""
    if ("n_layers" in obj or "d_model" in obj) and hf_model_type(obj) not in _READERS:
        return from_schema_row(obj, source)
    if is_hf_config(obj):
        return from_hf_config(obj, source)
    raise ArchFileError(f"{source}: neither a row of the measurements/architectures.csv schema (no 'n_layers') nor "
                        f"a Hugging Face config.json (no 'model_type'/'architectures')")


# ---------------------------------------------------------------- hardware

def hardware_from_mapping(row: Mapping, source: str) -> dict:
    """A row of the hardware_specs.csv schema -> hardware dict (numbers parsed; required columns checked)."""
    missing = [c for c in HARDWARE_REQUIRED if _blank(row.get(c))]
    if missing:
        raise ArchFileError(f"{source}: hardware row lacks {', '.join(repr(c) for c in missing)} "
                            f"(the columns of measurements/hardware_specs.csv)")
    _finite_numbers(row, source)
    out = {k: (None if _blank(v) else v) for k, v in row.items()}
    for c in HARDWARE_NUMERIC:
        out[c] = _float(row.get(c), source, c, HARDWARE_MAX)
    if all(out[c] is None for c in HARDWARE_NUMERIC if c.startswith("peak_")):
        raise ArchFileError(f"{source}: hardware row has no peak (give at least 'peak_bf16_tflops')")
    out["id"] = str(row["id"]).strip()
    out.setdefault("name", out["id"])
    return out
