"""Named architectures and hardware for the CLI, read straight from measurements/ (no store needed).

Names resolve the same way everywhere (`--model`, `--gpu`, a measurement file's `model_name` and `gpu`, the
store's `runs` table): `normalize_name` drops case, spaces, `-`, `_`, `.` and brackets, so `DeepSeek-V3`,
`deepseekv3` and `DeepSeekV3` are one name, as are `LLAMA3_70B`, `Llama 3 70B`, `Llama 3 (70B)` and `llama3-70b`.

* An architecture is found by its id, its name or one of its `aliases` (`|`-separated), first with the dots kept
  (`GPT-3 13B` and `GPT-3 1.3B` differ only by one; `Llama-3.1-70B` matches `Llama 3.1 70B`), then with them
  dropped. A key that two rows share at the first level is ambiguous and resolves to neither (the shipped table
  has none; tests/test_names.py checks); one they share only without dots is left to the first level.
* A run's model_name that names none (`stepcast predict --runs`) is tried again without its parameter-size token
  (`DeepSeek V3 671B` -> deepseek-v3), only when the rest names one architecture whose params_b is within 15% of
  that size (`arch_ids_without_size`; `8x7B` and `A22B` are not size tokens); the reading is stated in the run's
  assumptions.
* Hardware is found by its id or name; failing that, by words: every word of the query must start a word of
  the row's id or name (`H100 SXM` -> h100-sxm5-80gb, `A100 40GB` -> a100-sxm4-40gb). When several rows fit
  and they differ only in form factor or memory size (`A100` fits a100-sxm4-40gb, a100-sxm4-80gb and
  a100-pcie-80gb), the documented default is the SXM/OAM part before a PCIe card, then the one with the most
  memory (`choose_default_variant`), and a note names the other candidates. Rows that differ otherwise
  (`TPU`, `MI3`, `Blackwell`) are an error listing the candidates. A count written with the name (`8x A100`) or a
  TPU slice's size (`v5p-128`, `v5litepod-256`) is set apart with a note (`stepcast predict --runs` reads n_gpus
  from it where the run states none: `accelerator_count`, `resolve_gpu_cells`); a model number is not read as a
  longer one (`H20` is no H200) nor as NVIDIA's S, Ti or Super part of it (`L40` is no L40S, `GTX 1080` no 1080 Ti).
"""

from __future__ import annotations

import csv
import difflib
import io
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from models.arch.archfile import (
    ArchFileError,
    architecture_from_mapping,
    hardware_from_mapping,
)
from models.core.limits import JSONRefused, strict_json
from models.core.tables import LINE_COLUMN
from pipeline.readers import FileRejected, _decode
from pipeline.settings import Settings

if TYPE_CHECKING:
    from models.corpus.recipes import Recipes
    from models.memory.stacks import Stacks

ARCH_MODEL_COLUMNS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab", "activation",
                      "n_experts", "top_k", "expert_ffn_dim", "n_shared_experts", "n_dense_layers", "tied_embeddings")
#: hybrid Mamba-Transformer columns (models.arch.mamba) carried to the model for rows that have a layer_pattern
ARCH_HYBRID_COLUMNS = ("layer_pattern", "mamba_state_dim", "mamba_n_heads", "mamba_head_dim", "mamba_n_groups",
                       "mamba_chunk_size", "mamba_conv_kernel", "shared_expert_ffn_dim", "moe_latent_size",
                       "mamba_dt_rank", "mamba_expand")
#: Multi-head Latent Attention shape and multi-token-prediction depth (models.arch.mla), carried for every row (empty:
#: not MLA, no MTP)
ARCH_MLA_COLUMNS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "mtp_layers")

#: characters a name comparison ignores: spaces, '.', '_', '-' and brackets ("GPT-3 (175B)" is "GPT-3 175B"). The
#: same class is used by Python's re, polars and the store's SQL (DuckDB's RE2, pipeline/store.py `_norm_sql`), which
#: all read `\[` and `\]` in a class alike; tests/test_names.py checks the three agree
NAME_IGNORED = r"[ \t\r\n._()\[\]-]"
_IGNORED_RE = re.compile(NAME_IGNORED)
#: the first level of a model-name comparison keeps dots (a decimal point tells 1.3B from 13B)
NAME_IGNORED_KEEP_DOTS = r"[ \t\r\n_()\[\]-]"
_IGNORED_KEEP_DOTS_RE = re.compile(NAME_IGNORED_KEEP_DOTS)
#: the second level drops dots ("Qwen2.5" is "qwen25"), but not a size's decimal point: "1.3B" reads "1p3b", so
#: "Cerebras-GPT-1.3B" or "Baichuan 2 1.3B" never meets a 13B row; applied after lower-casing, before
#: NAME_IGNORED, alike in Python, polars and the store's SQL
DECIMAL_SIZE = r"(\d)\.(\d+)\s*([bmkt])\b"
_DECIMAL_SIZE_RE = re.compile(DECIMAL_SIZE)
_WORD_RE = re.compile(r"[a-z0-9]+")
#: words that only tell variants of one chip apart: form factor and memory size (`nvl` alone: the H100 NVL card)
VARIANT_WORD_RE = re.compile(r"^(sxm\d*|pcie|oam|\d+gb|hbm\w*|nvl\d*)$")
#: words that name a vendor, a system or a memory technology rather than the chip: `nvidia-smi` prints
#: "NVIDIA H100 80GB HBM3", ROCm "AMD Instinct MI300X", clouds "HGX H100", "DGX A100" or "AWS Trainium2"; a name whose words do not
#: all fit a row is tried again without them
NOISE_WORDS = frozenset({"nvidia", "amd", "instinct", "intel", "habana", "google", "cloud", "tesla", "geforce",
                         "dgx", "hgx", "gpu", "gpus", "accelerator", "hbm", "hbm2", "hbm2e", "hbm3", "hbm3e",
                         "gddr5", "gddr6", "gddr6x", "board", "module", "aws", "amazon"})
#: words naming an interconnect, not a chip or its variant, dropped before matching: "H100 (NVLink)" is an
#: NVLink-connected H100, no H100 NVL card (whose "nvl" the word would otherwise fit)
INTERCONNECT_WORDS = frozenset({"nvlink", "nvswitch", "infiniband", "roce"})
#: a cloud instance's size word ("48xlarge", "xlarge", "metal")
INSTANCE_SIZE_RE = re.compile(r"\d*x?large|metal")


class UnknownName(ValueError):
    pass


def normalize_name(name: str | None, keep_dots: bool = False) -> str:
    """A name as compared: lower case, without spaces, '-', '_', '(', ')', '[', ']' and (unless `keep_dots`) '.',
    a size's decimal point then read as 'p' (`DECIMAL_SIZE`)."""
    low = str(name or "").strip().lower()
    if keep_dots:
        return _IGNORED_KEEP_DOTS_RE.sub("", low)
    return _IGNORED_RE.sub("", _DECIMAL_SIZE_RE.sub(r"\1p\2\3", low))


