"""CLI commands kept in their own modules; each registers on `pipeline.cli.app` with `@app.command()`.

Import order here is the order in `stepcast --help`."""

from pipeline.commands import search  # noqa: F401
from pipeline.commands import plan  # noqa: F401
from pipeline.commands import curves  # noqa: F401
from pipeline.commands import fit  # noqa: F401
