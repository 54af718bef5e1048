"""Decode attention: GQA-packed tensor-core kernel, all query heads of one KV group per program

Correct kernel. One program per (sequence, KV head g) loads the GROUP = Hq // Hkv
query heads g*GROUP .. g*GROUP+GROUP-1 that share g as the rows of a
[BLOCK_H, D] tile (BLOCK_H = GROUP padded to >= 16, the smallest tl.dot shape;
padding rows are zero and never stored), so each key/value tile is loaded once
for the whole group. Scores are tl.dot(q, k^T) and the output update is
tl.dot(p, v), both with float32 accumulation. float16 operands stay float16
(tensor cores; p is cast to float16 for the second dot); float32 and bfloat16
operands are fed as float32 with input_precision="ieee", so the large-score cases
are not hurt by tf32 rounding (correct_bf16_dot.py is the variant with
bfloat16 operands).
Online softmax per row, masked loads, -inf for keys past kv_len.
"""
import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "attention.decode",
    "bug_class": None,
    "pos0": None,
    "params": {},
    "modelled_on": None,
    "style": "gqa-packed-dot",
}


@triton.jit
def _decode_gqa_dot(Q, K, V, Out, Lens, scale,
                    s_qb, s_qh, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd, s_ob, s_oh, s_od,
                    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    kv_len = tl.load(Lens + b)
    offs_r = tl.arange(0, BLOCK_H)
    heads = g * GROUP + offs_r
    h_mask = offs_r < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q = tl.load(Q + b * s_qb + heads[:, None] * s_qh + offs_d[None, :] * s_qd,
                mask=h_mask[:, None] & d_mask[None, :], other=0.0).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_len
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(K + b * s_kb + g * s_kh + offs_n[:, None] * s_ks + offs_d[None, :] * s_kd,
                    mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision="ieee") * scale
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        v = tl.load(V + b * s_vb + g * s_vh + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd,
                    mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision="ieee")
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(Out + b * s_ob + heads[:, None] * s_oh + offs_d[None, :] * s_od, out.to(Out.dtype.element_ty),
             mask=h_mask[:, None] & d_mask[None, :])


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    group = Hq // Hkv
    out = torch.empty_like(q)
    _decode_gqa_dot[(B, Hkv)](
        q, k_cache, v_cache, out, kv_lens, scale,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        GROUP=group, D=D, BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=32,
        BLOCK_D=max(16, triton.next_power_of_2(D)),
        DOT_DTYPE=tl.float16 if q.dtype == torch.float16 else tl.float32)
    return out
