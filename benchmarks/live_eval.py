"""Live evaluation of `kernalin-ci bench` on a GPU, judged against a kernel-only reference (issue 12).

    python3 benchmarks/live_eval.py                      # default: <= 8 minutes on one H200
    python3 benchmarks/live_eval.py --quick              # <= 2 minutes, a smoke run
    python3 benchmarks/live_eval.py --noise              # adds the noisy pass (a competing stream)
    python3 benchmarks/live_eval.py --noise-only         # the noisy pass alone (about 4 minutes)
    python3 benchmarks/live_eval.py --device cpu --quick # the code path under the Triton interpreter (no figures)

Ops: kv_append and rope at tokens 1, 64, 256; attention.decode and attention.decode_paged at their
default bench shapes. Kernels: benchmarks/kernels/{kv_append,rope,decode_attention,paged_attention}.py.

Per op and regime, `--calls` benchmarks (each a fresh worker process, its own seed, `bench_pair` exactly
as `kernalin-ci bench` runs it, `--rounds` fixed rounds) time together:
- identical copies of the base kernel, each written to its own module file in a temporary directory
  (separately imported and compiled): base, head, the bench's own A/A copy (base2), and
  `--aa-triples` - 1 more triples of copies;
- known-effect variants: the same file with one launch-config line rewritten (num_warps, tile sizes,
  split counts).
A/A trials: every triple (head vs base, floor from base2) in windows of 5 and 10 rounds and over all
rounds, plus the adaptive verdict a user would get (the looks and stopping rule of the harness);
overall and per shape, all from `stats.compare_run`, the function the bench uses.
Known-effect pairs: each variant against base (floor from base2) over all rounds; the reference is the
CUDA profiler's kernel-only device time (torch.profiler, never triton.testing.do_bench, whose interval
holds the host launch overhead), base and variant alternated on shared inputs, in the same regime
(warm: back-to-back launches; cold: the L2 flushed before every launch), geometric mean over shapes.
`--noise`: the same benchmarks again while a thread of this process keeps a second CUDA stream busy
with a memory-bound copy (another process's context: the GPU time-slices between them).

Prints the tables of docs/statistics.md ("Live evaluation") and writes every figure to `--out`.
Stops cleanly at `--budget-s`: what was measured is evaluated, what was skipped is listed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
T0 = time.perf_counter()

# op -> (kernel file, entry function, shape params, [(variant name, constant, value)])
OPS = {
    "kv_append": (
        "benchmarks/kernels/kv_append.py",
        "append",
        {"tokens": [1, 64, 256]},
        [("num_warps=1", "NUM_WARPS", 1), ("num_warps=8", "NUM_WARPS", 8)],
    ),
    "rope": (
        "benchmarks/kernels/rope.py",
        "rope",
        {"tokens": [1, 64, 256]},
        [("num_warps=1", "NUM_WARPS", 1), ("num_warps=8", "NUM_WARPS", 8)],
    ),
    "attention.decode": (
        "benchmarks/kernels/decode_attention.py",
        "split_kv",
        {},
        [("SPLITS=8", "SPLITS", 8), ("BLOCK_N=32", "BLOCK_N", 32), ("num_warps=8", "NUM_WARPS", 8)],
    ),
    "attention.decode_paged": (
        "benchmarks/kernels/paged_attention.py",
        "decode_paged",
        {},
        [("num_warps=2", "NUM_WARPS", 2), ("num_warps=8", "NUM_WARPS", 8)],
    ),
}
CPU_SHAPES = {
    "kv_append": {"tokens": [1, 4]},
    "rope": {"tokens": [1, 4]},  # the interpreter is slow
    "attention.decode": {"batch": 1, "kv_len": 8},
    "attention.decode_paged": {"batch": 1, "kv_len": 8},
}
WINDOWS = (5, 10)
EFFECT_MIN = 0.02  # the goal: every reference effect of 2% or more gets its direction


def say(*a) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s]", *a, flush=True)


# ------------------------------------------------------------------ kernels: copies and variants


def write_copy(src: str, dest_dir: str, constant: str | None = None, value=None) -> str:
    """The kernel file copied into its own directory (one module per copy), one constant rewritten."""
    os.makedirs(dest_dir)
    text = open(os.path.join(ROOT, src)).read()
    if constant is not None:
        text, n = re.subn(rf"^{constant} = .*$", f"{constant} = {value!r}", text, count=1, flags=re.M)
        if n != 1:
            raise SystemExit(f"live_eval: {src} has no line '{constant} = ...'")
    path = os.path.join(dest_dir, "k.py")
    with open(path, "w") as f:
        f.write(text)
    return path


# ------------------------------------------------------------------ the kernel-only reference


def reference(
    op_name: str, entries: list[tuple[str, str]], params: dict, device: str, regime: str, iters: int
) -> list[list[float]]:
    """Per entry and shape: the median kernel-only device time (us) of one launch; CPU: wall clock (ms)."""
    import torch

    from kernalin_ci.bench.shapes import bench_cases, split_params
    from kernalin_ci.bench.timing import L2_FLUSH_BYTES
    from kernalin_ci.entry import load_entry
    from kernalin_ci.ops import get_op
    from kernalin_ci.ops.base import resolve_params

    op = get_op(op_name)
    op_params, bench = split_params(dict(params))
    resolved = resolve_params(op_name, op.params, op_params)
    os.environ["KERNALIN_PARAMS"] = json.dumps(resolved)
    fns = [load_entry(e, r) for e, r in entries]
    out = [[] for _ in fns]
    for case in bench_cases(op_name, resolved, device, bench):
        kw = op.inputs(case, resolved, device, poison=False)
        for fn in fns:
            for _ in range(3):
                fn(**kw)
        if device != "cuda":
            for i, fn in enumerate(fns):
                ts = []
                for _ in range(max(3, iters // 10)):
                    t = time.perf_counter()
                    fn(**kw)
                    ts.append((time.perf_counter() - t) * 1e3)
                out[i].append(float(np.median(ts)))
            continue
        torch.cuda.synchronize()
        flush = torch.empty(L2_FLUSH_BYTES if regime == "cold" else 16, dtype=torch.int8, device="cuda")
        marker_names = _marker_names(flush)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                for fn in fns:  # alternated: drift hits every entry alike
                    flush.bitwise_not_()  # cold: evicts the L2; warm: a tiny marker between launches
                    fn(**kw)
            torch.cuda.synchronize()
        segs = _segments(prof, marker_names)
        k = len(segs) // len(fns)  # the loop ends with the last entry: align the launches from the end
        if k < iters // 2:
            raise RuntimeError(f"profiler: {len(segs)} launches found, expected {iters * len(fns)}")
        segs = segs[len(segs) - k * len(fns) :]
        for i in range(len(fns)):
            out[i].append(float(np.median(segs[i :: len(fns)][2:])))
        del kw
    return out


def _device_events(prof):
    from torch.autograd import DeviceType

    evs = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    return sorted(evs, key=lambda e: e.time_range.start)


def _marker_names(buf) -> set:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        buf.bitwise_not_()
        torch.cuda.synchronize()
    return {e.name for e in _device_events(prof)}


def _segments(prof, marker_names: set) -> list[float]:
    """Device time (us) of the kernels between consecutive markers: one launch of one entry each."""
    segs: list[float] = []
    for e in _device_events(prof):
        if e.name in marker_names:
            segs.append(0.0)
        elif segs:
            segs[-1] += e.time_range.elapsed_us()
    return segs


# ------------------------------------------------------------------ the noisy neighbour


class Noise:
    """A thread keeping a second CUDA stream busy with a memory-bound copy (bursts of about 0.1-1 ms)."""

    def __init__(self, device: str):
        self.device, self.stop, self.thread = device, threading.Event(), None

    def __enter__(self):
        if self.device == "cuda":
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()
        return self

    def _run(self):
        import torch

        src = torch.empty(512 << 20, dtype=torch.int8, device="cuda")
        dst = torch.empty_like(src)
        s = torch.cuda.Stream()
        rng = np.random.default_rng(1)
        while not self.stop.is_set():
            with torch.cuda.stream(s):
                n = int(rng.integers(64, 512)) << 20
                dst[:n].copy_(src[:n])
            s.synchronize()
            time.sleep(float(rng.uniform(0, 0.002)))

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


# ------------------------------------------------------------------ one benchmark call


def bench_call(op_name: str, tmp: str, call: int, regime: str, args, device: str, noisy: bool, budget_s: float) -> dict:
    from kernalin_ci.bench.pair import bench_pair

    src, fn, shape_params, variants = OPS[op_name]
    if device == "cpu":
        shape_params = CPU_SHAPES.get(op_name, shape_params)
        variants = variants[:1]
    d = os.path.join(tmp, f"{op_name}-{regime}-{call}-{'noisy' if noisy else 'quiet'}")
    copies = {}
    for name in ["base", "head"] + [f"aa{i}" for i in range(3 * (args.aa_triples - 1))]:
        copies[name] = write_copy(src, os.path.join(d, name))
    extra = [(n, f"{p}:{fn}", os.path.dirname(p)) for n, p in copies.items() if n.startswith("aa")]
    for vname, const, value in variants:
        p = write_copy(src, os.path.join(d, "v-" + re.sub(r"\W", "_", vname)), const, value)
        extra.append((vname, f"{p}:{fn}", os.path.dirname(p)))
    ctx = Noise(device) if noisy else None
    if ctx:
        ctx.__enter__()
    try:
        res = bench_pair(
            op_name,
            f"{copies['base']}:{fn}",
            f"{copies['head']}:{fn}",
            os.path.dirname(copies["base"]),
            os.path.dirname(copies["head"]),
            shape_params,
            device,
            budget_s=budget_s,
            reps=args.reps,
            max_rounds=args.rounds,
            adaptive=False,
            seed=call,
            regime=regime,
            extra=extra,
            timeout_s=300.0,
        )
    finally:
        if ctx:
            ctx.__exit__(None, None, None)
    if res.failed:
        raise SystemExit(f"live_eval: {op_name} {regime} call {call}: {res.error_kind}: {res.error}")
    return {
        "instances": {k: v.tolist() for k, v in res.instances.items()},
        "shapes": [s["shape"] for s in res.shapes],
        "inner": [s["inner"] for s in res.shapes],
        "copies": [s["copies"] for s in res.shapes],
        "timing": [s["timing"] for s in res.shapes],
        "same_output_addresses": res.trace.meta.get("same_output_addresses"),
        "seconds": res.seconds,
        "bench_seconds": res.bench_seconds,
        "setup_seconds": res.setup_seconds,
        "variants": [v[0] for v in variants],
        "entries": {"base": f"{copies['base']}:{fn}"} | {n: e for n, e, _ in extra},
    }


# ------------------------------------------------------------------ evaluation


def triples(call: dict) -> list[tuple[str, str, str]]:
    names = ["base", "head", "base2"] + sorted(
        (n for n in call["instances"] if n.startswith("aa")), key=lambda n: int(n[2:])
    )
    return [(names[i], names[i + 1], names[i + 2]) for i in range(0, len(names) - 2, 3)]


def adaptive_verdict(b, h, b2):
    """The verdict a live run stops with: the first look that stops, else the last round's."""
    from kernalin_ci.bench import stats

    n_max = b.shape[0]
    for n in stats.looks(n_max):
        v, per = stats.compare_run(b[:n], h[:n], b2[:n])
        if stats.should_stop(v.verdict, v.rope_source):
            return v, per
    return stats.compare_run(b, h, b2)


