"""Partial-rotary RoPE whose frequencies use the head dim (CUDA C++)

Parent: correct_gptj_partial.py. Injected bug, rope.cu under BUG_FREQUENCY_HEAD_DIM: theta_i = base^(-2i/D) where it should be
base^(-2i/rotary_dim).
Bug class: rope-frequency. Modelled on pie-project/pie issue #602 (as the Triton catalogue's bug_frequency_head_dim.py).
pos-0 probe: missed (angles are 0 at position 0).
"""

import ctypes
import math
from pathlib import Path

import torch

from kernalin_ci import current_params
from kernalin_ci.cuda import nvrtc

CATALOGUE = {
    "op": "rope",
    "bug_class": "rope-frequency",
    "pos0": "missed",
    "params": {"rotary_dim": 32},
    "modelled_on": "https://github.com/pie-project/pie/issues/602",
    "style": "CUDA C++, partial rotary frequencies from D",
    "cuda": {"sources": ["rope/rope.cu"], "flags": ["-Icommon", "-DBUG_FREQUENCY_HEAD_DIM"]},
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
