"""Wall time and peak memory of the default `kernalin-ci verify` per catalogue kernel.

    python benchmarks/verify_bench.py [--device cpu|cuda] [--kind dynamic|structural|all] [--op OP]
                                      [--only correct|bug|all] [--jobs N] [--sanitizer on|off] [--json PATH]

Each kernel is verified in a fresh process tree; the peak resident memory is the
largest of that tree's processes (the CLI and its worker children), read from
getrusage(RUSAGE_CHILDREN) in a wrapper process; the CPU seconds are the tree's user +
system time sampled from /proc (benchmarks/proc_tree.py: the sandboxed workers included),
what a shared machine's load does not inflate. Prints one row
per kernel and a summary (median, max) with the load average. `--jobs N` verifies N kernels at once (the
issue-36 goal is stated for four at once on a GPU); `--sanitizer off` leaves Compute Sanitizer out (a GPU's
default runs it beside the dynamic checks); `--breakdown` prints every process of each verify (when it was
seen, its CPU seconds: the parent, each worker by its task and cases, compilers) and the CPU per kind of
process over the run. Figures: docs/verification.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proc_tree import TreeSampler  # noqa: E402  (benchmarks/proc_tree.py)

WRAPPER = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": r.returncode, "seconds": time.perf_counter() - t,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "stdout": r.stdout, "stderr": r.stderr[-2000:]}))
"""


def measure(kernel, device: str, kind: str, sanitizer: str | None = None) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "kernalin_ci",
        "verify",
        "--op",
        kernel.op,
        "--entry",
        f"{kernel.path}:entry",
        "--device",
        device,
        "--quiet",
        "--json",
        "-",
    ]
    for k, v in kernel.params.items():
        cmd += ["--param", f"{k}={v}"]
    if kind != "all":
        cmd += ["--only", kind]
    if sanitizer:
        cmd += ["--sanitizer", sanitizer]
    p = subprocess.Popen(
        [sys.executable, "-c", WRAPPER, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    with TreeSampler(p.pid) as tree:
        stdout, _ = p.communicate()
    m = json.loads(stdout)
    try:
        res = json.loads(m["stdout"])
    except json.JSONDecodeError:
        res = {"verdict": "error", "cases_run": 0, "findings": []}
    return {
        "kernel": kernel.name,
        "op": kernel.op,
        "bug": kernel.bug_class,
        "rc": m["rc"],
        "verdict": res.get("verdict"),
        "cases": res.get("cases_run"),
        "seconds": round(m["seconds"], 2),
        "cpu_seconds": tree.cpu_seconds,
        "peak_rss_mb": round(m["peak_rss_mb"]),
        "error": None if m["rc"] in (0, 1) else m["stderr"][-300:],
        "processes": tree.processes,
    }


def main() -> int:
    from kernalin_ci.catalogue import default_dir, discover

    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--kind", default="all", choices=("dynamic", "structural", "all"))
    ap.add_argument("--op", action="append")
    ap.add_argument("--only", default="correct", choices=("correct", "bug", "all"))
    ap.add_argument("--jobs", type=int, default=1, help="kernels verified at once")
    ap.add_argument("--sanitizer", choices=("on", "off"), help="Compute Sanitizer on a GPU (default: verify's)")
    ap.add_argument("--breakdown", action="store_true", help="per kernel, every process: when it ran, its CPU")
    ap.add_argument("--json")
    args = ap.parse_args()
    kernels = [k for k in discover(default_dir(), args.op) if args.only == "all" or (args.only == "bug") == k.is_bug]
    kernels = [k for k in kernels if k.cuda is None]  # the CUDA catalogue's timings: benchmarks/cuda_gpu.py timing
    rows = []
    print(f"{'kernel':48} {'verdict':8} {'cases':>5} {'seconds':>8} {'CPU s':>8} {'peak MB':>8}  load")
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        runs = [pool.submit(measure, k, args.device, args.kind, args.sanitizer) for k in kernels]
        for run in as_completed(runs):
            r = run.result()
            r["load"] = os.getloadavg()[0]  # the 1-minute load average after the run (a shared machine)
            rows.append(r)
            _print(r)
            if args.breakdown:
                _print_processes(r["processes"])
    _summary(rows, args)
    if args.breakdown:
        _by_label(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def _print(r: dict) -> None:
    print(
        f"{r['kernel']:48} {str(r['verdict']):8} {str(r['cases']):>5} {r['seconds']:8.1f} "
        f"{r['cpu_seconds']:8.1f} {r['peak_rss_mb']:8d}  {r['load']:.1f}"
        + (f"  ERROR {r['error']}" if r["error"] else ""),
        flush=True,
    )


def _print_processes(procs: list[dict]) -> None:
    for p in procs:
        if p["cpu"] >= 0.05 or p["end"] - p["start"] >= 0.5:
            print(f"    {p['start']:6.1f} -> {p['end']:6.1f} s  CPU {p['cpu']:6.2f}  {p['label']}")


def _by_label(rows: list[dict]) -> None:
    """CPU seconds per kind of process, summed over each verify, then the median over the verifies."""
    per: dict[str, list[float]] = {}
    for r in rows:
        sums: dict[str, float] = {}
        for p in r["processes"]:
            sums[p["label"]] = sums.get(p["label"], 0.0) + p["cpu"]
        for lab, cpu in sums.items():
            per.setdefault(lab, []).append(cpu)
    print("\nCPU seconds per kind of process (median over the verifies that had one; how many had one):")
    for lab, cpus in sorted(per.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"  {statistics.median(cpus):7.2f}  ({len(cpus):3d})  {lab}")


def _summary(rows: list[dict], args) -> None:
    secs = [r["seconds"] for r in rows]
    cpu = [r["cpu_seconds"] for r in rows]
    mem = [r["peak_rss_mb"] for r in rows]
    print(
        f"\n{len(rows)} kernels on {args.device} ({args.kind}, {args.jobs} at once): "
        f"seconds median {statistics.median(secs):.1f}, "
        f"max {max(secs):.1f}; CPU seconds median {statistics.median(cpu):.1f}, max {max(cpu):.1f}; "
        f"peak RSS median {statistics.median(mem):.0f} MB, max {max(mem):.0f} MB; "
        f"load average {min(r['load'] for r in rows):.1f}-{max(r['load'] for r in rows):.1f}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
