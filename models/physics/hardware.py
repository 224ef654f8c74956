"""Hardware resolution: turn rows of ``measurements/hardware_specs.csv`` into model inputs.

Pure functions: the caller reads the CSV (or the DuckDB ``hardware`` table) and passes a
polars DataFrame; nothing here touches files.

Rules (all documented in docs/model.md, section "Hardware"):

* The table states the facts the model keys on, each with its source in ``source_ref``
  (measurements/DATA_CARD.md); nothing is parsed from the prose columns:
  ``scaleup_size`` = ``scaleup_domain_accelerators``, the accelerators one scale-up link joins (8 on an HGX/DGX
  board, 72 in an NVL72 rack, a TPU's whole pod: ICI spans it); empty -> ``gpus_per_node_typical`` (a hardware
  file that states only its node); both empty -> ``default_scaleup_size`` (8, the HGX/DGX and common 8-slot PCIe
  server size) and ``scaleup_size_fallback = True``. ``accelerators_per_host`` (one host's
  accelerators: 4 per NVL72 compute tray, 4 or 8 TPU chips per host) passes through for the readers of node
  counts (models.corpus.runs_adapter.spans_hosts, pipeline.predict_runs).
* ``inter_node_bw_gbps`` empty -> ``min(intra_node_bw_gbps, inter_node_fallback_gbps)``
  with ``inter_node_bw_fallback = True``. The fallback (12.5 GB/s = one 100 Gb/s
  EDR/100GbE NIC per accelerator) is the typical lowest-tier fabric in the table (DGX-1
  P100/V100 have 6.25 GB/s per GPU, DGX A100 25); a NIC behind a PCIe slot can never
  exceed the accelerator's PCIe link, hence the ``min``.
* ``scaleup_link`` = the table's kind of scale-up link (LINK_KINDS): ``pcie`` where the accelerators talk over
  PCIe and the host (GTX 580, GTX 1080 Ti, K80, A100/H100 PCIe, H100 NVL, L40S, RTX 4090), else ``nvlink``,
  ``xgmi`` (Infinity Fabric), ``ici`` (TPU), ``ethernet`` (Gaudi's on-chip RoCE); empty for a link none of them
  (AWS NeuronLink, a custom part: the NVLink-class tier). A hardware file that leaves it empty is read from the
  words of its ``intra_node_link`` (``link_kind``: "PCIe Gen4 x16" is ``pcie``). A PCIe card with an optional 2-GPU NVLink bridge is
  ``pcie``: its ``intra_node_bw_gbps`` is the PCIe link, and every group larger than the bridged pair talks over
  PCIe. ``scaleup_link_code`` (LINK_CODES, NaN when empty) carries it into the model arrays: pcie rows use the
  PCIe/host tier's efficiency and latency (``PhysParams.pcie_eff``, ``alpha_pcie_s``; docs/model.md "Hardware").
* ``sm_count`` is the table's; where it is empty (no spec sheet gives it), equivalent SMs from the 16-bit peak
  (``A100_TFLOPS_PER_SM``) with ``sm_count_fallback = True``.
* ``generation_code`` is the calibration group of the row's ``generation`` (models.core.domains); a generation the
  groups do not list is ``unknown``, so its predictions are extrapolated.
* A stated fact that is not one (a domain or host size that is not a whole number >= 1, a link kind outside
  LINK_KINDS) is refused like a missing required value (below).
* fp32-only parts (no tensor cores: GTX 580, GTX 1080 Ti, K80 - no BF16/TF32/FP8 peak and
  ``peak_fp16 == peak_fp32``) run every dtype at the FP32 peak (``fp32_only = True``).
* Memory capacities are binary whatever the source's word: TPU v3/v4 list 32 GiB (DATA_CARD.md), NVIDIA's
  "80 GB" are 80 GiB too (nvidia-smi, models.memory.model.CAPACITY_BYTES_PER_GB); ``memory_gb`` is kept as stated
  and the model compares bytes with ``models.memory.model.capacity_bytes(memory_gb)``.
* A value the model needs (memory_gb, memory_bw_gbps, intra_node_bw_gbps, at least one
  peak) that is empty raises ``HardwareSpecError`` naming the id and column
  (``strict=True``), or fills ``hardware_error`` for that row (``strict=False``).
"""

from __future__ import annotations

import re
from typing import Mapping

import numpy as np
import polars as pl

from models.core.domains import generation_group_code, hardware_code
from models.core.params import DTYPE_CODES

