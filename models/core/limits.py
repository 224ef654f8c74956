"""The largest numbers the tool plans for, each with its reason, and the checks every layer applies with them.

A number outside these bounds is not a question the model can answer (a 4,000-digit layer count, NaN
accelerators, a training run of 1e308 months): the CLI, the Python API and the explorer refuse it with one line
that names the value and the bound. The bounds are physical or sensible limits with room to spare, not tuned to
any data: a value near a bound is answered as any other. The options of the commands take theirs from here
(pipeline/options.py `Option.max`); the fields of an architecture or hardware file (models.arch.archfile) from
`ARCH_MAX` and `HARDWARE_MAX`; a JSON text (a config.json, the explorer's `arch_json`) is read by `strict_json`,
which refuses NaN, infinities and integers beyond `JSON_MAX_INT` before anything converts them.
"""

from __future__ import annotations

import json
import math
from numbers import Integral, Real
from typing import Any, Optional

# ------------------------------------------------------------------ the bounds, with their reasons

# accelerators in one job (and every parallel degree, scale-up domain or pod, which cannot exceed them): 16x the
# million-accelerator clusters announced for the late 2020s
MAX_ACCELERATORS = 2**24
# sequences in one optimizer step (global batch, micro-batch, per-GPU batch): published global batches are at most
# tens of millions of tokens, i.e. under a million sequences even of a few dozen tokens
MAX_SEQUENCES = 2**24
# tokens per sequence: above the longest contexts trained (millions of tokens) by more than 10x
MAX_SEQ_LEN = 2**27
# tokens per optimizer step (plan's --global-batch-tokens): 1000x the largest published batches (tens of millions)
MAX_BATCH_TOKENS = 2**36
# training tokens: the largest runs train on ~1e13-1e14 tokens and all text ever written is estimated at ~1e15;
# 1e28 leaves the counterfactual sweeps (frontier, plan --optimal) many orders of magnitude
MAX_TOKENS = 1e28
# layers (blocks) of a model, and interleaved chunks per pipeline stage: the deepest trained transformers have
# about a thousand
MAX_LAYERS = 2**17
# a width (d_model, an MLP's hidden size, a head dim, a low-rank or latent size, a Mamba dimension): published
# widths are at most tens of thousands
MAX_WIDTH = 2**24
# attention heads, key-value heads, Mamba heads or groups: published models have at most a few hundred
MAX_HEADS = 2**20
# vocabulary: published tokenizers have at most a few hundred thousand tokens
MAX_VOCAB = 2**26
# experts of a MoE layer, and experts per token: a million-expert layer has been trained (PEER); 16x that
MAX_EXPERTS = 2**24
# a ratio (MoE capacity factor, network oversubscription): past the expert count a capacity factor drops no token,
# and an oversubscription of a million leaves no network at all
MAX_RATIO = 1e6
# bandwidth per accelerator, GB/s (scale-up, scale-out, memory): 1,000x today's fastest links and HBM stacks
MAX_BANDWIDTH_GBPS = 1e7
# memory per accelerator, GB: a petabyte, 1,000x a wafer-scale system's external memory per device
MAX_MEMORY_GB = 1e6
# peak throughput per accelerator, TFLOP/s: 100x a wafer-scale engine's
MAX_TFLOPS = 1e7
# power per accelerator, W: a wafer-scale system draws tens of kW; 1 MW is 20x that
MAX_POWER_W = 1e6
# streaming multiprocessors (or cores) per accelerator: a wafer-scale engine has ~1e6 cores
MAX_CORES = 2**24
# time: a century (a training run, a deadline); past it the hardware, prices and the people are gone
MAX_MONTHS = 1200.0
MAX_DAYS = 36_525.0
# money, USD: 10 trillion, about a tenth of world GDP and 20x the largest AI infrastructure programme announced
MAX_USD = 1e13
# layouts one search or plan returns
MAX_TOP = 100_000
# a calendar year (a hardware row's release year)
MAX_YEAR = 2200
# any integer of a JSON text (a config.json field, a run record): 2**53 is the largest a float holds exactly,
# far above any field of a model's config (vocabularies, positions, rope bases are < 1e12)
JSON_MAX_INT = 2**53

