"""Calibration of the analytical model on measured runs: physics first, then a residual regressor, grouped
validation and conformal intervals (pure: arrays and DataFrames in, a bundle and tables out).

1. Target: log(measured tokens/s/GPU) per run (`models.targets`; MFU/HFU/TFLOP-only runs converted and
   flagged `target_derived`; whole-run GPU-hour averages excluded: they include downtime).
2. Physics: the named `PhysParams` fields in `FIT_FIELDS` (+ per-software-preset `PRESET_FIELDS`) are fitted
   with `scipy.optimize.least_squares` (soft-L1 loss on the log ratio, bounded by
   `models.params.FITTABLE_BOUNDS`, a weak pull towards the priors so unidentified fields stay put). Runs are
   weighted `n_source^-1/4` so the 1,440 vTrain single-node runs do not drown the other sources (each
   source's total weight grows as sqrt(n)).
3. Residual: a regressor on `models.features` predicts the remaining log(measured / physics). Candidates:
   `physics` (no residual model), `ridge` (standardised ridge regression), `gbm` (histogram gradient
   boosting). The one with the lowest leave-one-source-out MdAPE is kept.
4. Grouped validation: leave-one-source-out (`loso`) and leave-one-hardware-out (`loho`); for every fold
   the physics AND the residual model are re-fitted without the held-out group (`fold_train_ids` records
   what each fold saw). Sources / hardware with fewer than `MIN_GROUP` runs are held out together as one
   pooled group ("other"), which is stricter than one at a time.
5. Intervals: normalised conformal (models.conformal) on the out-of-group log errors; kappa (how fast
   intervals widen with distance from the training data) is the one with the narrowest median width among
   those whose leave-one-source-out coverage is within 0.85-0.95.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from models import conformal
from models.features import FEATURE_NAMES, FeatureError, build_features, validate
from models.params import DEFAULT, FITTABLE_BOUNDS, PhysParams
from models.runs_adapter import PRESETS, preset_params
from models.step_time import OUTPUT_COLUMNS, encode_configs, predict_arrays

FIT_CODE_VERSION = "stepcast-calibration/1"
FIT_FIELDS = ("matmul_eff_16bit", "matmul_eff_8bit", "attn_eff", "gemm_half_flops", "host_overhead_s_per_op",
              "scaleup_eff", "scaleout_eff", "alpha_scaleup_s", "tp_overlap", "dp_overlap", "fsdp_gather_overlap")
PRESET_FIELDS = {"megatron_2022": ("host_overhead_s_per_op",)}
LOG_FIELDS = {"gemm_half_flops", "host_overhead_s_per_op", "alpha_scaleup_s", "alpha_scaleout_s"}
MODEL_KINDS = ("physics", "ridge", "gbm")
MIN_GROUP = 5
ALPHA = 0.10
KAPPAS = (0.0, 0.1, 0.25, 0.5, 1.0)
COVERAGE_BAND = (0.85, 0.95)
HYPER = {
    "prior_weight": 0.3, "soft_l1_scale": 0.05, "max_nfev": 30, "source_weight_power": -0.25,
    "physics_subsample_over": 400,
    "ridge_alpha": 10.0,
    "gbm": {"max_iter": 80, "learning_rate": 0.08, "max_leaf_nodes": 15, "min_samples_leaf": 20,
            "l2_regularization": 1.0},
    "alpha": ALPHA, "kappas": list(KAPPAS), "min_group": MIN_GROUP,
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


def fit_data(configs: pl.DataFrame, targets: pl.DataFrame) -> FitData:
    """Join predictable configs (models.evaluate.prepare_configs) with targets (run_id,
    measured_tokens_per_s_per_gpu, whole_run_average); keep runs with a finite positive target that the
    model can predict (memory-infeasible runs are kept: they ran, their time prediction is still made)."""
    t = targets.select("run_id", "measured_tokens_per_s_per_gpu", pl.col("whole_run_average").fill_null(False))
    df = configs.join(t, on="run_id", how="inner").filter(
        (pl.col("measured_tokens_per_s_per_gpu") > 0) & ~pl.col("whole_run_average")).sort("run_id")
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


def fit_version(data: FitData) -> str:
    """Hash of the data and of everything in the code that shapes the fit (same data -> same version)."""
    h = hashlib.sha256()
    h.update(FIT_CODE_VERSION.encode())
    h.update(json.dumps(HYPER, sort_keys=True).encode())
    h.update(json.dumps(DEFAULT.to_dict(), sort_keys=True).encode())
    h.update(json.dumps([FIT_FIELDS, PRESET_FIELDS, FEATURE_NAMES], sort_keys=True, default=list).encode())
    h.update(data_hash(data).encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------- physics
class Physics:
    """The analytical model on fixed configurations, encoded once; fast re-prediction for new params."""

    def __init__(self, configs: pl.DataFrame):
        presets = configs["software_preset"].fill_null("default").to_numpy() if "software_preset" in \
            configs.columns else np.full(configs.height, "default")
        self.n = configs.height
        self.parts = []
        for name in PRESETS:
            idx = np.flatnonzero(presets == name)
            if len(idx):
                self.parts.append((name, idx, encode_configs(configs[idx])))

    def predict(self, params: PhysParams, overrides: dict, columns=("tokens_per_s_per_gpu",)) -> dict:
        out = {c: np.full(self.n, np.nan) for c in columns}
        for name, idx, arrays in self.parts:
            res = predict_arrays(arrays, preset_params(name, params, overrides))
            for c in columns:
                out[c][idx] = res[c]
        return out

    def log_tput(self, params: PhysParams, overrides: dict) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(self.predict(params, overrides)["tokens_per_s_per_gpu"])

    def frame(self, params: PhysParams, overrides: dict) -> pl.DataFrame:
        res = self.predict(params, overrides, [c for c in OUTPUT_COLUMNS if c not in ("feasible", "error_code")])
        return pl.DataFrame(res)


def _slots(configs: pl.DataFrame) -> list[tuple[str | None, str]]:
    presets = set(configs["software_preset"].fill_null("default").to_list())
    return [(None, f) for f in FIT_FIELDS] + [(p, f) for p, fs in PRESET_FIELDS.items() if p in presets for f in fs]


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
    return base.with_(**glob), over


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

    def resid(u):
        params, over = _unpack(slots, u, base)
        r = sw * (phys.log_tput(params, over) - data.log_target)
        return np.concatenate([np.nan_to_num(r, nan=10.0), pw * (u - u0)])

    sol = least_squares(resid, np.clip(u0, 1e-6, 1 - 1e-6), bounds=(0.0, 1.0), loss="soft_l1",
                        f_scale=HYPER["soft_l1_scale"], max_nfev=max_nfev or HYPER["max_nfev"], diff_step=1e-3,
                        x_scale=1.0)
    return _unpack(slots, sol.x, base)


# --------------------------------------------------------------------------------------- residual
def _make_model(kind: str):
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if kind == "ridge":
        return make_pipeline(StandardScaler(), Ridge(alpha=HYPER["ridge_alpha"]))
    if kind == "gbm":
        return HistGradientBoostingRegressor(random_state=0, early_stopping=False, **HYPER["gbm"])
    raise ValueError(f"unknown model kind {kind!r}; expected one of {MODEL_KINDS}")


def _fit_model(kind: str, X: np.ndarray, y: np.ndarray, w: np.ndarray):
    if kind == "physics":
        return None
    from threadpoolctl import threadpool_limits

    m = _make_model(kind)
    with threadpool_limits(limits=1):  # tiny data: OpenMP threads only contend (measured 5x slower)
        if kind == "ridge":
            m.fit(X, y, ridge__sample_weight=w)
        else:
            m.fit(X, y, sample_weight=w)
    return m


def _model_predict(model, X: np.ndarray) -> np.ndarray:
    if model is None:
        return np.zeros(len(X))
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return np.asarray(model.predict(X), dtype=float)


def _features(phys: Physics, data: FitData, params: PhysParams, over: dict) -> np.ndarray:
    return build_features(phys.frame(params, over), data.configs, check=False)


# ------------------------------------------------------------------------------------ grouped CV
def pooled_groups(labels: np.ndarray, min_group: int = MIN_GROUP) -> np.ndarray:
    """Groups with fewer than `min_group` runs are merged into one held-out group 'other'."""
    vals, counts = np.unique(labels, return_counts=True)
    small = set(vals[counts < min_group])
    return np.array([("other" if x in small else x) for x in labels], dtype=object)


@dataclass
class CVResult:
    scheme: str
    folds: np.ndarray                      # held-out fold label of each run
    log_pred: dict[str, np.ndarray]        # predictor -> out-of-group log tokens/s/GPU per run
    distance: np.ndarray                   # novelty distance of each run w.r.t. its fold's training set
    fold_train_ids: dict[str, list[str]] = field(default_factory=dict)


def grouped_cv(data: FitData, folds: np.ndarray, scheme: str, kinds=MODEL_KINDS,
               hold_out: list | None = None, max_nfev: int | None = None) -> CVResult:
    """For every fold label in `hold_out` (default: all), fit physics + residual models on the runs of the
    other folds only and predict the held-out runs. Runs whose fold is not held out keep NaN."""
    n = len(folds)
    log_pred = {"analytical": np.full(n, np.nan)} | {k: np.full(n, np.nan) for k in kinds}
    dist = np.full(n, np.nan)
    phys_all = Physics(data.configs)
    base_log = phys_all.log_tput(DEFAULT, {})
    train_ids: dict[str, list[str]] = {}
    for g in (hold_out if hold_out is not None else list(np.unique(folds))):
        test = folds == g
        if not test.any():
            continue
        train = ~test
        tr = data.subset(np.flatnonzero(train))
        train_ids[str(g)] = sorted(tr.run_id.tolist())
        # every fold fits the physics exactly as the final fit does (same evaluation budget), so the
        # cross-validated figures describe the procedure that produces the shipped fit
        params, over = fit_physics(tr, max_nfev=max_nfev or HYPER["max_nfev"])
        X = _features(phys_all, data, params, over)
        phys_log = phys_all.log_tput(params, over)
        y = data.log_target - phys_log
        log_pred["analytical"][test] = base_log[test]
        for kind in kinds:
            model = _fit_model(kind, X[train], y[train], data.weight[train])
            log_pred[kind][test] = phys_log[test] + _model_predict(model, X[test])
        dist[test] = conformal.Novelty.fit(X[train]).distance(X[test])
    return CVResult(scheme, folds, log_pred, dist, train_ids)


def _metrics(rel: np.ndarray) -> dict:
    a = np.abs(rel[np.isfinite(rel)])
    if not len(a):
        return {"n_runs": 0, "mdape": None, "mape": None, "within_10pct": None}
    return {"n_runs": int(len(a)), "mdape": float(np.median(a)), "mape": float(np.mean(a)),
            "within_10pct": float(np.mean(a <= 0.10))}


def _rel(log_pred: np.ndarray, log_target: np.ndarray) -> np.ndarray:
    return np.exp(log_pred - log_target) - 1.0


# --------------------------------------------------------------------------------------- the fit
@dataclass
class CalibrationBundle:
    """A fitted calibration: physics params, residual model, conformal interval; `apply_calibration` uses it."""

    version: str
    params: PhysParams
    preset_overrides: dict
    model_kind: str
    model: object
    kappa: float
    q: float
    alpha: float
    novelty: conformal.Novelty
    feature_names: tuple = FEATURE_NAMES
    hardware_seen: tuple = ()
    metrics: dict = field(default_factory=dict)

    def params_for(self, preset: str = "default") -> PhysParams:
        return preset_params(preset, self.params, self.preset_overrides)


def fit_calibration(data: FitData, max_nfev: int | None = None, vtrain_multi_prefix: str = "vtrain_m",
                    protocols=("loso", "loho")):
    """Fit everything on `data` and validate it under the grouped protocols.

    Returns (bundle, report): report has `metrics` (rows: scheme, grouping, group, predictor, n_runs, mdape,
    mape, within_10pct, coverage_90, median_width), `oof` (per-run out-of-group predictions of the
    leave-one-source-out protocol, with interval and coverage), `chosen`, `fold_train_ids`."""
    version = fit_version(data)
    src = data.group("source")
    gpu = data.group("gpu")
    loso = grouped_cv(data, pooled_groups(src), "loso", max_nfev=max_nfev)
    loho = grouped_cv(data, pooled_groups(gpu), "loho", max_nfev=max_nfev)
    cvs = [loso, loho]
    if "vtrain_multi_lomso" not in protocols:
        vtrain_multi_prefix = "\0"  # matches no run
    # vTrain multi-node: leave each model size out (the other sizes and every other source stay in)
    rid = data.run_id
    vm = np.array([str(r).startswith(vtrain_multi_prefix) for r in rid])
    if vm.sum() >= 2 * MIN_GROUP:
        size = data.configs["d_model"].cast(pl.Utf8).to_numpy().astype(object)
        folds = np.where(vm, "h=" + size, "never")
        sizes = sorted(set(folds[vm]))
        cvs.append(grouped_cv(data, folds, "vtrain_multi_lomso", hold_out=sizes, max_nfev=max_nfev))

    # choose the residual model under leave-one-source-out
    scores = {k: _metrics(_rel(loso.log_pred[k], data.log_target))["mdape"] for k in MODEL_KINDS}
    chosen = min(MODEL_KINDS, key=lambda k: (scores[k], MODEL_KINDS.index(k)))

    # choose kappa: narrowest median width with LOSO coverage inside the band
    abs_err = np.abs(data.log_target - loso.log_pred[chosen])
    best = None
    for kappa in KAPPAS:
        sig = conformal.sigma(loso.distance, kappa)
        cov, _, width = conformal.grouped_coverage(abs_err, sig, loso.folds, ALPHA)
        c = float(cov.mean())
        inside = COVERAGE_BAND[0] <= c <= COVERAGE_BAND[1]
        key = (not inside, float(np.median(width)) if inside else abs(c - 0.9))
        if best is None or key < best[0]:
            best = (key, kappa)
    kappa = best[1]

    # final fit on everything
    params, over = fit_physics(data)
    phys_all = Physics(data.configs)
    X = _features(phys_all, data, params, over)
    phys_log = phys_all.log_tput(params, over)
    model = _fit_model(chosen, X, data.log_target - phys_log, data.weight)
    q = conformal.conformal_quantile(abs_err / conformal.sigma(loso.distance, kappa), ALPHA)
    bundle = CalibrationBundle(version=version, params=params, preset_overrides=over, model_kind=chosen,
                               model=model, kappa=kappa, q=q, alpha=ALPHA, novelty=conformal.Novelty.fit(X),
                               hardware_seen=tuple(sorted(set(gpu))))

    # metrics: every protocol x grouping x predictor, plus interval coverage of the chosen predictor
    rows = []
    for cv in cvs:
        held = np.isfinite(cv.log_pred[chosen])
        sig = conformal.sigma(cv.distance, kappa)
        cov = np.full(len(rid), np.nan)
        width = np.full(len(rid), np.nan)
        c, _, w = conformal.grouped_coverage(abs(data.log_target - cv.log_pred[chosen])[held], sig[held],
                                             cv.folds[held], ALPHA)
        cov[held], width[held] = c, w
        groupings = {"source": src, "gpu": gpu} if cv.scheme != "vtrain_multi_lomso" else {"model_size": cv.folds}
        for gname, labels in groupings.items():
            for grp in ["ALL"] + sorted(set(labels[held])):
                sel = held & ((labels == grp) if grp != "ALL" else True)
                for pred_name in ("analytical", "physics", "ridge", "gbm", "calibrated"):
                    lp = cv.log_pred[chosen if pred_name == "calibrated" else pred_name]
                    m = _metrics(_rel(lp[sel], data.log_target[sel]))
                    is_cal = pred_name == "calibrated"
                    rows.append({"scheme": cv.scheme, "grouping": gname, "group": grp, "predictor": pred_name, **m,
                                 "coverage_90": float(np.mean(cov[sel])) if is_cal and sel.any() else None,
                                 "median_width": float(np.median(width[sel])) if is_cal and sel.any() else None})
            if cv.scheme == "vtrain_multi_lomso":
                break
    metrics = pl.DataFrame(rows, schema_overrides={"coverage_90": pl.Float64, "median_width": pl.Float64,
                                                   "mdape": pl.Float64, "mape": pl.Float64,
                                                   "within_10pct": pl.Float64})
    sig = conformal.sigma(loso.distance, kappa)
    cov, qs, width = conformal.grouped_coverage(abs_err, sig, loso.folds, ALPHA)
    lo_t, hi_t = np.exp(loso.log_pred[chosen] - qs * sig), np.exp(loso.log_pred[chosen] + qs * sig)
    oof = pl.DataFrame({
        "run_id": rid, "loso_fold": loso.folds.astype(str),
        "loso_tokens_per_s_per_gpu": np.exp(loso.log_pred[chosen]),
        "loso_tokens_per_s_per_gpu_lo": lo_t, "loso_tokens_per_s_per_gpu_hi": hi_t, "loso_covered": cov,
        "loho_tokens_per_s_per_gpu": np.exp(loho.log_pred[chosen]),
    })
    overall = metrics.filter((pl.col("scheme") == "loso") & (pl.col("grouping") == "source")
                             & (pl.col("group") == "ALL"))
    summary = {r["predictor"]: r for r in overall.to_dicts()}
    bundle.metrics = {"loso": summary, "scores": scores}
    report = {"metrics": metrics, "oof": oof, "chosen": chosen, "kappa": kappa, "q": q,
              "fold_train_ids": {cv.scheme: cv.fold_train_ids for cv in cvs}, "folds": {
                  cv.scheme: dict(zip(rid.tolist(), cv.folds.astype(str).tolist())) for cv in cvs}}
    return bundle, report


# ------------------------------------------------------------------------------------------ serve
def apply_calibration(bundle: CalibrationBundle, analytical: pl.DataFrame, features_input: pl.DataFrame) -> pl.DataFrame:
    """Calibrated step time / throughput with the conformal interval, one row per input row.

    `analytical`: `models.step_time.predict` output made with `bundle.params_for(preset)` (columns
    models.features.REQUIRED_ANALYTICAL + tokens_per_s_per_gpu); `features_input`: the configurations
    (models.features.REQUIRED_CONFIG: architecture, layout, resolved hardware; optional columns listed
    there). A `models.search.search` result frame serves as both. Raises models.features.FeatureError for
    missing columns, unknown hardware (null hardware columns) and null/NaN/non-positive values."""
    if "tokens_per_s_per_gpu" not in analytical.columns:
        raise FeatureError("analytical: missing column tokens_per_s_per_gpu")
    validate(analytical, features_input)
    X = build_features(analytical, features_input, check=True)
    shift = _model_predict(bundle.model, X)
    sig = conformal.sigma(bundle.novelty.distance(X), bundle.kappa)
    width = bundle.q * sig
    step = analytical["step_time_s"].cast(pl.Float64).to_numpy() * np.exp(-shift)
    tput = analytical["tokens_per_s_per_gpu"].cast(pl.Float64).to_numpy() * np.exp(shift)
    return pl.DataFrame({
        "step_time_s": step, "step_time_lo_s": step * np.exp(-width), "step_time_hi_s": step * np.exp(width),
        "tokens_per_s_per_gpu": tput, "tokens_per_s_per_gpu_lo": tput * np.exp(-width),
        "tokens_per_s_per_gpu_hi": tput * np.exp(width),
        "fit_version": [bundle.version] * len(step),
    })
