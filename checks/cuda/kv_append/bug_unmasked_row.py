"""Paged KV append whose copy loop runs to a multiple of the block size (CUDA C++)

Parent: correct_per_token.py. Injected bug, kv_append.cu under BUG_UNMASKED_ROW: the loop bound is Hkv * D rounded up to the
128 threads: where Hkv * D is no multiple of 128 (the `odd-heads` case: 6 x 80) the tail copies the next token's key
into the next slot's first elements.
Bug class: stray-write. Modelled on ROCm/aiter PR #3698 (as the Triton catalogue's bug_unmasked_row.py).
pos-0 probe: missed (Hkv 2 x D 64 = 128: no tail).
"""

import ctypes
from pathlib import Path

import torch

from kernalin_ci.cuda import nvrtc

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "stray-write",
    "pos0": "missed",
    "params": {"block_size": 32},
    "modelled_on": "https://github.com/ROCm/aiter/pull/3698",
    "style": "CUDA C++, unmasked tail of the row",
    "cuda": {"sources": ["kv_append/kv_append.cu"], "flags": ["-Icommon", "-DBUG_UNMASKED_ROW"]},
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
