"""Every verdict explained, on a GPU (issue 18): one command, about 2.5 minutes on one H200.

  python benchmarks/explain_gpu.py [--out DIR] [--budget-s S] [--deadline-s S] [--device cpu]

1. provenance and the measured device-to-device copy bandwidth;
2. % of peak of the example repository's kernels (examples/decode-kernels), each timed against itself in
   the gate's default regime (cold): kv_append at T = 1, 64, 256 and at the planted shapes, decode
   attention at B=1 kv_len=32768 and B=16 kv_len=4096; then rope and paged attention while time is left;
3. the planted L2-resident shapes: kv_append (a plain row copy, the example's fastest kernel) at
   T = 2048, 3072, 4096 tokens moves 16.8, 25.2 and 33.6 MB, all of it inside the H200's 50 MB L2. Timed
   warm (back-to-back launches on the same buffers) every launch after the first finds them in L2, and a
   figure above the datasheet HBM peak, or more than 10% above the measured copy, is flagged as a
   measurement problem; timed cold (step 2) the same shapes read DRAM and are not flagged; T = 8192
   (67 MB, beyond the L2) is timed warm as a control;
4. the example's comment-only PR (prs/comment-only.patch): identical compiled code, nothing timed;
5. its launch-config PR (prs/more-warps.patch, num_warps 4 -> 8): timed, with the register / occupancy
   change, the correctness re-check after timing, and Nsight Compute base and head side by side, run in
   the worker sandbox (or the reason it could not be; then, the example being trusted code, once more
   with KERNALIN_SANDBOX=off so the figures are seen).
The compiles of step 4 and 5 run in the background (CPU only) while step 2 and 3 time on the GPU.
Everything printed is also written to DIR/explain_gpu.json (DIR/explain_gpu.txt: the printed lines).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernalin_ci.bench.pair import bench_pair  # noqa: E402
from kernalin_ci.bench.shapes import bench_cases  # noqa: E402
from kernalin_ci.config import Kernel  # noqa: E402
from kernalin_ci.explain import peak  # noqa: E402
from kernalin_ci.explain import profile as profile_mod  # noqa: E402
from kernalin_ci.explain.gate import after_bench, before_bench  # noqa: E402
from kernalin_ci.explain.profile import nsight, profile_lines  # noqa: E402
from kernalin_ci.explain.provenance import environment, provenance_text  # noqa: E402
from kernalin_ci.explain.render import explain_lines  # noqa: E402
from kernalin_ci.ops import get_op  # noqa: E402
from kernalin_ci.ops.base import resolve_params  # noqa: E402
from kernalin_ci.report.model import KernelReport  # noqa: E402

EXAMPLE = ROOT / "examples" / "decode-kernels"
# name, op, entry, op params, cold shapes (GPU), required
KERNELS = [
    ("kv_append", "kv_append", "kernels/kv_cache.py:append", {"block_size": 16}, "tokens", True),
    ("decode_attention", "attention.decode", "kernels/attention.py:decode", {}, "attention", True),
    ("rope", "rope", "kernels/rope.py:rope", {"style": "neox"}, "tokens", False),
    (
        "paged_attention",
        "attention.decode_paged",
        "kernels/paged_attention.py:decode_paged",
        {"block_size": 16},
        "attention",
        False,
    ),
]
SHAPES = {
    "cuda": {
        "tokens": [{"tokens": 1}, {"tokens": 64}, {"tokens": 256}],
        "attention": [{"batch": 1, "kv_len": 32768}, {"batch": 16, "kv_len": 4096}],
        "planted": [{"tokens": 2048}, {"tokens": 3072}, {"tokens": 4096}],
        "control": [{"tokens": 8192}],  # 67 MB: beyond the L2, warm or not
        "pr": [{"batch": 16, "kv_len": 4096}],
    },
    "cpu": {  # a dry run of the same steps at tiny shapes (no GPU figures)
        "tokens": [{"tokens": 4}],
        "attention": [{"batch": 2, "kv_len": 24}],
        "planted": [{"tokens": 8}],
        "control": [{"tokens": 16}],
        "pr": [{"batch": 2, "kv_len": 24}],
    },
}
T0 = time.perf_counter()
LINES: list[str] = []


def say(msg: str) -> None:
    line = f"[{time.perf_counter() - T0:6.1f} s] {msg}"
    LINES.append(line)
    print(line, flush=True)


def tree(tmp: Path, name: str, patch: str | None) -> str:
    d = tmp / name
    shutil.copytree(EXAMPLE / "kernels", d / "kernels")
    if patch:
        subprocess.run(["git", "apply", str(EXAMPLE / "prs" / patch)], cwd=d, check=True)
    return str(d)


def peaks_of(name, op_name, op_params, shapes, res, dev, peaks, copy, regime) -> list[dict]:
    """% of peak per timed shape of an A/A benchmark (the head side: the same kernel)."""
    op = get_op(op_name)
    params = resolve_params(op_name, op.params, op_params)
    cases = {c.name: c for c in bench_cases(op_name, params, dev, {"shapes": json.dumps(shapes)})}
    rows = []
    for s in res.shapes:
        c = cases[s.shape]
        ms = s.head_ms if dev == "cuda" else None  # interpreter times are no GPU figures
        # the example's kernels have no tensor-core instruction (tl.sum, no tl.dot): CUDA-core FLOP/s
        p = peak.shape_peak(op.traffic(c, params), ms, c.dtype, peaks, copy, tensor=False)
        rows.append({"kernel": name, "regime": regime, "shape": s.shape, **p})
        t = f"{s.head_ms:.4g}" if s.head_ms is not None else "n/a"
        say(f"   {name} [{regime}] {s.shape}: {t} ms/call: {peak.peak_text(p)}")
    return rows


def time_example(name, op_name, entry, op_params, shapes, dev, budget, peaks, copy, regime) -> dict:
    params = {**op_params, "shapes": json.dumps(shapes)}
    where = str(EXAMPLE)
    res = bench_pair(op_name, entry, entry, where, where, params, dev, budget_s=budget, progress=False, regime=regime)
    if res.error:
        say(f"   {name} [{regime}]: benchmark failed: {res.error}")
    rows = peaks_of(name, op_name, op_params, shapes, res, dev, peaks, copy, regime)
    return {"rows": rows, "error": res.error, "notes": res.notes, "copies": [s.copies for s in res.shapes]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "explain-gpu-out"))
    ap.add_argument("--budget-s", type=float, default=1.5, help="timing budget per benchmark")
    ap.add_argument("--deadline-s", type=float, default=165.0, help="optional steps are skipped after this")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    a = ap.parse_args()
    dev, S = a.device, SHAPES[a.device]
    profile_mod.TIMEOUT_S = 45.0  # a side under ncu takes 10-20 s; a hang must not eat the run
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"device": dev}

    def save() -> None:
        (out_dir / "explain_gpu.json").write_text(json.dumps(result, indent=1, default=str))
        (out_dir / "explain_gpu.txt").write_text("\n".join(LINES) + "\n")

    env = environment(dev, measure_copy=dev == "cuda")
    result["environment"] = env
    copy = env.get("copy_gbs")
    peaks = peak.gpu_peaks(env.get("gpu_name"))
    say(f"1. ran on: {provenance_text(env)}")
    say(
        f"   datasheet: {peaks}; above peak means > {peaks and peaks['hbm_gbs']} GB/s or > "
        f"{peak.COPY_MARGIN:.2f} x the measured copy ({copy and round(copy * peak.COPY_MARGIN)} GB/s)"
    )

    with tempfile.TemporaryDirectory(prefix="kernalin-explain-gpu-") as tmp, ThreadPoolExecutor(2) as pool:
        base = tree(Path(tmp), "base", None)
        heads = {
            n: tree(Path(tmp), n, p)
            for n, p in (("comment-only", "comment-only.patch"), ("more-warps", "more-warps.patch"))
        }
        pr_bench = {"shapes": json.dumps(S["pr"])}
        entry = "kernels/attention.py:decode"
        plans = {
            n: pool.submit(before_bench, "attention.decode", entry, {}, pr_bench, dev, base, h)
            for n, h in heads.items()
        }  # compiles: CPU only, while the GPU times below

        # 2 + 3. % of peak (cold), the planted shapes warm
        result["peak"] = {}
        for name, op_name, k_entry, op_params, kind, required in KERNELS:
            if not required:
                continue  # after step 5, while time is left
            shapes = S[kind] + (S["planted"] if name == "kv_append" else [])
            say(f"2. {name}: % of peak, cold (the gate's default regime)")
            result["peak"][name] = time_example(
                name, op_name, k_entry, op_params, shapes, dev, a.budget_s, peaks, copy, "cold"
            )
            if name == "kv_append":
                say("3. kv_append at the planted L2-resident shapes, warm")
                result["planted_warm"] = time_example(
                    name, op_name, k_entry, op_params, S["planted"] + S["control"], dev, a.budget_s, peaks, copy, "warm"
                )
                cold = [
                    r
                    for r in result["peak"][name]["rows"]
                    if r["shape"] in {x["shape"] for x in result["planted_warm"]["rows"]}
                ]
                warm = result["planted_warm"]["rows"][: len(S["planted"])]
                control = result["planted_warm"]["rows"][len(S["planted"]) :]
                say(
                    f"   flagged above peak: planted warm {sum(r['above_peak'] for r in warm)} of {len(warm)}, "
                    f"planted cold {sum(r['above_peak'] for r in cold)} of {len(cold)}, "
                    f"beyond-L2 control warm {sum(r['above_peak'] for r in control)} of {len(control)}"
                )
            save()

        # 4 + 5. the example's PRs
        for name, fut in plans.items():
            plan = fut.result()
            k = Kernel(name="decode_attention", op="attention.decode", entry=entry)
            kr = KernelReport(k.name, k.op, k.entry, "changed")
            if plan.skip_timing:
                say(f"4. {name}: {plan.ident.verdict}: NOT timed ({plan.ident.seconds:.1f} s of compiling)")
                result[name] = {"identity": plan.ident.to_json(), "timed": False}
                continue
            r = bench_pair(
                k.op,
                entry,
                entry,
                base,
                heads[name],
                pr_bench,
                dev,
                budget_s=a.budget_s,
                progress=False,
                shapes=plan.to_time,
            )
            kr.benchmark = r
            ex = after_bench(plan, kr, k, k.op, {}, dev, heads[name], profile=True)
            b = kr.benchmark.to_json()
            say(f"5. {name}: verdict {b.get('verdict')} ratio {b.get('ratio')}")
            for line in explain_lines(ex):
                say("     " + line)
            result[name] = {"benchmark": b, "explain": ex.to_json(), "timed": True}
            prof = ex.profile or {}
            got = prof.get("status") == "profiled" and not any("error" in (prof.get(s) or {}) for s in ("base", "head"))
            if dev == "cuda" and not got and shutil.which("ncu"):
                # the example is trusted code: show the figures without the sandbox too
                os.environ["KERNALIN_SANDBOX"] = "off"
                try:
                    cases = [c for c in plan.cases if c.name in plan.to_time]
                    params = resolve_params(k.op, get_op(k.op).params, {})
                    un = nsight(True, k.op, entry, base, heads[name], params, cases[0], dev)
                finally:
                    os.environ.pop("KERNALIN_SANDBOX", None)
                say("5. more-warps, Nsight Compute once more without the sandbox (the example is trusted code):")
                for line in profile_lines(un):
                    say("     " + line)
                result[name]["profile_unsandboxed"] = un
            save()

        # 2 (rest). the optional kernels, while time is left
        for name, op_name, k_entry, op_params, kind, _required in KERNELS:
            if name in result["peak"]:
                continue
            if time.perf_counter() - T0 > a.deadline_s - 20:
                say(f"2. {name}: skipped (the run's {a.deadline_s:.0f} s are nearly spent)")
                continue
            say(f"2. {name}: % of peak, cold")
            result["peak"][name] = time_example(
                name, op_name, k_entry, op_params, S[kind], dev, a.budget_s, peaks, copy, "cold"
            )
            save()
    say(f"done; {out_dir / 'explain_gpu.json'}")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
