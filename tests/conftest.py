"""Shared fixtures: a store built once per test session from the shipped measurements."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENTS = ROOT / "measurements"


def dagster_home_of(store: Path) -> Path:
    """The Dagster instance folder the session build recorded its run in (beside its store)."""
    return store.parent / "dagster_home"


@pytest.fixture(scope="session")
def built_store(tmp_path_factory) -> Path:
    """Run `stepcast build` (the build job in-process) on a temporary store, recording the run in a temporary
    Dagster instance (``dagster_home_of(store)``); returns the store path."""
    import io

    from rich.console import Console

    from pipeline.build import run_build
    from pipeline.settings import Settings

    folder = tmp_path_factory.mktemp("built")
    # the build must not pick up (or move) files a developer left in the real drop folder
    (folder / "incoming").mkdir()
    overrides = {"STEPCAST_STORE": str(folder / "stepcast.duckdb"), "STEPCAST_INCOMING": str(folder / "incoming"),
                 "DAGSTER_HOME": str(folder / "dagster_home")}
    old = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    out = io.StringIO()
    try:
        cfg = Settings.load()
        ok = run_build(cfg, Console(file=out, width=200), quiet=True)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert ok, out.getvalue()[-4000:]
    return cfg.store


@pytest.fixture()
def store_copy(built_store, tmp_path) -> Path:
    """A private copy of the built store that a test may change."""
    target = tmp_path / "store.duckdb"
    shutil.copyfile(built_store, target)
    return target


@pytest.fixture(autouse=True)
def _no_default_store(monkeypatch, tmp_path_factory):
    """Commands under test never read the developer's own out/ store or Dagster instance: unless a test points STEPCAST_STORE
    somewhere, it points at an empty folder (so predict/search/plan run analytical, as on a fresh clone)."""
    folder = tmp_path_factory.mktemp("no-store")
    monkeypatch.setenv("STEPCAST_STORE", str(folder / "stepcast.duckdb"))
    monkeypatch.setenv("STEPCAST_INCOMING", str(folder / "incoming"))
    monkeypatch.delenv("STEPCAST_SNAPSHOT", raising=False)
    # nor the developer's Dagster instance (.dagster/ or their DAGSTER_HOME): builds record their runs here
    monkeypatch.setenv("DAGSTER_HOME", str(folder / "dagster_home"))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """measured_runs.csv through `stepcast predict --runs`'s path, on the priors (no store, no fit): once per session
    for every test that reads the corpus's predicted rows."""
    from pipeline.predict_runs import predict_file

    old = os.environ.get("STEPCAST_STORE")
    os.environ["STEPCAST_STORE"] = str(tmp_path_factory.mktemp("none") / "stepcast.duckdb")
    try:
        return predict_file(MEASUREMENTS / "measured_runs.csv", MEASUREMENTS)
    finally:
        if old is None:
            os.environ.pop("STEPCAST_STORE")
        else:
            os.environ["STEPCAST_STORE"] = old
