"""Speed and fidelity of the scaling-curve search: prints, for reference cases, the best tokens/s/GPU of the
restricted curve grid (models.planning.curves.CURVE_GRID) as a fraction of the unrestricted models.planning.search.search, and
both run times; then the time of one full curve, of one accelerator's frontier sweep (per assumption set), and
of the build's frontier work: every accelerator of the catalog under both assumption sets, in one process and in
worker processes (``pipeline.parallel.workers()``, STEPCAST_WORKERS), one job per accelerator and assumption set,
as the `frontier` asset runs it.

    uv run python benchmarks/bench_curves.py
"""

import time

import polars as pl

from models.planning.curves import best_layouts, scaling_curve
from models.core.params import DEFAULT
from models.fitting.assumptions import params_for
from models.planning.frontier import frontier_sweep, frontier_table
from models.physics.hardware import resolve_hardware
from models.planning.search import search
from pipeline import catalog
from pipeline.settings import PROJECT_ROOT

M = PROJECT_ROOT / "measurements"
CASES = [("gpt3-175b", "h100-sxm5-80gb", 1024, 1536, 2048), ("llama3-8b", "a100-sxm4-80gb", 64, 512, 8192),
         ("mixtral-8x7b", "h100-sxm5-80gb", 256, 1024, 4096), ("gpt3-175b", "gb200", 1152, 1536, 2048),
         ("llama3-70b", "tpu-v5p", 512, 512, 8192), ("mpt-1b", "a100-sxm4-40gb", 64, 640, 2048)]


def hw(gpu):
    return resolve_hardware(pl.DataFrame([catalog.find_hardware(M, gpu)]), strict=False).row(0, named=True)


def main() -> None:
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
    for a in ("ideal", "realistic"):
        t = time.perf_counter()
        frontier_sweep(hw("h100-sxm5-80gb"), 3.0, params=params_for(a, DEFAULT), assumptions=a)
        print(f"one frontier sweep (H100, 3 months, {a}, 65 levels): {time.perf_counter() - t:.2f} s")
    from models.planning.curves import default_dtype
    from pipeline.parallel import map_jobs, workers

    rows = resolve_hardware(pl.read_csv(M / "hardware_specs.csv", infer_schema_length=None), strict=False)
    jobs = [((h, DEFAULT), {"dtype": default_dtype(h), "assumptions": (a,)}) for h in rows.iter_rows(named=True)
            if not h.get("hardware_error") for a in ("ideal", "realistic")]
    for n in sorted({1, workers()}):
        t = time.perf_counter()
        map_jobs(frontier_table, jobs, n)
        print(f"build's frontier work ({len(jobs) // 2} accelerators x 2 assumption sets), {n} process(es): "
              f"{time.perf_counter() - t:.1f} s")


if __name__ == "__main__":  # spawned worker processes import this module: nothing runs at import
    main()
