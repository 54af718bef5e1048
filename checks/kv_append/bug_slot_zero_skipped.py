"""Paged KV append whose padding test also skips slot 0

Parent: correct_per_token.py. Injected bug, in _kv_append_token_kernel: `if slot <= 0: return`
where it should be `if slot < 0: return`. Slot 0 is a real slot in this cache (block 0,
offset 0), so the token mapped there is never written: in an engine that reserves slot 0 as a
padding sink the test is right, ported to one that does not, it silently drops a token.
Bug class: kv-coverage.
Modelled on sgl-project/sglang PR #32477: SGLang's KV store kernel skips writes to the reserved
padding slot 0 by default (reserved_skip_index = 0), an invariant that only holds where slot 0
is reserved.
pos-0 probe: caught. The probe writes exactly one token, at slot 0, and it is skipped; the
cache keeps its zeros.
"""
import triton
import triton.language as tl

CATALOGUE = {
    "op": "kv_append",
    "bug_class": "kv-coverage",
    "pos0": "caught",
    "params": {},
    "modelled_on": "https://github.com/sgl-project/sglang/pull/32477",
    "style": "per token, slot 0 treated as padding",
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
    if slot <= 0:
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
