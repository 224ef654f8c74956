"""Full recompute under XLA skips each layer's last GEMM (models.physics.parts.remat_skipped_gemm): JAX's remat stages only
what the backward needs (jax/_src/ad_checkpoint.py remat_partial_eval, pe.dce_jaxpr), and the MLP's down-projection
output is not needed by its own backward. PyTorch's and Megatron-Core's checkpoints recompute it."""

from __future__ import annotations

import polars as pl
import pytest

from models.physics.step_time import predict
from pipeline.predict_runs import predict_frame
from pipeline.settings import Settings
from tests.test_step_time import cfg, hw  # noqa: F401 (hw is a fixture)


@pytest.fixture(autouse=True)
def no_store(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "none" / "stepcast.duckdb"))


def test_palm_540b_hardware_over_model_flops_is_the_published_ratio():
    """PaLM 540B on 6,144 TPU v4 (T5X/JAX, rematerialization): 46.2% MFU and 57.8% HFU (Chowdhery et al. 2022,
    section 4.1 and Appendix B), a ratio of 1.251. Recomputing the whole forward would make it 1.33 (6.3% high);
    without the down-projection it is 1.23 (PaLM's parallel layers also skip the attention output projection,
    1.22: within 3% either way)."""
    runs = pl.read_csv(Settings.load().measurements / "measured_runs.csv", infer_schema_length=0)
    run = predict_frame(runs.filter(pl.col("run_id") == "palm_540b"), Settings.load().measurements).row(0, named=True)
    assert "full recompute under XLA" in run["assumptions"]
    assert run["hfu"] / run["mfu"] == pytest.approx(57.8 / 46.2, rel=0.03)
    assert abs(run["hfu"] / run["mfu"] - 4.0 / 3.0) > 0.06


def test_only_full_recompute_on_an_xla_row_skips_the_down_projection(hw):
    """The same GPU row compiled by XLA (``xla_compiled`` 1) or not: full recompute is cheaper by the down-projection
    GEMM, and its hardware FLOPs per token drop by exactly 2 x d_model x ffn_dim per layer (HFU / MFU is hardware /
    model FLOPs); selective recompute and no recompute are unchanged."""
    n_layers, d, ffn, s, vocab = 96, 12288, 49152, 2048, 51200  # the `cfg` GPT-175B shape (gelu: 2 MLP GEMMs)
    model_fpt = 6.0 * (n_layers * (4 * d * d + 2 * d * ffn) + vocab * d) + 12.0 * n_layers * s * d
    for rc in ("full", "selective", "none"):
        base = cfg(hw, recompute=rc, n_gpus=512, dp=8, global_batch_seqs=512)
        out = predict(pl.concat([base, base.with_columns(pl.lit(1.0).alias("xla_compiled"))], how="diagonal"))
        plain, xla = out.row(0, named=True), out.row(1, named=True)
        assert plain["error"] is None and xla["error"] is None
        if rc == "full":
            assert xla["step_time_s"] < plain["step_time_s"]
            assert xla["hfu"] / xla["mfu"] == pytest.approx(
                plain["hfu"] / plain["mfu"] - 2.0 * n_layers * d * ffn / model_fpt, rel=1e-9)
        else:
            assert xla["step_time_s"] == pytest.approx(plain["step_time_s"], rel=1e-12)
            assert xla["hfu"] / xla["mfu"] == pytest.approx(plain["hfu"] / plain["mfu"], rel=1e-12)


def test_a_tpu_and_an_xla_stack_on_a_gpu_say_so_and_a_megatron_run_does_not():
    """The assumption is listed where it applies: a TPU row and MaxText on a GPU with full recompute; a Megatron-LM
    row on the same GPU recomputes the whole forward and does not carry it."""
    def row(gpu, framework):
        frame = pl.DataFrame({"run_id": ["r"], "model_name": ["llama2-70b"], "gpu": [gpu], "n_gpus": [256],
                              "framework": [framework], "year": [2024], "seq_len": [4096],
                              "global_batch_seqs": [512], "tp": [8], "pp": [1], "sharding": ["fsdp"],
                              "recompute": ["full"], "metric": ["tokens_per_s_per_gpu"], "value": [500.0]})
        return predict_frame(frame, Settings.load().measurements).row(0, named=True)

    note = "full recompute under XLA"
    assert note in row("tpu-v5p", "MaxText")["assumptions"]
    assert note in row("h100-sxm5-80gb", "MaxText")["assumptions"]
    assert note not in (row("h100-sxm5-80gb", "Megatron-LM")["assumptions"] or "")


def test_predict_on_a_tpu_says_which_xla_rules_answered():
    """`stepcast predict` on a TPU lists the XLA rules its step used (one model, one answer with `--runs`); on a GPU
    the same flags list neither."""
    import json

    from typer.testing import CliRunner

    from pipeline.cli import app

    def assumptions(gpu):
        res = CliRunner().invoke(app, ["predict", "-m", "llama3-70b", "--gpu", gpu, "-n", "256", "-b", "512", "-s", "4096",
                                       "--tp", "8", "--recompute", "full", "--sharding", "fsdp", "--format", "json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout[res.stdout.index("["):])[0]["assumptions"]

    tpu, gpu = assumptions("tpu-v5p"), assumptions("h100-sxm5-80gb")
    for note in ("full recompute under XLA", "TP traffic hidden behind the matmuls"):
        assert note in tpu and note not in gpu
