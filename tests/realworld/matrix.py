"""Verify every kernel of the real-world corpus and its mutant; print the matrix as a markdown table.

    python tests/realworld/matrix.py [--device cpu|cuda] [--jobs N] [--only ID[,ID]] [--json PATH]
    python tests/realworld/matrix.py --engine ptx [--jobs N] [--only ID[,ID]] [--json PATH]

Fetches the corpus first (tests/realworld/fetch.py). Exit code 0 when every original is as the manifest
expects (clean, its documented true finding, or findings of a known cause) and every mutant is caught.
The CUDA C++ kernels (manifest `device: cuda`) run only with --device cuda.

--engine ptx runs the PTX engine alone (`verify --only structural --engine ptx`, on the CPU) on every kernel,
the CUDA C++ ones included: per original its verdict (clean, its documented true finding, FALSE findings, or not
analysed with the cause), the properties proved and not proved; per mutant whether the engine alone reports its
class. Exit code 0 when no original has a false finding (a missed mutant is a figure, not a failure).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402


def row(k: corpus.Kernel, orig: corpus.Outcome, mut: corpus.Outcome) -> str:
    def cell(o):
        word = corpus.judge(k, o).word
        return f"{word}: {', '.join(o.classes)}" if o.classes else word

    structural = "not analysed"
    if orig.structural == "ran":
        structural = f"ran: {len(orig.proved)} proved" + (f", {len(orig.gaps)} not verified" if orig.gaps else "")
    elif orig.structural == corpus.expected_structural(k):  # said: the analysis does not model the feature
        structural = "not analysed for " + orig.structural.split("not analysed for ", 1)[1].split(":")[0]
    if corpus.triton_too_new(k):
        structural = "n/a"
    return (
        f"| {k.id} | {k.op} | {cell(orig)} | {structural} | {k.mutant.bug_class} | {cell(mut)} | "
        f"{orig.seconds:.0f} + {mut.seconds:.0f} |"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--jobs", type=int, default=1, help="verifies at once (each uses its own workers)")
    ap.add_argument("--only", help="comma-separated kernel ids")
    ap.add_argument("--json", help="also write every outcome as JSON to this path")
    ap.add_argument("--engine", choices=("ptx",), help="the PTX engine alone, on the CPU (above)")
    args = ap.parse_args(argv)
    kernels = corpus.load_manifest()
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {k.id for k in kernels}
        if unknown:
            print(f"matrix: unknown kernel id(s): {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        kernels = [k for k in kernels if k.id in wanted]
    if args.jobs < 1:
        print("matrix: --jobs must be at least 1", file=sys.stderr)
        return 2
    if args.engine == "ptx":
        return ptx_matrix(kernels, args.jobs, args.json)
    gpu_only = [k.id for k in kernels if k.device == "cuda" and args.device != "cuda"]
    if gpu_only:  # CUDA C++ kernels run on a GPU only (docs/cuda.md), as in tests/test_realworld.py
        print(f"matrix: left out (GPU only, --device cuda): {', '.join(gpu_only)}", file=sys.stderr)
        kernels = [k for k in kernels if k.id not in gpu_only]
    corpus.fetch(kernels)
    jobs = [(k, v) for k in kernels for v in ("original", "mutant")]
    with ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(lambda kv: corpus.verify(kv[0], kv[1], args.device), jobs))
    by = {(o.kernel, o.variant): o for o in outcomes}
    print(f"| kernel | op | original ({args.device}) | structural | mutant | mutant ({args.device}) | seconds |")
    print("|---|---|---|---|---|---|---|")
    for k in kernels:
        print(row(k, by[k.id, "original"], by[k.id, "mutant"]))
    notes = []
    for o in outcomes:
        k = next(k for k in kernels if k.id == o.kernel)
        j = corpus.judge(k, o)
        notes += [f"- {k.id} ({o.variant}): {p}" for p in [*j.problems, *j.known, j.not_checked] if p]
        notes += [f"- {k.id} ({o.variant}): not checked: {n}" for n in o.not_checked]
        if o.variant == "original" and o.proved:
            notes.append(f"- {k.id}: structural proved: {', '.join(o.proved)}")
        notes += [f"- {k.id} ({o.variant}): structural not verified: {g[:200]}" for g in o.gaps]
    notes += [f"- {k.id}: true finding [{r['bug_class']}]: {r['why']}" for k in kernels for r in k.true_findings]
    if notes:
        print("\n" + "\n".join(notes))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    bad = [o for o in outcomes if corpus.judge(next(k for k in kernels if k.id == o.kernel), o).problems]
    return 1 if bad else 0


PTX_ONLY = ("--only", "structural", "--engine", "ptx")


def ptx_cell(k: corpus.Kernel, o: corpus.Outcome) -> tuple[str, bool]:
    """(the cell of one outcome of the PTX engine alone, whether it is a false finding on an original)."""
    if o.error and k.device == "cuda":  # its adapter calls a library nvcc built (ctypes): nothing to capture
        return f"not analysed here: {o.error.split(': ', 1)[-1][:120]}", False
    if o.error:
        return f"ERROR: {o.error[:160]}", o.variant == "original"
    if o.structural != "ran":
        return o.structural.replace("not-analysed:", "not analysed:")[:200], False
    if o.variant == "mutant":
        if k.mutant.bug_class in o.classes:
            return "caught", False
        return ("other: " + ", ".join(o.classes)) if o.classes else "missed", False
    true = [f for f in o.findings if any(corpus.matches(f, r) for r in k.true_findings)]
    false = [f for f in o.findings if f not in true]
    if false:
        return "FALSE: " + "; ".join(f"[{f['bug_class']}] {f['message'][:160]}" for f in false), True
    return ("true finding: " + ", ".join(sorted({f["bug_class"] for f in true}))) if true else "clean", False


def ptx_matrix(kernels: list[corpus.Kernel], jobs: int, json_path: str | None) -> int:
    corpus.fetch(kernels)
    work = [(k, v) for k in kernels for v in ("original", "mutant")]
    with ThreadPoolExecutor(jobs) as pool:
        outcomes = list(pool.map(lambda kv: corpus.verify(kv[0], kv[1], "cpu", PTX_ONLY), work))
    by = {(o.kernel, o.variant): o for o in outcomes}
    print("| kernel | op | original (PTX engine) | proved / not proved | mutant | mutant (PTX engine) | seconds |")
    print("|---|---|---|---|---|---|---|")
    bad, notes = False, []
    for k in kernels:
        orig, mut = by[k.id, "original"], by[k.id, "mutant"]
        (oc, false), (mc, _) = ptx_cell(k, orig), ptx_cell(k, mut)
        bad = bad or false
        unproved = [n["message"] for n in orig.notices if n.get("check") == "structural:ptx-proof"]
        counts = f"{len(orig.proved)} / {len(unproved)}" if orig.structural == "ran" else "-"
        seconds = f"{orig.seconds:.0f} + {mut.seconds:.0f}"
        print(f"| {k.id} | {k.op} | {oc} | {counts} | {k.mutant.bug_class} | {mc} | {seconds} |")
        notes += [f"- {k.id}: {m[:240]}" for m in unproved]
    if notes:
        print("\n" + "\n".join(notes))
    if json_path:
        Path(json_path).write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
