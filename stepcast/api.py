"""The functions of `import stepcast`: each is one command of the CLI, computed by the same function of
`pipeline.api` the command calls, returning what the command's `--format json` prints as polars / Python
values instead of text.

Keyword arguments are the command's flags with the same defaults (`--global-batch` -> `global_batch`,
`--arch-file` -> `arch`, `--hardware-file` -> `hardware_file`, `--runs` -> `predict_frame`); the flags that
only shape the printout (`--format`, `--out`) have no keyword. `store=` is the global `--store`.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import polars as pl

from pipeline import api
from pipeline.api import InputError
from pipeline.settings import Settings

PathLike = Union[str, Path]


def _settings(store: Optional[PathLike]) -> Settings:
    """The command's settings: `store` as `--store` (None: STEPCAST_STORE, else out/stepcast.duckdb)."""
    return Settings.load(store=store)


def _source(value: Union[None, PathLike, Mapping]) -> tuple[Optional[Path], Optional[Mapping]]:
    """(file, mapping) of an `arch=` / `hardware_file=` argument: a path to a file or the row itself."""
    if value is None:
        return None, None
    if isinstance(value, Mapping):
        return None, value
    if isinstance(value, (str, Path)):
        return Path(value), None
    raise InputError(f"expected a path or a dict, got {type(value).__name__}")


def _at_least(**flags: tuple[Any, float]) -> None:
    """The lower bounds the command's options declare (`min=` in the CLI), with typer's wording."""
    for name, (value, low) in flags.items():
        if value is not None and not value >= low:
            raise InputError(f"Invalid value for '--{name.replace('_', '-')}': Input should be greater than or "
                             f"equal to {low:g}")


def _many(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def predict(*, model: Union[None, str, Sequence[str]] = None, gpu: Union[None, str, Sequence[str]] = None,
            gpus: Union[None, int, Sequence[int]] = None, global_batch: Optional[int] = None,
            seq_len: Optional[int] = None, micro_batch: Optional[int] = None, tp: int = 1, pp: int = 1,
            dp: Optional[int] = None, cp: int = 1, ep: int = 1, vpp: Optional[int] = None, sharding: Optional[str] = None,
            recompute: Optional[str] = None, sequence_parallel: Optional[bool] = None, dtype: str = "bf16",
            gpus_per_node: Optional[int] = None, inter_node_gbps: Optional[float] = None,
            arch: Union[None, PathLike, Mapping] = None, hardware_file: Union[None, PathLike, Mapping] = None,
            assumptions: str = "realistic", analytical_only: bool = False,
            scaleup_size: Optional[int] = None, scaleup_gbps: Optional[float] = None,
            scaleout_gbps: Optional[float] = None, oversubscription: Optional[float] = None,
            pod_size: Optional[int] = None, store: Optional[PathLike] = None, etp: Optional[int] = None,
            capacity_factor: Optional[float] = None) -> pl.DataFrame:
    """Step time, throughput, MFU, memory and the time breakdown of a configuration (`stepcast predict`).

    One row per configuration with exactly the columns and values of `stepcast predict --format json`: the
    prediction with its 90% interval (`step_time_lo_s` .. `step_time_hi_s`), which parameters answered
    (`fit_version`), under which `assumptions` (with every default applied) and whether the configuration is
    inside the fit's domain (`calibration_domain`). `model`, `gpu` and `gpus` also take lists: one row per
    combination, in order. `arch` is an architecture instead of `model`: a path to a Hugging Face config.json
    or a row of the architectures schema (CSV/JSON), or that row / config as a dict; `hardware_file` likewise
    for the accelerator. A configuration that does not fit in memory is a row with `feasible` false; an
    invalid one (e.g. tp x pp x cp x dp != gpus) raises InputError with the reason. The network keywords
    (`scaleup_size`, `scaleup_gbps`, `scaleout_gbps`, `oversubscription`, `pod_size`) are the CLI's flags: 3 =
    a 3:1 oversubscribed fat-tree above pods of `pod_size` accelerators (none: above every scale-up domain).
    MoE: `etp` (expert tensor-parallel degree, default tp) and `capacity_factor` (default dropless) are the CLI's
    `--etp` and `--capacity-factor`.

    >>> import stepcast
    >>> df = stepcast.predict(model="llama3-70b", gpu="h100", gpus=[512, 1024], global_batch=1024,
    ...                       seq_len=8192, tp=8, pp=4)
    >>> df.select("n_gpus", "dp", "feasible").rows()
    [(512, 16, True), (1024, 32, True)]
    """
    _at_least(gpus=(None if isinstance(gpus, (list, tuple)) else gpus, 1), global_batch=(global_batch, 1),
              seq_len=(seq_len, 1), micro_batch=(micro_batch, 1), tp=(tp, 1), pp=(pp, 1), dp=(dp, 1), cp=(cp, 1),
              ep=(ep, 1), vpp=(vpp, 1), gpus_per_node=(gpus_per_node, 1), inter_node_gbps=(inter_node_gbps, 0.001))
    for n in _many(gpus):
        _at_least(gpus=(n, 1))
    cfg = _settings(store)
    arch_file, arch_row = _source(arch)
    hw_file, hw_row = _source(hardware_file)
    frames = [api.prediction(cfg, model=m, gpu=g, gpus=n, global_batch=global_batch, seq_len=seq_len,
                             arch_file=arch_file, hardware_file=hw_file, arch=arch_row, hardware=hw_row,
                             micro_batch=micro_batch, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, sharding=sharding,
                             recompute=recompute, sequence_parallel=sequence_parallel, dtype=dtype,
                             gpus_per_node=gpus_per_node, inter_node_gbps=inter_node_gbps,
                             analytical_only=analytical_only, assumptions=assumptions, scaleup_size=scaleup_size,
                             scaleup_gbps=scaleup_gbps, scaleout_gbps=scaleout_gbps,
                             oversubscription=oversubscription, pod_size=pod_size, etp=etp,
                             capacity_factor=capacity_factor)
              for m, g, n in itertools.product(_many(model), _many(gpu), _many(gpus))]
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")


def predict_frame(frame: Union[pl.DataFrame, PathLike], *, assumptions: str = "realistic",
                  analytical_only: bool = False, store: Optional[PathLike] = None) -> pl.DataFrame:
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
                               assumptions=assumptions, analytical_only=analytical_only)


