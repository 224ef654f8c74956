"""The static report site: index, a scaling page per accelerator, calibration, frontier, hardware choice.

`build_site(folder, tables)` gets DataFrames (the assets read them from the store: reports/ never touches the
database) and writes plain HTML files that open offline from disk: the Vega/Vega-Lite/vega-embed JavaScript
(vl-convert's bundle, what Altair's `save(..., inline=True)` embeds) is written ONCE beside the pages
(`vega-bundle.js`, loaded with a relative `<script src>`), each page carries its own data inline, and nothing is
fetched from a network. A chart that would have nothing to draw is replaced by a sentence saying why. The site is
written to a temporary folder beside the target and swapped in at the end, so a failed build leaves the previous
site untouched. The folder holds the pages and the bundle they load, nothing else.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import altair as alt
import polars as pl

from models.fitting import calibration
from models.planning.curves import DEFAULT_THRESHOLD, REFERENCE_RUNS
from reports import charts

SERIES_MIN_SIZES = 3
BUNDLE = "vega-bundle.js"
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#222;
line-height:1.45;padding:0 16px} h1{font-size:1.6em} h2{margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.88em;margin:8px 0;display:block;max-width:100%;overflow-x:auto}
td,th{border:1px solid #ddd;padding:3px 7px;text-align:right} th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left} td.text{text-align:left;min-width:14em} nav a{margin-right:14px}
.note{background:#f7f7f2;border-left:4px solid #c8b900;padding:6px 12px;margin:10px 0}
.caveat{background:#fff4f0;border-left:4px solid #d9541e;padding:6px 12px;margin:10px 0}
.empty{color:#555;font-style:italic;border:1px dashed #bbb;padding:10px 14px;margin:10px 0}
.chart{margin:14px 0;max-width:100%;overflow-x:auto} .headline{font-size:1.15em}
.grid{display:flex;flex-wrap:wrap;gap:10px} small{color:#666} ul.cols{columns:3}
"""


# ------------------------------------------------------------------ number formats (as people write them)

def usd(v) -> str:
    """$11.3M, $2.1B, $950K, $740."""
    if v is None:
        return "—"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(v) >= div:
            return f"${v / div:.3g}{suffix}"
    return f"${v:,.0f}"


def si(v) -> str:
    """175B, 3.5T, 8.03B (parameters, tokens)."""
    if v is None:
        return "—"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def flop(v) -> str:
    """3.2e25."""
    return "—" if v is None else f"{v:.2g}".replace("e+", "e")


def pct(v, digits: int = 0) -> str:
    return "—" if v is None else f"{v:.{digits}%}"


def count(v) -> str:
    return "—" if v is None else f"{v:,.0f}"


def days(v) -> str:
    return "—" if v is None else (f"{v:,.1f}" if v < 100 else f"{v:,.0f}")


def layout_expr(prefix: str = "") -> pl.Expr:
    """'TP 8 · PP 8 · DP 16' (CP/EP/interleave/micro-batch/sharding/recompute when present and not trivial)."""
    def part(col: str, label: str) -> pl.Expr:
        c = pl.col(f"{prefix}{col}")
        return pl.when(c.is_not_null() & (c.cast(pl.Utf8) != "1")).then(pl.lit(f"{label} ") + c.cast(pl.Utf8))

    return pl.concat_str([part("tp", "TP"), part("pp", "PP"), part("dp", "DP"), part("cp", "CP"), part("ep", "EP")],
                         separator=" · ", ignore_nulls=True).fill_null("").replace("", "single accelerator")


def with_layout(df: pl.DataFrame) -> pl.DataFrame:
    cols = [c for c in ("tp", "pp", "dp", "cp", "ep") if c not in df.columns]
    d = df.with_columns([pl.lit(None, dtype=pl.Int64).alias(c) for c in cols]) if cols else df
    return df.with_columns(d.select(layout_expr().alias("layout"))["layout"])


def with_display(df: pl.DataFrame) -> pl.DataFrame:
    """Human-readable columns for tooltips: layout, cost, price, parameters, tokens."""
    d = with_layout(df)
    if "cost_usd" in d.columns:
        d = d.with_columns(pl.col("cost_usd").map_elements(usd, return_dtype=pl.Utf8).alias("cost"))
    if "usd_per_gpu_hour" in d.columns:
        d = d.with_columns(pl.col("usd_per_gpu_hour").map_elements(lambda v: f"${v:.2f}", return_dtype=pl.Utf8)
                           .alias("price"))
    for col in ("params", "tokens"):
        if col in d.columns:
            d = d.with_columns(pl.col(col).map_elements(si, return_dtype=pl.Utf8).alias(f"{col}_h"))
    return d


def humane_reason(reason: str | None) -> str:
    """A pipeline reason as a sentence for readers (the store keeps the original)."""
    if not reason:
        return "no reason recorded"
    m = re.search(r"hardware '([^']+)': column '([^']+)' is empty but required by the step-time model", reason)
    if m:
        what = {"intra_node_bw_gbps": "scale-up (intra-node) bandwidth", "inter_node_bw_gbps":
                "scale-out (inter-node) bandwidth"}.get(m.group(2), m.group(2))
        return f"the hardware table gives no {what} for it, which the step-time model needs"
    return reason


