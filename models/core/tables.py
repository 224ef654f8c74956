"""What the readers of the shipped reference tables (measurements/recipes/*.csv, stacks.csv, stack_words.csv) share:
the error a malformed table raises, naming table, line, column, what was expected and what was found, and the
column through which the caller hands over each row's file line."""

from __future__ import annotations

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
