"""A cluster and stack learned from a handful of its runs: the served fit adapted to one source's measurements.

The runs a source measured (a user's cluster, a team, a publication) are off the served fit by nearly the same
factor (the held-out figures of the k-shot protocol below show a level per source, not a per-part pattern: a
compute-versus-communication split of that level predicts no better). So the adaptation is one named quantity,
the source's **throughput factor** `exp(level)`: measured / predicted throughput of its runs, estimated by partial
pooling toward the global fit (level 0), a ridge regression on a constant:

    level = sum(e) / (k + a),   a = alpha * s2 / sigma2

with `e` the k runs' log errors log(measured / predicted tokens/s/GPU). This is the posterior mean of a level with
a normal prior around the global fit: `alpha` is the within-source over between-source variance of the transfer
protocol (one run moves the answer little, five runs more); `s2` is the source's own spread of its errors pooled
with the protocol's (`sigma2`, with `prior_dof` degrees of freedom), so runs that agree closely are trusted more
than runs that scatter.

The interval after k runs is the protocol's own: the 90% quantile of the held-out log errors of adapted
predictions of sources never in the fit, every unit weighing the same (`AdaptationRule.q_by_k`). It replaces the
unadapted interval, which describes a source the fit has never seen.

**The k-shot protocol** (`kshot_protocol`): each unit (a source's runs on one accelerator with one stack: the
cluster and stack a user brings) with at least `MIN_UNIT_RUNS` runs, predicted by the fit that never saw its
source (leave one source out); k of its runs (k in `KS`, `DRAWS` seeded draws) adapt it, the rest are predicted.
`select_rule` chooses alpha and prior_dof on it (every unit weighing the same) and measures the interval by
leaving one unit out (scikit-learn's `LeaveOneGroupOut`): the quantile is taken on the other units.

Serving (`apply_adaptation`) multiplies the step, its parts and the throughput figures of the one prediction
function's outputs by the factor: vectorized, no per-row work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from models.fitting.bounds import bound_interval
from models.physics.step_time import BREAKDOWN

KS = (0, 1, 3, 5)
DRAWS = 20
# a unit enters the protocol with at least max(KS) + 3 runs, so that every k leaves runs to predict
MIN_UNIT_RUNS = max(KS) + 3
ALPHA_GRID = (0.25, 0.5, 1.0, 2.0, 4.0)
PRIOR_DOF_GRID = (1.0, 2.0, 4.0, math.inf)
COVERAGE = 0.90
#: the k whose error `select_rule` minimizes: the mean over these of the units-equal MdAPE
SELECT_KS = (1, 3, 5)


@dataclass(frozen=True)
class AdaptationRule:
    """How a source's runs move the served fit, as the k-shot protocol chose and measured it."""

    alpha: float  # within-source / between-source variance ratio of the log errors (the shrinkage at k runs)
    prior_dof: float  # degrees of freedom of the protocol's spread in a source's pooled spread (inf: ignore its own)
    sigma2: float  # the protocol's within-unit variance of log errors
    q_by_k: tuple = ()  # ((k, 90% half-width of log throughput), ...) from the protocol, leave-one-unit-out
    n_units: int = 0
    n_runs: int = 0

    def half_width(self, n_runs: int) -> float | None:
        """The 90% half-width (log) of a prediction adapted with `n_runs` runs: the protocol's at the largest k
        of `KS` not above n_runs (None when the protocol measured none)."""
        ks = [(k, q) for k, q in self.q_by_k if k <= n_runs]
        return ks[-1][1] if ks else None


