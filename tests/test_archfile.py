"""Architectures and hardware from files (models/arch/archfile.py via catalog.resolve_architecture /
resolve_hardware_row), and the parameter counts of the architecture families added in issue 14."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from models.arch.accounting import ARCH_COLUMNS, param_counts
from models.arch.archfile import ArchFileError, architecture_from_mapping, hardware_from_mapping
from pipeline import catalog
from pipeline.cli import app
from tests.conftest import MEASUREMENTS

HF = Path(__file__).parent / "data" / "hf"
runner = CliRunner()


@pytest.fixture(autouse=True)
def no_store(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "none" / "stepcast.duckdb"))


def table_row(arch_id: str) -> dict:
    return catalog.find_architecture(MEASUREMENTS, arch_id)


def counts(arch: dict) -> dict[str, float]:
    a = {c: np.array([np.nan if arch.get(c) is None else float(arch[c])]) for c in ARCH_COLUMNS if c != "activation"}
    a["activation"] = np.array([arch["activation"]])
    pc = param_counts(a)
    return {k: float(v[0]) for k, v in pc.items()}


SHAPE = ("n_layers", "d_model", "n_heads", "n_kv_heads", "vocab", "n_experts", "top_k", "expert_ffn_dim",
         "n_shared_experts", "n_dense_layers", "tied_embeddings", "activation")


@pytest.mark.parametrize("file, arch_id", [
    ("llama-3-8b.json", "llama3-8b"), ("mixtral-8x7b.json", "mixtral-8x7b"),
    ("qwen3-30b-a3b.json", "qwen3-30b-a3b"), ("deepseek-v3.json", "deepseek-v3"),
    ("gpt-oss-20b.json", "gpt-oss-20b"),
    ("qwen1.5-moe-a2.7b.json", "qwen1.5-moe-a2.7b"),  # a shared expert 4 experts wide (5632 = 4 x 1408)
])
def test_hugging_face_config_round_trips_to_the_table_row(file, arch_id):
    from_file = catalog.resolve_architecture(None, HF / file)
    row = table_row(arch_id)
    for c in SHAPE:
        assert from_file[c] == row[c] or (not from_file[c] and not row[c]), c
    assert counts(from_file) == pytest.approx(counts(row), rel=1e-12)


def test_deepseek_mla_and_mtp_fields_are_kept():
    d = catalog.resolve_architecture(None, HF / "deepseek-v3.json")
    row = table_row("deepseek-v3")
    for c in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "mtp_layers"):
        assert d[c] == row[c], c
    assert (d["q_lora_rank"], d["kv_lora_rank"], d["qk_rope_head_dim"], d["mtp_layers"]) == (1536, 512, 64, 1)


def test_nemotron_h_config_round_trips_including_the_mamba_fields():
    d = catalog.resolve_architecture(None, HF / "nemotron-h-8b.json")
    row = table_row("nemotron-h-8b")
    for c in SHAPE + ("ffn_dim", "head_dim", "arch", "layer_pattern", "mamba_state_dim", "mamba_n_heads",
                      "mamba_head_dim", "mamba_n_groups", "mamba_chunk_size", "mamba_conv_kernel", "mamba_expand"):
        assert d[c] == row[c] or (not d[c] and not row[c]), c
    assert d["arch"] == "hybrid-mamba" and d["layer_pattern"].count("*") == 4
    assert d["id"] == "nemotron-h-8b"  # named after the file (a file called config.json: after its class)


# ---------------------------------------------------------------- published totals

@pytest.mark.parametrize("arch_id, total_b, active_b, rel, source", [
    ("mixtral-8x7b", 46.7, 12.9, 0.01, "Jiang et al. 2024 (arXiv:2401.04088)"),
    ("qwen3-30b-a3b", 30.5, 3.3, 0.02, "Qwen/Qwen3-30B-A3B model card"),
    ("qwen3-235b-a22b", 235.0, 22.0, 0.02, "Qwen/Qwen3-235B-A22B model card"),
    ("llama4-maverick", 400.0, 17.0, 0.02, "Meta Llama 4 model card"),
    ("qwen3-8b", 8.2, 8.2, 0.01, "Qwen/Qwen3-8B model card"),
    ("qwen3-0.6b", 0.6, 0.6, 0.02, "Qwen/Qwen3-0.6B model card"),
])
def test_parameter_counts_match_published_totals(arch_id, total_b, active_b, rel, source):
    c = counts(table_row(arch_id))
    assert c["params"] / 1e9 == pytest.approx(total_b, rel=rel), source
    assert c["active_params"] / 1e9 == pytest.approx(active_b, rel=rel), source


def test_grok1_total_matches_the_readme():
    # xai-org/grok-1 README: 314B; the count has no biases, so within 1%
    assert counts(table_row("grok-1"))["params"] / 1e9 == pytest.approx(314, rel=0.01)


def test_gpt_oss_20b_matches_the_model_card():
    # OpenAI gpt-oss model card: 20.9B total, 3.6B active counting the unembedding but not the input embedding
    row = table_row("gpt-oss-20b")
    c = counts(row)
    assert c["params"] / 1e9 == pytest.approx(20.9, rel=0.01)
    assert (c["active_params"] - row["vocab"] * row["d_model"]) / 1e9 == pytest.approx(3.6, rel=0.02)


def mla_minus_mha_per_layer(a: dict) -> float:
    """MLA attention weights (DeepSeek-V2 Section 2.1: q down/up, kv down with the shared rope key, kv up, output)
    minus the n_heads x v_head_dim MHA count of the same row without its MLA fields."""
    h, heads = a["d_model"], a["n_heads"]
    qk = a["qk_nope_head_dim"] + a["qk_rope_head_dim"]
    mla = (h * a["q_lora_rank"] + a["q_lora_rank"] * heads * qk + h * (a["kv_lora_rank"] + a["qk_rope_head_dim"])
           + a["kv_lora_rank"] * heads * (a["qk_nope_head_dim"] + a["v_head_dim"]) + heads * a["v_head_dim"] * h)
    mha = 4 * h * heads * a["v_head_dim"]
    return mla - mha


@pytest.mark.parametrize("arch_id, total_b, active_b, rel, source", [
    ("deepseek-v3", 671, 37, 0.02, "DeepSeek-AI 2024 (arXiv:2412.19437): 671B total, 37B active"),
    ("deepseek-v2", 236, 21, 0.02, "DeepSeek-AI 2024 (arXiv:2405.04434): 236B total, 21B active"),
    ("kimi-k2", 1000, 32, 0.03, "moonshotai/Kimi-K2 model card: 1T total, 32B active"),
])
def test_mla_fields_reproduce_published_totals(arch_id, total_b, active_b, rel, source):
    """With the MLA fields the table keeps, models/arch/accounting.py counts MLA attention (models/arch/mla.py) and the
    published totals come out; without them it counts n_heads x v_head_dim MHA, larger by the hand-written
    MLA - MHA difference per layer (the latent norms aside)."""
    a = table_row(arch_id)
    mla_cols = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    arr = {c: np.array([np.nan if a.get(c) is None else float(a[c])]) for c in ARCH_COLUMNS + mla_cols
           if c != "activation"} | {"activation": np.array([a["activation"]])}
    c = {k: float(v[0]) for k, v in param_counts(arr).items()}
    mha = counts(a)
    assert c["params"] / 1e9 == pytest.approx(total_b, rel=rel), source
    assert c["active_params"] / 1e9 == pytest.approx(active_b, rel=rel), source
    norms = a["n_layers"] * (a["q_lora_rank"] + a["kv_lora_rank"])
    assert c["params"] - mha["params"] == pytest.approx(a["n_layers"] * mla_minus_mha_per_layer(a) + norms)


def hybrid_params(a: dict) -> float:
    """Nemotron-H weights from layer_pattern and the Mamba fields: Mamba-2 blocks (Megatron-Core MambaMixer:
    in_proj to z, x, B, C, dt; depthwise conv over x, B, C; dt bias, A, D; gated norm; out_proj), attention
    blocks (GQA), squared-ReLU MLP blocks (2 matrices), a norm per block, untied embeddings and final norm."""
    h, p = a["d_model"], a["layer_pattern"]
    d_inner = a["mamba_n_heads"] * a["mamba_head_dim"]
    bc = 2 * a["mamba_n_groups"] * a["mamba_state_dim"]
    conv = (a["mamba_conv_kernel"] or 4) + 1  # width 4 (Nemotron-H configs) + bias
    mamba = (h * (2 * d_inner + bc + a["mamba_n_heads"]) + (d_inner + bc) * conv + 3 * a["mamba_n_heads"]
             + d_inner + d_inner * h)
    attn = 2 * h * (a["n_heads"] + a["n_kv_heads"]) * a["head_dim"]
    mlp = 2 * h * a["ffn_dim"]
    per_block = {"M": mamba, "*": attn, "-": mlp}
    return sum(per_block[b] + h for b in p) + 2 * a["vocab"] * h + h


@pytest.mark.parametrize("arch_id, total_b, rel, source", [
    ("nemotron-h-8b", 8.0, 0.02, "Nemotron-H paper (arXiv:2504.03624): 8B"),
    ("nemotron-h-47b", 47.0, 0.02, "Nemotron-H paper: 47B"),
    ("nemotron-h-56b", 56.0, 0.02, "Nemotron-H paper: 56B"),
])
def test_nemotron_h_fields_reproduce_published_totals(arch_id, total_b, rel, source):
    """The pattern and Mamba fields the table keeps give the published sizes (models/arch/accounting.py counts the same:
    tests/test_hybrid.py)."""
    assert hybrid_params(table_row(arch_id)) / 1e9 == pytest.approx(total_b, rel=rel), source


# ---------------------------------------------------------------- files and errors

def test_schema_row_file_csv_and_json(tmp_path):
    row = catalog.architectures(MEASUREMENTS).filter(pl.col("id") == "llama3-70b")
    row.write_csv(tmp_path / "a.csv")
    (tmp_path / "a.json").write_text(json.dumps(row.to_dicts()[0]))
    for f in ("a.csv", "a.json"):
        d = catalog.resolve_architecture(None, tmp_path / f)
        assert counts(d) == pytest.approx(counts(table_row("llama3-70b")), rel=1e-12)
        assert d["id"] == "llama3-70b"


def test_several_rows_need_a_name(tmp_path):
    catalog.architectures(MEASUREMENTS).head(3).write_csv(tmp_path / "three.csv")
    with pytest.raises(catalog.UnknownName, match="three.csv: 3 rows; give a file with one row"):
        catalog.resolve_architecture(None, tmp_path / "three.csv")
    assert catalog.resolve_architecture("GPT3-5B", tmp_path / "three.csv")["id"] == "gpt3-5b"


@pytest.mark.parametrize("drop, key", [("num_hidden_layers", "num_hidden_layers"), ("vocab_size", "vocab_size")])
def test_hugging_face_config_missing_key_is_named(tmp_path, drop, key):
    cfg = json.loads((HF / "mixtral-8x7b.json").read_text())
    del cfg[drop]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(catalog.UnknownName, match=rf"config.json: Hugging Face config \(model_type 'mixtral'\) "
                                                  rf"lacks the key '{key}'"):
        catalog.resolve_architecture(None, tmp_path / "config.json")


def test_mla_config_without_kv_lora_rank_is_refused():
    cfg = json.loads((HF / "deepseek-v3.json").read_text())
    del cfg["kv_lora_rank"]
    with pytest.raises(ArchFileError, match="x.json: .*'deepseek_v3'.* lacks the key 'kv_lora_rank'"):
        architecture_from_mapping(cfg, "x.json")


def test_nemotron_pattern_must_match_the_layer_count():
    cfg = json.loads((HF / "nemotron-h-8b.json").read_text())
    cfg["num_hidden_layers"] = 50
    with pytest.raises(ArchFileError, match="hybrid_override_pattern has 52 blocks but num_hidden_layers is 50"):
        architecture_from_mapping(cfg, "nh.json")


def test_unsupported_model_type_lists_the_supported_ones():
    with pytest.raises(ArchFileError, match="model_type 'bert' is not supported; supported: llama, .*nemotron_h"):
        architecture_from_mapping({"model_type": "bert", "hidden_size": 768}, "bert.json")


def test_schema_row_missing_columns_and_bad_values():
    with pytest.raises(ArchFileError, match="r.csv: architecture row lacks 'ffn_dim', 'vocab'"):
        architecture_from_mapping({"n_layers": "2", "d_model": "64", "n_heads": "4"}, "r.csv")
    with pytest.raises(ArchFileError, match="r.csv: 'n_layers' = 'two' is not a number"):
        architecture_from_mapping({"n_layers": "two", "d_model": "64", "n_heads": "4", "ffn_dim": "256",
                                   "vocab": "100"}, "r.csv")
    with pytest.raises(ArchFileError, match="arch 'moe' but 'n_experts' is empty"):
        architecture_from_mapping({"n_layers": "2", "d_model": "64", "n_heads": "4", "ffn_dim": "256",
                                   "vocab": "100", "arch": "moe"}, "r.csv")


def test_hardware_file_row_and_errors(tmp_path):
    h100 = catalog.hardware(MEASUREMENTS).filter(pl.col("id") == "h100-sxm5-80gb").to_dicts()[0]
    (tmp_path / "hw.json").write_text(json.dumps(dict(h100, id="my-h100")))
    row = catalog.resolve_hardware_row(None, tmp_path / "hw.json")
    assert row["id"] == "my-h100" and row["peak_bf16_tflops"] == pytest.approx(989.4)
    with pytest.raises(ArchFileError, match="hw.csv: hardware row lacks 'memory_bw_gbps'"):
        hardware_from_mapping(dict(h100, memory_bw_gbps=""), "hw.csv")
    with pytest.raises(ArchFileError, match="has no peak"):
        hardware_from_mapping({k: (None if k.startswith("peak_") else v) for k, v in h100.items()}, "hw.csv")


def test_predict_arch_file_equals_the_named_model(tmp_path):
    common = ["--gpus", "64", "--global-batch", "128", "--seq-len", "8192", "--format", "json",
              "--analytical-only"]
    by_name = runner.invoke(app, ["predict", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb"] + common)
    h100 = catalog.hardware(MEASUREMENTS).filter(pl.col("id") == "h100-sxm5-80gb").to_dicts()[0]
    (tmp_path / "hw.json").write_text(json.dumps(dict(h100, id="my-h100")))
    by_file = runner.invoke(app, ["predict", "--arch-file", str(HF / "llama-3-8b.json"),
                                  "--hardware-file", str(tmp_path / "hw.json")] + common)
    assert by_name.exit_code == 0 and by_file.exit_code == 0, by_file.output
    a, b = json.loads(by_name.stdout)[0], json.loads(by_file.stdout)[0]
    assert b["step_time_s"] == pytest.approx(a["step_time_s"], rel=1e-12)
    assert b["params"] == pytest.approx(a["params"], rel=1e-12)


def test_predict_arch_file_error_exits_2(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    result = runner.invoke(app, ["predict", "--arch-file", str(tmp_path / "c.json"), "--gpu", "H100", "--gpus",
                                 "8", "--global-batch", "8", "--seq-len", "512"])
    assert result.exit_code == 2 and "lacks the key 'num_attention_heads'" in result.stderr