def normalize_expr(col: str | pl.Expr, keep_dots: bool = False) -> pl.Expr:
    """`normalize_name` as a polars expression."""
    expr = pl.col(col) if isinstance(col, str) else col
    low = expr.cast(pl.Utf8).str.strip_chars().str.to_lowercase()
    if keep_dots:
        return low.str.replace_all(NAME_IGNORED_KEEP_DOTS, "")
    return low.str.replace_all(DECIMAL_SIZE, "${1}p${2}${3}").str.replace_all(NAME_IGNORED, "")


@lru_cache(maxsize=4)
def architectures(measurements: Path) -> pl.DataFrame:
    return pl.read_csv(measurements / "architectures.csv", infer_schema_length=None)


@lru_cache(maxsize=4)
def hardware(measurements: Path) -> pl.DataFrame:
    return pl.read_csv(measurements / "hardware_specs.csv", infer_schema_length=None)


#: the folder of the recipe tables under a measurements root: one CSV per table of models.corpus.recipes.TABLES
RECIPES_FOLDER = "recipes"


def read_recipe_csv(path: Path, line_column: str) -> pl.DataFrame:
    """A recipe or stack table's cells as text (empty -> null) with the file line of each row in `line_column`;
    raises FileRejected for a file that is absent or unreadable (a bad byte named by line and column, as the
    measurement files' `pipeline.readers._decode` names it) or has a row of another width than its header."""
    if not path.exists():
        raise FileRejected(str(path), "file not found")
    try:
        text = _decode(str(path), path.read_bytes())
    except OSError as err:
        raise FileRejected(str(path), f"unreadable CSV: {err}") from None
    try:
        reader = csv.reader(io.StringIO(text, newline=""))
        header = next(reader, None)
        if not header:
            raise FileRejected(str(path), "expected a header line naming the table's columns", line=1)
        rows, lines = [], []
        for row in reader:
            if not row:  # a blank line
                continue
            if len(row) != len(header):
                raise FileRejected(str(path), f"expected {len(header)} fields (the header's), got {len(row)}",
                                   line=reader.line_num)
            rows.append([cell if cell != "" else None for cell in row])
            lines.append(reader.line_num)
    except csv.Error as err:
        raise FileRejected(str(path), f"unreadable CSV: {err}") from None
    frame = pl.DataFrame(rows, schema={c: pl.Utf8 for c in header}, orient="row") if rows else \
        pl.DataFrame(schema={c: pl.Utf8 for c in header})
    return frame.with_columns(pl.Series(line_column, lines, dtype=pl.Int64))


#: the stack tables under a measurements root (models.memory.stacks): one row per training stack, one per word
STACKS_FILE = "stacks.csv"
STACK_WORDS_FILE = "stack_words.csv"


@lru_cache(maxsize=4)
def stacks(measurements: Path) -> Stacks:
    """The training stacks runs may name and the words they write for them (models.memory.stacks.Stacks), from
    `measurements`/stacks.csv and stack_words.csv, read and checked once per measurements root. A malformed file
    raises FileRejected naming the file, the line and column, and what was expected."""
    # start-up time: the tables' checks read the model's vocabulary (numpy), loaded when runs are predicted only
    from models.memory.stacks import (
        STACK_TABLE,
        WORD_TABLE,
        StackTableError,
        stacks_from_frames,
    )

    paths = {STACK_TABLE: Path(measurements) / STACKS_FILE, WORD_TABLE: Path(measurements) / STACK_WORDS_FILE}
    frames = {name: read_recipe_csv(path, LINE_COLUMN) for name, path in paths.items()}
    try:
        return stacks_from_frames(frames[STACK_TABLE], frames[WORD_TABLE])
    except StackTableError as err:
        raise FileRejected(str(paths[err.table]), err.reason, line=err.line, column=err.column) from None


@lru_cache(maxsize=4)
def recipes(measurements: Path) -> Recipes:
    """What the named recipes of measured runs set (models.corpus.recipes.Recipes), from the CSVs of
    `measurements`/recipes/ (one per table of models.corpus.recipes.TABLES), read and checked once per measurements
    root, checked against the root's stacks (`stacks`), which the `Recipes` carries. A malformed file raises
    FileRejected naming the file, the line and column, and what was expected."""
    # start-up time: the tables' checks read the model's vocabulary (numpy), loaded when runs are predicted only
    from models.corpus.recipes import TABLES, RecipeTableError, recipes_from_frames

    folder = Path(measurements) / RECIPES_FOLDER
    paths = {name: folder / f"{name}.csv" for name in TABLES}
    for extra in sorted(folder.glob("*.csv")):
        if extra.stem not in TABLES:
            raise FileRejected(str(extra), f"not a recipe table: expected one of {', '.join(TABLES)}")
    frames = {name: read_recipe_csv(path, LINE_COLUMN) for name, path in paths.items()}
    known = stacks(measurements)
    try:
        return recipes_from_frames(frames, known)
    except RecipeTableError as err:
        raise FileRejected(str(paths.get(err.table, folder / f"{err.table}.csv")), err.reason, line=err.line,
                           column=err.column) from None


def _instance_key(name) -> str:
    """An instance type as the tables and `resolve_gpu` compare it: `normalize_name` with dots kept, without a count
    or host-VM note ("a4-highgpu-8g" for "a4-highgpu-8g + 8x B200 (...)")."""
    return normalize_name(re.split(r"\s[(+]", str(name))[0], keep_dots=True)


@lru_cache(maxsize=1)
def _instance_rows() -> tuple[list[tuple[str, str, int]], dict[str, tuple[float, str]], frozenset[str]]:
    """Each file read once: (instance key, accelerator id, accelerators per instance) from
    measurements/cloud_prices.csv and from instance_networks.csv (its types and their aliases), per key of the
    latter whose network is given (scale-out GB/s per accelerator, source), and the keys the latter lists (a row
    with an empty gpu_network_gbps names a type and its accelerators, its network unsourced). Empty where a file
    is absent."""
    rows, nets, listed = [], {}, set()
    path = _default_measurements() / "cloud_prices.csv"
    if path.exists():
        prices = pl.read_csv(path, columns=["accelerator_id", "instance_type", "accelerator_count"],
                             infer_schema_length=0).unique()
        rows += [(key, aid, int(count) if count else 0) for aid, inst, count in prices.iter_rows()
                 if (key := _instance_key(inst)) and "*" not in key]
    path = _default_measurements() / "instance_networks.csv"
    if path.exists():
        for line, r in enumerate(pl.read_csv(path, infer_schema_length=0).to_dicts(), start=2):
            for col in ("instance_type", "accelerator_id", "accelerators", "gpu_network_gbps"):
                cell = str(r.get(col) or "").strip()
                number = col in ("accelerators", "gpu_network_gbps")
                if col == "gpu_network_gbps" and not cell:  # the type is known, its network is not sourced
                    continue
                if not cell or (number and not (re.fullmatch(r"\d+(\.\d+)?", cell) and float(cell) > 0)):
                    raise UnknownName(f"{path}: line {line}, column {col}: expected "
                                      f"{'a number > 0' if number else 'a value'}, got {cell!r}")
            per = int(float(r["accelerators"]))
            gbps = str(r.get("gpu_network_gbps") or "").strip()
            for name in [r["instance_type"], *str(r.get("aliases") or "").split("|")]:
                if name.strip():
                    key = _instance_key(name)
                    rows.append((key, r["accelerator_id"], per))
                    listed.add(key)
                    if gbps:
                        nets[key] = (float(gbps) / 8.0 / per, r["source"])
    return rows, nets, frozenset(listed)


