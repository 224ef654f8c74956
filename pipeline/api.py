"""The functions behind the commands, on plain Python / polars inputs: the CLI, the serve API and Python
callers use the same ones (`from pipeline import api`).

Each command's function takes the command's options object (pipeline/options.py: `prediction(cfg,
PredictOptions(...))`), or its fields as keywords (`prediction(cfg, model="llama3-8b", ...)`). Every function
resolves names (model, accelerator), applies and REPORTS its defaults, and predicts through the one prediction
function (`models.fitting.predictor`). Bad input raises `InputError` with a message that names the flag or field
and what was expected.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional

import numpy as np
import polars as pl

from models.arch.archfile import (APPROXIMATED_ARCHITECTURES, APPROXIMATED_NOTE, ArchFileError,
                                  architecture_from_mapping, hardware_from_mapping)
from models.arch.moe import resolve_etp
from models.core.params import DEFAULT, DTYPE_CODES, is_low_precision
from models.core.precision import RECIPE_SOURCE, recipe_layers_16bit
from models.core.software import PRESETS
from models.corpus.runs_adapter import XLA_REMAT_NOTE, XLA_TP_NOTE, hybrid_problems, stack_settings
from models.fitting.assumptions import check_assumptions, params_for
from models.fitting.predictor import Predictor, predict, with_adaptation
from models.memory.model import MAXTEXT_REMAT
from models.memory.stacks import STACK_COLUMNS
from models.physics.hardware import compiler_overlaps_tp, resolve_hardware
from models.physics.step_time import (BREAKDOWN, ERR_BATCH, ERR_CP_SEQ, ERR_EP, ERR_GPU_PRODUCT, ERR_HEADS_TP,
                                      ERR_PP_LAYERS, ERR_VPP, ERROR_MESSAGES, arch_config)
from models.planning import plan as P
from models.planning.search import search as run_search
from pipeline import catalog, trace
from pipeline.catalog import UnknownName, instance_network
from pipeline.options import (CurveOptions, FrontierOptions, InputError, Options, PlanOptions, PredictOptions,
                              SearchOptions)
from pipeline.output import json_rows
from pipeline.predict_runs import predict_file, predict_frame
from pipeline.readers import FileRejected
from pipeline.settings import Settings

SHARDINGS = ("none", "zero1", "zero2", "zero3", "fsdp", "hsdp")
RECOMPUTES = ("none", "selective", "full")
DTYPES = ("bf16", "fp16", "fp8", "fp8-cs", "mxfp8", "nvfp4", "fp32", "tf32")
TP_MODES = ("1d", "2d")  # models.core.params.TP_MODE_CODES
ASSUMPTION_SETS = ("realistic", "ideal")


class NoResult(InputError):
    """Valid input that has no answer: no feasible layout, no plan within the deadline or budget, no trainable
    compute level. The message says what was tried and what to change; the CLI prints it and exits 1.
    `detail` carries what the CLI prints beside the message (e.g. the frontier's levels)."""

    def __init__(self, message: str, detail: Optional[dict] = None):
        super().__init__(message, exit_code=1)
        self.detail = detail or {}


def _calibrated():
    """pipeline.calibrated: the prediction model of the store's promoted fit (`model_for`, `promoted_fit`)."""
    # start-up time: pipeline.calibrated loads DuckDB (the store's reader), which `import stepcast` leaves out
    from pipeline import calibrated

    return calibrated


def _planning():
    """(models.planning.curves, models.planning.frontier), for curve and frontier."""
    # start-up time: the curve and frontier models load SciPy (the USL fit), which predict, search and plan never use
    from models.planning import curves, frontier

    return curves, frontier


def check_adaptable(calibrate_on, source: Optional[str], analytical_only: bool, assumptions: str) -> None:
    """InputError when `calibrate_on` / `source` ask to adapt an answer no measurement moves (the priors, the ideal
    bound) or both are given; nothing without either."""
    if calibrate_on is None and source is None:
        return
    flag = "--calibrate-on" if calibrate_on is not None else "--source"
    if calibrate_on is not None and source is not None:
        raise InputError("--calibrate-on and --source both given: give one (a file of your runs, or a source the "
                         "store holds)")
    if analytical_only:
        raise InputError(f"{flag} adapts the calibrated fit; --analytical-only answers with the priors alone")
    if assumptions != "realistic":
        raise InputError(f"{flag} adapts the realistic prediction; --assumptions {assumptions} is a bound no "
                         "measurement moves")


def adapt_model(cfg: Settings, model, calibrate_on=None, source: Optional[str] = None, *,
                analytical_only: bool = False, assumptions: str = "realistic"):
    """`model` (the served fit under `assumptions`, `pipeline.calibrated.model_for`) adapted to the runs of
    `calibrate_on` (a run file's path, or a frame in the measurement schema) or to the stored adaptation of
    `source` (`pipeline.adaptation`); `model` itself when neither is given. InputError when the fit cannot be
    adapted (no fit, analytical or ideal answers, both given, a bad file, no usable run, an unknown source)."""
    if calibrate_on is None and source is None:
        return model
    check_adaptable(calibrate_on, source, analytical_only, assumptions)
    # start-up time: the adaptation reads the store (DuckDB), which `import stepcast` leaves out
    from pipeline import adaptation

    try:
        if calibrate_on is not None:
            ad = adaptation.from_file(calibrate_on, cfg.measurements, model)
        else:
            ad = _calibrated().from_readable_store(cfg, lambda con, _: adaptation.from_source(con, source, model))
            if ad is None:
                raise adaptation.AdaptationError(f"--source {source}: no store yet: run `stepcast build`")
    except (adaptation.AdaptationError, FileRejected, UnknownName) as err:
        raise InputError(str(err), exit_code=1) from err
    return dataclasses.replace(model, adaptation=ad)


#: `--stack generic`: the generic stack row on purpose (the wider interval of a stack the fit never saw)
GENERIC_STACK = "generic"


def stack_inputs(cfg: Settings, stack: Optional[str], gpu_id: Optional[str]) -> tuple[dict, Optional[dict], str]:
    """What `--stack NAME` sets for configurations on `gpu_id`, read by the words of measurements/stack_words.csv as
    a run file's `framework` is (`models.corpus.runs_adapter.stack_settings`): (the per-configuration inputs: the
    stack's memory values, XLA compilation, software era, `stack_unknown`; the reading; the sentence for
    `assumptions`). ({}, None, "") without a stack. `--stack generic` asks for the generic row (wider interval); any
    other name the words do not know is an InputError listing the known stacks."""
    if stack is None:
        return {}, None, ""
    name = stack.strip()
    if not name:
        raise InputError("--stack: give a stack name (`stepcast list stacks`)")
    stacks = catalog.stacks(cfg.measurements)
    generic = name.lower() == GENERIC_STACK
    # a question is about a run now: the stack's current release (its year decides era rules such as DeepSpeed's
    # SDPA kernels from 2024, models.corpus.runs_adapter)
    d = stack_settings("" if generic else name, gpu_id or "", resolve_hardware(catalog.hardware(cfg.measurements),
                                                                              strict=False), stacks,
                       year=datetime.date.today().year)
    if not d["known"] and not generic:
        words = list(stacks.words)
        raise InputError(f"--stack {name}: no stack of measurements/stack_words.csv is named so; known: "
                         + ", ".join(words or sorted(stacks.stacks)) + f" (or --stack {GENERIC_STACK}: the generic row "
                         "with the wider interval; `stepcast list stacks`)")
    d = dict(d, sharding_options=() if generic else stacks.stacks[d["memory_preset"]].sharding_options)
    inputs = {c: d[c] for c in STACK_COLUMNS}
    inputs.update(xla_compiled=d["xla_compiled"], era_code=float(PRESETS.index(d["software_preset"])),
                  stack_unknown=1.0 if generic else 0.0)
    note = (f"stack {GENERIC_STACK}: the generic row of measurements/stacks.csv, {d['software_preset']} kernels, "
            "the wider interval of a stack the fit never saw" if generic else
            f"stack {name}: read as {d['memory_preset']} (measurements/stacks.csv), {d['software_preset']} kernels"
            + (", XLA-compiled" if d["xla_compiled"] == 1.0 else ""))
    return inputs, d, note


def options_model(cfg: Settings, o, assumptions: Optional[str] = None):
    """The model a command's options ask for: the served fit (or the priors) under the assumptions, adapted to
    `o.calibrate_on` / `o.source` where the command has them."""
    assumptions = assumptions or o.assumptions
    m = _calibrated().model_for(cfg, o.analytical_only, assumptions)
    return adapt_model(cfg, m, getattr(o, "calibrate_on", None), getattr(o, "source", None),
                       analytical_only=o.analytical_only, assumptions=assumptions)


def check_choice(flag: str, value: Optional[str], allowed) -> None:
    if value is not None and value not in allowed:
        raise InputError(f"{flag} must be one of {', '.join(allowed)}, got '{value}'")


def check_precision(dtype: str, hw: dict) -> None:
    """A precision the accelerator has no tensor-core peak for is an error, never a silent fallback."""
    need = {"nvfp4": "peak_fp4_tflops", "fp8": "peak_fp8_tflops", "fp8-cs": "peak_fp8_tflops",
            "mxfp8": "peak_fp8_tflops"}.get(dtype)
    if need and not (hw.get(need) is not None and hw.get(need) == hw.get(need) and float(hw[need]) > 0):
        fmt_name = need.removeprefix("peak_").removesuffix("_tflops").upper()
        raise InputError(f"--dtype {dtype}: {hw.get('id')} has no {fmt_name} tensor-core peak ({need} is empty); "
                         "choose a precision it has or another accelerator (`stepcast list gpus`)")


def check_network(scaleup_size=None, scaleup_gbps=None, scaleout_gbps=None, memory_gb=None,
                  oversubscription=None, pod_size=None) -> None:
    """The network-tier (and memory) overrides are positive finite numbers, the oversubscription a ratio >= 1
    and the pod size a positive whole number, else InputError naming the flag, its value and the expectation.
    (A pod below the scale-up domain: `check_pod`, once the hardware is known.)"""
    for flag, v in (("--scaleup-size", scaleup_size), ("--scaleup-gbps", scaleup_gbps),
                    ("--scaleout-gbps", scaleout_gbps), ("--memory-gb", memory_gb)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise InputError(f"{flag} must be a positive number, got {v}")
    if oversubscription is not None and not (oversubscription >= 1 and math.isfinite(oversubscription)):
        raise InputError(f"--oversubscription must be a ratio >= 1 (1 = non-blocking, 3 = 3:1 oversubscribed), "
                         f"got {oversubscription:g}")
    if pod_size is not None and not (pod_size >= 1 and math.isfinite(pod_size) and pod_size == int(pod_size)):
        raise InputError(f"--pod-size must be a positive whole number of accelerators, got {pod_size:g}")


def check_pod(pod_size, hw: dict) -> None:
    """A pod holds whole scale-up domains: `--pod-size` below the accelerator's (or --scaleup-size's) domain is
    an InputError."""
    su = hw.get("scaleup_size")
    if pod_size is not None and su is not None and pod_size < su:
        raise InputError(f"--pod-size must be at least the scale-up domain ({su:g} accelerators of {hw.get('id')}), "
                         f"got {pod_size:g}")


def network_overrides(scaleup_size: Optional[int] = None, scaleup_gbps: Optional[float] = None,
                      scaleout_gbps: Optional[float] = None, oversubscription: Optional[float] = None,
                      pod_size: Optional[int] = None) -> dict:
    """`resolved_hardware` overrides of the network tiers (checked), as `stepcast search` applies them:
    `oversubscription` and `pod_size` are the model's optional network columns (models.physics.step_time.NETWORK_COLUMNS)."""
    check_network(scaleup_size, scaleup_gbps, scaleout_gbps, oversubscription=oversubscription, pod_size=pod_size)
    out = {"intra_node_bw_gbps": scaleup_gbps, "inter_node_bw_gbps": scaleout_gbps,
           "oversubscription": oversubscription, "pod_size": pod_size}
    if scaleup_size is not None:
        out.update(scaleup_size=scaleup_size, gpus_per_node_typical=scaleup_size)
    return out


def network_note(oversubscription: Optional[float] = None, pod_size: Optional[int] = None) -> str:
    """The pod tier in words, for the outputs that list their assumptions; "" for a non-blocking network."""
    if oversubscription is None or oversubscription == 1:
        return ""
    where = f"pods of {pod_size:g} accelerators" if pod_size is not None else "every scale-up domain"
    return f"network: {oversubscription:g}:1 oversubscribed above {where}"


def _with_note(result: pl.DataFrame, note: str) -> pl.DataFrame:
    """`result` with "; `note`" appended to its `assumptions` (as it is without a note or that column)."""
    if not note or "assumptions" not in result.columns:
        return result
    return result.with_columns((pl.col("assumptions") + pl.lit("; " + note)).alias("assumptions"))


def _with_approximation_note(result: pl.DataFrame, arch: dict) -> pl.DataFrame:
    """`assumptions` + the note of an architecture the model only approximates, as predict --runs says it
    (models.corpus.runs_adapter), or the approximations of a Hugging Face config (its `hf_notes`)."""
    if arch.get("hf_notes"):
        return _with_note(result, f"architecture mapped from its config: {arch['hf_notes']}")
    return _with_note(result, APPROXIMATED_NOTE if str(arch.get("id")).lower() in APPROXIMATED_ARCHITECTURES else "")


def _with_network_note(result: pl.DataFrame, oversubscription, pod_size) -> pl.DataFrame:
    return _with_note(result, network_note(oversubscription, pod_size))


def resolved_hardware(hw_row: dict, overrides: Optional[dict] = None) -> dict:
    hw = resolve_hardware(pl.DataFrame([hw_row]), strict=False).row(0, named=True)
    if hw.get("hardware_error"):
        raise InputError(f"hardware {hw_row.get('id')}: {hw['hardware_error']}")
    for k, v in (overrides or {}).items():
        if v is not None:
            hw[k] = float(v)
    check_pod((overrides or {}).get("pod_size"), hw)
    return hw


def predict_config(cfg: Settings, o: PredictOptions, arch: dict, hw_row: dict, gpu: Optional[str],
                   keep: Optional[dict] = None) -> pl.DataFrame:
    """One configuration of `o` on the architecture row `arch` and hardware row `hw_row` (`gpu`: the name the
    accelerator was asked by, for a cloud instance's network; None for a row from a file): a one-row frame with
    the resolved inputs, the prediction (calibrated unless `analytical_only`), its interval and provenance
    (`fit_version`, `assumptions`, `calibration_domain`).
    `assumptions` also lists every default applied (and the pod tier when it is oversubscribed). The network
    flags of search/curve (`scaleup_size`, `scaleup_gbps`, `scaleout_gbps`) stand beside the older
    `gpus_per_node` / `inter_node_gbps`; both given and different is an InputError. An invalid layout raises
    InputError with the reason. MoE options (models.arch.moe): `etp` the expert tensor-parallel degree (default tp,
    Megatron-Core's; where ep is folded over tp the largest etp that folds, listed in `assumptions`),
    `capacity_factor` the expert capacity factor (default: dropless). `layers_16bit`: layers a low-precision recipe
    keeps in 16 bits at the end of the stack (default: the model's published recipe, models.core.precision, else 0).
    `keep`: a dict that receives the configuration frame and the model that answered (`configs`, `model`: what a
    timeline of the step is drawn from, pipeline.trace)."""
    gpus, global_batch, seq_len, tp, pp, cp, ep = o.gpus, o.global_batch, o.seq_len, o.tp, o.pp, o.cp, o.ep
    sharding, recompute, dtype, tp_mode, assumptions = o.sharding, o.recompute, o.dtype, o.tp_mode, o.assumptions
    # the defaults this function applies (and lists in `assumptions`)
    dp, micro_batch, vpp, sequence_parallel, gpus_per_node = o.dp, o.micro_batch, o.vpp, o.sequence_parallel, \
        o.gpus_per_node
    etp, capacity_factor, layers_16bit = o.etp, o.capacity_factor, o.layers_16bit
    check_choice("--sharding", sharding, SHARDINGS)
    check_choice("--recompute", recompute, RECOMPUTES + tuple(MAXTEXT_REMAT))
    check_choice("--dtype", dtype, DTYPES)
    check_choice("--assumptions", assumptions, ASSUMPTION_SETS)
    check_choice("--tp-mode", tp_mode, TP_MODES)
    save_list = None
    if recompute in MAXTEXT_REMAT:  # a MaxText remat_policy: selective with its save list (models.memory.model)
        save_list, recompute = recompute, "selective"
    for (old, ov), (new, nv) in ((("--gpus-per-node", gpus_per_node), ("--scaleup-size", o.scaleup_size)),
                                 (("--inter-node-gbps", o.inter_node_gbps), ("--scaleout-gbps", o.scaleout_gbps))):
        if ov is not None and nv is not None and ov != nv:
            raise InputError(f"{old} {ov:g} and {new} {nv:g} disagree: both set the same network tier; give one")
    scaleout_gbps = o.scaleout_gbps if o.scaleout_gbps is not None else o.inter_node_gbps
    hw = resolved_hardware(hw_row, network_overrides(o.scaleup_size, o.scaleup_gbps, scaleout_gbps,
                                                     o.oversubscription, o.pod_size))
    check_precision(dtype, hw)
    defaults = []
    if gpu is not None and scaleout_gbps is None and (net := instance_network(gpu)) is not None:
        defaults.append(net[1])  # a cloud instance type's own scale-out network (`resolve_gpu`)
    if dp is None:
        if gpus % (tp * pp * cp):
            raise InputError(f"--gpus {gpus} is not divisible by tp {tp} x pp {pp} x cp {cp} = {tp * pp * cp}")
        dp = gpus // (tp * pp * cp)
        defaults.append(f"dp=N/(tp*pp*cp)={dp}")
    if micro_batch is None:
        micro_batch = 1
        defaults.append("micro_batch=1")
    if vpp is None:
        vpp = 1
        if pp > 1:  # a measured run's unstated vpp is inferred instead (models.corpus.runs_adapter): say which this is
            defaults.append("vpp=1 (plain 1F1B; --vpp N for the interleaved schedule)")
    stack_row, stack, stack_note = stack_inputs(cfg, o.stack, hw_row.get("id"))
    if stack_note:
        defaults.insert(0, stack_note)
    if sharding is None:
        own = stack["default_sharding"] if stack is not None and not stack_row["stack_unknown"] else None
        sharding = (own or "zero1") if dp * cp > 1 else "none"
        defaults.append(f"sharding={sharding}" + (" (the stack's default)" if own else ""))
    if recompute is None:
        recompute = "selective"
        defaults.append("recompute=selective")
    if sequence_parallel is None:
        sequence_parallel = tp > 1
        defaults.append(f"sequence_parallel={'on' if sequence_parallel else 'off'}")
    if bool(compiler_overlaps_tp(hw.get("scaleup_link_code", float("nan")))):  # a TPU: XLA compiles (models.physics.parts)
        if tp > 1:
            defaults.append(XLA_TP_NOTE)
        if recompute == "full":
            defaults.append(XLA_REMAT_NOTE)
    if gpus_per_node is None:
        gpus_per_node = int(min(hw["scaleup_size"] or 8, gpus))
        defaults.append(f"gpus_per_node={gpus_per_node}")
    if capacity_factor is not None and not (capacity_factor > 0 and math.isfinite(capacity_factor)):
        raise InputError(f"--capacity-factor must be a number > 0 (omit it for dropless), got {capacity_factor}")
    is_moe = float(arch.get("n_experts") or 0) > 0
    if is_moe and etp is None:  # Megatron-Core's default etp = tp, or the largest that folds (models.arch.moe)
        e_, inferred = resolve_etp(float("nan"), tp, cp, dp, ep)
        etp = int(e_)
        defaults.append(f"etp={etp} (ep={ep} does not fold with etp=tp: the largest etp dividing tp that does)"
                        if inferred else f"etp=tp={etp}")
    if is_moe and capacity_factor is None:
        defaults.append("dropless (no capacity factor)")
    low = dtype in DTYPE_CODES and bool(is_low_precision(DTYPE_CODES[dtype]))
    if layers_16bit is not None and not (0 <= layers_16bit <= float(arch.get("n_layers") or 0)):
        raise InputError(f"--layers-16bit must be between 0 and the model's {arch.get('n_layers')} layers, "
                         f"got {layers_16bit}")
    if layers_16bit is not None and layers_16bit > 0 and not low:
        raise InputError(f"--layers-16bit keeps layers of a low-precision recipe in 16 bits; --dtype {dtype} runs "
                         f"every layer in {dtype} already (use fp8, fp8-cs, mxfp8 or nvfp4)")
    if layers_16bit is None and low and (rl := recipe_layers_16bit(arch.get("id"), dtype)) is not None:
        layers_16bit = rl
        defaults.append(f"n_layers_16bit={rl} ({RECIPE_SOURCE[(str(arch.get('id')).lower(), dtype)]})")
    # the architecture columns the model reads (hybrid pattern and Mamba shape, MLA and MTP), as search carries them
    row = arch_config(arch)
    if "mtp_layers" in row:  # MLA attention, MTP modules (models.arch.mla)
        mtp = arch.get("mtp_layers")
        if mtp is not None and mtp == mtp and float(mtp) > 0:  # NaN != NaN: empty
            defaults.append(f"mtp_layers={int(float(mtp))} (architecture table)")
    row.update(run_id="cli", model=arch.get("id"), gpu=hw_row.get("id"), seq_len=seq_len,
               global_batch_seqs=global_batch, micro_batch=micro_batch, n_gpus=gpus, tp=tp, pp=pp, dp=dp, cp=cp,
               ep=ep, vpp=vpp, sharding=sharding, recompute=recompute, sequence_parallel=sequence_parallel,
               dtype=dtype, gpus_per_node=gpus_per_node, tp_mode=tp_mode)
    if etp is not None:  # MoE options (models.arch.moe); absent columns = the defaults
        row["etp"] = etp
    if capacity_factor is not None:
        row["moe_capacity_factor"] = float(capacity_factor)
    if layers_16bit:
        row["n_layers_16bit"] = float(layers_16bit)
    row.update({k: v for k, v in stack_row.items() if k != "era_code"})
    if stack is not None:
        row["software_preset"] = stack["software_preset"]
    if save_list is not None:
        row["selective_policy"] = float(MAXTEXT_REMAT[save_list])
        defaults.append(f"recompute {save_list}: selective with that MaxText remat_policy's save list (memory: what "
                        f"it keeps on the device; time: what the backward recomputes)")
    configs = pl.DataFrame([row]).hstack(pl.DataFrame([{k: v for k, v in hw.items() if k not in row}]))
    m = options_model(cfg, o, assumptions)
    open_settings, spread = settings_spread(cfg, configs, o, m, arch, hw)
    if spread > 0:
        configs = configs.with_columns(pl.lit(spread).alias("settings_halfwidth"))
        defaults.append(f"interval: the spread over the settings left open ({', '.join(open_settings)}), "
                        f"x/{math.exp(spread):.2f}; state them to narrow it")
    res = predict(configs, m)
    err = res["error"][0]
    if err is not None and not err.startswith("memory"):
        raise InputError(f"invalid configuration: {with_numbers(err, int(res['error_code'][0]), arch, row)}")
    if keep is not None:
        keep.update(configs=configs, model=m)
    inputs = pl.DataFrame([{k: row[k] for k in ("run_id", "model", "gpu", "n_gpus", "tp", "pp", "dp", "cp", "ep", "vpp",
                                                 "micro_batch", "global_batch_seqs", "seq_len", "sharding",
                                                 "recompute", "sequence_parallel", "dtype", "gpus_per_node",
                                                 "tp_mode")}
                           | {"etp": row.get("etp"), "moe_capacity_factor": row.get("moe_capacity_factor")}],
                          schema_overrides={"etp": pl.Int64, "moe_capacity_factor": pl.Float64})
    res = res.with_columns((pl.col("assumptions") + pl.lit("; defaults: " + ", ".join(defaults) if defaults else ""))
                           .alias("assumptions"))
    res = _with_approximation_note(res, arch)
    res = _with_network_note(res, o.oversubscription, o.pod_size)
    return inputs.hstack(res.with_columns(pl.lit(float(hw["inter_node_bw_gbps"])).alias("inter_node_bw_gbps")))


def layout_problems(arch: Mapping, *, gpus: int, global_batch: int, seq_len: int, tp=None, pp=None, cp=None, dp=None,
                    micro_batch=None, ep=None, etp=None, vpp=None) -> dict[int, str]:
    """The layout rules of the step-time model (models.physics.step_time `ERROR_MESSAGES`) that the given values
    break, each said with the numbers that break it ("n_heads 64 is not divisible by tp 6"), by error bit. A
    dimension left None (search: not fixed) is not judged."""
    out: dict[int, str] = {}
    heads = int(arch.get("n_heads") or 0)
    kv = int(arch.get("n_kv_heads") or heads)
    layers = int(arch.get("n_layers") or 0)
    known = [x for x in (tp, pp, cp, dp) if x is not None]
    if known and gpus % math.prod(known):
        names = " x ".join(f"{n} {v}" for n, v in (("tp", tp), ("pp", pp), ("cp", cp), ("dp", dp)) if v is not None)
        out[ERR_GPU_PRODUCT] = (f"tp {tp} x pp {pp} x cp {cp} x dp {dp} = {tp * pp * cp * dp} is not --gpus {gpus}"
                                if len(known) == 4 else f"--gpus {gpus} is not divisible by {names}"
                                + (f" = {math.prod(known)}" if len(known) > 1 else ""))
    elif len(known) == 4 and tp * pp * cp * dp != gpus:
        out[ERR_GPU_PRODUCT] = f"tp {tp} x pp {pp} x cp {cp} x dp {dp} = {tp * pp * cp * dp} is not --gpus {gpus}"
    if dp is not None and micro_batch is not None and global_batch % (dp * micro_batch):
        out[ERR_BATCH] = (f"global batch {global_batch} is not a multiple of dp {dp} x micro-batch {micro_batch} = "
                          f"{dp * micro_batch}")
    elif (dp or micro_batch) and global_batch % (dp or micro_batch):
        which = "dp" if dp else "micro-batch"
        out[ERR_BATCH] = f"global batch {global_batch} is not a multiple of {which} {dp or micro_batch}"
    if tp is not None and heads and heads % tp:
        out[ERR_HEADS_TP] = f"n_heads {heads} is not divisible by tp {tp}"
    elif tp is not None and kv and kv % tp and tp % kv:
        out[ERR_HEADS_TP] = f"n_kv_heads {kv} and tp {tp}: neither divides the other"
    if pp is not None and layers and pp > layers:
        out[ERR_PP_LAYERS] = f"pp {pp} is more than the model's {layers} layers"
    if cp is not None and seq_len % cp:
        out[ERR_CP_SEQ] = f"seq_len {seq_len} is not divisible by cp {cp}"
    experts = int(arch.get("n_experts") or 0)
    if ep is not None and ep > 1 and experts and experts % ep:
        out[ERR_EP] = f"ep {ep} does not divide the model's {experts} experts"
    elif ep is not None and ep > 1 and not experts:
        out[ERR_EP] = f"ep {ep} > 1 needs an MoE model ({arch.get('id')} has no experts)"
    elif None not in (ep, etp, tp, cp, dp) and experts and (tp * cp * dp) % (etp * ep):
        out[ERR_EP] = (f"etp {etp} x ep {ep} = {etp * ep} does not divide tp {tp} x cp {cp} x dp {dp} = "
                       f"{tp * cp * dp}")
    if vpp is not None and vpp > 1 and None not in (pp, dp, micro_batch):
        steps = global_batch // (dp * micro_batch) if dp * micro_batch else 0
        if pp <= 1:
            out[ERR_VPP] = f"vpp {vpp} needs pp > 1 (pp {pp})"
        elif steps % pp:
            out[ERR_VPP] = (f"vpp {vpp}: {steps} micro-batches (global batch {global_batch} / (dp {dp} x micro-batch "
                            f"{micro_batch})) are not a multiple of pp {pp}")
        elif layers and layers // pp < vpp:
            out[ERR_VPP] = f"vpp {vpp}: {layers // pp} layers per stage ({layers} / pp {pp}) are fewer than vpp"
    return out


def with_numbers(err: str, code: int, arch: Mapping, row: Mapping) -> str:
    """The step-time model's `error` of one configuration with each rule it breaks said with its numbers
    (`layout_problems`); a rule without a numbered form keeps the model's wording."""
    numbered = layout_problems(arch, gpus=row["n_gpus"], global_batch=row["global_batch_seqs"],
                               seq_len=row["seq_len"], tp=row["tp"], pp=row["pp"], cp=row["cp"], dp=row["dp"],
                               micro_batch=row["micro_batch"], ep=row["ep"], etp=row.get("etp"), vpp=row["vpp"])
    for bit, text in numbered.items():
        if code & bit and ERROR_MESSAGES[bit] in err:
            err = err.replace(ERROR_MESSAGES[bit], text)
    return err


#: the plausible values of each setting a question may leave open (the interval's settings part: `settings_spread`)
OPEN_SETTINGS = {"micro_batch": (1, 2, 4), "vpp": (1, 2, 4), "sharding": ("none", "zero1", "zero3"),
                 "recompute": ("none", "selective", "full"), "sequence_parallel": (False, True),
                 "stack": (None, "torchtitan")}


def settings_spread(cfg: Settings, configs: pl.DataFrame, o: PredictOptions, model, arch: Mapping,
                    hw: Mapping) -> tuple[list[str], float]:
    """(the settings `o` leaves open, the log half-width they add to the interval): half the log range of the step
    time the one prediction function gives over every feasible combination of their plausible values
    (`OPEN_SETTINGS`; a micro-batch must tile the batch, an interleave the layers), the stated settings held. A
    fully stated configuration has none; stating a setting only removes combinations, so it never widens it."""
    row = configs.row(0, named=True)
    tp, pp, dp, cp = (int(row[k]) for k in ("tp", "pp", "dp", "cp"))
    layers = int(float(arch.get("n_layers") or 1))
    tpu = bool(compiler_overlaps_tp(hw.get("scaleup_link_code", float("nan"))))
    open_: dict[str, tuple] = {}
    if o.micro_batch is None:
        open_["micro_batch"] = tuple(b for b in OPEN_SETTINGS["micro_batch"] if row["global_batch_seqs"] % (dp * b) == 0)
    if o.vpp is None and pp > 1:
        open_["vpp"] = tuple(v for v in OPEN_SETTINGS["vpp"] if layers % (pp * v) == 0)
    if o.sharding is None and dp * cp > 1:
        open_["sharding"] = OPEN_SETTINGS["sharding"]
    if o.recompute is None:
        open_["recompute"] = OPEN_SETTINGS["recompute"]
    if o.sequence_parallel is None and tp > 1:
        open_["sequence_parallel"] = OPEN_SETTINGS["sequence_parallel"]
    if o.stack is None and not tpu:
        open_["stack"] = OPEN_SETTINGS["stack"]
    open_ = {k: v for k, v in open_.items() if len(v) > 1}
    if not open_:
        return [], 0.0
    grid = configs
    for name, values in open_.items():
        if name == "stack":
            frames = []
            for st in values:
                inputs, d, _ = stack_inputs(cfg, st, row.get("gpu"))
                extra = {k: v for k, v in inputs.items() if k != "era_code"}
                if d is not None:
                    extra["software_preset"] = d["software_preset"]
                frames.append(grid.with_columns([pl.lit(v).alias(k) for k, v in extra.items()]))
            grid = pl.concat(frames, how="diagonal_relaxed")
        else:
            grid = grid.drop(name, strict=False).join(pl.DataFrame({name: list(values)}), how="cross")
    res = predict(grid, model)
    step = res.filter(pl.col("feasible") & pl.col("step_time_s").is_finite())["step_time_s"]
    if step.len() < 2:
        return list(open_), 0.0
    return list(open_), float(0.5 * (math.log(step.max()) - math.log(step.min())))


def search_layouts(cfg: Settings, *, arch: dict, hw_row: dict, gpus: int, global_batch: int, seq_len: int,
                   fixed: Optional[dict] = None, dtype: str = "bf16", top: int = 10, rank_by: str = "throughput",
                   analytical_only: bool = False, assumptions: str = "realistic",
                   hw_overrides: Optional[dict] = None, calibrate_on=None,
                   source: Optional[str] = None, stack: Optional[str] = None) -> tuple[pl.DataFrame, int, Any]:
    """(best layouts, number evaluated, model used), ranked by the calibrated figure of the one function."""
    check_choice("--dtype", dtype, DTYPES)
    check_choice("--assumptions", assumptions, ASSUMPTION_SETS)
    if rank_by not in ("throughput", "cost"):
        raise InputError(f"--rank-by must be throughput or cost, got '{rank_by}'")
    hw = resolved_hardware(hw_row, hw_overrides)
    check_precision(dtype, hw)
    stack_row, stack_read, stack_note = stack_inputs(cfg, stack, hw_row.get("id"))
    hw = hw | stack_row
    fixed = dict(fixed or {})
    if stack_read is not None and stack_read["sharding_options"] and "sharding" not in fixed:
        fixed["sharding"] = list(stack_read["sharding_options"])  # only what the stack can run
        stack_note += f"; shardings the stack runs: {', '.join(stack_read['sharding_options'])}"
    m = adapt_model(cfg, _calibrated().model_for(cfg, analytical_only, assumptions), calibrate_on, source,
                    analytical_only=analytical_only, assumptions=assumptions)
    price = hw_row.get("cloud_usd_per_hour")
    result, n = run_search(arch, hw, gpus, global_batch, seq_len, fixed=fixed or {}, dtype=dtype, top_k=top,
                           rank_by=rank_by, usd_per_gpu_hour=price, return_count=True, params=m)
    if stack_note and result.height and "assumptions" in result.columns:
        result = result.with_columns(pl.concat_str([pl.col("assumptions"), pl.lit(stack_note)], separator="; ")
                                     .alias("assumptions"))
    return _with_approximation_note(result, arch), n, m


def title_of(command: str, result: pl.DataFrame) -> str:
    """A table title that says which parameters and assumptions answered."""
    if result.height == 0 or "assumptions" not in result.columns:
        return f"stepcast {command}"
    v = result["fit_version"][0] if "fit_version" in result.columns else None
    a = str(result["assumptions"][0]).split(";")[0]
    dom = sorted(set(str(x).split(";")[0] for x in result["calibration_domain"].to_list())) \
        if "calibration_domain" in result.columns else []
    ad = (f", adapted to {result['adapted_to'][0]} ({result['adaptation_runs'][0]} runs, throughput x"
          f"{result['throughput_factor'][0]:.3f})") if "adapted_to" in result.columns else ""
    return (f"stepcast {command} — {a}" + (f", fit {v}" if v else "") + ad
            + (f", domain: {' / '.join(dom)}" if dom else ""))


# ------------------------------------------------------------------ the commands' computations
# Each command of the CLI (`pipeline.commands.*`) builds its options object (pipeline/options.py) of its flags,
# calls one of these and prints what it returns; `stepcast` (the Python API) and the explorer (pipeline/serve.py)
# build the same object and call the same ones. They check their input in the order the command always did and
# raise InputError (NoResult when the input is valid but nothing answers).

PREDICT_COLUMNS = ["run_id", "feasible", "error", "step_time_s", "step_time_lo_s", "step_time_hi_s",
                   "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "mfu", "hfu",
                   "memory_gb_per_gpu", *BREAKDOWN, "fit_version", "assumptions", "calibration_domain"]
SEARCH_COLUMNS = ["rank", "tp", "tp_mode", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch", "sharding", "recompute",
                  "sequence_parallel", "step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu",
                  "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "mfu", "memory_gb_per_gpu", "fit_version",
                  *BREAKDOWN]
CURVE_COLUMNS = ["n_gpus", "global_batch_seqs", "tp", "tp_mode", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "sharding",
                 "recompute", "step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s", "tokens_per_s_lo",
                 "tokens_per_s_hi", "tokens_per_s_per_gpu", "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi", "mfu",
                 "time_to_train_days", "cost_usd", "parallel_efficiency", "marginal_efficiency",
                 "marginal_efficiency_lo", "marginal_efficiency_hi", "pareto_optimal", "efficient", "layout_note",
                 "feasible", "reason", "calibrated", "fit_version", "assumptions"]
BREAKDOWN_KEYS = ["step_time_s", *BREAKDOWN]
LEVEL_COLUMNS = ["assumptions", "training_flop", "params", "n_gpus", "tp", "pp", "dp", "cp", "vpp", "micro_batch",
                 "sharding", "recompute", "global_batch_seqs", "utilization", "time_to_train_days",
                 "latency_wall_days", "feasible", "binding", "limited_by", "reason", "cost_usd"]
PLAN_COLUMNS = ["rank", "hardware", "n_gpus", "tp", "tp_mode", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "sharding",
                "recompute", "days", "days_lo", "days_hi", "days_ideal", "cost_usd", "cost_usd_lo", "cost_usd_hi",
                "energy_mwh", "mfu", "tokens_per_s_per_gpu", "goodput", "expected_interruptions",
                "checkpoint_interval_min", "usd_per_gpu_hour", "price_source", "hfu", "step_time_s",
                "step_time_lo_s", "step_time_hi_s", "fit_version", "assumptions", "calibration_domain",
                "batch_capped", "batch_tokens_to_fill", "batch_note"]
#: which days a plan's deadline applies to (--deadline-at): the prediction, or the interval's upper bound
DEADLINE_AT = ("point", "upper")
OPTIMAL_COLUMNS = ["rank", "hardware", "n_gpus", "params", "tokens", "loss", "training_flop", "days", "cost_usd",
                   "energy_mwh", "mfu", "tp", "pp", "dp", "cp", "n_layers", "d_model", "usd_per_gpu_hour"]
NO_DEADLINE_HORIZON_DAYS = 365
#: what an adapted answer adds (`with_adaptation`)
ADAPTATION_COLUMNS = ["adapted_to", "adaptation_runs", "throughput_factor"]


def clean(v):
    """A float that JSON cannot carry (NaN, ±inf) as None, as the commands print it."""
    return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v


def architecture(cfg: Settings, model: Optional[str] = None, arch_file: Optional[Path] = None,
                 arch: Optional[Mapping] = None) -> dict:
    """The architecture dict of a mapping (a row of the architectures schema or a Hugging Face config), of
    `--arch-file PATH`, or of `--model NAME` (id, name or alias)."""
    if arch is not None:
        try:
            return architecture_from_mapping(dict(arch), "arch")
        except ArchFileError as err:
            raise InputError(str(err)) from None
    try:
        return catalog.resolve_architecture(model, arch_file, measurements=cfg.measurements)
    except catalog.UnknownName as err:
        raise InputError(str(err)) from None


def hardware_row(cfg: Settings, gpu: Optional[str] = None, hardware_file: Optional[Path] = None,
                 hardware: Optional[Mapping] = None) -> dict:
    """The hardware row of a mapping (a row of the hardware_specs schema), of `--hardware-file PATH`, or of
    `--gpu NAME`."""
    if hardware is not None:
        try:
            return hardware_from_mapping(dict(hardware), "hardware")
        except ArchFileError as err:
            raise InputError(str(err)) from None
    try:
        return catalog.resolve_hardware_row(gpu, hardware_file, measurements=cfg.measurements)
    except catalog.UnknownName as err:
        raise InputError(str(err)) from None


def check_hybrid(arch_row: Mapping) -> None:
    """InputError when a hybrid row cannot be predicted (an incomplete Mamba shape, or a counted size far from the
    table's): the rule `predict --runs` applies (models.corpus.runs_adapter.hybrid_problems), for predict, search, curve
    and plan alike."""
    if "hybrid" not in str(arch_row.get("arch") or ""):
        return
    row, why = hybrid_problems(pl.DataFrame([{c: arch_row.get(c) for c in (
        "arch", *catalog.ARCH_MODEL_COLUMNS, *catalog.ARCH_HYBRID_COLUMNS)} | {"arch_params_b": arch_row.get(
            "params_b")}]).with_columns(pl.col("arch_params_b").cast(pl.Float64, strict=False)))
    problem = row.select(why).item()
    if problem:
        raise InputError(f"{arch_row['id']}: {problem}")


def prediction(cfg: Settings, o: Optional[PredictOptions] = None, /, *, arch: Optional[Mapping] = None,
               hardware: Optional[Mapping] = None, keep: Optional[dict] = None, **fields: Any) -> pl.DataFrame:
    """`stepcast predict` for one configuration: the resolved inputs and the prediction, columns in the order
    the command prints them (`PREDICT_COLUMNS`, then the inputs). `arch` / `hardware`: the architecture or
    accelerator as a row (or Hugging Face config) instead of --model / --gpu (`o.runs` is `run_predictions`'s).
    `o.trace`: also write the timeline of the step there (`step_trace`); `keep` receives the configuration and model."""
    o = PredictOptions.given(o, **fields)
    missing = [flag for flag, v in (("--model", o.model or o.arch_file or arch),
                                    ("--gpu", o.gpu or o.hardware_file or hardware), ("--gpus", o.gpus),
                                    ("--global-batch", o.global_batch), ("--seq-len", o.seq_len))
               if v is None]
    if missing:
        raise InputError(f"missing {', '.join(missing)} (or give --runs FILE). See `stepcast predict --help`.")
    arch_row = architecture(cfg, o.model, o.arch_file, arch)
    hw_row = hardware_row(cfg, o.gpu, o.hardware_file, hardware)
    check_hybrid(arch_row)
    if (o.cp or 1) > 1 and "hybrid" in str(arch_row.get("arch") or "") \
            and arch_row.get("mamba_dt_rank") not in (None, "") \
            and arch_row.get("mamba_dt_rank") == arch_row.get("mamba_dt_rank"):  # NaN != NaN: empty
        raise InputError(f"{arch_row['id']}: cp={o.cp}: Mamba-1 mixers (mamba_dt_rank) have no "
                         "context-parallel model (no context-parallel selective scan is published; Megatron-"
                         "Core's MambaContextParallel is for Mamba-2); use cp=1")
    keep = {} if keep is None else keep
    result = predict_config(cfg, o, arch_row, hw_row, None if o.hardware_file or hardware else o.gpu, keep)
    extra = [c for c in result.columns if c not in PREDICT_COLUMNS]
    result = result.select(PREDICT_COLUMNS + extra)
    if o.trace is not None:  # --trace FILE: the timeline of one step, drawn from this prediction
        write_step_trace(o.trace, step_trace_of(keep, result))
    return result


def step_trace_of(keep: Mapping, result: pl.DataFrame) -> dict:
    """The Chrome trace of the step `result` predicts (`keep`: the configuration and model, `predict_config`)."""
    try:
        return trace.trace_document(keep["configs"], keep["model"], result)
    except trace.TraceRefused as err:
        raise InputError(str(err), exit_code=1) from err


def write_step_trace(path: Path, doc: Mapping) -> None:
    """`doc` written to `path`, an InputError naming the file when it cannot be written."""
    try:
        trace.write_trace(path, doc)
    except OSError as err:
        raise InputError(f"--trace {path}: cannot write the trace ({err.strerror or err})", exit_code=1) from err


def step_trace(cfg: Settings, o: Optional[PredictOptions] = None, /, *, arch: Optional[Mapping] = None,
               hardware: Optional[Mapping] = None, **fields: Any) -> dict:
    """The timeline of one optimizer step of the configuration `stepcast predict` would predict with these options,
    as a Chrome trace document (`traceEvents`, pipeline.trace; `o.trace` is not written)."""
    o = PredictOptions.given(o, **fields)
    keep: dict = {}
    result = prediction(cfg, dataclasses.replace(o, trace=None), arch=arch, hardware=hardware, keep=keep)
    return step_trace_of(keep, result)


def run_predictions(cfg: Settings, runs, *, assumptions: str = "realistic",
                    analytical_only: bool = False, calibrate_on=None, source: Optional[str] = None) -> pl.DataFrame:
    """`stepcast predict --runs`: every run of a measurement-schema file (a path) or frame, one row per run_id
    (`calibrate_on` / `source`: the served fit adapted to those runs, `adapt_model`)."""
    check_choice("--assumptions", assumptions, ASSUMPTION_SETS)
    m = adapt_model(cfg, _calibrated().model_for(cfg, analytical_only, assumptions), calibrate_on, source,
                    analytical_only=analytical_only, assumptions=assumptions)
    try:
        if isinstance(runs, pl.DataFrame):
            return predict_frame(runs, cfg.measurements, m)
        return predict_file(runs, cfg.measurements, m)
    except (FileRejected, UnknownName) as err:  # UnknownName: a reference table the reading needs is malformed
        raise InputError(str(err), exit_code=1) from err


def runs_summary(result: pl.DataFrame) -> str:
    """One paragraph on a `run_predictions` result: runs predicted (and why the rest are not, by count), and for the
    runs with a measurement the error of throughput (median and mean absolute, share within 10%), the 90% interval's
    coverage and the runs the memory model calls over capacity."""
    n = result.height
    ok = result.filter(pl.col("step_time_s").is_not_null())
    lines = [f"{n:,} run(s): {ok.height:,} predicted"]
    if ok.height < n:
        why = (result.filter(pl.col("step_time_s").is_null())
               .with_columns(pl.col("error").fill_null("no reason given").str.replace_all(r"\s*'[^']*'", "")
                             .str.replace(r"\s*\(.*$", "").str.slice(0, 80))
               .group_by("error").len().sort("len", descending=True))
        lines[0] += " (not predicted: " + "; ".join(f"{r['len']} {r['error']}" for r in why.head(4).iter_rows(
            named=True)) + (", ..." if why.height > 4 else "") + ")"
    if "error_pct" in ok.columns and (m := ok.filter(pl.col("error_pct").is_not_null())).height:
        e = m["error_pct"].cast(pl.Float64).abs()
        meas = m["measured_tokens_per_s_per_gpu"].cast(pl.Float64)
        covered = ((m["tokens_per_s_per_gpu_lo"].cast(pl.Float64) <= meas)
                   & (meas <= m["tokens_per_s_per_gpu_hi"].cast(pl.Float64))).drop_nulls()
        over = int((m["memory_fits"] == False).sum()) if "memory_fits" in m.columns else 0  # noqa: E712
        lines.append(f"{m.height:,} with a measurement: throughput off by {e.median():.1f}% median, {e.mean():.1f}% "
                     f"mean; {100 * (e <= 10).mean():.0f}% within 10%"
                     + (f"; the 90% interval covers {100 * covered.mean():.0f}%" if covered.len() else "")
                     + f"; {over} over the memory model's capacity")
    return "; ".join(lines)


def layout_search(cfg: Settings, o: Optional[SearchOptions] = None, /, *, arch: Optional[Mapping] = None,
                  hardware: Optional[Mapping] = None, **fields: Any) -> tuple[pl.DataFrame, int, dict, str]:
    """`stepcast search`: (the best layouts ranked, `SEARCH_COLUMNS` first; how many were evaluated; the
    architecture; the accelerator's name). The network options override the accelerator's network tiers (the
    ranking is computed with them). `arch` / `hardware`: rows instead of --model / --gpu. NoResult when no layout
    is feasible."""
    o = SearchOptions.given(o, **fields)
    rank_by, sharding, recompute, dtype, tp_mode = o.rank_by, o.sharding, o.recompute, o.dtype, o.tp_mode
    if rank_by not in ("throughput", "cost"):
        raise InputError(f"--rank-by must be throughput or cost, got '{rank_by}'")
    for name, value, allowed in (("--sharding", sharding, SHARDINGS), ("--recompute", recompute, RECOMPUTES),
                                 ("--activation", o.activation, ("gelu", "swiglu")), ("--dtype", dtype, DTYPES),
                                 ("--tp-mode", tp_mode, TP_MODES)):
        check_choice(name, value, allowed)
    if o.model or o.arch_file or arch is not None:
        arch_row = architecture(cfg, o.model, o.arch_file, arch)
    else:
        missing = [f for f, v in (("--layers", o.layers), ("--d-model", o.d_model), ("--heads", o.heads)) if v is None]
        if missing:
            raise InputError(f"give --model ID, --arch-file PATH or the architecture flags ({', '.join(missing)} "
                             "missing)")
        arch_row = dict(id="custom", n_layers=o.layers, d_model=o.d_model, n_heads=o.heads,
                        n_kv_heads=o.kv_heads or o.heads, ffn_dim=o.ffn_dim or 4 * o.d_model, vocab=o.vocab,
                        activation=o.activation, n_experts=0, top_k=0, tied_embeddings=False)
    check_hybrid(arch_row)  # a hybrid row predict refuses is not searched either
    hw_row = hardware_row(cfg, o.gpu, o.hardware_file, hardware)
    gpu = o.gpu or hw_row.get("id")
    capacity_factor = o.capacity_factor
    if capacity_factor is not None and not (capacity_factor > 0 and math.isfinite(capacity_factor)):
        raise InputError(f"--capacity-factor must be a number > 0 (omit it for dropless), got {capacity_factor}")
    fixed = {k: v for k, v in dict(tp=o.tp, pp=o.pp, dp=o.dp, cp=o.cp, ep=o.ep, etp=o.etp, vpp=o.vpp,
                                   micro_batch=o.micro_batch, sharding=sharding, recompute=recompute, tp_mode=tp_mode,
                                   moe_capacity_factor=capacity_factor).items() if v is not None}
    overrides = network_overrides(o.scaleup_size, o.scaleup_gbps, o.scaleout_gbps, o.oversubscription, o.pod_size)
    result, n_evaluated, model = search_layouts(cfg, arch=arch_row, hw_row=hw_row, gpus=o.gpus,
                                            global_batch=o.global_batch, seq_len=o.seq_len, fixed=fixed, dtype=dtype,
                                            top=o.top, rank_by=rank_by, analytical_only=o.analytical_only,
                                            assumptions=o.assumptions, hw_overrides=overrides,
                                            calibrate_on=o.calibrate_on, source=o.source, stack=o.stack)
    if result.height == 0:
        broken = layout_problems(arch_row, gpus=o.gpus, global_batch=o.global_batch, seq_len=o.seq_len, tp=o.tp,
                                 pp=o.pp, cp=o.cp, dp=o.dp, micro_batch=o.micro_batch, ep=o.ep, etp=o.etp, vpp=o.vpp)
        why = f": {'; '.join(broken.values())}" if broken else ""
        raise NoResult(f"no feasible layout among {n_evaluated:,} evaluated for {arch_row['id']} on {o.gpus} x {gpu} "
                       f"(batch {o.global_batch} x {o.seq_len}{', fixed ' + str(fixed) if fixed else ''}){why}. Try "
                       f"more GPUs, a smaller micro-batch, recompute, or sharding.")
    result = _with_network_note(result.with_row_index("rank", offset=1), o.oversubscription, o.pod_size)
    result = with_adaptation(result, model)
    extra = [c for c in result.columns if c not in SEARCH_COLUMNS]
    result = result.select([c for c in SEARCH_COLUMNS if c in result.columns] + extra)
    return result, n_evaluated, arch_row, gpu


# ---------------------------------------------------------------- curve and frontier

def tier_hardware(cfg: Settings, o: CurveOptions | FrontierOptions) -> dict:
    """The resolved hardware row of `o.gpu`, with the network tiers (and the frontier's memory) overridden where an
    option gives them."""
    gpu, scaleup_size, scaleup_gbps, scaleout_gbps = o.gpu, o.scaleup_size, o.scaleup_gbps, o.scaleout_gbps
    oversubscription, pod_size, memory_gb = o.oversubscription, o.pod_size, getattr(o, "memory_gb", None)
    check_network(scaleup_size, scaleup_gbps, scaleout_gbps, memory_gb, oversubscription, pod_size)
    try:
        hw_row = catalog.find_hardware(cfg.measurements, gpu)
    except catalog.UnknownName as err:
        raise InputError(str(err)) from None
    hw_row = dict(hw_row)
    if memory_gb is not None:
        hw_row["memory_gb"] = float(memory_gb)
    if scaleup_gbps is not None:
        hw_row["intra_node_bw_gbps"] = float(scaleup_gbps)
    if scaleout_gbps is not None:
        hw_row["inter_node_bw_gbps"] = float(scaleout_gbps)
    hw = resolve_hardware(pl.DataFrame([hw_row]), strict=False).row(0, named=True)
    if hw.get("hardware_error"):
        raise InputError(f"--gpu {gpu}: {hw['hardware_error']}", exit_code=1)
    if scaleup_size is not None:
        hw["scaleup_size"] = float(scaleup_size)
        hw["gpus_per_node_typical"] = int(scaleup_size)
    for k, v in (("oversubscription", oversubscription), ("pod_size", pod_size)):
        if v is not None:
            hw[k] = float(v)
    check_pod(pod_size, hw)
    return hw


def overrides_note(o: Options) -> str:
    """" (overridden: ...)": the network tiers (and the frontier's memory) the options override, for a title."""
    memory_gb = getattr(o, "memory_gb", None)  # the frontier's
    parts = [f"{k} {v:g}" for k, v in (("scale-up size", o.scaleup_size), ("scale-up GB/s", o.scaleup_gbps),
                                       ("scale-out GB/s", o.scaleout_gbps), ("memory GB", memory_gb),
                                       ("pod size", o.pod_size)) if v is not None]
    if o.oversubscription is not None and o.oversubscription != 1:
        parts.append(f"oversubscription {o.oversubscription:g}:1")
    return f" (overridden: {', '.join(parts)})" if parts else ""


def physics(cfg: Settings, assumptions: str, residual: bool = True, analytical_only: bool = False, o=None):
    """(residual hook, model, note) under an assumption set, from the promoted fit (`models.fitting.predictor`, the one
    prediction function): 'realistic' is the fit (``residual=False``: the frontier ranks and reports with the
    model directly, no post-hoc hook); 'ideal' is Epoch AI's ideal conditions on the fit's physics, no residual.
    Without a fit the priors answer."""
    try:
        check_assumptions(assumptions)
    except ValueError as err:
        raise InputError(f"--{err}") from None
    check_adaptable(getattr(o, "calibrate_on", None), getattr(o, "source", None), analytical_only, assumptions)
    bundle = None if analytical_only else _calibrated().promoted_fit(cfg)
    if analytical_only:
        if assumptions == "ideal":
            return None, params_for("ideal", DEFAULT), "ideal: Epoch AI's ideal conditions on the priors"
        return None, DEFAULT, "analytical: the prior parameters (--analytical-only)"
    if bundle is None:
        if assumptions == "ideal":
            return None, params_for("ideal", DEFAULT), "ideal: Epoch AI's ideal conditions on the priors"
        return None, DEFAULT, "realistic: analytical only: no promoted calibration fit"
    if assumptions == "ideal":
        return None, Predictor(bundle, "ideal"), (f"ideal: Epoch AI's ideal conditions on fit {bundle.version}'s "
                                                  "physics (no residual)")
    if not residual:
        return None, Predictor(bundle), f"realistic: calibrated with fit {bundle.version}"
    model = adapt_model(cfg, Predictor(bundle), getattr(o, "calibrate_on", None), getattr(o, "source", None))
    hook, params, note = _planning()[0].calibration_from_bundle(bundle, model.adaptation)
    return hook, params, f"realistic: {note}"


def check_batch_rule(batch_rule: str) -> None:
    rules = _planning()[0].BATCH_RULES
    if batch_rule not in rules:
        raise InputError(f"--batch-rule must be one of {', '.join(rules)}, got '{batch_rule}'")


def scaling_curve(cfg: Settings, o: Optional[CurveOptions] = None, /, *, arch: Optional[Mapping] = None,
                  **fields: Any) -> tuple[dict, str]:
    """`stepcast curve`: (the document `--format json` prints, with the points as a frame under "points" and
    the inflection under "inflection"; the header line the table and CSV print). `arch`: a row instead of --model."""
    o = CurveOptions.given(o, **fields)
    curves, _ = _planning()
    policy, tokens, seq_len, per_gpu_batch, threshold, dtype = o.policy, o.tokens, o.seq_len, o.per_gpu_batch, \
        o.threshold, o.dtype
    assumptions, batch_rule, gpu = o.assumptions, o.batch_rule, o.gpu
    if policy not in curves.POLICIES:
        raise InputError(f"--policy must be one of {', '.join(curves.POLICIES)}, got '{policy}'")
    if tokens is not None and not (tokens > 0 and math.isfinite(tokens)):
        raise InputError(f"--tokens must be a positive number of tokens, got {tokens}")
    if not 0 < threshold <= 1:
        raise InputError(f"--threshold must be in (0, 1], got {threshold}")
    if policy != "strong" and per_gpu_batch <= 0:
        raise InputError(f"--per-gpu-batch must be > 0 for the {policy} policy, got {per_gpu_batch}")
    if dtype is not None and dtype not in DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, got '{dtype}'")
    arch_row = architecture(cfg, o.model, o.arch_file, arch)
    check_hybrid(arch_row)
    check_batch_rule(batch_rule)
    hook, params, note = physics(cfg, assumptions, analytical_only=o.analytical_only, o=o)
    hw = tier_hardware(cfg, o)
    stack_row, _, stack_note = stack_inputs(cfg, o.stack, hw.get("id"))
    hw = hw | stack_row
    if stack_note:
        note = f"{note}; {stack_note}"
    n_params = curves._arch_params(arch_row)
    tokens = tokens if tokens is not None else 20.0 * n_params
    batch = o.global_batch or curves.round_batch(4 * 2**20 / seq_len)
    try:
        c = curves.scaling_curve(arch_row, hw, policy, seq_len=seq_len, tokens=tokens, global_batch_seqs=batch,
                                 per_gpu_batch_seqs=per_gpu_batch, n_max=o.max_gpus,
                                 dtype=dtype or curves.default_dtype(hw), params=params,
                                 usd_per_gpu_hour=hw.get("cloud_usd_per_hour"), calibrate=hook, batch_rule=batch_rule)
    except ValueError as err:
        raise InputError(str(err)) from None
    c = curves.verdict(c, threshold)  # which sizes pay at this threshold, and why a point looks odd
    rec = curves.inflection(c, threshold)
    price = hw.get("cloud_usd_per_hour")
    c = c.with_columns(pl.lit(assumptions).alias("assumptions"))
    over = overrides_note(o)
    header = (f"{arch_row['id']} on {gpu}{over}, {assumptions} "
              f"assumptions, {policy} scaling, seq {seq_len}, {tokens:.3g} tokens"
              + (f", batch {batch} seqs" if policy == "strong" else f", {per_gpu_batch:g} seq/GPU")
              + f"; {note}; cost: " + (f"${price}/GPU-h (hardware.cloud_usd_per_hour)" if price else
                                       "none (no price for this accelerator)"))
    doc = {"model": arch_row["id"], "gpu": gpu, "assumptions": assumptions, "batch_rule": batch_rule,
           "policy": policy, "seq_len": seq_len, "tokens": tokens, "calibration": note,
           "inflection": {k: clean(v) for k, v in rec.items()}, "explanation": curves.explain(rec),
           "points": c.select([x for x in CURVE_COLUMNS if x in c.columns])}
    if network_note(o.oversubscription, o.pod_size):
        doc["network"] = {"oversubscription": o.oversubscription, "pod_size": o.pod_size}
    return doc, header


def compute_frontier(cfg: Settings, o: Optional[FrontierOptions] = None, /,
                     **fields: Any) -> tuple[dict, pl.DataFrame, str]:
    """`stepcast frontier`: (the document `--format json` prints, before NaN becomes None; the sweep of every compute
    level; the title). NoResult when no level is trainable (its `detail` has "reason", "sweep", "title").
    (`o.table` is the printout's: `frontier_document`.)"""
    o = FrontierOptions.given(o, **fields)
    curves, frontier = _planning()
    gpu, months, min_utilization, assumptions, batch_rule = o.gpu, o.months, o.min_utilization, o.assumptions, \
        o.batch_rule
    if not (months > 0 and math.isfinite(months)):
        raise InputError(f"--months must be > 0, got {months}")
    if not 0 < min_utilization <= 1:
        raise InputError(f"--min-utilization must be in (0, 1], got {min_utilization}")
    check_batch_rule(batch_rule)
    check_choice("--tp-form", o.tp_form, frontier.TP_FORMS)
    _, params, note = physics(cfg, assumptions, residual=False, analytical_only=o.analytical_only)
    hw = tier_hardware(cfg, o)
    dt = o.dtype or curves.default_dtype(hw)
    def under(rule: str) -> tuple[pl.DataFrame, dict]:
        sw = frontier.frontier_sweep(hw, months, params=params, dtype=dt, usd_per_gpu_hour=hw.get("cloud_usd_per_hour"),
                                     assumptions=assumptions, batch_rule=rule, tp_form=o.tp_form)
        return sw, frontier.frontier_summary(sw, min_utilization)

    sweep, s = under(batch_rule)
    over = overrides_note(o)
    title = (f"frontier of {gpu}{over}: {assumptions} assumptions, {months:g} months, >= {min_utilization:g} x best "
             f"utilization, {batch_rule} batch rule ({note})")
    if not s["found"]:
        raise NoResult(f"no compute level is trainable on {gpu} within {months:g} months ({assumptions} "
                       f"assumptions): {s['reason']}", detail={"reason": s["reason"], "sweep": sweep, "title": title})
    result = {"max_training_flop": s["training_flop"], "n_gpus": s["n_gpus"], "tp": s["tp"], "pp": s["pp"],
              "dp": s["dp"], "ep": s["ep"], "cp": s["cp"], "utilization": s["utilization"], "params": s["params"],
              "tokens": s["tokens"], "cost_usd": clean(s["cost_usd"]), "assumptions": assumptions,
              "batch_rule": batch_rule, "binding": s["binding"], "crossing_flop": s["crossing_flop"],
              "ended_by": s["ended_by"], "cost_basis": s["cost_basis"],
              "latency_wall_days": s["latency_wall_days"],
              "breakdown": {k: s[k] for k in BREAKDOWN_KEYS},
              "layout": {k: s[k] for k in ("vpp", "micro_batch", "sharding", "recompute", "global_batch_seqs",
                                           "tp_mode")},
              "model": {k: s[k] for k in ("arch_id", "d_model", "n_layers", "n_heads", "seq_len")},
              "gpu": gpu, "network": {"scaleup_size": hw.get("scaleup_size"),
                                      "scaleup_gbps": hw.get("intra_node_bw_gbps"),
                                      "scaleout_gbps": hw.get("inter_node_bw_gbps"), "memory_gb": hw.get("memory_gb"),
                                      "oversubscription": hw.get("oversubscription", 1.0),
                                      "pod_size": hw.get("pod_size")},
              "dtype": dt, "months": months, "min_utilization": min_utilization,
              "best_utilization": s["best_utilization"], "best_utilization_flop": s["best_utilization_flop"],
              "utilization_threshold": s["utilization_threshold"],
              "time_to_train_days": s["time_to_train_days"], "usd_per_gpu_hour": clean(s["usd_per_gpu_hour"]),
              "launch_price_usd": clean(s["launch_price_usd"]), "model_flop": s["model_flop"],
              "calibration": note,
              "training_flop_convention": "6 x params x tokens (Chinchilla); utilization = MFU (stepcast FLOPs)"}
    for k in ("peak_utilization", "ended_by_reason", "largest_feasible_flop", "reach_ended_by", "reach_reason",
              "latency_wall_flop"):
        result[k] = s[k]
    # the band between the batch laws: the frontier under each critical-batch law (and the one asked for)
    by_rule = {batch_rule: s} | {r: under(r)[1] for r in frontier.BAND_RULES if r != batch_rule}
    result["batch_rules"] = {r: {"max_training_flop": x.get("training_flop") if x["found"] else None,
                                 "n_gpus": x.get("n_gpus") if x["found"] else None,
                                 "utilization": x.get("utilization") if x["found"] else None,
                                 "ended_by": x.get("ended_by"), "largest_feasible_flop": x.get("largest_feasible_flop"),
                                 "reach_ended_by": x.get("reach_ended_by")} for r, x in by_rule.items()}
    found = [x["max_training_flop"] for x in result["batch_rules"].values() if x["max_training_flop"] is not None]
    result["batch_rule_band_flop"] = [min(found), max(found)]
    return result, sweep, title


def frontier_levels(sweep: pl.DataFrame) -> pl.DataFrame:
    """Every compute level of a frontier sweep, the columns `--table` prints in JSON."""
    return sweep.select([c for c in LEVEL_COLUMNS if c in sweep.columns])


def curve_document(doc: dict) -> dict:
    """What `stepcast curve --format json` prints (and `stepcast serve` answers) of a `scaling_curve` document."""
    return dict(doc, points=json_rows(doc["points"]))


def frontier_document(result: dict, sweep: pl.DataFrame, table: bool = False) -> dict:
    """What `stepcast frontier --format json` prints (and `stepcast serve` answers) of a `compute_frontier`
    answer; with `table`, every level as `--table` adds them."""
    out = {k: clean(v) for k, v in result.items()}
    if table:
        out["levels"] = json_rows(frontier_levels(sweep))
    return out


# ---------------------------------------------------------------- plan

def plan_prices(source: str, price_file: Optional[Path], measurements: Path):
    """Per-accelerator USD/hour by the chosen price source -> (dict id -> price, label)."""
    if price_file is not None or source.startswith("custom"):
        path = price_file or Path(source.split(":", 1)[1] if ":" in source else "")
        if not path or not Path(path).exists():
            raise InputError(f"--price-source custom needs a file: --price-source custom:FILE or --price-file FILE "
                             f"(CSV with columns hardware,usd_per_gpu_hour); got '{path}'")
        try:
            frame = pl.read_csv(path)
        except Exception as err:  # noqa: BLE001
            raise InputError(f"{path}: unreadable CSV ({err})") from None
        missing = [c for c in ("hardware", "usd_per_gpu_hour") if c not in frame.columns]
        if missing:
            raise InputError(f"{path}: missing column(s) {', '.join(missing)} (expected hardware,usd_per_gpu_hour)")
        bad = frame.with_row_index("i").filter(~(pl.col("usd_per_gpu_hour").cast(pl.Float64, strict=False) > 0))
        if bad.height:
            raise InputError(f"{path}: line {int(bad['i'][0]) + 2}, column usd_per_gpu_hour: expected a price > 0")
        return dict(zip(frame["hardware"], frame["usd_per_gpu_hour"].cast(pl.Float64))), f"custom:{path}"
    if source == "median":
        hw = catalog.hardware(measurements).filter(pl.col("cloud_usd_per_hour").is_not_null())
        return dict(zip(hw["id"], hw["cloud_usd_per_hour"].cast(pl.Float64))), "median"
    if source.startswith("cloud:"):
        cloud = source.split(":", 1)[1]
        prices = pl.read_csv(measurements / "cloud_prices.csv")
        known = sorted(prices["cloud"].unique().to_list())
        if cloud not in known:
            raise InputError(f"--price-source cloud:{cloud}: unknown cloud; expected one of {', '.join(known)}")
        per = (prices.filter(pl.col("cloud") == cloud)
               .group_by("accelerator_id")
               .agg((pl.col("price_usd_per_hour") / pl.col("accelerator_count")).median().alias("p")))
        return dict(zip(per["accelerator_id"], per["p"])), source
    raise InputError(f"--price-source must be median, cloud:NAME or custom:FILE, got '{source}'")


def training_plan(cfg: Settings, o: Optional[PlanOptions] = None, /, *, arch: Optional[Mapping] = None,
                  warn: Optional[Callable[[str], None]] = None, **fields: Any) -> tuple[pl.DataFrame, str]:
    """`stepcast plan`: (the ranked options, the columns the command prints; the title). NoResult when nothing
    meets the ask (`detail["empty_json"]`: the command prints `[]` for JSON). `warn` receives the warnings
    the command prints (plans past a year without a deadline). The network options override every candidate
    accelerator's tiers, as in `search`. `arch`: a row instead of --model."""
    o = PlanOptions.given(o, **fields)
    tokens, deadline_days, budget_usd, hardware, max_gpus = o.tokens, o.deadline_days, o.budget_usd, o.hardware, \
        o.max_gpus
    seq_len, dtype, optimal, top, assumptions = o.seq_len, o.dtype, o.optimal, o.top, o.assumptions
    batch_tokens, pod_size = o.global_batch_tokens, o.pod_size
    overrides = {k: v for k, v in network_overrides(o.scaleup_size, o.scaleup_gbps, o.scaleout_gbps,
                                                    o.oversubscription, pod_size).items() if v is not None}
    if assumptions not in ASSUMPTION_SETS:
        raise InputError(f"--assumptions must be one of {', '.join(ASSUMPTION_SETS)}, got '{assumptions}'")
    if tokens is not None and not (tokens > 0 and math.isfinite(tokens)):
        raise InputError(f"--tokens must be a positive number, got {tokens}")
    for name, v in (("--deadline-days", deadline_days), ("--budget-usd", budget_usd)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise InputError(f"{name} must be a positive number, got {v}")
    if optimal and budget_usd is None:
        raise InputError("--optimal needs --budget-usd (the compute you can buy decides the model size)")
    if not optimal and (tokens is None or (o.model is None and o.arch_file is None and arch is None)):
        raise InputError("--model (or --arch-file) and --tokens are required (or use --optimal with --budget-usd)")
    if batch_tokens < seq_len:
        raise InputError(f"--global-batch-tokens ({batch_tokens}) must be at least --seq-len ({seq_len})")
    check_choice("--deadline-at", o.deadline_at, DEADLINE_AT)
    days_col = "days_hi" if o.deadline_at == "upper" else "days"  # the days that must meet the deadline
    prices, price_label = plan_prices(o.price_source, o.price_file, cfg.measurements)
    hw_all = resolve_hardware(catalog.hardware(cfg.measurements), strict=False)
    if hardware:
        try:  # names as people say them (H100, gb200) resolve to the table's ids
            wanted = [catalog.find_hardware(cfg.measurements, h.strip())["id"] for h in hardware.split(",")
                      if h.strip()]
        except catalog.UnknownName as err:
            raise InputError(str(err)) from None
        no_price = [h for h in wanted if h not in prices]
        if no_price:  # the table's reason where it gives one (hardware_specs.csv price_ref "no price: ...")
            refs = dict(zip(hw_all["id"], hw_all["price_ref"])) if "price_ref" in hw_all.columns else {}
            why = "".join(f" ({h}: {refs[h].removeprefix('no price: ')})" for h in no_price
                          if price_label == "median" and str(refs.get(h) or "").startswith("no price: "))
            raise InputError(f"no {price_label} price for {', '.join(no_price)}{why}; give one with --price-source "
                             "custom:FILE")
    else:
        wanted = [h for h in hw_all["id"].to_list() if h in prices]
    hw_rows = [r | {k: float(v) for k, v in overrides.items()}
               for r in hw_all.filter(pl.col("id").is_in(wanted) & pl.col("hardware_error").is_null())
               .iter_rows(named=True)]
    for r in hw_rows:
        check_pod(pod_size, r)
    stack_note, grid = "", None
    if o.stack is not None:  # each accelerator's configurations with the stated stack (`stack_inputs`)
        rows = []
        for r in hw_rows:
            inputs, read, stack_note = stack_inputs(cfg, o.stack, r.get("id"))
            rows.append(r | inputs)
        hw_rows = rows
        if read is not None and read["sharding_options"]:  # the plan's shardings the stack can run
            own = [x for x in P.PLAN_GRID["sharding"] if x in read["sharding_options"]]
            grid = dict(P.PLAN_GRID, sharding=own or list(read["sharding_options"]))
    pred_model = options_model(cfg, o, assumptions)
    seqs = max(batch_tokens // seq_len, 1)

    if optimal:
        result = _optimal(hw_rows, prices, budget_usd, deadline_days, max_gpus, seq_len, seqs, dtype, pred_model)
        if result.height == 0:
            raise NoResult("no hardware in the list can train a model within the budget"
                           + (f" and {deadline_days:g} days" if deadline_days else "") + "; raise --budget-usd, "
                           "--deadline-days or --max-gpus")
        result = result.sort("loss").head(top).with_row_index("rank", offset=1)
        result = with_adaptation(result, pred_model)
        return (result.select([c for c in OPTIMAL_COLUMNS + ADAPTATION_COLUMNS if c in result.columns]),
                f"compute-optimal plans for ${budget_usd:,.0f} (Chinchilla loss, lower is better)"
                + overrides_note(o))

    arch_row = architecture(cfg, o.model, o.arch_file, arch)
    check_hybrid(arch_row)
    frame = P.plan_rows(arch_row, hw_rows, tokens, seqs, seq_len, max_gpus, prices, dtype=dtype, model=pred_model,
                        grid=grid)
    if frame.height == 0:
        raise NoResult(f"{arch_row['id']} fits on none of {', '.join(wanted)} up to {max_gpus} accelerators; raise "
                       "--max-gpus")
    frame = frame.with_columns(pl.lit(price_label).alias("price_source"))
    ok = frame
    if deadline_days is not None:
        ok = ok.filter(pl.col(days_col) <= deadline_days)
    if budget_usd is not None:
        ok = ok.filter(pl.col("cost_usd") <= budget_usd)
    if ok.height == 0:
        fastest = frame.sort("days").row(0, named=True)
        cheapest = frame.sort("cost_usd").row(0, named=True)
        msg = [f"no option meets the ask for {arch_row['id']} on {tokens:.3g} tokens"]
        if deadline_days is not None:
            if days_col != "days":
                fastest = frame.sort(days_col).row(0, named=True)
                msg.append(f"at the interval's upper bound (--deadline-at upper) the fastest found takes "
                           f"{fastest[days_col]:.1f} days ({fastest['days']:.1f} at the point estimate)")
            msg.append(f"the fastest found takes {fastest['days']:.1f} days ({fastest['n_gpus']:,} x "
                       f"{fastest['hardware']}, ${fastest['cost_usd']:,.0f}); a {deadline_days:g}-day deadline needs "
                       f"a larger --max-gpus (now {max_gpus:,}) or --global-batch-tokens (now {batch_tokens:,}: data "
                       f"parallelism cannot exceed its {seqs:,} sequences), faster hardware, or fewer tokens")
        if budget_usd is not None:
            msg.append(f"the cheapest found costs ${cheapest['cost_usd']:,.0f} ({cheapest['n_gpus']:,} x "
                       f"{cheapest['hardware']}, {cheapest['days']:.1f} days); the budget would need to be at "
                       f"least that")
        raise NoResult("; ".join(msg), detail={"empty_json": True})
    order = "cost_usd" if deadline_days is not None or budget_usd is None else "days"
    late = pl.lit(False)
    if deadline_days is None and budget_usd is None:
        # no deadline: the cheapest plans are the slowest; those past a year are ranked last, with a warning
        late = pl.col("days") > NO_DEADLINE_HORIZON_DAYS
        n_late = ok.filter(late).height
        if n_late and warn is not None:
            warn(f"no --deadline-days given; {n_late} of {ok.height} plans take more than "
                 f"{NO_DEADLINE_HORIZON_DAYS} days and are ranked last (give --deadline-days to rank by cost within "
                 "it)")
    ok = ok.with_columns(late.alias("_late")).sort(["_late", order, "days"]).drop("_late").head(top) \
        .with_row_index("rank", offset=1)
    ok = with_adaptation(ok, pred_model)
    if stack_note and "assumptions" in ok.columns:
        ok = ok.with_columns(pl.concat_str([pl.col("assumptions"), pl.lit(stack_note)], separator="; ")
                             .alias("assumptions"))
    past = ok.filter(pl.col("days_hi") > deadline_days) if deadline_days is not None else ok.clear()
    within = (f" within {deadline_days:g} days" + (" at the interval's upper bound" if days_col != "days" else
                                                   " at the point estimate" + (
        f" ({past.height} of them take up to {past['days_hi'].max():.0f} days at the interval's upper bound: "
        "--deadline-at upper plans to it)" if past.height else ""))) if deadline_days else ""
    title = (f"{arch_row['id']}, {tokens:.3g} tokens: best {ok.height} by {order.replace('_usd', '')}"
             + within
             + (f" within ${budget_usd:,.0f}" if budget_usd else "")
             + f" — {title_of('plan', ok).split(' — ', 1)[-1]}"
             + overrides_note(o))
    ok = _with_network_note(ok, o.oversubscription, pod_size)
    return ok.select([c for c in PLAN_COLUMNS + ADAPTATION_COLUMNS if c in ok.columns]), title


def _optimal(hw_rows, prices, budget, deadline, max_gpus, seq_len, seqs, dtype, phys):
    """For each hardware and cluster size: the Chinchilla-optimal model for the compute the budget buys at the
    MFU the model predicts for that model on that cluster (fixed point of size -> MFU -> compute -> size)."""
    out = []
    for hw in hw_rows:
        price = prices[hw["id"]]
        gpu_hours = budget / price
        peak = hw.get("peak_bf16_tflops") or hw.get("peak_fp32_tflops")
        for n in P.cluster_sizes(hw.get("scaleup_size") or 8, max_gpus):
            hours = gpu_hours / n
            if deadline is not None and hours / 24.0 > deadline:
                continue
            mfu, best, shape, n_opt, d_opt = 0.4, None, None, None, None
            for _ in range(3):
                compute = n * peak * 1e12 * mfu * hours * 3600.0
                n_opt, d_opt = P.CHINCHILLA.optimal(compute)
                shape = {k: float(v) for k, v in P.dense_shape(n_opt).items()}
                arch = dict(shape, activation="gelu", n_experts=0, top_k=0, tied_embeddings=False)
                res = run_search(arch, hw, n, seqs, seq_len, fixed=P.PLAN_GRID, dtype=dtype, top_k=1,
                             **({"params": phys} if phys is not None else {}))
                if res.height == 0:
                    best = None
                    break
                best = res.row(0, named=True)
                mfu = best["mfu"]
            if best is None or not hours > 0:
                continue
            rel = P.reliability(hours * 3600.0, n, n_opt)
            # the budget buys `hours` of wall-clock; interruptions eat (1 - goodput) of it
            compute = n * peak * 1e12 * mfu * hours * 3600.0 * float(rel["goodput"])
            n_opt, d_opt = P.CHINCHILLA.optimal(compute)
            out.append(dict(hardware=hw["id"], n_gpus=n, params=float(n_opt), tokens=float(d_opt),
                            loss=float(P.CHINCHILLA.loss(n_opt, d_opt)), training_flop=float(compute),
                            days=hours / 24.0, cost_usd=budget,
                            energy_mwh=float(P.energy_mwh(n, hw.get("tdp_w") or np.nan, hours * 3600.0)),
                            mfu=mfu, tp=best["tp"], pp=best["pp"], dp=best["dp"], cp=best["cp"],
                            n_layers=shape["n_layers"], d_model=shape["d_model"], usd_per_gpu_hour=price))
    return pl.DataFrame(out) if out else pl.DataFrame()
