"""Checks the per-layer estimate of a decode step against the whole step, on the GPU (docs/tokens.md).

    OUT=/some/dir python benchmarks/model_step_check.py      # on the GPU host, from the repository root

1. Llama-3.1-8B (the whole model fits on one H200) with the example repository's kernels in their
   places (examples/decode-kernels: paged attention, rope, kv_append), at two serving points
   (batch 1, context 4096; batch 64, context 2048). Each point is timed two ways in the same
   interleaved rounds: the whole step as one CUDA graph, and the per-layer estimate the benchmark
   uses when a model does not fit (a block of k layers x layers / k, plus the embedding and LM head,
   each part its own graph). Printed per point: the medians, estimate/whole with its 95% HDI (the
   benchmark's Bayesian bootstrap over rounds), and whether the estimate is within 3%.
2. `kernalin-ci bench --model llama-3.1-8b --op attention.decode_paged`, the example's paged attention
   as base against the same kernel with the example's exp2-softmax-step pull request applied (head):
   decode tokens/s and $/Mtok, base and head, with the posterior, for the two serving points.
   The JSON goes to $OUT/model_bench.json (default ./model-check-out).

Expected on one H200: about 90 s in all. `--smoke` runs step 1 on the CPU (Triton interpreter, a tiny
model, two rounds) and step 2 with `--device cpu` (which times nothing) to check the plumbing.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.chdir(ROOT)
SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: this process runs the example kernels

import torch  # noqa: E402

from kernalin_ci.bench import stats  # noqa: E402
from kernalin_ci.bench.timing import CpuClock, CudaClock, SharedInputs, TimedEntry  # noqa: E402
from kernalin_ci.entry import load_entry  # noqa: E402
from kernalin_ci.throughput import step as st  # noqa: E402
from kernalin_ci.throughput.spec import ServingPoint, from_cli, tiny  # noqa: E402

EXAMPLE = os.path.join(ROOT, "examples", "decode-kernels")
KERNELS = os.path.join(EXAMPLE, "kernels")
POINTS = [ServingPoint(1, 4096), ServingPoint(64, 2048)]
ROUNDS, REPS = (2, 1) if SMOKE else (30, 5)
GOAL = 0.03


def example_kernels() -> st.Kernels:
    return st.Kernels(
        attention=load_entry("kernels/paged_attention.py:decode_paged", EXAMPLE),
        rope=load_entry("kernels/rope.py:rope", EXAMPLE),
        kv_append=load_entry("kernels/kv_cache.py:append", EXAMPLE),
        attention_op="attention.decode_paged",
        block_size=16,
        layout="nhd",
    )


def check_estimate() -> list[str]:
    device = "cpu" if SMOKE else "cuda"
    spec = from_cli("llama-3.1-8b")
    points = POINTS
    if SMOKE:
        spec = dataclasses.replace(tiny(spec), layers=4)
        points = spec.serving
    kern = example_kernels()
    t0 = time.perf_counter()
    w = st.build_weights(spec, spec.layers, device, 0)
    k = 2 if SMOKE else st.block_layers(spec, st.layer_bytes(spec) + sum(st.kv_bytes(spec, p, kern) for p in points))
    wk = st.Weights(embed=w.embed, final_norm=w.final_norm, layers=w.layers[:k])
    clock = CudaClock(True) if device == "cuda" else CpuClock()
    rng = random.Random(0)
    lines = [
        f"model {spec.name}: {spec.layers} layers; per-layer estimate from a block of {k} layers x "
        f"{spec.layers / k:g} + embedding and LM head; {ROUNDS} rounds x {REPS} samples"
    ]
    print(lines[0], flush=True)
    for i, p in enumerate(points):
        pi = st.build_point(spec, p, kern, spec.layers, device, 100 + i)
        pik = dataclasses.replace(pi, caches=pi.caches[:k])
        none = SharedInputs({})  # the step reads what it was built with
        full = TimedEntry("full", functools.partial(st.full_step, spec, w, pi, kern), none, device)
        block = TimedEntry("layers", functools.partial(st.layers_part, spec, wk, pik, kern), none, device)
        ends = TimedEntry("ends", functools.partial(st.ends_part, spec, wk, pik, kern), none, device)
        for r in (full, block, ends):
            clock.prepare([r], none, "warm", lambda ev: None, p.label)
        variants = {
            "whole": lambda full=full: clock.sample(full),
            "estimate": lambda block=block, ends=ends: spec.layers / k * clock.sample(block) + clock.sample(ends),
        }
        times = {n: [] for n in variants}
        parts = {"layers": [], "ends": []}
        for _ in range(ROUNDS):
            for n in rng.sample(list(variants), len(variants)):
                variants[n]()  # warm-up sample, discarded
                times[n].append([variants[n]() for _ in range(REPS)])
            parts["layers"].append(clock.sample(block) / k)
            parts["ends"].append(clock.sample(ends))
        whole, est = np.asarray(times["whole"]), np.asarray(times["estimate"])
        v = stats.compare_trace(whole, est, rope=GOAL)
        ok = v.hdi[0] >= 1 - GOAL and v.hdi[1] <= 1 + GOAL
        line = (
            f"{p.label}: whole step {np.median(whole):.4f} ms, estimate {np.median(est):.4f} ms "
            f"(one layer {np.median(parts['layers']):.4f} ms x {spec.layers} + ends "
            f"{np.median(parts['ends']):.4f} ms); estimate/whole {v.ratio:.4f}, 95% HDI "
            f"[{v.hdi[0]:.4f}, {v.hdi[1]:.4f}]: {'within' if ok else 'NOT within'} {100 * GOAL:g}%"
        )
        print(line, flush=True)
        lines.append(line)
        del pi, pik, full, block, ends
        if device == "cuda":
            torch.cuda.empty_cache()
    lines.append(f"({time.perf_counter() - t0:.0f} s)")
    return lines


def apply_patch(patch: str, root: str) -> None:
    """Apply a unified diff's hunks by text replacement (no `patch` or git needed on the GPU host)."""
    target, old, new = None, [], []

    def flush():
        if target and (old or new):
            path = os.path.join(root, target)
            text = open(path).read()
            before, after = "".join(old), "".join(new)
            assert text.count(before) == 1, f"{patch}: hunk does not apply to {target}"
            open(path, "w").write(text.replace(before, after))

    for line in open(patch).read().splitlines(keepends=True):
        if line.startswith("+++ "):
            target = line[4:].strip().split("/", 1)[1]
        elif line.startswith("--- "):
            continue
        elif line.startswith("@@"):
            flush()
            old, new = [], []
        elif line[:1] == "-":
            old.append(line[1:])
        elif line[:1] == "+":
            new.append(line[1:])
        elif line[:1] == " ":
            old.append(line[1:])
            new.append(line[1:])
    flush()


