"""The one prediction function: physics with the parameters of the configuration's domain, the residual
correction and the interval, vectorized over configurations (pure numpy, no scikit-learn).

Every path that prints or stores a number calls `predict_arrays(arrays, model)` (or its polars front-end
`predict`): `stepcast predict`, `search`, `curve`, `frontier`, `plan`, the tables behind the SQL views.
`model` is one of

* a `PhysParams` -- the analytical model with exactly those parameters (`--analytical-only` passes the priors);
* a `Calibration` -- a fitted calibration under the realistic assumptions;
* a `Predictor` -- a calibration (or none) together with the named assumptions (`realistic` or `ideal`:
  Epoch AI's ideal conditions applied to the fitted parameters (the priors without a fit), no residual).

Realistic: per row, a configuration inside the fit's domain (its hardware generation, precision family and
software era were all in the training runs, `models.core.domains`) is predicted with the fitted physical
parameters and corrected by the residual regression; outside it, with the priors (`models.core.params.DEFAULT`)
and no correction, and its interval takes the wider `q_extrapolated` measured on the transfer protocols.
A cluster larger than any in the fit keeps the fitted parameters but the wider interval.

Reconciliation of the breakdown: the residual multiplies the step by r = exp(-shift); every breakdown column
(compute_s ... optimizer_s) is multiplied by the same r, so the parts still sum to the calibrated step, and
throughput, MFU and HFU are recomputed from the calibrated step (HFU >= MFU always: hardware FLOPs include
the model FLOPs). `analytical_step_time_s` keeps the physics step before the residual.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Union

import numpy as np
import polars as pl

from models.core.domains import GENERATION_GROUPS, Domain
from models.core.params import DEFAULT, PhysParams, Recompute, Sharding, is_low_precision
from models.core.software import PRESETS, preset_params
from models.fitting.adapt import Adaptation, AdaptationRule, apply_adaptation
from models.fitting.bounds import bound_interval
from models.fitting.assumptions import params_for
from models.physics.step_time import BREAKDOWN as step_time_breakdown
from models.physics.step_time import OUTPUT_COLUMNS, encode_configs, with_error_strings
from models.physics.step_time import predict_arrays as physics_arrays

ASSUMPTIONS = ("realistic", "ideal")
#: software preset -> era code, in models.core.software.PRESETS order (a test checks they agree)
ERA_CODES = {"default": 0, "megatron_2022": 1, "pytorch_native": 2}
BREAKDOWN = step_time_breakdown
EXTRA_COLUMNS = ("analytical_step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu_lo",
                 "tokens_per_s_per_gpu_hi", "domain_code")
# domain_code values: a configuration inside the fit's domain, outside it (generation, precision or era unseen), on
# more accelerators than any run of the fit, or on a hardware model the fit never measured (of a generation it did):
# the last two keep the fitted parameters and take the wider interval
DOMAIN_ANALYTICAL, DOMAIN_INSIDE, DOMAIN_OUTSIDE, DOMAIN_SCALE, DOMAIN_NEW_HARDWARE = 0, 1, 2, 3, 4
# ... or a PyTorch-native stack on a generation whose native kernel efficiency the fit did not fit (an earlier
# generation's carried, or the prior): fitted parameters, the wider interval
DOMAIN_NATIVE_CARRIED = 5
# ... or a stated training stack the stack table does not know (measurements/stack_words.csv): the generic stack row,
# fitted parameters, the wider interval
DOMAIN_NEW_STACK = 6

FEATURE_NAMES = (
    # where the physics time goes (fractions of the predicted step)
    "frac_compute", "frac_tp", "frac_bubble", "frac_pp", "frac_dp", "frac_cp", "frac_ep", "frac_optimizer",
    # per-GPU shapes (GEMM sizes, kernel counts)
    "log_tokens_per_mb", "log_hidden_per_tp", "log_ffn_per_tp", "log_layers_per_stage", "log_microbatches",
    # degrees
    "log_tp", "log_pp", "log_dp", "log_n_gpus",
    # precision, recompute, sharding, memory pressure, MoE
    "is_8bit", "recompute_selective", "recompute_full", "fsdp_like", "zero", "sequence_parallel", "mem_fill",
    "is_moe",
)


@dataclass
class Calibration:
    """A fitted calibration as plain numbers: physics parameters, domain, ridge residual, interval half-widths.

    Residual: shift = ((x - feature_mean) / feature_scale) . coef + intercept on `FEATURE_NAMES`, the log of
    measured / physics throughput; `coef` all zero for the physics-only kind. Interval: a configuration
    inside the domain gets +- q_inside (log), others +- q_extrapolated (split-conformal quantiles of the
    out-of-fold errors of the transfer protocols, `models.fitting.calibration`)."""

    version: str
    params: PhysParams
    preset_overrides: dict
    domain: Domain
    model_kind: str
    feature_mean: np.ndarray
    feature_scale: np.ndarray
    coef: np.ndarray
    intercept: float
    q_inside: float
    q_extrapolated: float
    alpha: float = 0.10
    metrics: dict = field(default_factory=dict)
    # which physical parameters answer outside the domain: "fitted" (the pooled fit over every domain seen:
    # the population estimate of a portable parameter) or "prior" (models.core.params.DEFAULT)
    outside: str = "fitted"
    # the interval's width model (None: constant half-widths, a fit stored without one): the half-width of a
    # configuration is q_inside (or q_extrapolated) x exp(width_features . width_coef), so a mixture-of-experts,
    # hybrid, low-precision or very large run gets the wider interval its out-of-fold errors show
    width_coef: np.ndarray | None = None
    # how a source's own runs adapt this fit, as the k-shot protocol chose and measured it (models.fitting.adapt;
    # None: a fit stored without one, which cannot be adapted)
    adaptation_rule: AdaptationRule | None = None

    @property
    def q(self) -> float:  # the inside half-width (the single `q` of earlier fits)
        return self.q_inside

    @property
    def kappa(self) -> float:  # earlier fits widened with a novelty distance; this one by domain
        return 0.0

    @property
    def hardware_seen(self) -> tuple:
        return self.domain.generations

    def params_for(self, preset: str = "default") -> PhysParams:
        return preset_params(preset, self.params, self.preset_overrides)


@dataclass(frozen=True)
class Predictor:
    """A calibration (or None: the priors answer) under named assumptions."""

    calibration: Calibration | None = None
    assumptions: str = "realistic"
    # a source's adaptation of the calibration (its throughput factor and interval; realistic assumptions only)
    adaptation: Adaptation | None = None

    def __post_init__(self):
        if self.assumptions not in ASSUMPTIONS:
            raise ValueError(f"unknown assumptions '{self.assumptions}': expected one of {', '.join(ASSUMPTIONS)}")

    @property
    def fit_version(self) -> str | None:
        return None if self.calibration is None else self.calibration.version


Model = Union[PhysParams, Calibration, Predictor, None]


def ideal_params(base: PhysParams = DEFAULT) -> PhysParams:
    """Epoch AI's "ideal conditions" (Erdil & Schneider-Joseph 2024): no host overhead or GEMM-size ramp,
    perfect overlap where the schedule allows it, no memory allowance beyond the model's own state; latency
    stays."""
    try:  # the named assumption sets, when the frontier's module is present

        return params_for("ideal", base)
    except ImportError:
        return base.with_(host_overhead_s_per_op=0.0, gemm_ramp_flops_per_sm=0.0, tp_overlap=1.0, dp_overlap=1.0,
                          fsdp_gather_overlap=1.0, ep_overlap=1.0, pp_overlap=1.0, mem_overhead_gb=0.0,
                          mem_fragmentation_frac=0.0)


NATIVE_GEN_KEY = "pytorch_native@"  # overrides key of the PyTorch-native kernel efficiency of one generation
GEN_KEY = "gen:"  # overrides key of the values fitted for one hardware generation group, e.g. "gen:Hopper"
#: fractions of a peak fitted per hardware generation group (the largest group in the data defines the shared
#: value; every other group with at least calibration.MIN_GENERATION_RUNS runs gets its own): A100 and H100 GEMMs
#: reach different shares of their datasheet peaks, a constant with the same meaning but not the same value. A
#: generation the fit never saw takes the priors' (``predict_arrays``).
GENERATION_FIELDS = ("matmul_eff_16bit", "matmul_eff_8bit")


#: NVIDIA generation groups in release order: a later one without its own fitted PyTorch-native kernel efficiency
#: takes the latest earlier one's, scaled by `LEGACY_MMA_SHARE` (Blackwell runs the Hopper-era kernels' successors;
#: the gap does not close)
_NVIDIA_ORDER = ("pre-Ampere", "Ampere", "Ada", "Hopper", "Blackwell")

#: Share of a generation's dense tensor-core peak that the warp-level ``mma.sync`` instructions reach: the
#: Ampere-class path that FlashAttention-2, PyTorch SDPA's FlashAttention backend and the Triton kernels of the
#: PyTorch-native stacks compile to. Up to Ada it is the native path (1.0). On Hopper only the asynchronous
#: warpgroup ``wgmma`` reaches the peak; ``mma.sync`` reaches about 2/3 of it (Shah et al. 2024, FlashAttention-3,
#: arXiv:2407.08608, section 2.2, after Luo et al. 2024, arXiv:2402.13499), which is why FlashAttention-2 runs at
#: 35% of an H100's peak against 70% of an A100's. Blackwell's native path is ``tcgen05``; no published figure gives
#: its ``mma.sync`` share, so it keeps Hopper's (stated where it answers). docs/calibration.md ("Latest figures") gives
#: the fitted values beside it.
LEGACY_MMA_SHARE = {"pre-Ampere": 1.0, "Ampere": 1.0, "Ada": 1.0, "Hopper": 2.0 / 3.0, "Blackwell": 2.0 / 3.0}


def native_kernel_effs(overrides: dict | None) -> dict[str, float]:
    """{generation group: kernel_eff} for PyTorch-native rows: the values a fit made for one generation
    (`NATIVE_GEN_KEY` + group), and for a later NVIDIA generation without its own the latest earlier one's, times
    the ratio of the two generations' `LEGACY_MMA_SHARE` (an efficiency fitted on Ampere carries to Hopper as
    2/3 of it: the kernels stay, the instruction path loses a third of the peak). Other groups take the preset's
    value (the prior, or one fitted from all native runs when no generation has enough of them:
    models.fitting.calibration._slots)."""
    own = _native_own_effs(overrides)
    out = dict(own)
    for g in _NVIDIA_ORDER:
        if g not in own and (src := _carried_from(own, g)) is not None:
            out[g] = own[src] * _mma_ratio(src, g)
    return out


def native_kernel_own(overrides: dict | None) -> set[str]:
    """The generation groups whose PyTorch-native kernel efficiency a fit fitted from their own runs."""
    return set(_native_own_effs(overrides))


def native_kernel_carried_from(overrides: dict | None, group: str) -> str | None:
    """The generation whose fitted PyTorch-native kernel efficiency `group` takes without one of its own (the latest
    earlier NVIDIA generation with its own, as `native_kernel_effs` carries it); None: the preset's value."""
    return _carried_from(_native_own_effs(overrides), group)


