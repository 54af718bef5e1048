"""Kernel-only device time of the benchmark's own launches: the live evaluation's reference (issue 12).

The reference must time what the benchmark times: the same kernels on the same shared buffers and
cold-regime ring, in the same memory state (inputs restored and the L2 flushed before each replay, as
before a timed sample). So it is measured inside the benchmark worker, after the timing rounds: every
instance's `inner` launches of one sample are run `k` times more under torch.profiler, each replay
inside its own `record_function` range, and the device kernels of a replay are summed.

The launches are EAGER (outside any CUDA graph). A profiled graph replay is no better: CUPTI's durations
of graph-replayed kernels are plausible on CUDA 13.0 (an earlier reading of 1.7-2.0x the span was this
module's own attribution error, since fixed), but the profiler changes how the graph runs (on the H200,
kv_append's 1.53 us per launch became 1.73 us of span; docs/statistics.md, "Micro-kernels"). Eager
launches leave host gaps between kernels, which the kernel-only sum leaves out by construction; the
span keeps them.

Attribution of device kernels to ranges (`attribute`): by the profiler's link from a device event
to the innermost profiled host op it was launched from (`linked_correlation_id`, what
torch.profiler itself uses to give an op its CUDA time): the range itself or an op inside it (an
entry's own torch calls); for a range no device event links to, by time (a replay's kernels start
inside its range: the range ends after a device synchronize, and the flush before it is synchronized
too). Without device events (the CPU and the Triton interpreter) a range's own wall-clock duration
stands in ("wall-clock"): those are not GPU figures.

Per range: `kernel` = the sum of its kernels' device durations (kernel-only, as the issue asks),
`span` = first kernel start to last kernel end (kernels plus the gaps between them), `kernels` = how
many. Each instance's first replay of a profiling session is a warm-up, discarded (its range caught
only part of its kernels on the H200). `record` checks what holds for any correct profile of one
stream's kernels (`implausible`) and marks an instance whose replays fail it invalid, with why.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from dataclasses import dataclass

from kernalin_ci.device import DEVICES

PREFIX = "kernalin-ref/"
WARM_UP = "w"  # the label of an instance's discarded first replay
LAUNCH = "eager"  # how the reference's replays launch their kernels (recorded with it)
SLACK = 0.005  # implausible: kernel time above the span by more than this fraction ...
SLACK_NS = 64  # ... plus this (two of the H200 profiler's 32 ns timestamp steps)


@dataclass(frozen=True)
class Event:
    """One profiler event, as plain data (from a kineto event or built by hand)."""

    device: bool  # a device (GPU) event; False: a host event
    name: str
    start_ns: int
    dur_ns: int
    corr: int  # the event's own correlation id (a host range's id)
    linked: int  # a device event: the host range it was launched from (0: unknown)


@dataclass(frozen=True)
class RangeTime:
    kernel_ns: float
    span_ns: float
    kernels: int
    method: str  # "linked" | "time" | "wall-clock"


def attribute(events: list[Event], prefix: str = PREFIX) -> dict[str, RangeTime]:
    """Host ranges named prefix + label -> {label: RangeTime} (see the module docstring)."""
    ranges = [e for e in events if not e.device and e.name.startswith(prefix)]
    # a range's GPU-side annotation (its name, from its first kernel to its last) is no kernel: torch
    # without activity_type (2.11) reports it as device work (it doubled a one-kernel range's time)
    devs = sorted((e for e in events if e.device and not e.name.startswith(prefix)), key=lambda e: e.start_ns)
    dev_starts = [d.start_ns for d in devs]
    ranges.sort(key=lambda e: e.start_ns)
    starts = [r.start_ns for r in ranges]
    owner: dict[int, int] = {}  # host op id -> the range it lies in (the range itself, or an op inside it)
    for h in events:
        i = bisect.bisect_right(starts, h.start_ns) - 1
        if not h.device and i >= 0 and h.start_ns + h.dur_ns <= ranges[i].start_ns + ranges[i].dur_ns:
            owner[h.corr] = ranges[i].corr
    linked: dict[int, list[Event]] = {}
    for d in devs:
        if d.linked in owner:
            linked.setdefault(owner[d.linked], []).append(d)
    out: dict[str, RangeTime] = {}
    for r in ranges:
        label = r.name[len(prefix) :]
        if r.corr in linked:
            ks, method = linked[r.corr], "linked"
        elif devs:
            lo, hi = bisect.bisect_left(dev_starts, r.start_ns), bisect.bisect_right(dev_starts, r.start_ns + r.dur_ns)
            ks = devs[lo:hi]
            method = "time"
        else:
            out[label] = RangeTime(float(r.dur_ns), float(r.dur_ns), 0, "wall-clock")
            continue
        if ks:
            span = max(d.start_ns + d.dur_ns for d in ks) - min(d.start_ns for d in ks)
        else:
            span = 0
        out[label] = RangeTime(float(sum(d.dur_ns for d in ks)), float(span), len(ks), method)
    return out


DEVICE_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")  # device work; not "gpu_user_annotation" (a range's GPU span)
OP_KINDS = ("cpu_op", "user_annotation")  # host ops a device event can link to; not runtime calls (CUPTI ids)


def events_of(prof) -> list[Event]:
    """A finished torch.profiler.profile -> plain events (the raw kineto events: no Python parsing): device work
    and host ops; runtime calls and the GPU spans of ranges are left out."""
    from torch.autograd import DeviceType

    out = []
    for e in prof.profiler.kineto_results.events():
        on_device = e.device_type() != DeviceType.CPU
        kind = e.activity_type() if hasattr(e, "activity_type") else ("kernel" if on_device else "cpu_op")
        if kind not in (DEVICE_KINDS if on_device else OP_KINDS):
            continue
        out.append(
            Event(
                device=on_device,
                name=e.name(),
                start_ns=int(e.start_ns()),
                dur_ns=int(e.duration_ns()),
                corr=int(e.correlation_id()),
                linked=int(e.linked_correlation_id()),
            )
        )
    return out


def profile_calls(calls: list[tuple[str, Callable[[], object]]], before, device: str) -> dict[str, RangeTime]:
    """Run every (label, fn) once under the profiler, `before()` (the restore, the flush) and a synchronize
    ahead of it and outside its range, a synchronize closing each range -> {label: RangeTime}."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    gpu = DEVICES[device].gpu
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    with profile(activities=acts) as prof:
        for label, fn in calls:
            before()
            sync()
            with record_function(PREFIX + label):
                fn()
                sync()
    return attribute(events_of(prof))


