"""RoPE kernel that supports both pairings but is always launched with NeoX pairing, ignoring style=gptj

Parent: correct_per_head.py (one program per (token, head), IS_NEOX constexpr).
Injected bug, in entry(): `IS_NEOX=True` where it should be `IS_NEOX=(style == "neox")`:
the configured style is never read or forwarded, so a GPT-J-style model (style=gptj)
gets pairs (i, i + D/2) instead of (2i, 2i + 1).
Bug class: rope-pairing.
Modelled on vllm-project/vllm PR #49323 (fixes #49290): the MRotaryEmbedding Triton kernel
hard-coded NeoX half-split pairing and never consulted is_neox_style, silently garbling
GPT-J-style models such as GLM-OCR.
pos-0 probe: missed. At position 0 every angle is 0, cos = 1 and sin = 0, so any rotation is
the identity whatever the pairing, and the output equals the input under both styles.
"""
import math

import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "rope",
    "bug_class": "rope-pairing",
    "pos0": "missed",
    "params": {"style": "gptj"},
    "modelled_on": "https://github.com/vllm-project/vllm/pull/49323",
    "style": "gptj requested, neox pairing hard-coded (per (token, head))",
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
    q_out = torch.empty_like(q)
    k_out = torch.empty_like(k)
    half = D // 2
    _rope_per_head_kernel[(T, Hq + Hkv)](
        q, k, q_out, k_out, positions,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        Hq, math.log2(BASE),
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half), IS_NEOX=True,
    )
    return q_out, k_out
