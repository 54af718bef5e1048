"""`kernalin-ci tune` against Triton's autotuner over the same space, on one GPU (about 4-5 minutes).

    OUT=/some/dir python3 benchmarks/tune_vs_autotune.py      # from the repository root, on the H200

Kernels (benchmarks/kernels/tune/): the example repository's paged attention under
@triton.autotune over BLOCK_N x num_warps (BLOCK_N 32 and 64 are larger than the 16-token page
and wrong), the example's RoPE under @triton.autotune over num_warps, and the catalogue's split-KV
decode attention with NUM_SPLITS as an entry keyword (`tune.params`). Per kernel:

1. tune: every candidate verified (dynamic + structural, on a Llama-like domain: D 128, 32/8
   heads, bfloat16), the survivors raced against the current config (`--budget-s` per kernel,
   default 45 s: the race's one benchmark worker spends about 15 s setting up the three bench shapes
   (their inputs are drawn on the CPU in float64, every config compiled and its CUDA graphs
   captured), and a round of five instances takes well under a second, so the rest buys the final
   race dozens of rounds; at 15 s the setup left one);
2. the autotuner's pick per bench shape: an autotuned kernel is loaded fresh per shape and
   called once (its own timing of every config; `best_config` read back); for a keyword space
   the same rule is applied by hand (triton.testing.do_bench of every config, the fastest wins);
3. kernel-only reference times (torch.profiler device time per call) of the current config,
   the autotuner's pick and tune's pick per shape;
4. one table: the picks, whether the autotuner's pick passes verification, the times, and the
   GPU time each method spent. JSON under $OUT (default ./tune-vs-autotune-out).

A cap (`--max-s`, default 330 s) starts no kernel later than `--budget-s` + 60 s before it (a kernel
takes about that long), and says which it skipped. Each shape's inputs are made once per kernel, for
the autotuner's picks and the kernel-only times both.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from kernalin_ci.tune.run import Target, tune  # noqa: E402
from kernalin_ci.tune.space import TuneSpec  # noqa: E402

DOMAIN = {"head_dim": 128, "num_q_heads": 32, "num_kv_heads": 8, "dtype": "bfloat16"}
KERNELS = {  # in order of importance: the cap skips the last ones first
    "paged": dict(
        op="attention.decode_paged",
        entry="kernels/tune/paged_autotuned.py:entry",
        params={"block_size": 16},
        domain={**DOMAIN, "block_size": 16},
        spec=TuneSpec(),
    ),
    "split_kv": dict(
        op="attention.decode",
        entry="kernels/tune/split_kv.py:entry",
        params={},
        domain=DOMAIN,
        spec=TuneSpec({"NUM_SPLITS": [1, 2, 4, 8, 16]}, use_autotune=False),
    ),
    "rope": dict(
        op="rope", entry="kernels/tune/rope_autotuned.py:rope", params={"style": "neox"}, domain=DOMAIN, spec=TuneSpec()
    ),
}
RESERVE_S = 60  # a kernel takes about this long besides its race: none starts past --max-s minus budget + this


def kernel_us(fn, kw: dict, calls: int = 20) -> float:
    """Device time per call (µs) of every kernel the call launches, from torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn(**kw)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(**kw)
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.key_averages():
        total += getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
    return total / calls


def autotune_picks(k: dict, result, cases, kws: list[dict]) -> list[dict]:
    """Per bench shape (its inputs in `kws`): the config Triton's autotuner picks, and the GPU time it
    spent choosing."""
    import torch
    import triton

    from kernalin_ci.entry import load_entry
    from kernalin_ci.tune.pin import autotuners, config_json, load_candidate

    space = result.space
    root = str(HERE)
    out = []
    for case, kw in zip(cases, kws):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if space.autotuned is not None:
            fn = load_entry(k["entry"], root)  # a fresh module: a fresh autotuner with an empty cache
            fn(**kw)
            torch.cuda.synchronize()
            at = autotuners(fn, root)[space.autotuned["kernel"]]
            picked = json.loads(json.dumps(config_json(at.best_config)))
            name = next(c.name for c in space.candidates if c.autotune["config"] == picked)
        else:
            field = [space.current] + space.candidates
            ms = {}
            for c in field:
                f = load_candidate(k["entry"], root, c.params, None)
                ms[c.name] = triton.testing.do_bench(lambda f=f, kw=kw: f(**kw))
            name = min(ms, key=ms.get)
        out.append({"shape": case.name, "pick": name, "seconds": time.perf_counter() - t0})
    return out


