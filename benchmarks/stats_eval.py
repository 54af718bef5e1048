"""Evaluate kernalin-ci's benchmark statistics against the anchors' rules on real H200 traces.

    python benchmarks/stats_eval.py                 # everything (a few minutes on 2 cores)
    python benchmarks/stats_eval.py --only table    # one section: location|table|rounds|floor|sensitivity|
                                                    # adaptive|goals|throughput
    python benchmarks/stats_eval.py --only goals --traces /path/to/gpu-traces   # another copy of the traces

Sources: tests/data/gpu-traces/timings_*.npz and benchmarks/data/*.npz, both in the
"variants" layout t[rounds, variants, reps] (plus `groups`: which variants are
identical builds; the shared traces' README says variants 0 and 1 are an A/A pair).

Trials. For every trace and window size n, windows of n consecutive rounds are taken
at (up to MAX_WINDOWS evenly spaced) start positions. Each trial uses one half of the
repetitions (even or odd indices) for base and head, so every method sees the same
samples:
- A/A: base and head are two identical builds. kernalin-ci's noise floor (base2) is a
  third identical build when the trace has one, else the other half of the base's own
  repetitions (no build offset in the floor: a narrower ROPE, so this is the harder case).
- effects: base is a build of group 0, head a build of a slower group (and the reverse,
  for `faster`); base2 as above. The true ratio is the trace's long-run median ratio.
Anchors (re-implemented on the same windows, all repetitions of the window pooled, as
those tools do):
- criterion.rs: mixed-bootstrap Welch t p < 0.05, then the 95% bootstrap CI of the
  relative change of the mean entirely outside +-1%.
- Google Benchmark compare.py: two-sided Mann-Whitney U p < 0.05, direction of the medians.
- asv: U test p < 0.002 and the median changed by more than a factor 1.1.
- pytest-benchmark: min regressed by more than 5% (mirrored for improvements).
A false alarm is a faster/slower verdict on an A/A pair; power is the rate of the
correct direction on an effect.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from kernalin_ci.bench import stats as ks  # noqa: E402

SHARED = os.path.join(ROOT, "tests", "data", "gpu-traces")
DATA = os.path.join(HERE, "data")
WINDOWS = (5, 10, 20, 50)
POWER_GRID = (5, 6, 8, 10, 12, 15, 20, 30, 40, 50)
MAX_WINDOWS = 120
RESAMPLES = 1000  # criterion's bootstrap resamples (its default is 100000; 1000 decide p < 0.05 and a 95% CI)
METHODS = ("kernalin-ci", "criterion.rs", "gbench U", "asv", "pytest-benchmark")


# ------------------------------------------------------------------ sources and trials


@dataclass
class Source:
    name: str
    t: np.ndarray  # [rounds, variants, reps]
    groups: np.ndarray  # [variants] identical-build group id; group 0 is the base kernel


def load_sources(extra_dirs=(), traces: str = SHARED) -> list[Source]:
    paths = sorted(glob.glob(os.path.join(traces, "timings_*.npz")))
    for d in (os.path.join(HERE, "data"), *extra_dirs):
        paths += sorted(glob.glob(os.path.join(d, "*.npz")))
    out = []
    for p in paths:
        z = np.load(p)
        if "t" not in z.files:
            continue  # a compare-format trace (base/head), not a variants trace
        t = np.asarray(z["t"], dtype=np.float64)
        if "groups" in z.files:
            groups = np.asarray(z["groups"], dtype=int)
        else:  # shared traces: variants 0 and 1 identical, each other variant its own group
            groups = np.array([0, 0] + list(range(1, t.shape[1] - 1)))
        out.append(Source(os.path.splitext(os.path.basename(p))[0].replace("timings_", ""), t, groups))
    return out


@dataclass
class Trial:
    """One base/head(/base2) assignment on a source: arrays [rounds, reps_half]."""

    source: str
    kind: str  # "aa" | "effect"
    true_ratio: float
    base: np.ndarray
    head: np.ndarray
    base2: np.ndarray
    floor_design: str  # "build" (a separate identical build) | "split" (the base's other repetitions)


def long_run_ratio(t: np.ndarray, b: int, h: int) -> float:
    m = np.median(t, axis=2)
    return float(np.median(m[:, h] / m[:, b]))


def trials_for(src: Source) -> list[Trial]:
    t, g = src.t, src.groups
    reps = t.shape[2]
    halves = (np.arange(0, reps, 2), np.arange(1, reps, 2))
    by_group: dict[int, list[int]] = {}
    for v, gid in enumerate(g):
        by_group.setdefault(int(gid), []).append(v)
    out = []

    def add(kind, b, h, b2):
        for i, half in enumerate(halves):
            other = halves[1 - i]
            if b2 is None:  # split design: base2 is the base's other half
                base2, design = t[:, b][:, other], "split"
            else:
                base2, design = t[:, b2][:, half], "build"
            out.append(
                Trial(
                    src.name,
                    kind,
                    long_run_ratio(t, b, h),
                    t[:, b][:, half],
                    t[:, h][:, half],
                    base2[:, : len(half)] if base2.shape[1] >= len(half) else base2,
                    design,
                )
            )

    for vs in by_group.values():  # A/A: two builds of one group
        if len(vs) >= 3:
            for k in range(len(vs)):
                add("aa", vs[k], vs[(k + 2) % len(vs)], vs[(k + 1) % len(vs)])
        elif len(vs) == 2:
            add("aa", vs[0], vs[1], None)
            add("aa", vs[1], vs[0], None)
    base_vs = by_group[0]
    for gid, vs in by_group.items():
        if gid == 0:
            continue
        h = vs[0]
        add("effect", base_vs[0], h, base_vs[1] if len(base_vs) > 1 else None)  # slower head
        add("effect", h, base_vs[0], vs[1] if len(vs) > 1 else None)  # faster head
    return out


def window_starts(rounds: int, n: int) -> np.ndarray:
    if n > rounds:
        return np.zeros(0, dtype=int)
    starts = np.arange(rounds - n + 1)
    if len(starts) > MAX_WINDOWS:
        starts = np.unique(np.linspace(0, rounds - n, MAX_WINDOWS).round().astype(int))
    return starts


def windows(x: np.ndarray, n: int, starts: np.ndarray) -> np.ndarray:
    """[rounds, reps] -> [W, n, reps]."""
    idx = starts[:, None] + np.arange(n)[None, :]
    return x[idx]


# ------------------------------------------------------------------ methods (vectorised over windows)


def kernalin(b, h, b2, rope_min=ks.ROPE_MIN, floor_multiple=ks.FLOOR_MULTIPLE, rope=None):
    d = ks.log_ratios(b, h)
    a = ks.log_ratios(b, b2)
    return ks.judge_arrays(d, a, rope=rope, rope_min=rope_min, floor_multiple=floor_multiple)


_COUNTS: dict = {}


def _counts(draws_from: int, size: int, key: str) -> np.ndarray:
    """[RESAMPLES, size] multinomial counts of `draws_from` draws with replacement (cached)."""
    k = (draws_from, size, key)
    if k not in _COUNTS:
        rng = np.random.default_rng([7, draws_from, size, len(key)])
        _COUNTS[k] = rng.multinomial(draws_from, np.full(size, 1.0 / size), size=RESAMPLES).astype(np.float64)
    return _COUNTS[k]


def _welch_t(mx, vx, nx, my, vy, ny):
    return (mx - my) / np.sqrt(vx / nx + vy / ny)


def criterion(b, h, threshold=0.01, alpha=0.05):
    x, y = h.reshape(h.shape[0], -1), b.reshape(b.shape[0], -1)  # [W, N] pooled samples
    nx, ny = x.shape[1], y.shape[1]
    t0 = _welch_t(x.mean(1), x.var(1, ddof=1), nx, y.mean(1), y.var(1, ddof=1), ny)
    z = np.concatenate([x, y], axis=1)
    cx, cy = _counts(nx, nx + ny, "mx"), _counts(ny, nx + ny, "my")

    def moments(c, data, n):
        m = data @ c.T / n
        v = (data**2 @ c.T - n * m**2) / (n - 1)
        return m, np.maximum(v, 1e-300)

    mx, vx = moments(cx, z, nx)
    my, vy = moments(cy, z, ny)
    tb = _welch_t(mx, vx, nx, my, vy, ny)
    p = (np.abs(tb) >= np.abs(t0)[:, None]).mean(1)
    ax, ay = _counts(nx, nx, "x"), _counts(ny, ny, "y")
    change = (x @ ax.T / nx) / (y @ ay.T / ny) - 1.0
    lo, hi = np.percentile(change, [2.5, 97.5], axis=1)
    v = np.full(len(p), "none", dtype=object)
    sig = p < alpha
    v[sig & (lo > threshold)] = "slower"
    v[sig & (hi < -threshold)] = "faster"
    return v


def _u_pvalue(b, h):
    x, y = h.reshape(h.shape[0], -1), b.reshape(b.shape[0], -1)
    return sps.mannwhitneyu(x, y, alternative="two-sided", axis=1, method="asymptotic").pvalue, x, y


def gbench(b, h, alpha=0.05):
    p, x, y = _u_pvalue(b, h)
    up = np.median(x, 1) > np.median(y, 1)
    v = np.full(len(p), "none", dtype=object)
    v[(p < alpha) & up] = "slower"
    v[(p < alpha) & ~up] = "faster"
    return v


def asv(b, h, alpha=0.002, factor=1.1):
    p, x, y = _u_pvalue(b, h)
    r = np.median(x, 1) / np.median(y, 1)
    v = np.full(len(p), "none", dtype=object)
    v[(p < alpha) & (r > factor)] = "slower"
    v[(p < alpha) & (r < 1 / factor)] = "faster"
    return v


def pytest_benchmark(b, h, pct=0.05):
    x, y = h.reshape(h.shape[0], -1), b.reshape(b.shape[0], -1)
    r = x.min(1) / y.min(1)
    v = np.full(len(r), "none", dtype=object)
    v[r > 1 + pct] = "slower"
    v[r < 1 / (1 + pct)] = "faster"
    return v


def run_methods(b, h, b2) -> dict:
    return {
        "kernalin-ci": kernalin(b, h, b2)["verdict"],
        "criterion.rs": criterion(b, h),
        "gbench U": gbench(b, h),
        "asv": asv(b, h),
        "pytest-benchmark": pytest_benchmark(b, h),
    }


# ------------------------------------------------------------------ sections


def collect(sources, ns, methods=True):
    """-> list of dict(trial, n, verdicts{method: [W]})."""
    rows = []
    for src in sources:
        for tr in trials_for(src):
            for n in ns:
                st = window_starts(tr.base.shape[0], n)
                if len(st) == 0:
                    continue
                b, h, b2 = windows(tr.base, n, st), windows(tr.head, n, st), windows(tr.base2, n, st)
                v = run_methods(b, h, b2) if methods else {"kernalin-ci": kernalin(b, h, b2)["verdict"]}
                rows.append({"trial": tr, "n": n, "v": v})
    return rows


def expected(tr: Trial) -> str | None:
    if tr.kind == "aa":
        return None
    return "slower" if tr.true_ratio > 1 else "faster"


def effect_label(tr: Trial) -> str:
    r = tr.true_ratio if tr.true_ratio > 1 else 1 / tr.true_ratio
    return f"{100 * (r - 1):.1f}%"


def section_table(sources):
    rows = collect(sources, WINDOWS)
    print("\n## False alarms (A/A) and power (effects) per window of n rounds\n")
    aa_trials = sum(1 for r in rows if r["trial"].kind == "aa" and r["n"] == WINDOWS[0])
    print(f"A/A trial sets: {aa_trials}; windows per set up to {MAX_WINDOWS}.\n")
    print(
        "| method | "
        + " | ".join(f"FA n={n}" for n in WINDOWS)
        + " | "
        + " | ".join(f"power>=1% n={n}" for n in WINDOWS)
        + " |"
    )
    print("|---|" + "---|" * (2 * len(WINDOWS)))
    for m in METHODS:
        fa, pw = [], []
        for n in WINDOWS:
            aa = np.concatenate([r["v"][m] for r in rows if r["n"] == n and r["trial"].kind == "aa"])
            alarm = np.isin(aa, ("faster", "slower"))
            fa.append(f"{alarm.mean():.3f} ({alarm.sum()}/{len(aa)})")
            eff = [
                (r["v"][m] == expected(r["trial"]))
                for r in rows
                if r["n"] == n and r["trial"].kind == "effect" and abs(np.log(r["trial"].true_ratio)) >= np.log(1.0095)
            ]
            pw.append(f"{np.concatenate(eff).mean():.3f}" if eff else "-")
        print(f"| {m} | " + " | ".join(fa) + " | " + " | ".join(pw) + " |")
    print("\n## Power per effect (correct direction), n rounds\n")
    effects = sorted(
        {(r["trial"].source, effect_label(r["trial"])) for r in rows if r["trial"].kind == "effect"},
        key=lambda e: (e[0], float(e[1][:-1])),
    )
    print("| effect | method | " + " | ".join(f"n={n}" for n in WINDOWS) + " |")
    print("|---|---|" + "---|" * len(WINDOWS))
    for srcname, lab in effects:
        for m in METHODS:
            cells = []
            for n in WINDOWS:
                hits = [
                    r["v"][m] == expected(r["trial"])
                    for r in rows
                    if r["n"] == n
                    and r["trial"].kind == "effect"
                    and r["trial"].source == srcname
                    and effect_label(r["trial"]) == lab
                ]
                cells.append(f"{np.concatenate(hits).mean():.3f}" if hits else "-")
            print(f"| {srcname} {lab} | {m} | " + " | ".join(cells) + " |")
    print("\n## kernalin-ci verdicts on A/A pairs (share of windows)\n")
    print("| n | equivalent | inconclusive | faster/slower |")
    print("|---|---|---|---|")
    for n in WINDOWS:
        aa = np.concatenate([r["v"]["kernalin-ci"] for r in rows if r["n"] == n and r["trial"].kind == "aa"])
        print(
            f"| {n} | {(aa == 'equivalent').mean():.3f} | {(aa == 'inconclusive').mean():.3f} | "
            f"{np.isin(aa, ('faster', 'slower')).mean():.3f} |"
        )


def section_rounds(sources):
    rows = collect(sources, POWER_GRID)
    print("\n## Rounds needed for 95% power (smallest n of", POWER_GRID, "; '>50' = never reached)\n")
    effects = sorted(
        {(r["trial"].source, effect_label(r["trial"])) for r in rows if r["trial"].kind == "effect"},
        key=lambda e: (e[0], float(e[1][:-1])),
    )
    print("| effect | " + " | ".join(METHODS) + " |")
    print("|---|" + "---|" * len(METHODS))
    for srcname, lab in effects:
        cells = []
        for m in METHODS:
            need = ">50"
            for n in POWER_GRID:
                hits = [
                    r["v"][m] == expected(r["trial"])
                    for r in rows
                    if r["n"] == n
                    and r["trial"].kind == "effect"
                    and r["trial"].source == srcname
                    and effect_label(r["trial"]) == lab
                ]
                if hits and np.concatenate(hits).mean() >= 0.95:
                    need = str(n)
                    break
            cells.append(need)
        print(f"| {srcname} {lab} | " + " | ".join(cells) + " |")


def section_floor(sources, n=20):
    """Smallest effect detected with >= 95% power at n rounds: A/A pairs with the head scaled by (1 + e)."""
    print(
        f"\n## Smallest effect kernalin-ci detects with 95% power at n={n} (A/A head scaled by 1+e, both directions)\n"
    )
    print("| trace | A/A floor (median) | per-round A/A sd | rope_min | smallest e | e / floor | e / sd |")
    print("|---|---|---|---|---|---|---|")
    grid = np.round(np.arange(0.0005, 0.0200, 0.0005), 4)
    for src in sources:
        summaries = []
        for tr in (tr for tr in trials_for(src) if tr.kind == "aa"):
            st = window_starts(tr.base.shape[0], n)
            b, h, b2 = windows(tr.base, n, st), windows(tr.head, n, st), windows(tr.base2, n, st)
            summaries.append((b, h, b2, ks.log_ratios(b, h), ks.log_ratios(b, b2)))
        floors = np.concatenate([ks.posterior_summary(d, a)["floor"] for *_, d, a in summaries])
        sds = np.concatenate([d.std(axis=1, ddof=1) for *_, d, _ in summaries])
        fl, sd = float(np.median(floors)), float(np.median(sds))
        for rope_min in (ks.ROPE_MIN, 0.0):
            smallest = None
            for e in grid:
                hits = []
                for *_, d, a in summaries:
                    for sign in (1, -1):
                        v = ks.judge_arrays(d + sign * np.log1p(e), a, rope_min=rope_min)["verdict"]
                        hits.append(v == ("slower" if sign > 0 else "faster"))
                if np.concatenate(hits).mean() >= 0.95:
                    smallest = e
                    break
            cells = (
                f"{100 * smallest:.2f}% | {smallest / fl:.1f}x | {smallest / sd:.1f}x" if smallest else ">2% | - | -"
            )
            print(f"| {src.name} | {100 * fl:.3f}% | {100 * sd:.3f}% | {100 * rope_min:.1f}% | {cells} |")


def section_location(sources):
    """Which per-round location: the round-to-round spread of the A/A log ratio (v0 vs v1) per estimator."""
    from scipy import stats as st

    est = {
        "mean": lambda x: x.mean(-1),
        "median": lambda x: np.median(x, -1),
        "min": lambda x: x.min(-1),
        "25% trimmed mean": lambda x: st.trim_mean(x, 0.25, axis=-1),
    }
    print("\n## Per-round location: sd of the per-round A/A log ratio (smaller is better)\n")
    print("| trace | " + " | ".join(est) + " |")
    print("|---|" + "---|" * len(est))
    for src in sources:
        aa = [v for v in range(src.t.shape[1]) if src.groups[v] == 0][:2]
        cells = []
        for f in est.values():
            m = f(src.t)
            cells.append(f"{100 * np.log(m[:, aa[1]] / m[:, aa[0]]).std(ddof=1):.3f}%")
        print(f"| {src.name} | " + " | ".join(cells) + " |")


def scaled(src: Source, s: float) -> Source:
    """A noisier machine: every variant's log-time deviations from its own median scaled by s."""
    lt = np.log(src.t)
    c = np.median(lt, axis=(0, 2), keepdims=True)
    return Source(f"{src.name} x{s:g}", np.exp(c + s * (lt - c)), src.groups)


