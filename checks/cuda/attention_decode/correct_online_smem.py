"""Decode attention over a contiguous cache [B, Hkv, S, D] in CUDA C++: the shared-memory tiled online softmax of
common/decode_attention.cuh (contiguous_decode in attention_decode_paged/paged_decode.cu).
"""

import ctypes
from pathlib import Path

import torch

from kernalin_ci.cuda import nvrtc

CATALOGUE = {
    "op": "attention.decode",
    "bug_class": None,
    "pos0": None,
    "params": {},
    "modelled_on": None,
    "style": "CUDA C++, contiguous cache",
    "cuda": {"sources": ["attention_decode_paged/paged_decode.cu"], "flags": ["-Icommon"]},
}

HERE = Path(__file__).resolve().parent
DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _kernel(name):
    defines = [f for f in CATALOGUE["cuda"]["flags"] if f.startswith("-D")]
    return nvrtc.load(HERE.parent / "attention_decode_paged/paged_decode.cu", options=defines, include_dirs=[HERE.parent / "common"]).kernel(name)


def _i64(n):
    return ctypes.c_int64(n)


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    if D > 256:
        raise ValueError(f"head dim {D}: this kernel takes at most 256")
    out = torch.empty_like(q)
    _kernel("contiguous_decode")(
        (B * Hq,), (128,),
        [q, k_cache, v_cache, kv_lens, out, Hq, k_cache.shape[1], D, float(scale),
         _i64(q.stride(0)), _i64(q.stride(1)),
         _i64(k_cache.stride(0)), _i64(k_cache.stride(1)), _i64(k_cache.stride(2)), DTYPE[q.dtype]],
    )
    return out
