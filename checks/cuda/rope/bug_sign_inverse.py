"""RoPE that applies the inverse rotation (CUDA C++)

Parent: correct_neox.py. Injected bug, rope.cu under BUG_SIGN: `x*c + y*s` and `y*c - x*s` where they should be
`x*c - y*s` and `y*c + x*s`: every vector is rotated by -position * theta.
Bug class: rope-sign. Modelled on the Triton catalogue's rope/bug_sign_inverse.py (karpathy/nanochat PR #489).
pos-0 probe: missed (at position 0 every rotation is the identity).
"""

import ctypes
import math
from pathlib import Path

import torch

from kernalin_ci import current_params
from kernalin_ci.cuda import nvrtc

CATALOGUE = {
    "op": "rope",
    "bug_class": "rope-sign",
    "pos0": "missed",
    "params": {"style": "neox"},
    "modelled_on": "https://github.com/karpathy/nanochat/pull/489",
    "style": "CUDA C++, rotation transposed",
    "cuda": {"sources": ["rope/rope.cu"], "flags": ["-Icommon", "-DBUG_SIGN"]},
}

HERE = Path(__file__).resolve().parent
DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _kernel(name):
    defines = [f for f in CATALOGUE["cuda"]["flags"] if f.startswith("-D")]
    return nvrtc.load(HERE.parent / "rope/rope.cu", options=defines, include_dirs=[HERE.parent / "common"]).kernel(name)


def _i64(n):
    return ctypes.c_int64(n)


def entry(q, k, positions):
    p = current_params()
    T, Hq, D = q.shape
    r = p["rotary_dim"] or D
    _kernel("rope")(
        (T,), (128,),
        [q, k, positions, Hq, k.shape[1], D, r, int(p["style"] == "neox"), math.log(p["base"]),
         _i64(q.stride(0)), _i64(q.stride(1)), _i64(k.stride(0)), _i64(k.stride(1)), DTYPE[q.dtype]],
    )
    return q, k  # rotated in place