def section_sensitivity(sources):
    print(
        "\n## Choosing the floor multiple k: A/A false alarms / power on >=1% effects / effects called "
        "equivalent, windows of n rounds, noise scaled x1..x8\n"
    )
    ks_ = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
    print(
        "| noise x | rope_min | k | "
        + " | ".join(f"FA n={n}" for n in WINDOWS)
        + " | "
        + " | ".join(f"power n={n}" for n in WINDOWS)
        + " | wrong 'equivalent' n=5 |"
    )
    print("|---|---|---|" + "---|" * (2 * len(WINDOWS) + 1))
    for s in (1, 2, 4, 8):
        cache = []  # (trial, n, posterior summary)
        for src in sources:
            for tr in trials_for(scaled(src, s)):
                for n in WINDOWS:
                    st = window_starts(tr.base.shape[0], n)
                    if len(st):
                        b, h, b2 = windows(tr.base, n, st), windows(tr.head, n, st), windows(tr.base2, n, st)
                        cache.append((tr, n, ks.posterior_summary(ks.log_ratios(b, h), ks.log_ratios(b, b2))))
        for rope_min in (ks.ROPE_MIN, 0.0):
            for k in ks_:
                if rope_min == 0.0 and k < 1.0:
                    continue
                fa, pw, weq = [], [], []
                for n in WINDOWS:
                    a_v, e_v, q_v = [], [], []
                    for tr, nn, summ in cache:
                        if nn != n:
                            continue
                        v = ks.decide(summ, rope_min=rope_min, floor_multiple=k)["verdict"]
                        if tr.kind == "aa":
                            a_v.append(np.isin(v, ("faster", "slower")))
                        elif abs(np.log(tr.true_ratio)) >= np.log(1.0095):
                            e_v.append(v == expected(tr))
                            q_v.append(v == "equivalent")
                    fa.append(f"{np.concatenate(a_v).mean():.3f}")
                    pw.append(f"{np.concatenate(e_v).mean():.3f}")
                    weq.append(np.concatenate(q_v).mean())
                print(
                    f"| {s} | {100 * rope_min:.1f}% | {k:g} | "
                    + " | ".join(fa)
                    + " | "
                    + " | ".join(pw)
                    + f" | {weq[0]:.3f} |"
                )


