"""NeoX RoPE whose second output line copies the minus sign of the first: out2 = x2 cos - x1 sin

Parent: correct_neox.py. Injected bug, in _rotate_heads_neox: `out2 = x2 * cos - x1 * sin`
where it should be `out2 = x2 * cos + x1 * sin` (the first line's minus copied into the
second). The result is not a rotation at all: it stretches each (x1, x2) pair along one
diagonal and shrinks it along the other, so norms change.
Bug class: rope-sign.
Modelled on hpcaitech/ColossalAI PR #6429: in the Triton fused_rotary_emb kernel two of the
four rotary output lines were copy-paste mistakes (written from the wrong tensor); this is
the same kind of slip among the output lines, on the sign.
pos-0 probe: missed. At position 0 every angle is 0, cos = 1 and sin = 0, so any rotation is
the identity: both output lines reduce to out = x whatever the sign of the sin term.
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
    "modelled_on": "https://github.com/hpcaitech/ColossalAI/pull/6429",
    "style": "neox in-kernel angles, per token, one output sign flipped",
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
    out1 = x1 * cos - x2 * sin
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
