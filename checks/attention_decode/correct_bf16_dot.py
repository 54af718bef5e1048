"""Decode attention with tensor-core dots on the cache dtype: tl.dot(q, k^T) and tl.dot(p.to(v.dtype), v)

Correct kernel, written the way serving stacks write their decode kernels. One program per
(sequence, KV head g) packs the GROUP = Hq // Hkv query heads that share g into the rows of a
[BLOCK_H, D] tile (BLOCK_H = GROUP padded to >= 16, the smallest tl.dot shape; padding rows are
zero and never stored). q, k and v stay in the cache dtype (bfloat16 / float16 operands go to
the tensor cores as they are, float32 with input_precision="ieee"); both dots accumulate in
float32. The softmax scale is folded with log2(e) so the kernel uses exp2; online softmax per
row over BLOCK_N = 64 keys, -inf for keys past kv_len; the probabilities are rounded to the
value dtype for the second dot (p.to(v.dtype)), as flash-decoding kernels do.
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
    "style": "gqa-packed-dot, operands in the cache dtype, p.to(v.dtype), exp2",
}

LOG2E = 1.4426950408889634


@triton.jit
def _decode_cache_dtype_dot(Q, K, V, Out, Lens, qk_scale,
                            s_qb, s_qh, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh,
                            GROUP: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    kv_len = tl.load(Lens + b)
    offs_r = tl.arange(0, BLOCK_H)
    heads = g * GROUP + offs_r
    h_mask = offs_r < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q = tl.load(Q + b * s_qb + heads[:, None] * s_qh + offs_d[None, :],
                mask=h_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_len
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(K + b * s_kb + g * s_kh + offs_n[:, None] * s_ks + offs_d[None, :], mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        v = tl.load(V + b * s_vb + g * s_vh + offs_n[:, None] * s_vs + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(Out + b * s_ob + heads[:, None] * s_oh + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=h_mask[:, None] & d_mask[None, :])


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    assert q.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    group = Hq // Hkv
    out = torch.empty_like(q)
    _decode_cache_dtype_dot[(B, Hkv)](
        q, k_cache, v_cache, out, kv_lens, scale * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        GROUP=group, D=D, BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=64,
        BLOCK_D=max(16, triton.next_power_of_2(D)))
    return out
