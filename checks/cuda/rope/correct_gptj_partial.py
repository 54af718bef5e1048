"""GPT-J-style RoPE on a partial rotary dim (rotary_dim 32 of D), CUDA C++: the same rope.cu as correct_neox,
dims past rotary_dim passed through untouched (never written).
"""

import ctypes
import math
from pathlib import Path

import torch

from kernalin_ci import current_params
from kernalin_ci.cuda import nvrtc

CATALOGUE = {
    "op": "rope",
    "bug_class": None,
    "pos0": None,
    "params": {"style": "gptj", "rotary_dim": 32},
    "modelled_on": None,
    "style": "CUDA C++, gptj pairs, partial rotary",
    "cuda": {"sources": ["rope/rope.cu"], "flags": ["-Icommon"]},
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
