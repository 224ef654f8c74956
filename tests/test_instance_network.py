"""A cloud instance type names its scale-out network as well as its accelerator (measurements/instance_networks.csv,
`pipeline.catalog.instance_network`): a p4d.24xlarge's 400 Gbit/s of EFA is 6.25 GB/s per A100, a quarter of the
DGX A100 default; a run that states its own network keeps it."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from pipeline.catalog import cloud_instance_types, hardware, instance_networks, normalize_name, resolve_gpu
from pipeline.cli import app
from pipeline.predict_runs import predict_frame
from pipeline.settings import Settings

MEAS = Path(__file__).resolve().parents[1] / "measurements"


@pytest.fixture(autouse=True)
def no_store(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAST_STORE", str(tmp_path / "none" / "stepcast.duckdb"))


def test_every_instance_network_row_names_a_known_instance_with_a_source():
    """Each row resolves to its accelerator and has a source; a row with its network gives it per accelerator, a row
    without one (the type sourced, its network not) leaves the accelerator's table default."""
    rows = pl.read_csv(MEAS / "instance_networks.csv", infer_schema_length=0).to_dicts()
    types = cloud_instance_types()
    hw_ids = set(hardware(MEAS)["id"].to_list())
    assert len(rows) >= 20
    for r in rows:
        key = normalize_name(r["instance_type"], keep_dots=True)
        assert types.get(key) == r["accelerator_id"] and r["accelerator_id"] in hw_ids, r["instance_type"]
        assert r["source"] and int(r["accelerators"]) > 0
        if r["gpu_network_gbps"]:
            assert instance_networks()[key][0] == pytest.approx(
                float(r["gpu_network_gbps"]) / 8 / int(r["accelerators"]))
        else:
            assert key not in instance_networks() and "not sourced" in r["notes"]


@pytest.mark.parametrize("name, gpu, per_instance, gb_per_s", [
    ("p5e.48xlarge", "h200-sxm-141gb", 8, 50.0),  # up to 3,200 Gbps of EFA (AWS EC2 User Guide)
    ("trn2.48xlarge", "trn2", 16, 25.0),  # 3,200 Gbps of EFA over 16 Trainium2 chips (AWS Neuron docs)
    ("trn1.32xlarge", "trn1", 16, 6.25),  # 800 Gbps over 16 chips
    ("a4x-highgpu-4g", "gb200", 4, 50.0),  # 4 x 400 Gbps CX-7 for 4 GPUs (Google Cloud docs)
    ("ND MI300X v5", "mi300x", 8, 50.0),  # 8 x 400 Gigabit NDR (Microsoft Learn)
    ("Standard_ND96amsr_A100_v4", "a100-sxm4-80gb", 8, 25.0),  # 200 Gb/s HDR per GPU
    ("ND GB200 v6", "gb200", 4, 50.0),  # 4 x 400 Gb/s per 4-GPU VM
    ("a3-highgpu-8g", "h100-sxm5-80gb", 8, 15.625),  # the VM's 1,000 Gbps
])
def test_the_added_instance_types_carry_their_accelerators_and_networks(name, gpu, per_instance, gb_per_s):
    from pipeline.catalog import accelerator_count

    row, note = resolve_gpu(hardware(MEAS), name)
    assert row["id"] == gpu and row["inter_node_bw_gbps"] == pytest.approx(gb_per_s), note
    assert accelerator_count(f"3x {name}")[0] == 3 * per_instance


@pytest.mark.parametrize("name, gpu", [("p6-b200.48xlarge", "b200"), ("ND H200 v5", "h200-sxm-141gb"),
                                       ("Standard_ND96isr_H200_v5", "h200-sxm-141gb")])
def test_a_type_without_a_sourced_network_names_its_accelerator_and_keeps_the_default(name, gpu):
    row, note = resolve_gpu(hardware(MEAS), name)
    plain, _ = resolve_gpu(hardware(MEAS), gpu)
    assert row["id"] == gpu and row["inter_node_bw_gbps"] == plain["inter_node_bw_gbps"]
    assert "instance_networks.csv" in note and "inter_node_bw_gbps" not in note


