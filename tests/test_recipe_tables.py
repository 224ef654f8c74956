"""The recipe tables (measurements/recipes/*.csv, models/corpus/recipes.py): every shipped file loads, each row is
sourced, keyed once and typed as documented; a malformed file is refused naming its file, line and column; the
lookups the runs adapter makes come from the tables and not from a second copy in the code."""

from __future__ import annotations

import ast
import csv
import dataclasses
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from models.core.tables import LINE_COLUMN
from models.corpus import moe_recipes as mr
from models.corpus.recipes import (
    KINDS,
    TABLES,
    RecipeTableError,
    Recipes,
    parse_table,
    recipe_fp8_params,
    recipe_memory,
    recipe_micro_batch,
    recipe_optimizer,
    recipes_from_frames,
)
from pipeline import catalog
from pipeline.readers import FileRejected
from tests.conftest import MEASUREMENTS, ROOT

FOLDER = MEASUREMENTS / catalog.RECIPES_FOLDER


@pytest.fixture(scope="module")
def shipped() -> Recipes:
    return catalog.recipes(MEASUREMENTS)


def _rows(name: str) -> tuple[list[str], list[dict]]:
    with open(FOLDER / f"{name}.csv", newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


# ---- the shipped tables ----------------------------------------------------------------------------------------------
def test_the_folder_holds_one_file_per_table_and_each_loads(shipped):
    assert sorted(p.stem for p in FOLDER.glob("*.csv")) == sorted(TABLES)
    for name in TABLES:
        assert len(getattr(shipped, name)) == len(_rows(name)[1]) > 0, name
    assert catalog.recipes(MEASUREMENTS) is shipped  # read once per measurements root


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_row_has_a_source_a_unique_key_and_the_header_of_its_table(name):
    table = TABLES[name]
    header, rows = _rows(name)
    assert header == [c.name for c in table.columns]
    assert tuple(c.name for c in table.values) == table.row._fields  # a row's fields are the value columns, in order
    keys = [tuple(r[c.name] for c in table.key) for r in rows]
    assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]
    assert all(r["source"].strip() for r in rows)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_value_is_of_its_documented_type(shipped, name):
    table = TABLES[name]
    types = {"whole": int, "positive": int, "bytes": float, "modules": tuple}
    for key, row in getattr(shipped, name).items():
        for col, value in zip(table.columns, (*key, *row)):
            if value is None:
                assert col.optional, (name, key, col.name)
                continue
            assert isinstance(value, types.get(col.kind, str)), (name, key, col.name, value)
            text = "|".join(value) if isinstance(value, tuple) else f"{value:g}" if isinstance(value, float) \
                else str(value)
            assert KINDS[col.kind][1](text) == value, (name, key, col.name, value)


def test_keys_name_architectures_and_hardware_of_the_shipped_tables(shipped):
    arch = set(pl.read_csv(MEASUREMENTS / "architectures.csv", infer_schema_length=None)["id"])
    hw = set(pl.read_csv(MEASUREMENTS / "hardware_specs.csv", infer_schema_length=None)["id"])
    for name, table in TABLES.items():
        names = [c.name for c in table.key]
        for key in getattr(shipped, name):
            k = dict(zip(names, key))
            assert k.get("arch_id", "deepseek-v3") in arch, (name, key)
            assert k.get("gpu", "gb200") in hw, (name, key)


def test_the_data_card_describes_every_table_and_column():
    card = (MEASUREMENTS / "DATA_CARD.md").read_text()
    section = card[card.index("## `recipes/`"):]
    for name, table in TABLES.items():
        assert f"`{name}.csv`" in section, name
        for col in table.columns:
            assert f"`{col.name}`" in section, (name, col.name)


def test_the_recipes_are_read_only(shipped):
    with pytest.raises(dataclasses.FrozenInstanceError):
        shipped.memory = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        shipped.expert_tp[("26.10",)] = shipped.expert_tp[("26.08",)]  # type: ignore[index]


