"""A fused decode step over an FP8 KV cache (correct): the catalogue's fully fused kernel
(checks/decode_step/correct_fused.py) with the append quantising on write and attention dequantising on
read (docs/ops.md, "FP8 KV caches"). Program (b, g) loads its KV head's scales once (element 0 under
per-tensor scales), stores the rotated key divided by k_scale and the value divided by v_scale (Triton's
float32 -> FP8 cast: round to nearest even, saturating), and widens each cached key and value it reads back
to float32 times the same scale. tests/test_kv_fp8.py derives its append-scale bug from this file.
"""
import math

import torch
import triton
import triton.language as tl

BASE = 10000.0


@triton.jit
def _decode_step(Q, K, V, Pos, KC, VC, Slots, Tables, Lens, Out, KS, VS, scale, log2_base,
                 s_qb, s_qh, s_kb, s_kh, s_vb, s_vh, s_cn, s_cp, s_ch, s_tb, s_ob, s_oh,
                 G: tl.constexpr, PAGE: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 BLOCK_N: tl.constexpr, PER_HEAD: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    sg = g if PER_HEAD else 0
    ks = tl.load(KS + sg)  # this KV head's scales: the append divides by them, attention multiplies
    vs = tl.load(VS + sg)
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
    tl.store(KC + new, (kr1 / ks).to(KC.dtype.element_ty), mask=im)
    tl.store(KC + new + HALF, (kr2 / ks).to(KC.dtype.element_ty), mask=im)
    tl.store(VC + new, (v1 / vs).to(VC.dtype.element_ty), mask=im)
    tl.store(VC + new + HALF, (v2 / vs).to(VC.dtype.element_ty), mask=im)
    tl.debug_barrier()
    # the query heads of this KV head's group, rotated
    h = g * G + tl.arange(0, G)
    qm = im[None, :]
    q1 = tl.load(Q + b * s_qb + h[:, None] * s_qh + i[None, :], mask=qm, other=0.0).to(tl.float32)
    q2 = tl.load(Q + b * s_qb + h[:, None] * s_qh + i[None, :] + HALF, mask=qm, other=0.0).to(tl.float32)
    qr1 = q1 * c[None, :] - q2 * s[None, :]
    qr2 = q2 * c[None, :] + q1 * s[None, :]
    # online softmax over the kv_len tokens, new one included
    L = tl.load(Lens + b)
    m = tl.full([G], float("-inf"), tl.float32)
    l = tl.zeros([G], tl.float32)
    acc1 = tl.zeros([G, BLOCK_HALF], tl.float32)
    acc2 = tl.zeros([G, BLOCK_HALF], tl.float32)
    for start in range(0, L, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nm = n < L
        pb = tl.load(Tables + b * s_tb + n // PAGE, mask=nm, other=0).to(tl.int64)
        row = pb * s_cn + (n % PAGE) * s_cp + g * s_ch
        km = nm[:, None] & im[None, :]
        kk1 = tl.load(KC + row[:, None] + i[None, :], mask=km, other=0.0).to(tl.float32) * ks
        kk2 = tl.load(KC + row[:, None] + i[None, :] + HALF, mask=km, other=0.0).to(tl.float32) * ks
        qk = tl.sum(qr1[:, None, :] * kk1[None, :, :], 2) + tl.sum(qr2[:, None, :] * kk2[None, :, :], 2)
        qk = tl.where(nm[None, :], qk * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(qk - m_new[:, None])
        vv1 = tl.load(VC + row[:, None] + i[None, :], mask=km, other=0.0).to(tl.float32) * vs
        vv2 = tl.load(VC + row[:, None] + i[None, :] + HALF, mask=km, other=0.0).to(tl.float32) * vs
        acc1 = acc1 * alpha[:, None] + tl.sum(p[:, :, None] * vv1[None, :, :], 1)
        acc2 = acc2 * alpha[:, None] + tl.sum(p[:, :, None] * vv2[None, :, :], 1)
        l = l * alpha + tl.sum(p, 1)
        m = m_new
    o = Out + b * s_ob + h[:, None] * s_oh + i[None, :]
    tl.store(o, (acc1 / l[:, None]).to(Out.dtype.element_ty), mask=qm)
    tl.store(o + HALF, (acc2 / l[:, None]).to(Out.dtype.element_ty), mask=qm)


def entry(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale, k_scale, v_scale):
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    assert G & (G - 1) == 0 and D % 2 == 0 and k_cache.stride(3) == 1 and q.stride(2) == 1
    assert k_cache.stride() == v_cache.stride() and k.stride(2) == 1 and v.stride(2) == 1
    out = torch.empty_like(q)
    half = D // 2
    _decode_step[(B, Hkv)](
        q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, out, k_scale, v_scale, scale,
        math.log2(BASE),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1),
        G=G, PAGE=k_cache.shape[1], HALF=half, BLOCK_HALF=triton.next_power_of_2(half), BLOCK_N=64,
        PER_HEAD=k_scale.numel() > 1)
    return out
