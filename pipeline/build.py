"""`stepcast build`: materialize the whole asset graph (Dagster's multiprocess executor), with a progress display,
then summarize.

The run is recorded in the project's Dagster instance, so `dagster dev` shows its materializations, check
results, metadata and run history: `$DAGSTER_HOME` when set, else `.dagster/` in the project root. The project's
`dagster.yaml` keeps Dagster's storage in `.dagster/` (paths relative to the folder `dagster dev` starts in: the
project root); a home of its own gets a `dagster.yaml` with the project's settings and Dagster's default storage
layout inside that home, which is the same layout.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from pipeline import automation, parallel, store
from pipeline.definitions import make_definitions
from pipeline.parallel import workers
from pipeline.settings import PROJECT_ROOT, Settings

PROJECT_DAGSTER_YAML = PROJECT_ROOT / "dagster.yaml"
DEFAULT_DAGSTER_HOME = PROJECT_ROOT / ".dagster"
# the instance settings that say WHERE Dagster stores; a home of its own keeps them inside itself (Dagster's defaults)
STORAGE_KEYS = ("storage", "local_artifact_storage", "compute_logs")
GENERATED_MARK = "# written by `stepcast build` from the project's dagster.yaml"


def load_reference_tables(con, cfg: Settings) -> None:
    """Load hardware, architectures and prices into a store that has none (used by `stepcast ingest`)."""
    for table in store.REFERENCE:
        store.load_reference(con, table, cfg.measurements)
    store.rebuild_runs(con)


def dagster_home() -> Path:
    """The Dagster instance folder: `$DAGSTER_HOME` when set, else `.dagster/` in the project root."""
    value = os.environ.get("DAGSTER_HOME", "").strip()
    return Path(value).expanduser().resolve() if value else DEFAULT_DAGSTER_HOME


def instance_yaml() -> str:
    """The project's dagster.yaml for a home of its own: every setting except the storage locations."""
    import yaml

    config = yaml.safe_load(PROJECT_DAGSTER_YAML.read_text(encoding="utf-8")) or {}
    settings = {k: v for k, v in config.items() if k not in STORAGE_KEYS}
    return f"{GENERATED_MARK}; rewritten when that file changes, unless this line is removed\n" + \
        yaml.safe_dump(settings, sort_keys=False)


def ensure_dagster_home(home: Path) -> Path:
    """Create ``home`` with its dagster.yaml (see ``instance_yaml``); a dagster.yaml someone wrote (without the
    generated-file line) is left as it is."""
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    text = instance_yaml()
    current = target.read_text(encoding="utf-8") if target.exists() else None
    if current is None or (current.startswith(GENERATED_MARK) and current != text):
        target.write_text(text, encoding="utf-8")
    return home


def project_instance():
    """The project's Dagster instance (see the module docstring), created on first use."""
    import dagster as dg

    return dg.DagsterInstance.from_config(str(ensure_dagster_home(dagster_home())))


#: the modules every step process needs, imported once by the multiprocess executor's fork server (each step is
#: forked from it instead of starting Python and importing Dagster and the assets again: ~3 s a step); with the
#: modules of the instance's storage (`run_config`). pipeline.api, typer: a step re-runs the command's main module.
PRELOAD = ("pipeline.build", "pipeline.definitions", "pipeline.api", "typer", "upath", "numpy.ma")
#: a line Dagster's console logger writes from each step process before the step's own logging starts (the
#: event log has the same event); the step processes' other output reaches stderr
_DAGSTER_DEBUG_LINE = b" - dagster - DEBUG - "
BUILD_TAG = "stepcast/build"  # a token naming one `stepcast build` run (the progress display finds it by it)
STEP_EVENTS = ("STEP_START", "STEP_SUCCESS", "STEP_FAILURE", "STEP_SKIPPED")


def build_job(store: str, snapshot: str, reports: str, measurements: str, incoming: str, holder_pid: int = 0):
    """The build job as `stepcast build` runs it: its step processes reconstruct it from these arguments (the paths
    chosen on the command line, and the pid of the `stepcast build` that holds the store's writer lock for them)."""
    cfg = Settings(store=Path(store), snapshot=Path(snapshot), reports=Path(reports), measurements=Path(measurements),
                   incoming=Path(incoming))
    return make_definitions(cfg, holder_pid=holder_pid).resolve_job_def("build")


