"""The posterior chart of a benchmark verdict: a mermaid `xychart-beta` that GitHub renders in a comment.

Bars: the posterior of head/base from the verdict's `posterior_hist` ({"edges", "density"}), as the
percentage of posterior mass per bar. Line: a plateau at the top of the chart over the ROPE band.
The x-axis is a grid of head/base values with a round step whose bar centres include 1.0 exactly
(one bar is labelled `1.000`, or `1.00` on a coarser grid), wide enough to show the posterior, the
ROPE and 1.0 together, with at most MAX_BARS bars.

Putting the given histogram on that grid is drawing, not statistics: each source bin's mass is
spread uniformly over its width and added to the bars it overlaps. No estimate is derived from it.
"""

from __future__ import annotations

import json
import math

from kernalin_ci.report.text import rope_text

MAX_BARS = 30
STEPS = (0.0005, 0.001, 0.002, 0.0025, 0.005, 0.01, 0.02, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0)
WIDTH, HEIGHT, LABEL_PX = 900, 300, 11


def _histogram(v) -> tuple[list[float], list[float]] | None:
    """(edges, mass per bin) from verdict V's posterior_hist, or None when it is absent or malformed."""
    h = v.posterior_hist
    if not isinstance(h, dict):
        return None
    edges, density = h.get("edges"), h.get("density")
    if not isinstance(edges, list) or not isinstance(density, list) or len(edges) != len(density) + 1 or not density:
        return None
    try:
        edges = [float(e) for e in edges]
        density = [float(d) for d in density]
    except (TypeError, ValueError):
        return None
    if not all(math.isfinite(x) for x in edges + density) or any(d < 0 for d in density):
        return None
    if any(b2 <= b1 for b1, b2 in zip(edges, edges[1:])):
        return None
    mass = [d * (e2 - e1) for d, e1, e2 in zip(density, edges, edges[1:])]
    return (edges, mass) if sum(mass) > 0 else None


def _grid(lo: float, hi: float) -> tuple[float, int, int]:
    """(step, first, count): bars centred on k * step for k in [first, first + count), covering [lo, hi]."""
    for step in STEPS:
        first = math.floor(lo / step + 0.5)
        last = math.floor(hi / step + 0.5)
        if last - first + 1 <= MAX_BARS:
            return step, first, last - first + 1
    step = STEPS[-1]
    first = math.floor(lo / step + 0.5)
    return step, first, math.floor(hi / step + 0.5) - first + 1


def _rebin(edges: list[float], mass: list[float], step: float, first: int, count: int) -> list[float]:
    out = [0.0] * count
    for m, a, b in zip(mass, edges, edges[1:]):
        if m == 0:
            continue
        k0 = max(first, math.floor(a / step + 0.5))
        k1 = min(first + count - 1, math.floor(b / step + 0.5))
        for k in range(k0, k1 + 1):
            lo, hi = max(a, (k - 0.5) * step), min(b, (k + 0.5) * step)
            if hi > lo:
                out[k - first] += m * (hi - lo) / (b - a)
    return out


def posterior_chart(v) -> str | None:
    """The mermaid chart (a fenced ```mermaid block) for benchmark Verdict V; None without posterior_hist."""
    hist = _histogram(v) if v is not None else None
    if hist is None:
        return None
    edges, mass = hist
    total = sum(mass)
    rope = v.rope or [1.0, 1.0]
    try:
        rlo, rhi = float(rope[0]), float(rope[1])
    except (TypeError, ValueError, IndexError):
        rlo = rhi = 1.0
    lo, hi = min(edges[0], rlo, 1.0), max(edges[-1], rhi, 1.0)
    step, first, count = _grid(lo, hi)
    bars = [100 * m / total for m in _rebin(edges, mass, step, first, count)]
    decimals = next(d for d in range(8) if abs(round(step, d) - step) < 1e-12)
    labels = [f"{k * step:.{decimals}f}" for k in range(first, first + count)]
    top = max(bars)
    y_max = min(100, max(1, math.ceil(top * 1.1)))
    band = [float(y_max) if rlo - 1e-12 <= k * step <= rhi + 1e-12 else 0.0 for k in range(first, first + count)]
    title = f"Posterior of head/base (bars, % of mass); line: equivalence margin {rope_text([rlo, rhi])}"
    lines = [
        "```mermaid",
        "%%{init: "
        + json.dumps({"xyChart": {"width": WIDTH, "height": HEIGHT, "xAxis": {"labelFontSize": LABEL_PX}}})
        + "}%%",
        "xychart-beta",
        f'    title "{title}"',
        '    x-axis "head/base (below 1.000: head faster)" [' + ", ".join(f'"{x}"' for x in labels) + "]",
        f'    y-axis "posterior mass (%)" 0 --> {y_max}',
        "    bar [" + ", ".join(f"{v:.2f}" for v in bars) + "]",
        "    line [" + ", ".join(f"{v:g}" for v in band) + "]",
        "```",
    ]
    return "\n".join(lines)
