"""Accelerator prices (measurements/hardware_specs.csv `cloud_usd_per_hour`, measurements/cloud_prices.csv): every
accelerator `stepcast plan` can rank either has a price or says why it has none; the prices read from pages carry
their page, date and kind; the per-accelerator price is the documented median of its rows."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import polars as pl
import pytest

from pipeline.api import plan_prices
from pipeline.catalog import hardware

MEAS = Path(__file__).resolve().parents[1] / "measurements"
#: accelerators the price work names: priced from pages, or deliberately priceless
PRICED_FROM_PAGES = ("mi300x", "mi325x", "gb200", "b300", "trn1")
PRICELESS = ("gb300", "mi355x", "h20", "gaudi3", "trn2")


def hw() -> pl.DataFrame:
    return pl.read_csv(MEAS / "hardware_specs.csv", infer_schema_length=None)


def page_rows() -> pl.DataFrame:
    """cloud_prices.csv rows not read from the SkyPilot catalog (no commit hash)."""
    prices = pl.read_csv(MEAS / "cloud_prices.csv", infer_schema_length=0)
    return prices.filter(~pl.col("catalog_commit").str.contains(r"^[0-9a-f]{40}$"))


def test_every_accelerator_has_a_price_or_says_why_not():
    for r in hw().iter_rows(named=True):
        price, ref = r["cloud_usd_per_hour"], r["price_ref"] or ""
        if price is None:
            assert ref.startswith("no price: ") and len(ref) > 40, r["id"]
        else:
            assert price > 0 and not ref.startswith("no price") and "Median" in ref, r["id"]


def test_the_named_accelerators_are_priced_or_priceless_with_their_own_reason():
    table = {r["id"]: r for r in hw().iter_rows(named=True)}
    for a in PRICED_FROM_PAGES:
        assert table[a]["cloud_usd_per_hour"] > 0, a
    generic = table["gtx-580"]["price_ref"]
    for a in PRICELESS:
        assert table[a]["cloud_usd_per_hour"] is None and table[a]["price_ref"] != generic, a


def test_rows_read_from_pages_name_the_page_its_date_and_the_kind_of_price():
    rows = page_rows()
    assert set(rows["accelerator_id"]) == set(PRICED_FROM_PAGES)
    for r in rows.iter_rows(named=True):
        assert re.search(r"www\.[a-z0-9.-]+\.[a-z]+/", r["catalog_file"]), r["instance_type"]
        assert re.search(r"\[(.*(list|rental).*)\]$", r["catalog_file"]), r["instance_type"]
        assert re.fullmatch(r"20\d\d(-\d\d-\d\d)?", r["catalog_commit"]), r["instance_type"]
        assert float(r["price_usd_per_hour"]) > 0 and int(r["accelerator_count"]) > 0


@pytest.mark.parametrize("aid, usd, source", [
    ("mi300x", 3.925, "median of Oracle 6, Azure 6, TensorWave 1.50, Vultr 1.85 per GPU-hour"),
    ("mi325x", 1.95, "TensorWave"),
    ("gb200", 4.54, "Spheron: $9.08 per 2-GPU Superchip-hour"),
    ("b300", 6.125, "Ornn benchmark range $5.00-$7.25"),
    ("trn1", 21.50 / 16, "trn1.32xlarge $21.50/hr, 16 chips"),
])
def test_a_price_from_pages_is_the_median_over_clouds_of_its_rows(aid, usd, source):
    rows = page_rows().filter(pl.col("accelerator_id") == aid)
    per_cloud = {}
    for r in rows.iter_rows(named=True):
        per_cloud.setdefault(r["cloud"], []).append(float(r["price_usd_per_hour"]) / int(r["accelerator_count"]))
    median = statistics.median(statistics.median(v) for v in per_cloud.values())
    stated = hw().filter(pl.col("id") == aid)["cloud_usd_per_hour"][0]
    assert stated == pytest.approx(median, rel=1e-3) and stated == pytest.approx(usd, rel=1e-3), source


def test_plan_prices_the_newly_priced_accelerators():
    """`plan`'s default price source (median) covers them, and a page's cloud is a price source of its own."""
    median, label = plan_prices("median", None, MEAS)
    assert label == "median" and all(median[a] > 0 for a in PRICED_FROM_PAGES)
    assert not set(PRICELESS) & set(median)
    oracle, _ = plan_prices("cloud:oracle", None, MEAS)
    assert oracle == {"mi300x": pytest.approx(6.0)}
    resolvable = set(hardware(MEAS)["id"].to_list())
    assert set(PRICED_FROM_PAGES) <= resolvable


def test_plan_on_a_priceless_accelerator_says_why_in_one_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from pipeline.cli import app

    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "none" / "stepcast.duckdb"))
    res = CliRunner().invoke(app, ["plan", "--model", "llama3-70b", "--tokens", "15e12", "--deadline-days", "90",
                                   "--hardware", "trn2"])
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert "no median price for trn2 (trn2: the AWS on-demand rate of trn2.48xlarge was not found" in line
    assert line.endswith("give one with --price-source custom:FILE")