def sequential(b, h, b2, n_max, rope_min=ks.ROPE_MIN, floor_multiple=ks.FLOOR_MULTIPLE, every_round=False, prune=False):
    """Adaptive stopping on windows [W, n_max, reps]: the verdict at the first decided look, and its rounds.

    Also returns whether any look (decided or not) said faster/slower: the false-alarm
    rate of a rule that stops at the first such look, an upper bound for this one.
    every_round: look after every round from the 5th (not only at stats.looks).
    prune: judge only the windows still running at each look (the same verdicts and rounds, faster; the
    any-look alarms then count only looks a window still ran to).
    """
    W = b.shape[0]
    verdict = np.full(W, "inconclusive", dtype=object)
    used = np.full(W, n_max)
    open_ = np.ones(W, dtype=bool)
    any_alarm = np.zeros(W, dtype=bool)
    looks = list(range(ks.MIN_ROUNDS, n_max + 1)) if every_round else list(ks.looks(n_max))
    if looks[-1] != n_max:
        looks.append(n_max)  # the budget ends: a last look at whatever was measured
    for n in looks:
        if prune and not open_.any():
            break
        sel = np.flatnonzero(open_) if prune else np.arange(W)
        res = kernalin(b[sel, :n], h[sel, :n], b2[sel, :n], rope_min=rope_min, floor_multiple=floor_multiple)
        v = np.full(W, "inconclusive", dtype=object)
        src = np.full(W, "minimum", dtype=object)
        v[sel], src[sel] = res["verdict"], res["rope_source"]
        any_alarm[sel] |= np.isin(res["verdict"], ("faster", "slower"))
        stop = np.array([ks.should_stop(x, y) for x, y in zip(v, src)], dtype=bool)
        dec = open_ & stop
        verdict[dec] = v[dec]
        used[dec] = n
        open_ &= ~dec
        if n == n_max:
            verdict[open_] = v[open_]
    return verdict, used, any_alarm