@pytest.mark.parametrize("name,gpu,gb_per_s", [
    ("p4d.24xlarge", "a100-sxm4-40gb", 6.25),  # 400 Gbit/s EFA over 8 GPUs
    ("p5.48xlarge", "h100-sxm5-80gb", 50.0),  # 3,200 Gbit/s
    ("a3-megagpu-8g", "h100-sxm5-80gb", 25.0),  # 8 x 200 Gbit/s GPUDirect-TCPXO
    ("a2-highgpu-8g", "a100-sxm4-40gb", 1.5625),  # 100 Gbit/s for the whole VM
])
def test_an_instance_type_carries_its_network(name, gpu, gb_per_s):
    row, note = resolve_gpu(hardware(MEAS), name)
    assert row["id"] == gpu and row["inter_node_bw_gbps"] == pytest.approx(gb_per_s)
    assert "instance_networks.csv" in note
    plain, _ = resolve_gpu(hardware(MEAS), gpu)
    assert plain["inter_node_bw_gbps"] != pytest.approx(gb_per_s) or gpu == "h100-sxm5-80gb"


@pytest.mark.parametrize("name,gpu", [("ND H100 v5", "h100-sxm5-80gb"), ("Standard_ND96isr_H100_v5", "h100-sxm5-80gb"),
                                      ("ND A100 v4", "a100-sxm4-40gb")])
def test_azure_nd_series_names_read_as_their_accelerators(name, gpu):
    """Azure's ND VMs are not in the price table; their network rows name them (one InfiniBand HCA per GPU: the
    table's default, 25 GB/s per A100 and 50 per H100)."""
    row, note = resolve_gpu(hardware(MEAS), name)
    plain, _ = resolve_gpu(hardware(MEAS), gpu)
    assert row["id"] == gpu and row["inter_node_bw_gbps"] == plain["inter_node_bw_gbps"]
    assert "instance_networks.csv" in note


def test_an_instance_without_a_network_row_keeps_the_table_default():
    row, note = resolve_gpu(hardware(MEAS), "p5en.48xlarge")
    plain, _ = resolve_gpu(hardware(MEAS), row["id"])
    assert row["inter_node_bw_gbps"] == plain["inter_node_bw_gbps"] and "instance_networks" not in note


def _runs(**over):
    base = {"model_name": "llama2-70b", "n_gpus": "256", "seq_len": "4096", "global_batch_seqs": "512",
            "micro_batch": "1", "tp": "8", "pp": "4", "framework": "Megatron-LM", "dtype": "bf16", "sharding": "zero1",
            "recompute": "selective", "metric": "tokens_per_s_per_gpu", "value": "300"}
    rows = [base | {"run_id": rid} | cells for rid, cells in over.items()]
    return predict_frame(pl.DataFrame(rows), Settings.load().measurements)


def test_a_run_on_an_instance_pays_its_network_unless_it_states_one():
    out = {r["run_id"]: r for r in _runs(p4d={"gpu": "p4d.24xlarge"}, a100={"gpu": "a100-sxm4-40gb"},
                                         stated={"gpu": "p4d.24xlarge", "inter_node_bw_gbps": "25"}).to_dicts()}
    assert out["p4d"]["gpu"] == out["a100"]["gpu"] == "a100-sxm4-40gb"
    # 6.25 GB/s per GPU instead of 25: the data- and pipeline-parallel traffic across nodes takes longer
    assert out["p4d"]["dp_comm_exposed_s"] > 2 * out["a100"]["dp_comm_exposed_s"]
    assert out["p4d"]["step_time_s"] > out["a100"]["step_time_s"]
    assert "network of p4d.24xlarge" in out["p4d"]["assumptions"]
    assert out["stated"]["step_time_s"] == pytest.approx(out["a100"]["step_time_s"], rel=1e-12)
    assert "network of p4d.24xlarge" not in out["stated"]["assumptions"]


