"""Decode attention with the served features that adds the sink to the denominator once per tile

Bug kernel, derived from correct_features.py. The sink's term is added inside the loop, to each
tile's running sum, instead of once after it:

    l_i = l_i * alpha + tl.sum(p, 0) + tl.exp(sink - m_new)     # should be: the loop's l_i, and the
                                                                # sink's exp(sink - m_i) once, after it

With n tiles the sink counts up to n times (the earlier terms rescaled by alpha like the rest), so the
output shrinks as the sequence grows.

Bug class: attention-sink.
Modelled on: https://github.com/kekzl/imp/pull/1346 -- the split-K decode path's shared reduce launcher
applied no sink term (nullptr) while the non-split path did: the sink belongs in the softmax
denominator exactly once, however the keys are partitioned.

pos0 probe: missed. At kv_len 1 there is one tile, so the sink is added once, as it should be.
"""
import torch
import triton
import triton.language as tl

import kernalin_ci

CATALOGUE = {
    "op": "attention.decode",
    "bug_class": "attention-sink",
    "pos0": "missed",
    "params": {"window": 40, "logit_cap": 20.0, "alibi": True, "sinks": True},
    "modelled_on": "https://github.com/kekzl/imp/pull/1346",
    "style": "online-softmax-features",
    "structural": "not-analysed",
}


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _decode_features(Q, K, V, Out, Lens, Slopes, Sinks, scale, cap, window,
                     s_qb, s_qh, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd, s_ob, s_oh, s_od,
                     GROUP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     USE_WINDOW: tl.constexpr, USE_CAP: tl.constexpr, USE_ALIBI: tl.constexpr,
                     USE_SINKS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // GROUP
    kv_len = tl.load(Lens + b)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q = tl.load(Q + b * s_qb + h * s_qh + offs_d * s_qd, mask=d_mask, other=0.0).to(tl.float32)
    k_base = K + b * s_kb + g * s_kh
    v_base = V + b * s_vb + g * s_vh
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
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + offs_n[:, None] * s_ks + offs_d[None, :] * s_kd, mask=kv_mask, other=0.0)
        qk = tl.sum(k.to(tl.float32) * q[None, :], 1) * scale
        if USE_CAP:
            qk = cap * _tanh(qk / cap)
        if USE_ALIBI:
            qk = qk + slope * (offs_n - (kv_len - 1)).to(tl.float32)
        qk = tl.where(n_mask, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new)
        v = tl.load(v_base + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0) + tl.exp(sink - m_new)
        m_i = m_new
    out = acc / l_i
    tl.store(Out + b * s_ob + h * s_oh + offs_d * s_od, out.to(Out.dtype.element_ty), mask=d_mask)


def entry(q, k_cache, v_cache, kv_lens, scale, alibi_slopes=None, sinks=None):
    prm = kernalin_ci.current_params()
    B, Hq, D = q.shape
    out = torch.empty_like(q)
    _decode_features[(B, Hq)](
        q, k_cache, v_cache, out, kv_lens, alibi_slopes if alibi_slopes is not None else q,
        sinks if sinks is not None else q, scale, prm.get("logit_cap") or 1.0, prm.get("window") or 0,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        GROUP=Hq // k_cache.shape[1], D=D, BLOCK_N=32, BLOCK_D=triton.next_power_of_2(D),
        USE_WINDOW=bool(prm.get("window")), USE_CAP=bool(prm.get("logit_cap")),
        USE_ALIBI=alibi_slopes is not None, USE_SINKS=sinks is not None)
    return out
