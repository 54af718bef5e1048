"""The timing loop, run inside the worker child (task "bench"; see kernalin_ci/kernel_worker.py).

Instances: the base entry, the head entry and a second, separately loaded copy of
the base (from a copy of its tree) for the A/A noise floor; more may follow (the
GPU benchmark script records extra variants).

Shared buffers. Per shape, every instance is timed on the SAME input buffers (and,
on a GPU, its timing graph is captured into one memory pool shared by the
instances of that shape, so identical code also gets identical output and scratch
addresses). With a copy of the inputs per instance, each instance had its own
memory placement, and on a 2 us kernel a placement offset of 0.5-1.5% is larger than
the A/A floor: identical code was called `slower` (issue 12). Inputs an instance
writes (a KV cache, an in-place rotation) are restored from the master copy before
every other instance runs, so each instance starts from the same data.

Regimes (`regime`): `warm` times `inner` back-to-back launches on the same inputs
after one L2 flush per sample (launches 2..inner find the inputs in L2); `cold`
gives every input tensor enough copies to span COLD_L2_MULTIPLE x the L2, and at least enough for
COLD_L2_MULTIPLE x the L2 of the bytes a launch moves by the op's model (a kernel that touches a few
rows of a large cache); at most `inner` copies, the device's `cold_max_bytes` in all. Launch j of a sample reads copy
j mod n of each, so every launch reads memory that is not in L2.

Setup (`setup`), once per worker: per shape the inputs (op.inputs, once), every instance bound to
them, warmed up, its CUDA graphs captured and `inner` chosen. tune's race (task "tune-race",
kernalin_ci/tune/schedule.py) does this once for all its screening rungs and final chunks.

Per round and shape:

1. fresh inputs: every floating-point input is redrawn in place from a seeded
   generator on the device (the op's generator built the initial tensors, so
   lengths, tables, positions and slots keep the op's structure; `custom`
   ops call their own `inputs()` with a new seed instead), then loaded into
   every copy;
2. output agreement: each instance runs once on the fresh inputs, through the
   same CUDA graph mechanism it is timed with, and every output must agree with
   the base's within twice the op's tolerance (both sides carry up to one
   tolerance of error; kv_append is compared bit for bit). A kernel that skips
   work when captured or timed, returns a cached result, or works on another
   stream leaves stale outputs behind and is caught here;
3. timing: the instances are timed back to back in a random order, the inputs
   any of them writes restored before each; each does one discarded warm-up
   sample, then `reps` samples.

A CUDA sample is one replay of a CUDA graph of `inner` launches between two CUDA
events on the launching stream, preceded (by default) by an L2 flush and
followed by a device synchronize; `inner` is chosen so one sample lasts about
1 ms, far above the few microseconds of launch overhead. Should an entry not be
capturable (a host sync inside, say), every instance of that shape is timed
eagerly instead, with a device synchronize before the start event and another
before the end event, so work on other streams lies wholly inside the interval. On the CPU the same loop runs with a
wall clock (the Triton interpreter): those figures are not GPU figures.

With job "reference": k the worker, after its rounds, profiles k more replays of every instance's
`inner` launches, launched eagerly on the same buffers and ring (the kernel-only reference of
benchmarks/live_eval.py; kernalin_ci/bench/kernel_time.py).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

import torch

from kernalin_ci.bench import kernel_time, stats
from kernalin_ci.bench.regime import REGIMES
from kernalin_ci.device import CPU, CUDA, DEVICES
from kernalin_ci.entry import load_entry
from kernalin_ci.jobs import BenchJob, Emit, TimedJob
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import TOLERANCE, Case, Op
from kernalin_ci.runtime.cuda_errors import CUDA_ERROR
from kernalin_ci.runtime.poison import bits
from kernalin_ci.runtime.rows import row_errors

MAX_INNER = 10000
L2_FLUSH_BYTES = 256 << 20  # several times the L2 of any current GPU (H100: 50 MB, H200: 60 MB)
COLD_L2_MULTIPLE = 2  # cold: each input tensor's copies span at least this many L2 sizes


class BenchAbort(Exception):
    """Stops the benchmark: outputs disagree, or an entry raised."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# ------------------------------------------------------------------ inputs


