"""Where stepcast reads and writes: one place, overridable by environment variables.

| setting            | env var                | default (relative to the project root)   |
|--------------------|------------------------|------------------------------------------|
| store (writer)     | STEPCAST_STORE         | out/stepcast.duckdb                      |
| snapshot (readers) | STEPCAST_SNAPSHOT      | <store folder>/snapshot/stepcast.duckdb  |
| reports site       | STEPCAST_REPORTS       | <store folder>/site                      |
| measurements       | STEPCAST_MEASUREMENTS  | measurements/                            |
| incoming drop dir  | STEPCAST_INCOMING      | measurements/incoming/                   |

The snapshot and reports follow the store: `--store /tmp/x/s.duckdb` publishes to
`/tmp/x/snapshot/s.duckdb` unless STEPCAST_SNAPSHOT says otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


@dataclass(frozen=True)
class Settings:
    store: Path
    snapshot: Path
    reports: Path
    measurements: Path
    incoming: Path

    @classmethod
    def load(cls, store: str | Path | None = None, reports: str | Path | None = None) -> "Settings":
        store_path = Path(store).expanduser() if store else _env_path("STEPCAST_STORE")
        if store_path is None:
            store_path = PROJECT_ROOT / "out" / "stepcast.duckdb"
        store_path = store_path.resolve()
        snapshot = _env_path("STEPCAST_SNAPSHOT") or store_path.parent / "snapshot" / store_path.name
        reports_path = Path(reports).expanduser() if reports else _env_path("STEPCAST_REPORTS")
        measurements = _env_path("STEPCAST_MEASUREMENTS") or PROJECT_ROOT / "measurements"
        incoming = _env_path("STEPCAST_INCOMING") or measurements / "incoming"
        return cls(
            store=store_path,
            snapshot=snapshot.resolve(),
            reports=(reports_path or store_path.parent / "site").resolve(),
            measurements=measurements.resolve(),
            incoming=incoming.resolve(),
        )
