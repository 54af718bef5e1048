"""A correct neox RoPE (float32 angles, out of place) whose key rotation goes through a data-dependent
guard, `where(x == x, rotated, x)` (a NaN passes through unrotated), as some kernels guard their inputs:
the structural analysis follows q's rotation but not k's, whose values are no linear form of the input
(tests/test_structural_properties.py: a reported gap, never a pass)."""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def _rope(q, k, q_out, k_out, positions, sq_t, sq_h, sk_t, sk_h, hq, hkv, log2_base,
          HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(positions + t).to(tl.float32)
    i = tl.arange(0, HALF)[None, :]
    angle = pos * tl.exp2(-(i.to(tl.float32) / HALF) * log2_base)
    cos, sin = tl.cos(angle), tl.sin(angle)
    h = tl.arange(0, BLOCK_H)[:, None]
    m = (h < hq) & (i < HALF)
    x1 = tl.load(q + t * sq_t + h * sq_h + i, mask=m)
    x2 = tl.load(q + t * sq_t + h * sq_h + i + HALF, mask=m)
    tl.store(q_out + t * sq_t + h * sq_h + i, x1 * cos - x2 * sin, mask=m)
    tl.store(q_out + t * sq_t + h * sq_h + i + HALF, x2 * cos + x1 * sin, mask=m)
    m = (h < hkv) & (i < HALF)
    y1 = tl.load(k + t * sk_t + h * sk_h + i, mask=m)
    y2 = tl.load(k + t * sk_t + h * sk_h + i + HALF, mask=m)
    tl.store(k_out + t * sk_t + h * sk_h + i, tl.where(y1 == y1, y1 * cos - y2 * sin, y1), mask=m)
    tl.store(k_out + t * sk_t + h * sk_h + i + HALF, tl.where(y2 == y2, y2 * cos + y1 * sin, y2), mask=m)


def entry(q, k, positions):
    T, hq, d = q.shape
    assert q.dtype == torch.float32 and d & (d - 1) == 0
    q, k = q.contiguous(), k.contiguous()
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _rope[(T,)](q, k, q_out, k_out, positions, q.stride(0), q.stride(1), k.stride(0), k.stride(1), hq, k.shape[1],
                math.log2(10000.0), HALF=d // 2, BLOCK_H=triton.next_power_of_2(max(hq, k.shape[1])))
    return q_out, k_out
