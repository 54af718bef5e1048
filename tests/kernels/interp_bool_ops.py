"""`and` / `or` between blocks, the idiom of xformers' rope_padded picking Llama-3.1's middle band
(`is_mid = hi < w and w <= lo`): `python interp_bool_ops.py patched|unpatched` under TRITON_INTERPRET=1 prints
the stored flags as JSON (compiled, Triton applies logical_and / logical_or elementwise)."""
import json
import sys

import torch
import triton
import triton.language as tl

if sys.argv[1] == "patched":
    from kernalin_ci.runtime.interp_patches import boolean_operators

    assert boolean_operators()


@triton.jit
def bands(W, O, lo, hi, N):
    i = tl.arange(0, 8)
    w = tl.load(W + i)
    mid = hi < w and w <= lo  # blocks: elementwise
    out = w < hi or lo < w
    few = N > 3 and N < 10  # scalars: Python's short circuit, the same value
    tl.store(O + i, mid.to(tl.int32) + 2 * out.to(tl.int32) + 4 * few.to(tl.int32))


w = torch.arange(8, dtype=torch.float32)
o = torch.zeros(8, dtype=torch.int32)
bands[(1,)](w, o, 5.0, 2.0, 5)
print(json.dumps({"flags": o.tolist()}))
