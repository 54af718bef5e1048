"""Paged KV append that writes padding tokens (slot -1) instead of skipping them

Parent: correct_per_token.py. Injected bug, in _kv_append_token_kernel: the early exit
`if slot < 0: return` is missing. For slot -1, slot // block_size is 0 and slot % block_size
is -1 in Triton's truncating integer arithmetic (or -1 and block_size - 1 when flooring: the
same address), so the padding token's key and value are written one slot before the start of
each cache: past the allocation, or, in a combined [2, num_blocks, ...] KV buffer, over the
last slot of the K half.
Bug class: kv-padding.
Modelled on vllm-project/vllm PR #13922: with CUDA-graph padding on V1 the key tensor had more
rows than slot_mapping, and reshape_and_cache had to be taught to leave the padded rows alone.
pos-0 probe: missed. The probe's only token has slot 0: there is no padding token to write.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "kv-padding",
    "pos0": "missed",
    "params": {},
    "modelled_on": "https://github.com/vllm-project/vllm/pull/13922",
    "style": "per token, slot -1 not skipped",
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
