"""The training-stack tables (measurements/stacks.csv, stack_words.csv; models/memory/stacks.py): both files load,
every row is sourced, ids and words are unique and typed as documented, a malformed file is refused naming its
file, line and column, the lookups the runs adapter makes read the tables, and no stack table is a literal in
models/ any more."""

from __future__ import annotations

import ast
import csv
import shutil
from pathlib import Path

import polars as pl
import pytest

from models.memory.stacks import (
    DEFAULT_STACK,
    FAMILIES,
    KINDS,
    STACK_FILE_COLUMNS,
    WORD_FILE_COLUMNS,
    Stacks,
    framework_preset,
    has_words,
)
from pipeline import catalog
from pipeline.readers import FileRejected
from tests.conftest import MEASUREMENTS, ROOT
from tests.test_recipe_tables import _rewrite

FILES = {catalog.STACKS_FILE: STACK_FILE_COLUMNS, catalog.STACK_WORDS_FILE: WORD_FILE_COLUMNS}


@pytest.fixture(scope="module")
def shipped() -> Stacks:
    return catalog.stacks(MEASUREMENTS)


def _rows(name: str) -> tuple[list[str], list[dict]]:
    with open(MEASUREMENTS / name, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


# ---- the shipped tables ----------------------------------------------------------------------------------------------
def test_both_files_load_once_per_root(shipped):
    assert len(shipped.stacks) == len(_rows(catalog.STACKS_FILE)[1]) > 0
    assert len(shipped.words) == len(_rows(catalog.STACK_WORDS_FILE)[1]) > 0
    assert DEFAULT_STACK in shipped.stacks
    assert catalog.stacks(MEASUREMENTS) is shipped
    assert catalog.recipes(MEASUREMENTS).stacks == shipped  # the corpus reader gets them with the recipes


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_row_is_sourced_with_a_unique_key_and_the_documented_header(name):
    header, rows = _rows(name)
    assert header == [c.name for c in FILES[name]]
    key = header[0]
    keys = [r[key] for r in rows]
    assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]
    assert all(len(r["source"].strip()) > 20 for r in rows)


def test_values_are_of_their_documented_types(shipped):
    for sid, s in shipped.stacks.items():
        assert isinstance(s.selective_policy, int) and isinstance(s.default_sharding, str), sid
        for f in ("grad_bytes", "logits_bytes", "logits_chunks", "act_offload_frac"):
            assert isinstance(getattr(s, f), float), (sid, f)
        for f in ("unsharded_weights_with_pp", "quantized_saves", "local_batch_per_dp_rank", "interleaves_pipeline"):
            assert isinstance(getattr(s, f), bool), (sid, f)
        assert s.sequence_parallel_with_tp in (True, False, None)
        assert s.before_year is None or isinstance(s.before_year, int)
        for target in (s.before_year_reads_as, s.nemo_release_reads_as):
            assert target is None or target in shipped.stacks
    orders = [w.order for w in shipped.words.values() if w.stack is not None]
    assert len(orders) == len(set(orders)) and all(isinstance(o, int) for o in orders)
    for word, w in shipped.words.items():
        assert word == word.lower() and w.families <= set(FAMILIES)
        assert (w.stack is None) == (w.order is None) and (w.stack is None or w.stack in shipped.stacks)
    for col in (*STACK_FILE_COLUMNS, *WORD_FILE_COLUMNS):
        assert col.kind in KINDS, col.name


def test_the_data_card_describes_both_files_and_every_column():
    card = (MEASUREMENTS / "DATA_CARD.md").read_text()
    for name, columns in FILES.items():
        section = card[card.index(f"## `{name}`"):]
        for col in columns:
            assert f"`{col.name}`" in section, (name, col.name)


# ---- lookups that could go wrong -------------------------------------------------------------------------------------
@pytest.mark.parametrize("framework, year, stack", [
    ("torchtitan (PyTorch FSDP2/DTensor)", 2024, "torchtitan"),
    ("MaxText", 2024, "jax_spmd"),
    ("Some New Trainer", 2025, DEFAULT_STACK),  # an unknown word: the default stack
    (None, None, DEFAULT_STACK),
    ("Megatron-LM", 2021, "megatron_deepspeed"),  # the megatron row's before_year rule
    ("NeMo 25.02", 2025, "megatron_bridge"),  # its nemo_release_from rule
    ("Megatron-DeepSpeed", 2024, "megatron_deepspeed"),  # an earlier word wins over "megatron"
])
def test_a_run_reads_its_stack(shipped, framework, year, stack):
    df = pl.DataFrame({"framework": [framework], "year": [year]}, schema={"framework": pl.Utf8, "year": pl.Int64})
    assert df.select(framework_preset(shipped, "framework", "year"))["memory_preset"][0] == stack


