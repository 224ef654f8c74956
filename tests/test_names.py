"""Names resolve the same way everywhere: `--model`, `--gpu`, a measurement file's model_name and gpu, the store's
`runs` table (pipeline/catalog.py); `stepcast list models|gpus`."""

from __future__ import annotations

import json

import duckdb
import polars as pl
import pytest
from typer.testing import CliRunner

from pipeline import catalog, store
from pipeline.cli import app
from tests.conftest import MEASUREMENTS
from tests.test_ingest import BASE, write_rows

runner = CliRunner()


@pytest.fixture(autouse=True)
def no_store(tmp_path, monkeypatch):
    """Analytical path only: no store, hence no promoted calibration fit."""
    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "none" / "stepcast.duckdb"))


# ---------------------------------------------------------------- architectures

@pytest.mark.parametrize("name, arch_id", [
    ("DeepSeek-V3", "deepseek-v3"), ("deepseekv3", "deepseek-v3"), ("DeepSeekV3", "deepseek-v3"),
    ("deepseek_v3", "deepseek-v3"), ("LLAMA3_70B", "llama3-70b"), ("Llama 3 70B", "llama3-70b"),
    ("llama3-70b", "llama3-70b"), ("Llama-3.1-70B", "llama3-70b"), ("qwen3 30b a3b", "qwen3-30b-a3b"),
    ("Mixtral 8x7B", "mixtral-8x7b"), ("GPT OSS 20B", "gpt-oss-20b"), ("Nemotron_3_Nano", "nemotron-3-nano"),
])
def test_model_names_resolve_ignoring_case_spaces_and_separators(name, arch_id):
    assert catalog.find_architecture(MEASUREMENTS, name)["id"] == arch_id


@pytest.mark.parametrize("name, arch_id", [
    ("GPT-3 (175B)", "gpt3-175b"), ("Llama 2 (70B)", "llama2-70b"), ("Mixtral (8x7B)", "mixtral-8x7b"),
    ("GPT-3 [175B]", "gpt3-175b"), ("Llama-2 (70B)", "llama2-70b"), ("GPT-3 175B (MLPerf)", "gpt3-175b")])
def test_model_names_with_the_size_in_parentheses_or_brackets_resolve(name, arch_id):
    """Parentheses and brackets separate words like spaces do (`normalize_name`, and the store's SQL with it)."""
    assert catalog.find_architecture(MEASUREMENTS, name)["id"] == arch_id
    got = catalog.fill_from_architectures(pl.DataFrame({"model_name": [name]}), MEASUREMENTS)
    assert got["arch_id"][0] == arch_id


def test_an_unknown_model_with_its_size_in_parentheses_is_still_refused():
    with pytest.raises(catalog.UnknownName, match=r"unknown model 'Foo \(7B\)': expected an id, name or alias"):
        catalog.find_architecture(MEASUREMENTS, "Foo (7B)")
    assert catalog.fill_from_architectures(pl.DataFrame({"model_name": ["Foo (7B)"]}), MEASUREMENTS)[
        "arch_id"][0] is None


def test_shipped_architecture_names_are_unambiguous():
    # two rows whose id, name or alias normalize alike would make a name resolve to neither
    assert catalog.ambiguous_arch_keys(catalog.architectures(MEASUREMENTS)) == {}


def test_ambiguous_model_name_lists_the_candidates(tmp_path):
    meas = tmp_path / "m"
    meas.mkdir()
    arch = catalog.architectures(MEASUREMENTS)
    twin = arch.filter(pl.col("id") == "llama3-8b").with_columns(pl.lit("my-llama").alias("id"),
                                                                  pl.lit("My Llama").alias("name"))
    pl.concat([arch, twin]).write_csv(meas / "architectures.csv")
    with pytest.raises(catalog.UnknownName, match="ambiguous.*llama3-8b, my-llama"):
        catalog.find_architecture(meas, "Llama 3 8B")
    assert catalog.find_architecture(meas, "my_llama")["id"] == "my-llama"


def test_unknown_model_is_refused_with_a_suggestion():
    with pytest.raises(catalog.UnknownName, match="unknown model 'llama3-7b'.*Did you mean"):
        catalog.find_architecture(MEASUREMENTS, "llama3-7b")


def test_run_model_names_fill_architecture_like_the_store():
    runs = pl.DataFrame({"model_name": ["DeepSeek-V3", "deepseek_v3", "LLAMA3_70B", "Llama 3 70B", "nope"],
                         "n_layers": [None, None, None, 99, None]}, schema_overrides={"n_layers": pl.Int64})
    out = catalog.fill_from_architectures(runs, MEASUREMENTS)
    assert out["arch_id"].to_list() == ["deepseek-v3", "deepseek-v3", "llama3-70b", "llama3-70b", None]
    assert out["n_layers"].to_list() == [61, 61, 80, 99, None]  # a run's own value wins
    assert out["n_experts"].to_list()[:2] == [256, 256]


@pytest.mark.parametrize("name, arch_id", [
    ("DeepSeek V3 671B", "deepseek-v3"), ("deepseek-v3-671b", "deepseek-v3"), ("Mixtral 8x7B 47B", "mixtral-8x7b"),
    ("DeepSeek V3 7B", None), ("Mixtral 8x7B 7B", None), ("Phi-3 7B", None), ("Phi-3 14B", "phi-3-medium"),
    ("Mixtral 8x22B", "mixtral-8x22b"), ("Qwen3 235B A22B", "qwen3-235b-a22b"),  # exact names: no size is dropped
    ("DeepSeek-V3 (671B)", "deepseek-v3"), ("Mixtral-8x7B (47B)", "mixtral-8x7b")])
