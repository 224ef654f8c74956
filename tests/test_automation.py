"""Automation: schedule and sensor definitions, the sensor cursor, incoming files end to end (Dagster test
APIs and the real daemon), one writer, SIGKILL during a build, a reader holding the snapshot."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import duckdb
import pytest

from pipeline import automation, store
from tests.conftest import ROOT
from tests.test_ingest import BASE, write_rows

BIN = Path(sys.executable).parent


def good_file(path: Path, run_id: str, value: str = "6000") -> Path:
    return write_rows(path, [dict(BASE, run_id=run_id, value=value),
                             dict(BASE, run_id=run_id, metric="mfu", unit="fraction", value="0.41")])


def drop(folder: Path, name: str, writer) -> Path:
    """Write a file beside under a hidden name, then rename it in (how a careful producer drops files)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = writer(folder / f".{name}.tmp")
    final = folder / name
    os.replace(tmp, final)
    return final


def table_counts(path: Path) -> dict[str, int]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        names = [r[0] for r in con.execute(
            "select table_name from information_schema.tables where table_schema = 'main' order by 1").fetchall()]
        return {t: con.execute(f'select count(*) from "{t}"').fetchone()[0] for t in names}
    finally:
        con.close()


# ---------------------------------------------------------------- definitions

def test_schedule_sensor_and_refit_job_definitions():
    from pipeline.definitions import make_definitions

    defs = make_definitions()
    schedule = defs.resolve_schedule_def("nightly_refit")
    assert schedule.cron_schedule == "0 3 * * *" and schedule.execution_timezone == "UTC"
    assert schedule.job_name == "refit"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    sensor = defs.resolve_sensor_def("incoming_files")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert sensor.job_name == "refit"
    refit, build = defs.resolve_job_def("refit"), defs.resolve_job_def("build")
    # the refit job is the whole graph: every asset and every (blocking) check of `build`
    assert refit.asset_layer.executable_asset_keys == build.asset_layer.executable_asset_keys
    checks = refit.asset_layer.asset_graph.asset_check_keys
    assert checks and checks == build.asset_layer.asset_graph.asset_check_keys
    assert refit.tags.get(automation.WRITER_TAG) == "true"


def test_dagster_yaml_allows_one_run_at_a_time(tmp_path):
    from pipeline.build import ensure_dagster_home

    home = ensure_dagster_home(tmp_path / "dh")  # the project's dagster.yaml, storage inside the home
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        queue = instance.get_concurrency_config().run_queue_config
        assert queue.max_concurrent_runs == 1
        assert {"key": automation.WRITER_TAG, "limit": 1} in queue.tag_concurrency_limits
    finally:
        instance.dispose()


# ---------------------------------------------------------------- sensor cursor

