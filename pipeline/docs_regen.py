"""Rewrite the figures the documents show (the README's tour and held-out table, docs/python-api.md's example
output, docs/calibration.md's latest figures) from a built store, or check them.

    uv run python -m pipeline.docs_regen [--store PATH]          # rewrite README.md, docs/python-api.md, calibration.md
    uv run python -m pipeline.docs_regen [--store PATH] --check  # list the figures that differ, exit 1 if any
    uv run python -m pipeline.docs_regen --screenshots out/site  # also re-shoot docs/img's pictures of the site

The store defaults to the settings' (`STEPCAST_STORE`, else out/stepcast.duckdb). Each document block is its own
template: it says which lines of the fresh output it shows.

* README, section "A 5-minute tour": every `$ ` command is run as the tour test runs it (pipeline.docs_regen.run_tour
  command). Under it, a table row `│ key │ ... │` shows the fresh row whose first cell is `key`; a row of column
  names shows those columns of the table that has them (`…` for the columns left out, kept as `…`); a `…` line
  stays; another line shows the fresh line that begins with its first word, cut after as many words when it ends
  with `…`. A command with no lines under it is run and shows nothing.
* docs/python-api.md: every ```python block is run as a doctest session (`>>> `, `... `), in one namespace per
  document with `pl` and `stepcast` imported and polars printing without shapes and dtypes; the output of each
  example replaces the lines under it. An example shown with no output is run and shows none.
* The held-out tables (README "How accurate it is", docs/calibration.md "Latest figures"): the served fit's
  `fit_metrics` over all runs, worst protocol first; the README's rows keep their labels, and the figures of the
  sentences around its table (runs and sources, the k-shot protocol, the priors, GB300) are the served fit's too.
* `--screenshots SITE`: docs/img's pictures of the report site and of the explorer, re-shot in headless Chromium.

`compare(doc, fresh)` is what `--check` and tests/test_readme_tour.py apply: the same words in the same order,
numbers within 2% (or within the rounding of the figure shown); an elapsed time `(… s)` is not compared.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import duckdb
import polars as pl

import stepcast
from pipeline.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PYTHON_API = ROOT / "docs" / "python-api.md"
TOUR = "A 5-minute tour"
#: how the documents show the machine's paths
SHOWN_ROOT = "/home/you/stepcast"
REL_TOL = 0.02

TOKEN = re.compile(r"[A-Za-z_][\w.+\-]*|[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|[-—]")
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?$")
ELAPSED = re.compile(r"\(\d+(?:\.\d+)? s\)")
BOX = "┃│"


# ------------------------------------------------------------------ comparing a shown block with fresh output

def _number(token: str) -> tuple[float, float] | None:
    """(value, half a unit of its last shown digit), or None for a word."""
    if not NUMBER.match(token):
        return None
    text = token.replace(",", "").rstrip(",")
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return float(text), 0.5 * 10.0 ** (int(exponent or 0) - decimals)


def compare(doc: str, fresh: str, where: str = "") -> list[str]:
    """What differs between a shown block and the fresh one: words exactly, numbers within REL_TOL (or the rounding
    of the figure shown)."""
    a, b = (TOKEN.findall(ELAPSED.sub("(… s)", t)) for t in (doc, fresh))
    problems = []
    for i, (x, y) in enumerate(zip(a, b)):
        nx, ny = _number(x), _number(y)
        if nx is not None and ny is not None:
            (vx, ux), (vy, uy) = nx, ny
            if abs(vx - vy) > max(REL_TOL * max(abs(vx), abs(vy)), ux, uy):
                problems.append(f"{where}: shown {x}, now {y} (token {i}: …{' '.join(a[max(0, i - 4):i])})")
        elif x != y:
            problems.append(f"{where}: shown '{x}', now '{y}' (token {i}: …{' '.join(a[max(0, i - 4):i])})")
        if len(problems) >= 5:
            break
    if len(a) != len(b) and not problems:
        problems.append(f"{where}: {len(a)} words and figures shown, {len(b)} now")
    return problems


# ------------------------------------------------------------------ the README tour

def section_bounds(text: str, title: str) -> tuple[int, int]:
    start = text.index(f"## {title}")
    nxt = text.find("\n## ", start + 1)
    return start, nxt if nxt > 0 else len(text)


def tour_env(store: Path) -> dict:
    return dict(os.environ, STEPCAST_STORE=str(store), PATH=f"{Path(sys.executable).parent}{os.pathsep}"
                f"{os.environ['PATH']}", COLUMNS="160")


def run_tour_command(command: str, store: Path) -> subprocess.CompletedProcess:
    """A tour command as a user runs it, on `store` (and the snapshot beside it for `duckdb`)."""
    snapshot = store.parent / "snapshot" / store.name
    shell = command.removeprefix("uv run ").replace("out/snapshot/stepcast.duckdb", str(snapshot))
    return subprocess.run(["bash", "-c", shell], cwd=ROOT, env=tour_env(store), capture_output=True, text=True,
                          timeout=600)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(f"[{BOX}]", line.strip())[1:-1]]


def parse_output(text: str) -> tuple[list[dict], list[str]]:
    """The rich tables of a command's output ({header, rows}) and its other lines (stripped)."""
    tables, plain, current = [], [], None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("┃"):
            if current is None or current["rows"]:
                current = {"header": _cells(s), "rows": []}
                tables.append(current)
            else:  # a header cell wrapped onto a second line
                current["header"] = [f"{h}{c}" for h, c in zip(current["header"], _cells(s))]
        elif s.startswith("│"):
            cells = _cells(s)
            if current is None:
                current = {"header": [], "rows": []}
                tables.append(current)
            if cells and cells[0] == "" and current["rows"]:  # a cell wrapped onto a continuation line
                continue
            current["rows"].append(cells)
        elif s and s[0] in "┏┡└┗":
            if s[0] in "└┗":
                current = None
        elif s:
            plain.append(s)
    return tables, plain


