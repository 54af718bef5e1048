"""Do profilers see what CUDA events see on graph-replayed micro-kernels? (docs/statistics.md, issue 12)

kv_append (benchmarks/kernels/kv_append.py) at T=1 with num_warps 4 (the base), 1 and 8; CUDA graphs of
100, 200 and 400 launches on fixed inputs, each replay after an L2 flush, the graphs in a random order.
Four instruments time the same replays:
- `events`: CUDA events around each replay; the slope over the graph lengths is the cost per launch;
- `cupti`: torch.profiler (CUPTI) around the replays: per replay the sum of the kernels' device durations
  and their span (first start to last end), each as a slope; and the CUDA events taken under it;
- `ncu-graph`: Nsight Compute, each replay as one workload (`--graph-profiling graph`), its
  `gpu__time_duration`; slope as above;
- `ncu-node`: Nsight Compute, each kernel of a 100-launch graph profiled alone (`--graph-profiling node`).
Prints per instrument the time per launch of each variant and the variants' ratios to the base; events
and cupti run in `--runs` separate processes each (the spread between processes is part of the answer).
`--contexts`: CUDA events only, graphs of 288 launches (the benchmark's `inner` there) writing cache slot
0, 1234 or the last, or a new random slot per launch, in `--runs` processes: the same clock in other
contexts. `--resident`: the same graphs on slot 0, with 0, 1 or 3 more graphs per variant captured and
left idle in the process.

    python3 benchmarks/graph_profilers.py             # one GPU (ncu rows: ncu on PATH); about 90 s on an H200
    python3 benchmarks/graph_profilers.py --contexts  # about 30 s
    python3 benchmarks/graph_profilers.py --resident  # about 60 s
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
WARPS = (4, 1, 8)
LENGTHS = (100, 200, 400)
METRIC = "gpu__time_duration.sum"


def load(nw: int, tmp: str):
    with open(os.path.join(ROOT, "benchmarks", "kernels", "kv_append.py")) as f:
        src = f.read().replace("NUM_WARPS = 4", f"NUM_WARPS = {nw}")
    path = os.path.join(tmp, f"kv_nw{nw}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"kv_nw{nw}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.append


def replays(mode: str, lengths: tuple[int, ...], reps: int) -> dict:
    """In the child: build the graphs, replay them; events -> their times (ns); cupti -> the same under
    torch.profiler, with each replay's kernel sum and span (ns); ncu -> NVTX-marked replays."""
    import contextlib

    import torch

    T, H, D, S = 1, 8, 128, 32768
    key = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
    val = torch.randn_like(key)
    kc = torch.zeros(S, H, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    slots = torch.tensor([1234], device="cuda", dtype=torch.int64)
    graphs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for nw in WARPS:
            fn = load(nw, tmp)
            for _ in range(3):
                fn(key, val, kc, vc, slots)
            torch.cuda.synchronize()
            for n in lengths:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(n):
                        fn(key, val, kc, vc, slots)
                graphs[f"{nw}/{n}"] = g
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    order, log, times = list(graphs), [], {k: [] for k in graphs}
    for k in order:
        graphs[k].replay()  # warm-up, outside any range
    torch.cuda.synchronize()
    rng = random.Random(0)
    prof = contextlib.nullcontext()
    if mode == "cupti":
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CUDA])
    with prof:
        replay_all(graphs, order, flush, mode, reps, rng, times, log)
    out = {"times": times, "log": log}
    if mode == "cupti":
        out.update(cupti_times(prof, log))
    return out


def cupti_times(prof, log: list[str]) -> dict:
    """The profiled kv_append kernels, in start order, cut into the replays of `log` (each replay of graph
    `nw/n` holds n of them) -> per replay the kernels' summed device time and their span, in ns."""
    from kernalin_ci.bench.kernel_time import events_of

    kern = sorted((e.start_ns, e.dur_ns) for e in events_of(prof) if e.device and "_append_kernel" in e.name)
    sizes = [int(k.split("/")[1]) for k in log]
    if len(kern) != sum(sizes):
        return {"error": f"{len(kern)} kernels recorded, {sum(sizes)} launched"}
    kernel, span, i = [], [], 0
    for n in sizes:
        part = kern[i : i + n]
        i += n
        kernel.append(float(sum(d for _, d in part)))
        span.append(float(part[-1][0] + part[-1][1] - part[0][0]))
    return {"kernel": kernel, "span": span}