def test_sensor_cursor_round_trip_and_dedupe(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAST_INCOMING_SETTLE_S", "0")
    incoming = tmp_path / "incoming"
    sensor = automation.make_incoming_sensor(incoming)
    a = drop(incoming, "a.csv", lambda p: good_file(p, "s-a"))
    drop(incoming, "b.csv", lambda p: good_file(p, "s-b"))
    (incoming / "README.md").write_text("not data")
    (incoming / ".c.csv.tmp").write_text("still being written")
    (incoming / "processed").mkdir()
    good_file(incoming / "processed" / "old.csv", "s-old")

    first = sensor(dg.build_sensor_context(cursor=None))
    assert sorted(r.tags[automation.FILE_TAG] for r in first.run_requests) == ["a.csv", "b.csv"]
    sha_a = store.sha256_file(a)
    assert f"a.csv@{sha_a}" in {r.run_key for r in first.run_requests}
    assert automation.cursor_load(first.cursor) == {"a.csv": sha_a, "b.csv": store.sha256_file(incoming / "b.csv")}

    # same files, cursor round trip: nothing new
    again = sensor(dg.build_sensor_context(cursor=first.cursor))
    assert not again.run_requests and again.skip_reason is not None
    assert again.cursor == first.cursor

    # one file changes: exactly one request, keyed by the new content
    good_file(incoming / "b.csv", "s-b", value="6100")
    changed = sensor(dg.build_sensor_context(cursor=again.cursor))
    assert [r.tags[automation.FILE_TAG] for r in changed.run_requests] == ["b.csv"]
    assert changed.run_requests[0].run_key == f"b.csv@{store.sha256_file(incoming / 'b.csv')}"

    # a file that leaves the folder (processed or quarantined) leaves the cursor
    a.unlink()
    gone = sensor(dg.build_sensor_context(cursor=changed.cursor))
    assert not gone.run_requests and "a.csv" not in automation.cursor_load(gone.cursor)


def test_sensor_waits_for_a_file_to_settle(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAST_INCOMING_SETTLE_S", "3600")
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    good_file(incoming / "fresh.csv", "s-fresh")
    result = automation.make_incoming_sensor(incoming)(dg.build_sensor_context())
    assert not result.run_requests
    old = time.time() - 7200
    os.utime(incoming / "fresh.csv", (old, old))
    result = automation.make_incoming_sensor(incoming)(dg.build_sensor_context())
    assert [r.tags[automation.FILE_TAG] for r in result.run_requests] == ["fresh.csv"]


# ---------------------------------------------------------------- incoming files end to end (test APIs)

def _settings(tmp_path: Path, built_store: Path, monkeypatch):
    from pipeline.settings import Settings

    target = tmp_path / "store" / "stepcast.duckdb"
    target.parent.mkdir(parents=True)
    shutil.copyfile(built_store, target)
    monkeypatch.setenv("STEPCAST_STORE", str(target))
    monkeypatch.setenv("STEPCAST_INCOMING", str(tmp_path / "incoming"))
    monkeypatch.setenv("STEPCAST_INCOMING_SETTLE_S", "0")
    monkeypatch.delenv("STEPCAST_SNAPSHOT", raising=False)
    return Settings.load()


def test_dropped_file_runs_the_graph_and_bad_file_is_quarantined(built_store, tmp_path, monkeypatch):
    from pipeline.definitions import make_definitions

    cfg = _settings(tmp_path, built_store, monkeypatch)
    drop(cfg.incoming, "good.csv", lambda p: good_file(p, "e2e-good"))
    drop(cfg.incoming, "bad.csv", lambda p: write_rows(p, [dict(BASE, run_id="e2e-bad-1"),
                                                          dict(BASE, run_id="e2e-bad-2", value="45", metric="mfu",
                                                               unit="fraction")]))
    defs = make_definitions(cfg)
    tick = defs.resolve_sensor_def("incoming_files")(dg.build_sensor_context())
    assert len(tick.run_requests) == 2
    request = next(r for r in tick.run_requests if r.tags[automation.FILE_TAG] == "good.csv")
    # the ingest half of the graph and the snapshot (the whole graph runs in the real-daemon test below)
    selection = [dg.AssetKey(k) for k in ("hardware", "architectures", "cloud_prices", "run_metrics", "runs",
                                          "store_snapshot")]
    result = defs.resolve_job_def("refit").execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), tags=request.tags, raise_on_error=True, asset_selection=selection)
    assert result.success
    assert {e.asset_key for e in result.get_asset_materialization_events()} == set(selection)
    assert all(ev.passed for ev in result.get_asset_check_evaluations())
    meta = next(e for e in result.get_asset_materialization_events()
                if e.asset_key == dg.AssetKey("run_metrics")).materialization.metadata
    assert meta["incoming_accepted"].value == 1 and meta["incoming_quarantined"].value == 1

    processed, quarantine = automation.processed_dir(cfg.incoming), automation.quarantine_dir(cfg.incoming)
    assert sorted(p.name for p in cfg.incoming.iterdir() if p.is_file()) == []
    assert (processed / "good.csv").exists()
    assert (quarantine / "bad.csv").exists()
    reason = (quarantine / "bad.csv.reason.txt").read_text()
    assert "bad.csv:3: column value = '45'" in reason and "looks like a percent" in reason

    snap = duckdb.connect(str(cfg.snapshot), read_only=True)
    try:
        good = snap.execute("select tokens_per_s_per_gpu, mfu, source_file from runs where run_id = 'e2e-good'").fetchall()
        bad = snap.execute("select count(*) from run_metrics where run_id like 'e2e-bad%'").fetchone()[0]
    finally:
        snap.close()
    assert good == [(6000.0, 0.41, store.file_key(processed / "good.csv"))]
    assert bad == 0  # an incoming file is all or nothing

    # a rebuild from scratch still holds every accepted incoming file (processed/ is ingested every time)
    fresh = tmp_path / "fresh.duckdb"
    con = store.connect(fresh)
    try:
        from pipeline.build import load_reference_tables

        load_reference_tables(con, cfg)
        out = automation.ingest_incoming(con, cfg.incoming)
        assert [r.status for r in out.reprocessed] == ["accepted"] and not out.accepted
        assert con.execute("select count(*) from runs where run_id = 'e2e-good'").fetchone()[0] == 1
    finally:
        con.close()


