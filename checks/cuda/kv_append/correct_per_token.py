"""Paged KV append in CUDA C++: one block per token, element copies (bit for bit) into slot_mapping[t], padding
tokens (slot < 0) skipped (checks/cuda/kv_append/kv_append.cu without a bug flag).
"""

import ctypes
from pathlib import Path

import torch

from kernalin_ci.cuda import nvrtc

CATALOGUE = {
    "op": "kv_append",
    "bug_class": None,
    "pos0": None,
    "params": {},
    "modelled_on": None,
    "style": "CUDA C++, per token",
    "cuda": {"sources": ["kv_append/kv_append.cu"], "flags": ["-Icommon"]},
}

HERE = Path(__file__).resolve().parent
DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _kernel(name):
    defines = [f for f in CATALOGUE["cuda"]["flags"] if f.startswith("-D")]
    return nvrtc.load(HERE.parent / "kv_append/kv_append.cu", options=defines, include_dirs=[HERE.parent / "common"]).kernel(name)


def _i64(n):
    return ctypes.c_int64(n)


def entry(key, value, k_cache, v_cache, slot_mapping):
    T, Hkv, D = key.shape
    name = "kv_append32" if key.element_size() == 4 else "kv_append16"
    _kernel(name)(
        (T,), (128,),
        [key, value, k_cache, v_cache, slot_mapping, Hkv, D, k_cache.shape[1],
         _i64(key.stride(0)), _i64(key.stride(1)), _i64(value.stride(0)), _i64(value.stride(1)),
         _i64(k_cache.stride(0)), _i64(k_cache.stride(1)), _i64(k_cache.stride(2))],
    )