def test_a_name_with_a_size_token_resolves_only_to_an_architecture_of_that_size(name, arch_id):
    arch = catalog.architectures(MEASUREMENTS)
    got = catalog.fill_from_architectures(pl.DataFrame({"model_name": [name]}), MEASUREMENTS)
    assert got["arch_id"][0] == arch_id
    if arch_id is None:  # `--model` refuses what a runs file cannot read, saying why where a size contradicts
        with pytest.raises(catalog.UnknownName, match="unknown model"):
            catalog.find_architecture(MEASUREMENTS, name)
    else:  # and reads the same architecture as a runs file does (one reading of a name on every path)
        assert catalog.find_architecture(MEASUREMENTS, name)["id"] == arch_id
    if arch_id is not None and catalog.arch_ids(pl.col("model_name"), arch, pl.DataFrame({"model_name": [name]}))[
            "arch_id"][0] is None:  # read without its size: said so
        assert got["model_name_note"][0].startswith(f"model '{name}' read as {arch_id}")
        assert got["n_layers"][0] == arch.filter(pl.col("id") == arch_id)["n_layers"][0]


@pytest.mark.parametrize("name, arch_id", [
    ("meta-llama/Llama-2-13b-hf", "llama2-13b"), ("Llama-2-13b-chat-hf", "llama2-13b"),
    ("EleutherAI/gpt-neox-20b", "gpt-neox-20b"), ("google/gemma-2-9b-it", "gemma2-9b"),
    ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b"), ("someone/unknown-model-hf", None),
    ("meta-llama/Llama-2-13b-hf-7B", None),  # a size that contradicts the name still refuses it
    ("Chinchilla", "chinchilla-70b"), ("Gopher", "gopher-280b"),  # the one architecture of that name, of any size
    ("Llama", None), ("GPT-3", None),  # a family of several sizes stays unresolved
    ("EleutherAI/gpt-j-6b", "gpt-j-6b"), ("openai-community/gpt2-xl", "gpt2-1.5b"), ("StarCoder", "starcoderbase-15.5b")])
def test_a_checkpoint_name_resolves_to_its_architecture(name, arch_id):
    got = catalog.fill_from_architectures(pl.DataFrame({"model_name": [name]}), MEASUREMENTS)
    assert got["arch_id"][0] == arch_id
    if arch_id is None:
        with pytest.raises(catalog.UnknownName):
            catalog.find_architecture(MEASUREMENTS, name)
        return
    assert catalog.find_architecture(MEASUREMENTS, name)["id"] == arch_id
    if catalog.arch_ids(pl.col("model_name"), catalog.architectures(MEASUREMENTS),
                        pl.DataFrame({"model_name": [name]}))["arch_id"][0] is None:
        assert got["model_name_note"][0].startswith(f"model '{name}' read as {arch_id}")


def test_a_size_that_does_not_match_the_named_architecture_is_refused_saying_why():
    import stepcast

    runs = pl.DataFrame({"run_id": ["ok", "off"], "model_name": ["DeepSeek V3 671B", "DeepSeek V3 7B"],
                         "gpu": ["h100-sxm5-80gb"] * 2, "n_gpus": [1024, 1024], "tp": [2, 2], "pp": [16, 16],
                         "ep": [64, 64], "global_batch_seqs": [4096, 4096], "seq_len": [4096, 4096],
                         "dtype": ["fp8", "fp8"]})
    out = stepcast.predict_frame(runs)
    ok, off = out.row(0, named=True), out.row(1, named=True)
    assert ok["step_time_s"] is not None and "model 'DeepSeek V3 671B' read as deepseek-v3" in ok["assumptions"]
    same = stepcast.predict_frame(runs.head(1).with_columns(pl.lit("DeepSeek-V3").alias("model_name")))
    assert ok["step_time_s"] == same["step_time_s"][0]
    assert off["step_time_s"] is None and "architecture shape unknown" in off["error"]
    assert "without its size names deepseek-v3, whose 671 B parameters are not within 15% of 7 B" in off["error"]


def test_store_alias_sql_matches_the_catalog_keys():
    """The store's `runs` table and `predict --runs` map names with one rule (SQL and polars)."""
    con = duckdb.connect()
    arch = catalog.architectures(MEASUREMENTS)
    con.register("_a", arch.to_arrow())
    con.execute("create table architectures as select * from _a")
    sql = set(con.sql(store._ALIASES_SQL).pl().select("alias", "id").rows())
    py = set(catalog.arch_name_keys(arch).select("key", "id").rows())
    assert sql == py and ("deepseekv3", "deepseek-v3") in sql
    sql1 = set(con.sql(store._aliases_sql(True)).pl().select("alias", "id").rows())
    assert sql1 == set(catalog.arch_name_keys(arch, keep_dots=True).select("key", "id").rows())
    base = pl.DataFrame({"model_name": ["DeepSeek-V3", "Llama 3.1 405B", "GPT-3 13B", "GPT3-1.3B", "Llama 2 (70B)",
                                        "GPT-3 [1.3B]"], "run_id": ["a", "b", "c", "d", "e", "f"]})
    base = base.with_columns(*[pl.lit(None, dtype=pl.Int64).alias(c) for c in store.ARCH_FILL])
    rows = store.runs_rows(base, store.arch_aliases(con))
    want = ["deepseek-v3", "llama3-405b", "gpt3-13b", "gpt3-1.3b", "llama2-70b", "gpt3-1.3b"]
    assert rows["arch_id"].to_list() == want
    assert rows["n_layers"].to_list() == [61, 126, 40, 24, 80, 24] and rows["arch_filled"].all()
    # the writer's SQL derivation of `runs` gives the same ids (first with dots kept, then without)
    con.register("_b", base.to_arrow())
    sql_ids = con.sql(f"""with base as (select * from _b), alias1 as ({store._aliases_sql(True)}),
        alias2 as ({store._ALIASES_SQL}) select b.run_id, {store._ARCH_ID_SQL} as arch_id from base b
        left join alias1 al1 on al1.alias = {store._norm_sql('b.model_name', True)}
        left join alias2 al2 on al2.alias = {store._norm_sql('b.model_name')} order by b.run_id""").pl()
    assert sql_ids["arch_id"].to_list() == want
    # one normalization on both sides (catalog.NAME_IGNORED in the SQL): names with brackets compare alike
    odd = ["GPT-3 (175B)", "Mixtral [8x7B]", " Llama_2.70B\t", "a(b)[c]-d.e_f g"]
    for keep_dots in (False, True):
        sql_keys = [con.execute(f"select {store._norm_sql('?', keep_dots)}", [n]).fetchone()[0] for n in odd]
        assert sql_keys == [catalog.normalize_name(n, keep_dots) for n in odd]
        assert pl.DataFrame({"n": odd}).select(catalog.normalize_expr("n", keep_dots))["n"].to_list() == sql_keys


