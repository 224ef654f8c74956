"""The calibration page's section "Your cluster in k runs": the k-shot protocol of the promoted fit."""

from __future__ import annotations

import json
import re

import duckdb
import polars as pl
import pytest

from reports import charts
from reports.site import Page, _kshot_section, heldout_summary, kshot_rows, pct

SECTION = "<h2>Your cluster in k runs</h2>"
FALLBACK = "No k-shot figures yet"
HEADER = ["k", "predictor", "MdAPE", "MAPE", "MdAPE, units equal", "90% coverage", "90% interval median width"]

# the overall rows of the promoted fit: k -> (adapted, naive) units-equal MdAPE; k = 0 is the unadapted fit for both
BALANCED = {0: (0.1012, 0.1012), 1: (0.0861, 0.0953), 3: (0.0734, 0.0788), 5: (0.0702, 0.0715)}
WIDTH = {0: 0.571, 1: 0.503, 3: 0.487, 5: 0.455}


def _row(version: str, scheme: str, predictor: str, group: str = "ALL", k: int | None = None, **figures) -> dict:
    out = {"version": version, "scheme": scheme, "grouping": "unit" if scheme == "kshot" else "source",
           "group": group, "predictor": predictor, "n_runs": 200, "mdape": 0.08, "mape": 0.11, "within_10pct": 0.6,
           "coverage_90": 0.9, "median_width": None, "mdape_balanced": 0.09, "mape_balanced": 0.12, "k_shot": k}
    out.update(figures)
    return out


def _metrics() -> pl.DataFrame:
    rows = []
    for predictor, mdape in (("analytical", 0.6), ("physics", 0.2), ("calibrated", 0.15)):
        rows.append(_row("v2", "loso", predictor, mdape=mdape, median_width=0.5 if predictor == "calibrated" else None))
    for k, (adapted, naive) in BALANCED.items():
        for predictor, bal in (("adapted", adapted), ("naive", naive)):
            rows.append(_row("v2", "kshot", predictor, k=k, mdape=bal + 0.004, mape=bal + 0.03, mdape_balanced=bal,
                             mape_balanced=bal + 0.035, coverage_90=0.897 if predictor == "adapted" else 0.883,
                             median_width=WIDTH[k] if predictor == "adapted" else WIDTH[k] + 0.05))
    for unit, mdape in (("unit a | h100 | megatron", 0.05), ("unit b | a100 | nemo", 0.12)):
        rows.append(_row("v2", "kshot", "adapted", group=unit, k=3, mdape=mdape, mdape_balanced=mdape,
                         coverage_90=None))
    # an earlier, unpromoted fit's protocol: none of its figures may appear
    rows.append(_row("v1", "kshot", "adapted", k=3, mdape_balanced=0.4321))
    return pl.DataFrame(rows, schema_overrides={"median_width": pl.Float64, "coverage_90": pl.Float64,
                                                "k_shot": pl.Int64})


FITS = pl.DataFrame({"version": ["v2", "v1"], "promoted": [True, False]})


@pytest.fixture(autouse=True)
def _fresh_datasets():
    """The chart registry is per page (build_site clears it after each); so is every test here."""
    charts.forget_data()
    yield
    charts.forget_data()


def _section(metrics, fits) -> str:
    page = Page("Calibration: how far off are the predictions?")
    _kshot_section(page, metrics, fits)
    return page.render()


