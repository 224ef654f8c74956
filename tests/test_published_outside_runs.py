"""Published training throughputs from outside the corpus, predicted by the served fit of a fresh build.

These runs are not measurements of the corpus (measurements/ holds none of them) and nothing is fitted to them:
they check that what the fit learned carries to a source, a scale and a framework it never saw, as a new user's
file would be read by `stepcast predict --runs`.

Dubey et al. 2024, "The Llama 3 Herd of Models" (arXiv:2407.21783), Table 4: Llama 3 405B pre-training on H100
SXM 80 GB (Meta's Grand Teton servers, 8 per node), BF16, 16M tokens per batch, at the stated tensor, context,
pipeline and data-parallel degrees, measured at 430, 400 and 380 model TFLOP/s per GPU. The rows state only what
the table states; every other field is inferred by the documented rules (models/corpus/runs_adapter.py).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeline.cli import app

#: (run_id, GPUs, sequence length, global batch in sequences (16M tokens), tp, cp, pp, dp, model TFLOP/s per GPU)
LLAMA3_TABLE_4 = (
    ("llama3-405b-8k-8192gpu", 8192, 8192, 2048, 8, 1, 16, 64, 430.0),
    ("llama3-405b-8k-16384gpu", 16384, 8192, 2048, 8, 1, 16, 128, 400.0),
    ("llama3-405b-128k-16384gpu", 16384, 131072, 128, 8, 16, 16, 8, 380.0),
)
#: the stated tolerance: the held-out protocols' worst pooled MAPE is 11.6% (docs/calibration.md); a published
#: figure off by more than 15% means the fit no longer carries to this source
TOLERANCE = 0.15


def test_llama3_405b_table_4_is_predicted_within_tolerance_and_inside_its_interval(built_store, tmp_path):
    """Each of the three Table 4 rows is predicted within 15% of its published model TFLOP/s per GPU (as tokens/s
    per GPU through the stepcast FLOP count), inside its 90% interval; the runs are read as measured (a target
    beside each prediction) and none is refused. (The memory model calls the 8,192-GPU layout too big for 80 GB
    with selective recompute, 160 GB: Meta's stage rebalancing and recompute are not in the table; not asserted.)"""
    f = tmp_path / "llama3_table4.csv"
    lines = ["run_id,model_name,gpu,n_gpus,seq_len,global_batch_seqs,tp,cp,pp,dp,dtype,year,metric,value,unit"]
    lines += [f"{rid},Llama 3.1 405B,H100 SXM5 80GB,{n},{s},{b},{tp},{cp},{pp},{dp},bf16,2024,model_tflops_per_gpu,"
              f"{tflops},TFLOP/s/GPU" for rid, n, s, b, tp, cp, pp, dp, tflops in LLAMA3_TABLE_4]
    f.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(app, ["--store", str(built_store), "predict", "--runs", str(f), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["run_id"]: r for r in json.loads(result.output)}
    assert set(rows) == {r[0] for r in LLAMA3_TABLE_4}
    for rid, row in rows.items():
        # predicted (a run the memory model calls too big is still predicted, its figure in `error`)
        assert row["step_time_s"] and row["fit_version"], (rid, row["error"])
        measured = row["measured_tokens_per_s_per_gpu"]
        assert measured and row["target_derived"], rid  # read from the TFLOP/s through the FLOP count
        assert row["tokens_per_s_per_gpu"] == pytest.approx(measured, rel=TOLERANCE), (rid, row["error_pct"])
        assert row["tokens_per_s_per_gpu_lo"] <= measured <= row["tokens_per_s_per_gpu_hi"], rid