class Page:
    """One HTML page: text blocks and charts in order, loading the shared JavaScript bundle beside it."""

    def __init__(self, title: str, depth: int = 0):
        self.title, self.depth, self.parts, self.specs = title, depth, [], []

    def h(self, text: str, level: int = 2) -> None:
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def p(self, text_html: str, cls: str = "") -> None:
        self.parts.append(f'<p class="{cls}">{text_html}</p>' if cls else f"<p>{text_html}</p>")

    def empty(self, why: str) -> None:
        """In place of a chart that has nothing to draw: the reason, as a sentence."""
        self.parts.append(f'<p class="empty">{html.escape(why)}</p>')

    def raw(self, text_html: str) -> None:
        self.parts.append(text_html)

    def chart(self, chart, name: str) -> dict:
        spec = charts.to_spec(chart)
        div = f"chart-{len(self.specs)}"
        self.specs.append((div, spec))
        self.parts.append(f'<div class="chart" id="{div}" data-chart="{html.escape(name)}"></div>')
        return spec

    def table(self, df: pl.DataFrame, formats: dict | None = None, links: dict | None = None,
              text: tuple[str, ...] = ()) -> None:
        """``formats``: column → format string or function of the value; ``links``: column → a link pattern, or
        (pattern, the values that have a page); ``text`` columns align left."""
        formats = formats or {}
        head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
        rows = []
        for r in df.iter_rows(named=True):
            cells = []
            for c in df.columns:
                v, f = r[c], formats.get(c)
                txt = "—" if v is None else (f(v) if callable(f) else f.format(v) if f else str(v))
                txt = html.escape(txt)
                link = links.get(c) if links else None
                target, allowed = link if isinstance(link, tuple) else (link, None)
                if target and v is not None and (allowed is None or v in allowed):
                    txt = f'<a href="{html.escape(target.format(v))}">{txt}</a>'
                cells.append(f'<td class="text">{txt}</td>' if c in text else f"<td>{txt}</td>")
            rows.append("<tr>" + "".join(cells) + "</tr>")
        self.parts.append(f"<table><tr>{head}</tr>{''.join(rows)}</table>")

    def render(self) -> str:
        """The page; every dataset once (``DATA``), however many of its charts draw it."""
        up = "../" * self.depth
        nav = (f'<nav><a href="{up}index.html">index</a><a href="{up}frontier.html">frontier</a>'
               f'<a href="{up}hardware-choice.html">hardware choice</a><a href="{up}calibration.html">calibration</a>'
               f"</nav>")
        datasets, embeds = {}, []
        for div, spec in self.specs:
            spec = dict(spec)
            own = spec.pop("datasets", None) or {}
            datasets.update(own)
            names = sorted(own)
            embeds.append(f"vegaEmbed('#{div}', withData({json.dumps(spec, separators=(',', ':'))}, "
                          f"{json.dumps(names)}), {{actions: false, renderer: 'svg'}})"
                          f".catch(function(e) {{ console.error(e); }});")
        # inside a function: the bundle's minified globals (D, ...) must not be shadowed or overwritten. Each dataset
        # is stored by column (its column names once, not once per row) and turned back into rows in the browser
        script = ("(function () {\n" + ROWS_JS + "var DATA = " + json.dumps(
            {n: _columns(rows) for n, rows in datasets.items()}, separators=(",", ":")) + ";\n"
                  "function withData(s, names) { s.datasets = {}; names.forEach(function (n) { s.datasets[n] = rows(DATA[n]); });"
                  " return s; }\n" + "\n".join(embeds) + "\n})();")
        return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"UTF-8\">"
                f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>"
                f"{html.escape(self.title)}</title><style>{CSS}</style>\n"
                f"<script type=\"text/javascript\" src=\"{up}{BUNDLE}\"></script></head>\n"
                f"<body>{nav}<h1>{html.escape(self.title)}</h1>\n" + "\n".join(self.parts)
                + f"\n<script type=\"text/javascript\">\n{script}\n</script>\n</body></html>\n")

#: a dataset stored by column (`_columns`) back into the rows Vega takes
ROWS_JS = ("function rows(c) { var keys = Object.keys(c), n = keys.length ? c[keys[0]].length : 0, out = [];"
           " for (var i = 0; i < n; i++) { var r = {}; keys.forEach(function (k) { r[k] = c[k][i]; }); out.push(r); }"
           " return out; }\n")


def _columns(rows: list[dict]) -> dict[str, list]:
    """Rows (as Vega-Lite takes them) by column: {name: [value per row]}, null where a row lacks the field."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return {k: [r.get(k) for r in rows] for k in keys}


def _bundle() -> str:
    import vl_convert as vlc
    from altair.utils._importers import vl_version_for_vl_convert

    return vlc.javascript_bundle(vl_version=vl_version_for_vl_convert())


# ------------------------------------------------------------------ data shaping (pure)

def measured_runs(pred: pl.DataFrame, cal: pl.DataFrame | None, runs: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every measured run beside stepcast's prediction of that very run (its model, precision, sequence length,
    batch, cluster size and layout): the served fit's (`calibrated_predictions`, what `stepcast predict --runs`
    answers, with its 90 % interval) when the store has it, else the analytical model's (`analytical_predictions`).
    ``estimate`` says which; ``measured_over_predicted`` is the ratio of tokens/s per GPU. Runs the served fit gives
    no prediction for keep a null prediction (the page counts them)."""
    if pred.height == 0:
        return pl.DataFrame()
    d = pred.filter(pl.col("measured_tokens_per_s_per_gpu").is_not_null())
    if runs is not None and "arch_id" in runs.columns and "arch_id" not in d.columns:
        d = d.join(runs.select("run_id", "arch_id"), on="run_id", how="left")
    if cal is not None and cal.height and "tokens_per_s_per_gpu" in cal.columns:
        c = cal.unique("run_id", keep="first").select(
            "run_id", pl.col("tokens_per_s_per_gpu").alias("predicted_tokens_per_s_per_gpu"),
            *[pl.col(f"tokens_per_s_per_gpu_{b}").alias(f"predicted_{b}") if f"tokens_per_s_per_gpu_{b}" in cal.columns
              else pl.lit(None, dtype=pl.Float64).alias(f"predicted_{b}") for b in ("lo", "hi")])
        d = d.join(c, on="run_id", how="left").with_columns(pl.lit("served fit").alias("estimate"))
    else:
        d = d.with_columns(pl.col("tokens_per_s_per_gpu").alias("predicted_tokens_per_s_per_gpu"),
                           pl.lit(None, dtype=pl.Float64).alias("predicted_lo"),
                           pl.lit(None, dtype=pl.Float64).alias("predicted_hi"),
                           pl.lit("analytical model").alias("estimate"))
    return with_layout(d).with_columns(
        pl.col("source").str.replace(r" \(.*", "").alias("series"),
        pl.col("dtype").fill_null("?").alias("precision") if "dtype" in d.columns else pl.lit("?").alias("precision"),
        (pl.col("measured_tokens_per_s_per_gpu") / pl.col("predicted_tokens_per_s_per_gpu")).alias("measured_over_predicted"),
        ((pl.col("measured_tokens_per_s_per_gpu") >= pl.col("predicted_lo"))
         & (pl.col("measured_tokens_per_s_per_gpu") <= pl.col("predicted_hi"))).alias("inside"),
    ).sort("gpu", "source", "n_gpus", "run_id")


def measured_summary(m: pl.DataFrame) -> pl.DataFrame:
    """Per (source, precision) of predicted runs: runs, their sequence lengths and cluster sizes, median and range of
    measured ÷ predicted, share inside the 90 % interval."""
    return m.filter(pl.col("measured_over_predicted").is_not_null()).group_by("source", "precision").agg(
        pl.len().alias("runs"), pl.col("seq_len").min().alias("seq_min"), pl.col("seq_len").max().alias("seq_max"),
        pl.col("n_gpus").min().alias("N_min"), pl.col("n_gpus").max().alias("N_max"),
        pl.col("measured_over_predicted").median().alias("median"),
        pl.col("measured_over_predicted").min().alias("lowest"), pl.col("measured_over_predicted").max().alias("highest"),
        pl.col("inside").mean().alias("inside")).sort("source", "precision")


