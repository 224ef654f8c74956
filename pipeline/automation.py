"""Re-fits that run themselves: the `refit` job, a nightly schedule, and a sensor on the incoming folder.

Flow: a measurement file dropped into the incoming folder (`Settings.incoming`: `measurements/incoming/`,
env `STEPCAST_INCOMING`) is seen by the `incoming_files` sensor, which requests one `refit` run naming every
new, changed or due-for-retry file of that tick (tag `stepcast/incoming_files`, a JSON list; run key
`incoming-<n>-<hash>`). The sensor's cursor remembers the runs it asked for; a file counts as handled only
when its run SUCCEEDED and moved it away. A failed run (a held store lock, a crash) counts a failure for each
file it named: the file is asked for again after `retry_backoff_s()` (doubling), and after `max_attempts()`
failures the sensor moves it to `quarantine/` with the last failure's reason. The run rebuilds the whole
graph; its `run_metrics` asset calls `ingest_incoming` with the run's files, which

- re-ingests every file already in `<incoming>/processed/` (so that a rebuild from scratch still holds every
  accepted incoming file; unchanged files cost one hash each),
- ingests exactly the files the run names (a run without the tag, e.g. the nightly one: every settled file)
  strictly (all or nothing: a file with any rejected row is not loaded), stored under its `processed/` name,
  then moves it to `<incoming>/processed/<name>`,
- moves a file that failed to `<incoming>/quarantine/<name>` with `<name>.reason.txt` beside it (the reason,
  and one line per rejected row: `file:line: column NAME = 'VALUE': reason`) and its rows to `rejected_rows`,
- leaves a file that changed while being read where it is (the sensor asks again).

When the run's files bring no new rows (all quarantined, or the same bytes again), `run_metrics` materializes
nothing and everything downstream is skipped: no re-fit, no republish.

"Settled" means not modified for `STEPCAST_INCOMING_SETTLE_S` seconds (default 2): a file still being
copied in is not picked up half-written. Safer still: write it under a name starting with `.` and rename it
when complete (hidden names, `*.tmp`, `*.part`, `*~`, `README*` and `*.reason.txt` are never picked up).

The nightly schedule (`nightly_refit`, 03:00 UTC, env `STEPCAST_REFIT_CRON`) runs the same job. Both start
RUNNING in `dagster dev`. One writer: every run holds the store's writer lock for its whole duration
(`StoreResource`, the same lock `stepcast build`, `ingest` and `fit` take); the project's `dagster.yaml`
allows one run in progress at a time (others wait in the queue); the job runs its steps in one process
(in-process executor), so steps never contend for the DuckDB file lock either. `stepcast build` runs the same
graph as the `build` job with the multiprocess executor: its steps run under the lock the build holds and take
turns on the DuckDB file (`StoreResource.get_connection` waits while another step has it open). Blocking asset
checks stop everything downstream of a failed check, including the snapshot: readers keep the last good one.

A run whose process died (SIGKILL, out of memory, a crash) records no end: it would stay STARTED and, with one
run at a time, hold the queue for good. The `dead_runs` sensor (the daemon's first tick, then every
`STEPCAST_SENSOR_INTERVAL_S`) and every `stepcast build` mark such runs FAILURE with the reason
(`fail_dead_runs`); Dagster's run monitoring (dagster.yaml) fails the runs that never got a process.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import polars as pl
from dagster_duckdb import DuckDBResource

from pipeline import store
from pipeline.measurements import REJECT_SCHEMA
from pipeline.readers import SUFFIXES as READ_SUFFIXES
from pipeline.readers import sha256_bytes
from pipeline.settings import Settings

JOB_NAME = "refit"
WRITER_TAG = "stepcast/writes_store"
FILES_TAG = "stepcast/incoming_files"  # JSON list of the incoming file names a sensor run ingests
RUN_KEY_TAG = "dagster/run_key"
SUFFIXES = tuple(s for s in READ_SUFFIXES if s)  # the processed/ files ingested again: every type a reader takes
# (a Markdown file is a measurement file too now, a pipe table of runs; the folder's README is left by its name)
IGNORED_SUFFIXES = (".tmp", ".part", ".partial", "~", ".reason.txt")


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


def retry_backoff_s() -> float:
    """Wait before the first retry of a file whose run failed; doubled after each further failure (env
    STEPCAST_RETRY_BACKOFF_S). With the default 4 attempts, the waits of 60, 120 and 240 s plus the runs'
    own lock waits (store.LOCK_WAIT_S) outlast a `stepcast build` holding the store (80 s alone, a few
    minutes on a busy machine), the usual reason for a run to fail on an intact file."""
    return _env_float("STEPCAST_RETRY_BACKOFF_S", 60.0)


def max_attempts() -> int:
    """Runs a file gets before it is quarantined with the last failure's reason (env STEPCAST_INCOMING_MAX_ATTEMPTS)."""
    return max(1, int(_env_float("STEPCAST_INCOMING_MAX_ATTEMPTS", 4)))


