"""Measured runs in the formats people paste them in (TSV, JSON, JSON Lines, a Markdown pipe table): the same
runs predict and ingest as their CSV does, and a bad file is refused naming file and line/record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline import automation, readers, store
from pipeline.cli import app
from pipeline.measurements import COLUMNS
from pipeline.readers import FileRejected, read_measurement_file
from tests.test_ingest import BASE, all_tables, ingest_one, write_rows

runner = CliRunner()

#: the two runs of tests/test_predict_cli.py's runs file, the second on twice the GPUs
ROWS = [BASE, dict(BASE, run_id="t-2", n_gpus="128", dp="128", value="5800", notes="second | run")]


@pytest.fixture(autouse=True)
def no_store(tmp_path, monkeypatch):
    """The analytical path (no store, no promoted fit), as in tests/test_predict_cli.py."""
    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "none" / "stepcast.duckdb"))


def _typed(row: dict) -> dict:
    """A record as a JSON writer gives it: counts as numbers, the rest as strings."""
    return {k: int(v) if v.isdigit() else v for k, v in row.items()}


def _md_cell(value: str) -> str:
    return value.replace("|", "\\|")


def _markdown(rows: list[dict]) -> str:
    """A table as a README shows it: text around it, bold header, alignment colons, code-formatted ids."""
    cols = list(COLUMNS)
    align = [":---" if i % 3 == 0 else "---:" if i % 3 == 1 else ":---:" for i in range(len(cols))]
    body = ["| " + " | ".join(f"`{_md_cell(r[c])}`" if c in ("run_id", "gpu") else _md_cell(r.get(c, ""))
                              for c in cols) + " |" for r in rows]
    return "\n".join(["# Our runs", "", "Measured on our cluster | last week.", "",
                      "| " + " | ".join(f"**{c}**" if c == "run_id" else c for c in cols) + " |",
                      "|" + "|".join(align) + "|", *body, "", "Numbers are per step."]) + "\n"


def write_format(path: Path, rows: list[dict]) -> Path:
    suffix = path.suffix
    if suffix in (".tsv", ".tab"):
        path.write_text("\n".join("\t".join(r.get(c, "") for c in COLUMNS) for r in [dict(zip(COLUMNS, COLUMNS)),
                                                                                    *rows]) + "\n")
    elif suffix == ".json":
        path.write_text(json.dumps([_typed(r) for r in rows], indent=2))
    elif suffix in (".jsonl", ".ndjson"):
        path.write_text("\n".join(json.dumps(_typed(r)) for r in rows) + "\n")
    elif suffix in (".md", ".markdown"):
        path.write_text(_markdown(rows))
    else:
        raise AssertionError(suffix)
    return path


def _predict(path: Path) -> dict:
    result = runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    return {r["run_id"]: r for r in json.loads(result.output)}


SUFFIXES = [".tsv", ".tab", ".json", ".jsonl", ".ndjson", ".md", ".markdown"]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_each_format_predicts_what_its_csv_predicts(tmp_path, suffix):
    want = _predict(write_rows(tmp_path / "runs.csv", ROWS))
    got = _predict(write_format(tmp_path / f"runs{suffix}", ROWS))
    assert set(got) == set(want) == {"t-run-1", "t-2"}
    for run_id, w in want.items():
        g = got[run_id]
        assert w["step_time_s"] is not None and g["step_time_s"] == pytest.approx(w["step_time_s"])
        assert g["measured_tokens_per_s_per_gpu"] == pytest.approx(w["measured_tokens_per_s_per_gpu"])
        assert (g["n_gpus"], g["assumptions"]) == (w["n_gpus"], w["assumptions"])


def test_a_json_object_with_one_list_of_records_reads_like_the_list(tmp_path):
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"source": "our cluster", "n": 2, "tags": ["a", "b"],
                                "runs": [_typed(r) for r in ROWS]}))
    frame = read_measurement_file(path).frame
    assert frame["run_id"].to_list() == ["t-run-1", "t-2"] and frame["_line"].to_list() == [1, 2]
    assert _predict(path)["t-2"]["step_time_s"] == pytest.approx(_predict(write_format(tmp_path / "l.json", ROWS))
                                                                 ["t-2"]["step_time_s"])


def test_json_cells_are_text_as_written(tmp_path):
    path = tmp_path / "runs.json"
    path.write_text('[{"run_id": "a", "value": 6000, "mfu": 0.410, "big": 1e3, "recompute": true, '
                    '"sharding": false, "notes": null}, {"run_id": "b", "tp": 2}]')
    frame = read_measurement_file(path).frame
    assert frame.row(0, named=True) == {"run_id": "a", "value": "6000", "mfu": "0.410", "big": "1e3",
                                        "recompute": "true", "sharding": "false", "notes": None, "tp": None,
                                        "_line": 1}
    assert frame.row(1, named=True)["tp"] == "2"
    assert all(dtype == readers.pl.Utf8 for c, dtype in frame.schema.items() if c != "_line")


def test_a_markdown_table_copied_from_a_readme(tmp_path):
    path = tmp_path / "runs.md"
    path.write_text("# Results\n"
                    "\n"
                    "```\n"
                    "| not | this |\n"
                    "|-----|------|\n"
                    "| a   | b    |\n"
                    "```\n"
                    "\n"
                    "| **Run** | Model | GPU type | num_gpus | Step time (ms) | Notes |\n"
                    "|:--------|:-----:|---------:|---------:|:---------------|-------|\n"
                    "| `a` | **llama3-8b** | `h100-sxm5-80gb` | 64 | 4,000 | tp \\| pp sweep |\n"
                    "| b | llama3-8b | h100-sxm5-80gb | 128 | `3900` | *fast* |\n"
                    "\n"
                    "| another | table |\n"
                    "|---|---|\n"
                    "| ignored | too |\n")
    frame = read_measurement_file(path).frame
    assert frame.columns == ["Run", "Model", "GPU type", "num_gpus", "Step time (ms)", "Notes", "_line"]
    assert frame.rows() == [("a", "llama3-8b", "h100-sxm5-80gb", "64", "4,000", "tp | pp sweep", 11),
                            ("b", "llama3-8b", "h100-sxm5-80gb", "128", "3900", "fast", 12)]
    rows = _predict(path)  # the header synonyms apply as to a CSV's header
    assert rows["a"]["n_gpus"] == 64 and rows["a"]["step_time_s"] is not None
    assert "column 'Step time (ms)' read as metric step_time_s (x 0.001)" in rows["a"]["assumptions"]


def test_tsv_reads_without_a_delimiter_warning_and_takes_a_header_with_commas(tmp_path):
    path = tmp_path / "runs.tsv"
    path.write_text("run_id\tgpu\tStep time (ms, mean)\tMFU (%, model)\na\th100\t4,000\t40\n")
    for defer in (False, True):
        read = read_measurement_file(path, defer_simple=defer)
        assert read.header == ["run_id", "gpu", "Step time (ms, mean)", "MFU (%, model)"] and not read.warnings
    assert read_measurement_file(path).frame.row(0) == ("a", "h100", "4,000", "40", 2)


def test_jsonl_lines_are_file_lines(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text('{"run_id": "a", "tp": 1}\n\n{"run_id": "b", "tp": 2}\r\n')
    assert read_measurement_file(path).frame.rows() == [("a", "1", 1), ("b", "2", 3)]


# ---------------------------------------------------------------- bad files

BAD = [
    ("nested.json", '[{"run_id": "a"}, {"run_id": "b", "layout": {"tp": 2}}]', "record 2, column layout",
     "nested value (an object) under key 'layout'"),
    ("listcell.json", '{"runs": [{"run_id": "a", "gpus": [1, 2]}]}', "record 1, column gpus", "nested value (a list)"),
    ("two_lists.json", '{"runs": [{"run_id": "a"}], "baselines": [{"run_id": "b"}]}', "two_lists.json:",
     "several lists of records (under 'runs', 'baselines')"),
    ("no_list.json", '{"run_id": "a", "gpu": "h100"}', "no_list.json:", "an object without a list of records"),
    ("scalar.json", '"runs"', "scalar.json:", "expected a list of records"),
    ("not_object.json", '[{"run_id": "a"}, 5]', "record 2", "a number where a record (a JSON object"),
    ("empty_list.json", '{"runs": []}', "empty_list.json:", "expected a list of records"),
    ("empty.json", "[]", "empty.json:", "no data rows"),
    ("broken.json", '[{"run_id": "a"},\n {"run_id": "b",}]', "broken.json, line 2", "invalid JSON"),
    ("dupkey.json", '[{"run_id": "a", "run_id": "b"}]', "column run_id", "duplicate key 'run_id'"),
    ("bad.jsonl", '{"run_id": "a"}\n{"run_id": "b"}\n{"run_id": "c"\n', "bad.jsonl, line 3",
     "invalid JSON: Expecting ',' delimiter (column 15)"),
    ("list.jsonl", '{"run_id": "a"}\n[1, 2]\n', "list.jsonl, line 2", "a list where a record"),
    ("nested.jsonl", '{"run_id": "a"}\n\n{"run_id": "b", "x": {"y": 1}}\n', "nested.jsonl, line 3, column x",
     "nested value"),
    ("blank.jsonl", "\n\n", "blank.jsonl, line 1", "empty file"),
    ("ragged.md", "| run_id | gpu |\n|---|---|\n| a | h100 |\n| b | h100 | extra |\n", "ragged.md, line 4",
     "table row has 3 cells, the header 2"),
    ("separator.md", "text\n\n| run_id | gpu |\n|---|---|---|\n| a | h100 |\n", "separator.md, line 4",
     "separator row has 3 cells"),
    ("notable.md", "# Runs\n\nrun_id | gpu\n\n- a on h100\n", "notable.md:", "no pipe table found"),
    ("header_only.md", "| run_id | gpu |\n| :-- | --: |\n\nmore text\n", "header_only.md, line 3", "no data rows"),
    ("dupe_header.md", "x\n| run_id | `run_id` |\n|---|---|\n| a | b |\n", "dupe_header.md, line 2, column run_id",
     "duplicate column names"),
    ("nul.jsonl", '{"run_id": "a\x00"}\n', "nul.jsonl, line 1:", "NUL byte"),
    ("runs.xlsx", "PK", "runs.xlsx:", "unsupported file type '.xlsx': expected one of .csv, .txt, .tsv, .tab, "
                                      ".parquet, .pq, .json, .jsonl, .ndjson, .md, .markdown"),
]


@pytest.mark.parametrize("name, text, where, reason", BAD, ids=[b[0] for b in BAD])
def test_bad_files_are_refused_naming_file_and_line(tmp_path, name, text, where, reason):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(FileRejected) as info:
        read_measurement_file(path)
    message = str(info.value)
    assert where in message and reason in message, message
    assert str(path) in message


def test_predict_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"run_id": "a"}\n{"run_id": "b"}\n{"run_id": "c"\n')
    result = runner.invoke(app, ["predict", "--runs", str(path)])
    assert result.exit_code == 1 and "bad.jsonl, line 3: invalid JSON" in result.output


def test_a_file_changing_while_read_is_retried(tmp_path, monkeypatch):
    path = write_format(tmp_path / "runs.jsonl", ROWS)
    real, calls = readers._read_bytes, []

    def read(p):
        calls.append(p)
        return real(p) + (b"\n" if len(calls) == 2 else b"")

    monkeypatch.setattr(readers, "_read_bytes", read)
    with pytest.raises(FileRejected) as info:
        read_measurement_file(path)
    assert info.value.retry and "file changed while being read" in str(info.value)


# ---------------------------------------------------------------- ingest and the incoming folder

def _stored(store_path: Path, key: str) -> list[tuple]:
    import duckdb

    con = duckdb.connect(str(store_path), read_only=True)
    try:
        return con.execute("select * exclude (source_file, source_line) from run_metrics where source_file = ? "
                           "order by run_id, metric", [key]).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".md", ".tsv"])
def test_ingest_stores_what_the_csv_stores(built_store, tmp_path, suffix):
    rows = [ROWS[0], {k: v for k, v in ROWS[1].items() if k != "notes"}]  # a record without a key: an empty cell
    results = {}
    for name, path in (("csv", write_rows(tmp_path / "runs.csv", rows)),
                       ("other", write_format(tmp_path / f"runs{suffix}", rows))):
        target = tmp_path / f"{name}.duckdb"
        shutil.copyfile(built_store, target)
        rep = ingest_one(target, path)
        assert rep.status == "accepted" and rep.rows_accepted == 2, rep.rejections
        results[name] = _stored(target, rep.file)
    assert results["other"] == results["csv"] and len(results["csv"]) == 2
    if suffix == ".jsonl":
        import duckdb

        con = duckdb.connect(str(tmp_path / "other.duckdb"), read_only=True)
        lines = con.execute("select run_id, source_line from run_metrics where run_id like 't-%' order by 1").fetchall()
        con.close()
        assert lines == [("t-2", 2), ("t-run-1", 1)]


def test_rejected_row_names_its_jsonl_line(store_copy, tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(BASE) + "\n\n" + json.dumps(dict(BASE, run_id="t-2", value="fast")) + "\n")
    rep = ingest_one(store_copy, path)
    assert rep.rows_accepted == 1
    assert rep.rejections.row(0, named=True)["line"] == 3 and rep.rejections["column"][0] == "value"


@pytest.mark.parametrize("name, text", [("bad.jsonl", json.dumps(BASE) + "\n{oops\n"),
                                        ("bad.md", "| run_id | gpu |\n|---|---|\n| a |\n"),
                                        ("bad.json", json.dumps([dict(BASE, tp={"size": 2})]))])
def test_a_refused_file_leaves_the_store_as_it_was(store_copy, tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    before = all_tables(store_copy)
    with pytest.raises(FileRejected) as info:
        ingest_one(store_copy, path)
    assert name in str(info.value)
    assert all_tables(store_copy) == before


def test_the_incoming_folder_takes_every_readable_type(tmp_path):
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    for name in ("a.csv", "b.jsonl", "c.md", "d.json", "e.tsv", "README.md", "f.md.reason.txt", "g.json.part"):
        (incoming / name).write_text("x")
    assert [p.name for p in automation.candidates(incoming, settle_s=0)] == ["a.csv", "b.jsonl", "c.md", "d.json",
                                                                            "e.tsv"]
    assert {".json", ".jsonl", ".ndjson", ".md", ".markdown", ".tsv", ".tab"} <= set(automation.SUFFIXES)