def _agreed(pairs) -> dict:
    """{key: value} of (key, value) pairs, without a key the pairs give two values for."""
    out: dict = {}
    for key, value in pairs:
        out[key] = value if out.get(key, value) == value else None
    return {k: v for k, v in out.items() if v}


@lru_cache(maxsize=1)
def cloud_instance_types() -> dict[str, str]:
    """Cloud instance types (AWS p5.48xlarge, GCP a3-highgpu-8g, Azure's ND H100 v5, ...; `_instance_key`) -> the
    accelerator id they carry, from measurements/cloud_prices.csv (the skypilot-catalog rows it was built from) and
    instance_networks.csv; a type naming two accelerators names neither. Empty when the files are absent."""
    return _agreed((key, aid) for key, aid, _ in _instance_rows()[0])


@lru_cache(maxsize=1)
def instance_accelerators() -> dict[str, int]:
    """Cloud instance types (`_instance_key`) -> the accelerators one instance holds, from
    measurements/cloud_prices.csv (`accelerator_count`) and instance_networks.csv (`accelerators`); a type the
    tables give two counts for is left out."""
    return _agreed((key, count) for key, _, count in _instance_rows()[0])


def instance_networks() -> dict[str, tuple[float, str]]:
    """Cloud instance types and their aliases (`_instance_key`) -> (scale-out GB/s per accelerator, source): the
    accelerator-to-accelerator network of the instance (Gbit/s) over its accelerators, from
    measurements/instance_networks.csv (the cloud's own pages). Empty when the file is absent."""
    return _instance_rows()[1]


def instance_network(name: str | None) -> tuple[float, str] | None:
    """(scale-out GB/s per accelerator, note) of a cloud instance type a hardware cell names, or None."""
    if name is None:
        return None
    bare = split_count(str(name))[1]  # "16x p4d.24xlarge": sixteen of them, each with its network
    if (net := instance_networks().get(_instance_key(bare))) is None:
        return None
    return net[0], f"inter_node_bw_gbps={net[0]:g} GB/s per accelerator: the network of {bare.strip()} " \
                   f"(measurements/instance_networks.csv)"


def _suggest(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name.lower(), options, n=3, cutoff=0.5)
    return f" Did you mean {', '.join(close)}?" if close else ""


# ---------------------------------------------------------------- architectures

def _raw_arch_names(arch: pl.DataFrame, ids: bool = True) -> pl.DataFrame:
    """Every (`id`, `name`) pair of the table as written: (ids,) names and aliases."""
    return pl.concat([
        *([arch.select("id", pl.col("id").alias("name"))] if ids else []),
        arch.select("id", pl.col("name").cast(pl.Utf8)),
        arch.select("id", pl.col("aliases").cast(pl.Utf8).fill_null("").str.split("|").alias("name"))
        .explode("name"),
    ])


def _arch_names(arch: pl.DataFrame, keep_dots: bool = False) -> pl.DataFrame:
    """Every (normalized name `key`, `id`) pair of the table: ids, names and aliases."""
    return _raw_arch_names(arch).select(normalize_expr("name", keep_dots).alias("key"), "id").filter(
        pl.col("key") != "").unique()


def _read_as(res: pl.DataFrame, hit: pl.Expr, found: str, note: pl.Expr, out: str) -> pl.DataFrame:
    """`res` with `out` set to column `found` and `model_name_note` to `note` where `hit` (a fallback reading of a
    model name; the other rows keep theirs)."""
    old_note = pl.col("model_name_note") if "model_name_note" in res.columns else pl.lit(None, dtype=pl.Utf8)
    return res.with_columns(pl.when(hit).then(pl.col(found)).otherwise(pl.col(out)).alias(out),
                            pl.when(hit).then(note).otherwise(old_note).alias("model_name_note"))


def arch_name_keys(arch: pl.DataFrame, keep_dots: bool = False) -> pl.DataFrame:
    """One row per normalized name (`key`) of an architecture and its `id`: ids, names and aliases. Keys that
    two architectures share are left out (they would be ambiguous)."""
    keys = _arch_names(arch, keep_dots)
    return keys.filter(pl.col("key").is_unique()).sort("key")


def ambiguous_arch_keys(arch: pl.DataFrame, keep_dots: bool = True) -> dict[str, list[str]]:
    """Normalized names that more than one architecture claims, with the ids (empty for the shipped table at the
    first level, dots kept)."""
    dup = _arch_names(arch, keep_dots).group_by("key").agg(pl.col("id").sort()).filter(pl.col("id").list.len() > 1)
    return {r["key"]: r["id"] for r in dup.iter_rows(named=True)}


def ids_by_name(frame: pl.DataFrame, names: pl.Expr, keys_dots: pl.DataFrame, keys: pl.DataFrame,
                out: str = "arch_id") -> pl.DataFrame:
    """`frame` with `out`: the id each of `names` resolves to (null: none), looked up first with dots kept in
    `keys_dots`, then without in `keys` (frames of unique `key`, `id`): `find_architecture`'s rule, vectorized."""
    k1 = keys_dots.select(pl.col("key").alias("_k1"), pl.col("id").alias("_id1"))
    k2 = keys.select(pl.col("key").alias("_k2"), pl.col("id").alias("_id2"))
    return (frame.with_columns(normalize_expr(names, keep_dots=True).alias("_k1"), normalize_expr(names).alias("_k2"))
            .join(k1, on="_k1", how="left").join(k2, on="_k2", how="left")
            .with_columns(pl.coalesce("_id1", "_id2").alias(out)).drop("_k1", "_k2", "_id1", "_id2"))


def arch_ids(names: pl.Expr, arch: pl.DataFrame, frame: pl.DataFrame, out: str = "arch_id") -> pl.DataFrame:
    """`frame` with `out`: the architecture id each of `names` resolves to (null: none; `ids_by_name`)."""
    return ids_by_name(frame, names, arch_name_keys(arch, keep_dots=True), arch_name_keys(arch), out)