# ---------------------------------------------------------------- hardware

@pytest.mark.parametrize("name, hw_id, note_names", [
    ("h100-sxm5-80gb", "h100-sxm5-80gb", None),
    ("H100", "h100-sxm5-80gb", "h100-pcie-80gb, h100-nvl-94gb"),
    ("h100", "h100-sxm5-80gb", "h100-pcie-80gb, h100-nvl-94gb"),
    ("H100 SXM", "h100-sxm5-80gb", None),
    ("H100 PCIe", "h100-pcie-80gb", None),
    ("A100", "a100-sxm4-80gb", "a100-sxm4-40gb, a100-sxm4-80gb, a100-pcie-80gb"),
    ("A100 80GB", "a100-sxm4-80gb", "a100-pcie-80gb"),
    ("A100 40GB", "a100-sxm4-40gb", "a100-pcie-40gb"),
    ("gb200", "gb200", None),
    ("GB200", "gb200", None),
    ("MI300", "mi300x", None),
    ("TPU v5p", "tpu-v5p", None),
    ("GTX 580", "gtx-580", None),
    ("GTX 580 3GB", "gtx-580-3gb", None),
    ("GH200", "gh200", None),  # the 96 GB HBM3 part of the 4-GH200 HPE Cray EX nodes, not the HBM3e one
    ("gh200", "gh200", None),
    ("GH200 Grace Hopper Superchip", "gh200", None),
    ("GH200 144GB", "gh200-144gb", None),
    ("H100 NVL", "h100-nvl-94gb", None),
    # an interconnect word is no variant: an NVLink-connected H100 is the SXM part by default, not the NVL card
    ("H100 (NVLink)", "h100-sxm5-80gb", "h100-sxm5-80gb, h100-pcie-80gb, h100-nvl-94gb"),
    ("A800", "a800-sxm4-80gb", None),
    # as tools print them: nvidia-smi, rocm-smi, cloud instance and system names (vendor, system and memory
    # technology words are dropped when the whole name fits no row)
    ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb", "h100-pcie-80gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb", None),
    ("NVIDIA H100 PCIe", "h100-pcie-80gb", None),
    ("AMD Instinct MI300X", "mi300x", None),
    ("HGX H100", "h100-sxm5-80gb", "h100-pcie-80gb"),
    ("NVIDIA GB200", "gb200", None),
    ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb", None),
    ("Intel Gaudi 3", "gaudi3", None),
    # nvidia-smi names GH200 by its Grace LPDDR5X size (CSCS Alps: "NVIDIA GH200 120GB"); DCGM by its HBM
    ("NVIDIA GH200 120GB", "gh200", None),
    ("NVIDIA GH200 480GB", "gh200", None),
    ("NVIDIA GH200 96GB HBM3", "gh200", None),
    ("NVIDIA H100 NVL", "h100-nvl-94gb", None),
    ("NVIDIA A800-SXM4-80GB", "a800-sxm4-80gb", None),
    # accelerators of published training measurements beyond the flagship parts; each keeps its neighbours' names
    ("Trainium2", "trn2", None), ("trn2", "trn2", None), ("AWS Trainium2", "trn2", None),
    ("Trainium", "trn1", None), ("trn1", "trn1", None), ("AWS Trainium", "trn1", None),
    ("L4", "l4", None), ("NVIDIA L4", "l4", None), ("L40S", "l40s", None), ("NVIDIA L40S", "l40s", None),
    ("T4", "t4", None), ("Tesla T4", "t4", None), ("NVIDIA T4", "t4", None),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb", None), ("A100 PCIe 40GB", "a100-pcie-40gb", None),
    ("A100 PCIe", "a100-pcie-80gb", "a100-pcie-40gb"),
    ("MI250", "mi250", None), ("AMD Instinct MI250", "mi250", None), ("MI250X", "mi250x", None),
    ("AMD Instinct MI250X", "mi250x", None), ("MI210", "mi210", None), ("AMD Instinct MI210", "mi210", None),
    ("V100", "v100-sxm2-32gb", "v100-sxm2-16gb"),
    # PCIe V100s, RTX A6000, RTX 3090, A10: new rows that leave V100, A100 and RTX 4090 where they were
    ("V100", "v100-sxm2-32gb", "v100-pcie-16gb"), ("Tesla V100-PCIE-16GB", "v100-pcie-16gb", None),
    ("Tesla V100-PCIE-32GB", "v100-pcie-32gb", None), ("V100 PCIe 16GB", "v100-pcie-16gb", None),
    ("V100 PCIe", "v100-pcie-32gb", "v100-pcie-16gb"), ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb", None),
    ("A100", "a100-sxm4-80gb", "a100-pcie-40gb"), ("RTX 4090", "rtx-4090", None),
    ("NVIDIA GeForce RTX 4090", "rtx-4090", None),
    ("RTX A6000", "rtx-a6000", None), ("NVIDIA RTX A6000", "rtx-a6000", None), ("A6000", "rtx-a6000", None),
    ("RTX 3090", "rtx-3090", None), ("NVIDIA GeForce RTX 3090", "rtx-3090", None),
    # a TPU slice ("v5p-256": its TensorCore or chip count), a form factor the id and name do not spell
    ("TPU v5p-256", "tpu-v5p", "ignoring '256'"), ("v5e-256", "tpu-v5e", "ignoring '256'"),
    ("TPU v4-3072", "tpu-v4", "ignoring '3072'"), ("B200-SXM", "b200", None), ("MI300X OAM", "mi300x", None),
    ("A10", "a10", None), ("NVIDIA A10", "a10", None),
    # sourced rows for names people write in measured-run files; each keeps its neighbours' names (H20 is not the
    # H200, L40 is not the L40S, MI100 is not an MI3xx, TPU v2 / TPU7x are not the other TPUs)
    ("H20", "h20", None), ("NVIDIA H20", "h20", None), ("h20", "h20", None), ("H200", "h200-sxm-141gb", None),
    ("A40", "a40", None), ("NVIDIA A40", "a40", None), ("L40", "l40", None), ("NVIDIA L40", "l40", None),
    ("L40S", "l40s", None), ("B100", "b100", None), ("NVIDIA B100", "b100", None), ("B200", "b200", None),
    ("MI100", "mi100", None), ("AMD Instinct MI100", "mi100", None), ("TPU v2", "tpu-v2", None),
    ("tpu-v2", "tpu-v2", None), ("TPU v7", "tpu-v7", None), ("TPU7x", "tpu-v7", None), ("Ironwood", "tpu-v7", None),
    ("Google TPU v7", "tpu-v7", None), ("TPU v6e", "tpu-v6e", None),
    # Google's other name for the v5e, with or without a slice size
    ("TPU v5 lite", "tpu-v5e", "v5 lite is the TPU v5e"), ("v5litepod", "tpu-v5e", "v5 lite is the TPU v5e"),
    ("v5lite", "tpu-v5e", "v5 lite is the TPU v5e"), ("v5litepod-16", "tpu-v5e", "ignoring '16'"),
])
def test_gpu_names_resolve(name, hw_id, note_names):
    row, note = catalog.resolve_gpu(catalog.hardware(MEASUREMENTS), name)
    assert row["id"] == hw_id
    if note_names is None:
        assert note is None
    else:
        assert note_names in note and f"using {hw_id}" in note


