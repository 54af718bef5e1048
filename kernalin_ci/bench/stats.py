"""Bayesian bootstrap verdicts on interleaved timing rounds (numpy only).

The unit of replication is the round: in every round base, head and (when
present) a second, separately built base instance were timed back to back in a
random order, `reps` samples each. Per round we keep one robust location per
instance (the median of its samples), and per round the paired log ratios

    d_r = log(head_r / base_r)        a_r = log(base2_r / base_r)   (A/A)

A Bayesian bootstrap (Rubin 1981) puts Dirichlet(1, ..., 1) weights on the
rounds; each weight vector gives one posterior draw of the mean log ratio, so
`D @ W.T` yields the whole posterior of many traces at once. The same weights
serve the A/A pair, so the noise floor and the verdict see the same rounds.

Verdict against the region of practical equivalence (ROPE) [1 - rho, 1 + rho]:
`slower` / `faster` when >= 95% of the posterior lies beyond it on that side,
`equivalent` when >= 95% lies inside, else `inconclusive`. rho is fixed by the
caller (`--rope`) or max(rope_min, FLOOR_MULTIPLE * floor), where the floor is
the farthest edge of the A/A pair's 95% HDI from 1: how far two identical
builds appear apart at this number of rounds; a shape row of a multi-shape run has a
minimum of at least SHAPE_ROPE_MIN (row_minima). docs/statistics.md justifies the
constants from the H200 traces and live runs.

This module computes plain estimates; rendering lives elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

CONFIDENCE = 0.95  # posterior mass a verdict needs, and the HDI mass
ROPE_MIN = 0.005  # default user minimum half-width of the ROPE (0.5%)
SHAPE_ROPE_MIN = 0.01  # a shape row of a multi-shape run: at least this (row_minima; docs/statistics.md)
FLOOR_MULTIPLE = 1.0  # ROPE >= this multiple of the A/A floor (docs/statistics.md)
MIN_ROUNDS = 5  # fewer rounds never give a verdict (the bootstrap is too narrow below that)
DRAWS = 4000  # posterior draws; Monte Carlo error of a probability near 0.95 is about 0.0035
SEED = 20261202  # fixed: the same trace always gives the same verdict
HIST_BINS = 40  # bins of the posterior histogram in the verdict JSON (the report draws it)
LOOK_GROWTH = 1.25  # adaptive stopping looks at rounds 5, 6, 8, 10, 12, 15, 19, 24, ...


@dataclass
class Verdict:
    """The posterior summary of one head/base comparison (plain data)."""

    verdict: str
    ratio: float  # posterior median of head/base
    hdi: tuple[float, float]  # 95% highest-density interval of head/base
    p_faster: float
    p_slower: float
    p_equivalent: float
    rope: tuple[float, float]
    rounds: int
    rope_source: str  # "fixed" (caller's --rope) | "minimum" (rope_min) | "floor" (multiple of the A/A floor)
    floor: float | None = None  # A/A noise floor as a fraction (None without a base2 instance)
    aa_ratio: float | None = None  # posterior median of base2/base
    aa_hdi: tuple[float, float] | None = None
    posterior_hist: dict | None = None  # {"edges": [...], "density": [...]} of head/base draws

    @property
    def rope_half_width(self) -> float:
        return self.rope[1] - 1.0

    def to_json(self) -> dict:
        """The docs/cli.md verdict object (plus a few extra fields)."""
        return {
            "verdict": self.verdict,
            "ratio": self.ratio,
            "hdi": list(self.hdi),
            "p_faster": self.p_faster,
            "p_slower": self.p_slower,
            "p_equivalent": self.p_equivalent,
            "rope": list(self.rope),
            "rounds": self.rounds,
            "rope_source": self.rope_source,
            "floor": self.floor,
            "aa_ratio": self.aa_ratio,
            "aa_hdi": list(self.aa_hdi) if self.aa_hdi is not None else None,
            "posterior_hist": self.posterior_hist,
        }

    @classmethod
    def from_json(cls, d: dict) -> Verdict:
        return cls(
            verdict=d["verdict"],
            ratio=d["ratio"],
            hdi=tuple(d["hdi"]),
            p_faster=d["p_faster"],
            p_slower=d["p_slower"],
            p_equivalent=d["p_equivalent"],
            rope=tuple(d["rope"]),
            rounds=d.get("rounds") or 0,
            rope_source=d.get("rope_source") or "",
            floor=d.get("floor"),
            aa_ratio=d.get("aa_ratio"),
            aa_hdi=tuple(d["aa_hdi"]) if d.get("aa_hdi") else None,
            posterior_hist=d.get("posterior_hist"),
        )


@lru_cache(maxsize=256)
def dirichlet_weights(n: int, draws: int = DRAWS) -> np.ndarray:
    """[draws, n] Dirichlet(1, ..., 1) weights, fixed per (n, draws): normalised exponentials."""
    rng = np.random.default_rng([SEED, n, draws])
    w = rng.standard_exponential((draws, n))
    w /= w.sum(axis=1, keepdims=True)
    w.setflags(write=False)
    return w


def round_location(samples: np.ndarray) -> np.ndarray:
    """Robust per-round location: the median over the last axis (the samples of one round).

    The median is kept because the first sample of an instance in a round runs
    0.5-2.4% slow in every H200 trace (a warm-up effect), which moves the mean
    (docs/statistics.md compares mean, min, trimmed mean and median).
    """
    return np.median(samples, axis=-1)


def log_ratios(base: np.ndarray, head: np.ndarray) -> np.ndarray:
    """Per-round log(head/base) of the robust locations; arrays [..., rounds, reps]."""
    return np.log(round_location(head)) - np.log(round_location(base))


def hdi(sorted_draws: np.ndarray, mass: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """Narrowest interval holding `mass` of the (sorted, last axis) draws."""
    n = sorted_draws.shape[-1]
    k = max(1, min(n, int(math.ceil(mass * n))))
    widths = sorted_draws[..., k - 1 :] - sorted_draws[..., : n - k + 1]
    i = widths.argmin(axis=-1)[..., None]
    lo = np.take_along_axis(sorted_draws, i, axis=-1)[..., 0]
    hi = np.take_along_axis(sorted_draws, i + k - 1, axis=-1)[..., 0]
    return lo, hi


def posterior(d: np.ndarray) -> np.ndarray:
    """Sorted posterior draws of the mean of per-round values d [T, n] -> [T, DRAWS]."""
    d = np.atleast_2d(np.asarray(d, dtype=np.float64))
    post = d @ dirichlet_weights(d.shape[-1]).T
    post.sort(axis=-1)
    return post


def sorted_median(sorted_draws: np.ndarray) -> np.ndarray:
    n = sorted_draws.shape[-1]
    return 0.5 * (sorted_draws[..., (n - 1) // 2] + sorted_draws[..., n // 2])


def floor_from_aa(aa_sorted: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A/A posterior (sorted log draws [T, B]) -> (floor, median ratio, hdi lo, hdi hi)."""
    lo, hi = hdi(np.exp(aa_sorted))
    floor = np.maximum(np.abs(1.0 - lo), np.abs(hi - 1.0))
    return floor, np.exp(sorted_median(aa_sorted)), lo, hi