def settle_seconds() -> float:
    """How long a file must be left untouched before it is picked up (a design default, not a measurement)."""
    return _env_float("STEPCAST_INCOMING_SETTLE_S", 2.0)


def processed_dir(incoming: Path) -> Path:
    return Path(incoming) / "processed"


def quarantine_dir(incoming: Path) -> Path:
    return Path(incoming) / "quarantine"


def candidates(incoming: Path, settle_s: float | None = None, now: float | None = None) -> list[Path]:
    """Files directly in the incoming folder that are ready to be ingested, sorted by name."""
    incoming = Path(incoming)
    if not incoming.is_dir():
        return []
    settle_s = settle_seconds() if settle_s is None else settle_s
    now = time.time() if now is None else now
    out = []
    for p in sorted(incoming.iterdir()):
        name = p.name
        if name.startswith(".") or name.upper().startswith("README") or name.lower().endswith(IGNORED_SUFFIXES):
            continue
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        if not p.is_file() or now - st.st_mtime < settle_s:
            continue
        out.append(p)
    return out


def scan(incoming: Path, settle_s: float | None = None) -> dict[str, str]:
    """{file name: sha256} of the ready files of the incoming folder."""
    found = {}
    for p in candidates(incoming, settle_s):
        try:
            found[p.name] = sha256_bytes(p.read_bytes())
        except OSError:
            continue  # vanished or unreadable right now: next tick
    return found


# ---------------------------------------------------------------- ingest (called by the run_metrics asset)

@dataclass
class IncomingResult:
    accepted: list[str] = field(default_factory=list)      # moved to processed/
    quarantined: list[str] = field(default_factory=list)   # moved to quarantine/ with a reason file
    retry: list[str] = field(default_factory=list)         # changed while being read: left in place
    reprocessed: list[store.FileReport] = field(default_factory=list)  # files of processed/, every run
    messages: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)      # named by the run's tags but not in the folder
    changed: bool = False                                 # an accepted file brought rows the store lacked


def _reason_text(rep: store.FileReport) -> str:
    lines = [f"{rep.path or rep.file}: {rep.status}: {rep.message}",
             f"quarantined at {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}"]
    if rep.rejections is not None:
        for r in rep.rejections.iter_rows(named=True):
            lines.append(f"{rep.path or r['file']}:{r['line']}: column {r['column'] or '-'} = {r['value']!r}: "
                         f"{r['reason']}")
    lines.append("Fix the file and drop it into the incoming folder again.")
    return "\n".join(lines) + "\n"


def _quarantine(path: Path, incoming: Path, text: str) -> Path:
    target_dir = quarantine_dir(incoming)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / path.name
    if target.exists():  # keep the earlier quarantined copy: add a time stamp to the new one
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        target = target_dir / f"{path.stem}.{stamp}{path.suffix}"
    os.replace(path, target)
    Path(str(target) + ".reason.txt").write_text(text, encoding="utf-8")
    return target


def _record_rejections(con, rep: store.FileReport, key: str) -> int:
    """Write a quarantined file's rejected rows (or its whole-file reason) to `rejected_rows` under `key`
    (its quarantine/ name), replacing rows an earlier quarantine of the same name left. Returns rows written."""
    if rep.rejections is not None and rep.rejections.height:
        rows = rep.rejections.with_columns(pl.lit(key).alias("file"))
    else:
        err = rep.error
        rows = pl.DataFrame({"file": [key], "line": [getattr(err, "line", None)], "column": [getattr(err, "column", None)],
                             "value": [None], "reason": [getattr(err, "reason", None) or rep.message or rep.status]},
                            schema=REJECT_SCHEMA)
    store.ensure_schema(con)
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("delete from rejected_rows where file = ?", [key])
        con.register("_rej", rows.select(list(REJECT_SCHEMA)).to_arrow())
        con.execute('insert into rejected_rows (file, line, "column", value, reason) select * from _rej')
        con.unregister("_rej")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return rows.height


