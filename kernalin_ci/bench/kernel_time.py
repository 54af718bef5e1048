"""Kernel-only device time of the benchmark's own replays: the live evaluation's reference (issue 12).

The reference must time what the benchmark times: the same CUDA graphs (the same kernels, the
same shared buffers, the same cold-regime ring), in the same memory state (the same L2 flush
before each replay). So it is measured inside the benchmark worker, after the timing rounds:
every instance's timing graph is replayed `k` times more under torch.profiler, each replay
inside its own `record_function` range, and the device kernels of a replay are summed.

Attribution of device kernels to ranges (`attribute`): by the profiler's link from a device event
to the innermost profiled host op it was launched from (`linked_correlation_id`, what
torch.profiler itself uses to give an op its CUDA time): the range itself (a graph replay) or an
op inside it (an eager entry's own torch calls); for a range no device event links to,
by time (a replay's kernels start inside its range: the range ends after a device synchronize,
and the flush before it is synchronized too). Without device events (the CPU and
the Triton interpreter) a range's own wall-clock duration stands in ("wall-clock"): those are not
GPU figures.

Per range: `kernel` = the sum of its kernels' device durations (kernel-only, as the issue asks),
`span` = first kernel start to last kernel end (kernels plus the gaps between them, what the
CUDA events of a sample hold apart from the event overhead), `kernels` = how many.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

PREFIX = "kernalin-ref/"


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
    devs = [e for e in events if e.device]
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
            ks = [d for d in devs if r.start_ns <= d.start_ns <= r.start_ns + r.dur_ns]
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


def profile_calls(calls: list[tuple], before, device: str) -> dict[str, RangeTime]:
    """Run every (label, fn[, before]) once under the profiler, its `before()` (the restore, the flush; the
    shared `before` where it has none) ahead of it and outside its range, a synchronize closing each range
    -> {label: RangeTime}."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with profile(activities=acts) as prof:
        for label, fn, *own in calls:
            (own[0] if own else before)()
            sync()
            with record_function(PREFIX + label):
                fn()
                sync()
    return attribute(events_of(prof))
