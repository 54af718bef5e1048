"""NeoX RoPE that rotates token t by angle t * theta: the token index is used as its position

Parent: correct_neox.py. Injected bug, in _rope_neox_kernel:
`pos = t.to(tl.float32)` where it should be `pos = tl.load(positions + t).to(tl.float32)`:
the program id (the token's row in the batch) stands in for its position, which is only
right for a single prompt starting at position 0.
Bug class: rope-position.
Modelled on NVIDIA-NeMo/Automodel PR #2377: LlamaRotaryEmbedding keyed only on the sequence
length and returned cos_cache[:seq_len], silently ignoring position_ids values whenever they
were not arange(seq_len).
pos-0 probe: missed. The probe has one token (t = 0) at position 0, where the index and the
position agree, and the angle is 0 anyway.
"""
import math

import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "rope",
    "bug_class": "rope-position",
    "pos0": "missed",
    "params": {"style": "neox"},
    "modelled_on": "https://github.com/NVIDIA-NeMo/Automodel/pull/2377",
    "style": "neox in-kernel angles, per token, program id as position",
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
    out2 = x2 * cos + x1 * sin
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
    pos = t.to(tl.float32)
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
