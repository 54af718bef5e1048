"""Decode attention with the served features that soft-caps the raw dot product, before the scale

Bug kernel, derived from correct_features.py. The cap is applied to q.k and the softmax scale after it:

    qk = tl.sum(k.to(tl.float32) * q[None, :], 1)     # should be: ... * scale, then the cap
    qk = cap * _tanh(qk / cap) * scale

The op's soft-cap bounds the scaled score s = scale * q.k to (-cap, cap); here the bound is
scale * cap, and scores below the cap are squashed by tanh at 1/scale (8x for D = 64) their size.

Bug class: soft-cap.
Modelled on: https://github.com/sgl-project/sgl-kernel-xpu/pull/491 -- the XPU flash-attention kernel
had to undo the scale it had fused into the scores before the tanh ("apply S = softcap * tanh(S /
softcap) on the natural-scale logit") and re-fold it after: the cap belongs after the softmax scale.

pos0 probe: missed. With one key (and no sink: this file's params leave sinks off) the softmax is 1
whatever the score, so out = v[0] for any cap. With a sink the probe sees it: the one score is compared
with the sink's logit.
"""
import torch
import triton
import triton.language as tl

import kernalin_ci

CATALOGUE = {
    "op": "attention.decode",
    "bug_class": "soft-cap",
    "pos0": "missed",
    "params": {"window": 40, "logit_cap": 20.0, "alibi": True},
    "modelled_on": "https://github.com/sgl-project/sgl-kernel-xpu/pull/491",
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
        qk = tl.sum(k.to(tl.float32) * q[None, :], 1)
        if USE_CAP:
            qk = cap * _tanh(qk / cap) * scale
        if USE_ALIBI:
            qk = qk + slope * (offs_n - (kv_len - 1)).to(tl.float32)
        qk = tl.where(n_mask, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new)
        v = tl.load(v_base + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    if USE_SINKS:
        l_i = l_i + tl.exp(sink - m_i)
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
