"""A launch of 3 programs, each calling a device function twice (one of them through an aliased builtin):
how many times the interpreter patches the language (runtime/interp_patches.py, aliased_builtins).

    TRITON_INTERPRET=1 python interp_nested_calls.py patched|unpatched

prints {"patches": N, "y": [...]}."""

import json
import sys

import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

tl_exp2 = tl.exp2


@triton.jit
def _twice(x):
    return x * 2.0


@triton.jit
def _exp2(x):
    return tl_exp2(x)


@triton.jit
def _kernel(X, Y, N: tl.constexpr):
    i = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(Y + i, _exp2(_twice(tl.load(X + i))))


if __name__ == "__main__":
    calls = [0]
    original = interpreter._patch_lang

    def counted(fn):
        calls[0] += 1
        return original(fn)

    interpreter._patch_lang = counted
    if sys.argv[1] == "patched":
        from kernalin_ci.runtime.interp_patches import aliased_builtins

        aliased_builtins()
    x = torch.arange(12, dtype=torch.float32) / 4
    y = torch.empty(12)
    try:
        _kernel[(3,)](x, y, N=4)
        print(json.dumps({"patches": calls[0], "y": y.tolist()}))
    except Exception as e:
        print(json.dumps({"patches": calls[0], "error": f"{type(e).__name__}: {e}"[:300]}))
