"""The report site: built by the pipeline on a temporary store, rebuilt from a store copy, and every page opened
in headless Chromium (Debian's `chromium`) with no console error, no network request and non-empty charts.

Browser tests skip when /usr/bin/chromium is absent, except under CI=true where they fail instead."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import duckdb
import polars as pl
import pytest

CHROMIUM = Path("/usr/bin/chromium")
#: the whole site, JavaScript bundle, pages and PNGs included: a page per accelerator of the shipped catalog (52,
#: ~80-300 KB each) and the frontier's sweep of every one of them; 8 MB held for 34 accelerators, the 46 took ~9.7 MB,
#: the 52 take ~10.6 MB (10.1 MiB)
SITE_TARGET_BYTES = 12 * 1024 * 1024
# Per chart: is it rendered (an <svg>), and for every leaf view how many data marks it drew. A view is a Vega
# `role-scope` group named `…_group` (a concatenated view), or one item of the `cell` group (a facet panel); a leaf
# holds no other view;
# a chart of one view is its own leaf. Data marks: children of `role-mark` groups, except the helper layers
# reports/charts.py names `guide_…` (a y = x diagonal or a threshold rule alone is an empty chart).
VIEW_STATE_JS = """(() => {
  const charts = [...document.querySelectorAll('div.chart')];
  const marks = (root) => [...root.querySelectorAll('g.role-mark')]
      .filter(g => ![...g.classList].some(c => c.startsWith('guide_')))
      .reduce((n, g) => n + g.children.length, 0);
  const isView = (g) => [...g.classList].some(c => c === 'cell' || (c.endsWith('_group') && !c.endsWith('pathgroup')));
  const views = (svg) => {
    const all = [...svg.querySelectorAll('g.role-scope')].filter(isView)
        .flatMap(g => g.classList.contains('cell') ? [...g.children].filter(c => c.tagName === 'g') : [g]);
    const leaves = all.filter(g => !all.some(o => o !== g && g.contains(o)));
    return (leaves.length ? leaves : [svg]).map(marks);
  };
  return {ready: document.readyState, charts: charts.length,
          rendered: charts.filter(x => x.querySelector('svg')).length,
          views: charts.map(x => x.querySelector('svg') ? views(x.querySelector('svg')) : []),
          empty_notes: document.querySelectorAll('p.empty').length};
})()"""
TABLES = ("scaling_curves", "inflection_points", "frontier", "analytical_predictions", "runs", "hardware")


def _site_tables(store) -> dict[str, pl.DataFrame]:
    """The tables the report site is drawn from, read from a store."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        return {t: con.sql(f"select * from {t}").pl() for t in TABLES}
    finally:
        con.close()


def site_of(store: Path) -> Path:
    return Path(os.environ.get("STEPCAST_REPORTS") or store.parent / "site")


def need_chromium():
    if CHROMIUM.exists():
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{CHROMIUM} is missing under CI=true: .ci/run installs Debian's chromium package")
    pytest.skip(f"{CHROMIUM} not installed (apt-get install -y chromium); browser checks skipped")


