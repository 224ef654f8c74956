"""`stepcast fit`: re-fit the calibration on the store's measured runs and print the comparison table."""

from __future__ import annotations

import json
from typing import Optional

import polars as pl
import typer
from rich.table import Table

from pipeline.commands.common import console, fail, settings, store_modules

PROTOCOLS = ("loso", "loho", "logo", "lofo", "lopo", "scale", "lost", "vtrain_multi_lomso")
GROUPINGS = {"loso": "source", "loho": "gpu", "logo": "generation", "lofo": "family", "lopo": "precision",
             "scale": "scale", "lost": "stack"}


def fit(
    grouping: Optional[str] = typer.Option(None, "--by", help="Rows of the per-group table: source, gpu, or the "
                                                                "scheme's own groups [default: the scheme's]."),
    scheme: str = typer.Option("logo", "--scheme", help="The protocol of the per-group table: loso, loho, logo, "
                                                         "lofo, lopo, scale, lost or vtrain_multi_lomso."),
    protocols: str = typer.Option("loso,logo,lofo,lopo,scale", "--protocols",
                                  help="Comma-separated validation protocols to run (loso: leave one source out; "
                                       "loho: one hardware model; logo: one hardware generation; lofo: one "
                                       "architecture family; lopo: one precision; scale: fit <= 256 accelerators, "
                                       "score larger runs; lost: one training stack; vtrain_multi_lomso: vTrain "
                                       "multi-node model sizes). Every fit also runs the k-shot protocol on the "
                                       "leave-one-source-out errors (fit_metrics scheme 'kshot')."),
    force: bool = typer.Option(False, "--force", help="Re-fit even if this data's version is already stored."),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json."),
    publish: bool = typer.Option(True, "--publish/--no-publish", help="Publish a fresh snapshot afterwards."),
    promote_version: Optional[str] = typer.Option(
        None, "--promote", metavar="VERSION",
        help="Serve this stored fit version instead of re-fitting (a person's decision over the promotion rule; "
             "`stepcast info` shows the served fit and the latest candidate with the reason)."),
) -> None:
    """Fit physics parameters + residual model, validate under the transfer protocols, store a versioned fit,
    print the comparison.

    The first table has one row per protocol and predictor: the analytical model with prior parameters
    (`analytical`), with fitted parameters (`physics`), the ridge residual (`ridge`) and the kept one
    (`calibrated`, with the coverage and median relative width of its 90% interval), all predicted out of
    fold: MdAPE, MAPE, the same with every source weighing the same ("sources equal": one source's 1,440 runs do
    not stand for all), share within +-10%. The second breaks one protocol down by its held-out groups. Every
    fold re-fits the physics and the residual without its runs. Needs a built store (`stepcast build`).

    Example: `stepcast fit --scheme lopo` (per precision), `stepcast fit --protocols loso,loho --scheme loho`,
    `stepcast fit --protocols loso,lost --scheme lost` (one training stack at a time).

    A new fit is served only if it is not worse than the served one on equal terms (pipeline/fits.py); a
    refused one is kept. `stepcast fit --promote VERSION` serves a stored version by hand. Like every writer,
    the command holds the store's writer lock (waits up to STEPCAST_LOCK_WAIT_S seconds for another writer).
    """
    fits, store = store_modules()
    wanted = tuple(p.strip() for p in protocols.split(",") if p.strip())
    bad = [p for p in wanted + (scheme,) if p not in PROTOCOLS]
    if bad:
        fail(f"unknown protocol '{bad[0]}': expected one of {', '.join(PROTOCOLS)}")
    if scheme not in wanted:
        wanted = wanted + (scheme,)
    grouping = grouping or GROUPINGS.get(scheme, "source")
    if grouping not in ("source", "gpu", GROUPINGS.get(scheme, "source")):
        fail(f"--by must be source, gpu or {GROUPINGS.get(scheme, 'source')} for --scheme {scheme}, got '{grouping}'")
    if fmt not in ("table", "json"):
        fail(f"--format must be table or json, got '{fmt}'")
    cfg = settings()
    if not cfg.store.exists():
        fail(f"store not found: {cfg.store} (run `stepcast build` first)", 1)
    try:
        with store.writer_lock(cfg.store):
            con = store.connect_waiting(cfg.store)  # a program outside stepcast may have it open
            try:
                if not store.table_exists(con, "runs"):
                    fail(f"{cfg.store}: no runs table (run `stepcast build` first)", 1)
                if promote_version is not None:
                    try:
                        row = fits.promote(con, promote_version)
                    except KeyError as err:
                        fail(err.args[0], 1)
                else:
                    # start-up time: models.fitting.calibration loads NumPy and the fit's code, for this command only
                    from models.fitting.calibration import PROTOCOLS as DEFAULT_PROTOCOLS

                    res = fits.run_fit(con, protocols=wanted, force=force or set(wanted) != set(DEFAULT_PROTOCOLS))
            finally:
                con.close()
            if publish:
                store.publish_snapshot(cfg.store, cfg.snapshot)
    except store.StoreBusy as err:
        fail(str(err), 1)
    if promote_version is not None:
        console.print(f"serving fit {row['version']} (n_train {row['n_train']}): {row['promotion_reason']}",
                      highlight=False)
        return
    f, m = res["fit"], res["metrics"]
    overall = m.filter(((pl.col("grouping") == "source") | (pl.col("scheme") == "vtrain_multi_lomso"))
                       & (pl.col("group") == "ALL") & pl.col("predictor").is_in(["analytical", "physics", "ridge",
                                                                                  "calibrated"]))
    sel = m.filter(pl.col("scheme") == scheme)
    if scheme != "vtrain_multi_lomso":
        sel = sel.filter(pl.col("grouping") == grouping)
    wide = sel.pivot(on="predictor", index="group", values="mdape").join(
        sel.filter(pl.col("predictor") == "calibrated").select("group", "n_runs", "mape", "within_10pct",
                                                               "coverage_90", "median_width"),
        on="group").sort(pl.col("group") != "ALL", -pl.col("n_runs"))
    scaling = (m.filter((pl.col("grouping") == "scaling_series") & (pl.col("group") == "ALL"))
               .select("scheme", "predictor", "n_series", "efficiency_abs_error", "efficiency_max_abs_error")
               .sort("scheme", "predictor") if "n_series" in m.columns else pl.DataFrame())
    if fmt == "json":
        print(json.dumps({"fit": {k: (str(v) if k.endswith("_at") else v) for k, v in f.items()},
                          "protocols": overall.to_dicts(), "scaling_efficiency": scaling.to_dicts(),
                          "scheme": scheme, "grouping": grouping, "rows": wide.to_dicts()}, indent=2, default=str))
        return
    pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
    t0 = Table(title="every protocol, all held-out runs: out-of-fold error of throughput per predictor")
    for c in ("protocol", "predictor", "n_runs", "MdAPE", "MAPE", "MdAPE sources equal", "MAPE sources equal",
              "within ±10%", "coverage_90", "median_width"):
        t0.add_column(c, justify="left" if c in ("protocol", "predictor") else "right")
    for r in overall.sort("scheme", "predictor").iter_rows(named=True):
        t0.add_row(r["scheme"], r["predictor"], str(r["n_runs"]), pct(r["mdape"]), pct(r["mape"]),
                   pct(r.get("mdape_balanced")), pct(r.get("mape_balanced")),
                   pct(r["within_10pct"]), pct(r["coverage_90"]), pct(r["median_width"]))
    console.print(t0)
    if scaling.height:
        ts = Table(title="scaling efficiency (per-GPU throughput at a measured series' largest N over its smallest): "
                         "|predicted - measured| over the series, every protocol")
        for c in ("protocol", "predictor", "series", "mean |error|", "largest |error|"):
            ts.add_column(c, justify="left" if c in ("protocol", "predictor") else "right")
        for r in scaling.iter_rows(named=True):
            ts.add_row(r["scheme"], r["predictor"], str(r["n_series"]), f"{r['efficiency_abs_error']:.3f}",
                       f"{r['efficiency_max_abs_error']:.3f}")
        console.print(ts)
    t = Table(title=f"{scheme} by {grouping}: out-of-group MdAPE of throughput per predictor; calibrated MAPE, "
                    "share within ±10%, 90% interval coverage and median relative width")
    cols = ["group", "n_runs", "analytical", "physics", "ridge", "calibrated", "mape", "within_10pct",
            "coverage_90", "median_width"]
    for c in cols:
        t.add_column(c, justify="left" if c == "group" else "right")
    for r in wide.iter_rows(named=True):
        t.add_row(*[str(r[c])[:48] if c == "group" else str(r[c]) if c == "n_runs"
                    else ("-" if r.get(c) is None else f"{r[c]:.1%}") for c in cols])
    console.print(t)
    status = "promoted" if f["promoted"] else "kept, not promoted"
    console.print(f"fit {f['version']} ({f['model_kind']}; {status}: {f['promotion_reason']}); "
                  f"{'reused stored fit' if res['reused'] else 'fitted now'}; promoted fit: {res['promoted']}")
    cal_rows = overall.filter(pl.col("predictor") == "calibrated").drop_nulls("mdape")
    if cal_rows.height:
        worst = cal_rows.sort("mdape", descending=True).row(0, named=True)
        console.print(f"worst protocol: {worst['scheme']} MdAPE {worst['mdape']:.1%}, MAPE {worst['mape']:.1%}, "
                      f"coverage {pct(worst['coverage_90'])}")
        if "mdape_balanced" in cal_rows.columns and cal_rows["mdape_balanced"].drop_nulls().len():
            wb = cal_rows.drop_nulls("mdape_balanced").sort("mdape_balanced", descending=True).row(0, named=True)
            console.print(f"worst protocol with every source weighing the same: {wb['scheme']} MdAPE "
                          f"{wb['mdape_balanced']:.1%}, MAPE {pct(wb['mape_balanced'])}")
