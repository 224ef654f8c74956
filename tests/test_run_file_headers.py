"""`stepcast predict --runs` reads run tables as papers, READMEs and benchmark pages write them: a GPU count under
"# GPUs" or "Number of GPUs", a layout in one cell ("TP8 PP16 DP64", "FSDP 32, TP 8"), a batch in tokens with a
unit suffix ("16M"), a batch per data-parallel rank ("Local batch size"), throughput and MFU under their table
headers; each reading is stated in `assumptions`, and the same run written in the schema's own columns predicts
the same."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.predict_runs import parse_layout, token_count

runner = CliRunner()


@pytest.fixture(autouse=True)
def no_store(tmp_path, monkeypatch):
    """The analytical path: no store, no promoted fit."""
    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "none" / "stepcast.duckdb"))


def _predict(path) -> dict:
    result = runner.invoke(app, ["predict", "--runs", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    return {r["run_id"]: r for r in json.loads(result.output)}


@pytest.mark.parametrize("text, want", [
    ("TP8 PP16 DP64", {"tp": 8, "pp": 16, "dp": 64}),
    ("tp=8, pp=4, cp=2", {"tp": 8, "pp": 4, "cp": 2}),
    ("8-way TP, 16-way PP", {"tp": 8, "pp": 16}),
    ("FSDP 32, TP 8", {"dp": 32, "sharding": "fsdp", "tp": 8}),
    ("HSDP 64 TP 2", {"dp": 64, "sharding": "hsdp", "tp": 2}),
    ("ZeRO-3 128", {"dp": 128, "sharding": "zero3"}),
    ("TP 8 SP", {"tp": 8}),  # sequence parallelism is no degree of its own
    ("TP8xPP4xDP32", {"tp": 8, "pp": 4, "dp": 32}), ("TP 8 x PP 4", {"tp": 8, "pp": 4}),
    ("tensor parallel 8, pipeline parallel 4", {"tp": 8, "pp": 4}),
    ("tensor-parallel size 2, expert model parallelism 64", {"tp": 2, "ep": 64}),
    ("virtual pipeline parallel 5, pipeline parallel 4", {"vpp": 5, "pp": 4}),
    ("(8, 4, 32)", {}),  # degrees without their names are not guessed
    ("", {}), (None, {})])
def test_a_layout_cell_reads_as_its_degrees(text, want):
    assert parse_layout(text) == want


@pytest.mark.parametrize("text, seq_len, want", [
    ("16M", 8192, 2048 * 8192),  # Llama 3's "16M tokens": 2,048 x 8,192 = 16 x 2^20 (decimal is no whole number)
    ("4M", 4096, 1024 * 4096),
    ("2M", 2000, 2_000_000),  # decimal when it makes whole sequences
    ("16,777,216", 8192, 16_777_216), ("4.2M tokens", 2048, 4_200_000), ("many", 8192, None)])
def test_a_token_count_reads_its_unit_suffix(text, seq_len, want):
    assert token_count(text, seq_len)[0] == want


def test_paper_table_headers_predict_like_the_schema(tmp_path):
    """A Llama-3-paper-style row (a GPU count under '# GPUs', a layout column per degree, the batch in tokens with a
    suffix, MFU in percent under 'BF16 MFU') reads as the same run written in the schema's columns."""
    paper = tmp_path / "paper.csv"
    paper.write_text('Model,Hardware,# GPUs,TP,PP,DP,Seq. len.,Tokens/batch,BF16 MFU\n'
                     'llama3-70b,h100-sxm5-80gb,"1,024",8,4,32,8192,8M,40%\n')
    schema = tmp_path / "schema.csv"
    schema.write_text("run_id,model_name,gpu,n_gpus,tp,pp,dp,seq_len,global_batch_seqs,metric,value\n"
                      "line 2,llama3-70b,h100-sxm5-80gb,1024,8,4,32,8192,1024,mfu,0.4\n")
    p, s = _predict(paper)["line 2"], _predict(schema)["line 2"]
    assert (p["n_gpus"], p["tp"], p["pp"], p["dp"], p["global_batch_seqs"]) == (1024, 8, 4, 32, 1024)
    assert p["step_time_s"] == pytest.approx(s["step_time_s"])
    assert p["measured_tokens_per_s_per_gpu"] == pytest.approx(s["measured_tokens_per_s_per_gpu"])
    for note in ("column '# GPUs' read as n_gpus", "column 'BF16 MFU' read as metric mfu",
                 "global_batch_seqs = the batch in tokens / seq_len (a K/M/B suffix read as 2^10/2^20/2^30"):
        assert note in p["assumptions"]


def test_number_of_gpus_a_layout_cell_and_a_local_batch(tmp_path):
    """A torchtitan-README-style row: 'Number of GPUs', the layout in one 'Parallelism' cell, the batch per
    data-parallel rank, throughput under 'Tokens/sec/GPU'. FSDP without a named framework is PyTorch's: the run is
    predicted on the PyTorch-native kernel stack with PyTorch FSDP's memory, as a run naming PyTorch FSDP is."""
    table = tmp_path / "table.csv"
    table.write_text("Model,Number of GPUs,Hardware,Parallelism,Local batch size,Sequence length,Tokens/sec/GPU\n"
                     'llama3-70b,256,h100-sxm5-80gb,"FSDP 32, TP 8",2,8192,"1,000"\n')
    named = tmp_path / "named.csv"
    named.write_text("run_id,model_name,gpu,n_gpus,tp,dp,sharding,micro_batch,global_batch_seqs,seq_len,framework,"
                     "metric,value\n"
                     "line 2,llama3-70b,h100-sxm5-80gb,256,8,32,fsdp,2,64,8192,PyTorch FSDP,tokens_per_s_per_gpu,1000\n")
    t, n = _predict(table)["line 2"], _predict(named)["line 2"]
    assert (t["n_gpus"], t["tp"], t["dp"], t["sharding"], t["micro_batch"], t["global_batch_seqs"]) == \
        (256, 8, 32, "fsdp", 2, 64)
    assert t["measured_tokens_per_s_per_gpu"] == pytest.approx(1000.0)
    assert t["step_time_s"] == pytest.approx(n["step_time_s"])
    for note in ("column 'Number of GPUs' read as n_gpus", "the layout column read as its degrees (dp, sharding, tp)",
                 "global_batch_seqs = the batch per data-parallel rank x dp",
                 "software stack pytorch_native (no framework stated; FSDP/HSDP sharding is PyTorch's)"):
        assert note in t["assumptions"]


