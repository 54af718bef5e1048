"""Decode step in two launches: rotation and cache append fused in one kernel, paged attention in another

Correct kernel. The first kernel, one program per (sequence, KV head), computes the
NeoX angles of positions[b] (exp2 form, float32), rotates the new key and writes it
with v into slot slot_mapping[b] of the paged caches (64-bit offsets, D masked to
its power-of-two tile), and rotates the query heads of the KV head's GQA group into
a scratch q_rot. The second kernel, launched after it (so every write has landed),
runs an online softmax over the kv_len tokens, new one included, reading q_rot and
the caches through the block table in tiles of BLOCK_N. Float32 math, halves of the
head dim kept apart.
"""
import math

import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "decode_step",
    "bug_class": None,
    "pos0": None,
    "params": {"block_size": 16},
    "modelled_on": None,
    "style": "rope + append fused, attention a second launch",
}

BASE = 10000.0


@triton.jit
def _rope_append(Q, K, V, Pos, KC, VC, Slots, QR, log2_base,
                 s_qb, s_qh, s_kb, s_kh, s_vb, s_vh, s_cn, s_cp, s_ch, s_rb, s_rh,
                 G: tl.constexpr, PAGE: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    i = tl.arange(0, BLOCK_HALF)
    im = i < HALF
    pos = tl.load(Pos + b).to(tl.float32)
    ang = pos * tl.exp2(-(i.to(tl.float32) / HALF) * log2_base)
    c = tl.cos(ang)
    s = tl.sin(ang)
    k1 = tl.load(K + b * s_kb + g * s_kh + i, mask=im, other=0.0).to(tl.float32)
    k2 = tl.load(K + b * s_kb + g * s_kh + i + HALF, mask=im, other=0.0).to(tl.float32)
    v1 = tl.load(V + b * s_vb + g * s_vh + i, mask=im, other=0.0)
    v2 = tl.load(V + b * s_vb + g * s_vh + i + HALF, mask=im, other=0.0)
    slot = tl.load(Slots + b)
    new = (slot // PAGE) * s_cn + (slot % PAGE) * s_cp + g * s_ch + i
    tl.store(KC + new, (k1 * c - k2 * s).to(KC.dtype.element_ty), mask=im)
    tl.store(KC + new + HALF, (k2 * c + k1 * s).to(KC.dtype.element_ty), mask=im)
    tl.store(VC + new, v1, mask=im)
    tl.store(VC + new + HALF, v2, mask=im)
    h = g * G + tl.arange(0, G)
    qm = im[None, :]
    q1 = tl.load(Q + b * s_qb + h[:, None] * s_qh + i[None, :], mask=qm, other=0.0).to(tl.float32)
    q2 = tl.load(Q + b * s_qb + h[:, None] * s_qh + i[None, :] + HALF, mask=qm, other=0.0).to(tl.float32)
    r = QR + b * s_rb + h[:, None] * s_rh + i[None, :]
    tl.store(r, q1 * c[None, :] - q2 * s[None, :], mask=qm)
    tl.store(r + HALF, q2 * c[None, :] + q1 * s[None, :], mask=qm)


@triton.jit
def _attend(QR, KC, VC, Tables, Lens, Out, scale, s_rb, s_rh, s_cn, s_cp, s_ch, s_tb, s_ob, s_oh,
            G: tl.constexpr, PAGE: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
            BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    i = tl.arange(0, BLOCK_HALF)
    im = i < HALF
    h = g * G + tl.arange(0, G)
    qm = im[None, :]
    qr1 = tl.load(QR + b * s_rb + h[:, None] * s_rh + i[None, :], mask=qm, other=0.0)
    qr2 = tl.load(QR + b * s_rb + h[:, None] * s_rh + i[None, :] + HALF, mask=qm, other=0.0)
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
        kk1 = tl.load(KC + row[:, None] + i[None, :], mask=km, other=0.0).to(tl.float32)
        kk2 = tl.load(KC + row[:, None] + i[None, :] + HALF, mask=km, other=0.0).to(tl.float32)
        qk = tl.sum(qr1[:, None, :] * kk1[None, :, :], 2) + tl.sum(qr2[:, None, :] * kk2[None, :, :], 2)
        qk = tl.where(nm[None, :], qk * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(qk - m_new[:, None])
        vv1 = tl.load(VC + row[:, None] + i[None, :], mask=km, other=0.0).to(tl.float32)
        vv2 = tl.load(VC + row[:, None] + i[None, :] + HALF, mask=km, other=0.0).to(tl.float32)
        acc1 = acc1 * alpha[:, None] + tl.sum(p[:, :, None] * vv1[None, :, :], 1)
        acc2 = acc2 * alpha[:, None] + tl.sum(p[:, :, None] * vv2[None, :, :], 1)
        l = l * alpha + tl.sum(p, 1)
        m = m_new
    o = Out + b * s_ob + h[:, None] * s_oh + i[None, :]
    tl.store(o, (acc1 / l[:, None]).to(Out.dtype.element_ty), mask=qm)
    tl.store(o + HALF, (acc2 / l[:, None]).to(Out.dtype.element_ty), mask=qm)


def entry(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale):
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    assert G & (G - 1) == 0 and D % 2 == 0 and k_cache.stride(3) == 1 and q.stride(2) == 1
    assert k_cache.stride() == v_cache.stride() and k.stride(2) == 1 and v.stride(2) == 1
    half = D // 2
    q_rot = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    blocks = dict(G=G, PAGE=k_cache.shape[1], HALF=half, BLOCK_HALF=triton.next_power_of_2(half))
    _rope_append[(B, Hkv)](
        q, k, v, positions, k_cache, v_cache, slot_mapping, q_rot, math.log2(BASE),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), q_rot.stride(0), q_rot.stride(1), **blocks)
    out = torch.empty_like(q)
    _attend[(B, Hkv)](
        q_rot, k_cache, v_cache, block_tables, kv_lens, out, scale, q_rot.stride(0), q_rot.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1),
        BLOCK_N=64, **blocks)
    return out
