"""`stepcast plan`: which accelerator, how many, which layout, how long, how much, how sure."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Optional

import typer

from pipeline.cli import ANALYTICAL_HELP, ASSUMPTIONS_HELP, _fail, app, settings

PLAN_COLUMNS = ["rank", "hardware", "n_gpus", "tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "sharding",
                "recompute", "days", "days_lo", "days_hi", "days_ideal", "cost_usd", "cost_usd_lo", "cost_usd_hi",
                "energy_mwh", "mfu", "tokens_per_s_per_gpu", "goodput", "expected_interruptions",
                "checkpoint_interval_min", "usd_per_gpu_hour", "price_source", "hfu", "step_time_s",
                "step_time_lo_s", "step_time_hi_s", "fit_version", "assumptions", "calibration_domain"]
TABLE_COLUMNS = ["rank", "hardware", "n_gpus", "tp", "pp", "dp", "cp", "days", "days_lo", "days_hi", "cost_usd",
                 "energy_mwh", "mfu", "goodput"]
NO_DEADLINE_HORIZON_DAYS = 365
OPTIMAL_COLUMNS = ["rank", "hardware", "n_gpus", "params", "tokens", "loss", "training_flop", "days", "cost_usd",
                   "energy_mwh", "mfu", "tp", "pp", "dp", "cp", "n_layers", "d_model", "usd_per_gpu_hour"]


def _prices(source: str, price_file: Optional[Path], measurements: Path):
    """Per-accelerator USD/hour by the chosen price source -> (dict id -> price, label)."""
    import polars as pl

    from pipeline import catalog

    if price_file is not None or source.startswith("custom"):
        path = price_file or Path(source.split(":", 1)[1] if ":" in source else "")
        if not path or not Path(path).exists():
            _fail(f"--price-source custom needs a file: --price-source custom:FILE or --price-file FILE "
                  f"(CSV with columns hardware,usd_per_gpu_hour); got '{path}'")
        try:
            frame = pl.read_csv(path)
        except Exception as err:  # noqa: BLE001
            _fail(f"{path}: unreadable CSV ({err})")
        missing = [c for c in ("hardware", "usd_per_gpu_hour") if c not in frame.columns]
        if missing:
            _fail(f"{path}: missing column(s) {', '.join(missing)} (expected hardware,usd_per_gpu_hour)")
        bad = frame.with_row_index("i").filter(~(pl.col("usd_per_gpu_hour").cast(pl.Float64, strict=False) > 0))
        if bad.height:
            _fail(f"{path}: line {int(bad['i'][0]) + 2}, column usd_per_gpu_hour: expected a price > 0")
        return dict(zip(frame["hardware"], frame["usd_per_gpu_hour"].cast(pl.Float64))), f"custom:{path}"
    if source == "median":
        hw = catalog.hardware(measurements).filter(pl.col("cloud_usd_per_hour").is_not_null())
        return dict(zip(hw["id"], hw["cloud_usd_per_hour"].cast(pl.Float64))), "median"
    if source.startswith("cloud:"):
        cloud = source.split(":", 1)[1]
        prices = pl.read_csv(measurements / "cloud_prices.csv")
        known = sorted(prices["cloud"].unique().to_list())
        if cloud not in known:
            _fail(f"--price-source cloud:{cloud}: unknown cloud; expected one of {', '.join(known)}")
        per = (prices.filter(pl.col("cloud") == cloud)
               .group_by("accelerator_id")
               .agg((pl.col("price_usd_per_hour") / pl.col("accelerator_count")).median().alias("p")))
        return dict(zip(per["accelerator_id"], per["p"])), source
    _fail(f"--price-source must be median, cloud:NAME or custom:FILE, got '{source}'")


@app.command()
def plan(
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="Architecture id or name, e.g. llama3-70b (not used with --optimal)."),
    arch_file: Optional[Path] = typer.Option(None, "--arch-file", metavar="PATH",
                                             help="Architecture from a file instead of --model: a row of the "
                                                  "architectures schema (CSV/JSON) or a Hugging Face config.json."),
    tokens: Optional[float] = typer.Option(None, "--tokens", "-t", help="Training tokens, e.g. 15e12."),
    deadline_days: Optional[float] = typer.Option(None, "--deadline-days", help="Finish within this many days."),
    budget_usd: Optional[float] = typer.Option(None, "--budget-usd", help="Spend at most this many dollars."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="Comma-separated hardware ids (default: every "
                                                                     "accelerator with a price)."),
    max_gpus: int = typer.Option(65536, "--max-gpus", min=1, help="Largest cluster to consider."),
    price_source: str = typer.Option("median", "--price-source",
                                     help="median (cross-cloud median), cloud:NAME (aws, gcp, lambda, nebius, "
                                          "runpod, vast) or custom:FILE (CSV hardware,usd_per_gpu_hour)."),
    price_file: Optional[Path] = typer.Option(None, "--price-file", help="Same as --price-source custom:FILE."),
    seq_len: int = typer.Option(8192, "--seq-len", min=1, help="Tokens per sequence (Llama 3 pre-training: 8192)."),
    batch_tokens: int = typer.Option(4_194_304, "--global-batch-tokens", min=1,
                                     help="Tokens per optimizer step (Llama 3 405B started at 4M)."),
    dtype: str = typer.Option("bf16", "--dtype", help="Precision of the matmuls."),
    optimal: bool = typer.Option(False, "--optimal", help="Choose the model size too: the compute-optimal "
                                                          "(Chinchilla) size and token count for the budget."),
    top: int = typer.Option(10, "--top", "-k", min=1, help="How many options to show."),
    assumptions: str = typer.Option("realistic", "--assumptions", help=ASSUMPTIONS_HELP),
    analytical_only: bool = typer.Option(False, "--analytical-only", help=ANALYTICAL_HELP),
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the result to this file."),
) -> None:
    """Rank hardware x cluster size x layout by cost within a deadline (or by time within a budget).

    Each option has days (with the expected interruptions, checkpoints and restarts of a cluster that size; the
    failure-free `days_ideal` beside it), dollars, energy (MWh at TDP x PUE 1.1), MFU and, when a calibrated fit
    is promoted, the interval `days_lo..days_hi`. The reliability model and every constant with its source:
    `models/plan.py`.

    Examples:

    `stepcast plan --model llama3-70b --tokens 15e12 --deadline-days 90 --format json`

    `stepcast plan --model llama3-70b --tokens 15e12 --budget-usd 20e6 --hardware h100-sxm5-80gb,b200`

    `stepcast plan --model llama3-70b --budget-usd 5e6 --deadline-days 60 --optimal`
    """
    import numpy as np
    import polars as pl

    from models import plan as P
    from models.hardware import resolve_hardware
    from pipeline import api, catalog
    from pipeline.output import render

    if fmt not in ("table", "csv", "json"):
        _fail(f"--format must be table, csv or json, got '{fmt}'")
    if assumptions not in api.ASSUMPTION_SETS:
        _fail(f"--assumptions must be one of {', '.join(api.ASSUMPTION_SETS)}, got '{assumptions}'")
    if tokens is not None and not (tokens > 0 and math.isfinite(tokens)):
        _fail(f"--tokens must be a positive number, got {tokens}")
    for name, v in (("--deadline-days", deadline_days), ("--budget-usd", budget_usd)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            _fail(f"{name} must be a positive number, got {v}")
    if optimal and budget_usd is None:
        _fail("--optimal needs --budget-usd (the compute you can buy decides the model size)")
    if not optimal and (tokens is None or (model is None and arch_file is None)):
        _fail("--model (or --arch-file) and --tokens are required (or use --optimal with --budget-usd)")
    if batch_tokens < seq_len:
        _fail(f"--global-batch-tokens ({batch_tokens}) must be at least --seq-len ({seq_len})")
    cfg = settings()
    prices, price_label = _prices(price_source, price_file, cfg.measurements)
    hw_all = resolve_hardware(catalog.hardware(cfg.measurements), strict=False)
    if hardware:
        try:  # names as people say them (H100, gb200) resolve to the table's ids
            wanted = [catalog.find_hardware(cfg.measurements, h.strip())["id"] for h in hardware.split(",")
                      if h.strip()]
        except catalog.UnknownName as err:
            _fail(str(err))
        no_price = [h for h in wanted if h not in prices]
        if no_price:
            _fail(f"no {price_label} price for {', '.join(no_price)}; give one with --price-source custom:FILE")
    else:
        wanted = [h for h in hw_all["id"].to_list() if h in prices]
    hw_rows = [r for r in hw_all.filter(pl.col("id").is_in(wanted) & pl.col("hardware_error").is_null())
               .iter_rows(named=True)]
    from pipeline.calibrated import model_for

    pred_model = model_for(cfg, analytical_only, assumptions)
    phys = pred_model
    seqs = max(batch_tokens // seq_len, 1)

    if optimal:
        result = _optimal(P, np, pl, hw_rows, prices, budget_usd, deadline_days, max_gpus, seq_len, seqs, dtype,
                          phys)
        if result.height == 0:
            print("no hardware in the list can train a model within the budget"
                  + (f" and {deadline_days:g} days" if deadline_days else "") + "; raise --budget-usd, "
                  "--deadline-days or --max-gpus", file=sys.stderr)
            raise typer.Exit(1)
        result = result.sort("loss").head(top).with_row_index("rank", offset=1)
        render(result.select([c for c in OPTIMAL_COLUMNS if c in result.columns]), fmt, out,
               title=f"compute-optimal plans for ${budget_usd:,.0f} (Chinchilla loss, lower is better)")
        return

    try:
        arch = catalog.resolve_architecture(model, arch_file, measurements=cfg.measurements)
    except catalog.UnknownName as err:
        _fail(str(err))
    frame = P.plan_rows(arch, hw_rows, tokens, seqs, seq_len, max_gpus, prices, dtype=dtype, model=pred_model)
    if frame.height == 0:
        print(f"{arch['id']} fits on none of {', '.join(wanted)} up to {max_gpus} accelerators; raise --max-gpus",
              file=sys.stderr)
        raise typer.Exit(1)
    frame = frame.with_columns(pl.lit(price_label).alias("price_source"))
    fit_version = frame["fit_version"].drop_nulls().first() if "fit_version" in frame.columns else None
    ok = frame
    if deadline_days is not None:
        ok = ok.filter(pl.col("days") <= deadline_days)
    if budget_usd is not None:
        ok = ok.filter(pl.col("cost_usd") <= budget_usd)
    if ok.height == 0:
        fastest = frame.sort("days").row(0, named=True)
        cheapest = frame.sort("cost_usd").row(0, named=True)
        msg = [f"no option meets the ask for {arch['id']} on {tokens:.3g} tokens"]
        if deadline_days is not None:
            msg.append(f"the fastest found takes {fastest['days']:.1f} days ({fastest['n_gpus']:,} x "
                       f"{fastest['hardware']}, ${fastest['cost_usd']:,.0f}); a {deadline_days:g}-day deadline needs "
                       f"a larger --max-gpus (now {max_gpus:,}) or --global-batch-tokens (now {batch_tokens:,}: data "
                       f"parallelism cannot exceed its {seqs:,} sequences), faster hardware, or fewer tokens")
        if budget_usd is not None:
            msg.append(f"the cheapest found costs ${cheapest['cost_usd']:,.0f} ({cheapest['n_gpus']:,} x "
                       f"{cheapest['hardware']}, {cheapest['days']:.1f} days); the budget would need to be at "
                       f"least that")
        print("; ".join(msg), file=sys.stderr)
        if fmt == "json":
            print("[]")
        raise typer.Exit(1)
    order = "cost_usd" if deadline_days is not None or budget_usd is None else "days"
    late = pl.lit(False)
    if deadline_days is None and budget_usd is None:
        # no deadline: the cheapest plans are the slowest; those past a year are ranked last, with a warning
        late = pl.col("days") > NO_DEADLINE_HORIZON_DAYS
        n_late = ok.filter(late).height
        if n_late:
            print(f"warning: no --deadline-days given; {n_late} of {ok.height} plans take more than "
                  f"{NO_DEADLINE_HORIZON_DAYS} days and are ranked last (give --deadline-days to rank by cost within "
                  "it)", file=sys.stderr)
    ok = ok.with_columns(late.alias("_late")).sort(["_late", order, "days"]).drop("_late").head(top) \
        .with_row_index("rank", offset=1)
    cols = [c for c in PLAN_COLUMNS if c in ok.columns]
    title = (f"{arch['id']}, {tokens:.3g} tokens: best {ok.height} by {order.replace('_usd', '')}"
             + (f" within {deadline_days:g} days" if deadline_days else "")
             + (f" within ${budget_usd:,.0f}" if budget_usd else "")
             + f" — {api.title_of('plan', ok).split(' — ', 1)[-1]}")
    if fmt == "table":
        render(ok.select(cols), fmt, out, title=title, table_columns=TABLE_COLUMNS)
    else:
        print(title, file=sys.stderr)
        render(ok.select(cols), fmt, out)


def _optimal(P, np, pl, hw_rows, prices, budget, deadline, max_gpus, seq_len, seqs, dtype, phys):
    """For each hardware and cluster size: the Chinchilla-optimal model for the compute the budget buys at the
    MFU the model predicts for that model on that cluster (fixed point of size -> MFU -> compute -> size)."""
    from models.search import search

    out = []
    for hw in hw_rows:
        price = prices[hw["id"]]
        gpu_hours = budget / price
        peak = hw.get("peak_bf16_tflops") or hw.get("peak_fp32_tflops")
        for n in P.cluster_sizes(hw.get("scaleup_size") or 8, max_gpus):
            hours = gpu_hours / n
            if deadline is not None and hours / 24.0 > deadline:
                continue
            mfu, best, shape, n_opt, d_opt = 0.4, None, None, None, None
            for _ in range(3):
                compute = n * peak * 1e12 * mfu * hours * 3600.0
                n_opt, d_opt = P.CHINCHILLA.optimal(compute)
                shape = {k: float(v) for k, v in P.dense_shape(n_opt).items()}
                arch = dict(shape, activation="gelu", n_experts=0, top_k=0, tied_embeddings=False)
                res = search(arch, hw, n, seqs, seq_len, fixed=P.PLAN_GRID, dtype=dtype, top_k=1,
                             **({"params": phys} if phys is not None else {}))
                if res.height == 0:
                    best = None
                    break
                best = res.row(0, named=True)
                mfu = best["mfu"]
            if best is None or not hours > 0:
                continue
            rel = P.reliability(hours * 3600.0, n, n_opt)
            # the budget buys `hours` of wall-clock; interruptions eat (1 - goodput) of it
            compute = n * peak * 1e12 * mfu * hours * 3600.0 * float(rel["goodput"])
            n_opt, d_opt = P.CHINCHILLA.optimal(compute)
            out.append(dict(hardware=hw["id"], n_gpus=n, params=float(n_opt), tokens=float(d_opt),
                            loss=float(P.CHINCHILLA.loss(n_opt, d_opt)), training_flop=float(compute),
                            days=hours / 24.0, cost_usd=budget,
                            energy_mwh=float(P.energy_mwh(n, hw.get("tdp_w") or np.nan, hours * 3600.0)),
                            mfu=mfu, tp=best["tp"], pp=best["pp"], dp=best["dp"], cp=best["cp"],
                            n_layers=shape["n_layers"], d_model=shape["d_model"], usd_per_gpu_hour=price))
    return pl.DataFrame(out) if out else pl.DataFrame()