def ingest_incoming(con, incoming: str | Path, log=None, names: list[str] | None = None) -> IncomingResult:
    """Ingest the processed/ files again and the new files of the incoming folder; move each new file to
    processed/ or quarantine/ (its rejected rows go to `rejected_rows` under its quarantine name). Store
    semantics are those of `store.ingest_files` (strict mode). `names`: only these files of the folder (a
    sensor run ingests exactly the files its tags name); None: every settled file (build, nightly run)."""
    incoming = Path(incoming)
    result = IncomingResult()
    if not incoming.is_dir():
        return result
    done = processed_dir(incoming)
    kept = sorted(p for p in done.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES) if done.is_dir() else []
    if kept:
        result.reprocessed = store.ingest_files(con, kept, strict=True)
        result.changed = any(rep.ok and rep.status != "unchanged" for rep in result.reprocessed)
        for rep in result.reprocessed:
            if not rep.ok:
                result.messages.append(f"processed file no longer ingests: {rep.file}: {rep.status} {rep.message}")
    if names is None:
        new = candidates(incoming)
    else:
        new = [incoming / n for n in sorted(set(names)) if (incoming / n).is_file()]
        result.missing = sorted(set(names) - {p.name for p in new})
        result.messages += [f"{n}: named by the run but no longer in {incoming}" for n in result.missing]
    if new:
        _ingest_new(con, incoming, new, result)
    if log is not None:
        for m in result.messages:
            log.warning(m)
    return result


def _ingest_new(con, incoming: Path, new: list[Path], result: IncomingResult) -> None:
    done = processed_dir(incoming)
    keys = [store.file_key(done / p.name) for p in new]
    by_key = {rep.file: rep for rep in store.ingest_files(con, new, strict=True, keys=keys)}
    for path, key in zip(new, keys):
        rep = by_key[key]
        if rep.ok:
            done.mkdir(parents=True, exist_ok=True)
            os.replace(path, done / path.name)
            result.accepted.append(path.name)
            result.changed |= rep.status != "unchanged"
        elif rep.error is not None and rep.error.retry:
            result.retry.append(path.name)
            result.messages.append(f"{path.name}: {rep.message}")
        else:
            if rep.error is not None and not rep.message:
                rep.message = str(rep.error)
            rep.path = str(path)
            target = _quarantine(path, incoming, _reason_text(rep))
            _record_rejections(con, rep, store.file_key(target))
            result.quarantined.append(path.name)
            result.messages.append(f"{path.name}: quarantined to {target}: {rep.message}")


# ---------------------------------------------------------------- one writer

class StoreResource(DuckDBResource):
    """The store as the assets see it (a DuckDBResource) that also holds the store's writer lock
    (`store.writer_lock`) while Dagster has it set up.

    - In-process executor (the `refit` job: every daemon run, sensor, schedule or a launch from the UI): the
      resource is set up once per run and torn down when the run ends, so the run is one writer for its whole
      duration like `stepcast build`, `ingest` and `fit`. A run that cannot get the lock within the bound
      fails with StoreBusy (the sensor retries its files, see `make_incoming_sensor`).
    - `stepcast build` (multiprocess executor): the build holds the lock for the whole run and names its pid
      in `holder_pid`; the step processes run under that hold (`writer_lock(holder_pid=...)`) instead of
      waiting for it.
    - Another executor with steps in processes (the `build` job launched from the UI): each step holds the
      lock while it runs; a step that finds it held by a step of its own run waits for it (up to
      `store.store_wait_s()`), not only the usual bound.

    Either way steps of one run may run at the same time in different processes: `get_connection` waits while
    another process has the DuckDB file open, and the assets keep the store open only to read their inputs and
    write their rows."""

    holder_pid: int = 0  # the process holding the writer lock for this run's steps (0: none, take it)

    def yield_for_execution(self, context):  # noqa: D401 - Dagster's hook
        return _holding_lock(self, context)

    @contextmanager
    def get_connection(self):
        con = store.connect_waiting(self.database, config={"custom_user_agent": "dagster", **self.connection_config})
        try:
            yield con
        finally:
            con.close()