def test_a_stated_column_wins_over_the_layout_cell(tmp_path):
    path = tmp_path / "both.csv"
    path.write_text("run_id,model_name,gpu,n_gpus,tp,Parallelism,global_batch_seqs,seq_len\n"
                    "a,llama3-8b,h100-sxm5-80gb,64,2,TP4 PP2,256,8192\n")
    row = _predict(path)["a"]
    assert (row["tp"], row["pp"]) == (2, 2)


def test_a_megatron_readme_row_reads_its_shape_size_and_tflops(tmp_path):
    """The Megatron-LM README's table: the shape under 'Attention heads', 'Hidden size', 'Number of layers', the size
    as '1.7B', the throughput as 'Achieved teraFLOP/s per GPU' (an accelerator column added: the README's is A100)."""
    path = tmp_path / "readme.csv"
    path.write_text("Model size,Attention heads,Hidden size,Number of layers,Tensor model-parallel size,"
                    "Pipeline model-parallel size,Number of GPUs,Batch size,Achieved teraFLOP/s per GPU,GPU\n"
                    "1.7B,24,2304,24,1,1,32,512,137,a100-sxm4-80gb\n")
    row = _predict(path)["line 2"]
    assert (row["n_gpus"], row["tp"], row["pp"], row["global_batch_seqs"]) == (32, 1, 1, 512)
    assert row["step_time_s"] is not None and row["measured_tokens_per_s_per_gpu"] is not None
    for note in ("column 'Attention heads' read as n_heads", "column 'Model size' read as params_b",
                 "column 'Achieved teraFLOP/s per GPU' read as metric model_tflops_per_gpu"):
        assert note in row["assumptions"]


def test_micro_batch_times_gradient_accumulation_times_dp_is_the_global_batch(tmp_path):
    path = tmp_path / "accum.csv"
    path.write_text("model,gpu,nodes,tp,micro_batch_size,grad_accum,seq_len,tokens/s/gpu\n"
                    "llama3-8b,h100-sxm5-80gb,8,2,2,4,4096,8200\n")
    row = _predict(path)["line 2"]
    assert (row["n_gpus"], row["dp"], row["micro_batch"], row["global_batch_seqs"]) == (64, 32, 2, 2 * 4 * 32)
    assert "global_batch_seqs = micro_batch x gradient accumulation steps x dp" in row["assumptions"]


def test_samples_per_second_are_sequences_of_the_row_s_length(tmp_path):
    """Hugging Face Trainer's train_samples_per_second (and a per-GPU samples column) count sequences: tokens/s =
    samples/s x seq_len; the same run written in tokens predicts and measures the same."""
    samples = tmp_path / "samples.csv"
    samples.write_text("model,gpu,n_gpus,global_batch_seqs,seq_len,train_samples_per_second\n"
                       "llama3-8b,h100-sxm5-80gb,64,256,8192,64\n"
                       "llama3-8b,h100-sxm5-80gb,64,256,4096,\n")
    tokens = tmp_path / "tokens.csv"
    tokens.write_text("model,gpu,n_gpus,global_batch_seqs,seq_len,tokens_per_s\n"
                      "llama3-8b,h100-sxm5-80gb,64,256,8192,524288\n")
    s, t = _predict(samples), _predict(tokens)
    assert s["line 2"]["measured_tokens_per_s_per_gpu"] == pytest.approx(64 * 8192 / 64)
    assert s["line 2"]["measured_tokens_per_s_per_gpu"] == pytest.approx(t["line 2"]["measured_tokens_per_s_per_gpu"])
    assert s["line 3"]["measured_tokens_per_s_per_gpu"] is None  # an empty cell measures nothing
    assert ("column 'train_samples_per_second' read as metric tokens_per_s (x seq_len: a sample is one sequence)"
            in s["line 2"]["assumptions"])


def test_an_unsharded_measured_run_that_cannot_fit_is_read_as_sharded(tmp_path):
    """A measured run with no sharding stated on no named stack that the memory model cannot fit unsharded (13B on
    64 H100 at tp 2: 12 B of Adam state per parameter alone is 78 GB a GPU) is read with the least sharding that
    fits, ZeRO-1, and says so; the same row with sharding 'none' stated, or without a measurement, keeps none."""
    f = tmp_path / "runs.csv"
    f.write_text("run_id,model_name,params_b,gpu,n_gpus,tp,pp,seq_len,global_batch_seqs,sharding,metric,value\n"
                 "open,AcmeLM-13B,13,h100-sxm5-80gb,64,2,1,4096,512,,tokens_per_s_per_gpu,3000\n"
                 "stated,AcmeLM-13B,13,h100-sxm5-80gb,64,2,1,4096,512,none,tokens_per_s_per_gpu,3000\n"
                 "planned,AcmeLM-13B,13,h100-sxm5-80gb,64,2,1,4096,512,,,\n")
    rows = _predict(f)
    assert rows["open"]["sharding"] == "zero1" and rows["open"]["memory_fits"] is True
    assert "sharding=zero1 (no sharding stated, the stack's default unknown, and the measured run does not fit" in \
        rows["open"]["assumptions"]
    for rid in ("stated", "planned"):
        assert rows[rid]["sharding"] == "none"
    assert rows["stated"]["memory_fits"] is False


