"""What a benchmark asks of an op: the bench params and the device's default model.

`kernalin_ci/bench/shapes.py` parses the bench params (`--param batch=...`) into a
`BenchRequest`; each op turns it into Cases (`Op.bench_cases`). Defaults on a GPU
follow a Llama-like model (Hq 32, Hkv 8, D 128, bfloat16) and span the decode
regimes a kernel change can trade against each other: one long sequence
(split-KV territory), a mid-size batch, a large batch of short sequences. On the
CPU (the Triton interpreter) the shapes are tiny and float32.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kernalin_ci.device import DEVICES
from kernalin_ci.errors import UsageError

GPU_DEFAULTS = {
    "attention": [{"batch": 1, "kv_len": 32768}, {"batch": 16, "kv_len": 4096}, {"batch": 128, "kv_len": 512}],
    "tokens": [{"tokens": 1}, {"tokens": 64}, {"tokens": 256}],
}
CPU_DEFAULTS = {  # one small shape: an interpreted attention call takes a second or more
    "attention": [{"batch": 2, "kv_len": 24}],
    "tokens": [{"tokens": 4}],
}
GPU_MODEL: dict[str, Any] = {"Hq": 32, "Hkv": 8, "D": 128, "dtype": "bfloat16", "num_blocks": 2048}
CPU_MODEL: dict[str, Any] = {"Hq": 4, "Hkv": 2, "D": 32, "dtype": "float32", "num_blocks": 8}


@dataclass(frozen=True)
class BenchRequest:
    """The bench params as given (batch, kv_len, tokens, dtype, shapes) on a device."""

    device: str
    given: dict[str, Any]

    @property
    def model(self) -> dict[str, Any]:
        return GPU_MODEL if DEVICES[self.device].gpu else CPU_MODEL

    @property
    def dtype(self) -> str:
        return str(self.given.get("dtype", self.model["dtype"]))

    def heads(self, params: dict[str, Any]) -> tuple[int, int, int]:
        """(Hq, Hkv, D): the op params `num_q_heads`, `num_kv_heads`, `head_dim` where set, else the model's."""
        m = self.model
        hq = int(params.get("num_q_heads") or m["Hq"])
        hkv = int(params.get("num_kv_heads") or (m["Hkv"] if hq % m["Hkv"] == 0 else 1))
        D = int(params.get("head_dim") or m["D"])
        if hq % hkv:
            raise UsageError(f"bench shapes: num_q_heads {hq} is not a multiple of num_kv_heads {hkv}")
        return hq, hkv, D

    def attention_shapes(self) -> list[dict[str, Any]]:
        """{batch, kv_len, explicit}: explicit lengths are used as given, the others made ragged."""
        shapes = self._grid("attention")
        for s in shapes:
            if "batch" not in s or "kv_len" not in s:
                raise UsageError(f"bench shape {s}: attention shapes need batch and kv_len")
        return shapes

    def token_shapes(self, op_name: str) -> list[dict[str, Any]]:
        """{tokens}: the tokens per call."""
        shapes = self._grid("tokens")
        for s in shapes:
            if "tokens" not in s:
                raise UsageError(f"bench shape {s}: {op_name} shapes need tokens")
        return shapes

    def _grid(self, kind: str) -> list[dict[str, Any]]:
        bench = self.given
        if "shapes" in bench:
            shapes = bench["shapes"]
            if isinstance(shapes, str):
                try:
                    shapes = json.loads(shapes)
                except json.JSONDecodeError as e:
                    raise UsageError(f"bench param shapes: not valid JSON: {e}") from None
            if not isinstance(shapes, list) or not shapes or not all(isinstance(s, dict) for s in shapes):
                raise UsageError("bench param 'shapes' must be a non-empty list of objects")
            out = []
            for s in shapes:
                bad = set(s) - {"batch", "kv_len", "tokens"}
                if bad:
                    raise UsageError(f"bench shape {s}: unknown keys {sorted(bad)} (use batch, kv_len, tokens)")
                out.append({k: _ints(k, v)[0] for k, v in s.items()} | {"explicit": True})
            return out
        defaults = (GPU_DEFAULTS if DEVICES[self.device].gpu else CPU_DEFAULTS)[kind]
        if kind == "attention" and ("batch" in bench or "kv_len" in bench):
            batches = _ints("batch", bench["batch"]) if "batch" in bench else sorted({d["batch"] for d in defaults})
            lens = _ints("kv_len", bench["kv_len"]) if "kv_len" in bench else sorted({d["kv_len"] for d in defaults})
            return [{"batch": b, "kv_len": L, "explicit": "kv_len" in bench} for b in batches for L in lens]
        if kind == "tokens" and "tokens" in bench:
            return [{"tokens": t} for t in _ints("tokens", bench["tokens"])]
        return [dict(d) for d in defaults]


def _ints(key: str, v: Any) -> list[int]:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            raise UsageError(f"bench param {key}={v!r}: expected an integer or a list of integers") from None
    vals = v if isinstance(v, list) else [v]
    if not vals or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in vals):
        raise UsageError(f"bench param {key}={v!r}: expected a positive integer or a list of them")
    return vals


def ragged_lens(batch: int, kv_len: int, ragged: bool) -> list[int]:
    """Ragged lengths spread evenly over kv_len/2 .. kv_len (the last is kv_len)."""
    if batch == 1 or not ragged:
        return [kv_len] * batch
    lo = max(1, kv_len // 2)
    return [lo + round(i * (kv_len - lo) / (batch - 1)) for i in range(batch)]


def len_label(lens: list[int]) -> str:
    lo, hi = min(lens), max(lens)
    return str(hi) if lo == hi else f"{lo}..{hi}"