def _render(rows: list[list[str] | None]) -> list[str]:
    """Rows of cells as `│ a │ b │` lines padded to their columns' widths (None: a `…` line)."""
    widths: dict[int, int] = {}
    for r in rows:
        for i, c in enumerate(r or []):
            widths[i] = max(widths.get(i, 0), len(c))
    return ["…" if r is None else "│ " + " │ ".join(c.ljust(widths[i]) for i, c in enumerate(r)) + " │"
            for r in rows]


def regenerate_output(shown: list[str], fresh: str) -> list[str]:
    """The lines `shown` under a command, refilled from its fresh output."""
    tables, plain = parse_output(fresh)
    out: list[str] = []
    group: list[list[str] | None] = []
    columns: tuple[dict, list[str]] | None = None

    def flush():
        nonlocal group, columns
        if group:
            out.extend(_render(group))
        group, columns = [], None

    for line in shown:
        s = line.strip()
        if s.startswith("│"):
            cells = _cells(s)
            named = [c for c in cells if c != "…"]
            if not group and columns is None:
                header_of = [t for t in tables if named and all(c in t["header"] for c in named)]
                if header_of:
                    columns = (header_of[0], cells)
                    group.append(cells)
                    continue
            source = columns[0] if columns else None
            candidates = [source] if source else tables
            row = next((r for t in candidates for r in t["rows"] if r and r[0] == cells[0]), None)
            table = next((t for t in candidates if row in t["rows"]), None) if row else None
            if row is None:
                raise LookupError(f"no row '{cells[0]}' in the fresh output")
            if columns:
                header = table["header"]
                group.append([c if c == "…" else row[header.index(c)] for c in columns[1]])
            else:
                group.append(row[:len(cells)] if len(cells) <= len(row) else row)
        elif s == "…":
            if group or columns:
                group.append(None)
            else:
                out.append(line)
        else:
            flush()
            words = s.split()
            match = next((p for p in plain if p.split()[:1] == words[:1]), None)
            if match is None:
                raise LookupError(f"no line beginning '{words[0]}' in the fresh output")
            if s.endswith("…"):
                match = " ".join(match.split()[:len(words) - 1]) + " …"
            out.append(line[:len(line) - len(line.lstrip())] + match)
    flush()
    return out


def shown_paths(text: str, store: Path) -> str:
    """A machine's paths as the documents show them."""
    return text.replace(str(store.parent / "snapshot"), f"{SHOWN_ROOT}/out/snapshot") \
        .replace(str(store), f"{SHOWN_ROOT}/out/stepcast.duckdb").replace(str(ROOT), SHOWN_ROOT)


