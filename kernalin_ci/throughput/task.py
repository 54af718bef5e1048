"""Worker task "model-bench": build the decode step per serving point and time it, base against head.

Runs in the worker child (kernalin_ci/kernel_worker.py); the parent is kernalin_ci.throughput.bench. The
timing is the kernel benchmark's (kernalin_ci.bench.timing): the same clocks (CUDA graphs replayed
between CUDA events after an L2 flush), one discarded warm-up sample per instance, `reps` samples, the
instances in a random order in every round, and the same adaptive stopping. A sample of an instance
is one step: the whole model captured in one CUDA graph, or, when the whole model with the caches of
every serving point does not fit in the GPU's free memory, the per-layer estimate (layers / k) x a
block of k layers + the embedding and LM head (two graphs, each timed after its own L2 flush).

Before every round's timing each instance runs the step once on fresh tokens (and a fresh hidden
state), through its captured graph: layer 0's attention output must agree with the base's within
twice the dtype's tolerance and the logits must be finite, so an instance that skips work when
captured cannot look fast. On the CPU nothing is timed: a small model of the same head dim and head
ratio runs once per instance under the Triton interpreter and the outputs are compared.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import torch

from kernalin_ci.bench import stats
from kernalin_ci.bench.timing import (
    BenchAbort,
    CpuClock,
    CudaClock,
    SharedInputs,
    TimedEntry,
    time_instances,
    timed_rounds,
)
from kernalin_ci.bench.trace import geometric_mean_over_shapes
from kernalin_ci.device import DEVICES
from kernalin_ci.entry import load_entry
from kernalin_ci.jobs import Emit, EntryAt, ModelJob
from kernalin_ci.ops.base import TOLERANCE
from kernalin_ci.runtime.cuda_errors import CUDA_ERROR
from kernalin_ci.runtime.rows import row_errors
from kernalin_ci.throughput import step as st
from kernalin_ci.throughput.spec import ModelSpec, ServingPoint, tiny

HEADROOM_BYTES = 4 << 30  # activations, graph pools, cuBLAS workspaces, the L2 flush buffer
FREE_FRACTION = 0.9


def load_kernels(roles: dict[str, EntryAt], job: ModelJob) -> st.Kernels:
    fns = {role: load_entry(r.entry, r.root) for role, r in roles.items()}
    return st.Kernels(
        attention=fns.get("attention"),
        rope=fns.get("rope"),
        kv_append=fns.get("kv_append"),
        decode_step=fns.get("decode_step"),
        attention_op=job.attention_op,
        block_size=job.block_size,
        layout=job.layout,
        params=dict(job.params),
    )


def run_job(job: ModelJob, device: str, emit: Emit) -> None:
    instances = [(i.name, load_kernels(i.roles, job)) for i in job.instances]
    spec = job.spec
    try:
        if not DEVICES[device].timed:
            _cpu_check(spec, instances, job, emit)
        else:
            _run(spec, instances, job, device, emit)
    except BenchAbort as e:
        emit({"event": "bench-error", "kind": e.kind, "message": str(e)})
    except torch.cuda.OutOfMemoryError as e:
        emit({"event": "bench-error", "kind": "out-of-memory", "message": " ".join(str(e).split())[:300]})
    except RuntimeError as e:
        msg = " ".join(str(e).split())[:300]
        if not DEVICES[device].gpu or not CUDA_ERROR.search(f"{type(e).__name__} {msg}"):
            raise
        emit({"event": "bench-error", "kind": "cuda-error", "message": f"{type(e).__name__}: {msg}"})


def _call(name: str, fn):
    try:
        return fn()
    except Exception as e:  # the user's kernel
        raise BenchAbort(
            "entry-error", f"{name}: an entry raised {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        ) from None


def agreement(spec: ModelSpec, label: str, outs: list[tuple[str, dict]]) -> None:
    """Layer 0's attention output of every instance against the base's; every output finite."""
    tol = 2 * TOLERANCE[spec.dtype]
    base_name, base = outs[0]
    for name, o in outs:
        for key, t in o.items():
            if not bool(torch.isfinite(t).all()):
                raise BenchAbort("mismatch", f"{label}: {name}'s {key} holds non-finite values")
        if name == base_name or "attn0" not in o:
            continue
        rows = (-1, spec.head_dim)  # one row per (sequence, head), as the ops compare
        err = row_errors(o["attn0"].double().cpu().reshape(rows), base["attn0"].double().cpu().reshape(rows))
        if not bool((err <= tol).all()):
            raise BenchAbort(
                "mismatch",
                f"{name} and {base_name} disagree on {label}: layer 0's attention output "
                f"differs by up to {float(err.max()):.3g} (relative, per head; "
                f"tolerance {tol:g})",
            )


def _cpu_check(spec: ModelSpec, instances, job: ModelJob, emit: Emit) -> None:
    small = tiny(spec)
    point = small.serving[0]
    t0 = time.perf_counter()
    k0 = instances[0][1]
    w = st.build_weights(small, small.layers, "cpu", job.seed)
    pi = st.build_point(small, point, k0, small.layers, "cpu", job.seed)
    outs = []
    for name, k in instances:
        outs.append((name, _call(name, functools.partial(st.full_step, small, w, pi, k))))
    agreement(small, point.label, outs)
    emit(
        {
            "event": "cpu-check",
            "shape": small.shape(),
            "point": {"batch": point.batch, "context": point.context},
            "instances": [n for n, _ in instances],
            "seconds": time.perf_counter() - t0,
        }
    )


class Part:
    """One timed graph of a step, per instance, and its multiplier in the step time."""

    def __init__(self, name: str, multiplier: float, runners: list[TimedEntry]):
        self.name, self.multiplier, self.runners = name, multiplier, runners


def choose_mode(
    spec: ModelSpec, points: list[ServingPoint], k0: st.Kernels, requested: str, free: int
) -> tuple[str, int, str]:
    """-> (mode, layers built, why); `free`: the device's free memory in bytes."""
    lb, eb = st.layer_bytes(spec), st.ends_bytes(spec)
    kv = sum(st.kv_bytes(spec, p, k0) for p in points)
    need = spec.layers * (lb + kv) + eb + HEADROOM_BYTES
    fits = need <= FREE_FRACTION * free
    mode = requested if requested != "auto" else ("full" if fits else "per-layer")
    gib = 1 << 30
    why = (
        f"the whole model with the caches of every serving point needs {need / gib:.1f} GiB, {free / gib:.1f} GiB free"
    )
    built = spec.layers if mode == "full" else st.block_layers(spec, lb + kv)
    return mode, built, why


