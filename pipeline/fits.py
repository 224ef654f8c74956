"""Versioned calibration fits in the store: `fits`, `fit_metrics`, `fit_artifacts`, `calibrated_predictions`.

- `fits`: one row per fit version (hash of data, code parameters and the model code, models.fitting.calibration.fit_version):
  `version, created_at, promoted, promoted_at, model_kind, physical_params` (JSON of the fitted PhysParams),
  `preset_overrides` (JSON), `cv_scheme` ('leave-one-source-out'), `mdape, mape, within_10pct, coverage_90,
  median_width` (fractions, of the calibrated predictions under that scheme), `analytical_mdape`,
  `physics_mdape`, `loho_mdape, loho_coverage_90`, `kappa, q`, `n_train, n_sources, n_hardware`,
  `features, hyperparameters` (JSON), `code_version`, `promotion_reason`, `promotion_detail` (JSON: the
  comparison behind the decision).
- `fit_metrics`: per version x scheme (loso, loho, vtrain_multi_lomso) x grouping x group x predictor
  (analytical, physics, ridge, gbm, calibrated): n_runs, mdape, mape, within_10pct, coverage_90, median_width,
  mdape_balanced, mape_balanced (every source of the group weighing the same).
- `fit_artifacts`: version, format ('pickle'), sklearn_version, n_bytes, bytes (BLOB): the serialized
  models.fitting.calibration.CalibrationBundle. It is unpickled only from this store (a file we wrote).
- `fit_oof`: per version x scheme x run: `fold` (the held-out group the run was predicted from), `log_pred`
  (out-of-fold calibrated log tokens/s/GPU), `log_target` (measured): what promotion compares.
- `calibrated_predictions`: per measured run, predictions of the promoted fit (see `calibrated_frame`).

Promotion (`promotion_decision`), on equal terms: a new version is compared with the served (promoted) one
per validation protocol (loso, loho and any other scheme both have out-of-fold rows for), on the runs BOTH
were scored on, each against today's measured target. It is refused when, on any protocol, its MdAPE there
(every source weighing the same, so the 1,440 runs of one source do not decide alone) exceeds the served fit's
by more than the noise margin: one standard error of the served fit's score, estimated from its fold-to-fold
spread (sd of the per-fold MdAPE / sqrt(folds); the "one-standard-error rule" of Hastie, Tibshirani &
Friedman, The Elements of Statistical Learning, 2nd ed., section 7.10; a scheme with one fold, like `scale`,
takes the median's distribution-free standard error, `median_standard_error`). It is also refused when the runs
new since the served fit contradict it: more of them lie outside the served fit's own 90% conformal interval
than its stated 10% miss rate allows (one-sided binomial test, p < SURPRISE_P).
Otherwise it is promoted. The candidate's own out-of-fold score on the new runs is reported beside. A refused
version is kept with `promoted = false` and the reason; `stepcast fit --promote VERSION` (`promote`) lets a
person decide. Re-fitting the same data with the same model code (every `.py` file under `models/`) gives the same version:
the stored row is reused, nothing is duplicated.
"""

from __future__ import annotations

import datetime as dt
import json
import pickle
from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from models.corpus.evaluate import predict_runs, prepare_configs
from models.fitting import calibration as cal
from models.fitting.calibration import (
    FIT_CODE_VERSION,
    HYPER,
    source_weights,
    weighted_median,
)
from models.corpus.recipes import Recipes
from models.fitting.predictor import FEATURE_NAMES, predict
from pipeline import adaptation, catalog, store
from pipeline.parallel import pool_map
from pipeline.settings import Settings

CV_SCHEME = "leave-one-source-out"


#: one-sided binomial p-value below which the runs new since the served fit are taken to contradict it: a drop
#: that the served fit's interval describes correctly is refused about once in a hundred drops (runs of one
#: drop share a source, so their misses are correlated and false refusals are somewhat more frequent)
SURPRISE_P = 0.01
OOF_SCHEMES = {"loso": "loso_tokens_per_s_per_gpu", "loho": "loho_tokens_per_s_per_gpu"}