def run_config(n_workers: int, instance=None) -> dict:
    """Dagster's multiprocess executor, at most `n_workers` steps at a time, steps forked from a server that has
    imported `PRELOAD` and the modules of `instance`'s storage (each step opens the instance: ~1.5 s of imports);
    Dagster's console log quiet (the progress display and the summary say what happened)."""
    preload = list(PRELOAD)
    if instance is not None:
        ref = instance.get_ref()
        preload += sorted({v.module_name for v in ref._asdict().values() if hasattr(v, "module_name")} - set(preload))
    return {
        "execution": {"config": {"multiprocess": {
            "max_concurrent": n_workers,
            "start_method": {"forkserver": {"preload_modules": preload}},
        }}},
        "loggers": {"console": {"config": {"log_level": "CRITICAL"}}},
    }


def start_step_server(preload: list[str]) -> None:
    """Start the fork server Dagster's multiprocess executor forks the steps from (unless this process has one),
    preloading `preload`, with its stderr (and so the steps') piped through a filter that drops Dagster's
    per-step debug lines and passes everything else on to this process's stderr."""
    import multiprocessing
    import sys
    from multiprocessing import forkserver


    multiprocessing.get_context("forkserver").set_forkserver_preload(list(preload))
    read_end, write_end = os.pipe()
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(write_end, 2)
    # the steps' pools take turns on the CPUs (pipeline.parallel.cpu_slot); the server and so every step inherit this
    os.environ[parallel.SLOTS_ENV] = str(parallel.slots_dir())
    try:
        forkserver.ensure_running()  # a server already running keeps its stderr; the pipe then just closes
    finally:
        os.environ.pop(parallel.SLOTS_ENV, None)
        os.dup2(saved, 2)
        os.close(saved)
        os.close(write_end)
    threading.Thread(target=_pass_stderr, args=(read_end,), daemon=True, name="stepcast-step-stderr").start()


def _pass_stderr(fd: int) -> None:
    with os.fdopen(fd, "rb") as lines:
        for line in lines:
            if _DAGSTER_DEBUG_LINE not in line:
                try:
                    os.write(2, line)
                except OSError:
                    pass


class _StepWatcher(threading.Thread):
    """Advances a rich progress bar as the run's steps start and finish: reads the run's step events from the
    instance's event log (the steps run in other processes and write them there)."""

    def __init__(self, progress: Progress, task, n_steps: int, token: str, interval_s: float = 0.25):
        super().__init__(daemon=True, name="stepcast-build-progress")
        self.progress, self.task, self.n_steps, self.token = progress, task, n_steps, token
        self.interval_s, self.stop, self.done, self.running = interval_s, threading.Event(), 0, []

    def run(self) -> None:
        import dagster as dg

        try:
            instance = dg.DagsterInstance.from_config(str(dagster_home()))
        except Exception:  # noqa: BLE001 - no progress display, the build goes on
            return
        kinds = {dg.DagsterEventType(k) for k in STEP_EVENTS}
        run_id, cursor = None, None
        try:
            while not self.stop.wait(self.interval_s):
                try:
                    if run_id is None:
                        runs = instance.get_runs(dg.RunsFilter(tags={BUILD_TAG: self.token}), limit=1)
                        run_id = runs[0].run_id if runs else None
                        if run_id is None:
                            continue
                    page = instance.get_records_for_run(run_id, cursor=cursor, of_type=kinds)
                except Exception:  # noqa: BLE001 - the event log busy for a moment: next time
                    continue
                cursor = page.cursor
                for rec in page.records:
                    self._seen(rec.event_log_entry.dagster_event)
        finally:
            instance.dispose()

    def _seen(self, event) -> None:
        kind, step = event.event_type_value, event.step_key
        if kind == "STEP_START":
            self.running.append(step)
        elif step in self.running:
            self.running.remove(step)
        if kind != "STEP_START":
            self.done += 1
        self.progress.update(self.task, completed=min(self.done, self.n_steps))
        if self.running:  # between two steps the last description stays
            self.progress.update(self.task, description=f"building [bold]{', '.join(self.running)}[/bold]")


