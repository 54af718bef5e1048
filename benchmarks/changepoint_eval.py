"""Evaluate change-point detection on commit series built from H200 timing traces (docs/history.md).

    python benchmarks/changepoint_eval.py --traces DIR [--series 40] [--session-noise S] [--edivisive]

Each synthetic commit is one gate run: ROUNDS consecutive rounds from a random place in a trace (of one of the two
identical A/A instances, picked at random per commit), its time the median of their samples. A series
has N commits; changes are injected as a step at commit N/2 (+0.5%, +1%, +2%), as a linear drift over
30 commits (+1%, +2% in total), or taken from the trace itself (attn: kv_len 4096 -> 4116, a measured
+1.1%). A change point counts as a detection when it lies within TOL commits of the step (or inside the
drift's span widened by TOL); every other change point is a false one. Prints a Markdown table.
Evaluation only: nothing in CI reads the traces.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kernalin_ci.history import changepoints  # noqa: E402

N = 100
ROUNDS = 10
TOL = 3
DRIFT = (40, 70)


SESSION = [0.0]  # --session-noise: a relative N(0, sigma) offset per commit (a fresh GPU session each run)


def commit_times(t: np.ndarray, rng, n: int, variants=(0, 1)) -> np.ndarray:
    out = np.empty(n)
    for i in range(n):
        v = variants[rng.integers(len(variants))]
        start = rng.integers(0, t.shape[0] - ROUNDS + 1)  # consecutive rounds: the trace's slow drift counts
        out[i] = np.median(t[start : start + ROUNDS, v, :])
    return out * (1 + rng.normal(0, SESSION[0], n)) if SESSION[0] else out


def scenarios(t: np.ndarray, name: str):
    yield "none", None, lambda rng: commit_times(t, rng, N)
    for s in (0.005, 0.01, 0.02):
        yield (
            f"step +{s:.1%}",
            ("step", N // 2),
            lambda rng, s=s: commit_times(t, rng, N) * np.r_[np.ones(N // 2), np.full(N - N // 2, 1 + s)],
        )
    for d in (0.01, 0.02):
        ramp = np.clip((np.arange(N) - DRIFT[0]) / (DRIFT[1] - DRIFT[0]), 0, 1) * d
        yield f"drift +{d:.0%} over 30", ("drift", DRIFT), lambda rng, r=ramp: commit_times(t, rng, N) * (1 + r)
    if name == "attn":  # a real step: the trace's kv_len 4116 variant (measured ratio 1.0111)
        yield (
            "trace step (attn 4096->4116, +1.1%)",
            ("step", N // 2),
            lambda rng: np.r_[commit_times(t, rng, N // 2), commit_times(t, rng, N - N // 2, variants=(2,))],
        )


def score(cps: list[int], truth) -> tuple[bool, int]:
    if truth is None:
        return False, len(cps)
    kind, where = truth
    lo, hi = (where - TOL, where + TOL) if kind == "step" else (where[0] - TOL, where[1] + TOL)
    hits = [c for c in cps if lo <= c <= hi]  # a drift may be cut into several steps: all inside are true
    return bool(hits), len(cps) - len(hits)


def pelt(penalty):
    def f(x):
        found = changepoints.detect(x, penalty=penalty)
        return [c.index for c in found or []]

    return f


def edivisive(x):
    from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive

    return sorted(e_divisive(x, pvalue=0.05, permutations=100))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", required=True, help="the directory of timings_{attn,rope,copy}.npz")
    ap.add_argument("--series", type=int, default=40)
    ap.add_argument("--penalties", default="2,3,5")
    ap.add_argument("--edivisive", action="store_true", help="also E-divisive (signal-processing-algorithms)")
    ap.add_argument(
        "--session-noise",
        type=float,
        default=0.0,
        help="relative sd of a per-commit offset the traces do not hold (between GPU sessions)",
    )
    a = ap.parse_args()
    SESSION[0] = a.session_noise
    methods = {f"PELT pen={p}*log n": pelt(float(p)) for p in a.penalties.split(",")}
    if a.edivisive:
        methods["E-divisive p<0.05"] = edivisive
    print(
        f"{a.series} series of {N} commits per row; a commit = median of {ROUNDS} consecutive rounds; "
        f"detection within +-{TOL} commits; per-commit session noise "
        f"{a.session_noise:.2%}\n"
    )
    print("| trace | change | method | detected | false change points / 100 commits | ms per series |")
    print("|---|---|---|---|---|---|")
    for name in ("attn", "rope", "copy"):
        path = Path(a.traces) / f"timings_{name}.npz"
        if not path.is_file():
            print(f"{path}: missing", file=sys.stderr)
            return 2
        t = np.load(path)["t"]
        for label, truth, make in scenarios(t, name):
            for mname, method in methods.items():
                rng = np.random.default_rng(12345)  # the same series for every method
                det, false, secs = 0, 0, 0.0
                for _ in range(a.series):
                    x = make(rng)
                    t0 = time.perf_counter()
                    cps = method(x)
                    secs += time.perf_counter() - t0
                    hit, nf = score(cps, truth)
                    det += hit
                    false += nf
                rate = "-" if truth is None else f"{det / a.series:.0%}"
                print(
                    f"| {name} | {label} | {mname} | {rate} | {100 * false / (a.series * N):.2f} | "
                    f"{1000 * secs / a.series:.1f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
