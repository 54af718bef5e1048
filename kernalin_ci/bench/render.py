"""The progress line of a benchmark round (never recomputes a statistic)."""

from __future__ import annotations

from kernalin_ci.bench.stats import Verdict


def progress_line(rounds: int, seconds: float, v: Verdict | None, clock: str) -> str:
    if v is None:
        return f"  bench round {rounds} ({seconds:.1f} s {clock})"
    return (
        f"  bench round {rounds} ({seconds:.1f} s {clock}): head/base {v.ratio:.4f} "
        f"[{v.hdi[0]:.4f}, {v.hdi[1]:.4f}]  P(faster) {v.p_faster:.2f}  P(eq) {v.p_equivalent:.2f}  "
        f"P(slower) {v.p_slower:.2f}  -> {v.verdict}"
    )