def _table(text: str) -> list[list[str]]:
    """The section's table as rows of cell texts (header first)."""
    table = re.search(r"<table>(.*?)</table>", text, re.S).group(1)
    return [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", table)]


def _datasets(text: str) -> dict:
    """The page's datasets as rows (the page stores each by column)."""
    data = json.loads(re.search(r"var DATA = (.*?);\nfunction withData", text, re.S).group(1))
    return {name: [dict(zip(cols, values)) for values in zip(*cols.values())] for name, cols in data.items()}


def test_section_shows_the_promoted_fits_protocol():
    text = _section(_metrics(), FITS)
    assert SECTION in text and FALLBACK not in text
    body = text[text.index(SECTION):]
    # the caption: what the protocol is, the headline at k = 3, and whose interval it is
    assert "each of the 2 units" in body and "k = 0, 1, 3, 5" in body
    assert "--calibrate-on FILE" in body and "median error of the k runs" in body
    assert f"median error is <b>{pct(0.0734, 1)}</b> (naive {pct(0.0788, 1)}; unadapted {pct(0.1012, 1)})" in body
    assert pct(0.0734, 1) == "7.3%"
    assert "The 90 % interval after k runs is the protocol's own" in body
    # one chart: error and interval width against k
    assert body.count('class="chart"') == 1 and 'data-chart="kshot"' in body
    # the table: the overall rows only, k ascending, adapted first
    table = _table(body)
    assert table[0] == HEADER
    assert [(r[0], r[1]) for r in table[1:]] == [(str(k), p) for k in BALANCED for p in ("adapted", "naive")]
    k3 = dict(zip(HEADER, table[1 + 2 * 2]))
    assert k3 == {"k": "3", "predictor": "adapted", "MdAPE": "7.7%", "MAPE": "10.3%", "MdAPE, units equal": "7.3%",
                  "90% coverage": "90%", "90% interval median width": "49%"}
    assert "43.2%" not in text  # the unpromoted fit's figure
    # the chart's data: the overall rows, per-unit rows and other fits left out
    rows = [r for values in _datasets(text).values() for r in values]
    assert len(rows) == 8 and {r["predictor"] for r in rows} == {"adapted", "naive"}
    assert {(r["k_shot"], r["predictor"]): r["mdape_balanced"] for r in rows}[(3, "adapted")] == 0.0734
    assert {(r["k_shot"], r["predictor"]): r["median_width"] for r in rows}[(5, "adapted")] == 0.455


def test_chart_is_valid_vega_lite_with_both_panels():
    from altair.utils.schemapi import validate_jsonschema
    from altair.vegalite.v6.schema import core

    overall = kshot_rows(_metrics(), FITS).filter(pl.col("group") == "ALL")
    spec = charts.to_spec(charts.kshot_chart(overall, "error", "width"))
    validate_jsonschema(spec, core.load_schema())
    error, width = spec["hconcat"]
    assert error["encoding"]["y"]["field"] == "mdape_balanced" and width["encoding"]["y"]["field"] == "median_width"
    assert "adapted" in width["transform"][0]["filter"]  # the interval: the adapted prediction's
    assert error["width"] == width["width"] == charts.WIDTH and error["height"] == charts.HEIGHT
    assert error["encoding"]["x"]["axis"]["values"] == [0, 1, 3, 5]


@pytest.mark.parametrize("case", ["older store: no k_shot column", "no kshot rows", "kshot rows of another fit",
                                  "no fit_metrics", "no fits"])
def test_without_kshot_rows_the_section_says_so_in_one_sentence(case):
    m = _metrics()
    metrics, fits = {
        "older store: no k_shot column": (m.filter(pl.col("scheme") != "kshot").drop("k_shot"), FITS),
        "no kshot rows": (m.filter(pl.col("scheme") != "kshot"), FITS),
        "kshot rows of another fit": (m.filter(pl.col("version") == "v1"), FITS),
        "no fit_metrics": (None, FITS),
        "no fits": (m, None),
    }[case]
    text = _section(metrics, fits)
    body = text[text.index(SECTION):]
    empty = re.findall(r'<p class="empty">(.*?)</p>', body)
    assert len(empty) == 1 and empty[0].startswith(FALLBACK) and empty[0].count(". ") == 0
    assert 'class="chart"' not in body and "<table>" not in body


def test_held_out_table_leaves_the_kshot_rows_to_their_section():
    m = _metrics()
    summary = heldout_summary(m, FITS)
    assert summary["scheme"].to_list() == ["loso"]
    assert summary.equals(heldout_summary(m.filter(pl.col("scheme") != "kshot"), FITS))


def test_built_site_calibration_page_shows_the_stores_protocol(built_store):
    """The session build's calibration page against its own store: the k = 3 adapted units-equal MdAPE."""
    from tests.test_reports import site_of

    con = duckdb.connect(str(built_store), read_only=True)
    try:
        rows = con.sql("""select k_shot, predictor, mdape_balanced from fit_metrics join fits f using(version)
                          where f.promoted and scheme = 'kshot' and "group" = 'ALL' order by k_shot, predictor""").pl()
    finally:
        con.close()
    page = (site_of(built_store) / "calibration.html").read_text()
    assert SECTION in page
    body = page[page.index(SECTION):page.index("<h2>", page.index(SECTION) + len(SECTION))]
    assert rows.height, "the session build's promoted fit wrote no k-shot rows"
    k3 = rows.filter((pl.col("k_shot") == 3) & (pl.col("predictor") == "adapted"))["mdape_balanced"][0]
    table = _table(body)
    assert table[0] == HEADER and len(table) == 1 + rows.height
    assert dict(zip(HEADER, table[1 + 2 * 2]))["MdAPE, units equal"] == pct(k3, 1)
    assert f"median error is <b>{pct(k3, 1)}</b>" in body
