"""`stepcast predict`: one configuration from flags, or every run of a measurement file."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from tests.conftest import MEASUREMENTS
from tests.test_ingest import BASE, write_rows

runner = CliRunner()


@pytest.fixture(autouse=True)
def no_store(tmp_path, monkeypatch):
    """These tests exercise the analytical path: no store, hence no promoted calibration fit
    (tests/test_calibration.py covers the calibrated columns against the built store)."""
    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "none" / "stepcast.duckdb"))
REQUIRED = ["run_id", "feasible", "error", "step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu",
            "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "mfu", "hfu", "memory_gb_per_gpu", "compute_s",
            "tp_comm_s", "pp_bubble_s", "pp_comm_s", "dp_comm_exposed_s", "cp_comm_s", "ep_comm_s", "optimizer_s",
            "straggler_s", "fit_version", "assumptions", "calibration_domain"]
RUNS_REQUIRED = ["run_id", "feasible", "error", "step_time_s", "step_time_lo_s", "step_time_hi_s",
                 "tokens_per_s_per_gpu", "mfu", "hfu", "memory_gb_per_gpu", "memory_gb", "memory_fits", "fit_version",
                 "assumptions", "calibration_domain", "measured_tokens_per_s_per_gpu", "error_pct"]
GPT3 = ["predict", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "1024", "--global-batch", "1536",
        "--seq-len", "2048", "--tp", "8", "--pp", "8"]


def test_predict_one_configuration_json():
    result = runner.invoke(app, GPT3 + ["--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 1
    row = rows[0]
    assert list(row)[: len(REQUIRED)] == REQUIRED
    assert row["feasible"] is True and row["error"] is None
    # the command echoes what it resolved and every default it applied
    assert row["model"] == "gpt3-175b" and row["dp"] == 16 and row["calibration_domain"] == "no fit: priors"
    assert row["assumptions"].startswith("realistic; defaults: dp=N/(tp*pp*cp)=16, micro_batch=1, vpp=1 (plain 1F1B; "
                                         "--vpp N for the interleaved schedule), sharding=zero1")
    # the parts add up to no more than the step, and the step's throughput matches its definition
    assert row["step_time_s"] > row["compute_s"] > 0
    assert row["tokens_per_s_per_gpu"] == __import__("pytest").approx(1536 * 2048 / (row["step_time_s"] * 1024))


def test_predict_infeasible_configuration_says_why():
    args = ["predict", "--model", "gpt3-175b", "--gpu", "a100-sxm4-40gb", "--gpus", "8", "--global-batch", "8",
            "--seq-len", "2048", "--tp", "8", "--recompute", "none", "--sharding", "none", "--format", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)[0]
    assert row["feasible"] is False and "memory" in row["error"] and "> 42.9 GB capacity" in row["error"]  # 40 GiB


def test_predict_runs_file_one_row_per_run(tmp_path):
    out = tmp_path / "pred.csv"
    result = runner.invoke(app, ["predict", "--runs", str(MEASUREMENTS / "measured_runs.csv"), "--format", "csv",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    pred = pl.read_csv(out, infer_schema_length=None)
    assert set(RUNS_REQUIRED) <= set(pred.columns)
    assert pred.height == 871 and pred["run_id"].n_unique() == 871
    # whole-run GPU-hour totals name no GPU count: kept, with the reason
    llama2 = pred.filter(pl.col("run_id") == "llama2_70b").row(0, named=True)
    assert llama2["feasible"] is False and "n_gpus not stated" in llama2["error"]
    # every run with an accelerator, a shape and a GPU count gets a prediction, whatever the memory model says
    assert pred["step_time_s"].is_not_null().sum() >= 560
    # and the measurement with the error beside it, where the file has one
    scored = pred.filter(pl.col("error_pct").is_not_null())
    assert scored.height > 500
    row = scored.row(0, named=True)
    assert row["error_pct"] == pytest.approx(100 * (row["tokens_per_s_per_gpu"] / row["measured_tokens_per_s_per_gpu"]
                                                    - 1))


def test_predict_runs_bad_rows_keep_their_run_id(tmp_path):
    path = write_rows(tmp_path / "runs.csv", [BASE, dict(BASE, run_id="t-2", gpu="h900"),
                                              dict(BASE, run_id="t-3", seq_len="")])
    result = runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["run_id"]: r for r in json.loads(result.output)}
    assert rows["t-run-1"]["feasible"] is True
    assert "unknown hardware id 'h900'" in rows["t-2"]["error"]
    # an unstated sequence length is inferred by a documented rule, and the row says so
    assert rows["t-3"]["step_time_s"] is not None and "seq_len=" in rows["t-3"]["assumptions"]


def _predict_text(tmp_path, text: str) -> dict:
    """`predict --runs` on a file of `text`: its rows by run_id."""
    path = tmp_path / "runs.csv"
    path.write_text(text)
    result = runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    return {r["run_id"]: r for r in json.loads(result.output)}


def test_predict_runs_reads_the_headers_people_write(tmp_path):
    """Headers and metric columns under their common spellings (Megatron-LM / Hugging Face argument names, units in
    the header) are read as the schema's, each reading stated; the same run in schema form predicts the same."""
    wide = tmp_path / "wide.csv"
    wide.write_text("Run,Model,GPU type,num_gpus,tensor_model_parallel_size,pipeline_model_parallel_size,"
                    "global_batch_size,seq_length,Step time (ms),MFU (%)\n"
                    "a,llama3-8b,h100-sxm5-80gb,64,2,1,256,8192,4000,40\n")
    schema = tmp_path / "schema.csv"
    schema.write_text("run_id,model_name,gpu,n_gpus,tp,pp,global_batch_seqs,seq_len,metric,value\n"
                      "a,llama3-8b,h100-sxm5-80gb,64,2,1,256,8192,step_time_s,4.0\n"
                      "a,llama3-8b,h100-sxm5-80gb,64,2,1,256,8192,mfu,0.4\n")
    got = {}
    for name, path in (("wide", wide), ("schema", schema)):
        result = runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"])
        assert result.exit_code == 0, result.output
        got[name] = json.loads(result.output)[0]
    w, s = got["wide"], got["schema"]
    assert (w["run_id"], w["n_gpus"], w["tp"], w["global_batch_seqs"], w["seq_len"]) == ("a", 64, 2, 256, 8192)
    assert w["step_time_s"] == pytest.approx(s["step_time_s"])
    # 4,000 ms is 4 s: 256 x 8,192 tokens / (4 s x 64 GPUs)
    assert w["measured_tokens_per_s_per_gpu"] == pytest.approx(256 * 8192 / (4.0 * 64))
    assert w["measured_tokens_per_s_per_gpu"] == pytest.approx(s["measured_tokens_per_s_per_gpu"])
    for note in ("column 'num_gpus' read as n_gpus", "column 'Run' read as run_id",
                 "column 'Step time (ms)' read as metric step_time_s (x 0.001)"):
        assert note in w["assumptions"]


