"""`stepcast serve`: the explorer in the browser and its JSON API (pipeline/serve.py)."""

from __future__ import annotations

import typer

from pipeline.commands.common import settings


def serve(
    port: int = typer.Option(8765, "--port", "-p", min=1, max=65535, help="TCP port to listen on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind: loopback by default; 0.0.0.0 serves "
                                                         "every network this machine is on (prints a warning)."),
) -> None:
    """An interactive explorer in the browser: scaling curves, the frontier and the best layout of your choice
    of accelerators, model, tokens and network, redrawn as you change them; the URL keeps the view.

    It reads the promoted fit of the snapshot once at start-up and never writes. Beside the page, a JSON API
    answers `/api/predict`, `/api/search`, `/api/curve` and `/api/frontier` with the options of the commands
    of those names as query parameters and the JSON their `--format json` prints, e.g.
    `curl 'http://127.0.0.1:8765/api/predict?model=gpt3-175b&gpu=a100-sxm4-80gb&gpus=1024&global_batch=1536&seq_len=2048&tp=8&pp=8'`.

    Example: `stepcast serve` then open http://127.0.0.1:8765/ (Ctrl-C stops it).
    """
    # start-up time: pipeline.serve loads the model, Starlette and the report site (Altair), for this command only
    from pipeline.serve import run

    run(settings(), host=host, port=port)
