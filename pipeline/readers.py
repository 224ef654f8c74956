"""Read measurement files (CSV/TSV, Parquet, JSON, JSON Lines, a Markdown pipe table) into string cells with
line numbers, or reject them whole.

The file is read once into memory; its sha256 is taken from those same bytes, so a file that changes while
being read is caught by reading it again after parsing and comparing the bytes (`FileRejected.retry` is then true: the
file is not bad, it is incomplete). CSV: UTF-8 (a BOM is accepted), LF or CRLF line endings, RFC-4180
quoting (fields may hold commas and newlines); a header that is clearly semicolon-, tab- or pipe-separated
is parsed with that delimiter and a warning (accepted, explicitly: the cells are then validated like any
other). Lines are 1-based and count the header as line 1, so the first data row is line 2; a quoted field
spanning lines is reported at the line where its row starts. A .tsv/.tab file is the same path with a tab
expected (no warning for it).

The other formats give the same frame (every cell as text, `_line`), so the header synonyms and checks
downstream are the same: Parquet and JSON number their records 1, 2, ... (`_line` is the record number);
JSON Lines and Markdown give the file line of each record/body row. JSON numbers keep their text as written,
booleans become `true`/`false`, null an empty cell; a nested object or list is refused, naming record and key.

Two CSV paths give the same result:
- fast path (polars, all columns as strings) when no quoted field spans lines, there is no blank line and
  every line has exactly the header's number of delimiters outside quotes (checked with byte counts, see
  `simple_csv`); then the line of data row i is i + 2, and the batch ingest parses such files together
  (`parse_simple`: one polars call for many files with one header);
- the csv module otherwise (quotes, blank lines, ragged rows), which tracks exact line numbers.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

csv.field_size_limit(10_000_000)


class FileRejected(Exception):
    """A whole file cannot be ingested. The message names the file, and the line/column where known.

    `retry` is true when the file is not bad but was changing while being read (ingest it again later)."""

    def __init__(self, file: str, reason: str, line: int | None = None, column: str | None = None,
                 retry: bool = False, unit: str = "line"):
        self.file, self.reason, self.line, self.column, self.retry = file, reason, line, column, retry
        # `unit`: what `line` counts ("record" for a JSON file's records, which have no line of their own)
        where = file + (f", {unit} {line}" if line is not None else "") + (f", column {column}" if column else "")
        super().__init__(f"{where}: {reason}")


@dataclass
class ReadResult:
    frame: pl.DataFrame | None  # all cells as strings, plus `_line`; None when parsing was deferred (`simple`)
    sha256: str
    n_bytes: int
    warnings: list[str] = field(default_factory=list)
    short_rows: list[tuple[int, int]] = field(default_factory=list)  # (line, n_fields) of ragged rows
    header: list[str] = field(default_factory=list)
    simple: SimpleCsv | None = None  # set instead of `frame` when parsing was deferred (defer_simple=True)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _line_of_offset(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _column_at(data: bytes, offset: int, expected: str = ",") -> str | None:
    """Best-effort name of the column holding byte `offset` (delimiters counted on its line, quotes ignored)."""
    first = data.split(b"\n", 1)[0].decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r")
    delimiter = _detect_delimiter("", first, [], expected)
    header = [h.strip() for h in first.split(delimiter)]
    start = data.rfind(b"\n", 0, offset) + 1
    if start == 0:  # the bad byte is in the header itself
        return f"#{data[:offset].count(delimiter.encode()) + 1} (header)"
    index = data[start:offset].count(delimiter.encode())
    return header[index] if index < len(header) else f"#{index + 1}"


def _decode(path: str, data: bytes, delimiter: str | None = ",") -> str:
    """The file's text (a leading BOM dropped). `delimiter`: the one expected, to name the column of a bad byte
    (None: the file has no delimited header, no column is named)."""
    def column(offset: int) -> str | None:
        return None if delimiter is None else _column_at(data, offset, delimiter)

    if b"\x00" in data:
        at = data.index(b"\x00")
        raise FileRejected(path, "NUL byte in file (binary or corrupted data)", line=_line_of_offset(data, at),
                           column=column(at))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FileRejected(path, f"not UTF-8: byte 0x{data[err.start]:02x} cannot be decoded (save the file as UTF-8)",
                           line=_line_of_offset(data, err.start), column=column(err.start)) from None
    return text[1:] if text.startswith("\ufeff") else text


_DELIMITER_NAMES = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}


def _detect_delimiter(path: str, header: str, warnings: list[str], expected: str = ",") -> str:
    """The header's delimiter: `expected` (a comma; a tab for .tsv/.tab, taken as soon as the header has one),
    or another that the header clearly uses, with a warning."""
    if expected != "," and expected in header:
        return expected
    counts = {d: header.count(d) for d in _DELIMITER_NAMES}
    best = "," if counts[","] >= 2 else max((";", "\t", "|"), key=lambda d: counts[d])
    if best != expected and counts[best] >= 2:
        warnings.append(f"{path}: header is {_DELIMITER_NAMES[best]}-separated, not "
                        f"{_DELIMITER_NAMES[expected]}-separated; parsed with '{best}'")
        return best
    return expected


def _check_header(path: str, header: list[str], line: int = 1, unit: str = "line") -> list[str]:
    header = [h.strip() for h in header]
    if len(set(header)) != len(header):
        dupes = sorted({h for h in header if header.count(h) > 1})
        raise FileRejected(path, f"duplicate column names in header: {', '.join(dupes)}", line=line, column=dupes[0],
                           unit=unit)
    return header


@dataclass
class SimpleCsv:
    """A CSV file whose rows are one per line, each with exactly the header's fields (checked on its bytes by
    `simple_csv`), so that data row i is on line i + 2 and its body can be parsed together with other such
    files' bodies (`parse_simple`)."""
    header: list[str]
    delimiter: str
    data: bytes  # the whole file (the careful path re-reads it from here if a joint parse fails)
    start: int  # offset of the first data line
    n_rows: int
    #: ASCII without tab, vertical tab or form feed: the only blank a cell can start or end with is ' '
    #: (a CR is only ever part of a CRLF line end here, which the parser drops)
    plain: bool

    def body(self) -> list:
        """The data lines, each ending in a line feed (one is added when the file lacks it)."""
        view = memoryview(self.data)[self.start:]
        return [view] if self.data.endswith(b"\n") else [view, b"\n"]


