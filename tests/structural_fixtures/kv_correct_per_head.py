"""KV append, one program per (token, KV head), flat slot offsets in int64 (test fixture)."""
import triton
import triton.language as tl


CATALOGUE = {"op": "kv_append", "bug_class": None, "pos0": None, "params": {}, "modelled_on": None,
             "style": "one program per (token, head), slot * slot_stride in int64"}


@triton.jit
def _append_head(K, V, KC, VC, Slots, s_kt, s_kh, s_slot, s_head, D: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(Slots + t)
    if slot < 0:
        return
    d = tl.arange(0, BLOCK_D)
    m = d < D
    src = t * s_kt + h * s_kh + d
    dst = slot * s_slot + h * s_head + d
    tl.store(KC + dst, tl.load(K + src, mask=m), mask=m)
    tl.store(VC + dst, tl.load(V + src, mask=m), mask=m)


def entry(key, value, k_cache, v_cache, slot_mapping):
    T, Hkv, D = key.shape
    # a paged cache [num_blocks, block_size, Hkv, D] is a flat [num_slots, Hkv, D] array
    _append_head[(T, Hkv)](key, value, k_cache, v_cache, slot_mapping, key.stride(0), key.stride(1),
                           k_cache.stride(1), k_cache.stride(2), D=D, BLOCK_D=triton.next_power_of_2(D))
