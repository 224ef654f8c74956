"""Hugging Face config.json files of the Gemma, Phi-3, OLMo, Falcon and GPT-NeoX families (`--arch-file`,
models/arch/archfile.py): each reads into the row of measurements/architectures.csv for the same model, its
parameter count matches the published one, and what the step-time model cannot express is said in `notes` and in
a prediction's `assumptions`. The files are in tests/data/hf (README.md there says where each is from)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from models.arch.archfile import ArchFileError, architecture_from_mapping
from pipeline import catalog
from pipeline.cli import app
from tests.test_archfile import SHAPE, counts, table_row

HF = Path(__file__).parent / "data" / "hf"
runner = CliRunner()


def read(file: str) -> dict:
    return catalog.resolve_architecture(None, HF / file)


@pytest.mark.parametrize("file, arch_id", [
    ("gemma-7b.json", "gemma-7b"), ("gemma-2-9b.json", "gemma2-9b"), ("gemma-3-1b.json", "gemma3-1b"),
    ("gemma-3-27b.json", "gemma3-27b"), ("phi-3-mini-4k-instruct.json", "phi-3-mini"),
    ("olmo-2-1124-7b.json", "olmo2-7b"), ("olmo-2-1124-13b.json", "olmo2-13b"), ("olmo-7b-hf.json", "olmo-7b"),
    ("olmo-7b.json", "olmo-7b"), ("falcon-7b.json", "falcon-7b"), ("falcon-40b.json", "falcon-40b"),
    ("falcon-40b-refinedweb.json", "falcon-40b"), ("gpt-neox-20b.json", "gpt-neox-20b"),
    ("pythia-6.9b.json", "pythia-6.9b"),
])
def test_config_reads_into_the_table_row(file, arch_id):
    d, row = read(file), table_row(arch_id)
    for c in SHAPE + ("ffn_dim",):
        assert d[c] == row[c] or (not d[c] and not row[c]), c
    assert counts(d) == pytest.approx(counts(row), rel=1e-12)
    if row["sliding_window"]:
        assert d["sliding_window"] == row["sliding_window"]


@pytest.mark.parametrize("file, published, rel, source", [
    ("gemma-7b.json", 8_538_074_112, 0.005, "Gemma Team 2024 (arXiv:2403.08295) Table 2: 786,825,216 embedding + "
                                            "7,751,248,896 non-embedding"),
    ("gemma-2-9b.json", 9_242_230_784, 0.005, "Gemma 2 report (arXiv:2408.00118) Table 2: 918,028,800 embedding + "
                                              "8,324,201,984 non-embedding"),
    ("gemma-3-1b.json", 1_000e6, 0.005, "Gemma 3 report (arXiv:2503.19786) Table 1: 302M embedding + 698M "
                                        "non-embedding"),
    ("gemma-3-27b.json", 27_016e6, 0.005, "Gemma 3 report Table 1: 1,416M embedding + 25,600M non-embedding (the "
                                          "417M vision encoder apart)"),
    ("phi-3-mini-4k-instruct.json", 3.8e9, 0.02, "Abdin et al. 2024 (arXiv:2404.14219): phi-3-mini, 3.8B"),
    ("olmo-2-1124-13b.json", 13_716_198_400, 0.001, "allenai/OLMo-2-1124-13B model.safetensors.index.json: "
                                                    "total_size 54,864,793,600 bytes of float32 weights"),
    ("olmo-7b.json", 7e9, 0.02, "Groeneveld et al. 2024 (arXiv:2402.00838): OLMo 7B"),
    ("falcon-7b.json", 7e9, 0.02, "Almazrouei et al. 2023 (arXiv:2311.16867): Falcon-7B"),
    ("gpt-neox-20b.json", 20_554_567_680, 0.001, "Black et al. 2022 (arXiv:2204.06745): 20,554,567,680"),
    ("pythia-6.9b.json", 6_857_302_016, 0.001, "Biderman et al. 2023 (arXiv:2304.01373) Table 1: 6,857,302,016"),
])
def test_parameter_count_matches_the_published_one(file, published, rel, source):
    assert counts(read(file))["params"] == pytest.approx(published, rel=rel), source


def falcon_module_params(h: int, heads: int, kv: int, layers: int, vocab: int, ffn: int, norms: int) -> int:
    """transformers FalconForCausalLM weights: query_key_value (heads + 2 kv) x head_dim out, dense, the
    4h MLP, `norms` LayerNorms (weight + bias) per layer, the tied embedding and ln_f; no linear biases."""
    hd = h // heads
    layer = h * (heads + 2 * kv) * hd + h * h + 2 * h * ffn + norms * 2 * h
    return layers * layer + vocab * h + 2 * h


def test_falcon_attention_variants_follow_falcon_attention():
    """Key-value heads as transformers' FalconAttention sizes query_key_value: num_kv_heads under the new decoder
    architecture (40B), one under multi_query (7B), every head otherwise; the weights then match the module's
    count within the GPT-style biases the gelu accounting adds (< 0.1%). Falcon-40B is 41.3B against its nominal 40B
    (the shape is exact: tests/test_architectures_table.py keeps it among the nominal sizes)."""
    f40 = read("falcon-40b.json")
    assert f40["n_kv_heads"] == 8
    assert counts(f40)["params"] == pytest.approx(falcon_module_params(8192, 128, 8, 60, 65024, 32768, 2), rel=1e-3)
    f7 = read("falcon-7b.json")
    assert f7["n_kv_heads"] == 1 and f7["tied_embeddings"]
    assert counts(f7)["params"] == pytest.approx(falcon_module_params(4544, 71, 1, 32, 65024, 18176, 1), rel=1e-3)
    cfg = json.loads((HF / "falcon-7b.json").read_text())
    mha = architecture_from_mapping(dict(cfg, multi_query=False), "rw.json")
    assert mha["n_kv_heads"] == 71
    # the first falcon-7b config: RefinedWebModel code, RefinedWeb keys
    old = {k: v for k, v in cfg.items() if k not in ("num_attention_heads", "num_hidden_layers", "model_type",
                                                      "new_decoder_architecture")}
    old.update(model_type="RefinedWebModel", n_head=71, n_layer=32, architectures=["RWForCausalLM"])
    assert counts(architecture_from_mapping(old, "rw.json")) == pytest.approx(counts(f7), rel=1e-12)


def test_gemma_defaults_tie_the_embeddings_and_gate_the_mlp():
    """GemmaConfig ties the embeddings by default and GemmaMLP is gated whatever hidden_act says: a config without
    tie_word_embeddings is tied; hidden_act gelu is still the 3-matrix MLP."""
    d = read("gemma-7b.json")
    assert d["tied_embeddings"] and d["activation"] == "swiglu" and d["head_dim"] == 256
    untied = architecture_from_mapping(dict(json.loads((HF / "gemma-7b.json").read_text()),
                                            tie_word_embeddings=False), "g.json")
    assert counts(untied)["params"] - counts(d)["params"] == pytest.approx(256000 * 3072)


def test_gemma3_multimodal_config_reads_the_text_model_over_the_text_defaults():
    """gemma-3-27b's text_config leaves vocab_size out: Gemma3TextConfig's 262208 applies; the vision tower is
    not counted and the notes say so."""
    d = read("gemma-3-27b.json")
    assert d["vocab"] == 262208 and d["sliding_window"] == 1024
    assert "vision tower" in d["notes"] and "52 of 62 layers" in d["notes"]


@pytest.mark.parametrize("file, phrases", [
    ("gemma-2-9b.json", ("every other layer", "attn_logit_softcapping and final_logit_softcapping not modelled",
                         "recorded as swiglu")),
    ("gemma-3-1b.json", ("512-token window on 22 of 26 layers",)),
    ("falcon-40b.json", ("in parallel", "no biases")),
    ("gpt-neox-20b.json", ("parallel residual", "rotary on 0.25")),
    ("phi-3-mini-4k-instruct.json", ("2047 tokens",)),
    ("olmo-2-1124-13b.json", ("QK-norm",)),
])
def test_notes_say_what_is_approximated(file, phrases):
    notes = read(file)["notes"]
    for p in phrases:
        assert p in notes, (p, notes)


def test_a_prediction_from_such_a_config_says_its_approximations(tmp_path):
    common = ["--gpu", "h100-sxm5-80gb", "--gpus", "64", "--global-batch", "128", "--seq-len", "8192",
              "--format", "json", "--analytical-only"]
    out = runner.invoke(app, ["predict", "--arch-file", str(HF / "gemma-2-9b.json")] + common)
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)[0]
    assert "architecture mapped from its config" in got["assumptions"] and "softcapping" in got["assumptions"]
    assert got["params"] == pytest.approx(counts(table_row("gemma2-9b"))["params"] , rel=1e-9)
    plain = json.loads(runner.invoke(app, ["predict", "--arch-file", str(HF / "llama-3-8b.json")] + common).stdout)
    assert "mapped from its config" not in plain[0]["assumptions"]


def test_a_falcon_with_a_gated_activation_is_refused_naming_the_key():
    cfg = dict(json.loads((HF / "falcon-7b.json").read_text()), activation="swiglu")
    with pytest.raises(ArchFileError, match=r"f.json: .*'falcon'.* has 'activation' = 'swiglu'; expected a "
                                            r"non-gated GELU"):
        architecture_from_mapping(cfg, "f.json")


@pytest.mark.parametrize("file, key", [("gemma-2-9b.json", "intermediate_size"),
                                       ("gpt-neox-20b.json", "num_hidden_layers"),
                                       ("falcon-40b.json", "vocab_size")])
def test_a_missing_key_is_named(file, key):
    cfg = json.loads((HF / file).read_text())
    del cfg[key]
    with pytest.raises(ArchFileError, match=f"x.json: .*lacks the key '{key}'"):
        architecture_from_mapping(cfg, "x.json")


def test_phimoe_config_reads_as_the_phi35_moe_row():
    """Phi-3.5-MoE (model_type phimoe): the transformers PhimoeConfig values the table row cites read into that row."""
    cfg = {"model_type": "phimoe", "architectures": ["PhimoeForCausalLM"], "vocab_size": 32064, "hidden_size": 4096,
           "intermediate_size": 6400, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "hidden_act": "silu", "num_local_experts": 16, "num_experts_per_tok": 2, "tie_word_embeddings": False}
    d, row = architecture_from_mapping(cfg, "phimoe.json"), table_row("phi-3.5-moe")
    for c in SHAPE + ("ffn_dim",):
        assert d[c] == row[c] or (not d[c] and not row[c]), c
    assert counts(d)["params"] / 1e9 == pytest.approx(41.9, rel=0.01)  # model card: 41.9B total
    assert counts(d)["active_params"] / 1e9 == pytest.approx(6.6, rel=0.01)  # 6.6B active
