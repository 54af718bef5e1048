"""kv_append entries in Triton for engine tests: `entry` is correct, `no_padding_skip`
writes tokens whose slot is -1 (to slot index -1: just before the cache), `padding_to_slot0`
clamps the slot of a padding token to 0 and writes it there."""
import triton
import triton.language as tl


@triton.jit
def _append(key, value, kc, vc, slots, sk_t, sv_t, sc_slot, N: tl.constexpr, BLOCK: tl.constexpr,
            SKIP_PADDING: tl.constexpr, PAD_TO_ZERO: tl.constexpr):
    t = tl.program_id(0)
    s = tl.load(slots + t)
    if PAD_TO_ZERO:
        s = tl.maximum(s, 0)
    i = tl.arange(0, BLOCK)
    m = i < N
    if SKIP_PADDING:
        m = m & (tl.zeros_like(i) + s >= 0)
    x = tl.load(key + t * sk_t + i, mask=m)
    y = tl.load(value + t * sv_t + i, mask=m)
    tl.store(kc + s * sc_slot + i, x, mask=m)
    tl.store(vc + s * sc_slot + i, y, mask=m)


def _launch(key, value, k_cache, v_cache, slot_mapping, skip, pad_to_zero=False):
    T, H, D = key.shape
    _append[(T,)](key, value, k_cache, v_cache, slot_mapping, key.stride(0), value.stride(0), k_cache.stride(1),
                  N=H * D, BLOCK=triton.next_power_of_2(H * D), SKIP_PADDING=skip, PAD_TO_ZERO=pad_to_zero)


def entry(key, value, k_cache, v_cache, slot_mapping):
    _launch(key, value, k_cache, v_cache, slot_mapping, True)


def no_padding_skip(key, value, k_cache, v_cache, slot_mapping):
    _launch(key, value, k_cache, v_cache, slot_mapping, False)


def padding_to_slot0(key, value, k_cache, v_cache, slot_mapping):
    _launch(key, value, k_cache, v_cache, slot_mapping, False, pad_to_zero=True)
