"""Response times of `stepcast serve`'s API, as the page sees them (HTTP round trip on loopback included).

    uv run python benchmarks/bench_serve.py [--store out/stepcast.duckdb] [--repeat 10]

Starts `stepcast serve` on a free loopback port (the store's snapshot must exist: `stepcast build`), waits for
it, then calls each endpoint --repeat times (the frontier sweeps: --repeat // 2, at least 3) and prints the
median and 90th percentile per endpoint, with the number of layouts each search evaluates. Targets: a curve or
a 10,000-layout search < 300 ms, a whole frontier sweep for one accelerator < 3 s. The server keeps no answer
cache: every call computes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [  # (label, endpoint, parameters)
    ("predict gpt3-175b, 1,024 x A100, tp8 pp8", "predict",
     {"model": "gpt3-175b", "gpu": "a100-sxm4-80gb", "gpus": 1024, "global_batch": 1536, "seq_len": 2048, "tp": 8,
      "pp": 8}),
    ("search llama3-8b, 8 x H100", "search",
     {"model": "llama3-8b", "gpu": "h100-sxm5-80gb", "gpus": 8, "global_batch": 256, "seq_len": 8192, "top": 1}),
    ("search llama3-8b, 16 x H100", "search",
     {"model": "llama3-8b", "gpu": "h100-sxm5-80gb", "gpus": 16, "global_batch": 256, "seq_len": 8192, "top": 1}),
    ("search gpt3-175b, 1,024 x A100", "search",
     {"model": "gpt3-175b", "gpu": "a100-sxm4-80gb", "gpus": 1024, "global_batch": 1536, "seq_len": 2048, "top": 1}),
    ("search llama3-405b, 16,384 x H100", "search",
     {"model": "llama3-405b", "gpu": "h100-sxm5-80gb", "gpus": 16384, "global_batch": 2048, "seq_len": 8192,
      "top": 1}),
    ("curve gpt3-175b on A100 (to 16,384)", "curve",
     {"model": "gpt3-175b", "gpu": "a100-sxm4-80gb", "tokens": 3e11, "global_batch": 1536}),
    ("curve llama3-405b on H100 (to 32,768)", "curve",
     {"model": "llama3-405b", "gpu": "h100-sxm5-80gb", "tokens": 1.56e13, "seq_len": 8192, "global_batch": 2048,
      "max_gpus": 32768}),
    ("frontier h100, realistic, every level", "frontier", {"gpu": "h100-sxm5-80gb", "table": "true"}),
    ("frontier gtx-580-3gb, ideal, every level", "frontier",
     {"gpu": "gtx-580-3gb", "assumptions": "ideal", "table": "true"}),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def layouts_evaluated(store: str | None, q: dict) -> int:
    """How many layouts the search scores (the CLI prints it; the JSON does not carry it)."""
    from pipeline import api
    from pipeline.settings import Settings

    return api.layout_search(Settings.load(store=store), model=q["model"], gpu=q["gpu"], gpus=q["gpus"],
                             global_batch=q["global_batch"], seq_len=q["seq_len"], top=1, analytical_only=True)[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default=os.environ.get("STEPCAST_STORE"), help="store whose snapshot answers")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    port = free_port()
    cmd = [sys.executable, "-m", "pipeline.cli"] + (["--store", args.store] if args.store else []) + [
        "serve", "--port", str(port)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for line in proc.stderr:
            print(f"  server: {line.rstrip()}")
            if line.startswith("explorer:"):
                break
        else:
            sys.exit("the server did not start")
        while True:  # the line comes just before uvicorn binds the port
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.perf_counter() - t0 > 120:
                    sys.exit("the server did not start")
                time.sleep(0.05)
        print(f"start-up (fit, tables, bundle, warm-up): {time.perf_counter() - t0:.1f} s")
        print(f"{'endpoint':46} {'calls':>5} {'median ms':>10} {'p90 ms':>8}  layouts")
        for label, endpoint, q in CASES:
            url = f"{base}/api/{endpoint}?{urllib.parse.urlencode(q)}"
            n = max(3, args.repeat // 2) if endpoint == "frontier" else args.repeat
            times = []
            for _ in range(n):
                t = time.perf_counter()
                with urllib.request.urlopen(url, timeout=120) as r:
                    json.loads(r.read())
                times.append((time.perf_counter() - t) * 1000)
            times.sort()
            p90 = times[min(len(times) - 1, round(0.9 * (len(times) - 1)))]
            count = f"{layouts_evaluated(args.store, q):,}" if endpoint == "search" else ""
            print(f"{label:46} {n:5d} {statistics.median(times):10.0f} {p90:8.0f}  {count}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