def _carried_from(own: Mapping[str, float], group: str) -> str | None:
    """The latest NVIDIA generation before `group` among `own`'s keys (None: none, or `group` is not NVIDIA's)."""
    if group not in _NVIDIA_ORDER:
        return None
    earlier = [g for g in _NVIDIA_ORDER[:_NVIDIA_ORDER.index(group)] if g in own]
    return earlier[-1] if earlier else None


def _mma_ratio(src: str, group: str) -> float:
    """The factor an efficiency carried from `src` to `group` takes: the ratio of their `LEGACY_MMA_SHARE`."""
    return LEGACY_MMA_SHARE[group] / LEGACY_MMA_SHARE[src]


def _mma_scale_note(src: str, group: str) -> str:
    """How `native_kernel_effs` scales an efficiency carried from `src` to `group` (empty when it does not)."""
    r = _mma_ratio(src, group)
    return "" if r == 1.0 else f" x {r:.2f}, the mma.sync share of {group}'s tensor peak"


def _native_own_effs(overrides: dict | None) -> dict[str, float]:
    """{generation group: its own fitted PyTorch-native kernel efficiency} (keys `NATIVE_GEN_KEY` + group)."""
    return {k[len(NATIVE_GEN_KEY):]: v["kernel_eff"] for k, v in (overrides or {}).items()
            if k.startswith(NATIVE_GEN_KEY) and "kernel_eff" in (v or {})}


