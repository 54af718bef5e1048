"""Timing regimes of a benchmark sample (docs/benchmarking.md, "Timing regimes").

- `warm`: `inner` back-to-back launches on the same inputs after one L2 flush per sample,
  so launches 2..inner find their inputs in L2 (a kernel run many times in a row).
- `cold`: launch j of a sample reads copy j mod n of every input, with enough copies to
  span twice the L2, so every launch reads memory that is not in L2 (a kernel run once per
  layer between other kernels, as in a decode step).
"""

REGIMES = ("warm", "cold")
DEFAULT_REGIME = "cold"  # H200 live evaluation: warm gave 25/360 false per-shape A/A verdicts, cold 0/210
# (docs/statistics.md, "Live evaluation")

# Per launch, below this the ratio of two kernels depends on the timing context: on the H200 the
# benchmark, other contexts and profilers put launch-config ratios of 1.5-7 us kernels 1-5% apart
# (same direction for effects of 2% or more), of a 0.2 ms attention 0.1-0.4% (docs/statistics.md,
# "Micro-kernels"). Shapes under it get a note (bench.pair.micro_note); their verdicts stand.
MICRO_US = 10.0


def is_micro(base_ms: float | None) -> bool:
    """A shape whose base takes `base_ms` per launch (None: not timed) runs under MICRO_US."""
    return base_ms is not None and base_ms * 1e3 < MICRO_US
