"""tune(): verify every candidate, race the survivors, return a TuneResult (parent side).

1. verification first: the current config and each candidate run `verify()` (dynamic and
   structural, on the kernel's domain) in worker children; a candidate with a finding is dropped
   and listed with it, and is never timed;
2. the race, in ONE benchmark worker (kernalin_ci/tune/schedule.py): the inputs, compiles, warm-ups
   and CUDA graphs of every survivor, the current config and its A/A copy are set up once; then
   screening (interleaved rounds of all survivors against the current config; successive halving
   keeps the better half per rung, rounds doubling per rung, until `finalists` remain; at most half
   the budget after the first rung) and the final race (the finalists and the current config in
   chunks of rounds, judged after each: `race.judge`, stopping when `race.settled` or the budget is
   spent; at least stats.MIN_ROUNDS final rounds always run, so a budget smaller than the setup is
   overrun by those). Every round checks output agreement and restores written inputs, as `bench`;
3. the final rounds are judged again here (`decide`: race.judge, race.recommend).
"""

from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kernalin_ci.bench import stats
from kernalin_ci.bench.pair import bench_pair
from kernalin_ci.device import DEVICES
from kernalin_ci.errors import UsageError
from kernalin_ci.jobs import RaceSchedule
from kernalin_ci.progress import (
    CandidateDropped,
    CandidateVerified,
    ProgressSink,
    RaceRung,
    RaceSetUp,
    TuneStarted,
    TuneVerified,
    sink_for,
)
from kernalin_ci.report.text import finding_line, not_shown_faster_text
from kernalin_ci.tune import race
from kernalin_ci.tune.space import Candidate, Space, TuneSpec, build_space, candidate_source
from kernalin_ci.verify import verify

FINALISTS = 3
SCREEN_ROUNDS = 2
FINAL_CHUNKS = (10, 20, 40, 80, 160)  # rounds per final chunk: the race looks after each


@dataclass
class Target:
    """The kernel to tune: an op, an entry, its params, domain and bench params."""

    op: str
    entry: str
    root: str
    params: dict = field(default_factory=dict)
    domain: dict = field(default_factory=dict)
    dtype: str | None = None
    bench: dict = field(default_factory=dict)
    name: str = ""


@dataclass
class Checked:
    candidate: Candidate
    passed: bool | None  # None: not checked (why in `note`)
    findings: list = field(default_factory=list)  # Finding
    structural: str = ""
    seconds: float = 0.0
    note: str = ""

    def finding_lines(self) -> list[str]:
        """One line per finding, those with a source location first."""
        return [finding_line(f) for f in sorted(self.findings, key=lambda f: f.location is None)]

    def to_json(self) -> dict:
        return {
            **self.candidate.to_json(),
            "passed": self.passed,
            "note": self.note,
            "findings": [f.to_json() for f in self.findings],
            "finding_lines": self.finding_lines(),
            "structural": self.structural,
            "seconds": self.seconds,
        }


@dataclass
class TuneResult:
    target: Target
    device: str
    space: Space
    checked: list[Checked] = field(default_factory=list)
    reference: str | None = None  # the instance the race is judged against ("current" when it verified)
    shapes: list = field(default_factory=list)  # [{"shape", "dims", "dtype"}]
    judgements: list = field(default_factory=list)  # race.ShapeJudgement per shape
    rungs: list = field(default_factory=list)  # [{"field", "rounds", "kept", "seconds"}]
    final_rounds: int = 0
    chosen: str | None = None  # one config for every shape (race.overall)
    # "settled" | "budget" | "rounds" (every final chunk ran) | "failed" (the benchmark could not finish)
    # | "single" (one verified config, nothing to race) | "none" (no verified candidate)
    stopped: str = ""
    verify_seconds: float = 0.0
    race_seconds: float = 0.0  # timing rounds and bench setup (GPU time on a GPU)
    seconds: float = 0.0
    budget_s: float = 0.0
    clock: str = ""
    notes: list = field(default_factory=list)
    timed: list = field(default_factory=list)  # every config that ran in a timing round
    # where the race's time went: its benchmark workers ("workers": 1), their setup ("seconds") and rounds
    # ("rounds", "round_seconds"), and per shape the setups ("setups": 1 each), the inputs made
    # ("inputs_made": op.inputs calls, 1 each for a built-in op) and the CUDA graphs captured
    race_setup: dict = field(default_factory=dict)

    def label(self, name: str | None) -> str:
        if name is None:
            return "-"
        if name == "current":
            if self.space.current.params:
                return f"current ({self.space.current.label})"
            at = self.space.autotuned
            return f"current (the autotuner over {len(at['configs'])} configs)" if at else "current"
        c = next((c for c in self.space.candidates if c.name == name), None)
        return c.label if c else name

    @property
    def dropped(self) -> list[Checked]:
        return [c for c in self.checked if c.passed is False and c.candidate.name != "current"]


