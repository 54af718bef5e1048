"""Live evaluation of `kernalin-ci bench` on a GPU, judged against a kernel-only reference (issue 12).

    python3 benchmarks/live_eval.py --out $OUT/live.json   # quiet (cold + warm), noisy (cold): <= 8 min, one H200
    python3 benchmarks/live_eval.py --quick                # a sanity run, <= 60 s
    python3 benchmarks/live_eval.py --noise-only           # the noisy pass alone
    python3 benchmarks/live_eval.py --device cpu --quick   # the code path under the Triton interpreter
    python3 benchmarks/live_eval.py --rejudge benchmarks/data/live_shape_h200.json.gz  # a recorded run, no GPU

Ops: kv_append and rope at tokens 1, 64, 256; attention.decode and attention.decode_paged at their default
bench shapes. Kernels: benchmarks/kernels/{kv_append,rope,decode_attention,paged_attention}.py.

One call per pass (quiet; noisy: a thread keeps a second CUDA stream busy with a memory-bound copy),
regime and op: one `bench_pair` exactly as `kernalin-ci bench` runs it (a fresh worker process, fixed
rounds), timing together `--triples` disjoint A/A triples of separately loaded copies of the base kernel
(each its own module file: base, head, base2, then 3 more per triple) and the known-effect variants
(the same file with one launch-config line rewritten: num_warps, tile sizes, split counts). After the
rounds, the worker profiles `--ref-replays` more replays of every instance's `inner` launches, launched
eagerly on the same buffers and ring (kernalin_ci/bench/kernel_time.py): the kernel-only reference of
the same kernels, buffers and regime. A reference whose profile fails the plausibility check (kernel
time above the span, kernel counts that differ) is recorded as invalid and shown as such, never as a ratio.

An A/A "live run": per triple, the rounds are cut into consecutive runs, each judged at the harness's
looks and stopped by its rule (at most RUN_CAP rounds), the next starting on the following round, so no
round counts twice; 3 triples x 50 rounds give about 30 runs per op and regime when runs settle at 5
rounds. Runs of one call share the process, its compiled kernels and the GPU's state of the moment; they
are not independent processes. Also judged: disjoint fixed windows of 5 and 10 rounds. All verdicts come
from `stats.compare_run`, the function the bench uses, overall and per shape.

Prints the tables of docs/statistics.md ("Live evaluation"; read "## Goals") and writes every figure to
`--out`. Each call's timing budget is its share of `--budget-s`; a call that no longer fits is skipped
and listed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
RUN_CAP = 20  # an A/A live run stops where the harness would, after at most this many rounds
# per pass and op: (A/A triples, rounds, variants: 0 = all). About 30 A/A live runs per op and regime in the
# quiet pass (runs settle at 5 rounds); the attention ops take fewer instances and more rounds (an instance's
# setup costs more than its rounds). "noisy": a competing stream, in the default regime (cold) unless --regimes
# says otherwise (its warm calls were recorded on 2026-12-04).
PASSES = ("quiet", "noisy")
PASS_REGIMES = {"quiet": ("cold", "warm"), "noisy": ("cold",)}  # the default regime first
PLAN = {
    "quiet": {
        "kv_append": (3, 50, 0),
        "rope": (3, 50, 0),
        "attention.decode": (2, 75, 0),
        "attention.decode_paged": (2, 75, 0),
    },
    "noisy": {op: (2, 30, 0) for op in ("kv_append", "rope", "attention.decode", "attention.decode_paged")},
}
# seconds of a call outside its timing rounds: worker start, setup (compiling every copy, CUDA graphs), the
# reference (the 2026-12-04 H200 run: 13.7-14.0 s kv_append, 15.2-19.3 rope, 24.8-26.0 attention.decode,
# 19.8-25.3 attention.decode_paged, with the in-graph reference; the eager reference adds its host launches,
# estimated at 3-4 s for the micro-kernels' hundreds of launches per replay); a call's timing budget is its
# share of what is left after these
OVERHEAD_S = {"kv_append": 19.0, "rope": 21.0, "attention.decode": 27.0, "attention.decode_paged": 24.0}


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


# ------------------------------------------------------------------ one benchmark call (one worker process)


def bench_call(op_name: str, tmp: str, key: str, cfg: dict, args, noisy: bool, budget_s: float, seed: int) -> dict:
    """One `bench_pair` (a fresh worker process) timing together: base, head, base2 and 3 x (triples - 1) more
    separately loaded copies of the base kernel, and the launch-config variants; then `--ref-replays`
    profiled eager replays of every instance's `inner` launches (the kernel-only reference)."""
    from kernalin_ci.bench.pair import bench_pair

    src, fn, shape_params, variants = OPS[op_name]
    if args.device == "cpu":
        shape_params = CPU_SHAPES.get(op_name, shape_params)
    variants = variants[: cfg["variants"]] if cfg.get("variants") else variants
    triples, rounds = cfg["triples"], cfg["rounds"]
    d = os.path.join(tmp, key.replace("/", "-"))
    copies = {}
    for name in ["base", "head"] + [f"aa{i}" for i in range(3 * (triples - 1))]:
        copies[name] = write_copy(src, os.path.join(d, name))
    extra = [(n, f"{p}:{fn}", os.path.dirname(p)) for n, p in copies.items() if n.startswith("aa")]
    for vname, const, value in variants:
        p = write_copy(src, os.path.join(d, "v-" + re.sub(r"\W", "_", vname)), const, value)
        extra.append((vname, f"{p}:{fn}", os.path.dirname(p)))
    ctx = Noise(args.device) if noisy else None
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
            args.device,
            budget_s=budget_s,
            reps=args.reps,
            max_rounds=rounds,
            adaptive=False,
            seed=seed,
            regime=key.split("/")[1],
            extra=extra,
            timeout_s=420.0,
            reference=args.ref_replays,
        )
    finally:
        if ctx:
            ctx.__exit__(None, None, None)
    if res.failed:
        return {"error": f"{res.error_kind}: {res.error}"}
    return {
        "clock": res.clock,
        "instances": {k: v.tolist() for k, v in res.instances.items()},
        "reference": res.reference,
        "notes": res.notes,
        "shapes": [s.shape for s in res.shapes],
        "inner": [s.inner for s in res.shapes],
        "copies": [s.copies for s in res.shapes],
        "timing": [s.timing for s in res.shapes],
        "same_output_addresses": res.trace.meta.get("same_output_addresses"),
        "seconds": res.seconds,
        "bench_seconds": res.bench_seconds,
        "setup_seconds": res.setup_seconds,
        "rounds": res.rounds,
        "seed": seed,
        "variants": [v[0] for v in variants],
    }


