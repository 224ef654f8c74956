"""`stepcast fit`: re-fit the calibration on the store's measured runs and print the comparison table."""

from __future__ import annotations

import json


import typer

from pipeline.cli import _fail, app, console, settings

PROTOCOLS = ("loso", "loho", "vtrain_multi_lomso")


@app.command()
def fit(
    grouping: str = typer.Option("source", "--by", help="Rows of the table: source or gpu."),
    scheme: str = typer.Option("loso", "--scheme", help="loso (leave one source out), loho (leave one hardware "
                                                        "out) or vtrain_multi_lomso."),
    force: bool = typer.Option(False, "--force", help="Re-fit even if this data's version is already stored."),
    vtrain_lomso: bool = typer.Option(True, "--vtrain-lomso/--no-vtrain-lomso",
                                      help="Also validate leave-one-model-size-out on vTrain multi-node runs."),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json."),
    publish: bool = typer.Option(True, "--publish/--no-publish", help="Publish a fresh snapshot afterwards."),
) -> None:
    """Fit physics parameters + residual model, validate grouped, store a versioned fit, print the comparison.

    The table compares, per group, the analytical model with prior parameters (`analytical`), with fitted
    parameters (`physics`), the residual models (`ridge`, `gbm`) and the kept one (`calibrated`, with the
    coverage and median relative width of its 90% interval), all predicted out-of-group. Needs a built store
    (`stepcast build`). Example: `stepcast fit --by gpu --scheme loho`.
    """
    import polars as pl

    from pipeline import fits, store

    if grouping not in ("source", "gpu"):
        _fail(f"--by must be source or gpu, got '{grouping}'")
    if scheme not in PROTOCOLS:
        _fail(f"--scheme must be one of {', '.join(PROTOCOLS)}, got '{scheme}'")
    if fmt not in ("table", "json"):
        _fail(f"--format must be table or json, got '{fmt}'")
    cfg = settings()
    if not cfg.store.exists():
        _fail(f"store not found: {cfg.store} (run `stepcast build` first)", 1)
    con = store.connect(cfg.store)
    try:
        if not store.table_exists(con, "runs"):
            _fail(f"{cfg.store}: no runs table (run `stepcast build` first)", 1)
        protocols = ("loso", "loho") + (("vtrain_multi_lomso",) if vtrain_lomso or scheme == "vtrain_multi_lomso"
                                        else ())
        res = fits.run_fit(con, protocols=protocols, force=force or "vtrain_multi_lomso" in protocols)
    finally:
        con.close()
    if publish:
        store.publish_snapshot(cfg.store, cfg.snapshot)
    f, m = res["fit"], res["metrics"]
    sel = m.filter(pl.col("scheme") == scheme)
    if scheme != "vtrain_multi_lomso":
        sel = sel.filter(pl.col("grouping") == grouping)
    wide = sel.pivot(on="predictor", index="group", values="mdape").join(
        sel.filter(pl.col("predictor") == "calibrated").select("group", "n_runs", "mape", "within_10pct",
                                                               "coverage_90", "median_width"),
        on="group").sort(pl.col("group") != "ALL", -pl.col("n_runs"))
    if fmt == "json":
        print(json.dumps({"fit": {k: (str(v) if k.endswith("_at") else v) for k, v in f.items()},
                          "scheme": scheme, "grouping": grouping, "rows": wide.to_dicts()}, indent=2, default=str))
        return
    from rich.table import Table

    t = Table(title=f"{scheme} by {grouping}: out-of-group MdAPE of throughput per predictor; calibrated MAPE, "
                    "share within ±10%, 90% interval coverage and median relative width")
    cols = ["group", "n_runs", "analytical", "physics", "ridge", "gbm", "calibrated", "mape", "within_10pct",
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
    console.print(f"LOSO: MdAPE {f['mdape']:.1%} (analytical {f['analytical_mdape']:.1%}, physics "
                  f"{f['physics_mdape']:.1%}), coverage {f['coverage_90']:.1%}, median width "
                  f"{f['median_width']:.1%}; LOHO MdAPE {f['loho_mdape']:.1%}, coverage {f['loho_coverage_90']:.1%}")
