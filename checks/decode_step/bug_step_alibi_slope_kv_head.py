"""Fused decode step with the served features that reads the ALiBi slopes of the KV head

Injected bug, derived from correct_features_step.py (Parent: correct_features_step.py). The program's
query heads h = g * G .. g * G + G - 1 share KV head g, and the slopes are loaded by the KV head index:

    slope = tl.load(Slopes + h // G)     # should be: tl.load(Slopes + h)

so every query head of a group gets the slope of query head g: the wrong slope for all heads but few.

Bug class: alibi.
Modelled on: https://github.com/vllm-project/vllm/pull/496 (vllm-project/vllm) -- "hotfix attn alibi wo
head mapping": vLLM's paged attention with ALiBi had to be fixed for the head mapping of grouped KV heads.

pos-0 probe: missed. At kv_len 1 the only key is the query's own position, whose bias slope * (p - p) is 0
for any slope.
"""
import math

import torch
import triton
import triton.language as tl

import kernalin_ci

CATALOGUE = {
    "op": "decode_step",
    "bug_class": "alibi",
    "pos0": "missed",
    "params": {"block_size": 16, "window": 24, "logit_cap": 20.0, "alibi": True, "sinks": True, "steps": 24},
    "modelled_on": "https://github.com/vllm-project/vllm/pull/496",
    "style": "fully fused with the attention features, slopes by KV head",
    "structural": "not-analysed",
}

BASE = 10000.0


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _decode_step(Q, K, V, Pos, KC, VC, Slots, Tables, Lens, Out, Slopes, Sinks, scale, log2_base, cap, window,
                 s_qb, s_qh, s_kb, s_kh, s_vb, s_vh, s_cn, s_cp, s_ch, s_tb, s_ob, s_oh,
                 G: tl.constexpr, PAGE: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 BLOCK_N: tl.constexpr, USE_WINDOW: tl.constexpr, USE_CAP: tl.constexpr,
                 USE_ALIBI: tl.constexpr, USE_SINKS: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    i = tl.arange(0, BLOCK_HALF)
    im = i < HALF
    pos = tl.load(Pos + b).to(tl.float32)
    ang = pos * tl.exp2(-(i.to(tl.float32) / HALF) * log2_base)
    c = tl.cos(ang)
    s = tl.sin(ang)
    # the new token: rotate k, write k and v into its slot
    k1 = tl.load(K + b * s_kb + g * s_kh + i, mask=im, other=0.0).to(tl.float32)
    k2 = tl.load(K + b * s_kb + g * s_kh + i + HALF, mask=im, other=0.0).to(tl.float32)
    v1 = tl.load(V + b * s_vb + g * s_vh + i, mask=im, other=0.0).to(tl.float32)
    v2 = tl.load(V + b * s_vb + g * s_vh + i + HALF, mask=im, other=0.0).to(tl.float32)
    kr1 = k1 * c - k2 * s
    kr2 = k2 * c + k1 * s
    slot = tl.load(Slots + b)
    new = (slot // PAGE) * s_cn + (slot % PAGE) * s_cp + g * s_ch + i
    tl.store(KC + new, kr1.to(KC.dtype.element_ty), mask=im)
    tl.store(KC + new + HALF, kr2.to(KC.dtype.element_ty), mask=im)
    tl.store(VC + new, v1.to(VC.dtype.element_ty), mask=im)
    tl.store(VC + new + HALF, v2.to(VC.dtype.element_ty), mask=im)
    tl.debug_barrier()
    # the query heads of this KV head's group, rotated
    h = g * G + tl.arange(0, G)
    qm = im[None, :]
    q1 = tl.load(Q + b * s_qb + h[:, None] * s_qh + i[None, :], mask=qm, other=0.0).to(tl.float32)
    q2 = tl.load(Q + b * s_qb + h[:, None] * s_qh + i[None, :] + HALF, mask=qm, other=0.0).to(tl.float32)
    qr1 = q1 * c[None, :] - q2 * s[None, :]
    qr2 = q2 * c[None, :] + q1 * s[None, :]
    # online softmax over the window's tokens, new one included
    L = tl.load(Lens + b)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(L - window, 0)
    first = (lo // BLOCK_N) * BLOCK_N
    if USE_ALIBI:
        slope = tl.load(Slopes + h // G)
    m = tl.full([G], float("-inf"), tl.float32)
    if USE_SINKS:
        sink = tl.load(Sinks + h)
        m = sink
    l = tl.zeros([G], tl.float32)
    acc1 = tl.zeros([G, BLOCK_HALF], tl.float32)
    acc2 = tl.zeros([G, BLOCK_HALF], tl.float32)
    for start in range(first, L, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nm = (n < L) & (n >= lo)
        pb = tl.load(Tables + b * s_tb + n // PAGE, mask=nm, other=0).to(tl.int64)
        row = pb * s_cn + (n % PAGE) * s_cp + g * s_ch
        km = nm[:, None] & im[None, :]
        kk1 = tl.load(KC + row[:, None] + i[None, :], mask=km, other=0.0).to(tl.float32)
        kk2 = tl.load(KC + row[:, None] + i[None, :] + HALF, mask=km, other=0.0).to(tl.float32)
        qk = (tl.sum(qr1[:, None, :] * kk1[None, :, :], 2) + tl.sum(qr2[:, None, :] * kk2[None, :, :], 2)) * scale
        if USE_CAP:
            qk = cap * _tanh(qk / cap)
        if USE_ALIBI:
            qk = qk + slope[:, None] * (n - (L - 1)).to(tl.float32)[None, :]
        qk = tl.where(nm[None, :], qk, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(qk - m_new[:, None])
        vv1 = tl.load(VC + row[:, None] + i[None, :], mask=km, other=0.0).to(tl.float32)
        vv2 = tl.load(VC + row[:, None] + i[None, :] + HALF, mask=km, other=0.0).to(tl.float32)
        acc1 = acc1 * alpha[:, None] + tl.sum(p[:, :, None] * vv1[None, :, :], 1)
        acc2 = acc2 * alpha[:, None] + tl.sum(p[:, :, None] * vv2[None, :, :], 1)
        l = l * alpha + tl.sum(p, 1)
        m = m_new
    if USE_SINKS:
        l = l + tl.exp(sink - m)
    o = Out + b * s_ob + h[:, None] * s_oh + i[None, :]
    tl.store(o, (acc1 / l[:, None]).to(Out.dtype.element_ty), mask=qm)
    tl.store(o + HALF, (acc2 / l[:, None]).to(Out.dtype.element_ty), mask=qm)


def entry(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale, alibi_slopes=None,
          sinks=None):
    prm = kernalin_ci.current_params()
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    assert G & (G - 1) == 0 and D % 2 == 0 and k_cache.stride(3) == 1 and q.stride(2) == 1
    assert k_cache.stride() == v_cache.stride() and k.stride(2) == 1 and v.stride(2) == 1
    out = torch.empty_like(q)
    half = D // 2
    _decode_step[(B, Hkv)](
        q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, out,
        alibi_slopes if alibi_slopes is not None else q, sinks if sinks is not None else q, scale, math.log2(BASE),
        prm.get("logit_cap") or 1.0, prm.get("window") or 0,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1),
        G=G, PAGE=k_cache.shape[1], HALF=half, BLOCK_HALF=triton.next_power_of_2(half), BLOCK_N=32,
        USE_WINDOW=bool(prm.get("window")), USE_CAP=bool(prm.get("logit_cap")), USE_ALIBI=alibi_slopes is not None,
        USE_SINKS=sinks is not None)
    return out
