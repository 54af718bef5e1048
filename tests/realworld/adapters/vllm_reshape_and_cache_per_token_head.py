"""kv_append entry for vLLM's per-token-head FP8 cache write (vllm 0.34.0,
vllm/v1/attention/ops/triton_reshape_and_cache_flash.py, `_reshape_cache_per_token_head`): one program per
(token, KV head) loads the head's key row, takes its largest |value| over the FP8 format's largest normal as
the row's scale (at least 1e-6), stores that scale in the scale cache at the token's slot and head, and
stores the row times the scale's reciprocal, clamped to the format's range, in the FP8 cache; the value row
likewise. Padding tokens (slot -1) are skipped by the kernel itself.

Our kv_append with `kv_dtype: fp8_e4m3` and `kv_scale: per-token-head` (docs/ops.md, "FP8 KV caches"): the
caches are vLLM's flash layout [num_blocks, block_size, Hkv, D], our NHD caches as they are, and `k_scale`,
`v_scale` are the scale caches [num_blocks, block_size, Hkv] float32. The adapter launches the kernel as vLLM's
launcher `triton_reshape_and_cache_flash_per_token_head_quant` does for an FP8 cache on CUDA (its grid, strides,
QUANT_MAX / QUANT_MIN of e4m3 and its warp rule); the launcher itself asks vLLM's platform object, which the CPU
interpreter has not. vLLM's module is loaded by
_vllm_cache_flash.py.
"""

import torch
import triton
from _vllm_cache_flash import module as _m  # the vLLM module, loaded with its stand-ins


def entry(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale):
    assert k_cache.dtype == torch.float8_e4m3fn, "vLLM's per-token-head FP8 cache is e4m3"
    num_tokens, num_kv_heads, head_size = key.shape
    padded = triton.next_power_of_2(head_size)
    _m._reshape_cache_per_token_head[(num_tokens, num_kv_heads)](
        key_ptr=key,
        value_ptr=value,
        key_cache_ptr=k_cache,
        value_cache_ptr=v_cache,
        k_scale_cache_ptr=k_scale,
        v_scale_cache_ptr=v_scale,
        slot_mapping_ptr=slot_mapping,
        stride_key_tok=key.stride(0),
        stride_key_head=key.stride(1),
        stride_val_tok=value.stride(0),
        stride_val_head=value.stride(1),
        stride_kc_blk=k_cache.stride(0),
        stride_kc_slot=k_cache.stride(1),
        stride_kc_head=k_cache.stride(2),
        stride_vc_blk=v_cache.stride(0),
        stride_vc_slot=v_cache.stride(1),
        stride_vc_head=v_cache.stride(2),
        stride_ks_blk=k_scale.stride(0),
        stride_ks_slot=k_scale.stride(1),
        stride_ks_head=k_scale.stride(2),
        stride_vs_blk=v_scale.stride(0),
        stride_vs_slot=v_scale.stride(1),
        stride_vs_head=v_scale.stride(2),
        block_size=k_cache.shape[1],
        head_size=head_size,
        head_size_v=value.shape[2],
        HEAD_SIZE_PADDED=padded,
        QUANT_MAX=448.0,
        QUANT_MIN=-448.0,
        IS_INT_QUANT=False,
        num_warps=min(16, max(1, padded // 32)),
    )
