"""A small correct kv_append kernel (one program per token, all heads at once) for benchmarks/live_eval.py.

`NUM_WARPS` is the launch config the live evaluation varies (it rewrites that line in a copy).
"""

import triton
import triton.language as tl

NUM_WARPS = 4


@triton.jit
def _append_kernel(
    key_ptr, value_ptr, kc_ptr, vc_ptr, slots_ptr, sk_t, sv_t, sc_slot, N: tl.constexpr, BLOCK: tl.constexpr
):
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t)
    if slot >= 0:
        i = tl.arange(0, BLOCK)
        mask = i < N
        tl.store(kc_ptr + slot * sc_slot + i, tl.load(key_ptr + t * sk_t + i, mask=mask), mask=mask)
        tl.store(vc_ptr + slot * sc_slot + i, tl.load(value_ptr + t * sv_t + i, mask=mask), mask=mask)


def append(key, value, k_cache, v_cache, slot_mapping):
    T, H, D = key.shape
    _append_kernel[(T,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        value.stride(0),
        k_cache.stride(1),
        N=H * D,
        BLOCK=triton.next_power_of_2(H * D),
        num_warps=NUM_WARPS,
    )