# ------------------------------------------------------------------ evaluation (pure: numpy and stats only)


def triples(call: dict) -> list[tuple[str, str, str]]:
    """Disjoint A/A triples (base, head, floor copy) of separately loaded copies."""
    names = ["base", "head", "base2"] + sorted(
        (n for n in call["instances"] if n.startswith("aa")), key=lambda n: int(n[2:])
    )
    return [(names[i], names[i + 1], names[i + 2]) for i in range(0, len(names) - 2, 3)]


def live_run(b, h, f, cap: int):
    """What a live run with a budget of `cap` rounds says: the harness's looks and stopping rule on the
    first rounds of b, h, f -> (overall verdict, per-shape verdicts), or None when fewer than 5 rounds."""
    from kernalin_ci.bench import stats

    n_max = min(cap, b.shape[0])
    if n_max < stats.MIN_ROUNDS:
        return None
    for n in stats.looks(n_max):
        v, per = stats.compare_run(b[:n], h[:n], f[:n])
        if stats.should_stop(v.verdict, v.rope_source):
            return v, per
    return stats.compare_run(b[:n_max], h[:n_max], f[:n_max])


def _rec(kind, triple, start, v, per) -> dict:
    return {
        "budget": kind,
        "triple": list(triple),
        "start": start,
        "rounds": v.rounds,
        "verdict": v.verdict,
        "ratio": v.ratio,
        "floor": v.floor,
        "shapes": [p.verdict for p in per],
        "shape_ratios": [p.ratio for p in per],
    }