def native_kernel_eff_rows(overrides: dict | None, groups: np.ndarray, native: np.ndarray) -> np.ndarray | None:
    """Per row, the fitted PyTorch-native kernel efficiency of its generation group (`native_kernel_effs`) where
    `native`, NaN elsewhere (the parameters' value, models.physics.step_time); None when no row takes one."""
    effs = native_kernel_effs(overrides)
    if not effs:
        return None
    vals = np.full(len(groups), np.nan)
    for g, v in effs.items():
        vals[native & (groups == g)] = v
    return vals if np.isfinite(vals).any() else None


def group_params(preset: str, generation: str | None, base: PhysParams, overrides: dict | None) -> PhysParams:
    """The parameters of one software era and hardware generation group: `base` with the era's documented
    differences and fitted values, then the values fitted for that generation (fractions of a peak that differ
    between generations, e.g. Hopper's GEMMs reach a smaller share of their peak than Ampere's)."""
    p = preset_params(preset, base, overrides)
    extra = (overrides or {}).get(GEN_KEY + generation) if generation else None
    return p.with_(**extra) if extra else p


def physical_params(model: Model) -> PhysParams:
    """The physical parameters that answer for `model` (default software era): a PhysParams itself, a fit's
    fitted ones, the priors without a fit; under 'ideal' with Epoch's ideal conditions applied."""
    if isinstance(model, PhysParams):
        return model
    p = as_predictor(model)
    base = p.calibration.params if p.calibration is not None else DEFAULT
    return ideal_params(base) if p.assumptions == "ideal" else base