def tour_blocks(text: str) -> list[tuple[int, int, str, list[str]]]:
    """(first line, end line, command, lines shown under it) of each tour command with output, as line indices."""
    lines = text.splitlines()
    start, end = section_bounds(text, TOUR)
    first, last = text[:start].count("\n"), text[:end].count("\n")
    blocks, i = [], first
    while i < last:
        if lines[i].startswith("$ "):
            command, j = lines[i][2:], i + 1
            while command.replace('\\"', "").count('"') % 2:
                command += "\n" + lines[j]
                j += 1
            k = j
            while k < last and not lines[k].startswith(("```", "$ ")):
                k += 1
            if k > j:
                blocks.append((j, k, command, lines[j:k]))
            i = k
        else:
            i += 1
    return blocks


def tour_results(store: Path, text: str) -> list[tuple[int, int, str, list[str], list[str]]]:
    """Each tour block with its fresh lines."""
    results = []
    for j, k, command, shown in tour_blocks(text):
        done = run_tour_command(command, store)
        if done.returncode != 0:
            raise RuntimeError(f"{command}\nexit {done.returncode}\n{done.stderr[-2000:]}")
        results.append((j, k, command, shown, regenerate_output(shown, shown_paths(done.stdout, store))))
    return results


# ------------------------------------------------------------------ the held-out figures (README, docs/calibration.md)

CALIBRATION = ROOT / "docs" / "calibration.md"
#: the words of a README row that name its protocol
PROTOCOL_WORDS = {"lofo": "family", "logo": "generation", "loso": "one source", "lopo": "precision",
                  "scale": "larger than 256"}
FIGURES = ("mdape", "mape", "mdape_balanced", "mape_balanced", "within_10pct", "coverage_90", "median_width")


def held_out_figures(store: Path) -> dict[tuple[str, str], dict]:
    """(protocol, predictor) -> the served fit's held-out figures over all runs, as `stepcast fit` prints them."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        rows = con.execute(f"""
            select m.scheme, m.predictor, {', '.join(f'm.{c}' for c in FIGURES)} from fit_metrics m
            join fits f using (version)
            where f.promoted and m.grouping = 'source' and m."group" = 'ALL'""").fetchall()
    finally:
        con.close()
    return {(r[0], r[1]): dict(zip(FIGURES, r[2:])) for r in rows}


def _pct(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{100 * v:.{digits}f}%"


def _table_at(lines: list[str], header: str) -> tuple[int, int]:
    """(first row, end) line indices of the body of the markdown table whose header line starts with `header`."""
    first = next(i for i, line in enumerate(lines) if line.startswith(header)) + 2
    end = first
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return first, end


def readme_accuracy(store: Path, text: str) -> tuple[int, int, list[str], list[str]]:
    """The README's held-out table ("How accurate it is"), worst first, from the served fit."""
    figures = held_out_figures(store)
    lines = text.splitlines()
    first, end = _table_at(lines, "| held out |")
    rows = []
    for line in lines[first:end]:
        label = line.split("|")[1].strip()
        scheme = next(s for s, words in PROTOCOL_WORDS.items() if words in label)
        f = figures[(scheme, "calibrated")]
        rows.append((-(f["mdape"] or 0), f"| {label} | {_pct(f['mdape'])} | {_pct(f['mape'])} | "
                                         f"{_pct(f['mdape_balanced'])} | {_pct(f['coverage_90'], 0)} |"))
    return first, end, lines[first:end], [r for _, r in sorted(rows)]


def calibration_latest(store: Path, text: str) -> tuple[int, int, list[str], list[str]]:
    """docs/calibration.md's table of "Latest figures", worst first, from the served fit."""
    figures = held_out_figures(store)
    lines = text.splitlines()
    first, end = _table_at(lines, "| protocol | analytical (priors) MdAPE |")
    schemes = sorted((line.split("`")[1] for line in lines[first:end]), key=lambda s: -(figures[(s, "calibrated")]
                                                                                         ["mdape"] or 0))
    rows = []
    for i, s in enumerate(schemes):
        f, a = figures[(s, "calibrated")], figures[(s, "analytical")]
        bold = (lambda x: f"**{x}**") if i == 0 else (lambda x: x)
        rows.append(f"| `{s}` | {_pct(a['mdape'])} | {bold(_pct(f['mdape']))} | {bold(_pct(f['mape']))} | "
                    f"{bold(_pct(f['mdape_balanced']))} | {bold(_pct(f['mape_balanced']))} | "
                    f"{_pct(f['within_10pct'], 0)} | {bold(_pct(f['coverage_90']))} | {_pct(f['median_width'], 0)} |")
    return first, end, lines[first:end], rows