@pytest.mark.parametrize("name, candidates", [
    ("TPU", "tpu-v3, tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e, tpu-v2, tpu-v7"),
    ("Blackwell", "gb200, b300, gb300"),
    ("MI3", "mi300x, mi325x, mi355x"),
    ("RTX", "rtx-4090, rtx-a6000, rtx-3090"),
])
def test_gpu_name_fitting_different_chips_is_an_error_listing_them(name, candidates):
    with pytest.raises(catalog.UnknownName, match=f"'{name}' is ambiguous: it fits {candidates}; give one"):
        catalog.resolve_gpu(catalog.hardware(MEASUREMENTS), name)


def test_unknown_gpu_is_refused():
    with pytest.raises(catalog.UnknownName, match="unknown hardware 'H9000'"):
        catalog.resolve_gpu(catalog.hardware(MEASUREMENTS), "H9000")


@pytest.mark.parametrize("name", ["NVIDIA", "NVIDIA H9000 HBM3", "AMD Instinct"])
def test_a_name_that_is_only_vendor_or_system_words_is_refused(name):
    with pytest.raises(catalog.UnknownName, match=f"unknown hardware '{name}'"):
        catalog.resolve_gpu(catalog.hardware(MEASUREMENTS), name)


# ---------------------------------------------------------------- commands