def cost_pareto(df: pl.DataFrame, time_col: str = "time_to_train_days") -> pl.DataFrame:
    """Flag the (time, cost) points no other point beats on both (per target run); rows without a cost, a time
    or (when the frame says) feasibility are dropped."""
    ok = pl.col("cost_usd").is_not_null() & pl.col(time_col).is_not_null()
    d = df.filter((pl.col("feasible") & ok) if "feasible" in df.columns else ok).sort([time_col, "cost_usd"])
    best, flags = float("inf"), []
    for c in d["cost_usd"].to_list():
        flags.append(c < best)
        best = min(best, c)
    return d.with_columns(pl.Series("cost_pareto", flags, dtype=pl.Boolean))


def protocol_name(scheme: str) -> str:
    """The calibration's own description of a held-out protocol, when it has one."""
    names = getattr(calibration, "PROTOCOL_NAMES", {}) or {}
    fallback = {"loso": "leave one source out", "loho": "leave one hardware model out"}
    return names.get(scheme) or fallback.get(scheme) or scheme


def heldout_summary(metrics: pl.DataFrame | None, fits: pl.DataFrame | None) -> pl.DataFrame:
    """One row per held-out protocol of the promoted fit (all runs pooled), worst calibrated MdAPE first: runs,
    analytical/physics/calibrated MdAPE, calibrated MAPE, share within ±10 %, 90 % interval coverage."""
    if metrics is None or metrics.height == 0:
        return pl.DataFrame()
    # k-shot and the scaling efficiency have their own sections
    m = metrics.filter((pl.col("group") == "ALL") & (pl.col("scheme") != "kshot"))
    if "grouping" in m.columns:
        m = m.filter(pl.col("grouping") != "scaling_series")
    if fits is not None and fits.height and "promoted" in fits.columns:
        promoted = fits.filter(pl.col("promoted"))["version"].to_list()
        if promoted:
            m = m.filter(pl.col("version") == promoted[0])
    m = m.unique(["scheme", "predictor"], keep="first", maintain_order=True)
    wide = m.pivot(on="predictor", index="scheme", values="mdape")
    if "mdape_balanced" not in m.columns:  # a store written before the sources-equal figures
        m = m.with_columns(pl.lit(None, dtype=pl.Float64).alias("mdape_balanced"),
                           pl.lit(None, dtype=pl.Float64).alias("mape_balanced"))
    cal = m.filter(pl.col("predictor") == "calibrated").select(
        "scheme", "n_runs", pl.col("mape").alias("calibrated_mape"), "within_10pct", "coverage_90",
        pl.col("mdape_balanced").alias("calibrated_mdape_balanced"),
        pl.col("mape_balanced").alias("calibrated_mape_balanced"))
    out = wide.join(cal, on="scheme", how="inner")
    for col in ("analytical", "physics", "calibrated"):
        if col not in out.columns:
            out = out.with_columns(pl.lit(None, dtype=pl.Float64).alias(col))
    return out.with_columns(pl.col("scheme").map_elements(protocol_name, return_dtype=pl.Utf8).alias("protocol")) \
        .sort("calibrated", descending=True, nulls_last=True)


KSHOT_FIGURES = ("n_runs", "mdape", "mape", "mdape_balanced", "mape_balanced", "within_10pct", "coverage_90",
                 "median_width")


def kshot_rows(metrics: pl.DataFrame | None, fits: pl.DataFrame | None) -> pl.DataFrame:
    """The promoted fit's rows of the k-shot protocol (`scheme` 'kshot'): the overall ones (`group` 'ALL', one per
    k and predictor) and the per-unit ones (k = 3, adapted), k ascending, adapted first. Empty when the store has
    none: a fit written before the protocol, or no promoted fit."""
    if (metrics is None or metrics.height == 0 or "k_shot" not in metrics.columns or fits is None
            or fits.height == 0 or "promoted" not in fits.columns):
        return pl.DataFrame()
    promoted = fits.filter(pl.col("promoted"))["version"].to_list()
    m = metrics.filter((pl.col("scheme") == "kshot") & pl.col("version").is_in(promoted)
                       & pl.col("k_shot").is_not_null())
    for col in KSHOT_FIGURES:
        if col not in m.columns:
            m = m.with_columns(pl.lit(None, dtype=pl.Float64).alias(col))
    return m.unique(["k_shot", "predictor", "group"], keep="first", maintain_order=True).sort(
        "k_shot", pl.col("predictor") != "adapted", "predictor", "group")


# ------------------------------------------------------------------ the site

def build_site(folder: str | Path, tables: dict[str, pl.DataFrame | None], *, executor=None) -> list[Path]:
    """Write the site (see ``_build``). Altair's per-object JSON-schema validation is switched off while
    building (it costs ~0.4 s per chart); the specs are plain Vega-Lite that vega-embed checks when rendering,
    and the browser tests fail on any rendering error. ``executor``: a process pool (``concurrent.futures``)
    that may draw part of the hardware pages meanwhile (the build's, ``pipeline.parallel``); the pages are the
    same either way."""
    from altair.utils import schemapi

    try:
        with schemapi.debug_mode(False):
            return _build(folder, tables, executor=executor)
    except BaseException:
        target = Path(folder).resolve()
        shutil.rmtree(target.with_name(f".{target.name}.{os.getpid()}.tmp"), ignore_errors=True)
        raise
    finally:
        charts.forget_data()


class _Site:
    """The tables a site is drawn from, with the shared derived frames."""

    def __init__(self, tables: dict[str, pl.DataFrame | None]):
        hw = tables["hardware"]
        self.names = dict(zip(hw["id"].to_list(), hw["name"].to_list())) if hw.height else {}
        self.vendors = dict(zip(hw["id"].to_list(), hw["vendor"].to_list())) if "vendor" in hw.columns else {}
        vendor = pl.DataFrame({"gpu": list(self.vendors), "vendor": list(self.vendors.values())},
                              schema={"gpu": pl.Utf8, "vendor": pl.Utf8})
        self.vendor = vendor
        self.curves = with_display(tables["scaling_curves"]).join(vendor, on="gpu", how="left").with_columns(
            pl.col("vendor").fill_null("other"))
        self.knees = tables["inflection_points"]
        self.frontier = with_display(tables["frontier"]).join(vendor, on="gpu", how="left").with_columns(
            pl.col("vendor").fill_null("other"))
        self.pred = tables["analytical_predictions"]
        self.cal = tables.get("calibrated_predictions")
        self.fits = tables.get("fits")
        self.fit_metrics = tables.get("fit_metrics")
        self.choice = tables.get("hardware_choice")
        self.targets = tables.get("target_runs")
        self.measured = measured_runs(self.pred, self.cal, tables.get("runs"))
        c = self.curves
        calibrated = bool(c["calibrated"].any()) if "calibrated" in c.columns and c.height else False
        self.cal_note = (c.filter(pl.col("calibrated"))["calibration_note"][0] if calibrated
                         else (c["calibration_note"][0] if c.height else "no curves"))
        self.gpus = sorted(c["gpu"].unique().to_list()) if c.height else []

    def name(self, gpu: str) -> str:
        return self.names.get(gpu, gpu)


