"""Decode attention, online softmax with tl.dot over a GQA group, whose running max is made safe for rows
with every score masked: `m_safe = where(m > -inf, m, 0)`, weights exp(s - m_safe), rescale
exp(m_old - m_safe) (test fixture)."""
import torch
import triton
import triton.language as tl

CATALOGUE = {"op": "attention.decode", "bug_class": None, "pos0": None, "params": {}, "modelled_on": None,
             "style": "online softmax, guarded max for fully masked rows, tl.dot"}


@triton.jit
def _attn_safe_max(Q, K, V, O, Lens, scale, s_qb, s_qh, s_kb, s_kh, s_ks, s_ob, s_oh,
                   GROUP: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    kv_len = tl.load(Lens + b)
    r = tl.arange(0, BLOCK_G)
    rm = r < GROUP
    h = g * GROUP + r
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(Q + b * s_qb + h[:, None] * s_qh + d[None, :], mask=rm[:, None] & dm[None, :], other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nm = n < kv_len
        kvm = nm[:, None] & dm[None, :]
        k = tl.load(K + b * s_kb + g * s_kh + n[:, None] * s_ks + d[None, :], mask=kvm, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(nm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        v = tl.load(V + b * s_kb + g * s_kh + n[:, None] * s_ks + d[None, :], mask=kvm, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + b * s_ob + h[:, None] * s_oh + d[None, :], out.to(O.dtype.element_ty), mask=rm[:, None] & dm[None, :])


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    out = torch.empty_like(q)
    _attn_safe_max[(B, Hkv)](q, k_cache, v_cache, out, kv_lens, scale, q.stride(0), q.stride(1), k_cache.stride(0),
                             k_cache.stride(1), k_cache.stride(2), out.stride(0), out.stride(1),
                             GROUP=Hq // Hkv, D=D, BLOCK_G=max(16, triton.next_power_of_2(Hq // Hkv)), BLOCK_N=32,
                             BLOCK_D=max(16, triton.next_power_of_2(D)))
    return out
