"""Time and peak memory of the whole gate (`kernalin-ci run`) on one pull request that changes N kernels.

    python benchmarks/gate_scale_bench.py [--counts 1,4,16,64] [--device cpu|cuda] [--op OP ...]
                                          [--no-bench] [--json PATH]

For each N a git repository is made in a temporary folder. Its base commit holds N kernels, copies of the
catalogue's correct Triton kernels of the chosen ops (default: attention.decode, attention.decode_paged, rope,
kv_append), taken in catalogue order and cycled, each in its own file with its own `.kernalin.yml` entry and the
catalogue's params. The head commit changes the code of every one of them (a module-level assignment: a new
syntax tree, so the kernel is `changed` and fully gated; the compiled kernel stays the same). `kernalin-ci run
--base main --head pr` then gates the pull request in a fresh process tree, as CI would. The gate checks its
kernels one after another (it has no --jobs: on a GPU, kernels timed at once would disturb each other's timings).

Per N: the wall time, the gate's own seconds, the median and max seconds per kernel, the CPU seconds of the
whole process tree (the gate and its sandboxed workers) and its peak memory, the largest sum of resident memory
over the tree at one moment (both sampled from /proc every 0.2 s: benchmarks/proc_tree.py), and the load average
before and after (a shared machine's load stretches the wall time, not the CPU seconds). Figures: docs/benchmarking.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proc_tree import TreeSampler  # noqa: E402  (benchmarks/proc_tree.py)

OPS = ("attention.decode", "attention.decode_paged", "rope", "kv_append")


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def make_repo(path: Path, n: int, ops: list[str], bench: bool) -> list[str]:
    """A repository with N catalogue kernels at main and branch `pr` changing the code of every one."""
    from kernalin_ci.catalogue import default_dir, discover

    pool = [k for k in discover(default_dir(), ops) if not k.is_bug and k.cuda is None]
    if not pool:
        raise SystemExit(f"no correct Triton kernel in the catalogue for {ops}")
    (path / "kernels").mkdir(parents=True)
    lines = ["version: 1", "kernels:"]
    names = []
    for i in range(n):
        k = pool[i % len(pool)]
        stem = f"{Path(k.path).stem}_{i:02d}"
        shutil.copy(k.path, path / "kernels" / f"{stem}.py")
        lines += [f"  - name: {stem}", f"    op: {k.op}", f"    entry: kernels/{stem}.py:entry"]
        if k.params:
            lines.append(f"    params: {json.dumps(k.params)}")
        names.append(k.name)
    lines += ["gate:", "  fail_on: [finding, slower]"] + ([] if bench else ["  bench: false"])
    (path / ".kernalin.yml").write_text("\n".join(lines) + "\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-qm", f"base: {n} kernels")
    git(path, "checkout", "-qb", "pr")
    for f in sorted((path / "kernels").glob("*.py")):
        f.write_text(f.read_text() + "\nPR_REVISION = 1  # a code change: a new syntax tree\n")
    git(path, "commit", "-qam", f"pr: change all {n} kernels")
    return names


def gate(repo: Path, device: str) -> dict:
    cmd = [sys.executable, "-m", "kernalin_ci", "run", "--base", "main", "--head", "pr", "--device", device]
    cmd += ["--quiet", "--out", str(repo / "out")]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with TreeSampler(p.pid) as tree:
        _, err = p.communicate()
        seconds = time.perf_counter() - t0
    report = json.loads((repo / "out" / "report.json").read_text()) if (repo / "out" / "report.json").is_file() else {}
    kernels = report.get("kernels", [])
    return {
        "rc": p.returncode,
        "seconds": round(seconds, 1),
        "gate_seconds": round(report.get("seconds") or 0.0, 1),
        "conclusion": report.get("conclusion"),
        "kernel_seconds": [round(k.get("seconds") or 0.0, 1) for k in kernels],
        "verdicts": sorted({(k.get("verification") or {}).get("verdict") or str(k.get("error")) for k in kernels}),
        "cpu_seconds": tree.cpu_seconds,
        "tree_peak_mb": tree.peak_rss_mb,
        "stderr": err[-1500:] if p.returncode not in (0, 1) else "",
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1,4,16,64", help="kernels changed per pull request (comma-separated)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--op", action="append", help=f"only kernels of this op, repeatable (default: {', '.join(OPS)})")
    ap.add_argument("--no-bench", action="store_true", help="gate.bench: false (verification only)")
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.counts.split(",")]
    rows = []
    print(
        f"{'kernels':>7} {'rc':>3} {'seconds':>8} {'gate s':>7} {'s/kernel median':>15} {'max':>6} "
        f"{'CPU s':>7} {'tree MB':>8}  load",
        flush=True,
    )
    for n in counts:
        with tempfile.TemporaryDirectory(prefix="kernalin-gate-scale-") as tmp:
            repo = Path(tmp) / "repo"
            names = make_repo(repo, n, args.op or list(OPS), bench=not args.no_bench)
            load = os.getloadavg()
            r = gate(repo, args.device)
            r |= {
                "kernels": n,
                "catalogue": names,
                "load_before": [round(x, 2) for x in load],
                "load_after": [round(x, 2) for x in os.getloadavg()],
            }
        rows.append(r)
        ks = r["kernel_seconds"] or [0.0]
        print(
            f"{n:7d} {r['rc']:3d} {r['seconds']:8.1f} {r['gate_seconds']:7.1f} {statistics.median(ks):15.1f} "
            f"{max(ks):6.1f} {r['cpu_seconds']:7.1f} {r['tree_peak_mb']:8d}  "
            f"{r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f}  {r['conclusion']} {r['verdicts']}"
            + (f"\n  ERROR {r['stderr']}" if r["stderr"] else ""),
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
