"""attention.decode entry for FlashInfer's single-request decode kernel (SingleDecodeWithKVCacheDispatched,
CUDA cores, flashinfer-python 0.7.2.post1), head dim 128, float16, one launch per sequence.

The contiguous cache [B, Hkv, S, D] gives each sequence an HND view [Hkv, S, D] (kv_stride_h = S * D): a view,
no copy. The kernel takes the sequence's length as an argument, so the lengths are read on the host once
(`kv_lens.tolist()`)."""

import ctypes

import torch
from _flashinfer import call, half_only, library, ptr

library("flashinfer_decode.cu")  # built when the entry loads (the build worker's load: once per source hash)


def entry(q, k_cache, v_cache, kv_lens, scale):
    half_only(q, k_cache, v_cache)
    B, Hq, D = q.shape
    if D != 128:
        raise ValueError(f"this build of the kernel takes head dim 128, not {D}")
    out = torch.empty_like(q)
    fn = library("flashinfer_decode.cu").fi_single_decode
    Hkv = k_cache.shape[1]
    for b, n in enumerate(kv_lens.tolist()):
        call(fn, ptr(q[b]), ptr(k_cache[b]), ptr(v_cache[b]), ptr(out[b]), ctypes.c_uint(n), ctypes.c_uint(Hq),
             ctypes.c_uint(Hkv), ctypes.c_uint(q.stride(1)), ctypes.c_uint(k_cache.stride(2)),
             ctypes.c_uint(k_cache.stride(1)), ctypes.c_float(scale))  # fmt: skip
    return out