PEAK_COLUMNS = (
    "peak_fp32_tflops",
    "peak_tf32_tflops",
    "peak_bf16_tflops",
    "peak_fp16_tflops",
    "peak_fp8_tflops",
)
#: dense FP4 peak (NVFP4/MXFP4; vendor sparse figures halved), empty for parts without FP4 tensor cores. Exposed to
#: the model (hardware_arrays) and chosen for nvfp4 by `peak_tflops_for` (no FP4 peak: nvfp4 is refused).
FP4_PEAK_COLUMN = "peak_fp4_tflops"
NUMERIC_COLUMNS = PEAK_COLUMNS + (
    FP4_PEAK_COLUMN,
    "memory_gb",
    "memory_bw_gbps",
    "intra_node_bw_gbps",
    "inter_node_bw_gbps",
    "gpus_per_node_typical",
    "sm_count",
    "accelerators_per_host",
    "scaleup_domain_accelerators",
)
REQUIRED_COLUMNS = ("memory_gb", "memory_bw_gbps", "intra_node_bw_gbps")
HW_MODEL_COLUMNS = PEAK_COLUMNS + (
    FP4_PEAK_COLUMN,
    "memory_gb",
    "memory_bw_gbps",
    "intra_node_bw_gbps",
    "inter_node_bw_gbps",
    "scaleup_size",
    "scaleup_link_code",
)
#: kinds of scale-up link (``scaleup_link``), coded for the model arrays (``scaleup_link_code``)
LINK_KINDS = ("nvlink", "xgmi", "ici", "ethernet", "pcie")
LINK_CODES = {k: i for i, k in enumerate(LINK_KINDS)}
#: the code of the PCIe/host tier (models.physics.step_time reads it)
PCIE_LINK_CODE = LINK_CODES["pcie"]

#: hardware facts the table states per row, with their source in `source_ref` (measurements/DATA_CARD.md)
SCALEUP_DOMAIN_COLUMN = "scaleup_domain_accelerators"  # accelerators one scale-up link joins
HOST_COLUMN = "accelerators_per_host"  # accelerators in one host (node)
LINK_COLUMN = "scaleup_link"  # LINK_KINDS; empty: none of them
#: the stated counts: whole numbers of accelerators, at least 1
COUNT_COLUMNS = (SCALEUP_DOMAIN_COLUMN, HOST_COLUMN)
# Without an SM count (H20, L4, Trainium, a custom part): equivalent SMs = 16-bit dense peak / the A100's per-SM
# 16-bit rate (312 TFLOP/s / 108 SMs), i.e. the GEMM ramp is as long in time as on an A100-class SM array.
A100_TFLOPS_PER_SM = 312.0 / 108.0
INTER_NODE_FALLBACK_GBPS = 12.5
DEFAULT_SCALEUP_SIZE = 8


class HardwareSpecError(ValueError):
    """A hardware value the model needs is missing or invalid."""

    def __init__(self, hw_id: str, column: str, message: str = "") -> None:
        self.hw_id = hw_id
        self.column = column
        super().__init__(
            f"hardware '{hw_id}': column '{column}' "
            + (message or "is empty but required by the step-time model")
        )


def link_kind(link: str | None) -> str | None:
    """The kind of scale-up link an ``intra_node_link`` text names (LINK_KINDS), None when it names none: the kind of
    a row that does not state ``scaleup_link`` (a user's hardware file); tests/test_hardware_facts.py checks that the
    shipped table's stated kinds agree with their words. "PCIe ..." first: a PCIe card with an optional NVLink bridge pair is ``pcie``
    (module docstring)."""
    text = (link or "").strip().lower()
    if not text:
        return None
    if text.startswith("pcie"):
        return "pcie"
    for kind, words in (("nvlink", ("nvlink",)), ("xgmi", ("infinity fabric", "xgmi")), ("ici", ("ici",)),
                        ("ethernet", ("roce", "gbe", "ethernet")), ("pcie", ("pcie",))):
        if any(re.search(rf"\b{re.escape(w)}\b", text) for w in words):
            return kind
    return None