def tune(
    target: Target,
    spec: TuneSpec,
    device: str,
    *,
    budget_s: float | None = None,
    rope_min: float = stats.ROPE_MIN,
    rope: float | None = None,
    finalists: int = FINALISTS,
    reps: int | None = None,
    seed: int = 0,
    timeout_s: float | None = None,
    jobs: int | None = None,
    progress: bool | ProgressSink = True,
    discovered: list | None = None,
) -> TuneResult:
    t0 = time.perf_counter()
    sink = sink_for(progress)

    say = sink.event

    budget_s = budget_s if budget_s is not None else DEVICES[device].tune_budget_s
    if budget_s <= 0:
        raise UsageError("--budget-s must be positive")
    if finalists < 1:
        raise UsageError("--finalists must be at least 1")
    root = str(Path(target.root).resolve())
    space = build_space(spec, target.entry, root, device, timeout_s or 120.0, discovered)
    result = TuneResult(target, device, space, budget_s=budget_s)
    auto = space.autotuned
    say(
        TuneStarted(
            target.name or target.entry,
            len(space.candidates),
            _param_values(space),
            device,
            (len(auto["configs"]), auto["kernel"]) if auto else None,
        )
    )
    with tempfile.TemporaryDirectory(prefix="kernalin-tune-") as tmp:
        os.chmod(tmp, 0o755)  # read by the kernel workers' sandbox user (uid 65534 under root)
        entries = {"current": target.entry}
        for c in space.candidates:
            path = Path(tmp, f"candidate_{c.name}.py")
            path.write_text(candidate_source(target.entry, root, c))
            entries[c.name] = f"{path}:entry"
        t_verify = time.perf_counter()
        result.checked = _verify_all(
            target, space, entries, root, device, timeout_s, jobs or DEVICES[device].tune_verify_jobs, say
        )
        result.verify_seconds = time.perf_counter() - t_verify
        survivors = [c.candidate.name for c in result.checked if c.passed and c.candidate.name != "current"]
        current_ok = any(c.passed for c in result.checked if c.candidate.name == "current")
        dropped = len(result.dropped)
        unchecked = sum(c.passed is None and c.candidate.name != "current" for c in result.checked)
        say(TuneVerified(len(survivors), len(space.candidates), dropped, unchecked, result.verify_seconds))
        for c in result.dropped:
            say(CandidateDropped(c.candidate.label, c.finding_lines()[0] if c.findings else c.note))
        for c in result.checked:
            if c.passed is None and c.candidate.name != "current":
                say(CandidateDropped(c.candidate.label, c.note, raced=False))
        if not current_ok:
            cur = next(c for c in result.checked if c.candidate.name == "current")
            result.notes.append(
                "the current config is not a baseline: "
                + (cur.note if cur.passed is None else f"it fails verification ({cur.finding_lines()[0]})")
            )
        field_ = (["current"] if current_ok else []) + survivors
        if not survivors:
            result.stopped = "none"
            result.notes.append("no candidate passed verification: nothing to race")
        elif len(field_) == 1:
            result.stopped = "single"
            result.reference = result.chosen = field_[0]
            result.notes.append("one verified config and no verified current config: chosen without timing")
        else:
            _race(
                result,
                target,
                entries,
                root,
                field_,
                device,
                budget_s,
                rope,
                rope_min,
                finalists,
                reps or DEVICES[device].tune_reps,
                seed,
                timeout_s,
                say,
            )
    result.seconds = time.perf_counter() - t0
    return result


