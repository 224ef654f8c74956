"""Speed and fidelity of the scaling-curve search: prints, for reference cases, the best tokens/s/GPU of the
restricted curve grid (models.curves.CURVE_GRID) as a fraction of the unrestricted models.search.search, and
both run times; then the time of one full curve and of one accelerator's frontier.

    uv run python benchmarks/bench_curves.py
"""

import time

import polars as pl

from models.curves import best_layouts, scaling_curve
from models.frontier import frontier_sweep
from models.hardware import resolve_hardware
from models.search import search
from pipeline import catalog
from pipeline.settings import PROJECT_ROOT

M = PROJECT_ROOT / "measurements"
CASES = [("gpt3-175b", "h100-sxm5-80gb", 1024, 1536, 2048), ("llama3-8b", "a100-sxm4-80gb", 64, 512, 8192),
         ("mixtral-8x7b", "h100-sxm5-80gb", 256, 1024, 4096), ("gpt3-175b", "gb200", 1152, 1536, 2048),
         ("llama3-70b", "tpu-v5p", 512, 512, 8192), ("mpt-1b", "a100-sxm4-40gb", 64, 640, 2048)]


def hw(gpu):
    return resolve_hardware(pl.DataFrame([catalog.find_hardware(M, gpu)]), strict=False).row(0, named=True)


for name, gpu, n, b, s in CASES:
    arch, h = catalog.find_architecture(M, name), hw(gpu)
    t = time.perf_counter()
    full = search(arch, h, n, b, s, top_k=1)
    t_full = time.perf_counter() - t
    t = time.perf_counter()
    best, _ = best_layouts(arch, h, [n], [b], s)
    t_grid = time.perf_counter() - t
    print(f"{name:14s} {gpu:16s} N={n:5d}: restricted/full = "
          f"{best['tokens_per_s_per_gpu'][0] / full['tokens_per_s_per_gpu'][0]:.3f}  ({t_grid:.3f} s vs {t_full:.3f} s)")
t = time.perf_counter()
scaling_curve(catalog.find_architecture(M, "gpt3-175b"), hw("h100-sxm5-80gb"), "strong", seq_len=2048, tokens=3e11,
              global_batch_seqs=1536)
print(f"one curve (gpt3-175b, H100, 22 sizes): {time.perf_counter() - t:.2f} s")
t = time.perf_counter()
frontier_sweep(hw("h100-sxm5-80gb"), 3.0)
print(f"one frontier sweep (H100, 3 months): {time.perf_counter() - t:.2f} s")
