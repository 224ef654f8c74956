"""Altair chart builders for the report site (pure: DataFrames in, charts out; no database, no files).

Every chart has axis titles with units and tooltips. Log axes for cluster size, throughput and compute; a log
axis never carries bars (a bar starts at zero). Numbers read as people write them: `$11.3M`, `52%`, `1,024`.
Accelerators are faceted by vendor with Vega's 20-colour `tableau20` scheme inside each facet (the largest vendor
has 19 accelerators), so no two accelerators of one panel share a colour.

Helper layers (the y = x diagonal, a threshold rule) are named ``guide…``: the browser tests count a view as
drawn only when it has marks besides those.
"""

from __future__ import annotations

import altair as alt
import polars as pl

WIDTH, HEIGHT = 360, 240
SCHEMA = "https://vega.github.io/schema/vega-lite/v6.json"  # an identifier in the spec, never fetched


# Composition at the dict level: Altair's layer/concat constructors deep-copy every sub-chart with its data
# (seconds per page); leaf charts are converted once with ``to_dict(validate=False)`` and their inline
# datasets merged upward instead.
def _split(part) -> tuple[dict, dict]:
    d = part.to_dict(validate=False) if hasattr(part, "to_dict") else dict(part)
    datasets = d.pop("datasets", {}) or {}
    d.pop("$schema", None)
    d.pop("config", None)
    return d, datasets


def _compose(key: str, parts, props: dict) -> dict:
    specs, datasets = [], {}
    for part in parts:
        d, ds = _split(part)
        specs.append(d)
        datasets.update(ds)
    out = {key: specs, **props}
    if datasets:
        out["datasets"] = datasets
    return out


def layer(*parts, **props) -> dict:
    return _compose("layer", parts, props)


def hconcat(*parts, **props) -> dict:
    return _compose("hconcat", parts, props)


def vconcat(*parts, **props) -> dict:
    return _compose("vconcat", parts, props)


_DATASETS: dict[str, list[dict]] = {}
_BY_CONTENT: dict[int, str] = {}
SIGNIFICANT_DIGITS = 4  # what a chart or tooltip shows; the store keeps full precision


def _rounded(v):
    """Whole numbers (N, batch, knee N) stay exact; other floats keep ``SIGNIFICANT_DIGITS``."""
    return float(f"{v:.{SIGNIFICANT_DIGITS}g}") if isinstance(v, float) and not v.is_integer() else v


def data(df: pl.DataFrame, columns=None) -> alt.NamedData:
    """A named inline dataset (NaN/inf → null, floats to 4 significant digits). Charts reference it by name and
    ``to_spec`` attaches the values at the top level, once per page however many charts use the same rows:
    Altair's own conversion walks every value through its schema machinery (seconds per page)."""
    d = df.select(list(dict.fromkeys(c for c in columns if c in df.columns))) if columns else df
    floats = [c for c, t in d.schema.items() if t in (pl.Float32, pl.Float64)]
    if floats:
        d = d.with_columns([pl.when(pl.col(c).is_finite()).then(pl.col(c)).otherwise(None).alias(c) for c in floats])
    rows = [{k: _rounded(v) for k, v in r.items()} for r in d.iter_rows(named=True)]
    key = hash((tuple(d.columns), repr(rows)))
    if key not in _BY_CONTENT:
        _BY_CONTENT[key] = f"data-{len(_DATASETS)}"
        _DATASETS[_BY_CONTENT[key]] = rows
    return alt.NamedData(name=_BY_CONTENT[key])


def rows_of(name: str) -> int:
    return len(_DATASETS.get(name, []))


def _names(spec, out: set) -> set:
    if isinstance(spec, dict):
        dat = spec.get("data")
        if isinstance(dat, dict) and "name" in dat:
            out.add(dat["name"])
        for v in spec.values():
            _names(v, out)
    elif isinstance(spec, list):
        for v in spec:
            _names(v, out)
    return out


CURVE_COLUMNS = ("arch_id", "policy", "n_gpus", "global_batch_seqs", "layout", "tokens_per_s_per_gpu", "mfu",
                 "step_time_s", "time_to_train_days", "cost_usd", "cost", "marginal_efficiency", "gpu", "cost_pareto")


