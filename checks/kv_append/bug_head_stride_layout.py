"""Paged KV append launched with the slot and head strides swapped (HND strides on an NHD cache)

Parent: correct_per_token.py. Injected bug, in entry(): the cache strides are passed as
`k_cache.stride(0), k_cache.stride(2), k_cache.stride(1)` (and the same for v_cache) where
they should be `stride(0), stride(1), stride(2)`: the adapter was written for a
[num_blocks, Hkv, block_size, D] (HND) cache. On this [num_blocks, block_size, Hkv, D] cache,
head h of the token at offset o is written into slot row h + o // Hkv of its block, at head
position o % Hkv: one token's heads are spread over Hkv slot rows, over other tokens' data.
Bug class: stray-write.
Modelled on ROCm/aiter PR #4531 (review): the kernel forwarded stride(1)/stride(2) of a cache
whose layout needed stride(0)/stride(1), "causing incorrect addressing and silent KV-cache
corruption".
pos-0 probe: caught. Even at slot 0 only head 0 lands in place: with Hkv = 2, head 1 is
written over slot 1 (a stray write) and slot 0's head 1 keeps the zeros of the probe's
cache.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "stray-write",
    "pos0": "caught",
    "params": {},
    "modelled_on": "https://github.com/ROCm/aiter/pull/4531",
    "style": "per token, slot and head strides swapped",
}


@triton.jit
def _kv_append_token_kernel(key, value, k_cache, v_cache, slot_mapping,
                            stride_kt, stride_kh, stride_vt, stride_vh,
                            stride_kcb, stride_kcs, stride_kch,
                            stride_vcb, stride_vcs, stride_vch,
                            num_kv_heads, head_dim,
                            BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_mapping + t)
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
        k_cache.stride(0), k_cache.stride(2), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(2), v_cache.stride(1),
        Hkv, D,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_H=triton.next_power_of_2(Hkv), BLOCK_D=triton.next_power_of_2(D),
    )