def clone_inputs(kw: dict) -> dict:
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


def copy_into(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, torch.Tensor):
            if dst[k].shape != v.shape or dst[k].dtype != v.dtype:
                raise BenchAbort(
                    "input-shape",
                    f"input {k!r} changed shape between rounds ({tuple(dst[k].shape)} -> {tuple(v.shape)})",
                )
            dst[k].copy_(v)


def refresh(kw: dict, gen: torch.Generator) -> None:
    """Redraw every floating-point input in place (standard normal, like the op generators)."""
    for v in kw.values():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            v.normal_(generator=gen)


def l2_bytes(device: str) -> int:
    """The device's L2 size (torch.cuda.get_device_properties), else a nominal one."""
    dev = DEVICES[device]
    if dev.gpu:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return int(getattr(props, "L2_cache_size", 0) or dev.l2_bytes)
    return dev.l2_bytes


def cold_copies(
    sizes: dict[str, int], launches: int, l2: int, max_bytes: int, touched: int | None = None
) -> dict[str, int]:
    """Copies per input tensor (name -> bytes) for the cold regime: enough to span COLD_L2_MULTIPLE x l2,
    at most `launches`, scaled down together when their total would exceed max_bytes (at least 1).
    `touched`: the bytes one launch moves by the op's model (Op.traffic). A launch that reads or writes only
    part of a large tensor (a few rows of a KV cache) would find that part in L2 again after two copies;
    every tensor gets at least enough copies for COLD_L2_MULTIPLE x l2 of launches to pass in between."""
    least = math.ceil(COLD_L2_MULTIPLE * l2 / touched) if touched else 1
    n = {k: max(1, min(launches, max(least, math.ceil(COLD_L2_MULTIPLE * l2 / max(b, 1))))) for k, b in sizes.items()}
    total = sum(n[k] * sizes[k] for k in sizes)
    if total > max_bytes:
        scale = max_bytes / total
        n = {k: max(1, int(n[k] * scale)) for k in n}
    return n


class SharedInputs:
    """One shape's input buffers, shared by every instance.

    `kw` is what checks and warm launches read; `ring[j]` is what launch j of a
    sample reads (warm: always `kw`; cold: copy j mod n of each tensor). `written`
    names the inputs some instance changed (found by the checks); they are
    restored from `master` before each instance is timed.
    """

    def __init__(self, master: dict):
        self.master = master
        self.kw = clone_inputs(master)
        self.copies = {k: [v] for k, v in self.kw.items() if isinstance(v, torch.Tensor)}
        self.ring = [self.kw]
        self.written: set[str] = set()

    def make_ring(self, regime: str, launches: int, device: str, touched: int | None = None) -> dict[str, int]:
        """Build the cold copies (nothing for warm) -> copies per tensor (`touched`: see cold_copies)."""
        if regime != "cold":
            return {k: 1 for k in self.copies}
        sizes = {k: v[0].numel() * v[0].element_size() for k, v in self.copies.items()}
        n = cold_copies(sizes, launches, l2_bytes(device), DEVICES[device].cold_max_bytes, touched)
        for k, c in self.copies.items():
            c += [c[0].clone() for _ in range(n[k] - 1)]
        self.ring = [{**self.kw, **{k: c[j % len(c)] for k, c in self.copies.items()}} for j in range(launches)]
        return n

    def load(self) -> None:
        """Every copy of every input := master (after the round's fresh draw)."""
        for k, c in self.copies.items():
            for t in c:
                _copy(t, self.master[k], k)

    def restore(self) -> None:
        """Undo what an instance wrote: the written inputs (every copy) := master."""
        for k in self.written:
            for t in self.copies[k]:
                t.copy_(self.master[k])

    def note_writes(self) -> None:
        """After a check: remember every input whose buffer no longer equals master."""
        for k, c in self.copies.items():
            if k not in self.written and not torch.equal(bits(c[0]), bits(self.master[k])):
                self.written.add(k)


def _copy(dst, src, name: str) -> None:
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise BenchAbort(
            "input-shape", f"input {name!r} changed shape between rounds ({tuple(dst.shape)} -> {tuple(src.shape)})"
        )
    dst.copy_(src)