@dataclass(frozen=True)
class Adaptation:
    """One source's adaptation: its throughput factor over the served fit and the interval it earns."""

    name: str  # the source (or the file the runs came from)
    n_runs: int  # runs that adapted it
    level: float  # log of the throughput factor (measured / served prediction), shrunk toward 0
    raw_level: float  # the unshrunk mean log error of those runs (what the runs alone say)
    half_width: float | None  # 90% half-width of log throughput after n_runs runs (None: keep the fit's)
    fit_version: str | None = None
    run_errors: tuple = field(default=(), compare=False)  # each run's log error (for reports)

    @property
    def throughput_factor(self) -> float:
        return math.exp(self.level)

    def describe(self) -> str:
        """One sentence for `assumptions`: how many runs adapted the fit and by how much."""
        pct = 100.0 * (self.throughput_factor - 1.0)
        raw = 100.0 * (math.exp(self.raw_level) - 1.0)
        width = "" if self.half_width is None else (f"; its 90% interval is the k-shot protocol's after "
                                                    f"{min(self.n_runs, max(KS))} run(s), x/{math.exp(self.half_width):.2f}")
        return (f"adapted to {self.name} from {self.n_runs} run(s): throughput factor {self.throughput_factor:.3f} "
                f"({pct:+.1f}%; the runs alone say {raw:+.1f}%, shrunk toward the global fit){width}")


def _penalty(e: np.ndarray, alpha: float, prior_dof: float, sigma2: float) -> float:
    """The ridge penalty a of errors `e`: alpha scaled by their own spread pooled with the protocol's `sigma2` over
    `prior_dof` degrees of freedom (alpha itself without a finite prior_dof or a spread)."""
    if math.isinf(prior_dof) or sigma2 <= 0:
        return alpha
    k = len(e)
    ss = float(((e - e.mean()) ** 2).sum()) if k > 1 else 0.0
    return alpha * (prior_dof * sigma2 + ss) / (prior_dof + k - 1) / sigma2


def _level(e: np.ndarray, alpha: float, prior_dof: float, sigma2: float) -> float:
    """The partially pooled level of errors `e` (see the module docstring): sum(e) / (k + a); 0 without errors."""
    return float(e.sum() / (len(e) + _penalty(e, alpha, prior_dof, sigma2))) if len(e) else 0.0


def shrinkage_penalty(errors: np.ndarray, rule: AdaptationRule) -> float:
    """The ridge penalty a of these errors under `rule` (alpha scaled by their pooled spread)."""
    return _penalty(np.asarray(errors, dtype=float), rule.alpha, rule.prior_dof, rule.sigma2)


def adapt(errors, rule: AdaptationRule, name: str, fit_version: str | None = None) -> Adaptation:
    """The adaptation of one source from its runs' log errors (log measured / served predicted throughput): the
    ridge regression on a constant with the rule's penalty, in closed form sum(e) / (k + a) (scikit-learn's `Ridge`
    gives the same number, a test checks it; importing it would cost a command two seconds). Raises ValueError
    without a run."""
    e = np.asarray(errors, dtype=float)
    e = e[np.isfinite(e)]
    if not len(e):
        raise ValueError(f"{name}: no run with both a measurement and a prediction to adapt the fit with")
    level = _level(e, rule.alpha, rule.prior_dof, rule.sigma2)
    return Adaptation(name=name, n_runs=len(e), level=level, raw_level=float(e.mean()),
                      half_width=rule.half_width(len(e)), fit_version=fit_version, run_errors=tuple(e.tolist()))