def _ensure(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("""CREATE TABLE IF NOT EXISTS fits (
        version VARCHAR PRIMARY KEY, created_at TIMESTAMP, promoted BOOLEAN, promoted_at TIMESTAMP,
        model_kind VARCHAR, physical_params VARCHAR, preset_overrides VARCHAR, cv_scheme VARCHAR,
        mdape DOUBLE, mape DOUBLE, within_10pct DOUBLE, coverage_90 DOUBLE, median_width DOUBLE,
        analytical_mdape DOUBLE, physics_mdape DOUBLE, loho_mdape DOUBLE, loho_coverage_90 DOUBLE,
        kappa DOUBLE, q DOUBLE, n_train BIGINT, n_sources BIGINT, n_hardware BIGINT, features VARCHAR,
        hyperparameters VARCHAR, code_version VARCHAR, promotion_reason VARCHAR)""")
    # the comparison behind the decision (JSON: served version, per-scheme scores, new-run test)
    con.execute("ALTER TABLE fits ADD COLUMN IF NOT EXISTS promotion_detail VARCHAR")
    con.execute("""CREATE TABLE IF NOT EXISTS fit_metrics (
        version VARCHAR, scheme VARCHAR, grouping VARCHAR, "group" VARCHAR, predictor VARCHAR, n_runs BIGINT,
        mdape DOUBLE, mape DOUBLE, within_10pct DOUBLE, coverage_90 DOUBLE, median_width DOUBLE)""")
    # the same with every source weighing the same (models.fitting.calibration._metrics); null in rows of older fits
    con.execute("ALTER TABLE fit_metrics ADD COLUMN IF NOT EXISTS mdape_balanced DOUBLE")
    con.execute("ALTER TABLE fit_metrics ADD COLUMN IF NOT EXISTS mape_balanced DOUBLE")
    # the k-shot protocol's rows (scheme 'kshot'): how many of a unit's runs adapted the fit; null elsewhere
    con.execute("ALTER TABLE fit_metrics ADD COLUMN IF NOT EXISTS k_shot BIGINT")
    # the scaling-efficiency rows (grouping 'scaling_series', models.fitting.scaling): per series the measured and
    # predicted per-GPU throughput at its largest cluster over its smallest and their |difference|; in the row
    # 'ALL' the mean and the largest |difference| over the series and how many series; null elsewhere
    for col, kind in (("efficiency_measured", "DOUBLE"), ("efficiency_predicted", "DOUBLE"),
                      ("efficiency_abs_error", "DOUBLE"), ("efficiency_max_abs_error", "DOUBLE"),
                      ("n_series", "BIGINT")):
        con.execute(f"ALTER TABLE fit_metrics ADD COLUMN IF NOT EXISTS {col} {kind}")
    con.execute("""CREATE TABLE IF NOT EXISTS fit_artifacts (
        version VARCHAR PRIMARY KEY, format VARCHAR, sklearn_version VARCHAR, n_bytes BIGINT, bytes BLOB)""")
    con.execute("""CREATE TABLE IF NOT EXISTS fit_oof (
        version VARCHAR, scheme VARCHAR, run_id VARCHAR, fold VARCHAR, log_pred DOUBLE, log_target DOUBLE)""")


# ---------------------------------------------------------------- out-of-fold rows and the promotion rule

def oof_long(report: dict, data) -> pl.DataFrame:
    """Per-run out-of-fold rows (scheme, run_id, fold, log_pred, log_target) of a fit report: the report's
    `oof_long` when models.fitting.calibration gives it, else derived from `oof` and `folds` (loso and loho)."""
    schema = {"scheme": pl.Utf8, "run_id": pl.Utf8, "fold": pl.Utf8, "log_pred": pl.Float64, "log_target": pl.Float64}
    finite = pl.col("log_pred").is_finite() & pl.col("log_target").is_finite()  # a run its scheme never held out
    if report.get("oof_long") is not None:
        return report["oof_long"].select([pl.col(c).cast(t) for c, t in schema.items()]).filter(finite)
    oof = report.get("oof")
    if oof is None:
        return pl.DataFrame(schema=schema)
    target = pl.DataFrame({"run_id": data.run_id.astype(str), "log_target": data.log_target})
    parts = []
    for scheme, col in OOF_SCHEMES.items():
        folds = report.get("folds", {}).get(scheme)
        if col not in oof.columns or folds is None:
            continue
        parts.append(oof.select(pl.lit(scheme).alias("scheme"), pl.col("run_id").cast(pl.Utf8),
                                pl.col("run_id").cast(pl.Utf8).replace_strict(folds, default=None).alias("fold"),
                                pl.col(col).log().alias("log_pred")).join(target, on="run_id", how="left"))
    out = pl.concat(parts) if parts else pl.DataFrame(schema=schema)
    return out.select([pl.col(c).cast(t) for c, t in schema.items()]).filter(finite)


def _abs_rel(pred: str, target: str = "log_target") -> pl.Expr:
    return ((pl.col(pred) - pl.col(target)).exp() - 1.0).abs()


def compare_on_equal_terms(candidate: pl.DataFrame, served: pl.DataFrame) -> list[dict]:
    """Per scheme both have rows for: the MdAPE of each on the runs both were scored on (against the
    candidate's, i.e. today's, target), the noise margin (one standard error of the served fit's MdAPE from
    its per-fold spread on those runs), whether the candidate is worse by more than it, and the candidate's
    own out-of-fold MdAPE on the runs the served fit never saw."""
    out = []
    seen = set(served["run_id"].to_list())
    for scheme in sorted(set(candidate["scheme"].to_list()) & set(served["scheme"].to_list())):
        cand = candidate.filter(pl.col("scheme") == scheme)
        both = served.filter(pl.col("scheme") == scheme).select("run_id", "fold", pl.col("log_pred").alias("served")) \
            .join(cand.select("run_id", "log_pred", "log_target"), on="run_id", how="inner") \
            .with_columns(_abs_rel("served").alias("e_served"), _abs_rel("log_pred").alias("e_cand"))
        new = cand.filter(~pl.col("run_id").is_in(list(seen)))
        row = {"scheme": scheme, "n_common": both.height, "n_new": new.height,
               "candidate_new_mdape": float(new.select(_abs_rel("log_pred").median()).item()) if new.height else None}
        if both.height:
            per_fold = both.group_by("fold").agg(pl.col("e_served").median())["e_served"].to_numpy()
            margin = float(np.std(per_fold, ddof=1) / np.sqrt(len(per_fold))) if len(per_fold) > 1 else \
                median_standard_error(both["e_served"].to_numpy())
            if "source" in cand.columns:  # every source weighs the same (models.fitting.calibration._metrics)
                both = both.join(cand.select("run_id", "source"), on="run_id", how="left")
                w = source_weights(both["source"].to_numpy())
                served_mdape = weighted_median(both["e_served"].to_numpy(), w)
                cand_mdape = weighted_median(both["e_cand"].to_numpy(), w)
            else:
                served_mdape, cand_mdape = float(both["e_served"].median()), float(both["e_cand"].median())
            row.update(served_mdape=served_mdape, candidate_mdape=cand_mdape, margin=margin,
                       n_folds=int(len(per_fold)), worse=bool(cand_mdape > served_mdape + margin))
        out.append(row)
    return out


def median_standard_error(x: np.ndarray) -> float:
    """Standard error of the median of `x` without assuming a distribution, for a scheme with one fold (no
    fold-to-fold spread): half the distance between the order statistics of rank n/2 -+ sqrt(n)/2, the ranks
    of the median's 68% confidence interval (the number of values below the median is Binomial(n, 1/2), sd
    sqrt(n)/2; Conover, Practical Nonparametric Statistics, 3rd ed., section 3.2)."""
    x = np.sort(np.asarray(x, dtype=float))
    n = len(x)
    if n < 2:
        return 0.0
    lo = int(np.clip(np.floor(n / 2 - np.sqrt(n) / 2), 0, n - 1))
    hi = int(np.clip(np.ceil(n / 2 + np.sqrt(n) / 2), 0, n - 1))
    return float((x[hi] - x[lo]) / 2)


def new_runs_surprise(served_on_new: pl.DataFrame | None, alpha: float) -> dict | None:
    """How the served fit did on the runs new since it: of `n_new` runs with a prediction, `n_outside` lie
    outside its (1 - alpha) interval; `p_value` = P(X >= n_outside) for X ~ Binomial(n_new, alpha), the
    chance of that many misses if the interval is as good as the served fit states."""
    if served_on_new is None or served_on_new.height == 0:
        return None
    judged = served_on_new.filter(pl.col("covered").is_not_null())
    n, k = judged.height, int((~judged["covered"]).sum())
    if n == 0:
        return None
    from scipy.stats import (
        binom,  # ~0.9 s to import: only when there are new runs to judge (not in a first fit)
    )

    rel = judged.select((pl.col("tokens_per_s_per_gpu") / pl.col("measured_tokens_per_s_per_gpu") - 1).abs().median())
    p = float(binom.sf(k - 1, n, alpha)) if k else 1.0
    return {"n_new": n, "n_outside": k, "alpha": alpha, "p_value": p, "served_mdape_new": float(rel.item()),
            "contradicts": p < SURPRISE_P}


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def promotion_decision(served_version: str | None, candidate: pl.DataFrame, served: pl.DataFrame,
                       surprise: dict | None) -> tuple[bool, str, dict]:
    """(promote, reason, detail) for a candidate's out-of-fold rows against the served fit's (see the module
    docstring for the rule)."""
    detail: dict = {"served": served_version, "schemes": [], "new_runs": surprise}
    if served_version is None:
        return True, "first fit", detail
    if candidate.height == 0:
        return False, f"not promoted: no out-of-fold rows to compare with the served fit {served_version}", detail
    if served.height == 0:
        return True, (f"promoted: the served fit {served_version} has no stored out-of-fold rows (fitted before "
                      f"fit_oof existed), so no comparison on equal terms is possible"), detail
    comps = compare_on_equal_terms(candidate, served)
    detail["schemes"] = comps
    scored = [c for c in comps if c["n_common"]]
    if not scored:
        return False, f"not promoted: no scheme and run in common with the served fit {served_version}", detail
    terms = "; ".join(f"{c['scheme']} {_pct(c['candidate_mdape'])} vs {_pct(c['served_mdape'])} "
                      f"+ {_pct(c['margin'])} on {c['n_common']} runs" for c in scored)
    worse = [c for c in scored if c["worse"]]
    new = ""
    if surprise is not None:
        new = (f"{surprise['n_outside']} of {surprise['n_new']} new runs outside the served fit's "
               f"{1 - surprise['alpha']:.0%} interval (binomial p = {surprise['p_value']:.2g}; served MdAPE on them "
               f"{_pct(surprise['served_mdape_new'])}, candidate's out-of-fold "
               f"{_pct(next((c['candidate_new_mdape'] for c in comps if c['scheme'] == 'loso'), None))})")
    why = []
    if surprise is not None and surprise["contradicts"]:
        why.append(f"the runs new since the served fit {served_version} contradict it: {new}")
    if worse:
        why.append(f"worse than the served fit {served_version} on equal terms on "
                   f"{', '.join(c['scheme'] for c in worse)} (MdAPE on the runs both were scored on, candidate vs "
                   f"served + one standard error)")
    if why:
        return False, (f"not promoted: {'; and '.join(why)}; a person decides (stepcast fit --promote VERSION). "
                       f"Equal terms: {terms}"), detail
    new = f"; {new}" if new else ""
    return True, f"promoted: not worse than the served fit {served_version} on equal terms: {terms}{new}", detail


def stored_oof(con: duckdb.DuckDBPyConnection, version: str) -> pl.DataFrame:
    return con.execute("select scheme, run_id, fold, log_pred, log_target from fit_oof where version = ?",
                       [version]).pl()


def load_fit(con: duckdb.DuckDBPyConnection, version: str):
    if not store.table_exists(con, "fit_artifacts"):
        return None
    row = con.execute("select bytes from fit_artifacts where version = ?", [version]).fetchone()
    if not row:
        return None
    try:
        return pickle.loads(row[0])
    except (AttributeError, ModuleNotFoundError, ImportError, pickle.UnpicklingError):
        return None  # written by an older code version whose classes are gone: it cannot be served


def load_promoted_fit(con: duckdb.DuckDBPyConnection):
    """The promoted models.fitting.calibration.CalibrationBundle of a store or snapshot, or None if there is none.
    `bundle.params` are the fitted PhysParams (`bundle.params_for(preset)` for a software preset)."""
    if not (store.table_exists(con, "fits") and store.table_exists(con, "fit_artifacts")):
        return None
    row = con.execute("select version from fits where promoted order by promoted_at desc limit 1").fetchone()
    return load_fit(con, row[0]) if row else None


def fit_summary(bundle, report, data) -> dict:
    m = report["metrics"]

    def pick(scheme, predictor, col):
        r = m.filter((pl.col("scheme") == scheme) & (pl.col("grouping") == "source") & (pl.col("group") == "ALL")
                     & (pl.col("predictor") == predictor))
        return float(r[col][0]) if r.height and r[col][0] is not None else None

    return {
        "version": bundle.version, "model_kind": bundle.model_kind,
        "physical_params": json.dumps(bundle.params.to_dict(), sort_keys=True),
        "preset_overrides": json.dumps(bundle.preset_overrides, sort_keys=True), "cv_scheme": CV_SCHEME,
        "mdape": pick("loso", "calibrated", "mdape"), "mape": pick("loso", "calibrated", "mape"),
        "within_10pct": pick("loso", "calibrated", "within_10pct"),
        "coverage_90": pick("loso", "calibrated", "coverage_90"),
        "median_width": pick("loso", "calibrated", "median_width"),
        "analytical_mdape": pick("loso", "analytical", "mdape"), "physics_mdape": pick("loso", "physics", "mdape"),
        "loho_mdape": pick("loho", "calibrated", "mdape"), "loho_coverage_90": pick("loho", "calibrated",
                                                                                     "coverage_90"),
        "kappa": float(bundle.kappa), "q": float(bundle.q), "n_train": data.configs.height,
        "n_sources": int(data.configs["source"].n_unique()), "n_hardware": int(data.configs["gpu"].n_unique()),
        "features": json.dumps(list(FEATURE_NAMES)), "hyperparameters": json.dumps(HYPER, sort_keys=True),
        "code_version": FIT_CODE_VERSION,
    }


def served_version(con: duckdb.DuckDBPyConnection) -> str | None:
    if not store.table_exists(con, "fits"):
        return None
    row = con.execute("select version from fits where promoted order by promoted_at desc limit 1").fetchone()
    return row[0] if row else None


def sklearn_version() -> str:
    """The installed scikit-learn's version (`sklearn.__version__`), read from its package metadata: importing
    scikit-learn only for this took 1.5-3 s of the build (the fit itself runs on numpy and scipy)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scikit-learn")
    except PackageNotFoundError:  # not installed as a distribution: ask the module
        import sklearn

        return sklearn.__version__


def save_fit(con: duckdb.DuckDBPyConnection, bundle, report, data, now: dt.datetime | None = None,
             served_on_new: pl.DataFrame | None = None) -> dict:
    """Store a fit (row, per-group metrics, out-of-fold rows, artifact) and apply the promotion rule, in one
    transaction. `served_on_new`: the served fit's calibrated predictions (`calibrated_frame`) of the runs
    new since it. Returns the stored `fits` row as a dict."""
    _ensure(con)
    now = now or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    row = fit_summary(bundle, report, data)
    existing = con.execute("select version from fits where version = ?", [row["version"]]).fetchone()
    if existing:
        return stored_fit(con, row["version"])
    oof = oof_long(report, data)
    cur = served_version(con)
    served = stored_oof(con, cur) if cur else oof.clear()
    served_bundle = load_fit(con, cur) if cur else None
    surprise = new_runs_surprise(served_on_new, getattr(served_bundle, "alpha", None) or 0.10)
    sources = pl.DataFrame({"run_id": data.run_id.astype(str), "source": data.group("source").astype(str)})
    promote, reason, detail = promotion_decision(cur, oof.join(sources, on="run_id", how="left"), served, surprise)
    blob = pickle.dumps(bundle, protocol=pickle.HIGHEST_PROTOCOL)
    con.execute("BEGIN TRANSACTION")
    try:
        if promote:
            con.execute("update fits set promoted = false where promoted")
        cols = ["version", "created_at", "promoted", "promoted_at"] + [k for k in row if k != "version"] + [
            "promotion_reason", "promotion_detail"]
        vals = [row["version"], now, promote, now if promote else None] + [row[k] for k in row if k != "version"] + [
            reason, json.dumps(detail, default=float)]
        con.execute(f"insert into fits ({', '.join(cols)}) values ({', '.join('?' * len(cols))})", vals)
        _insert_rows(con, row["version"], report, oof)
        con.execute("insert into fit_artifacts values (?, 'pickle', ?, ?, ?)",
                    [row["version"], sklearn_version(), len(blob), blob])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return stored_fit(con, row["version"])


def _insert_rows(con: duckdb.DuckDBPyConnection, version: str, report: dict, oof: pl.DataFrame) -> None:
    """A version's fit_metrics and fit_oof rows (replacing any stored ones)."""
    m = report["metrics"]
    optional = {"k_shot": pl.Int64, "efficiency_measured": pl.Float64, "efficiency_predicted": pl.Float64,
                "efficiency_abs_error": pl.Float64, "efficiency_max_abs_error": pl.Float64, "n_series": pl.Int64}
    metrics = m.with_columns(pl.lit(version).alias("version")).select(
        "version", "scheme", "grouping", "group", "predictor", "n_runs", "mdape", "mape", "within_10pct",
        "coverage_90", "median_width", "mdape_balanced", "mape_balanced",
        *[pl.col(c).cast(t) if c in m.columns else pl.lit(None, dtype=t).alias(c) for c, t in optional.items()])
    for table, frame in (("fit_metrics", metrics), ("fit_oof", oof.select(pl.lit(version).alias("version"), pl.all()))):
        con.execute(f"delete from {table} where version = ?", [version])
        con.register("_rows", frame.to_arrow())
        con.execute(f"insert into {table} select * from _rows")
        con.unregister("_rows")


def promote(con: duckdb.DuckDBPyConnection, version: str, by: str = "stepcast fit --promote") -> dict:
    """A person's decision: serve the stored fit `version` (whatever the rule said), rewrite
    `calibrated_predictions` with it. Raises KeyError for a version not in the store."""
    _ensure(con)
    row = con.execute("select promoted, promotion_reason from fits where version = ?", [version]).fetchone()
    if row is None or load_fit(con, version) is None:
        known = [r[0] for r in con.execute("select version from fits order by created_at desc limit 5").fetchall()]
        raise KeyError(f"no stored fit {version!r} (latest: {', '.join(known) or 'none'})")
    prev = served_version(con)
    if prev != version:
        now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute("update fits set promoted = false where promoted")
            con.execute("update fits set promoted = true, promoted_at = ?, promotion_reason = ? where version = ?",
                        [now, f"promoted by hand ({by}) in place of {prev}; the rule had said: {row[1]}", version])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    write_calibrated(con)
    return stored_fit(con, version)


def write_calibrated(con: duckdb.DuckDBPyConnection, oof: pl.DataFrame | None = None,
                     recipes: Recipes | None = None) -> None:
    """Rewrite `calibrated_predictions` with the promoted fit (`oof`: that fit's report['oof'], if at hand;
    `recipes`: `input_recipes()` unless given)."""
    runs, hw, metrics = read_inputs(con)
    recipes = recipes if recipes is not None else input_recipes()
    ok, _ = prepare_configs(runs, hw, recipes)
    targets = predict_runs(runs, hw, metrics, recipes)
    bundle = load_promoted_fit(con)
    _write_served(con, bundle, calibrated_frame(bundle, ok, targets, oof))


def _write_served(con: duckdb.DuckDBPyConnection, bundle, frame: pl.DataFrame) -> None:
    """`calibrated_predictions` (the served fit's prediction of every run) and `source_adaptations` (each source's
    adaptation of the served fit from its runs, pipeline.adaptation: what `--source NAME` answers with)."""
    store.replace_table(con, "calibrated_predictions", frame)
    store.replace_table(con, adaptation.TABLE, adaptation.source_table(frame, getattr(bundle, "adaptation_rule", None),
                                                 getattr(bundle, "version", None)))


def fit_status(con: duckdb.DuckDBPyConnection) -> dict:
    """{'served': row, 'latest': row} of the promoted fit and the most recent fit (version, n_train, created_at,
    promoted, promoted_at, promotion_reason, LOSO/LOHO MdAPE), or {} when the store has no fits."""
    if not store.table_exists(con, "fits"):
        return {}
    cols = "version, n_train, created_at, promoted, promoted_at, promotion_reason, mdape, loho_mdape"
    out = {}
    for role, where in (("served", "where promoted order by promoted_at desc"), ("latest", "order by created_at desc")):
        cur = con.execute(f"select {cols} from fits {where} limit 1")
        row = cur.fetchone()
        if row is not None:
            out[role] = {d[0]: (str(v) if isinstance(v, dt.datetime) else v) for d, v in zip(cur.description, row)}
    return out


def stored_fit(con: duckdb.DuckDBPyConnection, version: str) -> dict:
    cur = con.execute("select * from fits where version = ?", [version])
    names = [d[0] for d in cur.description]
    return dict(zip(names, cur.fetchone()))


def read_inputs(con: duckdb.DuckDBPyConnection) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(runs, hardware, run_metrics) of a store, as every store-side prediction reads them (the fit, the calibrated
    and analytical predictions): runs carry their architecture's hybrid block pattern and Mamba shape, the columns
    `predict --runs` takes from the architecture table too (`pipeline.catalog.with_architecture_extras`)."""
    runs = con.sql("select * from runs").pl()
    if store.table_exists(con, "architectures"):
        runs = catalog.with_architecture_extras(runs, con.sql("select * from architectures").pl())
    hw = con.sql("select * from hardware").pl()
    metrics = con.sql("select run_id, metric, value, derived, notes, n_gpus, seq_len, global_batch_seqs "
                      "from run_metrics").pl()
    return runs, hw, metrics


def input_recipes(measurements: Path | None = None) -> Recipes:
    """What the runs' named recipes set, as every store-side prediction reads it (the fit, the calibrated and
    analytical predictions): the recipe tables of `measurements` (default: the settings' measurements root, the one
    `stepcast build` fills the store from), `pipeline.catalog.recipes`."""
    return catalog.recipes(measurements or Settings.load().measurements)


def run_fit(con: duckdb.DuckDBPyConnection, protocols=None, force: bool = False,
            recipes: Recipes | None = None) -> dict:
    """Fit on the store's runs (unless this exact version is already stored and `force` is False), store it
    with the promotion decision, rewrite `calibrated_predictions` with the promoted fit. `recipes`: what the runs'
    named recipes set (`input_recipes()` unless given). Returns {'fit': row, 'reused': bool, 'metrics': fit_metrics
    rows of this version, 'promoted': served version}."""
    protocols = tuple(protocols or cal.PROTOCOLS)
    runs, hw, metrics = read_inputs(con)
    recipes = recipes if recipes is not None else input_recipes()
    prepared = prepare_configs(runs, hw, recipes)
    ok = prepared[0]
    targets = predict_runs(runs, hw, metrics, recipes, prepared=prepared)
    data = cal.fit_data(ok, targets.select("run_id", "measured_tokens_per_s_per_gpu", "whole_run_average"))
    version = cal.fit_version(data)
    _ensure(con)
    stored = bool(con.execute("select count(*) from fits where version = ?", [version]).fetchone()[0])
    reused = stored and not force
    oof = None
    if not reused:
        bundle, report = cal.fit_calibration(data, protocols=protocols, map_fn=pool_map)
        if stored:  # a forced re-fit of stored data: fresh metrics and out-of-fold rows, the decision stands
            _insert_rows(con, version, report, oof_long(report, data))
        else:
            save_fit(con, bundle, report, data, served_on_new=_served_on_new_runs(con, ok, targets, data))
        oof = report["oof"]
    promoted = load_promoted_fit(con)
    frame = calibrated_frame(promoted, ok, targets, oof if promoted is not None and promoted.version == version
                             else None)
    _write_served(con, promoted, frame)
    fm = con.execute("select * from fit_metrics where version = ?", [version]).pl()
    return {"fit": stored_fit(con, version), "reused": reused, "metrics": fm, "promoted": promoted.version
            if promoted is not None else None}


def _served_on_new_runs(con: duckdb.DuckDBPyConnection, configs: pl.DataFrame, targets: pl.DataFrame,
                        data) -> pl.DataFrame | None:
    """The served fit's calibrated predictions (with its interval) of the fit data's runs it was not fitted
    on (its fit_oof rows name the runs it saw); None without a served fit or its out-of-fold rows."""
    cur = served_version(con)
    if cur is None:
        return None
    seen = {r[0] for r in con.execute("select distinct run_id from fit_oof where version = ?", [cur]).fetchall()}
    bundle = load_fit(con, cur)
    if not seen or bundle is None:
        return None
    new = [r for r in data.run_id.astype(str).tolist() if r not in seen]
    if not new:
        return None
    return calibrated_frame(bundle, configs.filter(pl.col("run_id").is_in(new)),
                            targets.filter(pl.col("run_id").is_in(new)), None)


def calibrated_frame(bundle, configs: pl.DataFrame, targets: pl.DataFrame, oof: pl.DataFrame | None) -> pl.DataFrame:
    """One row per predictable measured run: analytical (prior physics), physics (fitted), calibrated with its
    90% interval, the measured target and the error; `loso_*` = the out-of-source prediction of the same fit
    (the honest number for runs like these from a source the fit has not seen)."""
    base = targets.select("run_id", "source", "gpu", pl.col("step_time_s").alias("analytical_step_time_s"),
                          pl.col("tokens_per_s_per_gpu").alias("analytical_tokens_per_s_per_gpu"),
                          "measured_tokens_per_s_per_gpu", "measured_step_time_s", "target_kind",
                          pl.col("target_derived").fill_null(False), pl.col("whole_run_average").fill_null(False))
    if bundle is None:
        return base.with_columns(pl.lit(None, dtype=pl.Utf8).alias("fit_version"))
    res = predict(configs, bundle)  # the one prediction function, as every command serves it
    valid = res["step_time_s"].is_not_null()
    cal = res.filter(valid)
    out = configs.filter(valid).select("run_id").hstack(cal.select(
        pl.col("analytical_step_time_s").alias("physics_step_time_s"), "feasible", "step_time_s", "step_time_lo_s",
        "step_time_hi_s", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi",
        "fit_version", "calibration_domain"))
    out = base.join(out, on="run_id", how="inner")
    if oof is not None:
        out = out.join(oof, on="run_id", how="left")
    return out.with_columns(
        (pl.col("tokens_per_s_per_gpu") / pl.col("measured_tokens_per_s_per_gpu") - 1.0).alias("rel_error"),
        ((pl.col("measured_tokens_per_s_per_gpu") >= pl.col("tokens_per_s_per_gpu_lo"))
         & (pl.col("measured_tokens_per_s_per_gpu") <= pl.col("tokens_per_s_per_gpu_hi"))).alias("covered"),
    ).sort("run_id")
