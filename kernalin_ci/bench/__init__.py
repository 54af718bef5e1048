"""The baseline-versus-PR benchmark: interleaved timing rounds and Bayesian bootstrap verdicts.

- `stats.py`    posterior, noise floor, ROPE, verdicts, adaptive-stopping looks (numpy only)
- `trace.py`    the `compare` trace format (npz/json), validated on load
- `shapes.py`   the bench params (`--param batch=...`) -> each op's benchmark shapes (`Op.bench_cases`)
- `timing.py`   the timing loop inside the worker child (CUDA graphs + events, or a CPU wall clock), shared buffers
- `regime.py`   the timing regimes (warm, cold) and the default
- `pair.py`     `bench_pair()`: the parent side, what the CLI and the gate call
- `render.py`   text for verdicts and progress
"""

from kernalin_ci.bench.stats import Verdict, compare_many, compare_trace

__all__ = ["Verdict", "compare_trace", "compare_many"]  # bench_pair: kernalin_ci.bench.pair
