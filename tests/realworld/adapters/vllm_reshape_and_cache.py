"""kv_append entry for vLLM's Triton reshape_and_cache_flash (vllm 0.34.0,
vllm/v1/attention/ops/triton_reshape_and_cache_flash.py): one program per token and tile of its
Hkv x D elements, writing key and value into the paged caches at the token's slot; padding tokens (slot
-1) are skipped by the kernel itself.

The cache is vLLM's flash layout [num_blocks, block_size, Hkv, D]: our NHD cache as it is. The adapter
launches the kernel with the launcher's grid, strides and constants for an unquantized cache on a
Hopper GPU (TILE_SIZE up to 2048, 16 warps, 10 stages): the launcher itself asks the CUDA runtime for
the device's capability, which the CPU interpreter has not. vLLM's module is loaded by
_vllm_cache_flash.py.

FP8 caches (docs/ops.md, "FP8 KV caches"): with `kv_dtype` set the caches are FP8 and the entry gets `k_scale`
and `v_scale`; the launch sets FP8_KV_CACHE as vLLM's launcher does for an fp8 `kv_cache_dtype`, and the kernel
divides by one element of each scale (`tl.load(k_scale)`): per-tensor scales only.
"""

import torch
import triton
from _vllm_cache_flash import module as _m  # the vLLM module, loaded with its stand-ins


def entry(key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
    num_heads, head_size = key.shape[1], key.shape[2]
    n = num_heads * head_size
    one = torch.ones((), dtype=torch.float32, device=key.device)
    fp8 = k_scale is not None
    tile = min(2048, triton.next_power_of_2(n))
    _m.reshape_and_cache_kernel_flash[(slot_mapping.shape[0], triton.cdiv(n, tile))](
        key_ptr=key,
        value_ptr=value,
        key_cache_ptr=k_cache,
        value_cache_ptr=v_cache,
        slot_mapping_ptr=slot_mapping,
        k_scale=k_scale if fp8 else one,
        v_scale=v_scale if fp8 else one,
        key_stride=key.stride(0),
        value_stride=value.stride(0),
        block_stride=k_cache.stride(0),
        head_stride=k_cache.stride(2),
        dim_stride_k=0,
        dim_stride_v=0,
        page_stride=k_cache.stride(1),
        num_heads=num_heads,
        head_size=head_size,
        block_size=k_cache.shape[1],
        x=1,
        USE_HEAD_MAJOR_LAYOUT=False,
        INTERLEAVED_V_PACK_FACTOR=0,
        FP8_KV_CACHE=fp8,
        TILE_SIZE=tile,
        num_warps=16,
        num_stages=10,
    )