def to_spec(part) -> dict:
    """A complete top-level Vega-Lite spec (dict) from a chart or a composed dict, with the values of every
    named dataset it references."""
    d, ds = _split(part)
    for name in _names(d, set()):
        if name in _DATASETS:
            ds[name] = _DATASETS[name]
    if ds:
        d["datasets"] = ds
    d["$schema"] = SCHEMA
    return d


def forget_data() -> None:
    """Drop the registered datasets (after a site is written)."""
    _DATASETS.clear()
    _BY_CONTENT.clear()
POLICY_DASH = alt.Scale(domain=["strong", "weak", "critical"], range=[[1, 0], [6, 3], [2, 2]])
PALETTE = "tableau20"  # Vega's 20 distinguishable categorical colours
# on a log axis, label only the ticks whose leading digit is 1, 2 or 5 (Vega labels every tick of a decade)
_MANTISSA = "round(100 * datum.value / pow(10, floor(log(datum.value) / LN10 + 1e-9))) / 100"
_LEAD_125 = f"indexof([1, 2, 5], {_MANTISSA}) >= 0"


def log_labels(label: str) -> str:
    """A labelExpr for a log axis: ``label`` (an expression of datum.value) at 1, 2, 5 × 10^k, blank elsewhere."""
    return f"{_LEAD_125} ? {label} : ''"


USD_AXIS = log_labels("replace(format(datum.value, '$.3~s'), 'G', 'B')")  # d3's SI prefix G (giga) reads as billions
COUNT_AXIS = "format(datum.value, ',')"


def guide(chart: alt.Chart, name: str) -> alt.Chart:
    """A helper layer (a rule, a diagonal): not a data mark of its own (see the module docstring)."""
    return chart.properties(name=f"guide_{name}")


def _n_axis(title: str = "accelerators N (log scale)") -> alt.X:
    return alt.X("n_gpus:Q", scale=alt.Scale(type="log", base=2), title=title,
                 axis=alt.Axis(labelExpr=COUNT_AXIS, tickCount=8))


def _y_axis(fmt: str) -> alt.Axis:
    """``count``: 1.5k, 20k, 1M on a log axis; any other value: a d3 format (".0%": 52%)."""
    return alt.Axis(format=fmt) if fmt != "count" else alt.Axis(labelExpr=log_labels("format(datum.value, '.3~s')"))


CURVE_TOOLTIP = [
    alt.Tooltip("arch_id:N", title="model"), alt.Tooltip("policy:N"), alt.Tooltip("n_gpus:Q", title="N", format=","),
    alt.Tooltip("global_batch_seqs:Q", title="batch (seqs)", format=","), alt.Tooltip("layout:N"),
    alt.Tooltip("tokens_per_s_per_gpu:Q", title="tokens/s/GPU", format=",.0f"),
    alt.Tooltip("mfu:Q", title="MFU", format=".1%"), alt.Tooltip("step_time_s:Q", title="step time (s)", format=".3f"),
    alt.Tooltip("time_to_train_days:Q", title="time to train (days)", format=",.1f"),
    alt.Tooltip("cost:N", title="cost"),
    alt.Tooltip("marginal_efficiency:Q", title="marginal efficiency", format=".2f"),
]


PANEL_METRICS = ("tokens_per_s", "tokens_per_s_per_gpu", "mfu", "marginal_efficiency")


