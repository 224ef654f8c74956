"""Are two builds' results the same? Compares every table of two stores' snapshots and their report sites.

    uv run python benchmarks/compare_stores.py BEFORE_DIR AFTER_DIR

Each DIR is the folder of a `stepcast --store DIR/stepcast.duckdb build` (snapshot in DIR/snapshot, site in
DIR/site). Tables: every value exact (rows sorted, since a table's row order is not part of it), with the fit
version (a hash of the model code, so it changes with any edit of models/) replaced by a placeholder and
timestamps left out; a column the AFTER store adds (a fact moved from code into a table) and a change of the
provenance text (`PROVENANCE_COLUMNS`: sources appended) are reported beside the table, not counted as a
difference, while a removed column is. Sites: every file byte for byte, except that each page's datasets (`var DATA = {...}`) are
compared as parsed JSON with their rows as a set (their key order follows the drawing process's string hashing,
their row order the store's scan order), and the fit version and the fit's created_at are replaced. Exits 1 when
anything differs."""

import json
import re
import sys
from pathlib import Path

import duckdb
import polars as pl
from polars.testing import assert_frame_equal

#: text that says where a value comes from, not a value: a change may add sources (reported, not a difference)
PROVENANCE_COLUMNS = {"source_ref", "source", "notes", "price_ref"}
SKIP_COLUMNS = {"bytes", "n_bytes"}  # fit_artifacts' pickle holds the fit version and the classes' module paths


def _open(folder: Path):
    con = duckdb.connect(str(folder / "snapshot" / "stepcast.duckdb"), read_only=True)
    row = con.execute("select version from fits where promoted").fetchone()
    tables = sorted(t for (t,) in con.execute(
        "select table_name from information_schema.tables where table_type = 'BASE TABLE'").fetchall())
    return con, (row[0] if row else None), tables


def _normal(frame: pl.DataFrame, version: str | None) -> pl.DataFrame:
    cols = [c for c in frame.columns if c not in SKIP_COLUMNS and not isinstance(frame.schema[c], (pl.Datetime, pl.Date))]
    frame = frame.select(cols)
    if version:
        frame = frame.with_columns([pl.col(c).str.replace_all(version, "<VERSION>", literal=True)
                                    for c in cols if frame.schema[c] == pl.Utf8])
    return frame.sort(cols, nulls_last=True) if cols else frame


def _page(text: str, version: str | None) -> str:
    if version:
        text = text.replace(version, "<VERSION>")
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?", "<TIMESTAMP>", text)
    m = re.search(r"var DATA = (.*?);\nfunction withData", text, re.S)
    if m:
        # each dataset stored by column (reports.site) or, in an older site, as rows: compared as sorted rows
        rows = {k: [dict(zip(v, r)) for r in zip(*v.values())] if isinstance(v, dict) else v
                for k, v in json.loads(m.group(1)).items()}
        data = {k: sorted(v, key=lambda r: json.dumps(r, sort_keys=True)) if isinstance(v, list) else v
                for k, v in rows.items()}
        text = text[:m.start(1)] + json.dumps(data, sort_keys=True) + text[m.end(1):]
    return text


def main(a_dir: str, b_dir: str) -> int:
    a, b = Path(a_dir), Path(b_dir)
    ca, va, ta = _open(a)
    cb, vb, tb = _open(b)
    print(f"fit versions: {va} / {vb}")
    differ = sorted(set(ta) ^ set(tb))
    for t in differ:
        print(f"{t}: only in one store")
    for t in sorted(set(ta) & set(tb)):
        fa, fb = ca.sql(f'select * from "{t}"').pl(), cb.sql(f'select * from "{t}"').pl()
        removed = [c for c in fa.columns if c not in fb.columns]
        added = [c for c in fb.columns if c not in fa.columns]
        shared = [c for c in fa.columns if c in fb.columns and c not in PROVENANCE_COLUMNS]
        notes = [f"columns added: {added}"] if added else []
        notes += [f"provenance text differs: {c}" for c in fa.columns if c in PROVENANCE_COLUMNS and c in fb.columns
                  and not _normal(fa.select(c), va).equals(_normal(fb.select(c), vb))]
        try:
            assert not removed, f"columns removed: {removed}"
            assert_frame_equal(_normal(fa.select(shared), va), _normal(fb.select(shared), vb), check_exact=True)
            print(f"{t}: equal ({fa.height} rows x {len(shared)} columns){'; ' + '; '.join(notes) if notes else ''}")
        except AssertionError as err:
            differ.append(t)
            print(f"{t}: DIFFERENT: {str(err)[:300]}")
    sa, sb = a / "site", b / "site"
    files = sorted({p.relative_to(sa) for p in sa.rglob("*") if p.is_file()}
                   | {p.relative_to(sb) for p in sb.rglob("*") if p.is_file()})
    pages = []
    for p in files:
        if not (sa / p).exists() or not (sb / p).exists():
            pages.append(str(p))
            continue
        x, y = (sa / p).read_bytes(), (sb / p).read_bytes()
        if p.suffix == ".html":
            x, y = _page(x.decode(), va), _page(y.decode(), vb)
        if x != y:
            pages.append(str(p))
    print(f"site: {len(files)} files, {len(pages)} differ {pages if pages else ''}")
    print("ALL EQUAL" if not differ and not pages else f"{len(differ)} tables and {len(pages)} site files differ")
    return 0 if not differ and not pages else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
