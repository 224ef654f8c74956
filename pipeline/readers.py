"""Read measurement files (CSV or Parquet) into string cells with line numbers, or reject them whole.

The file is read once into memory; its sha256 is taken from those same bytes, so a file that changes while
being read is caught by comparing with a second hash after parsing. CSV: UTF-8 (a BOM is accepted), LF or
CRLF line endings, RFC-4180 quoting (fields may hold commas and newlines); a header that is clearly
semicolon- or tab-separated is parsed with that delimiter and a warning. Lines are 1-based and count the
header as line 1, so the first data row is line 2; a quoted field spanning lines is reported at the line
where its row starts.
"""

from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

csv.field_size_limit(10_000_000)


class FileRejected(Exception):
    """A whole file cannot be ingested. The message names the file, and the line/column where known."""

    def __init__(self, file: str, reason: str, line: int | None = None, column: str | None = None):
        self.file, self.reason, self.line, self.column = file, reason, line, column
        where = file + (f", line {line}" if line is not None else "") + (f", column {column}" if column else "")
        super().__init__(f"{where}: {reason}")


@dataclass
class ReadResult:
    frame: pl.DataFrame  # all cells as strings, plus `_line`
    sha256: str
    n_bytes: int
    warnings: list[str] = field(default_factory=list)
    short_rows: list[tuple[int, int]] = field(default_factory=list)  # (line, n_fields) of ragged rows


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _line_of_offset(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _decode(path: str, data: bytes) -> str:
    if b"\x00" in data:
        raise FileRejected(path, "NUL byte in file (binary or corrupted data)", line=_line_of_offset(data, data.index(b"\x00")))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FileRejected(path, f"not UTF-8: byte 0x{data[err.start]:02x} cannot be decoded (save the file as UTF-8)",
                           line=_line_of_offset(data, err.start)) from None
    return text[1:] if text.startswith("\ufeff") else text


def _detect_delimiter(path: str, header: str, warnings: list[str]) -> str:
    counts = {d: header.count(d) for d in (",", ";", "\t", "|")}
    if counts[","] >= 2:
        return ","
    best = max((";", "\t", "|"), key=lambda d: counts[d])
    if counts[best] >= 2:
        name = {";": "semicolon", "\t": "tab", "|": "pipe"}[best]
        warnings.append(f"{path}: header is {name}-separated, not comma-separated; parsed with '{best}'")
        return best
    return ","


def read_csv_text(path: str, text: str) -> tuple[pl.DataFrame, list[str], list[tuple[int, int]]]:
    warnings: list[str] = []
    if not text.strip():
        raise FileRejected(path, "empty file (expected a header row and at least one data row)", line=1)
    first_line = text.split("\n", 1)[0]
    delimiter = _detect_delimiter(path, first_line, warnings)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = next(reader)
    except csv.Error as err:
        raise FileRejected(path, f"unreadable header: {err}", line=1) from None
    header = [h.strip() for h in header]
    if len(set(header)) != len(header):
        dupes = sorted({h for h in header if header.count(h) > 1})
        raise FileRejected(path, f"duplicate column names in header: {', '.join(dupes)}", line=1)
    n = len(header)
    rows: list[list[str]] = []
    lines: list[int] = []
    short: list[tuple[int, int]] = []
    start = reader.line_num + 1
    try:
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                start = reader.line_num + 1
                continue
            if len(row) != n:
                short.append((start, len(row)))
            else:
                rows.append(row)
                lines.append(start)
            start = reader.line_num + 1
    except csv.Error as err:
        raise FileRejected(path, f"malformed CSV ({err}); an unclosed quote or a truncated file?", line=start) from None
    if not rows and not short:
        raise FileRejected(path, "no data rows (only a header)", line=2)
    columns = list(zip(*rows)) if rows else [[] for _ in header]
    frame = pl.DataFrame({h: pl.Series(h, list(col), dtype=pl.Utf8) for h, col in zip(header, columns)})
    frame = frame.with_columns(pl.Series("_line", lines, dtype=pl.Int64))
    return frame, warnings, short


def read_measurement_file(path: str | Path) -> ReadResult:
    """Read a CSV or Parquet measurement file. Raises FileRejected for problems that concern the whole file."""
    p = Path(path)
    name = str(p)
    if not p.exists():
        raise FileRejected(name, "file not found")
    if p.is_dir():
        raise FileRejected(name, "is a directory, expected a .csv or .parquet file")
    data = p.read_bytes()
    digest = sha256_bytes(data)
    if p.suffix.lower() in (".parquet", ".pq"):
        try:
            frame = pl.read_parquet(io.BytesIO(data))
        except Exception as err:  # noqa: BLE001 - any parquet failure rejects the file
            raise FileRejected(name, f"unreadable Parquet file: {err}") from None
        if frame.height == 0:
            raise FileRejected(name, "no data rows")
        frame = frame.with_columns([pl.col(c).cast(pl.Utf8, strict=False) for c in frame.columns])
        frame = frame.with_columns(pl.int_range(1, frame.height + 1, dtype=pl.Int64).alias("_line"))
        result = ReadResult(frame=frame, sha256=digest, n_bytes=len(data))
    elif p.suffix.lower() in (".csv", ".txt", ""):
        text = _decode(name, data)
        frame, warnings, short = read_csv_text(name, text)
        result = ReadResult(frame=frame, sha256=digest, n_bytes=len(data), warnings=warnings, short_rows=short)
    else:
        raise FileRejected(name, f"unsupported file type '{p.suffix}': expected .csv or .parquet")
    # the file must not have changed while we read it
    if p.exists() and sha256_bytes(p.read_bytes()) != digest:
        raise FileRejected(name, "file changed while being read; ingest it again once it is complete")
    return result
