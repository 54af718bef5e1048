"""The PTX engine's counterexamples replayed as dynamic cases: `verify --only structural --engine ptx` of catalogue
kernels, each finding's message saying whether its counterexample failed when run (docs/structural.md, "Replay").

    python benchmarks/ptx_replay.py [--device cpu|cuda] [--json PATH] NAME [NAME ...]

NAME is a catalogue kernel's name as `kernalin-ci catalogue` prints it (`kv_append/bug_padding_not_skipped`,
`cuda/rope/bug_sign_inverse`). A CUDA C++ kernel's counterexamples replay only on a GPU (on the CPU its findings
say *not replayed*). Prints one line per finding: the kernel, the bug class and how its replay ended.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def replay_word(message: str) -> str:
    """How a PTX finding's replay ended, from its message."""
    for pattern, word in (
        (r"; replayed: fails dynamically", "replayed: fails"),
        (r"; replay passed", "replayed: passed (did not reproduce)"),
        (r"; not replayed \(([^)]*)\)", "not replayed"),
    ):
        m = re.search(pattern, message)
        if m:
            return f"{word} ({m.group(1)})" if m.groups() else word
    return "no replay said"


def main() -> int:
    from kernalin_ci import catalogue as cat
    from kernalin_ci.cuda.sources import CudaSpec
    from kernalin_ci.verify import verify

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+", metavar="NAME")
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--json", help="also write every finding's message as JSON")
    args = ap.parse_args()
    kernels = {k.name: k for k in cat.discover(cat.default_dir())}
    unknown = [n for n in args.names if n not in kernels]
    if unknown:
        print(f"ptx_replay: unknown kernel(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    rows = []
    for name in args.names:
        k = kernels[name]
        t0 = time.perf_counter()
        r = verify(
            k.op, f"{k.path}:entry", k.params, args.device, only="structural", engine="ptx", sanitizer=False,
            progress=False, root=k.root, cuda=CudaSpec.from_json(k.cuda),
        )  # fmt: skip
        seconds = time.perf_counter() - t0
        found = [f for f in r.findings if f.check.startswith("structural:ptx-")]
        print(f"{name} ({k.bug_class or 'correct'}): {r.structural.status}, {len(found)} findings, {seconds:.1f} s")
        for f in found:
            print(f"  [{f.bug_class}] {replay_word(f.message)}")
        rows.append({"kernel": name, "seconds": round(seconds, 1), "status": r.structural.status,
                     "findings": [{"bug_class": f.bug_class, "message": f.message} for f in found]})  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