def test_build_writes_the_site(built_store):
    site = site_of(built_store)
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    for page in ("index.html", "frontier.html", "calibration.html", "hardware-choice.html",
                 "hardware/h100-sxm5-80gb.html", "hardware/gtx-580.html"):
        assert page in pages
    assert not (site / "hardware" / "tpu-v3.html").exists()  # no intra-node bandwidth in the data: no curves
    for png in ("frontier.png", "scaling-h100-gpt3-175b.png", "hardware-choice.png"):
        assert (site / "img" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    index = (site / "index.html").read_text()
    assert "vegaEmbed" in index and 'src="http' not in index and "cdn.jsdelivr" not in index
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        n = con.execute("select count(distinct gpu) from scaling_curves").fetchone()[0]
        knees = con.execute("select count(*) from inflection_points").fetchone()[0]
        fr = con.execute("select count(*) from frontier where is_frontier").fetchone()[0]
    finally:
        con.close()
    assert len([p for p in pages if p.startswith("hardware/")]) == n
    assert knees > 0 and fr >= 28


def test_site_shares_one_bundle_and_stays_under_the_size_target(built_store):
    site = site_of(built_store)
    bundle = site / "vega-bundle.js"
    assert bundle.stat().st_size > 100_000  # the Vega/Vega-Lite/vega-embed bundle, written once
    for page in site.rglob("*.html"):
        text = page.read_text()
        up = "../" * (len(page.relative_to(site).parts) - 1)
        assert f'src="{up}vega-bundle.js"' in text, page
        assert "vegaEmbed=" not in text and "function vegaEmbed" not in text, f"{page}: carries its own bundle"
    total = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    assert total < SITE_TARGET_BYTES, f"site is {total / 2**20:.1f} MB, target < {SITE_TARGET_BYTES / 2**20:.0f} MB"


def test_numbers_read_as_people_write_them():
    from reports.site import count, flop, pct, si, usd

    assert [usd(11.3e6), usd(2.1e9), usd(950e3), usd(740.0), usd(None)] == ["$11.3M", "$2.1B", "$950K", "$740", "—"]
    assert [pct(0.52), pct(0.123, 1), count(1024), si(175e9), si(15e12), flop(3.2e25)] == \
        ["52%", "12.3%", "1,024", "175B", "15T", "3.2e25"]


def test_calibration_summary_puts_the_worst_held_out_protocol_first():
    from reports.site import heldout_summary

    rows = []
    for scheme, cal in (("loso", 0.085), ("scale", 0.31), ("loho", 0.127)):
        for predictor, mdape in (("analytical", 0.93), ("physics", cal + 0.02), ("calibrated", cal)):
            rows.append({"version": "v1", "scheme": scheme, "grouping": "source", "group": "ALL", "predictor": predictor,
                         "n_runs": 100, "mdape": mdape, "mape": mdape * 1.4, "within_10pct": 0.5, "coverage_90": 0.9})
        rows.append({**rows[-1], "group": "some source", "mdape": 0.99})  # per-group rows are not the headline
    summary = heldout_summary(pl.DataFrame(rows), pl.DataFrame({"version": ["v1"], "promoted": [True]}))
    assert summary["scheme"].to_list() == ["scale", "loho", "loso"]
    assert summary["calibrated"].to_list() == [0.31, 0.127, 0.085]
    assert summary["protocol"][2] == "leave one source out"


def test_a_chart_with_nothing_to_draw_becomes_a_sentence(store_copy, tmp_path):
    from reports.site import build_site

    tables = _site_tables(store_copy)
    gtx = tables["scaling_curves"].filter(pl.col("gpu") == "gtx-580")
    assert gtx.height and not gtx["feasible"].all()
    # an accelerator on which nothing fits: the GTX 580's rows with every point infeasible for the memory reason
    # its smallest clusters give (tensor parallelism across the network lets larger clusters fit GPT-3 in 1.5 GB)
    reason = gtx.filter(~pl.col("feasible"))["reason"].drop_nulls()[0]
    is_gtx = pl.col("gpu") == "gtx-580"
    tables["scaling_curves"] = tables["scaling_curves"].filter(pl.col("gpu").is_in(["gtx-580", "h100-sxm5-80gb"])) \
        .with_columns(pl.when(is_gtx).then(False).otherwise(pl.col("feasible")).alias("feasible"),
                      pl.when(is_gtx).then(pl.lit(reason)).otherwise(pl.col("reason")).alias("reason"))
    build_site(tmp_path / "site", tables, png=False)
    page = (tmp_path / "site" / "hardware" / "gtx-580.html").read_text()
    assert 'class="chart"' not in page
    assert page.count('class="empty"') >= 3 and "no layout fits in memory" in page


def test_site_rebuilds_from_a_store_copy_and_a_failed_build_keeps_the_old_site(store_copy, tmp_path):
    from reports.site import build_site

    tables = _site_tables(store_copy)
    tables["scaling_curves"] = tables["scaling_curves"].filter(pl.col("gpu").is_in(["h100-sxm5-80gb", "b200"]))
    out = tmp_path / "site"
    files = build_site(out, tables, png=False)
    assert {f.name for f in files} >= {"index.html", "h100-sxm5-80gb.html", "b200.html"}
    assert sorted(p.name for p in (out / "hardware").iterdir()) == ["b200.html", "h100-sxm5-80gb.html"]
    before = (out / "index.html").read_text()
    broken = dict(tables, frontier=tables["frontier"].drop("utilization"))
    with pytest.raises(Exception):
        build_site(out, broken, png=False)
    assert (out / "index.html").read_text() == before
    assert not list(tmp_path.glob(".site.*"))  # the failed build cleaned up its temporary folder


def _page_content(text: str) -> str:
    """A page with its datasets parsed: their key order follows the drawing process's string hashing."""
    import re

    m = re.search(r"var DATA = (.*?);\nfunction withData", text, re.S)
    return text if m is None else text[:m.start(1)] + json.dumps(json.loads(m.group(1)), sort_keys=True) + text[m.end(1):]


def test_site_drawn_partly_in_a_worker_process_is_the_same(store_copy, tmp_path):
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from reports.site import build_site

    tables = _site_tables(store_copy)
    tables["scaling_curves"] = tables["scaling_curves"].filter(
        pl.col("gpu").is_in(["a100-sxm4-80gb", "b200", "h100-sxm5-80gb"]))
    here = build_site(tmp_path / "here", tables, png=False)
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as ex:
        split = build_site(tmp_path / "split", tables, png=False, executor=ex)
    assert [p.relative_to(tmp_path / "here") for p in here] == [p.relative_to(tmp_path / "split") for p in split]
    for a, b in zip(here, split):
        assert _page_content(a.read_text()) == _page_content(b.read_text()), a.name


# ------------------------------------------------------------------ headless Chromium through the DevTools protocol

class Browser:
    """Headless Chromium with a DevTools websocket on one page target."""

    def __init__(self):
        import websocket  # websocket-client

        self.profile = tempfile.mkdtemp(prefix="stepcast-chromium-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={self.profile}", f"--remote-debugging-port={port}", "--remote-allow-origins=*",
             "--window-size=1400,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import urllib.request

        deadline, targets = time.time() + 30, None
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as r:
                    targets = [t for t in json.load(r) if t.get("type") == "page"]
                if targets:
                    break
            except OSError:
                time.sleep(0.2)
        assert targets, "chromium did not open a DevTools endpoint"
        self.ws = websocket.create_connection(targets[0]["webSocketDebuggerUrl"], timeout=30)
        self.next_id = 0
        self.events: list[dict] = []
        for method in ("Runtime.enable", "Log.enable", "Network.enable", "Page.enable"):
            self.call(method)

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def evaluate(self, expr):
        return self.call("Runtime.evaluate", expression=expr, returnByValue=True)["result"].get("value")

    def open(self, url: str, timeout: float = 60.0) -> dict:
        self.events.clear()
        self.call("Page.navigate", url=url)
        deadline = time.time() + timeout
        state = None
        while time.time() < deadline:
            state = self.evaluate(VIEW_STATE_JS)
            if state and state["ready"] == "complete" and state["rendered"] == state["charts"]:
                break
            time.sleep(0.25)
        time.sleep(0.3)
        self.evaluate("1")  # drain pending events
        return state

    def problems(self, local: tuple[str, ...] = ("file:",)) -> tuple[list[str], list[str]]:
        """(console errors, requests to addresses that do not start with one of `local`, data:, blob:, about:)."""
        errors, requests = [], []
        for ev in self.events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                errors.append(p.get("exceptionDetails", {}).get("text", "exception"))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                errors.append(p["entry"].get("text", ""))
            elif m == "Network.requestWillBeSent":
                url = p.get("request", {}).get("url", "")
                if not url.startswith((*local, "data:", "blob:", "about:")):
                    requests.append(url)
        return errors, requests

    def close(self):
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    need_chromium()
    b = Browser()
    yield b
    b.close()


def test_every_page_renders_offline_without_errors(built_store, browser):
    site = site_of(built_store)
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 5
    for page in pages:
        state = browser.open(page.as_uri())
        assert state and state["ready"] == "complete", f"{page}: did not load"
        errors, requests = browser.problems()
        name = page.relative_to(site)
        assert not errors, f"{name}: console errors {errors[:3]}"
        assert not requests, f"{name}: network requests {requests[:3]}"
        assert state and (state["charts"] > 0 or state["empty_notes"] > 0), f"{name}: no charts and no reason why"
        assert state["rendered"] == state["charts"], f"{name}: {state['charts'] - state['rendered']} charts not rendered"
        empty = [(i, v) for i, views in enumerate(state["views"]) for v in [views] if not views or 0 in views]
        assert not empty, f"{name}: chart(s) with an empty view (marks per view): {empty}"
