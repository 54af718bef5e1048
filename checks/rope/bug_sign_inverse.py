"""NeoX RoPE that applies the transposed (inverse) rotation: both sin terms have the wrong sign

Parent: correct_neox.py. Injected bug, in _rotate_heads_neox:
`out1 = x1 * cos + x2 * sin` and `out2 = x2 * cos - x1 * sin` where they should be
`out1 = x1 * cos - x2 * sin` and `out2 = x2 * cos + x1 * sin`: every vector is rotated by
-position * theta instead of +position * theta.
Bug class: rope-sign.
Modelled on karpathy/nanochat PR #489: its apply_rotary_emb used the transpose of the
textbook rotation matrix; the maintainer kept it because checkpoints were trained with that
convention, which is exactly why a serving kernel with the other sign is wrong for a
checkpoint trained with the standard one.
pos-0 probe: missed. At position 0 every angle is 0, cos = 1 and sin = 0, so any rotation is
the identity in either direction. (Because q and k are both rotated backwards, <R(m)q,
R(n)k> still depends on m - n only: the relative-position property holds; only the reference
comparison sees it.)
"""
import math

import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "rope",
    "bug_class": "rope-sign",
    "pos0": "missed",
    "params": {"style": "neox"},
    "modelled_on": "https://github.com/karpathy/nanochat/pull/489",
    "style": "neox in-kernel angles, per token, rotation transposed",
}

BASE = 10000.0


@triton.jit
def _rotate_heads_neox(src, dst, stride_src_h, stride_dst_h, num_heads, cos, sin,
                       HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < num_heads) & (i < HALF)
    x1 = tl.load(src + h * stride_src_h + i, mask=mask).to(tl.float32)
    x2 = tl.load(src + h * stride_src_h + i + HALF, mask=mask).to(tl.float32)
    out1 = x1 * cos + x2 * sin
    out2 = x2 * cos - x1 * sin
    tl.store(dst + h * stride_dst_h + i, out1.to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + h * stride_dst_h + i + HALF, out2.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _rope_neox_kernel(q, k, q_out, k_out, positions,
                      stride_qt, stride_qh, stride_kt, stride_kh,
                      stride_qot, stride_qoh, stride_kot, stride_koh,
                      num_q_heads, num_kv_heads, log2_base,
                      HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                      BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(positions + t).to(tl.float32)
    i = tl.arange(0, BLOCK_HALF)
    inv_freq = tl.exp2(-(i.to(tl.float32) / HALF) * log2_base)  # base^(-2i/r), r = 2 * HALF
    angle = pos * inv_freq
    cos = tl.cos(angle)[None, :]
    sin = tl.sin(angle)[None, :]
    _rotate_heads_neox(q + t * stride_qt, q_out + t * stride_qot, stride_qh, stride_qoh, num_q_heads,
                       cos, sin, HALF, BLOCK_HALF, BLOCK_HQ)
    _rotate_heads_neox(k + t * stride_kt, k_out + t * stride_kot, stride_kh, stride_koh, num_kv_heads,
                       cos, sin, HALF, BLOCK_HALF, BLOCK_HKV)


def entry(q, k, positions):
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and D % 2 == 0
    q_out = torch.empty_like(q)
    k_out = torch.empty_like(k)
    half = D // 2
    _rope_neox_kernel[(T,)](
        q, k, q_out, k_out, positions,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        Hq, Hkv, math.log2(BASE),
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(Hq), BLOCK_HKV=triton.next_power_of_2(Hkv),
    )
    return q_out, k_out