def test_an_unknown_model_with_a_size_in_its_name_is_predicted_from_that_size(tmp_path):
    """A model the architecture table does not know, named with its size ("Mystery 70B"), is predicted as a dense
    model of that size (the shape rule of params_b) and says so; the same row with params_b=70 stated predicts the
    same. A name marking a mixture of experts ("Foo-30B-A3B", "Bar 8x22B") is refused, saying what to give."""
    f = tmp_path / "runs.csv"
    f.write_text("run_id,model_name,params_b,gpu,n_gpus,tp,pp,seq_len,global_batch_seqs,metric,value\n"
                 "named,Mystery 70B,,a100-sxm4-80gb,128,8,2,2048,1024,tokens_per_s_per_gpu,400\n"
                 "stated,Mystery,70,a100-sxm4-80gb,128,8,2,2048,1024,tokens_per_s_per_gpu,400\n"
                 "moe,Foo-30B-A3B,,h100-sxm5-80gb,16,1,1,4096,512,tokens_per_s_per_gpu,3000\n"
                 "moe2,Bar 8x22B,,h100-sxm5-80gb,64,2,1,4096,512,tokens_per_s_per_gpu,2000\n")
    rows = _predict(f)
    assert rows["named"]["step_time_s"] == pytest.approx(rows["stated"]["step_time_s"])
    assert "params_b=70 from the model name 'Mystery 70B'" in rows["named"]["assumptions"]
    for rid in ("moe", "moe2"):
        assert rows[rid]["step_time_s"] is None
        assert "a mixture of experts' size fixes no shape: give n_layers" in rows[rid]["error"]


def test_a_moe_the_table_lacks_is_predicted_from_the_expert_shape_its_row_states(tmp_path):
    """A mixture of experts the architecture table does not know is predicted from the shape its row states in the
    table's columns (n_experts, top_k, expert_ffn_dim, ...) or under their Hugging Face config names
    (num_local_experts, num_experts_per_tok, moe_intermediate_size, tie_word_embeddings): Mixtral 8x7B's shape
    under another name predicts what the table's Mixtral 8x7B does. Without the expert shape it is refused, saying
    what to give; a stated cell that is not a whole number is not read."""
    layout = "h100-sxm5-80gb,64,2,1,8,4096,256,tokens_per_s_per_gpu,3000"
    cols = "gpu,n_gpus,tp,pp,ep,seq_len,global_batch_seqs,metric,value"
    shape = "32,4096,32,8,14336,32000,swiglu"
    shape_cols = "n_layers,d_model,n_heads,n_kv_heads,ffn_dim,vocab,activation"
    f = tmp_path / "schema.csv"
    f.write_text(f"run_id,model_name,{shape_cols},n_experts,top_k,expert_ffn_dim,tied_embeddings,{cols}\n"
                 f"named,Mixtral 8x7B,,,,,,,,,,,,{layout}\n"
                 f"stated,AcmeMoE,{shape},8,2,14336,false,{layout}\n"
                 f"bare,AcmeMoE,{shape},,,,,{layout}\n"
                 f"half,AcmeMoE,{shape},8,2.5,14336,false,{layout}\n")
    g = tmp_path / "hf.csv"
    g.write_text(f"run_id,model_name,arch,{shape_cols},num_local_experts,num_experts_per_tok,moe_intermediate_size,"
                 f"tie_word_embeddings,{cols}\n"
                 f"hf,AcmeMoE,moe,{shape},8,2,14336,False,{layout}\n")
    rows = {**_predict(f), **_predict(g)}
    assert rows["named"]["step_time_s"] is not None
    for rid in ("stated", "hf"):
        assert rows[rid]["error"] is None, rows[rid]["error"]
        assert rows[rid]["step_time_s"] == pytest.approx(rows["named"]["step_time_s"], rel=1e-9)
        assert rows[rid]["memory_gb_per_gpu"] == pytest.approx(rows["named"]["memory_gb_per_gpu"], rel=1e-9)
    assert "column 'num_local_experts' read as n_experts" in rows["hf"]["assumptions"]
    # no expert shape: read as the dense model its shape describes, which expert parallelism cannot split
    assert rows["bare"]["step_time_s"] is None and "ep>1 needs an MoE model" in rows["bare"]["error"]
    assert rows["half"]["step_time_s"] is None
    assert "column top_k = '2.5': not a whole number" in rows["half"]["error"]


def test_an_expert_count_without_top_k_is_refused_and_an_unstated_expert_width_is_said(tmp_path):
    """n_experts without top_k cannot be predicted (how many experts a token visits sets its FLOPs) and says what
    to give; without expert_ffn_dim the experts are as wide as the dense MLP (ffn_dim), said in assumptions."""
    f = tmp_path / "runs.csv"
    f.write_text("run_id,model_name,arch,n_layers,d_model,n_heads,ffn_dim,vocab,n_experts,top_k,gpu,n_gpus,tp,pp,ep,"
                 "seq_len,global_batch_seqs,metric,value\n"
                 "nok,AcmeMoE,moe,32,4096,32,14336,32000,8,,h100-sxm5-80gb,64,2,1,8,4096,256,tokens_per_s_per_gpu,3000\n"
                 "wide,AcmeMoE,moe,32,4096,32,14336,32000,8,2,h100-sxm5-80gb,64,2,1,8,4096,256,tokens_per_s_per_gpu,"
                 "3000\n"
                 "none,AcmeMoE,moe,32,4096,32,14336,32000,,,h100-sxm5-80gb,64,2,1,8,4096,256,tokens_per_s_per_gpu,"
                 "3000\n")
    rows = _predict(f)
    assert rows["nok"]["step_time_s"] is None
    assert "n_experts stated without top_k" in rows["nok"]["error"]
    assert rows["wide"]["step_time_s"] is not None
    assert "expert_ffn_dim=ffn_dim (not stated" in rows["wide"]["assumptions"]
    assert "moe architecture without expert shapes: give n_experts and top_k" in rows["none"]["error"]


