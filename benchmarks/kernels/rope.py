"""Small correct rope kernels (neox style, rotary_dim = D, base from the op params) for benchmarks and tests.

- `rope`: out of place, one program per token rotating every head of q and k.
- `rope_inplace`: the same rotation written back into q and k (returns them).
- `rope_x3`: `rope` computed three times over (a copy made about 3x slower on purpose).
"""

import torch
import triton
import triton.language as tl

from kernalin_ci import current_params

NUM_WARPS = 4  # the launch config benchmarks/live_eval.py varies (Triton's default)


@triton.jit
def _rope_kernel(
    x,
    out,
    pos,
    log2_base,
    stride_t,
    stride_h,
    ostride_t,
    ostride_h,
    H,
    BLOCK_H: tl.constexpr,
    HALF: tl.constexpr,
    REPEAT: tl.constexpr,
):
    t = tl.program_id(0)
    p = tl.load(pos + t).to(tl.float32)
    i = tl.arange(0, HALF)
    theta = tl.exp2(-(2.0 * i.to(tl.float32) / (2 * HALF)) * log2_base)
    a = p * theta
    c = tl.cos(a)[None, :]
    s = tl.sin(a)[None, :]
    h = tl.arange(0, BLOCK_H)
    m = (h < H)[:, None]
    src = x + t * stride_t + h[:, None] * stride_h + i[None, :]
    dst = out + t * ostride_t + h[:, None] * ostride_h + i[None, :]
    x1 = tl.load(src, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=m, other=0.0).to(tl.float32)
    for _ in range(REPEAT):
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
        tl.store(dst, y1.to(out.dtype.element_ty), mask=m)
        tl.store(dst + HALF, y2.to(out.dtype.element_ty), mask=m)


def _rotate(x, out, positions, repeat):
    import math

    T, H, D = x.shape
    base = float(current_params().get("base", 10000.0))
    _rope_kernel[(T,)](
        x,
        out,
        positions,
        math.log2(base),
        x.stride(0),
        x.stride(1),
        out.stride(0),
        out.stride(1),
        H=H,
        BLOCK_H=triton.next_power_of_2(H),
        HALF=D // 2,
        REPEAT=repeat,
        num_warps=NUM_WARPS,
    )
    return out


def rope(q, k, positions):
    return _rotate(q, torch.empty_like(q), positions, 1), _rotate(k, torch.empty_like(k), positions, 1)


def rope_inplace(q, k, positions):
    return _rotate(q, q, positions, 1), _rotate(k, k, positions, 1)


def rope_x3(q, k, positions):
    return _rotate(q, torch.empty_like(q), positions, 3), _rotate(k, torch.empty_like(k), positions, 3)
