"""Paged KV append that stores the key tile into the value cache

Parent: correct_per_token.py. Injected bug, in _kv_append_token_kernel: the last store
writes `k` into v_cache where it should write `v` (a copy-paste of the line above it).
The value tile is loaded and never used; every attention output then averages keys.
Bug class: kv-source.
Modelled on hpcaitech/ColossalAI PR #6429: in its Triton fused_rotary_emb kernel two output
lines were computed from the wrong one of the two tensors (K for Q and Q for K), the same
copy-paste slip between a pair of symmetric lines.
pos-0 probe: caught. The probe writes one token at slot 0 with random key and value, so
v_cache[0, 0] holds the key instead of the value.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "kv-source",
    "pos0": "caught",
    "params": {},
    "modelled_on": "https://github.com/hpcaitech/ColossalAI/pull/6429",
    "style": "per token, value cache written from key",
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
    tl.store(v_cache + blk * stride_vcb + off * stride_vcs + h * stride_vch + d, k, mask=mask)


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
