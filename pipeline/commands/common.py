"""What every command module shares: the consoles, the settings of this invocation, `fail`, and `command`, which
turns a command's options (pipeline/options.py) into its typer flags. pipeline/cli.py registers the commands;
nothing here imports it."""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NoReturn, Optional

import typer
from rich.console import Console

from pipeline.options import InputError, Option, Options
from pipeline.settings import Settings

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


@dataclass
class State:
    """This invocation's settings, from the global options (`stepcast --store PATH ...`): set by pipeline.cli."""

    settings: Optional[Settings] = None


state = State()


def settings(reports: Optional[Path] = None) -> Settings:
    """Where this invocation reads and writes: the global --store (else STEPCAST_STORE) and, for build, `reports`."""
    base = state.settings or Settings.load()
    return base if reports is None else Settings.load(store=base.store, reports=reports)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `error: message` on stderr and exit with `code` (2: a usage error)."""
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def computations():
    """pipeline.api, the functions the prediction commands call (and `import stepcast` and the explorer). It
    loads the model (NumPy and the models/ modules), which `stepcast --help`, `list` and the store's commands
    never use."""
    # start-up time: pipeline.api loads NumPy and the model
    from pipeline import api

    return api


def store_modules():
    """(pipeline.fits, pipeline.store): the store and its calibration fits, for ingest, info and fit. They load
    DuckDB, which `stepcast --help` never needs."""
    # start-up time: pipeline.store and pipeline.fits load DuckDB
    from pipeline import fits, store

    return fits, store


def builder():
    """pipeline.build: the build job, for build (and ingest into a store without its reference tables)."""
    # start-up time: pipeline.build loads Dagster (seconds), which only `stepcast build` needs
    from pipeline import build

    return build


def typer_option(o: Option):
    """The typer declaration of an option: its flags, default (`...` when required), bound, metavar and help."""
    flag = f"{o.long_flag}/--no-{o.long_flag[2:]}" if o.negatable else o.long_flag
    return typer.Option(... if o.required else o.default, flag, *([o.short] if o.short else []), help=o.help,
                        min=o.min, metavar=o.metavar, hidden=o.hidden)


def command(options: type[Options]) -> Callable:
    """Decorator: `fn(o, **printout)` as a typer command whose flags are `options.OPTIONS`, in order. typer reads
    the flags from the signature made here; a call builds the options object `o` of the flags (a value out of its
    bounds: `error: ...`, exit 2) and passes the CLI-only ones (`--format`, `--out`, ...) by name."""
    printout = [o.name for o in options.OPTIONS if o.cli_only]
    signature = inspect.Signature([
        inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=typer_option(o), annotation=o.annotation)
        for o in options.OPTIONS])

    def decorate(fn: Callable) -> Callable:
        def run(**flags):
            extra = {name: flags.pop(name) for name in printout}
            try:  # the options object checks every bound (pipeline.options.check_bounds)
                o = options(**flags)
            except InputError as err:
                fail(str(err), err.exit_code)
            return fn(o, **extra)

        functools.update_wrapper(run, fn, assigned=("__module__", "__name__", "__qualname__", "__doc__"), updated=())
        run.__signature__ = signature
        return run

    return decorate