def replay_plan(instances: int, k: int, rng: random.Random) -> list[tuple[int, str]]:
    """The reference's replays of one shape -> [(instance, range label)]: each instance's discarded warm-up
    replay first, then `k` rounds with the instances in a random order each time."""
    plan = [(i, f"{i}/{WARM_UP}") for i in range(instances)]
    for j in range(k):
        plan += [(i, f"{i}/{j}") for i in rng.sample(range(instances), instances)]
    return plan


def implausible(ts: list[RangeTime], inner: int) -> str | None:
    """Why the replays of one instance cannot be a correct profile of `inner` launches on one stream, else
    None: a replay without kernels, kernel counts that differ between replays or are no multiple of
    `inner` (a range that caught part of a replay), kernel time above the span (kernels that run one after
    another cannot; a device range counted as a kernel did). Wall-clock ranges are not checked."""
    if not ts:
        return "no replay recorded"
    dev = [t for t in ts if t.method != "wall-clock"]
    if not dev:
        return None
    counts = sorted({t.kernels for t in dev})
    if counts[0] == 0:
        return "a replay recorded no kernels"
    if len(counts) > 1:
        return f"kernels per replay differ ({', '.join(map(str, counts))})"
    if counts[0] % inner:
        return f"{counts[0]} kernels per replay is no multiple of inner = {inner}"
    for t in dev:
        if t.kernel_ns > t.span_ns * (1 + SLACK) + SLACK_NS:
            return f"kernel time {t.kernel_ns / 1e3:.2f} us > span {t.span_ns / 1e3:.2f} us in one replay"
    return None


def record(got: dict[str, RangeTime], names: list[str], inners: list[int], k: int) -> dict:
    """The reference of one shape from its ranges ({"<instance>/<replay>": RangeTime}; warm-ups left out):
    per instance one value per replay, in ms per launch, of `kernel_ms`, `span_ms` and `kernels`; `method`
    (how kernels were attributed: one method, or several joined by "+"); `launch`; `invalid` {instance:
    why} for those whose replays fail `implausible` (their times are kept, but must not be used)."""
    out: dict = {"kernel_ms": {}, "span_ms": {}, "kernels": {}, "method": "", "launch": LAUNCH, "invalid": {}}
    methods = set()
    for i, (n, inner) in enumerate(zip(names, inners)):
        ts = [t for t in (got.get(f"{i}/{j}") for j in range(k)) if t is not None]
        out["kernel_ms"][n] = [t.kernel_ns / inner / 1e6 for t in ts]
        out["span_ms"][n] = [t.span_ns / inner / 1e6 for t in ts]
        out["kernels"][n] = [t.kernels for t in ts]
        methods |= {t.method for t in ts}
        why = f"only {len(ts)} of {k} replays recorded" if len(ts) < k else implausible(ts, inner)
        if why:
            out["invalid"][n] = why
    out["method"] = "+".join(sorted(methods)) or "none"
    return out