def find_architecture(measurements: Path, name: str) -> dict:
    """The architecture row `name` means (`--model`): its id, name or alias (dots kept first, then dropped), else
    the lenient readings a measurement file's `model_name` gets (`lenient_arch_ids`: without its size token, a
    checkpoint's base name, the one architecture of that name), so one name reads alike on every path."""
    arch = architectures(measurements)
    for keep_dots in (True, False):
        key = normalize_name(name, keep_dots)
        clash = ambiguous_arch_keys(arch, keep_dots).get(key)
        if clash:
            raise UnknownName(f"model '{name}' is ambiguous: it names {', '.join(clash)} in "
                              f"measurements/architectures.csv; give one of these ids")
        hit = arch_name_keys(arch, keep_dots).filter(pl.col("key") == key)
        if hit.height == 1:
            return arch.filter(pl.col("id") == hit["id"][0]).row(0, named=True)
    res = lenient_arch_ids(pl.DataFrame({"model_name": [name], "arch_id": [None]},
                                        schema={"model_name": pl.Utf8, "arch_id": pl.Utf8}), arch)
    if (one := res["arch_id"][0]) is not None:
        return arch.filter(pl.col("id") == one).row(0, named=True)
    why = res["model_name_error"][0] if "model_name_error" in res.columns else None
    raise UnknownName(f"unknown model '{name}': " + (f"{why}. " if why else "") +
                      "expected an id, name or alias from measurements/architectures.csv "
                      "(e.g. gpt3-175b, llama3-70b, DeepSeek-V3; `stepcast list models` prints them all)."
                      f"{_suggest(name.strip().lower(), arch['id'].to_list())}")


def lenient_arch_ids(frame: pl.DataFrame, arch: pl.DataFrame) -> pl.DataFrame:
    """`frame` (`model_name`, `arch_id`) where `arch_id` is still empty: the readings after the exact one, in
    order: the name without its size token (`arch_ids_without_size`), its checkpoint's base name
    (`_checkpoint_ids`), the one architecture of that name (`_sizeless_ids`); each noted in `model_name_note`."""
    return _sizeless_ids(_checkpoint_ids(arch_ids_without_size(frame, arch), arch), arch)


def _fill_by_arch_id(runs: pl.DataFrame, arch: pl.DataFrame, columns) -> pl.DataFrame:
    """`runs` (with `arch_id`) with `columns` of the architecture table filled where the run leaves them empty (added
    where it lacks them), and the table's stated size as `arch_params_b` (the hybrid completeness check of
    models.corpus.runs_adapter), joined by `arch_id`."""
    fill = [c for c in columns if c in arch.columns]
    src = [*fill, *(["params_b"] if "params_b" in arch.columns and "params_b" not in fill else [])]
    out = runs.join(arch.select("id", *src).rename({c: f"_a_{c}" for c in src}), left_on="arch_id", right_on="id",
                    how="left")
    exprs = [(pl.coalesce(pl.col(c), pl.col(f"_a_{c}").cast(out.schema[c], strict=False)) if c in runs.columns
              else pl.col(f"_a_{c}")).alias(c) for c in fill]
    if "params_b" in arch.columns:
        exprs.append(pl.col("_a_params_b").cast(pl.Float64, strict=False).alias("arch_params_b"))
    return out.with_columns(exprs).drop([c for c in out.columns if c.startswith("_a_")])


def with_architecture_extras(runs: pl.DataFrame, arch: pl.DataFrame) -> pl.DataFrame:
    """`runs` (the store's table, with `arch_id`) plus the architecture columns its SQL does not carry: the hybrid
    block pattern and Mamba shape (`ARCH_HYBRID_COLUMNS`), the MLA shape and MTP depth (`ARCH_MLA_COLUMNS`) and
    `arch_params_b`."""
    if "arch_id" not in runs.columns or "id" not in arch.columns:
        return runs
    return _fill_by_arch_id(runs, arch, (*ARCH_HYBRID_COLUMNS, *ARCH_MLA_COLUMNS))


#: a parameter-size token of a model name, a word of its own ("671B", "7b", "2.7B", "125M", "1T"): the "7B" of
#: "8x7B" (Mixtral) or "A22B" (Qwen3's active size) is not one, so those stay part of the name
SIZE_TOKEN = r"\b(\d+(?:\.\d+)?)\s*([bmt])\b"
#: the token's unit in billions of parameters
SIZE_UNIT_B = {"b": 1.0, "m": 1e-3, "t": 1e3}
#: how far a name's size token may be from the architecture's `params_b` for the name without it to mean that
#: architecture (nominal sizes are rounded: Llama 3 "8B" is 8.03 B, Nemotron 3 Nano "30B" 31.6 B)
NAME_SIZE_TOLERANCE = 0.15



def name_size_b(name: pl.Expr) -> pl.Expr:
    """The parameter size a (lower-case) model name states by its size token (`SIZE_TOKEN`), in billions; null
    without one ("llama 2 70b" -> 70.0)."""
    return (name.str.extract(SIZE_TOKEN, 1).cast(pl.Float64, strict=False)
            * name.str.extract(SIZE_TOKEN, 2).replace_strict(SIZE_UNIT_B, default=None, return_dtype=pl.Float64))


def arch_ids_without_size(frame: pl.DataFrame, arch: pl.DataFrame, names: str = "model_name",
                          out: str = "arch_id") -> pl.DataFrame:
    """`frame` where `out` is empty: the architecture `names` resolves to once its parameter-size token
    (`SIZE_TOKEN`) is dropped, when the rest names exactly one architecture (`arch_ids`) whose `params_b` is within
    NAME_SIZE_TOLERANCE of the dropped size ("DeepSeek V3 671B" -> deepseek-v3), with `model_name_note` saying so;
    where the rest names one whose size differs more, `out` stays empty and `model_name_error` says why."""
    low = pl.col(names).cast(pl.Utf8).str.to_lowercase()
    size_b = name_size_b(low)
    sizes = arch.select(pl.col("id").alias("_wo_id"), pl.col("params_b").cast(pl.Float64, strict=False)
                        .alias("_wo_params_b"))
    res = arch_ids(low.str.replace(SIZE_TOKEN, " ").str.replace_all(r"\(\s*\)", " "), arch,
                   frame.with_columns(size_b.alias("_size_b")), "_wo_id")
    res = res.join(sizes, on="_wo_id", how="left")
    todo = pl.col(out).is_null() & pl.col("_size_b").is_not_null() & pl.col("_wo_id").is_not_null()
    close = (pl.col("_wo_params_b") / pl.col("_size_b") - 1.0).abs() <= NAME_SIZE_TOLERANCE
    size_text = pl.col("_size_b").round(3).cast(pl.Utf8).str.replace(r"\.0$", "")
    arch_text = pl.col("_wo_params_b").round(3).cast(pl.Utf8).str.replace(r"\.0$", "")
    return res.with_columns(
        pl.when(todo & close).then(pl.col("_wo_id")).otherwise(pl.col(out)).alias(out),
        pl.when(todo & close).then(pl.format("model '{}' read as {} (the name without its size, {} B; the "
                                             "architecture table states {} B)", pl.col(names), pl.col("_wo_id"),
                                             size_text, arch_text)).alias("model_name_note"),
        pl.when(todo & ~close.fill_null(False)).then(pl.format(
            "'{}' without its size names {}, whose {} B parameters are not within {}% of {} B", pl.col(names),
            pl.col("_wo_id"), arch_text, pl.lit(round(100 * NAME_SIZE_TOLERANCE)), size_text))
        .alias("model_name_error"),
    ).drop("_size_b", "_wo_id", "_wo_params_b")


