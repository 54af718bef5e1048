"""Benchmark shapes: realistic decode shapes by default, overridable; each op builds its own
(`Op.bench_cases`, defaults in kernalin_ci/ops/bench_shapes.py).

Defaults on a GPU follow a Llama-like model (Hq 32, Hkv 8, D 128, bfloat16) and
span the decode regimes a kernel change can trade against each other: one long
sequence (split-KV territory), a mid-size batch, a large batch of short
sequences. Batched sequences get ragged lengths (kv_len/2 .. kv_len), as a
serving batch has. On the CPU (the Triton interpreter) the shapes are tiny and
float32, because the interpreter is slow and not faithful in bfloat16.

Bench params come from `--param` (and .kernalin.yml) next to the op's own params:
  batch=N | [N, ...]      sequences per call (attention ops)
  kv_len=N | [N, ...]     sequence length; with it every sequence has exactly kv_len
  tokens=N | [N, ...]     tokens per call (rope, kv_append)
  dtype=float16|bfloat16|float32
  shapes=[{...}, ...]     explicit list, e.g. [{"batch": 1, "kv_len": 32768}, {"batch": 64, "kv_len": 2048}]
Head counts and the head dim come from the op params `num_q_heads`,
`num_kv_heads`, `head_dim` where the op has them.
"""

from __future__ import annotations

from kernalin_ci.errors import UsageError
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import DTYPES, Case
from kernalin_ci.ops.bench_shapes import BenchRequest

BENCH_KEYS = ("batch", "kv_len", "tokens", "dtype", "shapes")


def split_params(raw: dict) -> tuple[dict, dict]:
    """--param items -> (op params, bench params)."""
    op_params = {k: v for k, v in raw.items() if k not in BENCH_KEYS}
    bench = {k: v for k, v in raw.items() if k in BENCH_KEYS}
    return op_params, bench


def bench_cases(op_name: str, params: dict, device: str, bench: dict | None = None) -> list[Case]:
    """The Cases to time (op params already resolved; bench params from split_params): the op's own
    `bench_cases` for this request."""
    bench = dict(bench or {})
    unknown = set(bench) - set(BENCH_KEYS)
    if unknown:
        raise UsageError(f"unknown bench params {sorted(unknown)} (bench params: {', '.join(BENCH_KEYS)})")
    request = BenchRequest(device, bench)
    dtype = bench.get("dtype", request.model["dtype"])
    if dtype not in DTYPES:
        raise UsageError(f"bench param dtype={dtype!r} must be one of {', '.join(DTYPES)}")
    return get_op(op_name).bench_cases(params, device, request)