def aa_trials(call: dict) -> list[dict]:
    from kernalin_ci.bench import stats

    arr = {k: np.asarray(v) for k, v in call["instances"].items()}
    R = arr["base"].shape[0]
    out = []
    for bn, hn, fn in triples(call):
        b, h, f = arr[bn], arr[hn], arr[fn]
        budgets = [(n, s, n) for n in WINDOWS if n < R for s in range(0, R - n + 1, n)] + [("all", 0, R)]
        for label, s, n in budgets:
            v, per = stats.compare_run(b[s : s + n], h[s : s + n], f[s : s + n])
            out.append(
                {
                    "budget": label,
                    "rounds": n,
                    "start": s,
                    "triple": [bn, hn, fn],
                    "verdict": v.verdict,
                    "ratio": v.ratio,
                    "floor": v.floor,
                    "shapes": [p.verdict for p in per],
                    "shape_ratios": [p.ratio for p in per],
                }
            )
        v, per = adaptive_verdict(b, h, f)
        out.append(
            {
                "budget": "adaptive",
                "start": 0,
                "triple": [bn, hn, fn],
                "verdict": v.verdict,
                "ratio": v.ratio,
                "rounds": v.rounds,
                "floor": v.floor,
                "shapes": [p.verdict for p in per],
                "shape_ratios": [p.ratio for p in per],
            }
        )
    return out