# ---- what the code relies on -----------------------------------------------------------------------------------------
def test_spot_checks_of_the_lookups_the_adapter_makes(shipped):
    etp = shipped.expert_tp[("26.08",)]
    assert etp.etp == 1 and "r0.6.0" in etp.source and "perf_recipes" in etp.source
    llama = shipped.memory[("llama3-70b", "pretrain", "gb200", "fp8")]
    assert (llama.recompute, llama.act_offload_layers) == ("none", 40)
    assert "cpu_offloading_num_layers=40" in llama.source
    assert shipped.memory[("llama3-70b", "pretrain", "gb300", "fp8-cs")].act_offload_layers == 20
    assert shipped.recompute_modules[("deepseek-v3", "pretrain", "gb200", "mxfp8", "26.04")].recompute_modules == \
        ("mlp",)
    assert shipped.recompute_modules[("gpt-oss-120b", "pretrain", "h100-sxm5-80gb", "bf16", "25.11")] \
        .recompute_modules == ("layernorm", "moe_act")
    opt = shipped.optimizer[("nemotron-4-340b", "pretrain", "24.07")]
    assert (opt.recompute, opt.optimizer_bytes_per_param, opt.grad_bytes_per_param) == ("selective", 4.0, 2.0)
    mb = shipped.micro_batch[("gpt-oss-120b", "pretrain", "h100-sxm5-80gb", "bf16", "25.11")]
    assert (mb.stated_micro_batch, mb.micro_batch) == (4, 1)
    assert shipped.sharding[("nemotron-3-ultra", "pretrain", "gb200", "mxfp8", "26.08")].sharding == "hsdp"
    off = shipped.fp8_param_gather_off
    assert ("kimi-k2", "mxfp8") in off and ("kimi-k2", "fp8") not in off
    assert shipped.fp8_param_gather[("26.08", "mxfp8")].precision_config == "bf16_with_mxfp8_mixed"
    assert ("26.08", "nvfp4") not in shipped.fp8_param_gather
    assert shipped.inplace_cross_entropy[("26.06",)].logits_bytes_per_element == 2.0
    assert ("26.08",) not in shipped.inplace_cross_entropy  # TE of 26.08 unknown: the preset's 6 B
    assert [k for k in shipped.default_layouts] == [("jax_spmd", None), ("*", "gaudi")]  # first match wins
    assert shipped.a2a_overlap[("26.02", "qwen3-235b-a22b", "b300", "mxfp8")].dispatcher_backend is None
    assert ("26.04", "nemotron-3-super", "b200", "nvfp4") in shipped.flex_dispatcher


def test_the_runs_adapter_reads_the_tables_not_a_second_copy(shipped):
    """A changed row changes what the adapter's functions give: the facts live in the tables only."""
    frames = {name: catalog.read_recipe_csv(FOLDER / f"{name}.csv", LINE_COLUMN) for name in TABLES}
    frames["expert_tp"] = frames["expert_tp"].with_columns(
        pl.when(pl.col("container") == "26.04").then(pl.lit("2")).otherwise(pl.col("etp")).alias("etp"))
    frames["memory"] = frames["memory"].with_columns(pl.when(
        (pl.col("arch_id") == "llama3-70b") & (pl.col("gpu") == "gb200") & (pl.col("dtype") == "fp8"))
        .then(pl.lit("20")).otherwise(pl.col("act_offload_layers")).alias("act_offload_layers"))
    frames["optimizer"] = frames["optimizer"].with_columns(pl.lit("6").alias("grad_bytes_per_param"))
    changed = recipes_from_frames(frames, catalog.stacks(MEASUREMENTS))
    run = "mb2604-pre-training-qwen3-235b-a22b-h100-256gpu-fp8-gbs8192"
    assert (mr.recipe_etp(run, shipped), mr.recipe_etp(run, changed)) == (1, 2)
    etp = pl.DataFrame({"run_id": [run], "n_experts": [128], "etp": [None], "assumptions": [None]},
                       schema_overrides={"etp": pl.Float64, "assumptions": pl.Utf8})
    assert mr.resolve_recipe_etp(etp, changed)["etp"].to_list() == [2.0]
    mem = pl.DataFrame({"memory_preset": ["megatron_bridge"], "arch_id": ["llama3-70b"], "model_name": ["LLAMA3_70B"],
                        "gpu": ["gb200"], "dtype": ["fp8"], "recompute": [None], "n_layers": [80], "pp": [1],
                        "assumptions": [None], "framework": ["Megatron-Bridge / NeMo 26.02"]},
                       schema_overrides={"recompute": pl.Utf8, "assumptions": pl.Utf8})
    assert recipe_memory(mem, shipped)["act_offload_frac"][0] == 0.5
    assert recipe_memory(mem, changed)["act_offload_frac"][0] == 0.25
    assert recipe_memory(mem, shipped)["logits_bytes"][0] == 2.0  # 26.02's TE writes the gradient in place
    opt = pl.DataFrame({"memory_preset": ["megatron"], "arch_id": ["llama2-70b"], "model_name": ["LLAMA2_70B SFT"],
                        "framework": ["NeMo 24.07"], "recompute": [None], "assumptions": [None]},
                       schema_overrides={"recompute": pl.Utf8, "assumptions": pl.Utf8})
    assert recipe_optimizer(opt, shipped).select("recompute", "optimizer_bytes", "grad_bytes").row(0) == \
        ("none", 4.0, 2.0)
    assert recipe_optimizer(opt, changed)["grad_bytes"][0] == 6.0
    fp8 = pl.DataFrame({"memory_preset": ["megatron_bridge"] * 2, "arch_id": ["kimi-k2", "llama3-70b"],
                        "model_name": ["Kimi K2", "LLAMA3_70B"], "dtype": ["mxfp8"] * 2,
                        "framework": ["Megatron-Bridge / NeMo 26.06"] * 2, "assumptions": [None] * 2},
                       schema_overrides={"assumptions": pl.Utf8})
    assert recipe_fp8_params(fp8, shipped)["fp8_param_gather"].to_list() == [None, 1.0]
    micro = pl.DataFrame({"memory_preset": ["megatron_bridge"], "arch_id": ["gpt-oss-120b"],
                          "model_name": ["GPT-OSS 120B"], "gpu": ["h100-sxm5-80gb"], "dtype": ["bf16"],
                          "micro_batch": [4], "framework": ["Megatron-Bridge / NeMo 25.11"], "assumptions": [None]},
                         schema_overrides={"assumptions": pl.Utf8})
    out = recipe_micro_batch(micro, shipped)
    assert out["micro_batch"][0] == 1 and "GPT_OSS_120B_H100_BF16_BASE_CONFIG" in out["assumptions"][0]


