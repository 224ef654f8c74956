"""The calibration page's reliability chart: coverage against width per transfer protocol and held-out group."""

from __future__ import annotations

import polars as pl

from reports import charts, site


def _metrics() -> tuple[pl.DataFrame, pl.DataFrame]:
    rows = [("v1", "lofo", "source", "ALL", 200, 0.71, 0.5), ("v1", "lofo", "family", "dense", 180, 0.70, 0.5),
            ("v1", "lofo", "family", "moe", 19, 0.9, 0.6), ("v1", "lofo", "family", "ALL", 200, 0.71, 0.5),
            ("v1", "loso", "source", "ALL", 200, 0.91, 0.4), ("v1", "loso", "gpu", "a100", 50, 0.9, 0.4),
            ("v0", "loso", "source", "ALL", 200, 0.5, 0.1), ("v1", "kshot", "unit", "ALL", 150, 0.9, 0.45)]
    m = pl.DataFrame(rows, schema=["version", "scheme", "grouping", "group", "n_runs", "coverage_90", "median_width"],
                     orient="row").with_columns(pl.lit("calibrated").alias("predictor"))
    fits = pl.DataFrame({"version": ["v1", "v0"], "promoted": [True, False]})
    return m, fits


def test_the_chart_shows_each_protocol_and_its_own_groups_of_20_runs_of_the_promoted_fit():
    rows = site.reliability_rows(*_metrics())
    got = set(rows.select("scheme", "group").iter_rows())
    # the protocol's own groups (>= 20 runs) and its overall row once; another version, grouping or k-shot: out
    assert got == {("lofo", "ALL"), ("lofo", "dense"), ("loso", "ALL")}
    spec = charts.reliability_chart(rows, "t")
    assert "layer" in spec and str(0.85) in str(spec) and str(0.95) in str(spec)


def test_no_metrics_no_section():
    assert site.reliability_rows(None, None).height == 0
    m, fits = _metrics()
    assert site.reliability_rows(m, fits.with_columns(pl.lit(False).alias("promoted"))).height == 0