def section_adaptive(sources, multiples=(ks.FLOOR_MULTIPLE,)):
    print("\n## Adaptive stopping: looks at", list(ks.looks(50)), "until a verdict or n_max rounds\n")
    print(
        "| k | noise x | n_max | A/A trials | FA fixed n_max | FA adaptive | FA any look | median rounds A/A | "
        "power fixed n_max | power adaptive | effects called equivalent (adaptive) | median rounds effects |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    cat = np.concatenate
    for k, s, n_max in ((k, s, n) for k in multiples for s in (1, 2, 4, 8) for n in (20, 50)):
        fa_fix, fa_ad, any_look, r_aa, pw_fix, pw, weq, r_eff = ([] for _ in range(8))
        for src in sources:
            for tr in trials_for(scaled(src, s)):
                st = window_starts(tr.base.shape[0], n_max)
                if not len(st):
                    continue
                b, h, b2 = windows(tr.base, n_max, st), windows(tr.head, n_max, st), windows(tr.base2, n_max, st)
                v, used, anyf = sequential(b, h, b2, n_max, floor_multiple=k)
                fix = kernalin(b, h, b2, floor_multiple=k)["verdict"]
                if tr.kind == "aa":
                    fa_fix.append(np.isin(fix, ("faster", "slower")))
                    fa_ad.append(np.isin(v, ("faster", "slower")))
                    any_look.append(anyf)
                    r_aa.append(used)
                elif abs(np.log(tr.true_ratio)) >= np.log(1.0095):
                    pw_fix.append(fix == expected(tr))
                    pw.append(v == expected(tr))
                    weq.append(v == "equivalent")
                    r_eff.append(used)
        print(
            f"| {k:g} | {s} | {n_max} | {len(cat(fa_fix))} | {cat(fa_fix).mean():.4f} | "
            f"{cat(fa_ad).mean():.4f} | "
            f"{cat(any_look).mean():.4f} | {np.median(cat(r_aa)):.0f} | {cat(pw_fix).mean():.3f} | "
            f"{cat(pw).mean():.3f} | {cat(weq).mean():.3f} | {np.median(cat(r_eff)):.0f} |"
        )


GOAL_NOISE = (1, 2, 4, 8)
GOAL_BUDGETS = (5, 6, 8, 10, 12, 15, 20, 30, 50)
GOAL_ADAPTIVE_BUDGETS = (5, 10, 20, 50)  # budgets (in rounds) of the adaptive runs
GOAL_STOP_NOISE = (1, 4)  # noise levels of the stopping-round table (every-round looks are slow to simulate)
GOAL_EFFECT = 0.02  # issue 36: power at 10 rounds >= 95% for effects of 2% or more


def live_noise(data_dir: str = DATA) -> list[tuple[str, str, float, int]]:
    """Round-to-round sd of the A/A log ratio (geometric mean over shapes, as the overall verdict) in the live
    H200 runs of benchmarks/live_eval.py, quiet and with a competing stream ("noisy"), cold regime:
    [(pass, op, median sd over the A/A pairs, rounds)]."""
    import gzip
    import json

    rows: dict = {}
    for path in sorted(glob.glob(os.path.join(data_dir, "live_*_h200.json.gz"))):
        with gzip.open(path) as f:
            runs = json.load(f).get("runs", {})
        for key, run in runs.items():
            pas, regime, op = key.split("/")
            if regime != "cold" or pas not in ("quiet", "noisy"):
                continue
            for call in run.get("calls", []):
                med = {k: np.median(np.asarray(v, dtype=np.float64), axis=-1) for k, v in call["instances"].items()}
                geo = {k: np.log(v).mean(axis=-1) for k, v in med.items()}  # [rounds] log geometric mean over shapes
                names = [k for k in geo if k in ("base", "base2") or k.startswith("aa")]
                for x, y in zip(names, names[1:]):
                    a = geo[y] - geo[x]
                    if len(a) >= 5:
                        rows.setdefault((pas, op), []).append((a.std(ddof=1), len(a)))
    return [(p, o, float(np.median([sd for sd, _ in v])), sum(n for _, n in v)) for (p, o), v in sorted(rows.items())]


def section_goals(sources):
    """Issue 36's statistics goals: false alarms <= 1% at every budget (5 rounds included), power at 10 rounds
    >= 95% for effects >= 2% on a noisy GPU, and adaptive stopping that ends as soon as the posterior decides."""
    cat = np.concatenate
    print("\n## Issue 36 goals: false alarms at every budget, power at 10 rounds, when adaptive stopping ends\n")
    live = live_noise()
    if live:
        print("Noise of a competing stream, live (benchmarks/data/live_*_h200.json.gz, cold): round-to-round sd of")
        print("the A/A log ratio (geometric mean over shapes), median over A/A pairs:\n")
        print("| pass | op | sd | rounds |")
        print("|---|---|---|---|")
        for pas, op, sd, n in live:
            print(f"| {pas} | {op} | {100 * sd:.3f}% | {n} |")
        quiet = [sd for pas, _, sd, _ in live if pas == "quiet"]
        noisy = [sd for pas, _, sd, _ in live if pas == "noisy"]
        if quiet and noisy:
            print(f"\nquiet: at most {100 * max(quiet):.3f}%; with a competing stream: at most {100 * max(noisy):.3f}%")
    aa_sd = {}
    for src in sources:
        m = np.median(src.t, axis=2)
        v0, v1 = [v for v in range(src.t.shape[1]) if src.groups[v] == 0][:2]
        aa_sd[src.name] = float(np.log(m[:, v1] / m[:, v0]).std(ddof=1))
    print(
        "\nTrace A/A sd per round at x1: "
        + ", ".join(f"{k} {100 * v:.3f}%" for k, v in aa_sd.items())
        + ". The noise is scaled as in 'Choosing the floor multiple' (xS: every variant's log-time deviations from "
        "its median times S).\n"
    )
    print(
        "| noise x | A/A trials | FA fixed, worst budget (n) | FA fixed n=5 | FA adaptive, worst budget | "
        f"power n=10, real effects >= {100 * GOAL_EFFECT:g}% | power n=10, +-{100 * GOAL_EFFECT:g}% exactly | "
        f"adaptive, budget 10 rounds: power +-{100 * GOAL_EFFECT:g}% |"
    )
    print("|---|---|---|---|---|---|---|---|")
    stop_rows = []
    for s in GOAL_NOISE:
        fa = {n: [] for n in GOAL_BUDGETS}
        fa_ad = {n: [] for n in GOAL_BUDGETS}
        real, synth, synth_ad = [], [], []
        delays: dict = {(kind, how): [] for kind in ("aa", "2%") for how in ("looks", "every")}
        for src in sources:
            for tr in trials_for(scaled(src, s)):
                for n in GOAL_BUDGETS:
                    st = window_starts(tr.base.shape[0], n)
                    if not len(st):
                        continue
                    b, h, b2 = windows(tr.base, n, st), windows(tr.head, n, st), windows(tr.base2, n, st)
                    if tr.kind == "aa":
                        fa[n].append(np.isin(kernalin(b, h, b2)["verdict"], ("faster", "slower")))
                        if n in GOAL_ADAPTIVE_BUDGETS:
                            v, _, _ = sequential(b, h, b2, n, prune=True)
                            fa_ad[n].append(np.isin(v, ("faster", "slower")))
                        if n == 10:
                            for sign in (1, -1):
                                hs = h * (1 + GOAL_EFFECT) ** sign
                                want = "slower" if sign > 0 else "faster"
                                synth.append(kernalin(b, hs, b2)["verdict"] == want)
                                synth_ad.append(sequential(b, hs, b2, n, prune=True)[0] == want)
                    elif n == 10 and abs(np.log(tr.true_ratio)) >= np.log(1 + GOAL_EFFECT - 0.001):
                        real.append(kernalin(b, h, b2)["verdict"] == expected(tr))
                n_max = 50
                st = window_starts(tr.base.shape[0], n_max)
                if tr.kind == "effect" or s not in GOAL_STOP_NOISE or not len(st):
                    continue
                b, h, b2 = windows(tr.base, n_max, st), windows(tr.head, n_max, st), windows(tr.base2, n_max, st)
                for kind, heads in (("aa", (h,)), ("2%", (h * (1 + GOAL_EFFECT), h / (1 + GOAL_EFFECT)))):
                    for hs in heads:
                        for how in ("looks", "every"):
                            every = how == "every"
                            delays[kind, how].append(sequential(b, hs, b2, n_max, every_round=every, prune=True)[1])
        worst = max(GOAL_BUDGETS, key=lambda n: cat(fa[n]).mean() if fa[n] else -1)
        worst_ad = max(GOAL_ADAPTIVE_BUDGETS, key=lambda n: cat(fa_ad[n]).mean() if fa_ad[n] else -1)
        n_aa = len(cat(fa[5]))
        print(
            f"| {s} | {n_aa} | {cat(fa[worst]).mean():.4f} ({worst}) | {cat(fa[5]).mean():.4f} | "
            f"{cat(fa_ad[worst_ad]).mean():.4f} ({worst_ad}) | {cat(real).mean():.3f} ({len(cat(real))}) | "
            f"{cat(synth).mean():.3f} ({len(cat(synth))}) | {cat(synth_ad).mean():.3f} |"
        )
        for kind in ("aa", "2%"):
            if delays[kind, "looks"]:
                stop_rows.append((s, kind, cat(delays[kind, "looks"]), cat(delays[kind, "every"])))
    print(
        "\nWhen adaptive stopping ends (budget 50 rounds; A/A windows as they are, and with the head scaled by "
        f"+-{100 * GOAL_EFFECT:g}%): the round of the stop at the looks (5, 6, 8, 10, 12, 15, ...) against the same "
        "rule looking after every round\n"
    )
    print(
        "| noise x | pair | windows | rounds at the looks: median / 90th pct | every round: median / 90th pct | "
        "extra rounds of the looks: mean | ran to the budget (looks) |"
    )
    print("|---|---|---|---|---|---|---|")
    for s, kind, lk, ev in stop_rows:
        print(
            f"| {s} | {'A/A' if kind == 'aa' else kind} | {len(lk)} | "
            f"{np.median(lk):.0f} / {np.percentile(lk, 90):.0f} | "
            f"{np.median(ev):.0f} / {np.percentile(ev, 90):.0f} | {np.mean(lk - ev):.2f} | {np.mean(lk == 50):.3f} |"
        )


def section_throughput(count=2000):
    """Wall time of `kernalin-ci compare` on `count` trace files (200 rounds x 10 reps, with base2)."""
    import subprocess
    import tempfile

    print(f"\n## `kernalin-ci compare` throughput ({count} traces of 200 rounds x 10 reps with base2)\n")
    src = load_sources()[0]
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i in range(count):
            v = rng.integers(1, src.t.shape[1])
            p = os.path.join(tmp, f"t{i:05d}.npz")
            np.savez(p, base=src.t[:, 0], head=src.t[:, v], base2=src.t[:, 1])
            paths.append(p)
        exe = [sys.executable, "-m", "kernalin_ci", "compare"]
        t0 = time.perf_counter()
        subprocess.run(exe + paths[:1] + ["--json", os.devnull], check=True, cwd=ROOT)
        startup = time.perf_counter() - t0
        t0 = time.perf_counter()
        subprocess.run(exe + paths + ["--json", os.devnull, "--quiet"], check=True, cwd=ROOT)
        total = time.perf_counter() - t0
        t0 = time.perf_counter()
        from kernalin_ci.bench.trace import load_trace

        traces = [load_trace(p) for p in paths]
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        ks.compare_many([(tr.base, tr.head, tr.base2) for tr in traces])
        t_stats = time.perf_counter() - t0
    print(f"- one trace (process start-up included): {startup:.2f} s")
    print(
        f"- {count} traces in one process: {total:.2f} s ({1000 * (total - startup) / count:.2f} ms per trace "
        f"beyond start-up)"
    )
    print(f"- in-process: loading {t_load:.2f} s, statistics {t_stats:.2f} s ({ks.DRAWS} posterior draws each)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only",
        choices=("location", "table", "rounds", "floor", "sensitivity", "adaptive", "goals", "throughput"),
    )
    ap.add_argument("--traces", default=SHARED, help="folder of the shared timings_*.npz traces (README there)")
    ap.add_argument("--data", action="append", default=[], help="another directory of variants traces")
    ap.add_argument("--multiples", default=None, help="floor multiples for the adaptive section, e.g. 0.5,1")
    args = ap.parse_args(argv)
    sources = load_sources(args.data, args.traces)
    print("# kernalin-ci statistics evaluation")
    print(
        "\nSources: "
        + "; ".join(f"{s.name} {s.t.shape[0]} rounds x {s.t.shape[1]} variants x {s.t.shape[2]} reps" for s in sources)
    )
    t0 = time.perf_counter()
    for name, fn in (
        ("location", section_location),
        ("table", section_table),
        ("rounds", section_rounds),
        ("floor", section_floor),
        ("sensitivity", section_sensitivity),
        ("adaptive", section_adaptive),
        ("goals", section_goals),
        ("throughput", section_throughput),
    ):
        if args.only in (None, name):
            if name == "throughput":
                fn()
            elif name == "adaptive" and args.multiples:
                fn(sources, tuple(float(x) for x in args.multiples.split(",")))
            else:
                fn(sources)
    print(f"\n(evaluation took {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