def test_a_torchtitan_run_reads_torchtitans_values_and_families(shipped):
    tt = shipped.stacks["torchtitan"]
    assert (tt.logits_bytes, tt.unsharded_weights_with_pp, tt.local_batch_per_dp_rank) == (12.0, True, True)
    df = pl.DataFrame({"framework": ["torchtitan", "MaxText", "HF Accelerate", "GPT-NeoX"]})
    fam = df.select(*[has_words(shipped, "framework", f).alias(f) for f in FAMILIES])
    assert fam["fsdp"].to_list() == [True, False, False, False]
    assert fam["xla"].to_list() == [False, True, False, False]
    assert fam["native_kernels"].to_list() == [True, False, True, False]
    assert fam["megatron_based"].to_list() == [False, False, False, True]


# ---- malformed tables are refused ------------------------------------------------------------------------------------
def _root(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copy(MEASUREMENTS / name, tmp_path / name)
    return tmp_path


def _refused(root: Path) -> FileRejected:
    with pytest.raises(FileRejected) as err:
        catalog.stacks(root)
    return err.value


@pytest.mark.parametrize("name, old, new, line, column, expected", [
    (catalog.STACKS_FILE, "torchtitan,op_sac,4,12,", "torchtitan,op_sac,four,12,", None, "grad_bytes_per_element",
     "a number of bytes"),
    (catalog.STACKS_FILE, "llm_foundry,attention_core,4,4,1,0,false,", "llm_foundry,attention_core,4,4,1,0,no,", None,
     "sequence_parallel_with_tp", "true or false"),
    (catalog.STACK_WORDS_FILE, "maxtext,jax_spmd,", "maxtext,jax,", None, "stack", "a stack id"),
    (catalog.STACK_WORDS_FILE, "pax,jax_spmd,6,", "pax,jax_spmd,5,", None, "order", "an order no other word has"),
])
def test_a_malformed_row_is_refused_naming_file_line_and_column(tmp_path, name, old, new, line, column, expected):
    root = _root(tmp_path)
    path = root / name
    text = path.read_text(encoding="utf-8")
    assert old in text
    line = text[:text.index(old)].count("\n") + 1
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    err = _refused(root)
    assert (err.file, err.line, err.column) == (str(path), line, column), str(err)
    assert expected in err.reason and f"{path}, line {line}, column {column}" in str(err)


def test_a_duplicate_word_and_a_missing_column_are_refused(tmp_path):
    root = _root(tmp_path / "dup")
    path = root / catalog.STACK_WORDS_FILE
    _rewrite(path, lambda lines: [*lines, lines[-1]])
    err = _refused(root)
    assert err.column == "word" and "a word no other row has" in err.reason
    root = _root(tmp_path / "col")
    path = root / catalog.STACKS_FILE
    pl.read_csv(path, infer_schema_length=0).drop("quantized_saves").write_csv(path)
    err = _refused(root)
    assert (err.line, err.column) == (1, "quantized_saves") and "expected a column quantized_saves" in err.reason


# ---- no second copy in the code --------------------------------------------------------------------------------------
def test_no_stack_table_is_a_literal_in_models():
    """The stack tables live in measurements/ only: no module of models/ defines the old names, nor a literal that
    spells a list of stack words or stack ids."""
    gone = {"FRAMEWORK_WORDS", "PRESET_CODES", "FSDP_STACKS", "MEGATRON_STACKS", "NATIVE_KERNEL_STACKS",
            "XLA_STACKS", "NEMO2_PERF_RELEASE"}
    stacks = catalog.stacks(MEASUREMENTS)
    words, ids = set(stacks.words), set(stacks.ids) - {DEFAULT_STACK}
    for path in sorted((ROOT / "models").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {t.id for t in targets if isinstance(t, ast.Name)}
                assert not names & gone, (path, names & gone)
                # models.core.software.PRESETS names the software presets, not the stacks
                assert "PRESETS" not in names or path.parent.name != "memory", path
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                elts = node.keys if isinstance(node, ast.Dict) else node.elts
                texts = {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                assert len(texts & words) < 2 and len(texts & ids) < 2, (path, node.lineno, texts)