def test_file_changing_while_read_stays_for_the_next_run(store_copy, tmp_path, monkeypatch):
    from pipeline import readers

    monkeypatch.setenv("STEPCAST_INCOMING_SETTLE_S", "0")
    incoming = tmp_path / "incoming"
    path = drop(incoming, "moving.csv", lambda p: good_file(p, "e2e-moving"))
    real = readers._read_bytes
    calls = {"n": 0}

    def changing(p: Path) -> bytes:
        calls["n"] += 1
        data = real(p)
        return data + b"\n" if calls["n"] == 2 else data  # the second read sees other bytes

    monkeypatch.setattr(readers, "_read_bytes", changing)
    con = store.connect(store_copy)
    try:
        out = automation.ingest_incoming(con, incoming)
        n = con.execute("select count(*) from run_metrics where run_id = 'e2e-moving'").fetchone()[0]
    finally:
        con.close()
    assert out.retry == ["moving.csv"] and not out.quarantined and not out.accepted
    assert path.exists() and n == 0


# ---------------------------------------------------------------- the real daemon

def test_real_daemon_sensor_run_updates_the_whole_graph(built_store, tmp_path):
    """`dagster-daemon run` in a subprocess (temp DAGSTER_HOME with the project's dagster.yaml): a dropped
    file starts one queued `refit` run, which re-materializes every asset (ingest, predictions, fits,
    curves, site: whatever the graph holds) and publishes a snapshot with the new run."""
    from pipeline.build import ensure_dagster_home

    home = ensure_dagster_home(tmp_path / "dagster_home")
    target = tmp_path / "store" / "stepcast.duckdb"
    target.parent.mkdir()
    shutil.copyfile(built_store, target)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    env = dict(os.environ, DAGSTER_HOME=str(home), STEPCAST_STORE=str(target), STEPCAST_INCOMING=str(incoming),
               STEPCAST_SENSOR_INTERVAL_S="1", STEPCAST_INCOMING_SETTLE_S="0")
    for var in ("STEPCAST_SNAPSHOT", "STEPCAST_REPORTS"):
        env.pop(var, None)
    log_path = tmp_path / "daemon.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([str(BIN / "dagster-daemon"), "run", "-m", "pipeline.definitions"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    instance = None
    try:
        drop(incoming, "d1.csv", lambda p: good_file(p, "daemon-1"))
        instance = dg.DagsterInstance.from_config(str(home))
        deadline = time.monotonic() + 420  # bounded: start-up plus one full run of the graph on 2 busy cores
        records = []
        while time.monotonic() < deadline:
            records = instance.get_run_records(dg.RunsFilter(job_name="refit"))
            if records and records[0].dagster_run.is_finished:
                break
            assert proc.poll() is None, log_path.read_text()[-3000:]
            time.sleep(1)
        assert len(records) == 1, log_path.read_text()[-3000:]
        run = records[0].dagster_run
        assert run.status == dg.DagsterRunStatus.SUCCESS, log_path.read_text()[-3000:]
        assert run.tags[automation.FILE_TAG] == "d1.csv" and run.tags[automation.WRITER_TAG] == "true"
        from pipeline.definitions import make_definitions

        graph = set(make_definitions().resolve_job_def("refit").asset_layer.executable_asset_keys)
        events = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
        assert {e.event_log_entry.dagster_event.asset_key for e in events} == graph
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        if instance is not None:
            instance.dispose()
    snapshot = target.parent / "snapshot" / target.name
    con = duckdb.connect(str(snapshot), read_only=True)
    try:
        got = con.execute("select run_id, tokens_per_s_per_gpu from runs where run_id like 'daemon-%'").fetchall()
    finally:
        con.close()
    assert got == [("daemon-1", 6000.0)]
    assert [p.name for p in automation.processed_dir(incoming).iterdir()] == ["d1.csv"]


# ---------------------------------------------------------------- failure safety