@contextmanager
def _holding_lock(resource: "StoreResource", context):
    run = getattr(context, "dagster_run", None)
    command = f"dagster run {run.run_id} (job {run.job_name})" if run is not None else "dagster run"
    deadline = time.monotonic() + store.store_wait_s()
    with ExitStack() as stack:
        while True:
            try:
                stack.enter_context(store.writer_lock(resource.database, command=command,
                                                      holder_pid=resource.holder_pid or None))
                break
            except store.StoreBusy:  # held by a step of this same run (steps in processes): wait for it
                holder = store.lock_holder(str(resource.database) + ".lock")
                if run is None or run.run_id not in holder or time.monotonic() >= deadline:
                    raise
        yield resource


# ---------------------------------------------------------------- runs whose process died

#: the statuses of a run that has a process working on it (and so counts against the one-run-at-a-time limit)
ACTIVE = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING)


#: a run tag naming the process that executes the run, set by `stepcast build` when it creates its run
PID_TAG = "stepcast/pid"


def run_process(instance: dg.DagsterInstance, run) -> tuple[int, float] | None:
    """(pid, a time it was running) of the process executing `run`: the first run-level engine event naming a
    pid (a daemon-launched run worker's "Started process for run", the executor's "parent process" of
    `stepcast build`, "Executing steps in process" of the in-process executor), else the run's `PID_TAG`
    (`stepcast build` names itself when it creates the run, before any event). None: no process yet."""
    page = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT, limit=100)
    for rec in page.records:
        ev = rec.event_log_entry.dagster_event
        meta = getattr(getattr(ev, "event_specific_data", None), "metadata", None) or {}
        if ev is None or ev.step_key or "pid" not in meta:
            continue
        try:
            return int(meta["pid"].value), rec.event_log_entry.timestamp
        except (TypeError, ValueError):
            continue
    tagged = run.tags.get(PID_TAG, "")
    if tagged.isdigit():
        record = instance.get_run_record_by_id(run.run_id)
        return int(tagged), record.create_timestamp.timestamp() if record is not None else time.time()
    return None


def _process_started_at(pid: int) -> float | None:
    """When process `pid` started (epoch seconds, /proc), None where /proc cannot say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return None
    started = boot + int(stat[stat.rindex(")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
    # a clock /proc reports differently from time.time() (some sandboxes) would make a live process look new
    return started if pid == os.getpid() or (_process_started_at(os.getpid()) or 0.0) <= time.time() else None


def process_gone(pid: int, seen_at: float) -> bool:
    """Whether the process `pid`, seen running at `seen_at`, has ended: no such process, a zombie, or a process
    that started after `seen_at` (the pid was reused)."""
    if not store._pid_alive(pid):
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
        if state[state.rindex(")") + 2] == "Z":
            return True
    except OSError:
        pass
    started = _process_started_at(pid)
    return started is not None and started > seen_at + 2.0  # clock ticks round: a margin


def fail_dead_runs(instance: dg.DagsterInstance, by: str) -> list[str]:
    """Mark failed every run of `instance` still recorded as in progress whose process is gone (killed by
    SIGKILL, out of memory, a crash, a reboot: nothing recorded its end, so the run would stay STARTED and,
    with one run at a time, block the run queue for good). Returns one line per run marked failed; the run's
    failure message says why and by whom (`by`). Dagster's own run monitoring (dagster.yaml) covers runs that
    never got a process (STARTING past its start timeout); the local run launcher cannot tell it a run's
    process died, this does."""
    lines = []
    for record in instance.get_run_records(dg.RunsFilter(statuses=list(ACTIVE))):
        run = record.dagster_run
        found = run_process(instance, run)
        if found is None or not process_gone(*found):
            continue
        pid = found[0]
        message = (f"the process running this run (pid {pid}) is gone, killed or crashed while the run was "
                   f"{run.status.value}; marked failed by {by} so that the runs queued behind it can start")
        fresh = instance.get_run_by_id(run.run_id)
        if fresh is None or fresh.is_finished:
            continue
        instance.report_run_failed(fresh, message)
        lines.append(f"Dagster run {run.run_id} (job {run.job_name}) was left {run.status.value} by pid {pid}, "
                     f"which is gone (killed or crashed): marked FAILURE")
    return lines


# ---------------------------------------------------------------- job, schedule, sensor

refit_job = dg.define_asset_job(
    JOB_NAME, selection=dg.AssetSelection.all(), executor_def=dg.in_process_executor,
    tags={WRITER_TAG: "true"},
    description="Re-fit everything (the `build` graph): ingest incl. the incoming folder, predict, fit, curves, "
                "reports, then publish the snapshot. Started by the nightly schedule and the incoming-file sensor.",
)

nightly_refit = dg.ScheduleDefinition(
    name="nightly_refit", job=refit_job, cron_schedule=os.environ.get("STEPCAST_REFIT_CRON", "0 3 * * *"),
    execution_timezone="UTC", default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Nightly re-fit of the whole graph at 03:00 UTC (env STEPCAST_REFIT_CRON to change).",
)


def tagged_files(tags) -> list[str] | None:
    """The incoming file names a run's tags name (None: a run that names none, e.g. the nightly one)."""
    value = (tags or {}).get(FILES_TAG)
    if value is None:
        return None
    try:
        names = json.loads(value)
    except json.JSONDecodeError:
        return None
    return [str(n) for n in names] if isinstance(names, list) else None