def simple_csv(path: str, data: bytes, delimiter: str) -> SimpleCsv | None:
    """Check with byte counts that rows are one per line with the header's fields (None: the careful path).

    Every test is cheap (C-level byte counts and splits over the file):
    - no lone CR, no quote in the header, at least one data line;
    - an even number of quote characters, and no line feed between an odd-numbered quote and the next (so
      no quoted field spans lines);
    - the delimiters outside quotes (by the parity of the quotes before them) number (fields - 1) x lines;
      as no line may have more fields than the header (the parser refuses those), every line has exactly
      the header's number of fields; a blank line, which has no delimiter, fails this too.
    When every quote is part of a doubled pair (`""`, an empty field), no byte is inside quotes."""
    start = 3 if data.startswith(b"\xef\xbb\xbf") else 0  # a BOM holds no line feed, quote or delimiter
    if b"\r" in data and data.count(b"\r") != data.count(b"\r\n"):
        return None  # a lone CR: the csv module decides what it is
    end = data.find(b"\n", start)
    first = (data[start:] if end < 0 else data[start:end]).rstrip(b"\r")
    if not first or b'"' in first or end < 0:
        return None
    header = _check_header(path, first.decode("utf-8").split(delimiter))
    if len(header) < 2 and (b"\n\n" in data or b"\n\r\n" in data):
        return None  # a blank line (with two or more columns, the delimiter count below finds those)
    n_lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    if n_lines < 2:
        return None  # header only: the csv path says so
    delim = delimiter.encode()
    n_delims = data.count(delim)
    n_quotes = data.count(b'"') if b'"' in data else 0
    if n_quotes and n_quotes != 2 * data.count(b'""'):  # not every quote is one of a `""` pair
        if n_quotes % 2:
            return None  # an unclosed quote
        inside = b"".join(data.split(b'"')[1::2])  # a byte is inside quotes after an odd number of them
        if b"\n" in inside:
            return None  # a quoted field spans lines
        n_delims -= inside.count(delim)
    if n_delims != (len(header) - 1) * n_lines:
        return None  # ragged rows: the csv path names them
    plain = data.isascii() and b"\t" not in data and b"\x0b" not in data and b"\x0c" not in data
    return SimpleCsv(header=header, delimiter=delimiter, data=data, start=end + 1, n_rows=n_lines - 1, plain=plain)


