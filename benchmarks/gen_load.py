"""Generate a load-test batch of measurement files (valid rows in the measurement schema).

    cd /work/main && uv run python benchmarks/gen_load.py OUT_DIR [--files 1000] [--rows-per-file 1000]

Each file holds `rows-per-file` rows: runs of 4 metrics each (step_time_s, tokens_per_s_per_gpu,
model_tflops_per_gpu, mfu) on shipped hardware ids and a Llama-3-8B-like shape, with layouts that satisfy
tp*pp*dp = n_gpus. Values are synthetic but inside every validation range (they exercise the ingest path,
not the model). Run ids are unique across files (`load-FFFF-RRRRR`), so every row is accepted.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.measurements import COLUMNS

GPUS = ("h100-sxm5-80gb", "a100-sxm4-80gb", "h200-sxm-141gb")
METRICS = (("step_time_s", "s"), ("tokens_per_s_per_gpu", "tokens/s/GPU"), ("model_tflops_per_gpu", "TFLOP/s/GPU"),
           ("mfu", "fraction"))


def make_file(index: int, rows: int, rng: np.random.Generator) -> pl.DataFrame:
    n_runs = -(-rows // len(METRICS))
    tp = rng.choice([1, 2, 4, 8], n_runs)
    pp = rng.choice([1, 2, 4], n_runs)
    dp = rng.choice([1, 2, 4, 8, 16, 32], n_runs)
    n_gpus = tp * pp * dp
    gpu = rng.choice(GPUS, n_runs)
    step = rng.uniform(0.5, 20.0, n_runs)
    tok = rng.uniform(500.0, 9000.0, n_runs)
    tflops = rng.uniform(50.0, 600.0, n_runs)
    mfu = rng.uniform(0.2, 0.6, n_runs)
    run = pl.DataFrame({
        "run_id": [f"load-{index:04d}-{r:05d}" for r in range(n_runs)],
        "n_gpus": n_gpus.astype(str), "tp": tp.astype(str), "pp": pp.astype(str), "dp": dp.astype(str),
        "gpu": gpu,
    })
    values = np.stack([step, tok, tflops, mfu], axis=1).reshape(-1)
    long = run[np.repeat(np.arange(n_runs), len(METRICS))].with_columns(
        pl.Series("metric", [m for m, _ in METRICS] * n_runs),
        pl.Series("unit", [u for _, u in METRICS] * n_runs),
        pl.Series("value", [f"{v:.6g}" for v in values]),
    ).head(rows)
    const = {"source": "load test", "source_ref": "benchmarks/gen_load.py", "year": "2024",
             "model_name": "Llama 3 8B", "arch": "dense", "params_b": "8", "active_params_b": "", "n_layers": "32", "d_model": "4096",
             "n_heads": "32", "n_kv_heads": "8", "ffn_dim": "14336", "vocab": "128256", "seq_len": "8192",
             "global_batch_seqs": "512", "micro_batch": "1", "gpu_as_reported": "", "gpus_per_node": "8",
             "framework": "megatron-lm", "dtype": "bf16", "cp": "", "ep": "", "vpp": "", "sharding": "zero1",
             "recompute": "selective", "derived": "no", "notes": "synthetic load-test row"}
    return long.with_columns([pl.lit(v).alias(k) for k, v in const.items()]).select(COLUMNS)


def generate(out: Path, files: int = 1000, rows_per_file: int = 1000, seed: int = 0) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(files):
        path = out / f"load_{i:04d}.csv"
        make_file(i, rows_per_file, rng).write_csv(path)
        paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--rows-per-file", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    paths = generate(args.out, args.files, args.rows_per_file, args.seed)
    print(f"wrote {len(paths)} files x {args.rows_per_file} rows to {args.out}")


if __name__ == "__main__":
    main()
