"""Shared fixtures: a store built once per test session from the shipped measurements."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENTS = ROOT / "measurements"


@pytest.fixture(scope="session")
def built_store(tmp_path_factory) -> Path:
    """Run the whole build job in-process on a temporary store; returns the store path."""
    import dagster as dg

    from pipeline.definitions import make_definitions
    from pipeline.settings import Settings

    folder = tmp_path_factory.mktemp("built")
    old = os.environ.get("STEPCAST_STORE")
    os.environ["STEPCAST_STORE"] = str(folder / "stepcast.duckdb")
    try:
        cfg = Settings.load()
    finally:
        if old is None:
            os.environ.pop("STEPCAST_STORE")
        else:
            os.environ["STEPCAST_STORE"] = old
    result = make_definitions(cfg).resolve_job_def("build").execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), raise_on_error=True)
    assert result.success
    return cfg.store


@pytest.fixture()
def store_copy(built_store, tmp_path) -> Path:
    """A private copy of the built store that a test may change."""
    target = tmp_path / "store.duckdb"
    shutil.copyfile(built_store, target)
    return target
