"""Paged split-KV decode attention whose combine kernel weights partials by exp(lse_i) without subtracting the max

Bug kernel, derived from correct_split_paged.py. The partial kernel is correct;
the combine kernel exponentiates the per-split log-sum-exp directly:

    w = tl.exp(lse)                            # should be: w = tl.exp(lse - tl.max(lse, 0))

Mathematically the common factor cancels in sum w_i o_i / sum w_i, so ordinary
inputs pass; once a split's lse exceeds ~88 (large scores), exp overflows to inf
and the output is inf / inf = NaN.

Bug class: split-combine.
Modelled on: https://github.com/Dao-AILab/flash-attention/issues/949 -- the
flash-decoding combine kernel (combine_attn_seqk_parallel) was reported not to
take the global maximum of the split statistics before rescaling the partial
outputs, trading numerical safety in the combine for nothing.

pos0 probe: missed. kv_len = 1 gives one non-empty split with a small lse (the
score of one N(0, 1) key) and three empty ones (exp(-inf) = 0).
"""
import torch
import triton
import triton.language as tl

from kernalin_ci import current_params

CATALOGUE = {
    "op": "attention.decode_paged",
    "bug_class": "softmax-no-max",
    "pos0": "missed",
    "params": {"block_size": 16},
    "modelled_on": "https://github.com/Dao-AILab/flash-attention/issues/949",
    "style": "paged-split-kv",
}

NUM_SPLITS = 4


@triton.jit
def _paged_partial(Q, K, V, MidO, MidLse, Tables, Lens, scale,
                   s_qb, s_qh, s_qd, s_kn, s_kp, s_kh, s_kd, s_vn, s_vp, s_vh, s_vd, s_tb, s_tc,
                   s_mb, s_mh, s_ms, s_md, s_lb, s_lh, s_ls,
                   GROUP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, NUM_SPLITS: tl.constexpr,
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
        blk = tl.load(Tables + b * s_tb + (offs_n // PAGE) * s_tc, mask=n_mask, other=0).to(tl.int64)
        slot = offs_n % PAGE
        k = tl.load(K + blk[:, None] * s_kn + slot[:, None] * s_kp + g * s_kh + offs_d[None, :] * s_kd,
                    mask=kv_mask, other=0.0)
        qk = tl.sum(k.to(tl.float32) * q[None, :], 1) * scale
        qk = tl.where(n_mask, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new)
        v = tl.load(V + blk[:, None] * s_vn + slot[:, None] * s_vp + g * s_vh + offs_d[None, :] * s_vd,
                    mask=kv_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    l_safe = tl.where(l_i > 0, l_i, 1.0)  # an empty split: o = 0, lse = -inf
    tl.store(MidO + b * s_mb + h * s_mh + s * s_ms + offs_d * s_md, acc / l_safe, mask=d_mask)
    tl.store(MidLse + b * s_lb + h * s_lh + s * s_ls, m_i + tl.log(l_safe))


@triton.jit
def _paged_combine(MidO, MidLse, Out, s_mb, s_mh, s_ms, s_md, s_lb, s_lh, s_ls, s_ob, s_oh, s_od,
                   D: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    lse = tl.load(MidLse + b * s_lb + h * s_lh + offs_s * s_ls)
    o = tl.load(MidO + b * s_mb + h * s_mh + offs_s[:, None] * s_ms + offs_d[None, :] * s_md,
                mask=d_mask[None, :], other=0.0)
    w = tl.exp(lse)
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(Out + b * s_ob + h * s_oh + offs_d * s_od, out.to(Out.dtype.element_ty), mask=d_mask)


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale):
    B, Hq, D = q.shape
    block_size = current_params().get("block_size", k_cache.shape[1])
    BLOCK_D = triton.next_power_of_2(D)
    mid_o = torch.empty((B, Hq, NUM_SPLITS, D), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((B, Hq, NUM_SPLITS), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    _paged_partial[(B, Hq, NUM_SPLITS)](
        q, k_cache, v_cache, mid_o, mid_lse, block_tables, kv_lens, scale,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(),
        *mid_o.stride(), *mid_lse.stride(),
        GROUP=Hq // k_cache.shape[2], D=D, PAGE=block_size, NUM_SPLITS=NUM_SPLITS, BLOCK_N=64,
        BLOCK_D=BLOCK_D)
    _paged_combine[(B, Hq)](
        mid_o, mid_lse, out, *mid_o.stride(), *mid_lse.stride(), *out.stride(),
        D=D, NUM_SPLITS=NUM_SPLITS, BLOCK_D=BLOCK_D)
    return out