def test_predict_runs_metric_spellings_percentages_and_files_without_run_ids(tmp_path):
    path = tmp_path / "long.csv"
    path.write_text("model_name,gpu,n_gpus,global_batch_seqs,seq_len,metric,value\n"
                    "llama3-8b,h100-sxm5-80gb,64,256,8192,tokens/s/GPU,8000\n"
                    "llama3-8b,h100-sxm5-80gb,128,256,8192,mfu,38.5\n")
    result = runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["run_id"]: r for r in json.loads(result.output)}
    assert set(rows) == {"line 2", "line 3"}  # each row one run, named by its line
    assert rows["line 2"]["measured_tokens_per_s_per_gpu"] == pytest.approx(8000.0)
    assert "read in the schema's names and units" in rows["line 2"]["assumptions"]
    assert rows["line 3"]["measured_tokens_per_s_per_gpu"] is not None  # 38.5 read as 0.385 MFU
    assert "an mfu/hfu above 1 read as a percentage" in rows["line 3"]["assumptions"]
    # the schema's own column wins over a synonym of it
    both = tmp_path / "both.csv"
    both.write_text("run_id,model_name,gpu,n_gpus,num_gpus,global_batch_seqs,seq_len\n"
                    "b,llama3-8b,h100-sxm5-80gb,64,8,256,8192\n")
    row = json.loads(runner.invoke(app, ["predict", "--runs", str(both), "--format", "json"]).output)[0]
    assert row["n_gpus"] == 64 and "num_gpus" not in (row["assumptions"] or "")


@pytest.mark.parametrize("sharding, recompute, want", [
    ("ZeRO-3", "full activation checkpointing", ("zero3", "full")), ("FULL_SHARD", "true", ("fsdp", "full")),
    ("distributed optimizer", "no", ("zero1", "none")), ("DDP", "selective", ("none", "selective")),
    ("HYBRID_SHARD", "gradient checkpointing", ("hsdp", "full")), ("ZeRO stage 2", "False", ("zero2", "none"))])
