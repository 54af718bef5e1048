"""Paged KV append that splits slots with a hard-coded block size of 32 on a cache of 16-slot blocks

Parent: correct_per_token.py. Injected bug, in entry(): `BLOCK_SIZE=32` where it should be
`BLOCK_SIZE=k_cache.shape[1]`: the block size the kernel was first written for stays baked
into the launch. With 16-slot blocks, slot s goes to block s // 32, offset s % 32, i.e. cache
row 16 * (s // 32) + s % 32: every slot with s % 32 >= 16 lands in the next block's rows,
and every slot from 32 on lands in the wrong row.
Bug class: kv-slot.
Modelled on vllm-project/vllm PR #47056: the FlashAttention cache update derived block_size
from key_cache.size(1) of a packed view (4 instead of the logical 16), so a valid logical slot
decoded to block slot / 4 and the write went past the cache.
pos-0 probe: missed. Slot 0 is block 0, offset 0 for every block size.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "kv-slot",
    "pos0": "missed",
    "params": {},
    "modelled_on": "https://github.com/vllm-project/vllm/pull/47056",
    "style": "per token, block size hard-coded 32 (cache has 16)",
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
        BLOCK_SIZE=32, BLOCK_H=triton.next_power_of_2(Hkv), BLOCK_D=triton.next_power_of_2(D),
    )
