"""A correct neox RoPE whose angles go through libdevice math (issue 30, item 2): libdevice.exp2 for the
frequencies, libdevice.cos / libdevice.sin for the rotation, in float32, out of place.
"""
import math

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _rotate(src, dst, stride_h, nh, cos, sin, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    m = (h < nh) & (i < HALF)
    x1 = tl.load(src + h * stride_h + i, mask=m).to(tl.float32)
    x2 = tl.load(src + h * stride_h + i + HALF, mask=m).to(tl.float32)
    tl.store(dst + h * stride_h + i, (x1 * cos - x2 * sin).to(dst.dtype.element_ty), mask=m)
    tl.store(dst + h * stride_h + i + HALF, (x2 * cos + x1 * sin).to(dst.dtype.element_ty), mask=m)


@triton.jit
def _rope_libdevice(q, k, q_out, k_out, positions, stride_qt, stride_qh, stride_kt, stride_kh, hq, hkv, log2_base,
                    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(positions + t).to(tl.float32)
    i = tl.arange(0, BLOCK_HALF)
    angle = pos * libdevice.exp2(-(i.to(tl.float32) / HALF) * log2_base)
    cos = libdevice.cos(angle)[None, :]
    sin = libdevice.sin(angle)[None, :]
    _rotate(q + t * stride_qt, q_out + t * stride_qt, stride_qh, hq, cos, sin, HALF, BLOCK_HALF, BLOCK_H)
    _rotate(k + t * stride_kt, k_out + t * stride_kt, stride_kh, hkv, cos, sin, HALF, BLOCK_HALF, BLOCK_H)


def entry(q, k, positions):
    T, hq, d = q.shape
    hkv = k.shape[1]
    q, k = q.contiguous(), k.contiguous()
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _rope_libdevice[(T,)](q, k, q_out, k_out, positions, q.stride(0), q.stride(1), k.stride(0), k.stride(1), hq, hkv,
                          math.log2(10000.0), HALF=d // 2, BLOCK_HALF=triton.next_power_of_2(d // 2),
                          BLOCK_H=triton.next_power_of_2(max(hq, hkv)))
    return q_out, k_out