#: the outputs the throughput factor divides (times) and multiplies (rates)
TIME_COLUMNS = ("step_time_s", "step_time_lo_s", "step_time_hi_s", *BREAKDOWN)
RATE_COLUMNS = ("tokens_per_s_per_gpu", "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "mfu", "hfu")


def apply_adaptation(out: Mapping[str, np.ndarray], ad: Adaptation) -> dict[str, np.ndarray]:
    """The outputs of the one prediction function with `ad` applied: every time divided by the throughput factor,
    every rate multiplied by it, and the interval the protocol measured after `ad.n_runs` runs (when it has one)."""
    res = dict(out)
    f = math.exp(ad.level)
    for c in TIME_COLUMNS:
        if c in res:
            res[c] = np.asarray(res[c], dtype=float) / f
    for c in RATE_COLUMNS:
        if c in res:
            res[c] = np.asarray(res[c], dtype=float) * f
    if ad.half_width is not None:  # the protocol's interval after n_runs runs replaces the residual and extrapolation
        n = len(np.atleast_1d(res["step_time_s"]))
        settings = np.log(np.asarray(res.get("interval_settings", np.ones(n)), dtype=float))
        total = np.sqrt(ad.half_width ** 2 + settings ** 2)
        bound_interval(res, total, total)
        res["interval_residual"] = np.full(n, math.exp(ad.half_width))
        res["interval_extrapolation"] = np.ones(n)
    return res


# ------------------------------------------------------------------------------------ the k-shot protocol
def units_of(*labels: np.ndarray) -> np.ndarray:
    """Each run's unit: its labels joined (source | accelerator | stack)."""
    cols = [np.asarray(x).astype(str) for x in labels]
    return np.array([" | ".join(t) for t in zip(*cols)], dtype=object)


def protocol_units(units: np.ndarray, errors: np.ndarray) -> dict[str, np.ndarray]:
    """The units with at least MIN_UNIT_RUNS runs of finite error: {unit: indices of its runs}."""
    ok = np.isfinite(errors)
    out = {}
    for u in np.unique(units[ok]):
        idx = np.flatnonzero(ok & (units == u))
        if len(idx) >= MIN_UNIT_RUNS:
            out[str(u)] = idx
    return out


@dataclass
class KshotDraws:
    """Held-out errors of the protocol: per (k, unit), the adapted and the naive log residuals of the runs not
    drawn, over all draws."""

    adapted: dict  # (k, unit) -> residuals (log measured - log adapted prediction)
    naive: dict  # (k, unit) -> residuals after shifting by the median error of the k runs


def kshot_draws(errors: np.ndarray, units: Mapping[str, np.ndarray], alpha: float, prior_dof: float, sigma2: float,
                ks=KS, draws: int = DRAWS, seed: int = 0) -> KshotDraws:
    """For every unit and k, DRAWS seeded draws of k runs adapting the prediction of the rest."""
    adapted, naive = {}, {}
    for ui, (u, idx) in enumerate(sorted(units.items())):
        e = errors[idx]
        for k in ks:
            rng = np.random.default_rng([seed, ui, k])
            res_a, res_n = [], []
            for _ in range(draws if k else 1):
                perm = rng.permutation(len(e))
                tr, te = e[perm[:k]], e[perm[k:]]
                lvl = _level(tr, alpha, prior_dof, sigma2)
                res_a.append(te - lvl)
                res_n.append(te - (np.median(tr) if k else 0.0))
            adapted[(k, u)] = np.concatenate(res_a)
            naive[(k, u)] = np.concatenate(res_n)
    return KshotDraws(adapted, naive)


def _units_equal_mdape(res: dict, k: int, units) -> float:
    return float(np.mean([np.median(np.abs(np.expm1(res[(k, u)]))) for u in units]))


def within_unit_variance(errors: np.ndarray, units: Mapping[str, np.ndarray]) -> float:
    """The pooled within-unit variance of the log errors (each unit's sample variance, units equal)."""
    return float(np.mean([np.var(errors[idx], ddof=1) for idx in units.values()]))


def between_unit_variance(errors: np.ndarray, units: Mapping[str, np.ndarray]) -> float:
    """The variance of the units' mean log errors (less the within-unit share of it)."""
    means = np.array([errors[idx].mean() for idx in units.values()])
    within = np.mean([np.var(errors[idx], ddof=1) / len(idx) for idx in units.values()])
    return float(max(np.var(means, ddof=1) - within, 1e-6))


def _weighted_quantile(x: np.ndarray, w: np.ndarray, q: float) -> float:
    o = np.argsort(x)
    c = np.cumsum(w[o])
    return float(x[o][min(np.searchsorted(c, q * c[-1]), len(x) - 1)])


def select_rule(errors: np.ndarray, unit_labels: np.ndarray, ks=KS, draws: int = DRAWS, seed: int = 0):
    """Choose the adaptation rule on the k-shot protocol and measure it.

    `errors`: each run's held-out log error (log measured - log predicted by the fit without its source);
    `unit_labels`: each run's unit. Returns (rule, rows): rows of protocol metrics per k, for the adapted
    prediction and the naive baseline (shift by the median error of the k runs), pooled (`mdape`, `mape`,
    `within_10pct`) and with every unit weighing the same (`mdape_balanced`, `mape_balanced`), with the
    leave-one-unit-out coverage and median width (hi - lo) / prediction of the 90% interval; plus per-unit rows at
    k = 3. None and [] when fewer than 3 units qualify."""
    from sklearn.model_selection import LeaveOneGroupOut  # start-up time: loads only in the fit

    errors = np.asarray(errors, dtype=float)
    units = protocol_units(np.asarray(unit_labels, dtype=object), errors)
    if len(units) < 3:
        return None, []
    names = sorted(units)
    sigma2 = within_unit_variance(errors, units)
    best = None
    for alpha in ALPHA_GRID:
        for dof in PRIOR_DOF_GRID:
            d = kshot_draws(errors, units, alpha, dof, sigma2, ks=SELECT_KS, draws=draws, seed=seed)
            score = float(np.mean([_units_equal_mdape(d.adapted, k, names) for k in SELECT_KS]))
            if best is None or score < best[0] - 1e-12:
                best = (score, alpha, dof)
    _, alpha, dof = best
    d = kshot_draws(errors, units, alpha, dof, sigma2, ks=ks, draws=draws, seed=seed)
    # the interval after k runs: leave one unit out -- its half-width is the units-equal 90% quantile of the other
    # units' |residual| -- and the served half-width is that quantile over all units
    q_by_k, rows = [], []
    groups = np.arange(len(names))
    for k in ks:
        for kind, res in (("adapted", d.adapted), ("naive", d.naive)):
            absr = [np.abs(res[(k, u)]) for u in names]
            w = [np.full(len(a), 1.0 / len(a)) for a in absr]
            covered, widths = [], []
            for train, test in LeaveOneGroupOut().split(groups.reshape(-1, 1), groups=groups):
                q = _weighted_quantile(np.concatenate([absr[i] for i in train]),
                                       np.concatenate([w[i] for i in train]), COVERAGE)
                t = test[0]
                covered.append(float(np.mean(absr[t] <= q)))
                widths.append(2.0 * math.sinh(q))  # (hi - lo) / prediction of exp(+-q)
            q_all = _weighted_quantile(np.concatenate(absr), np.concatenate(w), COVERAGE)
            if kind == "adapted":
                q_by_k.append((k, q_all))
            rel = [np.expm1(-res[(k, u)]) for u in names]  # predicted / measured - 1
            pooled = np.abs(np.concatenate(rel))
            per_unit = [np.abs(r) for r in rel]
            wts = np.concatenate([np.full(len(r), 1.0 / len(r)) for r in per_unit])
            rows.append({"k": k, "predictor": kind, "grouping": "unit", "group": "ALL",
                         "n_runs": int(sum(len(units[u]) for u in names)), "n_units": len(names),
                         "mdape": float(np.median(pooled)), "mape": float(np.mean(pooled)),
                         "within_10pct": float(np.mean(pooled <= 0.10)),
                         "mdape_balanced": _weighted_quantile(pooled, wts, 0.5),
                         "mape_balanced": float(np.sum(pooled * wts) / np.sum(wts)),
                         "coverage_90": float(np.mean(covered)), "median_width": float(np.median(widths))})
            if k == 3 and kind == "adapted":
                for u, r in zip(names, per_unit):
                    rows.append({"k": k, "predictor": kind, "grouping": "unit", "group": u,
                                 "n_runs": int(len(units[u])), "n_units": 1, "mdape": float(np.median(r)),
                                 "mape": float(np.mean(r)), "within_10pct": float(np.mean(r <= 0.10)),
                                 "mdape_balanced": float(np.median(r)), "mape_balanced": float(np.mean(r)),
                                 "coverage_90": None, "median_width": None})
    rule = AdaptationRule(alpha=float(alpha), prior_dof=float(dof), sigma2=sigma2, q_by_k=tuple(q_by_k),
                          n_units=len(names), n_runs=int(sum(len(v) for v in units.values())))
    return rule, rows
