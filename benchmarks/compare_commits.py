"""Do two commits give the same numbers? Builds each from scratch and compares every output.

    uv run python benchmarks/compare_commits.py BASE [HEAD] [--work DIR] [--reuse]

For each commit: a git worktree of it in DIR/<commit> (its own locked environment, made by `uv run --locked`),
`stepcast --store DIR/<commit>-store/stepcast.duckdb build`, then the CLI in `--format json` on the fixed set of
configurations in `CONFIGURATIONS` (predict from flags and from the shipped run file, search, plan, curve and
frontier, under both sets of assumptions and analytical-only) against that store. Then:
- every table of the two stores and every file of their report sites, through benchmarks/compare_stores.py (the
  fit version, a hash of the model code, and timestamps aside);
- every CLI answer as parsed JSON, with the fit version replaced by a placeholder and the search's wall-clock
  time left out.
Prints one line per comparison and exits 1 when anything differs. `--reuse` keeps an existing worktree, store
and answers of a commit (to compare a new HEAD with a base built before). HEAD defaults to the working tree's
commit; uncommitted changes are not compared (commit them, or pass the work tree's folder as HEAD:
`--head-dir .`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import compare_stores  # noqa: E402  (the sibling script; benchmarks/ is not a package)

#: name -> stepcast arguments (after `--store STORE`); each answer is compared as JSON
CONFIGURATIONS: dict[str, list[str]] = {
    "predict-llama3-70b-h100": ["predict", "--model", "llama3-70b", "--gpu", "h100-sxm5-80gb", "--gpus", "512",
                                "--global-batch", "1024", "--seq-len", "8192", "--tp", "8", "--pp", "4",
                                "--format", "json"],
    "predict-gpt3-175b-a100": ["predict", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "1024",
                               "--global-batch", "1536", "--seq-len", "2048", "--tp", "8", "--pp", "8",
                               "--format", "json"],
    "predict-gpt3-175b-ideal": ["predict", "--model", "gpt3-175b", "--gpu", "a100-sxm4-80gb", "--gpus", "1024",
                                "--global-batch", "1536", "--seq-len", "2048", "--tp", "8", "--pp", "8",
                                "--assumptions", "ideal", "--format", "json"],
    "predict-analytical": ["predict", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--gpus", "64",
                           "-b", "256", "-s", "8192", "--tp", "1", "--pp", "1", "--sharding", "fsdp",
                           "--analytical-only", "--format", "json"],
    "predict-deepseek-v3-fp8": ["predict", "--model", "deepseek-v3", "--gpu", "h800", "--gpus", "2048",
                                "-b", "15360", "-s", "4096", "--tp", "1", "--pp", "16", "--ep", "64",
                                "--dtype", "fp8", "--format", "json"],
    "predict-gb300-fp8": ["predict", "--model", "llama3-8b", "--gpu", "gb300", "--gpus", "8", "--global-batch",
                          "128", "--micro-batch", "2", "--seq-len", "8192", "--tp", "1", "--pp", "1", "--dtype",
                          "fp8", "--format", "json"],
    "predict-tpu-v5p": ["predict", "--model", "llama3-70b", "--gpu", "tpu-v5p", "--gpus", "256", "-b", "512",
                        "-s", "8192", "--format", "json"],
    "predict-runs": ["predict", "--runs", "measurements/measured_runs.csv", "--format", "json"],
    "search-llama3-70b": ["search", "--model", "llama3-70b", "--gpu", "h100-sxm5-80gb", "--gpus", "512",
                          "--global-batch", "1024", "--seq-len", "8192", "--top", "20", "--format", "json"],
    "search-mixtral-cost": ["search", "--model", "mixtral-8x7b", "--gpu", "h100-sxm5-80gb", "--gpus", "64",
                            "-b", "256", "-s", "4096", "--rank-by", "cost", "--intervals", "--top", "10",
                            "--format", "json"],
    "plan-llama3-70b": ["plan", "--model", "llama3-70b", "--tokens", "15e12", "--deadline-days", "90", "--top", "10",
                        "--format", "json"],
    "curve-llama3-8b": ["curve", "--model", "llama3-8b", "--gpu", "h100-sxm5-80gb", "--policy", "strong",
                        "--max-gpus", "1024", "--format", "json"],
    "frontier-h100-ideal": ["frontier", "--gpu", "h100-sxm5-80gb", "--months", "3", "--assumptions", "ideal",
                            "--format", "json"],
    "frontier-gtx580": ["frontier", "--gpu", "gtx-580", "--months", "3", "--format", "json"],
}
#: keys whose values are wall-clock or paths, not model output
VOLATILE_KEYS = {"elapsed_s", "seconds", "search_seconds", "store", "snapshot"}


def _run(cmd: list[str], cwd: Path, log: Path | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if log is not None:
        log.write_text(out.stdout + out.stderr)
    return out


def _commit(ref: str) -> str:
    return _run(["git", "rev-parse", "--short", ref], ROOT).stdout.strip()


def _prepare(commit: str, work: Path, reuse: bool, head_dir: Path | None) -> Path:
    """The folder holding the commit's worktree, store and CLI answers (built unless reused)."""
    base = work / commit
    tree = head_dir if head_dir is not None else base / "tree"
    answers = base / "answers"
    if reuse and (answers / "done").exists():
        print(f"{commit}: reusing {base}")
        return base
    if head_dir is None and not tree.exists():
        got = _run(["git", "worktree", "add", "--detach", str(tree), commit], ROOT)
        if got.returncode:
            sys.exit(f"git worktree add {commit} failed: {got.stderr.strip()}")
    store = base / "store"
    shutil.rmtree(store, ignore_errors=True)
    started = time.time()
    print(f"{commit}: building in {tree} ...", flush=True)
    got = _run(["uv", "run", "--locked", "stepcast", "--store", str(store / "stepcast.duckdb"), "build"], tree,
               base / "build.log")
    if got.returncode:
        sys.exit(f"{commit}: build failed (exit {got.returncode}); see {base / 'build.log'}")
    print(f"{commit}: built in {time.time() - started:.0f} s; asking {len(CONFIGURATIONS)} questions", flush=True)
    answers.mkdir(parents=True, exist_ok=True)
    for name, args in CONFIGURATIONS.items():
        got = _run(["uv", "run", "--locked", "stepcast", "--store", str(store / "stepcast.duckdb"), *args], tree)
        (answers / f"{name}.json").write_text(got.stdout)
        (answers / f"{name}.status").write_text(f"{got.returncode}\n{got.stderr}")
    (answers / "done").write_text("")
    return base


