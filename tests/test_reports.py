"""The report site: built by the pipeline on a temporary store, rebuilt from a store copy, and every page opened
in headless Chromium (Debian's `chromium`) with no console error or warning, no network request, non-empty charts
that fit the page's width and a screen's height (or carry their x axis on top); the site within its size and
holding nothing that no page references.

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
#: the whole site, JavaScript bundle and pages: a page per accelerator of the shipped catalog (52, ~50-300 KB each) and
#: the frontier's sweep of every one of them
SITE_TARGET_BYTES = 8_000_000
#: a chart taller than this (CSS px; a laptop screen) carries its x axis on top, where a reader starts
SCREEN_PX = 1000
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
  // geometry: the drawing's size against its box (wider: cut off, e.g. a legend), and its x axes' tops (role-axis
  // groups Vega labels "X-axis ...") relative to the drawing's top, with the cells (facet panels) above each axis
  const geometry = (div) => {
    const svg = div.querySelector('svg');
    if (!svg) return null;
    const box = svg.getBoundingClientRect();
    const axes = [...svg.querySelectorAll('g.role-axis')].filter(a => (a.getAttribute('aria-label') || '').startsWith('X-axis'))
        .map(a => a.getBoundingClientRect());
    const cells = [...svg.querySelectorAll('g.cell > g')].map(c => c.querySelector('path.background, rect') || c)
        .map(c => c.getBoundingClientRect());
    return {name: div.dataset.chart, width: box.width, height: box.height, room: div.clientWidth,
            axis_tops: axes.map(a => a.top - box.top),
            orphan_axes: cells.length ? axes.filter(a => !cells.some(c => c.left < a.right && a.left < c.right
                && a.top - c.bottom > -4 && a.top - c.bottom < 60)).length : 0};
  };
  return {ready: document.readyState, charts: charts.length,
          rendered: charts.filter(x => x.querySelector('svg')).length,
          views: charts.map(x => x.querySelector('svg') ? views(x.querySelector('svg')) : []),
          geometry: charts.map(geometry),
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
    assert not (site / "img").exists()  # no exports beside the pages: nothing in the folder that no page shows
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
    assert total <= SITE_TARGET_BYTES, f"site is {total / 1e6:.1f} MB, target <= {SITE_TARGET_BYTES / 1e6:.0f} MB"


def _references(page: Path) -> set[Path]:
    """The local files a page links to or loads (href/src; fragments, queries and outside addresses left out)."""
    import re
    from urllib.parse import unquote

    out = set()
    for ref in re.findall(r'(?:href|src)="([^"]*)"', page.read_text()):
        ref = ref.split("#")[0].split("?")[0]
        if ref and not re.match(r"^[a-z]+:", ref):
            out.add((page.parent / unquote(ref)).resolve())
    return out


def test_every_file_of_the_site_is_referenced_and_every_link_resolves(built_store):
    """Nothing in the site folder that no page references (the index is the way in), and no page links to a file
    that is not there."""
    site = site_of(built_store).resolve()
    files = {f.resolve() for f in site.rglob("*") if f.is_file()}
    referenced = set()
    for page in sorted(site.rglob("*.html")):
        refs = _references(page)
        broken = sorted(str(r.relative_to(site)) if r.is_relative_to(site) else str(r) for r in refs - files)
        assert not broken, f"{page.relative_to(site)} links to missing files: {broken[:5]}"
        referenced |= refs
    unreferenced = sorted(str(f.relative_to(site)) for f in files - referenced - {site / "index.html"})
    assert not unreferenced, f"files no page references: {unreferenced[:10]}"


def _datasets(page: Path) -> dict[str, list[dict]]:
    """A page's datasets as rows (the page stores each by column)."""
    import re

    data = json.loads(re.search(r"var DATA = (.*?);\nfunction withData", page.read_text(), re.S).group(1))
    return {name: [dict(zip(cols, values)) for values in zip(*cols.values())] for name, cols in data.items()}


def _tables(page: Path) -> list[list[list[str]]]:
    """A page's HTML tables as rows of cell texts (header first)."""
    import re

    return [[[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr)]
             for tr in re.findall(r"<tr>(.*?)</tr>", t)] for t in re.findall(r"<table>(.*?)</table>", page.read_text(), re.S)]


def test_measured_runs_meet_the_prediction_of_their_own_configuration(built_store):
    """An accelerator page draws each measured run against the served fit's prediction of that very run (the
    store's calibrated_predictions, as `stepcast predict --runs` answers), never on a curve of another configuration:
    the curves' datasets carry no measured run."""
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        cal = con.sql("""select a.run_id, a.dtype, a.seq_len, a.measured_tokens_per_s_per_gpu as measured,
                                c.tokens_per_s_per_gpu as predicted
                         from analytical_predictions a join calibrated_predictions c using (run_id)
                         where a.gpu = 'h100-sxm5-80gb' and a.measured_tokens_per_s_per_gpu is not null
                           and c.tokens_per_s_per_gpu > 0 and a.n_gpus > 0""").pl()
    finally:
        con.close()
    assert cal.height >= 50 and cal["dtype"].n_unique() >= 2 and cal["seq_len"].n_unique() >= 3
    page = site_of(built_store) / "hardware" / "h100-sxm5-80gb.html"
    data = _datasets(page)
    rows = [r for rows in data.values() for r in rows if "predicted_tokens_per_s_per_gpu" in r]
    assert {r["run_id"] for r in rows} == set(cal["run_id"])
    want = dict(zip(cal["run_id"], cal["predicted"]))
    for r in rows:
        assert r["predicted_tokens_per_s_per_gpu"] == pytest.approx(want[r["run_id"]], rel=1e-3), r["run_id"]
        assert r["measured_over_predicted"] == pytest.approx(
            r["measured_tokens_per_s_per_gpu"] / r["predicted_tokens_per_s_per_gpu"], rel=2e-3), r["run_id"]
    curves = [r for rows in data.values() for r in rows if "policy" in r]
    assert curves and not any("run_id" in r for r in curves)
    text = page.read_text()
    assert 'data-chart="h100-sxm5-80gb-measured"' in text and "Measured runs against their own prediction" in text