def effect_trials(call: dict, ref: dict) -> list[dict]:
    from kernalin_ci.bench import stats

    arr = {k: np.asarray(v) for k, v in call["instances"].items()}
    R = arr["base"].shape[0]
    out = []
    for vname in call["variants"]:
        r_shapes = ref["ratios"][vname]
        r = float(np.exp(np.mean(np.log(r_shapes))))
        for label, n in [(n, n) for n in WINDOWS if n < R] + [("all", R)]:
            v, per = stats.compare_run(arr["base"][:n], arr[vname][:n], arr["base2"][:n])
            lo, hi = v.hdi[0] - v.floor, v.hdi[1] + v.floor
            want = "faster" if r <= 1 - EFFECT_MIN else "slower" if r >= 1 + EFFECT_MIN else None
            out.append(
                {
                    "variant": vname,
                    "budget": label,
                    "rounds": n,
                    "reference": r,
                    "reference_shapes": r_shapes,
                    "verdict": v.verdict,
                    "ratio": v.ratio,
                    "hdi": list(v.hdi),
                    "floor": v.floor,
                    "inside": bool(lo <= r <= hi),
                    "expected": want,
                    "shapes": [p.verdict for p in per],
                    "shape_ratios": [p.ratio for p in per],
                    "shape_hdis": [list(p.hdi) for p in per],
                }
            )
    return out