def as_predictor(model: Model) -> Predictor | PhysParams:
    if model is None:
        return Predictor(None)
    if isinstance(model, Calibration):
        return Predictor(model)
    return model


# ------------------------------------------------------------------------------------------ features
def _b(x, n) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    return np.broadcast_to(a, (n,)) if a.ndim == 0 else a


def residual_features(a: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray]) -> np.ndarray:
    """Feature matrix (rows x FEATURE_NAMES) from the configuration arrays and the physics outputs."""
    n = len(out["step_time_s"])
    g = lambda k, d=np.nan: _b(a[k], n) if k in a and a[k] is not None else np.full(n, float(d))  # noqa: E731
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / out["step_time_s"]
        cols = [out[c] * inv for c in BREAKDOWN]
        tp, pp, dp = g("tp"), g("pp"), g("dp")
        cp = np.nan_to_num(g("cp", 1.0), nan=1.0)
        dt = np.nan_to_num(g("dtype", 0.0)).astype(np.int64)
        rc = np.nan_to_num(g("recompute", 0.0)).astype(np.int64)
        sh = np.nan_to_num(g("sharding", 0.0)).astype(np.int64)
        cols += [np.log(g("micro_batch") * g("seq_len") / cp), np.log(g("d_model") / tp), np.log(g("ffn_dim") / tp),
                 np.log(np.ceil(g("n_layers") / pp)), np.log(out["n_microbatches"]),
                 np.log(tp), np.log(pp), np.log(dp), np.log(g("n_gpus")),
                 is_low_precision(dt).astype(float), (rc == Recompute.SELECTIVE).astype(float),
                 (rc == Recompute.FULL).astype(float),
                 ((sh >= Sharding.ZERO3) & (sh <= Sharding.HSDP)).astype(float),
                 ((sh == Sharding.ZERO1) | (sh == Sharding.ZERO2)).astype(float),
                 (np.nan_to_num(g("sequence_parallel", 0.0)) > 0).astype(float),
                 np.clip(out["memory_gb_per_gpu"] / g("memory_gb"), 0.0, 5.0),
                 (np.nan_to_num(g("n_experts", 0.0)) > 0).astype(float)]
    return np.column_stack(cols)


def residual_shift(cal: Calibration, X: np.ndarray) -> np.ndarray:
    if cal.model_kind == "physics" or not np.any(cal.coef):
        return np.zeros(len(X))
    return ((X - cal.feature_mean) / cal.feature_scale) @ cal.coef + cal.intercept


# ------------------------------------------------------------------------------------------ predict
def _rows(a: Mapping[str, np.ndarray], idx: np.ndarray, n: int) -> dict:
    return {k: (v[idx] if np.ndim(v) and len(v) == n else v) for k, v in a.items()}


def _physics_groups(a: Mapping[str, np.ndarray], n: int, groups: list[tuple[np.ndarray | None, PhysParams]],
                    detail: bool = False) -> dict:
    """Physics outputs for rows split into groups, each predicted with its own PhysParams (``detail``: with the
    timeline's parts, models.physics.step_time.TIMELINE_COLUMNS)."""
    if len(groups) == 1 and groups[0][0] is None:
        return physics_arrays(a, groups[0][1], detail=detail)
    out: dict[str, np.ndarray] = {}
    for idx, params in groups:
        if idx is None or not len(idx):
            continue
        part = physics_arrays(_rows(a, idx, n), params, detail=detail)
        if not out:
            out = {k: np.empty(n, dtype=v.dtype) for k, v in part.items()}
        for k, v in part.items():
            out[k][idx] = v
    return out


#: what makes a prediction harder, as the interval's width model sees it (`width_features`)
WIDTH_FEATURES = ("intercept", "is_moe", "is_hybrid", "is_low_precision", "log2_n_gpus_over_10", "era_pytorch_native",
                  "era_megatron_2022")