def parse_simple(files: list[SimpleCsv]) -> pl.DataFrame | None:
    """Parse the bodies of simple files that share a header and delimiter in ONE polars call (all cells as
    strings, rows in file order); None when the parser disagrees with the byte checks (then each file goes
    the careful way). One call for many files costs far less than one per file (benchmarks/ingest_floor.py)."""
    first = files[0]
    head = first.delimiter.join(first.header).encode() + b"\n"
    buf = b"".join([head, *[part for f in files for part in f.body()]])
    try:
        frame = pl.read_csv(io.BytesIO(buf), separator=first.delimiter, infer_schema=False, quote_char='"',
                            has_header=True)
    except Exception:  # noqa: BLE001 - anything unusual goes the careful way
        return None
    if frame.height != sum(f.n_rows for f in files) or frame.width != len(first.header):
        return None
    if frame.columns != first.header:
        frame.columns = first.header
    return frame


def _fast_csv(path: str, data: bytes, delimiter: str) -> pl.DataFrame | None:
    """Parse with polars when the file is simple enough that line = row index + 2 (`simple_csv`); None to
    fall back to the csv module."""
    simple = simple_csv(path, data, delimiter)
    frame = parse_simple([simple]) if simple is not None else None
    if frame is None:
        return None
    # hstack, not with_columns: per call, polars' query engine costs more than the column itself
    return frame.hstack([pl.Series("_line", range(2, frame.height + 2), dtype=pl.Int64)])


def _unclosed_quote_column(text: str, delimiter: str, start_offset: int, header: list[str]) -> str | None:
    """The column whose quoted field is never closed (the row starting at `start_offset`)."""
    try:
        fields = next(csv.reader(io.StringIO(text[start_offset:] + '"', newline=""), delimiter=delimiter))
    except (csv.Error, StopIteration):
        return None
    i = len(fields) - 1
    return header[i] if 0 <= i < len(header) else None


def read_csv_text(path: str, text: str, data: bytes | None = None, expected: str = ","
                  ) -> tuple[pl.DataFrame, list[str], list[tuple[int, int]]]:
    """Parse delimited text (`expected`: the delimiter the file's suffix promises, see `_detect_delimiter`)."""
    warnings: list[str] = []
    if not text.strip():
        raise FileRejected(path, "empty file (expected a header row and at least one data row)", line=1)
    first_line = text.split("\n", 1)[0]
    delimiter = _detect_delimiter(path, first_line, warnings, expected)
    if data is not None:
        fast = _fast_csv(path, data, delimiter)
        if fast is not None:
            return fast, warnings, []
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = next(reader)
    except csv.Error as err:
        raise FileRejected(path, f"unreadable header: {err}", line=1) from None
    header = _check_header(path, header)
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
        offset = 0
        for _ in range(start - 1):
            offset = text.index("\n", offset) + 1
        column = _unclosed_quote_column(text, delimiter, offset, header)
        raise FileRejected(path, f"malformed CSV ({err}); an unclosed quote or a truncated file?", line=start,
                           column=column) from None
    if not rows and not short:
        raise FileRejected(path, "no data rows (only a header)", line=2)
    columns = list(zip(*rows)) if rows else [[] for _ in header]
    frame = pl.DataFrame({h: pl.Series(h, list(col), dtype=pl.Utf8) for h, col in zip(header, columns)})
    frame = frame.with_columns(pl.Series("_line", lines, dtype=pl.Int64))
    return frame, warnings, short


_PARQUET_OK = (pl.Utf8, pl.String, pl.Categorical, pl.Enum, pl.Boolean)