def disagreement(op: Op, case: Case, inputs: dict, ref: dict, got: dict, exact: bool) -> str | None:
    """None when `got` agrees with `ref` (the base's outputs on `inputs`), else what differs."""
    tol = 2 * TOLERANCE.get(case.dtype, TOLERANCE["float32"])
    for name, r in ref.items():
        g = got.get(name)
        if not isinstance(g, torch.Tensor) or g.shape != r.shape:
            return (
                f"output {name!r}: shape {tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__}"
                f" vs the base's {tuple(r.shape)}"
            )
        if exact:
            diff = bits(g) != bits(r)
            if bool(diff.any()):
                return f"output {name!r}: {int(diff.sum())} of {diff.numel()} elements differ bit for bit"
            continue
        finite_r, finite_g = torch.isfinite(r), torch.isfinite(g)
        if bool((finite_r != finite_g).any()):
            return f"output {name!r}: {int((finite_r != finite_g).sum())} elements finite on one side only"
        err = row_errors(torch.where(finite_g, g, 0).double(), torch.where(finite_r, r, 0).double())
        bad = ~(err <= tol)
        if bool(bad.any()):
            worst = int(torch.where(bad, err, torch.zeros_like(err)).argmax())
            where = op.row_label(case, inputs, name, worst)
            return (
                f"output {name!r}: {int(bad.sum())} of {bad.numel()} rows differ by more than {tol:g} "
                f"(relative; worst {float(err[worst]):.3g} at {where})"
            )
    return None


# ------------------------------------------------------------------ one instance on one shape


class TimedEntry:
    """An instance's entry bound to its shape's shared inputs; `check()` runs it once, `sample()` times it."""

    def __init__(self, name: str, fn, inputs: SharedInputs, device: str):
        self.name, self.fn, self.inputs, self.device = name, fn, inputs, DEVICES[device]
        self.graph_check = self.graph_time = None
        self.check_ret = None
        self.inner = 1
        self.out_ptrs: tuple = ()  # addresses of the timing graph's outputs (shared-pool diagnostics)
        self.captures = 0  # CUDA graphs captured (setup work: the race's tally, tune/schedule.py)

    @property
    def kw(self) -> dict:
        return self.inputs.kw

    def call(self, kw: dict | None = None):
        try:
            return self.fn(**(self.kw if kw is None else kw))
        except Exception as e:  # the user's kernel
            raise BenchAbort(
                "entry-error", f"{self.name}: the entry raised {type(e).__name__}: {' '.join(str(e).split())[:300]}"
            ) from None

    def launches(self, raw: bool = False):
        """The `inner` launches of one sample, each on its ring entry; returns the last return value.
        raw: the entry's own exceptions pass through (inside a graph capture)."""
        ring = self.inputs.ring
        call = (lambda kw: self.fn(**kw)) if raw else self.call
        ret = None
        for j in range(self.inner):
            ret = call(ring[j % len(ring)])
        return ret

    def warm_up(self, calls: int = 3) -> None:
        if self.device.gpu:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(calls):
                    self.call()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
        else:
            for _ in range(min(calls, 1)):
                self.call()

    def capture(self, body, pool=None):
        self.captures += 1
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            ret = body()
        torch.cuda.synchronize()
        return g, ret

    def check(self):
        """One launch on the current inputs; returns what the entry returned."""
        if self.graph_check is not None:
            self.graph_check.replay()
            torch.cuda.synchronize()
            return self.check_ret
        ret = self.call()
        if self.device.gpu:
            torch.cuda.synchronize()
        return ret


def _tensor_ptrs(ret) -> tuple:
    items = ret if isinstance(ret, (tuple, list)) else (ret,)
    return tuple(t.data_ptr() for t in items if isinstance(t, torch.Tensor))


def time_shape(clock, sh: Shape, order: list[int], reps: int) -> dict[str, list[float]]:
    """One round of one shape: the instances in `order`, the inputs they write restored before each
    (what an earlier instance wrote; its checks found out what), a discarded warm-up sample where the
    clock has one, then `reps` samples -> {instance: [ms per launch]}."""
    names = [r.name for r in sh.runners]
    return time_instances(
        names, order, reps, clock.warm_sample, lambda i: clock.sample(sh.runners[i]), sh.inputs.restore
    )


