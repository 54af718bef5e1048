"""The H200 run of the baseline-versus-PR benchmark, in one invocation (about 4-6 minutes).

    OUT=/some/dir python benchmarks/gpu_bench.py          # on the GPU machine, from the repository root

1. correctness: the benchmark kernels of benchmarks/kernels/decode_attention.py through
   `kernalin-ci verify` (dynamic checks; split_kv and single_pass), and the slow copies
   against split_kv's output;
2. collection with the L2 flush on and off: split_kv three times (three separately loaded
   builds: base, head, base2), split_kv_slow1 (+1% work), split_kv_slow2 (+2%) and
   single_pass timed in the same interleaved rounds, 100 fixed rounds, two shapes (one
   whose KV fits in L2, one that does not); saved as variants traces for
   benchmarks/data/ (t[rounds, variants, reps], groups) and summarised: per-launch time,
   within-round spread, A/A round-to-round jitter, the ratios;
3. the four benchmarks of the issue (adaptive, default budget 30 s, default L2 flush):
   single_pass -> split_kv (faster), split_kv -> single_pass (slower), split_kv against
   itself on the default decode shapes (equivalent), split_kv -> split_kv_slow2 (about 2%
   slower); their compare-format traces are saved (`kernalin-ci compare` reproduces the
   verdicts from them; meta["bench_result"] holds the bench verdict JSON);
4. a summary table, printed last.
Eight files go under $OUT (default ./gpu-bench-out): four variants traces, four bench traces.

`--smoke` runs the same steps on the CPU (Triton interpreter, tiny shapes, two rounds each,
no verify step) to check the script's plumbing where there is no GPU; its figures mean nothing.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.chdir(ROOT)
SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: this process runs kernels too

import torch  # noqa: E402

from kernalin_ci.bench.pair import bench_pair  # noqa: E402
from kernalin_ci.bench.trace import save_trace  # noqa: E402

K = "benchmarks/kernels/decode_attention.py"
OUT = os.environ.get("OUT") or os.path.join(ROOT, "gpu-bench-out")
DEADLINE_S = 460  # skip what is left after this (the device allows 10 minutes per command)
T0 = time.perf_counter()
LONG = {"batch": 8, "kv_len": 16384}
SHAPES = [{"batch": 1, "kv_len": 4096}, LONG]  # K+V: 17 MB (fits the 60 MB L2) and 537 MB
DEVICE = "cpu" if SMOKE else "cuda"
if SMOKE:
    LONG = {"batch": 2, "kv_len": 24}
    SHAPES = [{"batch": 1, "kv_len": 16}, LONG]
    OUT = os.path.join(OUT, "smoke")


def say(*a):
    print(f"[{time.perf_counter() - T0:6.1f} s]", *a, flush=True)


def left() -> float:
    return DEADLINE_S - (time.perf_counter() - T0)


def environment():
    if SMOKE:
        say("SMOKE RUN on the CPU (Triton interpreter): plumbing only, no figures")
        return
    p = torch.cuda.get_device_properties(0)
    import triton

    say(
        f"GPU {p.name}, {p.total_memory / 2**30:.0f} GiB, L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MB, "
        f"{p.multi_processor_count} SMs; torch {torch.__version__}, triton {triton.__version__}"
    )


def correctness():
    from kernalin_ci.verify import verify

    rows = []
    for fn in () if SMOKE else ("split_kv", "single_pass"):
        t = time.perf_counter()
        r = verify("attention.decode", f"{K}:{fn}", {}, "cuda", only="dynamic", progress=False, timeout_s=300)
        rows.append((fn, "pass" if not r.findings else f"FAIL {len(r.findings)}", r.cases_run, time.perf_counter() - t))
        for f in r.findings:
            say(f"  {fn}: [{f.bug_class}] {f.message}")
    import importlib.util

    from kernalin_ci.ops import get_op
    from kernalin_ci.ops.base import Case

    spec = importlib.util.spec_from_file_location("da", os.path.join(ROOT, K))
    da = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(da)
    op = get_op("attention.decode")
    case = Case(
        "check", {"Hq": 32, "Hkv": 8, "D": 128, "kv_lens": [4096, 777, 16384], "scale": 128**-0.5}, "bfloat16", 5
    )
    if SMOKE:
        case = Case("check", {"Hq": 4, "Hkv": 2, "D": 32, "kv_lens": [5, 17], "scale": 32**-0.5}, "float32", 5)
    kw = op.inputs(case, {}, DEVICE, poison=False)
    ref = op.reference({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}, {})
    base = da.split_kv(**kw)
    for fn in ("split_kv_slow1", "split_kv_slow2", "single_pass"):
        out = getattr(da, fn)(**kw)
        same = bool(torch.equal(out, base))
        err = float(((out.double().cpu() - ref.tensors["out"]).norm(dim=-1) / ref.tensors["out"].norm(dim=-1)).max())
        rows.append((fn, f"bit-identical to split_kv: {same}; max rel err vs float64 {err:.2e}", 1, 0.0))
    for r in rows:
        say(f"  correctness {r[0]}: {r[1]} ({r[2]} cases, {r[3]:.1f} s)")
    return rows


def collect(flush: bool):
    """100 fixed rounds of six instances on two shapes -> variants traces and a summary."""
    extra = [
        ("slow1", f"{K}:split_kv_slow1", ROOT),
        ("slow2", f"{K}:split_kv_slow2", ROOT),
        ("single", f"{K}:single_pass", ROOT),
    ]
    res = bench_pair(
        "attention.decode",
        f"{K}:split_kv",
        f"{K}:split_kv",
        ROOT,
        ROOT,
        {"shapes": SHAPES},
        DEVICE,
        budget_s=600 if SMOKE else 60,
        max_rounds=2 if SMOKE else 100,
        adaptive=False,
        l2_flush=flush,
        extra=extra,
        progress=False,
        seed=11 + flush,
    )
    if res.failed:
        say(f"  collection (flush {flush}) FAILED: {res.error}")
        return [], res
    names = ["base", "base2", "head", "slow1", "slow2", "single"]  # groups: three identical builds first
    order_cols = {"base": 0, "head": 1, "base2": 2, "slow1": 3, "slow2": 4, "single": 5}  # harness order
    rows = []
    for si, label in enumerate(res.trace.meta["shapes"]):
        t = np.stack([res.instances[n][:, si] for n in names], axis=1)  # [rounds, variants, reps]
        pos = np.argsort(res.orders[:, si, :], axis=1)  # position of each instance in its round
        order = np.stack([pos[:, order_cols[n]] for n in names], axis=1).astype(np.int8)
        b, kv = SHAPES[si]["batch"], SHAPES[si]["kv_len"]
        name = f"h200_attn_b{b}_kv{kv}_{'flush' if flush else 'noflush'}"
        meta = {
            "what": "attention.decode split_kv x3 builds, +1%, +2%, single_pass",
            "shape": label,
            "variants": names,
            "l2_flush": flush,
            "inner": res.trace.meta["inner"][si],
            "timing": res.trace.meta["timing"][si],
            "unit": "ms",
            "gpu": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(0),
        }
        np.savez_compressed(
            os.path.join(OUT, name + ".npz"),
            t=t,
            order=order,
            groups=np.array([0, 0, 0, 1, 2, 3]),
            inner=np.int64(res.trace.meta["inner"][si]),
            meta=np.array(json.dumps(meta)),
        )
        m = np.median(t, axis=2)
        aa = np.log(m[:, 1] / m[:, 0])
        ratio = lambda k: float(np.exp(np.median(np.log(m[:, k] / m[:, 0]))))  # noqa: E731
        rows.append(
            {
                "shape": label,
                "flush": flush,
                "base_ms": float(np.median(m[:, 0])),
                "within_cv": float(np.median(t.std(axis=2) / t.mean(axis=2))),
                "aa_jitter_sd": float(aa.std(ddof=1)),
                "aa_offset": float(np.exp(np.median(aa)) - 1),
                "head_vs_base": ratio(2),
                "slow1": ratio(3),
                "slow2": ratio(4),
                "single": ratio(5),
                "inner": res.trace.meta["inner"][si],
                "timing": res.trace.meta["timing"][si],
                "file": name + ".npz",
            }
        )
    say(
        f"  collection flush={flush}: {res.rounds} rounds, {res.bench_seconds:.1f} s timing, "
        f"{res.setup_seconds:.1f} s setup"
    )
    return rows, res


def bench(name, base, head, params):
    say(f"bench {name}: {head} vs {base}")
    res = bench_pair(
        "attention.decode",
        f"{K}:{base}",
        f"{K}:{head}",
        ROOT,
        ROOT,
        params,
        DEVICE,
        progress=True,
        max_rounds=2 if SMOKE else None,
        budget_s=600 if SMOKE else 30.0,
    )
    j = {k: v for k, v in res.to_json().items() if k != "posterior_hist"}
    j["shapes"] = [{k: v for k, v in s.items() if k != "posterior_hist"} for s in j["shapes"]]
    if res.trace is not None:  # the device returns 8 files at most: the verdict JSON rides in the trace's meta
        res.trace.meta["bench_result"] = j
        save_trace(res.trace, os.path.join(OUT, f"bench_{name}.npz"))
    if res.failed:
        say(f"  FAILED ({res.error_kind}): {res.error}")
    else:
        v = res.verdict
        say(
            f"  -> {v.verdict}: ratio {v.ratio:.4f} [{v.hdi[0]:.4f}, {v.hdi[1]:.4f}], P(f/e/s) "
            f"{v.p_faster:.3f}/{v.p_equivalent:.3f}/{v.p_slower:.3f}, ROPE +-{100 * v.rope_half_width:.2f}%, "
            f"{res.rounds} rounds, {res.bench_seconds:.2f} GPU s, setup {res.setup_seconds:.1f} s"
        )
        for s in res.shapes:
            say(
                f"     {s.shape}: {s.base_ms:.4f} -> {s.head_ms:.4f} ms, {s.verdict.verdict} "
                f"(inner {s.inner}, {s.timing})"
            )
    return name, res


def main():
    os.makedirs(OUT, exist_ok=True)
    if not SMOKE and not torch.cuda.is_available():
        print("no CUDA GPU visible (--smoke runs the plumbing on the CPU)", file=sys.stderr)
        return 2
    environment()
    say("1. correctness")
    correctness()
    say("2. collection, L2 flush on and off")
    coll = []
    for flush in (True, False):
        if left() < 200 and not SMOKE:
            say(f"  skipped collection flush={flush}: {left():.0f} s left")
            continue
        rows, _ = collect(flush)
        coll += rows
    say("3. the four benchmarks (adaptive, default budget and L2 flush)")
    plan = [
        ("faster", "single_pass", "split_kv", {**LONG}),
        ("slower", "split_kv", "single_pass", {**LONG}),
        ("itself", "split_kv", "split_kv", {}),  # the default decode shapes
        ("slower2pct", "split_kv", "split_kv_slow2", {**LONG}),
    ]
    benches = []
    for name, base, head, params in plan:
        if left() < 45 and not SMOKE:
            say(f"  skipped bench {name}: {left():.0f} s left")
            continue
        benches.append(bench(name, base, head, params))

    print("\n# Summary (" + ("CPU SMOKE RUN: plumbing only" if SMOKE else torch.cuda.get_device_name(0)) + ")\n")
    print("## L2 flush on/off (100 rounds, 5 reps, six instances interleaved)\n")
    print(
        "| shape | flush | inner | base ms/launch | within-round CV | A/A round jitter sd | A/A offset | "
        "head/base (A/A) | slow1 | slow2 | single_pass |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in coll:
        print(
            f"| {r['shape']} | {'on' if r['flush'] else 'off'} | {r['inner']} | {r['base_ms']:.4f} | "
            f"{100 * r['within_cv']:.2f}% | {100 * r['aa_jitter_sd']:.3f}% | {100 * r['aa_offset']:+.3f}% | "
            f"{r['head_vs_base']:.4f} | {r['slow1']:.4f} | {r['slow2']:.4f} | {r['single']:.3f} |"
        )
    print("\n## The four benchmarks\n")
    print(
        "| bench | head vs base | verdict | head/base | 95% HDI | P(faster) | P(equiv.) | P(slower) | ROPE | "
        "A/A floor | rounds | GPU s to verdict | setup s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, res in benches:
        if res.failed:
            print(
                f"| {name} | {res.head.split(':')[1]} vs {res.base.split(':')[1]} | FAILED: {res.error_kind} |"
                + " |" * 10
            )
            continue
        v = res.verdict
        print(
            f"| {name} | {res.head.split(':')[1]} vs {res.base.split(':')[1]} | {v.verdict} | {v.ratio:.4f} | "
            f"[{v.hdi[0]:.4f}, {v.hdi[1]:.4f}] | {v.p_faster:.3f} | {v.p_equivalent:.3f} | {v.p_slower:.3f} | "
            f"+-{100 * v.rope_half_width:.2f}% | {100 * (v.floor or 0):.3f}% | {res.rounds} | "
            f"{res.bench_seconds:.2f} | "
            f"{res.setup_seconds:.1f} |"
        )
    print(f"\nfiles in {OUT}: {', '.join(sorted(os.listdir(OUT)))}")
    print(f"total {time.perf_counter() - T0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