#: the share of the hardware pages an executor's process draws (the rest, and the other pages, stay here)
REMOTE_SHARE = 0.6


def _hardware_pages(site: _Site, gpus: list[str], validate: bool | None = False) -> list[tuple[str, str]]:
    """(accelerator, HTML) of the hardware pages of ``gpus``, each drawn with an empty dataset registry as in one
    process; in a worker process (``validate`` False: Altair's validation off, as ``build_site`` has it; None:
    leave the setting as it is)."""
    from contextlib import nullcontext

    from altair.utils import schemapi

    alt.data_transformers.disable_max_rows()
    out = []
    with schemapi.debug_mode(False) if validate is False else nullcontext():
        for gpu in gpus:
            text = _hardware_page(site, gpu).render()
            charts.forget_data()  # each page carries only its own data
            out.append((gpu, text))
    return out


def _build(folder: str | Path, tables: dict[str, pl.DataFrame | None], *, executor=None) -> list[Path]:
    """Write the site into ``folder`` (replaced atomically). ``tables``: scaling_curves, inflection_points,
    frontier, analytical_predictions, runs, hardware (required); calibrated_predictions, fits, fit_metrics,
    hardware_choice, target_runs (optional). Returns the files written (final paths): the pages and the JavaScript
    bundle they load, nothing else."""
    folder = Path(folder).resolve()
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "hardware").mkdir(parents=True)
    alt.data_transformers.disable_max_rows()
    site = _Site(tables)
    # the first hardware pages (the bulk of the work) go to `executor`'s process when there is one; this process
    # draws the rest meanwhile. vl-convert's bundle is made in Rust without Python's lock: in a thread it overlaps
    # the pages' Python work instead of following it
    far = site.gpus[:int(len(site.gpus) * REMOTE_SHARE)] if executor is not None else []
    remote = executor.submit(_hardware_pages, site, far) if far else None
    with ThreadPoolExecutor(max_workers=1) as pool:
        bundle = pool.submit(_bundle)
        pages: dict[str, str] = {}  # path -> HTML

        def save(page: Page, rel: str) -> None:
            pages[rel] = page.render()
            charts.forget_data()  # each page carries only its own data

        for gpu, text in _hardware_pages(site, site.gpus[len(far):], validate=None):
            pages[f"hardware/{gpu}.html"] = text
        save(_frontier_page(site), "frontier.html")
        save(_choice_page(site), "hardware-choice.html")
        shown, page = _calibration_page(site)
        save(page, "calibration.html")
        save(_index_page(site, shown), "index.html")
        for gpu, text in remote.result() if remote is not None else ():
            pages[f"hardware/{gpu}.html"] = text
        # written in the order one process draws them: the bundle, the hardware pages, the rest
        (tmp / BUNDLE).write_text(bundle.result(), encoding="utf-8")
        written: list[Path] = [folder / BUNDLE]
        order = [f"hardware/{gpu}.html" for gpu in site.gpus] + ["frontier.html", "hardware-choice.html",
                                                                 "calibration.html", "index.html"]
        for rel in order:
            (tmp / rel).write_text(pages[rel], encoding="utf-8")
            written.append(folder / rel)
    # swap in
    old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)
    return written


KNEE_FORMATS = {"knee N": count, "knee N low": count, "knee N high": count, "USL σ": "{:.3g}", "USL κ": "{:.3g}",
                "USL peak N": count, "smallest feasible N": count}


def _knee_table(k: pl.DataFrame) -> pl.DataFrame:
    return k.select(
        *[c for c in ("accelerator", "model") if c in k.columns], "policy",
        pl.col("inflection_n").alias("knee N"), pl.col("inflection_n_lo").alias("knee N low"),
        pl.col("inflection_n_hi").alias("knee N high"), pl.col("usl_sigma").alias("USL σ"),
        pl.col("usl_kappa").alias("USL κ"), pl.col("usl_peak_n").alias("USL peak N"), "explanation")


def _hardware_page(site: _Site, gpu: str) -> Page:
    name = site.name(gpu)
    page = Page(f"Scaling curves — {name} ({gpu})", depth=1)
    c = site.curves.filter(pl.col("gpu") == gpu)
    k = site.knees.filter(pl.col("gpu") == gpu)
    page.p(f"Best layout at each cluster size N for the reference runs, per batch policy (strong: fixed global "
           f"batch; weak: one sequence per accelerator; critical: weak scaling up to the DeepSeek LLM 2024 "
           f"critical batch for the run's compute). Bands: calibrated interval (absent when the curve is "
           f"analytical only). Diamonds: the inflection point, the smallest N whose marginal efficiency "
           f"falls below {DEFAULT_THRESHOLD:g}: from there each added accelerator delivers less than "
           f"{DEFAULT_THRESHOLD:.0%} of what the best accelerator of a smaller cluster delivers. A curve is the "
           f"prediction for its reference run's configuration only (its model, sequence length and batch, in the "
           f"precision the accelerator trains in by default: bf16, or fp16/fp32 where it has no BF16 rate); "
           f"measured runs on this accelerator are compared with the prediction of their own "
           f"configuration in <a href=\"#measured\">Measured runs against their own prediction</a>. "
           f"<b>{html.escape(site.cal_note)}</b>.", "note")
    for ref in REFERENCE_RUNS:
        rc = c.filter(pl.col("arch_id") == ref["arch_id"])
        if rc.height == 0:
            continue
        page.h(f"{ref['arch_id']}: sequence {ref['seq_len']:,}, {si(ref['tokens'])} tokens")
        page.p(f"<small>{html.escape(ref['source'])}. Strong-scaling batch {ref['global_batch_seqs']:,} "
               f"sequences.</small>")
        if not rc["feasible"].any():
            largest = rc.sort("n_gpus").tail(1)
            page.empty(f"Nothing to draw: no layout of {ref['arch_id']} runs on {name} at any cluster size up to "
                       f"{count(largest['n_gpus'][0])} accelerators ({humane_reason(largest['reason'][0])}).")
            continue
        rk = k.filter(pl.col("arch_id") == ref["arch_id"])
        tot = charts.curve_panel(rc, rk, "tokens_per_s", "whole-cluster throughput", "tokens/s (log)")
        per = charts.curve_panel(rc, rk, "tokens_per_s_per_gpu", "throughput per accelerator", "tokens/s per GPU (log)")
        mfu = charts.curve_panel(rc, rk, "mfu", "model FLOPs utilization", "MFU", log_y=False, fmt=".0%")
        me = charts.curve_panel(rc, rk, "marginal_efficiency", "marginal efficiency", "marginal efficiency (1 = linear)",
                                log_y=False, fmt=".1f", threshold=DEFAULT_THRESHOLD)
        page.chart(charts.vconcat(charts.hconcat(tot, per), charts.hconcat(mfu, me)), f"{gpu}-{ref['arch_id']}")
        knees = rk.filter(pl.col("knee_found") | pl.col("usl_sigma").is_not_null())
        if knees.height:
            page.table(_knee_table(knees), KNEE_FORMATS, text=("explanation",))
        else:
            page.p("No knee and no USL fit: " + "; ".join(sorted(set(rk["explanation"].drop_nulls().to_list())))
                   + ".")
    _measured_section(page, site, gpu)
    page.h("Best layout at each N")
    best = c.filter(pl.col("feasible"))
    if best.height:
        page.table(best.select(
            pl.col("arch_id").alias("model"), "policy", pl.col("n_gpus").alias("N"),
            pl.col("global_batch_seqs").alias("batch (seqs)"), "layout", pl.col("micro_batch").alias("micro-batch"),
            "sharding", "recompute", pl.col("tokens_per_s_per_gpu").alias("tokens/s/GPU"), pl.col("mfu").alias("MFU"),
            pl.col("time_to_train_days").alias("days"), pl.col("cost_usd").alias("cost"),
            pl.col("parallel_efficiency").alias("parallel eff."), pl.col("marginal_efficiency").alias("marginal eff.")),
            {"N": count, "batch (seqs)": count, "tokens/s/GPU": count, "MFU": pct, "days": days, "cost": usd,
             "parallel eff.": "{:.2f}", "marginal eff.": "{:.2f}"}, text=("layout",))
    else:
        page.empty(f"No feasible layout on {name} for any reference run (see above).")
    return page


