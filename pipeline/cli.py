"""The `stepcast` command line: the typer app, its global --store option and the commands, in `--help` order.

Each command lives in a module of pipeline/commands/ (what they share: pipeline/commands/common.py); the options of
predict, search, curve, frontier and plan are defined once in pipeline/options.py. Heavy modules (the model,
DuckDB, Dagster, Altair) load inside the commands that need them, so `stepcast --help` starts quickly.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from pipeline.commands import common, curves, data, explore, fit, listing, plan, predict, search
from pipeline.settings import Settings

app = typer.Typer(
    name="stepcast",
    help=(
        "Predict how long one LLM training step takes on a given cluster and parallel layout, what a run costs, "
        "and where adding accelerators stops paying off.\n\n"
        "Start with `stepcast build` (ingests the shipped measurements into the DuckDB store and publishes a "
        "read-only snapshot), then `stepcast info` to see where everything went."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def main_options(
    store: Optional[Path] = typer.Option(
        None, "--store", envvar="STEPCAST_STORE", metavar="PATH",
        help="DuckDB store the writer uses (default: out/stepcast.duckdb in the project; env STEPCAST_STORE).",
    ),
) -> None:
    common.state.settings = Settings.load(store=store)


#: the commands, in `stepcast --help` order (then `stepcast list`)
COMMANDS = (data.build, data.ingest, predict.predict, data.info, explore.serve, search.search, plan.plan,
            curves.curve, curves.frontier, fit.fit)
for command in COMMANDS:
    app.command()(command)
app.add_typer(listing.list_app, name="list")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        common.err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
