"""The race's decision code: plain arrays in, plain decisions out (no processes, no clocks).

times: {name: [rounds, shapes, reps] ms per launch}, every instance timed in the same interleaved
rounds. `screen` keeps the best part of a field (successive halving); `judge` gives, per shape, the
best config, its posterior against the reference (the current config) and the configs equivalent to
it within the ROPE; `settled` says whether more rounds could still change that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kernalin_ci.bench import stats


def medians(times: dict, names: list[str]) -> np.ndarray:
    """[len(names), shapes] median ms per launch."""
    return np.stack([np.median(np.asarray(times[n], dtype=np.float64), axis=(0, 2)) for n in names])


def screen(times: dict, alive: list[str], keep: int) -> list[str]:
    """The `keep` best of `alive`: a config's score is its best rank over the shapes (a shape's winner
    is kept first), ties broken by its geometric-mean time relative to each shape's fastest."""
    if len(alive) <= keep:
        return list(alive)
    m = medians(times, alive)
    ranks = m.argsort(axis=0).argsort(axis=0)  # [configs, shapes]
    rel = np.exp(np.log(m / m.min(axis=0, keepdims=True)).mean(axis=1))
    order = sorted(range(len(alive)), key=lambda i: (int(ranks[i].min()), float(rel[i])))
    return [alive[i] for i in sorted(order[:keep])]


def halve(n: int, finalists: int) -> int:
    """How many a screening rung keeps of n: half (rounded up), never fewer than `finalists`."""
    return max(finalists, math.ceil(n / 2))


@dataclass
class ShapeJudgement:
    shape: int
    best: str
    ms: dict  # name -> median ms
    vs_reference: dict  # name -> Verdict of name against the reference
    equivalent: list[str] = field(default_factory=list)  # within the ROPE of the best (the best excluded)
    open: list[str] = field(default_factory=list)  # not yet separated from the best
    rope: float = 0.0  # half-width used between configs

    def to_json(self, labels: dict | None = None) -> dict:
        lab = labels or {}
        return {
            "shape": self.shape,
            "best": self.best,
            "best_label": lab.get(self.best, self.best),
            "ms": self.ms,
            "vs_current": {n: v.to_json() | {"posterior_hist": None} for n, v in self.vs_reference.items()},
            "equivalent": self.equivalent,
            "open": self.open,
            "rope": self.rope,
        }


def judge(
    times: dict,
    reference: str,
    aa: str | None,
    field_: list[str],
    *,
    rope: float | None = None,
    rope_min: float = stats.ROPE_MIN,
) -> list[ShapeJudgement]:
    """Per shape: each config of `field_` against `reference` (with the A/A instance `aa` for the
    noise floor), the best (reference included), and its equivalents and open rivals."""
    ref = np.asarray(times[reference], dtype=np.float64)
    a = np.asarray(times[aa], dtype=np.float64) if aa else None
    out = []
    for s in range(ref.shape[1]):
        base = ref[:, s, :]
        base2 = a[:, s, :] if a is not None else None
        vs = {
            n: stats.compare_trace(base, np.asarray(times[n])[:, s, :], base2, rope=rope, rope_min=rope_min)
            for n in field_
            if n != reference
        }
        if vs:
            half = next(iter(vs.values())).rope_half_width  # one reference and one A/A: one ROPE
        else:
            half = rope if rope is not None else rope_min
        ratio = {reference: 1.0, **{n: v.ratio for n, v in vs.items()}}
        best = min(ratio, key=lambda n: (ratio[n], n != reference))
        ms = {n: float(np.median(np.asarray(times[n])[:, s, :])) for n in ratio}
        j = ShapeJudgement(s, best, ms, vs, rope=half)
        for n in ratio:
            if n == best:
                continue
            v = stats.compare_trace(np.asarray(times[best])[:, s, :], np.asarray(times[n])[:, s, :], rope=half)
            if v.verdict == "equivalent":
                j.equivalent.append(n)
            elif v.verdict != "slower":  # "slower": n is clearly slower than the best; anything else is open
                j.open.append(n)
        out.append(j)
    return out


def settled(judgements: list[ShapeJudgement]) -> bool:
    """True when no shape has a rival still open against its best and the best's verdict against the
    reference is decided (faster, equivalent or slower)."""
    for j in judgements:
        if j.open:
            return False
        v = j.vs_reference.get(j.best)
        if v is not None and v.verdict == "inconclusive":
            return False
    return True


def overall(judgements: list[ShapeJudgement], reference: str) -> str:
    """One config for all shapes: the one that is best or equivalent to the best on the most shapes;
    ties go to the smallest geometric mean of its time relative to each shape's best."""
    names = list(judgements[0].ms)

    def score(n):
        good = sum(n == j.best or n in j.equivalent for j in judgements)
        rel = math.exp(sum(math.log(j.ms[n] / j.ms[j.best]) for j in judgements) / len(judgements))
        return (-good, rel, n != reference)

    return min(names, key=score)


def recommend(judgements: list[ShapeJudgement], reference: str) -> tuple[str, str | None]:
    """The config to adopt -> (name, a leader that was held back or None). `overall`'s pick replaces
    the reference only when its posterior says faster on at least one shape and faster or equivalent
    on every shape."""
    pick = overall(judgements, reference)
    if pick == reference:
        return pick, None
    verdicts = [j.vs_reference[pick].verdict for j in judgements]
    if "faster" in verdicts and all(v in ("faster", "equivalent") for v in verdicts):
        return pick, None
    return reference, pick
