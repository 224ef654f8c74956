"""The functions behind the commands, on plain Python / polars inputs: the CLI, the serve API and Python
callers use the same ones (`from pipeline import api`).

Every function resolves names (model, accelerator), applies and REPORTS its defaults, and predicts through
the one prediction function (`models.predictor`). Bad input raises `InputError` with a message that names
the flag or field and what was expected.
"""

from __future__ import annotations

from typing import Any, Optional

import polars as pl

from pipeline.settings import Settings

SHARDINGS = ("none", "zero1", "zero2", "zero3", "fsdp", "hsdp")
RECOMPUTES = ("none", "selective", "full")
DTYPES = ("bf16", "fp16", "fp8", "fp8-cs", "mxfp8", "nvfp4", "fp32", "tf32")
ASSUMPTION_SETS = ("realistic", "ideal")


class InputError(ValueError):
    """Bad input to a command: the message says which flag/field and what was expected."""

    exit_code = 2  # the CLI's exit status for it (1 where the data, not the flag, is at fault)


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


def check_network(scaleup_size=None, scaleup_gbps=None, scaleout_gbps=None, memory_gb=None) -> None:
    """The network-tier (and memory) overrides are positive finite numbers, else InputError naming the flag."""
    import math

    for flag, v in (("--scaleup-size", scaleup_size), ("--scaleup-gbps", scaleup_gbps),
                    ("--scaleout-gbps", scaleout_gbps), ("--memory-gb", memory_gb)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise InputError(f"{flag} must be a positive number, got {v}")


def network_overrides(scaleup_size: Optional[int] = None, scaleup_gbps: Optional[float] = None,
                      scaleout_gbps: Optional[float] = None) -> dict:
    """`resolved_hardware` overrides of the network tiers (checked), as `stepcast curve` applies them."""
    check_network(scaleup_size, scaleup_gbps, scaleout_gbps)
    out = {"intra_node_bw_gbps": scaleup_gbps, "inter_node_bw_gbps": scaleout_gbps}
    if scaleup_size is not None:
        out.update(scaleup_size=scaleup_size, gpus_per_node_typical=scaleup_size)
    return out


def resolve_names(cfg: Settings, model: Optional[str] = None, gpu: Optional[str] = None, arch: Optional[dict] = None,
                  hw_row: Optional[dict] = None) -> tuple[dict, dict]:
    """(architecture row, hardware row) from names (ids or aliases) or given rows."""
    from pipeline import catalog

    try:
        arch = arch if arch is not None else catalog.find_architecture(cfg.measurements, model)
        hw_row = hw_row if hw_row is not None else catalog.find_hardware(cfg.measurements, gpu)
    except catalog.UnknownName as err:
        raise InputError(str(err)) from None
    return arch, hw_row


def resolved_hardware(hw_row: dict, overrides: Optional[dict] = None) -> dict:
    from models.hardware import resolve_hardware

    hw = resolve_hardware(pl.DataFrame([hw_row]), strict=False).row(0, named=True)
    if hw.get("hardware_error"):
        raise InputError(f"hardware {hw_row.get('id')}: {hw['hardware_error']}")
    for k, v in (overrides or {}).items():
        if v is not None:
            hw[k] = float(v)
    return hw


def predict_config(cfg: Settings, *, model: Optional[str] = None, gpu: Optional[str] = None, gpus: int,
                   global_batch: int, seq_len: int, micro_batch: Optional[int] = None, tp: int = 1, pp: int = 1,
                   dp: Optional[int] = None, cp: int = 1, ep: int = 1, vpp: int = 1, sharding: Optional[str] = None,
                   recompute: Optional[str] = None, sequence_parallel: Optional[bool] = None,
                   dtype: str = "bf16", gpus_per_node: Optional[int] = None,
                   inter_node_gbps: Optional[float] = None, analytical_only: bool = False,
                   assumptions: str = "realistic", arch: Optional[dict] = None,
                   hw_row: Optional[dict] = None) -> pl.DataFrame:
    """One configuration: a one-row frame with the resolved inputs, the prediction (calibrated unless
    `analytical_only`), its interval and provenance (`fit_version`, `assumptions`, `calibration_domain`).
    `assumptions` also lists every default applied. An invalid layout raises InputError with the reason."""
    from models.predictor import predict
    from pipeline import catalog
    from pipeline.calibrated import model_for

    check_choice("--sharding", sharding, SHARDINGS)
    check_choice("--recompute", recompute, RECOMPUTES)
    check_choice("--dtype", dtype, DTYPES)
    check_choice("--assumptions", assumptions, ASSUMPTION_SETS)
    arch, hw_row = resolve_names(cfg, model, gpu, arch, hw_row)
    hw = resolved_hardware(hw_row, {"inter_node_bw_gbps": inter_node_gbps})
    check_precision(dtype, hw)
    defaults = []
    if dp is None:
        if gpus % (tp * pp * cp):
            raise InputError(f"--gpus {gpus} is not divisible by tp*pp*cp = {tp * pp * cp}")
        dp = gpus // (tp * pp * cp)
        defaults.append(f"dp=N/(tp*pp*cp)={dp}")
    if micro_batch is None:
        micro_batch = 1
        defaults.append("micro_batch=1")
    if sharding is None:
        sharding = "zero1" if dp * cp > 1 else "none"
        defaults.append(f"sharding={sharding}")
    if recompute is None:
        recompute = "selective"
        defaults.append("recompute=selective")
    if sequence_parallel is None:
        sequence_parallel = tp > 1
        defaults.append(f"sequence_parallel={'on' if sequence_parallel else 'off'}")
    if gpus_per_node is None:
        gpus_per_node = int(min(hw["scaleup_size"] or 8, gpus))
        defaults.append(f"gpus_per_node={gpus_per_node}")
    row = {c: arch.get(c) for c in catalog.ARCH_MODEL_COLUMNS}
    row.update(run_id="cli", model=arch.get("id"), gpu=hw_row.get("id"), seq_len=seq_len,
               global_batch_seqs=global_batch, micro_batch=micro_batch, n_gpus=gpus, tp=tp, pp=pp, dp=dp, cp=cp,
               ep=ep, vpp=vpp, sharding=sharding, recompute=recompute, sequence_parallel=sequence_parallel,
               dtype=dtype, gpus_per_node=gpus_per_node)
    configs = pl.DataFrame([row]).hstack(pl.DataFrame([{k: v for k, v in hw.items() if k not in row}]))
    m = model_for(cfg, analytical_only, assumptions)
    res = predict(configs, m)
    err = res["error"][0]
    if err is not None and not err.startswith("memory"):
        raise InputError(f"invalid configuration: {err}")
    inputs = pl.DataFrame([{k: row[k] for k in ("run_id", "model", "gpu", "n_gpus", "tp", "pp", "dp", "cp", "ep", "vpp",
                                                 "micro_batch", "global_batch_seqs", "seq_len", "sharding",
                                                 "recompute", "sequence_parallel", "dtype", "gpus_per_node")}])
    res = res.with_columns((pl.col("assumptions") + pl.lit("; defaults: " + ", ".join(defaults) if defaults else ""))
                           .alias("assumptions"))
    return inputs.hstack(res.with_columns(pl.lit(float(hw["inter_node_bw_gbps"])).alias("inter_node_bw_gbps")))


def search_layouts(cfg: Settings, *, arch: dict, hw_row: dict, gpus: int, global_batch: int, seq_len: int,
                   fixed: Optional[dict] = None, dtype: str = "bf16", top: int = 10, rank_by: str = "throughput",
                   analytical_only: bool = False, assumptions: str = "realistic",
                   hw_overrides: Optional[dict] = None) -> tuple[pl.DataFrame, int, Any]:
    """(best layouts, number evaluated, model used), ranked by the calibrated figure of the one function."""
    from models.search import search as run_search
    from pipeline.calibrated import model_for

    check_choice("--dtype", dtype, DTYPES)
    check_choice("--assumptions", assumptions, ASSUMPTION_SETS)
    if rank_by not in ("throughput", "cost"):
        raise InputError(f"--rank-by must be throughput or cost, got '{rank_by}'")
    hw = resolved_hardware(hw_row, hw_overrides)
    check_precision(dtype, hw)
    m = model_for(cfg, analytical_only, assumptions)
    price = hw_row.get("cloud_usd_per_hour")
    result, n = run_search(arch, hw, gpus, global_batch, seq_len, fixed=fixed or {}, dtype=dtype, top_k=top,
                           rank_by=rank_by, usd_per_gpu_hour=price, return_count=True, params=m)
    return result, n, m


def title_of(command: str, result: pl.DataFrame) -> str:
    """A table title that says which parameters and assumptions answered."""
    if result.height == 0 or "assumptions" not in result.columns:
        return f"stepcast {command}"
    v = result["fit_version"][0] if "fit_version" in result.columns else None
    a = str(result["assumptions"][0]).split(";")[0]
    dom = sorted(set(str(x).split(";")[0] for x in result["calibration_domain"].to_list())) \
        if "calibration_domain" in result.columns else []
    return (f"stepcast {command} — {a}" + (f", fit {v}" if v else "") + (f", domain: {' / '.join(dom)}" if dom else ""))
