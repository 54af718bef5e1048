"""A correct NeoX RoPE that writes its outputs with tl.atomic_add into zeroed tensors (as kernels that
accumulate partial results do). The Triton interpreter has no bfloat16 atomics, so on the CPU its
bfloat16 cases cannot run: they must be reported as not checked, never as a finding."""
import math

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_atomic(src, dst, positions, stride_t, num_heads, log2_base,
                 HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    i = tl.arange(0, BLOCK_HALF)[None, :]
    h = tl.arange(0, BLOCK_H)[:, None]
    mask = (h < num_heads) & (i < HALF)
    angle = tl.load(positions + t).to(tl.float32) * tl.exp2(-(i.to(tl.float32) / HALF) * log2_base)
    cos, sin = tl.cos(angle), tl.sin(angle)
    base = t * stride_t + h * (2 * HALF) + i
    x1 = tl.load(src + base, mask=mask).to(tl.float32)
    x2 = tl.load(src + base + HALF, mask=mask).to(tl.float32)
    tl.atomic_add(dst + base, (x1 * cos - x2 * sin).to(dst.dtype.element_ty), mask=mask)
    tl.atomic_add(dst + base + HALF, (x2 * cos + x1 * sin).to(dst.dtype.element_ty), mask=mask)


def entry(q, k, positions):
    outs = []
    for x in (q, k):
        x = x.contiguous()
        T, H, D = x.shape
        out = torch.zeros_like(x)
        _rope_atomic[(T,)](x, out, positions, x.stride(0), H, math.log2(10000.0), HALF=D // 2,
                           BLOCK_HALF=triton.next_power_of_2(D // 2), BLOCK_H=triton.next_power_of_2(H))
        outs.append(out)
    return tuple(outs)
