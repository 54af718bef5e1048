"""Flat-row KV append without masks: it copies next_power_of_2(Hkv * D) elements per token

Parent: correct_flat_rows.py. Injected bug, in _kv_append_row_kernel: the loads and stores
have no `mask=mask` (written for shapes where Hkv * D is a power of two). When it is not
(Hkv = 6 or 12, D = 80 or 96), each token reads past its row into the next token's key and
value and writes BLOCK - Hkv * D elements past its slot, over the next slot(s) of the cache
(past the end of the cache for its last slot).
Bug class: stray-write.
Modelled on ROCm/aiter PR #3698: unified_attention reused one 192-wide dim mask for a 128-wide V
head, so the output store wrote past each head into the next and past the buffer on the last
head (garbled logits, then hipErrorIllegalAddress).
pos-0 probe: missed. The probe's Hkv * D = 2 * 64 = 128 is a power of two: BLOCK equals the
row.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "stray-write",
    "pos0": "missed",
    "params": {"block_size": 32},
    "modelled_on": "https://github.com/ROCm/aiter/pull/3698",
    "style": "flat row copy, loads/stores unmasked",
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
    k = tl.load(key + t * stride_kt + j)
    v = tl.load(value + t * stride_vt + j)
    tl.store(k_cache + blk * stride_kcb + off * stride_kcs + j, k)
    tl.store(v_cache + blk * stride_vcb + off * stride_vcs + j, v)


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