def posterior_summary(d: np.ndarray, a: np.ndarray | None = None) -> dict:
    """Per-round log ratios d [T, n] (and A/A a [T, n]) -> posterior draws and their summaries ([T] arrays).

    The expensive half (one matrix product, one sort); `decide` turns it into verdicts
    for any ROPE without recomputing it.
    """
    d = np.atleast_2d(np.asarray(d, dtype=np.float64))
    post = posterior(d)
    out = {"n": d.shape[1], "post": post, "ratio": np.exp(sorted_median(post))}
    out["hdi_lo"], out["hdi_hi"] = hdi(np.exp(post))
    if a is not None:
        out["floor"], out["aa_ratio"], out["aa_lo"], out["aa_hi"] = floor_from_aa(posterior(a))
    return out


def decide(
    summary: dict, rope: float | None = None, rope_min: float = ROPE_MIN, floor_multiple: float = FLOOR_MULTIPLE
) -> dict:
    """The ROPE, the three probabilities and the verdict, added to a copy of `summary`. `rope_min`: one
    minimum for every row, or one per row ([T])."""
    out = dict(summary)
    post, n = out["post"], out["n"]
    T = post.shape[0]
    if rope is not None:
        rho = np.full(T, float(rope))
        source = np.full(T, "fixed", dtype=object)
    elif "floor" in out:
        by_floor = floor_multiple * out["floor"]
        rho = np.maximum(rope_min, by_floor)
        source = np.where(by_floor > rope_min, "floor", "minimum").astype(object)
    else:
        rho = np.broadcast_to(np.asarray(rope_min, dtype=np.float64), (T,)).copy()
        source = np.full(T, "minimum", dtype=object)
    out["rho"], out["rope_source"] = rho, source
    up, down = np.log1p(rho)[:, None], np.log1p(-np.minimum(rho, 0.999999))[:, None]
    out["p_slower"] = (post > up).mean(axis=-1)
    out["p_faster"] = (post < down).mean(axis=-1)
    out["p_equivalent"] = 1.0 - out["p_slower"] - out["p_faster"]
    verdict = np.full(T, "inconclusive", dtype=object)
    if n >= MIN_ROUNDS:
        verdict[out["p_equivalent"] >= CONFIDENCE] = "equivalent"
        verdict[out["p_slower"] >= CONFIDENCE] = "slower"
        verdict[out["p_faster"] >= CONFIDENCE] = "faster"
    out["verdict"] = verdict
    return out