def _served(con, sql: str):
    return con.execute(sql.replace("SERVED", "(select version from fits where promoted)")).fetchone()


PERCENT = re.compile(r"\d[\d,]*(?:\.\d+)?(?=%)")


def _refill(span: str, values: list[float]) -> str:
    """`span` with its percentages replaced in order by `values` (fractions), each shown to the decimals it had."""
    it = iter(values)
    return PERCENT.sub(lambda m: f"{100 * next(it):.{len(m.group().partition('.')[2])}f}", span)


def prose_figures(store: Path) -> list[tuple[re.Pattern, callable]]:
    """(pattern, its text refilled from the served fit) for the figures written into sentences: the runs and sources
    judged, the k-shot protocol (units equal), the priors' error, GB300's median error out of source."""
    con = duckdb.connect(str(store), read_only=True)
    metric = ("select {} from fit_metrics where version = SERVED and scheme = '{}' and predictor = '{}' and "
              "\"group\" = 'ALL'")
    try:
        n_runs, = _served(con, metric.format("n_runs", "loso", "calibrated") + " and grouping = 'source'")
        n_sources, = _served(con, "select count(distinct source) from calibrated_predictions "
                                  "where loso_tokens_per_s_per_gpu is not null")
        priors, = _served(con, metric.format("mdape", "loso", "analytical") + " and grouping = 'source'")
        kshot = {(pred, k): _served(con, metric.format("mdape_balanced, mape_balanced, coverage_90, median_width",
                                                       "kshot", pred) + f" and k_shot = {k}")
                 for pred in ("adapted", "naive") for k in (0, 1, 3, 5)}
        gb300, = _served(con, "select median(loso_tokens_per_s_per_gpu / measured_tokens_per_s_per_gpu - 1) "
                              "from calibrated_predictions where gpu = 'gb300'")
    finally:
        con.close()
    ks = (0, 1, 3, 5)
    k_paragraph = ([kshot[("adapted", k)][0] for k in ks] + [kshot[("naive", k)][0] for k in ks[1:]]
                   + [kshot[("adapted", k)][1] for k in ks] + [0.90]  # "90% coverage"
                   + [kshot[("adapted", k)][c] for c in (2, 3) for k in ks])
    return [
        (re.compile(r"[\d,]+ runs (from|with a throughput target from) \d+ sources"),
         lambda m: f"{n_runs:,} runs {m.group(1)} {n_sources} sources"),
        (re.compile(r"from [\d.]+% to [\d.]+% \(sources equal, the k-shot protocol\)"),
         lambda m: _refill(m.group(), [kshot[("adapted", 0)][0], kshot[("adapted", 3)][0]])),
        (re.compile(r"\(`--analytical-only`\) are \d+% off"), lambda m: _refill(m.group(), [priors])),
        (re.compile(r"GB300 \(\d+% too \w+\)"),
         lambda m: f"GB300 ({abs(100 * gb300):.0f}% too {'slow' if gb300 < 0 else 'fast'})"),
        (re.compile(r"MdAPE [\d.]+% at k = 0,.*?median width \(hi - lo\) / prediction(?:,?\s+[\d.]+%)+", re.S),
         lambda m: _refill(m.group(), k_paragraph)),
    ]


def prose_results(store: Path, text: str, title: str) -> tuple[int, int, list[str], list[str]]:
    """The section `title` of a document with its sentences' figures refilled from the served fit."""
    lines = text.splitlines()
    start, end = section_bounds(text, title)
    first, last = text[:start].count("\n"), text[:end].count("\n")
    section = "\n".join(lines[first:last])
    for pattern, fill in prose_figures(store):
        section = pattern.sub(fill, section)
    return first, last, lines[first:last], section.split("\n")


# ------------------------------------------------------------------ docs/python-api.md

def python_blocks(text: str) -> list[tuple[int, int]]:
    """(first, end) line indices of the inside of each ```python block."""
    lines, blocks, start = text.splitlines(), [], None
    for i, line in enumerate(lines):
        if line.strip() == "```python":
            start = i + 1
        elif line.strip() == "```" and start is not None:
            blocks.append((start, i))
            start = None
    return blocks


