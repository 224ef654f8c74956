"""One writer, always: every writer takes the store's writer lock; the loser waits a bound, then stops with
"another process is writing <store> (pid, command, since)", exit 1, no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline import store
from pipeline.cli import app
from tests.conftest import ROOT
from tests.test_ingest import BASE, write_rows

runner = CliRunner()

HOLDER = """
import sys, time
from pipeline import store
with store.writer_lock(sys.argv[1], command="holder for a test"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def hold(path: Path, seconds: float) -> subprocess.Popen:
    """Another process holding the store's lock for `seconds` (returns once it holds it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(seconds)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def release(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
    proc.stdout.close()


@pytest.fixture()
def busy_store(tmp_path, monkeypatch):
    path = tmp_path / "s.duckdb"
    monkeypatch.setenv("STEPCAST_STORE", str(path))
    monkeypatch.setenv("STEPCAST_LOCK_WAIT_S", "0.5")
    proc = hold(path, 300)
    yield path, proc
    release(proc)


def expect_busy(result, path: Path, proc: subprocess.Popen) -> None:
    text = result.output
    assert result.exit_code == 1, text
    assert f"another process is writing {path} (pid {proc.pid}, command 'holder for a test', since 20" in text
    assert "waited 0.5 s" in text
    assert "Traceback" not in text
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_ingest_fit_and_build_wait_then_stop_with_the_holder(busy_store, tmp_path):
    path, proc = busy_store
    rows = write_rows(tmp_path / "r.csv", [dict(BASE)])
    start = time.monotonic()
    expect_busy(runner.invoke(app, ["ingest", str(rows)]), path, proc)
    assert time.monotonic() - start >= 0.5  # it waited the bound
    path.touch()  # (fit needs a store file to get as far as the lock)
    expect_busy(runner.invoke(app, ["fit", "--promote", "x"]), path, proc)
    expect_busy(runner.invoke(app, ["build", "--quiet"]), path, proc)


def test_a_waiter_gets_the_lock_when_the_holder_finishes_or_dies(tmp_path, monkeypatch):
    path = tmp_path / "s.duckdb"
    proc = hold(path, 1.0)  # finishes by itself after a second
    with store.writer_lock(path, timeout_s=30, command="waiter"):
        assert "command 'waiter'" in store.lock_holder(Path(str(path) + ".lock"))
    proc.wait()
    proc.stdout.close()
    # a holder killed by SIGKILL leaves no stale lock: the OS drops its flock
    proc = hold(path, 300)
    with pytest.raises(store.StoreBusy):
        with store.writer_lock(path, timeout_s=0):
            pass
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    with store.writer_lock(path, timeout_s=0):
        pass
    assert store.lock_holder(Path(str(path) + ".lock")) == "unknown holder"  # released: the file names no one


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    """`stepcast build` holds the lock and runs the job in-process, whose runs hold it again (StoreResource)
    and publish (publish_snapshot takes it too): nesting must not wait on itself."""
    path = tmp_path / "s.duckdb"
    with store.writer_lock(path, timeout_s=0, command="outer"):
        with store.writer_lock(path, timeout_s=0, command="inner"):
            assert "command 'outer'" in store.lock_holder(Path(str(path) + ".lock"))
        # still held after the inner one left: another process cannot take it
        probe = subprocess.run([sys.executable, "-c", "import sys; from pipeline import store\n"
                                "try:\n    store.writer_lock(sys.argv[1], timeout_s=0).__enter__()\n"
                                "except store.StoreBusy as e:\n    print(e)", str(path)],
                               cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert "another process is writing" in probe.stdout and f"pid {os.getpid()}" in probe.stdout


# ---------------------------------------------------------------- a program outside stepcast with the store open

FOREIGN = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])  # read-write: DuckDB's own file lock, no stepcast writer lock
con.execute("create table if not exists notes (a integer)")
print("open", flush=True)
time.sleep(float(sys.argv[2]))
"""
BIN = Path(sys.executable).parent


def test_a_program_holding_the_store_open_is_named_in_one_line(tmp_path):
    """A DuckDB connection held open by another program (a shell, a notebook): `ingest` stops with one line that
    names its pid and command and says what to do, no traceback; `build` says it waits and for how long, then
    stops with the same line."""
    path = tmp_path / "s.duckdb"
    proc = subprocess.Popen([sys.executable, "-c", FOREIGN, str(path), "300"], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "open"
        env = dict(os.environ, STEPCAST_STORE=str(path), STEPCAST_LOCK_WAIT_S="0.5",
                   DAGSTER_HOME=str(tmp_path / "dagster_home"), STEPCAST_INCOMING=str(tmp_path / "incoming"))
        for var in ("STEPCAST_SNAPSHOT", "STEPCAST_REPORTS"):
            env.pop(var, None)
        rows = write_rows(tmp_path / "r.csv", [dict(BASE)])
        holder = f"another process has {path} open: pid {proc.pid} ({sys.executable} -c import sys, time, duckdb"
        what_to_do = f"not a stepcast writer; close the store there or end that process (`kill {proc.pid}`), " \
                     f"then run the command again"

        ingest = subprocess.run([str(BIN / "stepcast"), "ingest", str(rows)], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=300)
        assert ingest.returncode == 1, ingest.stdout + ingest.stderr
        assert ingest.stdout == ""
        lines = ingest.stderr.splitlines()
        assert len(lines) == 1, ingest.stderr
        assert lines[0].startswith(f"error: {holder}") and what_to_do in lines[0], lines[0]
        assert lines[0].endswith("(waited 0.5 s, env STEPCAST_LOCK_WAIT_S)"), lines[0]

        start = time.monotonic()
        build = subprocess.run([str(BIN / "stepcast"), "build", "--quiet", "--wait", "1.5"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=300)
        assert time.monotonic() - start >= 1.5
        assert build.returncode == 1, build.stdout + build.stderr
        assert "Traceback" not in build.stdout + build.stderr
        lines = build.stderr.splitlines()
        assert len(lines) == 2, build.stderr
        assert lines[0].startswith(f"{path} is open in pid {proc.pid} (") and \
            lines[0].endswith("; waiting up to 1.5 s for it to close (env STEPCAST_LOCK_WAIT_S)"), lines[0]
        assert lines[1].startswith(f"error: {holder}") and what_to_do in lines[1], lines[1]
        assert lines[1].endswith("(waited 1.5 s, env STEPCAST_LOCK_WAIT_S)"), lines[1]
    finally:
        release(proc)


def test_build_states_its_default_wait():
    """`stepcast build --help` states the default wait, and it is the one the writers use."""
    help_text = " ".join(runner.invoke(app, ["build", "--help"]).output.replace("│", " ").split())
    assert f"default: {store.LOCK_WAIT_S:g} s, env STEPCAST_LOCK_WAIT_S" in help_text, help_text
