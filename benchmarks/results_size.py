"""How much a kernel worker hands back through its results folder, per example kernel: the largest result
file and the total, against the folder's disk cap (KERNALIN_SANDBOX_DISK, default 8 GiB; docs/security.md).

    python benchmarks/results_size.py [--device cpu|cuda] [--kernel NAME]

Runs `verify` (dynamic checks) of each kernel of examples/decode-kernels in this process and notes the
size of every result file the parent reads (verify/exchange.py). On a GPU this includes the 2^31-element
kv_append case (handed back as its non-zero rows), which the CPU interpreter does not run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
EXAMPLE = ROOT / "examples" / "decode-kernels"


def main() -> int:
    import yaml

    from kernalin_ci import sandbox
    from kernalin_ci.verify import exchange, verify

    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--kernel", action="append")
    args = ap.parse_args()
    sizes: list[int] = []
    load = exchange.load

    def noting(directory, name, named, max_bytes=exchange.MAX_FILE_BYTES):
        try:
            sizes.append(os.stat(os.path.join(directory, name), follow_symlinks=False).st_size)
        except OSError:
            pass
        return load(directory, name, named, max_bytes)

    exchange.load = noting
    cap = sandbox.worker_disk()
    print(f"results folder cap {sandbox.size_text(cap)}; sandboxed workers: {sandbox.workers_sandboxed()}")
    print(f"{'kernel':<18} {'files':>6} {'largest':>12} {'total':>12} {'seconds':>8}  verdict")
    kernels = yaml.safe_load((EXAMPLE / ".kernalin.yml").read_text())["kernels"]
    largest = 0
    for k in kernels:
        if args.kernel and k["name"] not in args.kernel:
            continue
        sizes.clear()
        t = time.perf_counter()
        r = verify(
            k["op"], str(EXAMPLE / k["entry"]), k.get("params", {}), args.device, only="dynamic", root=str(EXAMPLE),
            progress=False,
        )  # fmt: skip
        big = max(sizes, default=0)
        largest = max(largest, big)
        print(
            f"{k['name']:<18} {len(sizes):>6} {big:>12,} {sum(sizes):>12,} {time.perf_counter() - t:>8.1f}  "
            f"{'pass' if not r.findings else f'{len(r.findings)} findings'}"
        )
    print(f"largest result file: {largest:,} bytes ({100 * largest / cap:.3f} % of the cap)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