#: what a checkpoint's name adds to its architecture's: the hub organisation ("meta-llama/", "EleutherAI/") and
#: trailing words naming a format, a fine-tune or a re-release of the same shape ("-hf" conversions, "-base",
#: "-instruct", "-chat", "-it", "-sft", a dotted release version "-v0.1" and a four-digit release date "-2507" as in
#: Mistral-7B-Instruct-v0.1 or Qwen3-30B-A3B-Instruct-2507; an undotted "V3" names a model, not a release);
#: dropped (`checkpoint_base_name`) when the full name resolves to no architecture
CHECKPOINT_PREFIX = r"^.*/"
CHECKPOINT_SUFFIX = r"(?i)([-_ .](hf|base|instruct|chat|it|sft|v\d+(\.\d+)+|\d{4}))+$"


def checkpoint_base_name(name: pl.Expr | str) -> pl.Expr | str:
    """A model name without its hub organisation and its checkpoint suffixes ("meta-llama/Llama-2-13b-chat-hf" ->
    "Llama-2-13b"); a string or a polars expression."""
    if isinstance(name, str):
        return re.sub(CHECKPOINT_SUFFIX, "", re.sub(CHECKPOINT_PREFIX, "", name.strip()))
    return name.cast(pl.Utf8).str.strip_chars().str.replace(CHECKPOINT_PREFIX, "").str.replace(CHECKPOINT_SUFFIX, "")


def _checkpoint_ids(frame: pl.DataFrame, arch: pl.DataFrame, names: str = "model_name",
                    out: str = "arch_id") -> pl.DataFrame:
    """`frame` where `out` is still empty: the architecture its checkpoint's base name (`checkpoint_base_name`)
    names, exactly or without its size token, noted in `model_name_note`."""
    if frame.filter(pl.col(out).is_null() & pl.col(names).is_not_null()).height == 0:
        return frame
    base = frame.select(pl.col(names), checkpoint_base_name(pl.col(names)).alias("_ck_name")).unique(names)
    base = arch_ids(pl.col("_ck_name"), arch, base, "_ck_id")
    base = arch_ids_without_size(base, arch, "_ck_name", "_ck_id").select(names, "_ck_name", "_ck_id")
    res = frame.join(base, on=names, how="left", nulls_equal=False)
    todo = pl.col(out).is_null() & pl.col("_ck_id").is_not_null()
    note = pl.format("model '{}' read as {} (its checkpoint name without the hub organisation and format, "
                     "fine-tune or release suffixes: '{}')", pl.col(names), pl.col("_ck_id"), pl.col("_ck_name"))
    if "model_name_error" in res.columns:  # the checkpoint's base name answered: the size complaint is moot
        res = res.with_columns(pl.when(todo).then(None).otherwise(pl.col("model_name_error")).alias("model_name_error"))
    return _read_as(res, todo, "_ck_id", note, out).drop("_ck_name", "_ck_id")


def _sizeless_ids(frame: pl.DataFrame, arch: pl.DataFrame, names: str = "model_name",
                  out: str = "arch_id") -> pl.DataFrame:
    """`frame` where `out` is still empty and the name carries no size: the architecture whose name or alias reads
    the same once its own size token is dropped ("Chinchilla" -> chinchilla-70b, "Gopher" -> gopher-280b), when
    exactly one architecture reads so (a family of several sizes, "Llama" or "GPT-3", stays unresolved), noted in
    `model_name_note`."""
    todo = pl.col(out).is_null() & pl.col(names).is_not_null() & \
        ~pl.col(names).cast(pl.Utf8).str.to_lowercase().str.contains(SIZE_TOKEN)
    if frame.filter(todo).height == 0:
        return frame
    raw = _raw_arch_names(arch, ids=False)
    has_size = pl.col("name").str.to_lowercase().str.contains(SIZE_TOKEN)
    keys = (raw.filter(has_size).select(
        normalize_expr(pl.col("name").str.to_lowercase().str.replace(SIZE_TOKEN, " ")).alias("_key"), "id")
        .unique().filter(pl.col("_key") != ""))
    taken = set(_arch_names(arch)["key"].to_list())  # a key some architecture already has in full
    keys = keys.filter(pl.col("_key").is_unique() & ~pl.col("_key").is_in(list(taken)))
    res = frame.with_columns(normalize_expr(pl.col(names)).alias("_key")).join(
        keys.rename({"id": "_sl_id"}), on="_key", how="left")
    hit = todo & pl.col("_sl_id").is_not_null()
    note = pl.format("model '{}' read as {} (the one architecture of that name, of any size)", pl.col(names),
                     pl.col("_sl_id"))
    return _read_as(res, hit, "_sl_id", note, out).drop("_key", "_sl_id")


def fill_from_architectures(runs: pl.DataFrame, measurements: Path) -> pl.DataFrame:
    """Fill empty architecture columns (and an empty `arch`) of run rows from the architecture the run's
    model_name names (id, name or alias, compared by `normalize_name`; the rule the store's `runs` table
    applies), else the one it names without its parameter-size token when that architecture has about that size
    (`arch_ids_without_size`: the lenient predict path only; the store's table keeps the exact rule)."""
    arch = architectures(measurements)
    out = lenient_arch_ids(arch_ids(pl.col("model_name"), arch, runs.drop("arch_id", strict=False)), arch)
    if "arch" in out.columns:  # an architecture's id or alias written in `arch` (a family word there otherwise)
        out = arch_ids(pl.col("arch"), arch, out, "_arch_as_id")
        named = pl.col("_arch_as_id").is_not_null()  # the family then comes from the table
        out = out.with_columns(pl.coalesce("arch_id", "_arch_as_id").alias("arch_id"),
                               pl.when(named).then(None).otherwise(pl.col("arch")).alias("arch")).drop("_arch_as_id")
    return _fill_by_arch_id(out, arch, ("arch", *ARCH_MODEL_COLUMNS, *ARCH_HYBRID_COLUMNS,
                                                          *ARCH_MLA_COLUMNS))


# ---------------------------------------------------------------- hardware

def _words(*texts) -> list[str]:
    return [w for t in texts for w in _WORD_RE.findall(str(t or "").lower())]