@dataclass
class SensorState:
    """The sensor's cursor. `pending`: run key -> {"files": {name: sha256}, "at": request time}, runs asked
    for and not yet seen finished. `files`: name -> {"sha", "failures", "retry_at", "reason"} for files
    whose runs failed. `seq` numbers the requests (run keys are never reused, so a retry needs a new one)."""

    seq: int = 0
    pending: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)

    def dumps(self) -> str:
        return json.dumps({"seq": self.seq, "pending": self.pending, "files": self.files}, sort_keys=True)


def cursor_load(cursor: str | None) -> SensorState:
    if not cursor:
        return SensorState()
    try:
        value = json.loads(cursor)
    except json.JSONDecodeError:
        return SensorState()
    if not isinstance(value, dict) or "pending" not in value:
        return SensorState()  # an older cursor (name -> sha256): start afresh, files are asked for again
    return SensorState(int(value.get("seq", 0)), dict(value["pending"]), dict(value.get("files", {})))


#: a requested run that has not appeared after this long is taken as lost (the request is made again)
LOST_RUN_S = 600.0


def _user_error(err):
    """The user code's error inside Dagster's wrappers (DagsterExecutionStepExecutionError, ...)."""
    while err is not None and err.cause is not None and err.cls_name.startswith("Dagster"):
        err = err.cause
    return err


def failure_reason(instance: dg.DagsterInstance, run) -> str:
    """Why a run failed: the user code's error of its first failed step, else of the run failure (a
    resource that could not be set up, e.g. StoreBusy), else the run failure message."""
    for kind in (dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE):
        for rec in instance.get_records_for_run(run.run_id, of_type=kind).records:
            ev = rec.event_log_entry.dagster_event
            err = _user_error(getattr(ev.event_specific_data, "error", None))
            if err is not None:
                where = f" step {ev.step_key}" if ev.step_key else ""
                msg = err.message.strip()
                return f"run {run.run_id}{where}: {msg if msg.startswith(err.cls_name) else err.cls_name + ': ' + msg}"
            if kind == dg.DagsterEventType.RUN_FAILURE and ev.message:
                return f"run {run.run_id} {run.status.value}: {ev.message}"
    return f"run {run.run_id} {run.status.value}: no failure message"


def settle_pending(state: SensorState, instance: dg.DagsterInstance, current: dict[str, str], now: float) -> None:
    """Update `state` with the outcome of the runs it asked for. A file is handled when its run succeeded
    and moved it away; a failed run (or a successful one that left the file, e.g. because it changed while
    being read) counts a failure for each file it named, with the reason and the next retry time."""
    for key, req in list(state.pending.items()):
        found = instance.get_runs(dg.RunsFilter(tags={RUN_KEY_TAG: key}), limit=1)
        if not found:
            if now - req["at"] > LOST_RUN_S:
                del state.pending[key]
                _count_failure(state, req["files"], "the requested run never started", now)
            continue
        run = found[0]
        if not run.is_finished:
            continue
        del state.pending[key]
        if run.status == dg.DagsterRunStatus.SUCCESS:
            left = {n: sha for n, sha in req["files"].items() if current.get(n) == sha}
            for n in req["files"]:
                if n not in left:
                    state.files.pop(n, None)
            if left:
                _count_failure(state, left, f"run {run.run_id} succeeded but left the file in place", now)
        else:
            _count_failure(state, req["files"], failure_reason(instance, run), now)


def _count_failure(state: SensorState, files: dict[str, str], reason: str, now: float) -> None:
    for name, sha in files.items():
        f = state.files.get(name)
        if f is None or f.get("sha") != sha:
            f = {"sha": sha, "failures": 0}
        f["failures"] += 1
        f["reason"] = reason
        f["retry_at"] = now + retry_backoff_s() * 2 ** (f["failures"] - 1)
        state.files[name] = f