def _parquet_frame(name: str, data: bytes) -> pl.DataFrame:
    try:
        frame = pl.read_parquet(io.BytesIO(data))
    except Exception as err:  # noqa: BLE001 - any parquet failure rejects the file
        raise FileRejected(name, f"unreadable Parquet file: {err}") from None
    if frame.height == 0:
        raise FileRejected(name, "no data rows", line=1)
    for col, dtype in frame.schema.items():
        if not (dtype.is_numeric() or isinstance(dtype, _PARQUET_OK) or dtype in _PARQUET_OK):
            raise FileRejected(name, f"column {col} has Parquet type {dtype}; expected a string or a number",
                               line=1, column=col)
    frame = frame.with_columns([pl.col(c).cast(pl.Utf8, strict=False) for c in frame.columns])
    # Parquet has no lines: `line` is the 1-based row number
    return frame.with_columns(pl.int_range(1, frame.height + 1, dtype=pl.Int64).alias("_line"))


# ---------------------------------------------------------------- JSON, JSON Lines, Markdown


def _records_frame(records: list[dict], lines: list[int]) -> pl.DataFrame:
    """Records of text cells (None: empty) as a frame of Utf8 columns in order of first appearance, plus `_line`."""
    columns: dict[str, None] = {}
    for r in records:
        columns.update(dict.fromkeys(r))
    frame = pl.DataFrame({c: pl.Series(c, [r.get(c) for r in records], dtype=pl.Utf8) for c in columns})
    return frame.with_columns(pl.Series("_line", lines, dtype=pl.Int64))


class _DuplicateKey(Exception):
    pass


def _no_duplicate_keys(pairs: list[tuple]) -> dict:
    seen: dict = {}
    for k, v in pairs:
        if k in seen:
            raise _DuplicateKey(k)
        seen[k] = v
    return seen


class _Number(str):
    """A JSON number, as the text it is written as."""


def _json_loads(text: str):
    """JSON with every number kept as the text it is written as (so `6000` and `0.41` are read like CSV cells)."""
    return json.loads(text, parse_int=_Number, parse_float=_Number, parse_constant=_Number,
                      object_pairs_hook=_no_duplicate_keys)


def _json_kind(value) -> str:
    if isinstance(value, _Number):
        return "a number"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "null")


def _json_record(path: str, value, n: int, unit: str) -> dict[str, str | None]:
    """One record's cells as text: a string as is, a number as written, a boolean as true/false, null empty."""
    if not isinstance(value, dict):
        raise FileRejected(path, f"{_json_kind(value)} where a record (a JSON object {{\"column\": value, ...}}) "
                                 f"was expected", line=n, unit=unit)
    out: dict[str, str | None] = {}
    for key, cell in value.items():
        if isinstance(cell, (dict, list)):
            raise FileRejected(path, f"nested value ({_json_kind(cell)}) under key '{key}': expected a string, "
                                     f"number, boolean or null (one value per column)", line=n, column=key, unit=unit)
        name = key.strip()
        if name in out:
            raise FileRejected(path, f"duplicate column names in {unit}: {name}", line=n, column=name, unit=unit)
        out[name] = "true" if cell is True else "false" if cell is False else None if cell is None else str(cell)
    return out


def _json_frame(name: str, text: str) -> pl.DataFrame:
    """A .json file: a list of records, or an object holding exactly one list of records (e.g. under "runs").
    `_line` is the 1-based record number."""
    if not text.strip():
        raise FileRejected(name, "empty file (expected a JSON list of records)", line=1)
    try:
        doc = _json_loads(text)
    except json.JSONDecodeError as err:
        raise FileRejected(name, f"invalid JSON: {err.msg} (column {err.colno})", line=err.lineno) from None
    except _DuplicateKey as err:
        raise FileRejected(name, f"duplicate key '{err.args[0]}' in a JSON object", column=err.args[0]) from None
    expected = 'a list of records ([{"run_id": ..., "gpu": ...}, ...]) or an object with one such list (e.g. {"runs": [...]})'
    if isinstance(doc, dict):
        lists = [k for k, v in doc.items() if isinstance(v, list) and any(isinstance(x, dict) for x in v)]
        if len(lists) != 1:
            found = (f"several lists of records (under {', '.join(repr(k) for k in lists)})" if lists else
                     "an object without a list of records" + (f" (keys: {', '.join(repr(k) for k in list(doc)[:8])})"
                                                               if doc else ""))
            raise FileRejected(name, f"expected {expected}; found {found}")
        doc = doc[lists[0]]
    elif not isinstance(doc, list):
        raise FileRejected(name, f"expected {expected}; found {_json_kind(doc)}")
    if not doc:
        raise FileRejected(name, "no data rows (an empty list of records)")
    records = [_json_record(name, r, i, "record") for i, r in enumerate(doc, 1)]
    return _records_frame(records, list(range(1, len(records) + 1)))


