"""Automation: schedule and sensor definitions, the sensor cursor, incoming files end to end (Dagster test
APIs and the real daemon), one writer, SIGKILL during a build, a reader holding the snapshot."""

from __future__ import annotations

import json
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
    home = tmp_path / "dh"
    home.mkdir()
    from pipeline.build import ensure_dagster_home

    ensure_dagster_home(home)  # the project's dagster.yaml, storage inside the home
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        queue = instance.get_concurrency_config().run_queue_config
        assert queue.max_concurrent_runs == 1
        assert {"key": automation.WRITER_TAG, "limit": 1} in queue.tag_concurrency_limits
    finally:
        instance.dispose()


def test_dead_runs_sensor_fails_the_run_of_a_dead_process_so_the_queue_moves(tmp_path):
    """A run left STARTED by a process that is gone blocks the one-run-at-a-time queue: the dead_runs sensor
    (every tick of the daemon, its first one at start) marks it FAILURE with the reason; a run whose process
    is alive stays as it is."""
    import uuid

    from pipeline.build import ensure_dagster_home

    instance = dg.DagsterInstance.from_config(str(ensure_dagster_home(tmp_path / "dh")))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        runs = {}
        for name, pid in (("gone", int(gone.stdout)), ("alive", alive.pid)):
            runs[name] = dg.DagsterRun(job_name="build", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED,
                                       tags={automation.PID_TAG: str(pid)})
            instance.add_run(runs[name])
        sensor = automation.make_dead_runs_sensor()
        assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
        result = sensor(dg.build_sensor_context(instance=instance))
        dead_id = runs["gone"].run_id
        assert f"Dagster run {dead_id} (job build) was left STARTED by pid {gone.stdout.strip()}, which is gone " \
               f"(killed or crashed): marked FAILURE" in result.skip_message
        assert instance.get_run_by_id(dead_id).status == dg.DagsterRunStatus.FAILURE
        assert "killed or crashed while the run was STARTED; marked failed by the dead_runs sensor so that the " \
               "runs queued behind it can start" in _run_failure_message(instance, dead_id)
        # what the run queue counts against max_concurrent_runs now: the live run only
        active = instance.get_run_records(dg.RunsFilter(statuses=list(automation.ACTIVE)))
        assert [r.dagster_run.run_id for r in active] == [runs["alive"].run_id]
        again = sensor(dg.build_sensor_context(instance=instance))
        assert again.skip_message == "no run left in progress by a dead process"
    finally:
        alive.kill()
        alive.wait()
        instance.dispose()


# ---------------------------------------------------------------- sensor cursor

def _tick(sensor, instance, cursor):
    return sensor(dg.build_sensor_context(cursor=cursor, instance=instance))


def _add_run(instance, key: str, status: dg.DagsterRunStatus) -> dg.DagsterRun:
    import uuid

    run = dg.DagsterRun(job_name="refit", run_id=str(uuid.uuid4()), status=status,
                        tags={automation.RUN_KEY_TAG: key, automation.WRITER_TAG: "true"})
    instance.add_run(run)
    return run


