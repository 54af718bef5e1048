"""Each op's benchmark shapes: realistic decode shapes by default, overridable.

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

import json

from kernalin_ci.errors import UsageError
from kernalin_ci.ops.base import DTYPES, Case

BENCH_KEYS = ("batch", "kv_len", "tokens", "dtype", "shapes")
ATTENTION = ("attention.decode", "attention.decode_paged")

GPU_DEFAULTS = {
    "attention": [{"batch": 1, "kv_len": 32768}, {"batch": 16, "kv_len": 4096}, {"batch": 128, "kv_len": 512}],
    "tokens": [{"tokens": 1}, {"tokens": 64}, {"tokens": 256}],
}
CPU_DEFAULTS = {  # one small shape: an interpreted attention call takes a second or more
    "attention": [{"batch": 2, "kv_len": 24}],
    "tokens": [{"tokens": 4}],
}
MODEL = {"cuda": {"Hq": 32, "Hkv": 8, "D": 128, "dtype": "bfloat16", "num_blocks": 2048},
         "cpu": {"Hq": 4, "Hkv": 2, "D": 32, "dtype": "float32", "num_blocks": 8}}


def split_params(raw: dict) -> tuple[dict, dict]:
    """--param items -> (op params, bench params)."""
    op_params = {k: v for k, v in raw.items() if k not in BENCH_KEYS}
    bench = {k: v for k, v in raw.items() if k in BENCH_KEYS}
    return op_params, bench


def _ints(key: str, v) -> list[int]:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            raise UsageError(f"--param {key}={v!r}: expected an integer or a list of integers") from None
    vals = v if isinstance(v, list) else [v]
    if not vals or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in vals):
        raise UsageError(f"--param {key}={v!r}: expected a positive integer or a list of them")
    return vals


def _grid(bench: dict, device: str, kind: str) -> list[dict]:
    if "shapes" in bench:
        shapes = bench["shapes"]
        if isinstance(shapes, str):
            try:
                shapes = json.loads(shapes)
            except json.JSONDecodeError as e:
                raise UsageError(f"--param shapes: not valid JSON: {e}") from None
        if not isinstance(shapes, list) or not shapes or not all(isinstance(s, dict) for s in shapes):
            raise UsageError("bench param 'shapes' must be a non-empty list of objects")
        out = []
        for s in shapes:
            bad = set(s) - {"batch", "kv_len", "tokens"}
            if bad:
                raise UsageError(f"bench shape {s}: unknown keys {sorted(bad)} (use batch, kv_len, tokens)")
            out.append({k: _ints(k, v)[0] for k, v in s.items()} | {"explicit": True})
        return out
    defaults = (GPU_DEFAULTS if device == "cuda" else CPU_DEFAULTS)[kind]
    if kind == "attention" and ("batch" in bench or "kv_len" in bench):
        batches = _ints("batch", bench["batch"]) if "batch" in bench else sorted({d["batch"] for d in defaults})
        lens = _ints("kv_len", bench["kv_len"]) if "kv_len" in bench else sorted({d["kv_len"] for d in defaults})
        return [{"batch": b, "kv_len": L, "explicit": "kv_len" in bench} for b in batches for L in lens]
    if kind == "tokens" and "tokens" in bench:
        return [{"tokens": t} for t in _ints("tokens", bench["tokens"])]
    return [dict(d) for d in defaults]


def kv_lens(batch: int, kv_len: int, ragged: bool) -> list[int]:
    """Ragged lengths spread evenly over kv_len/2 .. kv_len (the last is kv_len)."""
    if batch == 1 or not ragged:
        return [kv_len] * batch
    lo = max(1, kv_len // 2)
    return [lo + round(i * (kv_len - lo) / (batch - 1)) for i in range(batch)]


def bench_cases(op_name: str, params: dict, device: str, bench: dict | None = None) -> list[Case]:
    """The Cases to time (op params already resolved; bench params from split_params)."""
    bench = dict(bench or {})
    unknown = set(bench) - set(BENCH_KEYS)
    if unknown:
        raise UsageError(f"unknown bench params {sorted(unknown)} (bench params: {', '.join(BENCH_KEYS)})")
    m = MODEL["cuda" if device == "cuda" else "cpu"]
    dtype = bench.get("dtype", m["dtype"])
    if dtype not in DTYPES:
        raise UsageError(f"--param dtype={dtype!r} must be one of {', '.join(DTYPES)}")
    hq = params.get("num_q_heads") or m["Hq"]
    hkv = params.get("num_kv_heads") or (m["Hkv"] if hq % m["Hkv"] == 0 else 1)
    D = params.get("head_dim") or m["D"]
    if op_name == "rope" and params.get("rotary_dim") and params["rotary_dim"] > D:
        D = params["rotary_dim"]
    if hq % hkv:
        raise UsageError(f"bench shapes: num_q_heads {hq} is not a multiple of num_kv_heads {hkv}")
    cases = []
    if op_name in ATTENTION:
        for i, s in enumerate(_grid(bench, device, "attention")):
            if "batch" not in s or "kv_len" not in s:
                raise UsageError(f"bench shape {s}: attention shapes need batch and kv_len")
            lens = kv_lens(s["batch"], s["kv_len"], ragged=not s.get("explicit"))
            dims = {"Hq": hq, "Hkv": hkv, "D": D, "kv_lens": lens, "scale": D ** -0.5}
            cases.append(Case(f"B={s['batch']} kv_len={_len_label(lens)} Hq={hq} Hkv={hkv} D={D} {dtype}",
                              dims, dtype, 1000 + i, ("bench",)))
    elif op_name == "rope":
        mp = params.get("max_position", 65536)
        for i, s in enumerate(_grid(bench, device, "tokens")):
            if "tokens" not in s:
                raise UsageError(f"bench shape {s}: rope shapes need tokens")
            dims = {"T": s["tokens"], "Hq": hq, "Hkv": hkv, "D": D}
            cases.append(Case(f"T={s['tokens']} Hq={hq} Hkv={hkv} D={D} {dtype} (positions < {mp})",
                              dims, dtype, 1000 + i, ("bench",)))
    elif op_name == "kv_append":
        bs = params.get("block_size", 16)
        for i, s in enumerate(_grid(bench, device, "tokens")):
            if "tokens" not in s:
                raise UsageError(f"bench shape {s}: kv_append shapes need tokens")
            nb = max(m["num_blocks"], -(-2 * s["tokens"] // bs))
            dims = {"T": s["tokens"], "Hkv": hkv, "D": D, "num_blocks": nb, "padding": 0}
            cases.append(Case(f"T={s['tokens']} Hkv={hkv} D={D} {dtype} ({nb} blocks of {bs})",
                              dims, dtype, 1000 + i, ("bench",)))
    elif op_name == "custom":
        for i, c in enumerate((params.get("cases") or [{}])[:4]):
            cases.append(Case(f"custom case {i}", dict(c), bench.get("dtype", c.get("dtype", dtype)), 1000 + i,
                              ("bench",)))
    else:
        raise UsageError(f"op {op_name}: no benchmark shapes")
    return cases


def _len_label(lens: list[int]) -> str:
    lo, hi = min(lens), max(lens)
    return str(hi) if lo == hi else f"{lo}..{hi}"
