"""Progress: what a long run says while it works (the gate, verify, bench, the model benchmark, tune), through
one sink, as criterion.rs's Report does. A producer hands a typed event (one dataclass per kind: `GateStep`,
`CaseDone`, `BenchRound`, ...; plain data, no wording) to a `ProgressSink`; the sink decides where it goes and
how it reads. `TerminalSink` is the CLI's: it words each kind of event once (`TerminalSink.line`), the stderr
lines it has always printed. `sink_for(progress)` turns the `progress` argument of verify(), bench_pair(),
bench_model(), tune() and run_gate() (True, False/None, or a sink) into a sink.

Levels: a step (`GateStep`: the gate's own lines, which kernel, its summary) shows even with --quiet; every
other event (a case done, a benchmark round, a tune candidate) only without it.

Long work is never silent, and fits both a terminal and a CI log: an activity (`GateStep` with `working`,
`CasesStarted`, `BenchSetup`) names the work that goes on from then (starting the workers, compiling base and
head); until the next line, `TerminalSink` redraws it in place once a second with its elapsed time on a
terminal, and off a terminal (a CI log: plain lines, no control characters) repeats it with its elapsed time
after every HEARTBEAT_S of silence.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class GateStep:
    """A step of the gate: which kernel, its summary, what it starts (shown with --quiet too). `working`: long
    work goes on from it (an activity)."""

    message: str
    working: bool = False


@dataclass(frozen=True)
class KernelExplained:
    """One line of a kernel's explanation (kernalin_ci.explain), after the gate's summary of that kernel."""

    kernel: str
    line: str


@dataclass(frozen=True)
class CasesStarted:
    """verify's workers took their first case (`what`: how many cases in how many workers); an activity."""

    label: str  # the op, or the pipeline
    what: str


@dataclass(frozen=True)
class CaseDone:
    """One case of verify finished (`index` counts from 0 in the whole list of `total`)."""

    label: str
    index: int
    total: int
    case: str
    seconds: float
    findings: int
    note: str = ""


@dataclass(frozen=True)
class WorkerNote:
    """Something verify's worker supervisor says (a worker stopped, restarted)."""

    label: str
    note: str


@dataclass(frozen=True)
class BenchSetup:
    """What the benchmark sets up (the shapes, one by one); an activity."""

    what: str


@dataclass(frozen=True)
class BenchRound:
    """A benchmark round done: its number, the seconds timed so far, the clock and the verdict so far (a
    kernalin_ci.bench.stats.Verdict, or None before there is one). `look`: a round the stopping rule looks at."""

    round: int
    seconds: float
    clock: str
    verdict: Any = None
    look: bool = True


@dataclass(frozen=True)
class ModelRound:
    """A round of the model benchmark the stopping rule looks at: the step time's verdict so far (a Verdict)."""

    round: int
    seconds: float
    verdict: Any


@dataclass(frozen=True)
class TuneStarted:
    """`kernalin-ci tune` starts: its candidates, the values of each tuned param, the autotune configs."""

    target: str
    candidates: int
    params: dict  # param -> the values the candidates take
    device: str
    autotune: tuple[int, str] | None = None  # (configs, kernel) of a tuned @triton.autotune kernel


@dataclass(frozen=True)
class CandidateVerified:
    """One candidate verified: `finding` is its first finding's line (None: no finding), `ran` whether any
    case ran."""

    name: str
    label: str
    seconds: float
    finding: str | None = None
    ran: bool = True


@dataclass(frozen=True)
class TuneVerified:
    """Every candidate verified: how many pass, were dropped, were not checked."""

    passed: int
    candidates: int
    dropped: int
    unchecked: int
    seconds: float


@dataclass(frozen=True)
class CandidateDropped:
    """A candidate leaves the field (a finding, or outputs that disagree in the race): why, in one line."""

    label: str
    why: str
    raced: bool = True  # False: not checked as well as the current config, so never raced


@dataclass(frozen=True)
class RaceSetUp:
    """The race's benchmark worker set up its instances."""

    instances: int
    seconds: float


@dataclass(frozen=True)
class RaceRung:
    """A rung of the race: screening (`final` False: `kept` of `configs` go on) or the final rounds against the
    reference."""

    final: bool
    configs: int
    kept: int
    rounds: int
    seconds: float
    budget_s: float
    reference: str


