"""Text lines of the `bench` and `compare` commands: a verdict per line and the progress lines
(never recomputes a statistic; the verdict's wording is kernalin_ci.report.text's)."""

from __future__ import annotations

from kernalin_ci.bench.stats import Verdict
from kernalin_ci.report.text import verdict_words


def verdict_line(v: Verdict, label: str = "") -> str:
    """One line per verdict for `bench` and `compare`: the verdict in capitals (a column to scan),
    head/base, the verdict's figures in the report's own words (kernalin_ci.report.text.verdict_words),
    where the equivalence margin came from, and the rounds."""
    words = verdict_words(v)
    floor = f", A/A floor {100 * v.floor:.2f}%" if v.floor is not None else ""
    src = {"fixed": "fixed", "minimum": "minimum", "floor": "from the floor"}.get(v.rope_source, v.rope_source)
    head = f"{label}  " if label else ""
    return f"{head}{v.verdict.upper():12s} head/base {v.ratio:.4f}: {words} ({src}{floor}); {v.rounds} rounds"


def progress_line(rounds: int, seconds: float, v: Verdict | None, clock: str) -> str:
    if v is None:
        return f"  bench round {rounds} ({seconds:.1f} s {clock})"
    return (
        f"  bench round {rounds} ({seconds:.1f} s {clock}): head/base {v.ratio:.4f} "
        f"[{v.hdi[0]:.4f}, {v.hdi[1]:.4f}]  P(faster) {v.p_faster:.2f}  P(eq) {v.p_equivalent:.2f}  "
        f"P(slower) {v.p_slower:.2f}  -> {v.verdict}"
    )