def width_features(a: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """rows x WIDTH_FEATURES from the configuration arrays (architecture, dtype code: fp8 family and nvfp4 are
    low precision, n_gpus, software era code)."""
    g = lambda k: _b(np.asarray(a[k], dtype=float), n) if a.get(k) is not None else np.full(n, np.nan)  # noqa: E731
    dt = np.nan_to_num(g("dtype"), nan=0.0)
    era = _era_codes(a, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.nan_to_num(np.log2(np.maximum(g("n_gpus"), 1.0)) / 10.0, nan=0.0)
    return np.column_stack([
        np.ones(n), np.nan_to_num(g("n_experts"), nan=0.0) > 0, np.isfinite(g("n_attn_layers")),
        is_low_precision(dt), lg,
        era == ERA_CODES["pytorch_native"], era == ERA_CODES["megatron_2022"],
    ]).astype(float)


def width_scale(cal, a: Mapping[str, np.ndarray], n: int) -> np.ndarray | float:
    """The multiplier of a calibration's half-widths for each row (1.0 for fits without a width model)."""
    coef = getattr(cal, "width_coef", None)
    if coef is None:
        return 1.0
    return np.exp(width_features(a, n) @ np.asarray(coef, dtype=float))


def _era_codes(a, n) -> np.ndarray:
    x = a.get("era_code")
    return np.zeros(n, dtype=np.int64) if x is None else np.nan_to_num(_b(x, n)).astype(np.int64)


def predict_arrays(a: Mapping[str, np.ndarray], model: Model = None, *, detail: bool = False) -> dict[str, np.ndarray]:
    """Step time, throughput, MFU, HFU, interval and breakdown for every configuration in `a`.

    `a`: the arrays of `models.physics.step_time.predict_arrays` (+ optional `era_code`, 0 = default software era,
    1 = megatron_2022; `generation_code` from `models.physics.hardware.resolve_hardware`). Returns the physics
    outputs (OUTPUT_COLUMNS, calibrated where a calibration applies) plus EXTRA_COLUMNS; with ``detail`` also the
    physics' timeline parts (models.physics.step_time.TIMELINE_COLUMNS), uncorrected: the correction is the ratio
    of `step_time_s` to their `tl_step_s`."""
    model = as_predictor(model)
    n = len(np.asarray(a["n_layers"])) if np.ndim(a["n_layers"]) else 1
    era = _era_codes(a, n)
    eras = np.unique(era)

    def by_era(make):
        if len(eras) == 1:
            return [(None, make(int(eras[0])))]
        return [(np.flatnonzero(era == e), make(int(e))) for e in eras]

    def preset(e, base, overrides=None):
        return preset_params(PRESETS[e] if 0 <= e < len(PRESETS) else "default", base, overrides)

    if isinstance(model, PhysParams):
        out = _physics_groups(a, n, by_era(lambda e: preset(e, model)), detail)
        return _finish(out, n, None, np.zeros(n), np.zeros(n), np.full(n, DOMAIN_ANALYTICAL))
    cal = model.calibration
    if model.adaptation is not None and model.assumptions == "realistic" and cal is not None:
        # the calibrated prediction, then the source's throughput factor and the interval its runs earn
        return apply_adaptation(predict_arrays(a, Predictor(cal, model.assumptions), detail=detail),
                                model.adaptation)
    if model.assumptions == "ideal":  # the physical bound: ideal conditions on the fitted (else prior) parameters
        base = cal.params if cal is not None else DEFAULT
        over = cal.preset_overrides if cal is not None else None
        out = _physics_groups(a, n, by_era(lambda e: ideal_params(preset(e, base, over))), detail)
        return _finish(out, n, None, np.zeros(n), np.zeros(n), np.full(n, DOMAIN_ANALYTICAL))
    if cal is None:
        out = _physics_groups(a, n, by_era(lambda e: preset(e, DEFAULT)), detail)
        return _finish(out, n, None, np.zeros(n), np.zeros(n), np.full(n, DOMAIN_ANALYTICAL))
    gen = a.get("generation_code")
    gen = np.full(n, -1, dtype=np.int64) if gen is None else np.nan_to_num(_b(gen, n), nan=-1).astype(np.int64)
    dt = a.get("dtype")
    dt = np.zeros(n, dtype=np.int64) if dt is None else np.nan_to_num(_b(dt, n)).astype(np.int64)
    inside = cal.domain.inside(np.where(gen < 0, 10_000, gen), dt, era) & (gen >= 0)

    groups = []
    # a generation's own fitted GEMM efficiencies (inside the domain) travel as per-row arrays, so one physics
    # call serves every generation of a software era (no row copies on the search's hot path)
    gen_over = {i: cal.preset_overrides.get(GEN_KEY + g, {}) for i, g in enumerate(GENERATION_GROUPS)
                if (cal.preset_overrides or {}).get(GEN_KEY + g)}
    for e in eras:
        sel = era == e
        name = PRESETS[int(e)] if 0 <= e < len(PRESETS) else "default"
        if cal.outside == "fitted" or inside[sel].all():
            groups.append((np.flatnonzero(sel) if len(eras) > 1 else None,
                           group_params(name, None, cal.params, cal.preset_overrides)))
        else:
            for ins in (True, False):
                idx = np.flatnonzero(sel & (inside == ins))
                if len(idx):
                    groups.append((idx, group_params(name, None, cal.params, cal.preset_overrides) if ins
                                   else preset(int(e), DEFAULT)))
    # a generation the fit never saw takes the priors' GEMM efficiencies: the fit's shared value is the largest
    # group's own (Ampere's in the shipped fit, Hopper's when Ampere is held out), not a population estimate
    unseen_gen = ~cal.domain.codes()[0][np.clip(gen, 0, len(GENERATION_GROUPS) - 1)] | (gen < 0)
    present = [i for i in gen_over if np.any(gen == i)]
    if present or unseen_gen.any():
        a = dict(a)
        for f in GENERATION_FIELDS:
            vals = np.full(n, np.nan)  # NaN: the row's own parameters (models.physics.step_time)
            for i in present:
                if f in gen_over[i]:
                    vals[inside & (gen == i)] = gen_over[i][f]
            vals[unseen_gen] = getattr(DEFAULT, f)
            if np.isfinite(vals).any():
                a[f] = vals
    native = era == PRESETS.index("pytorch_native")
    native_unfitted = None
    if native.any():  # their generation's fitted kernel efficiency (a fitted value, in or out of the domain)
        labels = np.where(gen >= 0, np.array(GENERATION_GROUPS, dtype=object)[np.clip(gen, 0, None)], "unknown")
        ke = native_kernel_eff_rows(cal.preset_overrides, labels, native)
        if ke is not None:
            a = dict(a)
            a["kernel_eff"] = ke
        own = native_kernel_own(cal.preset_overrides)
        if own:  # per generation: a row of a generation without its own takes another's value or the prior
            native_unfitted = native & ~np.isin(labels.astype(str), sorted(own))
    if len(groups) == 1:
        groups = [(None, groups[0][1])]
    out = _physics_groups(a, n, groups, detail)
    shift = np.zeros(n)
    if inside.any() and cal.model_kind != "physics":
        X = residual_features(a, out)
        s = residual_shift(cal, X)
        shift = np.where(inside & np.isfinite(s), s, 0.0)
    beyond = _b(np.asarray(a["n_gpus"], dtype=float), n) > cal.domain.max_n_gpus
    code = np.where(~inside, DOMAIN_OUTSIDE, np.where(beyond, DOMAIN_SCALE, DOMAIN_INSIDE))
    if a.get("hardware_code") is not None:  # a hardware model the fit never measured: the wider interval
        new_hw = ~cal.domain.hardware_seen(_b(np.asarray(a["hardware_code"], dtype=float), n))
        code = np.where(inside & new_hw, DOMAIN_NEW_HARDWARE, code)
    if native_unfitted is not None:
        code = np.where(inside & native_unfitted & (code != DOMAIN_NEW_HARDWARE), DOMAIN_NATIVE_CARRIED, code)
    if a.get("stack_unknown") is not None:
        code = np.where(np.nan_to_num(_b(np.asarray(a["stack_unknown"], dtype=float), n)) > 0, DOMAIN_NEW_STACK, code)
    ws = width_scale(cal, a, n)
    residual = cal.q_inside * ws  # the residual spread of a configuration like this one inside the domain
    # outside the domain the transfer protocols' wider half-width, never narrower than the same row inside it
    width = np.where(code == DOMAIN_INSIDE, residual, max(cal.q_extrapolated, cal.q_inside) * ws)
    return _finish(out, n, cal, shift, width, code, residual=residual, settings=_settings_part(a, n))


#: the interval's parts (each hi / point, >= 1): the residual spread of configurations like this one inside the fit's
#: domain, the widening for what lies outside it (generation, precision, era, scale, hardware model, stack), and the
#: spread of the prediction over the settings the question left open (`settings_halfwidth`, pipeline.api)
INTERVAL_PARTS = ("interval_residual", "interval_extrapolation", "interval_settings")


def _settings_part(a: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """The log half-width a configuration's open settings add (`settings_halfwidth`; absent or NaN: none)."""
    x = a.get("settings_halfwidth")
    return np.zeros(n) if x is None else np.nan_to_num(_b(np.asarray(x, dtype=float), n), nan=0.0)


def _finish(out: dict, n: int, cal, shift: np.ndarray, width: np.ndarray, code: np.ndarray,
            residual: np.ndarray | None = None, settings: np.ndarray | None = None) -> dict:
    """Apply the residual shift to the step and its parts, recompute the derived figures, add the interval (its
    parts `INTERVAL_PARTS`: `residual` and `settings` log half-widths; the extrapolation is `width` beyond the
    residual): the half-width is the root sum of squares of (residual + extrapolation) and settings."""
    step0 = out["step_time_s"]
    res = dict(out)
    res["analytical_step_time_s"] = step0
    if np.any(shift):
        r = np.exp(-shift)
        step = step0 * r
        res["step_time_s"] = step
        for c in BREAKDOWN:
            res[c] = out[c] * r
        inv_r = 1.0 / r
        for c in ("tokens_per_s_per_gpu", "mfu", "hfu"):
            res[c] = out[c] * inv_r
    settings = np.zeros(n) if settings is None else settings
    residual = np.asarray(width, dtype=float) if residual is None else np.minimum(residual, width)
    total = np.sqrt(np.asarray(width, dtype=float) ** 2 + settings ** 2)
    bound_interval(res, total, total)
    res["interval_residual"] = np.exp(np.broadcast_to(residual, (n,)))
    res["interval_extrapolation"] = np.exp(np.broadcast_to(width - residual, (n,)))
    res["interval_settings"] = np.exp(settings)
    res["domain_code"] = np.asarray(code, dtype=np.int64)
    return res


# ------------------------------------------------------------------------------------------ polars
def encode(configs: pl.DataFrame) -> dict[str, np.ndarray]:
    """`models.physics.step_time.encode_configs` + the era code of `software_preset` (null -> default)."""
    arrays = encode_configs(configs)
    if "software_preset" in configs.columns:
        arrays["era_code"] = (configs["software_preset"].cast(pl.Utf8).fill_null("default")
                              .replace_strict(ERA_CODES, default=0, return_dtype=pl.Int64).to_numpy())
    elif "era_code" in configs.columns:  # arrays made into a frame (the curve's chosen layouts) keep their era
        arrays["era_code"] = configs["era_code"].cast(pl.Float64).fill_null(0.0).to_numpy().astype(np.int64)
    return arrays


def domain_text(model: Model, arrays: Mapping[str, np.ndarray], codes: np.ndarray) -> list[str]:
    """`calibration_domain` per row: 'analytical', 'ideal', 'no fit: priors', 'inside' or 'extrapolated: why'."""
    model = as_predictor(model)
    n = len(codes)
    if isinstance(model, PhysParams):
        return ["analytical"] * n
    if model.assumptions == "ideal":
        return ["ideal: " + ("the fit's physical parameters" if model.calibration is not None else "the priors")
                + " under Epoch AI's ideal conditions, no residual"] * n
    if model.calibration is None:
        return ["no fit: priors"] * n
    dom = model.calibration.domain
    gen = arrays.get("generation_code")
    gen = np.full(n, -1) if gen is None else np.nan_to_num(_b(gen, n), nan=-1).astype(np.int64)
    dt = np.nan_to_num(_b(arrays.get("dtype", 0), n)).astype(np.int64)
    era = _era_codes(arrays, n)
    N = _b(np.asarray(arrays["n_gpus"], dtype=float), n)
    fitted_outside = model.calibration.outside == "fitted"
    outside_note = ("the fit's parameters without the residual, wider interval" if fitted_outside
                    else "priors, wider interval")
    unseen_note = ("the priors' GEMM efficiencies and the fit's other parameters, without the residual, wider "
                   "interval" if fitted_outside else outside_note)  # a generation the fit never saw
    cache: dict = {}
    texts = []
    for i in range(n):
        key = (int(gen[i]), int(dt[i]), int(era[i]), int(codes[i]),
               float(N[i]) if codes[i] in (DOMAIN_SCALE, DOMAIN_NEW_HARDWARE) else 0)
        if key not in cache:
            if codes[i] == DOMAIN_NEW_STACK:
                cache[key] = ("extrapolated: training stack not in the stack table (measurements/stack_words.csv): "
                              "the generic stack row; fitted parameters, wider interval")
            elif codes[i] == DOMAIN_NATIVE_CARRIED:
                group = GENERATION_GROUPS[int(np.clip(gen[i], 0, len(GENERATION_GROUPS) - 1))]
                over = model.calibration.preset_overrides
                src = native_kernel_carried_from(over, group)
                cache[key] = (f"extrapolated: PyTorch-native kernels not fitted on {group} ("
                              + (f"{src}'s efficiency carried" + _mma_scale_note(src, group) if src else "the prior")
                              + f"; fitted on {', '.join(sorted(native_kernel_own(over)))}); fitted parameters, "
                              "wider interval")
            elif codes[i] == DOMAIN_NEW_HARDWARE:
                group = GENERATION_GROUPS[int(np.clip(gen[i], 0, len(GENERATION_GROUPS) - 1))]
                seen = ", ".join(dom.hardware_of_group(group)) or "none"
                more = (f"; {N[i]:,.0f} accelerators > the largest cluster in the fit ({dom.max_n_gpus:,.0f})"
                        if N[i] > dom.max_n_gpus else "")
                cache[key] = (f"extrapolated: hardware model not in the fit (its generation {group} is: {seen})"
                              f"{more}; fitted parameters, wider interval")
            elif codes[i] == DOMAIN_SCALE:
                cache[key] = (f"extrapolated: {N[i]:,.0f} accelerators > the largest cluster in the fit "
                              f"({dom.max_n_gpus:,.0f}); fitted parameters, wider interval")
            elif gen[i] < 0:
                cache[key] = f"extrapolated: hardware generation unknown; {unseen_note}"
            else:
                t = dom.explain(gen[i], dt[i], era[i])
                unseen = GENERATION_GROUPS[int(gen[i])] not in dom.generations
                cache[key] = t + (f"; {unseen_note if unseen else outside_note}" if t != "inside" else "")
        texts.append(cache[key])
    return texts


def predict(configs: pl.DataFrame, model: Model = None) -> pl.DataFrame:
    """Polars front-end: one row per input row with the physics columns (`models.physics.step_time.predict`'s, the
    error text included), EXTRA_COLUMNS and the provenance columns `fit_version`, `assumptions`,
    `calibration_domain`."""
    arrays = encode(configs)
    res = predict_arrays(arrays, model)
    cols = list(OUTPUT_COLUMNS) + list(EXTRA_COLUMNS) + [c for c in INTERVAL_PARTS if c in res]
    df = pl.DataFrame({k: res[k] for k in cols})
    df = df.with_columns([pl.col(c).fill_nan(None) for c in cols if df.schema[c] == pl.Float64])
    df = with_error_strings(df, arrays["memory_gb"])
    p = as_predictor(model)
    version = None if isinstance(p, PhysParams) else p.fit_version
    assumptions = "analytical" if isinstance(p, PhysParams) else p.assumptions
    df = df.with_columns(pl.lit(version, dtype=pl.Utf8).alias("fit_version"),
                         pl.lit(assumptions).alias("assumptions"),
                         pl.Series("calibration_domain", domain_text(model, arrays, res["domain_code"]),
                                   dtype=pl.Utf8))
    df = with_adaptation(df, p)  # which runs adapted the answer, and by how much (models.fitting.adapt)
    return df.select(["feasible", "error", *[c for c in df.columns if c not in ("feasible", "error")]])


def with_adaptation(result: pl.DataFrame, model: Model) -> pl.DataFrame:
    """`result` (any frame of answers) with the adaptation that answered for `model`, if any, said: `adapted_to`,
    `adaptation_runs`, `throughput_factor`, and its sentence in `assumptions` (once)."""
    ad = adaptation_of(model)
    if ad is None or result.height == 0:
        return result
    extra = [pl.lit(ad.name).alias("adapted_to"), pl.lit(ad.n_runs).alias("adaptation_runs"),
             pl.lit(ad.throughput_factor).alias("throughput_factor")]
    if "assumptions" in result.columns:
        text = ad.describe()
        extra.append(pl.when(pl.col("assumptions").str.contains(text, literal=True)).then(pl.col("assumptions"))
                     .otherwise(pl.concat_str([pl.col("assumptions"), pl.lit(text)], separator="; "))
                     .alias("assumptions"))
    return result.with_columns(extra)


def adaptation_of(model: Model) -> Adaptation | None:
    """The adaptation that answers for `model` (a realistic Predictor with a calibration and an adaptation)."""
    p = as_predictor(model)
    if isinstance(p, PhysParams) or p.adaptation is None or p.calibration is None or p.assumptions != "realistic":
        return None
    return p.adaptation


def with_assumptions(model: Model, assumptions: str) -> Predictor | PhysParams:
    p = as_predictor(model)
    return p if isinstance(p, PhysParams) else replace(p, assumptions=assumptions)