def choose_default_variant(rows: list[dict]) -> dict:
    """The documented default among variants of one chip: an SXM/OAM/superchip part before a PCIe card, then
    the most memory, then the latest release."""
    def rank(r: dict) -> tuple:
        pcie = "pcie" in _words(r.get("id"), r.get("form_factor"))
        return (pcie, -float(r.get("memory_gb") or 0), -float(r.get("release_year") or 0), r["id"])
    return sorted(rows, key=rank)[0]


#: NVIDIA's marks of another, faster product under the same model number: an appended "S" (L40S, V100S) and the
#: words "Ti" and "Super" (GTX 1080 Ti). A name without the mark is not read as the marked part: the L40 is not an
#: L40S (NVIDIA's datasheets give the L40S about twice the L40's dense FP16 tensor rate)
TIER_SUFFIX = "s"
TIER_WORDS = frozenset({"ti", "super"})
#: a Cloud TPU slice as its accelerator type names it ("v5p-128", "TPU v4-256", "v5litepod-256", "v6e-256",
#: "Trillium 256"): the generation and the number after it
TPU_SLICE_RE = re.compile(r"^\s*(?:(?:google\s+)?(?:cloud\s+)?tpu[\s_-]*)?"
                          r"(v2|v3|v4|v5p|v5e|v5litepod|v5lite|v6e|trillium)[\s_-]+(\d+)\s*$", re.IGNORECASE)
#: what a slice name's number counts, per chip: TensorCores, 2 a chip, on v2, v3, v4 and v5p ("v4-256" is 128
#: chips), chips on v5e and v6e ("v5litepod-256", "v6e-256": 256 chips) (Google Cloud TPU docs: TPU versions and
#: accelerator types), and the generation's name in the hardware table
TPU_SLICE_UNIT = {"v2": (2, "TPU v2"), "v3": (2, "TPU v3"), "v4": (2, "TPU v4"), "v5p": (2, "TPU v5p"),
                  "v5e": (1, "TPU v5e"), "v5litepod": (1, "TPU v5e"), "v5lite": (1, "TPU v5e"),
                  "v6e": (1, "TPU v6e"), "trillium": (1, "TPU v6e")}
#: Google's other name for the v5e, without a slice size ("TPU v5 lite", "v5litepod"; the Cloud TPU docs' accelerator
#: types spell it v5litepod)
TPU_V5_LITE_RE = re.compile(r"^\s*(?:google\s+)?(?:cloud\s+)?(?:tpu[\s_-]*)?v5[\s_-]*lite(?:[\s_-]*pod)?\s*$",
                            re.IGNORECASE)
#: GPUs in one system a hardware cell counts ("4 x DGX H100"): NVIDIA DGX/HGX systems hold 8 (DGX H100, DGX B200
#: datasheets: 8 GPUs), the DGX-2 16 (16 V100). A Grace Blackwell system (GB200/GB300) is counted by its NVLink
#: domain instead ("GB200 NVL72": 72 GPUs)
GPUS_PER_SYSTEM = ((re.compile(r"\bdgx[\s-]?2h?\b", re.IGNORECASE), 16, "a DGX-2 holds 16"),
                   (re.compile(r"\b[dh]gx\b", re.IGNORECASE), 8, "a DGX/HGX system holds 8"))
#: an NVLink domain named by its GPU count ("GB200 NVL72", "GB300 NVL72", "NVL36", "GB200 NVL4"); "H100 NVL" (no
#: number) is a PCIe card, not a domain
NVL_DOMAIN_RE = re.compile(r"\bnvl(\d+)\b", re.IGNORECASE)
#: a count written with the accelerator, before or after it ("8x A100", "8xA100", "8 × H100", "H100 x8")
_LEADING_COUNT_RE = re.compile(r"^\s*(\d+)\s*[x×]\s*(?=\S)(.*)$", re.IGNORECASE)
_TRAILING_COUNT_RE = re.compile(r"^(.*\S)\s+[x×]\s*(\d+)\s*$", re.IGNORECASE)


def split_count(text: str) -> tuple[int | None, str]:
    """(the count written with an accelerator, the rest): "8x H100 SXM" -> (8, "H100 SXM"), "H100 x8" -> (8,
    "H100"), "H100" -> (None, "H100")."""
    text = str(text or "").strip()
    if m := _LEADING_COUNT_RE.match(text):
        return int(m.group(1)), m.group(2).strip()
    if m := _TRAILING_COUNT_RE.match(text):
        return int(m.group(2)), m.group(1).strip()
    return None, text


def accelerator_count(cell: str | None) -> tuple[int | None, str]:
    """The accelerators a hardware cell states, and how it was read (or why it states none).

    * a count with the accelerator ("8x H100 SXM", "8xH100", "512 x A100", "H100 x8"): that many;
    * a count of systems ("4 x DGX H100", "4x HGX H200", "2x DGX B200"): x the GPUs of one (`GPUS_PER_SYSTEM`);
    * an NVLink domain ("GB200 NVL72", "1x GB200 NVL72"): its GPUs, x the count where one is written;
    * a Cloud TPU slice ("v5p-128", "TPU v4-256": TensorCores, 2 a chip; "v5e-256", "v5litepod-256", "v6e-256",
      "Trillium 256": chips; `TPU_SLICE_UNIT`), x the count of slices where one is written;
    * a count of cloud instances ("16x p4d.24xlarge"): x the accelerators of one (`instance_accelerators`).
    A system named without a count ("DGX H100") states none: the name often only says which GPU the cluster has."""
    text = str(cell or "").strip()
    times, rest = split_count(text)
    if times is not None and times < 1:
        return None, f"'{text}': a count of {times}"
    k = times or 1
    several = lambda what: f"{k} {what}{'s' if k > 1 else ''} x " if times is not None else ""  # noqa: E731
    if tpu := TPU_SLICE_RE.match(rest):
        gen, size = tpu.group(1).lower(), int(tpu.group(2))
        per_chip, name = TPU_SLICE_UNIT[gen]
        if size < per_chip or size % per_chip:
            return None, f"'{text}': {size} TensorCores are no whole number of {name} chips ({per_chip} a chip)"
        chips = size // per_chip
        counts = f"TensorCores, {per_chip} a chip" if per_chip > 1 else "chips"
        return k * chips, f"{several('slice')}{chips} chips: a {name} slice's name counts {counts}"
    if per := instance_accelerators().get(_instance_key(rest)):
        if times is None:  # "p5.48xlarge": which accelerator, not how many instances
            return None, f"'{text}' names a cloud instance type without a count"
        return k * per, f"{several('instance')}{per} accelerators: one {rest} holds {per}"
    if nvl := NVL_DOMAIN_RE.search(rest):
        size = int(nvl.group(1))
        if size >= 1:
            return k * size, f"{several('rack')}{size} GPUs: an NVL{size} domain holds {size}"
    for pattern, per, why in GPUS_PER_SYSTEM:
        if pattern.search(rest) and not re.search(r"\bgb[23]00\b", rest, re.IGNORECASE):
            if times is None:
                return None, f"'{text}' names a system without a count"
            return k * per, f"{several('system')}{per} GPUs: {why}"
    if times is None:
        return None, f"'{text}' states no count"
    if not rest:
        return None, f"'{text}' names no accelerator"
    return times, ""