def curve_panel(curves: pl.DataFrame, knees: pl.DataFrame, y: str, title: str, y_title: str, *, log_y: bool = True,
                fmt: str = "count", band: bool = True, threshold: float | None = None) -> dict:
    """One metric vs N for the curves of one reference model: a line per policy, the interval as a band, the knee as
    a diamond. Measured runs are not drawn here: each is another configuration than the curve's
    (``measured_vs_own_prediction`` compares them with their own predictions)."""
    frame = curves.filter(pl.col("feasible"))
    # one dataset for every panel of a page: the columns of all panels, not just this one's
    cols = list(dict.fromkeys(list(CURVE_COLUMNS) + [f"{m}{sfx}" for m in PANEL_METRICS for sfx in ("", "_lo", "_hi")]))
    scale = alt.Scale(type="log") if log_y else alt.Scale(zero=False)
    base = alt.Chart(data(frame, cols)).encode(x=_n_axis(), color=alt.Color("policy:N", title="batch policy"))
    layers = []
    if band and f"{y}_lo" in frame.columns:
        layers.append(base.mark_area(opacity=0.2).encode(y=alt.Y(f"{y}_lo:Q", scale=scale), y2=f"{y}_hi:Q"))
    layers.append(base.mark_line(point=True).encode(
        y=alt.Y(f"{y}:Q", title=y_title, scale=scale, axis=_y_axis(fmt)),
        strokeDash=alt.StrokeDash("policy:N", scale=POLICY_DASH, legend=None), tooltip=CURVE_TOOLTIP))
    if knees.height:
        k = knees.filter(pl.col("knee_found")).join(
            frame.select("policy", pl.col("n_gpus").cast(pl.Float64), y), left_on=["policy", "inflection_n"], right_on=["policy", "n_gpus"],
            how="inner") if "inflection_n" in knees.columns else knees.clear()
        if k.height:
            layers.append(alt.Chart(data(k, ["policy", "inflection_n", "inflection_n_lo", "inflection_n_hi", y])).mark_point(
                shape="diamond", size=160, filled=True, stroke="black").encode(
                x=alt.X("inflection_n:Q"), y=alt.Y(f"{y}:Q"), color=alt.Color("policy:N"),
                tooltip=[alt.Tooltip("policy:N"), alt.Tooltip("inflection_n:Q", title="knee N", format=","),
                         alt.Tooltip("inflection_n_lo:Q", title="knee N (low)", format=","),
                         alt.Tooltip("inflection_n_hi:Q", title="knee N (high)", format=",")]))
    if threshold is not None:
        layers.append(guide(alt.Chart(data(pl.DataFrame({"t": [threshold]}))).mark_rule(color="gray", strokeDash=[4, 4])
                            .encode(y="t:Q"), "threshold"))
    return layer(*layers, title=title, width=WIDTH, height=HEIGHT)


MEASURED_COLUMNS = ("run_id", "series", "model_name", "precision", "seq_len", "n_gpus", "global_batch_seqs", "layout",
                    "measured_tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu", "predicted_lo", "predicted_hi",
                    "measured_over_predicted")


def measured_vs_own_prediction(runs: pl.DataFrame, estimate: str) -> dict:
    """Measured runs against stepcast's prediction of each very run: predicted vs measured tokens/s per GPU
    (log-log, the y = x line dashed, the 90 % interval as a vertical rule when there is one), and measured ÷
    predicted vs N (shape: precision; the rule at 1 dashed). Colour: source. ``runs``: rows of
    ``reports.site.measured_runs`` with a positive prediction."""
    d = data(runs, MEASURED_COLUMNS)
    color = alt.Color("series:N", title="source", scale=alt.Scale(scheme=PALETTE),
                      legend=alt.Legend(columns=1, labelLimit=190, symbolLimit=0))
    tip = [alt.Tooltip("series:N", title="source"), alt.Tooltip("run_id:N"), alt.Tooltip("model_name:N", title="model"),
           alt.Tooltip("precision:N"), alt.Tooltip("seq_len:Q", title="sequence", format=","),
           alt.Tooltip("n_gpus:Q", title="N", format=","),
           alt.Tooltip("global_batch_seqs:Q", title="batch (seqs)", format=","), alt.Tooltip("layout:N"),
           alt.Tooltip("measured_tokens_per_s_per_gpu:Q", title="measured tokens/s/GPU", format=",.0f"),
           alt.Tooltip("predicted_tokens_per_s_per_gpu:Q", title=f"predicted ({estimate})", format=",.0f"),
           alt.Tooltip("predicted_lo:Q", title="90% interval, low", format=",.0f"),
           alt.Tooltip("predicted_hi:Q", title="90% interval, high", format=",.0f"),
           alt.Tooltip("measured_over_predicted:Q", title="measured ÷ predicted", format=".2f")]
    lo = float(min(runs["predicted_tokens_per_s_per_gpu"].min(), runs["measured_tokens_per_s_per_gpu"].min()))
    hi = float(max(runs["predicted_tokens_per_s_per_gpu"].max(), runs["measured_tokens_per_s_per_gpu"].max()))
    log = alt.Scale(type="log")
    x = alt.X("measured_tokens_per_s_per_gpu:Q", title="measured tokens/s per GPU (log)", scale=log,
              axis=_y_axis("count"))
    diag = guide(alt.Chart(data(pl.DataFrame({"x": [lo, hi]}))).mark_line(color="gray", strokeDash=[4, 4])
                 .encode(x=alt.X("x:Q", scale=log), y=alt.Y("x:Q", scale=log)), "diagonal")
    layers = [diag]
    if runs["predicted_lo"].is_not_null().any():
        layers.append(alt.Chart(d).transform_filter("isValid(datum.predicted_lo) && datum.predicted_lo > 0")
                      .mark_rule(opacity=0.35).encode(x=x, y=alt.Y("predicted_lo:Q", scale=log), y2="predicted_hi:Q",
                                                      color=color, tooltip=tip))
    layers.append(alt.Chart(d).mark_point(size=40, filled=True, opacity=0.75).encode(
        x=x, y=alt.Y("predicted_tokens_per_s_per_gpu:Q", title=f"predicted tokens/s per GPU, {estimate} (log)",
                     scale=log, axis=_y_axis("count")), color=color, tooltip=tip))
    left = layer(*layers, title="predicted against measured, each run's own configuration", width=WIDTH - 40,
                 height=WIDTH - 40)
    one = guide(alt.Chart(data(pl.DataFrame({"one": [1.0]}))).mark_rule(color="gray", strokeDash=[4, 4])
                .encode(y="one:Q"), "one")
    ratio = alt.Chart(d).mark_point(size=40, filled=True, opacity=0.75).encode(
        x=_n_axis(), y=alt.Y("measured_over_predicted:Q", title="measured ÷ predicted tokens/s per GPU (log)",
                             scale=alt.Scale(type="log"), axis=alt.Axis(format=".2~f")),
        color=color, shape=alt.Shape("precision:N", title="precision"), tooltip=tip)
    right = layer(one, ratio, title="measured ÷ predicted against N", width=WIDTH - 40, height=WIDTH - 40)
    return hconcat(left, right)