def test_predict_resolves_deepseek_v3_and_h100_with_a_note():
    result = runner.invoke(app, ["predict", "--model", "DeepSeek-V3", "--gpu", "H100", "--gpus", "1024",
                                 "--global-batch", "4096", "--seq-len", "4096", "--pp", "16", "--ep", "64",
                                 "--dtype", "fp8", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "using h100-sxm5-80gb" in result.stderr
    row = json.loads(result.stdout)[0]
    assert row["step_time_s"] > 0 and row["peak_tflops"] == pytest.approx(1978.9)


def test_predict_answers_mamba2_and_mamba1_hybrids():
    result = runner.invoke(app, ["predict", "--model", "Nemotron-H 8B", "--gpu", "H100", "--gpus", "8",
                                 "--global-batch", "64", "--seq-len", "8192", "--tp", "8"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["predict", "--model", "Jamba-v0.1", "--gpu", "H100", "--gpus", "8",
                                 "--global-batch", "64", "--seq-len", "8192", "--tp", "8", "--ep", "1"])
    assert result.exit_code == 0, result.output


def test_predict_runs_file_resolves_model_and_gpu_names(tmp_path):
    rows = [dict(BASE, run_id="a", model_name="DeepSeek-V3", arch="moe", params_b="", n_layers="", d_model="",
                 n_heads="", n_kv_heads="", ffn_dim="", vocab="", gpu="H100", n_gpus="1024", dp="", tp="1",
                 pp="16", ep="64", seq_len="4096", global_batch_seqs="4096", sharding="zero1",
                 framework="Megatron-Core"),
            dict(BASE, run_id="b", gpu="TPU")]
    path = write_rows(tmp_path / "runs.csv", rows)
    result = runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    out = {r["run_id"]: r for r in json.loads(result.stdout)}
    assert out["a"]["error"] is None or "expert shapes" not in out["a"]["error"]
    assert out["a"]["step_time_s"] > 0
    assert ("gpu 'H100' fits h100-sxm5-80gb, h100-pcie-80gb, h100-nvl-94gb; using h100-sxm5-80gb"
            in out["a"]["assumptions"])
    assert "unknown hardware id 'TPU'" in out["b"]["error"]  # an ambiguous name is not guessed


def test_list_gpus_json():
    result = runner.invoke(app, ["list", "gpus", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["id"]: r for r in json.loads(result.stdout)}
    assert len(rows) == catalog.hardware(MEASUREMENTS).height
    assert rows["h100-sxm5-80gb"]["short_names"] == "H100" and rows["h100-pcie-80gb"]["short_names"] == ""
    assert rows["b200"]["peak_fp4_tflops"] == 9000 and rows["h100-sxm5-80gb"]["peak_fp4_tflops"] is None
    assert rows["gtx-580-3gb"]["memory_gb"] == 3 and rows["mi355x"]["generation"] == "CDNA4"
    assert rows["gh200"]["generation"] == "Hopper" and rows["gh200"]["memory_gb"] == 96


def test_list_models_csv_and_bad_format():
    result = runner.invoke(app, ["list", "models", "--format", "csv"])
    assert result.exit_code == 0, result.output
    frame = pl.read_csv(result.stdout.encode())
    assert frame.height == catalog.architectures(MEASUREMENTS).height
    assert {"id", "name", "aliases", "params_b", "n_experts"} <= set(frame.columns)
    bad = runner.invoke(app, ["list", "gpus", "--format", "xml"])
    assert bad.exit_code == 2 and "--format must be table, csv or json" in bad.stderr


def test_hardware_copy_extends_the_upstream_table():
    """measurements/hardware_specs.csv extends ../shared/data/hardware_specs.csv: more rows (gtx-580-3gb, GH200 in its
    HBM3 and HBM3e versions, H100 NVL, A800; A100 PCIe 40GB, T4, L4, MI250, MI210, Trainium, Trainium2,
    V100 PCIe 16/32GB, RTX A6000, RTX 3090, A10; H20, A40, L40, B100, MI100, TPU v2, TPU7x), six more columns,
    sources appended; every upstream value otherwise unchanged (a price it lacks may be filled, with its reference)."""
    upstream = MEASUREMENTS.parent.parent / "shared" / "data" / "hardware_specs.csv"
    if not upstream.exists():
        pytest.skip("no upstream copy on this machine")
    up = pl.read_csv(upstream, infer_schema_length=0)
    ours = pl.read_csv(MEASUREMENTS / "hardware_specs.csv", infer_schema_length=0)
    assert set(ours["id"]) - set(up["id"]) == {"gtx-580-3gb", "gh200", "gh200-144gb", "h100-nvl-94gb", "a800-sxm4-80gb",
                                              "a100-pcie-40gb", "t4", "l4", "mi250", "mi210", "trn1", "trn2",
                                              "v100-pcie-16gb", "v100-pcie-32gb", "rtx-a6000", "rtx-3090", "a10",
                                              "h20", "a40", "l40", "b100", "mi100", "tpu-v2", "tpu-v7"}
    assert set(ours.columns) - set(up.columns) == {"generation", "sm_count", "peak_fp4_tflops", "accelerators_per_host",
                                                   "scaleup_domain_accelerators", "scaleup_link"}
    same = [c for c in up.columns if c not in ("source_ref", "notes")]
    mine = ours.filter(pl.col("id").is_in(up["id"].implode())).select(same).sort("id")
    theirs = up.select(same).sort("id")
    assert mine["id"].equals(theirs["id"])
    for col in same:
        # a price the upstream table lacks may be filled from a sourced row of measurements/cloud_prices.csv (its
        # price_ref says which, or why there is none); every value upstream states stays as it is
        fills = col in ("cloud_usd_per_hour", "price_ref")
        changed = mine[col].ne_missing(theirs[col])
        if fills:
            changed = changed & theirs[col].is_not_null()
        assert not changed.any(), (col, mine.filter(changed)["id"].to_list())


def test_a10g_is_not_read_as_the_a10():
    """AWS's A10G (G5) has no sourced tensor peak and is reported to differ from the A10's: it names no row."""
    for name in ("A10G", "NVIDIA A10G"):
        with pytest.raises(catalog.UnknownName, match="unknown hardware"):
            catalog.resolve_gpu(catalog.hardware(MEASUREMENTS), name)


@pytest.mark.parametrize("name", ["L20", "A800 80GB PCIe", "H200 NVL", "A30", "Ascend 910B", "Max 1550"])
def test_a_model_number_is_never_read_as_a_longer_one(name):
    """An L20 is not an L40 or L40S: a name whose model number only starts a known one is refused (and a product the
    table lacks, such as the A800 PCIe card, the H200 NVL, the A30, Ascend 910B or Max 1550, is not read as a
    neighbour)."""
    with pytest.raises(catalog.UnknownName, match=f"unknown hardware '{name}'"):
        catalog.resolve_gpu(catalog.hardware(MEASUREMENTS), name)


# ---------------------------------------------------------------- names as papers and benchmark tables write them

#: model names as written in papers, model cards, hub ids and benchmark tables, and the architecture each reads as in
#: `stepcast predict --runs` (None: not in measurements/architectures.csv, or a family of several sizes, refused)
WRITTEN_MODEL_NAMES = [
    ("GPT-3 175B", "gpt3-175b"), ("GPT3 175B", "gpt3-175b"), ("GPT-3 (175B)", "gpt3-175b"), ("gpt3", None),
    ("Llama-3.1-405B", "llama3-405b"), ("Llama 3.1 405B", "llama3-405b"), ("Llama 3 405B", "llama3-405b"),
    ("meta-llama/Meta-Llama-3.1-70B", "llama3-70b"), ("Llama3-70B-Instruct", "llama3-70b"),
    ("Meta-Llama-3-8B-Instruct", "llama3-8b"), ("Llama 3.1 8B Instruct", "llama3-8b"),
    ("Llama-3.3-70B-Instruct", "llama3-70b"), ("Llama-2-7b-chat-hf", "llama2-7b"), ("Llama 2 (70B)", "llama2-70b"),
    ("LLaMA-65B", "llama-65b"), ("LLaMA 2 13B", "llama2-13b"), ("Mixtral 8x22B", "mixtral-8x22b"),
    ("Mixtral-8x7B-v0.1", "mixtral-8x7b"), ("Mixtral (8x7B)", "mixtral-8x7b"), ("Mixtral-8x7B (47B)", "mixtral-8x7b"),
    ("DeepSeek-V3-Base", "deepseek-v3"), ("deepseek-ai/DeepSeek-V3", "deepseek-v3"), ("DeepSeek-V3 (671B)", "deepseek-v3"),
    ("DeepSeek-V2-Lite", "deepseek-v2-lite"), ("DeepSeek-V2.5", "deepseek-v2"), ("Qwen2.5-72B-Instruct", "qwen2.5-72b"),
    ("Qwen3-235B-A22B", "qwen3-235b-a22b"), ("Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
    ("Qwen3-235B-A22B-Instruct-2507", "qwen3-235b-a22b"), ("Qwen3-8B-Base", "qwen3-8b"),
    ("Nemotron-4 340B", "nemotron-4-340b"), ("Nemotron-4-340B-Base", "nemotron-4-340b"),
    ("Megatron-Turing NLG 530B", "mt-nlg-530b"), ("MT-NLG 530B", "mt-nlg-530b"), ("MT-NLG", "mt-nlg-530b"),
    ("BLOOM-176B", "bloom-176b"), ("Falcon-180B", "falcon-180b"), ("OPT-175B", "opt-175b"), ("PaLM 540B", "palm-540b"),
    ("PaLM", "palm-540b"), ("Gemma-2-27b", "gemma2-27b"), ("Gemma-3-27B-IT", "gemma3-27b"),
    ("gpt-oss-120b", "gpt-oss-120b"), ("GPT-OSS-120B", "gpt-oss-120b"), ("DBRX", "dbrx"), ("Grok-1", "grok-1"),
    ("Llama 4 Maverick", "llama4-maverick"), ("Llama-4-Maverick-17B-128E-Instruct", "llama4-maverick"),
    ("Kimi K2", "kimi-k2"), ("Kimi-K2-Instruct-0905", "kimi-k2"), ("GLM-4.5", "glm-4.5"), ("GLM 4.5", "glm-4.5"),
    ("Mistral Large 2", "mistral-large-2"), ("Mistral-Large-Instruct-2407", "mistral-large-2"),
    ("Mistral-7B-Instruct-v0.1", "mistral-7b"), ("Mistral-Small-24B-Instruct-2501", "mistral-small-24b"),
    ("Mistral-Small-3.1-24B", None), ("Phi-3-mini", "phi-3-mini"), ("Phi-3-mini-4k-instruct", "phi-3-mini"),
    ("Yi-34B", "yi-34b"), ("OLMo-2-13B", "olmo2-13b"), ("StarCoder2-15B", "starcoder2-15b"), ("StarCoder", "starcoderbase-15.5b"),
    ("CodeLlama-34b", "llama2-34b"), ("Jamba", "jamba-v0.1"), ("Nemotron-H 56B", "nemotron-h-56b"),
    ("Chinchilla", "chinchilla-70b"), ("GPT-NeoX-20B", "gpt-neox-20b"), ("GPT-J-6B", "gpt-j-6b"),
    ("GPT-2 XL", "gpt2-1.5b"), ("pythia-6.9b-deduped", "pythia-6.9b"), ("BloombergGPT", "bloomberggpt-50b"),
    ("MiniMax M2", "minimax-m2"), ("Qwen3-Coder-480B-A35B-Instruct", "qwen3-coder-480b-a35b"),
    ("GPT-3 1.3B", "gpt3-1.3b"), ("GPT-3 XL", "gpt3-1.3b"), ("Falcon-40B-Instruct", "falcon-40b"),
    # open models of measured training-run tables (measurements/architectures.csv rows added with them)
    ("SmolLM-135M", "smollm-135m"), ("SmolLM 360M", "smollm-360m"), ("HuggingFaceTB/SmolLM-1.7B", "smollm-1.7b"),
    ("SmolLM2-135M", "smollm2-135m"), ("SmolLM2-360M-Instruct", "smollm2-360m"), ("SmolLM2-1.7B", "smollm2-1.7b"),
    ("HuggingFaceTB/SmolLM2-1.7B", "smollm2-1.7b"), ("SmolLM2 1.7B", "smollm2-1.7b"),
    ("OLMoE-1B-7B", "olmoe-1b-7b"), ("allenai/OLMoE-1B-7B-0924", "olmoe-1b-7b"), ("OLMoE-1B-7B-0125-Instruct", "olmoe-1b-7b"),
    ("DeepSeekMoE 16B", "deepseek-moe-16b"), ("deepseek-ai/deepseek-moe-16b-base", "deepseek-moe-16b"),
    ("DeepSeek-MoE-16B", "deepseek-moe-16b"), ("Qwen1.5-MoE-A2.7B", "qwen1.5-moe-a2.7b"),
    ("Qwen/Qwen1.5-MoE-A2.7B-Chat", "qwen1.5-moe-a2.7b"), ("Qwen2-57B-A14B", "qwen2-57b-a14b"),
    ("Qwen/Qwen2-57B-A14B-Instruct", "qwen2-57b-a14b"), ("Qwen2-7B", "qwen2-7b"), ("Qwen/Qwen2-7B-Instruct", "qwen2-7b"),
    ("Qwen2.5-7B", "qwen2.5-7b"), ("Phi-3.5-MoE", "phi-3.5-moe"), ("microsoft/Phi-3.5-MoE-instruct", "phi-3.5-moe"),
    ("Granite-3.0-2B", "granite-3.0-2b"), ("ibm-granite/granite-3.0-8b-base", "granite-3.0-8b"),
    ("granite-3.0-1b-a400m-instruct", "granite-3.0-1b-a400m"), ("Granite 3.0 3B-A800M", "granite-3.0-3b-a800m"),
    ("StarCoder2-3B", "starcoder2-3b"), ("bigcode/starcoder2-7b", "starcoder2-7b"), ("StarCoder2 15B", "starcoder2-15b"),
    ("Gemma-2B", "gemma-2b"), ("google/gemma-7b", "gemma-7b"), ("Gemma 7B", "gemma-7b"), ("gemma-2-2b", "gemma2-2b"),
    ("Gemma 2 9B", "gemma2-9b"), ("Command R", "command-r"), ("CohereForAI/c4ai-command-r-v01", "command-r"),
    ("Baichuan2-7B-Base", "baichuan2-7b"), ("Baichuan 2 13B", "baichuan2-13b"),
    ("Yi-6B", "yi-6b"), ("Yi-1.5-6B", "yi-6b"), ("Yi-1.5-34B", "yi-34b"), ("01-ai/Yi-1.5-34B-Chat", "yi-34b"),
    ("SmolLM3-3B", "smollm3-3b"), ("HuggingFaceTB/SmolLM3-3B-Base", "smollm3-3b"), ("SmolLM3", "smollm3-3b"),
    ("GLM-4.6", "glm-4.5"), ("zai-org/GLM-4.6", "glm-4.5"),  # the GLM-4.5 architecture (alias)
    ("Granite", None), ("SmolLM", None), ("StarCoder2", None),  # families of several sizes stay unresolved
    ("Command R Plus", "command-r-plus"), ("c4ai-command-r-plus", "command-r-plus"),  # Command R+ (104B), not Command R
    ("Command R", "command-r"), ("Llama 3.1 Nemotron 70B", "llama3-70b"),  # a Llama 3.1 70B fine-tune: its shape
]


@pytest.mark.parametrize("name, arch_id", WRITTEN_MODEL_NAMES)
def test_model_names_as_papers_and_tables_write_them(name, arch_id):
    got = catalog.fill_from_architectures(pl.DataFrame({"model_name": [name]}), MEASUREMENTS)
    assert got["arch_id"][0] == arch_id
    if arch_id is None:
        with pytest.raises(catalog.UnknownName, match=f"model '{name}'"):
            catalog.find_architecture(MEASUREMENTS, name)


#: accelerator names as nvidia-smi, clouds, papers and benchmark tables write them, and the hardware row each reads as
#: (None: refused, as unknown or ambiguous: a product the table lacks is not read as a neighbour)
WRITTEN_GPU_NAMES = [
    ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"), ("H100 SXM", "h100-sxm5-80gb"), ("H100-SXM5-80GB", "h100-sxm5-80gb"),
    ("H100 (SXM)", "h100-sxm5-80gb"), ("H100 80GB", "h100-sxm5-80gb"), ("A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("A100 80GB PCIe", "a100-pcie-80gb"), ("A100 SXM 80GB", "a100-sxm4-80gb"), ("A100 (80GB)", "a100-sxm4-80gb"),
    ("8x A100", "a100-sxm4-80gb"), ("8xA100", "a100-sxm4-80gb"), ("8 x H100", "h100-sxm5-80gb"),
    ("8× H100 SXM", "h100-sxm5-80gb"), ("H100 x8", "h100-sxm5-80gb"), ("NVIDIA GB200 NVL72", "gb200"),
    ("GB200 NVL72", "gb200"), ("B200 180GB", "b200"), ("HGX B200", "b200"), ("DGX B200", "b200"),
    ("GB300 NVL72", "gb300"), ("H200", "h200-sxm-141gb"), ("H200 141GB", "h200-sxm-141gb"), ("MI300X", "mi300x"),
    ("AMD Instinct MI300X", "mi300x"), ("AMD Instinct MI250X", "mi250x"), ("MI325X", "mi325x"), ("TPU v5p", "tpu-v5p"),
    ("v5p", "tpu-v5p"), ("TPU v5e", "tpu-v5e"), ("v5e", "tpu-v5e"), ("TPUv4", "tpu-v4"), ("Trillium", "tpu-v6e"),
    ("Gaudi 2", "gaudi2"), ("Gaudi2", "gaudi2"), ("Intel Gaudi 2", "gaudi2"), ("HL-325L", "gaudi3"), ("H800", "h800-sxm5-80gb"),
    ("L40S", "l40s"), ("Trn2", "trn2"), ("DGX A100", "a100-sxm4-80gb"), ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("A100-PCIE-80GB", "a100-pcie-80gb"),
    ("HL-225", None),  # Gaudi 2's OAM card: its model number is not a Gaudi 3's
    ("L40", "l40"), ("V100S", None),  # NVIDIA's "S" parts are other products than the L40 and V100
    ("GTX 1080", None), ("GTX 1080 Ti", "gtx-1080-ti"),  # nor the GTX 1080 a 1080 Ti
    ("H20", "h20"), ("A10G", None), ("Inferentia2", None), ("TPU v5", None), ("8x", None),
    # cloud instance types (measurements/cloud_prices.csv); an instance size names no chip: p9 is no Trn2
    ("p5.48xlarge", "h100-sxm5-80gb"), ("p4d.24xlarge", "a100-sxm4-40gb"), ("a3-megagpu-8g", "h100-sxm5-80gb"),
    ("p5en.48xlarge", "h200-sxm-141gb"), ("trn2.48xlarge", "trn2"), ("p9.48xlarge", None),
]


@pytest.mark.parametrize("name, hw_id", WRITTEN_GPU_NAMES)
def test_gpu_names_as_papers_and_tables_write_them(name, hw_id):
    hw = catalog.hardware(MEASUREMENTS)
    if hw_id is None:
        with pytest.raises(catalog.UnknownName, match=f"hardware '{name}'"):
            catalog.resolve_gpu(hw, name)
        return
    row, note = catalog.resolve_gpu(hw, name)
    assert row["id"] == hw_id
    if name.lower().startswith("8") or name.endswith("x8"):  # a count written with the name: said so
        assert note.startswith(f"'{name}': ignoring the count") and f"using {hw_id}" in note
    ids, _ = catalog.resolve_gpu_column(pl.Series("gpu", [name]), hw)
    assert ids[0] == hw_id


# ---------------------------------------------------------------- InternLM2, Qwen1.5-72B, Yi-9B, Codestral, ChatGLM3,
# ---------------------------------------------------------------- Cerebras-GPT, MiniCPM, Hunyuan-Large, DeepSeek-Coder-V2

#: rows added for these models (measurements/architectures.csv: source and notes give each config and count)
ADDED_ROWS = ("internlm2-7b", "internlm2-20b", "qwen1.5-72b", "yi-9b", "codestral-22b", "chatglm3-6b",
              "cerebras-gpt-13b", "minicpm-2b", "hunyuan-large")

#: the names users write for them, and the row each reads as; DeepSeek-Coder-V2 (-Lite) are aliases of the DeepSeek-V2
#: (-Lite) rows, whose shapes they have. None: not in the table (Snowflake Arctic: its released configs disagree on the
#: KV heads; MiniCPM-2B-128k has another vocabulary and untied embeddings). DeepSeek-V2.5 has DeepSeek-V2's shape (its
#: config.json as two quantized copies quote it) and is an alias of that row
ADDED_NAMES = [
    ("InternLM2-7B", "internlm2-7b"), ("internlm/internlm2-7b", "internlm2-7b"),
    ("internlm/internlm2-chat-7b", "internlm2-7b"), ("InternLM2.5-7B", "internlm2-7b"),
    ("InternLM2-20B", "internlm2-20b"), ("internlm/internlm2-20b", "internlm2-20b"),
    ("internlm2-chat-20b", "internlm2-20b"), ("internlm/internlm2_5-20b-chat", "internlm2-20b"),
    ("Qwen1.5-72B", "qwen1.5-72b"), ("Qwen/Qwen1.5-72B", "qwen1.5-72b"), ("Qwen/Qwen1.5-72B-Chat", "qwen1.5-72b"),
    ("Yi-1.5-9B", "yi-9b"), ("01-ai/Yi-1.5-9B", "yi-9b"), ("Yi-1.5-9B-Chat", "yi-9b"), ("Yi-9B", "yi-9b"),
    ("Codestral 22B", "codestral-22b"), ("Codestral-22B-v0.1", "codestral-22b"),
    ("mistralai/Codestral-22B-v0.1", "codestral-22b"),
    ("ChatGLM3-6B", "chatglm3-6b"), ("THUDM/chatglm3-6b", "chatglm3-6b"), ("chatglm3-6b-base", "chatglm3-6b"),
    ("ChatGLM2-6B", "chatglm3-6b"),
    ("Cerebras-GPT 13B", "cerebras-gpt-13b"), ("cerebras/Cerebras-GPT-13B", "cerebras-gpt-13b"),
    ("MiniCPM-2B", "minicpm-2b"), ("openbmb/MiniCPM-2B-sft-bf16", "minicpm-2b"), ("MiniCPM-2B-sft-bf16", "minicpm-2b"),
    ("Hunyuan-Large", "hunyuan-large"), ("tencent/Tencent-Hunyuan-Large", "hunyuan-large"),
    ("Hunyuan-A52B-Instruct", "hunyuan-large"),
    ("DeepSeek-Coder-V2", "deepseek-v2"), ("deepseek-ai/DeepSeek-Coder-V2-Instruct", "deepseek-v2"),
    ("DeepSeek-Coder-V2-Base", "deepseek-v2"), ("DeepSeek-Coder-V2-Lite", "deepseek-v2-lite"),
    ("deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct", "deepseek-v2-lite"),
    ("DeepSeek-V2", "deepseek-v2"), ("DeepSeek-V2-Lite", "deepseek-v2-lite"),  # the rows' own names still reach them
    ("Snowflake Arctic", None), ("Snowflake/snowflake-arctic-base", None), ("MiniCPM-2B-128k", None),
    ("DeepSeek-V2.5", "deepseek-v2"), ("deepseek-ai/DeepSeek-V2.5", "deepseek-v2"), ("DeepSeek-V2.5-1210", "deepseek-v2"),
]


@pytest.mark.parametrize("name, arch_id", ADDED_NAMES)
def test_added_model_names_resolve_to_their_rows(name, arch_id):
    """`--model` and a runs file's model_name read each name as the same row (or refuse it alike)."""
    got = catalog.fill_from_architectures(pl.DataFrame({"model_name": [name]}), MEASUREMENTS)
    assert got["arch_id"][0] == arch_id
    if arch_id is None:
        with pytest.raises(catalog.UnknownName, match=f"unknown model '{name}'"):
            catalog.find_architecture(MEASUREMENTS, name)
    else:
        assert catalog.find_architecture(MEASUREMENTS, name)["id"] == arch_id


def test_every_name_of_the_added_rows_reaches_its_row():
    arch = catalog.architectures(MEASUREMENTS)
    assert catalog.ambiguous_arch_keys(arch) == {}
    added = arch.filter(arch["id"].is_in(ADDED_ROWS))
    assert added.height == len(ADDED_ROWS)
    for r in added.iter_rows(named=True):
        for name in [r["id"], r["name"], *(r["aliases"] or "").split("|")]:
            if name:
                assert catalog.find_architecture(MEASUREMENTS, name)["id"] == r["id"], name


#: (row, published size in billions, tolerance, whether that size leaves out the embedding matrices): 2% for a
#: published count (tests/test_architectures_table.py), 6% where the size is only the nominal one in the model's name
PUBLISHED_SIZES = [
    ("yi-9b", 8.83, 0.02, False),  # 01.AI, Yi-9B: 0.26 x 2 embedding + 8.31 non-embedding = 8.83B
    ("hunyuan-large", 389, 0.02, False),  # Hunyuan-Large report: 389B total
    ("minicpm-2b", 2.4, 0.02, True),  # MiniCPM card: 2.4B parameters excluding embeddings
    ("internlm2-7b", 7, 0.06, True),  # the name's 7B (6.98B without the two untied 92544-row matrices)
    ("internlm2-20b", 20, 0.06, False), ("qwen1.5-72b", 72, 0.06, False), ("codestral-22b", 22, 0.06, False),
    ("chatglm3-6b", 6, 0.06, False), ("cerebras-gpt-13b", 13, 0.06, False),
]


@pytest.mark.parametrize("arch_id, published_b, rel, without_embedding", PUBLISHED_SIZES)
def test_added_rows_count_their_published_size(arch_id, published_b, rel, without_embedding):
    """models/arch/accounting.py's count of each added row is its params_b (published, nominal or, where notes say so,
    counted from the shape) and the published size within the tolerance above."""
    from tests.test_archfile import counts, table_row

    a = table_row(arch_id)
    pc = counts(a)
    total, active = pc["params"] / 1e9, pc["active_params"] / 1e9
    assert total == pytest.approx(a["params_b"], rel=rel), (arch_id, total)
    assert active == pytest.approx(a["active_params_b"], rel=rel), (arch_id, active)
    if without_embedding:
        total -= a["vocab"] * a["d_model"] * (1 if a["tied_embeddings"] else 2) / 1e9
    assert total == pytest.approx(published_b, rel=rel), (arch_id, total, a["source"])


def test_added_moe_and_attention_layouts():
    """Hunyuan-Large: every layer 16 routed experts of 18304, top-1, and one shared expert of the same width (52B active
    published: counted 51.6B with the tied embedding once); ChatGLM3-6B: multi-query attention with 2 KV groups."""
    from tests.test_archfile import counts, table_row

    h = table_row("hunyuan-large")
    assert tuple(h[c] for c in ("n_experts", "top_k", "expert_ffn_dim", "n_shared_experts", "n_dense_layers",
                                "ffn_dim")) == (16, 1, 18304, 1, 0, 18304)
    assert counts(h)["active_params"] / 1e9 == pytest.approx(52, rel=0.02)
    assert (table_row("chatglm3-6b")["n_heads"], table_row("chatglm3-6b")["n_kv_heads"]) == (32, 2)
    assert table_row("qwen1.5-72b")["n_kv_heads"] == 64  # MHA: Qwen1.5 has GQA only in 32B and 110B