def resolve_hardware(
    hw: pl.DataFrame,
    *,
    strict: bool = True,
    inter_node_fallback_gbps: float = INTER_NODE_FALLBACK_GBPS,
    default_scaleup_size: int = DEFAULT_SCALEUP_SIZE,
) -> pl.DataFrame:
    """Resolve hardware spec rows into the columns the step-time model consumes.

    Input: rows with (at least) ``id`` and the numeric columns of hardware_specs.csv
    (strings or numbers; empty string/null = missing). Output: the input columns (numeric
    ones cast to Float64) plus ``scaleup_size``, ``scaleup_size_fallback``,
    ``inter_node_bw_fallback``, ``fp32_only``, ``scaleup_link`` /
    ``scaleup_link_code``, ``sm_count_fallback``, ``generation_code``, ``hardware_code`` and ``hardware_error``
    (null when the row is usable).
    """
    df = hw
    unreadable: dict[str, list] = {}  # per count column, the text of a cell that is no number (row order)
    for c in NUMERIC_COLUMNS:
        if c not in df.columns:
            df = df.with_columns(pl.lit(None, dtype=pl.Float64).alias(c))
        elif df.schema[c] == pl.Utf8:
            text = pl.col(c).str.strip_chars().replace("", None)
            if c in COUNT_COLUMNS:
                unreadable[c] = df.select(pl.when(text.cast(pl.Float64, strict=False).is_null()).then(text))\
                    .to_series().to_list()
            df = df.with_columns(text.cast(pl.Float64, strict=False))
        else:
            df = df.with_columns(pl.col(c).cast(pl.Float64, strict=False))
    for c in ("id", "intra_node_link", "source_ref", "notes", "vendor"):
        if c not in df.columns:
            df = df.with_columns(pl.lit(None, dtype=pl.Utf8).alias(c))

    rows = df.to_dicts()
    out_rows = []
    for i, r in enumerate(rows):
        hw_id = r.get("id") or "<no id>"
        err = None
        # fp32-only parts
        fp32_only = (
            r["peak_fp32_tflops"] is not None
            and r["peak_bf16_tflops"] is None
            and r["peak_tf32_tflops"] is None
            and r["peak_fp8_tflops"] is None
            and (r["peak_fp16_tflops"] is None or r["peak_fp16_tflops"] == r["peak_fp32_tflops"])
        )
        if fp32_only:
            for c in ("peak_tf32_tflops", "peak_bf16_tflops", "peak_fp16_tflops", "peak_fp8_tflops"):
                r[c] = r["peak_fp32_tflops"]
        # scale-up domain: the table's, else the typical node (a hardware file that states only that), else the
        # default size (flagged)
        domain = r[SCALEUP_DOMAIN_COLUMN] if r[SCALEUP_DOMAIN_COLUMN] is not None else r["gpus_per_node_typical"]
        su_fallback = domain is None
        scaleup = float(default_scaleup_size) if su_fallback else domain
        # scale-out
        inter_fb = False
        if r["inter_node_bw_gbps"] is None or not r["inter_node_bw_gbps"] > 0:
            intra = r["intra_node_bw_gbps"]
            r["inter_node_bw_gbps"] = (
                min(intra, inter_node_fallback_gbps) if intra is not None else inter_node_fallback_gbps
            )
            inter_fb = True
        # required values
        for c in REQUIRED_COLUMNS:
            v = r[c]
            if v is None or not (v > 0):
                err = HardwareSpecError(hw_id, c)
                break
        if err is None and all(r[c] is None for c in PEAK_COLUMNS):
            err = HardwareSpecError(hw_id, "peak_bf16_tflops", "and every other peak column are empty")
        # stated facts: counts of accelerators, a link kind the model knows
        for c in COUNT_COLUMNS:
            text, v = unreadable.get(c, [None] * len(rows))[i], r[c]
            if err is None and (text is not None or (v is not None and not (v >= 1 and float(v).is_integer()))):
                err = HardwareSpecError(hw_id, c, f"= {text if text is not None else f'{v:g}'} is not a whole "
                                                  "number of accelerators >= 1")
        stated = r.get(LINK_COLUMN)
        kind = (str(stated).strip().lower() if stated is not None else "") or None
        if kind is None:  # a hardware file that does not state the kind: the words of its intra_node_link
            kind = link_kind(r.get("intra_node_link"))
        elif kind not in LINK_CODES:
            err = err or HardwareSpecError(hw_id, LINK_COLUMN, f"= '{stated}' is none of "
                                                               f"{', '.join(LINK_KINDS)} (empty: a link none of them)")
            kind = None
        if err is not None and strict:
            raise err
        r["scaleup_size"] = float(scaleup)
        r["scaleup_size_fallback"] = su_fallback
        r["scaleup_link"] = kind
        r["scaleup_link_code"] = float(LINK_CODES[kind]) if kind is not None else None
        r["inter_node_bw_fallback"] = inter_fb
        r["fp32_only"] = fp32_only
        r["hardware_error"] = None if err is None else str(err)
        # SMs for the GEMM-size ramp (PhysParams.gemm_ramp_flops_per_sm)
        sm_fallback = not (r["sm_count"] is not None and r["sm_count"] > 0)
        if sm_fallback:  # no SM count in the table: equivalent SMs from the 16-bit peak
            peak16 = next((r[c] for c in ("peak_bf16_tflops", "peak_fp16_tflops", "peak_fp32_tflops")
                           if r[c] is not None and r[c] > 0), None)
            r["sm_count"] = peak16 / A100_TFLOPS_PER_SM if peak16 else None
        r["sm_count_fallback"] = sm_fallback
        # calibration domain: the group of the row's generation (models.core.domains), as a code for the arrays
        r["generation_code"] = float(generation_group_code(r.get("generation")))
        # and the hardware model itself (models.core.domains.hardware_code): a model the fit never measured is extrapolated
        r["hardware_code"] = hardware_code(r.get("id"))
        out_rows.append(r)

    schema = dict(df.schema)
    schema.update(
        {
            "scaleup_size": pl.Float64,
            "scaleup_size_fallback": pl.Boolean,
            "scaleup_link": pl.Utf8,
            "scaleup_link_code": pl.Float64,
            "inter_node_bw_fallback": pl.Boolean,
            "fp32_only": pl.Boolean,
            "hardware_error": pl.Utf8,
            "generation_code": pl.Float64,
            "hardware_code": pl.Float64,
            "sm_count_fallback": pl.Boolean,
        }
    )
    return pl.DataFrame(out_rows, schema=schema, orient="row")


