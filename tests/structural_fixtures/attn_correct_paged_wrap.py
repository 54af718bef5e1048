"""Paged decode attention with tl.dot over a GQA group, written as some serving stacks write it: the head-dim
offsets wrap (`d % D`, so the padding lanes re-read real elements; q is 0 there and those output lanes are not
stored) and the scores are masked only in the tile that reaches kv_len, under an `if` (test fixture)."""
import torch
import triton
import triton.language as tl

CATALOGUE = {"op": "attention.decode_paged", "bug_class": None, "pos0": None, "params": {"block_size": 16},
             "modelled_on": None, "style": "tl.dot, wrapped head-dim offsets, score mask under an if, paged"}


@triton.jit
def _paged_wrap(Q, K, V, O, Lens, BT, qk_scale, s_qb, s_qh, s_kn, s_kp, s_kh, s_bt,
           GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_H: tl.constexpr, PAGE: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    r = tl.arange(0, BLOCK_H)
    heads = kvh * GROUP + r
    hm = r < GROUP
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(Q + b * s_qb + heads[:, None] * s_qh + d[None, :], mask=hm[:, None] & dm[None, :], other=0.0)
    dw = d % D
    kv_len = tl.load(Lens + b)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nm = n < kv_len
        blk = tl.load(BT + b * s_bt + n // PAGE, mask=nm, other=0).to(tl.int64)
        off = blk[:, None] * s_kn + (n % PAGE)[:, None] * s_kp + kvh * s_kh + dw[None, :]
        kvm = nm[:, None]
        k = tl.load(K + off, mask=kvm, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if start + BLOCK_N > kv_len:
            s = tl.where(nm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        v = tl.load(V + off, mask=kvm, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(O + b * s_qb + heads[:, None] * s_qh + d[None, :], out.to(O.dtype.element_ty),
             mask=hm[:, None] & dm[None, :])


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    group = Hq // Hkv
    out = torch.empty_like(q)
    _paged_wrap[(B, Hkv)](q, k_cache, v_cache, out, kv_lens, block_tables, scale * 1.4426950408889634, q.stride(0),
                     q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
                     GROUP=group, D=D, BLOCK_D=triton.next_power_of_2(D), BLOCK_N=32,
                     BLOCK_H=max(16, triton.next_power_of_2(group)), PAGE=k_cache.shape[1])
    return out