def replay_all(graphs, order, flush, mode, reps, rng, times, log) -> None:
    import torch

    for _ in range(reps):
        rng.shuffle(order)
        for k in order:
            flush.zero_()
            torch.cuda.synchronize()
            if mode in ("events", "cupti"):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                graphs[k].replay()
                e.record()
                torch.cuda.synchronize()
                times[k].append(s.elapsed_time(e) * 1e6)
            else:
                torch.cuda.nvtx.range_push("kref")
                graphs[k].replay()
                torch.cuda.nvtx.range_pop()
                torch.cuda.synchronize()
            log.append(k)


CONTEXT_INNER = 288


def contexts(reps: int, seed: int, idle: int = -1) -> dict:
    """In the child: kv_append at T=1, graphs of CONTEXT_INNER launches writing one fixed slot or a new
    random slot per launch, each replay after an L2 flush -> {context: {num_warps: median ns per launch}}.
    idle >= 0: slot 0 only, and `idle` more graphs of the same launches per variant captured and never
    replayed (graphs resident in the process)."""
    import torch

    H, D, S = 8, 128, 32768
    key = torch.randn(1, H, D, device="cuda", dtype=torch.bfloat16)
    val = torch.randn_like(key)
    kc = torch.zeros(S, H, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    fixed = {s: torch.tensor([s], device="cuda", dtype=torch.int64) for s in (0, 1234, S - 1)}
    perm = torch.randperm(S, generator=torch.Generator().manual_seed(seed))[:CONTEXT_INNER].tolist()
    ring = [torch.tensor([s], device="cuda", dtype=torch.int64) for s in perm]
    slots = {f"slot {s}": [t] * CONTEXT_INNER for s, t in fixed.items()}
    slots["a random slot per launch"] = ring
    if idle >= 0:
        slots = {f"{3 * (idle + 1)} graphs resident": [fixed[0]] * CONTEXT_INNER}
    graphs, resident = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for nw in WARPS:
            fn = load(nw, tmp)
            for _ in range(3):
                fn(key, val, kc, vc, fixed[0])
            torch.cuda.synchronize()
            for name, ss in slots.items():
                for i in range(max(idle, 0) + 1):
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        for t in ss:
                            fn(key, val, kc, vc, t)
                    if i == 0:
                        graphs[(name, nw)] = g
                    else:
                        resident.append(g)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    times: dict = {k: [] for k in graphs}
    order = list(graphs)
    for k in order:
        graphs[k].replay()
    rng = random.Random(seed)
    for _ in range(reps):
        rng.shuffle(order)
        for k in order:
            flush.zero_()
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            graphs[k].replay()
            e.record()
            torch.cuda.synchronize()
            times[k].append(s.elapsed_time(e) * 1e6 / CONTEXT_INNER)
    out: dict = {}
    for (name, nw), v in times.items():
        out.setdefault(name, {})[str(nw)] = statistics.median(v)
    return out


def child(
    mode: str, lengths: tuple[int, ...], reps: int, ncu: list[str] | None = None, seed: int = 0, idle: int = -1
) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--child", mode, "--lengths", ",".join(map(str, lengths))]
    argv += ["--reps", str(reps), "--seed", str(seed), "--idle", str(idle)]
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "ncu.csv")
        if ncu:
            argv = [*ncu, "--log-file", log, *argv]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
        got = [ln for ln in p.stdout.splitlines() if ln.startswith("PROBE ")]
        if p.returncode != 0 or not got:
            raise SystemExit(f"graph_profilers: {mode} failed: {(p.stdout + p.stderr)[-800:]}")
        out = json.loads(got[0][6:])
        if ncu:
            with open(log, errors="replace") as f:
                out["durations"] = parse(f.read())
    return out


def parse(text: str) -> list[float]:
    rows = [ln for ln in text.splitlines() if ln.startswith('"')]
    got = {}
    for r in csv.DictReader(io.StringIO("\n".join(rows))):
        if r.get("Metric Name") == METRIC:
            got[int(r["ID"])] = float(r["Metric Value"].replace(",", ""))
    return [got[i] for i in sorted(got)]


def per_launch(medians: dict[str, float], lengths: tuple[int, ...]) -> dict[int, float]:
    lo, hi = lengths[0], lengths[-1]
    return {nw: (medians[f"{nw}/{hi}"] - medians[f"{nw}/{lo}"]) / (hi - lo) for nw in WARPS}


def row(name: str, t: dict[int, float], note: str) -> str:
    b = t[4]
    return f"| {name} | {t[4]:.0f} | {t[1]:.0f} | {t[8]:.0f} | {t[1] / b:.4f} | {t[8] / b:.4f} | {note} |"