CALIBRATION_COLUMNS = ("run_id", "source", "gpu", "n_gpus", "estimate", "measured_tokens_per_s_per_gpu",
                       "tokens_per_s_per_gpu", "rel_error")


def measured_vs_predicted(df: pl.DataFrame, pred_col: str, title: str, estimate: str) -> dict:
    """Scatter of measured vs predicted tokens/s/GPU (log-log) of one ``estimate`` with the y = x line, coloured by
    source. ``df``: every estimate's rows (one dataset shared with ``residual_strip``)."""
    d = df.filter((pl.col("estimate") == estimate) & pl.col(pred_col).is_not_null()
                  & pl.col("measured_tokens_per_s_per_gpu").is_not_null()
                  & (pl.col(pred_col) > 0) & (pl.col("measured_tokens_per_s_per_gpu") > 0))
    lo = float(min(d[pred_col].min() or 1, d["measured_tokens_per_s_per_gpu"].min() or 1)) if d.height else 1.0
    hi = float(max(d[pred_col].max() or 10, d["measured_tokens_per_s_per_gpu"].max() or 10)) if d.height else 10.0
    diag = guide(alt.Chart(data(pl.DataFrame({"x": [lo, hi]}))).mark_line(color="gray", strokeDash=[4, 4])
                 .encode(x="x:Q", y="x:Q"), "diagonal")
    pts = alt.Chart(data(df, CALIBRATION_COLUMNS)).transform_filter(
        (alt.datum[pred_col] > 0) & (alt.datum.measured_tokens_per_s_per_gpu > 0)
        & (alt.datum.estimate == estimate)).mark_circle(size=30, opacity=0.7).encode(
        x=alt.X("measured_tokens_per_s_per_gpu:Q", title="measured tokens/s/GPU (log)", scale=alt.Scale(type="log"),
                axis=_y_axis("count")),
        y=alt.Y(f"{pred_col}:Q", title="predicted tokens/s/GPU (log)", scale=alt.Scale(type="log"),
                axis=_y_axis("count")),
        color=alt.Color("source:N", scale=alt.Scale(scheme=PALETTE), legend=alt.Legend(columns=1, labelLimit=220)),
        tooltip=[alt.Tooltip("run_id:N"), alt.Tooltip("source:N"), alt.Tooltip("gpu:N"),
                 alt.Tooltip("n_gpus:Q", title="N", format=","),
                 alt.Tooltip("measured_tokens_per_s_per_gpu:Q", title="measured", format=",.0f"),
                 alt.Tooltip(f"{pred_col}:Q", title="predicted", format=",.0f")])
    return layer(diag, pts, title=title, width=WIDTH, height=WIDTH)


