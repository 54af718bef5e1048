"""A KV append that is correct except at two kv heads, where it stores far outside any buffer.

On a GPU that store is an illegal memory access: the CUDA context is lost, the worker reports a
`cuda-error` for that case and a fresh worker must run the cases after it (tests/test_cuda_restart.py).
"""

import triton
import triton.language as tl


@triton.jit
def _append(key, value, k_cache, v_cache, slot_mapping, row_len, BLOCK_SIZE: tl.constexpr, BLOCK: tl.constexpr,
            WILD: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_mapping + t)
    if slot < 0:
        return
    j = tl.arange(0, BLOCK)
    mask = j < row_len
    dst = (slot // BLOCK_SIZE) * BLOCK_SIZE * row_len + (slot % BLOCK_SIZE) * row_len + j
    if WILD:
        dst += 1 << 44  # far past any allocation
    tl.store(k_cache + dst, tl.load(key + t * row_len + j, mask=mask), mask=mask)
    tl.store(v_cache + dst, tl.load(value + t * row_len + j, mask=mask), mask=mask)


def entry(key, value, k_cache, v_cache, slot_mapping):
    T, Hkv, D = key.shape
    key, value = key.contiguous(), value.contiguous()
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    _append[(T,)](key, value, k_cache, v_cache, slot_mapping, Hkv * D, BLOCK_SIZE=k_cache.shape[1],
                  BLOCK=triton.next_power_of_2(Hkv * D), WILD=Hkv == 2)