def _run(spec: ModelSpec, instances, job: ModelJob, device: str, emit: Emit) -> None:
    """The timed benchmark (run_job calls it on a GPU only; the loop itself is device-generic)."""
    seed = job.seed
    points = spec.serving
    gpu = DEVICES[device].gpu
    clock = CudaClock(job.l2_flush) if gpu else CpuClock()
    k0 = instances[0][1]
    free = torch.cuda.mem_get_info()[0] if gpu else 1 << 40
    mode, built, why = choose_mode(spec, points, k0, job.mode, free)
    t_setup = time.perf_counter()
    w = st.build_weights(spec, built, device, seed)
    emit({"event": "mode", "mode": mode, "layers_built": built, "why": why})
    shapes = []
    no_inputs = SharedInputs({})  # a step reads what it was built with (weights, caches, tokens): no kwargs
    for pi_index, p in enumerate(points):
        pi = st.build_point(spec, p, k0, built, device, seed * 1009 + pi_index)
        if mode == "full":
            spec_parts = [("step", 1.0, st.full_step)]
        else:
            spec_parts = [("layers", spec.layers / built, st.layers_part), ("ends", 1.0, st.ends_part)]
        parts = []
        for pname, mult, fn in spec_parts:
            runners = [
                TimedEntry(name, functools.partial(fn, spec, w, pi, k), no_inputs, device) for name, k in instances
            ]
            inner, timing, _ = clock.prepare(runners, no_inputs, "warm", emit, f"{p.label} {pname}")
            parts.append(Part(pname, mult, runners))
            emit(
                {
                    "event": "setup",
                    "shape": pi_index,
                    "label": p.label,
                    "part": pname,
                    "inner": inner,
                    "timing": timing,
                    "multiplier": mult,
                }
            )
        shapes.append((p, pi, parts))
    emit({"event": "setup-done", "seconds": time.perf_counter() - t_setup, "clock": clock.label})

    names = [n for n, _ in instances]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 7)

    def prepare(si: int, rnd: int) -> None:
        """Fresh tokens and hidden state; every instance runs the step once through its graph and agrees."""
        p, pi, parts = shapes[si]
        pi.tokens.random_(0, spec.vocab_size, generator=gen)
        pi.hidden.normal_(generator=gen)
        outs: list[tuple[str, dict]] = [(n, {}) for n in names]
        for part in parts:
            for i, r in enumerate(part.runners):
                outs[i][1].update({k: v.detach().clone() for k, v in r.check().items()})
        agreement(spec, f"{p.label} (round {rnd + 1}, fresh tokens)", outs)

    def time_shape(si: int, order: list[int]) -> dict[str, list[float]]:
        """One step of an instance is the sum of its parts, each after its own L2 flush, times its multiplier."""
        parts = shapes[si][2]
        return time_instances(
            names,
            order,
            job.reps,
            clock.warm_sample,
            lambda i: sum(part.multiplier * clock.sample(part.runners[i]) for part in parts),
        )

    timed_rounds(names, len(shapes), prepare, time_shape, job, lambda times: _verdict(times, names, job), emit)


def _verdict(times: dict, names: list[str], job: ModelJob):
    if len(names) < 2:
        return None
    arr = {n: geometric_mean_over_shapes(np.asarray(times[n], dtype=np.float64)) for n in names}
    base2 = arr[names[2]] if len(names) > 2 else None
    return stats.compare_trace(arr[names[0]], arr[names[1]], base2, rope=job.rope, rope_min=job.rope_min)
