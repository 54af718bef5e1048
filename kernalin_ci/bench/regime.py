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
