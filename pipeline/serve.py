"""`stepcast serve`: the interactive explorer, a small Starlette app on uvicorn.

What it serves, and nothing else:

| path | what |
|---|---|
| `/` | the explorer page (pipeline/explorer/index.html with the model and accelerator tables inlined) |
| `/vega-bundle.js` | the offline Vega / Vega-Lite / vega-embed bundle of the report site (reports.site.BUNDLE) |
| `/api/predict`, `/api/search`, `/api/curve`, `/api/frontier` | the JSON `stepcast predict / search / curve / frontier --format json` prints |
| `/api/trace` | the timeline of one step of predict's configuration, the trace `stepcast predict --trace FILE` writes |

The API takes the commands' options as query parameters (`--global-batch` is `global_batch`, flags are
`analytical_only=true`): the parameters of an endpoint are the options of its command (pipeline/options.py) but
those naming a file, which the server does not read for a caller (`query_parameters`). It builds the command's
options object, calls the functions the commands (and `import stepcast`) call, pipeline.api, and answers with the
same JSON, so the numbers are the CLI's. A Hugging Face config.json (or a row of the architectures schema) can
stand in for `model` as the `arch_json` parameter: the text of the file, which `--arch-file` would read. Bad input is HTTP 400 with the message the CLI prints
(`{"error": ...}`, an `api.InputError`); valid input without an answer (`api.NoResult`: a search with no
feasible layout, a frontier with no trainable level) is 422 with the CLI's message.

A request must name this server in its Host header: localhost, 127.0.0.1, [::1] or the address it was bound to,
with its port (served on every interface, 0.0.0.0 or ::, any IP address); any other name is 403, so that a web
page whose name an attacker points at this machine (DNS rebinding) cannot read the API from a visitor's browser.
Numbers arrive checked: a query parameter out of its option's bounds (pipeline.options.check_bounds), NaN,
Infinity or an integer of thousands of digits in `arch_json` or `calibrate_json` (models.core.limits.strict_json)
is 400 naming it.

Bounds: GET only, no request body, a query string of at most MAX_QUERY_BYTES, at most MAX_GPUS accelerators
(and MAX_TOP layouts), at most WORKERS computations running and MAX_IN_FLIGHT admitted (more: 503), each
answered within the timeout (else 504; the abandoned computation still counts as in flight until it ends).
The server only reads: the promoted fit is read once from the snapshot at start-up (pin_promoted_fit), the
hardware and architecture tables come from measurements/ (cached by pipeline.catalog).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import math
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

import polars as pl
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from models.arch.archfile import ArchFileError, architecture_from_mapping
from models.core.limits import JSONRefused, strict_json
from models.physics.hardware import resolve_hardware
from models.planning.curves import default_dtype
from pipeline import api, catalog
from pipeline.api import InputError, NoResult
from pipeline.calibrated import pin_promoted_fit
from pipeline.options import CurveOptions, FrontierOptions, Options, PredictOptions, SearchOptions
from pipeline.output import json_rows
from pipeline.settings import Settings
from reports.site import BUNDLE, _bundle

EXPLORER = Path(__file__).resolve().parent / "explorer"
MAX_QUERY_BYTES = 16_384  # a pasted config.json is 1-3 KB
MAX_GPUS = 131_072  # accelerators in one request (--gpus, --max-gpus): 8x the largest preset
MAX_TOP = 100  # layouts one search returns
WORKERS = 2  # computations at once: the cores of the development machine
MAX_IN_FLIGHT = 6  # admitted computations, running or queued (or timed out and still running)
REQUEST_TIMEOUT_S = 30.0
MAX_ACCELERATORS = 4  # side by side on the page (each is its own request)
LOOPBACK = ("127.0.0.1", "::1", "localhost")
SECURITY_HEADERS = {
    # everything from this origin: no CDN, no request leaving the server (vega compiles expressions: eval)
    "content-security-policy": "default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; "
                               "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


# ------------------------------------------------------------------ query parameters (the CLI's option names)

def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _int(name: str, text: str, lo: int = 1, hi: Optional[int] = None) -> int:
    try:
        v = int(text)
    except ValueError:
        raise InputError(f"Invalid value for '{_flag(name)}': '{text}' is not a valid integer.") from None
    if v < lo or (hi is not None and v > hi):
        rng = f"x>={lo}" if hi is None else f"{lo}<=x<={hi}"
        raise InputError(f"Invalid value for '{_flag(name)}': {v} is not in the range {rng}.")
    return v


def _float(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InputError(f"Invalid value for '{_flag(name)}': '{text}' is not a valid float.") from None


def _bool(name: str, text: str) -> bool:
    t = text.strip().lower()
    if t in ("", "1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise InputError(f"Invalid value for '{_flag(name)}': '{text}' is not a valid boolean.")


def _str(name: str, text: str) -> str:
    return text


#: the explorer's upper bounds on the work one request asks for
UPPER = {"gpus": MAX_GPUS, "max_gpus": MAX_GPUS, "top": MAX_TOP}
PARSERS: dict[Any, Callable] = {int: _int, float: _float, bool: _bool, str: _str}


def query_parameters(options: type[Options]) -> dict[str, Callable]:
    """The query parameters of a command's endpoint, each with its parser: the options of `options` (a whole number
    at least its lower bound, else 1, and at most UPPER's), `arch_json` after `model` where the command takes an
    architecture. Not the options naming a file (--arch-file, --hardware-file, --runs): the server reads no file a
    request names."""
    out: dict[str, Callable] = {}
    for o in options.fields():
        if o.name == "calibrate_on":  # the runs themselves, as JSON records (`calibrate_json`), not a file's name
            out["calibrate_json"] = _str
        if o.type is Path:
            continue
        parse = PARSERS[o.type]
        if o.type is int:
            lo = 1 if o.min is None else int(o.min)
            parse = functools.partial(_int, lo=lo, hi=UPPER.get(o.name))
        out[o.name] = parse
        if o.name == "model":
            out["arch_json"] = _str
    return out


PREDICT_PARAMS = query_parameters(PredictOptions)
SEARCH_PARAMS = query_parameters(SearchOptions)
CURVE_PARAMS = query_parameters(CurveOptions)
FRONTIER_PARAMS = query_parameters(FrontierOptions)


def parse_query(pairs: list[tuple[str, str]], spec: dict[str, Callable], endpoint: str) -> dict[str, Any]:
    """Typed parameters from the query string; `global-batch` and `global_batch` are one name. An unknown,
    repeated or ill-typed parameter is an InputError naming it."""
    out: dict[str, Any] = {}
    for raw, text in pairs:
        name = raw.strip().lstrip("-").replace("-", "_")
        if name not in spec:
            raise InputError(f"unknown parameter '{raw}' for {endpoint}; expected one of {', '.join(spec)}")
        if name in out:
            raise InputError(f"parameter '{name}' given twice")
        out[name] = spec[name](name, text)
    return out


# ------------------------------------------------------------------ the four answers (the CLI's functions)

def _json_parameter(q: dict, name: str, fits: Callable[[Any], bool], expected: str):
    """The parsed JSON of query parameter `name` (removed from `q`), None when absent; InputError naming the parameter
    when it is not JSON or `fits` refuses it (`expected` says what it takes)."""
    text = q.pop(name, None)
    if text is None:
        return None
    try:  # NaN, Infinity, integers beyond 2^53 refused naming their key
        obj = strict_json(text)
    except JSONRefused as err:
        raise InputError(f"{name}: {err}") from None
    if not fits(obj):
        raise InputError(f"{name}: expected {expected}")
    return obj


def _arch(q: dict) -> Optional[dict]:
    """The mapping of `arch_json` (a pasted config.json or schema row, as --arch-file reads it), else None; a field
    the architecture reader refuses (a value past its bound, a missing key) is an InputError naming `arch_json`."""
    obj = _json_parameter(q, "arch_json", lambda o: isinstance(o, dict), "a JSON object (a Hugging Face config.json "
                          "or a row of the architectures schema)")
    if obj is not None:
        try:
            architecture_from_mapping(obj, "arch_json")
        except ArchFileError as err:
            raise InputError(str(err)) from None
    return obj


def _request(options: type[Options], q: dict) -> tuple[Options, Optional[dict]]:
    """(the command's options object, the architecture of `arch_json` or None) of a parsed query; a required option
    missing is an InputError with typer's message."""
    for o in options.fields():
        if o.required and q.get(o.name) is None:
            raise InputError(f"Missing option '{_flag(o.name)}'.")
    arch = _arch(q)
    runs = _calibration_runs(q)
    if runs is not None:
        q["calibrate_on"] = runs
    return options(**q), arch


def _calibration_runs(q: dict):
    """The runs of `calibrate_json` (a JSON array of records in the measurement schema, or the spellings
    `predict --runs` reads: what a FILE for --calibrate-on holds) as a frame of text cells, else None; a bad cell is
    named by its record number (`pipeline.adaptation.from_file`)."""
    obj = _json_parameter(q, "calibrate_json", lambda o: isinstance(o, list) and bool(o) and all(
        isinstance(r, dict) for r in o), "a JSON array of run records (objects with run_id, model_name, gpu, "
        "n_gpus, ..., metric and value)")
    if obj is None:
        return None
    cols = sorted({k for r in obj for k in r})
    rows = [{c: (None if r.get(c) is None else str(r.get(c))) for c in cols} for r in obj]
    return pl.DataFrame(rows, schema={c: pl.Utf8 for c in cols})  # its records numbered by pipeline.adaptation


def predict_json(cfg: Settings, q: dict) -> list[dict]:
    """`stepcast predict --format json` for one configuration."""
    o, arch = _request(PredictOptions, q)
    return json_rows(api.prediction(cfg, o, arch=arch))


def search_json(cfg: Settings, q: dict) -> list[dict]:
    """`stepcast search --format json`."""
    o, arch = _request(SearchOptions, q)
    result, _, _, _ = api.layout_search(cfg, o, arch=arch)
    return json_rows(result)


def curve_json(cfg: Settings, q: dict) -> dict:
    """`stepcast curve --format json`."""
    o, arch = _request(CurveOptions, q)
    doc, _ = api.scaling_curve(cfg, o, arch=arch)
    return api.curve_document(doc)


def frontier_json(cfg: Settings, q: dict) -> dict:
    """`stepcast frontier --format json` (`table=true`: with every level, as `--table`)."""
    o, _ = _request(FrontierOptions, q)
    result, sweep, _ = api.compute_frontier(cfg, o)
    return api.frontier_document(result, sweep, o.table)


def trace_json(cfg: Settings, q: dict) -> dict:
    """The timeline of one step of the configuration /api/predict predicts (`stepcast predict --trace FILE`'s
    document: `traceEvents`, pipeline.trace)."""
    o, arch = _request(PredictOptions, q)
    return api.step_trace(cfg, o, arch=arch)


ENDPOINTS: dict[str, tuple[dict, Callable]] = {
    "/api/predict": (PREDICT_PARAMS, predict_json),
    "/api/trace": (PREDICT_PARAMS, trace_json),
    "/api/search": (SEARCH_PARAMS, search_json),
    "/api/curve": (CURVE_PARAMS, curve_json),
    "/api/frontier": (FRONTIER_PARAMS, frontier_json),
}


def finite(obj):
    """NaN and infinities as null, so that a browser's JSON.parse reads the answer."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


# ------------------------------------------------------------------ the page and the bundle

def vega_bundle(cfg: Settings) -> bytes:
    """The report site's Vega bundle: the built site's copy when there is one, else made the way the site
    makes it (reports.site._bundle, vl-convert's offline bundle)."""
    built = cfg.reports / BUNDLE
    if built.is_file():
        return built.read_bytes()
    return _bundle().encode("utf-8")


def predictable_arch(row: dict) -> bool:
    """A named architecture the model can answer for: every row except hybrids without a Mamba shape (Mamba-2:
    mamba_n_heads; Mamba-1, Jamba: mamba_dt_rank), refused by the step-time model with that reason."""
    return "hybrid" not in str(row.get("arch") or "") or finite(row.get("mamba_n_heads")) is not None \
        or finite(row.get("mamba_dt_rank")) is not None


def boot_data(cfg: Settings) -> dict:
    """What the page needs before its first request: the named models and accelerators, limits."""
    arch = catalog.architectures(cfg.measurements)
    models = [{"id": r["id"], "name": r.get("name"), "params_b": finite(r.get("params_b")), "arch": r.get("arch")}
              for r in arch.iter_rows(named=True) if predictable_arch(r)]
    hw = resolve_hardware(catalog.hardware(cfg.measurements), strict=False)
    keep = ("id", "name", "memory_gb", "scaleup_size", "intra_node_bw_gbps", "inter_node_bw_gbps",
            "cloud_usd_per_hour", "release_year")
    gpus = [{**{k: finite(r.get(k)) for k in keep}, "default_dtype": default_dtype(r)}
            for r in hw.iter_rows(named=True) if not r.get("hardware_error")]
    return {"models": models, "gpus": gpus,
            "limits": {"max_gpus": MAX_GPUS, "max_accelerators": MAX_ACCELERATORS, "max_top": MAX_TOP,
                       "max_query_bytes": MAX_QUERY_BYTES}}


def explorer_page(cfg: Settings) -> bytes:
    html = (EXPLORER / "index.html").read_text(encoding="utf-8")
    data = json.dumps(boot_data(cfg), separators=(",", ":")).replace("</", "<\\/")
    return html.replace("/*BOOT*/null", data).encode("utf-8")


# ------------------------------------------------------------------ the app

class Explorer:
    """The state the app keeps from start-up: settings, the pinned fit, page and bundle, the worker pool."""

    def __init__(self, cfg: Settings, *, timeout_s: float = REQUEST_TIMEOUT_S, bundle: Optional[bytes] = None):
        self.cfg = cfg
        self.timeout_s = timeout_s
        self.fit = pin_promoted_fit(cfg)
        self.page = explorer_page(cfg)
        self.bundle = bundle if bundle is not None else vega_bundle(cfg)
        self.pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="stepcast-serve")
        self.lock = threading.Lock()
        self.in_flight = 0
        self._warm()

    def _warm(self) -> None:
        """Import the model and answer one small request, so that the first visitor does not wait for it."""
        try:
            curve_json(self.cfg, {"model": "llama3-8b", "gpu": "h100-sxm5-80gb", "max_gpus": 64})
        except Exception as err:  # noqa: BLE001 - a warm-up failing must not stop the server; requests will say why
            print(f"warning: warm-up request failed: {err}", file=sys.stderr)

    def admit(self) -> bool:
        with self.lock:
            if self.in_flight >= MAX_IN_FLIGHT:
                return False
            self.in_flight += 1
            return True

    def release(self, _future=None) -> None:
        with self.lock:
            self.in_flight -= 1

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def create_app(cfg: Settings, *, timeout_s: float = REQUEST_TIMEOUT_S, bundle: Optional[bytes] = None,
               host: str = "127.0.0.1"):
    """The Starlette app: the page, the bundle and the four API endpoints (module docstring); `host` is the
    address the server is bound to (the Host headers it answers: `Bounded`)."""
    ex = Explorer(cfg, timeout_s=timeout_s, bundle=bundle)

    def respond(body: bytes, media: str, status: int = 200, extra: Optional[dict] = None) -> Response:
        return Response(body, status_code=status, media_type=media, headers={**SECURITY_HEADERS, **(extra or {})})

    def error(status: int, message: str, extra: Optional[dict] = None) -> Response:
        return JSONResponse({"error": message}, status_code=status, headers={**SECURITY_HEADERS, **(extra or {})})

    async def page(request):
        return respond(ex.page, "text/html; charset=utf-8")

    async def bundle_js(request):
        return respond(ex.bundle, "text/javascript; charset=utf-8", extra={"cache-control": "max-age=3600"})

    async def answer_api(request):
        spec, answer = ENDPOINTS[request.url.path]
        try:
            q = parse_query(request.query_params.multi_items(), spec, request.url.path)
        except InputError as err:
            return error(400, str(err))
        if not ex.admit():
            return error(503, f"busy: {MAX_IN_FLIGHT} computations already in flight; retry in a moment",
                         {"retry-after": "2"})
        fut = ex.pool.submit(answer, ex.cfg, q)
        fut.add_done_callback(ex.release)
        try:
            doc = await asyncio.wait_for(asyncio.wrap_future(fut), ex.timeout_s)
        except asyncio.TimeoutError:
            return error(504, f"{request.url.path}: no answer within {ex.timeout_s:g} s; ask for less (fewer "
                              "accelerators, fix a layout dimension)")
        except NoResult as err:
            return error(422, str(err))
        except InputError as err:
            return error(400, str(err))
        body = json.dumps(finite(doc), default=str).encode("utf-8")
        return respond(body, "application/json")

    routes = [Route("/", page, methods=["GET", "HEAD"]), Route(f"/{BUNDLE}", bundle_js, methods=["GET", "HEAD"])]
    routes += [Route(path, answer_api, methods=["GET"]) for path in ENDPOINTS]
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        ex.close()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.explorer = ex
    return Bounded(app, host)


WILDCARDS = ("0.0.0.0", "::", "")


def _host_name(value: str) -> tuple[str, Optional[str]]:
    """(name, port or None) of a Host header: `[::1]:8765` is ('::1', '8765'), `localhost` ('localhost', None)."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        return name, rest[1:] if rest.startswith(":") else None
    name, sep, port = value.rpartition(":")
    return (name, port) if sep and ":" not in name else (value, None)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class Bounded:
    """ASGI guard in front of the app: this server's name in the Host header, GET/HEAD only, no body, a bounded
    query string and path."""

    def __init__(self, app, host: str = "127.0.0.1"):
        self.app = app
        self.bound = host.strip().strip("[]").lower()
        self.names = {*LOOPBACK, self.bound}

    def host_problem(self, headers: dict, scope) -> Optional[tuple[int, str]]:
        """(status, message) when the Host header does not name this server at its port, else None."""
        raw = headers.get(b"host")
        if raw is None:
            return 400, "no Host header: name this server (e.g. 127.0.0.1 and its port)"
        text = raw.decode("latin-1")
        name, port = _host_name(text)
        server_port = (scope.get("server") or (None, None))[1]
        name_ok = name.rstrip(".") in self.names or (self.bound in WILDCARDS and _is_ip(name))
        port_ok = server_port is None or port == str(server_port) or (port is None and server_port == 80)
        if name_ok and port_ok:
            return None
        shown = text if len(text) <= 100 else text[:100] + "..."
        expected = ", ".join(sorted(self.names - set(WILDCARDS))) + (
            " or any IP address" if self.bound in WILDCARDS else "")
        return 403, (f"Host '{shown}' is not this server: the explorer answers only {expected} (port {server_port}); "
                     "a page under another name cannot read it")

    @staticmethod
    def request_problem(headers: dict, scope) -> Optional[tuple[int, str]]:
        """(status, message) of a request the explorer does not take (a method but GET, a body, a long query
        string or path), else None."""
        length = headers.get(b"content-length", b"0")
        if scope["method"] not in ("GET", "HEAD"):
            return 405, "only GET: the explorer reads, it never writes"
        if len(scope.get("query_string") or b"") > MAX_QUERY_BYTES:
            return 414, f"query string over {MAX_QUERY_BYTES:,} bytes"
        if length.strip() not in (b"", b"0") or b"transfer-encoding" in headers:
            return 413, "no request body accepted"
        if len(scope.get("raw_path") or b"") > 256:
            return 414, "path too long"
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            problem = self.host_problem(headers, scope) or self.request_problem(headers, scope)
            if problem:
                body = json.dumps({"error": problem[1]}).encode()
                await send({"type": "http.response.start", "status": problem[0],
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
                            + [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(cfg: Settings, *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Start the explorer and serve until interrupted."""
    if not is_loopback(host):
        print(f"warning: serving on {host}: anyone who can reach port {port} of this machine can use the explorer "
              "(read-only, no authentication, no encryption). Use the default 127.0.0.1 to keep it to yourself.",
              file=sys.stderr)
    print("stepcast serve: loading the fit, the tables and the Vega bundle ...", file=sys.stderr)
    app = create_app(cfg, host=host)
    fit = app.app.state.explorer.fit
    print(f"fit: {getattr(fit, 'version', None) or 'none (analytical priors)'} (read from {cfg.snapshot} "
          f"or {cfg.store}, once)", file=sys.stderr)
    shown = f"[{host}]" if ":" in host else host
    print(f"explorer: http://{shown}:{port}/  (Ctrl-C stops it)", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", h11_max_incomplete_event_size=32_768,
                timeout_keep_alive=5)
