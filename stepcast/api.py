"""The functions of `import stepcast`: each is one command of the CLI, computed by the same function of
`pipeline.api` the command calls, returning what the command's `--format json` prints as polars / Python
values instead of text.

Keyword arguments are the command's options with the same names and defaults (`--global-batch` ->
`global_batch`): each function's keywords are its command's options of pipeline/options.py, from which the
function builds the command's options object, as the CLI and the explorer do. Beside them: `arch` (an
architecture as a path or a row, for `--arch-file`), `store=` (the global `--store`), and for `predict` lists of
models, accelerators and sizes. `hardware_file` also takes a row. The flags that only shape the printout
(`--format`, `--out`) have no keyword.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Optional, Union

import polars as pl

from pipeline import api
from pipeline.api import InputError
from pipeline.options import (CurveOptions, FrontierOptions, Options, PlanOptions, PredictOptions, SearchOptions,
                              check_bounds)
from pipeline.settings import Settings

PathLike = Union[str, Path]
Source = Union[None, PathLike, Mapping]  # a file, or its row (an architecture: its Hugging Face config) as a dict
RunsSource = Union[None, pl.DataFrame, PathLike]  # runs: a file in the measurement schema, or its rows as a frame


def _keywords(options: type[Options], types: Optional[Mapping[str, Any]] = None,
              **extra: tuple[Any, Any]) -> Callable:
    """Decorator: `fn(**keywords)` as a function of the keywords of `options`' fields (the CLI's names and
    defaults; typed as `types` says where the Python API takes more than the CLI) and `extra` (name: (type,
    default)). An unknown keyword is a TypeError, as for a written-out signature; `fn` receives every keyword,
    defaults filled in."""
    types = types or {}
    params = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default,
                                annotation=types.get(o.name, Optional[PathLike] if o.type is Path else o.annotation))
              for o in options.fields()]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
               for name, (kind, default) in extra.items()]

    def decorate(fn: Callable) -> Callable:
        signature = inspect.Signature(params, return_annotation=inspect.signature(fn).return_annotation)

        @functools.wraps(fn)
        def call(**keywords):
            bound = signature.bind(**keywords)
            bound.apply_defaults()
            return fn(**bound.arguments)

        call.__signature__ = signature
        return call

    return decorate


def _check(options: type[Options], values: Mapping[str, Any]) -> None:
    """The bounds of the command's options (pipeline.options.check_bounds, as the CLI and the explorer check
    them); then the options the command requires."""
    check_bounds(options, values)
    missing = [o.long_flag for o in options.fields() if o.required and values.get(o.name) is None]
    if missing:
        raise InputError(f"missing {', '.join(missing)}")


def _build(options: type[Options], values: Mapping[str, Any]) -> Options:
    """The options object of checked values, a path given as text read as a Path."""
    kinds = {o.name: o.type for o in options.fields()}
    return options(**{k: Path(v) if kinds[k] is Path and isinstance(v, str) else v for k, v in values.items()})


def _settings(store: Optional[PathLike]) -> Settings:
    """The command's settings: `store` as `--store` (None: STEPCAST_STORE, else out/stepcast.duckdb)."""
    return Settings.load(store=store)


def _source(value: Source) -> tuple[Optional[Path], Optional[Mapping]]:
    """(file, mapping) of an `arch=` / `hardware_file=` argument: a path to a file or the row itself."""
    if value is None:
        return None, None
    if isinstance(value, Mapping):
        return None, value
    if isinstance(value, (str, Path)):
        return Path(value), None
    raise InputError(f"expected a path or a dict, got {type(value).__name__}")


def _architecture(arch: Source, arch_file: Optional[PathLike]) -> tuple[Optional[Path], Optional[Mapping]]:
    """(file, mapping) of the architecture: `arch` (a path or a row) or `arch_file` (a path, the CLI's name)."""
    if arch is not None and arch_file is not None:
        raise InputError("arch and arch_file both given: give one (arch takes a path or a row, arch_file a path)")
    return _source(arch if arch is not None else arch_file)


