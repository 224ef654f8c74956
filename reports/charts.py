"""Altair chart builders for the report site (pure: DataFrames in, charts out; no database, no files).

Every chart has axis titles with units and tooltips. Log axes for cluster size, throughput and compute.
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


def data(df: pl.DataFrame, columns=None) -> alt.NamedData:
    """A named inline dataset (NaN/inf → null). Charts reference it by name and ``to_spec`` attaches the values
    at the top level: Altair's own conversion walks every value through its schema machinery (seconds per
    page)."""
    d = df.select(list(dict.fromkeys(c for c in columns if c in df.columns))) if columns else df
    floats = [c for c, t in d.schema.items() if t in (pl.Float32, pl.Float64)]
    if floats:
        d = d.with_columns([pl.when(pl.col(c).is_finite()).then(pl.col(c)).otherwise(None).alias(c) for c in floats])
    name = f"data-{len(_DATASETS)}"
    _DATASETS[name] = d.to_dicts()
    return alt.NamedData(name=name)


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


CURVE_COLUMNS = ("arch_id", "policy", "n_gpus", "global_batch_seqs", "tp", "pp", "dp", "vpp", "micro_batch",
                 "sharding", "recompute", "tokens_per_s_per_gpu", "mfu", "step_time_s", "time_to_train_days",
                 "cost_usd", "marginal_efficiency", "gpu", "usd_per_gpu_hour", "cost_pareto")


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
POLICY_DASH = alt.Scale(domain=["strong", "weak", "critical"], range=[[1, 0], [6, 3], [2, 2]])


def _n_axis(title: str = "accelerators N (log scale)") -> alt.X:
    return alt.X("n_gpus:Q", scale=alt.Scale(type="log", base=2), title=title,
                 axis=alt.Axis(format="~s", tickCount=8))


CURVE_TOOLTIP = [
    alt.Tooltip("arch_id:N", title="model"), alt.Tooltip("policy:N"), alt.Tooltip("n_gpus:Q", title="N", format=","),
    alt.Tooltip("global_batch_seqs:Q", title="batch (seqs)", format=","), alt.Tooltip("tp:Q"), alt.Tooltip("pp:Q"),
    alt.Tooltip("dp:Q"), alt.Tooltip("vpp:Q", title="interleave"), alt.Tooltip("micro_batch:Q", title="micro-batch"),
    alt.Tooltip("sharding:N"), alt.Tooltip("recompute:N"),
    alt.Tooltip("tokens_per_s_per_gpu:Q", title="tokens/s/GPU", format=",.0f"),
    alt.Tooltip("mfu:Q", title="MFU", format=".1%"), alt.Tooltip("step_time_s:Q", title="step time (s)", format=".3f"),
    alt.Tooltip("time_to_train_days:Q", title="time to train (days)", format=",.1f"),
    alt.Tooltip("cost_usd:Q", title="cost (USD)", format="$,.3s"),
    alt.Tooltip("marginal_efficiency:Q", title="marginal efficiency", format=".2f"),
]


def curve_panel(curves: pl.DataFrame, knees: pl.DataFrame, measured: pl.DataFrame | None, y: str, title: str,
                y_title: str, *, log_y: bool = True, fmt: str = "~s", band: bool = True,
                threshold: float | None = None) -> dict:
    """One metric vs N for the curves of one reference model: a line per policy, the interval as a band,
    the knee as a diamond, measured points of the same model on this hardware as black circles."""
    frame = curves.filter(pl.col("feasible"))
    cols = list(dict.fromkeys(list(CURVE_COLUMNS) + [y, f"{y}_lo", f"{y}_hi"]))
    scale = alt.Scale(type="log") if log_y else alt.Scale(zero=False)
    base = alt.Chart(data(frame, cols)).encode(x=_n_axis(), color=alt.Color("policy:N", title="batch policy"))
    layers = []
    if band and f"{y}_lo" in frame.columns:
        layers.append(base.mark_area(opacity=0.2).encode(y=alt.Y(f"{y}_lo:Q", scale=scale), y2=f"{y}_hi:Q"))
    layers.append(base.mark_line(point=True).encode(
        y=alt.Y(f"{y}:Q", title=y_title, scale=scale, axis=alt.Axis(format=fmt)),
        strokeDash=alt.StrokeDash("policy:N", scale=POLICY_DASH, legend=None), tooltip=CURVE_TOOLTIP))
    if knees.height:
        k = knees.filter(pl.col("knee_found")).join(
            frame.select("policy", pl.col("n_gpus").cast(pl.Float64), y), left_on=["policy", "inflection_n"], right_on=["policy", "n_gpus"],
            how="inner") if "inflection_n" in knees.columns else knees.clear()
        if k.height:
            layers.append(alt.Chart(data(k)).mark_point(shape="diamond", size=160, filled=True, stroke="black").encode(
                x=alt.X("inflection_n:Q"), y=alt.Y(f"{y}:Q"), color=alt.Color("policy:N"),
                tooltip=[alt.Tooltip("policy:N"), alt.Tooltip("inflection_n:Q", title="knee N", format=","),
                         alt.Tooltip("inflection_n_lo:Q", title="knee N (low)", format=","),
                         alt.Tooltip("inflection_n_hi:Q", title="knee N (high)", format=","),
                         alt.Tooltip("explanation:N")]))
    if threshold is not None:
        layers.append(alt.Chart(data(pl.DataFrame({"t": [threshold]}))).mark_rule(color="gray", strokeDash=[4, 4])
                      .encode(y="t:Q"))
    if measured is not None and measured.height and y in measured.columns:
        layers.append(alt.Chart(data(measured)).mark_point(shape="circle", size=60, filled=True, color="black").encode(
            x=alt.X("n_gpus:Q"), y=alt.Y(f"{y}:Q"),
            tooltip=[alt.Tooltip("run_id:N"), alt.Tooltip("source:N"), alt.Tooltip("n_gpus:Q", format=","),
                     alt.Tooltip("global_batch_seqs:Q", title="batch (seqs)"),
                     alt.Tooltip(f"{y}:Q", title=f"measured {y_title}", format=",.3~f")]))
    return layer(*layers, title=title, width=WIDTH, height=HEIGHT)


def measured_series_chart(series: pl.DataFrame, y: str, y_title: str, title: str) -> dict:
    """Measured scaling series (filled) beside the analytical/calibrated prediction at each measured layout
    (open), one color per series, lines joining each series' points."""
    if series.height == 0:
        return alt.Chart(data(pl.DataFrame({"t": ["no measured series with 3+ cluster sizes on this hardware"]}))) \
            .mark_text(size=13).encode(text="t:N").properties(title=title, width=WIDTH, height=60).to_dict(validate=False)
    long = pl.concat([
        series.select("series", "run_id", "model_name", "n_gpus", pl.col(f"measured_{y}").alias("value"),
                      pl.lit("measured").alias("kind")),
        series.select("series", "run_id", "model_name", "n_gpus", pl.col(f"predicted_{y}").alias("value"),
                      pl.lit("predicted at that layout").alias("kind")),
    ]).filter(pl.col("value").is_not_null())
    base = alt.Chart(data(long)).encode(
        x=_n_axis(), y=alt.Y("value:Q", title=y_title, scale=alt.Scale(type="log"), axis=alt.Axis(format="~s")),
        color=alt.Color("series:N", title="measured series"),
        tooltip=[alt.Tooltip("series:N"), alt.Tooltip("run_id:N"), alt.Tooltip("model_name:N", title="model"),
                 alt.Tooltip("n_gpus:Q", title="N", format=","), alt.Tooltip("kind:N"),
                 alt.Tooltip("value:Q", title=y_title, format=",.3~f")])
    pts = base.mark_point(size=50).encode(shape=alt.Shape("kind:N", title=""),
                                          fill=alt.condition(alt.datum.kind == "measured", "series:N",
                                                             alt.value("transparent")))
    line = base.transform_filter(alt.datum.kind == "measured").mark_line(opacity=0.4)
    return layer(line, pts, title=title, width=WIDTH + 120, height=HEIGHT)