def slope_row(name: str, series: dict[str, list[float]], lengths: tuple[int, ...]) -> str:
    """Per-graph medians -> the per-launch slope of each variant, and the intercept (per replay besides)."""
    med = {k: statistics.median(v) for k, v in series.items()}
    t = per_launch(med, lengths)
    icpt = min(med[f"{nw}/{lengths[0]}"] - lengths[0] * t[nw] for nw in WARPS)
    return row(name, t, f"{icpt:.0f} ns")


def by_graph(log: list[str], values: list[float]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for k, v in zip(log, values):
        out.setdefault(k, []).append(v)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--runs", type=int, default=3, help="processes per instrument (events, cupti)")
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--contexts", action="store_true", help="the same clock in other contexts (events only)")
    ap.add_argument("--resident", action="store_true", help="with 3, 6 and 12 graphs resident (events only)")
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--idle", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--child", choices=("events", "cupti", "ncu", "contexts"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    lengths = tuple(int(x) for x in args.lengths.split(","))
    if args.child:
        if args.child == "contexts":
            got = contexts(args.reps, args.seed, args.idle)
        else:
            got = replays(args.child, lengths, args.reps)
        print("PROBE " + json.dumps(got), flush=True)
        return 0
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if not gpu:
        print("graph_profilers: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.contexts or args.resident:
        head = f"| CUDA events, graphs of {CONTEXT_INNER} launches | base ns/launch | num_warps 1 / base |"
        print(head + " num_warps 8 / base |")
        print("|---|---|---|---|")
        idles = (0, 1, 3) if args.resident else (-1,)
        for run in range(1, args.runs + 1):
            got = {}
            for idle in idles:
                got |= child("contexts", lengths, max(args.reps, 15), seed=run, idle=idle)
            for name, t in got.items():
                b = t["4"]
                print(f"| {name}, process {run} | {b:.0f} | {t['1'] / b:.4f} | {t['8'] / b:.4f} |")
        return 0
    print("| instrument | base ns/launch | num_warps 1 | num_warps 8 | ratio nw1 | ratio nw8 | per replay besides |")
    print("|---|---|---|---|---|---|---|")
    for run in range(1, args.runs + 1):
        ev = child("events", lengths, args.reps)
        print(slope_row(f"CUDA events (slope), process {run}", ev["times"], lengths))
    for run in range(1, args.runs + 1):
        cu = child("cupti", lengths, args.reps)
        print(slope_row(f"CUDA events under torch.profiler, process {run}", cu["times"], lengths))
        if "error" in cu:
            print(f"| CUPTI, process {run} | {cu['error']} | | | | | |")
            continue
        print(slope_row(f"CUPTI kernel sum (slope), process {run}", by_graph(cu["log"], cu["kernel"]), lengths))
        print(slope_row(f"CUPTI span (slope), process {run}", by_graph(cu["log"], cu["span"]), lengths))
    ncu = shutil.which("ncu")
    if ncu is None:
        print("| Nsight Compute | not run: no `ncu` on PATH | | | | | |")
        return 0
    base = [ncu, "--csv", "--print-units", "base", "--clock-control", "none", "--cache-control", "none"]
    base += ["--target-processes", "all", "--nvtx", "--nvtx-include", "kref/", "--metrics", METRIC]
    gr = child("ncu", lengths, args.reps, [*base, "--graph-profiling", "graph"])
    nd = child("ncu", lengths[:1], 2, [*base, "--graph-profiling", "node"])
    if len(gr["durations"]) == len(gr["log"]):
        print(slope_row("ncu, graph workloads (slope)", by_graph(gr["log"], gr["durations"]), lengths))
    else:
        print(f"| ncu, graph workloads | {len(gr['durations'])} profiled, {len(gr['log'])} replayed | | | | | |")
    n0 = lengths[0]
    if len(nd["durations"]) == n0 * len(nd["log"]):
        per: dict[str, list[float]] = {}
        for i, k in enumerate(nd["log"]):
            per.setdefault(k, []).extend(nd["durations"][i * n0 : (i + 1) * n0])
        t = {nw: statistics.mean(per[f"{nw}/{n0}"]) for nw in WARPS}
        print(row("ncu, each kernel alone (mean)", t, "-"))
    else:
        print(f"| ncu, each kernel alone | {len(nd['durations'])} profiled, {n0 * len(nd['log'])} launched | | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