def test_a_host_count_below_a_domain_that_spans_hosts_keeps_the_domain(tmp_path):
    """gpus_per_node counts one host's accelerators: 4 TPU v5p chips per host, 4 GB200s per NVL72 compute tray. Where
    the scale-up domain spans hosts (a TPU pod's ICI, NVLink Switch trays) a stated 4 keeps the domain, so the row
    predicts what it does with the column empty, and says so; on an 8-GPU HGX H100, whose NVLink domain is the
    host, a stated 4 is the domain and the step is slower than with the board's 8."""
    f = tmp_path / "runs.csv"
    rows_in = []
    for gpu, n, tp in (("TPU v5p", 512, 4), ("GB200", 256, 4), ("h100-sxm5-80gb", 256, 4)):
        for gpn in ("", "4"):
            rows_in.append(f"{gpu.split()[0].lower()}-{gpn or 'none'},Llama 2 70B,{gpu},{n},{gpn},4096,512,{tp},1,"
                           "bf16,fsdp,tokens_per_s_per_gpu,1000")
    f.write_text("run_id,model_name,gpu,n_gpus,gpus_per_node,seq_len,global_batch_seqs,tp,pp,dtype,sharding,metric,"
                 "value\n" + "\n".join(rows_in) + "\n")
    rows = _predict(f)
    for host_spanning, domain in (("tpu", 512), ("gb200", 72)):
        assert rows[f"{host_spanning}-4"]["step_time_s"] == pytest.approx(rows[f"{host_spanning}-none"]["step_time_s"])
        assert "gpus_per_node=4 read as one host's" in rows[f"{host_spanning}-4"]["assumptions"]
        assert f"scale-up domain, {domain} accelerators" in rows[f"{host_spanning}-4"]["assumptions"]
    assert rows["h100-sxm5-80gb-4"]["step_time_s"] > rows["h100-sxm5-80gb-none"]["step_time_s"]
    assert "read as one host's" not in (rows["h100-sxm5-80gb-4"]["assumptions"] or "")


def test_an_mlperf_system_description_s_headers_read_as_the_schema(tmp_path):
    """MLPerf Training's system-description words (accelerator_model_name, number_of_nodes, accelerators_per_node,
    max_sequence_length): a GB200 NVL72 system of 64 nodes of 4 reads as 256 GPUs in one 72-GPU NVLink domain per
    rack, the row predicting what the schema's row without a per-node count does."""
    mlperf = tmp_path / "mlperf.csv"
    mlperf.write_text("run_id,model_name,accelerator_model_name,number_of_nodes,accelerators_per_node,"
                      "max_sequence_length,global_batch_size,tp,pp,dtype,metric,value\n"
                      "r,Llama 3.1 405B,NVIDIA GB200,64,4,8192,1152,4,8,fp8,tokens_per_s_per_gpu,900\n")
    schema = tmp_path / "schema.csv"
    schema.write_text("run_id,model_name,gpu,n_gpus,seq_len,global_batch_seqs,tp,pp,dtype,metric,value\n"
                      "r,Llama 3.1 405B,gb200,256,8192,1152,4,8,fp8,tokens_per_s_per_gpu,900\n")
    m, s = _predict(mlperf)["r"], _predict(schema)["r"]
    assert (m["gpu"], m["n_gpus"], m["seq_len"]) == ("gb200", 256, 8192)
    assert m["step_time_s"] == pytest.approx(s["step_time_s"])
    for note in ("column 'accelerators_per_node' read as gpus_per_node", "gpus_per_node=4 read as one host's"):
        assert note in m["assumptions"]


@pytest.mark.parametrize("header, metric, factor", [
    ("Throughput (tokens/s)", "tokens_per_s", 1.0), ("Tokens/sec/GPU", "tokens_per_s_per_gpu", 1.0),
    ("Throughput per GPU (tokens/s)", "tokens_per_s_per_gpu", 1.0), ("model TFLOPS/GPU", "model_tflops_per_gpu", 1.0),
    ("TFLOP/s per GPU", "model_tflops_per_gpu", 1.0), ("Achieved TFLOPS", "model_tflops_per_gpu", 1.0),
    ("tokens per second per device", "tokens_per_s_per_gpu", 1.0),
    ("Elapsed time per iteration (ms)", "step_time_s", 1e-3),
    ("MFU (%)", "mfu", 0.01), ("hardware TFLOPS", None, None), ("Throughput (samples/s)", None, None)])
def test_metric_headers_read_in_canonical_words(header, metric, factor):
    """A measured quantity's header is read whatever its words for 'per', 'second', 'token' and 'device' and a leading
    'Throughput' or 'Achieved'; a quantity the schema has no metric for (hardware TFLOPS) is not read as one, and
    samples are left to the samples reading (x seq_len)."""
    from pipeline.measurements import header_key, metric_synonym
    got = metric_synonym(header_key(header))
    assert got == ((metric, factor) if metric else None)


def test_a_throughput_column_in_other_words_is_a_target(tmp_path):
    """'Throughput (tokens/s)' (the cluster's) and 'model TFLOPS/GPU' become measured targets, so the rows are
    scored, not only predicted."""
    f = tmp_path / "runs.csv"
    f.write_text("Model,GPU,GPUs,TP,PP,Seq Len,GBS,Throughput (tokens/s),model TFLOPS/GPU\n"
                 "llama3-70b,h100-sxm5-80gb,64,8,2,8192,256,30000,\n"
                 "llama3-70b,h100-sxm5-80gb,64,8,2,8192,256,,400\n")
    rows = _predict(f)
    assert rows["line 2"]["measured_tokens_per_s_per_gpu"] == pytest.approx(30000 / 64)
    assert rows["line 3"]["measured_tokens_per_s_per_gpu"] > 0
    assert "column 'Throughput (tokens/s)' read as metric tokens_per_s" in rows["line 2"]["assumptions"]


@pytest.mark.parametrize("key, names", [
    ("tp_pp_dp", ["tp", "pp", "dp"]), ("dp_tp_pp_cp", ["dp", "tp", "pp", "cp"]), ("tp_pp", ["tp", "pp"]),
    ("tp_pp_dp_degrees", ["tp", "pp", "dp"]), ("tp", []), ("tp_tp", []), ("model_pp", []), ("num_gpus", [])])