def test_predict_runs_reads_sharding_and_recompute_spellings(tmp_path, sharding, recompute, want):
    path = tmp_path / "runs.csv"
    path.write_text("run_id,model_name,gpu,n_gpus,global_batch_seqs,seq_len,sharding,recompute\n"
                    f"a,llama3-8b,h100-sxm5-80gb,64,256,8192,{sharding},{recompute}\n")
    row = json.loads(runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"]).output)[0]
    assert (row["sharding"], row["recompute"]) == want and row["step_time_s"] is not None
    assert f"sharding '{sharding}' read as {want[0]}" in row["assumptions"]


@pytest.mark.parametrize("dtype, sharding, recompute, want", [
    ("FP8 (E4M3)", "Megatron distributed optimizer", "full (uniform)", ("fp8", "zero1", "full")),
    ("float8 rowwise", "ZeRO stage 3 (DeepSpeed)", "per-op SAC", ("fp8-cs", "zero3", "selective")),
    ("MX FP8 block scaling", "FSDP2 fully_shard", "selective (core_attn)", ("mxfp8", "fsdp", "selective")),
    ("bf16 autocast", "HSDP (8-GPU shards)", "activation recompute: none", ("bf16", "hsdp", "none")),
    ("bf16", "optimizer state sharding", "recompute_granularity=selective", ("bf16", "zero1", "selective"))])
def test_predict_runs_reads_spellings_by_their_words(tmp_path, dtype, sharding, recompute, want):
    """Cells the spelling tables do not list are read by the words they contain (the most specific first) and the
    reading is listed in `assumptions`; a cell no rule reads is still named (zero-7 above, fp9)."""
    path = tmp_path / "runs.csv"
    path.write_text("run_id,model_name,gpu,n_gpus,global_batch_seqs,seq_len,dtype,sharding,recompute\n"
                    f"a,llama3-8b,b200,64,256,8192,{dtype},{sharding},{recompute}\n")
    row = json.loads(runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"]).output)[0]
    assert (row["dtype"], row["sharding"], row["recompute"]) == want and row["step_time_s"] is not None
    assert f"recompute '{recompute}' read as {want[2]}" in row["assumptions"]


def test_predict_runs_reads_thousands_separators_and_percent_signs(tmp_path):
    rows = _predict_text(tmp_path, 'run_id,model_name,gpu,n_gpus,global_batch_seqs,seq_len,metric,value\n'
                                   'a,llama3-8b,h100-sxm5-80gb,"1,024","2,048",8192,tokens_per_s_per_gpu,"8,000"\n'
                                   'b,llama3-8b,h100-sxm5-80gb,1024,2048,8192,mfu,41.2%\n'
                                   'c,llama3-8b,h100-sxm5-80gb,1024,2048,8192,mfu,0.412\n')
    assert (rows["a"]["n_gpus"], rows["a"]["global_batch_seqs"]) == (1024, 2048)
    assert rows["a"]["measured_tokens_per_s_per_gpu"] == pytest.approx(8000.0)
    assert rows["b"]["measured_tokens_per_s_per_gpu"] == pytest.approx(rows["c"]["measured_tokens_per_s_per_gpu"])


def test_predict_runs_reads_a_node_count_and_a_batch_in_tokens(tmp_path):
    rows = _predict_text(tmp_path, "run_id,model_name,gpu,num_nodes,gpus_per_node,tokens_per_batch,seq_len\n"
                                   "hgx,llama3-70b,h100-sxm5-80gb,32,,4194304,8192\n"
                                   "tray,llama3-8b,gb200,4,,1048576,8192\n"
                                   "stated,llama3-8b,h100-sxm5-80gb,4,4,1048576,8192\n")
    # 8 per HGX/DGX node, 4 per GB200 compute tray (not the 72-GPU NVLink domain), a stated count wins
    assert (rows["hgx"]["n_gpus"], rows["tray"]["n_gpus"], rows["stated"]["n_gpus"]) == (256, 16, 16)
    assert (rows["hgx"]["global_batch_seqs"], rows["tray"]["global_batch_seqs"]) == (512, 128)
    assert "n_gpus = nodes x GPUs per node" in rows["hgx"]["assumptions"]
    assert all(r["step_time_s"] is not None for r in rows.values())


def test_predict_runs_names_an_unknown_sharding_spelling(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("run_id,model_name,gpu,n_gpus,global_batch_seqs,seq_len,sharding\n"
                    "a,llama3-8b,h100-sxm5-80gb,64,256,8192,zero-7\n")
    row = json.loads(runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"]).output)[0]
    assert row["step_time_s"] is None and "unknown sharding 'zero-7'" in row["error"]


def test_predict_runs_unreadable_file_exits_nonzero(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"")
    result = runner.invoke(app, ["predict", "--runs", str(bad)])
    assert result.exit_code == 1 and "bad.csv" in result.output and "empty file" in result.output


def test_predict_bad_flags_are_named():
    r = runner.invoke(app, ["predict", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb"])
    assert r.exit_code == 2 and "--gpus" in r.output and "--global-batch" in r.output
    r = runner.invoke(app, GPT3[:-4] + ["--tp", "3"])
    assert r.exit_code == 2 and "not divisible" in r.output
    r = runner.invoke(app, GPT3 + ["--sharding", "zero9"])
    assert r.exit_code == 2 and "--sharding" in r.output
    r = runner.invoke(app, ["predict", "--model", "llama-9", "--gpu", "h100-sxm5-80gb", "--gpus", "8", "-b", "8",
                            "-s", "4096"])
    assert r.exit_code == 2 and "unknown model 'llama-9'" in r.output
    r = runner.invoke(app, GPT3 + ["--gpu", "h900"])  # `h100` names the H100 (tests/test_names.py)
    assert r.exit_code == 2 and "unknown hardware 'h900'" in r.output


def test_inter_node_gbps_gives_the_configuration_its_clusters_network():
    """Half the scale-out bandwidth slows the communication that crosses nodes (TP=16 over two 8-GPU nodes here)
    and the step; the hardware's own value changes nothing."""
    args = GPT3[:-4] + ["--tp", "16", "--pp", "4", "--format", "json"]
    default, same, half = (json.loads(runner.invoke(app, args + extra).output)[0]
                           for extra in ([], ["--inter-node-gbps", "25"], ["--inter-node-gbps", "12.5"]))
    assert same == default  # a100-sxm4-80gb: one 200 Gb/s NIC per GPU, 25 GB/s
    assert half["tp_comm_s"] > default["tp_comm_s"] and half["step_time_s"] > default["step_time_s"]
    bad = runner.invoke(app, args + ["--inter-node-gbps", "0"])
    assert bad.exit_code != 0 and "--inter-node-gbps" in bad.output


L70 = ["predict", "--model", "llama3-70b", "--gpu", "h100-sxm5-80gb", "--gpus", "512", "-b", "1024", "-s", "8192",
       "--tp", "8", "--pp", "4", "--format", "json"]


def test_oversubscription_slows_a_multi_node_layout_and_says_so():
    """512 x H100, tp 8 (inside a node), dp 16 and pp 4 across nodes. 3:1 above every scale-up domain: the DP
    reduction and the PP hops slow down. Pods of 256 (= tp x dp x 2): the DP groups (span 128) stay inside a
    pod, only the pipeline (outermost in the rank order) crosses, so only pp_comm_s grows."""
    base, over, pod = (json.loads(runner.invoke(app, L70 + extra).output)[0] for extra in
                       ([], ["--oversubscription", "3"], ["--oversubscription", "3", "--pod-size", "256"]))
    assert over["step_time_s"] > base["step_time_s"]
    assert over["dp_comm_exposed_s"] > base["dp_comm_exposed_s"] and over["pp_comm_s"] > base["pp_comm_s"]
    assert "network: 3:1 oversubscribed above every scale-up domain" in over["assumptions"]
    assert "network" not in base["assumptions"]
    assert pod["dp_comm_exposed_s"] == base["dp_comm_exposed_s"] and pod["pp_comm_s"] == over["pp_comm_s"]
    assert base["step_time_s"] < pod["step_time_s"] < over["step_time_s"]
    assert "pods of 256 accelerators" in pod["assumptions"]
    one = json.loads(runner.invoke(app, L70 + ["--oversubscription", "1"]).output)[0]
    assert one == base


@pytest.mark.parametrize("extra,message", [
    (["--oversubscription", "0.5"], "--oversubscription must be a ratio >= 1 (1 = non-blocking, 3 = 3:1 "
                                    "oversubscribed), got 0.5"),
    (["--oversubscription", "nan"], "--oversubscription NaN is not a finite number"),
    (["--pod-size", "4"], "--pod-size must be at least the scale-up domain (8 accelerators of h100-sxm5-80gb), "
                          "got 4"),
    (["--pod-size", "0"], "--pod-size must be a positive whole number of accelerators, got 0"),
    (["--scaleout-gbps", "-1"], "--scaleout-gbps must be a positive number, got -1"),
    (["--gpus-per-node", "4", "--scaleup-size", "8"], "--gpus-per-node 4 and --scaleup-size 8 disagree"),
    (["--inter-node-gbps", "25", "--scaleout-gbps", "50"], "--inter-node-gbps 25 and --scaleout-gbps 50 disagree"),
])
def test_bad_network_flags_exit_2_with_the_flag_value_and_expectation(extra, message):
    r = runner.invoke(app, L70 + extra)
    assert r.exit_code == 2 and message in r.output, r.output


def test_predict_takes_the_network_names_of_search_beside_the_old_ones():
    old = json.loads(runner.invoke(app, L70 + ["--inter-node-gbps", "25", "--gpus-per-node", "8"]).output)[0]
    new = json.loads(runner.invoke(app, L70 + ["--scaleout-gbps", "25", "--scaleup-size", "8"]).output)[0]
    both = json.loads(runner.invoke(app, L70 + ["--scaleout-gbps", "25", "--inter-node-gbps", "25"]).output)[0]
    assert new["step_time_s"] == old["step_time_s"] == both["step_time_s"]
    faster = json.loads(runner.invoke(app, L70 + ["--scaleup-gbps", "900"]).output)[0]
    assert faster["tp_comm_s"] < old["tp_comm_s"]


def test_predict_runs_reads_canonical_metric_names_in_any_case(tmp_path):
    """A `metric` value is looked up by its header key (case and spacing aside): the schema's own names written
    "MFU", "TOKENS_PER_S_PER_GPU" or "Step_Time_S" are read as mfu, tokens_per_s_per_gpu and step_time_s."""
    rows = _predict_text(tmp_path, "run_id,model_name,gpu,n_gpus,global_batch_seqs,seq_len,metric,value\n"
                                   "a,llama3-8b,h100-sxm5-80gb,64,256,8192,MFU,0.4\n"
                                   "b,llama3-8b,h100-sxm5-80gb,64,256,8192,TOKENS_PER_S_PER_GPU,8000\n"
                                   "c,llama3-8b,h100-sxm5-80gb,64,256,8192,Step_Time_S,4.0\n"
                                   "d,llama3-8b,h100-sxm5-80gb,64,256,8192,mfu,0.4\n")
    assert all(r["step_time_s"] is not None and r["error"] is None for r in rows.values()), rows
    assert rows["a"]["measured_tokens_per_s_per_gpu"] == pytest.approx(rows["d"]["measured_tokens_per_s_per_gpu"])
    assert rows["b"]["measured_tokens_per_s_per_gpu"] == pytest.approx(8000.0)
    assert rows["c"]["measured_tokens_per_s_per_gpu"] == pytest.approx(256 * 8192 / (4.0 * 64))
    assert "metric 'MFU', 'Step_Time_S', 'TOKENS_PER_S_PER_GPU' read in the schema's names and units" in \
        rows["a"]["assumptions"]


def test_predict_runs_sums_up_what_it_predicted_and_how_far_off(tmp_path):
    """Beside the file it writes, `predict --runs` says how many runs it predicted, why the others were not, and
    for the measured ones the error of throughput, the interval's coverage and the runs over capacity."""
    from pipeline.api import runs_summary

    path = tmp_path / "runs.csv"
    path.write_text("run_id,model_name,gpu,n_gpus,global_batch_seqs,seq_len,metric,value\n"
                    "a,llama3-8b,h100-sxm5-80gb,64,256,8192,tokens_per_s_per_gpu,8000\n"
                    "b,llama3-8b,h100-sxm5-80gb,64,256,8192,tokens_per_s_per_gpu,100000\n"
                    "c,llama3-8b,h900,64,256,8192,tokens_per_s_per_gpu,8000\n")
    result = runner.invoke(app, ["predict", "--runs", str(path), "--format", "csv", "--out", str(tmp_path / "o.csv")])
    assert result.exit_code == 0, result.output
    assert "3 run(s): 2 predicted (not predicted: 1 unknown hardware id)" in result.output
    rows = pl.read_csv(tmp_path / "o.csv").filter(pl.col("error_pct").is_not_null())
    e = rows["error_pct"].abs()
    assert f"2 with a measurement: throughput off by {e.median():.1f}% median, {e.mean():.1f}% mean" in result.output
    assert f"{100 * (e <= 10).mean():.0f}% within 10%" in result.output
    # an empty result says so
    assert runs_summary(rows.head(0)).startswith("0 run(s): 0 predicted")
