"""MaxText remat policies (AI-Hypercomputer/maxtext decoders.py get_remat_policy): every policy word a run file
may carry is read, not refused; its save list sets the memory the device keeps and the recompute the backward
does (models.memory.model MAXTEXT_REMAT, _SAVE_LISTS, SAVE_LIST_RECOMPUTE; models.physics.parts.save_list_recompute)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from models.memory.model import MAXTEXT_REMAT, SAVE_LIST_RECOMPUTE
from models.physics.step_time import predict_arrays
from pipeline.cli import app
from tests.test_archfile import table_row
from tests.test_hybrid import arrays
from tests.test_step_time import config_rows, hw  # noqa: F401 (hw is a fixture)

runner = CliRunner()

#: the tensors each policy keeps (the names of get_remat_policy; minimal keeps every weight GEMM's output)
KEPT = {0: None, 1: None,
        2: {"q", "k", "v", "out", "wi", "wo"}, 3: {"q", "k", "v", "out", "wo"}, 4: {"q", "k", "v", "out"},
        5: {"q", "k", "v"}, 6: {"q", "k", "v", "context", "out"}, 7: {"q", "k", "v"},
        8: {"q", "k", "v", "out", "wi", "wo"}, 9: {"q", "k", "v", "out", "wi", "wo", "context"}, 10: {"out"}}


@pytest.fixture(autouse=True)
def no_store(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "none" / "stepcast.duckdb"))


def test_a_policy_that_keeps_more_never_recomputes_more():
    assert SAVE_LIST_RECOMPUTE.shape[0] == max(MAXTEXT_REMAT.values()) + 1
    for a, kept_a in KEPT.items():
        for b, kept_b in KEPT.items():
            if kept_a is not None and kept_b is not None and kept_a >= kept_b:
                assert (SAVE_LIST_RECOMPUTE[a] <= SAVE_LIST_RECOMPUTE[b]).all(), (a, b)
    # offloading moves the kept tensors to the host: the same recompute as keeping them on the device
    assert (SAVE_LIST_RECOMPUTE[MAXTEXT_REMAT["qkv_proj_offloaded"]] ==
            SAVE_LIST_RECOMPUTE[MAXTEXT_REMAT["save_qkv_proj"]]).all()


def _run(hw, code=None, recompute=1):  # noqa: F811
    """Llama 3.1 70B on 256 TPU v5p chips, FSDP over all of them, as MaxText runs it."""
    lay = dict(seq_len=8192.0, global_batch_seqs=512.0, micro_batch=2.0, n_gpus=256.0, tp=1.0, pp=1.0, dp=256.0,
               cp=1.0, ep=1.0, vpp=1.0, sharding=4, recompute=recompute, sequence_parallel=0.0, dtype=0,
               gpus_per_node=4.0)
    a = config_rows(arrays(table_row("llama3-70b")), hw, "tpu-v5p", lay)
    if code is not None:
        a["selective_policy"] = np.array([float(code)])
    return predict_arrays(a)


def test_save_lists_order_step_time_and_memory(hw):  # noqa: F811
    """Less kept, more recomputed: minimal_flash (dots and context kept) is fastest among the lists, then minimal
    (the attention core recomputed, as Megatron's selective), save_dot_except_mlp, save_qkv_proj, save_out_proj,
    and full recompute slowest; memory runs the other way, and the offloaded lists keep only the layer input."""
    t = {w: _run(hw, MAXTEXT_REMAT[w]) for w in MAXTEXT_REMAT}
    sel, full, none = _run(hw), _run(hw, recompute=2), _run(hw, recompute=0)
    step = {w: r["step_time_s"][0] for w, r in t.items()}
    assert step["minimal"] == pytest.approx(sel["step_time_s"][0], rel=1e-12)
    order = ["minimal_flash", "minimal", "save_dot_except_mlp", "save_qkv_proj", "save_out_proj"]
    times = [none["step_time_s"][0]] + [step[w] for w in order] + [full["step_time_s"][0]]
    assert all(x <= y for x, y in zip(times, times[1:])) and times[1] < times[3] < times[-1]
    assert step["qkv_proj_offloaded"] == step["save_qkv_proj"] and step["minimal_offloaded"] == step["minimal"]
    mem = {w: r["mem_activations_gb"][0] for w, r in t.items()}
    assert mem["qkv_proj_offloaded"] < mem["save_qkv_proj"] < mem["save_dot_except_mlp"] < mem["minimal"] \
        <= mem["minimal_flash"]
    assert mem["minimal_offloaded"] == mem["qkv_proj_offloaded"]


def test_rows_without_a_save_list_are_unchanged(hw):  # noqa: F811
    base = _run(hw)
    for code in (np.nan, 0.0, 1.0):
        same = _run(hw, code)
        assert same["step_time_s"][0] == base["step_time_s"][0]
    assert _run(hw, 5, recompute=2)["step_time_s"][0] == _run(hw, recompute=2)["step_time_s"][0]


def test_every_maxtext_policy_word_is_read_not_refused(tmp_path):
    """A run file may name the policy the MaxText config sets: each is predicted with its save list and says
    so; 'custom' (its tensors named in the config, not the row) is read as an unknown recompute and inferred."""
    words = [*MAXTEXT_REMAT, "custom", "SAVE-QKV-PROJ"]
    path = tmp_path / "runs.csv"
    path.write_text("run_id,model_name,gpu,n_gpus,global_batch_seqs,micro_batch,seq_len,tp,pp,sharding,recompute,"
                    "framework,metric,value\n" + "".join(
                        f"r{i},llama2-70b,tpu-v6e,256,768,3,4096,1,1,fsdp,{w},maxtext,tokens_per_s_per_gpu,900\n"
                        for i, w in enumerate(words)))
    result = runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["run_id"]: r for r in json.loads(result.output)}
    assert len(rows) == len(words) and all(r["step_time_s"] is not None for r in rows.values())
    by_word = dict(zip(words, (rows[f"r{i}"] for i in range(len(words)))))
    for w in MAXTEXT_REMAT:
        assert by_word[w]["recompute"] == "selective"
        assert f"recompute '{w}' read as selective with that MaxText remat_policy's save list" in \
            by_word[w]["assumptions"]
    assert "recompute 'custom' read as unknown" in by_word["custom"]["assumptions"]
    assert by_word["SAVE-QKV-PROJ"]["step_time_s"] == by_word["save_qkv_proj"]["step_time_s"]
    # the 256-chip v6e recipe offloads q, k, v to the host: its 70B layers fit the 32 GB chips, kept they do not
    assert by_word["qkv_proj_offloaded"]["memory_fits"] and not by_word["save_qkv_proj"]["memory_fits"]
    assert by_word["qkv_proj_offloaded"]["step_time_s"] > by_word["minimal"]["step_time_s"]


def test_predict_takes_a_maxtext_policy_as_its_recompute():
    """`stepcast predict --recompute save_qkv_proj` answers from the same save list as a run file's cell: slower than
    minimal, which recomputes what Megatron's selective does; an unknown word is named with the choices."""
    base = ["predict", "--model", "llama2-70b", "--gpu", "tpu-v5p", "--gpus", "256", "--global-batch", "512",
            "--seq-len", "4096", "--micro-batch", "2", "--sharding", "fsdp", "--format", "json"]

    def step(word):
        result = runner.invoke(app, base + ["--recompute", word])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)[0]

    qkv, minimal, sel = step("save_qkv_proj"), step("minimal"), step("selective")
    assert "recompute save_qkv_proj: selective with that MaxText remat_policy's save list" in qkv["assumptions"]
    assert minimal["step_time_s"] == pytest.approx(sel["step_time_s"], rel=1e-12)
    assert qkv["step_time_s"] > minimal["step_time_s"] and qkv["memory_gb_per_gpu"] < minimal["memory_gb_per_gpu"]
    bad = runner.invoke(app, base + ["--recompute", "save_everything"])
    assert bad.exit_code == 2 and "qkv_proj_offloaded" in bad.output and "save_everything" in bad.output
