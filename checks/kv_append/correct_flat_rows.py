"""Paged KV append that copies each token's key and value as one flat row of Hkv * D elements.

One program per token. A cache slot [Hkv, D] and a token row key[t] are each
contiguous in memory (checked by the entry), so the program copies them as a
single vector of Hkv * D elements (BLOCK = next power of two, masked), key and
value in one kernel. Padding tokens (slot < 0) return early; the block size is a
constexpr taken from the cache shape (verified with block_size = 32), and the slot
stays int64 so offsets are 64-bit.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": None,
    "pos0": None,
    "params": {"block_size": 32},
    "modelled_on": None,
    "style": "one program per token, flat Hkv*D row copy, block_size 32",
}


@triton.jit
def _kv_append_row_kernel(key, value, k_cache, v_cache, slot_mapping,
                          stride_kt, stride_vt, stride_kcb, stride_kcs, stride_vcb, stride_vcs,
                          row_len,
                          BLOCK_SIZE: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_mapping + t)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    j = tl.arange(0, BLOCK)
    mask = j < row_len
    k = tl.load(key + t * stride_kt + j, mask=mask)
    v = tl.load(value + t * stride_vt + j, mask=mask)
    tl.store(k_cache + blk * stride_kcb + off * stride_kcs + j, k, mask=mask)
    tl.store(v_cache + blk * stride_vcb + off * stride_vcs + j, v, mask=mask)


def entry(key, value, k_cache, v_cache, slot_mapping):
    T, Hkv, D = key.shape
    for x in (key, value):
        assert x.stride(2) == 1 and x.stride(1) == D, "token rows must be contiguous"
    for c in (k_cache, v_cache):
        assert c.stride(3) == 1 and c.stride(2) == D, "cache slots must be contiguous"
    _kv_append_row_kernel[(T,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), value.stride(0), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        Hkv * D,
        BLOCK_SIZE=k_cache.shape[1], BLOCK=triton.next_power_of_2(Hkv * D),
    )