def run_build(cfg: Settings, console: Console, quiet: bool = False, wait_s: float | None = None) -> bool:
    """The build job, its steps in processes, while this process holds the store's one-writer lock (as
    `stepcast ingest` does) for them. A store held by another writer, or open in another program, is waited
    for up to `wait_s` (default `store.lock_wait_s()`), saying so on stderr; then one line says which process
    holds it and what to do, and the build returns False."""
    wait_s = store.lock_wait_s() if wait_s is None else wait_s

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    cfg.store.parent.mkdir(parents=True, exist_ok=True)
    # the step processes (forked from a server this process starts) wait the same bound for a program that
    # opens the store in the middle of the build
    saved = os.environ.get("STEPCAST_LOCK_WAIT_S")
    os.environ["STEPCAST_LOCK_WAIT_S"] = f"{wait_s:g}"
    try:
        with store.writer_lock(cfg.store, timeout_s=wait_s, on_wait=say):
            if cfg.store.exists():  # a program outside stepcast with the file open (no writer lock of its own)
                store.connect_waiting(cfg.store, foreign_wait_s=wait_s, on_wait=say).close()
            return _run_build(cfg, console, quiet)
    except store.StoreBusy as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return False
    finally:
        if saved is None:
            os.environ.pop("STEPCAST_LOCK_WAIT_S", None)
        else:
            os.environ["STEPCAST_LOCK_WAIT_S"] = saved


def _run_build(cfg: Settings, console: Console, quiet: bool) -> bool:
    import uuid

    import dagster as dg


    instance = project_instance()
    # a run left STARTED by a build or run worker that was killed would block the daemon's run queue for good
    for line in automation.fail_dead_runs(instance, by=f"stepcast build (pid {os.getpid()})"):
        console.print(line, highlight=False)
    config = run_config(workers(), instance)
    # the server imports the steps' modules while this process builds the job (both take seconds)
    start_step_server(config["execution"]["config"]["multiprocess"]["start_method"]["forkserver"]["preload_modules"])
    recon = dg.build_reconstructable_job("pipeline.build", "build_job", reconstructable_kwargs=dict(
        store=str(cfg.store), snapshot=str(cfg.snapshot), reports=str(cfg.reports),
        measurements=str(cfg.measurements), incoming=str(cfg.incoming), holder_pid=os.getpid()))
    job = recon.get_definition()
    n_steps = len(list(job.graph.node_defs)) if hasattr(job, "graph") else 1
    token = uuid.uuid4().hex
    start = time.perf_counter()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                  TimeElapsedColumn(), console=console, transient=quiet, disable=quiet) as progress:
        task = progress.add_task("starting", total=n_steps)
        watcher = _StepWatcher(progress, task, n_steps, token)
        if not quiet:
            watcher.start()
        try:
            result = dg.execute_job(recon, instance=instance, run_config=config,
                                    tags={BUILD_TAG: token, automation.PID_TAG: str(os.getpid())},
                                    raise_on_error=False)
        finally:
            watcher.stop.set()
            if watcher.is_alive():
                watcher.join()
            instance.dispose()
        progress.update(task, completed=n_steps, description="done" if result.success else "failed")
    elapsed = time.perf_counter() - start

    table = Table("asset", "status", "details", title=f"stepcast build — {elapsed:.1f} s")
    materialized = {tuple(m.asset_key.path): m for m in result.get_asset_materialization_events()}
    for key in sorted(materialized):
        meta = materialized[key].materialization.metadata
        keys = ("path",) if "path" in meta else tuple(k for k in meta if k.startswith("rows") or k == "rejected_rows")
        details = ", ".join(f"{k}={meta[k].value}" for k in keys)
        table.add_row("/".join(key), "[green]materialized[/green]", details)
    for ev in result.get_asset_check_evaluations():
        mark = "[green]passed[/green]" if ev.passed else "[red]FAILED[/red]"
        table.add_row(f"  check {ev.check_name}", mark, ev.description or "")
    failures = []
    for ev in result.all_events:
        if ev.event_type_value == "STEP_FAILURE":
            err = ev.step_failure_data.error
            while err is not None and err.cause is not None and "DagsterExecutionStepExecutionError" in err.cls_name:
                err = err.cause  # the user code's own error, not Dagster's wrapper
            msg = err.message.strip() if err else "unknown"
            failures.append((ev.step_key or "?", msg if err is None or msg.startswith(err.cls_name)
                             else f"{err.cls_name}: {msg}"))
            table.add_row(ev.step_key or "?", "[red]failed[/red]", "see below")
    console.print(table)
    for step, message in failures:
        console.print(f"[red]{step} failed:[/red] {message}", markup=True, highlight=False)
    console.print(f"store: {cfg.store}\nsnapshot (read-only, for readers): {cfg.snapshot}\n"
                  f"Dagster run {result.run_id} recorded in {dagster_home()} (`uv run dagster dev` in the "
                  f"project root shows it)", highlight=False)
    return bool(result.success)