def _word_fits(word: str, query: str) -> bool:
    """A query word fits a word of an accelerator's id, name or form factor when it is that word or its start, but
    a model number does not fit a longer one nor one with NVIDIA's tier mark appended (`TIER_SUFFIX`): "mi300" fits
    "mi300x", "80" fits "80gb" and "sxm" fits "sxm5", but "h20" does not fit "h200" (the H20 is another chip), nor
    "l4" "l40s", nor "l40" "l40s"."""
    if word == query:
        return True
    if not word.startswith(query):
        return False
    return query.isalpha() or not (word[len(query)].isdigit() or word[len(query):] == TIER_SUFFIX)


def resolve_gpu(hw: pl.DataFrame, name: str, network: bool = True) -> tuple[dict, str | None]:
    """The hardware row a name means, and a note when a documented default chose among variants. A cloud
    instance type's row carries the instance's scale-out network (`instance_network`) unless `network` is False
    (a run table says its own, `resolve_gpu_cells`).

    Raises UnknownName when nothing fits, or when several different chips fit (the message lists them)."""
    times, bare = split_count(name)
    if times is not None and bare:  # "8x A100": the accelerator without its count
        row, note = resolve_gpu(hw, bare)
        said = f"'{name}': ignoring the count to name the accelerator (the job's size is its n_gpus)"
        return row, f"{said}; using {row['id']}" if note is None else f"{said}; {note}"
    if tpu := TPU_SLICE_RE.match(str(name)):  # "v5p-128": the generation without the slice's size
        row, note = resolve_gpu(hw, TPU_SLICE_UNIT[tpu.group(1).lower()][1])
        said = (f"'{name}': ignoring '{tpu.group(2)}' to name the accelerator (the slice's size; the job's size is "
                f"its n_gpus)")
        return row, f"{said}; using {row['id']}" if note is None else f"{said}; {note}"
    if TPU_V5_LITE_RE.match(str(name)):
        row = resolve_gpu(hw, TPU_SLICE_UNIT["v5lite"][1])[0]
        return row, f"'{name}': Google's v5 lite is the TPU v5e; using {row['id']}"
    rows = hw.to_dicts()

    words = {r["id"]: _words(r["id"], r.get("name")) for r in rows}
    with_form = {r["id"]: _words(r["id"], r.get("name"), r.get("form_factor")) for r in rows}

    def exact(key: str) -> list[dict]:
        return [r for r in rows if key in (normalize_name(r["id"]), normalize_name(r.get("name")))]

    def fitting(query: list[str]) -> list[dict]:
        for table in (words, with_form):  # the form factor ("SXM", "OAM") only where the id and name fit nothing
            fit = [r for r in rows if all(any(_word_fits(w, q) for w in table[r["id"]]) for q in query)
                   and not (TIER_WORDS & set(table[r["id"]])) - set(query)]  # "GTX 1080" is no 1080 Ti
            if fit:
                return fit
        return []

    hit = exact(normalize_name(name))
    if len(hit) == 1:
        return hit[0], None
    by_id = {r["id"]: r for r in rows}
    if (aid := cloud_instance_types().get(key := normalize_name(name, keep_dots=True))) in by_id:  # "p5.48xlarge"
        table = "instance_networks.csv" if key in _instance_rows()[2] else "cloud_prices.csv"
        said = f"'{name}': a cloud instance type of {aid} (measurements/{table})"
        if not network or (net := instance_network(name)) is None:
            return by_id[aid], said
        return {**by_id[aid], "inter_node_bw_gbps": net[0]}, f"{said}; {net[1]}"  # its own scale-out network
    query = [q for q in _words(name) if q not in INTERCONNECT_WORDS]
    if not query:
        raise UnknownName(f"unknown hardware '{name}': give an id from measurements/hardware_specs.csv")
    fits = fitting(query)
    core = [q for q in query if q not in NOISE_WORDS]
    if not fits and core and len(core) < len(query):
        hit = exact(normalize_name("".join(core)))
        if len(hit) == 1:
            return hit[0], None
        fits, query = fitting(core), core
    ignored = None
    if not fits:  # words that fit no accelerator at all (a slice size, a board or form-factor code) are dropped
        # an instance size ("48xlarge" of "p5.48xlarge") names no chip, though a form factor may spell one out
        known = [q for q in query if not INSTANCE_SIZE_RE.fullmatch(q)
                 and any(_word_fits(w, q) for ws in with_form.values() for w in ws)]
        # ... when a model number is among the words kept ("HL-225" is no Gaudi 3 for its "HL-325L"'s "hl")
        if known and len(known) < len(query) and any(c.isdigit() for q in known for c in q):
            fits = fitting(known)
            ignored = [q for q in query if q not in known]
            query = known
    if len(fits) == 1:
        return fits[0], (None if ignored is None else
                         f"'{name}': ignoring {', '.join(repr(w) for w in ignored)} (no accelerator's id or name has "
                         f"them); using {fits[0]['id']}")
    if not fits:
        loose = [r for r in rows if all(any(w.startswith(q) for w in with_form[r["id"]]) for q in query)]
        if len(loose) > 1:  # a model number's start ("MI3"): the chips it starts, to choose from
            raise UnknownName(f"hardware '{name}' is ambiguous: it fits {', '.join(r['id'] for r in loose)}; "
                              f"give one of these ids")
        raise UnknownName(f"unknown hardware '{name}': expected an id or name from measurements/hardware_specs.csv "
                          f"(e.g. h100-sxm5-80gb, H100, A100 80GB, gb200; `stepcast list gpus` prints them all)."
                          f"{_suggest(name.strip().lower(), hw['id'].to_list())}")
    ids = ", ".join(r["id"] for r in fits)
    variants = all(
        all(q in words for q in query) and all(VARIANT_WORD_RE.match(w) for w in words if w not in query)
        for words in (set(_words(r["id"])) for r in fits))
    if not variants:
        raise UnknownName(f"hardware '{name}' is ambiguous: it fits {ids}; give one of these ids")
    chosen = choose_default_variant(fits)
    return chosen, (f"'{name}' fits {ids}; using {chosen['id']} (default: SXM/OAM before PCIe, then the most "
                    f"memory); name one of them to choose")


def find_hardware(measurements: Path, gpu: str, *, quiet: bool = False) -> dict:
    """The hardware row `gpu` names (see `resolve_gpu`); the note on a default goes to stderr."""
    row, note = resolve_gpu(hardware(measurements), gpu)
    if note and not quiet:
        print(f"note: {note}", file=sys.stderr)
    return row


