"""Publishing: a read-only snapshot of the store for readers, swapped in atomically."""

from pathlib import Path

import dagster as dg

from pipeline import store


class SnapshotConfig(dg.ConfigurableResource):
    """Where the writer's store is, where its published snapshot goes, and where the report site goes."""

    store: str
    snapshot: str
    reports: str = ""
    holder_pid: int = 0  # the process holding the store's writer lock for this run (`store.writer_lock`)


def make_snapshot_asset(upstream: list) -> dg.AssetsDefinition:
    """The snapshot asset, depending on every other asset so that it is written last."""

    @dg.asset(name="store_snapshot", group_name="publish", kinds={"duckdb"}, deps=upstream,
              description="Read-only copy of the store for readers (DuckDB CLI, notebooks, BI). Written beside, "
                          "then renamed into place, so a reader sees the old or the new store, never a mix.")
    def store_snapshot(paths: SnapshotConfig) -> dg.MaterializeResult:
        target = store.publish_snapshot(Path(paths.store), Path(paths.snapshot), holder_pid=paths.holder_pid or None)
        con = store.connect(target, read_only=True)
        try:
            counts = store.row_counts(con)
        finally:
            con.close()
        return dg.MaterializeResult(metadata={
            "path": dg.MetadataValue.path(str(target)),
            **{f"rows_{t}": dg.MetadataValue.int(c) for t, c in counts.items() if c is not None},
        })

    return store_snapshot
