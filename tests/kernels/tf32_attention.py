"""attention.decode with tl.dot at Triton's default input precision (TF32 for float32 operands on an
NVIDIA GPU): `entry`; the same kernel with input_precision="ieee": `entry_ieee`. One program per
(sequence, KV head) holds the group's query heads as the rows of a >= 16-row tile."""
import torch
import triton
import triton.language as tl


@triton.jit
def _decode_dot(Q, K, V, Out, Lens, scale, s_qb, s_qh, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh,
                GROUP: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr, IEEE: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    n = tl.load(Lens + b)
    r = tl.arange(0, BLOCK_H)
    heads = g * GROUP + r
    hm = r < GROUP
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(Q + b * s_qb + heads[:, None] * s_qh + d[None, :], mask=hm[:, None] & dm[None, :], other=0.0)
    q = q.to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start in range(0, n, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        jm = j < n
        mask = jm[:, None] & dm[None, :]
        k = tl.load(K + b * s_kb + g * s_kh + j[:, None] * s_ks + d[None, :], mask=mask, other=0.0).to(tl.float32)
        v = tl.load(V + b * s_vb + g * s_vh + j[:, None] * s_vs + d[None, :], mask=mask, other=0.0).to(tl.float32)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        else:
            s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(jm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    tl.store(Out + b * s_ob + heads[:, None] * s_oh + d[None, :], (acc / l_i[:, None]).to(Out.dtype.element_ty),
             mask=hm[:, None] & dm[None, :])


def _launch(q, k_cache, v_cache, kv_lens, scale, ieee):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    assert q.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    out = torch.empty_like(q)
    _decode_dot[(B, Hkv)](q, k_cache, v_cache, out, kv_lens, scale, q.stride(0), q.stride(1),
                          k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                          v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
                          GROUP=Hq // Hkv, D=D, BLOCK_H=max(16, triton.next_power_of_2(Hq // Hkv)), BLOCK_N=32,
                          BLOCK_D=max(16, triton.next_power_of_2(D)), IEEE=ieee)
    return out


def entry(q, k_cache, v_cache, kv_lens, scale):
    return _launch(q, k_cache, v_cache, kv_lens, scale, False)


def entry_ieee(q, k_cache, v_cache, kv_lens, scale):
    return _launch(q, k_cache, v_cache, kv_lens, scale, True)