def _normal(value, version: str | None):
    """JSON with the fit version replaced and volatile keys dropped."""
    if isinstance(value, dict):
        return {k: _normal(v, version) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_normal(v, version) for v in value]
    if isinstance(value, str) and version:
        return value.replace(version, "<VERSION>")
    return value


def _parse(text: str):
    """A command's JSON output: one document, or several (one per line)."""
    text = text.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def _version(base: Path) -> str | None:
    con = compare_stores.duckdb.connect(str(base / "store" / "snapshot" / "stepcast.duckdb"), read_only=True)
    row = con.execute("select version from fits where promoted").fetchone()
    con.close()
    return row[0] if row else None


def compare_answers(a: Path, b: Path) -> list[str]:
    va, vb = _version(a), _version(b)
    differ = []
    for name in CONFIGURATIONS:
        sa = (a / "answers" / f"{name}.status").read_text()
        sb = (b / "answers" / f"{name}.status").read_text()
        ja = _normal(_parse((a / "answers" / f"{name}.json").read_text() or "null"), va)
        jb = _normal(_parse((b / "answers" / f"{name}.json").read_text() or "null"), vb)
        code_a, code_b = sa.split("\n", 1)[0], sb.split("\n", 1)[0]
        same = ja == jb and code_a == code_b
        rows = len(ja) if isinstance(ja, list) else 1
        print(f"cli {name}: {'equal' if same else 'DIFFERENT'} (exit {code_a}, {rows} row(s))")
        if not same:
            differ.append(name)
    return differ


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="the commit to compare against (e.g. main~3, a hash)")
    p.add_argument("head", nargs="?", default="HEAD", help="the commit to check (default HEAD)")
    p.add_argument("--work", type=Path, default=Path("/tmp/stepcast-compare"),
                   help="folder for the worktrees, stores and answers (default /tmp/stepcast-compare)")
    p.add_argument("--reuse", action="store_true", help="reuse a commit's earlier build and answers in --work")
    p.add_argument("--head-dir", type=Path, default=None,
                   help="build HEAD from this folder (e.g. '.', with its uncommitted changes) instead of a worktree")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    a = _prepare(_commit(args.base), args.work, args.reuse, None)
    head = _commit(args.head) + ("-worktree" if args.head_dir else "")
    b = _prepare(head, args.work, args.reuse and args.head_dir is None, args.head_dir.resolve() if args.head_dir else None)
    stores = compare_stores.main(str(a / "store"), str(b / "store"))
    answers = compare_answers(a, b)
    print("EVERY OUTPUT IDENTICAL" if stores == 0 and not answers
          else f"DIFFERENT: stores {'differ' if stores else 'equal'}, {len(answers)} CLI answer(s) differ {answers}")
    return 0 if stores == 0 and not answers else 1


if __name__ == "__main__":
    sys.exit(main())
