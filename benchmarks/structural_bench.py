"""Structural verification over the whole catalogue: the catch matrix and the time per kernel.

    python benchmarks/structural_bench.py [--fixtures] [--json PATH] [--end-to-end N] [FILES...]

For every catalogue module (checks/<op>/*.py, plus tests/structural_fixtures/
with --fixtures), runs the structural checks alone, with the CATALOGUE params,
and prints one row: expected bug class, verdict, findings (class@line),
notices, and the seconds spent in capture / compile / interpret / analyse.
Verdicts: "caught" (a finding of the expected class), "other" (findings, none
of the expected class), "missed" (no finding), "clean" (correct kernel, no
finding), "FALSE" (correct kernel with a finding), "not-analysed" (the
structural status says not analysed, with its cause, as `verify` says it).

Runs entirely on the CPU, with the Triton found in the environment (no GPU, no
network): on the H200 image this measures Triton 3.6. The user's kernels are
imported into this process (the catalogue is ours), and the material goes
through the same file a worker writes; `kernalin-ci verify` captures and
compiles in a worker child and analyses in the parent. --end-to-end N also times N full
`kernalin-ci verify --only structural` commands (process start and imports
included).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"  # compile, never interpret (before anything imports triton)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import argparse  # noqa: E402
import ast  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def catalogue_entry(path: str) -> dict:
    tree = ast.parse(Path(path).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CATALOGUE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{path}: no CATALOGUE dict")


def run_one(path: str) -> dict:
    from kernalin_ci.entry import load_entry
    from kernalin_ci.ops import get_op
    from kernalin_ci.ops.base import resolve_params
    from kernalin_ci.verify.structural.in_process import analyze_entry

    cat = catalogue_entry(path)
    op = cat["op"]
    params = resolve_params(op, get_op(op).params, cat.get("params") or {})
    os.environ["KERNALIN_PARAMS"] = json.dumps(params)
    t0, c0 = time.perf_counter(), time.process_time()
    fn = load_entry(f"{path}:entry", str(ROOT))
    res = analyze_entry(op, fn, params)
    res["seconds"]["total"] = time.perf_counter() - t0
    res["seconds"]["cpu"] = time.process_time() - c0  # robust to other load on a shared machine
    want = cat.get("bug_class")
    classes = [f["bug_class"] for f in res["findings"]]
    if res["status"]["status"] == "not-analysed":  # said, never a pass (a feature the analysis does not model)
        verdict = "not-analysed"
    elif want is None:
        verdict = "FALSE" if classes else "clean"
    elif want in classes:
        verdict = "caught"
    else:
        verdict = "other" if classes else "missed"
    return {
        "file": os.path.relpath(path, ROOT),
        "op": op,
        "expected": want,
        "verdict": verdict,
        "findings": [(f["bug_class"], (f.get("location") or {}).get("line")) for f in res["findings"]],
        "notices": [n["message"] for n in res["notices"]],
        "cause": res["status"].get("cause"),
        "kernels": len(res["kernels"]),
        "seconds": res["seconds"],
    }


def end_to_end(path: str, n: int) -> list[float]:
    cat = catalogue_entry(path)
    cmd = [
        sys.executable,
        "-m",
        "kernalin_ci",
        "verify",
        "--op",
        cat["op"],
        "--entry",
        f"{path}:entry",
        "--only",
        "structural",
        "--device",
        "cpu",
        "--quiet",
    ]
    for k, v in (cat.get("params") or {}).items():
        cmd += ["--param", f"{k}={v}"]
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, capture_output=True)
        out.append(time.perf_counter() - t0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="catalogue modules (default: checks/*/*.py)")
    ap.add_argument("--fixtures", action="store_true", help="also run tests/structural_fixtures/*.py")
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    ap.add_argument(
        "--end-to-end",
        type=int,
        default=0,
        metavar="N",
        help="also time N full `kernalin-ci verify --only structural` runs of the first file",
    )
    args = ap.parse_args(argv)
    files = args.files or sorted(glob.glob(str(ROOT / "checks" / "*" / "*.py")))
    if args.fixtures:
        files += sorted(glob.glob(str(ROOT / "tests" / "structural_fixtures" / "*.py")))
    files = [f for f in files if not os.path.basename(f).startswith("_")]

    import torch
    import triton

    print(
        f"# structural catch matrix: triton {triton.__version__}, torch {torch.__version__}, "
        f"python {sys.version.split()[0]}, {len(files)} files"
    )
    t_imports = time.perf_counter()
    rows = []
    for path in files:
        try:
            row = run_one(path)
        except Exception as e:  # a broken catalogue file must not stop the matrix
            row = {
                "file": os.path.relpath(path, ROOT),
                "op": "?",
                "expected": "?",
                "verdict": "ERROR",
                "findings": [],
                "notices": [f"{type(e).__name__}: {e}"],
                "kernels": 0,
                "seconds": {"total": 0.0},
            }
        rows.append(row)
        s = row["seconds"]
        found = ", ".join(f"{c}@{ln}" for c, ln in row["findings"]) or "-"
        print(
            f"{row['verdict']:12s} {row['file']:58s} expected={str(row['expected']):22s} "
            f"found=[{found}] notices={len(row['notices'])} "
            f"t={s.get('total', 0):.2f}s cpu={s.get('cpu', 0):.2f}s (capture {s.get('capture', 0):.2f}, "
            f"compile {s.get('compile', 0):.2f}, parse {s.get('parse', 0):.2f}, "
            f"interpret {s.get('interpret', 0):.2f}, analyse {s.get('analyse', 0):.2f})",
            flush=True,
        )
        if row.get("cause"):
            print(f"        not analysed: {row['cause'][:200]}")
        for n in row["notices"]:
            print(f"        note: {n[:200]}")
    del t_imports
    bugs = [r for r in rows if r["expected"] not in (None, "?")]
    good = [r for r in rows if r["expected"] is None]
    caught = sum(r["verdict"] == "caught" for r in bugs)
    false = sum(r["verdict"] == "FALSE" for r in good)
    times = [r["seconds"]["total"] for r in rows if r["verdict"] != "ERROR"]
    cpu = [r["seconds"]["cpu"] for r in rows if r["verdict"] != "ERROR"]
    per_kernel = [r["seconds"]["total"] / max(r["kernels"], 1) for r in rows if r["verdict"] != "ERROR"]
    print(
        f"\n# bug kernels caught with their class: {caught}/{len(bugs)}; "
        f"correct kernels with a false finding: {false}/{len(good)}; not analysed (said): "
        f"{sum(r['verdict'] == 'not-analysed' for r in rows)}; errors: {sum(r['verdict'] == 'ERROR' for r in rows)}"
    )
    classes: dict = {}
    for r in bugs:
        classes.setdefault(r["expected"], []).append(r["verdict"] == "caught")
    print("# per class: " + ", ".join(f"{c} {sum(v)}/{len(v)}" for c, v in sorted(classes.items())))
    if times:
        print(
            f"# seconds per entry: median {statistics.median(times):.2f}, max {max(times):.2f} "
            f"(CPU: median {statistics.median(cpu):.2f}, max {max(cpu):.2f}); per kernel: "
            f"median {statistics.median(per_kernel):.2f}, max {max(per_kernel):.2f} "
            f"(first entry includes one-time warm-up)"
        )
    if args.end_to_end and files:
        e2e = end_to_end(files[0], args.end_to_end)
        print(
            f"# end-to-end `kernalin-ci verify --only structural` ({rows[0]['file']}): "
            f"{', '.join(f'{x:.2f}' for x in e2e)} s"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"triton": triton.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