def measured_vs_predicted(df: pl.DataFrame, pred_col: str, title: str) -> dict:
    """Scatter of measured vs predicted tokens/s/GPU (log-log) with the y = x line, colored by source."""
    d = df.filter(pl.col(pred_col).is_not_null() & pl.col("measured_tokens_per_s_per_gpu").is_not_null()
                  & (pl.col(pred_col) > 0) & (pl.col("measured_tokens_per_s_per_gpu") > 0))
    lo = float(min(d[pred_col].min() or 1, d["measured_tokens_per_s_per_gpu"].min() or 1)) if d.height else 1.0
    hi = float(max(d[pred_col].max() or 10, d["measured_tokens_per_s_per_gpu"].max() or 10)) if d.height else 10.0
    diag = alt.Chart(data(pl.DataFrame({"x": [lo, hi]}))).mark_line(color="gray", strokeDash=[4, 4]).encode(x="x:Q", y="x:Q")
    d = data(d, ["run_id", "source", "gpu", "n_gpus", "measured_tokens_per_s_per_gpu", pred_col])
    pts = alt.Chart(d).mark_circle(size=30, opacity=0.7).encode(
        x=alt.X("measured_tokens_per_s_per_gpu:Q", title="measured tokens/s/GPU (log)", scale=alt.Scale(type="log"),
                axis=alt.Axis(format="~s")),
        y=alt.Y(f"{pred_col}:Q", title="predicted tokens/s/GPU (log)", scale=alt.Scale(type="log"),
                axis=alt.Axis(format="~s")),
        color=alt.Color("source:N", legend=alt.Legend(columns=1, labelLimit=220)),
        tooltip=[alt.Tooltip("run_id:N"), alt.Tooltip("source:N"), alt.Tooltip("gpu:N"), alt.Tooltip("n_gpus:Q"),
                 alt.Tooltip("measured_tokens_per_s_per_gpu:Q", title="measured", format=",.0f"),
                 alt.Tooltip(f"{pred_col}:Q", title="predicted", format=",.0f")])
    return layer(diag, pts, title=title, width=WIDTH, height=WIDTH)


