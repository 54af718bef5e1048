"""Partial-rotary NeoX RoPE: only the first rotary_dim dims rotate, the rest are copied through.

With r = rotary_dim (from the op params; this entry is verified with r = 32 on
heads of D = 64 and 128), theta_i = exp2(-(2i/r) * log2(base)) in float32 for
i < r/2. One program per token rotates the pairs (i, i + r/2) of every head of q
and then of k, and copies dims r..D-1 of every head unchanged into the output
(out of place, so the pass-through must be written explicitly). base fixed (10000).
"""
import math

import torch
import triton
import triton.language as tl

from kernalin_ci import current_params

CATALOGUE = {
    "op": "rope",
    "bug_class": None,
    "pos0": None,
    "params": {"rotary_dim": 32},
    "modelled_on": None,
    "style": "neox partial rotary (r < D) with pass-through copy, one program per token",
}

BASE = 10000.0


@triton.jit
def _rotate_heads_partial(src, dst, stride_src_h, stride_dst_h, num_heads, cos, sin,
                          HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                          ROT: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < num_heads) & (i < HALF)
    x1 = tl.load(src + h * stride_src_h + i, mask=mask).to(tl.float32)
    x2 = tl.load(src + h * stride_src_h + i + HALF, mask=mask).to(tl.float32)
    tl.store(dst + h * stride_dst_h + i, (x1 * cos - x2 * sin).to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + h * stride_dst_h + i + HALF, (x2 * cos + x1 * sin).to(dst.dtype.element_ty), mask=mask)
    if PASS > 0:
        j = tl.arange(0, BLOCK_PASS)[None, :]
        pmask = (h < num_heads) & (j < PASS)
        xp = tl.load(src + h * stride_src_h + ROT + j, mask=pmask)
        tl.store(dst + h * stride_dst_h + ROT + j, xp, mask=pmask)


@triton.jit
def _rope_partial_kernel(q, k, q_out, k_out, positions,
                         stride_qt, stride_qh, stride_kt, stride_kh,
                         stride_qot, stride_qoh, stride_kot, stride_koh,
                         num_q_heads, num_kv_heads, log2_base,
                         HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                         BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr,
                         ROT: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(positions + t).to(tl.float32)
    i = tl.arange(0, BLOCK_HALF)
    inv_freq = tl.exp2(-(2.0 * i.to(tl.float32) / ROT) * log2_base)  # base^(-2i/r)
    angle = pos * inv_freq
    cos = tl.cos(angle)[None, :]
    sin = tl.sin(angle)[None, :]
    _rotate_heads_partial(q + t * stride_qt, q_out + t * stride_qot, stride_qh, stride_qoh, num_q_heads,
                          cos, sin, HALF, BLOCK_HALF, BLOCK_HQ, ROT, PASS, BLOCK_PASS)
    _rotate_heads_partial(k + t * stride_kt, k_out + t * stride_kot, stride_kh, stride_koh, num_kv_heads,
                          cos, sin, HALF, BLOCK_HALF, BLOCK_HKV, ROT, PASS, BLOCK_PASS)


def entry(q, k, positions):
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    rot = current_params().get("rotary_dim") or D
    assert q.stride(2) == 1 and k.stride(2) == 1 and rot % 2 == 0 and rot <= D
    q_out = torch.empty_like(q)
    k_out = torch.empty_like(k)
    half = rot // 2
    _rope_partial_kernel[(T,)](
        q, k, q_out, k_out, positions,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        Hq, Hkv, math.log2(BASE),
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(Hq), BLOCK_HKV=triton.next_power_of_2(Hkv),
        ROT=rot, PASS=D - rot, BLOCK_PASS=triton.next_power_of_2(max(D - rot, 1)),
    )
    return q_out, k_out