def resolve_gpu_column(gpus: pl.Series, hw: pl.DataFrame) -> tuple[pl.Series, pl.Series]:
    """A measurement file's `gpu` values as hardware ids (unresolvable values kept as they are), and per value
    the note on a documented default (null when the value named one row)."""
    ids, notes = {}, {}
    for g in gpus.drop_nulls().unique().to_list():
        try:
            row, note = resolve_gpu(hw, g, network=False)  # the network: `resolve_gpu_cells`, where none is stated
            ids[g], notes[g] = row["id"], (f"gpu {note}" if note else None)
        except UnknownName:
            ids[g], notes[g] = g, None
    return (gpus.replace_strict(ids, default=None, return_dtype=pl.Utf8).alias(gpus.name),
            gpus.replace_strict(notes, default=None, return_dtype=pl.Utf8).alias("gpu_note"))


def resolve_gpu_cells(runs: pl.DataFrame, hw: pl.DataFrame) -> pl.DataFrame:
    """A run table's `gpu` cells as hardware ids with `_gpu_note` (`resolve_gpu_column`), and `n_gpus` from the
    accelerators a cell states (`accelerator_count`: "8x H100", "4 x DGX H100", "GB200 NVL72", "v5p-128") where
    the row states neither n_gpus nor a node count (`_nodes`, which `pipeline.predict_runs.stated_otherwise` reads
    with the GPUs per node); each such reading is appended to `_gpu_note` ("n_gpus=512 from the hardware cell
    '512x A100 80GB'"). A stated n_gpus is never replaced. A cell naming a cloud instance type with a network row
    (`instance_network`: "p4d.24xlarge") sets `inter_node_bw_gbps` where the row states none, and says so."""
    cells = runs["gpu"]
    ids, notes = resolve_gpu_column(cells, hw)
    read = {g: accelerator_count(g) for g in cells.drop_nulls().unique().to_list()}
    read = {g: (n, f"n_gpus={n} from the hardware cell '{g}'" + (f" ({why})" if why else ""))
            for g, (n, why) in read.items() if n is not None}
    count = cells.replace_strict({g: n for g, (n, _) in read.items()}, default=None, return_dtype=pl.Int64)
    said = cells.replace_strict({g: w for g, (_, w) in read.items()}, default=None, return_dtype=pl.Utf8)
    stated = pl.col("n_gpus").is_not_null() if "n_gpus" in runs.columns else pl.lit(False)
    if "_nodes" in runs.columns:
        stated = stated | pl.col("_nodes").is_not_null()
    use = ~stated & count.is_not_null()
    n_gpus = pl.col("n_gpus") if "n_gpus" in runs.columns else pl.lit(None, dtype=pl.Int64)
    dtype = runs.schema.get("n_gpus", pl.Int64)
    # a cloud instance type names its network too (`instance_network`): the row's unless it states its own
    nets = {g: net for g in cells.drop_nulls().unique().to_list() if (net := instance_network(g)) is not None}
    net_bw = cells.replace_strict({g: v for g, (v, _) in nets.items()}, default=None, return_dtype=pl.Float64)
    net_said = cells.replace_strict({g: w for g, (_, w) in nets.items()}, default=None, return_dtype=pl.Utf8)
    own = pl.col("inter_node_bw_gbps").cast(pl.Float64, strict=False) if "inter_node_bw_gbps" in runs.columns \
        else pl.lit(None, dtype=pl.Float64)
    net_use = own.is_null() & net_bw.is_not_null()
    return runs.with_columns(
        ids, pl.when(use).then(count.cast(dtype)).otherwise(n_gpus).alias("n_gpus"),
        pl.when(net_use).then(net_bw).otherwise(own).alias("inter_node_bw_gbps"),
        pl.concat_str([notes, pl.when(use).then(said), pl.when(net_use).then(net_said)], separator="; ",
                      ignore_nulls=True).replace("", None).alias("_gpu_note"))


# ---------------------------------------------------------------- architecture and hardware files

def read_table_file(path: Path) -> list[dict]:
    """Rows of a JSON (an object or a list of objects) or CSV file, as dicts of strings/values."""
    path = Path(path)
    if not path.exists():
        raise UnknownName(f"{path}: file not found")
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix.lower() == ".json" or text.lstrip().startswith(("{", "[")):
        try:  # NaN, Infinity and integers of thousands of digits refused, naming the key
            data = strict_json(text)
        except JSONRefused as err:
            raise UnknownName(f"{path}: {err}") from None
        rows = data if isinstance(data, list) else [data]
        if not all(isinstance(r, dict) for r in rows):
            raise UnknownName(f"{path}: expected a JSON object or a list of objects")
        return rows
    try:
        frame = pl.read_csv(path, infer_schema_length=0)
    except Exception as err:  # noqa: BLE001
        raise UnknownName(f"{path}: unreadable CSV ({err})") from None
    return frame.to_dicts()


def _pick_row(rows: list[dict], name: str | None, path: Path) -> dict:
    if not rows:
        raise UnknownName(f"{path}: no rows")
    if len(rows) == 1:
        return rows[0]
    if name is None:
        raise UnknownName(f"{path}: {len(rows)} rows; give a file with one row, or name one with --model/--gpu")
    key = normalize_name(name)
    hit = [r for r in rows if key in {normalize_name(r.get("id")), normalize_name(r.get("name")),
                                      *(normalize_name(a) for a in str(r.get("aliases") or "").split("|"))}]
    if len(hit) != 1:
        raise UnknownName(f"{path}: {len(hit)} rows named '{name}' (expected one)")
    return hit[0]


def resolve_architecture(model: str | None, arch_file: Path | None, *, measurements: Path | None = None) -> dict:
    """The architecture dict of `--arch-file PATH` (a row of our schema as CSV/JSON, or a Hugging Face
    config.json; with several rows, `model` picks one), else of `--model NAME` from the table.

    Raises UnknownName (a ValueError) with a message naming the file and the missing key, or the name."""
    if arch_file is not None:
        rows = read_table_file(arch_file)
        try:
            return architecture_from_mapping(_pick_row(rows, model, Path(arch_file)), str(arch_file))
        except ArchFileError as err:
            raise UnknownName(str(err)) from None
    if model is None:
        raise UnknownName("give --model NAME or --arch-file PATH")
    return find_architecture(measurements or _default_measurements(), model)


def resolve_hardware_row(gpu: str | None, hardware_file: Path | None, *, measurements: Path | None = None) -> dict:
    """The hardware row of `--hardware-file PATH` (a row of the hardware_specs.csv schema as CSV/JSON; with
    several rows, `gpu` picks one), else of `--gpu NAME` from the table (see `resolve_gpu`)."""
    if hardware_file is not None:
        rows = read_table_file(hardware_file)
        try:
            return hardware_from_mapping(_pick_row(rows, gpu, Path(hardware_file)), str(hardware_file))
        except ArchFileError as err:
            raise UnknownName(str(err)) from None
    if gpu is None:
        raise UnknownName("give --gpu NAME or --hardware-file PATH")
    return find_hardware(measurements or _default_measurements(), gpu)


def _default_measurements() -> Path:
    return Settings.load().measurements