def _examples(lines: list[str]) -> list[tuple[list[str], list[str]]]:
    """(source lines, shown output lines) of each `>>> ` example."""
    examples: list[tuple[list[str], list[str]]] = []
    for line in lines:
        if line.startswith(">>> "):
            examples.append(([line[4:]], []))
        elif line.startswith("... ") or line == "...":
            examples[-1][0].append(line[4:])
        elif examples:
            examples[-1][1].append(line)
    return examples


def run_example(source: str, namespace: dict) -> str:
    """What the interactive interpreter prints for one example (an exception as doctest shows it)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        try:
            exec(compile(source, "<docs>", "single"), namespace)  # noqa: S102 - the document's own examples
        except Exception as err:  # noqa: BLE001 - shown as the document shows it
            kind = type(err)
            return f"Traceback (most recent call last):\n  ...\n{kind.__module__}.{kind.__qualname__}: {err}"
    return buffer.getvalue().rstrip("\n")


def python_results(store: Path, text: str) -> list[tuple[int, int, list[str], list[str]]]:
    """(first, end, shown lines, fresh lines) of each python block, its examples run on `store`."""
    lines = text.splitlines()
    namespace = {"pl": pl, "stepcast": stepcast}
    results = []
    old = os.environ.get("STEPCAST_STORE")
    os.environ["STEPCAST_STORE"] = str(store)
    try:
        with pl.Config(tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True, tbl_width_chars=200):
            for first, end in python_blocks(text):
                fresh = []
                for source, shown in _examples(lines[first:end]):
                    printed = run_example("\n".join(source), namespace)
                    fresh += [">>> " + source[0], *("... " + s if s else "..." for s in source[1:])]
                    fresh += shown_paths(printed, store).splitlines() if shown else []
                results.append((first, end, lines[first:end], fresh))
    finally:
        if old is None:
            os.environ.pop("STEPCAST_STORE", None)
        else:
            os.environ["STEPCAST_STORE"] = old
    return results


# ------------------------------------------------------------------ the report site's screenshots

CHROMIUM = Path("/usr/bin/chromium")
#: docs/img file: (page of the report site, window width x height in CSS pixels)
SCREENSHOTS = {"index.png": ("index.html", (1280, 1500)), "calibration.png": ("calibration.html", (1385, 3319)),
               "frontier.png": ("frontier.html", (1400, 1450)),
               "hardware-h100.png": ("hardware/h100-sxm5-80gb.html", (1280, 1500))}


def screenshot_site(site: Path) -> list[Path]:
    """Re-shoot the README's pictures of the report site (the built `site`) with headless Chromium; the explorer's
    and Dagster's pictures need a running server and are not re-shot here."""
    if not CHROMIUM.exists():
        raise FileNotFoundError(f"{CHROMIUM} not installed (apt-get install -y chromium): screenshots not taken")
    written = []
    for name, (page, (width, height)) in SCREENSHOTS.items():
        target = ROOT / "docs" / "img" / name
        subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--virtual-time-budget=15000", f"--window-size={width},{height}", f"--screenshot={target}",
                        (site / page).resolve().as_uri()], check=True, capture_output=True, timeout=300)
        written.append(target)
    return written


#: the explorer's view in the README: the Llama 3 405B preset (pipeline/explorer/index.html `PRESETS.llama3`)
EXPLORER_SHOT = ("explorer-llama3-405b.png", "gpus=h100-sxm5-80gb&model=llama3-405b&tokens=1.56e13&seq_len=8192&"
                 "policy=strong&global_batch=2048&per_gpu_batch=1&max_gpus=32768&n=16384&months=3&"
                 "assumptions=realistic", (1400, 1320))


def screenshot_explorer(store: Path, port: int = 8917) -> Path:
    """Re-shoot the README's picture of the explorer: `stepcast serve` on `store` (loopback, `port`), the preset's
    view in headless Chromium, then the server stopped."""
    name, view, (width, height) = EXPLORER_SHOT
    server = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "--store", str(store), "serve", "--port",
                               str(port)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):  # the server loads the fit and the tables first
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except OSError:
                time.sleep(1)
        target = ROOT / "docs" / "img" / name
        subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--virtual-time-budget=300000", f"--window-size={width},{height}", f"--screenshot={target}",
                        f"http://127.0.0.1:{port}/#{view}"], check=True, capture_output=True, timeout=600)
        return target
    finally:
        server.terminate()
        server.wait(timeout=30)


