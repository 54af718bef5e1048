"""attention.decode_multi in query tiles (correct): one program per (sequence, query head) walks its
sequence's new tokens BLOCK_Q at a time, as unified kernels tile the queries of a sequence, and runs an
online softmax over each tile's keys (0 .. the tile's last position, read through the block table, BLOCK_N
keys a tile, float32), each row masked at its own position p = kv_len - q_len + i.

tests/test_multi_token.py derives from it the kernel sized for drafts: one query tile per sequence
(q_len <= BLOCK_Q), right for every speculative step and wrong for a prefill chunk beside decodes.
"""
import torch
import triton
import triton.language as tl

BLOCK_Q = 16


@triton.jit
def _decode_multi_qtiles(Q, K, V, Out, Tables, Starts, Lens, scale,
                         s_qt, s_qh, s_kn, s_kp, s_kh, s_vn, s_vp, s_vh, s_tb, s_ot, s_oh,
                         HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                         BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // (HQ // HKV)
    q_start = tl.load(Starts + b)
    q_len = tl.load(Starts + b + 1) - q_start
    kv_len = tl.load(Lens + b)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    for q0 in range(0, q_len, BLOCK_Q):
        rows = q0 + tl.arange(0, BLOCK_Q)
        r_mask = rows < q_len
        pos = kv_len - q_len + rows
        qm = r_mask[:, None] & d_mask[None, :]
        q = tl.load(Q + (q_start + rows)[:, None] * s_qt + h * s_qh + offs_d[None, :], mask=qm, other=0.0)
        q = q.to(tl.float32)
        m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
        last = kv_len - q_len + tl.minimum(q0 + BLOCK_Q, q_len)  # keys 0 .. last - 1 reach this tile
        for start in range(0, last, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_mask = offs_n < last
            blk = tl.load(Tables + b * s_tb + offs_n // PAGE, mask=n_mask, other=0).to(tl.int64)
            slot = offs_n % PAGE
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(K + blk[:, None] * s_kn + slot[:, None] * s_kp + g * s_kh + offs_d[None, :],
                        mask=kv_mask, other=0.0).to(tl.float32)
            qk = tl.sum(q[:, None, :] * k[None, :, :], 2) * scale
            seen = (offs_n[None, :] <= pos[:, None]) & n_mask[None, :] & r_mask[:, None]
            qk = tl.where(seen, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(qk - m_safe[:, None])
            v = tl.load(V + blk[:, None] * s_vn + slot[:, None] * s_vp + g * s_vh + offs_d[None, :],
                        mask=kv_mask, other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], 1)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(Out + (q_start + rows)[:, None] * s_ot + h * s_oh + offs_d[None, :],
                 out.to(Out.dtype.element_ty), mask=qm)


def entry(q, k_cache, v_cache, block_tables, query_start_loc, kv_lens, scale):
    T, Hq, D = q.shape
    B = kv_lens.shape[0]
    assert q.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    out = torch.empty_like(q)
    _decode_multi_qtiles[(B, Hq)](
        q, k_cache, v_cache, out, block_tables, query_start_loc, kv_lens, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1),
        HQ=Hq, HKV=k_cache.shape[2], D=D, PAGE=k_cache.shape[1], BLOCK_Q=BLOCK_Q, BLOCK_N=32,
        BLOCK_D=triton.next_power_of_2(D))
    return out
