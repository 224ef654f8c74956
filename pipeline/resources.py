"""Dagster resources: where the measurements live (the store itself is a `DuckDBResource`)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg


class MeasurementsResource(dg.ConfigurableResource):
    """The folder of shipped measurements (hardware, architectures, prices, measured runs, vTrain raw files)."""

    root: str
    incoming: str = ""  # the drop folder (Settings.incoming); empty: no incoming files are ingested

    def path(self, *parts: str) -> Path:
        return Path(self.root).joinpath(*parts)

    @property
    def measured_runs(self) -> Path:
        return self.path("measured_runs.csv")

    @property
    def vtrain_single(self) -> Path:
        return self.path("external", "vtrain", "ground_truth_single.csv")

    @property
    def vtrain_multi(self) -> Path:
        return self.path("external", "vtrain", "ground_truth_multi.csv")