def _measured_section(page: Page, site: _Site, gpu: str) -> None:
    """Every measured run on ``gpu`` against stepcast's prediction of that very run (not against a curve of
    another configuration): a chart of both and a table per source, precision and sequence length."""
    page.raw('<h2 id="measured">Measured runs against their own prediction</h2>')
    m = site.measured.filter(pl.col("gpu") == gpu) if site.measured.height else site.measured
    if m.height == 0:
        page.empty(f"No measured run on {site.name(gpu)} in the corpus: nothing to compare.")
        return
    shown = m.filter(pl.col("measured_over_predicted").is_not_null() & (pl.col("predicted_tokens_per_s_per_gpu") > 0)
                     & (pl.col("n_gpus") > 0))
    estimate = m["estimate"][0]
    what = ("the served fit (`calibrated_predictions`: what <code>stepcast predict --runs</code> answers for the run, "
            "with its 90 % interval as a vertical line)" if estimate == "served fit"
            else "the analytical model (`analytical_predictions`; the store has no calibrated fit yet)")
    page.p(f"Each point is one measured run, compared with the prediction of {what} for that run's own "
           f"configuration: its model, precision, sequence length, batch, cluster size N and layout. Left: predicted "
           f"against measured tokens/s per GPU (on the dashed line the prediction is exact). Right: measured ÷ "
           f"predicted against N (shape: precision). The table sums the runs up per source and precision.", "note")
    missing = m.height - shown.height
    if missing:
        why = m.join(shown.select("run_id"), on="run_id", how="anti").with_columns(
            pl.col("error").fill_null("no prediction recorded").str.split(";").list.first().str.split(":").list.first()
            .str.strip_chars().alias("why") if "error" in m.columns else pl.lit("no prediction recorded").alias("why")
        ).group_by("why").len().sort("len", "why", descending=[True, False])
        page.p(f"{missing} of the {m.height} measured runs on {html.escape(site.name(gpu))} have no prediction from "
               f"the {estimate}, so they are not drawn: " + "; ".join(
                   f"{r['len']} — {html.escape(r['why'])}" for r in why.iter_rows(named=True)) + ".")
    if shown.height == 0:
        page.empty("No measured run here has a prediction to compare with.")
        return
    page.chart(charts.measured_vs_own_prediction(shown, estimate), f"{gpu}-measured")
    page.table(measured_summary(shown).select(
        "source", "precision", "runs", _span("seq_min", "seq_max").alias("sequence"), _span("N_min", "N_max").alias("N"),
        pl.col("median").alias("measured ÷ predicted, median"), pl.col("lowest").alias("lowest"),
        pl.col("highest").alias("highest"), pl.col("inside").alias("inside the 90% interval")),
        {"runs": count,
         "measured ÷ predicted, median": "{:.2f}×", "lowest": "{:.2f}×", "highest": "{:.2f}×",
         "inside the 90% interval": pct}, text=("source", "precision"))


def _span(lo: str, hi: str) -> pl.Expr:
    """'2,048' or '2,048–8,192'."""
    def fmt(c: str) -> pl.Expr:
        return pl.col(c).map_elements(count, return_dtype=pl.Utf8)

    return pl.when(pl.col(lo) == pl.col(hi)).then(fmt(lo)).otherwise(pl.concat_str([fmt(lo), fmt(hi)], separator="–"))


def _frontier_page(site: _Site) -> Page:
    fr = site.frontier
    page = Page("Compute frontier per accelerator")
    months = fr["months"].drop_nulls()[0] if "months" in fr.columns and fr["months"].drop_nulls().len() else None
    minu = fr["min_utilization"].drop_nulls()[0] if "min_utilization" in fr.columns and \
        fr["min_utilization"].drop_nulls().len() else None
    page.p(f"For each training compute C: the Chinchilla-optimal dense model (tokens = 20 × parameters, Hoffmann "
           f"et al. 2022; GPT-3-shaped: d_model/layers = 128, heads of 128), the DeepSeek LLM 2024 batch ceiling, "
           f"and the cluster/layout with the best utilization that finishes within {months or '?'} months. A "
           f"large dot marks each accelerator's frontier: the largest C before the first level whose utilization "
           f"falls below {pct(minu) if minu else '?'} of its best sustained one (held over three consecutive "
           f"levels; Epoch AI's \"not fall below\"). One panel per vendor; click a legend entry to highlight one "
           f"accelerator. <b>{html.escape(site.cal_note)}</b>.", "note")
    sets = [(None, "")] if "assumptions" not in fr.columns else [
        ("ideal", "ideal: perfect overlap, datasheet rates, no host overhead or GEMM-size ramp (Epoch AI)"),
        ("realistic", "realistic: the calibrated model")]
    latency = "binding" in fr.columns and (fr["feasible"] & (fr["binding"] == "latency")).any()
    page.p("Two charts: the same sweep under ideal conditions and under the calibrated model."
           + (" Crosses mark levels where the latency wall binds: the minimum time per step (kernel and collective "
              "latencies) times the steps the critical batch allows leaves no room for a larger cluster."
              if latency else ""), "note")
    for name, label in sets:
        sub = fr if name is None else fr.filter(pl.col("assumptions") == name)
        key = "frontier" if name in (None, "realistic") else f"frontier-{name}"
        if sub.filter(pl.col("feasible")).height:
            page.chart(charts.frontier_chart(
                sub, f"{label or 'utilization vs training compute'} ({months or '?'}-month limit)"), key)
        else:
            page.empty(f"No accelerator has a feasible configuration at any compute level{' under ' + name if name else ''}: "
                       "nothing to draw.")
    top = fr.filter(pl.col("is_frontier")) if "is_frontier" in fr.columns else fr.clear()
    if top.height:
        lead = [pl.col("assumptions")] if "assumptions" in top.columns else []
        page.table(top.sort(*(["assumptions"] if lead else []), "training_flop", descending=True).select(
            *lead, pl.col("gpu").alias("accelerator"), pl.col("training_flop").alias("training FLOP"),
            pl.col("params").alias("parameters"), "tokens", pl.col("n_gpus").alias("N"), "layout",
            pl.col("utilization").alias("utilization"), pl.col("best_utilization").alias("best utilization"),
            pl.col("time_to_train_days").alias("days"), pl.col("cost_usd").alias("cost")),
            {"training FLOP": flop, "parameters": si, "tokens": si, "N": count, "utilization": pct,
             "best utilization": pct, "days": days, "cost": usd}, _page_links(site, "accelerator"),
            text=("assumptions", "layout"))
    none = fr.filter(~pl.col("gpu").is_in(top["gpu"].to_list())).group_by("gpu").agg(pl.col("reason").drop_nulls()
                                                                                    .first())
    if none.height:
        page.p("Accelerators without a frontier: " + "; ".join(
            f"{html.escape(site.name(r['gpu']))}: {html.escape(humane_reason(r['reason']))}"
            for r in none.sort("gpu").iter_rows(named=True)) + ".")
    return page