def aa_trials(call: dict, cap: int = RUN_CAP) -> list[dict]:
    """A/A trials of one call. "run": per triple, the rounds are cut into consecutive live runs (each stops
    where the harness would, at most `cap` rounds; the next starts on the following round), so no round
    counts twice. 5 and 10: disjoint fixed windows. "all": every round."""
    from kernalin_ci.bench import stats

    arr = {k: np.asarray(v, dtype=np.float64) for k, v in call["instances"].items()}
    R = arr["base"].shape[0]
    out = []
    for tri in triples(call):
        b, h, f = (arr[n] for n in tri)
        s = 0
        while True:
            got = live_run(b[s:], h[s:], f[s:], cap)
            if got is None:
                break
            out.append(_rec("run", tri, s, *got))
            s += got[0].rounds
        for n in WINDOWS:
            for s in range(0, R - n + 1, n):
                out.append(_rec(n, tri, s, *stats.compare_run(b[s : s + n], h[s : s + n], f[s : s + n])))
        out.append(_rec("all", tri, 0, *stats.compare_run(b, h, f)))
    return out


def ref_ratios(call: dict, name: str, what: str = "kernel_ms") -> tuple[list[float] | None, str | None]:
    """Per shape: median reference time of `name` / that of the base -> (ratios, None); (None, None) when no
    reference was recorded; (None, why) when the reference of `name` or the base is invalid on a shape."""
    refs = call.get("reference") or []
    if len(refs) != len(call["shapes"]):
        return None, None
    out = []
    for shape, r in zip(call["shapes"], refs):
        bad = {n: w for n, w in (r.get("invalid") or {}).items() if n in (name, "base")}
        if bad:
            return None, "; ".join(f"{shape} {n}: {w}" for n, w in bad.items())
        a, b = r[what].get(name) or [], r[what].get("base") or []
        if not a or not b or np.median(b) <= 0:
            return None, None
        out.append(float(np.median(a) / np.median(b)))
    return out, None


def gmean(xs) -> float:
    return float(np.exp(np.mean(np.log(xs))))


def effect_trials(call: dict) -> list[dict]:
    """Each variant against the base (floor from base2): disjoint windows of 5 and 10 rounds and all rounds,
    judged against the kernel-only reference of the same call (geometric mean over shapes)."""
    from kernalin_ci.bench import stats

    arr = {k: np.asarray(v, dtype=np.float64) for k, v in call["instances"].items()}
    R = arr["base"].shape[0]
    out = []
    for vname in call["variants"]:
        rs, invalid = ref_ratios(call, vname)
        spans, _ = ref_ratios(call, vname, "span_ms")
        r = gmean(rs) if rs else None
        want = None if r is None else "faster" if r <= 1 - EFFECT_MIN else "slower" if r >= 1 + EFFECT_MIN else None
        budgets = [(n, s) for n in WINDOWS for s in range(0, R - n + 1, n)] + [("all", 0)]
        for label, s in budgets:
            n = R if label == "all" else label
            v, per = stats.compare_run(arr["base"][s : s + n], arr[vname][s : s + n], arr["base2"][s : s + n])
            lo, hi = v.hdi[0] - v.floor, v.hdi[1] + v.floor
            out.append(
                {
                    "variant": vname,
                    "budget": label,
                    "start": s,
                    "rounds": v.rounds,
                    "reference": r,
                    "reference_invalid": invalid,
                    "reference_shapes": rs,
                    "reference_span": gmean(spans) if spans else None,
                    "verdict": v.verdict,
                    "ratio": v.ratio,
                    "hdi": list(v.hdi),
                    "floor": v.floor,
                    "inside": None if r is None else bool(lo <= r <= hi),
                    "inside_span": None if not spans else bool(lo <= gmean(spans) <= hi),
                    "expected": want,
                    "shapes": [p.verdict for p in per],
                    "shape_ratios": [p.ratio for p in per],
                    "shape_hdis": [list(p.hdi) for p in per],
                }
            )
    return out


FALSE = ("faster", "slower")


def count_false(trials: list[dict], budget) -> dict:
    ts = [t for t in trials if t["budget"] == budget]
    return {
        "trials": len(ts),
        "false": sum(t["verdict"] in FALSE for t in ts),
        "shape_verdicts": sum(len(t["shapes"]) for t in ts),
        "false_shapes": sum(v in FALSE for t in ts for v in t["shapes"]),
    }


