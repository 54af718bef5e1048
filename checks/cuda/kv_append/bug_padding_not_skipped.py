"""Paged KV append that writes padding tokens (CUDA C++)

Parent: correct_per_token.py. Injected bug, kv_append.cu under BUG_PADDING_NOT_SKIPPED: the `if (slot < 0) return;` is gone;
slot -1 lands on offset block_size - 1 of block -1: the row just before the cache.
Bug class: kv-padding. Modelled on vllm-project/vllm PR #13922 (as the Triton catalogue's bug_padding_not_skipped.py).
pos-0 probe: missed (no padding token). Compute Sanitizer: memcheck sees the write before the cache's allocation: it
lands in the red zone memcheck pads the allocation before it with (kernalin_ci/cuda/sanitizer.py, `--padding`);
without the pad it lands inside that allocation, and the first GPU run's memcheck did not see it.
"""

import ctypes
from pathlib import Path

import torch

from kernalin_ci.cuda import nvrtc

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "kv-padding",
    "pos0": "missed",
    "params": {},
    "modelled_on": "https://github.com/vllm-project/vllm/pull/13922",
    "style": "CUDA C++, padding written",
    "cuda": {"sources": ["kv_append/kv_append.cu"], "flags": ["-Icommon", "-DBUG_PADDING_NOT_SKIPPED"]},
    "sanitizer": "caught",
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
