"""Every verdict explained, on a GPU (issue 18): one command, about 2-3 minutes on one H200.

  python benchmarks/explain_gpu.py [--out DIR] [--budget-s S]

1. provenance and the measured device-to-device copy bandwidth;
2. % of peak of the catalogue's split-KV decode attention (checks/attention_decode/correct_split_kv.py)
   at long context (split-KV: CUDA-core math, tl.sum), next to the copy bandwidth, plus planted
   L2-resident shapes (B=4 kv_len=2048 and B=8 kv_len=512: 34 and 17 MB of K/V inside the 50 MB L2,
   timed in a CUDA graph of back-to-back launches): any figure above the HBM peak is flagged;
3. the example repository's comment-only PR (examples/decode-kernels/prs/comment-only.patch): identical
   compiled code, nothing timed;
4. its launch-config PR (prs/more-warps.patch, num_warps 4 -> 8): timed, with the register / occupancy
   change and the correctness re-check after timing.
Everything printed is also written to DIR/explain_gpu.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernalin_ci.bench.pair import bench_pair  # noqa: E402
from kernalin_ci.config import Kernel  # noqa: E402
from kernalin_ci.explain import peak  # noqa: E402
from kernalin_ci.explain.gate import after_bench, before_bench  # noqa: E402
from kernalin_ci.explain.provenance import environment, provenance_text  # noqa: E402
from kernalin_ci.explain.render import explain_lines  # noqa: E402
from kernalin_ci.ops import get_op  # noqa: E402
from kernalin_ci.report.model import KernelReport  # noqa: E402

OP = "attention.decode"
LONG = [{"batch": 1, "kv_len": 32768}, {"batch": 16, "kv_len": 4096}]
# planted L2-resident shapes (K/V 33.6 MB and 16.8 MB, inside the H200's 50 MB L2): the launches after the
# first in a CUDA graph find K/V in L2, so the figure may exceed the HBM peak and must then be flagged
PLANTED = [{"batch": 4, "kv_len": 2048}, {"batch": 8, "kv_len": 512}]
T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {msg}", flush=True)


def tree(tmp: Path, name: str, patch: str | None) -> str:
    d = tmp / name
    shutil.copytree(ROOT / "examples" / "decode-kernels" / "kernels", d / "kernels")
    if patch:
        subprocess.run(["git", "apply", str(ROOT / "examples" / "decode-kernels" / "prs" / patch)], cwd=d, check=True)
    return str(d)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="explain-gpu-out")
    ap.add_argument("--budget-s", type=float, default=8.0)
    ap.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cpu: a dry run of the same steps at tiny shapes (no GPU figures)",
    )
    a = ap.parse_args()
    global LONG, PLANTED
    dev = a.device
    if dev == "cpu":
        LONG, PLANTED = [{"batch": 2, "kv_len": 24}], [{"batch": 1, "kv_len": 8}]
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {}

    env = environment(dev, measure_copy=dev == "cuda")
    result["environment"] = env
    copy = env.get("copy_gbs")
    peaks = peak.gpu_peaks(env.get("gpu_name"))
    say(f"1. ran on: {provenance_text(env)}")
    say(f"   datasheet: {peaks}")

    # 2. % of peak of the catalogue's split-KV kernel, long context + the planted L2-resident shape
    entry, where = "correct_split_kv.py:entry", str(ROOT / "checks" / "attention_decode")
    shapes = LONG + PLANTED
    res = bench_pair(
        OP, entry, entry, where, where, {"shapes": json.dumps(shapes)}, dev, budget_s=a.budget_s, progress=False
    )
    op = get_op(OP)
    from kernalin_ci.bench.shapes import bench_cases
    from kernalin_ci.ops.base import resolve_params

    params = resolve_params(OP, op.params, {})
    cases = {c.name: c for c in bench_cases(OP, params, dev, {"shapes": json.dumps(shapes)})}
    rows = []
    for s in res.shapes:
        c = cases[s["shape"]]
        ms = s.get("head_ms") if dev == "cuda" else None
        p = peak.shape_peak(op.traffic(c, params), ms, c.dtype, peaks, copy, tensor=False)
        rows.append({"shape": s["shape"], **p})
        say(f"2. split-KV {s['shape']}: {s.get('head_ms')} ms/call: {peak.peak_text(p)}")
    result["split_kv_peak"] = {"rows": rows, "error": res.error, "notes": res.notes}

    with tempfile.TemporaryDirectory(prefix="kernalin-explain-gpu-") as tmp:
        base = tree(Path(tmp), "base", None)
        for name, patch in (("comment-only", "comment-only.patch"), ("more-warps", "more-warps.patch")):
            head = tree(Path(tmp), name, patch)
            bench_params = {"shapes": json.dumps(LONG)}
            plan = before_bench(OP, "kernels/attention.py:decode", {}, bench_params, dev, base, head)
            k = Kernel(name="decode_attention", op=OP, entry="kernels/attention.py:decode")
            kr = KernelReport(k.name, OP, k.entry, "changed")
            if plan.skip_timing:
                say(f"3. {name}: {plan.ident.verdict}: NOT timed ({plan.ident.seconds:.1f} s of compiling)")
                result[name] = {"identity": plan.ident.to_json(), "timed": False}
                continue
            r = bench_pair(
                OP,
                k.entry,
                k.entry,
                base,
                head,
                bench_params,
                dev,
                budget_s=a.budget_s,
                progress=False,
                shapes=plan.to_time,
            )
            kr.benchmark = r.to_json()
            ex = after_bench(plan, kr, k, OP, {}, dev, head, profile=True)  # ncu where on PATH
            say(f"4. {name}: verdict {kr.benchmark.get('verdict')} ratio {kr.benchmark.get('ratio')}")
            for line in explain_lines(ex):
                print("     " + line, flush=True)
            result[name] = {"benchmark": kr.benchmark, "explain": ex, "timed": True}
    (out_dir / "explain_gpu.json").write_text(json.dumps(result, indent=1, default=str))
    say(f"done; {out_dir / 'explain_gpu.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
