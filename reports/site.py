"""The static report site: index, a scaling page per accelerator, calibration, frontier, hardware choice.

`build_site(folder, tables)` gets DataFrames (the assets read them from the store: reports/ never touches the
database) and writes plain HTML files that open offline from disk: every page carries the Vega/Vega-Lite/
vega-embed JavaScript inline (vl-convert's bundle, what Altair's `save(..., inline=True)` embeds) and its data
inline; nothing is fetched from a network. The site is written to a temporary folder beside the target and
swapped in at the end, so a failed build leaves the previous site untouched. Key charts are also exported as
PNG (`img/`) for the README.
"""

from __future__ import annotations

import html
import json
import os
import shutil
from pathlib import Path

import altair as alt
import polars as pl

from models.curves import DEFAULT_THRESHOLD, REFERENCE_RUNS
from reports import charts

SERIES_MIN_SIZES = 3
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#222;
line-height:1.45;padding:0 16px} h1{font-size:1.6em} h2{margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.88em;margin:8px 0} td,th{border:1px solid #ddd;padding:3px 7px;
text-align:right} th{background:#f4f4f4} td:first-child,th:first-child{text-align:left} nav a{margin-right:14px}
.note{background:#f7f7f2;border-left:4px solid #c8b900;padding:6px 12px;margin:10px 0} .chart{margin:14px 0}
.grid{display:flex;flex-wrap:wrap;gap:10px} small{color:#666}
"""


def _bundle() -> str:
    import vl_convert as vlc
    from altair.utils._importers import vl_version_for_vl_convert

    return vlc.javascript_bundle(vl_version=vl_version_for_vl_convert())


class Page:
    """One HTML page: text blocks and charts in order, rendered with the inline JavaScript bundle."""

    def __init__(self, title: str, depth: int = 0):
        self.title, self.depth, self.parts, self.specs = title, depth, [], []

    def h(self, text: str, level: int = 2) -> None:
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def p(self, text_html: str, cls: str = "") -> None:
        self.parts.append(f'<p class="{cls}">{text_html}</p>' if cls else f"<p>{text_html}</p>")

    def raw(self, text_html: str) -> None:
        self.parts.append(text_html)

    def chart(self, chart, name: str) -> dict:
        spec = charts.to_spec(chart)
        div = f"chart-{len(self.specs)}"
        self.specs.append((div, spec))
        self.parts.append(f'<div class="chart" id="{div}" data-chart="{html.escape(name)}"></div>')
        return spec

    def table(self, df: pl.DataFrame, formats: dict[str, str] | None = None, links: dict[str, str] | None = None
              ) -> None:
        formats = formats or {}
        head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
        rows = []
        for r in df.iter_rows(named=True):
            cells = []
            for c in df.columns:
                v = r[c]
                txt = "—" if v is None else (formats[c].format(v) if c in formats else str(v))
                txt = html.escape(txt)
                if links and c in links and v is not None:
                    txt = f'<a href="{html.escape(links[c].format(v))}">{txt}</a>'
                cells.append(f"<td>{txt}</td>")
            rows.append("<tr>" + "".join(cells) + "</tr>")
        self.parts.append(f"<table><tr>{head}</tr>{''.join(rows)}</table>")

    def render(self, bundle: str) -> str:
        up = "../" * self.depth
        nav = (f'<nav><a href="{up}index.html">index</a><a href="{up}frontier.html">frontier</a>'
               f'<a href="{up}hardware-choice.html">hardware choice</a><a href="{up}calibration.html">calibration</a>'
               f"</nav>")
        embeds = "\n".join(
            f"vegaEmbed('#{div}', {json.dumps(spec)}, {{actions: false, renderer: 'svg'}})"
            f".catch(function(e) {{ console.error(e); }});" for div, spec in self.specs)
        return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"UTF-8\"><title>{html.escape(self.title)}"
                f"</title><style>{CSS}</style>\n<script type=\"text/javascript\">\n{bundle}\n</script></head>\n"
                f"<body>{nav}<h1>{html.escape(self.title)}</h1>\n" + "\n".join(self.parts)
                + f"\n<script type=\"text/javascript\">\n{embeds}\n</script>\n</body></html>\n")


# ------------------------------------------------------------------ data shaping (pure)

def measured_series(pred: pl.DataFrame, runs: pl.DataFrame | None = None) -> pl.DataFrame:
    """Measured scaling series: runs of one (source, accelerator) at ≥ 3 cluster sizes, with the measured and
    predicted tokens/s/GPU and MFU at each run's own layout (measured MFU = predicted MFU × measured/predicted
    throughput: one FLOP convention for both). vTrain's single-node file is left out (1,440 layouts on ≤ 8
    GPUs: a layout study, not a scaling series)."""
    if pred.height == 0:
        return pl.DataFrame()
    d = pred.filter(pl.col("measured_tokens_per_s_per_gpu").is_not_null() & pl.col("n_gpus").is_not_null()
                    & pl.col("tokens_per_s_per_gpu").is_not_null() & ~pl.col("source").str.contains("single-node"))
    if runs is not None and "arch_id" in runs.columns and "arch_id" not in d.columns:
        d = d.join(runs.select("run_id", "arch_id"), on="run_id", how="left")
    sizes = d.group_by("source", "gpu").agg(pl.col("n_gpus").n_unique().alias("sizes"))
    d = d.join(sizes.filter(pl.col("sizes") >= SERIES_MIN_SIZES), on=["source", "gpu"], how="inner")
    return d.with_columns(
        pl.col("source").str.replace(r" \(.*", "").alias("series"),
        pl.col("tokens_per_s_per_gpu").alias("predicted_tokens_per_s_per_gpu"),
        (pl.col("mfu") * pl.col("measured_tokens_per_s_per_gpu") / pl.col("tokens_per_s_per_gpu")).alias("measured_mfu"),
        pl.col("mfu").alias("predicted_mfu"),
    )


def cost_pareto(df: pl.DataFrame) -> pl.DataFrame:
    """Flag the (time, cost) points no other point beats on both (per target run)."""
    d = df.filter(pl.col("feasible") & pl.col("cost_usd").is_not_null()).sort(["time_to_train_days", "cost_usd"])
    best, flags = float("inf"), []
    for c in d["cost_usd"].to_list():
        flags.append(c < best)
        best = min(best, c)
    return d.with_columns(pl.Series("cost_pareto", flags, dtype=pl.Boolean))


# ------------------------------------------------------------------ the site

def _fmt_n(v) -> str:
    return "—" if v is None else f"{v:,.0f}"


def build_site(folder: str | Path, tables: dict[str, pl.DataFrame | None], *, png: bool = True) -> list[Path]:
    """Write the site (see ``_build``). Altair's per-object JSON-schema validation is switched off while
    building (it costs ~0.4 s per chart); the specs are plain Vega-Lite that vega-embed checks when rendering,
    and the browser tests fail on any rendering error."""
    from altair.utils import schemapi

    try:
        with schemapi.debug_mode(False):
            return _build(folder, tables, png=png)
    except BaseException:
        target = Path(folder).resolve()
        shutil.rmtree(target.with_name(f".{target.name}.{os.getpid()}.tmp"), ignore_errors=True)
        raise
    finally:
        charts.forget_data()


def _build(folder: str | Path, tables: dict[str, pl.DataFrame | None], *, png: bool = True) -> list[Path]:
    """Write the site into ``folder`` (replaced atomically). ``tables``: scaling_curves, inflection_points,
    frontier, analytical_predictions, runs, hardware (required); calibrated_predictions, fits (optional).
    Returns the files written (final paths)."""
    folder = Path(folder).resolve()
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "hardware").mkdir(parents=True)
    (tmp / "img").mkdir()
    alt.data_transformers.disable_max_rows()
    bundle = _bundle()
    written: list[Path] = []
    pngs: dict[str, dict] = {}

    def save(page: Page, rel: str) -> None:
        (tmp / rel).write_text(page.render(bundle), encoding="utf-8")
        written.append(folder / rel)

    curves = tables["scaling_curves"]
    knees = tables["inflection_points"]
    fr = tables["frontier"]
    pred = tables["analytical_predictions"]
    runs = tables.get("runs")
    hw = tables["hardware"]
    cal = tables.get("calibrated_predictions")
    fits = tables.get("fits")
    calibrated = bool(curves["calibrated"].any()) if "calibrated" in curves.columns and curves.height else False
    cal_note = (curves.filter(pl.col("calibrated"))["calibration_note"][0] if calibrated
                else (curves["calibration_note"][0] if curves.height else "no curves"))
    series = measured_series(pred, runs)
    gpus = sorted(curves["gpu"].unique().to_list()) if curves.height else []
    names = dict(zip(hw["id"].to_list(), hw["name"].to_list())) if hw.height else {}

    # ---------------- hardware pages
    for gpu in gpus:
        page = Page(f"Scaling curves — {names.get(gpu, gpu)} ({gpu})", depth=1)
        c = curves.filter(pl.col("gpu") == gpu)
        k = knees.filter(pl.col("gpu") == gpu)
        page.p(f"Best layout at each cluster size N for the reference runs, per batch policy (strong: fixed global "
               f"batch; weak: one sequence per accelerator; critical: weak scaling up to the DeepSeek LLM 2024 "
               f"critical batch for the run's compute). Bands: calibrated interval (absent when the curve is "
               f"analytical only). Diamonds: the inflection point, the smallest N whose marginal efficiency "
               f"falls below {DEFAULT_THRESHOLD:g} — from there each added accelerator delivers less than "
               f"{DEFAULT_THRESHOLD:.0%} of what an accelerator of the smallest cluster delivers. Black circles: "
               f"measured runs of the same model on this accelerator. <b>{html.escape(cal_note)}</b>.", "note")
        for ref in REFERENCE_RUNS:
            rc = c.filter(pl.col("arch_id") == ref["arch_id"])
            if rc.height == 0:
                continue
            rk = k.filter(pl.col("arch_id") == ref["arch_id"])
            meas = (series.filter((pl.col("gpu") == gpu) & (pl.col("arch_id") == ref["arch_id"]))
                    .select("run_id", "source", "n_gpus", "global_batch_seqs",
                            pl.col("measured_tokens_per_s_per_gpu").alias("tokens_per_s_per_gpu"),
                            pl.col("measured_mfu").alias("mfu"))
                    if series.height and "arch_id" in series.columns else None)
            meas_total = meas.with_columns((pl.col("tokens_per_s_per_gpu") * pl.col("n_gpus")).alias("tokens_per_s")) \
                if meas is not None else None
            page.h(f"{ref['arch_id']}: sequence {ref['seq_len']:,}, {ref['tokens']:.3g} tokens")
            page.p(f"<small>{html.escape(ref['source'])}. Strong-scaling batch {ref['global_batch_seqs']:,} "
                   f"sequences.</small>")
            tot = charts.curve_panel(rc, rk, meas_total, "tokens_per_s", "whole-cluster throughput",
                                     "tokens/s (log)")
            per = charts.curve_panel(rc, rk, meas, "tokens_per_s_per_gpu", "throughput per accelerator",
                                     "tokens/s per GPU (log)")
            mfu = charts.curve_panel(rc, rk, meas, "mfu", "model FLOPs utilization", "MFU", log_y=False, fmt="%")
            me = charts.curve_panel(rc, rk, None, "marginal_efficiency", "marginal efficiency",
                                    "marginal efficiency (1 = linear)", log_y=False, fmt=".1f", threshold=DEFAULT_THRESHOLD)
            spec = page.chart(charts.vconcat(charts.hconcat(tot, per), charts.hconcat(mfu, me)), f"{gpu}-{ref['arch_id']}")
            if gpu == "h100-sxm5-80gb" and ref["arch_id"] == "gpt3-175b":
                pngs["scaling-h100-gpt3-175b"] = spec
            page.table(rk.select("policy", "inflection_n", "inflection_n_lo", "inflection_n_hi", "usl_sigma",
                                 "usl_kappa", "usl_peak_n", "explanation"),
                       {"inflection_n": "{:,.0f}", "inflection_n_lo": "{:,.0f}", "inflection_n_hi": "{:,.0f}",
                        "usl_sigma": "{:.3g}", "usl_kappa": "{:.3g}", "usl_peak_n": "{:,.0f}"})
        page.h("Measured scaling series on this accelerator")
        s = series.filter(pl.col("gpu") == gpu) if series.height else series
        page.p("Each series: one source's runs at three or more cluster sizes (models and batches may change along "
               "a weak-scaling series). Filled: measured; open: stepcast's prediction at exactly that run's layout "
               "(analytical model, `analytical_predictions`).", "note")
        page.chart(charts.hconcat(
            charts.measured_series_chart(s, "tokens_per_s_per_gpu", "tokens/s per GPU (log)", "throughput per GPU"),
            charts.measured_series_chart(s, "mfu", "MFU (log)", "model FLOPs utilization")), f"{gpu}-measured")
        page.h("Best layout at each N")
        page.table(c.filter(pl.col("feasible")).select(
            "arch_id", "policy", "n_gpus", "global_batch_seqs", "tp", "pp", "dp", "cp", "vpp", "micro_batch",
            "sharding", "recompute", "tokens_per_s_per_gpu", "mfu", "time_to_train_days", "cost_usd",
            "parallel_efficiency", "marginal_efficiency"),
            {"n_gpus": "{:,}", "tokens_per_s_per_gpu": "{:,.0f}", "mfu": "{:.1%}", "time_to_train_days": "{:,.1f}",
             "cost_usd": "${:,.0f}", "parallel_efficiency": "{:.2f}", "marginal_efficiency": "{:.2f}"})
        save(page, f"hardware/{gpu}.html")

    # ---------------- frontier
    page = Page("Compute frontier per accelerator")
    months = fr["months"].drop_nulls()[0] if "months" in fr.columns and fr["months"].drop_nulls().len() else None
    minu = fr["min_utilization"].drop_nulls()[0] if "min_utilization" in fr.columns and \
        fr["min_utilization"].drop_nulls().len() else None
    page.p(f"For each training compute C: the Chinchilla-optimal dense model (tokens = 20 × parameters, Hoffmann "
           f"et al. 2022; GPT-3-shaped: d_model/layers = 128, heads of 128), the DeepSeek LLM 2024 batch ceiling, "
           f"and the cluster/layout with the best utilization that finishes within {months or '?'} months. A "
           f"large dot marks each accelerator's frontier: the largest C whose utilization stays ≥ {minu or '?'} × "
           f"its best. Click a legend entry to highlight one accelerator. <b>{html.escape(cal_note)}</b>.", "note")
    spec = page.chart(charts.frontier_chart(fr, f"utilization vs training compute ({months or '?'}-month limit)"),
                      "frontier")
    pngs["frontier"] = spec
    top = fr.filter(pl.col("is_frontier")) if "is_frontier" in fr.columns else fr.clear()
    page.table(top.sort("training_flop", descending=True).select(
        "gpu", "training_flop", "params", "tokens", "n_gpus", "tp", "pp", "dp", "utilization", "best_utilization",
        "time_to_train_days", "cost_usd"),
        {"training_flop": "{:.3g}", "params": "{:.3g}", "tokens": "{:.3g}", "n_gpus": "{:,}", "utilization": "{:.1%}",
         "best_utilization": "{:.1%}", "time_to_train_days": "{:,.0f}", "cost_usd": "${:,.0f}"},
        {"gpu": "hardware/{}.html"})
    none = fr.filter(~pl.col("gpu").is_in(top["gpu"].to_list())).group_by("gpu").agg(pl.col("reason").drop_nulls()
                                                                                    .first())
    if none.height:
        page.p("Accelerators without a frontier: " + "; ".join(
            f"{html.escape(r['gpu'])}: {html.escape(str(r['reason']))}" for r in none.iter_rows(named=True)))
    save(page, "frontier.html")

    # ---------------- hardware choice
    page = Page("Hardware choice: time vs cost for the reference runs")
    page.p("Each point: one accelerator at one cluster size N with its best layout (strong scaling at the run's "
           "batch), cost = N × time × on-demand price per accelerator-hour (`hardware.cloud_usd_per_hour`, the "
           "SkyPilot-catalog median; accelerators without a price are left out). Black rings: Pareto-efficient "
           f"choices (nothing is both faster and cheaper). <b>{html.escape(cal_note)}</b>.", "note")
    for ref in REFERENCE_RUNS:
        d = cost_pareto(curves.filter((pl.col("arch_id") == ref["arch_id"]) & (pl.col("policy") == "strong")))
        spec = page.chart(charts.choice_chart(d, f"{ref['arch_id']}, {ref['tokens']:.3g} tokens: time vs cost"),
                          f"choice-{ref['arch_id']}")
        pngs.setdefault("hardware-choice", spec)
        page.table(d.filter(pl.col("cost_pareto")).select("gpu", "n_gpus", "tp", "pp", "dp", "time_to_train_days",
                                                           "cost_usd", "mfu"),
                   {"n_gpus": "{:,}", "time_to_train_days": "{:,.1f}", "cost_usd": "${:,.0f}", "mfu": "{:.1%}"},
                   {"gpu": "hardware/{}.html"})
    unpriced = sorted(set(gpus) - set(curves.filter(pl.col("usd_per_gpu_hour").is_not_null())["gpu"].to_list()))
    page.p("No price (no cost): " + ", ".join(unpriced))
    save(page, "hardware-choice.html")

    # ---------------- calibration
    page = Page("Calibration: measured vs predicted")
    scored = pred.filter(pl.col("scored")) if "scored" in pred.columns else pred
    long = scored.select("run_id", "source", "gpu", "n_gpus", "measured_tokens_per_s_per_gpu",
                         "tokens_per_s_per_gpu", "rel_error").with_columns(pl.lit("analytical").alias("estimate"))
    shown = "analytical only (no `calibrated_predictions` table in the store yet)"
    cov = None
    if cal is not None and cal.height and "tokens_per_s_per_gpu" in cal.columns:
        cj = cal.select("run_id", *[c for c in ("tokens_per_s_per_gpu", "tokens_per_s_per_gpu_lo",
                                                "tokens_per_s_per_gpu_hi", "fit_version") if c in cal.columns])
        cj = cj.unique("run_id", keep="first").rename({c: f"cal_{c}" for c in cj.columns if c != "run_id"})
        both = scored.join(cj, on="run_id", how="inner")
        if both.height:
            long = pl.concat([long, both.select(
                "run_id", "source", "gpu", "n_gpus", "measured_tokens_per_s_per_gpu",
                pl.col("cal_tokens_per_s_per_gpu").alias("tokens_per_s_per_gpu"),
                (pl.col("cal_tokens_per_s_per_gpu") / pl.col("measured_tokens_per_s_per_gpu") - 1).alias("rel_error"),
                pl.lit("calibrated").alias("estimate"))], how="vertical_relaxed")
            shown = "analytical and calibrated" + (f" (fit {both['cal_fit_version'][0]})"
                                                   if "cal_fit_version" in both.columns else "")
            if "cal_tokens_per_s_per_gpu_lo" in both.columns:
                inside = both.with_columns(((pl.col("measured_tokens_per_s_per_gpu") >= pl.col("cal_tokens_per_s_per_gpu_lo"))
                                            & (pl.col("measured_tokens_per_s_per_gpu") <= pl.col("cal_tokens_per_s_per_gpu_hi")))
                                           .alias("inside"))
                cov = {g: inside.group_by(g).agg(pl.col("inside").mean().alias("coverage"),
                                                 pl.len().alias("runs")) for g in ("source", "gpu")}
    page.p(f"Shown: <b>{html.escape(shown)}</b>. Runs with a measured throughput target (`scored`); the error is "
           f"predicted/measured − 1 of tokens/s per GPU. Note: the calibrated column is the in-sample prediction "
           f"of the promoted fit as stored; its grouped (leave-one-source-out) error is in the `fits` table.", "note")
    a_only = long.filter(pl.col("estimate") == "analytical")
    panels = [charts.measured_vs_predicted(a_only, "tokens_per_s_per_gpu", "analytical model")]
    c_only = long.filter(pl.col("estimate") == "calibrated")
    if c_only.height:
        panels.append(charts.measured_vs_predicted(c_only, "tokens_per_s_per_gpu", "calibrated"))
    page.chart(charts.hconcat(*panels), "measured-vs-predicted")
    page.chart(charts.hconcat(charts.residual_strip(long, "source", "rel_error", "error by source"),
                           charts.residual_strip(long, "gpu", "rel_error", "error by accelerator")), "residuals")
    page.h("Interval coverage")
    if cov is not None:
        nominal = None
        if fits is not None and fits.height and "alpha" in fits.columns:
            nominal = 1.0 - float(fits["alpha"][0])
        page.chart(charts.hconcat(charts.coverage_bars(cov["source"], "source", "coverage by source", nominal),
                               charts.coverage_bars(cov["gpu"], "gpu", "coverage by accelerator", nominal)),
                   "coverage")
    else:
        page.p("No intervals yet: the analytical model gives point predictions only; coverage appears here once a "
               "calibrated fit with intervals is promoted.")
    summary = long.group_by("estimate").agg(pl.len().alias("runs"), pl.col("rel_error").abs().median().alias("MdAPE"),
                                            (pl.col("rel_error").abs() <= 0.1).mean().alias("within ±10%"))
    page.table(summary.sort("estimate"), {"MdAPE": "{:.1%}", "within ±10%": "{:.0%}"})
    if fits is not None and fits.height:
        cols = [c for c in fits.columns if c in ("version", "fit_version", "promoted", "created_at", "model_kind",
                                                  "loso_mdape", "loho_mdape", "coverage_loso", "coverage_loho")]
        if cols:
            page.h("Fits")
            page.table(fits.select(cols).head(10))
    save(page, "calibration.html")

    # ---------------- index
    page = Page("stepcast reports")
    page.p(f"Where does a training run stop gaining from more accelerators, and what can each accelerator train at "
           f"all? Curves: <b>{html.escape(cal_note)}</b>. Built from the store's tables `scaling_curves`, "
           f"`inflection_points`, `frontier`, `analytical_predictions`"
           f"{', `calibrated_predictions`' if cal is not None else ''}.", "note")
    page.p(f"<b>Inflection point</b>: the smallest N whose marginal efficiency — throughput gained per added "
           f"accelerator, relative to the average accelerator of the smallest feasible cluster — falls below "
           f"{DEFAULT_THRESHOLD:g}; sizes beaten by a larger, more efficient size are skipped. The interval comes "
           f"from the calibrated bounds. A Universal Scalability Law fit X(N) = λn/(1+σ(n−1)+κn(n−1)) explains it: "
           f"σ contention, κ coherency, peak at n* = √((1−σ)/κ).")
    page.h("Pages")
    page.raw("<ul>" + "".join(f'<li><a href="{p}">{t}</a></li>' for p, t in (
        ("frontier.html", "compute frontier per accelerator"), ("hardware-choice.html", "hardware choice: time vs cost"),
        ("calibration.html", f"calibration: measured vs predicted ({html.escape(shown)})"))) + "</ul>")
    page.h("Inflection points (reference runs, strong scaling)")
    strong = knees.filter(pl.col("policy") == "strong").sort("gpu", "arch_id")
    page.table(strong.select("gpu", "arch_id", "n_min_feasible", "inflection_n", "inflection_n_lo", "inflection_n_hi",
                             "usl_sigma", "usl_kappa", "usl_peak_n"),
               {"inflection_n": "{:,.0f}", "inflection_n_lo": "{:,.0f}", "inflection_n_hi": "{:,.0f}",
                "usl_sigma": "{:.3g}", "usl_kappa": "{:.3g}", "usl_peak_n": "{:,.0f}"}, {"gpu": "hardware/{}.html"})
    sm = strong.filter(pl.col("arch_id") == REFERENCE_RUNS[0]["arch_id"]) if strong.height else strong
    if sm.height:
        chart = alt.Chart(charts.data(sm.with_columns(pl.col("inflection_n").fill_null(pl.col("n_max_swept"))),
                                      ["gpu", "inflection_n", "knee_found", "explanation"])).mark_bar().encode(
            y=alt.Y("gpu:N", sort="-x", title=None), x=alt.X("inflection_n:Q", scale=alt.Scale(type="log"),
                                                             title="inflection point N (log; no knee → largest N swept)"),
            color=alt.Color("knee_found:N", title="knee found"),
            tooltip=[alt.Tooltip("gpu:N"), alt.Tooltip("inflection_n:Q", format=","),
                     alt.Tooltip("explanation:N")]).properties(
            title=f"{REFERENCE_RUNS[0]['arch_id']}, strong scaling: where marginal efficiency drops below "
                  f"{DEFAULT_THRESHOLD:g}", width=560)
        page.chart(chart, "index-knees")
    page.h("Frontier")
    page.table(top.sort("training_flop", descending=True).select("gpu", "training_flop", "n_gpus", "utilization"),
               {"training_flop": "{:.3g}", "n_gpus": "{:,}", "utilization": "{:.1%}"}, {"gpu": "hardware/{}.html"})
    save(page, "index.html")

    if png:
        _pngs(pngs, tmp / "img", folder / "img", written)
    # swap in
    old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)
    return written


def _pngs(specs: dict[str, dict], tmp_dir: Path, final_dir: Path, written: list[Path]) -> None:
    """PNG exports of key charts with vl-convert (offline: it bundles Vega and its fonts)."""
    import vl_convert as vlc

    for name, spec in specs.items():
        data = vlc.vegalite_to_png(json.dumps(spec), scale=1.5)
        (tmp_dir / f"{name}.png").write_bytes(data)
        written.append(final_dir / f"{name}.png")
