"""Paged KV append that writes the key into the value cache (CUDA C++)

Parent: correct_per_token.py. Injected bug, kv_append.cu under BUG_VALUE_FROM_KEY: `v_cache[dst] = key[...]`.
Bug class: kv-source. Modelled on hpcaitech/ColossalAI PR #6429 (as the Triton catalogue's bug_value_from_key.py).
pos-0 probe: caught (the probe's key and value differ).
"""

import ctypes
from pathlib import Path

import torch

from kernalin_ci.cuda import nvrtc

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "kv-source",
    "pos0": "caught",
    "params": {},
    "modelled_on": "https://github.com/hpcaitech/ColossalAI/pull/6429",
    "style": "CUDA C++, V from K",
    "cuda": {"sources": ["kv_append/kv_append.cu"], "flags": ["-Icommon", "-DBUG_VALUE_FROM_KEY"]},
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
