"""A scalar comparison and-ed with a block mask (`(pid < H) & (r < n)`), the idiom of ColossalAI's rotary
kernel: `python interp_scalar_mask.py patched|unpatched` under TRITON_INTERPRET=1 prints the stored row or
the interpreter's error as JSON."""
import json
import sys

import torch
import triton
import triton.language as tl

if sys.argv[1] == "patched":
    from kernalin_ci.runtime.interp_patches import int1_comparisons

    assert int1_comparisons()


@triton.jit
def masked_copy(X, Y, N, H: tl.constexpr, BLOCK: tl.constexpr):
    h = tl.program_id(0)
    r = tl.arange(0, BLOCK)
    m = (h < H) & (r < N)
    x = tl.load(X + h * BLOCK + r, mask=m, other=-1.0)
    tl.store(Y + h * BLOCK + r, x, mask=(h < 3) & (r < BLOCK))


x = torch.arange(24.0)
y = torch.zeros(24)
try:
    masked_copy[(3,)](x, y, 5, 2, 8)  # heads 0-1 copy 5 values, head 2 is past H: all -1
    print(json.dumps({"y": y.tolist()}))
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
