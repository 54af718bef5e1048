"""Progress: what a long run says while it works (the gate, verify, bench, the model benchmark, tune), through
one sink, as criterion.rs's Report does. A producer words each event once (its `text`) and hands it to a
`ProgressSink`; the sink decides where it goes. `TerminalSink` is the CLI's: the stderr lines it has
always printed. `sink_for(progress)` turns the `progress` argument of verify(), bench_pair(),
bench_model(), tune() and run_gate() (True, False/None, or a sink) into a sink.

Levels: a "step" (the gate's own lines: which kernel, its summary) shows even with --quiet; a "detail" (a
case done, a benchmark round, a tune candidate) only without it.

Long work is never silent, and fits both a terminal and a CI log: an event marked `activity` names the work
that goes on from then (starting the workers, compiling base and head); until the next line, `TerminalSink`
redraws it in place once a second with its elapsed time on a terminal, and off a terminal (a CI log: plain
lines, no control characters) repeats it with its elapsed time after every HEARTBEAT_S of silence.
"""

from __future__ import annotations

import sys
import threading
import time
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
    # the work that goes on from this line on: a sink may repeat it with its elapsed time while nothing else
    # is said (TerminalSink: HEARTBEAT_S off a terminal, every second on one)
    activity: bool = False


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

    def event(self, ev: ProgressEvent) -> None:
        if self.quiet and ev.level != "step":
            return
        out = self.stream or sys.stderr
        tty = out.isatty()
        with self._lock:
            if ev.activity:
                self._activity = (ev.text, time.monotonic())
                if self._ticker is None:
                    self._ticker = threading.Thread(target=self._tick, name="progress-heartbeat", daemon=True)
                    self._ticker.start()
            elif ev.transient or ev.level == "step":
                self._activity = None  # a live display of its own, or the gate's next step: that work is over
            if tty and (ev.transient or ev.activity):
                if ev.activity and self._open == "transient":
                    print(file=out)  # keep the last round on screen
                print("\r" + ev.text + "\033[K", end="", file=out, flush=True)
                self._open = "activity" if ev.activity else "transient"
                return
            if ev.transient and not ev.keep:
                return
            if self._open == "transient":
                print(file=out)
            elif self._open == "activity":  # the status line gives way, and is redrawn under this line
                print("\r\033[K", end="", file=out)
            self._open = None
            print(ev.text, file=out, flush=True)
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