def test_frontier_tables_say_ideal_or_realistic(built_store):
    site = site_of(built_store)
    for name in ("index.html", "frontier.html"):
        tables = [t for t in _tables(site / name) if "training FLOP" in t[0]]
        assert len(tables) == 1, name
        head, *rows = tables[0]
        assert head[0] == "assumptions", name
        assert {r[0] for r in rows} == {"ideal", "realistic"}, name


def test_hardware_choice_page_shows_every_target_run(built_store):
    """Every target run of measurements/target_runs.csv has its section: a chart of the hardware_choice rows, or a
    sentence saying why there is none."""
    import re

    from pipeline.settings import PROJECT_ROOT

    targets = pl.read_csv(PROJECT_ROOT / "measurements" / "target_runs.csv")
    con = duckdb.connect(str(built_store), read_only=True)
    try:
        counts = dict(con.sql("select target_id, count(*) from hardware_choice group by 1").fetchall())
    finally:
        con.close()
    text = (site_of(built_store) / "hardware-choice.html").read_text()
    sections = re.split(r"<h2>", text)[1:]
    assert len(sections) == targets.height
    for t, section in zip(targets.iter_rows(named=True), sections):
        assert section.startswith(t["id"] + ":"), section[:80]
        if counts.get(t["id"]):
            assert f'data-chart="choice-{t["id"]}"' in section
        else:
            assert 'class="empty"' in section and "No priced accelerator" in section
    rows = [r for rows in _datasets(site_of(built_store) / "hardware-choice.html").values() for r in rows]
    assert {r["target_id"] for r in rows} == {k for k, v in counts.items() if v}


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
    build_site(tmp_path / "site", tables)
    page = (tmp_path / "site" / "hardware" / "gtx-580.html").read_text()
    assert 'class="chart"' not in page
    assert page.count('class="empty"') >= 3 and "no layout fits in memory" in page


def test_site_rebuilds_from_a_store_copy_and_a_failed_build_keeps_the_old_site(store_copy, tmp_path):
    from reports.site import build_site

    tables = _site_tables(store_copy)
    tables["scaling_curves"] = tables["scaling_curves"].filter(pl.col("gpu").is_in(["h100-sxm5-80gb", "b200"]))
    out = tmp_path / "site"
    files = build_site(out, tables)
    assert {f.name for f in files} >= {"index.html", "h100-sxm5-80gb.html", "b200.html"}
    assert sorted(p.name for p in (out / "hardware").iterdir()) == ["b200.html", "h100-sxm5-80gb.html"]
    before = (out / "index.html").read_text()
    broken = dict(tables, frontier=tables["frontier"].drop("utilization"))
    with pytest.raises(Exception):
        build_site(out, broken)
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
    here = build_site(tmp_path / "here", tables)
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as ex:
        split = build_site(tmp_path / "split", tables, executor=ex)
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

    def problems(self, local: tuple[str, ...] = ("file:",), warnings: bool = False) -> tuple[list[str], list[str]]:
        """(console errors, and warnings when `warnings`; requests to addresses that do not start with one of `local`,
        data:, blob:, about:)."""
        errors, requests = [], []
        console = ("error", "assert", "warning") if warnings else ("error", "assert")
        log = ("error", "warning") if warnings else ("error",)
        for ev in self.events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in console:
                errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                errors.append(p.get("exceptionDetails", {}).get("text", "exception"))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in log:
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
    """Every page, in Chromium: no console error or warning (Vega's warnings included), no network request, every
    chart drawn with marks in every view, no chart wider than its box (a legend cut off), none taller than a screen
    without an x axis on top, no facet axis under an empty cell."""
    site = site_of(built_store)
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 5
    for page in pages:
        state = browser.open(page.as_uri())
        assert state and state["ready"] == "complete", f"{page}: did not load"
        errors, requests = browser.problems(warnings=True)
        name = page.relative_to(site)
        assert not errors, f"{name}: console errors or warnings {errors[:3]}"
        assert not requests, f"{name}: network requests {requests[:3]}"
        assert state and (state["charts"] > 0 or state["empty_notes"] > 0), f"{name}: no charts and no reason why"
        assert state["rendered"] == state["charts"], f"{name}: {state['charts'] - state['rendered']} charts not rendered"
        empty = [(i, v) for i, views in enumerate(state["views"]) for v in [views] if not views or 0 in views]
        assert not empty, f"{name}: chart(s) with an empty view (marks per view): {empty}"
        for g in state["geometry"]:
            assert g["width"] <= g["room"] + 1, f"{name}: chart {g['name']} is {g['width']:.0f} px wide in a " \
                                                f"{g['room']} px box (cut off)"
            assert g["height"] <= SCREEN_PX or min(g["axis_tops"], default=SCREEN_PX) < 150, \
                f"{name}: chart {g['name']} is {g['height']:.0f} px tall with its x axes at {g['axis_tops']}"
            assert g["orphan_axes"] == 0, f"{name}: chart {g['name']} has an x axis under an empty facet cell"