def judge_arrays(
    d: np.ndarray,
    a: np.ndarray | None = None,
    rope: float | None = None,
    rope_min: float = ROPE_MIN,
    floor_multiple: float = FLOOR_MULTIPLE,
) -> dict:
    """Vectorised core: per-round log ratios d [T, n] (and A/A a [T, n]) -> dict of [T] arrays.

    Used by compare_many (thousands of traces) and by the evaluation (thousands
    of windows); Verdict objects are built from it by `verdicts_from`.
    """
    return decide(posterior_summary(d, a), rope, rope_min, floor_multiple)


def verdicts_from(res: dict) -> list[Verdict]:
    out = []
    has_aa = "floor" in res
    hists = histograms(res["post"])
    for i in range(len(res["verdict"])):
        rho = float(res["rho"][i])
        out.append(
            Verdict(
                verdict=str(res["verdict"][i]),
                ratio=float(res["ratio"][i]),
                hdi=(float(res["hdi_lo"][i]), float(res["hdi_hi"][i])),
                p_faster=float(res["p_faster"][i]),
                p_slower=float(res["p_slower"][i]),
                p_equivalent=float(res["p_equivalent"][i]),
                rope=(1.0 - rho, 1.0 + rho),
                rounds=int(res["n"]),
                rope_source=str(res["rope_source"][i]),
                floor=float(res["floor"][i]) if has_aa else None,
                aa_ratio=float(res["aa_ratio"][i]) if has_aa else None,
                aa_hdi=(float(res["aa_lo"][i]), float(res["aa_hi"][i])) if has_aa else None,
                posterior_hist=hists[i],
            )
        )
    return out


def histograms(sorted_log_draws: np.ndarray, bins: int = HIST_BINS) -> list[dict]:
    """Each row's posterior of head/base as a density histogram over its own range (for drawing only)."""
    r = np.exp(np.atleast_2d(sorted_log_draws))
    T, B = r.shape
    lo, hi = r[:, 0].copy(), r[:, -1].copy()
    flat = hi <= lo  # a degenerate posterior (one round): one narrow range
    lo[flat], hi[flat] = lo[flat] * (1 - 1e-6), hi[flat] * (1 + 1e-6)
    width = (hi - lo) / bins
    idx = np.clip(((r - lo[:, None]) / width[:, None]).astype(np.int64), 0, bins - 1)
    counts = np.bincount((idx + bins * np.arange(T)[:, None]).ravel(), minlength=T * bins).reshape(T, bins)
    density = counts / (B * width[:, None])
    edges = lo[:, None] + width[:, None] * np.arange(bins + 1)[None, :]
    return [{"edges": e.tolist(), "density": d.tolist()} for e, d in zip(edges, density)]


def compare_trace(base, head, base2=None, rope: float | None = None, rope_min: float = ROPE_MIN) -> Verdict:
    """head against base ([rounds, reps] each; base2 optional, same rounds): one Verdict."""
    base, head = np.asarray(base, dtype=np.float64), np.asarray(head, dtype=np.float64)
    _check(base, head, base2)
    d = log_ratios(base, head)[None, :]
    a = log_ratios(base, np.asarray(base2, dtype=np.float64))[None, :] if base2 is not None else None
    return verdicts_from(judge_arrays(d, a, rope, rope_min))[0]


def common_floor(summary: dict) -> dict:
    """Every row of a run (the overall row and one per shape) gets the run's one floor: the largest A/A floor
    among them. A copy of `summary`; each row keeps its own A/A ratio and HDI."""
    if "floor" not in summary:
        return summary
    out = dict(summary)
    out["floor"] = np.full_like(summary["floor"], float(np.max(summary["floor"])))
    return out


