"""Benchmark of the prediction function.

    uv run python benchmarks/bench_model.py [--n 1000000] [--repeat 5] [--store out/stepcast.duckdb]

Prints, on random valid configurations (numpy runs single-threaded for these element-wise kernels;
OMP/MKL threads are pinned to 1 anyway):
- the physics alone (`models.physics.step_time.predict_arrays`), and
- the calibrated prediction every command serves (`models.fitting.predictor.predict_arrays`: physics with the
  parameters of each row's domain, the residual correction and the interval) with the promoted fit of
  `--store` (or, without a store, a stand-in calibration with a ridge residual on every feature, so the
  residual path is timed);
- the same adapted to a source's runs (`--calibrate-on`: the throughput factor and the k-shot interval);
and the wall time of an exhaustive, calibrated layout search for MT-NLG 530B on 4,096 A100-SXM4-80GB (global
batch 1,920, seq 2,048) with the number of layouts evaluated and the best layout.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from models.physics.hardware import resolve_hardware  # noqa: E402
from models.planning.search import search  # noqa: E402
from models.physics.step_time import HARDWARE_COLUMNS, predict_arrays  # noqa: E402
from models.fitting import predictor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def random_configs(n: int, hw: pl.DataFrame, seed: int = 0) -> dict[str, np.ndarray]:
    """n random, valid configurations over several architectures, layouts and GPUs."""
    rng = np.random.default_rng(seed)
    archs = np.array([  # L, h, heads, kv, ffn, vocab, act, E, topk
        (24, 2048, 16, 16, 8192, 51200, 0, 0, 0),
        (32, 4096, 32, 8, 14336, 128256, 1, 0, 0),
        (80, 8192, 64, 8, 28672, 128256, 1, 0, 0),
        (96, 12288, 96, 96, 49152, 51200, 0, 0, 0),
        (32, 4096, 32, 8, 14336, 32000, 1, 8, 2),
    ], dtype=float)
    ai = rng.integers(0, len(archs), n)
    A = archs[ai]
    tp = 2.0 ** rng.integers(0, 4, n)
    pp = 2.0 ** rng.integers(0, 4, n)
    cp = 2.0 ** rng.integers(0, 2, n)
    dp = 2.0 ** rng.integers(0, 7, n)
    mb = 2.0 ** rng.integers(0, 3, n)
    m = 2.0 ** rng.integers(3, 6, n)
    ep = np.where(A[:, 7] > 0, np.minimum(2.0 ** rng.integers(0, 4, n), dp), 1.0)
    hwsel = hw.filter(pl.col("id").is_in(["a100-sxm4-80gb", "h100-sxm5-80gb", "b200", "mi300x", "gb200"]))
    hi = rng.integers(0, hwsel.height, n)
    out = dict(
        n_layers=A[:, 0], d_model=A[:, 1], n_heads=A[:, 2], n_kv_heads=A[:, 3], ffn_dim=A[:, 4], vocab=A[:, 5],
        activation=A[:, 6].astype(np.int64), n_experts=A[:, 7], top_k=A[:, 8],
        seq_len=2.0 ** rng.integers(11, 14, n), global_batch_seqs=dp * mb * m, micro_batch=mb,
        n_gpus=tp * pp * cp * dp, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
        vpp=np.where(pp > 1, rng.integers(1, 3, n), 1).astype(float),
        sharding=rng.integers(0, 6, n), recompute=rng.integers(0, 3, n),
        sequence_parallel=rng.integers(0, 2, n).astype(bool), dtype=rng.integers(0, 3, n),
        gpus_per_node=np.full(n, 8.0),
    )
    for c in HARDWARE_COLUMNS:
        out[c] = hwsel[c].cast(pl.Float64).fill_null(np.nan).to_numpy()[hi]
    return out


def load_or_standin(store: Path | None):
    """The promoted fit of `store`, or a stand-in: the default parameters, a ridge residual with a small weight on
    every feature and a domain of Ampere/Hopper/Blackwell in 16-bit and fp8 (so AMD rows are extrapolated)."""
    if store is not None:
        import duckdb

        from pipeline.fits import load_promoted_fit

        con = duckdb.connect(str(store), read_only=True)
        try:
            fit = load_promoted_fit(con)
        finally:
            con.close()
        if isinstance(fit, predictor.Calibration):
            return fit
        print(f"no current promoted fit in {store}: timing the stand-in calibration")
    from models.core.domains import Domain
    from models.core.params import DEFAULT

    k = len(predictor.FEATURE_NAMES)
    dom = Domain.of(["Ampere", "Hopper", "Blackwell"], ["16-bit", "fp8"], ["default"], np.array([4096.0]))
    return predictor.Calibration("stand-in", DEFAULT, {}, dom, "ridge", np.zeros(k), np.ones(k), np.full(k, 1e-3),
                                 0.0, 0.3, 0.5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5, help="timed calls (best and median are printed)")
    ap.add_argument("--store", type=Path, default=None, help="read the promoted fit from this store")
    args = ap.parse_args()
    hw = resolve_hardware(pl.read_csv(ROOT / "measurements" / "hardware_specs.csv", infer_schema_length=0),
                          strict=False)
    cfg = random_configs(args.n, hw)
    predict_arrays({k: v[:1000] for k, v in cfg.items()})  # warm-up
    walls, cpus = [], []
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        res = predict_arrays(cfg)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    best = min(walls)
    valid = int((res["error_code"] & ~(1 << 10) == 0).sum())
    print(f"predict_arrays: {args.n:,} configs in {best:.3f} s -> {args.n / best:,.0f} configs/s "
          f"(best of {args.repeat}; median {args.n / float(np.median(walls)):,.0f}/s; CPU time per call "
          f"{min(cpus):.3f}-{max(cpus):.3f} s; {valid:,} valid, {int(res['feasible'].sum()):,} feasible)")

    cal = load_or_standin(args.store)
    walls = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        res = predictor.predict_arrays(cfg, cal)
        walls.append(time.perf_counter() - t0)
    best = min(walls)
    inside = int((res["domain_code"] == predictor.DOMAIN_INSIDE).sum())
    print(f"calibrated predict_arrays ({cal.model_kind}, fit {cal.version}): {args.n:,} configs in {best:.3f} s -> "
          f"{args.n / best:,.0f} configs/s (best of {args.repeat}; median {args.n / float(np.median(walls)):,.0f}/s; "
          f"{inside:,} inside the fit's domain)")

    # the same, adapted to a source's runs (--calibrate-on / --source: models.fitting.adapt): the throughput factor
    # and the k-shot interval applied to the calibrated outputs
    from models.fitting.adapt import AdaptationRule, adapt

    rule = getattr(cal, "adaptation_rule", None) or AdaptationRule(1.0, 1.0, 0.02, ((0, 0.3), (3, 0.2)))
    adapted = predictor.Predictor(cal, adaptation=adapt([-0.2, -0.15, -0.25], rule, "bench"))
    walls = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        predictor.predict_arrays(cfg, adapted)
        walls.append(time.perf_counter() - t0)
    best = min(walls)
    print(f"adapted predict_arrays (3 runs, throughput factor {adapted.adaptation.throughput_factor:.3f}): "
          f"{args.n:,} configs in {best:.3f} s -> {args.n / best:,.0f} configs/s (best of {args.repeat}; median "
          f"{args.n / float(np.median(walls)):,.0f}/s)")

    a100 = hw.filter(pl.col("id") == "a100-sxm4-80gb").to_dicts()[0]
    mtnlg = dict(n_layers=105, d_model=20480, n_heads=128, ffn_dim=81920, vocab=51200, activation="gelu",
                 tied_embeddings=False)
    t0 = time.perf_counter()
    df, count = search(mtnlg, a100, 4096, 1920, 2048, top_k=5, return_count=True, params=cal)
    dt = time.perf_counter() - t0
    print(f"search MT-NLG 530B on 4,096 a100-sxm4-80gb (batch 1,920 x 2,048): {count:,} layouts in {dt:.2f} s "
          f"({count / dt:,.0f} layouts/s)")
    with pl.Config(tbl_cols=20, tbl_width_chars=200):
        print(df.select("tp", "pp", "cp", "dp", "vpp", "micro_batch", "sharding", "recompute", "sequence_parallel",
                        "step_time_s", "mfu", "memory_gb_per_gpu"))


if __name__ == "__main__":
    main()