ProgressEvent = (
    GateStep
    | KernelExplained
    | CasesStarted
    | CaseDone
    | WorkerNote
    | BenchSetup
    | BenchRound
    | ModelRound
    | TuneStarted
    | CandidateVerified
    | TuneVerified
    | CandidateDropped
    | RaceSetUp
    | RaceRung
)


@dataclass(frozen=True)
class Line:
    """How the terminal shows an event: its text, whether it is a step of the gate (else a detail), the work
    that goes on from it (`activity`), and a line the next replaces on a terminal (`transient`; off a terminal
    printed only when `keep`)."""

    text: str
    step: bool = False
    activity: bool = False
    transient: bool = False
    keep: bool = True


HEARTBEAT_S = 10.0  # off a terminal: a "still working" line after this much silence, at most one per period


@runtime_checkable
class ProgressSink(Protocol):
    def event(self, ev: ProgressEvent) -> None:
        """Report EV (called from the caller's threads: verify runs shards side by side)."""

    def flush(self) -> None:
        """End what is pending (a transient line on a terminal): the caller's own output follows."""


class NullSink:
    """Nothing is reported (progress=False, the catalogue, tune's inner verifications)."""

    def event(self, ev: ProgressEvent) -> None:
        pass

    def flush(self) -> None:
        pass


class TerminalSink:
    """The CLI's progress: one line per event on stderr; with quiet, only the steps. On a terminal a transient
    line (a benchmark round) overwrites itself and the current activity is a status line at the bottom, redrawn
    with its elapsed time; off a terminal every line is plain and an activity is repeated after each
    heartbeat_s of silence (module docstring)."""

    def __init__(self, quiet: bool = False, stream=None, heartbeat_s: float = HEARTBEAT_S):
        self.quiet = quiet
        self.stream = stream
        self.heartbeat_s = heartbeat_s
        self._open: str | None = None  # on a terminal, an unended line: "transient" or "activity"
        self._lock = threading.Lock()
        self._activity: tuple[str, float] | None = None  # (its line, when it started)
        self._said = time.monotonic()  # when the last line (or heartbeat) was written
        self._ticker: threading.Thread | None = None

    def line(self, ev: ProgressEvent) -> Line:
        """EV in the CLI's words: the one wording of each kind of progress event."""
        if isinstance(ev, GateStep):
            return Line(f"kernalin-ci run: {ev.message}", step=True, activity=ev.working)
        if isinstance(ev, KernelExplained):
            return Line(f"kernalin-ci run:       {ev.line}")
        if isinstance(ev, CasesStarted):
            return Line(f"  {ev.label} {ev.what}", activity=True)
        if isinstance(ev, CaseDone):
            n = ev.findings
            status = "ok" if n == 0 else f"FAIL ({n} finding{'s' * (n != 1)})"
            if ev.note:
                status = ev.note if n == 0 else f"{status}; {ev.note}"
            return Line(f"  {ev.label} [{ev.index + 1}/{ev.total}] {ev.case}: {status} ({ev.seconds:.1f} s)")
        if isinstance(ev, WorkerNote):
            return Line(f"  {ev.label} {ev.note}")
        if isinstance(ev, BenchSetup):
            return Line(f"  bench: {ev.what}", activity=True)
        if isinstance(ev, BenchRound):
            text = f"  bench round {ev.round} ({ev.seconds:.1f} s {ev.clock})"
            if ev.verdict is not None:
                v = ev.verdict
                text += (
                    f": head/base {v.ratio:.4f} [{v.hdi[0]:.4f}, {v.hdi[1]:.4f}]  P(faster) {v.p_faster:.2f}  "
                    f"P(eq) {v.p_equivalent:.2f}  P(slower) {v.p_slower:.2f}  -> {v.verdict}"
                )
            return Line(text, transient=True, keep=ev.look)
        if isinstance(ev, ModelRound):
            v = ev.verdict
            return Line(
                f"  model round {ev.round} ({ev.seconds:.1f} s): step head/base {v.ratio:.4f} "
                f"[{v.hdi[0]:.4f}, {v.hdi[1]:.4f}] -> {v.verdict}"
            )
        return Line(_tune_text(ev))

    def event(self, ev: ProgressEvent) -> None:
        ln = self.line(ev)
        if self.quiet and not ln.step:
            return
        out = self.stream or sys.stderr
        tty = out.isatty()
        with self._lock:
            if ln.activity:
                self._activity = (ln.text, time.monotonic())
                if self._ticker is None:
                    self._ticker = threading.Thread(target=self._tick, name="progress-heartbeat", daemon=True)
                    self._ticker.start()
            elif ln.transient or ln.step:
                self._activity = None  # a live display of its own, or the gate's next step: that work is over
            if tty and (ln.transient or ln.activity):
                if ln.activity and self._open == "transient":
                    print(file=out)  # keep the last round on screen
                print("\r" + ln.text + "\033[K", end="", file=out, flush=True)
                self._open = "activity" if ln.activity else "transient"
                return
            if ln.transient and not ln.keep:
                return
            if self._open == "transient":
                print(file=out)
            elif self._open == "activity":  # the status line gives way, and is redrawn under this line
                print("\r\033[K", end="", file=out)
            self._open = None
            print(ln.text, file=out, flush=True)
            self._said = time.monotonic()

    def _tick(self) -> None:
        while True:
            time.sleep(min(1.0, self.heartbeat_s / 4))
            out = self.stream or sys.stderr
            with self._lock:
                if self._activity is None:
                    continue
                text, since = self._activity
                now = time.monotonic()
                if out.isatty():
                    if self._open != "transient":
                        print(f"\r{text} ({now - since:.0f} s)\033[K", end="", file=out, flush=True)
                        self._open = "activity"
                elif now - self._said >= self.heartbeat_s:
                    print(f"{text} (still working, {now - since:.0f} s)", file=out, flush=True)
                    self._said = now

    def flush(self) -> None:
        with self._lock:
            self._activity = None
            if self._open:
                print(file=self.stream or sys.stderr, flush=True)
                self._open = None


