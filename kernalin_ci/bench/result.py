"""The typed result of `bench_pair` (kernalin_ci.bench.pair): a BenchResult and its ShapeResults, and their
report.json objects (`to_json`, `from_json`). A leaf: it imports only the statistics and the trace, so the
report and the renderers read it without importing the benchmark's driver."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kernalin_ci.bench import stats
from kernalin_ci.bench.trace import Trace

CLOCK_NOTE = {
    "cpu-wall-clock": "CPU wall-clock times under the Triton interpreter: not GPU figures",
    "cuda-events": "CUDA events around CUDA-graph replays, per launch",
}


@dataclass(frozen=True)
class ShapeResult:
    """One benchmark shape of a BenchResult: the case, how it was timed and, when the run reached a
    verdict, that shape's own verdict and median times (report.json: an item of the benchmark's `shapes`)."""

    shape: str  # the case's name (its label)
    dims: dict = field(default_factory=dict)  # the case's dims, long lists as [min, max] and a `_count`
    dtype: str = ""
    inner: int | None = None  # launches per timed sample
    timing: str | None = None  # how a sample was timed (a CUDA graph, eager launches, the CPU wall clock)
    copies: int | None = None  # input buffer sets the rounds rotate through
    verdict: stats.Verdict | None = None  # this shape's head/base verdict; None: the run reached none
    base_ms: float | None = None  # median time per launch (with a verdict)
    head_ms: float | None = None

    def to_json(self) -> dict:
        d = {
            "shape": self.shape,
            "dims": self.dims,
            "dtype": self.dtype,
            "inner": self.inner,
            "timing": self.timing,
            "copies": self.copies,
        }
        if self.verdict is not None:
            d |= self.verdict.to_json() | {"base_ms": self.base_ms, "head_ms": self.head_ms}
        return d

    @classmethod
    def from_json(cls, d: dict) -> ShapeResult:
        """The typed shape of a report.json shape object (fields it lacks take their defaults)."""
        return cls(
            shape=d.get("shape", ""),
            dims=dict(d.get("dims") or {}),
            dtype=d.get("dtype", ""),
            inner=d.get("inner"),
            timing=d.get("timing"),
            copies=d.get("copies"),
            verdict=stats.Verdict.from_json(d) if d.get("verdict") is not None else None,
            base_ms=d.get("base_ms"),
            head_ms=d.get("head_ms"),
        )


@dataclass
class BenchResult:
    op: str
    base: str
    head: str
    device: str
    verdict: stats.Verdict | None = None
    shapes: list[ShapeResult] = field(default_factory=list)
    rounds: int = 0
    seconds: float = 0.0  # wall time of the whole call
    bench_seconds: float = 0.0  # time spent in timing rounds (on a GPU: GPU seconds to the verdict)
    setup_seconds: float = 0.0
    stopped: str = ""  # "verdict" | "budget" | "max-rounds" | "" (aborted)
    clock: str = ""
    l2_flush: bool | None = None
    regime: str = ""  # "warm" | "cold" (docs/benchmarking.md)
    reps: int = 0
    budget_s: float = 0.0
    error: str | None = None
    error_kind: str | None = None  # "mismatch" | "entry-error" | "timeout" | "crashed" | "cuda-error" | ...
    notes: list = field(default_factory=list)
    trace: Trace | None = None
    instances: dict = field(default_factory=dict)  # name -> [rounds, shapes, reps] ms per launch
    orders: np.ndarray | None = None  # [rounds, shapes, instances] timing order
    # the kernel-only reference (`reference` > 0; kernalin_ci/bench/kernel_time.py), per shape:
    # {"kernel_ms"|"span_ms"|"kernels": {instance: [one value per profiled replay]}, "method": ...,
    # "launch": "eager", "invalid": {instance: why its replays are no correct profile}}
    reference: list = field(default_factory=list)
    # the verdict measured when kernalin_ci.explain turned it inconclusive (the environment changed while timing)
    verdict_measured: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def to_json(self) -> dict:
        v = (
            self.verdict.to_json()
            if self.verdict
            else {
                "verdict": None,
                "ratio": None,
                "hdi": None,
                "p_faster": None,
                "p_slower": None,
                "p_equivalent": None,
                "rope": None,
            }
        )
        return {
            **v,
            "op": self.op,
            "base": self.base,
            "head": self.head,
            "device": self.device,
            "clock": self.clock,
            "clock_note": CLOCK_NOTE.get(self.clock, ""),
            "shapes": [s.to_json() for s in self.shapes],
            "rounds": self.rounds,
            "seconds": self.seconds,
            "bench_seconds": self.bench_seconds,
            "setup_seconds": self.setup_seconds,
            "stopped": self.stopped,
            "budget_s": self.budget_s,
            "l2_flush": self.l2_flush,
            "regime": self.regime,
            "reps": self.reps,
            "error": self.error,
            "error_kind": self.error_kind,
            "notes": self.notes,
        } | ({"verdict_measured": self.verdict_measured} if self.verdict_measured is not None else {})

    @classmethod
    def from_json(cls, d: dict) -> BenchResult:
        """The typed result of a report.json's `benchmark` (fields it lacks take their defaults; the raw
        times, the trace and the kernel-only reference are not in report.json)."""
        return cls(
            op=d.get("op", ""),
            base=d.get("base", ""),
            head=d.get("head", ""),
            device=d.get("device", ""),
            verdict=stats.Verdict.from_json(d) if d.get("verdict") is not None else None,
            shapes=[ShapeResult.from_json(s) for s in d.get("shapes") or []],
            rounds=d.get("rounds") or 0,
            seconds=d.get("seconds") or 0.0,
            bench_seconds=d.get("bench_seconds") or 0.0,
            setup_seconds=d.get("setup_seconds") or 0.0,
            stopped=d.get("stopped") or "",
            clock=d.get("clock") or "",
            l2_flush=d.get("l2_flush"),
            regime=d.get("regime") or "",
            reps=d.get("reps") or 0,
            budget_s=d.get("budget_s") or 0.0,
            error=d.get("error"),
            error_kind=d.get("error_kind"),
            notes=list(d.get("notes") or []),
            verdict_measured=d.get("verdict_measured"),
        )