def measure(k: dict, result, picks: list[dict], cases, kws: list[dict]) -> list[dict]:
    from kernalin_ci.tune.pin import load_candidate

    space = result.space
    cands = {c.name: c for c in space.candidates} | {"current": space.current}
    checked = {c.candidate.name: c for c in result.checked}
    rows = []
    for i, (case, pick, kw) in enumerate(zip(cases, picks, kws)):
        j = result.judgements[i] if i < len(result.judgements) else None
        tune_pick = j.best if j else result.chosen
        # the kernel-only time of every config that passed verification, and of the autotuner's pick
        # (which may not have): "fastest verified" is the reference's answer to what tune should find
        timed = {}
        for name in [*(n for n, c in checked.items() if c.passed), pick["pick"], "current"]:
            if name is not None and name not in timed:
                c = cands[name]
                timed[name] = kernel_us(load_candidate(k["entry"], str(HERE), c.params, c.autotune), kw)
        verified = {n: t for n, t in timed.items() if checked.get(n) is not None and checked[n].passed}
        fastest = min(verified, key=verified.get) if verified else None
        us = {"current": timed["current"], "autotune": timed[pick["pick"]]}
        if tune_pick is not None:
            us["tune"] = timed.get(tune_pick, float("nan"))
        if fastest is not None:
            us["fastest_verified"] = verified[fastest]
        ck = checked.get(pick["pick"])
        v = j.vs_reference.get(tune_pick) if j else None
        rows.append(
            {
                "shape": case.name,
                "autotune_pick": result.label(pick["pick"]),
                "autotune_pick_verified": None if ck is None else ck.passed,
                "autotune_pick_findings": ck.finding_lines()[:1] if ck else [],
                "tune_pick": result.label(tune_pick),
                "tune_vs_current": v.to_json() | {"posterior_hist": None} if v else None,
                # what the race judged against: "current", or the first verified config when the
                # current one failed verification
                "tune_vs": result.label(result.reference) if result.reference else None,
                "fastest_verified": result.label(fastest) if fastest else None,
                "us_verified": {result.label(n): t for n, t in verified.items()},
                "tune_equivalent": [result.label(n) for n in (j.equivalent if j else [])],
                "us": us,
                "autotune_seconds": pick["seconds"],
            }
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated subset of {', '.join(KERNELS)}")
    p.add_argument("--budget-s", type=float, default=45.0, help="tune's race budget per kernel (default 45)")
    p.add_argument("--jobs", type=int, default=8, help="candidates verified at once (default 8)")
    p.add_argument("--max-s", type=float, default=330.0, help="skip the remaining kernels past this (default 330)")
    args = p.parse_args(argv)
    import torch

    from kernalin_ci.bench.shapes import bench_cases
    from kernalin_ci.ops import get_op
    from kernalin_ci.ops.base import resolve_params

    if not torch.cuda.is_available():
        print("tune_vs_autotune: needs a CUDA GPU", file=sys.stderr)
        return 2
    unknown = [n for n in args.kernels.split(",") if n.strip() and n.strip() not in KERNELS]
    if unknown:
        print(f"tune_vs_autotune: unknown kernel {unknown[0]!r} (kernels: {', '.join(KERNELS)})", file=sys.stderr)
        return 2
    out_dir = Path(os.environ.get("OUT", "tune-vs-autotune-out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "kernels": {}, "skipped": []}
    for name in [n.strip() for n in args.kernels.split(",") if n.strip()]:
        if time.perf_counter() - t_start > args.max_s - args.budget_s - RESERVE_S:
            report["skipped"].append(name)
            print(f"== {name}: skipped (past --max-s {args.max_s:g} s)", file=sys.stderr)
            continue
        k = KERNELS[name]
        print(f"== {name}", file=sys.stderr, flush=True)
        target = Target(k["op"], k["entry"], str(HERE), dict(k["params"]), dict(k["domain"]), None, {}, name)
        result = tune(target, k["spec"], "cuda", budget_s=args.budget_s, jobs=args.jobs, progress=True)
        op = get_op(k["op"])
        params = resolve_params(k["op"], op.params, k["params"])
        cases = bench_cases(k["op"], params, "cuda", {})
        kws = [op.inputs(case, params, "cuda", poison=False) for case in cases]  # once per shape
        picks = autotune_picks(k, result, cases, kws)
        rows = measure(k, result, picks, cases, kws)
        del kws
        report["kernels"][name] = {
            "candidates": len(result.space.candidates),
            "dropped": [c.candidate.label for c in result.dropped],
            "tune_seconds": {"verify": result.verify_seconds, "race": result.race_seconds, "all": result.seconds},
            "autotune_seconds": sum(p["seconds"] for p in picks),
            "chosen": result.label(result.chosen),
            "stopped": result.stopped,
            "final_rounds": result.final_rounds,
            "rungs": result.rungs,
            "race_setup": result.race_setup,
            "rows": rows,
            "notes": result.notes,
        }
        report["seconds"] = time.perf_counter() - t_start  # written after each kernel: a cut run keeps its part
        (out_dir / "tune_vs_autotune.json").write_text(json.dumps(report, indent=2) + "\n")
    report["seconds"] = time.perf_counter() - t_start
    (out_dir / "tune_vs_autotune.json").write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return 0


def table(report: dict) -> str:
    lines = [
        f"tune vs triton.autotune on {report['device']} (torch {report['torch']}), {report['seconds']:.0f} s",
        "",
        "| kernel | shape | autotune pick (verified?) | tune pick | tune's verdict (vs) | fastest verified "
        "(kernel-only) | µs current / autotune / tune / fastest verified | GPU s autotune / tune (verify+race) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, k in report["kernels"].items():
        ts = k["tune_seconds"]
        for r in k["rows"]:
            ok = {True: "yes", False: "NO: " + "; ".join(r["autotune_pick_findings"])[:80], None: "n/a"}[
                r["autotune_pick_verified"]
            ]
            v = r["tune_vs_current"]
            vs = f"{v['verdict']} {v['ratio']:.3f} (vs {r.get('tune_vs', 'current')})" if v else "-"
            us = " / ".join(
                f"{r['us'].get(x, float('nan')):.1f}" for x in ("current", "autotune", "tune", "fastest_verified")
            )
            lines.append(
                f"| {name} | {r['shape']} | {r['autotune_pick']} ({ok}) | {r['tune_pick']} | {vs} | "
                f"{r.get('fastest_verified') or '-'} | {us} | "
                f"{r['autotune_seconds']:.1f} / {ts['verify']:.0f}+{ts['race']:.0f} |"
            )
        lines.append(f"| {name} | dropped by verification: {', '.join(k['dropped']) or 'none'} | | | | | | |")
    for n in report["skipped"]:
        lines.append(f"| {n} | skipped: past --max-s | | | | | | |")
    lines.append("")
    for name, k in report["kernels"].items():
        rs = k.get("race_setup") or {}
        lines.append(
            f"{name}: chosen {k['chosen']} (stopped: {k['stopped']}, {k.get('final_rounds', 0)} final rounds); race "
            f"{k['tune_seconds']['race']:.1f} s = setup {rs.get('seconds', float('nan')):.1f} s "
            f"(workers {rs.get('workers', 0)}) + {rs.get('rounds', 0)} rounds "
            f"{rs.get('round_seconds', float('nan')):.1f} s"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