def bench_model_demo(out: str) -> int:
    """Step 2: the CLI, base = the example's paged attention, head = with the exp2-softmax-step patch."""
    with tempfile.TemporaryDirectory(prefix="model-check-") as tmp:
        head = os.path.join(tmp, "head")
        shutil.copytree(EXAMPLE, head, ignore=shutil.ignore_patterns("prs"))
        apply_patch(os.path.join(EXAMPLE, "prs", "exp2-softmax-step.patch"), head)
        cmd = [
            sys.executable,
            "-m",
            "kernalin_ci",
            "bench",
            "--model",
            "llama-3.1-8b",
            "--op",
            "attention.decode_paged",
            "--base",
            "kernels/paged_attention.py:decode_paged",
            "--base-root",
            EXAMPLE,
            "--head",
            "kernels/paged_attention.py:decode_paged",
            "--head-root",
            head,
            "--device",
            "cpu" if SMOKE else "cuda",
            "--budget-s",
            "20",
            "--json",
            os.path.join(out, "model_bench.json"),
        ]
        print("$ " + " ".join(cmd[1:]), flush=True)
        return subprocess.run(cmd).returncode


def main() -> int:
    out = os.environ.get("OUT", "model-check-out")
    os.makedirs(out, exist_ok=True)
    lines = check_estimate()
    rc = bench_model_demo(out)
    print("\n== per-layer estimate against the whole step")
    print("\n".join(lines))
    print(f"== kernalin-ci bench --model: exit {rc}; JSON in {out}/model_bench.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