def _tune_text(ev) -> str:
    """The lines of `kernalin-ci tune` (TerminalSink.line)."""
    if isinstance(ev, TuneStarted):
        space = [f"{k} in {v}" for k, v in ev.params.items()]
        if ev.autotune:
            space.append(f"{ev.autotune[0]} autotune configs of {ev.autotune[1]}")
        return f"tune {ev.target}: {ev.candidates} candidates ({'; '.join(space)}) on {ev.device}"
    if isinstance(ev, CandidateVerified):
        status = f"FAIL: {ev.finding}" if ev.finding else "ok" if ev.ran else "nothing ran"
        return f"  verify {ev.name} ({ev.label}): {status} ({ev.seconds:.1f} s)"
    if isinstance(ev, TuneVerified):
        unchecked = f", {ev.unchecked} not checked" if ev.unchecked else ""
        return (
            f"verified: {ev.passed} of {ev.candidates} candidates pass, {ev.dropped} dropped{unchecked} "
            f"({ev.seconds:.1f} s)"
        )
    if isinstance(ev, CandidateDropped):
        return f"  {'dropped' if ev.raced else 'not raced'} {ev.label}: {ev.why}"
    if isinstance(ev, RaceSetUp):
        return f"  benchmark set up for the race: {ev.instances} instances ({ev.seconds:.1f} s)"
    if ev.final:  # RaceRung
        return (
            f"  final race of {ev.configs} configs and {ev.reference}: {ev.rounds} rounds "
            f"({ev.seconds:.1f} of {ev.budget_s:g} s budget)"
        )
    return (
        f"  screening {ev.configs} configs: {ev.rounds} rounds, kept {ev.kept} "
        f"({ev.seconds:.1f} of {ev.budget_s:g} s budget)"
    )


class CollectSink:
    """Keeps every event (tests, and callers that show progress their own way)."""

    def __init__(self):
        self.events: list[ProgressEvent] = []

    def event(self, ev: ProgressEvent) -> None:
        self.events.append(ev)

    def flush(self) -> None:
        pass


def sink_for(progress) -> ProgressSink:
    """The sink a `progress` argument means: True the terminal, False or None nothing, a sink itself."""
    if isinstance(progress, ProgressSink):
        return progress
    return TerminalSink() if progress is True else NullSink()
