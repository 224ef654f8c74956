"""Re-fits that run themselves: the `refit` job, a nightly schedule, and a sensor on the incoming folder.

Flow: a measurement file dropped into the incoming folder (`Settings.incoming`: `measurements/incoming/`,
env `STEPCAST_INCOMING`) is seen by the `incoming_files` sensor, which requests one `refit` run per new or
changed file (cursor: file name -> sha256 of its bytes; run key `<name>@<sha256>`, so the same bytes never
start two runs). The run rebuilds the whole graph; its `run_metrics` asset calls `ingest_incoming`, which

- re-ingests every file already in `<incoming>/processed/` (so that a rebuild from scratch still holds every
  accepted incoming file; unchanged files cost one hash each),
- ingests each settled file of `<incoming>/` strictly (all or nothing: a file with any rejected row is not
  loaded), stored under its `processed/` name, then moves it to `<incoming>/processed/<name>`,
- moves a file that failed to `<incoming>/quarantine/<name>` with `<name>.reason.txt` beside it (the reason,
  and one line per rejected row: `file:line: column NAME = 'VALUE': reason`),
- leaves a file that changed while being read where it is: the sensor sees its new hash and asks again.

"Settled" means not modified for `STEPCAST_INCOMING_SETTLE_S` seconds (default 2): a file still being
copied in is not picked up half-written. Safer still: write it under a name starting with `.` and rename it
when complete (hidden names, `*.tmp`, `*.part`, `*~`, `README*` and `*.reason.txt` are never picked up).

The nightly schedule (`nightly_refit`, 03:00 UTC, env `STEPCAST_REFIT_CRON`) runs the same job. Both start
RUNNING in `dagster dev`. One writer: every run of this project writes the store, so the project's
`dagster.yaml` allows one run in progress at a time (others wait in the queue); the job runs its steps in
one process (in-process executor), so steps never contend for the DuckDB file lock either. Blocking asset
checks stop everything downstream of a failed check, including the snapshot: readers keep the last good one.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from pipeline import store
from pipeline.readers import sha256_bytes

JOB_NAME = "refit"
WRITER_TAG = "stepcast/writes_store"
FILE_TAG = "stepcast/incoming_file"
SHA_TAG = "stepcast/incoming_sha256"
SUFFIXES = (".csv", ".parquet", ".pq")
IGNORED_SUFFIXES = (".tmp", ".part", ".partial", "~", ".reason.txt", ".md")


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


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


def ingest_incoming(con, incoming: str | Path, log=None) -> IncomingResult:
    """Ingest the processed/ files again and the new files of the incoming folder; move each new file to
    processed/ or quarantine/. Store semantics are those of `store.ingest_files` (strict mode)."""
    incoming = Path(incoming)
    result = IncomingResult()
    if not incoming.is_dir():
        return result
    done = processed_dir(incoming)
    kept = sorted(p for p in done.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES) if done.is_dir() else []
    if kept:
        result.reprocessed = store.ingest_files(con, kept, strict=True)
        for rep in result.reprocessed:
            if not rep.ok:
                result.messages.append(f"processed file no longer ingests: {rep.file}: {rep.status} {rep.message}")
    new = candidates(incoming)
    if not new:
        return result
    keys = [store.file_key(done / p.name) for p in new]
    by_key = {rep.file: rep for rep in store.ingest_files(con, new, strict=True, keys=keys)}
    for path, key in zip(new, keys):
        rep = by_key[key]
        if rep.ok:
            done.mkdir(parents=True, exist_ok=True)
            os.replace(path, done / path.name)
            result.accepted.append(path.name)
        elif rep.error is not None and rep.error.retry:
            result.retry.append(path.name)
            result.messages.append(f"{path.name}: {rep.message}")
        else:
            if rep.error is not None and not rep.message:
                rep.message = str(rep.error)
            rep.path = str(path)
            target = _quarantine(path, incoming, _reason_text(rep))
            result.quarantined.append(path.name)
            result.messages.append(f"{path.name}: quarantined to {target}: {rep.message}")
    if log is not None:
        for m in result.messages:
            log.warning(m)
    return result


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


def cursor_load(cursor: str | None) -> dict[str, str]:
    if not cursor:
        return {}
    try:
        value = json.loads(cursor)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def requests_for(seen: dict[str, str], current: dict[str, str]) -> list[dg.RunRequest]:
    """One run request per file that is new or whose bytes changed since the cursor was written."""
    return [
        dg.RunRequest(run_key=f"{name}@{sha}", tags={FILE_TAG: name, SHA_TAG: sha, WRITER_TAG: "true"})
        for name, sha in sorted(current.items()) if seen.get(name) != sha
    ]


def make_incoming_sensor(incoming: str | Path | None = None) -> dg.SensorDefinition:
    """The sensor on `incoming` (default: the folder of `Settings.load()`, i.e. env STEPCAST_INCOMING)."""

    interval = int(_env_float("STEPCAST_SENSOR_INTERVAL_S", 30))

    @dg.sensor(name="incoming_files", job=refit_job, minimum_interval_seconds=interval,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="One refit run per new or changed file in the incoming folder (cursor: name -> sha256).")
    def incoming_files(context: dg.SensorEvaluationContext):
        from pipeline.settings import Settings

        folder = Path(incoming) if incoming is not None else Settings.load().incoming
        seen = cursor_load(context.cursor)
        current = scan(folder)
        requests = requests_for(seen, current)
        # files that left the folder (moved to processed/ or quarantine/) leave the cursor too
        cursor = json.dumps(current, sort_keys=True)
        if not requests:
            return dg.SensorResult(skip_reason=dg.SkipReason(f"no new or changed files in {folder}"), cursor=cursor)
        return dg.SensorResult(run_requests=requests, cursor=cursor)

    return incoming_files
