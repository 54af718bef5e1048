"""RoPE whose angle uses the token's index instead of its position (CUDA C++)

Parent: correct_neox.py. Injected bug, rope.cu under BUG_POSITION_TOKEN_INDEX: `pos = t` (blockIdx.x) where it should be
`positions[t]`: right only where positions happen to be 0, 1, 2, ...
Bug class: rope-position. Modelled on NVIDIA-NeMo/Automodel PR #2377 (as the Triton catalogue's bug_position_token_index.py).
pos-0 probe: missed (one token: index 0 is position 0).
"""

import ctypes
import math
from pathlib import Path

import torch

from kernalin_ci import current_params
from kernalin_ci.cuda import nvrtc

CATALOGUE = {
    "op": "rope",
    "bug_class": "rope-position",
    "pos0": "missed",
    "params": {"style": "neox"},
    "modelled_on": "https://github.com/NVIDIA-NeMo/Automodel/pull/2377",
    "style": "CUDA C++, program index as position",
    "cuda": {"sources": ["rope/rope.cu"], "flags": ["-Icommon", "-DBUG_POSITION_TOKEN_INDEX"]},
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