def _choice_page(site: _Site) -> Page:
    page = Page("Hardware choice: time vs cost for the target runs")
    choice = site.choice
    if choice is None or choice.height == 0:
        page.empty("No hardware choice yet: the store has no `hardware_choice` rows (the build writes them for every "
                   "target run of measurements/target_runs.csv, e.g. `stepcast build`).")
        return page
    page.p("For each target run (measurements/target_runs.csv: a named model, its token budget, sequence length and "
           "batch, with its source), each point is one accelerator at one cluster size N with its best layout, from "
           "the table `hardware_choice` (the numbers <code>stepcast plan</code> gives): days to train, interruptions "
           "included, and cost = N × days × the median on-demand cloud price per accelerator-hour "
           "(`hardware.cloud_usd_per_hour`; accelerators without a price are left out). One panel per vendor. Black "
           "rings: Pareto-efficient choices over all vendors (nothing is both faster and cheaper), listed in the "
           f"table. <b>{html.escape(site.cal_note)}</b>.", "note")
    d = with_display(choice.rename({"hardware": "gpu"})).join(site.vendor, on="gpu", how="left").with_columns(
        pl.col("vendor").fill_null("other"))
    ids = choice["target_id"].unique(maintain_order=True).to_list()
    targets = site.targets
    listed = targets.rows(named=True) if targets is not None and targets.height else [{"id": t} for t in ids]
    for t in listed:
        rows = d.filter(pl.col("target_id") == t["id"])
        head = (f"{t['id']}: {t['model']}, {si(float(t['tokens']))} tokens, sequence {int(t['seq_len']):,}"
                if "model" in t else t["id"])
        page.h(head)
        if "source" in t:
            page.p(f"<small>{html.escape(str(t['source']))}.</small>")
        front = cost_pareto(rows, "days")
        if front.height == 0:
            page.empty(f"No priced accelerator trains {t['id']}: no layout of any accelerator with a price fits in "
                       f"memory up to the largest cluster the table considers, so there is nothing to draw.")
            continue
        page.chart(charts.choice_chart(front, f"{t['id']}: days to train vs cost"), f"choice-{t['id']}")
        page.table(front.filter(pl.col("cost_pareto")).select(
            pl.col("gpu").alias("accelerator"), pl.col("n_gpus").alias("N"), "layout", "days",
            pl.col("days_lo").alias("days (low)"), pl.col("days_hi").alias("days (high)"),
            pl.col("cost_usd").alias("cost"), pl.col("mfu").alias("MFU")),
            {"N": count, "days": days, "days (low)": days, "days (high)": days, "cost": usd, "MFU": pct},
            _page_links(site, "accelerator"), text=("layout",))
    missing = [i for i in ids if i not in {t["id"] for t in listed}]
    if missing:
        page.p("In `hardware_choice` but no longer in measurements/target_runs.csv (left out): "
               + ", ".join(html.escape(i) for i in missing) + ".")
    priced = set(site.curves.filter(pl.col("usd_per_gpu_hour").is_not_null())["gpu"].to_list()) \
        if "usd_per_gpu_hour" in site.curves.columns else set(choice["hardware"].to_list())
    unpriced = sorted(g for g in site.gpus if g not in priced)
    if unpriced:
        page.p("Not in the hardware choice (no price, so no cost): " + ", ".join(site.name(g) for g in unpriced) + ".")
    return page


