"""Paged decode attention with the served features: sliding window, soft-cap, ALiBi, sinks (correct)

Online softmax over BLOCK_N keys read through the block table, one program per (sequence, query head),
float32 throughout. The features follow the op's params (kernalin_ci.current_params(), docs/ops.md
"Attention features"): the scaled score is soft-capped, then the ALiBi bias slope[h] * (j - p) is added,
keys at or before p - window are masked out (the loop starts at the window's first tile), and the head's
sink logit enters the denominator once, after the loop (the running maximum starts at the sink).
"""
import torch
import triton
import triton.language as tl

import kernalin_ci

CATALOGUE = {
    "op": "attention.decode_paged",
    "bug_class": None,
    "pos0": None,
    "params": {"block_size": 16, "window": 40, "logit_cap": 20.0, "alibi": True, "sinks": True},
    "modelled_on": None,
    "style": "paged-online-softmax-features",
    "structural": "not-analysed",
}


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _paged_features(Q, K, V, Out, Tables, Lens, Slopes, Sinks, scale, cap, window,
                    s_qb, s_qh, s_qd, s_kn, s_kp, s_kh, s_kd, s_vn, s_vp, s_vh, s_vd, s_tb, s_tc, s_ob, s_oh, s_od,
                    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, USE_WINDOW: tl.constexpr,
                    USE_CAP: tl.constexpr, USE_ALIBI: tl.constexpr, USE_SINKS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // (HQ // HKV)
    kv_len = tl.load(Lens + b)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q = tl.load(Q + b * s_qb + h * s_qh + offs_d * s_qd, mask=d_mask, other=0.0).to(tl.float32)
    table = Tables + b * s_tb
    n_pages = (kv_len + PAGE - 1) // PAGE
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(kv_len - window, 0)
    first = (lo // BLOCK_N) * BLOCK_N
    if USE_ALIBI:
        slope = tl.load(Slopes + h)
    m_i = -float("inf")
    if USE_SINKS:
        sink = tl.load(Sinks + h)
        m_i = sink
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(first, kv_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = (offs_n < kv_len) & (offs_n >= lo)
        col = offs_n // PAGE
        blk = tl.load(table + col * s_tc, mask=col < n_pages, other=0).to(tl.int64)
        slot = offs_n % PAGE
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(K + blk[:, None] * s_kn + slot[:, None] * s_kp + g * s_kh + offs_d[None, :] * s_kd,
                    mask=kv_mask, other=0.0)
        qk = tl.sum(k.to(tl.float32) * q[None, :], 1) * scale
        if USE_CAP:
            qk = cap * _tanh(qk / cap)
        if USE_ALIBI:
            qk = qk + slope * (offs_n - (kv_len - 1)).to(tl.float32)
        qk = tl.where(n_mask, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new)
        v = tl.load(V + blk[:, None] * s_vn + slot[:, None] * s_vp + g * s_vh + offs_d[None, :] * s_vd,
                    mask=kv_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    if USE_SINKS:
        l_i = l_i + tl.exp(sink - m_i)
    tl.store(Out + b * s_ob + h * s_oh + offs_d * s_od, (acc / l_i).to(Out.dtype.element_ty), mask=d_mask)


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale, alibi_slopes=None, sinks=None):
    prm = kernalin_ci.current_params()
    B, Hq, D = q.shape
    out = torch.empty_like(q)
    _paged_features[(B, Hq)](
        q, k_cache, v_cache, out, block_tables, kv_lens, alibi_slopes if alibi_slopes is not None else q,
        sinks if sinks is not None else q, scale, prm.get("logit_cap") or 1.0, prm.get("window") or 0,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
        HQ=Hq, HKV=k_cache.shape[2], D=D, PAGE=k_cache.shape[1], BLOCK_N=32,
        BLOCK_D=triton.next_power_of_2(D), USE_WINDOW=bool(prm.get("window")),
        USE_CAP=bool(prm.get("logit_cap")), USE_ALIBI=alibi_slopes is not None, USE_SINKS=sinks is not None)
    return out
