"""Text rendering of verdicts and progress (never recomputes a statistic)."""
from __future__ import annotations

from kernalin_ci.bench.stats import Verdict


def pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def verdict_line(v: Verdict, label: str = "") -> str:
    rho = v.rope_half_width
    floor = f", A/A floor {100 * v.floor:.2f}%" if v.floor is not None else ""
    src = {"fixed": "fixed", "minimum": "minimum", "floor": "from the floor"}.get(v.rope_source, v.rope_source)
    head = f"{label}  " if label else ""
    return (f"{head}{v.verdict.upper():12s} head/base {v.ratio:.4f} ({pct(v.ratio - 1)}), 95% HDI "
            f"[{v.hdi[0]:.4f}, {v.hdi[1]:.4f}]; P(faster) {v.p_faster:.3f}, P(equivalent) {v.p_equivalent:.3f}, "
            f"P(slower) {v.p_slower:.3f}; ROPE +-{100 * rho:.2f}% ({src}{floor}); {v.rounds} rounds")


def summary_sentence(v: Verdict) -> str:
    """One sentence for a report: e.g. '99.4% of the posterior mass sits below the ROPE'."""
    rho = 100 * v.rope_half_width
    if v.verdict == "faster":
        return f"{100 * v.p_faster:.1f}% of the posterior mass sits below the ROPE (-{rho:.2f}%): head is faster"
    if v.verdict == "slower":
        return f"{100 * v.p_slower:.1f}% of the posterior mass sits above the ROPE (+{rho:.2f}%): head is slower"
    if v.verdict == "equivalent":
        return f"{100 * v.p_equivalent:.1f}% of the posterior mass sits inside the ROPE (+-{rho:.2f}%): equivalent"
    return (f"no side holds 95% of the posterior mass (faster {100 * v.p_faster:.1f}%, equivalent "
            f"{100 * v.p_equivalent:.1f}%, slower {100 * v.p_slower:.1f}%): inconclusive")


def progress_line(rounds: int, seconds: float, v: Verdict | None, clock: str) -> str:
    if v is None:
        return f"  bench round {rounds} ({seconds:.1f} s {clock})"
    return (f"  bench round {rounds} ({seconds:.1f} s {clock}): head/base {v.ratio:.4f} "
            f"[{v.hdi[0]:.4f}, {v.hdi[1]:.4f}]  P(faster) {v.p_faster:.2f}  P(eq) {v.p_equivalent:.2f}  "
            f"P(slower) {v.p_slower:.2f}  -> {v.verdict}")
