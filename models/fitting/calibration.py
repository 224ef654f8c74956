"""Calibration of the analytical model on measured runs: fitted physics, a residual regression, validation
that measures transfer, and intervals that hold off the corpus (pure: arrays and DataFrames in, a
`models.fitting.predictor.Calibration` and tables out).

1. Target: log(measured tokens/s/GPU) per run (`models.corpus.targets`; MFU/HFU/TFLOP-only runs converted and
   flagged `target_derived`; whole-run GPU-hour averages excluded: they include downtime).
2. Physics: the named `PhysParams` fields in `FIT_FIELDS` (+ per-software-preset `PRESET_FIELDS`) are fitted
   with `scipy.optimize.least_squares` (soft-L1 loss on the log ratio, bounded by
   `models.core.params.FITTABLE_BOUNDS`, a weak pull towards the priors so unidentified fields stay put). Runs are
   weighted `n_source^-1/4` so the 1,440 vTrain single-node runs do not drown the other sources. Every
   fitted field is in units that mean the same on every device (fractions of a peak or of a link, seconds
   per kernel or per collective step). The fit records its domain (`models.core.domains.Domain`: hardware
   generation groups, precision families, software eras, largest cluster): the fitted values answer inside
   it, the priors outside it (`models.fitting.predictor`).
3. Residual: `ridge` (weighted ridge regression in numpy on `models.fitting.predictor.FEATURE_NAMES`) or `physics`
   (none); the kind whose WORST transfer protocol has the lowest MdAPE is kept.
4. Validation (`PROTOCOLS`): leave-one-source-out (`loso`),
   leave-one-hardware-generation-out (`logo`: pre-Ampere, Ampere, Ada, Hopper, Blackwell, AMD, Gaudi, TPU),
   leave-one-architecture-family-out (`lofo`: dense, MoE, hybrid), leave-one-precision-out (`lopo`: 16-bit,
   32-bit, fp8, fp4), and scale extrapolation (`scale`: fit on runs with <= 256 accelerators, score the
   larger ones). Every fold re-fits the physics AND the residual without its held-out runs and predicts them
   through the serving function (`models.fitting.predictor.predict_arrays`), so a held-out generation is predicted
   exactly as a new one would be: priors, no correction, the wider interval. Groups with fewer than
   `MIN_GROUP` runs are held out together as one pooled group ("other").
5. Intervals: split-conformal quantiles of the out-of-fold |log error| of every protocol, one for
   configurations inside the fit's domain (`q_inside`) and one for extrapolated ones (`q_extrapolated`);
   coverage per protocol is measured leave-one-fold-out (the quantile for a fold comes from the other folds).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from models.arch.archfile import APPROXIMATED_ARCHITECTURES
from models.core import domains
from models.core.params import (
    DEFAULT,
    FITTABLE_BOUNDS,
    LOW_PRECISION_DTYPES,
    PhysParams,
)
from models.core.software import PRESETS
from models.fitting import adapt, conformal, scaling
from models.fitting.predictor import (
    DOMAIN_INSIDE,
    FEATURE_NAMES,
    GEN_KEY,
    GENERATION_FIELDS,
    NATIVE_GEN_KEY,
    WIDTH_FEATURES,
    Calibration,
    encode,
    group_params,
    native_kernel_eff_rows,
    predict,
    residual_features,
    width_features,
)
from models.fitting.predictor import predict_arrays as serve_arrays
from models.physics.step_time import OUTPUT_COLUMNS, encode_configs, predict_arrays

#: bumped whenever a change of the fit's code changes what a stored fit means (a fit of another version is not
#: reused); what each version changed: docs/changelog.md, "Fit code versions"
FIT_CODE_VERSION = "stepcast-calibration/18"
FIT_FIELDS = ("matmul_eff_16bit", "matmul_eff_8bit", "attn_eff", "gemm_ramp_flops_per_sm", "host_overhead_s_per_op",
              "scaleup_eff", "scaleout_eff", "alpha_scaleup_s", "tp_overlap", "dp_overlap", "fsdp_gather_overlap")
PRESET_FIELDS = {"megatron_2022": ("host_overhead_s_per_op",), "pytorch_native": ("kernel_eff",)}
MIN_GENERATION_RUNS = 30
#: the shared GEMM efficiencies (those every generation without its own takes) are fitted only from runs of at least
#: this many sources: they stand for the hardware at large, and the runs of one source tell that source's stack and
#: recipes (a leave-one-family-out fold trained on one source's mixture-of-experts runs otherwise carried that
#: source's Hopper/Blackwell 16-bit fraction, 0.85, to every Ampere dense run); without them the prior answers. A
#: generation's own efficiency may come from one source (a user's own cluster, fed back in), and answers only for it.
MIN_GEMM_EFF_SOURCES = 2
NATIVE = "pytorch_native"
LOG_FIELDS = {"gemm_ramp_flops_per_sm", "host_overhead_s_per_op", "alpha_scaleup_s", "alpha_scaleout_s"}
MODEL_KINDS = ("physics", "ridge")
PROTOCOLS = ("loso", "logo", "lofo", "lopo", "scale")
#: every protocol `stepcast fit --protocols` accepts (loho, one hardware model at a time, is subsumed by logo's
#: whole generations and costs a dozen more folds, so it is not part of every fit)
ALL_PROTOCOLS = ("loso", "loho", "logo", "lofo", "lopo", "scale", "lost", "vtrain_multi_lomso")
PROTOCOL_NAMES = {"loso": "leave one source out", "loho": "leave one hardware model out",
                  "logo": "leave one hardware generation out", "lofo": "leave one architecture family out",
                  "lopo": "leave one precision out", "scale": "fit on <= 256 accelerators, score larger runs",
                  "lost": "leave one training stack out",
                  "vtrain_multi_lomso": "vTrain multi-node: leave one model size out"}
SCALE_SPLIT_N_GPUS = 256
MIN_GROUP = 5
ALPHA = 0.10
COVERAGE_BAND = (0.85, 0.95)
HYPER = {
    "prior_weight": 0.3, "soft_l1_scale": 0.05, "max_nfev": 30, "source_weight_power": -0.25,
    "physics_subsample_over": 400,
    "ridge_alpha": 30.0,
    "alpha": ALPHA, "min_group": MIN_GROUP, "protocols": list(PROTOCOLS), "scale_split": SCALE_SPLIT_N_GPUS,
}
OUT_COLUMNS = ("step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_lo",
               "tokens_per_s_per_gpu_hi", "fit_version")


# ------------------------------------------------------------------------------------------- data
@dataclass
class FitData:
    """Predictable measured runs with a usable target, prepared once for all folds."""

    configs: pl.DataFrame          # model input columns + run_id, source, gpu, software_preset
    log_target: np.ndarray         # log(measured tokens/s/GPU)
    weight: np.ndarray             # per-run weight (n_source ** source_weight_power)

    @property
    def run_id(self) -> np.ndarray:
        return self.configs["run_id"].to_numpy()

    def group(self, key: str) -> np.ndarray:
        return self.configs[key].cast(pl.Utf8).fill_null("?").to_numpy()

    def subset(self, rows: np.ndarray) -> "FitData":
        return FitData(self.configs[rows], self.log_target[rows], self.weight[rows])

    def labels(self, protocol: str) -> np.ndarray:
        """Per-run group of a transfer protocol: hardware generation group (`logo`), architecture family
        (`lofo`) or precision family (`lopo`) (models.core.domains)."""
        c = self.configs
        if protocol == "logo":
            gen = c["generation"] if "generation" in c.columns else None
            return domains.generation_groups(c["gpu"], gen)
        if protocol == "lofo":
            mamba = (c["n_mamba_layers"].to_numpy() if "n_mamba_layers" in c.columns else
                     c["layer_pattern"].cast(pl.Utf8).str.count_matches("M", literal=True).fill_null(0).to_numpy()
                     if "layer_pattern" in c.columns else None)
            return domains.arch_family(c["n_experts"].cast(pl.Float64).to_numpy(), mamba)
        if protocol == "lopo":
            return domains.precision_family(c["dtype"].to_list())
        raise ValueError(f"no labels for protocol {protocol!r}")


def fit_data(configs: pl.DataFrame, targets: pl.DataFrame) -> FitData:
    """Join predictable configs (models.corpus.evaluate.prepare_configs) with targets (run_id,
    measured_tokens_per_s_per_gpu, whole_run_average); keep runs with a finite positive target that the
    model can predict (memory-infeasible runs are kept: they ran, their time prediction is still made), except
    those of an architecture the model only approximates (`APPROXIMATED_ARCHITECTURES`)."""
    t = targets.select("run_id", "measured_tokens_per_s_per_gpu", pl.col("whole_run_average").fill_null(False))
    df = configs.join(t, on="run_id", how="inner").filter(
        (pl.col("measured_tokens_per_s_per_gpu") > 0) & ~pl.col("whole_run_average")).sort("run_id")
    if "arch_id" in df.columns:
        df = df.filter(~pl.col("arch_id").is_in(APPROXIMATED_ARCHITECTURES).fill_null(False))
    phys = Physics(df)
    ok = np.isfinite(phys.log_tput(DEFAULT, {}))
    df = df.filter(pl.Series(ok))
    n_src = df.group_by("source").len()
    w = df.join(n_src, on="source", how="left")["len"].to_numpy().astype(float) ** HYPER["source_weight_power"]
    return FitData(df, np.log(df["measured_tokens_per_s_per_gpu"].to_numpy()), w)


def data_hash(data: FitData) -> str:
    h = hashlib.sha256()
    cols = sorted(c for c in data.configs.columns if c != "assumptions")
    # floats to 12 significant digits, like the target below: a last-bit change in a derived input (an
    # MFU-converted throughput after a reordering of floating-point operations) is not new data
    frame = data.configs.select(cols).with_columns(pl.col(pl.Float64, pl.Float32).round_sig_figs(12))
    h.update(frame.sort("run_id").write_csv().encode())
    h.update(np.round(data.log_target, 12).tobytes())
    return h.hexdigest()


def physics_code_digest() -> str:
    """Hash of the model code (every `.py` file under `models/`): the physics a fit's parameters were fitted through. A fit
    stored before a change to it is not reused for the same data (its parameters would answer through a
    different physics)."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        from pathlib import Path

        h = hashlib.sha256()
        root = Path(__file__).parents[1]
        for f in sorted(root.rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode())
            h.update(f.read_bytes().replace(b"\r\n", b"\n"))
        _CODE_DIGEST = h.hexdigest()
    return _CODE_DIGEST


