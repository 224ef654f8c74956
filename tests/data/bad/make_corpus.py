"""Writes the bad-input corpus of this folder and its manifest EXPECTED.csv (run once; the files are kept).

    cd /work/main && uv run python tests/data/bad/make_corpus.py

Each case is a measurement file and its expected outcome:
- accepted: ingested whole (`reason`, if given, is a substring of a warning);
- rejected_file: the whole file is refused (FileRejected) naming `line` and `column` where they exist;
- rejected_rows: the file is ingested but the row at `line` is rejected on `column` with `reason`.
Run ids are unique per file, so the cases can be ingested one after the other into the same store.
`changing.csv` is a good file: tests/test_bad_inputs.py makes it change while being read.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import polars as pl

HERE = Path(__file__).resolve().parent
COLUMNS = [
    "run_id", "source", "source_ref", "year", "model_name", "arch", "params_b", "active_params_b", "n_layers",
    "d_model", "n_heads", "n_kv_heads", "ffn_dim", "vocab", "seq_len", "global_batch_seqs", "micro_batch", "gpu",
    "gpu_as_reported", "n_gpus", "gpus_per_node", "framework", "dtype", "tp", "pp", "dp", "cp", "ep", "vpp",
    "sharding", "recompute", "metric", "value", "unit", "derived", "notes",
]
BASE = {
    "source": "bad-input corpus", "source_ref": "tests/data/bad/make_corpus.py", "year": "2024",
    "model_name": "Llama 3 8B", "arch": "dense", "params_b": "8", "n_layers": "32", "d_model": "4096",
    "n_heads": "32", "n_kv_heads": "8", "ffn_dim": "14336", "vocab": "128256", "seq_len": "8192",
    "global_batch_seqs": "128", "micro_batch": "1", "gpu": "h100-sxm5-80gb", "gpu_as_reported": "H100",
    "n_gpus": "64", "gpus_per_node": "8", "framework": "torchtitan", "dtype": "bf16", "tp": "1", "pp": "1",
    "dp": "64", "sharding": "fsdp", "recompute": "none", "metric": "tokens_per_s_per_gpu", "value": "6000",
    "unit": "tokens/s/GPU", "derived": "no", "notes": "bad-input corpus row",
}
EXPECTED: list[tuple[str, str, str, str, str]] = []  # file, outcome, line, column, reason


def rows_for(stem: str, changes: list[dict], columns: list[str] = COLUMNS) -> list[dict]:
    out = []
    for i, ch in enumerate(changes):
        r = dict(BASE, run_id=f"bad-{stem}-{i + 1}")
        r.update(ch)
        out.append({c: r.get(c, "") for c in columns})
    return out


def csv_text(rows: list[dict], columns: list[str] = COLUMNS, delimiter: str = ",", lineterminator: str = "\n") -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, delimiter=delimiter, lineterminator=lineterminator,
                       extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


def case(name: str, content: bytes | str, outcome: str, line: int | str = "", column: str = "", reason: str = ""):
    data = content.encode("utf-8") if isinstance(content, str) else content
    (HERE / name).write_bytes(data)
    EXPECTED.append((name, outcome, str(line), column, reason))


def good(stem: str, n: int = 2, **kw) -> str:
    return csv_text(rows_for(stem, [{}] * n), **kw)


def one_bad(stem: str, change: dict) -> str:
    """A good row (line 2) and a bad one (line 3)."""
    return csv_text(rows_for(stem, [{}, change]))


def main() -> None:
    for p in HERE.iterdir():
        if p.name not in ("make_corpus.py", "__init__.py") and p.is_file():
            p.unlink()
    # ---- accepted as valid
    case("bom.csv", b"\xef\xbb\xbf" + good("bom").encode(), "accepted")
    case("crlf.csv", good("crlf", lineterminator="\r\n"), "accepted")
    case("bom_crlf.csv", b"\xef\xbb\xbf" + good("bomcrlf", lineterminator="\r\n").encode(), "accepted")
    case("quoted_comma.csv", csv_text(rows_for("qcomma", [{"notes": "with a comma, and more"}, {}])), "accepted")
    case("quoted_newline.csv", csv_text(rows_for("qnl", [{"notes": "two\nlines"}, {"value": "abc"}])),
         "rejected_rows", 4, "value", "expected a number")  # the row after the quoted newline is line 4
    case("quoted_newline_ok.csv", csv_text(rows_for("qnlok", [{"notes": "two\nlines, and a comma"}, {}])), "accepted")
    case("escaped_quotes.csv", csv_text(rows_for("esc", [{"notes": 'he said "fast"'}, {}])), "accepted")
    extra = COLUMNS + ["team", "cluster_name"]
    case("extra_columns.csv", csv_text([dict(r, team="infra", cluster_name="c1") for r in rows_for("extra", [{}, {}])],
                                       columns=extra), "accepted", "", "", "ignoring unknown column(s): team, cluster_name")
    case("semicolon.csv", good("semi", delimiter=";"), "accepted", "", "", "semicolon-separated")
    case("tab.csv", good("tab", delimiter="\t"), "accepted", "", "", "tab-separated")
    case("blank_lines.csv", good("blank").replace("\n", "\n\n", 2), "accepted")
    case("padded_cells.csv", csv_text(rows_for("pad", [{"gpu": "  h100-sxm5-80gb ", "value": " 6000 "}, {}])),
         "accepted")
    case("float_integers.csv", csv_text(rows_for("fint", [{"n_gpus": "6.4e1", "tp": "1.0", "dp": "64.0"}])),
         "accepted")
    case("exact_duplicate_rows.csv", csv_text(rows_for("xdup", [{}]) * 2), "accepted")
    case("changing.csv", good("changing"), "rejected_file", "", "", "changed while being read")
    buf = io.BytesIO()
    pl.DataFrame(rows_for("pq", [{}, {}])).write_parquet(buf)
    case("good.parquet", buf.getvalue(), "accepted")

    # ---- rejected whole
    case("empty.csv", b"", "rejected_file", 1, "", "empty file")
    case("whitespace_only.csv", "  \n\n \n", "rejected_file", 1, "", "empty file")
    case("header_only.csv", ",".join(COLUMNS) + "\n", "rejected_file", 2, "", "no data rows")
    no_unit = [c for c in COLUMNS if c != "unit"]
    case("missing_column.csv", csv_text(rows_for("nocol", [{}]), columns=no_unit), "rejected_file", 1, "unit",
         "missing required column(s): unit")
    case("colon_delimiter.csv", good("colon", delimiter=":"), "rejected_file", 1, "run_id",
         "missing required column(s)")
    text = good("latin1")
    at = text.rindex("bad-input corpus row")  # in the second data row only
    case("non_utf8.csv", (text[:at] + "caf\udce9 row" + text[at + len("bad-input corpus row"):])
         .encode("utf-8", "surrogateescape"), "rejected_file", 3, "notes", "not UTF-8")
    case("nul_byte.csv", good("nul").replace("Llama 3 8B", "Llama\x00 3 8B", 1), "rejected_file", 2, "model_name",
         "NUL byte")
    full = good("trunc")
    cut = full.index('"', full.index("bad-trunc-2")) if '"' in full else None
    quoted = csv_text(rows_for("trunc", [{}, {"notes": "a long note, cut off"}]))
    case("truncated_in_quote.csv", quoted[: quoted.index("a long note") + 6], "rejected_file", 3, "notes",
         "malformed CSV")
    case("duplicate_header.csv", good("duphead").replace("gpu_as_reported", "gpu", 1), "rejected_file", 1, "gpu",
         "duplicate column names")
    case("not_parquet.parquet", good("notpq"), "rejected_file", "", "", "unreadable Parquet file")
    buf = io.BytesIO()
    pl.DataFrame(rows_for("pqlist", [{}, {}])).with_columns(pl.Series("value", [[6000.0], [1.0]])).write_parquet(buf)
    case("list_typed.parquet", buf.getvalue(), "rejected_file", 1, "value", "has Parquet type")
    case("spreadsheet.xlsx", b"PK\x03\x04 not really a workbook", "rejected_file", "", "", "unsupported file type")
    del cut, full

    # ---- rejected rows (the good row of each file is kept)
    case("wrong_type_value.csv", one_bad("wtv", {"value": "fast"}), "rejected_rows", 3, "value", "expected a number")
    case("wrong_type_int.csv", one_bad("wti", {"n_layers": "thirty-two"}), "rejected_rows", 3, "n_layers",
         "expected an integer")
    case("nan_value.csv", one_bad("nan", {"value": "NaN"}), "rejected_rows", 3, "value", "NaN is not a measurement")
    case("inf_value.csv", one_bad("inf", {"value": "-inf"}), "rejected_rows", 3, "value", "infinite value")
    step = {"metric": "step_time_s", "unit": "s"}
    case("negative_time.csv", one_bad("neg", dict(step, value="-2.5")), "rejected_rows", 3, "value",
         "time must be > 0")
    case("zero_time.csv", one_bad("zero", dict(step, value="0")), "rejected_rows", 3, "value", "time must be > 0")
    case("mfu_percent.csv", one_bad("pct", {"metric": "mfu", "unit": "fraction", "value": "45"}), "rejected_rows", 3,
         "value", "looks like a percent")
    case("absurd_step_time.csv", one_bad("absurd", dict(step, value="1e9")), "rejected_rows", 3, "value",
         "absurd step time")
    case("absurd_layers.csv", one_bad("layers", {"n_layers": "1e12"}), "rejected_rows", 3, "n_layers", "out of range")
    case("absurd_throughput.csv", one_bad("tput", {"value": "5e9"}), "rejected_rows", 3, "value",
         "out of range for tokens_per_s_per_gpu")
    case("unknown_gpu.csv", one_bad("gpu", {"gpu": "h100-imaginary"}), "rejected_rows", 3, "gpu",
         "unknown hardware id")
    case("duplicate_conflict.csv", csv_text(rows_for("dupc", [{}, {}, {"value": "7000"}]))
         .replace("bad-dupc-3", "bad-dupc-2"), "rejected_rows", 3, "value", "different values on lines 3, 4")
    case("inconsistent_degrees.csv", one_bad("deg", {"tp": "2"}), "rejected_rows", 3, "n_gpus",
         "inconsistent degrees: tp*pp*dp*cp = 128 but n_gpus = 64")
    case("runs_disagree.csv", csv_text(rows_for("dis", [{}, {}, {"metric": "mfu", "unit": "fraction", "value": "0.4",
                                                                 "seq_len": "4096"}])).replace("bad-dis-3", "bad-dis-2"),
         "rejected_rows", 3, "seq_len", "disagree on seq_len")
    case("wrong_unit.csv", one_bad("unit", dict(step, unit="ms", value="3200")), "rejected_rows", 3, "unit",
         "unit for step_time_s must be s")
    case("missing_provenance.csv", one_bad("prov", {"source_ref": ""}), "rejected_rows", 3, "source_ref",
         "missing provenance")
    case("unknown_metric.csv", one_bad("metric", {"metric": "speed"}), "rejected_rows", 3, "metric", "unknown metric")
    case("bad_enum.csv", one_bad("enum", {"dtype": "bf17"}), "rejected_rows", 3, "dtype", "expected one of")
    case("long_field.csv", one_bad("long", {"notes": "x" * 20_000}), "rejected_rows", 3, "notes",
         "field longer than 10000 characters")
    lines = good("short", n=3).splitlines(keepends=True)
    case("truncated_row.csv", "".join(lines[:3]) + ",".join(lines[3].split(",")[:20]) + "\n", "rejected_rows", 4,
         COLUMNS[20], "truncated or mis-quoted row")
    lines = good("surplus", n=2).splitlines(keepends=True)
    case("extra_field.csv", lines[0] + lines[1] + lines[2].rstrip("\n") + ",surplus\n", "rejected_rows", 3, "notes",
         "extra field(s)")
    buf = io.BytesIO()
    pl.DataFrame(rows_for("pqbad", [{}, {"value": "fast"}])).write_parquet(buf)
    case("wrong_types.parquet", buf.getvalue(), "rejected_rows", 2, "value", "expected a number")
    case("semicolon_decimal_comma.csv", csv_text(rows_for("dec", [{}, {"value": "6000,5"}]), delimiter=";"),
         "rejected_rows", 3, "value", "expected a number")

    with open(HERE / "EXPECTED.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["file", "outcome", "line", "column", "reason"])
        w.writerows(sorted(EXPECTED))
    print(f"{len(EXPECTED)} cases written to {HERE}")


if __name__ == "__main__":
    main()