def residual_strip(df: pl.DataFrame, group: str, err_col: str, title: str) -> dict:
    """Relative error (predicted/measured − 1) per group: a tick per run and the group median."""
    d = data(df.filter(pl.col(err_col).is_not_null() & pl.col(err_col).is_finite()),
             ["run_id", group, "estimate", err_col])
    ticks = alt.Chart(d).mark_tick(opacity=0.5).encode(
        y=alt.Y(f"{group}:N", title=None, sort="-x", axis=alt.Axis(labelLimit=260)),
        x=alt.X(f"{err_col}:Q", title="relative error of tokens/s/GPU (predicted/measured − 1)",
                axis=alt.Axis(format="%"), scale=alt.Scale(domain=[-1, 2], clamp=True)),
        color=alt.Color("estimate:N", title="estimate"),
        tooltip=[alt.Tooltip("run_id:N"), alt.Tooltip(f"{group}:N"), alt.Tooltip("estimate:N"),
                 alt.Tooltip(f"{err_col}:Q", title="relative error", format="+.1%")])
    med = alt.Chart(d).mark_point(shape="diamond", size=80, filled=True, color="black").encode(
        y=alt.Y(f"{group}:N", sort="-x"), x=alt.X(f"median({err_col}):Q"), shape=alt.Shape("estimate:N", title=""),
        tooltip=[alt.Tooltip(f"{group}:N"), alt.Tooltip("estimate:N"),
                 alt.Tooltip(f"median({err_col}):Q", title="median error", format="+.1%"),
                 alt.Tooltip("count():Q", title="runs")])
    return layer(ticks, med, title=title, width=WIDTH + 80)


