"""The worker supervisor: drive worker children over a list of cases, in order, restarting after a
hang or crash, and accept only the results of the cases asked for (`run_cases`); split the cases over
parallel workers (`shard`, `threads_each`); one progress line per finished case (`Progress`).
`verify()` and `verify_pipeline()` (verify/__init__.py) are its callers."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Protocol

from kernalin_ci.findings import CaseErrors, CaseVerdict, Finding, Notice
from kernalin_ci.isolate import run_task
from kernalin_ci.jobs import CasesJob
from kernalin_ci.ops.base import Case
from kernalin_ci.progress import CaseDone, CasesStarted, ProgressSink, WorkerNote, sink_for
from kernalin_ci.sandbox import CappedFolder
from kernalin_ci.verify import exchange
from kernalin_ci.verify.exchange import BadResult

MAX_RESTARTS = 8


class Progress:
    """One event per finished case (long interpreter runs need a pulse), to a ProgressSink (kernalin_ci.progress:
    `progress` is True, False or a sink)."""

    def __init__(self, progress, total: int, label: str, indices: list[int] | None = None, pending=None):
        self.sink: ProgressSink = sink_for(progress)
        self.total, self.label = total, label
        self.indices = indices  # a shard's case i is case indices[i] of the whole list
        self._pending: list = [] if pending is None else pending  # the start line, until a case starts

    def case_done(self, index: int, name: str, seconds: float, n_findings: int, note: str = "") -> None:
        if self.indices is not None:
            index = self.indices[index]
        self.sink.event(CaseDone(self.label, index, self.total, name, seconds, n_findings, note))

    def start(self, text: str) -> None:
        """The work that starts: said when the first case starts (a worker loaded the entry and took its
        signature: a user's mistake before that is the one line of its error), then repeated with its
        elapsed time while nothing else is said (kernalin_ci.progress)."""
        self._pending[:] = [text]

    def case_started(self) -> None:
        try:
            text = self._pending.pop()  # once, whichever worker starts first
        except IndexError:
            return
        self.sink.event(CasesStarted(self.label, text))

    def note(self, text: str) -> None:
        self.sink.event(WorkerNote(self.label, text))

    def subset(self, indices: list[int]) -> Progress:
        """The same events for a shard of the cases, numbered as in the whole list."""
        return Progress(self.sink, self.total, self.label, indices, self._pending)


def threads_each(workers: int) -> dict | None:
    """Workers running at once share the cores: their OpenMP pools (the float64 references)
    would otherwise each take all of them, and spin."""
    if workers <= 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}


def shard(cases: list[Case], workers: int) -> list[list[int]]:
    """Split case indices into at most `workers` groups, one dtype per group where possible.

    A case tagged repeat-of:NAME stays with NAME (the stale-result check compares them in one
    worker). Groups keep the case order; the smallest neighbours merge when there are too many."""
    unit = list(range(len(cases)))
    by_name = {c.name: i for i, c in enumerate(cases)}
    for i, c in enumerate(cases):
        for t in c.tags:
            if t.startswith("repeat-of:") and t.split(":", 1)[1] in by_name:
                unit[i] = unit[by_name[t.split(":", 1)[1]]]
    groups: dict[str, list[int]] = {}
    for i in range(len(cases)):
        groups.setdefault(cases[unit[i]].dtype, []).append(i)
    out = sorted(groups.values())
    while len(out) > max(1, workers):
        j = min(range(len(out) - 1), key=lambda k: len(out[k]) + len(out[k + 1]))
        out[j : j + 2] = [sorted(out[j] + out[j + 1])]
    return out


@dataclass
class CasesRun:
    """What the workers did with a list of cases."""

    findings: list[Finding] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    done: int = 0  # cases finished (run, moved to another shape, or not checked)
    ran: list[Case] = field(default_factory=list)  # the cases as they ran (at the shape they ran at)
    not_checked: list[tuple[str, dict]] = field(default_factory=list)  # (case name, the worker's note)
    verdicts: list[CaseVerdict] = field(default_factory=list)  # each finished case's own verdict

    def note(self, notices: list[Notice]) -> None:
        """Keep a case's notices, each once: a cause every case shares (a TF32 dot) is one notice, not one per
        case (the decode pipeline's five cases said the same TF32 notice five times)."""
        self.notices.extend(n for n in notices if n not in self.notices)


def bad_result(message: str, case: Case | None = None, repro=None) -> Finding:
    """The worker's report for a case cannot be accepted (the case is attached by `record`)."""
    return Finding(
        "worker-result",
        "bad-result",
        message,
        case=case.to_json() if case else None,
        reproduce=repro(case) if case and repro else None,
    )


@dataclass
class CaseResult:
    """The parent's reading of one case-done event: the case as it ran, its findings and notices."""

    ran: Case | None  # None: not run (not checked)
    findings: list[Finding] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    not_checked: dict | None = None  # {"shape", "reason", "error", "instead"}
    errors: CaseErrors | None = None  # the outputs' errors the judge measured (None: none compared)


class ResultReader(Protocol):
    """What run_cases reads a worker's results with (verify/judge.py's CaseReader, verify/loop_judge.py's
    PipelineReader)."""

    def __call__(self, index: int, case: Case, ev: dict, results: str) -> CaseResult:
        """A case-done event -> the case's result (results: the folder the worker wrote its files into)."""

    def part(self, index: int, case: Case, ev: dict, results: str) -> None:
        """A case-part event: one part of a case handed back in parts (a BadResult where it has none)."""

    def partial(self, index: int) -> list[Finding]:
        """The findings of the parts of case INDEX judged so far (the worker died in it)."""


def run_cases(
    job: CasesJob,
    cases: list[Case],
    device: str,
    timeout_s: float,
    progress: Progress,
    repro,
    read_case: ResultReader,
    on_other_event=None,
    env: dict | None = None,
) -> CasesRun:
    """Drive worker children over all cases, restarting after a hang or crash. JOB: the task's job, its
    cases, start and results folder filled in here for each worker.

    The parent knows which cases it asked for, in which order: each case-start and case-done event
    must name the case due next. `read_case(index, case, event, results_dir)` turns a case-done event
    into a CaseResult (verify/judge.py; results_dir is the private directory the worker writes its
    result files into); `read_case.part(...)` reads a case handed back in parts, and
    `read_case.partial(index)` gives the findings of the parts judged before the worker died. A
    result the parent cannot accept is a `bad-result` finding for that case; an event out of turn or a
    malformed one is one too and stops that worker; so is a case that ends with no result, and a file
    no event named.
    """

    run = CasesRun()
    folder = CappedFolder("kernalin-results-")  # the worker writes folder.path, this process reads folder.view
    got: set[int] = set()
    start = 0
    restarts = 0
    explained = False  # the run ended with a finding that says why the remaining cases did not run

    def record(
        i: int,
        ran: Case | None,
        found: list[Finding],
        note: str = "",
        seconds: float = 0.0,
        errors: CaseErrors | None = None,
    ) -> None:
        """Case i is finished: its findings carry the case as it ran and the command that reruns it."""
        got.add(i)
        for f in found:
            f.case = (ran or cases[i]).to_json()
            f.reproduce = repro(ran or cases[i])
        moved = ran is not None and ran.to_json() != cases[i].to_json()  # ran at another shape instead
        run.verdicts.append(
            CaseVerdict(
                cases[i].name,
                not moved and (ran is not None or bool(found)),
                tuple(f.check for f in found),
                tuple(f.bug_class for f in found),
                tuple(f.message for f in found),
                None if moved else errors,
            )
        )
        run.findings.extend(found)
        run.done += 1
        progress.case_done(i, cases[i].name, seconds, len(found), note)

    try:
        while start < len(cases):
            state = {"in_flight": None, "due": start, "refused": None}

            def refuse(why: str) -> bool:
                i = state["due"]
                if i < len(cases) and i not in got:
                    record(i, None, [bad_result(why)])
                else:
                    run.findings.append(bad_result(why))
                state["refused"] = why
                return False

            def on_event(ev):
                kind = ev.get("event")
                if kind not in ("case-start", "case-part", "case-done", "malformed"):
                    if on_other_event and kind not in ("done", "restart", "usage-error", "internal-error"):
                        on_other_event(ev)
                    return True
                if kind == "malformed":
                    return refuse(f"a malformed event from the worker: {str(ev.get('line'))[:80]!r}")
                i = ev.get("index")
                if type(i) is not int or i >= len(cases):
                    return refuse(f"an event {kind!r} for a case not asked for ({str(i)[:20]!r})")
                if i != state["due"] or (kind != "case-start" and state["in_flight"] != i):
                    return refuse(f"an event {kind!r} out of turn (case {i}; case {state['due']} was due)")
                if kind == "case-start":
                    state["in_flight"] = i
                    progress.case_started()
                    return True
                if kind == "case-part":  # a case handed back in parts (the pipeline's steps)
                    try:
                        read_case.part(i, cases[i], ev, folder.view)
                        return True
                    except BadResult as e:
                        state["in_flight"], state["due"] = None, i + 1
                        record(i, None, [bad_result(str(e))])
                        state["refused"] = str(e)
                        return False
                state["in_flight"] = None
                state["due"] = i + 1
                case = cases[i]
                try:
                    r = read_case(i, case, ev, folder.view)
                except BadResult as e:  # this case's result: a finding; the next case may still be reported
                    record(i, None, [bad_result(str(e))])
                    return True
                run.note(r.notices)
                nc = r.not_checked
                if nc:
                    run.not_checked.append((case.name, nc))
                if r.ran is not None:
                    run.ran.append(r.ran)
                note = ""
                if nc:
                    note = f"{nc.get('shape') or 'this case'}: {nc['reason']}, " + (
                        f"ran at {nc['instead']} instead" if nc.get("instead") else "not checked"
                    )
                secs = ev.get("seconds")
                record(i, r.ran, r.findings, note, float(secs) if isinstance(secs, (int, float)) else 0.0, r.errors)
                return True

            outcome = run_task(
                dataclasses.replace(job, cases=tuple(cases), start=start, results=folder.path),
                device,
                timeout_s,
                on_event,
                env=env,
                writable=(folder,),
            )
            i = state["in_flight"]
            if i is not None:  # what the dead child may have begun to write for the case in flight is not read
                for name in os.listdir(folder.view):
                    if name.startswith((f"case-{i}.", f"case-{i}-")):
                        with contextlib.suppress(OSError):
                            os.unlink(os.path.join(folder.view, name))
            left = exchange.leftovers(folder.view)
            if left:
                run.findings.append(
                    bad_result(
                        f"the worker wrote files no result named: {', '.join(left[:5])}"
                        + (" ..." if len(left) > 5 else "")
                    )
                )
            full = folder.full()
            if full:  # the worker filled its results folder: its cap ends the run (never a pass)
                if i is not None and i not in got:
                    record(i, None, [bad_result(f"case {cases[i].name!r}: {full}")])
                else:
                    run.findings.append(bad_result(full))
                progress.note(full)
                explained = True
                break
            if outcome.status == "refused":
                progress.note(f"worker stopped: {state['refused']}")
                break
            shown = run.findings or (i is not None and read_case.partial(i))
            if outcome.status == "internal-error" and i is not None and shown:
                # the kernel already misbehaved in this run (a stray write, an error): a worker failing in a
                # later case or step is the process it corrupted (the interpreter writes out of bounds into the
                # worker's own memory), so that case crashed; with no finding yet it is our bug (exit 3)
                outcome.status = "crashed"
                outcome.detail = f"the worker failed after the kernel's earlier findings: {outcome.detail}"
            outcome.raise_for_error(job.TASK)
            if outcome.status == "ok":
                break
            if outcome.status in ("timeout", "crashed"):
                if i is None and not any(e.get("event") == "case-start" for e in outcome.events):
                    # died before any case started: loading the entry itself hangs or crashes
                    run.findings.append(Finding("isolation", outcome.status, f"loading the entry: {outcome.ended()}"))
                    progress.note(f"loading the entry {outcome.status}: {outcome.detail}")
                    explained = True
                    break
                if i is None:
                    i = state["due"]
                if i >= len(cases):
                    break
                kind = outcome.status if outcome.status == "timeout" else "crashed"
                # the steps of a loop case already judged keep their findings (a stray write, then the crash)
                partial = read_case.partial(i)
                record(i, None, [*partial, Finding("isolation", kind, f"case {cases[i].name!r}: {outcome.ended()}")])
                start = i + 1
            else:  # "restart": the CUDA context was lost after the last case reported
                start = state["due"]
            restarts += 1
            if restarts > MAX_RESTARTS:
                progress.note(f"gave up after {restarts} restarts; {len(cases) - start} cases not run")
                break
    finally:
        folder.close()
    if not explained:
        for i, c in enumerate(cases):
            if i not in got:
                run.findings.append(bad_result("the worker handed back no result", c, repro))
    return run