def _param_values(space: Space) -> dict:
    out: dict = {}
    for c in space.candidates:
        for k, v in c.params.items():
            out.setdefault(k, [])
            if v not in out[k]:
                out[k].append(v)
    return out


def _verify_all(
    target: Target, space: Space, entries: dict, root: str, device: str, timeout_s, jobs: int, say
) -> list[Checked]:

    todo = [space.current] + space.candidates

    def one(c: Candidate):
        if c.name == "current" and space.autotuned is not None and DEVICES[device].interpreted:
            return None, 0.0
        t = time.perf_counter()
        r = verify(
            target.op,
            entries[c.name],
            target.params,
            device,
            dtype=target.dtype,
            root=root,
            timeout_s=timeout_s,
            progress=False,
            raw_domain=target.domain or None,
        )
        seconds = time.perf_counter() - t
        first = finding_line(r.findings[0]) if r.findings else None
        say(CandidateVerified(c.name, c.label, seconds, first, r.cases_run > 0))
        return r, seconds

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        raw = list(pool.map(one, todo))
    current = raw[0][0]
    return [judge_verification(c, r, sec, current if c.name != "current" else None) for c, (r, sec) in zip(todo, raw)]


def judge_verification(c: Candidate, r, seconds: float = 0.0, current=None) -> Checked:
    """A config's verification result -> Checked. It passes only when verified at least as well as the
    current config (CURRENT: its VerifyResult; None for the current config itself, or when it was not
    checked): no finding, some case ran, no shape refused that the current config serves, and the
    compiled IR analysed wherever the current config's was. Anything less is never a pass: a finding
    fails it (dropped); nothing run, or less checked than the current config, is "not checked" (not raced)."""
    if r is None:
        return Checked(
            c,
            None,
            note="the full autotuner cannot time configs under the Triton interpreter (CPU): not checked, not raced",
        )
    ck = Checked(c, not r.findings, list(r.findings), r.structural.summary(), seconds)
    if r.findings:
        return ck
    if not r.cases_run:
        ck.passed, ck.note = None, "no verification case ran (" + _not_checked_text(r) + ")"
        return ck
    if current is None:
        return ck
    current_refuses = {n.shape for n in current.not_checked if n.reason == "unsupported"}
    refused = [n for n in r.not_checked if n.reason == "unsupported" and n.shape not in current_refuses]
    if refused:
        ck.passed = False
        ck.note = (
            f"refuses {len(refused)} shape{'s' * (len(refused) != 1)} the current config serves: "
            f"at {refused[0].shape}: {' '.join(refused[0].error.split())[:200]}"
        )
    elif current.structural.status == "analysed" and r.structural.status != "analysed":
        ck.passed = None
        ck.note = f"structural {r.structural.summary()}, where the current config's was analysed"
    return ck


def _not_checked_text(r) -> str:
    if r.not_checked:
        n = r.not_checked[0]
        return f"{n.reason} at {n.shape}" + (f": {' '.join(n.error.split())[:120]}" if n.error else "")
    return "no case planned"


def decide(result: TuneResult, acc: dict, reference: str, alive: list[str], rope, rope_min) -> str | None:
    """Judge the field still in the race (the reference and `alive`; a config dropped since is never
    judged, so never chosen) on the timing record `acc`; set result.judgements and result.chosen
    -> a leader held back (race.recommend), or None."""
    result.judgements = race.judge(acc, reference, "base2", [reference, *alive], rope=rope, rope_min=rope_min)
    if reference == "current":
        result.chosen, held = race.recommend(result.judgements, reference)
        return held
    result.chosen = race.overall(result.judgements, reference)  # the current config failed verification
    return None