def search(*, model: Optional[str] = None, gpu: Optional[str] = None, gpus: Optional[int] = None,
           global_batch: Optional[int] = None, seq_len: Optional[int] = None, layers: Optional[int] = None,
           d_model: Optional[int] = None, heads: Optional[int] = None, kv_heads: Optional[int] = None,
           ffn_dim: Optional[int] = None, vocab: int = 51200, activation: str = "gelu",
           arch: Union[None, PathLike, Mapping] = None, hardware_file: Union[None, PathLike, Mapping] = None,
           dtype: str = "bf16", top: int = 10, rank_by: str = "throughput", tp: Optional[int] = None,
           pp: Optional[int] = None, dp: Optional[int] = None, cp: Optional[int] = None, ep: Optional[int] = None,
           vpp: Optional[int] = None, micro_batch: Optional[int] = None, sharding: Optional[str] = None,
           recompute: Optional[str] = None, assumptions: str = "realistic", analytical_only: bool = False,
           scaleup_size: Optional[int] = None, scaleup_gbps: Optional[float] = None,
           scaleout_gbps: Optional[float] = None, oversubscription: Optional[float] = None,
           pod_size: Optional[int] = None, store: Optional[PathLike] = None, etp: Optional[int] = None,
           capacity_factor: Optional[float] = None) -> pl.DataFrame:
    """The best feasible layouts of a model on `gpus` accelerators, best first (`stepcast search`).

    Every valid layout (tp, pp, dp, cp, ep, interleave, micro-batch, sharding, recompute) is predicted; those
    that do not fit in memory are dropped; the rest are ranked by throughput (`rank_by="cost"`: GPU-time per
    token) and the first `top` returned with `rank`, the columns of `stepcast search --format json`. Fix a
    dimension with its keyword (`tp=8`, `sharding="fsdp"`). The architecture is `model`, `arch` (path or
    dict, as in `predict`) or the shape keywords (`layers`, `d_model`, `heads`, ...). `scaleup_size`,
    `scaleup_gbps`, `scaleout_gbps`, `oversubscription` and `pod_size` override the accelerator's network tiers
    (as in `curve`); the ranking is computed with them. Raises NoResult
    when no layout fits.

    >>> import stepcast
    >>> best = stepcast.search(model="gpt3-175b", gpu="a100-sxm4-80gb", gpus=1024, global_batch=1536,
    ...                        seq_len=2048, top=3)
    >>> best.height, best["rank"].to_list()
    (3, [1, 2, 3])
    """
    _at_least(layers=(layers, 1), d_model=(d_model, 1), heads=(heads, 1), kv_heads=(kv_heads, 1),
              ffn_dim=(ffn_dim, 1), vocab=(vocab, 1), gpus=(gpus, 1), global_batch=(global_batch, 1),
              seq_len=(seq_len, 1), top=(top, 1), tp=(tp, 1), pp=(pp, 1), dp=(dp, 1), cp=(cp, 1), ep=(ep, 1),
              vpp=(vpp, 1), micro_batch=(micro_batch, 1))
    missing = [f"--{k.replace('_', '-')}" for k, v in (("gpus", gpus), ("global_batch", global_batch),
                                                         ("seq_len", seq_len)) if v is None]
    if missing:
        raise InputError(f"missing {', '.join(missing)}")
    arch_file, arch_row = _source(arch)
    hw_file, hw_row = _source(hardware_file)
    result, _, _, _ = api.layout_search(
        _settings(store), model=model, layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads,
        ffn_dim=ffn_dim, vocab=vocab, activation=activation, gpu=gpu, arch_file=arch_file, hardware_file=hw_file,
        arch=arch_row, hardware=hw_row, gpus=gpus, global_batch=global_batch, seq_len=seq_len, dtype=dtype, top=top,
        rank_by=rank_by, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, micro_batch=micro_batch, sharding=sharding,
        recompute=recompute, assumptions=assumptions, analytical_only=analytical_only, scaleup_size=scaleup_size,
        scaleup_gbps=scaleup_gbps, scaleout_gbps=scaleout_gbps, oversubscription=oversubscription,
        pod_size=pod_size, etp=etp, capacity_factor=capacity_factor)
    return result


