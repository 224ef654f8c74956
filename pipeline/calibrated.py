"""Calibrating search results for the CLI: the promoted fit, applied to rows of `models.search.search`."""

from __future__ import annotations

import sys

import polars as pl

from pipeline.settings import Settings

ARCH_KEYS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab", "activation",
             "n_experts", "top_k", "expert_ffn_dim", "n_shared_experts", "n_dense_layers", "tied_embeddings")
HW_KEYS = ("peak_fp32_tflops", "peak_tf32_tflops", "peak_bf16_tflops", "peak_fp16_tflops", "peak_fp8_tflops",
           "memory_gb", "memory_bw_gbps", "intra_node_bw_gbps", "inter_node_bw_gbps", "scaleup_size")


def _from_readable_store(cfg: Settings, read):
    """`read(con, path)` on the snapshot, then on the store (skipping a missing one or one a writer holds);
    the first result that is not None, or None."""
    from pipeline import store

    for path in (cfg.snapshot, cfg.store):
        if not path.exists():
            continue
        try:
            con = store.connect(path, read_only=True)
        except Exception:  # noqa: BLE001 - locked by a writer: try the next
            continue
        try:
            result = read(con, path)
        finally:
            con.close()
        if result is not None:
            return result
    return None


def promoted_fit(cfg: Settings):
    """The promoted fit (a `models.predictor.Calibration`) from the snapshot (or the store when there is no
    snapshot), or None. A stored fit of an earlier format (before the one prediction function) is reported
    and skipped: run `stepcast fit` to make a current one."""
    try:
        from pipeline.fits import load_promoted_fit
    except ImportError:
        return None
    from models.predictor import Calibration

    def read(con, path):
        try:
            fit = load_promoted_fit(con)
        except Exception as err:  # noqa: BLE001 - an unreadable fit must not stop an analytical answer
            print(f"warning: promoted fit in {path} not usable ({err}); analytical figures only", file=sys.stderr)
            return None
        if fit is not None and not isinstance(fit, Calibration):
            print(f"warning: the promoted fit in {path} is of an earlier format; run `stepcast fit` "
                  "(analytical figures until then)", file=sys.stderr)
            return None
        return fit

    return _from_readable_store(cfg, read)


def model_for(cfg: Settings, analytical_only: bool = False, assumptions: str = "realistic"):
    """The prediction model every command uses (`models.predictor`): the priors' analytical model with
    `--analytical-only`, else the promoted calibration (None -> priors) under the named assumptions."""
    from models.params import DEFAULT
    from models.predictor import Predictor

    if analytical_only:
        return DEFAULT
    return Predictor(None if assumptions == "ideal" else promoted_fit(cfg), assumptions)


def calibrate_rows(bundle, frame: pl.DataFrame, arch: dict, hw_by_id: dict[str, dict], seq_len: int,
                   global_batch_seqs: int, hardware_col: str = "hardware",
                   n_gpus: int | None = None) -> pl.DataFrame | None:
    """Calibrated point and interval for search rows (one accelerator per row in `hardware_col`).

    Returns the calibration frame (tokens_per_s_per_gpu[_lo/_hi], step_time_s[_lo/_hi], fit_version) or None
    with a warning when the fit cannot be applied."""
    from models.calibration import apply_calibration

    extra = {k: arch.get(k) for k in ARCH_KEYS if k not in frame.columns}
    inputs = frame.with_columns(
        *[pl.lit(v).alias(k) for k, v in extra.items()],
        *([] if "seq_len" in frame.columns else [pl.lit(seq_len).alias("seq_len")]),
        *([] if "global_batch_seqs" in frame.columns else [pl.lit(global_batch_seqs).alias("global_batch_seqs")]),
        *([] if "n_gpus" in frame.columns or n_gpus is None else [pl.lit(n_gpus).alias("n_gpus")]),
    )
    ids = inputs[hardware_col].to_list()
    for key in HW_KEYS:
        if key not in inputs.columns:
            inputs = inputs.with_columns(pl.Series(key, [hw_by_id[i].get(key) for i in ids], dtype=pl.Float64))
    # the fit's features need these hardware figures; rows of parts without them stay analytical
    usable = pl.all_horizontal([pl.col(k).cast(pl.Float64).fill_null(0) > 0 for k in
                                ("peak_bf16_tflops", "memory_gb", "memory_bw_gbps", "intra_node_bw_gbps",
                                 "inter_node_bw_gbps")])
    idx = inputs.with_row_index("_i")
    good = idx.filter(usable)
    rest = idx.filter(~usable)
    if rest.height:
        names = sorted(set(rest[hardware_col].to_list()))
        print(f"note: {', '.join(names)} lack a figure the calibration needs (bf16 peak, memory or network "
              "bandwidth): analytical figures, no interval", file=sys.stderr)
    parts = []
    try:
        if good.height:
            parts.append(good.select("_i").hstack(apply_calibration(bundle, good.drop("_i"), good.drop("_i"))))
    except Exception as err:  # noqa: BLE001 - fall back to analytical figures, loudly
        print(f"warning: calibration not applied ({err}); showing analytical figures", file=sys.stderr)
        return None
    if rest.height:
        t = rest["tokens_per_s_per_gpu"]
        s_ = rest["step_time_s"]
        parts.append(pl.DataFrame({"_i": rest["_i"], "step_time_s": s_, "step_time_lo_s": s_, "step_time_hi_s": s_,
                                   "tokens_per_s_per_gpu": t, "tokens_per_s_per_gpu_lo": t,
                                   "tokens_per_s_per_gpu_hi": t,
                                   "fit_version": pl.Series([None] * rest.height, dtype=pl.Utf8)}))
    return pl.concat(parts, how="diagonal_relaxed").sort("_i").drop("_i")


def promoted_params(cfg: Settings):
    """The promoted fit's physical parameters (default software preset) and its version, read from the `fits`
    table's JSON — no scikit-learn import, so commands that only need the fitted physics start fast.
    Returns (PhysParams, version) or (None, None)."""
    import json

    from models.params import PhysParams
    from pipeline import store

    def read(con, path):
        if not store.table_exists(con, "fits"):
            return None
        row = con.execute("select physical_params, version from fits where promoted "
                          "order by promoted_at desc limit 1").fetchall()
        return (PhysParams.from_dict(json.loads(row[0][0])), row[0][1]) if row else None

    return _from_readable_store(cfg, read) or (None, None)
