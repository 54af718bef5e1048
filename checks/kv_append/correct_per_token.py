"""Paged KV append with one program per token writing all heads x D of its key and value at once.

Program t loads slot_mapping[t]; a negative slot marks a padding token and the
program returns without writing. Otherwise it splits the slot into
(block, offset) = (slot // block_size, slot % block_size), with block_size read
from the cache shape, and copies the [Hkv, D] tile of key[t] into
k_cache[block, offset] and of value[t] into v_cache[block, offset] as one masked
2-D load/store each, in the input dtype (a bit-exact copy). The slot is kept in
int64, so every cache offset is computed in 64-bit arithmetic. All strides come
from the tensors.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": None,
    "pos0": None,
    "params": {},
    "modelled_on": None,
    "style": "one program per token, [Hkv, D] tile, int64 offsets",
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
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        Hkv, D,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_H=triton.next_power_of_2(Hkv), BLOCK_D=triton.next_power_of_2(D),
    )
