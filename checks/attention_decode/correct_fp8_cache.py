"""Decode attention over an FP8 cache with per-head scales (correct): online softmax, one program per
(sequence, query head)

As correct_online_softmax.py, with the cache dequantised on read (docs/ops.md, "FP8 KV caches"): the
program loads its KV head g's scales k_scale[g] and v_scale[g] once (element 0 under `kv_scale:
per-tensor`), widens each FP8 key and value tile to float32 and multiplies it by its scale, then
computes in float32.
"""
import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "attention.decode",
    "bug_class": None,
    "pos0": None,
    "params": {"kv_dtype": "fp8_e4m3", "kv_scale": "per-head"},
    "modelled_on": None,
    "style": "online-softmax, FP8 cache",
    "structural": "not-analysed",
}


@triton.jit
def _decode_online_fp8(Q, K, V, Out, Lens, KScale, VScale, scale,
                   s_qb, s_qh, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd, s_ob, s_oh, s_od,
                   GROUP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                       PER_HEAD: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // GROUP
    kv_len = tl.load(Lens + b)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q = tl.load(Q + b * s_qb + h * s_qh + offs_d * s_qd, mask=d_mask, other=0.0).to(tl.float32)
    k_base = K + b * s_kb + g * s_kh
    v_base = V + b * s_vb + g * s_vh
    sg = g if PER_HEAD else 0
    k_scale = tl.load(KScale + sg)
    v_scale = tl.load(VScale + sg)

    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_len
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + offs_n[:, None] * s_ks + offs_d[None, :] * s_kd, mask=kv_mask, other=0.0)
        qk = tl.sum(k.to(tl.float32) * k_scale * q[None, :], 1) * scale
        qk = tl.where(n_mask, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new)
        v = tl.load(v_base + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * (v.to(tl.float32) * v_scale), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    out = acc / l_i
    tl.store(Out + b * s_ob + h * s_oh + offs_d * s_od, out.to(Out.dtype.element_ty), mask=d_mask)


def entry(q, k_cache, v_cache, kv_lens, scale, k_scale, v_scale):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    out = torch.empty_like(q)
    _decode_online_fp8[(B, Hq)](
        q, k_cache, v_cache, out, kv_lens, k_scale, v_scale, scale,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        GROUP=Hq // Hkv, D=D, BLOCK_N=64, BLOCK_D=triton.next_power_of_2(D), PER_HEAD=k_scale.numel() > 1)
    return out
