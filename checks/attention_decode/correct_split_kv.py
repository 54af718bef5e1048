"""Decode attention: split-KV flash-decoding, a partial kernel and a log-sum-exp combine kernel

Correct kernel. Stage 1 launches one program per (sequence, query head, split):
each sequence's kv_len keys are cut into NUM_SPLITS contiguous ranges of a whole
number of BLOCK_N tiles (ceil(kv_len / (NUM_SPLITS * BLOCK_N)) tiles each, so a
short sequence uses one split and leaves the others empty), and each program
runs an online softmax over its range and writes its normalised partial output
o_i and its log-sum-exp lse_i = m_i + log(l_i) to float32 scratch (an empty
split writes o_i = 0, lse_i = -inf). Stage 2 launches one program per (sequence, query head) that
weights the partials by w_i = exp(lse_i - max_j lse_j) and returns
sum_i w_i o_i / sum_i w_i. Loads are masked to the split's range; float32
throughout.
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
    "style": "split-kv",
}

NUM_SPLITS = 4


@triton.jit
def _split_partial(Q, K, V, MidO, MidLse, Lens, scale,
                   s_qb, s_qh, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd,
                   s_mb, s_mh, s_ms, s_md, s_lb, s_lh, s_ls,
                   GROUP: tl.constexpr, D: tl.constexpr, NUM_SPLITS: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    g = h // GROUP
    kv_len = tl.load(Lens + b)
    split_len = (kv_len + NUM_SPLITS * BLOCK_N - 1) // (NUM_SPLITS * BLOCK_N) * BLOCK_N
    lo = s * split_len
    hi = tl.minimum(lo + split_len, kv_len)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q = tl.load(Q + b * s_qb + h * s_qh + offs_d * s_qd, mask=d_mask, other=0.0).to(tl.float32)

    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(K + b * s_kb + g * s_kh + offs_n[:, None] * s_ks + offs_d[None, :] * s_kd,
                    mask=kv_mask, other=0.0)
        qk = tl.sum(k.to(tl.float32) * q[None, :], 1) * scale
        qk = tl.where(n_mask, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new)
        v = tl.load(V + b * s_vb + g * s_vh + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd,
                    mask=kv_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    l_safe = tl.where(l_i > 0, l_i, 1.0)  # an empty split: o = 0, lse = -inf
    tl.store(MidO + b * s_mb + h * s_mh + s * s_ms + offs_d * s_md, acc / l_safe, mask=d_mask)
    tl.store(MidLse + b * s_lb + h * s_lh + s * s_ls, m_i + tl.log(l_safe))


@triton.jit
def _split_combine(MidO, MidLse, Out, s_mb, s_mh, s_ms, s_md, s_lb, s_lh, s_ls, s_ob, s_oh, s_od,
                   D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    lse = tl.load(MidLse + b * s_lb + h * s_lh + offs_s * s_ls)
    o = tl.load(MidO + b * s_mb + h * s_mh + offs_s[:, None] * s_ms + offs_d[None, :] * s_md,
                mask=d_mask[None, :], other=0.0)
    w = tl.exp(lse - tl.max(lse, 0))
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(Out + b * s_ob + h * s_oh + offs_d * s_od, out.to(Out.dtype.element_ty), mask=d_mask)


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    BLOCK_D = triton.next_power_of_2(D)
    mid_o = torch.empty((B, Hq, NUM_SPLITS, D), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((B, Hq, NUM_SPLITS), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    _split_partial[(B, Hq, NUM_SPLITS)](
        q, k_cache, v_cache, mid_o, mid_lse, kv_lens, scale,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *mid_o.stride(), *mid_lse.stride(),
        GROUP=Hq // k_cache.shape[1], D=D, NUM_SPLITS=NUM_SPLITS, BLOCK_N=64, BLOCK_D=BLOCK_D)
    _split_combine[(B, Hq)](
        mid_o, mid_lse, out, *mid_o.stride(), *mid_lse.stride(), *out.stride(),
        D=D, NUM_SPLITS=NUM_SPLITS, BLOCK_D=BLOCK_D)
    return out
