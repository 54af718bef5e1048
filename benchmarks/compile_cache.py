"""Verify time with the kernel workers' Triton cache kept across runs: a cold run, then a warm one.

    python benchmarks/compile_cache.py [--device cpu|cuda] [--jobs N] [--only ID[,ID]] [--no-matrix] [--out DIR]

With fresh, empty cache folders (XDG_CACHE_HOME in a temporary folder, one for step 2 and one for step 3,
so each first pass is cold) and KERNALIN_SANDBOX=on, in this order:
  1. the cache key's walk of this repository as the working directory (what each run pays for it);
  2. `kernalin-ci verify` of checks/attention_decode/correct_online_softmax.py twice: cold, then warm;
  3. tests/realworld/matrix.py --jobs N twice (cold, warm; needs the corpus in .cache/realworld, and
     writes every mutant's tree first): median and max seconds per verify of each pass, their JSON in
     DIR (m1.json, m2.json).
Then the kept keys' count and size. Figures: docs/verification.md ("Time and memory").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRY = "checks/attention_decode/correct_online_softmax.py:entry"


def walk_seconds(env: dict) -> str:
    code = (
        "import os, sys, time; from kernalin_ci import sandbox; from kernalin_ci.launch import child_path\n"
        "here = os.path.realpath('.')\n"
        "inst = {os.path.realpath(p) for p in child_path(here) if os.path.isdir(p)} - {here}\n"
        "skip = {sandbox.cache_root(), *inst, *(os.path.realpath(p) for p in "
        "(sys.prefix, sys.base_prefix, *sandbox._site_dirs()))}\n"
        "t = time.perf_counter(); key, why = sandbox._fingerprint(('cuda', (here,), tuple(sorted(inst))), skip)\n"
        "print(f'{time.perf_counter() - t:.2f} s', why or 'ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    return (r.stdout or r.stderr).strip()


def verify_once(device: str, env: dict) -> tuple[float, int, str]:
    cmd = [sys.executable, "-m", "kernalin_ci", "verify", "--op", "attention.decode", "--entry", ENTRY]
    t = time.perf_counter()
    r = subprocess.run([*cmd, "--device", device], cwd=ROOT, env=env, capture_output=True, text=True)
    last = (r.stdout.strip().splitlines() or [""])[-1]
    verdict = next((ln for ln in r.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))), last)
    return time.perf_counter() - t, r.returncode, verdict[:100]


def matrix_once(device: str, jobs: int, only: str | None, env: dict, out: Path) -> str:
    cmd = [sys.executable, "tests/realworld/matrix.py", "--device", device, "--jobs", str(jobs), "--json", str(out)]
    cmd += ["--only", only] if only else []
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if not out.exists():
        return f"no result (exit {r.returncode}): {' '.join(r.stderr.split())[-300:]}"
    secs = [o["seconds"] for o in json.loads(out.read_text())]
    return (
        f"{len(secs)} verifies, median {statistics.median(secs):.1f} s, max {max(secs):.1f} s per verify, "
        f"{wall:.0f} s in all (exit {r.returncode})"
    )


def prepare_matrix(only: str | None) -> bool:
    """The corpus fetched and every mutant's tree written before the first pass, as the second pass finds
    them: the originals' working directory (this repository) holds those trees, and each pass writes them
    again (the same content: the same key)."""
    sys.path.insert(0, str(ROOT / "tests" / "realworld"))
    try:
        import corpus

        kernels = [k for k in corpus.load_manifest() if not only or k.id in only.split(",")]
        corpus.fetch(kernels)
        for k in kernels:
            corpus.mutant_tree(k)
    except Exception as e:  # no corpus here (no network): say so, the rest stands
        print(f"matrix: not run: the corpus is not available ({type(e).__name__}: {e})", flush=True)
        return False
    return True


def kept(root: Path) -> str:
    keys = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")] if root.is_dir() else []
    files = [f for k in keys for f in k.rglob("*") if f.is_file()]
    return f"{len(keys)} keys, {len(files)} files, {sum(f.stat().st_size for f in files) / 2**20:.1f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--jobs", type=int, default=4, help="the matrix's verifies at once")
    ap.add_argument("--only", help="the matrix's kernels (comma-separated ids; default all)")
    ap.add_argument("--no-matrix", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.gettempdir())
    args = ap.parse_args()
    env = {**os.environ, "KERNALIN_SANDBOX": "on"}
    env.pop("KERNALIN_COMPILE_CACHE", None)
    print(f"key walk of {ROOT}: {walk_seconds(env)}", flush=True)
    # the matrix's originals share a key with this verify (one working directory): a cache folder each
    env["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="kernalin-ccache-bench-")
    root = Path(env["XDG_CACHE_HOME"]) / "kernalin-ci" / "triton"
    for label in ("cold", "warm"):
        s, rc, verdict = verify_once(args.device, env)
        print(f"verify correct_online_softmax ({args.device}, {label}): {s:.1f} s, exit {rc}: {verdict}", flush=True)
    print(f"kept: {kept(root)}", flush=True)
    if not args.no_matrix and prepare_matrix(args.only):
        env["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="kernalin-ccache-bench-")
        root = Path(env["XDG_CACHE_HOME"]) / "kernalin-ci" / "triton"
        for i, label in enumerate(("cold", "warm"), 1):
            out = Path(args.out) / f"m{i}.json"
            got = matrix_once(args.device, args.jobs, args.only, env, out)
            print(f"matrix ({args.device}, --jobs {args.jobs}, {label}): {got}", flush=True)
            print(f"kept: {kept(root)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