def _calibration_page(site: _Site) -> tuple[str, Page]:
    page = Page("Calibration: how far off are the predictions?")
    held = heldout_summary(site.fit_metrics, site.fits)
    page.h("On runs the fit never saw")
    if held.height:
        worst = held.row(0, named=True)
        page.p(f"Held out by <b>{html.escape(worst['protocol'])}</b>, the hardest transfer tested, the calibrated "
               f"model's median error of tokens/s per GPU is <b>{pct(worst['calibrated'], 1)}</b> over "
               f"{count(worst['n_runs'])} runs (mean {pct(worst['calibrated_mape'], 1)}; "
               f"{pct(worst['within_10pct'])} within ±10 %; the 90 % interval holds "
               f"{pct(worst['coverage_90'])} of them). The analytical model with its prior parameters: "
               f"{pct(worst['analytical'], 1)}.", "note headline")
        page.p("Each protocol re-fits the physics and the residual model without the held-out group, then scores "
               "that group; worst first. These are the figures to expect on a new source, accelerator or scale. "
               "Pooled over runs, 1,440 single-node vTrain runs are 72 % of every figure; the columns "
               "<i>sources equal</i> weigh every source the same, the estimate for runs from a source the fit has "
               "not seen (promotion compares fits on them).")
        long = pl.concat([held.select("protocol", pl.lit(p).alias("predictor"), pl.col(p).alias("mdape"), "n_runs",
                                      pl.int_range(pl.len()).alias("order"))
                          for p in ("analytical", "physics", "calibrated")]).filter(pl.col("mdape").is_not_null())
        page.chart(charts.heldout_bars(long, "held-out MdAPE per protocol (worst first)"), "heldout")
        page.table(held.select(
            "protocol", pl.col("n_runs").alias("runs"), pl.col("analytical").alias("analytical MdAPE"),
            pl.col("physics").alias("physics MdAPE"), pl.col("calibrated").alias("calibrated MdAPE"),
            pl.col("calibrated_mape").alias("calibrated MAPE"),
            pl.col("calibrated_mdape_balanced").alias("MdAPE, sources equal"),
            pl.col("calibrated_mape_balanced").alias("MAPE, sources equal"),
            pl.col("within_10pct").alias("within ±10%"), pl.col("coverage_90").alias("90% coverage")),
            {"runs": count, **{c: (lambda v: pct(v, 1)) for c in ("analytical MdAPE", "physics MdAPE",
                                                                   "calibrated MdAPE", "calibrated MAPE",
                                                                   "MdAPE, sources equal", "MAPE, sources equal")},
             "within ±10%": pct, "90% coverage": pct}, text=("protocol",))
    else:
        page.empty("No held-out figures yet: the store has no `fit_metrics` rows (they appear once a calibration fit "
                   "has run, e.g. `stepcast build`).")

    _reliability_section(page, site.fit_metrics, site.fits)
    _kshot_section(page, site.fit_metrics, site.fits)

    pred = site.pred
    scored = pred.filter(pl.col("scored")) if "scored" in pred.columns else pred
    long = scored.select("run_id", "source", "gpu", "n_gpus", "measured_tokens_per_s_per_gpu",
                         "tokens_per_s_per_gpu", "rel_error").with_columns(pl.lit("analytical").alias("estimate"))
    shown = "analytical only (no `calibrated_predictions` table in the store yet)"
    cov = None
    cal = site.cal
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
    page.h("In-sample: the runs the fit was trained on")
    page.p(f"Shown: <b>{html.escape(shown)}</b>. Runs with a measured throughput target (`scored`); the error is "
           f"predicted/measured − 1 of tokens/s per GPU. The calibrated points are the promoted fit's predictions "
           f"on its own training runs: they flatter it; the held-out figures above are the honest ones.", "note")
    summary = long.group_by("estimate").agg(pl.len().alias("runs"), pl.col("rel_error").abs().median().alias("MdAPE"),
                                            (pl.col("rel_error").abs() <= 0.1).mean().alias("within ±10%"))
    page.table(summary.sort("estimate"), {"runs": count, "MdAPE": lambda v: pct(v, 1), "within ±10%": pct})
    a_only = long.filter(pl.col("estimate") == "analytical")
    c_only = long.filter(pl.col("estimate") == "calibrated")
    panels = [charts.measured_vs_predicted(long, "tokens_per_s_per_gpu", t, e)
              for d, t, e in ((a_only, "analytical model", "analytical"), (c_only, "calibrated (in-sample)", "calibrated"))
              if d.height]
    if panels:
        page.chart(charts.hconcat(*panels), "measured-vs-predicted")
        page.chart(charts.vconcat(charts.residual_strip(long, "source", "rel_error", "error by source"),
                                  charts.residual_strip(long, "gpu", "rel_error", "error by accelerator")), "residuals")
    else:
        page.empty("No measured run with a throughput target: nothing to compare.")
    page.h("Interval coverage")
    if cov is not None:
        nominal = None
        if site.fits is not None and site.fits.height and "alpha" in site.fits.columns:
            nominal = 1.0 - float(site.fits["alpha"][0])
        page.chart(charts.hconcat(charts.coverage_bars(cov["source"], "source", "coverage by source", nominal),
                                  charts.coverage_bars(cov["gpu"], "gpu", "coverage by accelerator", nominal)),
                   "coverage")
    else:
        page.empty("No intervals yet: the analytical model gives point predictions only; coverage appears here once a "
                   "calibrated fit with intervals is promoted.")
    fits = site.fits
    if fits is not None and fits.height:
        cols = [c for c in ("version", "promoted", "created_at", "model_kind", "n_train", "mdape", "loho_mdape",
                            "coverage_90", "promotion_reason") if c in fits.columns]
        page.h("Fits")
        page.table(fits.select(cols).head(10), {"n_train": count, "mdape": lambda v: pct(v, 1),
                                                "loho_mdape": lambda v: pct(v, 1), "coverage_90": pct},
                   text=("promotion_reason",))
    return shown, page


def reliability_rows(metrics: pl.DataFrame | None, fits: pl.DataFrame | None) -> pl.DataFrame:
    """The promoted fit's calibrated coverage and median width per transfer protocol and held-out group (the
    protocol's own groups: family, generation, precision, scale; and each protocol as a whole), empty without them."""
    if metrics is None or metrics.height == 0 or fits is None or fits.height == 0 or "promoted" not in fits.columns:
        return pl.DataFrame()
    promoted = fits.filter(pl.col("promoted"))["version"].to_list()
    own = {"lofo": "family", "logo": "generation", "lopo": "precision", "scale": "scale", "loso": "source"}
    m = metrics.filter(pl.col("version").is_in(promoted) & (pl.col("predictor") == "calibrated")
                       & pl.col("coverage_90").is_not_null() & pl.col("median_width").is_not_null()
                       & (pl.col("scheme") != "kshot"))
    own_group = pl.any_horizontal([(pl.col("scheme") == k) & (pl.col("grouping") == v) for k, v in own.items()])
    overall = (pl.col("group") == "ALL") & (pl.col("grouping") == "source")
    return m.filter(overall | (own_group & (pl.col("group") != "ALL") & (pl.col("n_runs") >= 20)))


def _reliability_section(page: Page, metrics: pl.DataFrame | None, fits: pl.DataFrame | None) -> None:
    """Coverage against width per protocol and held-out group (a reliability chart)."""
    rows = reliability_rows(metrics, fits)
    if rows.height == 0:
        return
    page.h("Coverage against width")
    page.p("Each point is a held-out group of a transfer protocol with at least 20 runs (open) or the protocol as a "
           "whole (filled): how often the 90 % interval covered the measured run, against how wide it was. The band "
           "is 85-95 %: below it the interval is too narrow for that group, above it wider than it needs to be.")
    page.chart(charts.reliability_chart(rows, "90% interval: coverage against median width, per protocol and group"),
               "reliability")


