"""Dagster Definitions: `dagster dev` (pyproject's [tool.dagster]) and `stepcast build` both load these."""

from __future__ import annotations

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets import checks, ingest, predict, publish
from pipeline.resources import MeasurementsResource
from pipeline.settings import Settings

ALL_ASSETS = [ingest.hardware, ingest.architectures, ingest.cloud_prices, ingest.run_metrics, ingest.runs,
              predict.analytical_predictions, publish.store_snapshot]

build_job = dg.define_asset_job(
    "build", selection=dg.AssetSelection.all(),
    description="The main job: ingest, predict, fit, curves, reports; then publish the snapshot.",
)


def make_definitions(settings: Settings | None = None) -> dg.Definitions:
    settings = settings or Settings.load()
    return dg.Definitions(
        assets=ALL_ASSETS,
        asset_checks=checks.CHECKS,
        jobs=[build_job],
        resources={
            "duckdb": DuckDBResource(database=str(settings.store)),
            "measurements": MeasurementsResource(root=str(settings.measurements)),
            "paths": publish.SnapshotConfig(store=str(settings.store), snapshot=str(settings.snapshot)),
        },
    )


defs = make_definitions()