def plan_tick(state: SensorState, current: dict[str, str], now: float) -> tuple[dict[str, str], dict[str, str]]:
    """({name: sha} to ask a run for now, {name: reason} to quarantine) for the settled files `current`.
    Files of a pending run wait for it; a failed file waits for its retry time; one that failed
    `max_attempts()` times is quarantined. Changed bytes start afresh. Files that left the folder are
    forgotten."""
    state.files = {n: f for n, f in state.files.items() if n in current}
    busy = {n for req in state.pending.values() for n in req["files"]}
    ready, give_up = {}, {}
    for name, sha in sorted(current.items()):
        if name in busy:
            continue
        f = state.files.get(name)
        if f is not None and f["sha"] != sha:
            state.files.pop(name)
            f = None
        if f is None:
            ready[name] = sha
        elif f["failures"] >= max_attempts():
            give_up[name] = f"{f['failures']} runs failed; the last: {f['reason']}"
        elif now >= f["retry_at"]:
            ready[name] = sha
    return ready, give_up


def quarantine_failed(incoming: Path, name: str, reason: str) -> Path | None:
    """Move a file whose runs kept failing to quarantine/ with the reason beside it (not the store: the
    sensor never writes it)."""
    path = Path(incoming) / name
    if not path.is_file():
        return None
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return _quarantine(path, Path(incoming), f"{path}: {reason}\nquarantined at {stamp} after {max_attempts()} "
                                             f"failed runs\nFix the cause and drop the file into the incoming "
                                             f"folder again.\n")


def make_dead_runs_sensor() -> dg.SensorDefinition:
    """The sensor that marks failed the runs whose process died (`fail_dead_runs`): at daemon start (its first
    tick) and every `STEPCAST_SENSOR_INTERVAL_S` seconds after."""

    @dg.sensor(name="dead_runs", minimum_interval_seconds=int(_env_float("STEPCAST_SENSOR_INTERVAL_S", 30)),
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Marks FAILURE every run left in progress by a process that is gone (a build or run "
                           "worker killed or crashed), so that the re-fits queued behind it start.")
    def dead_runs(context: dg.SensorEvaluationContext):
        lines = fail_dead_runs(context.instance, by="the dead_runs sensor")
        for line in lines:
            context.log.warning(line)
        return dg.SkipReason("; ".join(lines) if lines else "no run left in progress by a dead process")

    return dead_runs


def make_incoming_sensor(incoming: str | Path | None = None) -> dg.SensorDefinition:
    """The sensor on `incoming` (default: the folder of `Settings.load()`, i.e. env STEPCAST_INCOMING)."""

    interval = int(_env_float("STEPCAST_SENSOR_INTERVAL_S", 30))

    @dg.sensor(name="incoming_files", job=refit_job, minimum_interval_seconds=interval,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="One refit run naming every new, changed or due-for-retry file of the incoming folder; "
                           "a file counts as handled only once its run succeeded (failed runs are retried with "
                           "backoff, then the file is quarantined with the reason).")
    def incoming_files(context: dg.SensorEvaluationContext):
        folder = Path(incoming) if incoming is not None else Settings.load().incoming
        now = time.time()
        state = cursor_load(context.cursor)
        current = scan(folder)
        settle_pending(state, context.instance, current, now)
        ready, give_up = plan_tick(state, current, now)
        for name, reason in give_up.items():
            target = quarantine_failed(folder, name, reason)
            state.files.pop(name, None)
            context.log.warning(f"{name}: quarantined to {target}: {reason}")
        if not ready:
            waiting = sorted(state.files) + sorted(n for r in state.pending.values() for n in r["files"])
            return dg.SensorResult(skip_reason=dg.SkipReason(
                f"no new or changed files in {folder}" + (f" (waiting: {', '.join(waiting)})" if waiting else "")),
                cursor=state.dumps())
        state.seq += 1
        key = f"incoming-{state.seq}-" + sha256_bytes(json.dumps(ready, sort_keys=True).encode())[:12]
        state.pending[key] = {"files": ready, "at": now}
        tags = {FILES_TAG: json.dumps(sorted(ready)), WRITER_TAG: "true"}
        return dg.SensorResult(run_requests=[dg.RunRequest(run_key=key, tags=tags)], cursor=state.dumps())

    return incoming_files