#: the module-level tables the recipe CSVs replaced: none of them may come back as a Python literal in models/
MOVED = {"RECIPE_MEMORY", "RECIPE_RECOMPUTE_MODULES", "RECIPE_SHARDING", "RECIPE_MICRO_BATCH", "RECIPE_OPTIMIZER",
         "DEFAULT_LAYOUTS", "FP8_PARAM_GATHER_DTYPES", "FP8_PARAM_GATHER_CONTAINERS", "FP8_PARAM_GATHER_OFF",
         "TE_INPLACE_CROSS_ENTROPY_CONTAINERS", "TE_INPLACE_LOGITS_BYTES", "RECIPE_A2A_OVERLAP", "RECIPE_DISPATCHER",
         "RECIPE_ETP", "RECIPE_FLEX"}


def test_no_recipe_table_is_left_in_the_model_code():
    defined = set()
    for f in (ROOT / "models").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Assign):
                defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defined.add(node.target.id)
    assert not defined & MOVED


# ---- malformed tables are refused ------------------------------------------------------------------------------------
def _root(tmp_path: Path) -> Path:
    """A measurements root with a copy of the shipped recipe tables and the stack tables they are checked against."""
    shutil.copytree(FOLDER, tmp_path / catalog.RECIPES_FOLDER)
    for name in (catalog.STACKS_FILE, catalog.STACK_WORDS_FILE):
        shutil.copy(MEASUREMENTS / name, tmp_path / name)
    return tmp_path


def _rewrite(path: Path, change) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(change(lines)), encoding="utf-8")


def _refused(root: Path) -> FileRejected:
    with pytest.raises(FileRejected) as err:
        catalog.recipes(root)
    return err.value


def test_a_value_of_the_wrong_type_names_file_line_and_column(tmp_path):
    root = _root(tmp_path)
    path = root / "recipes" / "expert_tp.csv"
    _rewrite(path, lambda lines: [lines[0], lines[1], lines[2].replace("25.11,1,", "25.11,one,", 1), *lines[3:]])
    err = _refused(root)
    assert (err.file, err.line, err.column) == (str(path), 3, "etp")
    assert "expected a whole number >= 1, got 'one'" in str(err) and f"{path}, line 3, column etp" in str(err)