class CudaClock:
    label = "cuda-events"
    warm_sample = True  # one discarded sample per instance and round: the first runs 0.5-2.4% slow on a GPU

    def __init__(self, l2_flush: bool):
        self.flush_buf = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda") if l2_flush else None
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def prepare(
        self, runners: list[TimedEntry], inputs: SharedInputs, regime: str, emit, label: str, touched: int | None = None
    ) -> tuple[int, str, dict]:
        """Warm up, capture graphs (or fall back to eager for all), choose inner, build the cold copies.
        -> (inner, timing, copies per input)."""
        for r in runners:
            r.warm_up()
        timing = "cuda-graph"
        try:
            for r in runners:
                r.graph_check, r.check_ret = r.capture(lambda r=r: r.fn(**r.kw))
        except Exception as e:
            timing = "eager"
            note = " ".join(str(e).split())[:200]
            emit(
                {
                    "event": "note",
                    "message": f"{label}: CUDA graph capture failed ({type(e).__name__}: {note}); "
                    f"every instance is timed eagerly",
                }
            )
            for r in runners:
                r.graph_check = r.check_ret = None
            torch.cuda.synchronize()
        per_launch = self._per_launch(runners[0], timing)
        inner = max(1, min(MAX_INNER, math.ceil(CUDA.sample_s / max(per_launch, 1e-9))))
        copies = inputs.make_ring(regime, inner, "cuda", touched)
        pool = torch.cuda.graph_pool_handle()  # one pool per shape: identical code, identical addresses
        for r in runners:
            r.inner = inner
            if timing == "cuda-graph":
                r.graph_time, ret = r.capture(lambda r=r: r.launches(raw=True), pool)
                r.out_ptrs = _tensor_ptrs(ret)
                del ret  # freed into the shared pool: the next instance's capture reuses the same memory
            emit({"event": "setup-step", "message": f"{label}: {r.name} ready"})
        return inner, timing, copies

    def _per_launch(self, r: TimedEntry, timing: str) -> float:
        n = 20
        for _ in range(3):
            r.check()
        self.start.record()
        for _ in range(n):
            if timing == "cuda-graph":
                r.graph_check.replay()
            else:
                r.call()
        self.end.record()
        torch.cuda.synchronize()
        return self.start.elapsed_time(self.end) / 1e3 / n

    def time_shape(self, sh, order: list[int], reps: int) -> dict[str, list[float]]:
        return time_shape(self, sh, order, reps)

    def flush(self) -> None:
        if self.flush_buf is not None:
            self.flush_buf.zero_()

    def sample(self, r: TimedEntry) -> float:
        """Milliseconds per launch."""
        self.flush()
        if r.graph_time is None:
            # eager calls may launch on another stream, which would not wait for the flush on this
            # one and could start before the start event: nothing may run before the interval
            torch.cuda.synchronize()
        self.start.record()
        if r.graph_time is not None:
            r.graph_time.replay()
        else:
            r.launches()
            torch.cuda.synchronize()  # work on other streams counts too
        self.end.record()
        torch.cuda.synchronize()
        return self.start.elapsed_time(self.end) / r.inner


class CpuClock:
    label = "cpu-wall-clock"
    warm_sample = False  # an interpreter call is long; nothing to warm

    def __init__(self, l2_flush: bool = False):
        pass

    def prepare(
        self, runners: list[TimedEntry], inputs: SharedInputs, regime: str, emit, label: str, touched: int | None = None
    ) -> tuple[int, str, dict]:
        for r in runners:
            r.warm_up()
            emit({"event": "setup-step", "message": f"{label}: {r.name} ready"})
        t0 = time.perf_counter()
        runners[0].call()
        per_launch = time.perf_counter() - t0
        inner = max(1, min(MAX_INNER, math.ceil(CPU.sample_s / max(per_launch, 1e-9))))
        copies = inputs.make_ring(regime, inner, "cpu", touched)
        for r in runners:
            r.inner = inner
        return inner, "wall-clock", copies

    def time_shape(self, sh, order: list[int], reps: int) -> dict[str, list[float]]:
        return time_shape(self, sh, order, reps)

    def flush(self) -> None:
        pass

    def sample(self, r: TimedEntry) -> float:
        t0 = time.perf_counter()
        r.launches()
        return (time.perf_counter() - t0) * 1e3 / r.inner


