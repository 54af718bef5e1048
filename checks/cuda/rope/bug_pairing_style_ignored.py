"""RoPE that pairs (i, i + r/2) whatever the style (CUDA C++)

Parent: correct_gptj_partial.py. Injected bug, rope.cu under BUG_PAIRING_IGNORED: `pair_halves = true` where it should be
`neox != 0`: a gptj model's rows are rotated with neox pairs.
Bug class: rope-pairing. Modelled on vllm-project/vllm PR #49323 (as the Triton catalogue's bug_pairing_style_ignored.py).
pos-0 probe: missed (the identity at position 0, whatever the pairs).
"""

import ctypes
import math
from pathlib import Path

import torch

from kernalin_ci import current_params
from kernalin_ci.cuda import nvrtc

CATALOGUE = {
    "op": "rope",
    "bug_class": "rope-pairing",
    "pos0": "missed",
    "params": {"style": "gptj"},
    "modelled_on": "https://github.com/vllm-project/vllm/pull/49323",
    "style": "CUDA C++, style flag ignored",
    "cuda": {"sources": ["rope/rope.cu"], "flags": ["-Icommon", "-DBUG_PAIRING_IGNORED"]},
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