def _jsonl_frame(name: str, text: str) -> pl.DataFrame:
    """A .jsonl/.ndjson file: one JSON object per line (blank lines skipped); `_line` is the file line."""
    records, lines = [], []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            value = _json_loads(line)
        except json.JSONDecodeError as err:
            raise FileRejected(name, f"invalid JSON: {err.msg} (column {err.colno}); expected one JSON object per "
                                     f"line", line=n) from None
        except _DuplicateKey as err:
            raise FileRejected(name, f"duplicate key '{err.args[0]}' in a JSON object", line=n,
                               column=err.args[0]) from None
        records.append(_json_record(name, value, n, "line"))
        lines.append(n)
    if not records:
        raise FileRejected(name, "empty file (expected one JSON object per line)", line=1)
    return _records_frame(records, lines)


_MD_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_MD_SEPARATOR_CELL = re.compile(r"^:?-+:?$")
#: markup around a whole cell: bold, italic (`*x*`), code (`x`, ``x``); the inside holds no such marker itself
_MD_MARKUP = (re.compile(r"^\*\*((?:(?!\*\*).)+)\*\*$"), re.compile(r"^__((?:(?!__).)+)__$"),
              re.compile(r"^``((?:(?!``).)+)``$"), re.compile(r"^`([^`]+)`$"), re.compile(r"^\*([^*]+)\*$"))


def _md_cells(line: str) -> list[str]:
    """The cells of a pipe-table row: split on unescaped pipes (outer pipes optional), `\|` kept as `|`, each
    cell stripped of blanks and of bold/italic/code markup around the whole cell (`**x**`, `` `x` ``)."""
    parts = re.split(r"(?<!\\)\|", line.strip())
    if parts and not parts[0].strip():
        parts = parts[1:]
    if parts and not parts[-1].strip():
        parts = parts[:-1]
    cells = []
    for part in parts:
        cell = part.strip().replace("\\|", "|")
        while True:
            m = next((m for pattern in _MD_MARKUP if (m := pattern.match(cell)) and m.group(1).strip()), None)
            if m is None:
                break
            cell = m.group(1).strip()
        cells.append(cell)
    return cells


def _is_md_separator(line: str) -> bool:
    cells = _md_cells(line)
    return "|" in line and bool(cells) and all(_MD_SEPARATOR_CELL.match(c) for c in cells)


def _markdown_frame(name: str, text: str) -> pl.DataFrame:
    """The first GitHub pipe table of a Markdown file (outside fenced code blocks): header row, `|---|` separator
    row (colons allowed), then body rows up to a blank line or a line without a pipe. `_line` is the file line."""
    lines = [ln.rstrip("\r") for ln in text.split("\n")]
    fenced = False
    for i, line in enumerate(lines):
        if _MD_FENCE.match(line):
            fenced = not fenced
            continue
        if fenced or "|" not in line or i + 1 >= len(lines) or not _is_md_separator(lines[i + 1]):
            continue
        header = _check_header(name, _md_cells(line), line=i + 1)
        width = len(_md_cells(lines[i + 1]))
        if width != len(header):
            raise FileRejected(name, f"table separator row has {width} cells, the header above it {len(header)}",
                               line=i + 2)
        rows, numbers = [], []
        for j in range(i + 2, len(lines)):
            if not lines[j].strip() or "|" not in lines[j]:
                break
            cells = _md_cells(lines[j])
            if len(cells) != len(header):
                raise FileRejected(name, f"table row has {len(cells)} cells, the header {len(header)} "
                                         f"(write a pipe inside a cell as \\|)", line=j + 1)
            rows.append(dict(zip(header, cells)))
            numbers.append(j + 1)
        if not rows:
            raise FileRejected(name, "no data rows (the table has only a header)", line=i + 3)
        return _records_frame(rows, numbers)
    raise FileRejected(name, "no pipe table found (expected a header row, a |---|---| separator row and data rows)")


