"""Progress goes through one sink (kernalin_ci/progress.py): producers hand typed events, the terminal
sink words them and prints the lines the CLI has always printed, --quiet keeps only the gate's steps."""

from __future__ import annotations

import io
from pathlib import Path

from kernalin_ci.bench.stats import Verdict
from kernalin_ci.progress import (
    BenchRound,
    CaseDone,
    CasesStarted,
    CollectSink,
    GateStep,
    ModelRound,
    NullSink,
    TerminalSink,
    sink_for,
)
from kernalin_ci.verify import verify
from kernalin_ci.verify.supervisor import Progress

ROPE = Path(__file__).resolve().parents[1] / "checks" / "rope"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_terminal_prints_case_lines_as_before_and_quiet_keeps_the_steps():
    out = io.StringIO()
    sink = TerminalSink(stream=out)
    Progress(sink, 12, "rope").subset([3, 4]).case_done(1, "long-tail", 0.25, 2, "slow")
    Progress(sink, 12, "rope").note("worker stopped: refused")
    assert out.getvalue().splitlines() == [
        "  rope [5/12] long-tail: FAIL (2 findings); slow (0.2 s)",
        "  rope worker stopped: refused",
    ]
    quiet = io.StringIO()
    q = TerminalSink(quiet=True, stream=quiet)
    q.event(CaseDone("rope", 0, 1, "a", 0.1, 0))
    q.event(GateStep("a step"))
    assert quiet.getvalue() == "kernalin-ci run: a step\n"


def test_a_benchmark_round_overwrites_itself_on_a_tty_and_prints_only_its_looks_elsewhere():
    rounds = [BenchRound(i, 0.5, "cpu-wall-clock", look=i in (5, 6)) for i in range(4, 8)]
    pipe = io.StringIO()
    sink = TerminalSink(stream=pipe)
    for ev in rounds:
        sink.event(ev)
    sink.flush()
    assert pipe.getvalue() == "  bench round 5 (0.5 s cpu-wall-clock)\n  bench round 6 (0.5 s cpu-wall-clock)\n"
    tty = _Tty()
    sink = TerminalSink(stream=tty)
    for ev in rounds:
        sink.event(ev)
    # a line after a round ends the round's line
    sink.event(GateStep("next"))
    sink.event(rounds[0])
    sink.flush()
    assert tty.getvalue() == (
        "".join(f"\r  bench round {i} (0.5 s cpu-wall-clock)\033[K" for i in range(4, 8))
        + "\nkernalin-ci run: next\n\r  bench round 4 (0.5 s cpu-wall-clock)\033[K\n"
    )


def test_progress_arguments_mean_a_sink():
    c = CollectSink()
    assert sink_for(c) is c and isinstance(sink_for(False), NullSink) and isinstance(sink_for(None), NullSink)
    assert isinstance(sink_for(True), TerminalSink) and not sink_for(True).quiet


def test_verify_reports_each_case_to_the_sink_it_is_given():
    sink = CollectSink()
    r = verify("rope", f"{ROPE / 'correct_neox.py'}:entry", {"style": "neox"}, "cpu", probe=True, progress=sink)
    cases = [e for e in sink.events if isinstance(e, CaseDone)]
    assert len(cases) == r.cases_run >= 1
    first = cases[0]
    assert TerminalSink().line(first).text.startswith(f"  rope [1/{r.cases_run}] {first.case}: ok (")
    assert first.findings == 0 and first.label == "rope"


def test_the_terminal_words_a_rounds_verdict():
    v = Verdict("faster", 0.969, (0.965, 0.973), 0.99, 0.0, 0.01, (0.995, 1.005), 24, "minimum")
    t = TerminalSink()
    assert t.line(BenchRound(24, 3.25, "cuda-events", v)).text == (
        "  bench round 24 (3.2 s cuda-events): head/base 0.9690 [0.9650, 0.9730]  P(faster) 0.99  P(eq) 0.01  "
        "P(slower) 0.00  -> faster"
    )
    assert (
        t.line(ModelRound(8, 1.0, v)).text
        == "  model round 8 (1.0 s): step head/base 0.9690 [0.9650, 0.9730] -> faster"
    )


def test_long_work_is_never_silent_in_a_ci_log_nor_on_a_terminal():
    import re
    import time

    # a CI log: plain lines, no control characters, the activity repeated after each heartbeat of silence
    log = io.StringIO()
    sink = TerminalSink(stream=log, heartbeat_s=0.3)
    sink.event(GateStep("compiling", working=True))
    time.sleep(1.05)
    sink.event(GateStep("done"))
    time.sleep(0.5)  # the work is over: no more heartbeats
    lines = log.getvalue().splitlines()
    assert lines[0] == "kernalin-ci run: compiling" and lines[-1] == "kernalin-ci run: done", lines
    beats = lines[1:-1]
    assert 2 <= len(beats) <= 4 and all(
        re.fullmatch(r"kernalin-ci run: compiling \(still working, \d s\)", b) for b in beats
    )
    assert not re.search(r"[\x00-\x09\x0b-\x1f]", log.getvalue())
    # a terminal: the activity is a status line at the bottom, redrawn in place with its time; a case line
    # takes its place and the status line comes back under it
    tty = _Tty()
    sink = TerminalSink(stream=tty, heartbeat_s=0.3)
    sink.event(CasesStarted("rope", "3 cases in 1 worker"))
    time.sleep(0.4)
    sink.event(CaseDone("rope", 0, 3, "a", 0.1, 0))
    time.sleep(0.4)
    sink.flush()
    text = tty.getvalue()
    assert "\n" not in text.split("  rope [1/3] a: ok (0.1 s)")[0]  # no status line left behind above the case
    assert re.search(r"\r  rope 3 cases in 1 worker \(0 s\)\x1b\[K\r\x1b\[K  rope \[1/3\] a: ok \(0.1 s\)\n", text), (
        text
    )
    assert text.endswith("\n") and text.count("  rope 3 cases in 1 worker (") >= 2
