"""The PTX engine over the catalogue: per op, the bug classes it catches alone, its false findings, the
properties it proves on each correct kernel, and the seconds per kernel.

    python benchmarks/ptx_bench.py [--json PATH] [FILES...]

For every catalogue module (checks/<op>/*.py), captures the entry with its CATALOGUE params (and the twin
call), compiles each kernel to PTX for sm_90 and runs the PTX engine (`verify --engine ptx` does the same
through a worker child). Row verdicts: "caught" (a finding of the file's class), "other" (findings, none of
its class), "missed", "clean" (correct kernel, no finding), "FALSE" (a finding on a correct kernel), and
"not analysed" with the cause. CPU only, no GPU.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_one(path: str) -> dict:
    from kernalin_ci.catalogue import read_meta
    from kernalin_ci.entry import load_entry
    from kernalin_ci.ops import get_op
    from kernalin_ci.ops.base import resolve_params
    from kernalin_ci.verify.structural.in_process import analyze_entry

    meta = read_meta(Path(path))
    params = resolve_params(meta.op, get_op(meta.op).params, meta.params)
    os.environ["KERNALIN_PARAMS"] = json.dumps(params)
    t0, c0 = time.perf_counter(), time.process_time()
    out = analyze_entry(meta.op, load_entry(f"{path}:entry", None), params, str(ROOT), engine="ptx")
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    classes = sorted({f["bug_class"] for f in out["findings"]})
    status = out["status"]
    if meta.bug_class is None:
        verdict = "FALSE" if classes else ("clean" if status["status"] == "analysed" else "not analysed")
    else:
        verdict = "caught" if meta.bug_class in classes else ("other" if classes else "missed")
    return {
        "file": os.path.relpath(path, ROOT),
        "op": meta.op,
        "expected": meta.bug_class,
        "verdict": verdict,
        "classes": classes,
        "status": status,
        "proved": out.get("proved", []),
        "notices": [n["message"] for n in out["notices"]],
        "seconds": round(wall, 2),
        "cpu": round(cpu, 2),
        "kernels": out["kernels"],
    }


def crashed(path: str, e: Exception) -> dict:
    """The row of a file whose analysis raised: verdict ERROR, the exception as the cause."""
    from kernalin_ci.catalogue import read_meta

    try:
        meta = read_meta(Path(path))
        op, expected = meta.op, meta.bug_class
    except Exception:
        op, expected = "?", None
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    status = {"status": "error", "cause": f"engine error: {type(e).__name__}: {first}"}
    return {
        "file": os.path.relpath(path, ROOT), "op": op, "expected": expected, "verdict": "ERROR", "classes": [],
        "status": status, "proved": [], "notices": [], "seconds": 0.0, "cpu": 0.0, "kernels": [],
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    files = args.files or sorted(glob.glob(str(ROOT / "checks" / "*" / "*.py")))
    rows = []
    for f in files:
        try:
            r = run_one(f)
        except Exception as e:  # an engine crash on one file is that file's row, not the end of the run
            r = crashed(f, e)
        rows.append(r)
        cause = "" if r["status"]["status"] == "analysed" else f" ({r['status']['cause'][:90]})"
        took = f"{r['seconds']}s ({r['cpu']}s CPU)"
        print(f"{r['file']}: {r['verdict']} {','.join(r['classes'])} {took}{cause}", flush=True)
    print()
    print("| op | bug classes caught (PTX alone) | bug kernels caught | false findings | correct kernels analysed |")
    print("|---|---|---|---|---|")
    for op in sorted({r["op"] for r in rows}):
        mine = [r for r in rows if r["op"] == op]
        bugs = [r for r in mine if r["expected"]]
        classes = sorted({r["expected"] for r in bugs})
        caught = sorted({r["expected"] for r in bugs if r["verdict"] == "caught"})
        good = [r for r in mine if not r["expected"]]
        print(
            f"| {op} | {len(caught)}/{len(classes)} ({', '.join(caught) or '-'}) "
            f"| {sum(r['verdict'] == 'caught' for r in bugs)}/{len(bugs)} "
            f"| {sum(r['verdict'] == 'FALSE' for r in good)}/{len(good)} "
            f"| {sum(r['verdict'] == 'clean' for r in good)}/{len(good)} |"
        )
    errors = [r["file"] for r in rows if r["verdict"] == "ERROR"]
    if errors:
        print(f"\nengine errors ({len(errors)}): {', '.join(errors)}")
    secs, cpus = sorted(r["seconds"] for r in rows), sorted(r["cpu"] for r in rows)
    if secs:
        print(f"\nseconds per entry: median {secs[len(secs) // 2]}, max {secs[-1]}")
        print(f"CPU seconds per entry: median {cpus[len(cpus) // 2]}, max {cpus[-1]}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