def goal_rows(results: dict) -> list[dict]:
    """One row per (pass, regime, op) and a total per (pass, regime): the figures the issue's goals name."""
    rows = []
    groups: dict[tuple, list] = {}
    for r in results["runs"].values():
        groups.setdefault((r["pass"], r["regime"]), []).append((r["op"], r))
    for (pas, regime), items in groups.items():
        for op, r in items + [("all ops", None)]:
            rs = [x for _, x in items] if r is None else [r]
            aa = [t for x in rs for t in x["aa"]]
            eff = [e for x in rs for e in x["effects"]]
            full = [e for e in eff if e["budget"] == "all" and e["reference"] is not None]
            want = [e for e in full if e["expected"]]
            ten = [e for e in eff if e["budget"] == 10 and e["expected"]]
            row = {"pass": pas, "regime": regime, "op": op}
            for b in ("run", 5, 10, "all"):
                row[b] = count_false(aa, b)
            row["inside"] = (sum(e["inside"] for e in full), len(full))
            row["invalid"] = sum(e["budget"] == "all" and bool(e.get("reference_invalid")) for e in eff)
            row["inside_span"] = (sum(bool(e["inside_span"]) for e in full), len(full))
            row["direction"] = (sum(e["verdict"] == e["expected"] for e in want), len(want))
            row["power10"] = (sum(e["verdict"] == e["expected"] for e in ten), len(ten))
            row["floor"] = float(np.median([t["floor"] for t in aa if t["budget"] == "all"])) if aa else float("nan")
            rows.append(row)
    return rows


def _frac(c: dict, k: str = "false", n: str = "trials") -> str:
    return f"{c[k]}/{c[n]}" if c[n] else "-"


# ------------------------------------------------------------------ printing