# ---------------------------------------------------------------------------------------
# Peak selection by precision (vectorized)
# ---------------------------------------------------------------------------------------
def _nan(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def encode_dtype(dtype) -> np.ndarray:
    """Map dtype strings (scalar or array) to DTYPE_CODES; unknown -> -1."""
    arr = np.atleast_1d(np.asarray(dtype, dtype=object))
    return np.array([DTYPE_CODES.get(str(x).lower(), -1) if x is not None else -1 for x in arr], dtype=np.int64)


def peak_table(hw: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-dtype-code candidate peaks and fallback flags (index = DTYPE_CODES value).

    Entries that share a source are the same array (e.g. the four fp8-family codes): treat
    the result as read-only.
    """
    fp32 = _nan(hw["peak_fp32_tflops"])
    tf32 = _nan(hw["peak_tf32_tflops"])
    bf16 = _nan(hw["peak_bf16_tflops"])
    fp16 = _nan(hw["peak_fp16_tflops"])
    fp8 = _nan(hw["peak_fp8_tflops"])
    fp4 = _nan(hw[FP4_PEAK_COLUMN]) if hw.get(FP4_PEAK_COLUMN) is not None else np.full(np.shape(fp8), np.nan)
    shape = np.broadcast(fp32, tf32, bf16, fp16, fp8).shape
    no_fb = np.zeros(shape, dtype=bool)

    def first(*cands):
        out = np.broadcast_to(cands[0], shape)
        fb = no_fb
        for c in cands[1:]:
            m = np.isnan(out)
            if not np.count_nonzero(m):
                break
            out = np.where(m, c, out)
            fb = m if fb is no_fb else fb | m
        return out, fb

    p_bf16, f_bf16 = first(bf16, fp16)
    p_fp16, f_fp16 = first(fp16, bf16)
    p_fp8, f_fp8 = first(fp8, bf16, fp16)
    # NVFP4 runs at the dense FP4 peak; a part without one cannot run it (NaN -> ERR_DTYPE_PEAK), no fallback
    p_fp4, f_fp4 = np.broadcast_to(fp4, shape), no_fb
    p_fp32, f_fp32 = first(fp32)
    p_tf32, f_tf32 = first(tf32, fp32)
    peaks = [p_bf16, p_fp16, p_fp8, p_fp8, p_fp8, p_fp4, p_fp32, p_tf32]
    flags = [f_bf16, f_fp16, f_fp8, f_fp8, f_fp8, f_fp4, f_fp32, f_tf32]
    return peaks, flags


def choose_peak(codes: np.ndarray, peaks: list[np.ndarray], flags: list[np.ndarray]):
    codes = np.asarray(codes)
    if codes.dtype != np.int64:
        codes = codes.astype(np.int64)
    n_codes = len(peaks)  # one peak per dtype code (DTYPE_CODES order)
    bad = (codes < 0) | (codes >= n_codes)
    shape = np.broadcast(codes, peaks[0]).shape
    any_bad = bool(np.any(bad))
    idx = np.where(bad, 0, codes) if any_bad else codes
    # which codes occur (one pass); a code maps to the same result as an earlier code when its
    # peak and flag are the same arrays (fp8 family), so those rows need no separate selection
    present = np.bincount(np.ravel(idx), minlength=n_codes) if np.ndim(idx) else np.eye(n_codes, dtype=np.int64)[int(idx)]
    groups: list[tuple[int, list[int]]] = []  # (representative code, codes)
    for code in range(n_codes):
        if not present[code]:
            continue
        for rep, members in groups:
            if peaks[rep] is peaks[code] and flags[rep] is flags[code]:
                members.append(code)
                break
        else:
            groups.append((code, [code]))
    # start from the most frequent group, then one selection per other group present
    groups.sort(key=lambda g: -sum(int(present[c]) for c in g[1]))
    rep0 = groups[0][0]
    peak = np.array(np.broadcast_to(peaks[rep0], shape), dtype=np.float64)
    flag = np.array(np.broadcast_to(flags[rep0], shape), dtype=bool)
    for rep, members in groups[1:]:
        m = idx == members[0]
        for c in members[1:]:
            m |= idx == c
        peak = np.where(m, peaks[rep], peak)
        if np.count_nonzero(flags[rep]) or np.count_nonzero(flag):  # else all False either way
            flag = np.where(m, flags[rep], flag)
    if any_bad:
        peak = np.where(bad, np.nan, peak)
    return peak, flag


def peak_tflops_for(dtype, hw: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Dense peak TFLOP/s of the run's precision, and a flag when a fallback was used.

    dtype: codes (int array, see DTYPE_CODES) or strings. hw: arrays of the PEAK_COLUMNS.
    Selection (docs/model.md "Peak by precision"):
      bf16 -> bf16, else fp16 (flag);  fp16 -> fp16, else bf16 (flag)
      fp8 / fp8-cs / mxfp8 -> fp8, else bf16, else fp16 (flag)
      nvfp4 -> the dense FP4 peak (`peak_fp4_tflops`); NaN (an error, never a silent fallback)
               on parts without one (H100, A100, ...)
      fp32 -> fp32 (NaN if unknown);  tf32 -> tf32, else fp32 (flag)
    A result of NaN means the hardware has no usable peak for this dtype (or the code is
    unknown).
    """
    codes = np.asarray(dtype)
    if codes.dtype.kind in "OUS":
        codes = encode_dtype(codes)
    peaks, flags = peak_table(hw)
    return choose_peak(codes, peaks, flags)


#: the code of Google's inter-chip interconnect: the parts on it are TPUs (``compiler_overlaps_tp``)
ICI_LINK_CODE = LINK_CODES["ici"]


def compiler_overlaps_tp(link_code) -> np.ndarray:
    """Rows whose compiler overlaps the tensor-parallel collectives with the matmuls: TPUs (scale-up link ICI), whose
    programs only XLA compiles. XLA's TPU backend issues collectives asynchronously and decomposes a sharded matmul's
    all-gather / reduce-scatter into ring steps interleaved with the partial matmuls (collective matmul: Wang et al.,
    ASPLOS 2023, "Overlap Communication with Dependent Computation via Decomposition in Large Deep Learning
    Models"), switched on by the LIBTPU flags MaxText's TPU recipes set (--xla_tpu_enable_async_collective_fusion,
    --xla_tpu_overlap_compute_collective_tc: AI-Hypercomputer/maxtext MaxText/configs/v5e/128b.sh, v5p/512b.sh,
    Dec 2023). Such rows hide their TP traffic behind compute while it lasts (models.physics.parts.overlap)."""
    return np.asarray(link_code, dtype=np.float64) == ICI_LINK_CODE


def is_pcie(link_code) -> np.ndarray:
    """Rows whose scale-up link is PCIe (``scaleup_link_code`` == PCIE_LINK_CODE; NaN: not PCIe)."""
    return np.asarray(link_code, dtype=np.float64) == PCIE_LINK_CODE


def hardware_arrays(hw: pl.DataFrame) -> dict[str, np.ndarray]:
    """The model columns of a resolved hardware frame as float arrays (null -> NaN); ``scaleup_link_code`` says
    which rows talk over the PCIe/host tier (``is_pcie``)."""
    return {c: hw[c].cast(pl.Float64).fill_null(np.nan).to_numpy() for c in HW_MODEL_COLUMNS}