def curve(*, gpu: str, model: Optional[str] = None, arch: Union[None, PathLike, Mapping] = None,
          policy: str = "strong", tokens: Optional[float] = None, seq_len: int = 2048,
          global_batch: Optional[int] = None, per_gpu_batch: float = 1.0, max_gpus: int = 16384,
          threshold: float = 0.5, dtype: Optional[str] = None, assumptions: str = "realistic",
          batch_rule: str = "deepseek", scaleup_size: Optional[int] = None, scaleup_gbps: Optional[float] = None,
          scaleout_gbps: Optional[float] = None, analytical_only: bool = False,
          oversubscription: Optional[float] = None, pod_size: Optional[int] = None,
          store: Optional[PathLike] = None) -> dict:
    """A scaling curve: the best layout at each cluster size from one node to `max_gpus` (`stepcast curve`).

    Returns the document `stepcast curve --format json` prints: `model`, `gpu`, `assumptions`, `batch_rule`,
    `policy`, `seq_len`, `tokens`, `calibration`, `inflection` (the smallest N whose marginal efficiency is
    below `threshold`, with a USL fit), `explanation`, and `points`, here a polars DataFrame (one row per N:
    layout, throughput, MFU, time-to-train, cost, parallel and marginal efficiency).

    >>> import stepcast
    >>> c = stepcast.curve(model="llama3-8b", gpu="h100-sxm5-80gb", max_gpus=256)
    >>> c["points"]["n_gpus"].to_list()[:4]
    [8, 16, 24, 32]
    """
    _at_least(seq_len=(seq_len, 1), global_batch=(global_batch, 1), per_gpu_batch=(per_gpu_batch, 0),
              max_gpus=(max_gpus, 1))
    arch_file, arch_row = _source(arch)
    doc, _ = api.scaling_curve(_settings(store), gpu=gpu, model=model, arch_file=arch_file, arch=arch_row,
                               policy=policy, tokens=tokens, seq_len=seq_len, global_batch=global_batch,
                               per_gpu_batch=per_gpu_batch, max_gpus=max_gpus, threshold=threshold, dtype=dtype,
                               assumptions=assumptions, batch_rule=batch_rule, scaleup_size=scaleup_size,
                               scaleup_gbps=scaleup_gbps, scaleout_gbps=scaleout_gbps,
                               analytical_only=analytical_only, oversubscription=oversubscription,
                               pod_size=pod_size)
    return doc