def print_tables(results: dict) -> None:
    print("\n## Goals (read these lines): A/A false verdicts must be 0; references inside; directions right")
    print(
        "| pass | regime | op | A/A live runs false (overall) | per shape | A/A n=5 windows | per shape | "
        "A/A n=10 windows | per shape | kernel-only reference in HDI +- floor | (span reference) | "
        "references invalid | direction right (reference off by >= 2%) | power n=10 | median A/A floor |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in goal_rows(results):
        b = "**" if row["op"] == "all ops" else ""
        cells = []
        for k in ("run", 5, 10):
            cells += [_frac(row[k]), _frac(row[k], "false_shapes", "shape_verdicts")]
        pair = [f"{a}/{n}" if n else "-" for a, n in (row["inside"], row["inside_span"])]
        pair += [str(row["invalid"])] + [f"{a}/{n}" if n else "-" for a, n in (row["direction"], row["power10"])]
        print(
            f"| {row['pass']} | {row['regime']} | {b}{row['op']}{b} | {' | '.join(cells)} | {' | '.join(pair)} | "
            f"{100 * row['floor']:.2f}% |"
        )
    print("\n## Known-effect pairs (all rounds) against the kernel-only reference (eager launches, same buffers)")
    print(
        "| pass | regime | op | variant | reference (kernel-only) | span reference | bench head/base | 95% HDI | "
        "floor | reference in HDI +- floor | verdict | direction right | per shape: reference -> bench |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results["runs"].values():
        for e in r["effects"]:
            if e["budget"] != "all" or (e["reference"] is None and not e.get("reference_invalid")):
                continue
            if e.get("reference_invalid"):
                print(
                    f"| {r['pass']} | {r['regime']} | {r['op']} | {e['variant']} | invalid | invalid | "
                    f"{e['ratio']:.4f} | [{e['hdi'][0]:.4f}, {e['hdi'][1]:.4f}] | {100 * e['floor']:.2f}% | "
                    f"invalid | {e['verdict']} | - | {e['reference_invalid']} |"
                )
                continue
            right = "-" if e["expected"] is None else ("yes" if e["verdict"] == e["expected"] else "**no**")
            shapes = ", ".join(f"{x:.3f}->{y:.3f}" for x, y in zip(e["reference_shapes"], e["shape_ratios"]))
            print(
                f"| {r['pass']} | {r['regime']} | {r['op']} | {e['variant']} | {e['reference']:.4f} | "
                f"{e['reference_span']:.4f} | {e['ratio']:.4f} | [{e['hdi'][0]:.4f}, {e['hdi'][1]:.4f}] | "
                f"{100 * e['floor']:.2f}% | {'yes' if e['inside'] else '**no**'} | {e['verdict']} | {right} | "
                f"{shapes} |"
            )
    print(
        "\n## Per-launch time of the base: bench (CUDA events; on the CPU its wall clock) and the kernel-only "
        "reference (eager launches)"
    )
    print(
        "| pass | regime | op | shape | inner | bench | kernel-only | span | bench - kernel-only | "
        "kernels per launch | attribution | cold copies | same output addresses (base, base2) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results["runs"].values():
        c = r["calls"][0]
        base = np.asarray(c["instances"]["base"])
        for i, shape in enumerate(c["shapes"]):
            ref = c["reference"][i] if len(c.get("reference") or []) == len(c["shapes"]) else None
            bench = float(np.median(base[:, i]))
            k = float(np.median(ref["kernel_ms"]["base"])) if ref and ref["kernel_ms"]["base"] else float("nan")
            sp = float(np.median(ref["span_ms"]["base"])) if ref and ref["span_ms"]["base"] else float("nan")
            kpl = float(np.median(ref["kernels"]["base"])) / c["inner"][i] if ref and ref["kernels"]["base"] else 0
            kernel = f"{1e3 * k:.3f} us | {1e3 * sp:.3f} us | {1e3 * (bench - k):.3f} us"
            why = ((ref or {}).get("invalid") or {}).get("base")
            if why:
                kernel = f"invalid ({why}) | {1e3 * sp:.3f} us | -"
            same = (c.get("same_output_addresses") or [None] * len(c["shapes"]))[i]
            print(
                f"| {r['pass']} | {r['regime']} | {r['op']} | {shape} | {c['inner'][i]} | {1e3 * bench:.3f} us | "
                f"{kernel} | {kpl:.2f} | {(ref or {}).get('method', '-')} | {c['copies'][i]} | {same} |"
            )


# ------------------------------------------------------------------ main


def rejudge(path: str) -> int:
    """Print the tables of a recorded run, every verdict decided again from its recorded times (no GPU)."""
    import gzip

    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
            results = json.load(f)
        for run in results["runs"].values():
            run["aa"] = [t for call in run["calls"] for t in aa_trials(call)]
            run["effects"] = [t for call in run["calls"] for t in effect_trials(call)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # unreadable, not JSON, another shape
        print(f"live_eval: --rejudge {path}: not a recorded run ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    say(f"{path}: recorded on {results.get('device')}, judged again")
    print_tables(results)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="a sanity run: cold, three ops, 1 triple, <= 60 s")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated ops (default: all four)")
    ap.add_argument(
        "--regimes", default=None, help="comma-separated: cold, warm (default: quiet cold and warm, noisy cold)"
    )
    ap.add_argument("--passes", default=None, help="comma-separated: " + ", ".join(PASSES) + " (default: all)")
    ap.add_argument("--noise-only", action="store_true", help="the noisy pass alone (= --passes noisy)")
    ap.add_argument("--triples", type=int, default=None, help="A/A triples per call (default: PLAN)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per call (default: PLAN)")
    ap.add_argument("--reps", type=int, default=None, help="samples per instance and round (bench default)")
    ap.add_argument("--ref-replays", type=int, default=10, help="profiled replays per instance and shape")
    ap.add_argument("--budget-s", type=float, default=440.0, help="no call starts that cannot end within this (s)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "live_eval.json"))
    ap.add_argument(
        "--rejudge", metavar="FILE", help="judge a recorded run (its --out JSON, .gz too) with today's statistics"
    )
    args = ap.parse_args(argv)
    if args.rejudge:
        return rejudge(args.rejudge)
    passes = ["noisy"] if args.noise_only else (args.passes or ",".join(PASSES)).split(",")
    plan_cfg = {k: dict(v) for k, v in PLAN.items()}
    if args.quick:  # three ops, cold, quiet
        plan_cfg = {"quiet": {op: (1, 8, 1) for op in OPS}, "noisy": {op: (1, 8, 1) for op in OPS}}
        args.ref_replays, args.budget_s = 3, min(args.budget_s, 55.0)
        passes = (args.passes or "quiet").split(",")
        if args.ops == ",".join(OPS):
            args.ops = "kv_append,rope,attention.decode_paged"
        args.regimes = args.regimes or "cold"
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        plan_cfg = {p: {op: (1, 5, 1) for op in OPS} for p in PASSES}  # the interpreter is slow
        args.reps, args.ref_replays = args.reps or 2, min(args.ref_replays, 2)
    ops = [o for o in args.ops.split(",") if o]
    regimes = [r for r in (args.regimes or "cold,warm").split(",") if r]
    bad = (
        [o for o in ops if o not in OPS]
        + [r for r in regimes if r not in ("warm", "cold")]
        + [p for p in passes if p not in PASSES]
    )
    if bad or (args.rounds is not None and args.rounds < 5) or (args.triples is not None and args.triples < 1):
        print(
            f"live_eval: bad arguments {bad or ''} (ops: {', '.join(OPS)}; regimes: warm, cold; passes: "
            f"{', '.join(PASSES)}; rounds >= 5, triples >= 1)",
            file=sys.stderr,
        )
        return 2

    def cfg(pas: str, op: str) -> dict:
        t, n, v = plan_cfg[pas][op]
        return {
            "triples": args.triples or t,
            "rounds": args.rounds or n,
            "variants": v,
        }

    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("live_eval: --device cuda needs a CUDA GPU (--device cpu --quick: the code path)", file=sys.stderr)
            return 2
        p = torch.cuda.get_device_properties(0)
        import triton

        say(
            f"GPU {p.name}, L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB, torch {torch.__version__}, "
            f"triton {triton.__version__}"
        )
    else:
        say("CPU (Triton interpreter): the code path only; the figures mean nothing")

    def pass_regimes(pas: str) -> list[str]:
        return regimes if args.regimes else [r for r in PASS_REGIMES[pas] if r in regimes]

    plan = [(pas, regime, op) for pas in passes for regime in pass_regimes(pas) for op in ops if op in plan_cfg[pas]]
    # timing seconds a call is expected to need: instances x rounds x the op's cost of one instance-round
    # (the first H200 run: 0.008-0.016 s kv_append, 0.020-0.024 rope, 0.029 attention, 0.046 paged attention)
    cost = {"kv_append": 0.014, "rope": 0.022, "attention.decode": 0.03, "attention.decode_paged": 0.046}

    def weight(pas, op):
        c = cfg(pas, op)
        return (3 * c["triples"] + (c["variants"] or len(OPS[op][3]))) * c["rounds"] * cost[op]

    results = {"device": args.device, "args": vars(args), "ops": ops, "regimes": regimes, "runs": {}}
    results |= {"skipped": [], "failed": []}
    deadline = T0 + args.budget_s

    def overhead(op: str) -> float:
        return OVERHEAD_S[op] if args.device == "cuda" and not args.quick else 6.0

    with tempfile.TemporaryDirectory(prefix="kernalin-live-") as tmp:
        for idx, (pas, regime, op) in enumerate(plan):
            key = f"{pas}/{regime}/{op}"
            left = deadline - time.perf_counter()
            rest = plan[idx:]
            if left < overhead(op) + 3:
                results["skipped"].append(key)
                continue
            share = weight(pas, op) / sum(weight(p, o) for p, _, o in rest)
            budget = max(2.0, (left - sum(overhead(o) for _, _, o in rest)) * share)
            call = bench_call(op, tmp, key, cfg(pas, op), args, pas == "noisy", budget, seed=1000 * idx + 7)
            if "error" in call:
                results["failed"].append(f"{key}: {call['error']}")
                say(f"{key}: FAILED {call['error']}")
                continue
            run = {"pass": pas, "regime": regime, "op": op, "calls": [call]}
            run["aa"] = aa_trials(call)
            run["effects"] = effect_trials(call)
            results["runs"][key] = run
            c = count_false(run["aa"], "run")
            say(
                f"{key}: {call['rounds']} rounds, {call['bench_seconds']:.1f} s timing (budget {budget:.0f} s), "
                f"{call['setup_seconds']:.1f} s setup, {call['seconds']:.1f} s in all; A/A live runs false "
                f"{c['false']}/{c['trials']}, per shape {c['false_shapes']}/{c['shape_verdicts']}"
                + (f"; notes: {'; '.join(call['notes'])}" if call["notes"] else "")
            )
        print_tables(results)
    if results["skipped"]:
        say(f"budget reached: skipped {', '.join(results['skipped'])}")
    for f in results["failed"]:
        say(f"failed: {f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f)
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
