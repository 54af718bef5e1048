"""GQA-packed decode attention that gathers the query heads of a KV group interleaved (head h reads KV head h % Hkv)

Bug kernel, derived from correct_gqa_dot.py (one program per (sequence, KV head),
all its query heads as the rows of a tl.dot tile). The rows of program g are
taken as every Hkv-th head instead of the contiguous group:

    heads = g + offs_r * tl.num_programs(1)    # should be: heads = g * GROUP + offs_r

tl.num_programs(1) is Hkv, so query head h attends with KV head h % Hkv instead
of h // (Hq // Hkv). Every head is still written exactly once, and with Hq == Hkv
(MHA) the two mappings agree.

Bug class: gqa-mapping.
Modelled on: https://github.com/HazyResearch/HipKittens/pull/22 -- the attention
kernels mapped blocks to heads with GROUP_SIZE used for both the modulus and the
stride, which is only right when the number of KV heads equals the group size
(64/8); the fix interleaves by KV head count instead.

pos0 probe: caught. The probe uses Hq = 8, Hkv = 2 and kv_len = 1, so each head's
output is exactly one value vector; heads 1, 3, 4 and 6 return the other KV
head's value.
"""
import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "attention.decode",
    "bug_class": "gqa-mapping",
    "pos0": "caught",
    "params": {},
    "modelled_on": "https://github.com/HazyResearch/HipKittens/pull/22",
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
    heads = g + offs_r * tl.num_programs(1)
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