def test_a_header_of_degree_names_is_read_in_order(key, names):
    from pipeline.predict_runs import degree_names
    assert degree_names(key) == names


def test_degrees_under_a_header_that_names_them_and_a_step_time_with_a_node_count(tmp_path):
    """'TP/PP/DP' over '8/4/16' is the layout tp 8, pp 4, dp 16; a step time converts to a target with the GPU count
    a node count gives and the batch a token count gives, as the schema's own columns would."""
    f = tmp_path / "runs.csv"
    f.write_text("Model,Accelerator,Number of nodes,GPUs per node,TP/PP/DP,Seq length,Global batch (tokens),"
                 "Step time (s)\nLlama 3.1 70B,H100,64,8,8/4/16,8192,4M,9.5\n")
    schema = tmp_path / "schema.csv"
    schema.write_text("run_id,model_name,gpu,n_gpus,tp,pp,dp,seq_len,global_batch_seqs,metric,value\n"
                      "line 2,Llama 3.1 70B,H100,512,8,4,16,8192,512,step_time_s,9.5\n")
    r, s = _predict(f)["line 2"], _predict(schema)["line 2"]
    assert (r["n_gpus"], r["tp"], r["pp"], r["dp"], r["global_batch_seqs"]) == (512, 8, 4, 16, 512)
    assert r["measured_tokens_per_s_per_gpu"] == pytest.approx(512 * 8192 / (9.5 * 512))
    assert r["measured_tokens_per_s_per_gpu"] == pytest.approx(s["measured_tokens_per_s_per_gpu"])
    assert r["step_time_s"] == pytest.approx(s["step_time_s"])
    assert "column 'TP/PP/DP' read as the degrees tp, pp, dp in that order" in r["assumptions"]


def test_cells_written_with_units_footnotes_and_suffixes(tmp_path):
    """'1K' GPUs and a '4K' context are 1,024 and 4,096 (K = 1,024 in a count, said in assumptions); a global
    batch of '4M tokens' is a batch in tokens; '2.1 s' and '2100 ms' are the same step time; '405*' and '41.0%†'
    lose their footnote marks; '512k' tokens/s is 512,000."""
    f = tmp_path / "runs.csv"
    f.write_text("Model,GPU,# GPUs,Seq len,Global batch,Step time,TFLOPs/GPU,MFU,Throughput (tokens/s)\n"
                 "llama3-70b,h100-sxm5-80gb,1K,4K,4M tokens,2.1 s,,,\n"
                 "llama3-70b,h100-sxm5-80gb,1024,4096,1024,2100 ms,,,\n"
                 "llama3-70b,h100-sxm5-80gb,512,8192,1024,,405*,,\n"
                 "llama3-70b,h100-sxm5-80gb,512,8192,1024,,,41.0%†,\n"
                 "llama3-70b,h100-sxm5-80gb,512,8192,1024,,,,512k\n")
    rows = _predict(f)
    a, b = rows["line 2"], rows["line 3"]
    assert (a["n_gpus"], a["seq_len"], a["global_batch_seqs"]) == (1024, 4096, 1024)
    assert a["measured_tokens_per_s_per_gpu"] == pytest.approx(1024 * 4096 / (2.1 * 1024))
    assert b["measured_tokens_per_s_per_gpu"] == pytest.approx(a["measured_tokens_per_s_per_gpu"])
    assert "a K suffix in n_gpus, seq_len read as x 1,024" in a["assumptions"]
    assert rows["line 4"]["measured_tokens_per_s_per_gpu"] > 0 and rows["line 5"]["measured_tokens_per_s_per_gpu"] > 0
    assert rows["line 6"]["measured_tokens_per_s_per_gpu"] == pytest.approx(512_000 / 512)


@pytest.mark.parametrize("header, cell, sharding", [
    ("ZeRO stage", "3", "zero3"), ("ZeRO stage", "1", "zero1"), ("Sharding Strategy", "FULL_SHARD", "fsdp"),
    ("Sharding Strategy", "SHARD_GRAD_OP", "zero2"), ("Sharding Strategy", "HYBRID_SHARD", "hsdp"),
    ("FSDP", "1", "fsdp"), ("FSDP", "16", "fsdp"), ("Parallelism", "ZeRO-3, TP 8", "zero3")])
def test_sharding_stated_as_a_stage_a_strategy_or_a_flag(tmp_path, header, cell, sharding):
    f = tmp_path / "runs.csv"
    f.write_text(f'Model,GPU,# GPUs,Seq len,GBS,{header},TPS/GPU\nllama3-8b,h100-sxm5-80gb,64,8192,128,"{cell}",6000\n')
    row = _predict(f)["line 2"]
    assert row["sharding"] == sharding and row["measured_tokens_per_s_per_gpu"] == pytest.approx(6000)


def test_an_fsdp_flag_of_zero_states_no_sharding(tmp_path):
    """NeMo's tables: FSDP 0 means the run did not use FSDP and says nothing of optimizer sharding: the framework's
    default applies (Megatron's distributed optimizer)."""
    f = tmp_path / "runs.csv"
    f.write_text("Model,GPU,# GPUs,Seq len,GBS,FSDP,TP,framework\nllama3-70b,h100-sxm5-80gb,64,8192,128,0,4,NeMo\n")
    row = _predict(f)["line 2"]
    assert row["sharding"] == "zero1" and "sharding from framework default" in row["assumptions"]


@pytest.mark.parametrize("header, metric, value, want", [
    ("TPS/GPU", "tokens_per_s_per_gpu", "6258", 6258.0), ("Throughput (T/s/GPU)", "tokens_per_s_per_gpu", "851", 851.0),
    ("Throughput (T/s)", "tokens_per_s", "54464", 54464 / 64), ("perf/per_device_tokens_per_sec", None, "3000", 3000.0),
    ("train_step_timing in s", None, "4.2", 128 * 8192 / (4.2 * 64)), ("tps", None, "6000", 6000.0)])
