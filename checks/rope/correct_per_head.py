"""RoPE with one program per (token, head), both pairings, the style read from the op params.

Grid (T, Hq + Hkv): program (t, h) rotates query head h when h < Hq and key head
h - Hq otherwise. Each program loads positions[t], computes theta_i =
exp2(-(2i/r) * log2(base)) and a = position * theta_i in float32, and rotates one
head vector: pairs (i, i + r/2) for neox or (2i, 2i + 1) for gptj, chosen by the
IS_NEOX constexpr that the entry sets from the configured `style`. Out of place.
Full rotary (r = D); base fixed (10000). Verified with style=gptj (its CATALOGUE
params) and with style=neox.
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
    "params": {"style": "gptj"},
    "modelled_on": None,
    "style": "neox or gptj from params, in-kernel float32 angles, one program per (token, head)",
}

BASE = 10000.0


@triton.jit
def _rotate_one_head(src, dst, cos, sin, i, mask, HALF: tl.constexpr, IS_NEOX: tl.constexpr):
    if IS_NEOX:
        a = i
        b = i + HALF
    else:
        a = 2 * i
        b = 2 * i + 1
    x1 = tl.load(src + a, mask=mask).to(tl.float32)
    x2 = tl.load(src + b, mask=mask).to(tl.float32)
    tl.store(dst + a, (x1 * cos - x2 * sin).to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + b, (x2 * cos + x1 * sin).to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _rope_per_head_kernel(q, k, q_out, k_out, positions,
                          stride_qt, stride_qh, stride_kt, stride_kh,
                          stride_qot, stride_qoh, stride_kot, stride_koh,
                          num_q_heads, log2_base,
                          HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, IS_NEOX: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(positions + t).to(tl.float32)
    i = tl.arange(0, BLOCK_HALF)
    mask = i < HALF
    inv_freq = tl.exp2(-(i.to(tl.float32) / HALF) * log2_base)
    angle = pos * inv_freq
    cos = tl.cos(angle)
    sin = tl.sin(angle)
    if h < num_q_heads:
        _rotate_one_head(q + t * stride_qt + h * stride_qh, q_out + t * stride_qot + h * stride_qoh,
                         cos, sin, i, mask, HALF, IS_NEOX)
    else:
        hk = h - num_q_heads
        _rotate_one_head(k + t * stride_kt + hk * stride_kh, k_out + t * stride_kot + hk * stride_koh,
                         cos, sin, i, mask, HALF, IS_NEOX)


def entry(q, k, positions):
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and D % 2 == 0
    style = current_params().get("style", "neox")
    q_out = torch.empty_like(q)
    k_out = torch.empty_like(k)
    half = D // 2
    _rope_per_head_kernel[(T, Hq + Hkv)](
        q, k, q_out, k_out, positions,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        Hq, math.log2(BASE),
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half), IS_NEOX=(style == "neox"),
    )
    return q_out, k_out
