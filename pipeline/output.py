"""Printing result tables as a rich table, CSV or JSON, to the terminal or a file."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import polars as pl

FORMATS = ("table", "csv", "json")


def _clean(v):
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


def json_rows(frame: pl.DataFrame) -> list[dict]:
    """The rows `--format json` prints (NaN and infinities as null); `stepcast serve` answers with the same."""
    return [{k: _clean(v) for k, v in row.items()} for row in frame.iter_rows(named=True)]


def render(frame: pl.DataFrame, fmt: str, out: Path | None = None, title: str | None = None,
           table_columns: list[str] | None = None) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got '{fmt}'")
    if fmt == "json":
        text = json.dumps(json_rows(frame), indent=2, default=str)
    elif fmt == "csv":
        text = frame.write_csv()
    else:
        text = None
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        if text is None:  # a table asked for a file: write CSV there
            text = frame.write_csv()
        Path(out).write_text(text + ("" if text.endswith("\n") else "\n"))
        print(f"wrote {frame.height} row(s) to {out}", file=sys.stderr)
        return
    if text is not None:
        sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 220)
    if frame.height <= 2:  # one configuration reads best as field: value
        t = Table("field", *[str(v) for v in (frame["run_id"] if "run_id" in frame.columns else range(frame.height))],
                  title=title)
        for col in frame.columns:
            if col == "run_id":
                continue
            t.add_row(col, *[_fmt(v) for v in frame[col].to_list()])
        console.print(t)
        return
    cols = [c for c in (table_columns or frame.columns) if c in frame.columns]
    t = Table(*cols, title=title, show_lines=False)
    for row in frame.select(cols).iter_rows():
        t.add_row(*[_fmt(v) for v in row])
    console.print(t)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1e6 or a < 1e-3:
            return f"{v:.3g}"
        if a >= 100:
            return f"{v:,.0f}"
        return f"{v:.3g}" if a < 1 else f"{v:.2f}"
    return str(v)