def test_sensor_names_the_files_of_a_tick_and_waits_for_their_run(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAST_INCOMING_SETTLE_S", "0")
    incoming = tmp_path / "incoming"
    sensor = automation.make_incoming_sensor(incoming)
    instance = dg.DagsterInstance.ephemeral()
    a = drop(incoming, "a.csv", lambda p: good_file(p, "s-a"))
    drop(incoming, "b.csv", lambda p: good_file(p, "s-b"))
    (incoming / "README.md").write_text("not data")
    (incoming / ".c.csv.tmp").write_text("still being written")
    (incoming / "processed").mkdir()
    good_file(incoming / "processed" / "old.csv", "s-old")

    # two files dropped together: one run naming both
    first = _tick(sensor, instance, None)
    assert len(first.run_requests) == 1
    request = first.run_requests[0]
    assert automation.tagged_files(request.tags) == ["a.csv", "b.csv"]
    # until that run exists and finishes, nothing is asked again (even if a file changes meanwhile)
    assert not _tick(sensor, instance, first.cursor).run_requests
    run = _add_run(instance, request.run_key, dg.DagsterRunStatus.STARTED)
    good_file(incoming / "b.csv", "s-b", value="6100")
    waiting = _tick(sensor, instance, first.cursor)
    assert not waiting.run_requests and "waiting: a.csv, b.csv" in waiting.skip_reason.skip_message

    # the run succeeded and moved a.csv away; b.csv has other bytes now: only b.csv is asked for, new key
    instance.delete_run(run.run_id)  # (replaced by its finished record)
    _add_run(instance, request.run_key, dg.DagsterRunStatus.SUCCESS)
    a.unlink()
    second = _tick(sensor, instance, waiting.cursor)
    assert [automation.tagged_files(r.tags) for r in second.run_requests] == [["b.csv"]]
    assert second.run_requests[0].run_key != request.run_key
    state = automation.cursor_load(second.cursor)
    assert list(state.pending.values())[0]["files"] == {"b.csv": store.sha256_file(incoming / "b.csv")}
    assert state.files == {}


def test_sensor_retries_a_failed_file_with_backoff_then_quarantines_it(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAST_INCOMING_SETTLE_S", "0")
    monkeypatch.setenv("STEPCAST_INCOMING_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("STEPCAST_RETRY_BACKOFF_S", "3600")
    incoming = tmp_path / "incoming"
    sensor = automation.make_incoming_sensor(incoming)
    instance = dg.DagsterInstance.ephemeral()
    drop(incoming, "f.csv", lambda p: good_file(p, "s-f"))
    tick = _tick(sensor, instance, None)
    key = tick.run_requests[0].run_key
    _add_run(instance, key, dg.DagsterRunStatus.FAILURE)
    # failed: not asked again before the backoff has passed; the reason is kept
    tick = _tick(sensor, instance, tick.cursor)
    assert not tick.run_requests
    state = automation.cursor_load(tick.cursor)
    assert state.files["f.csv"]["failures"] == 1 and f"run " in state.files["f.csv"]["reason"]
    # once the backoff has passed: asked again under a new run key
    state.files["f.csv"]["retry_at"] = 0
    tick = _tick(sensor, instance, state.dumps())
    assert [automation.tagged_files(r.tags) for r in tick.run_requests] == [["f.csv"]]
    assert tick.run_requests[0].run_key != key
    _add_run(instance, tick.run_requests[0].run_key, dg.DagsterRunStatus.FAILURE)
    # a second failure reaches max attempts: the file is quarantined with the reason, and forgotten
    tick = _tick(sensor, instance, tick.cursor)
    assert not tick.run_requests and not (incoming / "f.csv").exists()
    reason = (automation.quarantine_dir(incoming) / "f.csv.reason.txt").read_text()
    assert "2 runs failed" in reason and "FAILURE" in reason
    assert automation.cursor_load(tick.cursor).files == {}
    # the same name dropped again is a new file
    drop(incoming, "f.csv", lambda p: good_file(p, "s-f", value="6200"))
    assert len(_tick(sensor, instance, tick.cursor).run_requests) == 1


def test_sensor_waits_for_a_file_to_settle(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPCAST_INCOMING_SETTLE_S", "3600")
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    good_file(incoming / "fresh.csv", "s-fresh")
    instance = dg.DagsterInstance.ephemeral()
    result = automation.make_incoming_sensor(incoming)(dg.build_sensor_context(instance=instance))
    assert not result.run_requests
    old = time.time() - 7200
    os.utime(incoming / "fresh.csv", (old, old))
    result = automation.make_incoming_sensor(incoming)(dg.build_sensor_context(instance=instance))
    assert [automation.tagged_files(r.tags) for r in result.run_requests] == [["fresh.csv"]]


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
    tick = defs.resolve_sensor_def("incoming_files")(dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral()))
    assert len(tick.run_requests) == 1
    request = tick.run_requests[0]
    assert automation.tagged_files(request.tags) == ["bad.csv", "good.csv"]
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
        rejected = snap.execute("select file, line, \"column\", value from rejected_rows "
                                "where file like '%quarantine/bad.csv'").fetchall()
    finally:
        snap.close()
    assert good == [(6000.0, 0.41, store.file_key(processed / "good.csv"))]
    assert bad == 0  # an incoming file is all or nothing
    assert rejected == [(store.file_key(quarantine / "bad.csv"), 3, "value", "45")]  # its rows are recorded

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


def test_run_of_only_a_quarantined_file_refits_nothing(built_store, tmp_path, monkeypatch):
    """A run whose only file is quarantined records its rows in rejected_rows and stops there: `runs`, the
    fit and the snapshot are skipped; a run naming a file that is gone does the same."""
    from pipeline.definitions import make_definitions

    cfg = _settings(tmp_path, built_store, monkeypatch)
    drop(cfg.incoming, "bad.csv", lambda p: write_rows(p, [dict(BASE, run_id="q-1", value="45", metric="mfu",
                                                               unit="fraction")]))
    drop(cfg.incoming, "later.csv", lambda p: good_file(p, "q-later"))
    job = make_definitions(cfg).resolve_job_def("refit")
    selection = [dg.AssetKey(k) for k in ("run_metrics", "runs", "calibrated_predictions", "store_snapshot")]
    for names in (["bad.csv"], ["gone.csv"]):
        result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), asset_selection=selection,
                                        tags={automation.FILES_TAG: json.dumps(names)}, raise_on_error=True)
        assert result.success and not result.get_asset_materialization_events()
        skipped = {e.step_key for e in result.all_events if e.event_type_value == "STEP_SKIPPED"}
        assert {"runs", "calibrated_predictions", "store_snapshot"} <= skipped
    assert (cfg.incoming / "later.csv").exists()  # not named by either run: left for its own
    assert not cfg.snapshot.exists()
    con = duckdb.connect(str(cfg.store), read_only=True)
    try:
        rows = con.execute("select line, \"column\", value, reason from rejected_rows where file = ?",
                           [store.file_key(automation.quarantine_dir(cfg.incoming) / "bad.csv")]).fetchall()
    finally:
        con.close()
    assert len(rows) == 1 and rows[0][:3] == (2, "value", "45") and "percent" in rows[0][3]


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

def copied_runs(built_store: Path, path: Path, prefix: str, factor: float, source: str = "torchtitan",
                n: int = 4, offset: int = 0) -> Path:
    """n runs of a shipped source written again under new run ids (`prefix` + id), their throughput x factor
    (step time / factor): factor 1 agrees with the corpus, factor 0.5 contradicts it (2x slow)."""
    from pipeline.measurements import COLUMNS
    import polars as pl

    con = duckdb.connect(str(built_store), read_only=True)
    try:
        ids = [r[0] for r in con.execute(
            "select distinct run_id from run_metrics where source = ? and metric in ('tokens_per_s_per_gpu', "
            "'step_time_s') order by run_id limit ? offset ?", [source, n, offset]).fetchall()]
        rows = con.execute("select * from run_metrics where run_id in (select unnest(?)) and metric in "
                           "('tokens_per_s_per_gpu', 'step_time_s')", [ids]).pl()
    finally:
        con.close()
    rows = rows.with_columns((pl.lit(prefix) + pl.col("run_id")).alias("run_id"), pl.when(
        pl.col("metric") == "step_time_s").then(pl.col("value") / factor).otherwise(pl.col("value") * factor)
        .alias("value"))
    rows.select([c for c in COLUMNS if c in rows.columns]).write_csv(path)
    return path


def _fits(path: Path) -> list[dict]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        cur = con.execute("select version, n_train, promoted, promotion_reason from fits order by created_at")
        return [dict(zip([d[0] for d in cur.description], r)) for r in cur.fetchall()]
    finally:
        con.close()


class Daemon:
    """`dagster-daemon run` in a subprocess (temp DAGSTER_HOME with the project's dagster.yaml, sensor every
    second, retries after 1 s, runs wait 1 s for the store lock) on a copy of the built store."""

    def __init__(self, built_store: Path, folder: Path):
        self.home = folder / "dagster_home"
        self.home.mkdir()
        from pipeline.build import ensure_dagster_home

        ensure_dagster_home(self.home)  # the project's dagster.yaml, storage inside the home
        self.store = folder / "store" / "stepcast.duckdb"
        self.store.parent.mkdir()
        shutil.copyfile(built_store, self.store)
        self.snapshot = self.store.parent / "snapshot" / self.store.name
        self.incoming = folder / "incoming"
        self.incoming.mkdir()
        self.env = dict(os.environ, DAGSTER_HOME=str(self.home), STEPCAST_STORE=str(self.store),
                        STEPCAST_INCOMING=str(self.incoming), STEPCAST_SENSOR_INTERVAL_S="1",
                        STEPCAST_INCOMING_SETTLE_S="0", STEPCAST_RETRY_BACKOFF_S="1", STEPCAST_LOCK_WAIT_S="1",
                        # the nightly schedule runs on the wall clock: twelve hours from now, so that it cannot
                        # fire (and take the store's lock, and add a run) while these tests run
                        STEPCAST_REFIT_CRON=f"0 {(time.gmtime().tm_hour + 12) % 24} * * *")
        for var in ("STEPCAST_SNAPSHOT", "STEPCAST_REPORTS"):
            self.env.pop(var, None)
        self.log_path = folder / "daemon.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([str(BIN / "dagster-daemon"), "run", "-m", "pipeline.definitions"], cwd=ROOT,
                                     env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.instance = dg.DagsterInstance.from_config(str(self.home))

    def tail(self) -> str:
        return self.log_path.read_text()[-3000:]

    def runs(self) -> list[dg.DagsterRun]:
        """The refit runs the incoming-files sensor started, oldest first."""
        return [r.dagster_run for r in reversed(self.instance.get_run_records(dg.RunsFilter(job_name="refit")))
                if r.dagster_run.tags.get("dagster/sensor_name") == "incoming_files"]

    def wait(self, done, timeout_s: float = 900, what: str = "") -> list[dg.DagsterRun]:
        """Poll the runs until done(runs) (bounded: start-up plus a full run of the graph, fit included, on 2
        cores shared with other jobs: 2-3 min alone, 6-8 min when busy)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            runs = self.runs()
            if done(runs):
                return runs
            assert self.proc.poll() is None, self.tail()
            time.sleep(1)
        raise AssertionError(f"timed out waiting for {what}: {[(r.status, r.tags) for r in self.runs()]}\n"
                             + self.tail())

    def events(self, run: dg.DagsterRun, kind: dg.DagsterEventType) -> list:
        return [r.event_log_entry.dagster_event for r in self.instance.get_records_for_run(run.run_id,
                                                                                         of_type=kind).records]

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()
        self.instance.dispose()


@pytest.fixture(scope="module")
def daemon(built_store, tmp_path_factory):
    d = Daemon(built_store, tmp_path_factory.mktemp("daemon"))
    yield d
    d.stop()


def test_daemon_retries_a_run_that_failed_on_the_lock_and_promotes_the_new_runs(daemon, built_store):
    """Two files dropped together while another process holds the store's writer lock: one run names both
    and fails on the lock (the files stay); once the lock is free the sensor asks again, the run ingests
    both, re-materializes every asset, and the fit on the larger data is promoted and published."""
    before = _fits(daemon.store)
    served = next(f for f in before if f["promoted"])
    folder = daemon.incoming.parent
    with store.writer_lock(daemon.store, command="test holding the lock"):
        drop(daemon.incoming, "g1.csv", lambda p: copied_runs(built_store, p, "g1-", 1.0, offset=0))
        drop(daemon.incoming, "g2.csv", lambda p: copied_runs(built_store, p, "g2-", 1.0, offset=4))
        runs = daemon.wait(lambda rs: rs and rs[0].is_finished, what="the run on the held lock")
    failed = runs[0]
    assert failed.status == dg.DagsterRunStatus.FAILURE, daemon.tail()
    assert automation.tagged_files(failed.tags) == ["g1.csv", "g2.csv"]
    reason = automation.failure_reason(daemon.instance, failed)
    assert "StoreBusy: another process is writing" in reason and "test holding the lock" in reason, reason
    assert sorted(p.name for p in daemon.incoming.glob("*.csv")) == ["g1.csv", "g2.csv"]  # not stranded

    runs = daemon.wait(lambda rs: len(rs) >= 2 and rs[1].is_finished, what="the retried run")
    assert len(runs) == 2, [r.tags for r in runs]
    run = runs[1]
    assert run.status == dg.DagsterRunStatus.SUCCESS, daemon.tail()
    assert automation.tagged_files(run.tags) == ["g1.csv", "g2.csv"] and run.tags[automation.WRITER_TAG] == "true"
    from pipeline.definitions import make_definitions

    graph = set(make_definitions().resolve_job_def("refit").asset_layer.executable_asset_keys)
    assert {e.asset_key for e in daemon.events(run, dg.DagsterEventType.ASSET_MATERIALIZATION)} == graph
    assert sorted(p.name for p in automation.processed_dir(daemon.incoming).iterdir()) == ["g1.csv", "g2.csv"]
    # one new fit (no redundant re-fit), trained on 8 more runs, promoted on equal terms and published
    after = _fits(daemon.store)
    assert len(after) == len(before) + 1
    new = after[-1]
    assert new["promoted"] and new["n_train"] == served["n_train"] + 8, new
    assert new["promotion_reason"].startswith("promoted: not worse than the served fit " + served["version"])
    assert _fits(daemon.snapshot)[-1] == new
    assert folder.exists()


def test_daemon_refuses_a_contradicting_drop_visibly_and_ingest_waits_then_stops(daemon, built_store, tmp_path):
    """Runs that repeat shipped configurations at half their measured throughput: ingested, but the fit on
    them is refused (the served fit's interval misses them far beyond its 10%); the run shows a failed check,
    `stepcast info` shows the served fit and the refused candidate with the reason. A `stepcast ingest`
    started during the run stops after its wait with the holder's name, exit 1, no traceback."""
    n_runs = len(daemon.runs())
    served = next(f for f in _fits(daemon.store) if f["promoted"])
    drop(daemon.incoming, "half.csv", lambda p: copied_runs(built_store, p, "half-", 0.5, offset=8))
    daemon.wait(lambda rs: len(rs) > n_runs and rs[-1].status == dg.DagsterRunStatus.STARTED, what="the run to start")
    lock = Path(str(daemon.store) + ".lock")
    daemon.wait(lambda rs: "dagster run" in store.lock_holder(lock), what="the run to hold the store's lock")
    other = good_file(tmp_path / "other.csv", "ingest-during-run")
    env = dict(daemon.env, DAGSTER_HOME=str(tmp_path / "cli_dagster_home"))  # the CLI's own instance
    out = subprocess.run([str(BIN / "stepcast"), "ingest", str(other)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"another process is writing {daemon.store} (pid " in out.stderr and "dagster run" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout

    runs = daemon.wait(lambda rs: len(rs) > n_runs and rs[-1].is_finished, what="the contradicting drop's run")
    run = runs[-1]
    assert run.status == dg.DagsterRunStatus.SUCCESS, daemon.tail()
    checks = {e.event_specific_data.check_name: e.event_specific_data
              for e in daemon.events(run, dg.DagsterEventType.ASSET_CHECK_EVALUATION)}
    assert not checks["latest_fit_promoted"].passed
    fits_now = _fits(daemon.store)
    latest = fits_now[-1]
    assert not latest["promoted"] and latest["n_train"] > served["n_train"]
    assert "contradict" in latest["promotion_reason"] and "of 4 new runs outside" in latest["promotion_reason"]
    assert next(f for f in fits_now if f["promoted"])["version"] == served["version"]
    info = subprocess.run([str(BIN / "stepcast"), "info"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert f"served fit: {served['version']}" in info.stdout, info.stdout
    assert f"latest candidate: {latest['version']}" in info.stdout and "NOT promoted" in info.stdout


# ---------------------------------------------------------------- failure safety

def test_daemon_fails_a_killed_build_and_runs_the_refit_queued_behind_it(daemon, built_store):
    """A drop while `stepcast build` runs: its re-fit waits in the queue (one run at a time). The build is killed
    by SIGKILL: nothing records the end of its run, which stays STARTED and would hold the queue for good. The
    dead_runs sensor marks it FAILURE, saying why, and the queued re-fit runs to completion."""
    n_runs = len(daemon.runs())

    def building() -> list[dg.DagsterRun]:
        return [r.dagster_run for r in daemon.instance.get_run_records(
            dg.RunsFilter(job_name="build", statuses=[dg.DagsterRunStatus.STARTED]))]

    proc = subprocess.Popen([str(BIN / "stepcast"), "build", "--quiet"], cwd=ROOT, env=daemon.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while not building():
        assert proc.poll() is None and time.monotonic() < deadline, "the build's run never STARTED"
        time.sleep(0.2)
    build_run = building()[0]
    drop(daemon.incoming, "k1.csv", lambda p: copied_runs(built_store, p, "k1-", 1.0, offset=12))
    daemon.wait(lambda rs: len(rs) > n_runs and rs[-1].status == dg.DagsterRunStatus.QUEUED,
                what="the re-fit to queue behind the build")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    runs = daemon.wait(lambda rs: len(rs) > n_runs and rs[-1].is_finished, what="the queued re-fit")
    assert runs[-1].status == dg.DagsterRunStatus.SUCCESS, daemon.tail()
    assert "k1.csv" in {p.name for p in automation.processed_dir(daemon.incoming).iterdir()}
    assert daemon.instance.get_run_by_id(build_run.run_id).status == dg.DagsterRunStatus.FAILURE
    reason = _run_failure_message(daemon.instance, build_run.run_id)
    assert f"the process running this run (pid {proc.pid}) is gone, killed or crashed while the run was STARTED; " \
           f"marked failed by the dead_runs sensor" in reason, reason


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


PUBLISH_CHILD = """
import sys, time
from pathlib import Path
from pipeline import store
new, snapshot, warm = map(Path, sys.argv[1:4])
t = time.perf_counter()
store.publish_snapshot(new, warm)  # a warm-up publish elsewhere: how long one takes here
print(time.perf_counter() - t, flush=True)
sys.stdin.readline()  # the parent's signal: go
store.publish_snapshot(new, snapshot)
print("published", flush=True)
time.sleep(60)
"""


def small_store(path: Path, n_runs: int) -> Path:
    """A store with the reference tables and n_runs synthetic runs (enough for publish_snapshot's check)."""
    from pipeline.build import load_reference_tables
    from pipeline.settings import Settings

    con = store.connect(path)
    try:
        store.ensure_schema(con)
        load_reference_tables(con, Settings.load(store=path))
        rows = [dict(BASE, run_id=f"small-{i}", value=str(5000 + i)) for i in range(n_runs)]
        store.ingest_file(con, write_rows(path.parent / f"{path.stem}.csv", rows))
    finally:
        con.close()
    return path


def test_sigkill_inside_the_publish_window_leaves_the_old_or_the_new_snapshot(tmp_path):
    """A publisher killed at seeded random points spread over one publish (lock, checkpoint, copy, fsync,
    check, rename; 0.15-0.4 s here) and just after it: readers find the old snapshot or the new one, whole,
    never a broken file; the next publish removes what the killed one left."""
    old_store, new_store = small_store(tmp_path / "old.duckdb", 5), small_store(tmp_path / "new.duckdb", 2)
    snapshot = tmp_path / "snap" / "s.duckdb"
    store.publish_snapshot(old_store, snapshot)
    old = table_counts(snapshot)
    new = table_counts(new_store)
    assert old["runs"] == new["runs"] + 3
    rng = random.Random(18)
    outcomes = []
    for _ in range(6):
        store.publish_snapshot(old_store, snapshot)
        proc = subprocess.Popen([sys.executable, "-c", PUBLISH_CHILD, str(new_store), str(snapshot),
                                 str(tmp_path / "warm" / "w.duckdb")], cwd=ROOT, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        duration_s = float(proc.stdout.readline())
        delay = rng.uniform(0.0, 1.5 * duration_s)  # inside the publish, and a little after it
        proc.stdin.write("go\n")
        proc.stdin.flush()
        time.sleep(delay)
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stdin.close()
        got = table_counts(snapshot)
        assert got in (old, new), f"killed {delay:.3f} s into a {duration_s:.3f} s publish: {got}"
        outcomes.append(got == new)
    store.publish_snapshot(new_store, snapshot)
    assert table_counts(snapshot) == new
    assert [p.name for p in snapshot.parent.iterdir()] == [snapshot.name]
    assert not all(outcomes), "no kill landed before the rename: the points missed the publish window"


def _run_failure_message(instance: dg.DagsterInstance, run_id: str) -> str:
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
    return " | ".join(r.event_log_entry.dagster_event.message or "" for r in records)


def test_sigkill_during_build_keeps_snapshot_and_next_build_recovers(built_store, tmp_path):
    """Builds killed by SIGKILL (once during start-up, once after its Dagster run STARTED): the snapshot stays
    whole, the killed run is left STARTED (nothing recorded its end), and the next build marks it FAILURE,
    saying why, and runs to completion."""
    target = tmp_path / "k" / "stepcast.duckdb"
    target.parent.mkdir()
    shutil.copyfile(built_store, target)
    snapshot = target.parent / "snapshot" / target.name
    store.publish_snapshot(target, snapshot)
    before = table_counts(snapshot)
    env = dict(os.environ, STEPCAST_STORE=str(target), STEPCAST_INCOMING=str(tmp_path / "incoming"))
    env.pop("STEPCAST_SNAPSHOT", None)
    home = tmp_path / "dagster_home"
    env["DAGSTER_HOME"] = str(home)  # never the project's own .dagster/
    cmd = [str(BIN / "stepcast"), "build", "--quiet"]
    rng = random.Random(7)
    from pipeline.build import ensure_dagster_home

    instance = dg.DagsterInstance.from_config(str(ensure_dagster_home(home)))
    # kill points: during start-up/ingest, and a few seconds after the build's run STARTED (in the later
    # assets); the publish step itself is covered by test_sigkill_inside_the_publish_window_leaves_...
    for started in (False, True):
        earlier = {r.dagster_run.run_id for r in instance.get_run_records()}
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        if started:
            deadline = time.monotonic() + 300
            while not {r.dagster_run.run_id for r in instance.get_run_records(
                    dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))} - earlier:
                assert proc.poll() is None and time.monotonic() < deadline, "the build's run never STARTED"
                time.sleep(0.2)
            delay = rng.uniform(0.0, 8.0)
        else:
            delay = rng.uniform(1.0, 4.0)
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert table_counts(snapshot) == before, f"snapshot changed after a kill at {delay:.1f} s"
    # what blocked the run queue: nothing records the end of a killed run, it stays STARTED
    killed = {r.dagster_run.run_id: int(r.dagster_run.tags[automation.PID_TAG])
              for r in instance.get_run_records(dg.RunsFilter(statuses=list(automation.ACTIVE)))}
    assert proc.pid in killed.values()

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
    # the killed runs: marked FAILURE by the next build, which says so; no run is left in progress
    for run_id, pid in killed.items():
        assert f"Dagster run {run_id} (job build) was left STARTED by pid {pid}, which is gone (killed or " \
               f"crashed): marked FAILURE" in done.stdout, done.stdout[-3000:]
        assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE
        reason = _run_failure_message(instance, run_id)
        assert f"the process running this run (pid {pid}) is gone, killed or crashed while the run was STARTED; " \
               f"marked failed by stepcast build (pid " in reason, reason
    assert not instance.get_run_records(dg.RunsFilter(statuses=list(automation.ACTIVE)))
    last = instance.get_run_records(dg.RunsFilter(job_name="build"), limit=1)[0].dagster_run
    assert last.status == dg.DagsterRunStatus.SUCCESS
    instance.dispose()
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
