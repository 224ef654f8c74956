"""What the readers of the shipped reference tables (measurements/recipes/*.csv, stacks.csv, stack_words.csv) share:
the error a malformed table raises, naming table, line, column, what was expected and what was found, the
column through which the caller hands over each row's file line, and the reading of a table's cells by the kind of
their column (`table_rows`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import polars as pl

#: the column a reader may add to a table's frame: the file line of each row (else row i is line i + 2)
LINE_COLUMN = "_line"


class TableError(ValueError):
    """A table that cannot be read: which, where (line 1 is the header; None: the table as a whole), what was
    expected and what was found."""

    def __init__(self, table: str, line: int | None, column: str | None, expected: str, got=None):
        self.table, self.line, self.column = table, line, column
        self.reason = f"expected {expected}" + ("" if got is None else f", got {got!r}")
        where = "".join([table, f": line {line}" if line is not None else "",
                         f", column {column}" if column else ""])
        super().__init__(f"{where}: {self.reason}")


@dataclass(frozen=True)
class Column:
    """One column of a table file: its name, its kind (a key of the reading module's `Kinds`), what it holds with
    its unit (measurements/DATA_CARD.md says the same), and whether an empty cell is allowed (read as None)."""

    name: str
    kind: str
    meaning: str
    optional: bool = False


#: kind of a column -> (what a cell must be, cell text -> value, None where it is not one)
Kinds = Mapping[str, tuple[str, Callable[[str], object]]]


def table_rows(table: str, columns: tuple[Column, ...], frame: pl.DataFrame, kinds: Kinds,
               error: type[TableError] = TableError,
               check: Callable[[Column, object], str | None] | None = None) -> Iterator[tuple[int, list]]:
    """(line, values in `columns` order) of each row of a table's frame (its cells as text; an optional
    `LINE_COLUMN`), one row at a time so a caller's own row checks run in file order: checked, the table's columns
    and no other, each cell of its column's kind, and where `check` names what a column's value must be instead (it
    returns None for a value it accepts), that. Raises `error` naming the table, line and column of the first cell
    that fails, left to right."""
    names = [c.name for c in columns]
    present = [c for c in frame.columns if c != LINE_COLUMN]
    for name in names:
        if name not in present:
            raise error(table, 1, name, f"a column {name} (the table's columns: {', '.join(names)})")
    for name in present:
        if name not in names:
            raise error(table, 1, name, f"only the table's columns ({', '.join(names)})", name)
    lines = frame[LINE_COLUMN].to_list() if LINE_COLUMN in frame.columns else list(range(2, frame.height + 2))
    cells = frame.select(pl.col(n).cast(pl.Utf8) for n in names).iter_rows()
    for line, row in zip(lines, cells):
        yield line, [_cell(table, line, col, text, kinds, error, check) for col, text in zip(columns, row)]


def _cell(table: str, line: int, col: Column, text, kinds: Kinds, error: type[TableError],
          check: Callable[[Column, object], str | None] | None) -> object:
    if text is None or text == "":
        if col.optional:
            return None
        raise error(table, line, col.name, f"a value ({kinds[col.kind][0]})", "")
    expected, parse = kinds[col.kind]
    value = parse(text)
    if check is not None and (wanted := check(col, value)) is not None:
        value, expected = None, wanted
    if value is None:
        raise error(table, line, col.name, expected, text)
    return value
