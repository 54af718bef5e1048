"""Decode attention, online softmax over a fixed number of tiles (the longest sequence's), each tile's update
under `if start < kv_len` inside the loop, so the running max, sum and accumulator are yielded from an scf.if
(test fixture)."""
import torch
import triton
import triton.language as tl

CATALOGUE = {"op": "attention.decode", "bug_class": None, "pos0": None, "params": {}, "modelled_on": None,
             "style": "online softmax, update guarded by an if in the loop"}


@triton.jit
def _attn_guarded(Q, K, V, O, Lens, scale, s_qb, s_qh, s_kb, s_kh, s_ks, s_ob, s_oh,
                  GROUP: tl.constexpr, D: tl.constexpr, MAX_LEN: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // GROUP
    kv_len = tl.load(Lens + b)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(Q + b * s_qb + h * s_qh + d, mask=dm, other=0.0).to(tl.float32)
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, MAX_LEN, BLOCK_N):
        if start < kv_len:
            n = start + tl.arange(0, BLOCK_N)
            nm = n < kv_len
            kvm = nm[:, None] & dm[None, :]
            k = tl.load(K + b * s_kb + g * s_kh + n[:, None] * s_ks + d[None, :], mask=kvm, other=0.0)
            s = tl.where(nm, tl.sum(k.to(tl.float32) * q[None, :], 1) * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new)
            v = tl.load(V + b * s_kb + g * s_kh + n[:, None] * s_ks + d[None, :], mask=kvm, other=0.0)
            acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
            l_i = l_i * alpha + tl.sum(p, 0)
            m_i = m_new
    tl.store(O + b * s_ob + h * s_oh + d, (acc / l_i).to(O.dtype.element_ty), mask=dm)


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    out = torch.empty_like(q)
    _attn_guarded[(B, Hq)](q, k_cache, v_cache, out, kv_lens, scale, q.stride(0), q.stride(1), k_cache.stride(0),
                           k_cache.stride(1), k_cache.stride(2), out.stride(0), out.stride(1),
                           GROUP=Hq // k_cache.shape[1], D=D, MAX_LEN=int(kv_lens.max()), BLOCK_N=32,
                           BLOCK_D=triton.next_power_of_2(D))
    return out