# ------------------------------------------------------------------ rewrite or check

def _splice(text: str, replacements: list[tuple[int, int, list[str]]]) -> str:
    lines = text.splitlines()
    for first, end, new in sorted(replacements, reverse=True):
        lines[first:end] = new
    return "\n".join(lines) + "\n"


def readme_differences(store: Path) -> list[str]:
    """Every figure or word of the README tour's output that differs from fresh output on `store`."""
    readme = README.read_text(encoding="utf-8")
    _, _, shown, fresh = readme_accuracy(store, readme)
    _, _, prose, fresh_prose = prose_results(store, readme, "How accurate it is")
    return compare("\n".join(shown), "\n".join(fresh), "README: How accurate it is") + compare(
        "\n".join(prose), "\n".join(fresh_prose), "README: How accurate it is (text)") + [
        p for _, _, command, shown, fresh in tour_results(store, readme)
        for p in compare("\n".join(shown), "\n".join(fresh), f"README: $ {command[:70]}")]


def calibration_differences(store: Path) -> list[str]:
    """Every figure of docs/calibration.md's "Latest figures" table that differs from the served fit's."""
    text = CALIBRATION.read_text(encoding="utf-8")
    _, _, shown, fresh = calibration_latest(store, text)
    _, _, prose, fresh_prose = prose_results(store, text, "Latest figures")
    return compare("\n".join(shown), "\n".join(fresh), "docs/calibration.md: Latest figures") + compare(
        "\n".join(prose), "\n".join(fresh_prose), "docs/calibration.md: Latest figures (text)")


def python_api_differences(store: Path) -> list[str]:
    """Every figure or word of docs/python-api.md's example output that differs from fresh output on `store`."""
    api = PYTHON_API.read_text(encoding="utf-8")
    return [p for first, _, shown, fresh in python_results(store, api)
            for p in compare("\n".join(shown), "\n".join(fresh), f"docs/python-api.md, the block at line {first}")]


def regenerate(store: Path) -> list[Path]:
    """Rewrite both documents' output blocks; returns the documents that changed."""
    changed = []
    readme = README.read_text(encoding="utf-8")
    first, end, _, table = readme_accuracy(store, readme)
    new = _splice(readme, [(j, k, fresh) for j, k, _, _, fresh in tour_results(store, readme)] + [(first, end, table)])
    first, end, _, prose = prose_results(store, new, "How accurate it is")
    new = _splice(new, [(first, end, prose)])
    api = PYTHON_API.read_text(encoding="utf-8")
    new_api = _splice(api, [(first, end, fresh) for first, end, _, fresh in python_results(store, api)])
    calibration = CALIBRATION.read_text(encoding="utf-8")
    first, end, _, table = calibration_latest(store, calibration)
    new_calibration = _splice(calibration, [(first, end, table)])
    first, end, _, prose = prose_results(store, new_calibration, "Latest figures")
    new_calibration = _splice(new_calibration, [(first, end, prose)])
    for path, old, text in ((README, readme, new), (PYTHON_API, api, new_api), (CALIBRATION, calibration,
                                                                                  new_calibration)):
        if text != old:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.docs_regen", description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, help="the built store (default: the settings')")
    parser.add_argument("--check", action="store_true", help="list the differences instead of rewriting")
    parser.add_argument("--screenshots", type=Path, metavar="SITE",
                        help="also re-shoot docs/img's pictures of this built report site and of the explorer "
                             "(headless Chromium)")
    args = parser.parse_args(argv)
    store = (args.store or Settings.load().store).resolve()
    if not store.exists():
        print(f"error: store not found: {store} (run `stepcast build` first)", file=sys.stderr)
        return 1
    if args.check:
        problems = readme_differences(store) + calibration_differences(store) + python_api_differences(store)
        print("\n".join(problems) or "the documents' figures are current")
        return 1 if problems else 0
    changed = regenerate(store)
    if args.screenshots:
        changed += [*screenshot_site(args.screenshots), screenshot_explorer(store)]
    print("rewrote " + ", ".join(p.relative_to(ROOT).as_posix() for p in changed) if changed else "no change")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