_CODE_DIGEST: str | None = None


def fit_version(data: FitData) -> str:
    """Hash of the data and of everything in the code that shapes the fit (same data and model code -> same
    version)."""
    h = hashlib.sha256()
    h.update(FIT_CODE_VERSION.encode())
    h.update(physics_code_digest().encode())
    h.update(json.dumps(HYPER, sort_keys=True).encode())
    h.update(json.dumps(DEFAULT.to_dict(), sort_keys=True).encode())
    h.update(json.dumps([FIT_FIELDS, PRESET_FIELDS, FEATURE_NAMES, GENERATION_FIELDS, MIN_GENERATION_RUNS,
                        MIN_GEMM_EFF_SOURCES, WIDTH_FEATURES, WIDTH_EPS, WIDTH_RIDGE],
                        sort_keys=True, default=list).encode())
    h.update(data_hash(data).encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------- physics
class Physics:
    """The analytical model on fixed configurations, encoded once; fast re-prediction for new params."""

    def __init__(self, configs: pl.DataFrame):
        presets = configs["software_preset"].fill_null("default").to_numpy() if "software_preset" in \
            configs.columns else np.full(configs.height, "default")
        gens = generation_labels(configs)
        self.n = configs.height
        self.configs = configs
        self.parts = []
        self.reference: str | None = None  # the generation other generations' 16-bit fractions follow
        for name in PRESETS:
            idx = np.flatnonzero(presets == name)
            if len(idx):
                self.parts.append((name, gens[idx], idx, encode_configs(configs[idx])))

    def predict(self, params: PhysParams, overrides: dict, columns=("tokens_per_s_per_gpu",)) -> dict:
        """Every row with its software era's parameters and its generation's fitted GEMM efficiencies (passed
        per row, so one physics call serves every generation of an era)."""
        out = {c: np.full(self.n, np.nan) for c in columns}
        for part in self.parts:
            res = self.predict_part(part, params, overrides)
            for c in columns:
                out[c][part[2]] = res[c]
        return out

    @staticmethod
    def predict_part(part: tuple, params: PhysParams, overrides: dict) -> dict:
        """The physics of one software era's rows, in one call (a row's prediction does not depend on the other
        rows of its call: tests/test_one_model.py)."""
        name, gens, idx, arrays = part
        p = group_params(name, None, params, overrides)
        per_gen = {g: (overrides or {}).get(GEN_KEY + g, {}) for g in np.unique(gens)}
        if any(per_gen.values()):
            arrays = dict(arrays)
            for f in GENERATION_FIELDS:
                vals = np.full(len(idx), getattr(p, f))
                for g, extra in per_gen.items():
                    if f in extra:
                        vals[gens == g] = extra[f]
                arrays[f] = vals
        ke = native_kernel_eff_rows(overrides, gens, np.full(len(idx), name == NATIVE))
        if ke is not None:  # the stack's kernel efficiency fitted for one generation
            arrays = dict(arrays)
            arrays["kernel_eff"] = ke
        return predict_arrays(arrays, p)

    def parts_touched(self, slot: tuple[str | None, str]) -> list[int]:
        """Indices of the parts whose prediction can change with the fitted value of `slot` (see `_slots`): every
        part for a shared field, the era's own for a preset field, the parts holding the generation's rows (of
        PyTorch-native era for its kernel efficiency) for a generation's field."""
        key = slot[0]
        if key is None:
            return list(range(len(self.parts)))
        if key.startswith(NATIVE_GEN_KEY):  # a later generation may take this one's value (native_kernel_effs)
            return [i for i, (name, _, _, _) in enumerate(self.parts) if name == NATIVE]
        if key.startswith(GEN_KEY):  # a generation's 16-bit fraction may follow the reference's (derive_16bit)
            if key == self.reference:
                return list(range(len(self.parts)))
            g = key[len(GEN_KEY):]
            return [i for i, (_, gens, _, _) in enumerate(self.parts) if np.any(gens == g)]
        return [i for i, (name, _, _, _) in enumerate(self.parts) if name == key]

    def arrays_all(self) -> dict:
        """Encoded arrays of every row in the original order (for the residual features)."""
        return encode(self.configs)

    def log_tput(self, params: PhysParams, overrides: dict) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(self.predict(params, overrides)["tokens_per_s_per_gpu"])

    def frame(self, params: PhysParams, overrides: dict) -> pl.DataFrame:
        res = self.predict(params, overrides, [c for c in OUTPUT_COLUMNS if c not in ("feasible", "error_code")])
        return pl.DataFrame(res)


def generation_labels(configs: pl.DataFrame) -> np.ndarray:
    gen = configs["generation"] if "generation" in configs.columns else None
    return domains.generation_groups(configs["gpu"], gen) if "gpu" in configs.columns else \
        np.full(configs.height, "unknown", dtype=object)


def _mask(sel: np.ndarray, sub: np.ndarray) -> np.ndarray:
    """The rows of `sel` (a boolean mask) that `sub` (a mask over those rows) keeps, as a mask over all rows."""
    out = np.zeros(len(sel), dtype=bool)
    out[np.flatnonzero(sel)[sub]] = True
    return out


def _slots(configs: pl.DataFrame) -> list[tuple[str | None, str]]:
    presets = set(configs["software_preset"].fill_null("default").to_list())
    dt = configs["dtype"].fill_null("bf16").to_numpy()
    # a precision's GEMM fraction is fitted only where the training runs hold that precision: without 16-bit
    # runs (a leave-one-precision-out fold) the 16-bit fraction would be set by the few 16-bit GEMMs of
    # low-precision runs (their LM head, the layers a recipe keeps in BF16) and carry their other errors to every
    # 16-bit run; it keeps its prior, as a parameter outside its domain does (models.fitting.predictor)
    low_all = np.isin(dt, LOW_PRECISION_DTYPES)
    src = configs["source"].fill_null("").to_numpy() if "source" in configs.columns else np.full(len(dt), "")

    def enough(sel, n_sources=1):  # runs enough (from sources enough) to tell a GEMM efficiency
        return int(sel.sum()) >= MIN_GENERATION_RUNS // 3 and len(set(src[sel])) >= n_sources
    # the shared efficiency answers for every generation without its own: from two sources at least
    ok_prec = {"matmul_eff_8bit": enough(low_all, MIN_GEMM_EFF_SOURCES),
               "matmul_eff_16bit": enough(~low_all & ~np.isin(dt, ("fp32", "tf32")), MIN_GEMM_EFF_SOURCES)}
    slots = [(None, f) for f in FIT_FIELDS if ok_prec.get(f, True)]
    slots += [(p, f) for p, fs in PRESET_FIELDS.items() if p in presets for f in fs]
    gens, counts = np.unique(generation_labels(configs), return_counts=True)
    pre = configs["software_preset"].fill_null("default").to_numpy()
    g_all = generation_labels(configs)
    for g, c in sorted(zip(gens, counts), key=lambda x: -x[1])[1:]:  # the largest group defines the shared value
        if c < MIN_GENERATION_RUNS or g == "unknown":
            continue
        sel = g_all == g
        low = np.isin(dt[sel], LOW_PRECISION_DTYPES)
        for f in GENERATION_FIELDS:
            if f == "matmul_eff_8bit" and not enough(_mask(sel, low)):
                continue  # too few low-precision runs of this generation to tell its own 8-bit efficiency
            if f == "matmul_eff_16bit" and not enough(_mask(sel, ~low & (pre[sel] != NATIVE))):  # reference kernels
                continue  # too few 16-bit runs on the reference kernels to tell its own 16-bit efficiency
            slots.append((GEN_KEY + str(g), f))
    nat = pre == NATIVE
    if nat.any():
        # the PyTorch-native kernel efficiency of each generation with enough native runs is its own (the
        # predictor carries it to later NVIDIA generations without one, models.fitting.predictor.native_kernel_effs); an
        # earlier generation never takes a later one's (Hopper's native kernels reach 0.66 of what the reference
        # kernels do, Ampere's 0.96): without its own or an earlier one, a generation keeps the prior. Only when no
        # generation has enough runs is one shared value fitted from all of them.
        ng, nc = np.unique(g_all[nat], return_counts=True)
        own = [g for g, c in sorted(zip(ng, nc), key=lambda x: -x[1]) if c >= MIN_GENERATION_RUNS and g != "unknown"]
        if own:
            slots = [sl for sl in slots if sl != (NATIVE, "kernel_eff")]
            slots += [(NATIVE_GEN_KEY + str(g), "kernel_eff") for g in own]
    return slots


def _to_unit(name: str, value: float) -> float:
    lo, hi = FITTABLE_BOUNDS[name]
    if name in LOG_FIELDS:
        return (np.log(value) - np.log(lo)) / (np.log(hi) - np.log(lo))
    return (value - lo) / (hi - lo)


def _from_unit(name: str, u: float) -> float:
    lo, hi = FITTABLE_BOUNDS[name]
    u = float(np.clip(u, 0.0, 1.0))
    if name in LOG_FIELDS:
        return float(np.exp(np.log(lo) + u * (np.log(hi) - np.log(lo))))
    return float(lo + u * (hi - lo))


def _unpack(slots, u, base: PhysParams) -> tuple[PhysParams, dict]:
    glob = {f: _from_unit(f, x) for (p, f), x in zip(slots, u) if p is None}
    over: dict = {}
    for (p, f), x in zip(slots, u):
        if p is not None:
            over.setdefault(p, {})[f] = _from_unit(f, x)
    return base.with_(**glob), derive_16bit(over, slots)


def _precision_reference(slots) -> str | None:
    """The generation group (overrides key) whose 16-bit and 8-bit GEMM fractions are both fitted from its own runs
    (the first such in `slots`, which lists generations by their number of runs), or None."""
    own: dict[str, set] = {}
    for p, f in slots:
        if p is not None and p.startswith(GEN_KEY) and f in GENERATION_FIELDS:
            own.setdefault(p, set()).add(f)
    both = [p for p, fs in own.items() if fs >= {"matmul_eff_16bit", "matmul_eff_8bit"}]
    return both[0] if both else None


def derive_16bit(over: dict, slots) -> dict:
    """A generation whose 8-bit GEMM fraction is its own but whose 16-bit one is not (too few 16-bit runs) takes
    16-bit = its 8-bit x (16-bit / 8-bit of the reference generation, the one with both fitted): the two
    precisions run on the same tensor cores at the same clocks, so a device's derating (power, clocks, memory)
    shows in both, while the ratio between them is the pipeline's. Without a reference generation nothing is
    derived (the shared 16-bit value answers)."""
    ref = _precision_reference(slots)
    if ref is None or ref not in over:
        return over
    r16, r8 = over[ref].get("matmul_eff_16bit"), over[ref].get("matmul_eff_8bit")
    if not (r16 and r8):
        return over
    lo, hi = FITTABLE_BOUNDS["matmul_eff_16bit"]
    for key, vals in over.items():
        if key.startswith(GEN_KEY) and "matmul_eff_8bit" in vals and "matmul_eff_16bit" not in vals:
            vals["matmul_eff_16bit"] = float(np.clip(vals["matmul_eff_8bit"] * r16 / r8, lo, hi))
    return over


def _physics_rows(data: FitData) -> FitData:
    """A source with more than `physics_subsample_over` runs enters the physics fit through an evenly spaced
    subset (every k-th run by run_id) with weights x k, so its total weight is unchanged: the few
    physical parameters are identified as well and each evaluation is several times cheaper."""
    limit = HYPER["physics_subsample_over"]
    src = data.group("source")
    keep = np.ones(len(src), dtype=bool)
    w = data.weight.copy()
    for g, cnt in zip(*np.unique(src, return_counts=True)):
        if cnt > limit:
            k = int(np.ceil(cnt / (limit / 2)))
            idx = np.flatnonzero(src == g)
            drop = idx[np.arange(len(idx)) % k != 0]
            keep[drop] = False
            w[idx] *= k
    out = data.subset(np.flatnonzero(keep))
    out.weight = w[keep]
    return out


def fit_physics(data: FitData, base: PhysParams = DEFAULT, max_nfev: int | None = None) -> tuple[PhysParams, dict]:
    """Fit FIT_FIELDS (+ PRESET_FIELDS) on `data` only. Returns (params, preset_overrides)."""
    from scipy.optimize import least_squares

    data = _physics_rows(data)
    phys = Physics(data.configs)
    slots = _slots(data.configs)
    prior = base.to_dict()
    u0 = np.array([_to_unit(f, prior[f]) for _, f in slots])
    sw = np.sqrt(data.weight)
    pw = HYPER["prior_weight"]

    parts = phys.parts
    phys.reference = _precision_reference(slots)
    touched = [phys.parts_touched(s) for s in slots]
    recent: dict[bytes, list] = {}  # parameter vector -> each part's log throughput (the last few evaluations)

    def residual(u, logs):
        out = np.full(phys.n, np.nan)
        for (_, _, idx, _), lg in zip(parts, logs):
            out[idx] = lg
        r = sw * (out - data.log_target)
        return np.concatenate([np.nan_to_num(r, nan=10.0), pw * (u - u0)])

    def part_logs(u, which, reuse):
        params, over = _unpack(slots, u, base)
        with np.errstate(divide="ignore", invalid="ignore"):
            return [np.log(phys.predict_part(part, params, over)["tokens_per_s_per_gpu"]) if i in which else reuse[i]
                    for i, part in enumerate(parts)]

    def resid(u):
        logs = part_logs(u, range(len(parts)), None)
        if len(recent) >= 4:
            recent.pop(next(iter(recent)))
        recent[u.tobytes()] = logs
        return residual(u, logs)

    def jacobian_map(fun, xs):
        """scipy's finite-difference Jacobian evaluations (`workers`): x0 + h_i e_i for every slot i. A slot's
        column re-predicts only the parts it can change and takes the others from the evaluation at x0 (the same
        numbers: the residual at x0 is always evaluated before its Jacobian; otherwise every part is
        re-predicted)."""
        xs = [np.asarray(x, dtype=float) for x in xs]
        k = len(xs)
        x0 = np.array([xs[(i + 1) % k][i] for i in range(k)]) if k == len(slots) and k > 1 else None
        at0 = recent.get(x0.tobytes()) if x0 is not None else None
        out = []
        for i, x in enumerate(xs):
            if at0 is None or not np.array_equal(np.delete(x, i), np.delete(x0, i)):
                out.append(fun(x))
            else:
                out.append(residual(x, part_logs(x, touched[i], at0)))
        return out

    kw = {"workers": jacobian_map} if "workers" in inspect.signature(least_squares).parameters else {}
    sol = least_squares(resid, np.clip(u0, 1e-6, 1 - 1e-6), bounds=(0.0, 1.0), loss="soft_l1",
                        f_scale=HYPER["soft_l1_scale"], max_nfev=max_nfev or HYPER["max_nfev"], diff_step=1e-3,
                        x_scale=1.0, **kw)
    return _unpack(slots, sol.x, base)


# --------------------------------------------------------------------------------------- residual
def fit_ridge(X: np.ndarray, y: np.ndarray, w: np.ndarray, alpha: float | None = None):
    """Weighted ridge on standardised features, in numpy: (mean, scale, coef, intercept)."""
    alpha = HYPER["ridge_alpha"] if alpha is None else alpha
    w = w / w.sum()
    mean = w @ X
    scale = np.sqrt(w @ (X - mean) ** 2)
    scale = np.where(scale > 1e-9, scale, 1.0)
    Z = (X - mean) / scale
    ybar = float(w @ y)
    A = Z.T @ (Z * w[:, None]) + (alpha / len(y)) * np.eye(Z.shape[1])
    coef = np.linalg.solve(A, Z.T @ (w * (y - ybar)))
    return mean, scale, coef, ybar


def domain_of(data: "FitData") -> domains.Domain:
    return domains.Domain.of(data.labels("logo"), data.labels("lopo"), data.group("software_preset"),
                             data.configs["n_gpus"].cast(pl.Float64).to_numpy(), data.labels("lofo"),
                             data.group("gpu") if "gpu" in data.configs.columns else ())


def build_calibration(train: "FitData", version: str = "fold", max_nfev: int | None = None) -> dict[str, Calibration]:
    """Fit physics + every residual kind on `train`; {kind: Calibration} (interval half-widths 0: set later)."""
    params, over = fit_physics(train, max_nfev=max_nfev)
    phys = Physics(train.configs)
    out = phys.predict(params, over, OUTPUT_COLUMNS)
    X = residual_features(phys.arrays_all(), out)
    y = train.log_target - np.log(out["tokens_per_s_per_gpu"])
    ok = np.isfinite(y) & np.isfinite(X).all(axis=1)
    dom = domain_of(train)
    n_f = X.shape[1]
    cals = {"physics": Calibration(version, params, over, dom, "physics", np.zeros(n_f), np.ones(n_f),
                                   np.zeros(n_f), 0.0, 0.0, 0.0)}
    mean, scale, coef, icpt = fit_ridge(X[ok], y[ok], train.weight[ok])
    cals["ridge"] = Calibration(version, params, over, dom, "ridge", mean, scale, coef, icpt, 0.0, 0.0)
    return cals


# ------------------------------------------------------------------------------------ grouped CV
def pooled_groups(labels: np.ndarray, min_group: int = MIN_GROUP) -> np.ndarray:
    """Groups with fewer than `min_group` runs are merged into one held-out group 'other'."""
    vals, counts = np.unique(labels, return_counts=True)
    small = set(vals[counts < min_group])
    return np.array([("other" if x in small else x) for x in labels], dtype=object)


def protocol_folds(data: "FitData", scheme: str) -> tuple[np.ndarray, list]:
    """(fold label per run, the fold labels to hold out) of a validation protocol."""
    if scheme == "loso":
        f = pooled_groups(data.group("source"))
    elif scheme == "loho":
        f = pooled_groups(data.group("gpu"))
    elif scheme == "lost":  # the training stack a run's framework words name (measurements/stacks.csv)
        f = pooled_groups(data.group("memory_preset") if "memory_preset" in data.configs.columns
                          else np.full(len(data.run_id), "?", dtype=object))
    elif scheme in ("logo", "lofo", "lopo"):
        f = pooled_groups(data.labels(scheme))
    elif scheme == "scale":
        big = data.configs["n_gpus"].cast(pl.Float64).to_numpy() > SCALE_SPLIT_N_GPUS
        f = np.where(big, f"n>{SCALE_SPLIT_N_GPUS}", f"n<={SCALE_SPLIT_N_GPUS}").astype(object)
        return f, ([f"n>{SCALE_SPLIT_N_GPUS}"] if big.any() and (~big).any() else [])
    elif scheme == "vtrain_multi_lomso":
        vm = np.array([str(r).startswith("vtrain_m") for r in data.run_id])
        size = data.configs["d_model"].cast(pl.Utf8).to_numpy().astype(object)
        f = np.where(vm, "h=" + size, "never").astype(object)
        return f, sorted(set(f[vm])) if vm.sum() >= 2 * MIN_GROUP else []
    else:
        raise ValueError(f"unknown protocol {scheme!r}; expected one of {ALL_PROTOCOLS}")
    held = sorted(set(f))
    # a protocol with one group has nothing to hold out against
    return f, (held if len(held) > 1 else [])


@dataclass
class CVResult:
    scheme: str
    folds: np.ndarray                      # held-out fold label of each run
    log_pred: dict[str, np.ndarray]        # predictor -> out-of-fold log tokens/s/GPU per run
    domain_code: np.ndarray                # models.fitting.predictor DOMAIN_* of each run w.r.t. its fold's fit
    fold_train_ids: dict[str, list[str]] = field(default_factory=dict)


def fold_predictions(job: tuple) -> dict:
    """One fold: fit physics + residual kinds on the runs outside `test` and predict the `test` runs through
    the serving function. `job` = (data, test row indices); a top-level function, so a process pool can run
    folds in parallel. Returns {kind: log tokens/s/GPU of the test rows, 'domain_code': ..., 'train_ids': ...}."""
    data, test_idx, max_nfev = job
    test = np.zeros(len(data.log_target), dtype=bool)
    test[test_idx] = True
    tr = data.subset(np.flatnonzero(~test))
    cals = build_calibration(tr, max_nfev=max_nfev)
    arrays = encode(data.configs[test_idx])
    out = {"train_ids": sorted(tr.run_id.tolist())}
    for kind, c in cals.items():
        res = serve_arrays(arrays, c)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[kind] = np.log(res["tokens_per_s_per_gpu"])
        out["domain_code"] = res["domain_code"]
    return out


def grouped_cv(data: "FitData", scheme: str, max_nfev: int | None = None, map_fn=map) -> CVResult:
    """For every fold of `scheme`, fit physics + residual kinds without it and predict it through the serving
    function (`map_fn` maps `fold_predictions` over the folds: the builtin map, or a process pool's).
    Runs whose fold is not held out keep NaN."""
    return cross_validate(data, [scheme], max_nfev=max_nfev, map_fn=map_fn)[0]


def cross_validate(data: "FitData", schemes, max_nfev: int | None = None, map_fn=map) -> list[CVResult]:
    """`grouped_cv` for several protocols, every fold of every protocol in one `map_fn` call."""
    return _cross_validate(data, schemes, max_nfev, map_fn)[0]


def _physics_cost(data: "FitData", train: np.ndarray) -> int:
    """Rows the physics fit of a training set evaluates (`_physics_rows`): what a fold's time grows with."""
    limit = HYPER["physics_subsample_over"]
    _, cnt = np.unique(data.group("source")[train], return_counts=True)
    k = np.where(cnt > limit, np.ceil(cnt / (limit / 2)), 1.0)
    return int(np.ceil(cnt / k).sum())


def _cv_task(job: tuple):
    """One task of `_cross_validate`'s map: a fold (`fold_predictions`) or, for ("final", data, version), the
    fit on every run (`build_calibration`), so that it runs beside the folds."""
    if job[0] == "final":
        return build_calibration(job[1], version=job[2])
    return fold_predictions(job)


def _cross_validate(data: "FitData", schemes, max_nfev: int | None = None, map_fn=map,
                    final_version: str | None = None) -> tuple[list[CVResult], dict | None]:
    """`cross_validate`, and with `final_version` the fit on every run in the same map: (results, {kind:
    Calibration} or None). The tasks go to `map_fn` largest first (a pool then ends with small ones, not one
    long fold on one worker while the other waits); their results are put back in order."""
    base_log = Physics(data.configs).log_tput(DEFAULT, {})
    jobs, keys, folds_of = [], [], {}
    for scheme in schemes:
        folds, hold_out = protocol_folds(data, scheme)
        folds_of[scheme] = folds
        for g in hold_out:
            jobs.append((data, np.flatnonzero(folds == g), max_nfev))
            keys.append((scheme, g))
    tasks = jobs + ([("final", data, final_version)] if final_version is not None else [])
    n = len(data.log_target)
    cost = [_physics_cost(data, np.setdiff1d(np.arange(n), j[1])) for j in jobs] + \
        ([_physics_cost(data, np.arange(n))] if final_version is not None else [])
    order = sorted(range(len(tasks)), key=lambda i: -cost[i])  # stable: equal costs keep their order
    done = list(map_fn(_cv_task, [tasks[i] for i in order]))
    results = [None] * len(tasks)
    for i, r in zip(order, done):
        results[i] = r
    final = results.pop() if final_version is not None else None
    out = []
    for scheme in schemes:
        folds = folds_of[scheme]
        log_pred = {k: np.full(n, np.nan) for k in ("analytical",) + MODEL_KINDS}
        code = np.full(n, -1, dtype=np.int64)
        train_ids = {}
        for (sch, g), job, res in zip(keys, jobs, results):
            if sch != scheme:
                continue
            idx = job[1]
            log_pred["analytical"][idx] = base_log[idx]
            for kind in MODEL_KINDS:
                log_pred[kind][idx] = res[kind]
            code[idx] = res["domain_code"]
            train_ids[str(g)] = res["train_ids"]
        out.append(CVResult(scheme, folds, log_pred, code, train_ids))
    return out, final


def weighted_median(x: np.ndarray, w: np.ndarray) -> float:
    """The median of `x` with weights `w` (the smallest x whose cumulative weight reaches half)."""
    o = np.argsort(x)
    c = np.cumsum(w[o])
    return float(x[o][np.searchsorted(c, 0.5 * c[-1])])


def source_weights(source: np.ndarray) -> np.ndarray:
    """Each run's weight when every source weighs the same: 1/n of its source's n runs."""
    _, inv, cnt = np.unique(np.asarray(source).astype(str), return_inverse=True, return_counts=True)
    return 1.0 / cnt[inv]


def _metrics(rel: np.ndarray, source: np.ndarray | None = None) -> dict:
    """MdAPE, MAPE and share within 10% over runs; with `source`, also `mdape_balanced`/`mape_balanced`: every
    source weighs the same (each run 1/n of its source), so one large source does not stand for all of them."""
    ok = np.isfinite(rel)
    a = np.abs(rel[ok])
    if not len(a):
        return {"n_runs": 0, "mdape": None, "mape": None, "within_10pct": None, "mdape_balanced": None,
                "mape_balanced": None}
    out = {"n_runs": int(len(a)), "mdape": float(np.median(a)), "mape": float(np.mean(a)),
           "within_10pct": float(np.mean(a <= 0.10)), "mdape_balanced": None, "mape_balanced": None}
    if source is not None:
        w = source_weights(np.asarray(source)[ok])
        out["mdape_balanced"] = weighted_median(a, w)
        out["mape_balanced"] = float(np.sum(a * w) / np.sum(w))
    return out


def _rel(log_pred: np.ndarray, log_target: np.ndarray) -> np.ndarray:
    return np.exp(log_pred - log_target) - 1.0


# ---------------------------------------------------------------------------------------- intervals
def _is_extrapolated(code: np.ndarray) -> np.ndarray:
    return code != DOMAIN_INSIDE


#: the width model's floor on |log error| before its log (an exact prediction would weigh -inf; 1 %, about an
#: eighth of the typical held-out error) and its ridge on every coefficient but the intercept
WIDTH_EPS = 0.01
WIDTH_RIDGE = 1.0


def fit_width_model(F: np.ndarray, err: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Coefficients of log(|log error| + WIDTH_EPS) on the width features `F` (models.fitting.predictor.WIDTH_FEATURES;
    first column the intercept): weighted least squares with a ridge on every coefficient but the intercept. The
    scale of a prediction's error is exp(F . coef), a geometric-mean scale, so a few very large errors (a source
    whose one figure is off by 2x) do not set the width of every run like them."""
    y = np.log(err + WIDTH_EPS)
    wn = w / w.sum()
    pen = np.full(F.shape[1], WIDTH_RIDGE / len(err))
    pen[0] = 0.0
    A = F.T @ (F * wn[:, None]) + np.diag(pen)
    return np.linalg.solve(A, F.T @ (wn * y))


def _oof_errors(cvs: list[CVResult], kind: str, log_target: np.ndarray, run_id: np.ndarray, feats: np.ndarray,
                weights: np.ndarray):
    """Every protocol's out-of-fold rows, stacked: |log error|, extrapolated flag, run id, width features,
    weight."""
    errs, exts, ids, fs, ws = [], [], [], [], []
    for cv in cvs:
        e = np.abs(cv.log_pred[kind] - log_target)
        ok = np.isfinite(e)
        errs.append(e[ok])
        exts.append(_is_extrapolated(cv.domain_code)[ok])
        ids.append(run_id[ok])
        fs.append(feats[ok])
        ws.append(weights[ok])
    return (np.concatenate(errs), np.concatenate(exts), np.concatenate(ids), np.concatenate(fs),
            np.concatenate(ws))


def _quantiles(E, X, alpha):
    q_in = conformal.conformal_quantile(E[~X], alpha)
    q_out = max(conformal.conformal_quantile(E[X], alpha) if X.sum() >= int(np.ceil(1.0 / alpha)) * 2 else
                conformal.conformal_quantile(E, alpha), q_in)
    return float(q_in), float(q_out)


def interval_quantiles(cvs: list[CVResult], kind: str, log_target: np.ndarray, feats: np.ndarray,
                       weights: np.ndarray, alpha: float = ALPHA):
    """(q_inside, q_extrapolated, width_coef): conformal quantiles over every protocol's out-of-fold predictions,
    per class (inside the fit's domain / extrapolated), of |log error| / exp(features . width_coef) — the error
    normalized by the width model fitted on those same rows (`fit_width_model`, run weights `weights`). With
    fewer than 2/alpha extrapolated predictions, q_extrapolated = the larger of q_inside and the quantile of all
    predictions."""
    E, X, _, F, W = _oof_errors(cvs, kind, log_target, np.arange(len(log_target)), feats, weights)
    coef = fit_width_model(F, E, W)
    q_in, q_out = _quantiles(E / np.exp(F @ coef), X, alpha)
    return q_in, q_out, coef


def protocol_coverage(cvs: list[CVResult], kind: str, log_target: np.ndarray, run_id: np.ndarray,
                      feats: np.ndarray, weights: np.ndarray,
                      alpha: float = ALPHA) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per protocol: (covered per run, relative width per run), each fold's width model and quantiles estimated
    from every protocol's out-of-fold errors EXCEPT those of the fold's own runs (leave-one-fold-out
    conformal)."""
    # run ids as integer codes (equal ids, equal codes): the membership test below is then on integers
    _, codes = np.unique(np.asarray(run_id), return_inverse=True)
    codes = codes.ravel()
    E, X, I, F, W = _oof_errors(cvs, kind, log_target, codes, feats, weights)
    out = {}
    for cv in cvs:
        e = np.abs(cv.log_pred[kind] - log_target)
        held = np.isfinite(e)
        covered = np.full(len(e), np.nan)
        width = np.full(len(e), np.nan)
        ext = _is_extrapolated(cv.domain_code)
        for g in np.unique(cv.folds[held]):
            sel = held & (cv.folds == g)
            keep = ~np.isin(I, codes[sel])
            coef = fit_width_model(F[keep], E[keep], W[keep])
            q_in, q_out = _quantiles(E[keep] / np.exp(F[keep] @ coef), X[keep], alpha)
            q = np.where(ext[sel], q_out, q_in) * np.exp(feats[sel] @ coef)
            covered[sel] = e[sel] <= q
            width[sel] = np.exp(q) - np.exp(-q)
        out[cv.scheme] = (covered, width)
    return out


# --------------------------------------------------------------------------------------- the fit
def _labels_for(cv: CVResult, data: "FitData") -> dict[str, np.ndarray]:
    if cv.scheme == "vtrain_multi_lomso":
        return {"model_size": cv.folds}
    per = {"loso": "source", "loho": "gpu", "logo": "generation", "lofo": "family", "lopo": "precision",
           "scale": "scale", "lost": "stack"}[cv.scheme]
    out = {"source": data.group("source"), "gpu": data.group("gpu")}
    if per not in out:
        out[per] = cv.folds
    return out


def scaling_rows(cvs, chosen: str, data: "FitData") -> pl.DataFrame:
    """fit_metrics rows (grouping 'scaling_series') of every protocol: per measured series (models.fitting.scaling)
    the measured and predicted efficiency between its smallest and largest cluster, and a row 'ALL' with the mean
    and largest |error| over the series, for the physics and the calibrated prediction."""
    labels = scaling.series_labels(data.configs)
    n_gpus = data.configs["n_gpus"].cast(pl.Float64).to_numpy()
    frames = []
    for cv in cvs:
        for pred_name in ("physics", "calibrated"):
            lp = cv.log_pred[chosen if pred_name == "calibrated" else pred_name]
            per = scaling.series_efficiency(labels, n_gpus, lp, data.log_target)
            if per.height == 0:
                continue
            s = scaling.summary(per)
            head = {"scheme": cv.scheme, "grouping": "scaling_series", "predictor": pred_name}
            frames.append(per.select(
                *[pl.lit(v).alias(k) for k, v in head.items()], pl.col("series").alias("group"),
                pl.col("n_runs").cast(pl.Int64), "efficiency_measured", "efficiency_predicted",
                pl.col("efficiency_error").abs().alias("efficiency_abs_error")))
            frames.append(pl.DataFrame([{**head, "group": "ALL", "n_runs": int(per["n_runs"].sum()),
                                         "n_series": s["n_series"], "efficiency_abs_error": s["mean_abs"],
                                         "efficiency_max_abs_error": s["max_abs"]}]))
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def fit_calibration(data: "FitData", max_nfev: int | None = None, protocols=PROTOCOLS, map_fn=map):
    """Fit everything on `data` and validate it under the transfer protocols.

    Returns (calibration, report): report has `metrics` (rows: scheme, grouping, group, predictor, n_runs,
    mdape, mape, within_10pct, coverage_90, median_width), `oof_long` (scheme, run_id, fold, log_pred,
    log_target, domain_code: every protocol's out-of-fold calibrated prediction per run), `oof` (per-run
    leave-one-source-out prediction with interval and coverage), `chosen`, `q_inside`, `q_extrapolated`,
    `worst` ({kind: (protocol, mdape)}), `fold_train_ids`, `folds`. `map_fn` runs the folds (see
    `grouped_cv`)."""
    version = fit_version(data)
    rid = data.run_id
    cvs, final_cals = _cross_validate(data, protocols, max_nfev=max_nfev, map_fn=map_fn, final_version=version)
    cvs = [cv for cv in cvs if np.isfinite(cv.log_pred["physics"]).any()]

    # choose the residual kind by its worst protocol
    src = data.group("source")

    def worst(kind):  # sources weigh the same: the figure for a run from a source the fit has not seen
        scores = [(cv.scheme, _metrics(_rel(cv.log_pred[kind], data.log_target), src)["mdape_balanced"])
                  for cv in cvs]
        scores = [s for s in scores if s[1] is not None]
        return max(scores, key=lambda s: s[1]) if scores else ("none", float("inf"))
    worsts = {k: worst(k) for k in MODEL_KINDS}
    chosen = min(MODEL_KINDS, key=lambda k: (worsts[k][1], MODEL_KINDS.index(k)))
    wf = width_features(encode(data.configs), len(rid))
    sw = source_weights(src)
    q_in, q_out, wcoef = interval_quantiles(cvs, chosen, data.log_target, wf, sw)

    final = final_cals[chosen]  # build_calibration(data, version=version), fitted beside the folds
    final.q_inside, final.q_extrapolated, final.width_coef = q_in, q_out, wcoef

    cover = protocol_coverage(cvs, chosen, data.log_target, rid, wf, sw)
    rows = []
    for cv in cvs:
        covered, width = cover[cv.scheme]
        held = np.isfinite(cv.log_pred[chosen])
        for gname, labels in _labels_for(cv, data).items():
            for grp in ["ALL"] + sorted(set(labels[held])):
                sel = held & ((labels == grp) if grp != "ALL" else True)
                for pred_name in ("analytical", "physics", "ridge", "calibrated"):
                    lp = cv.log_pred[chosen if pred_name == "calibrated" else pred_name]
                    m = _metrics(_rel(lp[sel], data.log_target[sel]), src[sel])
                    is_cal = pred_name == "calibrated"
                    rows.append({"scheme": cv.scheme, "grouping": gname, "group": grp, "predictor": pred_name, **m,
                                 "coverage_90": float(np.nanmean(covered[sel])) if is_cal and sel.any() else None,
                                 "median_width": float(np.nanmedian(width[sel])) if is_cal and sel.any() else None})
    metrics = pl.DataFrame(rows, schema_overrides={"coverage_90": pl.Float64, "median_width": pl.Float64,
                                                   "mdape": pl.Float64, "mape": pl.Float64,
                                                   "within_10pct": pl.Float64, "mdape_balanced": pl.Float64,
                                                   "mape_balanced": pl.Float64})
    metrics = pl.concat([metrics, scaling_rows(cvs, chosen, data)], how="diagonal_relaxed")
    oof_long = pl.concat([pl.DataFrame({
        "scheme": [cv.scheme] * len(rid), "run_id": rid.astype(str), "fold": cv.folds.astype(str),
        "log_pred": cv.log_pred[chosen], "log_target": data.log_target, "domain_code": cv.domain_code,
    }).filter(pl.col("log_pred").is_finite()) for cv in cvs])
    loso = next((cv for cv in cvs if cv.scheme == "loso"), cvs[0])
    loho = next((cv for cv in cvs if cv.scheme == "loho"), None)
    covered, _ = cover[loso.scheme]
    q_row = np.where(_is_extrapolated(loso.domain_code), q_out, q_in) * np.exp(wf @ wcoef)
    lp = loso.log_pred[chosen]
    oof = pl.DataFrame({
        "run_id": rid, "loso_fold": loso.folds.astype(str), "loso_tokens_per_s_per_gpu": np.exp(lp),
        "loso_tokens_per_s_per_gpu_lo": np.exp(lp - q_row), "loso_tokens_per_s_per_gpu_hi": np.exp(lp + q_row),
        "loso_covered": covered,
        "loho_tokens_per_s_per_gpu": np.exp(loho.log_pred[chosen]) if loho is not None else np.full(len(rid), np.nan),
    })
    # the k-shot protocol: a unit's own runs (source | accelerator | stack) adapting the fit that never saw its
    # source; it chooses and measures the adaptation rule every command serves (models.fitting.adapt)
    rule, kshot_rows = (None, [])
    if loso.scheme == "loso":
        units = adapt.units_of(src, data.group("gpu"), data.group("framework"))
        rule, kshot_rows = adapt.select_rule(data.log_target - loso.log_pred[chosen], units)
    final.adaptation_rule = rule
    metrics = metrics.with_columns(pl.lit(None, dtype=pl.Int64).alias("k_shot"))
    if kshot_rows:
        metrics = pl.concat([metrics, pl.DataFrame([{
            "scheme": "kshot", "grouping": r["grouping"], "group": r["group"], "predictor": r["predictor"],
            "n_runs": r["n_runs"], "mdape": r["mdape"], "mape": r["mape"], "within_10pct": r["within_10pct"],
            "coverage_90": r["coverage_90"], "median_width": r["median_width"], "mdape_balanced": r["mdape_balanced"],
            "mape_balanced": r["mape_balanced"], "k_shot": r["k"]} for r in kshot_rows],
            schema=metrics.schema)], how="vertical")
    summary = {r["scheme"]: r for r in metrics.filter((pl.col("grouping") == "source") & (pl.col("group") == "ALL")
                                                      & (pl.col("predictor") == "calibrated")).to_dicts()}
    final.metrics = {"protocols": summary, "worst": {k: list(v) for k, v in worsts.items()}, "chosen": chosen}
    report = {"metrics": metrics, "oof": oof, "oof_long": oof_long, "chosen": chosen, "q_inside": q_in,
              "q_extrapolated": q_out, "kappa": 0.0, "q": q_in, "worst": worsts,
              "fold_train_ids": {cv.scheme: cv.fold_train_ids for cv in cvs},
              "folds": {cv.scheme: dict(zip(rid.tolist(), cv.folds.astype(str).tolist())) for cv in cvs}}
    return final, report


# ------------------------------------------------------------------------------------------ serve
def apply_calibration(bundle: Calibration, analytical: pl.DataFrame, features_input: pl.DataFrame) -> pl.DataFrame:
    """Calibrated step time / throughput with the interval, one row per row of `features_input` (the
    configurations: architecture, layout, resolved hardware, optional software_preset). A thin wrapper over
    `models.fitting.predictor.predict`, kept for callers of the earlier API; `analytical` is only checked for its
    length (the physics is re-evaluated by the one prediction function)."""
    if analytical.height != features_input.height:
        raise ValueError(f"analytical has {analytical.height} rows but features_input has {features_input.height}")
    res = predict(features_input, bundle)
    return res.select("step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu",
                      "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "fit_version", "calibration_domain")
