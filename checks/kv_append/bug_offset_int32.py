"""Paged KV append that narrows the slot to int32, so cache offsets overflow past 2^31 elements

Parent: correct_per_token.py. Injected bug, in _kv_append_token_kernel:
`slot = tl.load(slot_mapping + t).to(tl.int32)` where it should be
`slot = tl.load(slot_mapping + t)` (int64). The block index is then int32 and so is
block * stride_kcb (the stride is an int32 kernel argument): once a cache holds more than 2^31
elements, slots in its upper half produce a negative offset and the store lands about 4 GiB
(2^32 elements) before the cache: an illegal address, or, when another buffer is mapped
there, a silent write into it.
Bug class: offset-overflow.
Modelled on vllm-project/vllm issue #1486: with 64K blocks the reshape_and_cache slot mapping
and offsets overflowed INT_MAX; int64 slot_mapping made the cache test pass.
(lightseekorg/tokenspeed PR #501 fixed the same loc * stride int32 multiply in Triton
KV-buffer kernels.) Under the CPU interpreter the wrapped store segfaults the worker.
pos-0 probe: missed. Slot 0 gives offset 0, far from 2^31; the probe's cache is 4 blocks.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "offset-overflow",
    "pos0": "missed",
    "params": {},
    "modelled_on": "https://github.com/vllm-project/vllm/issues/1486",
    "style": "per token, slot narrowed to int32",
}


@triton.jit
def _kv_append_token_kernel(key, value, k_cache, v_cache, slot_mapping,
                            stride_kt, stride_kh, stride_vt, stride_vh,
                            stride_kcb, stride_kcs, stride_kch,
                            stride_vcb, stride_vcs, stride_vch,
                            num_kv_heads, head_dim,
                            BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_mapping + t).to(tl.int32)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_kv_heads) & (d < head_dim)
    k = tl.load(key + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(value + t * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(k_cache + blk * stride_kcb + off * stride_kcs + h * stride_kch + d, k, mask=mask)
    tl.store(v_cache + blk * stride_vcb + off * stride_vcs + h * stride_vch + d, v, mask=mask)


def entry(key, value, k_cache, v_cache, slot_mapping):
    T, Hkv, D = key.shape
    assert key.stride(2) == 1 and value.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    _kv_append_token_kernel[(T,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        Hkv, D,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_H=triton.next_power_of_2(Hkv), BLOCK_D=triton.next_power_of_2(D),
    )
