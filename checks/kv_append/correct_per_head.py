"""Paged KV append with one program per (token, KV head), each copying one D-vector of key and value.

Grid (T, Hkv). Program (t, h) loads slot_mapping[t], returns at once for a padding
token (slot < 0), splits the slot into (slot // block_size, slot % block_size)
with block_size read from the cache shape, and copies key[t, h, :] into
k_cache[block, offset, h, :] and value[t, h, :] into v_cache[block, offset, h, :]
with one masked 1-D load/store each, in the input dtype. The slot stays int64, so
cache offsets are 64-bit. All strides come from the tensors.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": None,
    "pos0": None,
    "params": {},
    "modelled_on": None,
    "style": "one program per (token, head), D-vector copy, int64 offsets",
}


@triton.jit
def _kv_append_head_kernel(key, value, k_cache, v_cache, slot_mapping,
                           stride_kt, stride_kh, stride_vt, stride_vh,
                           stride_kcb, stride_kcs, stride_kch,
                           stride_vcb, stride_vcs, stride_vch,
                           head_dim,
                           BLOCK_SIZE: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_mapping + t)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    d = tl.arange(0, BLOCK_D)
    mask = d < head_dim
    k = tl.load(key + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(value + t * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(k_cache + blk * stride_kcb + off * stride_kcs + h * stride_kch + d, k, mask=mask)
    tl.store(v_cache + blk * stride_vcb + off * stride_vcs + h * stride_vch + d, v, mask=mask)


def entry(key, value, k_cache, v_cache, slot_mapping):
    T, Hkv, D = key.shape
    assert key.stride(2) == 1 and value.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    _kv_append_head_kernel[(T, Hkv)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        D,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_D=triton.next_power_of_2(D),
    )