# ------------------------------------------------------------------ the job


class Shape:
    def __init__(self, case: Case, inputs: SharedInputs, runners: list[TimedEntry], gen: torch.Generator):
        self.case, self.inputs, self.runners, self.gen = case, inputs, runners, gen
        self.inner, self.timing, self.copies = 1, "", {}
        self.inputs_made = 1  # op.inputs calls for this shape: the setup's, and a custom op's redraws

    def tally(self) -> dict:
        """The setup work done for this shape so far: inputs made (op.inputs calls), graphs captured."""
        return {"inputs_made": self.inputs_made, "graph_captures": sum(r.captures for r in self.runners)}

    @property
    def master(self) -> dict:
        return self.inputs.master


def run_job(job: BenchJob, device: str, emit: Emit) -> None:
    """Worker task "bench": emits setup / round / stopped events (or bench-error)."""
    guarded(job, device, emit, _run)


def guarded(job: BenchJob, device: str, emit: Emit, body: Callable[..., None]) -> None:
    """Load the job's op, entries and cases and run `body(job, emit, op, params, device, fns, cases)`; a
    benchmark that cannot finish (outputs disagree, an entry raised, out of memory, a CUDA error) ends
    with a bench-error event."""
    op = get_op(job.op, root=job.instances[0].root)
    params = job.params
    fns = [(i.name, load_entry(i.entry, i.root)) for i in job.instances]
    cases = list(job.cases)
    try:
        body(job, emit, op, params, device, fns, cases)
    except BenchAbort as e:
        emit({"event": "bench-error", "kind": e.kind, "message": str(e)})
    except torch.cuda.OutOfMemoryError as e:
        emit({"event": "bench-error", "kind": "out-of-memory", "message": " ".join(str(e).split())[:300]})
    except RuntimeError as e:  # an illegal address in a graph replay poisons the context: report and end
        msg = " ".join(str(e).split())[:300]
        if not DEVICES[device].gpu or not CUDA_ERROR.search(f"{type(e).__name__} {msg}"):
            raise
        emit({"event": "bench-error", "kind": "cuda-error", "message": f"{type(e).__name__}: {msg}"})


def setup(job: BenchJob, emit: Emit, op, params, device, fns, cases) -> tuple:
    """Once per benchmark worker: the clock, and per shape the shared inputs (op.inputs, once) and every
    instance bound to them and prepared by the clock (warm-up, CUDA graphs, inner, cold copies); emits a
    setup event per shape and setup-done. -> (clock, [Shape])."""
    clock = (CudaClock if DEVICES[device].gpu else CpuClock)(job.l2_flush)
    regime = job.regime
    if regime not in REGIMES:
        raise BenchAbort("usage", f"regime must be one of {', '.join(REGIMES)}, got {regime!r}")
    seed = job.seed
    shapes: list[Shape] = []
    t_setup = time.perf_counter()
    for si, case in enumerate(cases):
        inputs = SharedInputs(op.inputs(case, params, device, poison=False))
        gen = torch.Generator(device=device)
        gen.manual_seed(seed * 1_000_003 + si)
        runners = [TimedEntry(name, fn, inputs, device) for name, fn in fns]
        sh = Shape(case, inputs, runners, gen)
        traffic = op.traffic(case, params)
        touched = traffic.bytes if traffic is not None else None
        sh.inner, sh.timing, sh.copies = clock.prepare(runners, inputs, regime, emit, case.name, touched)
        shapes.append(sh)
        # the A/A pair (base, base2): identical code in one shared pool gets identical output addresses
        same = runners[0].out_ptrs == runners[2].out_ptrs if len(runners) > 2 and runners[0].out_ptrs else None
        emit(
            {
                "event": "setup",
                "shape": si,
                "label": case.name,
                "inner": sh.inner,
                "timing": sh.timing,
                "copies": max(sh.copies.values(), default=1),
                "same_output_addresses": same,
            }
        )
    emit({"event": "setup-done", "seconds": time.perf_counter() - t_setup, "clock": clock.label})
    return clock, shapes