CSV_SUFFIXES = (".csv", ".txt", "")
TSV_SUFFIXES = (".tsv", ".tab")
PARQUET_SUFFIXES = (".parquet", ".pq")
JSON_SUFFIXES = (".json",)
JSONL_SUFFIXES = (".jsonl", ".ndjson")
MARKDOWN_SUFFIXES = (".md", ".markdown")
#: every suffix `read_measurement_file` reads ("" is a file without one, read as CSV)
SUFFIXES = CSV_SUFFIXES + TSV_SUFFIXES + PARQUET_SUFFIXES + JSON_SUFFIXES + JSONL_SUFFIXES + MARKDOWN_SUFFIXES
ACCEPTED = ", ".join(s for s in SUFFIXES if s)


def _read_bytes(p: Path) -> bytes:
    return p.read_bytes()


def read_measurement_file(path: str | Path, defer_simple: bool = False) -> ReadResult:
    """Read a measurement file (see `SUFFIXES`: CSV/TSV, Parquet, JSON, JSON Lines, a Markdown pipe table). Raises
    FileRejected for problems that concern the whole file.

    With `defer_simple=True` a CSV/TSV file that `simple_csv` accepts is checked but not parsed: the result has
    `simple` instead of `frame`, for `parse_simple` to parse together with other files (the batch ingest)."""
    p = Path(path)
    name = str(p)
    if not p.exists():
        raise FileRejected(name, "file not found")
    if p.is_dir():
        raise FileRejected(name, f"is a directory, expected a measurement file ({ACCEPTED})")
    suffix = p.suffix.lower()
    if suffix not in SUFFIXES:
        raise FileRejected(name, f"unsupported file type '{p.suffix}': expected one of {ACCEPTED}")
    data = _read_bytes(p)
    digest = sha256_bytes(data)
    if suffix in PARQUET_SUFFIXES:
        frame = _parquet_frame(name, data)
        result = ReadResult(frame=frame, sha256=digest, n_bytes=len(data))
    elif suffix in JSON_SUFFIXES + JSONL_SUFFIXES + MARKDOWN_SUFFIXES:
        text = _decode(name, data, delimiter=None)
        reader = (_json_frame if suffix in JSON_SUFFIXES else _jsonl_frame if suffix in JSONL_SUFFIXES
                  else _markdown_frame)
        result = ReadResult(frame=reader(name, text), sha256=digest, n_bytes=len(data))
    else:
        expected = "\t" if suffix in TSV_SUFFIXES else ","
        # ASCII is valid UTF-8: only a NUL byte can still reject it, which `_decode` then names
        text = _decode(name, data, expected) if not data.isascii() or b"\x00" in data else None
        simple, warnings = None, []
        if defer_simple:
            end = data.find(b"\n")
            first = (data if end < 0 else data[:end]).decode("utf-8").removeprefix("\ufeff")
            if first.strip():
                simple = simple_csv(name, data, _detect_delimiter(name, first, warnings, expected))
        if simple is not None:
            result = ReadResult(frame=None, sha256=digest, n_bytes=len(data), warnings=warnings, header=simple.header,
                                simple=simple)
        else:
            # with defer_simple, `simple_csv` has already refused the bytes: straight to the careful path
            frame, warnings, short = read_csv_text(name, data.decode("ascii") if text is None else text,
                                                   None if defer_simple else data, expected)
            result = ReadResult(frame=frame, sha256=digest, n_bytes=len(data), warnings=warnings, short_rows=short)
    if result.frame is not None:
        result.header = [c for c in result.frame.columns if c != "_line"]
    # the file must not have changed while we read it
    if p.exists() and _read_bytes(p) != data:  # same bytes again (a byte compare, cheaper than a second hash)
        raise FileRejected(name, "file changed while being read; ingest it again once it is complete", retry=True)
    return result
