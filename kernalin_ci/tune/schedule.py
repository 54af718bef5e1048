"""The race in one benchmark worker (task "tune-race"): set up once, then screening and the final race.

A race used to start one benchmark worker per screening rung and per final chunk, and each paid the
whole setup again: a new process, the inputs drawn on the CPU in float64 at every bench shape (on the
GPU's default shapes, about 340 M numbers), every instance compiled, warmed up and its CUDA graphs
captured. On the H200 that setup was about 15 s per worker while a round of timing was well under a
second, so a 15 s budget bought one final round. Here the setup (timing.setup: inputs, warm-up,
graphs, per shape and instance) is done once for the whole race; every round is still the
benchmark's own:

- fresh inputs per shape (redrawn on the device, loaded into every copy: timing.new_inputs);
- the output agreement check of every instance still in the field against the reference (the
  "base" instance) on those inputs, through the graph it is timed with; an instance that disagrees
  leaves the field (event "dropped"), the A/A copy disagreeing ends the race (BenchAbort);
- every instance of the field, the reference and its A/A copy timed back to back in a random order,
  the inputs any of them writes restored before each (clock.time_shape).

The schedule (job "race"): screening rungs while the field is larger than `finalists` (rung k times
`screen_rounds` * 2**k rounds, then race.screen keeps the better half; the first rung always runs,
later ones only before half the budget), then final chunks (`final_chunks` rounds each) of the
finalists, the reference and its A/A copy, judged after each (race.judge) until race.settled, the
budget, or the last chunk. The budget counts the setup and the rounds; the final race runs at least
`min_final_rounds` rounds (fewer give no verdict), so a budget smaller than the setup is overrun by
those rounds. The parent (tune/run.py) judges the final rounds again with the same functions.

Events, besides the benchmark's setup events: "round" (phase, field, times of the instances timed in
it), "rung" (phase, field, rounds, kept for screening, elapsed), "dropped" (name, message), and
"stopped" (reason: settled | budget | rounds | none, and the setup tally per shape).
"""

from __future__ import annotations

import random
import time

import numpy as np

from kernalin_ci.bench import stats
from kernalin_ci.bench.timing import BenchAbort, disagreements, guarded, mismatch_text, new_inputs, setup
from kernalin_ci.jobs import Emit, RaceJob
from kernalin_ci.tune import race

REFERENCE, AA = "base", "base2"  # the benchmark's names of the current config and its A/A copy


def run_job(job: RaceJob, device: str, emit: Emit) -> None:
    guarded(job, device, emit, _race)


def _race(job: RaceJob, emit: Emit, op, params, device, fns, cases) -> None:
    t0 = time.perf_counter()
    clock, shapes = setup(job, emit, op, params, device, fns, cases)
    plan = job.race
    names = [n for n, _ in fns]
    index = {n: i for i, n in enumerate(names)}
    seed, reps, budget = job.seed, job.reps, float(job.budget_s)
    rope, rope_min = job.rope, job.rope_min
    order_rng = random.Random(seed)
    field = [n for n in names if n not in (REFERENCE, AA)]
    state = {"round": 0, "rounds_s": 0.0}  # rounds run, seconds spent in them

    def elapsed() -> float:
        return time.perf_counter() - t0

    def one_round(phase: str) -> dict[str, list]:
        """One interleaved round of the reference, its A/A copy and the field -> {name: [S][reps]}."""
        per: dict[str, list] = {}
        orders = []
        t_round = time.perf_counter()
        for sh in shapes:
            new_inputs(op, params, device, sh, state["round"], seed)
            active = [index[REFERENCE], index[AA]] + [index[n] for n in field]
            for i, why in disagreements(op, sh, op.exact, active):
                message = mismatch_text(sh, i, state["round"], why)
                if names[i] == AA:
                    raise BenchAbort("mismatch", message)  # the current config disagrees with itself
                field.remove(names[i])
                per.pop(names[i], None)
                emit({"event": "dropped", "name": names[i], "message": message})
            order = [index[REFERENCE], index[AA]] + [index[n] for n in field]
            order = order_rng.sample(order, len(order))
            orders.append(order)
            got = clock.time_shape(sh, order, reps)
            for i in order:
                per.setdefault(names[i], []).append(got[names[i]])
        state["round"] += 1
        state["rounds_s"] += time.perf_counter() - t_round
        emit(
            {
                "event": "round",
                "phase": phase,
                "round": state["round"],
                "field": list(field),
                "times": per,
                "order": orders,
                "elapsed": state["rounds_s"],  # the benchmark's meaning: seconds in timing rounds
            }
        )
        return per

    def rounds(n: int, phase: str, cap: float, at_least: int = 1) -> dict[str, np.ndarray]:
        """Up to n rounds, stopped once the elapsed time reaches `cap` (at least `at_least` run)
        -> {name: [rounds, S, reps]} of the instances still in the race."""
        got: dict[str, list] = {}
        for k in range(n):
            if k >= at_least and elapsed() >= cap:
                break
            per = one_round(phase)
            for name, t in per.items():
                got.setdefault(name, []).append(t)
            if not field:
                break
        keep = {REFERENCE, AA, *field}
        return {name: np.asarray(t, dtype=np.float64) for name, t in got.items() if name in keep}

    finalists = plan.finalists
    n_rounds = plan.screen_rounds
    first = True
    while len(field) > finalists and (first or elapsed() < budget / 2):  # screening: half the budget
        first = False
        before = list(field)
        times = rounds(n_rounds, "screen", budget / 2)
        kept = race.screen(times, list(field), race.halve(len(before), finalists))
        field[:] = kept
        emit(
            {
                "event": "rung",
                "phase": "screen",
                "field": before,
                "rounds": len(times[REFERENCE]),
                "kept": kept,
                "elapsed": elapsed(),
            }
        )
        n_rounds *= 2
    reason = "rounds"
    acc: dict[str, np.ndarray] = {}
    for chunk in plan.final_chunks:
        if not field:
            reason = "none"
            break
        done = len(acc[REFERENCE]) if acc else 0
        before = list(field)
        times = rounds(chunk, "final", budget, max(1, plan.min_final_rounds - done))
        acc = {n: np.concatenate([acc[n], t]) if n in acc else t for n, t in times.items()}
        acc = {n: acc[n] for n in (REFERENCE, AA, *field)}
        emit(
            {
                "event": "rung",
                "phase": "final",
                "field": before,
                "rounds": len(times[REFERENCE]),
                "kept": list(field),
                "elapsed": elapsed(),
            }
        )
        if not field:
            reason = "none"
            break
        js = race.judge(acc, REFERENCE, AA, [REFERENCE, *field], rope=rope, rope_min=rope_min)
        if len(acc[REFERENCE]) >= stats.MIN_ROUNDS and race.settled(js):
            reason = "settled"
            break
        if elapsed() >= budget:
            reason = "budget"
            break
    emit(
        {
            "event": "stopped",
            "reason": reason,
            "rounds": state["round"],
            "elapsed": elapsed(),
            "tally": [sh.tally() for sh in shapes],
        }
    )
