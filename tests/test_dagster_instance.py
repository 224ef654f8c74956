"""`stepcast build` records its run in the project's Dagster instance, and `dagster dev` (same instance) shows it
and stops on SIGTERM.

The session build (tests/conftest.py `built_store`) runs `stepcast build`'s code with DAGSTER_HOME pointed at a
temporary folder, so nothing here reads or writes the developer's `.dagster/`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import pytest
import yaml

from pipeline import build
from tests.conftest import ROOT, dagster_home_of

BIN = Path(sys.executable).parent
STOP_WITHIN_S = 30  # the bound for `dagster dev` after SIGTERM / Ctrl-C


def graph():
    from pipeline.definitions import make_definitions

    job = make_definitions().resolve_job_def("build")
    return set(job.asset_layer.executable_asset_keys), set(job.asset_layer.asset_graph.asset_check_keys)


def test_build_records_every_asset_and_check_in_the_instance(built_store):
    assets, checks = graph()
    instance = dg.DagsterInstance.from_config(str(dagster_home_of(built_store)))
    try:
        runs = instance.get_run_records(dg.RunsFilter(job_name="build"))
        assert len(runs) == 1 and runs[0].dagster_run.status == dg.DagsterRunStatus.SUCCESS
        missing = [k.to_user_string() for k in assets if instance.get_latest_materialization_event(k) is None]
        assert not missing, f"never materialized in the instance: {missing}"
        # metadata travels with the materialization (what the UI's asset page shows)
        site = instance.get_latest_materialization_event(dg.AssetKey("report_site")).asset_materialization
        assert site.metadata["pages"].value >= 5
        evaluations = instance.get_records_for_run(
            runs[0].dagster_run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION).records
        evaluated = {e.event_log_entry.dagster_event.event_specific_data.asset_check_key for e in evaluations}
        assert evaluated == checks
    finally:
        instance.dispose()


def test_dagster_home_gets_the_project_settings_and_keeps_a_hand_written_file(tmp_path):
    home = build.ensure_dagster_home(tmp_path / "home")
    written = yaml.safe_load((home / "dagster.yaml").read_text())
    project = yaml.safe_load(build.PROJECT_DAGSTER_YAML.read_text())
    assert written == {k: v for k, v in project.items() if k not in build.STORAGE_KEYS}
    instance = dg.DagsterInstance.from_config(str(home))
    try:  # the history stays inside the home, not in the folder the process runs in
        assert Path(instance.root_directory).resolve() == home.resolve()
    finally:
        instance.dispose()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    build.ensure_dagster_home(mine)
    assert (mine / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"


def test_dagster_dev_in_the_project_root_and_stepcast_build_share_one_folder():
    """Without DAGSTER_HOME, `dagster dev` reads the project's dagster.yaml, whose storage paths are relative to the
    folder it starts in (the project root), and `stepcast build` uses `.dagster/` there with Dagster's default
    layout (history/, storage/, schedules/ under the home): the same files."""
    config = yaml.safe_load(build.PROJECT_DAGSTER_YAML.read_text())
    dirs = [config["storage"]["sqlite"]["base_dir"], config["local_artifact_storage"]["config"]["base_dir"]]
    assert {(ROOT / d).resolve() for d in dirs} == {build.DEFAULT_DAGSTER_HOME}
    assert (ROOT / config["compute_logs"]["config"]["base_dir"]).resolve() == build.DEFAULT_DAGSTER_HOME / "storage"
    assert ".dagster/" in (ROOT / ".gitignore").read_text().split()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(port: int, query: str) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def test_dagster_dev_shows_the_build_and_stops_within_30_s_of_sigterm(built_store, tmp_path):
    """`dagster dev` on the session build's instance: the UI's GraphQL lists a materialization for every asset;
    SIGTERM stops it and every process it started within 30 s."""
    port = _free_port()
    env = dict(os.environ, DAGSTER_HOME=str(dagster_home_of(built_store)), STEPCAST_STORE=str(built_store),
               STEPCAST_INCOMING=str(tmp_path / "incoming"))
    log_path = tmp_path / "dev.log"
    with open(log_path, "w") as log:
        # SIGINT at its default: a background job of a non-interactive shell starts with it ignored, and Dagster
        # gives SIGTERM the SIGINT handler, so such a `dagster dev` ignores both (README "Dagster")
        proc = subprocess.Popen([str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port)], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline, nodes = time.monotonic() + 300, None
        while time.monotonic() < deadline and nodes is None:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                got = _graphql(port, "{ assetNodes { assetKey { path } assetMaterializations(limit: 1) { runId } } }")
                nodes = got["data"]["assetNodes"] if got.get("data") else None
            except OSError:
                time.sleep(1)
        assert nodes, log_path.read_text()[-3000:]
        assets, _ = graph()
        shown = {tuple(n["assetKey"]["path"]) for n in nodes if n["assetMaterializations"]}
        assert shown == {tuple(k.path) for k in assets}
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=STOP_WITHIN_S)
        left = ["?"]
        while left and time.monotonic() - start < STOP_WITHIN_S:  # its webserver, daemon and code servers too
            left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
            time.sleep(0.5)
        assert not left, f"processes left {STOP_WITHIN_S} s after SIGTERM to dagster dev: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"dagster dev still running {STOP_WITHIN_S} s after SIGTERM:\n{log_path.read_text()[-3000:]}")
