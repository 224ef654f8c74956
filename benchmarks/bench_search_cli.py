"""Whole-process time of `stepcast search` (start-up included), as a user sees it.

    uv run python benchmarks/bench_search_cli.py [--repeat 3]

Prints the wall time of each run for MT-NLG 530B on 4,096 A100-80GB (global batch 1,920, sequence 2,048) and
GPT-3 175B on 1,024 A100-80GB (batch 1,536), and the import time of the CLI alone. Target (issue 3): < 3 s.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

CASES = {
    "mt-nlg-530b on 4096 x a100-sxm4-80gb": ["--model", "mt-nlg-530b", "--gpu", "a100-sxm4-80gb", "--gpus", "4096",
                                            "--global-batch", "1920", "--seq-len", "2048"],
    "gpt3-175b on 1024 x a100-sxm4-80gb": ["--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "1024",
                                          "--global-batch", "1536", "--seq-len", "2048"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    exe = shutil.which("stepcast") or sys.exit("stepcast is not on PATH: run with `uv run python ...`")
    t0 = time.perf_counter()
    subprocess.run([exe, "--help"], check=True, capture_output=True)
    print(f"stepcast --help (start-up only): {time.perf_counter() - t0:.2f} s")
    for name, flags in CASES.items():
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            proc = subprocess.run([exe, "search", *flags, "--top", "5", "--format", "csv"], capture_output=True,
                                  text=True)
            times.append(time.perf_counter() - t0)
            if proc.returncode != 0:
                sys.exit(f"search failed: {proc.stderr}")
        header = proc.stderr.strip().splitlines()[-1]
        print(f"{name}: median {statistics.median(times):.2f} s, min {min(times):.2f} s over {args.repeat} runs "
              f"— {header}")


if __name__ == "__main__":
    main()