def _kshot_section(page: Page, metrics: pl.DataFrame | None, fits: pl.DataFrame | None) -> None:
    """The section "Your cluster in k runs": the k-shot protocol of the promoted fit (error and interval width
    against k, the overall rows as a table), or one sentence when the fit has none."""
    page.h("Your cluster in k runs")
    rows = kshot_rows(metrics, fits)
    overall = rows.filter(pl.col("group") == "ALL") if rows.height else rows
    if overall.height == 0:
        page.empty("No k-shot figures yet: `fit_metrics` has no `kshot` rows for the promoted fit (a fit made before "
                   "the k-shot protocol, or none yet; `stepcast fit` makes a current one).")
        return
    units = rows.filter(pl.col("group") != "ALL")["group"].n_unique()
    ks = sorted(int(k) for k in overall["k_shot"].unique().to_list())

    def err(k: int, predictor: str) -> str:
        r = overall.filter((pl.col("k_shot") == k) & (pl.col("predictor") == predictor))
        return pct(r["mdape_balanced"][0], 1) if r.height else "—"

    shown_k = 3 if 3 in ks else max(ks)
    page.p("A <i>unit</i> is one source's runs on one accelerator with one stack: the cluster and stack you bring. "
           f"In the k-shot protocol each {f'of the {units} units' if units else 'unit'} is predicted by the fit that "
           f"never saw its source (leave one source out); k of its runs (k = {', '.join(map(str, ks))}, drawn at "
           "random, several seeded draws) adapt that fit as <code>--calibrate-on FILE</code> does, and its other runs "
           "are predicted and scored. <i>naive</i> is the baseline that shifts every prediction by the median error "
           "of the k runs; at k = 0 both are the unadapted fit. The errors weigh every unit the same: after "
           f"{shown_k} runs the adapted fit's median error is <b>{err(shown_k, 'adapted')}</b> (naive "
           f"{err(shown_k, 'naive')}; unadapted {err(0, 'adapted')}). The 90 % interval after k runs is the "
           "protocol's own: its half-width is the 90 % quantile of the protocol's held-out errors at that k, every "
           "unit weighing the same, and its coverage is measured by leaving one unit out in turn; it replaces the "
           "unadapted interval, which describes a source the fit has never seen.")
    page.chart(charts.kshot_chart(overall, "error on the unit's other runs after k of its runs (naive: dashed)",
                                  "90% interval after k runs (adapted): median width"), "kshot")
    page.table(overall.select(
        pl.col("k_shot").alias("k"), "predictor", pl.col("mdape").alias("MdAPE"), pl.col("mape").alias("MAPE"),
        pl.col("mdape_balanced").alias("MdAPE, units equal"), pl.col("coverage_90").alias("90% coverage"),
        pl.col("median_width").alias("90% interval median width")),
        {**{c: (lambda v: pct(v, 1)) for c in ("MdAPE", "MAPE", "MdAPE, units equal")}, "90% coverage": pct,
         "90% interval median width": pct}, text=("predictor",))


def _index_page(site: _Site, shown: str) -> Page:
    page = Page("stepcast reports")
    page.p(f"Where does a training run stop gaining from more accelerators, and what can each accelerator train at "
           f"all? Curves: <b>{html.escape(site.cal_note)}</b>. Built from the store's tables `scaling_curves`, "
           f"`inflection_points`, `frontier`, `analytical_predictions`"
           f"{', `calibrated_predictions`' if site.cal is not None else ''}.", "note")
    page.p(f"<b>Inflection point</b>: the smallest N whose marginal efficiency (throughput gained per added "
           f"accelerator, relative to the best accelerator of a smaller cluster) falls below "
           f"{DEFAULT_THRESHOLD:g}; sizes beaten by a larger, more efficient size are skipped (their layout_note "
           f"says why, e.g. a batch that lacks the size's factor 3). The interval comes "
           f"from the calibrated bounds. A Universal Scalability Law fit X(N) = λn/(1+σ(n−1)+κn(n−1)) explains it: "
           f"σ contention, κ coherency, peak at n* = √((1−σ)/κ).")
    page.h("Pages")
    page.raw("<ul>" + "".join(f'<li><a href="{p}">{t}</a></li>' for p, t in (
        ("frontier.html", "compute frontier per accelerator"), ("hardware-choice.html", "hardware choice: time vs cost"),
        ("calibration.html", f"calibration: held-out and in-sample error ({html.escape(shown)})"))) + "</ul>")
    page.raw('<ul class="cols">' + "".join(f'<li><a href="hardware/{g}.html">{html.escape(site.name(g))}</a></li>'
                                           for g in site.gpus) + "</ul>")
    page.h("Where adding accelerators stops paying (strong scaling)")
    strong = site.knees.filter(pl.col("policy") == "strong").sort("gpu", "arch_id").with_columns(
        pl.col("gpu").replace_strict(site.names, default=pl.col("gpu")).alias("accelerator"))
    drawable = strong.filter(pl.col("inflection_n").is_not_null() | pl.col("n_max_swept").is_not_null()) \
        .filter(pl.col("n_min_feasible").is_not_null()) if "n_min_feasible" in strong.columns else strong.clear()
    if drawable.height:
        dots = drawable.with_columns(
            pl.col("inflection_n").fill_null(pl.col("n_max_swept")).alias("knee_n"),
            pl.when(pl.col("knee_found")).then(pl.lit("knee found")).otherwise(pl.lit("no knee up to the largest N swept"))
            .alias("status"))
        page.chart(charts.knee_dots(dots, f"knee N per accelerator: marginal efficiency below {DEFAULT_THRESHOLD:g} "
                                          f"(line: interval)"), "index-knees")
    else:
        page.empty("No accelerator has a feasible scaling curve: nothing to draw.")
    infeasible = strong.filter(pl.col("n_min_feasible").is_null()) if "n_min_feasible" in strong.columns else strong.clear()
    if infeasible.height:
        page.p("Not drawn (no feasible layout at any N): " + ", ".join(
            f"{r['accelerator']} × {r['arch_id']}" for r in infeasible.iter_rows(named=True)) + ".")
    page.raw(f"<details><summary>The knees as a table ({strong.height} rows: knee N with its interval, the USL fit "
             f"and why)</summary>")
    page.table(_knee_table(strong.rename({"arch_id": "model"}).select(
        "accelerator", "gpu", "model", "policy", "n_min_feasible", "inflection_n", "inflection_n_lo", "inflection_n_hi",
        "usl_sigma", "usl_kappa", "usl_peak_n", "explanation")).drop("policy"), KNEE_FORMATS, text=("explanation",))
    page.raw("</details>")
    page.h("Frontier")
    fr = site.frontier
    top = fr.filter(pl.col("is_frontier")) if "is_frontier" in fr.columns else fr.clear()
    lead = ["assumptions"] if "assumptions" in top.columns else []
    page.p("The largest training compute each accelerator trains at good utilization within the time limit, under "
           + ("both assumption sets: <i>realistic</i> (the calibrated model) and <i>ideal</i> (perfect overlap, "
              "datasheet rates). " if lead else "the model. ")
           + 'The <a href="frontier.html">frontier page</a> draws the whole sweep.')
    page.table(top.sort(*lead, "training_flop", descending=True).select(
        *lead, pl.col("gpu").alias("accelerator"), pl.col("training_flop").alias("training FLOP"),
        pl.col("n_gpus").alias("N"), "utilization"), {"training FLOP": flop, "N": count, "utilization": pct},
        _page_links(site, "accelerator"), text=tuple(lead))
    return page


def _page_links(site: _Site, column: str) -> dict[str, str]:
    """``Page.table``'s ``links`` for a column of accelerator ids: to their hardware pages (an id without a page
    stays plain text)."""
    return {column: ("hardware/{}.html", set(site.gpus))}
