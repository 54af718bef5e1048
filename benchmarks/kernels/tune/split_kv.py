"""Split-KV decode attention with its split count, tile and warps as keyword parameters
(benchmarks/tune_vs_autotune.py), from the catalogue's checks/attention_decode/correct_split_kv.py.
Every config is correct; the best split count depends on the shape (one long sequence wants many
splits, a large batch few)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _split_partial(
    Q,
    K,
    V,
    MidO,
    MidLse,
    Lens,
    scale,
    s_qb,
    s_qh,
    s_qd,
    s_kb,
    s_kh,
    s_ks,
    s_kd,
    s_vb,
    s_vh,
    s_vs,
    s_vd,
    s_mb,
    s_mh,
    s_ms,
    s_md,
    s_lb,
    s_lh,
    s_ls,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
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
        k = tl.load(K + b * s_kb + g * s_kh + offs_n[:, None] * s_ks + offs_d[None, :] * s_kd, mask=kv_mask, other=0.0)
        qk = tl.sum(k.to(tl.float32) * q[None, :], 1) * scale
        qk = tl.where(n_mask, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new)
        v = tl.load(V + b * s_vb + g * s_vh + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    l_safe = tl.where(l_i > 0, l_i, 1.0)  # an empty split: o = 0, lse = -inf
    tl.store(MidO + b * s_mb + h * s_mh + s * s_ms + offs_d * s_md, acc / l_safe, mask=d_mask)
    tl.store(MidLse + b * s_lb + h * s_lh + s * s_ls, m_i + tl.log(l_safe))


@triton.jit
def _split_combine(
    MidO,
    MidLse,
    Out,
    s_mb,
    s_mh,
    s_ms,
    s_md,
    s_lb,
    s_lh,
    s_ls,
    s_ob,
    s_oh,
    s_od,
    D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    lse = tl.load(MidLse + b * s_lb + h * s_lh + offs_s * s_ls)
    o = tl.load(
        MidO + b * s_mb + h * s_mh + offs_s[:, None] * s_ms + offs_d[None, :] * s_md, mask=d_mask[None, :], other=0.0
    )
    w = tl.exp(lse - tl.max(lse, 0))
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(Out + b * s_ob + h * s_oh + offs_d * s_od, out.to(Out.dtype.element_ty), mask=d_mask)


def entry(q, k_cache, v_cache, kv_lens, scale, NUM_SPLITS=4, BLOCK_N=64, num_warps=4):
    B, Hq, D = q.shape
    BLOCK_D = triton.next_power_of_2(D)
    mid_o = torch.empty((B, Hq, NUM_SPLITS, D), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((B, Hq, NUM_SPLITS), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    _split_partial[(B, Hq, NUM_SPLITS)](
        q,
        k_cache,
        v_cache,
        mid_o,
        mid_lse,
        kv_lens,
        scale,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *mid_o.stride(),
        *mid_lse.stride(),
        GROUP=Hq // k_cache.shape[1],
        D=D,
        NUM_SPLITS=NUM_SPLITS,
        BLOCK_N=BLOCK_N,
        BLOCK_D=BLOCK_D,
        num_warps=num_warps,
    )
    _split_combine[(B, Hq)](
        mid_o,
        mid_lse,
        out,
        *mid_o.stride(),
        *mid_lse.stride(),
        *out.stride(),
        D=D,
        NUM_SPLITS=NUM_SPLITS,
        BLOCK_D=BLOCK_D,
    )
    return out