def frontier(*, gpu: str, months: float = 3.0, min_utilization: float = 0.8, dtype: Optional[str] = None,
             table: bool = False, assumptions: str = "realistic", batch_rule: str = "deepseek",
             scaleup_size: Optional[int] = None, scaleup_gbps: Optional[float] = None,
             scaleout_gbps: Optional[float] = None, memory_gb: Optional[float] = None,
             analytical_only: bool = False, oversubscription: Optional[float] = None,
             pod_size: Optional[int] = None, store: Optional[PathLike] = None) -> dict:
    """The largest training compute one accelerator type trains within `months` at good utilization
    (`stepcast frontier`).

    Returns the document `stepcast frontier --format json` prints (`max_training_flop`, `n_gpus`, the layout,
    `utilization`, `params`, `tokens`, `cost_usd`, what binds, the breakdown, ...; NaN as None). With
    `table=True` it also has `levels`, here a polars DataFrame: every compute level swept. Raises NoResult
    when no compute level is trainable.

    >>> import stepcast
    >>> f = stepcast.frontier(gpu="h100-sxm5-80gb", months=3)
    >>> f["max_training_flop"] > 1e24
    True
    """
    result, sweep, _ = api.compute_frontier(
        _settings(store), gpu=gpu, months=months, min_utilization=min_utilization, dtype=dtype,
        assumptions=assumptions, batch_rule=batch_rule, scaleup_size=scaleup_size, scaleup_gbps=scaleup_gbps,
        scaleout_gbps=scaleout_gbps, memory_gb=memory_gb, analytical_only=analytical_only,
        oversubscription=oversubscription, pod_size=pod_size)
    out = {k: api.clean(v) for k, v in result.items()}
    if table:
        out["levels"] = api.frontier_levels(sweep)
    return out


def plan(*, model: Optional[str] = None, arch: Union[None, PathLike, Mapping] = None, tokens: Optional[float] = None,
         deadline_days: Optional[float] = None, budget_usd: Optional[float] = None,
         hardware: Union[None, str, Sequence[str]] = None, max_gpus: int = 65536, price_source: str = "median",
         price_file: Optional[PathLike] = None, seq_len: int = 8192, global_batch_tokens: int = 4_194_304,
         dtype: str = "bf16", optimal: bool = False, top: int = 10, assumptions: str = "realistic",
         analytical_only: bool = False, scaleup_size: Optional[int] = None, scaleup_gbps: Optional[float] = None,
         scaleout_gbps: Optional[float] = None, oversubscription: Optional[float] = None,
         pod_size: Optional[int] = None, store: Optional[PathLike] = None) -> pl.DataFrame:
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
    _at_least(max_gpus=(max_gpus, 1), seq_len=(seq_len, 1), global_batch_tokens=(global_batch_tokens, 1),
              top=(top, 1))
    if hardware is not None and not isinstance(hardware, str):
        hardware = ",".join(hardware)
    arch_file, arch_row = _source(arch)
    result, _ = api.training_plan(
        _settings(store), model=model, arch_file=arch_file, arch=arch_row, tokens=tokens, deadline_days=deadline_days,
        budget_usd=budget_usd, hardware=hardware, max_gpus=max_gpus, price_source=price_source,
        price_file=None if price_file is None else Path(price_file), seq_len=seq_len,
        global_batch_tokens=global_batch_tokens, dtype=dtype, optimal=optimal, top=top, assumptions=assumptions,
        analytical_only=analytical_only, scaleup_size=scaleup_size, scaleup_gbps=scaleup_gbps,
        scaleout_gbps=scaleout_gbps, oversubscription=oversubscription, pod_size=pod_size,
        warn=lambda message: warnings.warn(message, stacklevel=3))
    return result
