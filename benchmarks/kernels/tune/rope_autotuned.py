"""NeoX rotary embedding with autotuned warps (benchmarks/tune_vs_autotune.py), after the example
repository's kernel (examples/decode-kernels/kernels/rope.py). Every config is correct."""

import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (1, 2, 4, 8)], key=["D", "T"])
@triton.jit
def _rope_kernel(
    x_ptr, o_ptr, pos_ptr, s_t, s_h, so_t, so_h, log_base, T, D: tl.constexpr, HALF: tl.constexpr, BLOCK_D: tl.constexpr
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + t).to(tl.float32)
    i = tl.arange(0, BLOCK_D // 2)
    i_mask = i < HALF
    inv_freq = tl.exp(-(2.0 * i.to(tl.float32) / (2 * HALF)) * log_base)
    angle = pos * inv_freq
    cos = tl.cos(angle)
    sin = tl.sin(angle)
    x1 = tl.load(x_ptr + t * s_t + h * s_h + i, mask=i_mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + t * s_t + h * s_h + HALF + i, mask=i_mask, other=0.0).to(tl.float32)
    tl.store(o_ptr + t * so_t + h * so_h + i, (x1 * cos - x2 * sin).to(o_ptr.dtype.element_ty), mask=i_mask)
    tl.store(o_ptr + t * so_t + h * so_h + HALF + i, (x2 * cos + x1 * sin).to(o_ptr.dtype.element_ty), mask=i_mask)


def rope(q, k, positions):
    outs = []
    for x in (q, k):
        T, H, D = x.shape
        out = torch.empty_like(x)
        _rope_kernel[(T, H)](
            x,
            out,
            positions,
            x.stride(0),
            x.stride(1),
            out.stride(0),
            out.stride(1),
            9.210340371976184,
            T,
            D=D,
            HALF=D // 2,
            BLOCK_D=triton.next_power_of_2(D),
        )
        outs.append(out)
    return outs[0], outs[1]