def new_inputs(op, params, device, sh: Shape, rnd: int, seed: int) -> None:
    """A round's fresh inputs for one shape: redrawn into the master in place (a custom op builds new
    ones), then loaded into every copy the instances read."""
    _fresh_inputs(op, params, device, sh, rnd, seed)
    sh.inputs.load()


def _run(job: BenchJob, emit: Emit, op, params, device, fns, cases) -> None:
    clock, shapes = setup(job, emit, op, params, device, fns, cases)
    seed = job.seed
    exact = op.exact  # kv_append: whole caches, bit for bit
    names = [n for n, _ in fns]
    reps = job.reps

    def prepare(si: int, rnd: int) -> None:
        new_inputs(op, params, device, shapes[si], rnd, seed)
        _check_agreement(op, shapes[si], exact, rnd)

    def time_shape(si: int, order: list[int]) -> dict[str, list[float]]:
        return clock.time_shape(shapes[si], order, reps)

    def on_stop(rng: random.Random) -> None:
        if job.reference:
            _reference(shapes, clock, job.reference, rng, device, emit)

    timed_rounds(names, len(shapes), prepare, time_shape, job, lambda times: _verdict(times, names, job), emit, on_stop)


def time_instances(
    names: list[str],
    order: list[int],
    reps: int,
    warm_sample: bool,
    sample: Callable[[int], float],
    before: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """One round of one shape: the instances in `order`, each (after `before()`) one discarded warm-up
    sample where the clock has one, then `reps` samples of `sample(instance)` -> {name: [ms]}."""
    got = {}
    for i in order:
        if before is not None:
            before()
        if warm_sample:
            sample(i)  # warm-up sample, discarded
        got[names[i]] = [sample(i) for _ in range(reps)]
    return got


def timed_rounds(
    names: list[str],
    n_shapes: int,
    prepare: Callable[[int, int], None],
    time_shape: Callable[[int, list[int]], dict[str, list[float]]],
    job: TimedJob,
    verdict: Callable[[dict], stats.Verdict | None],
    emit,
    on_stop: Callable[[random.Random], None] | None = None,
) -> None:
    """The interleaved rounds of every benchmark (task "bench" and the model's "model-bench"), until the
    verdict, the budget or max_rounds. Per round and shape: `prepare(shape, round)` (fresh inputs, the
    output agreement check), then `time_shape(shape, order)` with the instances in a random order
    (time_instances: warm-up sample, `reps` samples). After every round: the `round` event (times
    [shapes][reps] per instance, the orders, the elapsed seconds, `verdict(times)`), and at a look the
    adaptive stop; at the end `on_stop(the order's random generator)`, then the `stopped` event."""
    budget = float(job.budget_s)
    max_rounds = job.max_rounds or 1 << 30
    adaptive = job.adaptive
    order_rng = random.Random(job.seed)
    times: dict[str, list] = {n: [] for n in names}  # per instance: list of [S, reps] per round
    elapsed = 0.0
    rnd = 0
    while True:
        t0 = time.perf_counter()
        per: dict[str, list] = {n: [] for n in names}
        orders = []
        for si in range(n_shapes):
            prepare(si, rnd)
            order = order_rng.sample(range(len(names)), len(names))
            orders.append(order)
            got = time_shape(si, order)
            for n in names:
                per[n].append(got[n])
        for n in names:
            times[n].append(per[n])
        rnd += 1
        elapsed += time.perf_counter() - t0
        v = verdict(times)
        emit(
            {
                "event": "round",
                "round": rnd,
                "times": per,
                "order": orders,
                "elapsed": elapsed,
                "verdict": v.to_json() if v else None,
            }
        )
        reason = None
        if adaptive and v is not None and stats.is_look(rnd) and stats.should_stop(v.verdict, v.rope_source):
            reason = "verdict"
        elif elapsed >= budget:
            reason = "budget"
        elif rnd >= max_rounds:
            reason = "max-rounds"
        if reason:
            if on_stop is not None:
                on_stop(order_rng)
            emit({"event": "stopped", "reason": reason, "rounds": rnd, "elapsed": elapsed})
            return


def _reference(shapes: list[Shape], clock, k: int, rng: random.Random, device: str, emit) -> None:
    """The kernel-only reference (kernalin_ci/bench/kernel_time.py): per shape, every instance's `inner`
    launches of one sample, launched eagerly (outside any CUDA graph: the profiler changes how a graph
    runs; kernel_time.py) on the same buffers and ring, the inputs restored and the L2 flushed before each
    replay as before a timed sample, under torch.profiler: a discarded warm-up replay per instance, then
    `k` replays of each, the instances in a random order each time."""

    for si, sh in enumerate(shapes):
        plan = kernel_time.replay_plan(len(sh.runners), k, rng)
        calls = [(label, lambda r=sh.runners[i]: r.launches()) for i, label in plan]

        def before(sh=sh):
            sh.inputs.restore()
            clock.flush()

        try:
            got = kernel_time.profile_calls(calls, before, device)
        except Exception as e:  # the profiler is a diagnostic: its failure must not end the benchmark
            msg = " ".join(str(e).split())[:200]
            emit({"event": "note", "message": f"{sh.case.name}: reference not measured ({type(e).__name__}: {msg})"})
            return
        names = [r.name for r in sh.runners]
        rec = kernel_time.record(got, names, [r.inner for r in sh.runners], k)
        emit({"event": "reference", "shape": si, **rec})


def _fresh_inputs(op, params, device, sh: Shape, rnd: int, seed: int) -> None:
    if op.redraws(params):
        refresh(sh.master, sh.gen)
    else:
        c = sh.case
        new = op.inputs(
            Case(c.name, c.dims, c.dtype, c.seed * 7919 + rnd + 1 + seed, c.tags), params, device, poison=False
        )
        sh.inputs_made += 1
        copy_into(sh.master, new)


def _check_agreement(op, sh: Shape, exact: bool, rnd: int) -> None:
    bad = disagreements(op, sh, exact)
    if bad:
        i, why = bad[0]
        raise BenchAbort("mismatch", mismatch_text(sh, i, rnd, why))


def mismatch_text(sh: Shape, i: int, rnd: int, why: str) -> str:
    """Why runner I's outputs are not the base's (runner 0) on SH's inputs of round RND."""
    return (
        f"{sh.runners[i].name} and {sh.runners[0].name} disagree on shape {sh.case.name} "
        f"(round {rnd + 1}, fresh inputs): {why}"
    )


def disagreements(op, sh: Shape, exact: bool, active: list[int] | None = None) -> list[tuple[int, str]]:
    """The output agreement check on the current inputs: each instance of `active` (runner indices, the
    base first; default all) runs once through its check graph, the inputs it writes restored before
    each, and every output is compared with the base's -> [(index, what differs)] of those that disagree."""
    active = list(range(len(sh.runners))) if active is None else active
    outs = []
    for i in active:
        r = sh.runners[i]
        sh.inputs.restore()
        ret = r.check()
        sh.inputs.note_writes()
        try:
            o = op.outputs(ret, r.kw)
        except TypeError as e:
            raise BenchAbort("wrong-output", f"{r.name}: {e}") from None
        outs.append({k: v.detach().clone() for k, v in o.items() if isinstance(v, torch.Tensor)})
    bad = []
    for i, o in zip(active[1:], outs[1:]):
        why = disagreement(op, sh.case, sh.master, outs[0], o, exact)
        if why:
            bad.append((i, why))
    return bad


def _verdict(times: dict, names: list[str], job: TimedJob):
    """The overall verdict after this round, from the same function that decides the final verdicts."""
    if len(names) < 2:
        return None
    import numpy as np

    arr = {n: np.asarray(times[n], dtype=np.float64) for n in names}
    base2 = arr[names[2]] if len(names) > 2 else None
    overall, _ = stats.compare_run(arr[names[0]], arr[names[1]], base2, rope=job.rope, rope_min=job.rope_min)
    return overall
