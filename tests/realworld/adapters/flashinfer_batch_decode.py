"""attention.decode_paged entry for FlashInfer's batch decode over a paged cache (BatchDecodeWithPagedKVCacheDispatched,
CUDA cores, its non-split path; flashinfer-python 0.7.2.post1), head dim 128, float16, NHD or HND.

FlashInfer's page table is CSR (indptr, indices, last_page_len); ours is a block table [B, max_blocks]. Its rows,
read as one flat array, are the `indices`: sequence b's pages start at b * max_blocks. So that consecutive indptr
entries can delimit them, the adapter makes two requests per sequence, 2b (its pages) and 2b + 1 (the rest of the
row, never launched), and launches only the even ones (request_indices = 0, 2, 4, ...). FlashInfer reads request
r's query at r * q_stride_n (and writes its output at the block's own index), so the query's row stride is passed
halved: request 2b reads sequence b's query (q's row stride is even: Hq * 128 elements). The small index tensors
are computed on the GPU from kv_lens; the caches and the block table are passed as they are."""

import ctypes

import torch
from _flashinfer import call, half_only, library, ptr

import kernalin_ci

library("flashinfer_decode.cu")  # built when the entry loads (the build worker's load: once per source hash)


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale):
    half_only(q, k_cache, v_cache)
    B, Hq, D = q.shape
    if D != 128:
        raise ValueError(f"this build of the kernel takes head dim 128, not {D}")
    hnd = kernalin_ci.current_params()["layout"] == "hnd"
    Hkv, page = (k_cache.shape[1], k_cache.shape[2]) if hnd else (k_cache.shape[2], k_cache.shape[1])
    dev, i32 = q.device, torch.int32
    M = block_tables.shape[1]
    pages = (kv_lens + page - 1) // page
    start = torch.arange(B, device=dev, dtype=i32) * M
    indptr = torch.cat([torch.stack([start, start + pages], 1).flatten(), start.new_full((1,), B * M)]).to(i32)
    last = torch.stack([kv_lens - (pages - 1) * page, torch.full_like(kv_lens, page)], 1).flatten().to(i32)
    requests = torch.arange(0, 2 * B, 2, device=dev, dtype=i32)
    tiles = torch.zeros(B, device=dev, dtype=i32)
    chunk = torch.full((1,), 1 << 30, device=dev, dtype=i32)
    strides = (ctypes.c_longlong * 3)(*k_cache.stride()[:3])
    q_row = ctypes.c_int(q.stride(0) // 2)  # request 2b reads row b
    out = torch.empty_like(q)
    fn = library("flashinfer_decode.cu").fi_batch_decode
    call(fn, ptr(q), ptr(k_cache), ptr(v_cache), ptr(block_tables), ptr(indptr), ptr(last), ptr(requests), ptr(tiles),
         ptr(chunk), ptr(out), ctypes.c_uint(B), ctypes.c_uint(2 * B), ctypes.c_uint(Hq), ctypes.c_uint(Hkv),
         ctypes.c_uint(page), ctypes.c_int(int(hnd)), strides, q_row, ctypes.c_int(q.stride(1)),
         ctypes.c_float(scale))  # fmt: skip
    return out