#: the largest value of each numeric field of an architecture (models.arch.archfile INT_FIELDS, params_b)
ARCH_MAX = {
    "n_layers": MAX_LAYERS, "d_model": MAX_WIDTH, "n_heads": MAX_HEADS, "n_kv_heads": MAX_HEADS,
    "head_dim": MAX_WIDTH, "ffn_dim": MAX_WIDTH, "vocab": MAX_VOCAB, "n_experts": MAX_EXPERTS, "top_k": MAX_EXPERTS,
    "expert_ffn_dim": MAX_WIDTH, "n_shared_experts": MAX_EXPERTS, "n_dense_layers": MAX_LAYERS,
    "q_lora_rank": MAX_WIDTH, "kv_lora_rank": MAX_WIDTH, "qk_rope_head_dim": MAX_WIDTH, "qk_nope_head_dim": MAX_WIDTH,
    "v_head_dim": MAX_WIDTH, "shared_expert_ffn_dim": MAX_WIDTH, "moe_layer_step": MAX_LAYERS,
    "mtp_layers": MAX_LAYERS, "mamba_state_dim": MAX_WIDTH, "mamba_n_heads": MAX_HEADS, "mamba_head_dim": MAX_WIDTH,
    "mamba_n_groups": MAX_HEADS, "mamba_chunk_size": MAX_SEQ_LEN, "mamba_conv_kernel": MAX_WIDTH,
    "mamba_expand": MAX_WIDTH, "moe_latent_size": MAX_WIDTH, "sliding_window": MAX_SEQ_LEN,
    "mamba_dt_rank": MAX_WIDTH,
    # parameters, billions: a trillion billion, far beyond any model the bounds above allow to be trained
    "params_b": 1e12, "active_params_b": 1e12,
}
#: the largest value of each numeric column of a hardware row (models.arch.archfile HARDWARE_NUMERIC)
HARDWARE_MAX = {
    **{f"peak_{p}_tflops": MAX_TFLOPS for p in ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")},
    "memory_gb": MAX_MEMORY_GB, "memory_bw_gbps": MAX_BANDWIDTH_GBPS, "intra_node_bw_gbps": MAX_BANDWIDTH_GBPS,
    "inter_node_bw_gbps": MAX_BANDWIDTH_GBPS, "gpus_per_node_typical": MAX_ACCELERATORS, "tdp_w": MAX_POWER_W,
    "sm_count": MAX_CORES, "release_year": MAX_YEAR, "scaleup_domain_accelerators": MAX_ACCELERATORS,
    "accelerators_per_host": MAX_ACCELERATORS,
}


# ------------------------------------------------------------------ the checks

def shown(v: Any) -> str:
    """A number as a message shows it: whole floats without '.0' (1e28 as 1e28, 16777216.0 as 16777216), an
    integer of more than 16 digits by its length (its digits can be thousands, more than Python will print)."""
    if isinstance(v, bool) or not isinstance(v, Real):
        text = repr(v)
        return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
    if isinstance(v, Integral):
        n = int(v)
        if abs(n) >= 10**16:
            digits = int((abs(n).bit_length() - 1) * math.log10(2)) + 1  # at most one short: 2^k's digits
            digits += abs(n) >= 10**digits
            return f"a {digits}-digit integer"
        return str(n)
    f = float(v)
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "Infinity" if f > 0 else "-Infinity"
    if f.is_integer() and abs(f) < 1e16:
        return str(int(f))
    return f"{f:.6g}".replace("e+", "e")


def bound_problem(label: str, v: Any, lo: Optional[float] = None, hi: Optional[float] = None, *,
                  whole: bool = False) -> Optional[str]:
    """Why `v` (called `label` in the message) is refused, else None: not a number, NaN or infinite, not whole
    where `whole`, below `lo` or above `hi`. The message names the value and the bound it broke."""
    if isinstance(v, bool) or not isinstance(v, Real):
        return f"{label} {shown(v)} is not a number"
    if not isinstance(v, Integral):
        f = float(v)
        if not math.isfinite(f):
            return f"{label} {shown(v)} is not a finite number"
        if whole and not f.is_integer():
            return f"{label} {shown(v)} is not a whole number"
    if lo is not None and v < lo:
        return f"{label} {shown(v)} is below its minimum {shown(lo)}"
    if hi is not None and v > hi:
        return f"{label} {shown(v)} is above the largest {shown(hi)} this tool plans for"
    return None


class JSONRefused(ValueError):
    """A JSON text with a number no field can hold (NaN, Infinity, an integer beyond JSON_MAX_INT) or not JSON at
    all; the message says which key and what, without the caller's file name (the caller adds it)."""


class _Huge(int):
    """An integer of a JSON text beyond JSON_MAX_INT, kept by its digit count (not converted: Python refuses
    integers of more than 4,300 digits from text)."""

    text: str  # the integer, or its digit count where it is long


def _huge(text: str):
    digits = len(text.lstrip("-"))
    if digits <= 16 and abs(int(text)) <= JSON_MAX_INT:  # 2**53 has 16 digits: a longer text is larger
        return int(text)
    h = _Huge(0)
    h.text = text if digits <= 16 else f"a {digits}-digit integer"
    return h


def _bad_number(v: Any) -> Optional[str]:
    if isinstance(v, _Huge):
        return f"{v.text}, above the largest {JSON_MAX_INT} (2^53) a field holds"
    if isinstance(v, float) and not math.isfinite(v):
        return f"{shown(v)}, not a finite number (JSON has no NaN or Infinity)"
    return None


def _first_bad(v: Any) -> Optional[str]:
    """What is wrong with the first bad number of a value or of the lists in it (objects check their own)."""
    if isinstance(v, list):
        return next((p for p in map(_first_bad, v) if p), None)
    return _bad_number(v)


def _checked_pairs(pairs: list[tuple[str, Any]]) -> dict:
    for key, v in pairs:
        problem = _first_bad(v)
        if problem:
            raise JSONRefused(f"'{key}' = {problem}")
    return dict(pairs)


def strict_json(text: str) -> Any:
    """The value of a JSON text whose every number is finite and every integer at most JSON_MAX_INT; JSONRefused
    naming the key of the first number that is not (or what makes the text not JSON)."""
    try:
        obj = json.loads(text, parse_constant=float, parse_int=_huge, object_pairs_hook=_checked_pairs)
    except JSONRefused:
        raise
    except json.JSONDecodeError as err:
        raise JSONRefused(f"not valid JSON ({err})") from None
    except (ValueError, RecursionError) as err:  # a float's text Python cannot read, nesting too deep
        raise JSONRefused(f"not valid JSON ({str(err)[:200]})") from None
    problem = _first_bad(obj)
    if problem:
        raise JSONRefused(f"a value is {problem}")
    return obj