def _many(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


@_keywords(PredictOptions, types={"model": Union[None, str, Sequence[str]], "gpu": Union[None, str, Sequence[str]],
                                  "gpus": Union[None, int, Sequence[int]], "hardware_file": Source,
                                  "runs": Union[None, pl.DataFrame, PathLike],
                                  "calibrate_on": RunsSource},
           arch=(Source, None), store=(Optional[PathLike], None))
def predict(*, model, gpu, gpus, arch, arch_file, hardware_file, runs, store, **options) -> pl.DataFrame:
    """Step time, throughput, MFU, memory and the time breakdown of a configuration (`stepcast predict`).

    One row per configuration with exactly the columns and values of `stepcast predict --format json`: the
    prediction with its 90% interval (`step_time_lo_s` .. `step_time_hi_s`), which parameters answered
    (`fit_version`), under which `assumptions` (with every default applied) and whether the configuration is
    inside the fit's domain (`calibration_domain`). `model`, `gpu` and `gpus` also take lists: one row per
    combination, in order. `arch` is an architecture instead of `model`: a path to a Hugging Face config.json
    or a row of the architectures schema (CSV/JSON), or that row / config as a dict (`arch_file`: a path, as
    the CLI's `--arch-file`); `hardware_file` likewise for the accelerator. A configuration that does not fit
    in memory is a row with `feasible` false; an invalid one (e.g. tp x pp x cp x dp != gpus) raises InputError
    with the reason. The network keywords (`scaleup_size`, `scaleup_gbps`, `scaleout_gbps`, `oversubscription`,
    `pod_size`) are the CLI's flags: 3 = a 3:1 oversubscribed fat-tree above pods of `pod_size` accelerators
    (none: above every scale-up domain). `tp_mode="2d"` splits d_model and d_ff over a grid of the tp ranks;
    `layers_16bit` keeps that many layers at the end of a low-precision recipe in BF16. MoE: `etp` (expert
    tensor-parallel degree, default tp) and `capacity_factor` (default dropless) are the CLI's `--etp` and
    `--capacity-factor`. `runs` is `predict_frame(runs)` (`--runs FILE`: the other options but `assumptions`,
    `analytical_only`, `calibrate_on` and `source` do not apply). `calibrate_on` (a run file's path, or a frame in
    the measurement schema) adapts the served fit to your cluster's runs, `source` to a stored source's
    (`stepcast list sources`); `stack` names the training stack (`stepcast list stacks`). `trace` (a path) also
    writes the timeline of one optimizer step there, a Chrome / Perfetto trace (docs/timeline.md).

    >>> import stepcast
    >>> df = stepcast.predict(model="llama3-70b", gpu="h100", gpus=[512, 1024], global_batch=1024,
    ...                       seq_len=8192, tp=8, pp=4)
    >>> df.select("n_gpus", "dp", "feasible").rows()
    [(512, 16, True), (1024, 32, True)]
    """
    if runs is not None and options["trace"] is not None:
        raise InputError("trace draws one configuration's step; not with runs")
    if runs is not None:
        return predict_frame(runs, assumptions=options["assumptions"], analytical_only=options["analytical_only"],
                             calibrate_on=options["calibrate_on"], source=options["source"], store=store)
    every = [dict(options, model=m, gpu=g, gpus=n) for m, g, n in itertools.product(_many(model), _many(gpu),
                                                                                   _many(gpus))]
    for values in every:
        _check(PredictOptions, values)
    if len(every) > 1 and options["trace"] is not None:
        raise InputError(f"trace draws one configuration's step; {len(every)} configurations given (one model, gpu "
                         "and gpus each)")
    cfg = _settings(store)
    arch_path, arch_row = _architecture(arch, arch_file)
    hw_path, hw_row = _source(hardware_file)
    frames = [api.prediction(cfg, _build(PredictOptions, dict(values, arch_file=arch_path, hardware_file=hw_path)),
                             arch=arch_row, hardware=hw_row)
              for values in every]
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")


def predict_frame(frame: Union[pl.DataFrame, PathLike], *, assumptions: str = "realistic",
                  analytical_only: bool = False, calibrate_on: Union[None, pl.DataFrame, PathLike] = None,
                  source: Optional[str] = None, store: Optional[PathLike] = None) -> pl.DataFrame:
    """Many configurations at once (`stepcast predict --runs FILE`), through the one vectorized prediction
    function (`models.fitting.predictor.predict`).

    `frame` is a polars DataFrame in the measurement schema (measurements/measured_runs.csv: `run_id`, `gpu`,
    `model_name`, `n_gpus`, `tp`, `pp`, `global_batch_seqs`, `seq_len`, ...; values of any type, read as a file's
    cells are) or a path to such a file (CSV/TSV, Parquet, JSON, JSON Lines or a Markdown pipe table). One row
    per distinct run_id, in order: the prediction, or in `error` why it cannot be made; where a row carries a
    measurement (`metric`, `value`), the measured throughput and `error_pct` beside it. Unstated fields are inferred by documented rules, listed in
    `assumptions`.

    >>> import polars as pl, stepcast
    >>> runs = pl.DataFrame({"run_id": ["a", "b"], "model_name": ["llama3-8b", "llama3-70b"],
    ...                      "gpu": ["h100-sxm5-80gb"] * 2, "n_gpus": [8, 64], "tp": [1, 8], "pp": [1, 4],
    ...                      "global_batch_seqs": [64, 256], "seq_len": [8192, 8192],
    ...                      "sharding": ["zero1", "zero1"]})
    >>> stepcast.predict_frame(runs).select("run_id", "feasible").rows()
    [('a', True), ('b', True)]
    """
    return api.run_predictions(_settings(store), frame if isinstance(frame, pl.DataFrame) else Path(frame),
                               assumptions=assumptions, analytical_only=analytical_only,
                               calibrate_on=calibrate_on if calibrate_on is None or isinstance(calibrate_on, pl.DataFrame)
                               else Path(calibrate_on), source=source)


@_keywords(SearchOptions, types={"hardware_file": Source, "calibrate_on": RunsSource}, arch=(Source, None),
           store=(Optional[PathLike], None))
def search(*, arch, arch_file, hardware_file, store, **options) -> pl.DataFrame:
    """The best feasible layouts of a model on `gpus` accelerators, best first (`stepcast search`).

    Every valid layout (tp, pp, dp, cp, ep, interleave, micro-batch, sharding, recompute) is predicted; those
    that do not fit in memory are dropped; the rest are ranked by throughput (`rank_by="cost"`: GPU-time per
    token) and the first `top` returned with `rank`, the columns of `stepcast search --format json`. Fix a
    dimension with its keyword (`tp=8`, `tp_mode="2d"`, `sharding="fsdp"`). The architecture is `model`, `arch`
    (path or dict, as in `predict`; `arch_file` a path) or the shape keywords (`layers`, `d_model`, `heads`, ...).
    `scaleup_size`, `scaleup_gbps`, `scaleout_gbps`, `oversubscription` and `pod_size` override the accelerator's
    network tiers (as in `curve`); the ranking is computed with them. Raises NoResult when no layout fits.

    >>> import stepcast
    >>> best = stepcast.search(model="gpt3-175b", gpu="a100-sxm4-80gb", gpus=1024, global_batch=1536,
    ...                        seq_len=2048, top=3)
    >>> best.height, best["rank"].to_list()
    (3, [1, 2, 3])
    """
    _check(SearchOptions, options)
    arch_path, arch_row = _architecture(arch, arch_file)
    hw_path, hw_row = _source(hardware_file)
    o = _build(SearchOptions, dict(options, arch_file=arch_path, hardware_file=hw_path))
    result, _, _, _ = api.layout_search(_settings(store), o, arch=arch_row, hardware=hw_row)
    return result


@_keywords(CurveOptions, types={"calibrate_on": RunsSource}, arch=(Source, None), store=(Optional[PathLike], None))
def curve(*, arch, arch_file, store, **options) -> dict:
    """A scaling curve: the best layout at each cluster size from one node to `max_gpus` (`stepcast curve`).

    Returns the document `stepcast curve --format json` prints: `model`, `gpu`, `assumptions`, `batch_rule`,
    `policy`, `seq_len`, `tokens`, `calibration`, `inflection` (the smallest N whose marginal efficiency is
    below `threshold`, with a USL fit), `explanation`, and `points`, here a polars DataFrame (one row per N:
    layout, throughput, MFU, time-to-train, cost, parallel and marginal efficiency). `gpu` is required.

    >>> import stepcast
    >>> c = stepcast.curve(model="llama3-8b", gpu="h100-sxm5-80gb", max_gpus=256)
    >>> c["points"]["n_gpus"].to_list()[:4]
    [8, 16, 24, 32]
    """
    _check(CurveOptions, options)
    arch_path, arch_row = _architecture(arch, arch_file)
    doc, _ = api.scaling_curve(_settings(store), _build(CurveOptions, dict(options, arch_file=arch_path)),
                               arch=arch_row)
    return doc


@_keywords(FrontierOptions, store=(Optional[PathLike], None))
def frontier(*, store, **options) -> dict:
    """The largest training compute one accelerator type trains within `months` at good utilization
    (`stepcast frontier`).

    Returns the document `stepcast frontier --format json` prints (`max_training_flop`, `n_gpus`, the layout,
    `utilization`, `params`, `tokens`, `cost_usd`, what binds, what ends it (`ended_by`, `ended_by_reason`), the
    frontier under each critical-batch law (`batch_rules`), the breakdown, ...; NaN as None). With
    `table=True` it also has `levels`, here a polars DataFrame: every compute level swept. `tp_form` is the
    tensor-parallel form the layouts may use (1d, 2d or any). Raises NoResult when no compute level is
    trainable.

    >>> import stepcast
    >>> f = stepcast.frontier(gpu="h100-sxm5-80gb", months=3)
    >>> f["max_training_flop"] > 1e24
    True
    """
    _check(FrontierOptions, options)
    o = _build(FrontierOptions, options)
    result, sweep, _ = api.compute_frontier(_settings(store), o)
    out = {k: api.clean(v) for k, v in result.items()}
    if o.table:
        out["levels"] = api.frontier_levels(sweep)
    return out


@_keywords(PlanOptions, types={"hardware": Union[None, str, Sequence[str]],
                               "calibrate_on": RunsSource}, arch=(Source, None),
           store=(Optional[PathLike], None))
def plan(*, arch, arch_file, hardware, store, **options) -> pl.DataFrame:
    """Hardware x cluster size x layout ranked by cost within a deadline, or by time within a budget
    (`stepcast plan`).

    The rows of `stepcast plan --format json`: days (with the expected interruptions of a cluster that size;
    `days_ideal` without), dollars, energy, MFU and, with a promoted fit, the interval `days_lo..days_hi`.
    `hardware` is a list of accelerator names (or the CLI's comma-separated string); default: every one
    with a price; the network keywords override every accelerator's tiers (as in `search`). `optimal=True`
    chooses the model size too (Chinchilla) for `budget_usd`. Raises NoResult
    when no option meets the ask (the message says what the fastest and cheapest found need). Without a
    deadline or budget, plans past a year are ranked last with a warning (`warnings.warn`).

    >>> import stepcast
    >>> p = stepcast.plan(model="llama3-70b", tokens=15e12, deadline_days=90, top=3)
    >>> p["rank"].to_list(), bool((p["days"] <= 90).all())
    ([1, 2, 3], True)
    """
    _check(PlanOptions, options)
    if hardware is not None and not isinstance(hardware, str):
        hardware = ",".join(hardware)
    arch_path, arch_row = _architecture(arch, arch_file)
    o = _build(PlanOptions, dict(options, hardware=hardware, arch_file=arch_path))
    result, _ = api.training_plan(_settings(store), o, arch=arch_row,
                                  warn=lambda message: warnings.warn(message, stacklevel=3))
    return result