def _race(
    result: TuneResult,
    target: Target,
    entries: dict,
    root: str,
    field_: list[str],
    device: str,
    budget_s: float,
    rope,
    rope_min,
    finalists: int,
    reps: int,
    seed: int,
    timeout_s,
    say,
) -> None:
    """The race in one benchmark worker (kernalin_ci/tune/schedule.py): set up once, screened, then the
    final rounds, which are judged here (decide) with the same functions the worker stopped on."""

    reference, first = field_[0], field_[1]
    result.reference = reference
    alive = field_[1:]
    config = {"base": reference, "head": first}  # the benchmark's instance names -> configs
    final: dict[str, list] = {}  # config (and "base2", the A/A copy) -> one [S, reps] per final round
    tally: list = []

    def on_event(ev: dict) -> None:
        nonlocal alive
        kind = ev.get("event")
        if kind == "setup":  # one per shape and benchmark worker
            setups = result.race_setup.setdefault("setups", [])
            setups += [0] * (ev["shape"] + 1 - len(setups))
            setups[ev["shape"]] += 1
        elif kind == "setup-done":
            result.race_setup["workers"] = result.race_setup.get("workers", 0) + 1
            result.race_setup["seconds"] = result.race_setup.get("seconds", 0.0) + ev["seconds"]
            say(RaceSetUp(len(field_) + 1, ev["seconds"]))
        elif kind == "round":
            times = {config.get(n, n): t for n, t in ev["times"].items()}
            result.timed += [n for n in times if n != "base2" and n not in result.timed]
            if ev["phase"] == "final":
                for n, t in times.items():
                    final.setdefault(n, []).append(t)
        elif kind == "rung":
            before = [config.get(n, n) for n in ev["field"]]
            kept = [config.get(n, n) for n in ev["kept"]]
            if ev["phase"] == "screen":
                result.rungs.append({"field": before, "rounds": ev["rounds"], "kept": kept})
                say(RaceRung(False, len(before), len(kept), ev["rounds"], ev["elapsed"], budget_s, reference))
            else:
                say(RaceRung(True, len(before), len(kept), ev["rounds"], ev["elapsed"], budget_s, reference))
            alive = [n for n in alive if n in kept]
        elif kind == "dropped":
            bad = config.get(ev["name"], ev["name"])
            ck = next(c for c in result.checked if c.candidate.name == bad)
            ck.passed = False
            ck.note = f"outputs disagree with {reference} in the benchmark: {ev['message']}"
            say(CandidateDropped(ck.candidate.label, ck.note))
            alive = [n for n in alive if n != bad]
        elif kind == "stopped":
            tally[:] = ev.get("tally") or []

    r = bench_pair(
        target.op,
        entries[reference],
        entries[first],
        root,
        root,
        {**target.params, **target.bench},
        device,
        budget_s=budget_s,
        rope_min=rope_min,
        rope=rope,
        reps=reps,
        seed=seed,
        timeout_s=timeout_s,
        progress=on_event,
        extra=[(n, entries[n], root) for n in field_[2:]],
        race=RaceSchedule(
            finalists=finalists,
            screen_rounds=SCREEN_ROUNDS,
            final_chunks=tuple(FINAL_CHUNKS),
            min_final_rounds=stats.MIN_ROUNDS,
        ),
    )
    result.clock = r.clock
    result.shapes = [{"shape": s.shape, "dims": s.dims, "dtype": s.dtype} for s in r.shapes]
    result.race_seconds = r.setup_seconds + r.bench_seconds
    result.race_setup.update(
        rounds=r.rounds,
        round_seconds=r.bench_seconds,
        inputs_made=[t["inputs_made"] for t in tally],
        graph_captures=[t["graph_captures"] for t in tally],
    )
    held = None
    if final.get(reference):
        acc = {n: np.asarray(final[n], dtype=np.float64) for n in (reference, "base2", *alive)}
        result.final_rounds = int(acc[reference].shape[0])
        held = decide(result, acc, reference, alive, rope, rope_min)
    if r.failed:
        result.notes.append(f"the race stopped: the benchmark failed ({r.error_kind}): {r.error}")
        result.stopped = "failed"
    else:
        result.stopped = r.stopped  # settled | budget | rounds | none
    if held is not None:
        verdicts = [j.vs_reference[held].verdict for j in result.judgements]
        result.notes.append(not_shown_faster_text(result.label(held), verdicts))
    if not result.judgements and alive:
        result.notes.append("the race produced no judgement (the benchmark failed before the final rounds)")