def coverage_bars(cov: pl.DataFrame, group: str, title: str, nominal: float | None) -> dict:
    bars = alt.Chart(data(cov)).mark_bar().encode(
        y=alt.Y(f"{group}:N", title=None, sort="-x", axis=alt.Axis(labelLimit=260)),
        x=alt.X("coverage:Q", title="share of measured runs inside the interval", axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1])),
        tooltip=[alt.Tooltip(f"{group}:N"), alt.Tooltip("coverage:Q", format=".1%"), alt.Tooltip("runs:Q")])
    layers = [bars]
    if nominal is not None:
        layers.append(alt.Chart(data(pl.DataFrame({"c": [nominal]}))).mark_rule(color="red").encode(x="c:Q"))
    return layer(*layers, title=title, width=WIDTH)


def frontier_chart(fr: pl.DataFrame, title: str) -> dict:
    """Utilization vs training compute per accelerator; the frontier point of each as a large dot."""
    d = data(fr.filter(pl.col("feasible")), ["gpu", "training_flop", "params", "tokens", "n_gpus", "tp", "pp", "dp",
                                              "utilization", "time_to_train_days", "cost_usd", "is_frontier"])
    tip = [alt.Tooltip("gpu:N", title="accelerator"), alt.Tooltip("training_flop:Q", title="training FLOP", format=".3~e"),
           alt.Tooltip("params:Q", format=".3~s"), alt.Tooltip("tokens:Q", format=".3~s"),
           alt.Tooltip("n_gpus:Q", title="N", format=","), alt.Tooltip("tp:Q"), alt.Tooltip("pp:Q"),
           alt.Tooltip("dp:Q"), alt.Tooltip("utilization:Q", format=".1%"),
           alt.Tooltip("time_to_train_days:Q", title="days", format=",.1f"),
           alt.Tooltip("cost_usd:Q", title="cost (USD)", format="$,.3s")]
    sel = alt.selection_point(fields=["gpu"], bind="legend")
    base = alt.Chart(d).encode(
        x=alt.X("training_flop:Q", title="training compute, 6·params·tokens (FLOP, log)", scale=alt.Scale(type="log"),
                axis=alt.Axis(format=".0e")),
        y=alt.Y("utilization:Q", title="utilization (MFU) of the best layout", axis=alt.Axis(format="%")),
        color=alt.Color("gpu:N", title="accelerator", legend=alt.Legend(columns=2)),
        opacity=alt.condition(sel, alt.value(0.9), alt.value(0.1)), tooltip=tip)
    line = base.mark_line().add_params(sel)
    top = base.transform_filter(alt.datum.is_frontier).mark_point(size=120, filled=True, stroke="black")
    return layer(line, top, title=title, width=640, height=360)


def choice_chart(df: pl.DataFrame, title: str) -> dict:
    """Time to train vs cost for one target run, one point per (accelerator, N); Pareto-efficient ones ringed."""
    d = data(df.filter(pl.col("feasible") & pl.col("cost_usd").is_not_null()), CURVE_COLUMNS)
    base = alt.Chart(d).encode(
        x=alt.X("time_to_train_days:Q", title="time to train (days, log)", scale=alt.Scale(type="log")),
        y=alt.Y("cost_usd:Q", title="cost (USD at on-demand cloud prices, log)", scale=alt.Scale(type="log"),
                axis=alt.Axis(format="$~s")),
        color=alt.Color("gpu:N", title="accelerator", legend=alt.Legend(columns=2)),
        tooltip=[alt.Tooltip("gpu:N", title="accelerator"), *CURVE_TOOLTIP,
                 alt.Tooltip("usd_per_gpu_hour:Q", title="USD per GPU-hour", format="$.2f")])
    pts = base.mark_circle(size=45, opacity=0.75)
    front = base.transform_filter(alt.datum.cost_pareto).mark_point(size=140, color="black")
    return layer(pts, front, title=title, width=560, height=340)