def residual_strip(df: pl.DataFrame, group: str, err_col: str, title: str) -> dict:
    """Relative error (predicted/measured − 1) per group: a tick per run and the group median."""
    d = data(df, CALIBRATION_COLUMNS)
    # the groups by their median error, largest first: one order for both layers
    order = df.filter(pl.col(err_col).is_finite()).group_by(group).agg(pl.col(err_col).median().alias("m")) \
        .sort("m", group, descending=[True, False])[group].to_list()
    ticks = alt.Chart(d).transform_filter(f"isFinite(datum.{err_col})").mark_tick(opacity=0.5).encode(
        y=alt.Y(f"{group}:N", title=None, sort=order, axis=alt.Axis(labelLimit=260)),
        x=alt.X(f"{err_col}:Q", title="relative error of tokens/s/GPU (predicted/measured − 1)",
                axis=alt.Axis(format=".0%"), scale=alt.Scale(domain=[-1, 2], clamp=True)),
        color=alt.Color("estimate:N", title="estimate"),
        tooltip=[alt.Tooltip("run_id:N"), alt.Tooltip(f"{group}:N"), alt.Tooltip("estimate:N"),
                 alt.Tooltip(f"{err_col}:Q", title="relative error", format="+.1%")])
    med = alt.Chart(d).transform_filter(f"isFinite(datum.{err_col})").mark_point(shape="diamond", size=80, filled=True, color="black").encode(
        y=alt.Y(f"{group}:N", sort=order), x=alt.X(f"median({err_col}):Q"), shape=alt.Shape("estimate:N", title=""),
        tooltip=[alt.Tooltip(f"{group}:N"), alt.Tooltip("estimate:N"),
                 alt.Tooltip(f"median({err_col}):Q", title="median error", format="+.1%"),
                 alt.Tooltip("count():Q", title="runs")])
    return layer(ticks, med, title=title, width=WIDTH + 160)


def coverage_bars(cov: pl.DataFrame, group: str, title: str, nominal: float | None) -> dict:
    bars = alt.Chart(data(cov)).mark_bar().encode(
        y=alt.Y(f"{group}:N", title=None, sort="-x", axis=alt.Axis(labelLimit=260)),
        x=alt.X("coverage:Q", title="share of measured runs inside the interval", axis=alt.Axis(format=".0%"),
                scale=alt.Scale(domain=[0, 1])),
        tooltip=[alt.Tooltip(f"{group}:N"), alt.Tooltip("coverage:Q", format=".1%"), alt.Tooltip("runs:Q")])
    layers = [bars]
    if nominal is not None:
        layers.append(guide(alt.Chart(data(pl.DataFrame({"c": [nominal]}))).mark_rule(color="red").encode(x="c:Q"),
                            "nominal"))
    return layer(*layers, title=title, width=WIDTH)


def heldout_bars(metrics: pl.DataFrame, title: str) -> dict:
    """Held-out MdAPE per transfer protocol (worst first) and predictor: bars on a linear axis from zero."""
    order = metrics.sort("order")["protocol"].unique(maintain_order=True).to_list()
    return alt.Chart(data(metrics, ["protocol", "predictor", "mdape", "n_runs"])).mark_bar().encode(
        y=alt.Y("protocol:N", sort=order, title=None, axis=alt.Axis(labelLimit=320)),
        yOffset=alt.YOffset("predictor:N", sort=["analytical", "physics", "calibrated"]),
        x=alt.X("mdape:Q", title="median absolute error of tokens/s per GPU on held-out runs (MdAPE)",
                axis=alt.Axis(format=".0%"), scale=alt.Scale(zero=True)),
        color=alt.Color("predictor:N", sort=["analytical", "physics", "calibrated"], title="predictor"),
        tooltip=[alt.Tooltip("protocol:N"), alt.Tooltip("predictor:N"), alt.Tooltip("mdape:Q", title="MdAPE", format=".1%"),
                 alt.Tooltip("n_runs:Q", title="runs", format=",")],
    ).properties(title=title, width=560).to_dict(validate=False)


