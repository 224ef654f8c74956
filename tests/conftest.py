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
    # the build must not pick up (or move) files a developer left in the real drop folder
    (folder / "incoming").mkdir()
    overrides = {"STEPCAST_STORE": str(folder / "stepcast.duckdb"), "STEPCAST_INCOMING": str(folder / "incoming")}
    old = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    try:
        cfg = Settings.load()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
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


@pytest.fixture(autouse=True)
def _no_default_store(monkeypatch, tmp_path_factory):
    """Commands under test never read the developer's own out/ store: unless a test points STEPCAST_STORE
    somewhere, it points at an empty folder (so predict/search/plan run analytical, as on a fresh clone)."""
    folder = tmp_path_factory.mktemp("no-store")
    monkeypatch.setenv("STEPCAST_STORE", str(folder / "stepcast.duckdb"))
    monkeypatch.setenv("STEPCAST_INCOMING", str(folder / "incoming"))
    monkeypatch.delenv("STEPCAST_SNAPSHOT", raising=False)