def test_throughput_headers_of_training_logs_and_benchmark_tables(tmp_path, header, metric, value, want):
    f = tmp_path / "runs.csv"
    f.write_text(f'Model,GPU,# GPUs,Seq len,GBS,{header}\nllama3-8b,h100-sxm5-80gb,64,8192,128,{value}\n')
    assert _predict(f)["line 2"]["measured_tokens_per_s_per_gpu"] == pytest.approx(want)


def test_llm_foundry_compact_headers_and_a_raw_parameter_count(tmp_path):
    """llm-foundry's benchmark headers (SeqLen (T), GlobalBatchSize, MicroBatchSize, GradAccum, NumParams as a raw
    count) read as the schema's columns."""
    f = tmp_path / "runs.csv"
    f.write_text("Model,SeqLen (T),# GPUs,GPU,MicroBatchSize,GradAccum,GlobalBatchSize,Throughput (T/s/GPU),"
                 "NumParams,Sharding Strategy\n"
                 "mpt-7b,2048,8,h100-sxm5-80gb,8,2,128,4000,6658859008,FULL_SHARD\n")
    row = _predict(f)["line 2"]
    assert (row["seq_len"], row["micro_batch"], row["global_batch_seqs"], row["sharding"]) == (2048, 8, 128, "fsdp")
    assert row["measured_tokens_per_s_per_gpu"] == pytest.approx(4000)
    assert row["step_time_s"] is not None and row["step_time_s"] < 60