RELIABILITY_COLUMNS = ("scheme", "grouping", "group", "n_runs", "coverage_90", "median_width")


def reliability_chart(rows: pl.DataFrame, title: str) -> dict:
    """The 90% interval's coverage against its median width (hi - lo) / prediction for every transfer protocol (a
    point per held-out group, a larger one for the protocol as a whole), with the 85-95% band the intervals aim
    for: a point below the band is a group the interval is too narrow for, one above it a group it is too wide for."""
    d = data(rows, RELIABILITY_COLUMNS)
    base = alt.Chart(d).encode(
        x=alt.X("median_width:Q", title="median width of the 90% interval, (hi − lo) / prediction",
                axis=alt.Axis(format=".0%"), scale=alt.Scale(zero=True)),
        y=alt.Y("coverage_90:Q", title="share of held-out runs the 90% interval covers", axis=alt.Axis(format=".0%"),
                scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("scheme:N", title="protocol"),
        tooltip=[alt.Tooltip("scheme:N", title="protocol"), alt.Tooltip("grouping:N"), alt.Tooltip("group:N"),
                 alt.Tooltip("n_runs:Q", title="runs", format=","),
                 alt.Tooltip("coverage_90:Q", title="covers", format=".1%"),
                 alt.Tooltip("median_width:Q", title="median width", format=".0%")])
    band = alt.Chart(alt.Data(values=[{"lo": 0.85, "hi": 0.95}])).mark_rect(opacity=0.12, color="#2a9d8f").encode(
        y="lo:Q", y2="hi:Q")
    groups = base.transform_filter("datum.group !== 'ALL'").mark_point(filled=False, size=40)
    overall = base.transform_filter("datum.group === 'ALL'").mark_point(filled=True, size=140)
    return alt.layer(band, groups, overall).properties(title=title, width=560, height=HEIGHT).to_dict(validate=False)


KSHOT_COLUMNS = ("k_shot", "predictor", "mdape", "mape", "mdape_balanced", "coverage_90", "median_width")
KSHOT_PREDICTORS = ["adapted", "naive"]
KSHOT_DASH = alt.Scale(domain=KSHOT_PREDICTORS, range=[[1, 0], [6, 3]])


def kshot_chart(rows: pl.DataFrame, error_title: str, width_title: str) -> dict:
    """The k-shot protocol: the error on a unit's other runs (every unit weighing the same) against the k runs that
    adapted the fit, adapted beside the naive shift (dashed), and the 90% interval's median width against k (adapted),
    side by side. ``rows``: one per (k, predictor), the protocol's overall rows."""
    ks = sorted(int(k) for k in rows["k_shot"].unique().to_list())
    d = data(rows, KSHOT_COLUMNS)
    x = alt.X("k_shot:Q", title="k: the unit's own runs that adapt the fit", scale=alt.Scale(domain=[0, max(ks)]),
              axis=alt.Axis(values=ks, format="d"))
    color = alt.Color("predictor:N", sort=KSHOT_PREDICTORS, title="predictor")
    tip = [alt.Tooltip("k_shot:Q", title="k"), alt.Tooltip("predictor:N"),
           alt.Tooltip("mdape_balanced:Q", title="MdAPE, units equal", format=".1%"),
           alt.Tooltip("mdape:Q", title="MdAPE", format=".1%"), alt.Tooltip("mape:Q", title="MAPE", format=".1%"),
           alt.Tooltip("coverage_90:Q", title="90% coverage", format=".0%"),
           alt.Tooltip("median_width:Q", title="median width of the 90% interval", format=".0%")]
    error = alt.Chart(d).transform_filter("isValid(datum.mdape_balanced)").mark_line(point=True).encode(
        x=x, y=alt.Y("mdape_balanced:Q", title="median error of tokens/s per GPU, units equal (MdAPE)",
                     axis=alt.Axis(format=".0%"), scale=alt.Scale(zero=True)),
        color=color, strokeDash=alt.StrokeDash("predictor:N", scale=KSHOT_DASH, legend=None), tooltip=tip,
    ).properties(title=error_title, width=WIDTH, height=HEIGHT)
    width = alt.Chart(d).transform_filter("datum.predictor === 'adapted' && isValid(datum.median_width)").mark_line(
        point=True).encode(
        x=x, y=alt.Y("median_width:Q", title="median width of the 90% interval, (hi − lo) / prediction",
                     axis=alt.Axis(format=".0%"), scale=alt.Scale(zero=True)),
        color=color, tooltip=tip,
    ).properties(title=width_title, width=WIDTH, height=HEIGHT)
    return hconcat(error, width)


def knee_dots(knees: pl.DataFrame, title: str) -> dict:
    """Knee N per accelerator and reference model on a log axis: a dot (filled: knee found; open: none up to the
    largest N swept, drawn there) and a rule over its interval."""
    d = data(knees, ["accelerator", "arch_id", "knee_n", "knee_found", "inflection_n_lo", "inflection_n_hi", "status"])
    # a row per accelerator makes the chart taller than a screen: the axis and the legends go on top
    x = alt.X("knee_n:Q", scale=alt.Scale(type="log", base=2), axis=alt.Axis(labelExpr=COUNT_AXIS, orient="top"),
              title="inflection point N (log scale)")
    y = alt.Y("accelerator:N", title=None, sort=alt.EncodingSortField("knee_n", op="min", order="descending"))
    tip = [alt.Tooltip("accelerator:N"), alt.Tooltip("arch_id:N", title="model"), alt.Tooltip("status:N"),
           alt.Tooltip("inflection_n_lo:Q", title="knee N (low)", format=","),
           alt.Tooltip("inflection_n_hi:Q", title="knee N (high)", format=",")]
    base = alt.Chart(d).encode(y=y, color=alt.Color("arch_id:N", title="reference model",
                                                    legend=alt.Legend(orient="top")),
                               yOffset=alt.YOffset("arch_id:N"))
    rule = base.transform_filter(alt.datum.knee_found).mark_rule(strokeWidth=2, opacity=0.6).encode(
        x=alt.X("inflection_n_lo:Q", scale=alt.Scale(type="log", base=2)), x2="inflection_n_hi:Q", tooltip=tip)
    dots = base.mark_point(size=70, strokeWidth=2).encode(
        x=x, fill=alt.condition(alt.datum.knee_found, alt.Fill("arch_id:N", legend=None), alt.value("white")),
        shape=alt.Shape("status:N", title="filled: knee found", scale=alt.Scale(range=["circle", "square"]),
                        legend=alt.Legend(orient="top")),
        tooltip=tip)
    return layer(rule, dots, title={"text": title, "anchor": "start"}, width=560, height={"step": 12})


def _vendor_facets(chart: alt.LayerChart, title: str) -> dict:
    """One panel per vendor, two to a row, each with its own x axis (a shared one would hang below an empty cell
    when the vendors are odd in number) and its own colour legend; each row as tall as its own tallest legend."""
    return chart.facet(facet=alt.Facet("vendor:N", title=None), columns=2, title=title, align="each").resolve_scale(
        color="independent").resolve_axis(x="independent").to_dict(validate=False)


#: a vendor panel's size and its legend: two columns of short labels, so that two panels with their legends fit
#: the page's width and NVIDIA's ~40 entries a panel's height
PANEL_WIDTH, PANEL_HEIGHT = 330, 220
PANEL_LEGEND = alt.Legend(columns=2, symbolLimit=0, labelLimit=95, columnPadding=6)


def frontier_chart(fr: pl.DataFrame, title: str) -> dict:
    """Utilization vs training compute per accelerator, one panel per vendor; the frontier point of each as a large
    dot, levels where the latency wall binds (the minimum step time, not data movement or memory, sets the
    cluster size) as crosses when there are any. Click a legend entry to highlight one accelerator."""
    cols = ["gpu", "vendor", "training_flop", "params_h", "tokens_h", "n_gpus", "layout", "utilization",
            "time_to_train_days", "cost", "is_frontier", "binding"]
    feasible = fr.filter(pl.col("feasible"))
    d = data(feasible, [c for c in cols if c in fr.columns])
    tip = [alt.Tooltip("gpu:N", title="accelerator"), alt.Tooltip("training_flop:Q", title="training FLOP", format=".2~e"),
           alt.Tooltip("params_h:N", title="parameters"), alt.Tooltip("tokens_h:N", title="tokens"),
           alt.Tooltip("n_gpus:Q", title="N", format=","), alt.Tooltip("layout:N"),
           alt.Tooltip("utilization:Q", format=".1%"), alt.Tooltip("time_to_train_days:Q", title="days", format=",.1f"),
           alt.Tooltip("cost:N", title="cost")] + ([alt.Tooltip("binding:N", title="binding constraint")]
                                                   if "binding" in fr.columns else [])
    sel = alt.selection_point(fields=["gpu"], bind="legend")
    base = alt.Chart().encode(
        x=alt.X("training_flop:Q", title="training compute, 6·params·tokens (FLOP, log)", scale=alt.Scale(type="log"),
                axis=alt.Axis(format=".0e")),
        y=alt.Y("utilization:Q", title="utilization (MFU) of the best layout", axis=alt.Axis(format=".0%")),
        color=alt.Color("gpu:N", title="accelerator", scale=alt.Scale(scheme=PALETTE), legend=PANEL_LEGEND),
        opacity=alt.condition(sel, alt.value(0.9), alt.value(0.1)), tooltip=tip)
    line = base.mark_line().add_params(sel)
    top = base.transform_filter(alt.datum.is_frontier).mark_point(size=120, filled=True, stroke="black")
    layers = [line, top]
    if "binding" in fr.columns and (feasible["binding"] == "latency").any():  # an empty layer warns in the browser
        layers.append(base.transform_filter(alt.datum.binding == "latency").mark_point(shape="cross", size=60,
                                                                                        filled=True))
    return _vendor_facets(alt.layer(*layers, data=d).properties(width=PANEL_WIDTH, height=PANEL_HEIGHT), title)


CHOICE_COLUMNS = ("target_id", "gpu", "vendor", "n_gpus", "layout", "days", "days_lo", "days_hi", "cost_usd", "cost",
                  "price", "mfu", "tokens_per_s_per_gpu", "step_time_s", "cost_pareto")


def choice_chart(df: pl.DataFrame, title: str) -> dict:
    """Days to train vs cost for one target run, one point per (accelerator, N), one panel per vendor;
    Pareto-efficient ones (over all vendors, ``cost_pareto``) ringed. ``df``: rows of the `hardware_choice` table
    with ``gpu``, ``vendor`` and the display columns."""
    d = data(df, list(CHOICE_COLUMNS))
    base = alt.Chart().encode(
        x=alt.X("days:Q", title="days to train (log)", scale=alt.Scale(type="log"),
                axis=alt.Axis(labelExpr=log_labels("format(datum.value, ',~r')"))),
        y=alt.Y("cost_usd:Q", title="cost at on-demand cloud prices (log)", scale=alt.Scale(type="log"),
                axis=alt.Axis(labelExpr=USD_AXIS)),
        color=alt.Color("gpu:N", title="accelerator", scale=alt.Scale(scheme=PALETTE), legend=PANEL_LEGEND),
        tooltip=[alt.Tooltip("gpu:N", title="accelerator"), alt.Tooltip("n_gpus:Q", title="N", format=","),
                 alt.Tooltip("layout:N"), alt.Tooltip("days:Q", title="days", format=",.1f"),
                 alt.Tooltip("days_lo:Q", title="days (low)", format=",.1f"),
                 alt.Tooltip("days_hi:Q", title="days (high)", format=",.1f"), alt.Tooltip("cost:N", title="cost"),
                 alt.Tooltip("price:N", title="price per GPU-hour"), alt.Tooltip("mfu:Q", title="MFU", format=".1%"),
                 alt.Tooltip("tokens_per_s_per_gpu:Q", title="tokens/s/GPU", format=",.0f"),
                 alt.Tooltip("step_time_s:Q", title="step time (s)", format=".3f")])
    pts = base.mark_circle(size=45, opacity=0.75)
    front = base.transform_filter(alt.datum.cost_pareto).mark_point(size=140, color="black")
    return _vendor_facets(alt.layer(pts, front, data=d).properties(width=PANEL_WIDTH, height=PANEL_HEIGHT), title)
