"""Dagster Definitions: `dagster dev` (pyproject's [tool.dagster]) and `stepcast build` both load these.

Assets and checks are collected from the modules in `ASSET_MODULES`; the published snapshot depends on every
other asset, so it is always written last and only after everything upstream succeeded."""

from __future__ import annotations

import dagster as dg

from assets import checks, ingest, plan, predict, publish
from assets import fit as fit_assets
from assets import curves, reports  # noqa: E402  (scaling curves, frontier, report site)
from pipeline import automation
from pipeline.resources import MeasurementsResource
from pipeline.settings import Settings

ASSET_MODULES = [ingest, predict, plan, checks, curves, reports, fit_assets]


def _collect():
    assets = list(dg.load_assets_from_modules(ASSET_MODULES))
    asset_checks = list(dg.load_asset_checks_from_modules(ASSET_MODULES))
    snapshot = publish.make_snapshot_asset([a for a in assets])
    return assets + [snapshot], asset_checks


ALL_ASSETS, ALL_CHECKS = _collect()

build_job = dg.define_asset_job(
    "build", selection=dg.AssetSelection.all(),
    description="The main job: ingest, predict, fit, curves, reports; then publish the snapshot.",
)


def make_definitions(settings: Settings | None = None, holder_pid: int = 0) -> dg.Definitions:
    """`holder_pid`: a process that holds the store's writer lock for the runs of these definitions (`stepcast
    build` for its step processes, see `pipeline.automation.StoreResource`); 0: each run takes it."""
    settings = settings or Settings.load()
    return dg.Definitions(
        assets=ALL_ASSETS,
        asset_checks=ALL_CHECKS,
        jobs=[build_job, automation.refit_job],
        schedules=[automation.nightly_refit],
        sensors=[automation.make_incoming_sensor(settings.incoming), automation.make_dead_runs_sensor()],
        resources={
            "duckdb": automation.StoreResource(database=str(settings.store), holder_pid=holder_pid),
            "measurements": MeasurementsResource(root=str(settings.measurements), incoming=str(settings.incoming)),
            "paths": publish.SnapshotConfig(store=str(settings.store), snapshot=str(settings.snapshot),
                                            reports=str(settings.reports), holder_pid=holder_pid),
        },
    )


defs = make_definitions()