def false_count(trials: list[dict], budget) -> tuple[int, int, int, int]:
    """-> (overall false, trials, per-shape false, shape verdicts) at one budget."""
    ts = [t for t in trials if t["budget"] == budget]
    over = sum(t["verdict"] in ("faster", "slower") for t in ts)
    shp = sum(v in ("faster", "slower") for t in ts for v in t["shapes"])
    return over, len(ts), shp, sum(len(t["shapes"]) for t in ts)


# ------------------------------------------------------------------ printing


def print_tables(results: dict) -> None:
    print("\n## A/A false verdicts (faster/slower on identical copies): overall and per shape")
    print(
        "| pass | regime | op | trials (calls x triples) | n=5 overall | n=5 per shape | n=10 overall | "
        "n=10 per shape | all rounds overall | all rounds per shape | adaptive overall | adaptive per shape | "
        "median floor | A/A ratio range | false by shape (every budget) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results["runs"].values():
        tr = r["aa"]
        if not tr:
            continue
        cells = []
        for b in (5, 10, "all", "adaptive"):
            o, n, s, ns = false_count(tr, b)
            cells += [f"{o}/{n}" if n else "-", f"{s}/{ns}" if ns else "-"]
        full = [t for t in tr if t["budget"] == "all"]
        floors = [t["floor"] for t in full]
        ratios = [x for t in full for x in t["shape_ratios"]]
        by_shape = ", ".join(
            f"{sum(t['shapes'][i] in ('faster', 'slower') for t in tr)}/{len(tr)}" for i in range(len(tr[0]["shapes"]))
        )
        print(
            f"| {r['pass']} | {r['regime']} | {r['op']} | {len(r['calls'])} x {len(full) // max(1, len(r['calls']))}"
            f" | {' | '.join(cells)} | {100 * np.median(floors):.2f}% | "
            f"{min(ratios):.4f}..{max(ratios):.4f} | {by_shape} |"
        )
    print("\n## Known-effect pairs (all rounds): reference = torch.profiler kernel-only device time")
    print(
        "| pass | regime | op | variant | call | reference | verdict | head/base | 95% HDI | floor | "
        "reference in HDI +- floor | direction right (reference off by >= 2%) | per shape: ref -> verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results["runs"].values():
        for c, eff in enumerate(r["effects"]):
            for e in eff:
                if e["budget"] != "all":
                    continue
                right = "-" if e["expected"] is None else ("yes" if e["verdict"] == e["expected"] else "**no**")
                shapes = ", ".join(f"{x:.3f}->{v}" for x, v in zip(e["reference_shapes"], e["shapes"]))
                print(
                    f"| {r['pass']} | {r['regime']} | {r['op']} | {e['variant']} | {c} | {e['reference']:.4f} | "
                    f"{e['verdict']} | {e['ratio']:.4f} | [{e['hdi'][0]:.4f}, {e['hdi'][1]:.4f}] | "
                    f"{100 * e['floor']:.2f}% | {'yes' if e['inside'] else '**no**'} | {right} | {shapes} |"
                )
    print("\n## Power and false alarms by budget (effects whose reference is off by >= 2%; A/A trials)")
    print(
        "| pass | regime | power n=5 | power n=10 | power all rounds | FA n=5 | FA n=10 | FA all rounds | FA adaptive |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for pas in ("quiet", "noisy"):
        for regime in results["regimes"]:
            rs = [r for r in results["runs"].values() if r["pass"] == pas and r["regime"] == regime]
            if not rs:
                continue
            effs = [e for r in rs for eff in r["effects"] for e in eff if e["expected"]]
            pw = []
            for b in (5, 10, "all"):
                sel = [e for e in effs if e["budget"] == b]
                pw.append(f"{sum(e['verdict'] == e['expected'] for e in sel)}/{len(sel)}" if sel else "-")
            fa = []
            for b in (5, 10, "all", "adaptive"):
                o = n = 0
                for r in rs:
                    oo, nn, _, _ = false_count(r["aa"], b)
                    o, n = o + oo, n + nn
                fa.append(f"{o}/{n}" if n else "-")
            print(f"| {pas} | {regime} | {' | '.join(pw)} | {' | '.join(fa)} |")
    print("\n## Regime summary (quiet pass; the default regime is chosen from this and the table below)")
    print(
        "| regime | A/A false verdicts, overall (every budget) | A/A false, per shape | reference in HDI +- floor | "
        "direction right (reference off by >= 2%) | median A/A floor |"
    )
    print("|---|---|---|---|---|---|")
    for regime in results["regimes"]:
        rs = [r for r in results["runs"].values() if r["pass"] == "quiet" and r["regime"] == regime]
        aa = [t for r in rs for t in r["aa"]]
        effs = [e for r in rs for eff in r["effects"] for e in eff if e["budget"] == "all"]
        if not aa:
            continue
        fo = sum(t["verdict"] in ("faster", "slower") for t in aa)
        fs = sum(v in ("faster", "slower") for t in aa for v in t["shapes"])
        ns = sum(len(t["shapes"]) for t in aa)
        want = [e for e in effs if e["expected"]]
        print(
            f"| {regime} | {fo}/{len(aa)} | {fs}/{ns} | {sum(e['inside'] for e in effs)}/{len(effs)} | "
            f"{sum(e['verdict'] == e['expected'] for e in want)}/{len(want)} | "
            f"{100 * np.median([t['floor'] for t in aa]):.2f}% |"
        )
    unit = next((r["reference"]["unit"] for r in results["runs"].values() if r.get("reference")), "us")
    print(f"\n## Regimes: per-launch time of the base (bench median, ms) and the reference ({unit})")
    print(
        "| op | shape | warm bench | cold bench | cold/warm | warm ref | cold ref | copies (cold) | "
        "same output addresses |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    by = {}
    for r in results["runs"].values():
        if r["pass"] == "quiet" and r["calls"]:
            by[(r["op"], r["regime"])] = r
    for op in results["ops"]:
        w, c = by.get((op, "warm")), by.get((op, "cold"))
        some = w or c
        if not some:
            continue
        for i, shape in enumerate(some["calls"][0]["shapes"]):

            def med(r, i=i):
                return float(np.median(np.asarray(r["calls"][0]["instances"]["base"])[:, i])) if r else float("nan")

            def refv(r, i=i):
                return r["reference"]["base"][i] if r and r.get("reference") else float("nan")

            same = {str(cl.get("same_output_addresses")) for rr in (w, c) if rr for cl in rr["calls"]}
            print(
                f"| {op} | {shape} | {med(w):.5f} | {med(c):.5f} | {med(c) / med(w):.3f} | {refv(w):.2f} | "
                f"{refv(c):.2f} | {c['calls'][0]['copies'][i] if c else '-'} | {', '.join(sorted(same))} |"
            )


# ------------------------------------------------------------------ main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 call per op and regime, 8 rounds (<= 2 min)")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated ops (default: all four)")
    ap.add_argument("--regimes", default="warm,cold", help="comma-separated: warm, cold")
    ap.add_argument("--calls", type=int, default=3, help="benchmark calls per op and regime (fresh processes)")
    ap.add_argument("--rounds", type=int, default=12, help="rounds per call (fixed, not adaptive)")
    ap.add_argument("--aa-triples", type=int, default=2, help="A/A triples (base, head, floor) per call")
    ap.add_argument("--reps", type=int, default=None, help="samples per instance and round (bench default)")
    ap.add_argument("--ref-iters", type=int, default=60, help="profiled launches per entry and shape")
    ap.add_argument("--noise", action="store_true", help="also a noisy pass (a competing CUDA stream)")
    ap.add_argument("--noise-calls", type=int, default=2, help="calls per op and regime in the noisy pass")
    ap.add_argument("--noise-only", action="store_true", help="only the noisy pass (a second run of the script)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no new call after this (seconds)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "live_eval.json"))
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    if args.quick:
        args.calls, args.rounds, args.aa_triples, args.noise_calls, args.ref_iters = 1, 8, 1, 1, 20
        args.budget_s = min(args.budget_s, 110.0)
    if args.device == "cpu":
        args.rounds, args.reps, args.ref_iters = min(args.rounds, 5), args.reps or 2, 10
    ops = [o for o in args.ops.split(",") if o]
    regimes = [r for r in args.regimes.split(",") if r]
    bad = [o for o in ops if o not in OPS] + [r for r in regimes if r not in ("warm", "cold")]
    if bad or args.calls < 1 or args.rounds < 5 or args.aa_triples < 1:
        print(
            f"live_eval: bad arguments {bad or ''} (ops: {', '.join(OPS)}; regimes: warm, cold; calls >= 1, "
            f"rounds >= 5, aa-triples >= 1)",
            file=sys.stderr,
        )
        return 2
    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print(
                "live_eval: --device cuda needs a CUDA GPU (use --device cpu --quick for the code path)",
                file=sys.stderr,
            )
            return 2
        p = torch.cuda.get_device_properties(0)
        import triton

        say(
            f"GPU {p.name}, L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB, torch {torch.__version__}, "
            f"triton {triton.__version__}"
        )
    else:
        say("CPU (Triton interpreter): the code path only; the figures mean nothing")
    results = {"device": args.device, "args": vars(args), "ops": ops, "regimes": regimes, "runs": {}, "skipped": []}
    passes = ([] if args.noise_only else [("quiet", args.calls)]) + (
        [("noisy", args.noise_calls)] if args.noise or args.noise_only else []
    )
    plan = [(pas, regime, op, c) for pas, n in passes for regime in regimes for op in ops for c in range(n)]
    per_call = []
    refs: dict = {}
    with tempfile.TemporaryDirectory(prefix="kernalin-live-") as tmp:
        for pas, regime, op, c in plan:
            key = f"{pas}/{regime}/{op}"
            r = results["runs"].setdefault(
                key, {"pass": pas, "regime": regime, "op": op, "calls": [], "aa": [], "effects": [], "reference": None}
            )
            guess = float(np.median(per_call)) if per_call else 0.0
            if time.perf_counter() - T0 + guess > args.budget_s:
                results["skipped"].append(f"{key} call {c}")
                continue
            t = time.perf_counter()
            if (op, regime) not in refs:
                refs[(op, regime)] = measure_reference(op, regime, args, tmp)
            r["reference"] = refs[(op, regime)]
            left = args.budget_s - (time.perf_counter() - T0)  # the timing rounds stop there at the latest
            call = bench_call(op, tmp, c, regime, args, args.device, pas == "noisy", max(1.0, left))
            per_call.append(time.perf_counter() - t)
            r["calls"].append(call)
            r["aa"] += aa_trials(call)
            r["effects"].append(effect_trials(call, r["reference"]))
            o, n, s, ns = false_count(r["aa"], "adaptive")
            say(
                f"{key} call {c + 1}: {call['bench_seconds']:.1f} s timing, {call['setup_seconds']:.1f} s setup; "
                f"A/A adaptive false so far {o}/{n} overall, {s}/{ns} per shape"
            )
        results["runs"] = {k: v for k, v in results["runs"].items() if v["calls"]}
        print_tables(results)
    if results["skipped"]:
        say(f"budget reached: skipped {len(results['skipped'])} calls: {', '.join(results['skipped'])}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f)
    say(f"wrote {args.out}")
    return 0


def measure_reference(op: str, regime: str, args, tmp: str) -> dict:
    src, fn, shape_params, variants = OPS[op]
    if args.device == "cpu":
        shape_params = CPU_SHAPES.get(op, shape_params)
        variants = variants[:1]
    d = os.path.join(tmp, f"ref-{op}-{regime}")
    entries = [(f"{write_copy(src, os.path.join(d, 'base'))}:{fn}", os.path.join(d, "base"))]
    for vname, const, value in variants:
        vd = os.path.join(d, "v-" + re.sub(r"\W", "_", vname))
        entries.append((f"{write_copy(src, vd, const, value)}:{fn}", vd))
    t = reference(op, entries, shape_params, args.device, regime, args.ref_iters)
    ratios = {v[0]: [h / b for h, b in zip(t[i + 1], t[0])] for i, v in enumerate(variants)}
    say(
        f"reference {op} {regime}: base {', '.join(f'{x:.2f}' for x in t[0])} "
        f"{'us (kernel-only)' if args.device == 'cuda' else 'ms (CPU wall clock)'}; "
        + "; ".join(f"{k} {float(np.exp(np.mean(np.log(v)))):.4f}" for k, v in ratios.items())
    )
    shutil.rmtree(d, ignore_errors=True)
    return {"base": t[0], "times": t, "ratios": ratios, "unit": "us" if args.device == "cuda" else "ms"}


if __name__ == "__main__":
    sys.exit(main())
