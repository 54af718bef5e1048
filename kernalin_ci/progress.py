"""Progress: what a long run says while it works (the gate, verify, bench, the model benchmark, tune), through
one sink, as criterion.rs's Report does. A producer words each event once (its `text`) and hands it to a
`ProgressSink`; the sink decides where it goes. `TerminalSink` is the CLI's: the stderr lines it has
always printed. `sink_for(progress)` turns the `progress` argument of verify(), bench_pair(),
bench_model(), tune() and run_gate() (True, False/None, or a sink) into a sink.

Levels: a "step" (the gate's own lines: which kernel, its summary) shows even with --quiet; a "detail" (a
case done, a benchmark round, a tune candidate) only without it.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class ProgressEvent:
    kind: str  # what happened: "case", "note", "bench-round", "model-round", "gate", "tune", ...
    text: str  # the line for a person (its one wording)
    data: dict = field(default_factory=dict)  # the same as plain data, for sinks that are not a terminal
    level: str = "detail"  # "step" | "detail"
    # a line the next one replaces on a terminal (a benchmark round); off a terminal a transient line is
    # printed only when `keep` (the rounds the stopping rule looks at)
    transient: bool = False
    keep: bool = True


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
    """The CLI's progress: one line per event on stderr (a transient line overwrites itself on a tty);
    with quiet, only the steps."""

    def __init__(self, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.stream = stream
        self._open = False  # a transient line is on the terminal, not ended
        self._lock = threading.Lock()

    def event(self, ev: ProgressEvent) -> None:
        if self.quiet and ev.level != "step":
            return
        out = self.stream or sys.stderr
        with self._lock:
            if ev.transient and out.isatty():
                print("\r" + ev.text + "\033[K", end="", file=out, flush=True)
                self._open = True
                return
            if ev.transient and not ev.keep:
                return
            if self._open:
                print(file=out)
                self._open = False
            print(ev.text, file=out, flush=True)

    def flush(self) -> None:
        with self._lock:
            if self._open:
                print(file=self.stream or sys.stderr, flush=True)
                self._open = False


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
