"""KV append whose entry first keeps only the tokens that have a slot (`key[slot_mapping >= 0]`, the same for
value and the slots) and launches one program per kept token (test fixture)."""
import triton
import triton.language as tl

from kernalin_ci import current_params

CATALOGUE = {"op": "kv_append", "bug_class": None, "pos0": None, "params": {}, "modelled_on": None,
             "style": "host gather of the valid tokens, then one program per token"}


@triton.jit
def _store_kv(K, V, KC, VC, Slots, s_kt, s_kh, s_vt, s_vh, s_cb, s_cs, s_ch, s_vb, s_vs, s_vhh,
              HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(Slots + t).to(tl.int64)
    blk = slot // BS
    off = slot % BS
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    m = (h < HKV) & (d < D)
    k = tl.load(K + t * s_kt + h * s_kh + d, mask=m)
    v = tl.load(V + t * s_vt + h * s_vh + d, mask=m)
    tl.store(KC + blk * s_cb + off * s_cs + h * s_ch + d, k, mask=m)
    tl.store(VC + blk * s_vb + off * s_vs + h * s_vhh + d, v, mask=m)


def entry(key, value, k_cache, v_cache, slot_mapping):
    keep = slot_mapping >= 0
    k, v, slots = key[keep], value[keep], slot_mapping[keep]
    T, Hkv, D = k.shape
    bs = current_params().get("block_size", 16)
    _store_kv[(T,)](k, v, k_cache, v_cache, slots, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                    k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
                    v_cache.stride(2), HKV=Hkv, D=D, BS=bs, BLOCK_H=triton.next_power_of_2(Hkv),
                    BLOCK_D=triton.next_power_of_2(D))
