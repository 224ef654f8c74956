"""`stepcast build`: materialize the whole asset graph in-process, with a progress display, then summarize.

The run is recorded in the project's Dagster instance, so `dagster dev` shows its materializations, check
results, metadata and run history: `$DAGSTER_HOME` when set, else `.dagster/` in the project root. The project's
`dagster.yaml` keeps Dagster's storage in `.dagster/` (paths relative to the folder `dagster dev` starts in: the
project root); a home of its own gets a `dagster.yaml` with the project's settings and Dagster's default storage
layout inside that home, which is the same layout.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline.settings import PROJECT_ROOT, Settings

PROJECT_DAGSTER_YAML = PROJECT_ROOT / "dagster.yaml"
DEFAULT_DAGSTER_HOME = PROJECT_ROOT / ".dagster"
# the instance settings that say WHERE Dagster stores; a home of its own keeps them inside itself (Dagster's defaults)
STORAGE_KEYS = ("storage", "local_artifact_storage", "compute_logs")
GENERATED_MARK = "# written by `stepcast build` from the project's dagster.yaml"


def load_reference_tables(con, cfg: Settings) -> None:
    """Load hardware, architectures and prices into a store that has none (used by `stepcast ingest`)."""
    from pipeline import store

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


class _StepListener(logging.Handler):
    """Advances a rich progress bar as Dagster reports steps finishing."""

    def __init__(self, progress: Progress, task, n_steps: int):
        super().__init__(level=logging.DEBUG)
        self.progress, self.task, self.n_steps, self.done = progress, task, n_steps, 0

    def emit(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "dagster_meta", None) or {}
        event = meta.get("dagster_event")
        kind = getattr(event, "event_type_value", None)
        step = getattr(event, "step_key", None) or meta.get("step_key")
        if kind == "STEP_START":
            self.progress.update(self.task, description=f"building [bold]{step}[/bold]")
        elif kind in ("STEP_SUCCESS", "STEP_FAILURE", "STEP_SKIPPED"):
            self.done += 1
            self.progress.update(self.task, completed=min(self.done, self.n_steps))


def run_build(cfg: Settings, console: Console, quiet: bool = False) -> bool:
    """The build job in-process, holding the store's one-writer lock (as `stepcast ingest` does)."""
    from pipeline import store

    cfg.store.parent.mkdir(parents=True, exist_ok=True)
    try:
        with store.writer_lock(cfg.store):
            return _run_build(cfg, console, quiet)
    except store.StoreBusy as err:
        console.print(f"[red]error:[/red] {err}")
        return False


def _run_build(cfg: Settings, console: Console, quiet: bool) -> bool:
    import dagster as dg

    from pipeline.definitions import make_definitions
    from pipeline.parallel import shared_pools

    defs = make_definitions(cfg)
    job = defs.resolve_job_def("build")
    n_steps = len(list(job.graph.node_defs)) if hasattr(job, "graph") else 1
    instance = project_instance()
    dagster_logger = logging.getLogger("dagster")
    start = time.perf_counter()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                  TimeElapsedColumn(), console=console, transient=quiet, disable=quiet) as progress:
        task = progress.add_task("starting", total=n_steps)
        listener = _StepListener(progress, task, n_steps)
        dagster_logger.addHandler(listener)
        try:
            with shared_pools():  # worker processes spawned once for the whole build (pipeline.parallel)
                result = job.execute_in_process(
                    instance=instance, raise_on_error=False,
                    run_config={"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}},
                )
        finally:
            dagster_logger.removeHandler(listener)
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
            failures.append((ev.step_key or "?", f"{err.cls_name}: {err.message.strip()}" if err else "unknown"))
            table.add_row(ev.step_key or "?", "[red]failed[/red]", "see below")
    console.print(table)
    for step, message in failures:
        console.print(f"[red]{step} failed:[/red] {message}", markup=True, highlight=False)
    console.print(f"store: {cfg.store}\nsnapshot (read-only, for readers): {cfg.snapshot}\n"
                  f"Dagster run {result.run_id} recorded in {dagster_home()} (`uv run dagster dev` in the "
                  f"project root shows it)", highlight=False)
    return bool(result.success)