def test_publish_failure_or_leftovers_never_touch_the_snapshot(store_copy, tmp_path, monkeypatch):
    snapshot = tmp_path / "snap" / "s.duckdb"
    store.publish_snapshot(store_copy, snapshot)
    before = table_counts(snapshot)
    # a publisher killed mid-copy leaves a temp file named after its (now dead) pid
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = snapshot.with_name(f".{snapshot.name}.{int(dead.stdout)}.tmp")
    leftover.write_bytes(b"half a database")
    # the rename fails: the snapshot is the old one, and no temp file stays behind
    monkeypatch.setattr(store.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError, match="disk gone"):
        store.publish_snapshot(store_copy, snapshot)
    monkeypatch.undo()
    assert table_counts(snapshot) == before
    assert sorted(p.name for p in snapshot.parent.iterdir()) == [snapshot.name]


def test_sigkill_during_build_keeps_snapshot_and_next_build_recovers(built_store, tmp_path):
    target = tmp_path / "k" / "stepcast.duckdb"
    target.parent.mkdir()
    shutil.copyfile(built_store, target)
    snapshot = target.parent / "snapshot" / target.name
    store.publish_snapshot(target, snapshot)
    before = table_counts(snapshot)
    env = dict(os.environ, STEPCAST_STORE=str(target), STEPCAST_INCOMING=str(tmp_path / "incoming"))
    env.pop("STEPCAST_SNAPSHOT", None)
    env["DAGSTER_HOME"] = str(tmp_path / "dagster_home")  # not the developer's .dagster/
    cmd = [str(BIN / "stepcast"), "build", "--quiet"]
    rng = random.Random(7)
    # kill points: during start-up/ingest, and during the later assets (a build takes ~10-25 s here); the
    # publish step itself is covered by test_publish_failure_or_leftovers_never_touch_the_snapshot
    for low, high in ((1.0, 4.0), (5.0, 12.0)):
        delay = rng.uniform(low, high)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert table_counts(snapshot) == before, f"snapshot changed after a kill at {delay:.1f} s"

    # the next build recovers without manual steps, while a reader holds the old snapshot open
    reader = duckdb.connect(str(snapshot), read_only=True)
    seen: list[int] = []
    stop = threading.Event()

    def read_loop():
        while not stop.is_set():
            seen.append(reader.execute("select count(*) from runs").fetchone()[0])
            time.sleep(0.05)

    thread = threading.Thread(target=read_loop)
    thread.start()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        stop.set()
        thread.join()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert seen and set(seen) == {before["runs"]}  # the reader saw one consistent store throughout
    assert reader.execute("select count(*) from run_metrics").fetchone()[0] == before["run_metrics"]
    reader.close()
    after = table_counts(snapshot)
    # same inputs, same ingest tables; every other table is there and as (non-)empty as before (their exact
    # counts belong to their own tests: some searches are not bit-for-bit repeatable)
    assert set(after) == set(before)
    assert {t: after[t] for t in store.MAIN_TABLES} == {t: before[t] for t in store.MAIN_TABLES}
    assert {t for t in after if after[t]} == {t for t in before if before[t]}
    assert [p.name for p in snapshot.parent.iterdir()] == [snapshot.name]  # no half-written leftovers


def test_refit_does_not_bypass_blocking_checks(built_store, tmp_path, monkeypatch):
    """A store that fails a blocking check (here: a hand-edited percent MFU) stops the run before the
    snapshot: readers keep the last good one."""
    from pipeline.definitions import make_definitions

    cfg = _settings(tmp_path, built_store, monkeypatch)
    store.publish_snapshot(cfg.store, cfg.snapshot)
    before = table_counts(cfg.snapshot)
    con = store.connect(cfg.store)
    try:
        con.execute("""insert into run_metrics (run_id, source, source_ref, model_name, gpu, metric, value, unit,
                       source_file, source_line)
                       values ('hand-edit', 'x', 'y', 'Llama 3 8B', 'h100-sxm5-80gb', 'mfu', 45, 'fraction',
                               'by-hand', 1)""")
    finally:
        con.close()
    selection = [dg.AssetKey(k) for k in ("run_metrics", "runs", "store_snapshot")]
    result = make_definitions(cfg).resolve_job_def("refit").execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), raise_on_error=False, asset_selection=selection)
    assert not result.success
    failed = {ev.check_name for ev in result.get_asset_check_evaluations() if not ev.passed}
    assert "run_metrics_units_and_ranges" in failed
    assert dg.AssetKey("store_snapshot") not in {e.asset_key for e in result.get_asset_materialization_events()}
    assert table_counts(cfg.snapshot) == before
