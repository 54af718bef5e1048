"""Two constructs of production kernels the Triton interpreter cannot run as it is (runtime/interp_patches.py):
libdevice.pow (xformers' rope_padded computes its frequencies with it) and a language builtin held under
another name in the kernel's module (`tl_exp2 = tl.exp2`, as LMDeploy's kernels do).

    TRITON_INTERPRET=1 python interp_pow_alias.py patched|unpatched

prints {"pow": [...], "exp2": [...]} or {"error": "..."}."""
import json
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

tl_exp2 = tl.exp2


@triton.jit
def _pow(X, Y, O, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(O + i, libdevice.pow(tl.load(X + i), tl.load(Y + i)))


@triton.jit
def _alias(X, O, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(O + i, tl_exp2(tl.load(X + i)))


if __name__ == "__main__":
    if sys.argv[1] == "patched":
        from kernalin_ci.runtime.interp_patches import aliased_builtins, libdevice_math

        libdevice_math()
        aliased_builtins()
    out = {}
    x, y = torch.tensor([2.0, -2.0, 1e4, 0.0]), torch.tensor([0.5, 3.0, -0.25, 0.0])
    for name, run in (
        ("pow", lambda o: _pow[(1,)](x, y, o, N=4)),
        ("exp2", lambda o: _alias[(1,)](torch.tensor([0.0, 1.0, -1.0, 3.0]), o, N=4)),
    ):
        o = torch.empty(4)
        try:
            run(o)
            out[name] = o.tolist()
        except Exception as e:
            out[name] = f"error: {type(e).__name__}: {e}"[:300]
    print(json.dumps(out))
