"""Change points of a timing series: PELT (ruptures) on log times scaled by their noise.

A step of a few tenths of a percent is invisible in one PR's verdict when it came in small pieces
(a slow drift), but shows as a change in the level of the series of recorded commits. The series is
put on a log scale (a change is a ratio), divided by a robust estimate of its commit-to-commit noise
(the median absolute difference of neighbours), and segmented by PELT with an L2 cost and a penalty
of PENALTY * log(n): a change point is where the level differs on either side by more than noise
explains. ruptures' KernelCPD with the linear kernel is that PELT (the linear kernel's cost is the
L2 cost) in C: the same segmentation as `Pelt(model="l2")`, a thousand times faster (1000 commits:
1.5 ms instead of 5.6 s). docs/history.md has the comparison with E-divisive and the evaluation on H200 traces
(benchmarks/changepoint_eval.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PENALTY = 3.0  # times log(n); chosen on the H200 traces (docs/history.md)
MIN_SIZE = 3  # commits on each side of a change at least
MIN_POINTS = 8  # shorter series are not analysed
NOISE_FLOOR = 1e-4  # relative: series quieter than this are treated as this noisy


@dataclass
class ChangePoint:
    index: int  # the first point of the new level
    before: float  # the level (median) before and after
    after: float

    @property
    def ratio(self) -> float:
        return self.after / self.before


def noise_scale(logs: np.ndarray) -> float:
    """Commit-to-commit noise of a log series: the median absolute first difference, scaled to a standard
    deviation for Gaussian noise (MAD of a difference of two draws = 0.954 sigma)."""
    d = np.abs(np.diff(logs))
    return max(float(np.median(d)) / 0.954, NOISE_FLOOR) if d.size else NOISE_FLOOR


def detect(values, penalty: float = PENALTY, min_size: int = MIN_SIZE) -> list[ChangePoint] | None:
    """Change points of VALUES (positive times, oldest first); None when the series is too short to analyse."""
    import ruptures

    x = np.asarray([v for v in values], dtype=np.float64)
    if x.size < MIN_POINTS or not np.all(np.isfinite(x)) or np.any(x <= 0):
        return None
    logs = np.log(x)
    z = (logs - np.median(logs)) / noise_scale(logs)
    bkps = (
        ruptures.KernelCPD(kernel="linear", min_size=min_size)
        .fit(z.reshape(-1, 1))
        .predict(pen=penalty * math.log(x.size))
    )
    edges = [0] + [b for b in bkps]
    out = []
    for i, b in enumerate(bkps[:-1]):
        before = float(np.median(x[edges[i] : b]))
        after = float(np.median(x[b : edges[i + 2]]))
        out.append(ChangePoint(b, before, after))
    return out