def test_virtual_pipeline_and_node_size_headers(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text("Model,GPU,Nodes,GPUs/node,TP,PP,VP,Seq len,GBS,TPS/GPU\n"
                 "llama3-70b,h100-sxm5-80gb,16,4,4,4,5,8192,128,500\n")
    row = _predict(f)["line 2"]
    assert (row["n_gpus"], row["vpp"]) == (64, 5)


def test_a_row_without_an_accelerator_says_to_give_one(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text("Model,# GPUs,TP,Seq len,GBS,MFU\nllama3-70b,64,8,8192,128,40%\n")
    row = _predict(f)["line 2"]
    assert row["step_time_s"] is None and row["error"].startswith("no accelerator stated: give a gpu column")


def test_a_local_batch_with_pipeline_stages_and_a_gpu_count_from_the_degrees(tmp_path):
    """torchtitan's tables: DP, TP, PP and a local batch, no GPU count: n_gpus is the degrees' product; with
    pipeline stages the local batch is split into micro-batches of one sequence, without it is one micro-batch."""
    f = tmp_path / "runs.csv"
    f.write_text("Model,GPU,DP,TP,PP,Local batch size,Sequence length,TPS/GPU\n"
                 "llama3-405b,h100-sxm5-80gb,8,8,8,32,8192,150\nllama3-8b,h100-sxm5-80gb,8,1,1,4,8192,6000\n")
    rows = _predict(f)
    a, b = rows["line 2"], rows["line 3"]
    assert (a["n_gpus"], a["micro_batch"], a["global_batch_seqs"]) == (512, 1, 256)
    assert (b["n_gpus"], b["micro_batch"], b["global_batch_seqs"]) == (8, 4, 32)
    assert "n_gpus = dp x tp x pp x cp" in a["assumptions"]
@pytest.mark.parametrize("cell, count", [
    ("8x H100 SXM", 8), ("8xH100", 8), ("512x A100 80GB", 512), ("512 x A100", 512), ("H100 x8", 8),
    ("4 x DGX H100", 32), ("4x HGX H200", 32), ("2x DGX B200", 16),  # DGX/HGX systems hold 8 GPUs
    ("1x GB200 NVL72", 72), ("GB200 NVL72", 72), ("2x GB200 NVL72", 144),  # an NVL72 rack holds 72
    ("v5p-128", 64), ("TPU v4-256", 128),  # v4 and v5p slice names count TensorCores, 2 a chip
    ("v5e-256", 256), ("v5litepod-256", 256), ("v6e-256", 256), ("Trillium 256", 256),  # v5e/v6e names count chips
    ("H100", None), ("h100-sxm5-80gb", None), ("tpu-v5e", None), ("DGX H100", None), ("H100 NVL", None),
    ("0x H100", None), ("8x", None), ("", None), (None, None)])
def test_a_hardware_cell_states_its_accelerator_count(cell, count):
    from pipeline.catalog import accelerator_count
    assert accelerator_count(cell)[0] == count


def test_an_accelerator_count_in_the_hardware_cell_is_n_gpus_where_none_is_stated(tmp_path):
    """'8x H100 SXM', '4 x DGX H100', 'GB200 NVL72', 'v5p-128', 'v5litepod-256' under a hardware header with no GPU
    count column: n_gpus is the count the cell states (systems x 8, 72 a rack, a v5p slice's TensorCores / 2, a v5e
    slice's chips), said in assumptions, and the row is predicted; a stated n_gpus or node count is never
    replaced."""
    f = tmp_path / "runs.csv"
    f.write_text("Model,Hardware,GBS,Seq len,TGS\n"
                 "Llama 3.1 8B,8x H100 SXM,64,8192,9250\n"
                 "Llama 3.1 8B,512x A100 80GB,1024,8192,3000\n"
                 "Llama 3.1 8B,4 x DGX H100,128,8192,9000\n"
                 "Llama 3.1 8B,GB200 NVL72,144,8192,12000\n"
                 "Llama 3.1 8B,v5p-128,128,8192,3000\n"
                 "Llama 3.1 8B,v5litepod-256,256,8192,2000\n")
    rows = _predict(f)
    want = {"line 2": (8, "h100-sxm5-80gb", "n_gpus=8 from the hardware cell '8x H100 SXM'"),
            "line 3": (512, "a100-sxm4-80gb", "n_gpus=512 from the hardware cell '512x A100 80GB'"),
            "line 4": (32, "h100-sxm5-80gb", "n_gpus=32 from the hardware cell '4 x DGX H100' (4 systems x 8 GPUs"),
            "line 5": (72, "gb200", "n_gpus=72 from the hardware cell 'GB200 NVL72' (72 GPUs"),
            "line 6": (64, "tpu-v5p", "n_gpus=64 from the hardware cell 'v5p-128' (64 chips: a TPU v5p slice's name "
                                      "counts TensorCores, 2 a chip)"),
            "line 7": (256, "tpu-v5e", "n_gpus=256 from the hardware cell 'v5litepod-256' (256 chips")}
    for rid, (n, gpu, note) in want.items():
        row = rows[rid]
        assert (row["n_gpus"], row["gpu"]) == (n, gpu), rid
        assert row["error"] is None and row["step_time_s"] is not None, (rid, row["error"])
        assert note in row["assumptions"], rid
        assert row["tp"] * row["pp"] * row["dp"] == n, rid
    stated = tmp_path / "stated.csv"
    stated.write_text("Model,Hardware,# GPUs,Nodes,GBS,Seq len\n"
                      "Llama 3.1 8B,8x H100 SXM,64,,128,8192\n"
                      "Llama 3.1 8B,8x H100 SXM,,4,128,8192\n")
    rows = _predict(stated)
    assert rows["line 2"]["n_gpus"] == 64 and rows["line 3"]["n_gpus"] == 32  # the 8 is per node there
    for row in rows.values():
        assert "from the hardware cell" not in (row["assumptions"] or "")


def test_a_run_no_layout_fits_gets_the_layout_needing_the_least_memory(tmp_path):
    """Llama 3.1 405B on 1,024 H100 at a batch of 512 with no layout stated. With sharding stated 'none' no layout
    fits the memory model, so pure data parallelism (dp 1,024) would not split the batch: the row gets the valid
    layout whose dp divides the batch that needs the least memory per GPU (tp 8 in the node, then the most pp),
    is predicted, says so and stays over the capacity (memory_fits False, the figure kept). Without a sharding
    stated (an unknown stack), a layout that fits with optimizer and weight sharding counts as fitting: the
    fastest layout that does, with the least sharding that fits. A row that fits keeps that rule too."""
    f = tmp_path / "runs.csv"
    f.write_text("Model,GPU,# GPUs,GBS,Seq len,Sharding,MFU\n"
                 "Llama 3.1 405B,H100,1024,512,8192,,40%\n"
                 "Llama 3.1 405B,H100,1024,512,8192,none,40%\n"
                 "Llama 3.1 70B,H100,1024,512,8192,,40%\n")
    rows = _predict(f)
    note = "(no layout stated and none fits the memory model: the layout needing the least memory per GPU)"
    fastest = "(no layout stated: the fastest valid layout the model finds that fits in memory"
    stated = rows["line 3"]
    assert (stated["tp"], stated["pp"], stated["dp"]) == (8, 64, 2)
    assert stated["step_time_s"] is not None and stated["error_pct"] is not None
    assert "not divisible" not in (stated["error"] or "") and f"tp=8, pp=64, vpp=" in stated["assumptions"]
    assert note in stated["assumptions"] and "tp=1 (not stated)" not in stated["assumptions"]
    assert stated["sharding"] == "none" and stated["memory_fits"] is False
    # a measured run ran: it stays feasible, predicted as stated, and says the memory model calls it over capacity
    assert stated["memory_gb_per_gpu"] > stated["memory_capacity_gb"] and stated["error"] is None
    assert stated["feasible"] is True and "although the memory model calls it over capacity (memory " in \
        stated["assumptions"]
    for rid in ("line 2", "line 4"):
        row = rows[rid]
        assert row["memory_fits"] is True and note not in row["assumptions"] and fastest in row["assumptions"], rid
        assert row["sharding"] != "none" and "the least sharding that fits" in row["assumptions"], rid
        assert row["tp"] * row["pp"] * row["dp"] == 1024 and row["tp"] <= 8, rid


def test_a_run_with_no_layout_gets_the_fastest_that_fits(tmp_path):
    """A Megatron-class run that states no layout is read with the tp x pp the model finds fastest among those
    that fit at its micro-batch (a published run is a tuned one): every other tp x pp of the same run, stated, is
    slower or does not fit."""
    head = "Model,GPU,# GPUs,GBS,Seq len,Micro batch,Framework,Sharding,Recompute,TP,PP,MFU\n"
    f = tmp_path / "runs.csv"
    f.write_text(head + "Llama 3 70B,H100,64,128,8192,1,Megatron-Core,zero1,selective,,,40%\n")
    row = _predict(f)["line 2"]
    assert "(no layout stated: the fastest valid layout the model finds that fits in memory" in row["assumptions"]
    assert row["memory_fits"] is True
    others = [(t, p) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8, 16) if (t, p) != (row["tp"], row["pp"])]
    g = tmp_path / "others.csv"
    g.write_text(head + "".join(f"Llama 3 70B,H100,64,128,8192,1,Megatron-Core,zero1,selective,{t},{p},40%\n"
                                for t, p in others))
    alt = _predict(g)
    assert len(alt) == len(others)
    for r in alt.values():
        if r["memory_fits"] and r["step_time_s"] is not None:
            assert r["step_time_s"] >= row["step_time_s"] * (1 - 1e-9), (r["tp"], r["pp"])


def test_a_gpu_count_cell_that_names_the_accelerator(tmp_path):
    """'512x A100 80GB' under a 'GPUs' header (no hardware column): the accelerator and its count."""
    f = tmp_path / "runs.csv"
    f.write_text("Model,GPUs,GBS,Seq len,TFLOPS/GPU\nLlama 2 70B,512x A100 80GB,1024,4096,160\n")
    row = _predict(f)["line 2"]
    assert (row["gpu"], row["n_gpus"]) == ("a100-sxm4-80gb", 512) and row["step_time_s"] is not None


@pytest.mark.parametrize("unit, want", [
    ("tokens/sec/GPU", ("tokens_per_s_per_gpu", 1.0)), ("tokens/s", ("tokens_per_s", 1.0)), ("MFU", ("mfu", 1.0)),
    ("%", ("mfu", 0.01)), ("TFLOPS/GPU", ("model_tflops_per_gpu", 1.0)), ("s/step", ("step_time_s", 1.0)),
    ("ms/iter", ("step_time_s", 1e-3)), ("seconds per iteration", ("step_time_s", 1.0)),
    ("samples/s", ("tokens_per_s", "seq_len")), ("iter/s", ("step_time_s", "inverse")),
    ("hours per 1B tokens", None), ("", None)])
def test_a_unit_names_its_quantity(unit, want):
    from pipeline.predict_runs import unit_metric
    assert unit_metric(unit) == want


def test_a_value_and_its_unit_without_a_metric_column(tmp_path):
    """"Throughput" beside "Units" (no metric column): each row's quantity is its unit's, in the schema's unit; the
    same run measured in tokens/s/GPU, s/step, ms/iter and iter/s gives one measured throughput; a unit nothing reads
    leaves its row without a measurement, and says so."""
    path = tmp_path / "runs.csv"
    path.write_text("run_id,Model,Hardware,# GPUs,Global batch size,Sequence length,Parallelism,Throughput,Units\n"
                    "a,Llama 3 70B,H100,1024,1024,8192,TP=8 PP=4,800,tokens/sec/GPU\n"
                    "b,Llama 3 70B,H100,1024,1024,8192,TP=8 PP=4,10.24,s/step\n"
                    "c,Llama 3 70B,H100,1024,1024,8192,TP=8 PP=4,\"10,240\",ms/iter\n"
                    "d,Llama 3 70B,H100,1024,1024,8192,TP=8 PP=4,0.09765625,iter/s\n"
                    "e,Llama 3 70B,H100,1024,1024,8192,TP=8 PP=4,1.2,hours per 1B tokens\n")
    rows = _predict(path)
    for r in "abcd":
        assert rows[r]["measured_tokens_per_s_per_gpu"] == pytest.approx(800.0, rel=1e-9), r
    assert rows["e"]["measured_tokens_per_s_per_gpu"] is None and rows["e"]["step_time_s"] is not None
    said = rows["a"]["assumptions"]
    assert "column 'Throughput' read as the value of the quantity column 'Units' names" in said
    assert "'ms/iter' as step_time_s (x 0.001)" in said and "'hours per 1B tokens' not read" in said


def test_a_metric_column_beside_a_unit_column(tmp_path):
    """A `metric` column with a `unit` column: a step time in milliseconds is read in seconds (it was read as
    seconds, 1,000 times too slow), a metric the schema does not name is read as its unit's quantity, and a schema
    metric keeps its name (tokens_per_s_per_gpu written with a per-job unit is still per GPU)."""
    path = tmp_path / "runs.csv"
    head = "run_id,model_name,gpu,n_gpus,global_batch_seqs,seq_len,tp,pp,metric,value,unit\n"
    run = "Llama 3 70B,H100,1024,1024,8192,8,4"
    path.write_text(head + f"a,{run},tokens_per_s_per_gpu,800,tokens/s/GPU\n"
                           f"b,{run},step_time_s,10240,ms\n"
                           f"c,{run},step_time_s,10.24,s\n"
                           f"d,{run},throughput,800,tokens/sec/gpu\n"
                           f"e,{run},speed,\"102,400\",samples/s\n"
                           f"f,{run},tokens_per_s_per_gpu,800,tokens/s\n")
    rows = _predict(path)
    for r in "abcf":
        assert rows[r]["measured_tokens_per_s_per_gpu"] == pytest.approx(800.0, rel=1e-9), r
    assert rows["d"]["measured_tokens_per_s_per_gpu"] == pytest.approx(800.0, rel=1e-9)
    assert rows["e"]["measured_tokens_per_s_per_gpu"] == pytest.approx(102400 * 8192 / 1024, rel=1e-9)
    said = rows["a"]["assumptions"]
    assert "metric 'step_time_s' in 'ms' read as step_time_s (x 0.001)" in said
    assert "metric 'throughput' in 'tokens/sec/gpu' read as tokens_per_s_per_gpu" in said


@pytest.mark.parametrize("cell, n", [("128 nodes", 1024), ("16 x 8", 128), ("128 nodes x 8 GPUs", 1024),
                                     ("16 hosts", 128)])
def test_a_gpu_count_cell_that_counts_nodes(tmp_path, cell, n):
    path = tmp_path / "runs.csv"
    path.write_text("run_id,model_name,gpu,# GPUs,global_batch_seqs,seq_len\n"
                    f"a,llama3-8b,h100-sxm5-80gb,{cell},1024,8192\n")
    assert _predict(path)["a"]["n_gpus"] == n


def test_step_time_and_sample_headers_as_tables_write_them(tmp_path):
    """A short "Seq" header is the sequence length, and the wide step-time, sample-rate and steps-per-second columns
    a table writes give one measured throughput (512 x 8,192 tokens on 64 GPUs in 7.3 s: 8,977.5 tokens/s/GPU)."""
    heads = ["Step time (s)", "Iteration time (ms)", "Avg. iteration time [s]", "Elapsed time per iteration (ms)",
             "it/s", "Sequences/sec"]
    cells = ["7.3", "7300", "7.3", "7300", str(1 / 7.3), str(512 / 7.3)]
    rows = "".join(f"r{i},llama3-8b,h100-sxm5-80gb,64,512,8192," + ",".join(c if j == i else "" for j, c in
                                                                          enumerate(cells)) + "\n"
                   for i in range(len(heads)))
    path = tmp_path / "runs.csv"
    path.write_text("Run,Model,GPU,GPUs,GBS,Seq," + ",".join(f'"{h}"' for h in heads) + "\n" + rows)
    got = _predict(path)
    for i in range(len(heads)):
        assert got[f"r{i}"]["seq_len"] == 8192 and got[f"r{i}"]["measured_tokens_per_s_per_gpu"] == \
            pytest.approx(512 * 8192 / 64 / 7.3, rel=1e-9), heads[i]
    assert "column 'it/s' read as metric step_time_s (1 / the value: steps per second)" in got["r4"]["assumptions"]