def compare_run(
    base, head, base2=None, rope: float | None = None, rope_min: float = ROPE_MIN
) -> tuple[Verdict, list[Verdict]]:
    """One benchmark run, [rounds, shapes, reps] per instance -> (overall verdict, one verdict per shape).

    The one function that decides both. The overall row judges the per-repetition geometric mean over
    shapes (each shape weighs the same); every row is decided by the same rule (`decide`: same ROPE
    rule, same minimum rounds, same probabilities) under the same floor (`common_floor`), so a shape is
    never called `slower` under a narrower ROPE than the run's A/A pairs justify at some shape.
    """
    base, head = np.asarray(base, dtype=np.float64), np.asarray(head, dtype=np.float64)
    b2 = np.asarray(base2, dtype=np.float64) if base2 is not None else None
    if base.ndim != 3 or head.shape != base.shape or (b2 is not None and b2.shape[:2] != base.shape[:2]):
        raise ValueError(
            f"base, head (and base2) must be [rounds, shapes, reps] with the same rounds and shapes, "
            f"got {base.shape}, {head.shape}" + (f", {b2.shape}" if b2 is not None else "")
        )

    def rows(x: np.ndarray) -> np.ndarray:  # [1 + shapes, rounds] of log per-round locations
        overall = np.log(round_location(np.exp(np.log(x).mean(axis=1))))
        return np.concatenate([overall[None, :], np.log(round_location(x)).T], axis=0)

    lb = rows(base)
    d = rows(head) - lb
    a = rows(b2) - lb if b2 is not None else None
    vs = verdicts_from(decide(common_floor(posterior_summary(d, a)), rope, row_minima(rope_min, base.shape[1])))
    return vs[0], vs[1:]


def row_minima(rope_min: float, shapes: int) -> np.ndarray:
    """The ROPE minimum of each row of a run ([overall, shape 1, ..., shape S]): the caller's for the
    overall row; at least SHAPE_ROPE_MIN for a shape row of a run of several shapes. Separately loaded
    copies of one micro-kernel differ at one shape by a placement offset that one A/A pair does not
    measure (docs/statistics.md); averaged over the shapes it shrinks below the caller's minimum. A
    one-shape run's shape row is its overall row: the caller's minimum (the one the gate decides by)."""
    m = np.full(1 + shapes, float(rope_min))
    if shapes > 1:
        m[1:] = max(float(rope_min), SHAPE_ROPE_MIN)
    return m


def compare_many(traces, rope: float | None = None, rope_min: float = ROPE_MIN) -> list[Verdict]:
    """Many (base, head, base2|None) triples at once.

    Traces of one layout (rounds, repetitions, with or without base2) are stacked:
    one median per array kind and one matrix product per group.
    """
    groups: dict[tuple, list[int]] = {}
    arrays = []
    for i, (base, head, base2) in enumerate(traces):
        base, head = np.asarray(base, dtype=np.float64), np.asarray(head, dtype=np.float64)
        base2 = np.asarray(base2, dtype=np.float64) if base2 is not None else None
        _check(base, head, base2)
        arrays.append((base, head, base2))
        key = (base.shape, head.shape, base2.shape if base2 is not None else None)
        groups.setdefault(key, []).append(i)
    out: list[Verdict | None] = [None] * len(arrays)
    for key, idx in groups.items():
        lb = np.log(round_location(np.stack([arrays[i][0] for i in idx])))
        d = np.log(round_location(np.stack([arrays[i][1] for i in idx]))) - lb
        a = np.log(round_location(np.stack([arrays[i][2] for i in idx]))) - lb if key[2] is not None else None
        for i, v in zip(idx, verdicts_from(judge_arrays(d, a, rope, rope_min))):
            out[i] = v
    return out


def _check(base, head, base2) -> None:
    if base.ndim != 2 or head.ndim != 2 or base.shape[0] != head.shape[0] or base.shape[0] < 1:
        raise ValueError(
            f"base and head must be [rounds, reps] with the same rounds, got {base.shape} and {head.shape}"
        )
    if base2 is not None and (np.ndim(base2) != 2 or np.shape(base2)[0] != base.shape[0]):
        raise ValueError(f"base2 must be [rounds, reps] with {base.shape[0]} rounds, got {np.shape(base2)}")


# ---------------------------------------------------------------- adaptive stopping


def looks(limit: int = 1 << 20):
    """The rounds after which the verdict is examined: 5, 6, 8, 10, 12, 15, 19, 24, 30, 38, ...

    Geometric spacing keeps the number of looks logarithmic in the rounds, so
    repeated looking adds little to the false-alarm rate (docs/statistics.md).
    """
    n = MIN_ROUNDS
    while n <= limit:
        yield n
        n = max(n + 1, int(round(n * LOOK_GROWTH)))


@lru_cache(maxsize=1)
def _look_set(limit: int = 100_000) -> frozenset:
    return frozenset(looks(limit))


def is_look(n: int) -> bool:
    return n in _look_set() if n <= 100_000 else False


def should_stop(verdict: str, rope_source: str) -> bool:
    """At a look: stop on faster/slower; stop on equivalent only when the ROPE is not the floor's.

    A ROPE set by the A/A floor is wide after few rounds on a noisy machine and
    narrows as rounds accumulate, so "equivalent" under it is not final: more rounds
    may resolve a real effect. Under the user's minimum (or a fixed --rope) it is.
    When the budget ends, the verdict stands whatever it is.
    """
    if verdict in ("faster", "slower"):
        return True
    return verdict == "equivalent" and rope_source != "floor"