@pytest.mark.parametrize("table, column, old, new, expected", [
    ("memory", "task", ",pretrain,", ",pre-train,", "one of pretrain, sft, lora"),
    ("memory", "act_offload_layers", ",none,40,", ",none,-40,", "a whole number >= 0"),
    ("optimizer", "grad_bytes_per_param", ",4,2,", ",4,two,", "a number of bytes"),
    ("recompute_modules", "recompute_modules", ",mla_up_proj|mlp,", ",mla_up_proj|attention,",
     "Megatron-Core recompute modules"),
    ("sharding", "sharding", ",hsdp,", ",fsdp2,", "one of none, zero1"),
    ("a2a_overlap", "container", "25.09,", "2025.09,", "a NeMo container release YY.MM"),
    ("default_layouts", "memory_preset", "jax_spmd,", "jax,", "a memory preset"),
])
def test_each_kind_of_column_refuses_a_value_of_another_kind(tmp_path, table, column, old, new, expected):
    root = _root(tmp_path)
    path = root / "recipes" / f"{table}.csv"
    _rewrite(path, lambda lines: [lines[0], lines[1].replace(old, new, 1), *lines[2:]])
    assert new in path.read_text().splitlines()[1]
    err = _refused(root)
    assert (err.line, err.column) == (2, column) and expected in err.reason, str(err)


def test_an_empty_required_cell_and_an_empty_source_are_refused(tmp_path):
    root = _root(tmp_path)
    path = root / "recipes" / "flex_dispatcher.csv"
    _rewrite(path, lambda lines: [*lines[:3], re.sub(r',"[^"]*"\n$', ",\n", lines[3]), *lines[4:]])
    err = _refused(root)
    assert (err.line, err.column) == (4, "source") and "expected a value" in err.reason


def test_a_duplicate_key_names_both_lines_and_the_key_columns(tmp_path):
    root = _root(tmp_path)
    path = root / "recipes" / "memory.csv"
    _rewrite(path, lambda lines: [*lines, lines[1]])
    n = len(path.read_text().splitlines())
    err = _refused(root)
    assert (err.line, err.column) == (n, "arch_id, task, gpu, dtype")
    assert "a key no other row has (line 2 has it too)" in err.reason and "llama3-70b|pretrain|gb200|fp8" in str(err)


def test_a_missing_or_unknown_column_is_refused_at_the_header(tmp_path):
    root = _root(tmp_path)
    path = root / "recipes" / "micro_batch.csv"
    frame = pl.read_csv(path, infer_schema_length=0).drop("stated_micro_batch")
    frame.write_csv(path)
    err = _refused(root)
    assert (err.file, err.line, err.column) == (str(path), 1, "stated_micro_batch")
    assert "expected a column stated_micro_batch" in err.reason
    extra = pl.read_csv(FOLDER / "micro_batch.csv", infer_schema_length=0).with_columns(pl.lit("x").alias("comment"))
    with pytest.raises(RecipeTableError) as pure:
        parse_table(TABLES["micro_batch"], extra)
    assert (pure.value.line, pure.value.column) == (1, "comment") and "only the table's columns" in pure.value.reason


def test_a_ragged_row_a_missing_file_and_a_stray_file_are_refused(tmp_path):
    root = _root(tmp_path / "ragged")
    path = root / "recipes" / "expert_tp.csv"
    _rewrite(path, lambda lines: [*lines[:2], "26.10,1\n", *lines[2:]])
    err = _refused(root)
    assert (err.file, err.line) == (str(path), 3) and "expected 3 fields" in err.reason
    root = _root(tmp_path / "missing")
    (root / "recipes" / "sharding.csv").unlink()
    assert _refused(root).reason == "file not found"
    root = _root(tmp_path / "stray")
    (root / "recipes" / "memory_old.csv").write_text("a,b\n1,2\n")
    err = _refused(root)
    assert err.file.endswith("memory_old.csv") and "not a recipe table" in err.reason


def test_the_pure_parser_counts_lines_without_a_line_column():
    """`recipes_from_frames` on frames without `_line` (built in code): row i is line i + 2, as in a file."""
    frames = {name: catalog.read_recipe_csv(FOLDER / f"{name}.csv", LINE_COLUMN).drop(LINE_COLUMN)
              for name in TABLES}
    assert recipes_from_frames(frames, catalog.stacks(MEASUREMENTS)) == catalog.recipes(MEASUREMENTS)
    frames["expert_tp"] = frames["expert_tp"].with_columns(
        pl.when(pl.col("container") == "26.02").then(pl.lit("0")).otherwise(pl.col("etp")).alias("etp"))
    with pytest.raises(RecipeTableError) as err:
        recipes_from_frames(frames, catalog.stacks(MEASUREMENTS))
    assert (err.value.table, err.value.line, err.value.column) == ("expert_tp", 4, "etp")
    with pytest.raises(RecipeTableError, match="expected the table"):
        recipes_from_frames({k: v for k, v in frames.items() if k != "memory"}, catalog.stacks(MEASUREMENTS))
