"""NeoX/GPT-J RoPE in CUDA C++, in place: one block per token, a thread per (head, pair), angles in float32
(checks/cuda/rope/rope.cu built without a bug flag; NVRTC through kernalin_ci.cuda.nvrtc).
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
    "params": {"style": "neox"},
    "modelled_on": None,
    "style": "CUDA C++, NVRTC, in place",
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