def test_predict_and_predict_runs_give_one_answer_on_an_instance():
    run = _runs(p4d={"gpu": "p4d.24xlarge"}).row(0, named=True)
    res = CliRunner().invoke(app, ["predict", "-m", "llama2-70b", "--gpu", "p4d.24xlarge", "-n", "256", "-b", "512",
                                   "-s", "4096", "--tp", "8", "--pp", "4", "--vpp", str(run["vpp"]),
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    cli = json.loads(res.stdout[res.stdout.index("["):])[0]
    assert cli["step_time_s"] == pytest.approx(run["step_time_s"], rel=1e-9)
    assert cli["inter_node_bw_gbps"] == pytest.approx(6.25)
    assert "network of p4d.24xlarge" in cli["assumptions"]


def test_a_count_of_instances_counts_their_accelerators():
    """"16x p4d.24xlarge" is sixteen instances of eight A100s: 128 GPUs, each with the p4d's network; an instance
    type alone names the accelerator, not how many."""
    from pipeline.catalog import accelerator_count

    assert accelerator_count("16x p4d.24xlarge")[0] == 128
    assert accelerator_count("2 x a2-megagpu-16g")[0] == 32
    assert accelerator_count("4x ND H100 v5")[0] == 32
    assert accelerator_count("p5.48xlarge")[0] is None
    assert accelerator_count("8x H100")[0] == 8  # a count with an accelerator counts accelerators
    run = predict_frame(pl.DataFrame([{"run_id": "r", "model_name": "llama2-70b", "gpu": "16x p4d.24xlarge",
                                       "seq_len": "4096", "global_batch_seqs": "512", "tp": "8", "pp": "4",
                                       "metric": "tokens_per_s_per_gpu", "value": "300"}]),
                        Settings.load().measurements).row(0, named=True)
    assert run["n_gpus"] == 128 and run["gpu"] == "a100-sxm4-40gb"
    assert "16 instances x 8 accelerators" in run["assumptions"] and "network of p4d.24xlarge" in run["assumptions"]


def test_a_malformed_instance_table_is_named_by_file_line_and_column(tmp_path, monkeypatch):
    """A network row whose bandwidth is not a number stops the reading with the file, line and column, through
    `predict` (exit 2) and `predict --runs` (exit 1) alike; the shipped table is untouched."""
    from pipeline import catalog

    bad = tmp_path / "meas"
    bad.mkdir()
    text = (MEAS / "instance_networks.csv").read_text().splitlines()
    head, row = text[0].split(","), text[1]
    text[1] = row.replace(",400,", ",fast,", 1)  # p4d.24xlarge's gpu_network_gbps
    (bad / "instance_networks.csv").write_text("\n".join(text) + "\n")
    monkeypatch.setattr(catalog, "_default_measurements", lambda: bad)
    catalog._instance_rows.cache_clear()
    catalog.cloud_instance_types.cache_clear()
    catalog.instance_accelerators.cache_clear()
    try:
        with pytest.raises(catalog.UnknownName, match=r"instance_networks\.csv: line 2, column gpu_network_gbps: "
                                                         r"expected a number > 0, got 'fast'"):
            catalog.instance_networks()
        res = CliRunner().invoke(app, ["predict", "-m", "llama2-70b", "--gpu", "p4d.24xlarge", "-n", "256", "-b",
                                       "512", "-s", "4096", "--tp", "8", "--pp", "4"])
        assert res.exit_code == 2 and "line 2, column gpu_network_gbps" in res.output
        runs = tmp_path / "runs.csv"
        runs.write_text("run_id,model_name,gpu,n_gpus,seq_len,global_batch_seqs,tp,pp\nr,llama2-70b,p4d.24xlarge,256,"
                        "4096,512,8,4\n")
        res = CliRunner().invoke(app, ["predict", "--runs", str(runs)])
        assert res.exit_code == 1 and "line 2, column gpu_network_gbps" in res.output
    finally:
        for f in (catalog._instance_rows, catalog.cloud_instance_types, catalog.instance_accelerators):
            f.cache_clear()
    assert "gpu_network_gbps" in head and (MEAS / "instance_networks.csv").read_text().count(",400,") >= 1
